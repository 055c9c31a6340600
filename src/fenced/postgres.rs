//! The PostgreSQL target (DESIGN §3 `write`/`protect`, §7–§8): fenced transactions, fenced
//! row writes, and the trigger that makes every other write path go through the fence.
//!
//! Every fenced write commits synchronously (`synchronous_commit = on` set last in its
//! transaction, after the caller's SQL, which cannot undo it): with the database at `off`, an
//! acknowledged guard row could be lost in a crash and a stale token accepted after it.
//!
//! Transaction form: `BEGIN ISOLATION LEVEL READ COMMITTED`, `begin_write` (advance the guard
//! row iff the token is ≥ the highest accepted, bind the token to this transaction), the
//! caller's SQL and `COMMIT` are pipelined: one round trip. If `begin_write` refuses, the
//! transaction is aborted, so the caller's SQL cannot run and `COMMIT` rolls back.

use std::time::Duration;

use futures_core::Stream;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::SimpleQueryMessage;

use crate::error::{ConflictKind, Error};
use crate::fenced::target::{wrong_form, Applied, Body, Outcome, TargetView, WriteRequest};
use crate::fenced::{quote_literal, quote_table, write_digest, TargetSpec};
use crate::pg::range::LogRange;
use crate::pg::session::{is_missing_schema, SchemaSpec, Session};
use crate::pg::sqlstate::{self, Fence};
use crate::pg::{self};
use crate::signals::Interrupts;
use crate::timeline::{Event, EventKind, LogQuery, Logged};

/// fence's tables in a target database.
pub const TARGET_SCHEMA: SchemaSpec = SchemaSpec {
    meta_table: "target_meta",
    version: 6,
    sql: include_str!("guard.sql"),
    purpose: "target",
};

pub struct PgTarget {
    session: Session,
}

/// The result of one statement of the caller's SQL (as `fence write` prints it in JSON).
#[derive(Debug, Default, serde::Serialize)]
pub struct StatementResult {
    /// Rows inserted, updated, deleted or returned.
    pub rows_affected: u64,
    /// Column names when the statement returned rows.
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Option<String>>>,
}

/// A row write (`--table`, `--key`, `--set`).
pub struct RowWrite {
    pub table: String,
    pub key: serde_json::Map<String, serde_json::Value>,
    pub set: serde_json::Map<String, serde_json::Value>,
    pub token_column: String,
    pub upsert: bool,
}

/// What a row write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowOutcome {
    Applied,
    Inserted,
}

/// The guard row of one resource, for `inspect --target`.
#[derive(Debug)]
pub struct GuardView {
    pub resource: String,
    pub highest_token: Option<i64>,
    pub updated_at_ms: Option<i64>,
    pub updated_by: Option<String>,
    pub accepted_writes: i64,
    pub rejected_writes: i64,
}

impl PgTarget {
    pub async fn connect(spec: &TargetSpec, schema: &str) -> Result<PgTarget, Error> {
        Ok(PgTarget {
            session: Session::open(&spec.url, &spec.display, schema, &TARGET_SCHEMA).await?,
        })
    }

    fn display(&self) -> &str {
        &self.session.display
    }

    /// Runs `sql` in one fenced transaction. Whatever makes fence give up before the answer
    /// (`write.timeout`, a stop signal), it cancels the transaction on the server and waits for
    /// the outcome, so it reports what is true instead of leaving a transaction to commit.
    pub async fn write_transaction(
        &self,
        write: &TxWrite<'_>,
        interrupts: &mut Interrupts,
    ) -> Result<TxOutcome, Error> {
        match self.fenced(write, interrupts).await {
            Err(Retry::MissingSchema) => {
                // Creating the schema may wait behind another process's creation of it: a stop
                // signal ends that wait, before anything of the write was sent.
                tokio::select! {
                    migrated = self.session.migrate() => migrated?,
                    (_, name) = interrupts.next() => {
                        return Err(Error::unavailable(
                            format!(
                                "interrupted by {name} while creating fence's schema in `{}`, before the write to `{}` was sent",
                                self.display(),
                                write.resource
                            ),
                            "nothing was sent, so nothing was applied; it is safe to retry",
                        ))
                    }
                }
                match self.fenced(write, interrupts).await {
                    Err(Retry::MissingSchema) => Err(Error::internal(
                        "fence's guard functions are still missing after creating them",
                        "check that --schema is not shadowed, and report this bug",
                    )),
                    Err(Retry::Fail(err)) => Err(err),
                    Ok(results) => Ok(results),
                }
            }
            Err(Retry::Fail(err)) => Err(err),
            Ok(results) => Ok(results),
        }
    }

