//! The PostgreSQL coordinator (DESIGN §7–§8).
//!
//! Each operation is one statement in autocommit, one round trip, sent as an unnamed
//! statement (`query_typed`; see `Session`): acquire, renew and release are plain statements
//! ([`pg_one_shot`](super::pg_one_shot), no PL/pgSQL to compile on a new connection), a
//! waiter's poll one call of a PL/pgSQL function. Both compute the next token from the locked
//! row, read `clock_timestamp()` after the lock, set `synchronous_commit = on` for their own
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
//! [`GRACE`] has passed, and skipped. The first [`WINDOW`] waiters keep their connection and
//! `LISTEN` (a release wakes the head, a grant moves everyone up), polling every
//! [`NEAR_POLL`] besides (a pooler drops `LISTEN`); when the queue moves fast, up to
//! [`HELD_MAX`] do. The others close their connection and poll on a fresh one, less often the
//! further back they are ([`far_poll`]): a thousand waiters behind a long-held lease hold two
//! connections and open about a hundred a second between them. The queue's pace (time per
//! grant) that decides both is, on joining, the median gap between the resource's recent
//! grants, then what the waiter's own polls see, followed at once when it is faster and
//! gradually when slower, and never shorter than the current holder has held the lease:
//! a lease that lay free while the next waiter slept does not teach the others to sleep
//! longer, which would leave it free longer still. A newcomer to `--wait` joins
//! at the back when others wait; a plain `acquire` (no `--wait`) is not queued and can take a
//! free resource before the head does.
//!
//! The price of exact order, measured with `fence bench` (README, Performance): a released
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

use crate::coordinator::pg_one_shot::{ACQUIRE, RELEASE, RENEW};
use crate::coordinator::Refusal;
use crate::coordinator::{
    ttl_ms, Attempt, Coordinator, Event, EventKind, Grant, InitAction, InitReport, InspectQuery,
    Inspection, Lease, LeaseRef, LogQuery, Logged, PruneQuery, Pruned, Released, ResourceView,
    State, Waiter,
};
use crate::error::{Error, Holder};
use crate::pg::session::{SchemaSpec, Session};
use crate::pg::window::LogWindow;
use crate::pg::CONNECT_PATIENCE;
use crate::sys::random_u64;
use crate::timeline::newest;

/// fence's own tables in the coordinator database.
pub const COORDINATOR_SCHEMA: SchemaSpec = SchemaSpec {
    meta_table: "meta",
    version: 5,
    sql: include_str!("schema.sql"),
    purpose: "coordinator",
};

/// How many waiters at the head of a queue keep their connection and listen: the head, so
/// that a release reaches it at once, and the next, so that the head's grant does too and a
/// fresh head is ready for the following release.
pub const WINDOW: i64 = 2;
/// The most waiters of one resource that keep a connection: behind the window, a waiter
/// whose turn should come within [`HOLD_SOONER`] at the queue's pace keeps its connection
/// and listens too, so that a hot resource with short critical sections is not held down
/// to the pace at which far waiters reconnect (a release or grant then wakes up to this
/// many waiters, each for one short poll).
pub const HELD_MAX: i64 = 8;
const HOLD_SOONER: Duration = Duration::from_millis(500);
/// How often the waiters of the window poll, whatever they hear: notifications are not
/// durable, a lease can expire without one, and a transaction-mode pooler drops `LISTEN`.
pub const NEAR_POLL: Duration = Duration::from_millis(250);
/// Poll interval of the first waiter outside the window, and the growth per place behind it.
const FAR_STEP: Duration = Duration::from_millis(200);
/// The shortest and the longest poll interval outside the window.
const FAR_MIN: Duration = Duration::from_millis(25);
pub const FAR_MAX: Duration = Duration::from_secs(10);
/// How long past its promised next poll a waiter's row lives: the waiter is late (a slow
/// connection, a full server, a loaded machine) rather than dead. A dead or paused waiter at
/// the head holds the queue up for its promise plus this, then is skipped.
pub const GRACE: Duration = Duration::from_secs(5);
/// Resources per `fence prune` statement: each is one short transaction.
const PRUNE_PAGE: usize = 1_000;
/// How long recording a refused attempt waits for a lock on `attempts` before it gives up
/// (with a warning): the refusal is answered at once all the same.
const ATTEMPT_LOCK_WAIT: Duration = Duration::from_millis(250);
/// The longest a queued waiter sleeps when its wait has no end.
const FOREVER: Duration = Duration::from_secs(3600);

