//! Connecting to PostgreSQL the way libpq users expect, and classifying its failures.
//!
//! tokio-postgres parses URLs but reads no environment and knows only `sslmode`
//! disable/prefer/require. This module adds what operators rely on: `PGHOST`, `PGPORT`,
//! `PGUSER`, `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`, `PGCONNECT_TIMEOUT`,
//! unix-socket hosts, and `sslmode=verify-ca|verify-full` with `sslrootcert`. Errors are mapped
//! to exit codes by what they mean for a retry: refused login or bad TLS settings are usage
//! errors (2), an unreachable server is unavailable (7), and a connection lost after a request
//! that changes state was sent is outcome unknown (8). A server that answers that it cannot
//! take a connection now (no free slot, 53300; starting or stopping, 57P03) is retried with
//! jittered back-off, for [`CONNECT_PATIENCE`] or as long as the caller's own bound.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

use tokio::time::Instant;
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::TlsStream;
use tokio_postgres::{AsyncMessage, Client, Config, Connection, Socket};

use crate::error::{Cause, Error};
use crate::sys::random_u64;

mod libpq_files;
pub mod range;
pub mod session;
pub mod sqlstate;

/// How long to wait for a server to accept a connection, unless the URL or
/// `PGCONNECT_TIMEOUT` says otherwise.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection is retried while the server answers that it cannot take one now,
/// when the caller sets no longer bound (`--wait` does).
pub const CONNECT_PATIENCE: Duration = Duration::from_secs(2);

/// How long fence waits for the answer to one request before giving up on it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ssl {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// A PostgreSQL server to connect to, fully resolved from URL and environment.
pub struct ConnectParams {
    config: Config,
    ssl: Ssl,
    root_cert: Option<PathBuf>,
    /// The URL without its password, for messages.
    pub display: String,
}

