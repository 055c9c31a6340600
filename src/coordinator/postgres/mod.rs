//! The PostgreSQL coordinator (DESIGN §7–§8).
//!
//! Each operation is one statement in autocommit, one round trip, sent as an unnamed
//! statement (`query_typed`; see `Session`): acquire, renew and release are plain statements
//! ([`pg_one_shot`](super::pg_one_shot), no PL/pgSQL to compile on a new connection), a
//! waiter's poll one call of a PL/pgSQL function. Both compute the next token from the locked
//! row, read `clock_timestamp()` per row (before a lock wait whose holder left the row as it
//! was: `Leases::grant_in_time` renews such a late grant), set `synchronous_commit = on` for their own
//! transaction, and write the event row in the same transaction, so a token is reported only
//! after it is durably granted, whatever the server's default. Nothing keeps session state
//! (no advisory locks, no `SET`, no named statements), so every command also works through a
//! transaction-mode pooler such as PgBouncer.
//!
//! The connection is opened on first use, and a server that answers "too many connections"
//! or "cannot connect now" is retried (for a couple of seconds, or for a whole `--wait`).
//!
//! Waiting (`--wait`) is a durable queue, the `waiters` table (see `schema.sql`): a row per
//! waiter, its id the arrival order, kept alive by the waiter's polls, each of which promises
//! the next. Only the head of the queue is granted, so waiters are served exactly in arrival
//! order; a waiter that stops polling (killed, paused) is deleted once its promise plus
//! [`GRACE`](queue::GRACE) has passed, and skipped. The first [`WINDOW`](queue::WINDOW) waiters keep their connection and
//! `LISTEN` (a release wakes the head, a grant moves everyone up), polling every
//! [`NEAR_POLL`](queue::NEAR_POLL) besides (a pooler drops `LISTEN`); when the queue moves fast, up to
//! the store's `held_waiters` ([`HELD_DEFAULT`](queue::HELD_DEFAULT) unless `fence init --held-waiters`
//! set it) keep their connection and poll on it, not listening. The others close their connection and poll on a fresh one, less often the
//! further back they are ([`far_poll`](queue::far_poll)): a thousand waiters behind a long-held lease hold two
//! connections and open about a hundred a second between them. Both decisions ask when the
//! waiter's turn could come: the queue's pace (time per grant) per place ahead, after the
//! current holder's time once; a holder past half a second (more than a hiccup) makes each
//! place count for more, up to its own time per place at a second ([`Pace`](queue::Pace)), and a
//! free lease that does not move counts as held that long (a stall). The pace is, on joining, the median
//! gap between the resource's recent grants, then what the waiter's own polls see, followed
//! at once when it is faster and gradually when slower: a lease that lay free while the next
//! waiter slept does not teach the others to sleep longer, which would leave it free longer
//! still. A newcomer keeps its connection (up to the store's `held_waiters`) until its own
//! polls have seen the queue move. A newcomer to `--wait` joins
//! at the back when others wait; a plain `acquire` (no `--wait`) is not queued and can take a
//! free resource before the head does.
//!
//! The price of exact order, measured with `fence bench` (docs/performance.md): a released
//! lease always goes to another process (the head), never back to the releasing worker, so a
//! hot resource with sub-millisecond critical sections hands over at the pace of a
//! notification and a poll (~5 ms here) rather than at the pace of one worker's loop.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::time::Instant;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

mod history;
mod queue;

use queue::{Queue, FOREVER};
pub use queue::{HELD_DEFAULT, HELD_MOST};

use crate::coordinator::pg_one_shot::{
    ACQUIRE, ACQUIRE_FAST, ACQUIRE_NEW, RELEASE, RELEASE_FAST, RENEW, RENEW_FAST,
};
use crate::coordinator::Refusal;
use crate::coordinator::{
    ttl_ms, Attempt, Grant, History, InitAction, InitReport, Lease, LeaseRef, Leases, Released,
};
use crate::error::{Error, Holder};
use crate::pg::session::{SchemaSpec, Session};
use crate::pg::CONNECT_PATIENCE;

/// fence's own tables in the coordinator database.
pub const COORDINATOR_SCHEMA: SchemaSpec = SchemaSpec {
    meta_table: "meta",
    version: 5,
    sql: include_str!("schema.sql"),
    purpose: "coordinator",
};

