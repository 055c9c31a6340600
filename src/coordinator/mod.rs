//! Lease coordinators behind one trait, so commands never match on the backend kind.
//!
//! Every coordinator keeps the same promises (DESIGN §6): a grant's token is strictly greater
//! than every token granted before for the resource (I1), at most one live lease exists per
//! resource by the coordinator's clock (I3), and a late renew or release never changes a newer
//! owner's lease (I4). Lease records are never deleted, so counters survive release; only
//! history (events) and dead waiters' rows may be (`fence prune`).

pub mod attempts;
pub(crate) mod file;
mod object;
pub mod pg_one_shot;
mod postgres;
mod refusal;
pub mod scratch;

pub use object::{HighWaterReport, ObjectCoordinator};
pub use postgres::COORDINATOR_SCHEMA;
/// The most connections the waiters of one busy resource keep on PostgreSQL.
pub use postgres::{HELD_DEFAULT as PG_HELD_WAITERS, HELD_MOST as PG_HELD_WAITERS_MOST};

use std::time::Duration;

use async_trait::async_trait;

use crate::config::{StoreKind, StoreSpec};
use crate::error::{Error, LostReason};
use crate::timeline::newest;
pub use crate::timeline::{Event, EventKind, LogQuery, Logged, Pattern, RunNote};
pub use attempts::Attempt;
pub use refusal::{Found, Refusal};

/// A lease as the coordinator recorded it. Instants are milliseconds since the Unix epoch by
/// the coordinator's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub resource: String,
    pub owner: String,
    pub token: i64,
    pub acquired_at_ms: i64,
    pub renewed_at_ms: i64,
    pub expires_at_ms: i64,
    /// The remaining lifetime when the coordinator answered.
    pub expires_in_ms: i64,
    pub ttl_ms: i64,
}

/// A successful acquisition.
#[derive(Clone, Debug)]
pub struct Grant {
    pub lease: Lease,
    /// The same owner already held it live: same token, expiry extended.
    pub reacquired: bool,
    /// When the request that made the grant was sent, where the coordinator knows it more
    /// closely than its caller (an object store's conditional put, after the reads and the
    /// attempts that lost; PostgreSQL's statement, after the connect's round trips): the
    /// store extended the lease at or after it. `fence run` counts
    /// its bound from the later of this and its own instant.
    pub sent: Option<tokio::time::Instant>,
}

/// The outcome of a release that succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The lease was live (or expired, untaken) and is now free.
    Now,
    /// It had already been released with this token: nothing to do.
    Already,
}

/// Which lease a renew or release names.
#[derive(Clone, Debug)]
pub struct LeaseRef {
    pub resource: String,
    pub owner: String,
    pub token: i64,
}

/// The state of a resource, as `inspect` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Held,
    Expired,
    Free,
    /// The store's own files for the resource cannot be read (local directory store).
    Damaged,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Held => "held",
            State::Expired => "expired",
            State::Free => "free",
            State::Damaged => "damaged",
        }
    }
}

/// Which resources an `inspect` answer holds: a page of the resources (by name) in a state.
#[derive(Clone, Copy, Debug, Default)]
pub struct InspectQuery<'a> {
    /// The named resources (every known one when empty).
    pub resources: &'a [String],
    /// Events per resource, most recent first.
    pub history: usize,
    /// Only resources in this state.
    pub state: Option<State>,
    /// Only resources named after this one (byte order): the cursor of the previous page.
    pub after: Option<&'a str>,
    /// At most this many resources.
    pub limit: Option<usize>,
}

impl InspectQuery<'_> {
    /// Applies the filters to a full answer, for stores that cannot filter at the source.
    pub fn apply(&self, mut views: Vec<ResourceView>) -> Vec<ResourceView> {
        if self.resources.is_empty() {
            views.sort_by(|a, b| a.resource.cmp(&b.resource));
        }
        views.retain(|v| {
            self.state.is_none_or(|s| v.state == s)
                && self.after.is_none_or(|after| v.resource.as_str() > after)
        });
        if let Some(limit) = self.limit {
            views.truncate(limit);
        }
        views
    }
}