impl ConnectParams {
    /// Resolves a `postgres://` URL plus `PG*` fallbacks, without connecting.
    pub fn resolve(url: &str, display: &str) -> Result<ConnectParams, Error> {
        let (url, params) = take_ssl_params(url);
        let mut config = Config::from_str(&url).map_err(|err| {
            Error::usage(
                format!("`{display}` is not a valid PostgreSQL URL: {err}"),
                "write it as postgres://user[:password]@host[:port]/database[?sslmode=require]",
            )
            .with_source(err)
        })?;
        // A service's settings come after the URL's and before the PG* variables (libpq).
        let service = match params.service.or_else(|| env("PGSERVICE")) {
            Some(name) => libpq_files::service(&name)?,
            None => libpq_files::Service::new(),
        };
        apply_service(&mut config, &service, display)?;
        let sslmode = params.sslmode.or_else(|| service.get("sslmode").cloned());
        let sslrootcert = params
            .sslrootcert
            .or_else(|| service.get("sslrootcert").cloned());
        if config.get_hosts().is_empty() {
            match env("PGHOST") {
                Some(hosts) => {
                    for host in hosts.split(',') {
                        add_host(&mut config, host);
                    }
                }
                None if Path::new("/var/run/postgresql").is_dir() => {
                    config.host_path("/var/run/postgresql");
                }
                None => {
                    config.host("localhost");
                }
            }
        }
        if config.get_ports().is_empty() {
            if let Some(port) = env("PGPORT") {
                let port = port.parse::<u16>().map_err(|err| {
                    Error::usage(
                        format!("PGPORT=`{port}` is not a port number"),
                        "set PGPORT to a number such as 5432, or put the port in the URL",
                    )
                    .with_source(err)
                })?;
                config.port(port);
            }
        }
        if config.get_user().is_none() {
            let user = env("PGUSER").or_else(os_user).ok_or_else(|| {
                Error::usage(
                    format!("`{display}` names no user, and PGUSER is unset"),
                    "put the user in the URL (postgres://user@host/db) or set PGUSER",
                )
            })?;
            config.user(&user);
        }
        if config.get_dbname().is_none() {
            if let Some(db) = env("PGDATABASE") {
                config.dbname(&db);
            }
        }
        if config.get_password().is_none() {
            if let Some(password) = env("PGPASSWORD").or_else(|| password_file(&config)) {
                config.password(password);
            }
        }
        if config.get_connect_timeout().is_none() {
            let timeout = env("PGCONNECT_TIMEOUT")
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|&secs| secs > 0)
                .map_or(DEFAULT_CONNECT_TIMEOUT, Duration::from_secs);
            config.connect_timeout(timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("fence");
        }
        let sslmode = sslmode.or_else(|| env("PGSSLMODE"));
        let ssl = match sslmode.as_deref() {
            None | Some("prefer") | Some("allow") => Ssl::Prefer,
            Some("disable") => Ssl::Disable,
            Some("require") => Ssl::Require,
            Some("verify-ca") => Ssl::VerifyCa,
            Some("verify-full") => Ssl::VerifyFull,
            Some(other) => {
                return Err(Error::usage(
                    format!("sslmode `{other}` is not one PostgreSQL knows"),
                    "use disable, prefer, require, verify-ca or verify-full",
                ))
            }
        };
        // libpq does not use TLS on unix sockets; neither do we.
        let ssl = if config
            .get_hosts()
            .iter()
            .all(|h| matches!(h, Host::Unix(_)))
        {
            Ssl::Disable
        } else {
            ssl
        };
        let root_cert = match ssl {
            Ssl::VerifyCa | Ssl::VerifyFull => {
                let path = sslrootcert
                    .or_else(|| env("PGSSLROOTCERT"))
                    .map(PathBuf::from)
                    .or_else(|| {
                        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".postgresql/root.crt"))
                    })
                    .ok_or_else(|| {
                        Error::usage(
                            "sslmode verify-ca/verify-full needs a CA certificate and none is configured",
                            "add `sslrootcert=/path/to/ca.pem` to the URL or set PGSSLROOTCERT",
                        )
                    })?;
                Some(path)
            }
            _ => None,
        };
        Ok(ConnectParams {
            config,
            ssl,
            root_cert,
            display: display.to_owned(),
        })
    }

    /// Connects and spawns the connection task on the current runtime; the receiver gets the
    /// payload of every `NOTIFY` on a channel this connection `LISTEN`s to. A server that
    /// cannot take the connection now is retried for [`CONNECT_PATIENCE`].
    pub async fn connect(&self) -> Result<(Client, Notifications), Error> {
        self.connect_until(Instant::now() + CONNECT_PATIENCE, &Refusals::default())
            .await
    }

    /// [`Self::connect`], retrying with jittered exponential back-off (25 ms doubling to 1 s)
    /// while the server answers that it has no slot for this connection ("too many
    /// connections", SQLSTATE 53300, per server or per role) or is starting or stopping
    /// ("cannot connect now", 57P03), until `until`. Nothing has been sent then, so retrying
    /// is always safe; any other failure is final at once. Each refusal is kept in
    /// `refusals` until a connection succeeds, for a caller whose own deadline ends the wait
    /// before this gives up (the error it gives up with names the refusal too).
    pub async fn connect_until(
        &self,
        until: Instant,
        refusals: &Refusals,
    ) -> Result<(Client, Notifications), Error> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(25);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let refusal = match self.connect_once().await {
                Ok(connected) => {
                    refusals.set(None);
                    return Ok(connected);
                }
                Err(ConnectAttempt::Final(err)) => return Err(err),
                Err(ConnectAttempt::Refused(refusal)) => refusal,
            };
            refusals.set(Some(refusal.clone()));
            // Between half and all of the pause, so that refused clients spread out.
            let nap = pause / 2
                + Duration::from_micros(random_u64() % (pause.as_micros() as u64 / 2 + 1));
            if Instant::now() + nap > until {
                return Err(Error::unavailable(
                    format!(
                        "PostgreSQL at `{}` refused to take a connection: {refusal}; fence retried {} for {:.1}s and gave up",
                        self.display,
                        if attempts == 1 { "once".to_owned() } else { format!("{attempts} times") },
                        started.elapsed().as_secs_f64()
                    ),
                    "nothing was done, so it is safe to retry; if the server (or this role) is often out of connection slots, size max_connections and the roles' CONNECTION LIMIT for fence's processes (docs/run.md, Connection sizing and PgBouncer)",
                ));
            }
            tokio::time::sleep(nap).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// One connection attempt, bounded as libpq's connect_timeout bounds it.
    async fn connect_once(&self) -> Result<(Client, Notifications), ConnectAttempt> {
        // tokio-postgres bounds only the TCP connect; libpq's connect_timeout bounds the
        // whole connection (TLS, start-up, login), and so do we.
        let limit = self
            .config
            .get_connect_timeout()
            .copied()
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        tokio::time::timeout(limit, self.connect_unbounded())
            .await
            .map_err(|_| {
                ConnectAttempt::Final(Error::unavailable(
                    format!(
                        "PostgreSQL at `{}` did not complete the connection within {}",
                        self.display,
                        crate::time::duration(limit)
                    ),
                    "check that the address is a PostgreSQL server and that it is not overloaded; nothing was done, so it is safe to retry",
                ))
            })?
    }

    async fn connect_unbounded(&self) -> Result<(Client, Notifications), ConnectAttempt> {
        let mut config = self.config.clone();
        let Some(tls) = self.tls().map_err(ConnectAttempt::Final)? else {
            let (client, connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(|err| self.connect_error(err))?;
            return Ok((client, drive(connection)));
        };
        config.ssl_mode(if self.ssl == Ssl::Prefer {
            SslMode::Prefer
        } else {
            SslMode::Require
        });
        let (client, connection) = config
            .connect(tls)
            .await
            .map_err(|err| self.connect_error(err))?;
        Ok((client, drive(connection)))
    }

    /// The first port the connection tries (`None`: the default, 5432).
    pub fn port(&self) -> Option<u16> {
        self.config.get_ports().first().copied()
    }

    /// The TLS connector `sslmode` asks for (`None`: plain TCP).
    fn tls(&self) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>, Error> {
        if self.ssl == Ssl::Disable {
            return Ok(None);
        }
        let roots = match self.ssl {
            Ssl::VerifyCa | Ssl::VerifyFull => self.read_root_certs()?,
            _ => Vec::new(),
        };
        let tls = tls_config(roots, self.ssl == Ssl::VerifyFull).map_err(|err| {
            Error::usage(
                format!(
                    "cannot use the CA certificate `{}`: {err}",
                    self.root_cert.as_deref().unwrap_or(Path::new("")).display()
                ),
                "point sslrootcert (or PGSSLROOTCERT) at the CA certificate that signed the server's",
            )
            .with_source(err)
        })?;
        Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(tls)))
    }

    /// Asks the server to cancel whatever `cancel` names is running (a new connection that
    /// carries only the cancel request, as libpq's PQcancel). The answer to the cancelled
    /// request, not this call, says whether it was cancelled in time.
    pub async fn cancel(&self, cancel: &tokio_postgres::CancelToken) -> Result<(), Error> {
        let sent = match self.tls()? {
            None => cancel.cancel_query(tokio_postgres::NoTls).await,
            Some(tls) => cancel.cancel_query(tls).await,
        };
        sent.map_err(|err| {
            Error::unavailable(
                format!(
                    "cannot reach PostgreSQL at `{}` to cancel: {}",
                    self.display,
                    error_chain(&err)
                ),
                "check that the server is reachable",
            )
            .with_source(err)
        })
    }

    /// Every certificate in the `sslrootcert` file (a bundle may hold several, as with libpq).
    fn read_root_certs(&self) -> Result<Vec<CertificateDer<'static>>, Error> {
        let path = self.root_cert.as_deref().unwrap_or(Path::new(""));
        let pem = std::fs::read(path).map_err(|err| {
            Error::usage(
                format!("cannot read the CA certificate `{}`: {err}", path.display()),
                "point sslrootcert (or PGSSLROOTCERT) at a readable PEM file",
            )
            .with_source(err)
        })?;
        let not_pem = |detail: &dyn std::fmt::Display| {
            Error::usage(
                format!("`{}` is not a PEM certificate: {detail}", path.display()),
                "point sslrootcert at the CA certificate that signed the server's",
            )
        };
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| not_pem(&err).with_source(err))?;
        if certs.is_empty() {
            return Err(not_pem(&"it holds no certificate"));
        }
        Ok(certs)
    }

    fn connect_error(&self, err: tokio_postgres::Error) -> ConnectAttempt {
        if let Some(db) = err.as_db_error() {
            let code = db.code();
            if *code == SqlState::TOO_MANY_CONNECTIONS || *code == SqlState::CANNOT_CONNECT_NOW {
                return ConnectAttempt::Refused(format!(
                    "{} (SQLSTATE {})",
                    db.message(),
                    code.code()
                ));
            }
        }
        let failure = self.connect_failure(&err);
        ConnectAttempt::Final(failure.with_source(err))
    }

    /// What a failed connection attempt means (the caller keeps the driver's error as its
    /// source).
    fn connect_failure(&self, err: &tokio_postgres::Error) -> Error {
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

/// Why one connection attempt failed.
enum ConnectAttempt {
    /// The server could not take the connection now (no free slot, starting, stopping): its
    /// message and SQLSTATE, to retry.
    Refused(String),
    Final(Error),
}

/// A TLS configuration that, as libpq, trusts only `roots` (and verifies nothing without
/// them: `sslmode=prefer|require` encrypt without authenticating the server). With roots,
/// `verify_host` (verify-full) also checks that the certificate names the host; verify-ca
/// checks the chain only.
fn tls_config(
    roots: Vec<CertificateDer<'static>>,
    verify_host: bool,
) -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let algorithms = provider.signature_verification_algorithms;
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let chain = if roots.is_empty() {
        None
    } else {
        let mut store = rustls::RootCertStore::empty();
        for root in roots {
            store.add(root)?;
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
            .build()
            .map_err(|err| rustls::Error::General(err.to_string()))?;
        if verify_host {
            return Ok(builder.with_webpki_verifier(webpki).with_no_client_auth());
        }
        Some(webpki)
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Lenient { chain, algorithms }))
        .with_no_client_auth())
}

