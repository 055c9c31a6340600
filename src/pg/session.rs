//! A connection to one database with one of fence's versioned schemas in it, created on first
//! use (or by `fence init`) without adding a round trip to the hot path: requests run
//! optimistically and the schema is created only when the server says it is missing.

use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use crate::error::Error;
use crate::pg::sqlstate::Fence;
use crate::pg::{self, ConnectParams, CONNECT_PATIENCE, REQUEST_TIMEOUT};

/// How many times a coordinator statement the server rolled back on its own (see
/// [`ROLLED_BACK`]) is sent in all.
const CANCELLED_ATTEMPTS: u32 = 3;

/// What the server answers when it rolled a statement back for a reason of the moment, not
/// of the statement: cancelled (a short `statement_timeout`, an admin's pg_cancel_backend), a
/// lock not granted within the role's `lock_timeout`, a serialization failure (a role or
/// database whose `default_transaction_isolation` is repeatable read or serializable, racing
/// another update of the row) or a deadlock. Nothing of it was applied: sent again.
const ROLLED_BACK: [SqlState; 4] = [
    SqlState::QUERY_CANCELED,
    SqlState::LOCK_NOT_AVAILABLE,
    SqlState::T_R_SERIALIZATION_FAILURE,
    SqlState::T_R_DEADLOCK_DETECTED,
];

fn rolled_back(err: &tokio_postgres::Error) -> bool {
    err.code().is_some_and(|code| ROLLED_BACK.contains(code))
}

/// One of fence's schemas: where its version is kept and the script that creates it.
pub struct SchemaSpec {
    /// Table (in the schema) holding `schema_version`.
    pub meta_table: &'static str,
    pub version: i32,
    /// Idempotent creation script; `__SCHEMA__` stands for the schema name, `__CHANNEL__`
    /// for the schema's notification channel ([`channel`]).
    pub sql: &'static str,
    /// Distinguishes the advisory lock of each kind of schema.
    pub purpose: &'static str,
}

/// The notification channel of fence's schema `schema`: `fence_<schema>`, cut to the 63 bytes
/// PostgreSQL allows a channel (a schema name may take 63 itself; `pg_notify` refuses a longer
/// channel, and `LISTEN` cuts it to the same 63). Schema names are ASCII, so any cut falls on
/// a character. Two long names alike in their first 57 characters share a channel: each
/// waiter then also hears the other schema's notifications, which name resources, not
/// schemas, and only poll once for nothing (a notification never grants anything).
pub fn channel(schema: &str) -> String {
    let mut channel = format!("fence_{schema}");
    channel.truncate(63);
    channel
}

/// The `CREATE OR REPLACE FUNCTION` statements of a schema script that name its channel.
fn notifying_functions(sql: &str) -> impl Iterator<Item = &str> {
    sql.match_indices("CREATE OR REPLACE FUNCTION")
        .filter_map(move |(start, _)| {
            let rest = &sql[start..];
            let body = rest.find("$fn$")? + 4;
            let end = body + rest[body..].find("$fn$;")? + 5;
            Some(&rest[..end])
        })
        .filter(|function| function.contains("__CHANNEL__"))
}

pub struct Session {
    pub client: Client,
    /// Notifications for channels this connection listens to.
    pub notifications: tokio::sync::Mutex<pg::Notifications>,
    pub display: String,
    pub schema: String,
    /// Where the connection goes, kept to send cancel requests there.
    server: ConnectParams,
    spec: &'static SchemaSpec,
    /// When the last request was handed to the connection (after it was made): a grant's
    /// bound counts from here, not from before a connect of several round trips.
    last_sent: std::cell::Cell<Option<tokio::time::Instant>>,
}

impl Session {
    pub async fn open(
        url: &str,
        display: &str,
        schema: &str,
        spec: &'static SchemaSpec,
    ) -> Result<Session, Error> {
        Session::open_until(
            url,
            display,
            schema,
            spec,
            Instant::now() + CONNECT_PATIENCE,
            &pg::Refusals::default(),
        )
        .await
    }