    /// One attempt: the whole transaction goes out as ONE simple-query message, so the server
    /// runs none of the caller's statements once `begin_write` fails (it skips the rest of a
    /// message after an error), and `end_write` rolls back anything that ran after the caller's
    /// SQL ended the transaction fence began (see guard.sql).
    async fn fenced(
        &self,
        write: &TxWrite<'_>,
        interrupts: &mut Interrupts,
    ) -> Result<TxOutcome, Retry> {
        // A stop signal that came while connecting (or creating the schema): send nothing.
        if let Some(name) = interrupts.pending() {
            return Err(Retry::Fail(Error::unavailable(
                format!(
                    "interrupted by {name} before the write to `{}` was sent",
                    write.resource
                ),
                "nothing was sent, so nothing was applied; it is safe to retry",
            )));
        }
        let client = &self.session.client;
        let script = self.script(write);
        let sent = std::time::Instant::now();
        // The checks on the caller's SQL read string literals as standard_conforming_strings
        // does; it must be on when the server parses the script, so it is set by the message
        // before (PgBouncer tracks this setting per client).
        let answer = async {
            let (scs, answer) = tokio::join!(
                client.simple_query("SET standard_conforming_strings = on"),
                collect(client, &script),
            );
            match scs {
                Ok(_) => answer,
                Err(err) => Answer::Failed {
                    completed: 0,
                    err,
                    ended: false,
                },
            }
        };
        tokio::pin!(answer);
        // The answer past the limit gets a last look (a pause of fence's own is not the
        // server's slowness).
        let gave_up = tokio::select! {
            answer = crate::time::answer_within(write.timeout + SERVER_FIRST, &mut answer) => match answer {
                Ok(answer) => return self.settle(answer, write, None, sent).await,
                Err(_) => GaveUp::Timeout(write.timeout),
            },
            (_, name) = interrupts.next() => GaveUp::Signal(name),
        };
        // Cancel on the server and wait for the answer: it says whether the COMMIT got in
        // first. The cancel request is a connection of its own, bounded like the wait.
        let cancelled = match tokio::time::timeout(CANCEL_WAIT, self.session.cancel()).await {
            Ok(cancelled) => cancelled,
            Err(_) => Err(Error::unavailable(
                format!("no answer within {}s", CANCEL_WAIT.as_secs()),
                "",
            )),
        };
        match crate::time::answer_within(CANCEL_WAIT, &mut answer).await {
            Ok(answer) => self.settle(answer, write, Some(gave_up), sent).await,
            Err(_) => Err(Retry::Fail(Error::OutcomeUnknown {
                message: format!(
                    "{}; fence asked PostgreSQL at `{}` to cancel the write to `{}`{} and got no answer within {}s",
                    gave_up.what(),
                    self.display(),
                    write.resource,
                    match cancelled {
                        Ok(()) => String::new(),
                        Err(err) => format!(" (the cancel request failed: {err})"),
                    },
                    CANCEL_WAIT.as_secs()
                ),
                hint: format!(
                    "the transaction may or may not commit (it cannot commit later than {} after it began): check `{}` and the data before retrying",
                    crate::time::duration(write.timeout),
                    crate::error::command_for("fence inspect", write.resource, " --target …")
                ),
                source: None,
            })),
        }
    }

    fn script(&self, write: &TxWrite<'_>) -> String {
        fenced_script(&self.session.schema, write)
    }

    /// Turns the server's answer into the outcome; `gave_up` says why fence stopped waiting
    /// before it came.
    async fn settle(
        &self,
        answer: Answer,
        write: &TxWrite<'_>,
        gave_up: Option<GaveUp>,
        sent: std::time::Instant,
    ) -> Result<TxOutcome, Retry> {
        let (completed, err, ended) = match answer {
            Answer::Done(messages) => {
                if let Some(gave_up) = gave_up {
                    crate::terminal::warn(&format!(
                        "warning: {}, but the transaction committed all the same (the cancel came too late, or the SQL caught it): its changes stand",
                        gave_up.what()
                    ));
                }
                let mut results = statement_results(messages);
                // BEGIN, the version check, three SETs and begin_write before; CLOSE ALL,
                // end_write and COMMIT after.
                results.truncate(results.len().saturating_sub(3));
                return Ok(TxOutcome::Applied(
                    results.split_off(PRELUDE_STATEMENTS.min(results.len())),
                ));
            }
            Answer::Failed {
                completed,
                err,
                ended,
            } => (completed, err, ended),
        };
        // The transaction is aborted (or the connection gone): end it before anything else.
        self.session.rollback().await;
        if let Some(db) = err
            .as_db_error()
            .filter(|db| Fence::of(db.code()) == Some(Fence::VersionMismatch))
        {
            // Nothing of the write ran. Older: migrated, then the write again; newer: refused.
            let found: Option<i32> = db.message().rsplit(' ').next().and_then(|v| v.parse().ok());
            return match found {
                Some(v) if v > TARGET_SCHEMA.version => {
                    Err(Retry::Fail(self.session.newer_schema(v)))
                }
                _ => Err(Retry::MissingSchema),
            };
        }
        if is_missing_schema(&err)
            && (completed < PRELUDE_STATEMENTS || self.lacks_end_write().await)
        {
            return Err(Retry::MissingSchema);
        }
        if completed < PRELUDE_STATEMENTS {
            if let Some(refused) = self.missing_grant(&err) {
                return Err(Retry::Fail(refused));
            }
            if let Some((entry, digest)) = replayed(&err) {
                let id = write.write_id.unwrap_or_default();
                crate::fenced::check_reused_id(
                    digest.as_deref(),
                    &write_digest(write.sql.as_bytes()),
                    write.resource,
                    write.token,
                    id,
                    entry.token,
                )
                .map_err(Retry::Fail)?;
                return Ok(TxOutcome::Replayed(entry));
            }
        }
        // A timeout: the statement cancelled (by statement_timeout, or end_write past the
        // deadline), or a lock not granted within lock_timeout.
        let lock_wait = err.code() == Some(&SqlState::LOCK_NOT_AVAILABLE);
        let cancelled = err.code().is_some_and(|state| {
            *state == SqlState::QUERY_CANCELED || Fence::of(state) == Some(Fence::TimedOut)
        });
        let rolled_back = |why: String| {
            Retry::Fail(Error::unavailable(
                why,
                "the transaction was rolled back and nothing was applied; it is safe to retry",
            ))
        };
        // fence's own timeouts fire only once --timeout has passed; the same SQLSTATEs earlier
        // come from the caller's SQL (its own timeouts, or a RAISE), which failed.
        let ours = gave_up.is_some() || sent.elapsed() >= write.timeout;
        if !ours && (cancelled || lock_wait) {
            return Err(Retry::Fail(
                self.classify(&err, write, completed, ended).await,
            ));
        }
        match (cancelled, lock_wait, gave_up) {
            (true, _, Some(gave_up)) => Err(rolled_back(format!(
                "{}: fence cancelled the write to `{}` on PostgreSQL at `{}`",
                gave_up.what(),
                write.resource,
                self.display()
            ))),
            (true, _, None) => Err(rolled_back(format!(
                "the write to `{}` did not finish within its {} timeout (--timeout), so PostgreSQL at `{}` cancelled it",
                write.resource,
                crate::time::duration(write.timeout),
                self.display()
            ))),
            (_, true, _) => Err(rolled_back(format!(
                "the write to `{}` waited {} for a lock held by another transaction (another fenced write of the same resource, or a writer of the same rows)",
                write.resource,
                crate::time::duration(write.timeout)
            ))),
            _ => Err(Retry::Fail(self.classify(&err, write, completed, ended).await)),
        }
    }

