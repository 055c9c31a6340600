//! The PostgreSQL coordinator (DESIGN §7–§8).
//!
//! Each operation is one call of a PL/pgSQL function in autocommit, one round trip: sent with
//! `query_typed` (Parse/Bind/Execute together) on its first use on a connection, as a prepared
//! statement after that (see `Session`). The functions compute the next token from the
//! locked row, read `clock_timestamp()` after the lock, set `synchronous_commit = on` for
//! their own transaction, and write the event row in the same transaction, so a token is
//! reported only after it is durably granted, whatever the server's default.

use std::cell::Cell;
use std::time::Duration;

use async_trait::async_trait;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use crate::error::{ConflictKind, Error, Holder, LostReason};
use crate::pg::session::{SchemaSpec, Session};
use crate::store::{
    ttl_ms, Coordinator, Event, Grant, InitReport, Lease, LeaseRef, Released, ResourceView, State,
    Waiter,
};

pub struct PgCoordinator {
    session: Session,
    /// Where this connection stands as a `--wait` waiter (see `wait_turn` in the schema).
    queue: Cell<Queue>,
}

/// A waiter's place: registered (a `waiters` row, maybe in the advisory lock queue), or at
/// the head of the queue (holding the lock and listening for releases).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Queue {
    Out,
    Waiting,
    Head,
}

/// fence's own tables in the coordinator database.
pub const COORDINATOR_SCHEMA: SchemaSpec = SchemaSpec {
    meta_table: "meta",
    version: 2,
    sql: include_str!("schema.sql"),
    purpose: "coordinator",
};

impl PgCoordinator {
    pub async fn connect(url: &str, display: &str, schema: &str) -> Result<PgCoordinator, Error> {
        Ok(PgCoordinator {
            session: Session::open(url, display, schema, &COORDINATOR_SCHEMA).await?,
            queue: Cell::new(Queue::Out),
        })
    }

    async fn call(
        &self,
        what: &str,
        mutating: bool,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        self.session.call(what, mutating, sql, params).await
    }
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
        let (action, schema_version) = self.session.init().await?;
        Ok(InitReport {
            action,
            schema_version,
            location: format!("schema `{}`", self.session.schema),
        })
    }

    async fn acquire(&self, resource: &str, owner: &str, ttl: Duration) -> Result<Grant, Error> {
        let ttl = ttl_ms(ttl);
        // A waiter's grant also takes it out of the queue, in the same round trip.
        let queued = self.queue.get() != Queue::Out;
        let rows = self
            .call(
                &format!("acquire `{resource}`"),
                true,
                if queued {
                    "SELECT * FROM __SCHEMA__.acquire_queued($1, $2, $3)"
                } else {
                    "SELECT * FROM __SCHEMA__.acquire($1, $2, $3)"
                },
                &[
                    (&resource, Type::TEXT),
                    (&owner, Type::TEXT),
                    (&ttl, Type::INT8),
                ],
            )
            .await?;
        let answer = Answer::from_rows(&rows)?;
        let lease = answer.lease(resource);
        if answer.status != "busy" {
            self.queue.set(Queue::Out);
        }
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
        let waiters_sql = "SELECT w.resource, w.owner, __SCHEMA__.ms(w.since) FROM __SCHEMA__.waiters w \
             WHERE ($1::text[] IS NULL OR w.resource = ANY($1)) \
             AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.backend_pid) ORDER BY w.since";
        let waiter_rows = self
            .call(what, false, waiters_sql, &[(&names, Type::TEXT_ARRAY)])
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
                    waiters: Vec::new(),
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
        for row in &waiter_rows {
            let resource: String = row.get(0);
            if let Some(view) = views.iter_mut().find(|v| v.resource == resource) {
                view.waiters.push(Waiter {
                    owner: row.get(1),
                    since_ms: row.get(2),
                });
            }
        }
        if !resources.is_empty() {
            views.sort_by_key(|v| resources.iter().position(|r| r == &v.resource));
        }
        Ok(views)
    }

    async fn wait_begin(&self, resource: &str, owner: &str) -> Result<(), Error> {
        self.call(
            "register as a waiter",
            true,
            "SELECT __SCHEMA__.wait_begin($1, $2)",
            &[(&resource, Type::TEXT), (&owner, Type::TEXT)],
        )
        .await?;
        self.queue.set(Queue::Waiting);
        Ok(())
    }

    async fn unwait(&self, resource: &str) -> Result<(), Error> {
        if self.queue.get() == Queue::Out {
            return Ok(()); // a grant already left the queue
        }
        self.queue.set(Queue::Out);
        self.call(
            "unregister as a waiter",
            true,
            "SELECT __SCHEMA__.unwait($1)",
            &[(&resource, Type::TEXT)],
        )
        .await?;
        Ok(())
    }

    async fn wait_for_release(&self, resource: &str, max: Duration) -> Result<(), Error> {
        if self.queue.get() != Queue::Head {
            // Block in the server until this waiter heads the queue, then return so that the
            // caller retries at once: releases before the LISTEN were not sent to us.
            let timeout = i64::try_from(max.as_millis()).unwrap_or(i64::MAX);
            let rows = self
                .call(
                    "wait for a turn",
                    false,
                    "SELECT __SCHEMA__.wait_turn($1, $2)",
                    &[(&resource, Type::TEXT), (&timeout, Type::INT8)],
                )
                .await?;
            if rows.first().is_some_and(|row| row.get::<_, bool>(0)) {
                self.queue.set(Queue::Head);
            }
            return Ok(());
        }
        let mut notifications = self.session.notifications.lock().await;
        let deadline = tokio::time::Instant::now() + max;
        loop {
            match tokio::time::timeout_at(deadline, notifications.recv()).await {
                Ok(Some(payload)) => {
                    // `:<resource>` (older versions put a waiter's backend pid first).
                    let (_, released) = payload.split_once(':').unwrap_or(("", &payload));
                    if released == resource {
                        return Ok(());
                    }
                }
                // The connection is gone, or the time is up: the next attempt tells.
                Ok(None) | Err(_) => return Ok(()),
            }
        }
    }

    fn pushes_wakeups(&self) -> bool {
        true
    }
}