/// The poll interval of a waiter at `place` (> [`WINDOW`]) whose queue has been granting
/// about one lease per `per_grant`: it wakes halfway to when its turn could come at that
/// pace (so it polls about log2 of its place times on the way to the head), and never later
/// than [`FAR_STEP`] per place ahead of it, so that a queue that speeds up finds its next
/// waiters awake soon enough. Halfway rather than just before: the pace is measured from
/// the queue itself, and a waiter that came only just in time would hold the pace down to
/// its own reconnect time. Between [`FAR_MIN`] and [`FAR_MAX`]. Summed over a queue behind a
/// long-held lease, the polls per second are about 5·H(50) + (N − 50)/10 ≈ 23 + N/10 for N
/// waiters (H the harmonic number).
pub fn far_poll(place: i64, per_grant: Duration) -> Duration {
    let ahead = u32::try_from((place - WINDOW).max(1)).unwrap_or(u32::MAX);
    let paced = per_grant.saturating_mul(ahead) / 2;
    paced
        .min(FAR_STEP.saturating_mul(ahead))
        .clamp(FAR_MIN, FAR_MAX)
}

/// How many places at the head of a queue going at `per_grant` keep their connection and
/// listen: the window, and behind it those whose turn should come within [`HOLD_SOONER`],
/// up to [`HELD_MAX`].
fn held_places(per_grant: Duration) -> i64 {
    let mut places = WINDOW;
    while places < HELD_MAX
        && per_grant.saturating_mul(u32::try_from(places).unwrap_or(u32::MAX)) < HOLD_SOONER
    {
        places += 1;
    }
    places
}

/// The pace after a poll that saw `grants` grants in the `elapsed` since the waiter's last
/// one. Fast attack, slow decay: a queue that speeds up is followed at once (its next
/// waiters must be awake in time), one that slows down gradually, so that time the lease lay
/// free because its next waiter slept does not teach the waiters to sleep longer (a slow
/// holder is told by how long it has held the lease, `Queue::held_for`). No grant: no news.
fn followed_pace(per_grant: Duration, elapsed: Duration, grants: u32) -> Duration {
    if grants == 0 {
        return per_grant;
    }
    let sample = (elapsed / grants).max(Duration::from_millis(1));
    if sample < per_grant {
        sample
    } else {
        (per_grant * 3 + sample) / 4
    }
}

/// The longest a waiter at `place` sleeps before its next poll, whatever the pace: what its
/// poll promises (its row lives that long plus [`GRACE`]). Never grows as the place shrinks.
fn promise(place: i64) -> Duration {
    if place <= WINDOW {
        return NEAR_POLL;
    }
    let ahead = u32::try_from(place - WINDOW).unwrap_or(u32::MAX);
    FAR_STEP.saturating_mul(ahead).min(FAR_MAX).max(NEAR_POLL)
}

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
    /// The server's last refusal of a new session (see [`Coordinator::connect_refusal`]).
    refusals: crate::pg::Refusals,
}

/// A waiter's state between its polls.
struct Queue {
    resource: String,
    /// When the wait ends (`None`: never); reconnecting is retried until then.
    until: Option<Instant>,
    /// Its row, once it joined.
    waiter: Option<i64>,
    /// 1 = head; 0 before joining.
    place: i64,
    /// What its last poll promised: the row lives this much past it, less [`GRACE`].
    promised: Duration,
    /// Up to which place its last poll asked to listen (see [`held_places`]).
    listen_within: i64,
    /// Whether its connection listens.
    listening: bool,
    /// Whether its last poll made it listen: it polls once more at once, since a release
    /// between its poll and its `LISTEN` was not sent to it.
    started_listening: bool,
    /// The pace of the queue, for [`far_poll`]: the lease's token and the time at the last
    /// poll, and the estimated time per grant.
    last_token: Option<i64>,
    last_poll: Instant,
    per_grant: Duration,
    /// How long the holder had held the lease at the last poll (zero when it was free): a
    /// grant takes at least that long, whatever the queue did before.
    held_for: Duration,
    /// The holder's remaining lease at the last poll.
    expires_in_ms: Option<i64>,
}