    /// Whether the schema predates `end_write` (version 1): then a failure to find it means
    /// "migrate", not a mistake in the caller's SQL.
    async fn lacks_end_write(&self) -> bool {
        let sql = format!(
            "SELECT to_regprocedure('{}.end_write(text,bigint,bigint)') IS NULL",
            self.session.schema
        );
        match self.session.client.query_one(&sql, &[]).await {
            Ok(row) => row.get(0),
            Err(_) => false,
        }
    }

    /// Maps a failure inside the fenced transaction to its outcome, recording rejections.
    /// `completed`: how many statements of the message completed before the failure. Only
    /// fence's own guard (before the caller's SQL) speaks for the token: the same SQLSTATEs
    /// raised later come from the caller's SQL, which failed (`sql_failed`).
    async fn classify(
        &self,
        err: &tokio_postgres::Error,
        write: &TxWrite<'_>,
        completed: usize,
        ended: bool,
    ) -> Error {
        let TxWrite {
            resource,
            token,
            owner,
            ..
        } = *write;
        let what = format!("write to `{resource}`");
        // A lost session is a lost connection whoever reports it (`pg::session_lost`): a
        // pooler that lost its server connection answers FATAL 08P01 with none of the
        // server's answers (they are flushed at the end of the message), so no statement seen
        // completed says nothing of the COMMIT (review 22: exit 1, "unexpected", for a write
        // that committed). Class 08 as an ERROR is the SQL's own (review 23).
        let connected = err.as_db_error().filter(|db| !pg::session_lost(db));
        let Some(db) = connected else {
            let cause = match err.as_db_error() {
                Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
                None => err.to_string(),
            };
            return match pg::lost(self.display(), &what, &cause, true) {
                Error::OutcomeUnknown { message, source, .. } => Error::OutcomeUnknown {
                    message,
                    source,
                    hint: format!(
                        "the transaction may or may not have committed: check `{}` (accepted writes, highest token) and the data before retrying",
                        crate::error::command_for("fence inspect", resource, " --target …")
                    ),
                },
                other => other,
            };
        };
        let guard = completed < PRELUDE_STATEMENTS;
        let error = match Fence::of(db.code()) {
            Some(Fence::Stale | Fence::NeverIssued) if !guard => {
                return Error::SqlFailed {
                    resource: resource.to_owned(),
                    token,
                    sqlstate: db.code().code().to_owned(),
                    message: db.message().to_owned(),
                }
            }
            Some(Fence::ForgedSettings) => Error::usage(
                db.message().to_owned(),
                format!(
                    "{}; the transaction was rolled back",
                    db.hint().unwrap_or("leave the settings fence sets alone: nothing was applied")
                ),
            ),
            Some(Fence::Stale) => Error::Stale {
                resource: resource.to_owned(),
                token,
                highest_token: db
                    .detail()
                    .and_then(|d| d.parse().ok())
                    .unwrap_or(token + 1),
                target: None,
            },
            Some(Fence::NeverIssued) => Error::Conflict {
                resource: resource.to_owned(),
                token,
                kind: ConflictKind::NeverIssued {
                    highest_token: db.detail().and_then(|d| d.parse().ok()).unwrap_or(0),
                },
            },
            // Defence in depth: the SQL ended fence's transaction although the checks before
            // sending found no transaction control. What ran before that may have committed.
            Some(Fence::TransactionEnded) => Error::OutcomeUnknown {
                message: format!(
                    "the SQL ended the fenced transaction of `{resource}` itself ({}); what ran after that was rolled back",
                    db.message()
                ),
                hint: format!(
                    "statements before the COMMIT or ROLLBACK may have committed: check the data and `{}`, remove transaction control from the SQL, and report how it got past fence's checks",
                    crate::error::command_for("fence inspect", resource, " --target …")
                ),
                source: None,
            },
            Some(Fence::NoToken | Fence::NoGuard) => Error::usage(
                format!(
                    "PostgreSQL at `{}` refused the write: {}",
                    self.display(),
                    db.message()
                ),
                db.hint()
                    .unwrap_or(
                        "write through `fence write` with the resource the table is protected by",
                    )
                    .to_owned(),
            ),
            // fence's own guard statements refused by the server (a read-only session: a
            // standby after a failover, `default_transaction_read_only`; a lost permission; a
            // shutdown) is not the caller's SQL's fault: classified as any request of fence's
            // (a review saw a read-only target reported `sql_failed`, "fix the SQL"). Any other
            // error before the guard completed is the SQL's: the server parses the whole
            // script before it runs any of it (a syntax error has completed nothing).
            _ if guard && refused_by_the_server(db.code()) => {
                pg::request_error(err, self.display(), &what, true)
            }
            // After the guard, a session the server ended (terminated, shut down, the
            // connection broken) is not the SQL's fault either (review 14 saw
            // `pg_terminate_backend` reported as "fix the SQL"): rolled back before
            // `end_write` answered, unknown after (the COMMIT may have run). Other errors of
            // the same classes can be the SQL's own (a missing file for COPY, a temp file
            // limit: review 16), and stay `sql_failed`.
            _ if ended_by_the_server(db.code()) => {
                let cause = format!("{} (SQLSTATE {})", db.message(), db.code().code());
                if ended {
                    pg::lost(self.display(), &what, &cause, true)
                } else {
                    Error::unavailable(
                        format!(
                            "PostgreSQL at `{}` ended the session while the write to `{resource}` ran, before it committed: {cause}",
                            self.display()
                        ),
                        "the transaction was rolled back and nothing was applied; it is safe to retry once the server takes connections again",
                    )
                }
            }
            _ => {
                return Error::SqlFailed {
                    resource: resource.to_owned(),
                    token,
                    sqlstate: db.code().code().to_owned(),
                    message: db.message().to_owned(),
                }
            }
        };
        if let Error::Stale { highest_token, .. } = &error {
            let detail = format!("token {highest_token} accepted before");
            let sql = format!(
                "SELECT {}.note_rejected($1, $2, $3, $4)",
                self.session.schema
            );
            // Best effort: the rejection itself is already certain.
            let _ = self
                .session
                .request(
                    "record the rejected write",
                    true,
                    &sql,
                    &[
                        (&resource, Type::TEXT),
                        (&token, Type::INT8),
                        (&owner, Type::TEXT),
                        (&detail, Type::TEXT),
                    ],
                )
                .await;
        }
        error
    }