pub struct PgCoordinator {
    url: String,
    display: String,
    schema: String,
    /// Opened on first use; a waiter far from the head closes it between polls.
    session: RefCell<Option<Rc<Session>>>,
    /// This process's place in a queue of waiters, while `--wait` lasts.
    queue: RefCell<Option<Queue>>,
    /// The refused attempts this process has recorded (a waiter's polls are one attempt).
    attempted: crate::coordinator::Attempted,
    /// The server's last refusal of a new session (see [`Leases::connect_refusal`]).
    refusals: crate::pg::Refusals,
}

impl PgCoordinator {
    /// Checks the URL; connects on first use.
    pub async fn connect(url: &str, display: &str, schema: &str) -> Result<PgCoordinator, Error> {
        crate::pg::ConnectParams::resolve(url, display)?;
        Ok(PgCoordinator {
            url: url.to_owned(),
            display: display.to_owned(),
            schema: schema.to_owned(),
            session: RefCell::new(None),
            queue: RefCell::new(None),
            attempted: crate::coordinator::Attempted::default(),
            refusals: crate::pg::Refusals::default(),
        })
    }

    /// The open session, or a new one. A waiter retries a full server until its wait ends;
    /// anything else for [`CONNECT_PATIENCE`].
    async fn session(&self) -> Result<Rc<Session>, Error> {
        let now = Instant::now();
        let until = match self.queue.borrow().as_ref() {
            Some(queue) => queue
                .until
                .unwrap_or_else(|| now + FOREVER)
                .max(now + CONNECT_PATIENCE),
            None => now + CONNECT_PATIENCE,
        };
        self.session_until(until).await
    }

    async fn session_until(&self, until: Instant) -> Result<Rc<Session>, Error> {
        if let Some(session) = self.session.borrow().as_ref() {
            if !session.client.is_closed() {
                return Ok(session.clone());
            }
        }
        let session = Rc::new(
            Session::open_until(
                &self.url,
                &self.display,
                &self.schema,
                &COORDINATOR_SCHEMA,
                until,
                &self.refusals,
            )
            .await?,
        );
        *self.session.borrow_mut() = Some(session.clone());
        Ok(session)
    }

    async fn call(
        &self,
        what: &str,
        mutating: bool,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        self.session()
            .await?
            .call(what, mutating, sql, params)
            .await
    }

    /// Sends one of the one-shot statements until it answers something else than `retry`,
    /// which means the lease row changed between the statement's snapshot and its row lock
    /// (another process's grant, renewal or release) and nothing was written: the next
    /// statement, on a new snapshot, sees the change.
    async fn one_shot(
        &self,
        what: &str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Answer, Error> {
        self.settle(what, (sql, params), None).await
    }

    /// Sends `fast`, a statement for the common case (`pg_one_shot::ACQUIRE_FAST` and its
    /// kin), until it answers something else than `retry`; when it answers no row (a case it
    /// does not handle, nothing written), sends `other`, and when that answers no row too
    /// (`ACQUIRE_NEW`: another acquirer created the row first), starts again.
    async fn one_shot_fast(
        &self,
        what: &str,
        fast: Statement<'_>,
        other: Statement<'_>,
    ) -> Result<Answer, Error> {
        self.settle(what, fast, Some(other)).await
    }

    /// [`Self::one_shot`] and [`Self::one_shot_fast`]: at most [`SETTLE_ATTEMPTS`] rounds,
    /// each of which wrote nothing, then an error rather than a loop at full speed against
    /// the server (a trigger that drops fence's insert into `leases`, or a policy, makes every
    /// round answer the same).
    async fn settle(
        &self,
        what: &str,
        first: Statement<'_>,
        other: Option<Statement<'_>>,
    ) -> Result<Answer, Error> {
        for _ in 0..SETTLE_ATTEMPTS {
            let mut rows = self.call(what, true, first.0, first.1).await?;
            if let (true, Some(other)) = (rows.is_empty(), other) {
                rows = self.call(what, true, other.0, other.1).await?;
                if rows.is_empty() {
                    continue;
                }
            }
            let answer = Answer::from_statement(&rows)?;
            if answer.status != "retry" {
                return Ok(answer);
            }
        }
        Err(Error::internal(
            format!(
                "PostgreSQL did not settle `{what}` in {SETTLE_ATTEMPTS} attempts: each found the lease row changed under it, or could not create it; nothing was written"
            ),
            format!(
                "a trigger or row-level policy on {}.leases can cause this: list them (`\\d {}.leases` in psql), remove what fence did not create, then retry",
                self.schema, self.schema
            ),
        ))
    }

    /// Records the attempt `err` refused, once per process, resource and kind; a failure is
    /// a warning (the refusal stands, and its exit code with it).
    async fn note_refusal(&self, op: &str, owner: &str, err: &Error) {
        let Some(attempt) = Attempt::of(op, owner, err) else {
            return;
        };
        if !self.attempted.first(&attempt) {
            return;
        }
        if let Err(err) = self.record_attempt(&attempt).await {
            crate::coordinator::unrecorded(&attempt, &err.to_string());
        }
    }
}

/// How many rounds a one-shot request gets before fence stops (see `PgCoordinator::settle`):
/// a round is sent again only when another process changed or created the lease row between
/// its snapshot and its lock, which a busy resource does a few times in a row, not hundreds.
const SETTLE_ATTEMPTS: u32 = 1000;

/// A statement's text and its typed parameters, as `query_typed` takes them.
type Statement<'a> = (&'a str, &'a [(&'a (dyn ToSql + Sync), Type)]);