/// One resource in an `inspect` answer.
#[derive(Clone, Debug)]
pub struct ResourceView {
    pub resource: String,
    pub state: State,
    /// The current (held/expired) or last (free) owner; `None` if never acquired.
    pub owner: Option<String>,
    /// The highest token issued; `None` if never acquired.
    pub token: Option<i64>,
    pub acquired_at_ms: Option<i64>,
    pub renewed_at_ms: Option<i64>,
    pub expires_at_ms: Option<i64>,
    pub expires_in_ms: Option<i64>,
    /// Most recent first.
    pub events: Vec<Event>,
    /// Processes waiting for the resource (`--wait`), longest waiting first.
    pub waiters: Vec<Waiter>,
}

/// A process blocked in `acquire --wait` or `run --wait`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    pub owner: String,
    /// Since when, by the store's clock (the local wall clock for the directory store).
    pub since_ms: i64,
}

impl ResourceView {
    /// A resource the store has no record of.
    pub fn unknown(resource: &str) -> ResourceView {
        ResourceView {
            resource: resource.to_owned(),
            state: State::Free,
            owner: None,
            token: None,
            acquired_at_ms: None,
            renewed_at_ms: None,
            expires_at_ms: None,
            expires_in_ms: None,
            events: Vec::new(),
            waiters: Vec::new(),
        }
    }
}

/// Something wrong with a store's own files, found by `inspect` (local directory store).
#[derive(Clone, Debug)]
pub struct IntegrityFinding {
    pub resource: String,
    /// `damaged`, `restored`, `record_missing` or `skipped_log_lines`.
    pub kind: &'static str,
    pub message: String,
}

/// An `inspect` answer with the integrity findings of the store.
#[derive(Clone, Debug, Default)]
pub struct Inspection {
    pub views: Vec<ResourceView>,
    pub findings: Vec<IntegrityFinding>,
}

/// A run event to record ([`History::record_run`]): the run's lease and what happened.
#[derive(Clone, Copy, Debug)]
pub struct RunEvent<'a> {
    pub resource: &'a str,
    pub owner: &'a str,
    pub token: i64,
    /// `run_started`, `run_finished` or `run_stopped`.
    pub kind: &'a EventKind,
    pub note: &'a RunNote,
}

/// What `fence prune` deletes.
#[derive(Clone, Copy, Debug)]
pub struct PruneQuery<'a> {
    /// The named resources (every known one when empty).
    pub resources: &'a [String],
    /// Events at least this old go.
    pub older_than: Duration,
    /// The last this many events of each resource stay, however old.
    pub keep: u32,
}

/// What `fence prune` deleted.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pruned {
    pub events: u64,
    /// Rows of waiters past their deadline (dead or paused).
    pub waiters: u64,
    /// The resources looked at.
    pub resources: u64,
    /// Events recorded before this instant (ms since the epoch, the store's clock) were
    /// candidates; `None` when the store holds no records yet.
    pub before_ms: Option<i64>,
}

/// What `fence init` did to the store's records (on the wire: `created`, `migrated`,
/// `up_to_date`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InitAction {
    Created,
    Migrated,
    UpToDate,
}

impl InitAction {
    /// From the schema version found (`None`: none yet) and the version now.
    pub fn of(before: Option<i32>, now: i32) -> InitAction {
        match before {
            None => InitAction::Created,
            Some(v) if v == now => InitAction::UpToDate,
            Some(_) => InitAction::Migrated,
        }
    }
}

/// What `fence init` did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct InitReport {
    pub action: InitAction,
    pub schema_version: i32,
    /// Where fence's records live (schema name or directory).
    pub location: String,
    /// PostgreSQL: how many waiters of one resource may keep a connection (`--held-waiters`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_waiters: Option<i64>,
}

/// How many times [`Leases::kept_in_time`] renews a lease whose grant or renewal came late.
pub const LATE_ANSWER_RENEWALS: u32 = 3;

/// An instant on tokio's clock and on the bound clock together, taken before a request is
/// sent: tokio's clock (CLOCK_MONOTONIC) stops while the machine is suspended, and a lease runs
/// out during a suspend too.
#[derive(Clone, Copy)]
pub struct Mark {
    at: tokio::time::Instant,
    at_ns: u64,
}

impl Mark {
    pub(crate) fn now() -> Mark {
        Mark {
            at: tokio::time::Instant::now(),
            at_ns: crate::sys::bound_clock_ns(),
        }
    }

    /// How long the machine was suspended since the mark.
    fn suspended(&self) -> Duration {
        Duration::from_nanos(crate::sys::bound_clock_ns().saturating_sub(self.at_ns))
            .saturating_sub(self.at.elapsed())
    }
}