/// The server check of `sslmode=prefer|require` (no chain: any certificate) and of
/// `verify-ca` (the chain must lead to a trusted root; the names are not checked). The
/// handshake signatures are checked either way.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // The chain is checked before the names: a name error means the chain is good.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Payloads of notifications received on a connection.
pub type Notifications = tokio::sync::mpsc::UnboundedReceiver<String>;

/// Drives a connection on the current runtime, forwarding its notifications.
fn drive<T>(mut connection: Connection<Socket, T>) -> Notifications
where
    T: TlsStream + Unpin + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(std::future::poll_fn(move |cx| loop {
        match connection.poll_message(cx) {
            std::task::Poll::Ready(Some(Ok(AsyncMessage::Notification(n)))) => {
                let _ = tx.send(n.payload().to_owned());
            }
            std::task::Poll::Ready(Some(Ok(_))) => {}
            std::task::Poll::Ready(Some(Err(_)) | None) => return std::task::Poll::Ready(()),
            std::task::Poll::Pending => return std::task::Poll::Pending,
        }
    }));
    CONNECTIONS.with(|open| {
        let mut open = open.borrow_mut();
        // A waiter reconnects for every poll: forget the connections that have ended.
        open.retain(|task| !task.is_finished());
        open.push(task);
    });
    rx
}

