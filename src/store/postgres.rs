//! The PostgreSQL coordinator (DESIGN §7–§8).
//!
//! Each operation is one call of a PL/pgSQL function in autocommit, sent with `query_typed`
//! (Parse/Bind/Execute in one round trip). The functions compute the next token from the
//! locked row, read `clock_timestamp()` after the lock, set `synchronous_commit = on` for
//! their own transaction, and write the event row in the same transaction, so a token is
//! reported only after it is durably granted, whatever the server's default.

use std::time::Duration;

use async_trait::async_trait;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use crate::error::{ConflictKind, Error, Holder, LostReason};
use crate::pg::{self, Target, REQUEST_TIMEOUT};
use crate::store::{
    ttl_ms, Coordinator, Event, Grant, InitReport, Lease, LeaseRef, Released, ResourceView, State,
};

const SCHEMA_VERSION: i32 = 1;
const SCHEMA_V1: &str = include_str!("schema_v1.sql");

pub struct PgCoordinator {
    client: Client,
    schema: String,
    display: String,
}

impl PgCoordinator {
    pub async fn connect(url: &str, display: &str, schema: &str) -> Result<PgCoordinator, Error> {
        let target = Target::resolve(url, display)?;
        let client = target.connect().await?;
        Ok(PgCoordinator {
            client,
            schema: schema.to_owned(),
            display: display.to_owned(),
        })
    }

    /// Runs one function call, creating the schema first if it does not exist yet.
    async fn call(
        &self,
        what: &str,
        mutating: bool,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        let sql = sql.replace("__SCHEMA__", &self.schema);
        match self.request(what, mutating, &sql, params).await? {
            Ok(rows) => Ok(rows),
            Err(err) if is_missing_schema(&err) => {
                self.migrate().await?;
                match self.request(what, mutating, &sql, params).await? {
                    Ok(rows) => Ok(rows),
                    Err(err) => Err(pg::request_error(&err, &self.display, what, mutating)),
                }
            }
            Err(err) => Err(pg::request_error(&err, &self.display, what, mutating)),
        }
    }

    /// One request with a deadline. The outer error is a timeout; the inner one is the
    /// server's answer, left to the caller to classify.
    async fn request(
        &self,
        what: &str,
        mutating: bool,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Result<Vec<Row>, tokio_postgres::Error>, Error> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.client.query_typed(sql, params))
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

    /// The schema's version, or `None` when it does not exist yet. Never raises an SQL
    /// error, so it is safe inside the migration transaction.
    async fn schema_version(&self) -> Result<Option<i32>, Error> {
        let what = "read the schema version";
        let exists = format!("SELECT to_regclass('{}.meta') IS NOT NULL", self.schema);
        let rows = self
            .request(what, false, &exists, &[])
            .await?
            .map_err(|err| pg::request_error(&err, &self.display, what, false))?;
        if !rows.first().is_some_and(|row| row.get::<_, bool>(0)) {
            return Ok(None);
        }
        let sql = format!(
            "SELECT value FROM {}.meta WHERE key = 'schema_version'",
            self.schema
        );
        let rows = self
            .request(what, false, &sql, &[])
            .await?
            .map_err(|err| pg::request_error(&err, &self.display, what, false))?;
        Ok(rows
            .first()
            .and_then(|row| row.get::<_, String>(0).parse().ok()))
    }

    /// Creates or migrates the schema in one transaction, under an advisory lock so that
    /// concurrent first uses do not race. A schema that is already current is left alone:
    /// re-running the DDL under live traffic would take table locks and can deadlock.
    async fn migrate(&self) -> Result<(), Error> {
        let what = format!("create fence's schema `{}`", self.schema);
        let lock = format!(
            "BEGIN; SELECT pg_advisory_xact_lock(hashtext('fence schema {}'))",
            self.schema
        );
        let result = match self.batch(&what, &lock).await {
            Ok(()) => match self.schema_version().await {
                Ok(Some(v)) if v >= SCHEMA_VERSION => self.batch(&what, "COMMIT").await,
                Ok(_) => {
                    let body = SCHEMA_V1.replace("__SCHEMA__", &self.schema);
                    self.batch(&what, &format!("{body}\nCOMMIT;")).await
                }
                Err(err) => Err(err),
            },
            Err(err) => Err(err),
        };
        if result.is_err() {
            let _ = self.client.batch_execute("ROLLBACK").await;
        }
        result
    }

    async fn batch(&self, what: &str, script: &str) -> Result<(), Error> {
        let result = tokio::time::timeout(REQUEST_TIMEOUT, self.client.batch_execute(script))
            .await
            .map_err(|_| pg::lost(&self.display, what, "no answer", true))?;
        result.map_err(|err| match err.as_db_error() {
            Some(db) if db.code().code() == "LF010" => Error::usage(
                format!("PostgreSQL at `{}`: {}", self.display, db.message()),
                "upgrade fence, or use another --schema",
            ),
            Some(db) if *db.code() == SqlState::INSUFFICIENT_PRIVILEGE => Error::usage(
                format!("PostgreSQL at `{}` refused to {what}: {}", self.display, db.message()),
                "have a user who may create schemas run `fence init` once, or pass --schema naming a schema you own",
            ),
            _ => pg::request_error(&err, &self.display, what, true),
        })
    }
}

