//! The PostgreSQL target (DESIGN §3 `write`/`protect`, §7–§8): fenced transactions, fenced
//! row writes, and the trigger that makes every other write path go through the fence.
//!
//! Transaction form: `BEGIN ISOLATION LEVEL READ COMMITTED`, `begin_write` (advance the guard
//! row iff the token is ≥ the highest accepted, bind the token to this transaction), the
//! caller's SQL and `COMMIT` are pipelined: one round trip. If `begin_write` refuses, the
//! transaction is aborted, so the caller's SQL cannot run and `COMMIT` rolls back.

use tokio_postgres::types::Type;
use tokio_postgres::SimpleQueryMessage;

use crate::error::{ConflictKind, Error};
use crate::pg::session::{is_missing_schema, SchemaSpec, Session};
use crate::pg::{self};
use crate::target::{quote_table, TargetSpec};

/// fence's tables in a target database.
pub const TARGET_SCHEMA: SchemaSpec = SchemaSpec {
    meta_table: "target_meta",
    version: 1,
    sql: include_str!("guard.sql"),
    purpose: "target",
};

pub struct PgTarget {
    session: Session,
}

/// The result of one statement of the caller's SQL.
#[derive(Debug, Default)]
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

    /// Runs `sql` in one fenced transaction.
    pub async fn write_transaction(
        &self,
        resource: &str,
        token: i64,
        owner: &str,
        sql: &str,
    ) -> Result<Vec<StatementResult>, Error> {
        match self.pipeline(resource, token, owner, sql).await {
            Err(Retry::MissingSchema) => {
                self.session.migrate().await?;
                match self.pipeline(resource, token, owner, sql).await {
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

    async fn pipeline(
        &self,
        resource: &str,
        token: i64,
        owner: &str,
        sql: &str,
    ) -> Result<Vec<StatementResult>, Retry> {
        let client = &self.session.client;
        let guard_sql = format!("SELECT {}.begin_write($1, $2, $3)", self.session.schema);
        let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 3] = [
            (&resource, Type::TEXT),
            (&token, Type::INT8),
            (&owner, Type::TEXT),
        ];
        // Polled together, these four requests go out back to back: one round trip.
        let all = async {
            tokio::join!(
                client.simple_query("BEGIN ISOLATION LEVEL READ COMMITTED"),
                client.query_typed(&guard_sql, &params),
                client.simple_query(sql),
                client.simple_query("COMMIT"),
            )
        };
        let what = format!("write to `{resource}`");
        let (begin, guard, body, commit) = tokio::time::timeout(pg::REQUEST_TIMEOUT * 3, all)
            .await
            .map_err(|_| Retry::Fail(pg::lost(self.display(), &what, "no answer in time", true)))?;
        // The first failure decides. A database error before COMMIT aborted the transaction,
        // so nothing was applied; a lost connection may have lost the answer to COMMIT.
        if let Err(err) = begin {
            return Err(Retry::Fail(
                self.classify(&err, resource, token, owner, &what).await,
            ));
        }
        if let Err(err) = guard {
            if is_missing_schema(&err) {
                return Err(Retry::MissingSchema);
            }
            if let Some(refused) = self.missing_grant(&err) {
                return Err(Retry::Fail(refused));
            }
            return Err(Retry::Fail(
                self.classify(&err, resource, token, owner, &what).await,
            ));
        }
        let messages = match body {
            Ok(messages) => messages,
            Err(err) => {
                return Err(Retry::Fail(
                    self.classify(&err, resource, token, owner, &what).await,
                ))
            }
        };
        if let Err(err) = commit {
            return Err(Retry::Fail(
                self.classify(&err, resource, token, owner, &what).await,
            ));
        }
        Ok(statement_results(messages))
    }

    /// Maps a failure inside the fenced transaction to its outcome, recording rejections.
    async fn classify(
        &self,
        err: &tokio_postgres::Error,
        resource: &str,
        token: i64,
        owner: &str,
        what: &str,
    ) -> Error {
        let Some(db) = err.as_db_error() else {
            return match pg::lost(self.display(), what, &err.to_string(), true) {
                Error::OutcomeUnknown { message, .. } => Error::OutcomeUnknown {
                    message,
                    hint: format!(
                        "the transaction may or may not have committed: check `fence inspect {} --target …` (accepted writes, highest token) and the data before retrying",
                        crate::error::shell_word(resource)
                    ),
                },
                other => other,
            };
        };
        // COMMIT, pipelined behind the failed statement, has already ended the transaction.
        let error = match db.code().code() {
            "LF002" => Error::Stale {
                resource: resource.to_owned(),
                token,
                highest_token: db
                    .detail()
                    .and_then(|d| d.parse().ok())
                    .unwrap_or(token + 1),
            },
            "LF001" | "LF003" => Error::usage(
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
            code if code.starts_with("LF") => pg::request_error(err, self.display(), what, true),
            code => {
                return Error::SqlFailed {
                    resource: resource.to_owned(),
                    token,
                    sqlstate: code.to_owned(),
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
    pub async fn write_row(
        &self,
        resource: &str,
        token: i64,
        write: &RowWrite,
    ) -> Result<RowOutcome, Error> {
        let table = quote_table(&write.table)?;
        let key = serde_json::Value::Object(write.key.clone());
        let set = serde_json::Value::Object(write.set.clone());
        let what = format!("write a row of {table} for `{resource}`");
        let rows = self
            .session
            .call(
                &what,
                true,
                "SELECT status, stored_token FROM __SCHEMA__.write_row($1, $2::text::jsonb, $3::text::jsonb, $4, $5, $6)",
                &[
                    (&table, Type::TEXT),
                    (&key.to_string(), Type::TEXT),
                    (&set.to_string(), Type::TEXT),
                    (&write.token_column, Type::TEXT),
                    (&token, Type::INT8),
                    (&write.upsert, Type::BOOL),
                ],
            )
            .await
            .map_err(|err| row_error(err, &table))?;
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

enum Retry {
    MissingSchema,
    Fail(Error),
}

fn row_error(err: Error, table: &str) -> Error {
    match err {
        Error::Internal { message, .. } if message.contains("LF006") || message.contains("LF007") => Error::usage(
            message,
            format!("check the table and column names: {table}, --key, --set and --token-column name what is in the database"),
        ),
        Error::Internal { message, .. } if message.contains("SQLSTATE LF001") || message.contains("SQLSTATE LF002") => Error::usage(
            message,
            "this table is protected by `fence protect`: write to it with the transaction form (`--sql`)",
        ),
        Error::Internal { message, .. } if message.contains("SQLSTATE 22") || message.contains("SQLSTATE 23") => Error::usage(
            message,
            "a value does not fit its column (type or constraint); nothing was written",
        ),
        other => other,
    }
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