thread_local! {
    /// The connection tasks of this thread, so that they can end cleanly before exit.
    static CONNECTIONS: std::cell::RefCell<Vec<tokio::task::JoinHandle<()>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The server's answer to the last connection attempt it refused (no free slot, starting,
/// stopping: its message and SQLSTATE), until a connection succeeds. Whoever connects owns
/// one and hands it to [`ConnectParams::connect_until`], which fills it as it retries: what
/// the owner reports when its own deadline cut the retrying short, so that no error value
/// reached it.
#[derive(Debug, Default)]
pub struct Refusals(std::sync::Mutex<Option<String>>);

impl Refusals {
    /// The last refusal since the last connection that succeeded, if any.
    pub fn last(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, refusal: Option<String>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = refusal;
    }
}

/// Lets every connection whose client has been dropped say goodbye (`Terminate`) before the
/// process exits; otherwise the server logs each exit as a connection reset.
pub async fn close_all() {
    let tasks = CONNECTIONS.with(|open| std::mem::take(&mut *open.borrow_mut()));
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_millis(200), task).await;
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
        ];
        if shutting_down.contains(code) {
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
fn error_chain(err: &dyn std::error::Error) -> String {
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

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn add_host(config: &mut Config, host: &str) {
    if host.starts_with('/') {
        config.host_path(host);
    } else {
        config.host(host);
    }
}

/// The name of the user running fence, as libpq defaults `user` to it.
fn os_user() -> Option<String> {
    env("USER").or_else(|| env("LOGNAME")).or_else(|| {
        // SAFETY: getpwuid returns a pointer to static storage or null; we copy the name out
        // immediately and fence does not call getpw* from other threads.
        unsafe {
            let pw = libc::getpwuid(libc::getuid());
            if pw.is_null() || (*pw).pw_name.is_null() {
                return None;
            }
            std::ffi::CStr::from_ptr((*pw).pw_name)
                .to_str()
                .ok()
                .map(str::to_owned)
        }
    })
}

/// Splits `sslmode` and `sslrootcert` out of a URL's query (tokio-postgres rejects
/// `verify-full` and does not know `sslrootcert`).
fn take_ssl_params(url: &str) -> (String, UrlParams) {
    let mut params = UrlParams::default();
    let Some((head, query)) = url.split_once('?') else {
        return (url.to_owned(), params);
    };
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("sslmode", value)) => params.sslmode = Some(decode(value)),
            Some(("sslrootcert", value)) => params.sslrootcert = Some(decode(value)),
            Some(("service", value)) => params.service = Some(decode(value)),
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        head.to_owned()
    } else {
        format!("{head}?{}", kept.join("&"))
    };
    (url, params)
}

