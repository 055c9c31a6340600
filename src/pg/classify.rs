//! What a failure means for a retry: a failed connection attempt, a failed request, and the
//! kind of driver error behind either.

use tokio_postgres::error::SqlState;

use crate::error::{Cause, Error};
use crate::pg::params::ConnectParams;

impl ConnectParams {
    /// What a failed connection attempt means (the caller keeps the driver's error as its
    /// source).
    pub(super) fn connect_failure(&self, err: &tokio_postgres::Error) -> Error {
        let display = &self.display;
        if let Some(db) = err.as_db_error() {
            let code = db.code();
            let text = db.message();
            if *code == SqlState::INVALID_PASSWORD
                || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            {
                return Error::usage(
                    format!("PostgreSQL at `{display}` refused the login: {text}"),
                    "check the user and password (URL, PGUSER, PGPASSWORD) and the server's pg_hba.conf",
                );
            }
            if *code == SqlState::INVALID_CATALOG_NAME {
                return Error::usage(
                    format!("PostgreSQL at `{display}`: {text}"),
                    "name an existing database in the URL (or PGDATABASE), or create it first",
                );
            }
            if *code == SqlState::INSUFFICIENT_PRIVILEGE {
                return Error::usage(
                    format!("PostgreSQL at `{display}` refused the connection: {text}"),
                    "grant this user CONNECT on the database",
                );
            }
            return Error::unavailable(
                format!("PostgreSQL at `{display}` cannot take the connection now: {text} (SQLSTATE {})", code.code()),
                "nothing was done; retry in a moment",
            );
        }
        let cause = error_chain(err);
        match driver_kind(err) {
            DriverKind::Tls => {
                return Error::usage(
                    format!("TLS with PostgreSQL at `{display}` failed: {cause}"),
                    "check sslmode and sslrootcert: verify-full needs the CA that signed the server's certificate and a host name the certificate names",
                )
            }
            // The configuration was checked when it was resolved (hosts, ports), so what the
            // driver finds wrong only once it talks to the server is the password it was asked
            // for and does not have.
            DriverKind::Config if self.config.get_password().is_none() => {
                return Error::usage(
                    format!("PostgreSQL at `{display}` asks for a password and none was given"),
                    "put it in ~/.pgpass (mode 0600; or the file PGPASSFILE names), in a service (PGSERVICE), in PGPASSWORD, or in the URL (postgres://user:password@host/db)",
                )
            }
            DriverKind::Config => {
                return Error::usage(
                    format!("`{display}` is not a usable PostgreSQL address: {cause}"),
                    "check the host, port and options in the URL",
                )
            }
            DriverKind::Other => {}
        }
        Error::unavailable(
            format!("cannot reach PostgreSQL at `{display}`: {cause}"),
            "check that the server is running and reachable from here; nothing was done, so it is safe to retry",
        )
    }
}

/// A failed request's error as its caller has it. Owned, it is kept whole as the `source()` of
/// the error fence makes of it; borrowed (the caller still needs it), only the server's error
/// is, when there is one (a `DbError` can be copied, the driver's error cannot).
pub trait Failure {
    fn error(&self) -> &tokio_postgres::Error;
    fn into_cause(self) -> Option<Cause>;
}

impl Failure for tokio_postgres::Error {
    fn error(&self) -> &tokio_postgres::Error {
        self
    }

    fn into_cause(self) -> Option<Cause> {
        Some(Box::new(self))
    }
}

impl Failure for &tokio_postgres::Error {
    fn error(&self) -> &tokio_postgres::Error {
        self
    }

    fn into_cause(self) -> Option<Cause> {
        let db = self.as_db_error()?.clone();
        Some(Box::new(db))
    }
}

/// `err` with `cause` as its source, if there is one.
pub(crate) fn caused(err: Error, cause: Option<Cause>) -> Error {
    match cause {
        Some(cause) => err.with_source(cause),
        None => err,
    }
}

/// What a failed request means, given whether it may have changed state.
pub fn request_error(err: impl Failure, display: &str, what: &str, mutating: bool) -> Error {
    let failure = classify_request(err.error(), display, what, mutating);
    caused(failure, err.into_cause())
}