impl Queue {
    /// The time per grant to plan with: the queue's recent pace, or longer while the current
    /// holder has held the lease longer than that.
    fn pace(&self) -> Duration {
        self.per_grant.max(self.held_for)
    }
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
        loop {
            let rows = self.call(what, true, sql, params).await?;
            let answer = Answer::from_statement(&rows)?;
            if answer.status != "retry" {
                return Ok(answer);
            }
        }
    }

    /// A queued waiter's attempt: joins the queue (first call) or polls it; rejoins at the
    /// back, saying so, when its row was deleted while it was paused or cut off.
    async fn poll_queue(&self, resource: &str, owner: &str, ttl: i64) -> Result<Answer, Error> {
        let (waiter, promise, listen_within) = self
            .queue
            .borrow()
            .as_ref()
            .map_or((None, FAR_MAX, WINDOW), |queue| {
                (queue.waiter, queue.promised, held_places(queue.pace()))
            });
        if let Some(queue) = self.queue.borrow_mut().as_mut() {
            queue.listen_within = listen_within;
        }
        let live = i64::try_from((promise + GRACE).as_millis()).unwrap_or(i64::MAX);
        let what = format!("wait for `{resource}`");
        if let Some(waiter) = waiter {
            let rows = self
                .call(
                    &what,
                    true,
                    "SELECT * FROM __SCHEMA__.wait_poll($1, $2, $3, $4, $5, $6)",
                    &[
                        (&resource, Type::TEXT),
                        (&owner, Type::TEXT),
                        (&ttl, Type::INT8),
                        (&waiter, Type::INT8),
                        (&live, Type::INT8),
                        (&listen_within, Type::INT8),
                    ],
                )
                .await?;
            let answer = Answer::from_rows(&rows)?;
            if answer.status != "lapsed" {
                return Ok(answer);
            }
            crate::terminal::warn(&format!(
                "warning: this waiter for `{resource}` did not poll within {}s of its promise (paused, or the server unreachable), so its place was given up; it joins the queue again at the back",
                GRACE.as_secs()
            ));
        }
        // Joining: the row must outlive the slowest first poll. The newcomer does not know
        // the queue's pace yet: it listens if it lands within reach of any pace, and lets go
        // of its connection after the answer if the pace says so.
        let live = i64::try_from((FAR_MAX + GRACE).as_millis()).unwrap_or(i64::MAX);
        let listen_within = HELD_MAX;
        if let Some(queue) = self.queue.borrow_mut().as_mut() {
            queue.listen_within = listen_within;
        }
        let rows = self
            .call(
                &what,
                true,
                "SELECT * FROM __SCHEMA__.wait_enter($1, $2, $3, $4, $5)",
                &[
                    (&resource, Type::TEXT),
                    (&owner, Type::TEXT),
                    (&ttl, Type::INT8),
                    (&live, Type::INT8),
                    (&listen_within, Type::INT8),
                ],
            )
            .await?;
        Answer::from_rows(&rows)
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

    /// Notes a busy poll's answer: place, pace, and the next promise.
    fn queued(&self, answer: &Answer) {
        let mut queue = self.queue.borrow_mut();
        let Some(queue) = queue.as_mut() else {
            return;
        };
        let now = Instant::now();
        if let Some(pace) = answer.pace_ms {
            queue.per_grant = Duration::from_millis(u64::try_from(pace).unwrap_or(0))
                .clamp(Duration::from_millis(1), FAR_MAX);
        } else if let (Some(before), Some(token)) = (queue.last_token, answer.token) {
            let elapsed = now.saturating_duration_since(queue.last_poll);
            // A token lower than the last one seen (a restored store) is no grant, not billions.
            let grants = u32::try_from(token.saturating_sub(before)).unwrap_or(0);
            queue.per_grant = followed_pace(queue.per_grant, elapsed, grants);
        }
        queue.held_for = answer.held_for();
        let place = answer.place.unwrap_or(queue.place);
        let listens = place <= queue.listen_within;
        queue.started_listening = listens && !queue.listening;
        queue.listening = listens || queue.listening;
        queue.waiter = answer.waiter.or(queue.waiter);
        queue.place = place;
        queue.last_token = answer.token;
        queue.last_poll = now;
        queue.expires_in_ms = answer.expires_in_ms;
        // Places only move forward and no interval outgrows its place's bound, so the row
        // is kept alive until the latest the next poll can come.
        queue.promised = promise(place);
    }

    /// One bound for the whole run, by the server's clock; then pages of [`PRUNE_PAGE`]
    /// resources (in name order, through `leases_resource_bytes`), each one statement: the
    /// id of each resource's last kept event through `events_resource_id`, the older
    /// events below it deleted in the same range (never those of a run id's completion
    /// record, `R#done:ID`: its events hold the digest of the command that completed it, which
    /// tells a retry from another command reusing the id), and their number per kind added to
    /// `event_totals`, so that the counters of `fence metrics` do not go down. `leases` is only read (its guard trigger
    /// refuses deletes anyway), so no token counter can change.
    async fn prune_all(&self, query: &PruneQuery<'_>) -> Result<Pruned, Error> {
        let what = "prune old events";
        let older = i64::try_from(query.older_than.as_millis()).unwrap_or(i64::MAX);
        // A schema that does not exist yet (a read of it returns no rows) has nothing to prune.
        let rows = self
            .call(
                what,
                false,
                "SELECT greatest(c.now - $1, 0) FROM (SELECT __SCHEMA__.ms(clock_timestamp()) AS now) c",
                &[(&older, Type::INT8)],
            )
            .await?;
        let Some(before) = rows.first().map(|row| row.get::<_, i64>(0)) else {
            return Ok(Pruned::default());
        };
        let keep = i64::from(query.keep);
        let page_size = i64::try_from(PRUNE_PAGE).unwrap_or(i64::MAX);
        let mut pruned = Pruned {
            before_ms: Some(before),
            ..Pruned::default()
        };
        let mut after: Option<String> = None;
        loop {
            let page: Vec<String> = if query.resources.is_empty() {
                // Once a batch is deleted, a failure is no longer "nothing changed".
                self.call(
                    what,
                    pruned.resources > 0,
                    "SELECT resource FROM __SCHEMA__.leases \
                     WHERE $1::text IS NULL OR resource COLLATE \"C\" > $1 \
                     ORDER BY resource COLLATE \"C\" LIMIT $2",
                    &[(&after, Type::TEXT), (&page_size, Type::INT8)],
                )
                .await?
                .iter()
                .map(|row| row.get(0))
                .collect()
            } else if after.is_none() {
                query.resources.to_vec()
            } else {
                Vec::new()
            };
            let Some(last) = page.last().cloned() else {
                break;
            };
            let rows = self
                .call(
                    what,
                    true,
                    "WITH cut AS ( \
                       SELECT p.resource, (SELECT k.id FROM __SCHEMA__.events k \
                         WHERE k.resource = p.resource ORDER BY k.id DESC OFFSET $2 LIMIT 1) AS last_id \
                       FROM unnest($1::text[]) AS p(resource) \
                       WHERE strpos(p.resource, $4) = 0), \
                     gone AS ( \
                       DELETE FROM __SCHEMA__.events e USING cut c \
                       WHERE e.resource = c.resource AND e.id <= c.last_id \
                         AND e.at < to_timestamp($3::bigint / 1000.0) \
                       RETURNING e.resource, e.kind), \
                     folded AS ( \
                       INSERT INTO __SCHEMA__.event_totals AS t (resource, kind, n) \
                       SELECT g.resource, g.kind, count(*) FROM gone g GROUP BY 1, 2 \
                       ON CONFLICT (resource, kind) DO UPDATE SET n = t.n + EXCLUDED.n) \
                     SELECT count(*) FROM gone",
                    &[
                        (&page, Type::TEXT_ARRAY),
                        (&keep, Type::INT8),
                        (&before, Type::INT8),
                        (&crate::config::DONE_MARK, Type::TEXT),
                    ],
                )
                .await?;
            pruned.events += rows
                .first()
                .map_or(0, |row| row.get::<_, i64>(0).unsigned_abs());
            pruned.resources += page.len() as u64;
            if query.resources.is_empty() && page.len() < PRUNE_PAGE {
                break;
            }
            after = Some(last);
        }
        // Past its deadline a waiter's row is dead (see `GRACE`): the queue itself deletes
        // such rows when the resource is polled; these are of resources no one waits for now.
        let names: Option<Vec<String>> =
            (!query.resources.is_empty()).then(|| query.resources.to_vec());
        let rows = self
            .call(
                what,
                true,
                "WITH gone AS (DELETE FROM __SCHEMA__.waiters w \
                   WHERE w.deadline < clock_timestamp() AND ($1::text[] IS NULL OR w.resource = ANY($1)) \
                   RETURNING 1) \
                 SELECT count(*) FROM gone",
                &[(&names, Type::TEXT_ARRAY)],
            )
            .await?;
        pruned.waiters = rows
            .first()
            .map_or(0, |row| row.get::<_, i64>(0).unsigned_abs());
        // Refused attempts whose last one is older than the bound.
        self.call(
            what,
            true,
            "DELETE FROM __SCHEMA__.attempts a WHERE a.last_at < to_timestamp($2::bigint / 1000.0) \
             AND ($1::text[] IS NULL OR a.resource = ANY($1))",
            &[(&names, Type::TEXT_ARRAY), (&before, Type::INT8)],
        )
        .await?;
        Ok(pruned)
    }
}

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
impl Coordinator for PgCoordinator {
    async fn init(&self) -> Result<InitReport, Error> {
        let (before, schema_version) = self.session().await?.init().await?;
        Ok(InitReport {
            action: InitAction::of(before, schema_version),
            schema_version,
            location: format!("schema `{}`", self.schema),
        })
    }