fn is_missing_schema(err: &tokio_postgres::Error) -> bool {
    err.code().is_some_and(|code| {
        *code == SqlState::INVALID_SCHEMA_NAME
            || *code == SqlState::UNDEFINED_TABLE
            || *code == SqlState::UNDEFINED_FUNCTION
    })
}

/// The row every lease function returns.
struct Answer {
    status: String,
    token: Option<i64>,
    owner: Option<String>,
    acquired_ms: Option<i64>,
    renewed_ms: Option<i64>,
    expires_ms: Option<i64>,
    expires_in_ms: Option<i64>,
    ttl_ms: Option<i64>,
}

impl Answer {
    fn from_rows(rows: &[Row]) -> Result<Answer, Error> {
        let row = rows.first().ok_or_else(|| {
            Error::internal(
                "PostgreSQL returned no row from a fence function",
                "fence's schema may have been altered by hand; run `fence init` to restore it",
            )
        })?;
        Ok(Answer {
            status: row.get("status"),
            token: row.get("token"),
            owner: row.get("owner"),
            acquired_ms: row.get("acquired_ms"),
            renewed_ms: row.get("renewed_ms"),
            expires_ms: row.get("expires_ms"),
            expires_in_ms: row.get("expires_in_ms"),
            ttl_ms: row.get("ttl_ms"),
        })
    }

    fn lease(&self, resource: &str) -> Lease {
        Lease {
            resource: resource.to_owned(),
            owner: self.owner.clone().unwrap_or_default(),
            token: self.token.unwrap_or_default(),
            acquired_at_ms: self.acquired_ms.unwrap_or_default(),
            renewed_at_ms: self.renewed_ms.unwrap_or_default(),
            expires_at_ms: self.expires_ms.unwrap_or_default(),
            expires_in_ms: self.expires_in_ms.unwrap_or_default(),
            ttl_ms: self.ttl_ms.unwrap_or_default(),
        }
    }

    /// Maps a refused renew/release to its error (the shared `classify` statuses).
    fn refusal(&self, lease: &LeaseRef) -> Error {
        let resource = lease.resource.clone();
        let token = lease.token;
        let highest_token = self.token.unwrap_or_default();
        match self.status.as_str() {
            "stale" => Error::Stale {
                resource,
                token,
                highest_token,
            },
            "expired" | "released" => Error::LeaseLost {
                resource,
                owner: lease.owner.clone(),
                token,
                reason: if self.status == "expired" {
                    LostReason::Expired
                } else {
                    LostReason::Released
                },
            },
            "never_issued" => Error::Conflict {
                resource,
                token,
                kind: ConflictKind::NeverIssued { highest_token },
            },
            "wrong_owner" => Error::Conflict {
                resource,
                token,
                kind: ConflictKind::WrongOwner {
                    holder: self.owner.clone().unwrap_or_default(),
                },
            },
            "no_lease" => Error::Conflict {
                resource,
                token,
                kind: ConflictKind::NoLease,
            },
            other => Error::internal(
                format!("PostgreSQL answered `{other}`, which this fence does not know"),
                "fence's schema may be from another version; run `fence init`",
            ),
        }
    }
}

#[async_trait(?Send)]
impl Coordinator for PgCoordinator {
    async fn init(&self) -> Result<InitReport, Error> {
        let before = self.schema_version().await?;
        let action = match before {
            Some(v) if v >= SCHEMA_VERSION => "up_to_date",
            Some(_) => "migrated",
            None => "created",
        };
        if action != "up_to_date" {
            self.migrate().await?;
        }
        Ok(InitReport {
            action,
            schema_version: before.map_or(SCHEMA_VERSION, |v| v.max(SCHEMA_VERSION)),
            location: format!("schema `{}`", self.schema),
        })
    }

    async fn acquire(&self, resource: &str, owner: &str, ttl: Duration) -> Result<Grant, Error> {
        let ttl = ttl_ms(ttl);
        let rows = self
            .call(
                &format!("acquire `{resource}`"),
                true,
                "SELECT * FROM __SCHEMA__.acquire($1, $2, $3)",
                &[
                    (&resource, Type::TEXT),
                    (&owner, Type::TEXT),
                    (&ttl, Type::INT8),
                ],
            )
            .await?;
        let answer = Answer::from_rows(&rows)?;
        let lease = answer.lease(resource);
        match answer.status.as_str() {
            "acquired" | "taken_over" | "reacquired" => Ok(Grant {
                reacquired: answer.status == "reacquired",
                lease,
            }),
            "busy" => Err(Error::Busy {
                resource: resource.to_owned(),
                holder: Holder {
                    owner: lease.owner,
                    token: lease.token,
                    expires_at_ms: lease.expires_at_ms,
                    expires_in_ms: lease.expires_in_ms,
                },
            }),
            other => Err(Error::internal(
                format!("PostgreSQL answered `{other}` to an acquire"),
                "fence's schema may be from another version; run `fence init`",
            )),
        }
    }