/// URL parameters fence handles itself (the driver does not know them).
#[derive(Default)]
struct UrlParams {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    service: Option<String>,
}

/// Fills what the URL left out from a service's settings.
fn apply_service(
    config: &mut Config,
    service: &libpq_files::Service,
    display: &str,
) -> Result<(), Error> {
    if config.get_hosts().is_empty() {
        if let Some(hosts) = service.get("host") {
            for host in hosts.split(',') {
                add_host(config, host);
            }
        }
    }
    if config.get_ports().is_empty() {
        if let Some(port) = service.get("port") {
            let port = port.parse::<u16>().map_err(|err| {
                Error::usage(
                    format!("the service for `{display}` sets port `{port}`, which is not a port number"),
                    "fix the port in the service file",
                )
                .with_source(err)
            })?;
            config.port(port);
        }
    }
    if config.get_user().is_none() {
        if let Some(user) = service.get("user") {
            config.user(user);
        }
    }
    if config.get_dbname().is_none() {
        if let Some(db) = service.get("dbname") {
            config.dbname(db);
        }
    }
    if config.get_password().is_none() {
        if let Some(password) = service.get("password") {
            config.password(password.as_str());
        }
    }
    if config.get_connect_timeout().is_none() {
        if let Some(secs) = service
            .get("connect_timeout")
            .and_then(|v| v.parse::<u64>().ok())
        {
            config.connect_timeout(Duration::from_secs(secs.max(1)));
        }
    }
    if config.get_application_name().is_none() {
        if let Some(name) = service.get("application_name") {
            config.application_name(name);
        }
    }
    Ok(())
}