    /// One conditional row write guarded by the row's own token column.
    /// The row form compares the token row by row, so a key must name at most one row:
    /// else a stale write is applied to a row of the key without a newer token while another
    /// has one, and an upsert inserts beside a newer row (a review showed both). Refused
    /// (usage, nothing sent to the table) unless a valid, non-partial unique index or primary
    /// key on plain columns, all of them `--key` columns, makes the key unique (key values
    /// are never NULL: `--key` gives text, which PostgreSQL converts). A table that does not
    /// exist is left to the write, which names it. One catalog query.
    async fn check_unique_key(
        &self,
        table: &str,
        write: &RowWrite,
        what: &str,
    ) -> Result<(), Error> {
        let columns: Vec<String> = write.key.keys().cloned().collect();
        // Each key column of the index (not its INCLUDE columns) a --key column, in the
        // column's own collation and the type's default operator class (a unique index in
        // "C" on a case-insensitive column admits 'A' and 'a'); with --upsert, exactly the
        // --key columns and not deferrable (ON CONFLICT must find the key's row, and takes no
        // deferrable constraint). And no inheritance children (not partitions): the write
        // reaches their rows too, which the parent's index does not cover.
        let sql = "SELECT to_regclass($1) IS NULL OR ( \
                     NOT EXISTS ( \
                       SELECT 1 FROM pg_catalog.pg_inherits h \
                         JOIN pg_catalog.pg_class c ON c.oid = h.inhparent \
                        WHERE h.inhparent = to_regclass($1) AND c.relkind <> 'p') \
                     AND EXISTS ( \
                       SELECT 1 FROM pg_catalog.pg_index i \
                        WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indisvalid \
                          AND i.indpred IS NULL AND i.indexprs IS NULL \
                          AND (NOT $3 OR (i.indimmediate AND i.indnkeyatts = cardinality($2))) \
                          AND NOT EXISTS ( \
                            SELECT 1 FROM generate_series(0, i.indnkeyatts - 1) AS k(n) \
                             WHERE NOT EXISTS ( \
                               SELECT 1 FROM pg_catalog.pg_attribute a \
                                 JOIN pg_catalog.pg_opclass o ON o.oid = i.indclass[k.n] \
                                WHERE a.attrelid = i.indrelid AND a.attnum = i.indkey[k.n] \
                                  AND a.attname = ANY ($2) \
                                  AND i.indcollation[k.n] = a.attcollation \
                                  AND o.opcdefault))))";
        let params: [(&(dyn ToSql + Sync), Type); 3] = [
            (&table, Type::TEXT),
            (&columns, Type::TEXT_ARRAY),
            (&write.upsert, Type::BOOL),
        ];
        let rows = match self.session.request(what, false, sql, &params).await? {
            Ok(rows) => rows,
            Err(err) => return Err(pg::request_error(err, self.display(), what, false)),
        };
        if rows.first().is_some_and(|row| row.get::<_, bool>(0)) {
            return Ok(());
        }
        let needed = if write.upsert {
            "a primary key or a unique index on exactly these columns (valid, not partial, not deferrable, in each column's own collation; INCLUDE columns aside)"
        } else {
            "a primary key or a unique index on some of these columns (valid, not partial, in each column's own collation; INCLUDE columns aside)"
        };
        Err(Error::usage(
            format!(
                "the key ({}) may name several rows of {table}, and a token compared row by row would let a stale write through: the row form needs {needed}, and a table without inheritance children",
                columns.join(", ")
            ),
            "add such a unique index or primary key, or name its columns as the key, or write with the transaction form (`--sql`), whose guard is the resource's token, not a column",
        ))
    }

    pub async fn write_row(
        &self,
        resource: &str,
        token: i64,
        write: &RowWrite,
        timeout: Duration,
        interrupts: &mut Interrupts,
    ) -> Result<RowOutcome, Error> {
        let table = quote_table(&write.table)?;
        let key = serde_json::Value::Object(write.key.clone());
        let set = serde_json::Value::Object(write.set.clone());
        let what = format!("write a row of {table} for `{resource}`");
        self.check_unique_key(&table, write, &what).await?;
        // check_write first (the schema's version; a token the coordinator in this schema
        // never issued), then write_row on the token it returns: nothing is written unless
        // the checks pass. Then set_config, evaluated after write_row: whatever the database,
        // role or a trigger set, the implicit transaction commits synchronously (a guard row
        // acknowledged and then lost in a crash would let a stale token back in).
        let sql = self.session.expand(
            "SELECT w.status, w.stored_token, pg_catalog.set_config('synchronous_commit', 'on', true) \
             FROM __SCHEMA__.check_write($7, $5, $8) AS c(token) \
             CROSS JOIN LATERAL __SCHEMA__.write_row($1, $2::text::jsonb, $3::text::jsonb, $4, c.token, $6) AS w",
        );
        let (key, set) = (key.to_string(), set.to_string());
        let version = TARGET_SCHEMA.version;
        let params: [(&(dyn ToSql + Sync), Type); 8] = [
            (&table, Type::TEXT),
            (&key, Type::TEXT),
            (&set, Type::TEXT),
            (&write.token_column, Type::TEXT),
            (&token, Type::INT8),
            (&write.upsert, Type::BOOL),
            (&resource, Type::TEXT),
            (&version, Type::INT4),
        ];
        let mut migrated = false;
        let rows = loop {
            let bounded = RowStatement {
                sql: &sql,
                params: &params,
                resource,
                timeout,
            };
            let err = match self.row_statement(&bounded, interrupts).await? {
                Ok(rows) => break rows,
                Err(err) => err,
            };
            let mismatch = err
                .as_db_error()
                .is_some_and(|db| Fence::of(db.code()) == Some(Fence::VersionMismatch));
            // An older schema (no check_write yet, or one that names an older version) is
            // migrated, then written; a newer one is refused, never written as it stands.
            if let Some(found) = err
                .as_db_error()
                .filter(|db| Fence::of(db.code()) == Some(Fence::VersionMismatch))
                .and_then(|db| db.message().rsplit(' ').next()?.parse::<i32>().ok())
                .filter(|found| *found > TARGET_SCHEMA.version)
            {
                return Err(self.session.newer_schema(found));
            }
            if !migrated && (mismatch || is_missing_schema(&err)) {
                self.session.migrate().await?;
                migrated = true;
                continue;
            }
            if let Some(db) = err
                .as_db_error()
                .filter(|db| Fence::of(db.code()) == Some(Fence::NeverIssued))
            {
                return Err(Error::Conflict {
                    resource: resource.to_owned(),
                    token,
                    kind: ConflictKind::NeverIssued {
                        highest_token: db.detail().and_then(|d| d.parse().ok()).unwrap_or(0),
                    },
                });
            }
            return Err(row_error(
                self.session.request_error(&err, &what, true),
                &table,
            ));
        };
        let row = rows
            .first()
            .ok_or_else(|| Error::internal("write_row returned nothing", "report this bug"))?;
        let status: String = row.get(0);
        let stored: Option<i64> = row.get(1);
        match status.as_str() {
            "applied" => Ok(RowOutcome::Applied),
            "inserted" => Ok(RowOutcome::Inserted),
            "stale" => Err(Error::Stale {
                resource: resource.to_owned(),
                token,
                highest_token: stored.unwrap_or_default(),
                target: None,
            }),
            "missing" => Err(Error::Conflict {
                resource: resource.to_owned(),
                token,
                kind: ConflictKind::RowMissing { table },
            }),
            other => Err(Error::internal(
                format!("write_row answered `{other}`"),
                "report this bug",
            )),
        }
    }