    async fn acquire(&self, resource: &str, owner: &str, ttl: Duration) -> Result<Grant, Error> {
        let ttl = ttl_ms(ttl);
        let queued = self
            .queue
            .borrow()
            .as_ref()
            .is_some_and(|queue| queue.resource == resource);
        let answer = if queued {
            self.poll_queue(resource, owner, ttl).await?
        } else {
            self.one_shot(
                &format!("acquire `{resource}`"),
                ACQUIRE,
                &[
                    (&resource, Type::TEXT),
                    (&owner, Type::TEXT),
                    (&ttl, Type::INT8),
                ],
            )
            .await?
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
        let answer = self
            .one_shot(
                &format!("renew `{}`", lease.resource),
                RENEW,
                &[
                    (&lease.resource, Type::TEXT),
                    (&lease.owner, Type::TEXT),
                    (&lease.token, Type::INT8),
                    (&ttl, Type::INT8),
                ],
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
        let answer = self
            .one_shot(
                &format!("release `{}`", lease.resource),
                RELEASE,
                &[
                    (&lease.resource, Type::TEXT),
                    (&lease.owner, Type::TEXT),
                    (&lease.token, Type::INT8),
                ],
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

    async fn inspect(
        &self,
        resources: &[String],
        history: usize,
    ) -> Result<Vec<ResourceView>, Error> {
        Ok(self
            .inspect_query(&InspectQuery {
                resources,
                history,
                ..InspectQuery::default()
            })
            .await?
            .views)
    }

    /// One page of leases, filtered in the server, then the last events of each resource of
    /// the page through its index (`events (resource, id DESC)`, one LATERAL range each) and
    /// its live waiters; merged in one pass. The cost follows the page, not the store.
    async fn inspect_query(&self, query: &InspectQuery<'_>) -> Result<Inspection, Error> {
        let names: Option<Vec<String>> =
            (!query.resources.is_empty()).then(|| query.resources.to_vec());
        let state = query.state.map(State::as_str);
        let after = query.after;
        let limit = query.limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX));
        let leases_sql =
            "SELECT resource, owner, token, __SCHEMA__.ms(acquired_at) AS acquired_ms, \
             __SCHEMA__.ms(renewed_at) AS renewed_ms, __SCHEMA__.ms(expires_at) AS expires_ms, \
             __SCHEMA__.ms(expires_at) - __SCHEMA__.ms(clock_timestamp()) AS expires_in_ms \
             FROM __SCHEMA__.leases \
             WHERE ($1::text[] IS NULL OR resource = ANY($1)) \
             AND ($2::text IS NULL OR resource COLLATE \"C\" > $2) \
             AND CASE $3::text WHEN 'held' THEN expires_at > clock_timestamp() \
                 WHEN 'expired' THEN expires_at <= clock_timestamp() \
                 WHEN 'free' THEN expires_at IS NULL ELSE true END \
             ORDER BY resource COLLATE \"C\" LIMIT $4";
        let what = "inspect leases";
        let rows = self
            .call(
                what,
                false,
                leases_sql,
                &[
                    (&names, Type::TEXT_ARRAY),
                    (&after, Type::TEXT),
                    (&state, Type::TEXT),
                    (&limit, Type::INT8),
                ],
            )
            .await?;
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
        // Named resources never acquired are shown as such (when the filters let them).
        for name in query.resources {
            if !views.iter().any(|v| &v.resource == name) {
                views.push(ResourceView::unknown(name));
            }
        }
        if !query.resources.is_empty() {
            views = query.apply(views);
        }
        let page: Vec<String> = views.iter().map(|v| v.resource.clone()).collect();
        let index: std::collections::HashMap<String, usize> = page
            .iter()
            .enumerate()
            .map(|(i, name)| (name.clone(), i))
            .collect();
        let history = i64::try_from(query.history).unwrap_or(i64::MAX);
        if history > 0 && !page.is_empty() {
            let events_sql = "SELECT p.resource, __SCHEMA__.ms(e.at) AS at_ms, e.kind, e.owner, e.token, e.detail \
                 FROM unnest($1::text[]) AS p(resource) CROSS JOIN LATERAL ( \
                   SELECT * FROM __SCHEMA__.events e WHERE e.resource = p.resource \
                   ORDER BY e.id DESC LIMIT $2) e";
            let event_rows = self
                .call(
                    what,
                    false,
                    events_sql,
                    &[(&page, Type::TEXT_ARRAY), (&history, Type::INT8)],
                )
                .await?;
            for row in &event_rows {
                let resource: String = row.get("resource");
                if let Some(&i) = index.get(&resource) {
                    views[i].events.push(Event {
                        owner: row.get("owner"),
                        token: row.get("token"),
                        detail: row.get("detail"),
                        ..Event::new(EventKind::parse(row.get("kind")), row.get("at_ms"))
                    });
                }
            }
        }
        if !page.is_empty() {
            // Rows past their deadline belong to dead or paused waiters (the next poll deletes
            // them).
            let waiters_sql =
                "SELECT w.resource, w.owner, __SCHEMA__.ms(w.since) FROM __SCHEMA__.waiters w \
                 WHERE w.resource = ANY($1) AND w.deadline >= clock_timestamp() ORDER BY w.id";
            let waiter_rows = self
                .call(what, false, waiters_sql, &[(&page, Type::TEXT_ARRAY)])
                .await?;
            for row in &waiter_rows {
                let resource: String = row.get(0);
                if let Some(&i) = index.get(&resource) {
                    views[i].waiters.push(Waiter {
                        owner: row.get(1),
                        since_ms: row.get(2),
                    });
                }
            }
        }
        if !query.resources.is_empty() {
            views.sort_by_key(|v| query.resources.iter().position(|r| r == &v.resource));
        }
        Ok(Inspection {
            views,
            findings: Vec::new(),
        })
    }

    fn pages_at_source(&self) -> bool {
        true
    }

    /// One upsert into `attempts`. The refused statement before it has already checked the
    /// schema's version (and migrated an older one); a schema without the table (dropped by
    /// hand) records nothing.
    async fn record_attempt(&self, attempt: &Attempt) -> Result<(), Error> {
        use crate::fenced::quote_literal;
        let what = format!("record the refused attempt on `{}`", attempt.resource);
        // A transaction of its own with a short lock wait: the record is history, and a lock
        // on `attempts` (a long transaction, a hand-run LOCK) must not hold up the answer to
        // the refused caller, nor a waiter's next poll. Literals, not parameters, since the
        // SET LOCAL goes in the same message (one round trip, as before).
        let sql = format!(
            "BEGIN; SET LOCAL lock_timeout = {ms}; \
             INSERT INTO {schema}.attempts AS a \
             (resource, minute, owner, kind, count, first_at, last_at, token, detail) \
             SELECT {resource}, date_trunc('minute', c.now), {owner}, {kind}, 1, c.now, c.now, {token}, {detail} \
             FROM (SELECT clock_timestamp() AS now) c \
             ON CONFLICT (resource, minute, owner, kind) DO UPDATE \
             SET count = a.count + 1, last_at = EXCLUDED.last_at, token = EXCLUDED.token, \
               detail = EXCLUDED.detail; COMMIT",
            ms = ATTEMPT_LOCK_WAIT.as_millis(),
            schema = self.schema,
            resource = quote_literal(&attempt.resource),
            owner = quote_literal(&attempt.owner),
            kind = quote_literal(attempt.kind.as_str()),
            token = attempt.token,
            detail = quote_literal(&attempt.detail),
        );
        let session = self.session().await?;
        let sent = tokio::time::timeout(
            crate::pg::REQUEST_TIMEOUT,
            session.client.batch_execute(&sql),
        )
        .await;
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => {
                // The failed statement left the transaction open and aborted.
                let _ = session.client.batch_execute("ROLLBACK").await;
                if crate::pg::session::is_missing_schema(&err) {
                    Ok(())
                } else {
                    Err(session.request_error(&err, &what, true))
                }
            }
            Err(_) => Err(crate::pg::lost(
                &self.display,
                &what,
                &format!("no answer within {}s", crate::pg::REQUEST_TIMEOUT.as_secs()),
                true,
            )),
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

    /// See [`PgCoordinator::prune_all`].
    async fn prune(&self, query: &PruneQuery<'_>) -> Result<Pruned, Error> {
        self.prune_all(query).await.map_err(|err| match err {
            // The only usage error here: a privilege the role lacks.
            Error::Usage { message, source, .. } => Error::Usage {
                message,
                source,
                hint: "`fence prune` needs SELECT on fence's `leases`, DELETE on its `events`, `waiters` and `attempts`, and INSERT and UPDATE on its `event_totals`: run it as the role that owns the schema (the one that ran `fence init`), or grant those".into(),
            },
            // Some batches may have been deleted, and repeating deletes only what is left.
            Error::OutcomeUnknown { message, source, .. } => Error::OutcomeUnknown {
                message,
                source,
                hint: "some of the old events may have been deleted already; run the same `fence prune` again (it is safe to repeat)".into(),
            },
            other => other,
        })
    }

    /// Each matching resource's events in the window through the `events (resource, at)`
    /// index (one LATERAL range per resource, newest first, at most `limit` each), then the
    /// newest `limit` of them all. The version-4 columns are read through `to_jsonb`, so that a
    /// schema not yet migrated answers with its events, without TTLs.
    async fn log(&self, query: &LogQuery<'_>) -> Result<Vec<Logged>, Error> {
        let window = LogWindow::new(query, "l.resource");
        let sql = format!(
            "SELECT l.resource, e.id, floor(extract(epoch FROM e.at) * 1000000)::int8 AS at_us, \
             __SCHEMA__.ms(e.at) AS at_ms, e.kind, e.owner, e.token, e.detail, \
             (e.j->>'ttl_ms')::int8 AS ttl_ms, \
             __SCHEMA__.ms((e.j->>'expires_at')::timestamptz) AS expires_ms, \
             __SCHEMA__.ms((e.j->>'previous_expires_at')::timestamptz) AS previous_expires_ms \
             FROM __SCHEMA__.leases l CROSS JOIN LATERAL ( \
               SELECT ev.id, ev.at, ev.kind, ev.owner, ev.token, ev.detail, to_jsonb(ev) AS j \
               FROM __SCHEMA__.events ev WHERE ev.resource = l.resource {range}) e \
             WHERE {filter} {last}",
            range = LogWindow::RANGE,
            filter = window.filter,
            last = LogWindow::LAST,
        );
        let rows = self
            .call("read the events", false, &sql, &window.params())
            .await?;
        let logged = rows
            .iter()
            .map(|row| {
                (
                    row.get("id"),
                    Logged {
                        resource: row.get("resource"),
                        at_us: row.get("at_us"),
                        event: Event {
                            owner: row.get("owner"),
                            token: row.get("token"),
                            detail: row.get("detail"),
                            ttl_ms: row.get("ttl_ms"),
                            expires_at_ms: row.get("expires_ms"),
                            previous_expires_at_ms: row.get("previous_expires_ms"),
                            ..Event::new(EventKind::parse(row.get("kind")), row.get("at_ms"))
                        },
                    },
                )
            })
            .collect();
        let mut logged = LogWindow::oldest_first(logged);
        // The refused attempts in the window (none on a schema older than version 5), by the
        // first attempt of each minute; the primary key `(resource, minute, …)` serves a
        // resource's range.
        let sql = format!(
            "SELECT a.resource, floor(extract(epoch FROM a.first_at) * 1000000)::int8 AS at_us, \
             __SCHEMA__.ms(a.first_at) AS at_ms, __SCHEMA__.ms(a.last_at) AS last_ms, a.kind, \
             a.owner, a.token, a.detail, a.count \
             FROM __SCHEMA__.attempts a WHERE {filter} \
             AND ($2::int8 IS NULL OR a.minute >= to_timestamp($2::int8 / 1000.0) - interval '1 minute') \
             AND ($2::int8 IS NULL OR a.first_at >= to_timestamp($2::int8 / 1000.0)) \
             AND ($3::int8 IS NULL OR a.minute < to_timestamp($3::int8 / 1000.0)) \
             AND ($3::int8 IS NULL OR a.first_at < to_timestamp($3::int8 / 1000.0)) \
             ORDER BY a.first_at DESC LIMIT $4",
            filter = LogWindow::new(query, "a.resource").filter,
        );
        let rows = self
            .call("read the refused attempts", false, &sql, &window.params())
            .await?;
        logged.extend(rows.iter().map(|row| Logged {
            resource: row.get("resource"),
            at_us: row.get("at_us"),
            event: Event {
                owner: row.get("owner"),
                token: row.get("token"),
                detail: row.get("detail"),
                count: row.get("count"),
                last_at_ms: row.get("last_ms"),
                ..Event::new(EventKind::parse(row.get("kind")), row.get("at_ms"))
            },
        }));
        newest(&mut logged, query.limit);
        Ok(logged)
    }

    /// One pass over the events table (no index serves a count of everything), plus what
    /// `fence prune` deleted (`event_totals`; none on a schema older than version 5, which
    /// reads as no rows).
    async fn event_counts(&self) -> Result<Vec<(String, EventKind, i64)>, Error> {
        let what = "count the events";
        let kept = self
            .call(
                what,
                false,
                "SELECT resource, kind, count(*) FROM __SCHEMA__.events GROUP BY 1, 2",
                &[],
            )
            .await?;
        let pruned = self
            .call(
                what,
                false,
                "SELECT resource, kind, n FROM __SCHEMA__.event_totals",
                &[],
            )
            .await?;
        let mut counts: std::collections::BTreeMap<(String, EventKind), i64> = Default::default();
        for row in kept.iter().chain(&pruned) {
            let kind = EventKind::parse(row.get(1));
            *counts.entry((row.get(0), kind)).or_default() += row.get::<_, i64>(2);
        }
        Ok(counts.into_iter().map(|((r, k), n)| (r, k, n)).collect())
    }

    fn queue_up(&self, resource: &str, _owner: &str, until: Option<Instant>) -> bool {
        *self.queue.borrow_mut() = Some(Queue {
            resource: resource.to_owned(),
            until,
            waiter: None,
            place: 0,
            promised: FAR_MAX,
            listen_within: WINDOW,
            listening: false,
            started_listening: false,
            last_token: None,
            last_poll: Instant::now(),
            per_grant: FAR_STEP,
            held_for: Duration::ZERO,
            expires_in_ms: None,
        });
        true
    }

    async fn wait_begin(&self, resource: &str, owner: &str) -> Result<(), Error> {
        // Waiters join the queue through `queue_up` and their next acquire; this is for a
        // caller that does not know about queues.
        self.queue_up(resource, owner, None);
        Ok(())
    }

    async fn unwait(&self, resource: &str) -> Result<(), Error> {
        let queue = self.queue.borrow_mut().take();
        let Some(waiter) = queue.and_then(|queue| queue.waiter) else {
            return Ok(()); // never joined, or a grant already left the queue
        };
        // One connection attempt: the wait is over, and a row left behind dies at its deadline.
        self.session_until(Instant::now())
            .await?
            .call(
                &format!("leave the queue of `{resource}`"),
                true,
                "SELECT __SCHEMA__.wait_leave($1, $2)",
                &[(&resource, Type::TEXT), (&waiter, Type::INT8)],
            )
            .await?;
        Ok(())
    }

    async fn wait_for_release(&self, resource: &str, max: Duration) -> Result<(), Error> {
        let (keep, nap) = match self.queue.borrow_mut().as_mut() {
            Some(queue) => {
                // The pace may have slowed since the poll: hold on only while it is worth it.
                let keep = queue.place <= held_places(queue.pace());
                queue.listening = queue.listening && keep;
                let nap = if queue.started_listening && queue.listening {
                    Duration::ZERO
                } else if queue.place == 1 {
                    // The head also wakes when the holder's lease runs out.
                    let expiry = queue.expires_in_ms.map_or(NEAR_POLL, |ms| {
                        Duration::from_millis(u64::try_from(ms).unwrap_or(0) + 1)
                    });
                    NEAR_POLL.min(expiry)
                } else if queue.listening {
                    // Notifications keep it up to date: polls only prove it alive.
                    NEAR_POLL
                } else {
                    far_poll(queue.place, queue.pace())
                };
                (keep, nap)
            }
            None => (true, max),
        };
        // A tenth of jitter either way, so that waiters do not poll in lockstep.
        let tenth = nap.as_micros() as u64 / 10;
        let nap = (nap + Duration::from_micros(random_u64() % (2 * tenth + 1)))
            .saturating_sub(Duration::from_micros(tenth))
            .min(max);
        if !keep {
            // Far from the head: no connection while asleep.
            self.session.borrow_mut().take();
            tokio::time::sleep(nap).await;
            return Ok(());
        }
        let Some(session) = self.session.borrow().clone() else {
            tokio::time::sleep(nap).await;
            return Ok(());
        };
        let mut notifications = session.notifications.lock().await;
        let deadline = Instant::now() + nap;
        loop {
            let payload = match tokio::time::timeout_at(deadline, notifications.recv()).await {
                Ok(Some(payload)) => payload,
                // The connection is gone (the next poll reconnects), or the time is up.
                Ok(None) | Err(_) => return Ok(()),
            };
            // `r:<resource>` a release; `g<id>:<resource>` waiter <id> was granted;
            // `l<id>:<resource>` waiter <id> left.
            let Some((event, moved)) = payload.split_once(':') else {
                continue;
            };
            if moved != resource {
                continue;
            }
            let mut queue = self.queue.borrow_mut();
            let Some(queue) = queue.as_mut() else {
                return Ok(());
            };
            let ahead = |id: &str| {
                id.parse::<i64>()
                    .is_ok_and(|id| queue.waiter.is_some_and(|mine| id < mine))
            };
            let poll = match event.split_at_checked(1) {
                // Only the head can take a released lease.
                Some(("r", _)) => queue.place <= 1,
                // The queue moved up: follow it; a new head polls at once only if the lease
                // may be free (a waiter left; a grant means the lease is held).
                Some((kind @ ("g" | "l"), id)) if ahead(id) => {
                    queue.place = (queue.place - 1).max(1);
                    kind == "l" && queue.place == 1
                }
                _ => false,
            };
            if poll {
                // Whatever else is pending is older than the poll that follows.
                while notifications.try_recv().is_ok() {}
                return Ok(());
            }
        }
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

    fn pushes_wakeups(&self) -> bool {
        true
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_pace_follows_a_faster_queue_at_once_and_a_stall_only_a_quarter() {
        // Faster: taken as it is.
        assert_eq!(followed_pace(40 * MS, 30 * MS, 10), 3 * MS);
        // A stall of 200 ms among ten 3 ms grants moves a 3 ms pace by a quarter of the gap.
        let stalled = followed_pace(3 * MS, 230 * MS, 10);
        assert_eq!(stalled, (3 * 3 * MS + 23 * MS) / 4);
        // No grant seen: the pace stays (how long the holder has held is another figure).
        assert_eq!(followed_pace(3 * MS, 10 * FAR_MAX, 0), 3 * MS);
        // Never below a millisecond.
        assert_eq!(followed_pace(3 * MS, MS, 10), MS);
    }

    #[test]
    fn a_slow_holder_slows_the_pace_and_a_free_lease_does_not() {
        let answer = |expires_in_ms: Option<i64>| Answer {
            status: "busy".into(),
            token: Some(7),
            owner: Some("holder".into()),
            acquired_ms: Some(1_000),
            renewed_ms: Some(60_000),
            expires_ms: Some(70_000),
            expires_in_ms,
            ttl_ms: Some(10_000),
            waiter: Some(3),
            place: Some(2),
            pace_ms: None,
        };
        // Held since 1 s, the server's clock at 65 s: 64 s.
        assert_eq!(answer(Some(5_000)).held_for(), 64_000 * MS);
        assert_eq!(answer(Some(0)).held_for(), Duration::ZERO);
        assert_eq!(answer(None).held_for(), Duration::ZERO);
        let mut queue = Queue {
            resource: "r".into(),
            until: None,
            waiter: Some(3),
            place: 2,
            promised: NEAR_POLL,
            listen_within: WINDOW,
            listening: false,
            started_listening: false,
            last_token: Some(7),
            last_poll: Instant::now(),
            per_grant: 3 * MS,
            held_for: answer(Some(5_000)).held_for(),
            expires_in_ms: Some(5_000),
        };
        assert_eq!(queue.pace(), 64_000 * MS);
        assert_eq!(held_places(queue.pace()), WINDOW);
        queue.held_for = Duration::ZERO;
        assert_eq!(queue.pace(), 3 * MS);
        assert_eq!(held_places(queue.pace()), HELD_MAX);
    }
}