/// The password file's password for the first host (libpq tries each host in turn; fence
/// sends one password to all of them).
fn password_file(config: &Config) -> Option<String> {
    let host = match config.get_hosts().first()? {
        Host::Tcp(name) => name.clone(),
        Host::Unix(path) => path.display().to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user()?;
    let database = config.get_dbname().unwrap_or(user);
    libpq_files::password(&host, port, database, user)
}

fn decode(value: &str) -> String {
    crate::url::percent_decode(value).unwrap_or_else(|| value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

    /// A server that answers every start-up with PostgreSQL's "too many connections" (FATAL,
    /// SQLSTATE 53300), as a full server does.
    async fn full_server() -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut length = [0u8; 4];
                if socket.read_exact(&mut length).await.is_err() {
                    continue;
                }
                let mut startup = vec![0u8; u32::from_be_bytes(length) as usize - 4];
                if socket.read_exact(&mut startup).await.is_err() {
                    continue;
                }
                let fields = b"SFATAL\0VFATAL\0C53300\0Msorry, too many clients already\0\0";
                let mut answer = vec![b'E'];
                answer.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
                answer.extend_from_slice(fields);
                let _ = socket.write_all(&answer).await;
            }
        });
        port
    }

    /// The refusals a retrying connection meets are kept where its caller can read them when
    /// its own deadline cuts the connecting short (no error reaches it then), and named in
    /// the error when the connecting gives up itself.
    #[tokio::test(flavor = "current_thread")]
    async fn refusals_are_the_callers_to_read() {
        let port = full_server().await;
        let url = format!("postgres://fence@127.0.0.1:{port}/db?sslmode=disable");
        let params = ConnectParams::resolve(&url, "db").unwrap();
        let refusal = "sorry, too many clients already (SQLSTATE 53300)";
        let refusals = Refusals::default();
        let cut = tokio::time::timeout(
            Duration::from_millis(300),
            params.connect_until(Instant::now() + Duration::from_secs(60), &refusals),
        )
        .await;
        assert!(
            cut.is_err(),
            "the connecting ended before its caller's deadline"
        );
        assert_eq!(refusals.last().as_deref(), Some(refusal));
        let Err(err) = params
            .connect_until(Instant::now() + Duration::from_millis(100), &refusals)
            .await
        else {
            panic!("a full server took the connection");
        };
        assert_eq!(err.exit(), crate::exit::Exit::Unavailable, "{err}");
        assert!(err.to_string().contains(refusal), "{err}");
    }

    /// The error fence makes of a driver error keeps it as its source (and a failure that is
    /// no refusal leaves none behind).
    #[tokio::test(flavor = "current_thread")]
    async fn connection_failures_keep_the_driver_error() {
        let params =
            ConnectParams::resolve("postgres://fence@127.0.0.1:1/db?sslmode=disable", "db")
                .unwrap();
        let refusals = Refusals::default();
        let Err(err) = params.connect_until(Instant::now(), &refusals).await else {
            panic!("nothing listens on port 1");
        };
        assert_eq!(err.exit(), crate::exit::Exit::Unavailable, "{err}");
        let source = std::error::Error::source(&err).expect("a source");
        assert!(source.is::<tokio_postgres::Error>(), "{source:?}");
        assert_eq!(refusals.last(), None);
        let err = match ConnectParams::resolve("postgres://h/db?connect_timeout=x", "db") {
            Err(err) => err,
            Ok(_) => panic!("a bad connect_timeout was accepted"),
        };
        assert!(
            std::error::Error::source(&err).is_some_and(|s| s.is::<tokio_postgres::Error>()),
            "{err:?}"
        );
    }

    #[test]
    fn ssl_params_are_split_out() {
        let (url, params) = take_ssl_params(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&application_name=x&service=ops",
        );
        assert_eq!(url, "postgres://u@h/db?application_name=x");
        assert_eq!(params.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(params.sslrootcert.as_deref(), Some("/tmp/ca.pem"));
        assert_eq!(params.service.as_deref(), Some("ops"));
    }
}