    /// The row form's statement in a transaction of its own, bounded as the transaction
    /// form's is: the server gives up by itself at `--timeout` (lock and statement timeouts),
    /// and sooner if fence's connection closes (`client_connection_check_interval`: a
    /// killed `fence write` does not commit later); fence gives up at `--timeout` or a stop
    /// signal, cancels the statement on the server and waits for the answer, which says
    /// whether the COMMIT got in first. (It waited its fixed request time, answered exit 8
    /// and left the statement to commit once the row's lock came free, and a SIGTERM ended
    /// fence with the same effect: review 14.) BEGIN with its settings, the statement and
    /// COMMIT go out together: one round trip.
    async fn row_statement(
        &self,
        statement: &RowStatement<'_>,
        interrupts: &mut Interrupts,
    ) -> Result<Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>, Error> {
        let RowStatement {
            sql,
            params,
            resource,
            timeout,
        } = *statement;
        if let Some(name) = interrupts.pending() {
            return Err(Error::unavailable(
                format!("interrupted by {name} before the write to `{resource}` was sent"),
                "nothing was sent, so nothing was applied; it is safe to retry",
            ));
        }
        let ms = timeout.as_millis().max(1);
        let statement_ms = ms + LOCK_BEFORE_STATEMENT.as_millis();
        let begin = format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; \
             SET LOCAL statement_timeout = {statement_ms}; SET LOCAL lock_timeout = {ms}; \
             SELECT pg_catalog.set_config('client_connection_check_interval', '1000', true) \
             WHERE pg_catalog.current_setting('server_version_num')::pg_catalog.int4 >= 140000"
        );
        let client = &self.session.client;
        let sent = std::time::Instant::now();
        let answer = async {
            // BEGIN's own answer says nothing the statement's does not: after a failed
            // BEGIN, the statement failed in the aborted transaction too.
            let (_, rows, committed) = tokio::join!(
                client.simple_query(&begin),
                client.query_typed(sql, params),
                client.simple_query("COMMIT"),
            );
            match (rows, committed) {
                (Ok(rows), Ok(_)) => Ok(rows),
                (Ok(_), Err(err)) | (Err(err), _) => Err(err),
            }
        };
        tokio::pin!(answer);
        let gave_up = tokio::select! {
            answer = crate::time::answer_within(timeout + SERVER_FIRST, &mut answer) => match answer {
                Ok(answer) => return self.row_answer(answer, statement, None, sent),
                Err(_) => GaveUp::Timeout(timeout),
            },
            (_, name) = interrupts.next() => GaveUp::Signal(name),
        };
        let cancelled = tokio::time::timeout(CANCEL_WAIT, self.session.cancel()).await;
        match crate::time::answer_within(CANCEL_WAIT, &mut answer).await {
            Ok(answer) => self.row_answer(answer, statement, Some(gave_up), sent),
            Err(_) => Err(Error::OutcomeUnknown {
                message: format!(
                    "{}; fence asked PostgreSQL at `{}` to cancel the write to `{resource}`{} and got no answer within {}s",
                    gave_up.what(),
                    self.display(),
                    match cancelled {
                        Ok(Ok(())) => String::new(),
                        Ok(Err(err)) => format!(" (the cancel request failed: {err})"),
                        Err(_) => " (the cancel request got no answer)".into(),
                    },
                    CANCEL_WAIT.as_secs()
                ),
                hint: format!(
                    "the row may or may not have been written (the server stops the statement by itself {} after it began): check the row and `{}` before retrying",
                    crate::time::duration(timeout),
                    crate::error::command_for("fence inspect", resource, " --target …")
                ),
                source: None,
            }),
        }
    }

    /// The answer to [`Self::row_statement`] sent at `sent`; `gave_up` says why fence had
    /// stopped waiting. A cancel or a timeout of fence's (past `--timeout`: the server's own
    /// at it, or fence's cancel) rolled the transaction back; a write that committed anyway
    /// stands, with a warning.
    fn row_answer(
        &self,
        answer: Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>,
        statement: &RowStatement<'_>,
        gave_up: Option<GaveUp>,
        sent: std::time::Instant,
    ) -> Result<Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>, Error> {
        let RowStatement {
            resource, timeout, ..
        } = *statement;
        let err = match &answer {
            Ok(_) => {
                if let Some(gave_up) = gave_up {
                    crate::terminal::warn(&format!(
                        "warning: {}, but the row was written all the same (the cancel came too late): the write stands",
                        gave_up.what()
                    ));
                }
                return Ok(answer);
            }
            Err(err) => err,
        };
        let lock_wait = err.code() == Some(&SqlState::LOCK_NOT_AVAILABLE);
        let cancelled = err.code() == Some(&SqlState::QUERY_CANCELED);
        // Earlier, the same SQLSTATEs are a role's or database's own short timeouts.
        if !(lock_wait || cancelled) || (gave_up.is_none() && sent.elapsed() < timeout) {
            return Ok(answer);
        }
        let why = match (gave_up, lock_wait) {
            (Some(gave_up), _) => format!(
                "{}: fence cancelled the write to `{resource}` on PostgreSQL at `{}`",
                gave_up.what(),
                self.display()
            ),
            (None, true) => format!(
                "the write to `{resource}` waited {} for a lock held by another transaction (a writer of the same row)",
                crate::time::duration(timeout)
            ),
            (None, false) => format!(
                "the write to `{resource}` did not finish within its {} timeout (--timeout), so PostgreSQL at `{}` cancelled it",
                crate::time::duration(timeout),
                self.display()
            ),
        };
        Err(Error::unavailable(
            why,
            "the transaction was rolled back and nothing was applied; it is safe to retry",
        ))
    }

    /// Fails (exit 2) when fence's schema is not in the target database: a read-only
    /// question (`inspect --id`, `log --target`, `metrics --target`) about a typo'd --schema
    /// (FENCE_SCHEMA forgotten) must not be answered "nothing was written there".
    pub async fn require_existing(&self) -> Result<(), Error> {
        if self.session.exists().await? {
            return Ok(());
        }
        Err(Error::usage(
            format!(
                "no fence schema `{}` in the target database at `{}`",
                self.session.schema,
                self.display()
            ),
            "check --schema (FENCE_SCHEMA): it must name the schema the writes used; `fence init --target` or the first `fence write` creates it",
        ))
    }

    /// Write id `id`'s entry in the ledger of `resource`, if it is there.
    pub async fn ledger_entry(
        &self,
        resource: &str,
        id: &str,
    ) -> Result<Option<LedgerEntry>, Error> {
        let rows = self
            .session
            .call(
                "read the target's write ledger",
                false,
                "SELECT floor(extract(epoch FROM applied_at) * 1000)::int8, token, owner \
                 FROM __SCHEMA__.write_ledger WHERE resource = $1 AND write_id = $2",
                &[(&resource, Type::TEXT), (&id, Type::TEXT)],
            )
            .await?;
        Ok(rows.first().map(|r| LedgerEntry {
            applied_at_ms: r.get(0),
            token: r.get(1),
            owner: r.get(2),
        }))
    }

    /// The connection and schema, for the other modules that act on a target database.
    pub(crate) fn session(&self) -> &Session {
        &self.session
    }

    /// The guard rows of `resources` (all when empty).
    pub async fn guards(&self, resources: &[String]) -> Result<Vec<GuardView>, Error> {
        let names: Option<Vec<String>> = (!resources.is_empty()).then(|| resources.to_vec());
        let rows = self
            .session
            .call(
                "read the target's guard rows",
                false,
                "SELECT g.resource, g.highest_token, floor(extract(epoch FROM g.updated_at) * 1000)::int8, \
                 g.updated_by, g.accepted_writes, \
                 (SELECT count(*) FROM __SCHEMA__.write_events e WHERE e.resource = g.resource AND e.kind = 'write_rejected') \
                 FROM __SCHEMA__.guards g WHERE $1::text[] IS NULL OR g.resource = ANY($1) ORDER BY g.resource",
                &[(&names, Type::TEXT_ARRAY)],
            )
            .await?;
        let mut views: Vec<GuardView> = rows
            .iter()
            .map(|r| GuardView {
                resource: r.get(0),
                highest_token: Some(r.get(1)),
                updated_at_ms: Some(r.get(2)),
                updated_by: r.get(3),
                accepted_writes: r.get(4),
                rejected_writes: r.get(5),
            })
            .collect();
        for name in resources {
            if !views.iter().any(|v| &v.resource == name) {
                views.push(GuardView {
                    resource: name.clone(),
                    highest_token: None,
                    updated_at_ms: None,
                    updated_by: None,
                    accepted_writes: 0,
                    rejected_writes: 0,
                });
            }
        }
        Ok(views)
    }
}