    /// [`Session::open`], retrying a server that cannot take the connection now until `until`;
    /// its refusals are kept in `refusals` (see [`ConnectParams::connect_until`]).
    pub async fn open_until(
        url: &str,
        display: &str,
        schema: &str,
        spec: &'static SchemaSpec,
        until: Instant,
        refusals: &pg::Refusals,
    ) -> Result<Session, Error> {
        let server = ConnectParams::resolve(url, display)?;
        let (client, notifications) = server.connect_until(until, refusals).await?;
        Ok(Session {
            client,
            notifications: tokio::sync::Mutex::new(notifications),
            display: display.to_owned(),
            schema: schema.to_owned(),
            server,
            spec,
            last_sent: std::cell::Cell::new(None),
        })
    }

    /// `sql` with this session's schema, its channel and its schema's version filled in.
    pub fn expand(&self, sql: &str) -> String {
        sql.replace("__CHANNEL__", &channel(&self.schema))
            .replace("__SCHEMA__", &self.schema)
            .replace("__VERSION__", &self.spec.version.to_string())
    }

    /// Asks the server to cancel the request this session is running.
    pub async fn cancel(&self) -> Result<(), Error> {
        self.server.cancel(&self.client.cancel_token()).await
    }

    /// `init`: creates or migrates the schema; returns the version it found (`None`: no
    /// schema) and the version it is at now.
    pub async fn init(&self) -> Result<(Option<i32>, i32), Error> {
        let before = self.schema_version().await?;
        match before {
            Some(v) if v > self.spec.version => return Err(self.newer_schema(v)),
            Some(v) if v == self.spec.version => {
                self.repair_channel().await?;
                return Ok((before, v));
            }
            _ => self.migrate().await?,
        }
        Ok((before, self.spec.version))
    }

    /// A current schema whose name is too long for `fence_<schema>` as a channel may have been
    /// made by a fence that named the channel in full: its functions that notify failed
    /// ("channel name too long"), so a `--wait` could not be granted. Those that still name
    /// it in full are made again with the channel cut to size, under the schema's advisory
    /// lock (two at once would fail: "tuple concurrently updated"), after looking again
    /// inside it; no table is touched. A schema that needs nothing is only read, so `init`
    /// stays a read for a role that may not replace fence's functions.
    async fn repair_channel(&self) -> Result<(), Error> {
        let full = format!("fence_{}", self.schema);
        if channel(&self.schema) == full || !self.names_full_channel(&full).await? {
            return Ok(());
        }
        let what = format!(
            "repair the notification channel of schema `{}` (its functions name it whole, longer than PostgreSQL allows)",
            self.schema
        );
        let lock = format!(
            "BEGIN; SELECT pg_advisory_xact_lock(hashtext('fence {} schema {}'))",
            self.spec.purpose, self.schema
        );
        let result = match self.batch(&what, &lock).await {
            Ok(()) => match self.names_full_channel(&full).await {
                Ok(true) => {
                    let functions: Vec<&str> = notifying_functions(self.spec.sql).collect();
                    let script = format!("{}\nCOMMIT;", self.expand(&functions.join("\n")));
                    self.batch(&what, &script).await
                }
                Ok(false) => self.batch(&what, "COMMIT").await,
                Err(err) => Err(err),
            },
            Err(err) => Err(err),
        };
        if result.is_err() {
            self.rollback().await;
        }
        result
    }