/// A coordinator's leases: granting, renewing and releasing them (I1, I3, I4).
#[async_trait(?Send)]
pub trait Leases {
    /// Creates or migrates the store's own records; idempotent.
    async fn init(&self) -> Result<InitReport, Error>;

    /// Grants a lease to `owner`, reacquires it for the same live owner, or fails with
    /// [`Error::Busy`] naming the live holder. The token is reported only once durable, and
    /// only while its lease lives ([`Self::grant_in_time`]).
    async fn acquire(&self, resource: &str, owner: &str, ttl: Duration) -> Result<Grant, Error> {
        self.grant_in_time(resource, owner, ttl, None).await
    }

    /// [`Self::grant`], checked for an answer that came too late to be of use
    /// ([`Self::kept_in_time`]). A store answers that late when the request waited on a lock
    /// (PostgreSQL: another transaction holding the lease row, whose grant then carries the
    /// clock it read before the wait) or the network held the answer; without this, a grant
    /// could be reported with exit 0 after its lease had run out.
    async fn grant_in_time(
        &self,
        resource: &str,
        owner: &str,
        ttl: Duration,
        above: Option<i64>,
    ) -> Result<Grant, Error> {
        let mark = Mark::now();
        let mut grant = self.grant(resource, owner, ttl, above).await?;
        let sent = grant.sent.map_or(mark.at, |sent| sent.max(mark.at));
        let lease = LeaseRef {
            resource: resource.to_owned(),
            owner: owner.to_owned(),
            token: grant.lease.token,
        };
        let (kept, sent) = self
            .kept_in_time(&lease, grant.lease.clone(), sent, mark, "grant")
            .await?;
        grant.lease = kept;
        grant.sent = Some(sent);
        Ok(grant)
    }

    /// A grant judged in time by [`Self::grant_in_time`] before more was done for it (`--wait`
    /// leaving its queue: on an object store, requests that can take as long as the network
    /// or the store's retries make them), judged again ([`Self::kept_in_time`]) from when it
    /// was asked for, the time since `since` (taken when that work began) counting a suspend of
    /// the machine: reported in time, renewed, or lost, as a late answer is.
    async fn still_in_time(
        &self,
        mut grant: Grant,
        owner: &str,
        since: Mark,
    ) -> Result<Grant, Error> {
        let Some(sent) = grant.sent else {
            return Ok(grant);
        };
        let lease = LeaseRef {
            resource: grant.lease.resource.clone(),
            owner: owner.to_owned(),
            token: grant.lease.token,
        };
        let (kept, sent) = self
            .kept_in_time(
                &lease,
                grant.lease.clone(),
                sent,
                since,
                "grant (with leaving the wait's queue after it)",
            )
            .await?;
        grant.lease = kept;
        grant.sent = Some(sent);
        Ok(grant)
    }

    /// [`Self::renew`], checked as [`Self::grant_in_time`] checks a grant (`fence renew`: a
    /// renewal that waited on a row lock carries the clock read before the wait too).
    async fn renew_in_time(&self, lease: &LeaseRef, ttl: Option<Duration>) -> Result<Lease, Error> {
        let mark = Mark::now();
        let renewed = self.renew(lease, ttl).await?;
        Ok(self
            .kept_in_time(lease, renewed, mark.at, mark, "renewal")
            .await?
            .0)
    }