impl PgTarget {
    /// `fence log --target`: the write events of the matching resources in the window, as
    /// the coordinator's are read (one `write_events (resource, at)` range per resource that
    /// has a guard row; a rejected write needs one). `rows_affected` (version 3) is read
    /// through `to_jsonb`, so that a schema not yet migrated answers without it.
    pub async fn log(&self, query: &LogQuery<'_>) -> Result<Vec<Logged>, Error> {
        let window = LogRange::new(query, "g.resource");
        let sql = format!(
            "SELECT g.resource, e.id, floor(extract(epoch FROM e.at) * 1000000)::int8 AS at_us, \
             e.kind, e.owner, e.token, e.detail, (e.j->>'rows_affected')::int8 AS rows_affected \
             FROM __SCHEMA__.guards g CROSS JOIN LATERAL ( \
               SELECT ev.id, ev.at, ev.kind, ev.owner, ev.token, ev.detail, to_jsonb(ev) AS j \
               FROM __SCHEMA__.write_events ev WHERE ev.resource = g.resource {range}) e \
             WHERE {filter} {last}",
            range = LogRange::RANGE,
            filter = window.filter,
            last = LogRange::LAST,
        );
        let rows = self
            .session
            .call(
                "read the target's write events",
                false,
                &sql,
                &window.params(),
            )
            .await?;
        let logged = rows
            .iter()
            .map(|row| {
                let at_us: i64 = row.get("at_us");
                (
                    row.get("id"),
                    Logged {
                        resource: row.get("resource"),
                        at_us,
                        event: Event {
                            owner: row.get("owner"),
                            token: row.get("token"),
                            detail: row.get("detail"),
                            rows: row.get("rows_affected"),
                            ..Event::new(EventKind::parse(row.get("kind")), at_us.div_euclid(1000))
                        },
                    },
                )
            })
            .collect();
        Ok(LogRange::oldest_first(logged))
    }
}