    /// Whether a function of the schema names the channel `full` whole (as a quoted string:
    /// an earlier fence's `pg_notify`).
    async fn names_full_channel(&self, full: &str) -> Result<bool, Error> {
        let what = "read fence's functions";
        let quoted = format!("'{full}'");
        let rows = self
            .request(
                what,
                false,
                "SELECT EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
                 WHERE n.nspname = $1 AND strpos(p.prosrc, $2) > 0)",
                &[(&self.schema, Type::TEXT), (&quoted, Type::TEXT)],
            )
            .await?
            .map_err(|err| pg::request_error(err, &self.display, what, false))?;
        Ok(rows.first().is_some_and(|row| row.get::<_, bool>(0)))
    }

    /// Runs one request; a write creates the schema first if it does not exist yet, a read
    /// of a missing schema returns no rows.
    pub async fn call(
        &self,
        what: &str,
        mutating: bool,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        let sql = self.expand(sql);
        let answer = self.request(what, mutating, &sql, params).await?;
        match answer {
            Ok(rows) => Ok(rows),
            // A statement that checks the schema's version failed its cast: the schema may be
            // at another version. Which one is read from the schema itself, never from the
            // server's message (translated under another lc_messages). Newer (or unreadable):
            // never used. Older or without a version: migrated. Either way, or when it is
            // current (another fence migrated it since, or the cast was not the check's), the
            // statement, of which nothing was applied, is sent once more and its answer stands.
            Err(err)
                if err.code() == Some(&SqlState::INVALID_TEXT_REPRESENTATION)
                    && checks_version(&sql) =>
            {
                match self.schema_version().await? {
                    Some(v) if v > self.spec.version => return Err(self.newer_schema(v)),
                    Some(v) if v == self.spec.version => {}
                    _ => self.migrate().await?,
                }
                match self.request(what, mutating, &sql, params).await? {
                    Ok(rows) => Ok(rows),
                    Err(err) => Err(self.request_error(err, what, mutating)),
                }
            }
            // A read of a schema that does not exist yet has nothing to report; only writes
            // create it. Nor has a read of a column an older version did not have yet (the
            // waiters' deadline before version 3): the next write migrates the schema.
            Err(err) if is_missing_schema(&err) && !mutating => Ok(Vec::new()),
            Err(err) if err.code() == Some(&SqlState::UNDEFINED_COLUMN) && !mutating => {
                Ok(Vec::new())
            }
            // A write to a coordinator schema older than its statement (version 3 had no
            // `previous_expires_at`, which the one-shot acquire writes) migrates it too. Not
            // on a target, where a missing column is the caller's (`write --row`).
            Err(err)
                if is_missing_schema(&err)
                    || (err.code() == Some(&SqlState::UNDEFINED_COLUMN)
                        && self.spec.purpose != "target") =>
            {
                self.migrate().await?;
                match self.request(what, mutating, &sql, params).await? {
                    Ok(rows) => Ok(rows),
                    Err(err) => Err(self.request_error(err, what, mutating)),
                }
            }
            // Rolled back by the server for a reason of the moment ([`ROLLED_BACK`]): a
            // coordinator's statement runs alone in autocommit, so nothing was applied; it is
            // sent again, a few times.
            Err(err) if rolled_back(&err) && self.spec.purpose == "coordinator" => {
                let mut last = err;
                for _ in 1..CANCELLED_ATTEMPTS {
                    match self.request(what, mutating, &sql, params).await? {
                        Ok(rows) => return Ok(rows),
                        Err(err) if rolled_back(&err) => last = err,
                        Err(err) => return Err(self.request_error(err, what, mutating)),
                    }
                }
                Err(self.request_error(last, what, mutating))
            }
            Err(err) => Err(self.request_error(err, what, mutating)),
        }
    }

    /// A read whose rows are handed to `each` as they arrive, until it returns false: the
    /// server's answer streams (tokio-postgres applies back-pressure), so memory follows the
    /// rows in flight, not the answer. Each row has [`REQUEST_TIMEOUT`] to come. A schema
    /// (or a column) that does not exist yet has no rows, as for [`Self::call`].
    pub async fn call_each(
        &self,
        what: &str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        each: &mut dyn FnMut(&Row) -> bool,
    ) -> Result<(), Error> {
        use futures_core::Stream;
        let sql = self.expand(sql);
        let lost = || {
            pg::lost(
                &self.display,
                what,
                &format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()),
                false,
            )
        };
        self.last_sent.set(Some(tokio::time::Instant::now()));
        let started = pg::answer_within_timeout(
            self.client
                .query_typed_raw(&sql, params.iter().map(|(value, ty)| (*value, ty.clone()))),
        )
        .await
        .map_err(|_| lost())?;
        let failed = |err: tokio_postgres::Error| {
            if is_missing_schema(&err) || err.code() == Some(&SqlState::UNDEFINED_COLUMN) {
                Ok(())
            } else {
                Err(self.request_error(err, what, false))
            }
        };
        let rows = match started {
            Ok(rows) => rows,
            Err(err) => return failed(err),
        };
        let mut rows = std::pin::pin!(rows);
        loop {
            let next = std::future::poll_fn(|cx| rows.as_mut().poll_next(cx));
            match pg::answer_within_timeout(next).await.map_err(|_| lost())? {
                Some(Ok(row)) => {
                    if !each(&row) {
                        return Ok(());
                    }
                }
                Some(Err(err)) => return failed(err),
                None => return Ok(()),
            }
        }
    }

    /// One request with a deadline. The outer error is a timeout; the inner one is the
    /// server's answer, left to the caller to classify.
    pub async fn request(
        &self,
        what: &str,
        mutating: bool,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Result<Vec<Row>, tokio_postgres::Error>, Error> {
        pg::answer_within_timeout(self.query(sql, params))
            .await
            .map_err(|_| {
                pg::lost(
                    &self.display,
                    what,
                    &format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()),
                    mutating,
                )
            })
    }

    /// Every request is an unnamed statement (`query_typed`: Parse, Bind, Execute and Sync in
    /// one round trip), never a named prepared statement: behind a transaction-mode pooler
    /// (PgBouncer) consecutive transactions run on different server connections, where a
    /// named statement is missing ("does not exist"), already taken ("s0 already exists"), or
    /// worse, another client's statement of the same name. The server's parse and plan that
    /// preparing saved cost about 0.06 ms per request (`fence bench`, docs/performance.md),
    /// and a one-shot command sends each statement once per connection anyway.
    async fn query(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        self.last_sent.set(Some(tokio::time::Instant::now()));
        self.client.query_typed(sql, params).await
    }

    /// When the last request was sent (see [`Session::last_sent`]'s field).
    pub fn last_sent(&self) -> Option<tokio::time::Instant> {
        self.last_sent.get()
    }

    /// Whether the schema exists (in any version).
    pub async fn exists(&self) -> Result<bool, Error> {
        Ok(self.schema_version().await?.is_some())
    }

    /// The schema's version, or `None` when it does not exist yet. Never raises an SQL
    /// error, so it is safe inside the migration transaction.
    async fn schema_version(&self) -> Result<Option<i32>, Error> {
        let what = "read the schema version";
        let exists = format!(
            "SELECT to_regclass('{}.{}') IS NOT NULL",
            self.schema, self.spec.meta_table
        );
        let rows = self
            .request(what, false, &exists, &[])
            .await?
            .map_err(|err| pg::request_error(err, &self.display, what, false))?;
        if !rows.first().is_some_and(|row| row.get::<_, bool>(0)) {
            return Ok(None);
        }
        let sql = format!(
            "SELECT value FROM {}.{} WHERE key = 'schema_version'",
            self.schema, self.spec.meta_table
        );
        let rows = self
            .request(what, false, &sql, &[])
            .await?
            .map_err(|err| pg::request_error(err, &self.display, what, false))?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let found: Option<String> = row.get(0);
        // Only the number as fence writes it: the statements' own check compares the text
        // (`'05'` is not `'5'`), so a version read otherwise would be "current" here and
        // refused there, the statement resent to fail again.
        let canonical = |v: &str| v.parse::<i32>().ok().filter(|n| n.to_string() == v);
        match found.as_deref().map(|v| (v, canonical(v))) {
            None => Ok(None),
            Some((_, Some(version))) => Ok(Some(version)),
            // Not a version this fence can compare ('6.1', '6 ', '05'): a newer fence's, or a
            // hand's. Never migrated over, never used.
            Some((found, None)) => Err(Error::usage(
                format!(
                    "PostgreSQL at `{}`: schema `{}` is at version `{found}`, which this fence cannot read (it knows up to {})",
                    self.display, self.schema, self.spec.version
                ),
                format!(
                    "upgrade fence, or use another --schema; if the version was changed by hand, set it back in {}.{} (key schema_version)",
                    self.schema, self.spec.meta_table
                ),
            )),
        }
    }

    /// A schema a newer fence made (or migrated): this fence must not use or "migrate" it.
    pub(crate) fn newer_schema(&self, version: i32) -> Error {
        Error::usage(
            format!(
                "PostgreSQL at `{}`: schema `{}` was created by a newer fence (version {version}; this fence knows up to {})",
                self.display, self.schema, self.spec.version
            ),
            "upgrade fence, or use another --schema",
        )
    }

    /// Creates or migrates the schema in one transaction, under an advisory lock so that
    /// concurrent first uses do not race. A schema that is already current is left alone:
    /// re-running the DDL under live traffic would take table locks and can deadlock.
    pub async fn migrate(&self) -> Result<(), Error> {
        let what = format!("create fence's schema `{}`", self.schema);
        let lock = format!(
            "BEGIN; SELECT pg_advisory_xact_lock(hashtext('fence {} schema {}'))",
            self.spec.purpose, self.schema
        );
        let result = match self.batch(&what, &lock).await {
            Ok(()) => match self.schema_version().await {
                Ok(Some(v)) if v > self.spec.version => Err(self.newer_schema(v)),
                Ok(Some(v)) if v == self.spec.version => self.batch(&what, "COMMIT").await,
                Ok(_) => {
                    let body = self.expand(self.spec.sql);
                    self.batch(&what, &format!("{body}\nCOMMIT;")).await
                }
                Err(err) => Err(err),
            },
            Err(err) => Err(err),
        };
        if result.is_err() {
            self.rollback().await;
        }
        result
    }

    /// [`pg::request_error`], except that a target database's missing privileges point to
    /// `fence grant`: the generic hint (write access to fence's tables, a schema the user
    /// owns) would let that user bypass `fence protect`.
    pub fn request_error(&self, err: impl pg::Failure, what: &str, mutating: bool) -> Error {
        match err.error().as_db_error() {
            Some(db)
                if self.spec.purpose == "target"
                    && *db.code() == SqlState::INSUFFICIENT_PRIVILEGE =>
            {
                let refused = Error::usage(
                    format!("PostgreSQL at `{}` refused to {what}: {}", self.display, db.message()),
                    format!(
                        "if this is fence's schema `{}`, have the admin run `fence grant --target URL --role ROLE` for this user (never grant it writes on fence's tables or ownership of the schema: either bypasses `fence protect`); privileges on your own tables are granted as usual",
                        self.schema
                    ),
                );
                pg::caused(refused, err.into_cause())
            }
            // A function of a long-named schema made by an older fence notifies on a
            // channel too long (`repair_channel`).
            Some(db)
                if self.spec.purpose == "coordinator"
                    && *db.code() == SqlState::INVALID_PARAMETER_VALUE
                    && channel(&self.schema) != format!("fence_{}", self.schema) =>
            {
                let refused = Error::usage(
                    format!("PostgreSQL at `{}` failed to {what}: {}", self.display, db.message()),
                    format!(
                        "schema `{}` was made by an older fence that named its notification channel in full, longer than PostgreSQL allows: run `fence init --schema {}` once to repair it",
                        self.schema, self.schema
                    ),
                );
                pg::caused(refused, err.into_cause())
            }
            _ => pg::request_error(err, &self.display, what, mutating),
        }
    }

    /// Ends a failed transaction. Bounded like every request (the connection may be why it
    /// failed); its outcome changes nothing, so it is not reported.
    pub async fn rollback(&self) {
        let _ = pg::answer_within_timeout(self.client.batch_execute("ROLLBACK")).await;
    }

    async fn batch(&self, what: &str, script: &str) -> Result<(), Error> {
        let result = pg::answer_within_timeout(self.client.batch_execute(script))
            .await
            .map_err(|_| pg::lost(&self.display, what, "no answer", true))?;
        result.map_err(|err| {
            let failure = self.batch_error(&err, what);
            pg::caused(failure, pg::Failure::into_cause(err))
        })
    }

    /// What a failed script of [`Session::batch`] means (the caller keeps the driver's error
    /// as its source).
    fn batch_error(&self, err: &tokio_postgres::Error, what: &str) -> Error {
        match err.as_db_error() {
            Some(db) if Fence::of(db.code()) == Some(Fence::NewerSchema) => Error::usage(
                format!("PostgreSQL at `{}`: {}", self.display, db.message()),
                "upgrade fence, or use another --schema",
            ),
            Some(db) if *db.code() == SqlState::INSUFFICIENT_PRIVILEGE && self.spec.purpose == "target" => Error::usage(
                format!("PostgreSQL at `{}` refused to {what}: {}", self.display, db.message()),
                format!(
                    "the admin prepares a target: run `fence init --target URL --schema {}` as the admin, then `fence grant --target URL --role ROLE` for this user; the application's role must never own fence's schema",
                    self.schema
                ),
            ),
            Some(db) if *db.code() == SqlState::INSUFFICIENT_PRIVILEGE => Error::usage(
                format!("PostgreSQL at `{}` refused to {what}: {}", self.display, db.message()),
                "have a user who may create schemas run `fence init` once and grant this user access to that schema, or pass --schema naming a schema this user may create",
            ),
            _ => pg::request_error(err, &self.display, what, true),
        }
    }
}