fn classify_request(
    err: &tokio_postgres::Error,
    display: &str,
    what: &str,
    mutating: bool,
) -> Error {
    if let Some(db) = err.as_db_error() {
        let code = db.code();
        if *code == SqlState::INSUFFICIENT_PRIVILEGE {
            return Error::usage(
                format!("PostgreSQL at `{display}` refused to {what}: {}", db.message()),
                "for a store: grant this user the privileges fence needs (USAGE on its schema, EXECUTE on its functions, SELECT/INSERT/UPDATE on the coordinator's tables meta, leases, events, waiters), or use a --schema this user owns; for a target database: have the admin run `fence grant`, and never grant writes on its `guards` or `bindings`",
            );
        }
        if *code == SqlState::QUERY_CANCELED {
            // A cancelled statement is rolled back (a timeout is disarmed before commit).
            return Error::unavailable(
                format!(
                    "PostgreSQL at `{display}` cancelled the request to {what}: {}",
                    db.message()
                ),
                "nothing was applied; if a statement_timeout this short is set for this role, database or in the URL's options, raise it for fence, then retry",
            );
        }
        if *code == SqlState::LOCK_NOT_AVAILABLE {
            return Error::unavailable(
                format!(
                    "PostgreSQL at `{display}` gave up the request to {what} waiting for a lock: {}",
                    db.message()
                ),
                "nothing was applied; if a lock_timeout this short is set for this role, database or in the URL's options, raise it for fence, then retry",
            );
        }
        if [
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
        ]
        .contains(code)
        {
            return Error::unavailable(
                format!(
                    "PostgreSQL at `{display}` rolled back the request to {what}, which raced other updates: {}",
                    db.message()
                ),
                "nothing was applied; retry (a default_transaction_isolation above read committed on this role or database makes such races fail: fence needs read committed)",
            );
        }
        if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
            return Error::unavailable(
                format!(
                    "PostgreSQL at `{display}` is read-only (a standby?), so fence cannot {what}"
                ),
                "point --store at the primary server",
            );
        }
        let shutting_down = [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::DATABASE_DROPPED,
        ];
        if shutting_down.contains(code) || session_lost(db) {
            return lost(
                display,
                what,
                &format!("{} (SQLSTATE {})", db.message(), code.code()),
                mutating,
            );
        }
        return Error::Database {
            message: format!("PostgreSQL at `{display}` failed to {what}: {} (SQLSTATE {})", db.message(), code.code()),
            hint: "this is unexpected; check the server log, and report it if fence's own schema is intact".into(),
            source: Box::new(db.clone()),
        };
    }
    lost(display, what, &error_chain(err), mutating)
}

/// Whether `db` ends the session as a lost connection: a connection exception (class 08)
/// with severity FATAL or PANIC, whoever sent it. A pooler that lost its server connection
/// answers FATAL 08P01 (`server conn crashed?`) in place of the server's answers, whatever
/// the server had applied (review 22: exit 1, "unexpected", for a grant and a write that had
/// committed). The same class as an ERROR is a statement's own failure on a live session (a
/// function or trigger that could not reach another server: review 23).
pub fn session_lost(db: &tokio_postgres::error::DbError) -> bool {
    use tokio_postgres::error::Severity;
    let fatal = match db.parsed_severity() {
        Some(severity) => matches!(severity, Severity::Fatal | Severity::Panic),
        // A pooler's error may carry only the (unlocalised) `S` field.
        None => matches!(db.severity(), "FATAL" | "PANIC"),
    };
    fatal && db.code().code().starts_with("08")
}

/// A request that got no answer: outcome unknown if it could have changed state.
pub fn lost(display: &str, what: &str, cause: &str, mutating: bool) -> Error {
    if mutating {
        Error::outcome_unknown(
            format!("lost PostgreSQL at `{display}` while trying to {what}: {cause}"),
            "the request may or may not have been applied: run `fence inspect` before retrying",
        )
    } else {
        Error::unavailable(
            format!("lost PostgreSQL at `{display}` while trying to {what}: {cause}"),
            "nothing was changed; retry once the server is reachable",
        )
    }
}

/// What kind of failure a tokio-postgres error is, as far as a connection attempt needs to
/// know. Never read from message text (a host name such as `ssl-db` or `tls.internal` is in
/// it): a TLS failure is a `rustls::Error` in the source chain (an `io::Error` may carry it),
/// and otherwise the driver's own error kind. tokio-postgres has no accessor for it, and the
/// rest of its TLS and configuration failures carry only a boxed string as their source (the
/// server that declines TLS, the password it asks for and was not given), so the kind is read
/// from the `kind` field of the error's `Debug` form — one of a closed set of variant names,
/// no user data. That form is pinned for tokio-postgres 0.7.18 (Cargo.lock) by this module's
/// tests, which classify real driver errors (`driver_kinds_of_real_driver_errors`), and by the
/// TLS and password tests (tests/pgpass.rs, tests/cli.rs): a driver that changes it fails them.
#[derive(Debug, PartialEq)]
enum DriverKind {
    Tls,
    Config,
    Other,
}