/// The row every lease function and one-shot statement returns.
struct Answer {
    status: String,
    token: Option<i64>,
    owner: Option<String>,
    acquired_ms: Option<i64>,
    renewed_ms: Option<i64>,
    expires_ms: Option<i64>,
    expires_in_ms: Option<i64>,
    ttl_ms: Option<i64>,
    /// A waiter's row and place (the queue functions only).
    waiter: Option<i64>,
    place: Option<i64>,
    /// The resource's recent time per grant (on joining the queue).
    pace_ms: Option<i64>,
    /// The store's `held_waiters` (on joining the queue, where it is set).
    held_waiters: Option<i64>,
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
            waiter: row.try_get("waiter").ok().flatten(),
            place: row.try_get("place").ok().flatten(),
            pace_ms: row.try_get("pace_ms").ok().flatten(),
            held_waiters: row
                .try_get::<_, Option<String>>("held_waiters")
                .ok()
                .flatten()
                .and_then(|text| text.parse().ok()),
        })
    }

    /// The row of a one-shot statement: the lease's timestamps and the server's clock as
    /// they are, converted here (one function fewer for a new connection to look up).
    fn from_statement(rows: &[Row]) -> Result<Answer, Error> {
        let row = rows.first().ok_or_else(|| {
            Error::internal(
                "PostgreSQL returned no row from a fence statement",
                "fence's schema may have been altered by hand; run `fence init` to restore it",
            )
        })?;
        let ms = |column: &str| row.get::<_, Option<SystemTime>>(column).map(epoch_ms);
        let now = epoch_ms(row.get("now"));
        let expires_ms = ms("expires_at");
        Ok(Answer {
            status: row.get("status"),
            token: row.get("token"),
            owner: row.get("owner"),
            acquired_ms: ms("acquired_at"),
            renewed_ms: ms("renewed_at"),
            expires_ms,
            expires_in_ms: expires_ms.map(|expires| expires - now),
            ttl_ms: row.get("ttl_ms"),
            waiter: None,
            place: None,
            pace_ms: None,
            held_waiters: None,
        })
    }

    /// How long the holder has held the lease, by the server's clock (zero when it is free).
    fn held_for(&self) -> Duration {
        match (self.acquired_ms, self.expires_ms, self.expires_in_ms) {
            (Some(acquired), Some(expires), Some(left)) if left > 0 => {
                Duration::from_millis(u64::try_from(expires - left - acquired).unwrap_or(0))
            }
            _ => Duration::ZERO,
        }
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
        let highest_token = self.token.unwrap_or_default();
        match Refusal::from_status(&self.status, highest_token, self.owner.as_deref()) {
            Some(refusal) => refusal.into_error(lease),
            None => Error::internal(
                format!(
                    "PostgreSQL answered `{}`, which this fence does not know",
                    self.status
                ),
                "fence's schema may be from another version; run `fence init`",
            ),
        }
    }
}

#[async_trait(?Send)]
impl Leases for PgCoordinator {
    async fn init(&self) -> Result<InitReport, Error> {
        let (before, schema_version) = self.session().await?.init().await?;
        Ok(InitReport {
            action: InitAction::of(before, schema_version),
            schema_version,
            location: format!("schema `{}`", self.schema),
            held_waiters: Some(self.held_waiters().await?.unwrap_or(HELD_DEFAULT)),
        })
    }