/// What a statement that checks the schema's version casts to an integer when the version is
/// not this fence's (see `schema_is_current!` in `coordinator::pg_one_shot`): that cast fails
/// with SQLSTATE 22P02. fence's own SQL, never the server's message, tells such a statement.
const VERSION_CHECK: &str = "'fence schema version '";

/// Whether `sql` (fence's own statement) carries the schema version check.
fn checks_version(sql: &str) -> bool {
    sql.contains(VERSION_CHECK)
}

pub fn is_missing_schema(err: &tokio_postgres::Error) -> bool {
    err.code().is_some_and(|code| {
        *code == SqlState::INVALID_SCHEMA_NAME
            || *code == SqlState::UNDEFINED_TABLE
            || *code == SqlState::UNDEFINED_FUNCTION
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The statements whose failed cast [`Session::call`] answers by reading the schema's
    /// version are exactly the coordinator's one-shot statements, which carry the check.
    #[test]
    fn the_one_shot_statements_carry_the_version_check() {
        use crate::coordinator::pg_one_shot::{
            ACQUIRE, ACQUIRE_FAST, RELEASE, RELEASE_FAST, RENEW, RENEW_FAST,
        };
        for sql in [
            ACQUIRE,
            ACQUIRE_FAST,
            RENEW,
            RENEW_FAST,
            RELEASE,
            RELEASE_FAST,
        ] {
            assert!(checks_version(sql), "{sql}");
        }
        assert!(!checks_version(
            "SELECT value FROM __SCHEMA__.meta WHERE key = 'schema_version'"
        ));
    }

    /// A schema name may take 63 bytes; its channel never does.
    #[test]
    fn the_channel_fits_postgresql_s_limit_and_is_unchanged_where_it_fitted() {
        assert_eq!(channel("fence"), "fence_fence");
        let fits = "s".repeat(57);
        assert_eq!(channel(&fits), format!("fence_{fits}"));
        let long = "s".repeat(63);
        assert_eq!(channel(&long).len(), 63);
        assert!(channel(&long).starts_with("fence_sss"));
    }

    /// The repair of a long-named schema makes again exactly the coordinator's functions
    /// that notify, each statement whole.
    #[test]
    fn the_functions_that_notify_are_found_whole() {
        let sql = crate::coordinator::COORDINATOR_SCHEMA.sql;
        let found: Vec<&str> = notifying_functions(sql).collect();
        let names: Vec<&str> = found
            .iter()
            .map(|f| {
                let name = f.split('(').next().unwrap();
                name.rsplit('.').next().unwrap()
            })
            .collect();
        assert_eq!(names, ["wait_enter", "wait_poll", "wait_leave", "release"]);
        for function in found {
            assert!(function.ends_with("$fn$;"), "{function}");
            assert_eq!(function.matches("$fn$").count(), 2, "{function}");
        }
    }
}