    /// `answer`, the lease as a grant or renewal sent at `sent` left it, once it is known to
    /// have come in time. Counted from the sending, as `run` counts (the store extended the
    /// lease at or after it; a suspend of this machine counts too), an answer that came after
    /// more than half the TTL is renewed (same token, its expiry counted from the renewal's
    /// request), at most [`LATE_ANSWER_RENEWALS`] times while the answers stay late. That an
    /// answer came late does not say the lease ran out: the store may have read its clock
    /// late as well (a lock taken before it, the directory store's lock file, a request held
    /// in the network), so even one past the whole TTL is renewed, and only the store's
    /// refusal of the renewal (expired, taken over), a renewal that could not be sent, or a
    /// last answer still past the TTL makes it lost ([`LostReason::ArrivedLate`]). No new lease
    /// is asked for, so the caller is told of every token granted to it. A renewal whose
    /// outcome is unknown is cancelled where the store can, and reported as such. Returns the
    /// lease and when the request that last extended it was sent, on tokio's clock, moved
    /// earlier by any suspend of the machine since that request was sent (that clock stopped
    /// during it; the lease did not), so that a bound measured from it is never later than
    /// the store's expiry.
    async fn kept_in_time(
        &self,
        lease: &LeaseRef,
        mut answer: Lease,
        mut sent: tokio::time::Instant,
        mut mark: Mark,
        what: &str,
    ) -> Result<(Lease, tokio::time::Instant), Error> {
        let lost = |reason| Error::LeaseLost {
            resource: lease.resource.clone(),
            owner: lease.owner.clone(),
            token: lease.token,
            reason,
        };
        let took = |sent: tokio::time::Instant, mark: &Mark| sent.elapsed() + mark.suspended();
        // Returned earlier by the suspend counted: the caller measures its bound on tokio's
        // clock from it, and that clock did not run while the machine slept.
        let kept = |answer: Lease, sent: tokio::time::Instant, mark: &Mark| match sent
            .checked_sub(mark.suspended())
        {
            Some(sent) => Ok((answer, sent)),
            None => Err(lost(LostReason::ArrivedLate)),
        };
        let ttl = Duration::from_millis(u64::try_from(answer.ttl_ms).unwrap_or(0));
        let mut what = what;
        for _ in 0..LATE_ANSWER_RENEWALS {
            let late = took(sent, &mark);
            if late <= ttl / 2 {
                return kept(answer, sent, &mark);
            }
            crate::terminal::warn(&format!(
                "warning: the {what} of `{}` (token {}) was answered {} after it was asked, more than half its TTL of {}; renewing it",
                lease.resource,
                lease.token,
                crate::time::span(late.as_millis() as i64),
                crate::time::span(ttl.as_millis() as i64),
            ));
            what = "renewal";
            let renewal = Mark::now();
            match self.renew(lease, Some(ttl)).await {
                Ok(renewed) => {
                    answer = renewed;
                    (sent, mark) = (renewal.at, renewal);
                }
                Err(Error::LeaseLost {
                    reason: LostReason::Expired,
                    ..
                }) => return Err(lost(LostReason::ArrivedLate)),
                // Released meanwhile (with its token), or its record lost: that, as it is.
                Err(err @ Error::LeaseLost { .. }) => return Err(err),
                Err(Error::Stale { highest_token, .. }) => {
                    return Err(lost(LostReason::TakenOver { highest_token }))
                }
                Err(Error::OutcomeUnknown { source, .. }) => {
                    // It may still apply: not while this process can stop it.
                    self.cancel_pending().await;
                    return Err(Error::OutcomeUnknown {
                        message: format!(
                            "`{}` was granted to `{}` with token {}, but the store's answer came late and the renewal sent then got no answer in time (it was cancelled where the store allows): whether the lease is still live is unknown",
                            lease.resource, lease.owner, lease.token
                        ),
                        hint: format!(
                            "`fence inspect {}` shows whether it is still held; release it with `{}` if nothing is to run under it",
                            crate::error::resource_word(&lease.resource),
                            crate::error::command_for(
                                "fence release",
                                &lease.resource,
                                &format!(
                                    " --owner {} --token {}",
                                    crate::error::shell_word(&lease.owner),
                                    lease.token
                                )
                            )
                        ),
                        source,
                    });
                }
                // Not renewed (the store unreachable): the answer before stands while it lasts.
                Err(_) if took(sent, &mark) < ttl => return kept(answer, sent, &mark),
                Err(_) => return Err(lost(LostReason::ArrivedLate)),
            }
        }
        if took(sent, &mark) < ttl {
            kept(answer, sent, &mark)
        } else {
            Err(lost(LostReason::ArrivedLate))
        }
    }

    /// [`Self::acquire`], whose new token is also above `above` when given (`fence acquire
    /// --above`: the recovery after a target fenced elsewhere accepted a token this store
    /// never issued). Another owner's live lease is busy as always; the owner's own live lease
    /// is reacquired only when its token is above `above` already, and refused otherwise
    /// ([`held_not_above`]), since a reacquire keeps its token. A grant whose token `above`
    /// raised past the store's own next one says so in its event ([`raised_detail`]).
    async fn grant(
        &self,
        resource: &str,
        owner: &str,
        ttl: Duration,
        above: Option<i64>,
    ) -> Result<Grant, Error>;

    /// Extends a live lease held with exactly this owner and token; `ttl` `None` keeps the
    /// lease's own TTL.
    async fn renew(&self, lease: &LeaseRef, ttl: Option<Duration>) -> Result<Lease, Error>;