    async fn renew(&self, lease: &LeaseRef, ttl: Option<Duration>) -> Result<Lease, Error> {
        let ttl = ttl.map(ttl_ms);
        let rows = self
            .call(
                &format!("renew `{}`", lease.resource),
                true,
                "SELECT * FROM __SCHEMA__.renew($1, $2, $3, $4)",
                &[
                    (&lease.resource, Type::TEXT),
                    (&lease.owner, Type::TEXT),
                    (&lease.token, Type::INT8),
                    (&ttl, Type::INT8),
                ],
            )
            .await?;
        let answer = Answer::from_rows(&rows)?;
        if answer.status == "renewed" {
            Ok(answer.lease(&lease.resource))
        } else {
            Err(answer.refusal(lease))
        }
    }

    async fn release(&self, lease: &LeaseRef) -> Result<Released, Error> {
        let rows = self
            .call(
                &format!("release `{}`", lease.resource),
                true,
                "SELECT * FROM __SCHEMA__.release($1, $2, $3)",
                &[
                    (&lease.resource, Type::TEXT),
                    (&lease.owner, Type::TEXT),
                    (&lease.token, Type::INT8),
                ],
            )
            .await?;
        let answer = Answer::from_rows(&rows)?;
        match answer.status.as_str() {
            "released" => Ok(Released::Now),
            "already_released" => Ok(Released::Already),
            _ => Err(answer.refusal(lease)),
        }
    }

    async fn inspect(
        &self,
        resources: &[String],
        history: usize,
    ) -> Result<Vec<ResourceView>, Error> {
        let names: Option<Vec<String>> = (!resources.is_empty()).then(|| resources.to_vec());
        let leases_sql = "SELECT resource, owner, token, __SCHEMA__.ms(acquired_at) AS acquired_ms, \
             __SCHEMA__.ms(renewed_at) AS renewed_ms, __SCHEMA__.ms(expires_at) AS expires_ms, \
             __SCHEMA__.ms(expires_at) - __SCHEMA__.ms(clock_timestamp()) AS expires_in_ms \
             FROM __SCHEMA__.leases WHERE $1::text[] IS NULL OR resource = ANY($1) ORDER BY resource";
        let history = i64::try_from(history).unwrap_or(i64::MAX);
        let events_sql =
            "SELECT resource, __SCHEMA__.ms(at) AS at_ms, kind, owner, token, detail FROM ( \
             SELECT e.*, row_number() OVER (PARTITION BY resource ORDER BY id DESC) AS n \
             FROM __SCHEMA__.events e WHERE $1::text[] IS NULL OR resource = ANY($1)) recent \
             WHERE n <= $2 ORDER BY resource, id DESC";
        let what = "inspect leases";
        let rows = self
            .call(what, false, leases_sql, &[(&names, Type::TEXT_ARRAY)])
            .await?;
        let event_rows = if history > 0 {
            self.call(
                what,
                false,
                events_sql,
                &[(&names, Type::TEXT_ARRAY), (&history, Type::INT8)],
            )
            .await?
        } else {
            Vec::new()
        };
        let mut views: Vec<ResourceView> = rows
            .iter()
            .map(|row| {
                let expires_ms: Option<i64> = row.get("expires_ms");
                let expires_in_ms: Option<i64> = row.get("expires_in_ms");
                let state = match expires_in_ms {
                    None => State::Free,
                    Some(ms) if ms > 0 => State::Held,
                    Some(_) => State::Expired,
                };
                ResourceView {
                    resource: row.get("resource"),
                    state,
                    owner: if state == State::Free {
                        None
                    } else {
                        row.get("owner")
                    },
                    token: Some(row.get("token")),
                    acquired_at_ms: row.get("acquired_ms"),
                    renewed_at_ms: row.get("renewed_ms"),
                    expires_at_ms: expires_ms,
                    expires_in_ms,
                    events: Vec::new(),
                }
            })
            .collect();
        for name in resources {
            if !views.iter().any(|v| &v.resource == name) {
                views.push(ResourceView::unknown(name));
            }
        }
        for row in &event_rows {
            let resource: String = row.get("resource");
            if let Some(view) = views.iter_mut().find(|v| v.resource == resource) {
                view.events.push(Event {
                    at_ms: row.get("at_ms"),
                    kind: row.get("kind"),
                    owner: row.get("owner"),
                    token: row.get("token"),
                    detail: row.get("detail"),
                });
            }
        }
        if !resources.is_empty() {
            views.sort_by_key(|v| resources.iter().position(|r| r == &v.resource));
        }
        Ok(views)
    }
}