enum Retry {
    MissingSchema,
    Fail(Error),
}

/// Statements fence sends before the caller's SQL: BEGIN, the schema version's check, three
/// SETs, begin_write.
const PRELUDE_STATEMENTS: usize = 6;

/// How much longer than a lock wait a statement may run: what the server cancels at `--timeout`
/// is a lock wait, not the statement, when both would go together. end_write still refuses to
/// commit after `--timeout`.
const LOCK_BEFORE_STATEMENT: Duration = Duration::from_millis(500);

/// How long past `--timeout` fence waits for the server's own timeouts (which give a definite
/// "rolled back") before it sends a cancel request itself.
const SERVER_FIRST: Duration = Duration::from_secs(2);

/// How long fence waits for the answer after a cancel request before calling the outcome
/// unknown.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// What a fenced transaction did.
#[derive(Debug)]
pub enum TxOutcome {
    /// Committed now: one result per statement of the caller's SQL.
    Applied(Vec<StatementResult>),
    /// Its write id was applied before (by this or another owner): nothing ran now.
    Replayed(LedgerEntry),
}

/// A write id's entry in the target's ledger.
#[derive(Debug)]
pub struct LedgerEntry {
    pub applied_at_ms: i64,
    pub token: i64,
    pub owner: Option<String>,
}

/// The ledger entry an LF011 ("already applied") error carries in its DETAIL, with the
/// digest of the write that used the id (`None` before target schema version 4).
fn replayed(err: &tokio_postgres::Error) -> Option<(LedgerEntry, Option<String>)> {
    let db = err
        .as_db_error()
        .filter(|db| Fence::of(db.code()) == Some(Fence::AlreadyApplied))?;
    let detail: serde_json::Value = serde_json::from_str(db.detail()?).ok()?;
    let entry = LedgerEntry {
        applied_at_ms: detail["applied_at"].as_i64()?,
        token: detail["token"].as_i64()?,
        owner: detail["owner"].as_str().map(str::to_owned),
    };
    Some((entry, detail["digest"].as_str().map(str::to_owned)))
}

/// One fenced transaction: who writes what, with which token, within how long.
#[derive(Clone, Copy)]
pub struct TxWrite<'a> {
    pub resource: &'a str,
    pub token: i64,
    pub owner: &'a str,
    /// `--id`: applied at most once per resource, whoever writes it.
    pub write_id: Option<&'a str>,
    /// Checked by [`crate::fenced::sql_check`] before it gets here.
    pub sql: &'a str,
    /// The server cancels the transaction after this long, and it can never commit later.
    pub timeout: Duration,
}

/// Why fence stopped waiting for a fenced transaction.
#[derive(Clone, Copy)]
enum GaveUp {
    Timeout(Duration),
    Signal(&'static str),
}

impl GaveUp {
    fn what(self) -> String {
        match self {
            GaveUp::Timeout(timeout) => format!(
                "the server did not answer within the {} timeout (--timeout)",
                crate::time::duration(timeout)
            ),
            GaveUp::Signal(name) => format!("interrupted by {name}"),
        }
    }
}

/// The row form's statement and what bounds it (see [`PgTarget::row_statement`]).
struct RowStatement<'a> {
    sql: &'a str,
    params: &'a [(&'a (dyn ToSql + Sync), Type)],
    resource: &'a str,
    timeout: Duration,
}

/// The server's answer to the script, with how many statements completed before a failure.
enum Answer {
    Done(Vec<SimpleQueryMessage>),
    Failed {
        completed: usize,
        err: tokio_postgres::Error,
        /// Whether `end_write` answered before the failure: then it may be the COMMIT's,
        /// which may have applied; before it, the transaction was rolled back.
        ended: bool,
    },
}

/// The script of one fenced transaction, sent as one message. Only `write.sql` comes from the
/// caller; it was checked to hold no transaction control and to end outside any quote or
/// comment, and the newline after it ends a trailing `--` comment. (Public so that a test can
/// send it with transaction control the checks would have refused, to prove `end_write`.)
pub fn fenced_script(schema: &str, write: &TxWrite<'_>) -> String {
    let resource = quote_literal(write.resource);
    let owner = quote_literal(write.owner);
    let token = write.token;
    let begin = match write.write_id {
        Some(id) => format!(
            "{schema}.begin_write_once({resource}, {token}, {owner}, {})",
            quote_literal(id)
        ),
        None => format!("{schema}.begin_write({resource}, {token}, {owner})"),
    };
    // What the write does, kept in the ledger with its id (empty without an id).
    let digest = match write.write_id {
        Some(_) => write_digest(write.sql.as_bytes()),
        None => String::new(),
    };
    let ms = write.timeout.as_millis().max(1);
    // A lock wait times out before the statement does, so it is reported as a lock wait.
    let statement_ms = ms + LOCK_BEFORE_STATEMENT.as_millis();
    // The target's schema must be the version this fence writes for, checked inside the
    // transaction before anything of the write (`check_write`, as the row form calls it; a
    // function call needs no USAGE on plpgsql, which a DO block would): an older one is
    // migrated first (without `check_write` yet, or naming its version: see `settle`), a
    // newer one refused, never written as it stands. `CLOSE ALL` after the caller's SQL: a
    // cursor WITH HOLD would run its query at COMMIT, after end_write's checks (the
    // deadline, the settings), so none is left open to do so.
    let version = TARGET_SCHEMA.version;
    format!(
        "BEGIN ISOLATION LEVEL READ COMMITTED;\n\
         SELECT {schema}.check_write({resource}, {token}, {version});\n\
         SET LOCAL statement_timeout = {statement_ms};\n\
         SET LOCAL lock_timeout = {ms};\n\
         SET LOCAL fence.write_digest = '{digest}';\n\
         SELECT {begin};\n\
         {sql}\n;\n\
         CLOSE ALL;\n\
         SELECT {schema}.end_write({resource}, {token}, {ms}), pg_catalog.set_config('synchronous_commit', 'on', true);\n\
         COMMIT",
        sql = write.sql
    )
}