    /// Frees a lease held with exactly this owner and token; keeps the token counter.
    async fn release(&self, lease: &LeaseRef) -> Result<Released, Error>;

    /// Asks the store to stop the request this process gave up waiting for (a renewal that
    /// did not answer within the lease's bound), so that it cannot apply later. Best effort,
    /// bounded; nothing to do where a request cannot outlive its caller's wait.
    async fn cancel_pending(&self) {}

    /// What the store answered when it last refused a new connection (PostgreSQL: no free
    /// slot, starting, stopping), unless one succeeded since: for a caller whose own deadline
    /// cut the connecting short, so that no error reached it.
    fn connect_refusal(&self) -> Option<String> {
        None
    }

    /// Fails (a usage error, exit 2) when the store has never been created: a read that only
    /// reports history (`fence log`, `fence metrics`) must not answer a typo in `--store` or
    /// `--schema` with "nothing happened". Stores that cannot tell (object stores, whose
    /// prefix exists as soon as anything is under it) accept.
    async fn require_existing(&self) -> Result<(), Error> {
        Ok(())
    }
}

/// How a coordinator lets a process wait for a busy resource (`--wait`): a queue, wake-ups.
#[async_trait(?Send)]
pub trait Waiting {
    /// On stores that keep an arrival-ordered queue of waiters (PostgreSQL): makes this
    /// process a waiter before its first attempt, so that the [`Leases::acquire`] calls that
    /// follow join and poll the queue (a newcomer cannot pass the waiters) and a server that
    /// cannot take a connection is retried until `until` (`None`: for ever); returns true.
    /// Elsewhere returns false, and the caller uses [`Self::wait_begin`] after a busy attempt.
    fn queue_up(
        &self,
        _resource: &str,
        _owner: &str,
        _until: Option<tokio::time::Instant>,
    ) -> bool {
        false
    }

    /// Shows this process as waiting for `resource` in `inspect` until [`Self::unwait`].
    async fn wait_begin(&self, resource: &str, owner: &str) -> Result<(), Error>;

    /// Removes this process from the resource's waiters.
    async fn unwait(&self, resource: &str) -> Result<(), Error>;

    /// Returns when the resource may have been released (a pushed wake-up, where the store
    /// has them) or after `max`, whichever is first.
    async fn wait_for_release(&self, resource: &str, max: Duration) -> Result<(), Error>;

    /// Whether wake-ups are pushed ([`Self::wait_for_release`] returns early on release), so
    /// that waiters need only a slow fallback poll.
    fn pushes_wakeups(&self) -> bool;

    /// Sets how many waiters of one resource may keep their connection while they wait
    /// (`fence init --held-waiters N`). Only PostgreSQL's waiters hold one.
    async fn set_held_waiters(&self, _most: i64) -> Result<(), Error> {
        Err(held_waiters_elsewhere())
    }
}

/// `--held-waiters` given for a store whose waiters hold no connection.
pub fn held_waiters_elsewhere() -> Error {
    Error::usage(
        "`--held-waiters` applies to PostgreSQL stores only: waiters on S3, GCS and the directory store hold no connection",
        "leave it out, or point --store at a PostgreSQL coordinator",
    )
}

/// What a coordinator remembers: the state and events of its resources, for `inspect`,
/// `log`, `metrics` and `prune`.
#[async_trait(?Send)]
pub trait History {
    /// Describes the named resources (every known one when empty) with up to `history`
    /// events each, most recent first.
    async fn inspect(
        &self,
        resources: &[String],
        history: usize,
    ) -> Result<Vec<ResourceView>, Error>;

    /// The newest `history` events of `resource`, handed to `each` as they are read until it
    /// returns false: most recent first, or oldest first. `inspect --history N` prints them
    /// as they come, so that memory follows a page, not N. Stores whose reads are not
    /// paged (object stores) hand over [`Self::inspect`]'s events.
    async fn history_each(
        &self,
        resource: &str,
        history: usize,
        oldest_first: bool,
        each: &mut dyn FnMut(Event) -> bool,
    ) -> Result<(), Error> {
        let mut events: Vec<Event> = self
            .inspect(&[resource.to_owned()], history)
            .await?
            .into_iter()
            .flat_map(|view| view.events)
            .collect();
        if oldest_first {
            events.reverse();
        }
        for event in events {
            if !each(event) {
                break;
            }
        }
        Ok(())
    }