    /// A grant, a reacquire or a refusal: the queue's poll for a queued waiter, else the
    /// one-shot statement; a new token is above `above` too, when asked (never queued:
    /// `--above` does not wait).
    async fn grant(
        &self,
        resource: &str,
        owner: &str,
        ttl: Duration,
        above: Option<i64>,
    ) -> Result<Grant, Error> {
        let ttl = ttl_ms(ttl);
        let queued = above.is_none()
            && self
                .queue
                .borrow()
                .as_ref()
                .is_some_and(|queue| queue.resource == resource);
        let answer = if queued {
            self.poll_queue(resource, owner, ttl).await?
        } else {
            let what = format!("acquire `{resource}`");
            let full: &[(&(dyn ToSql + Sync), Type)] = &[
                (&resource, Type::TEXT),
                (&owner, Type::TEXT),
                (&ttl, Type::INT8),
                (&above, Type::INT8),
            ];
            if above.is_some() {
                self.one_shot(&what, ACQUIRE, full).await?
            } else {
                let short = &full[..3];
                self.one_shot_fast(&what, (ACQUIRE_FAST, short), (ACQUIRE_NEW, short))
                    .await?
            }
        };
        let lease = answer.lease(resource);
        // The statement that answered was the last one sent on the session it used.
        let sent = self
            .session
            .borrow()
            .as_ref()
            .and_then(|session| session.last_sent());
        if queued {
            if answer.status == "busy" {
                self.queued(&answer);
            } else {
                // Granted: the grant took the row out of the queue in the same transaction.
                *self.queue.borrow_mut() = None;
            }
        }
        let result = match answer.status.as_str() {
            "acquired" | "taken_over" | "reacquired" => Ok(Grant {
                reacquired: answer.status == "reacquired",
                lease,
                sent,
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
            "held_not_above" => Err(crate::coordinator::held_not_above(
                resource,
                owner,
                lease.token,
                above.unwrap_or_default(),
            )),
            other => Err(Error::internal(
                format!("PostgreSQL answered `{other}` to an acquire"),
                "fence's schema may be from another version; run `fence init`",
            )),
        };
        if let Err(err) = &result {
            self.note_refusal("acquire", owner, err).await;
        }
        result
    }

    async fn renew(&self, lease: &LeaseRef, ttl: Option<Duration>) -> Result<Lease, Error> {
        let ttl = ttl.map(ttl_ms);
        let params: &[(&(dyn ToSql + Sync), Type)] = &[
            (&lease.resource, Type::TEXT),
            (&lease.owner, Type::TEXT),
            (&lease.token, Type::INT8),
            (&ttl, Type::INT8),
        ];
        let answer = self
            .one_shot_fast(
                &format!("renew `{}`", lease.resource),
                (RENEW_FAST, params),
                (RENEW, params),
            )
            .await?;
        if answer.status == "renewed" {
            return Ok(answer.lease(&lease.resource));
        }
        let err = answer.refusal(lease);
        self.note_refusal("renew", &lease.owner, &err).await;
        Err(err)
    }

    async fn release(&self, lease: &LeaseRef) -> Result<Released, Error> {
        let params: &[(&(dyn ToSql + Sync), Type)] = &[
            (&lease.resource, Type::TEXT),
            (&lease.owner, Type::TEXT),
            (&lease.token, Type::INT8),
        ];
        let answer = self
            .one_shot_fast(
                &format!("release `{}`", lease.resource),
                (RELEASE_FAST, params),
                (RELEASE, params),
            )
            .await?;
        match answer.status.as_str() {
            "released" => Ok(Released::Now),
            "already_released" => Ok(Released::Already),
            _ => {
                let err = answer.refusal(lease);
                self.note_refusal("release", &lease.owner, &err).await;
                Err(err)
            }
        }
    }

    async fn require_existing(&self) -> Result<(), Error> {
        if self.session().await?.exists().await? {
            return Ok(());
        }
        Err(Error::usage(
            format!(
                "no fence schema `{}` in PostgreSQL at `{}`",
                self.schema, self.display
            ),
            "check --schema (FENCE_SCHEMA) and the database in --store (FENCE_STORE); `fence init` or the first `fence acquire` creates the schema",
        ))
    }

    async fn cancel_pending(&self) {
        let session = self.session.borrow().clone();
        if let Some(session) = session {
            let _ = tokio::time::timeout(Duration::from_secs(2), session.cancel()).await;
        }
    }

    fn connect_refusal(&self) -> Option<String> {
        self.refusals.last()
    }
}

/// Milliseconds since the Unix epoch, rounded down, as the schema's `ms()` computes them.
fn epoch_ms(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => {
            let ms = before.duration().as_micros().div_ceil(1000);
            i64::try_from(ms).map_or(i64::MIN, |ms| -ms)
        }
    }
}