/// Reads the answer to `script` message by message, counting completed statements, so a
/// failure can be placed: in fence's statements before the caller's SQL, or later.
async fn collect(client: &tokio_postgres::Client, script: &str) -> Answer {
    let stream = match client.simple_query_raw(script).await {
        Ok(stream) => stream,
        Err(err) => {
            return Answer::Failed {
                completed: 0,
                err,
                ended: false,
            }
        }
    };
    tokio::pin!(stream);
    let mut messages = Vec::new();
    let mut completed = 0;
    // The caller's SQL could name a column `end_write` too: then a failure after it is
    // told "may have applied", the cautious answer.
    let mut ended = false;
    while let Some(message) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
        match message {
            Ok(message) => {
                match &message {
                    SimpleQueryMessage::CommandComplete(_) => completed += 1,
                    SimpleQueryMessage::RowDescription(columns) => {
                        ended |= columns.first().is_some_and(|c| c.name() == "end_write");
                    }
                    _ => {}
                }
                messages.push(message);
            }
            Err(err) => {
                return Answer::Failed {
                    completed,
                    err,
                    ended,
                }
            }
        }
    }
    Answer::Done(messages)
}

/// Whether a SQLSTATE is the server refusing a statement whatever its text: fence's own
/// conditions (`LF…`), a read-only transaction, a missing privilege, resources or an operator
/// (shutdown, cancel), the connection.
fn refused_by_the_server(state: &tokio_postgres::error::SqlState) -> bool {
    use tokio_postgres::error::SqlState;
    matches!(sqlstate::class(state), "LF" | "53" | "57" | "08")
        || *state == SqlState::READ_ONLY_SQL_TRANSACTION
        || *state == SqlState::INSUFFICIENT_PRIVILEGE
}

/// Whether the server ended the session, whatever the SQL: a shutdown, a terminated backend,
/// a dropped database (a connection exception, class 08, is a lost connection:
/// [`PgTarget::classify`]). The server sends these after the answers before them, so
/// whether `end_write` answered tells whether the COMMIT could have run.
fn ended_by_the_server(state: &tokio_postgres::error::SqlState) -> bool {
    use tokio_postgres::error::SqlState;
    [
        SqlState::ADMIN_SHUTDOWN,
        SqlState::CRASH_SHUTDOWN,
        SqlState::CANNOT_CONNECT_NOW,
        SqlState::DATABASE_DROPPED,
    ]
    .contains(state)
}

fn row_error(err: Error, table: &str) -> Error {
    let Some(state) = err.sqlstate() else {
        return err;
    };
    let hint = match (Fence::of(state), sqlstate::class(state)) {
        (Some(Fence::NoColumn | Fence::NoTable), _) => format!(
            "check the table and column names: {table}, --key, --set and --token-column name what is in the database"
        ),
        (Some(Fence::NoProgress), _) => format!(
            "a trigger or row-level security policy on {table} drops or hides fence's update of the row (`\\d {table}` in psql lists them): exempt fence's writes from it, or write with the transaction form (`--sql`); nothing was written"
        ),
        (Some(Fence::NoToken | Fence::Stale), _) => {
            "this table is protected by `fence protect`: write to it with the transaction form (`--sql`)".into()
        }
        (None, "22" | "23") => {
            "a value does not fit its column (type or constraint); nothing was written".into()
        }
        _ => return err,
    };
    Error::usage(err.to_string(), hint)
}

/// Splits the caller's statements' replies into one result per statement.
fn statement_results(messages: Vec<SimpleQueryMessage>) -> Vec<StatementResult> {
    let mut results = Vec::new();
    let mut current = StatementResult::default();
    for message in messages {
        match message {
            SimpleQueryMessage::RowDescription(columns) => {
                current.columns = columns.iter().map(|c| c.name().to_owned()).collect();
            }
            SimpleQueryMessage::Row(row) => {
                current.rows.push(
                    (0..row.len())
                        .map(|i| row.get(i).map(str::to_owned))
                        .collect(),
                );
            }
            SimpleQueryMessage::CommandComplete(count) => {
                current.rows_affected = count;
                results.push(std::mem::take(&mut current));
            }
            _ => {}
        }
    }
    results
}

#[async_trait::async_trait(?Send)]
impl crate::fenced::target::FencedTarget for PgTarget {
    fn display(&self) -> &str {
        &self.session.display
    }

    async fn require_existing(&self) -> Result<(), Error> {
        PgTarget::require_existing(self).await
    }

    /// Its refusals are `write_rejected` rows of its own history, beside the guard row.
    fn records_refusals(&self) -> bool {
        true
    }

    async fn write(&self, write: WriteRequest<'_>) -> Result<Outcome, Error> {
        match write.body {
            Body::Transaction { sql, interrupts } => {
                let tx = TxWrite {
                    resource: write.resource,
                    token: write.token,
                    owner: write.owner,
                    write_id: write.write_id,
                    sql,
                    timeout: write.timeout,
                };
                Ok(Outcome::Transaction(
                    self.write_transaction(&tx, interrupts).await?,
                ))
            }
            Body::Row {
                write: row,
                interrupts,
            } => Ok(Outcome::Row(
                self.write_row(write.resource, write.token, row, write.timeout, interrupts)
                    .await?,
            )),
            Body::Bytes { .. } => Err(wrong_form(self.display(), false)),
        }
    }

    async fn view(&self, resources: &[String]) -> Result<TargetView, Error> {
        Ok(TargetView::Guards(self.guards(resources).await?))
    }

    async fn applied(&self, resource: &str, id: &str) -> Result<Option<Applied>, Error> {
        Ok(self.ledger_entry(resource, id).await?.map(|e| Applied {
            at_ms: e.applied_at_ms,
            token: e.token,
            owner: e.owner,
            version: None,
        }))
    }

    async fn log(&self, query: &LogQuery<'_>) -> Result<Vec<Logged>, Error> {
        PgTarget::log(self, query).await
    }
}