    /// The highest token issued for `resource` (`None`: never acquired): a fenced write
    /// whose target cannot tell two versions with the same bytes apart (S3 ETags) asks it
    /// right before its put, so that a writer paused after its read is refused (Chubby's
    /// CheckSequencer). Reads only: no clock probe, no record of the asking.
    async fn highest_token(&self, resource: &str) -> Result<Option<i64>, Error> {
        Ok(self
            .inspect(&[resource.to_owned()], 0)
            .await?
            .into_iter()
            .next()
            .and_then(|view| view.token))
    }

    /// [`Self::inspect`] with what is wrong with the store's own files; stores whose
    /// records live in a server have nothing of the kind to report.
    async fn inspect_checked(
        &self,
        resources: &[String],
        history: usize,
    ) -> Result<Inspection, Error> {
        Ok(Inspection {
            views: self.inspect(resources, history).await?,
            findings: Vec::new(),
        })
    }

    /// [`Self::inspect_checked`] with filters and a page; stores that can filter at the
    /// source (PostgreSQL) do, so that a page of a large store costs what the page holds.
    async fn inspect_query(&self, query: &InspectQuery<'_>) -> Result<Inspection, Error> {
        let mut inspection = self.inspect_checked(query.resources, query.history).await?;
        inspection.views = query.apply(inspection.views);
        Ok(inspection)
    }

    /// Deletes old events and the rows of dead waiters; never a lease record, so token
    /// counters are untouched. Stores that keep their history bounded by themselves, or
    /// cannot prune yet, refuse.
    async fn prune(&self, _query: &PruneQuery<'_>) -> Result<Pruned, Error> {
        Err(Error::usage(
            "`fence prune` works on PostgreSQL stores only",
            "the directory store keeps the last 10,000 events of a resource once its log passes 4 MiB; object stores keep their full history for now",
        ))
    }

    /// Whether [`Self::inspect_query`] filters and pages at the source, so that reading a
    /// large answer page by page costs what each page holds (PostgreSQL); elsewhere every
    /// page would read the whole store. Such a store has no integrity findings to report
    /// (its records live in a server): an answer printed page by page has no place for them.
    fn pages_at_source(&self) -> bool {
        false
    }

    /// Notes a refused attempt (busy, conflict) in the history, coalesced with the same
    /// owner's attempts of the same kind on the resource in the same minute. Best effort:
    /// the refusal is the answer whatever happens here, so a failure is for the caller to
    /// report as a warning. Object stores do not record them: each would cost a request.
    async fn record_attempt(&self, _attempt: &Attempt) -> Result<(), Error> {
        Ok(())
    }