fn driver_kind(err: &tokio_postgres::Error) -> DriverKind {
    if rustls_failed(err) {
        return DriverKind::Tls;
    }
    let debug = format!("{err:?}");
    let kind = debug
        .strip_prefix("Error { kind: ")
        .and_then(|rest| rest.split([',', ' ', '(']).next());
    match kind {
        Some("Tls") => DriverKind::Tls,
        Some("Config") => DriverKind::Config,
        _ => DriverKind::Other,
    }
}

/// Whether a `rustls::Error` is in the error's source chain (an `io::Error` may carry it).
fn rustls_failed(err: &tokio_postgres::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(inner) = source {
        let carried = inner
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .is_some_and(|inner| inner.is::<rustls::Error>());
        if inner.is::<rustls::Error>() || carried {
            return true;
        }
        source = inner.source();
    }
    false
}

/// The whole `source()` chain in one line: tokio-postgres hides the useful part inside.
pub(super) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        let part = inner.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_postgres::config::SslMode;
    use tokio_postgres::tls::TlsStream;
    use tokio_postgres::{Client, Config, Connection, Socket};

    use crate::pg::tls::tls_config;

    /// A one-connection server on loopback that reads the client's first message (the 8-byte
    /// SSLRequest or the start-up packet's length and version) and answers `reply` (nothing:
    /// hangs up); after a reply of `S` it reads the TLS ClientHello first.
    async fn one_shot_server(reply: &'static [u8]) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 8];
            socket.read_exact(&mut request).await.unwrap();
            if reply.is_empty() {
                return;
            }
            socket.write_all(&reply[..1]).await.unwrap();
            if reply[0] == b'S' {
                let mut hello = [0u8; 5];
                socket.read_exact(&mut hello).await.unwrap();
            }
            socket.write_all(&reply[1..]).await.unwrap();
            // Keep the connection until the client is done with it.
            let _ = socket.read(&mut [0u8; 1024]).await;
        });
        port
    }

    fn connect_error(
        result: Result<(Client, Connection<Socket, impl TlsStream>), tokio_postgres::Error>,
    ) -> tokio_postgres::Error {
        match result {
            Ok(_) => panic!("the connection succeeded"),
            Err(err) => err,
        }
    }

    /// [`driver_kind`] reads the kind of the installed tokio-postgres' own errors, made the way
    /// fence meets them: an upgrade that changes their `Debug` form (or stops putting rustls'
    /// error in the chain) fails here first.
    #[tokio::test(flavor = "current_thread")]
    async fn driver_kinds_of_real_driver_errors() {
        let mut config = Config::new();
        config.user("fence").connect_timeout(Duration::from_secs(5));
        // No host at all: refused by the driver before it connects (kind `Config`, as the
        // password a server asks for and the driver was not given).
        let err = connect_error(config.connect(tokio_postgres::NoTls).await);
        assert_eq!(driver_kind(&err), DriverKind::Config, "{err:?}");

        let tls = || {
            tokio_postgres_rustls::MakeRustlsConnect::new(tls_config(Vec::new(), false).unwrap())
        };
        config.host("127.0.0.1").ssl_mode(SslMode::Require);
        // A server that declines TLS (`N`), with sslmode=require: kind `Tls`, known by the
        // `Debug` form alone (no rustls error: the handshake never began).
        let port = one_shot_server(b"N").await;
        let err = connect_error(config.clone().port(port).connect(tls()).await);
        assert!(!rustls_failed(&err), "{err:?}");
        assert_eq!(driver_kind(&err), DriverKind::Tls, "{err:?}");
        // A server that accepts TLS, then answers the handshake with something else: rustls'
        // own error, carried in an io::Error in the chain.
        let port = one_shot_server(b"SHTTP/1.1 400 Bad Request\r\n\r\n").await;
        let err = connect_error(config.clone().port(port).connect(tls()).await);
        assert!(rustls_failed(&err), "{err:?}");
        assert_eq!(driver_kind(&err), DriverKind::Tls, "{err:?}");
        // A server that hangs up at once, without TLS: neither.
        config.ssl_mode(SslMode::Disable);
        let port = one_shot_server(b"").await;
        let err = connect_error(
            config
                .clone()
                .port(port)
                .connect(tokio_postgres::NoTls)
                .await,
        );
        assert_eq!(driver_kind(&err), DriverKind::Other, "{err:?}");
    }
}