    /// Appends what `fence run` did with its command (`run_started`, `run_finished`,
    /// `run_stopped`) to the resource's history: an event that changes no lease, recorded
    /// whoever holds the lease now. Best effort: the caller warns when it fails, and nothing
    /// else (the exit status, the lease) depends on it.
    async fn record_run(&self, run: &RunEvent<'_>) -> Result<(), Error>;

    /// How many refused attempts (`busy`, `conflict`, `write_rejected`) each resource has
    /// had, as (resource, kind, count): every attempt, not the coalesced lines of the history,
    /// including those `fence prune` or a store's retention removed since, so that they never
    /// go down. `None` where the store does not record refused attempts (object stores).
    async fn attempt_counts(&self) -> Result<Option<Vec<(String, EventKind, i64)>>, Error> {
        Ok(None)
    }

    /// The events of the resources `query` names, within its time window, in order (oldest
    /// first), at most `query.limit` of the most recent. Stores that cannot read a window at
    /// the source read each resource's recent history and filter it.
    async fn log(&self, query: &LogQuery<'_>) -> Result<Vec<Logged>, Error> {
        let names = query.exact_names().unwrap_or_default();
        let views = self.inspect(&names, query.limit).await?;
        Ok(from_views(views, query))
    }

    /// [`Self::log`], each event handed to `each` as it is read, oldest first, until it
    /// returns false: `fence log` writes them as they come, so that memory follows a page,
    /// not the window. Stores that read a window whole hand over [`Self::log`]'s.
    async fn log_each(
        &self,
        query: &LogQuery<'_>,
        each: &mut dyn FnMut(Logged) -> bool,
    ) -> Result<(), Error> {
        for logged in self.log(query).await? {
            if !each(logged) {
                break;
            }
        }
        Ok(())
    }

    /// How many events of each kind each resource's history has had, as (resource, kind,
    /// count): for `fence metrics`, totals since the history began, including events
    /// `fence prune` or a store's retention removed since, so that they never go down.
    async fn event_counts(&self) -> Result<Vec<(String, EventKind, i64)>, Error> {
        let mut counts: std::collections::BTreeMap<(String, EventKind), i64> = Default::default();
        for view in self.inspect(&[], usize::MAX).await? {
            for event in view.events {
                *counts
                    .entry((view.resource.clone(), event.kind))
                    .or_default() += 1;
            }
        }
        Ok(counts.into_iter().map(|((r, k), n)| (r, k, n)).collect())
    }
}

/// A lease coordinator: its three capabilities, which commands reach through one
/// `Box<dyn Coordinator>` ([`open`]). A new coordinator implements the three traits.
pub trait Coordinator: Leases + Waiting + History {}

impl<T: Leases + Waiting + History> Coordinator for T {}

/// The refused attempts a process has recorded, by resource and kind: a waiter's retries
/// are one attempt, recorded once.
#[derive(Default)]
pub(crate) struct Attempted(std::cell::RefCell<std::collections::HashSet<(String, EventKind)>>);

impl Attempted {
    /// True the first time this process sees `attempt`'s resource and kind.
    pub fn first(&self, attempt: &Attempt) -> bool {
        self.0
            .borrow_mut()
            .insert((attempt.resource.clone(), attempt.kind.clone()))
    }
}

/// The warning for a refused attempt that could not be recorded: the refusal stands.
pub(crate) fn unrecorded(attempt: &Attempt, why: &str) {
    crate::terminal::warn(&format!(
        "warning: the refused attempt on `{}` was not recorded in the store's history ({why}); the refusal stands",
        attempt.resource
    ));
}

/// Opens the coordinator a store URL names (connecting, for network stores).
pub async fn open(spec: &StoreSpec, schema: &str) -> Result<Box<dyn Coordinator>, Error> {
    match &spec.kind {
        StoreKind::Postgres(url) => Ok(Box::new(
            postgres::PgCoordinator::connect(url, &spec.display, schema).await?,
        )),
        StoreKind::File(dir) => Ok(Box::new(file::FileCoordinator::open(dir)?)),
        StoreKind::Object(url) => Ok(Box::new(object::ObjectCoordinator::open(url)?)),
    }
}

/// The TTL in whole milliseconds, as coordinators store it.
pub fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// The token after `highest` for a new grant of `resource`. Tokens only go up (I1), so when
/// none is left above (only a damaged or hand-edited record can hold `i64::MAX`) the grant is
/// refused, naming where the highest came from, instead of wrapping around to a negative one.
pub fn next_token(resource: &str, highest: i64, source: &str) -> Result<i64, Error> {
    highest.checked_add(1).ok_or_else(|| {
        Error::internal(
            format!(
                "no fencing token is left above {highest} for `{resource}` (the highest a token can be), which {source} holds: it was damaged or edited by hand"
            ),
            format!(
                "nothing was granted; repair or restore {source}, or use another resource name"
            ),
        )
    })
}

/// The token of a new grant of `resource` after `highest`, and above `above` when asked
/// (`acquire --above`); see [`next_token`].
pub fn next_token_above(
    resource: &str,
    highest: i64,
    above: Option<i64>,
    source: &str,
) -> Result<i64, Error> {
    next_token(resource, highest.max(above.unwrap_or(0)), source)
}

/// The detail of a grant's event when `--above` raised its token past the store's own next
/// one (`above` over `highest`, the highest the store issued): `fence log` shows the jump
/// as deliberate. The PostgreSQL statement writes the same words (`pg_one_shot::ACQUIRE`).
pub fn raised_detail(highest: i64, above: Option<i64>) -> Option<String> {
    above
        .filter(|&above| above > highest)
        .map(|above| format!("token raised above {above} (--above)"))
}

/// The refusal of `acquire --above N` when `owner` already holds the lease live with a
/// token not above N: a reacquire keeps its token, so it cannot be raised without a release.
pub fn held_not_above(resource: &str, owner: &str, token: i64, above: i64) -> Error {
    use crate::error::{command_for, shell_word};
    Error::usage(
        format!(
            "`{resource}` is held by this owner (`{owner}`) with token {token}, which is not above {above}: acquiring it again would keep that token, so nothing was changed"
        ),
        format!(
            "release the lease first (`{}`), then run `{}` again",
            command_for(
                "fence release",
                resource,
                &format!(" --owner {} --token {token}", shell_word(owner))
            ),
            command_for("fence acquire", resource, &format!(" --above {above}"))
        ),
    )
}

/// The oldest-first, most recent `query.limit` events of `views` within the query.
fn from_views(views: Vec<ResourceView>, query: &LogQuery<'_>) -> Vec<Logged> {
    let mut logged: Vec<Logged> = views
        .into_iter()
        .filter(|v| query.matches(&v.resource))
        .flat_map(|v| {
            let resource = v.resource;
            // Most recent first in a view: reversed, each resource's events are in order.
            v.events.into_iter().rev().map(move |event| Logged {
                resource: resource.clone(),
                at_us: event.at_ms.saturating_mul(1000),
                event,
            })
        })
        .filter(|l| query.in_range(l.event.at_ms))
        .collect();
    newest(&mut logged, query.limit);
    logged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn above_raises_a_new_token_only_past_the_stores_own_next_one() {
        // Above N and above every token issued, whichever is higher.
        assert_eq!(next_token_above("r", 2, Some(99), "s").unwrap(), 100);
        assert_eq!(next_token_above("r", 150, Some(99), "s").unwrap(), 151);
        assert_eq!(next_token_above("r", 0, Some(99), "s").unwrap(), 100);
        assert_eq!(next_token_above("r", 7, None, "s").unwrap(), 8);
        assert_eq!(
            next_token_above("r", 1, Some(i64::MAX - 1), "s").unwrap(),
            i64::MAX
        );
        assert!(next_token_above("r", i64::MAX, Some(99), "s").is_err());
        // The event says so only when N raised it.
        assert_eq!(
            raised_detail(2, Some(99)).as_deref(),
            Some("token raised above 99 (--above)")
        );
        assert_eq!(raised_detail(99, Some(99)), None);
        assert_eq!(raised_detail(150, Some(99)), None);
        assert_eq!(raised_detail(2, None), None);
    }

    /// A suspend of the machine while a grant was asked for: the bound clock ran on, tokio's
    /// did not. The answer counts as late by the suspend too, and the instant it is kept from
    /// moves earlier by it, or `fence run`'s bound (measured on tokio's clock from that
    /// instant) would outlive the store's expiry by the suspend.
    #[tokio::test(flavor = "current_thread")]
    async fn a_suspend_while_a_grant_was_asked_counts_against_its_lease() {
        let dir = tempfile::tempdir().unwrap();
        let store = file::FileCoordinator::open(dir.path()).unwrap();
        let ttl = Duration::from_secs(10);
        let asleep = |secs: u64| {
            let at_ns = crate::sys::bound_clock_ns() - secs * 1_000_000_000;
            Mark {
                at: tokio::time::Instant::now(),
                at_ns,
            }
        };
        let grant = store.grant("r", "me", ttl, None).await.unwrap();
        let lease = LeaseRef {
            resource: "r".into(),
            owner: "me".into(),
            token: grant.lease.token,
        };
        // 3 s asleep, under half the TTL: kept, 3 s earlier.
        let mark = asleep(3);
        let (kept, sent) = store
            .kept_in_time(&lease, grant.lease.clone(), mark.at, mark, "grant")
            .await
            .unwrap();
        assert_eq!(kept.token, grant.lease.token);
        let back = mark.at.duration_since(sent);
        assert!(
            back >= Duration::from_secs(3) && back < Duration::from_secs(4),
            "{back:?}"
        );
        // 6 s asleep, over half the TTL: renewed once (the renewal was not slept through),
        // kept from the renewal's request.
        let mark = asleep(6);
        let (kept, sent) = store
            .kept_in_time(&lease, grant.lease.clone(), mark.at, mark, "grant")
            .await
            .unwrap();
        assert_eq!(kept.token, grant.lease.token);
        assert!(sent >= mark.at, "{:?}", mark.at.duration_since(sent));
    }

    #[test]
    fn a_held_lease_not_above_n_is_a_usage_error_naming_the_release() {
        let err = held_not_above("nightly report", "me", 2, 99);
        assert_eq!(err.exit(), crate::exit::Exit::Usage);
        let text = format!("{err}");
        assert!(
            text.contains("token 2") && text.contains("not above 99"),
            "{text}"
        );
        let hint = err.hint();
        assert!(
            hint.contains("fence release 'nightly report' --owner me --token 2")
                && hint.contains("fence acquire 'nightly report' --above 99"),
            "{hint}"
        );
    }
}
