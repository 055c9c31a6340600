//! Waiting on PostgreSQL (`--wait`): the durable queue of waiters, its pace, and the
//! wake-ups (see the parent module's documentation and `schema.sql`).

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tokio_postgres::types::Type;

use super::{Answer, PgCoordinator};
use crate::coordinator::Waiting;
use crate::error::Error;
use crate::sys::random_u64;

/// How many waiters at the head of a queue keep their connection and listen: the head, so
/// that a release reaches it at once, and the next, so that the head's grant does too and a
/// fresh head is ready for the following release.
pub const WINDOW: i64 = 2;
/// The most waiters of one resource that keep a connection and listen: behind the window, a
/// waiter whose turn should come within `HOLD_SOONER` at the queue's pace keeps its
/// connection and listens too, so that a hot resource with short critical sections is not
/// held down to the pace at which far waiters reconnect (a release or grant then wakes up to
/// this many waiters, each for one short poll). A store may let more keep their connection
/// (`fence init --held-waiters N`, the `meta` row `held_waiters`): those behind the first
/// [`HELD_DEFAULT`] poll on it (`held_poll`) instead of listening: PostgreSQL signals every
/// listening backend of the database on every notification, whatever its channel, so
/// listeners cost the server on every release and grant of every resource, where a poll's
/// cost is bounded by its waiter's pace. (On one hot resource the two measured alike:
/// docs/performance.md.)
pub const HELD_DEFAULT: i64 = 8;
/// The most `--held-waiters` takes.
pub const HELD_MOST: i64 = 1000;
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

/// The longest a queued waiter sleeps when its wait has no end.
pub(super) const FOREVER: Duration = Duration::from_secs(3600);

/// How fast a queue moves, as a waiter plans with it: about one grant per `per_grant`, the
/// current holder having held the lease for `held_for` already. See [`Pace::until`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pace {
    per_grant: Duration,
    held_for: Duration,
}

/// How long a holder may hold the lease and still be a hiccup of a fast queue rather than
/// a slow queue: [`HOLD_SOONER`].
const HICCUP: Duration = HOLD_SOONER;

impl Pace {
    /// When the turn of a waiter with `ahead` grants before its own could come: once the
    /// current holder is done (as long again as it has held), then `ahead` grants at the
    /// queue's time per grant, or, for a holder that has held past [`HICCUP`], at up to what
    /// it has held: from `per_grant` at HICCUP to `held_for` itself at twice HICCUP, and so
    /// on. One slow holder (a loaded machine's hiccup) otherwise sent the waiters far behind
    /// to sleep for seconds while the queue ahead of them drained in a fraction of one, and
    /// the queue stayed that slow; behind a lease held for long, every grant ahead may take
    /// as long, and the far waiters sleep as long as their bounds allow, so that a thousand
    /// of them do not reconnect to poll hundreds of times a second while it lasts. A ramp,
    /// not a step: at a step (a first version) a holder at 0.50 s rather than 0.49 s made
    /// 56 of 64 kept waiters let go of their connections at once (a review).
    fn until(self, ahead: u32) -> Duration {
        let slow = self
            .held_for
            .saturating_sub(HICCUP)
            .saturating_mul(2)
            .min(self.held_for);
        self.held_for
            .saturating_add(self.per_grant.max(slow).saturating_mul(ahead))
    }
}

/// The poll interval of a waiter at `place` (> [`WINDOW`]) in a queue going at `pace`: it
/// wakes halfway to when its turn could come at that pace (so it polls about log2 of its
/// place times on the way to the head), and never later
/// than [`FAR_STEP`] per place ahead of it, so that a queue that speeds up finds its next
/// waiters awake soon enough. Halfway rather than just before: the pace is measured from
/// the queue itself, and a waiter that came only just in time would hold the pace down to
/// its own reconnect time. Between [`FAR_MIN`] and [`FAR_MAX`]. Summed over a queue behind a
/// long-held lease, the polls per second are about 5·H(50) + (N − 50)/10 ≈ 23 + N/10 for N
/// waiters (H the harmonic number).
pub fn far_poll(place: i64, pace: Pace) -> Duration {
    let ahead = u32::try_from((place - WINDOW).max(1)).unwrap_or(u32::MAX);
    let paced = pace.until(ahead) / 2;
    paced
        .min(FAR_STEP.saturating_mul(ahead))
        .clamp(FAR_MIN, FAR_MAX)
}

/// How many places at the head of a queue going at `pace` keep their connection: the
/// window, and behind it those whose turn should come soon, up to `most` (the store's
/// `held_waiters`). Soon is [`HOLD_SOONER`] for the default, and as many times longer as
/// `most` is larger: a store that allows 64 keeps them while the queue moves at up to 62 ms
/// a grant (a queue held down to its far waiters' reconnects is that slow, and would never
/// get faster), and fewer the longer the lease has been held: the window alone behind a
/// lease held 1.4 s or more for up to 64 (behind one held 10 s, 6 of 1,000).
fn held_places(pace: Pace, most: i64) -> i64 {
    let soon = HOLD_SOONER
        .saturating_mul(u32::try_from(most.max(HELD_DEFAULT)).unwrap_or(u32::MAX))
        / u32::try_from(HELD_DEFAULT).unwrap_or(1);
    let mut places = WINDOW;
    while places < most && pace.until(u32::try_from(places).unwrap_or(u32::MAX)) < soon {
        places += 1;
    }
    places
}

/// The poll interval of a waiter at `place` behind the window that keeps its connection: as
/// [`far_poll`], halfway to when its turn could come at the queue's pace, but down to a
/// millisecond (a poll on a kept connection costs the server a statement, not a new
/// backend), and never longer than the window's own polls.
fn held_poll(place: i64, pace: Pace) -> Duration {
    let ahead = u32::try_from((place - WINDOW).max(1)).unwrap_or(u32::MAX);
    (pace.until(ahead) / 2).clamp(Duration::from_millis(1), NEAR_POLL)
}

/// The pace after a poll that saw `grants` grants in the `elapsed` since the waiter's last
/// one. Fast attack, slow decay: a queue that speeds up is followed at once (its next
/// waiters must be awake in time), one that slows down gradually, so that time the lease lay
/// free because its next waiter slept does not teach the waiters to sleep longer (a slow
/// holder is told by how long it has held the lease: [`Pace::held_for`]). No grant: no news.
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

/// A waiter's state between its polls.
pub(super) struct Queue {
    pub(super) resource: String,
    /// When the wait ends (`None`: never); reconnecting is retried until then.
    pub(super) until: Option<Instant>,
    /// Its row, once it joined.
    waiter: Option<i64>,
    /// 1 = head; 0 before joining.
    place: i64,
    /// What its last poll promised: the row lives this much past it, less [`GRACE`].
    promised: Duration,
    /// How many waiters of a resource may keep their connection: the store's
    /// `held_waiters`, read on joining ([`HELD_DEFAULT`] until then, or where none is set).
    held_most: i64,
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
    /// Whether `per_grant` comes from grants this waiter saw between two of its own polls,
    /// rather than from the resource's recent events as it joined.
    measured: bool,
    /// When this waiter last saw the queue move (a token it had not seen), or joined it.
    moved_at: Instant,
    /// How long the holder had held the lease at the last poll, or, when it was free, how
    /// long the queue had not moved (see [`Queue::note`]): a grant takes at least that long,
    /// whatever the queue did before.
    held_for: Duration,
    /// The holder's remaining lease at the last poll.
    expires_in_ms: Option<i64>,
}

impl Queue {
    /// A waiter of `resource` about to join, its wait ending at `until` (`None`: never), as
    /// of `now`: no row yet, the default pace, held waiters as by default.
    fn new(resource: &str, until: Option<Instant>, now: Instant) -> Queue {
        Queue {
            resource: resource.to_owned(),
            until,
            waiter: None,
            place: 0,
            promised: FAR_MAX,
            listen_within: WINDOW,
            held_most: HELD_DEFAULT,
            listening: false,
            started_listening: false,
            last_token: None,
            last_poll: now,
            per_grant: FAR_STEP,
            measured: false,
            moved_at: now,
            held_for: Duration::ZERO,
            expires_in_ms: None,
        }
    }

    /// The pace to plan with: the queue's recent time per grant, and how long the current
    /// holder has held the lease.
    fn pace(&self) -> Pace {
        Pace {
            per_grant: self.per_grant,
            held_for: self.held_for,
        }
    }

    /// The pace to decide on keeping the connection with. Until the waiter has seen the
    /// queue move between two of its own polls, only how long the holder has held the
    /// lease: the recent grants a newcomer joins with can describe a queue that is no more
    /// (a crowd that arrived at once is paced by its own connection set-up, 80–130 ms a
    /// grant here), and a waiter that lets go of its connection on them sleeps while the
    /// queue ahead of it drains (64 workers with `--held-waiters 64`: 3 three-second benches
    /// of 60 at 13–31 grants/s). Keeping it a while costs a connection the store allows.
    fn hold_pace(&self) -> Pace {
        Pace {
            per_grant: if self.measured {
                self.per_grant
            } else {
                Duration::ZERO
            },
            held_for: self.held_for,
        }
    }

    /// Up to which place waiters listen: those that keep their connection, at most
    /// [`HELD_DEFAULT`] whatever the store lets keep theirs (see there).
    fn listeners(&self) -> i64 {
        held_places(self.pace(), self.held_most.min(HELD_DEFAULT))
    }

    /// Notes a busy poll's answer, received at `now`: place, pace, and the next promise.
    fn note(&mut self, answer: &Answer, now: Instant) {
        // Joining, or rejoining with a new row after its row lapsed (paused past its
        // deadline): the pace is the resource's recent grants (if it has any), not grants
        // this waiter saw, and no pace is sampled across the lapse.
        let joined = answer.waiter.is_some_and(|w| Some(w) != self.waiter);
        // (A pace of zero or less, from a server clock that stepped back, is no pace.)
        if let Some(pace) = answer.pace_ms.filter(|&p| p > 0) {
            self.per_grant = Duration::from_millis(pace.unsigned_abs()).min(FAR_MAX);
        }
        if joined || answer.pace_ms.is_some() {
            self.measured = false;
            self.moved_at = now;
        } else if let (Some(before), Some(token)) = (self.last_token, answer.token) {
            let elapsed = now.saturating_duration_since(self.last_poll);
            // A token lower than the last one seen (a restored store) is no grant, not billions.
            let grants = u32::try_from(token.saturating_sub(before)).unwrap_or(0);
            self.per_grant = followed_pace(self.per_grant, elapsed, grants);
            self.measured |= grants > 0;
            if grants > 0 {
                self.moved_at = now;
            }
        }
        // A lease left free while the queue does not move (its head paused or killed after
        // it was told its turn: the queue waits for its row's deadline) is a stall, and lasts
        // as a holder would: the waiters behind plan with how long it has lasted, not with a
        // fast queue's pace (a review: 1,000 far waiters would have reconnected ~2,700 times
        // a second through a 5 s stall of a 4 ms-a-grant queue).
        self.held_for = match answer.held_for() {
            Duration::ZERO => now.saturating_duration_since(self.moved_at),
            held => held,
        };
        if let Some(most) = answer.held_waiters {
            self.held_most = most.clamp(WINDOW, HELD_MOST);
        }
        let place = answer.place.unwrap_or(self.place);
        let listens = place <= self.listen_within;
        self.started_listening = listens && !self.listening;
        self.listening = listens || self.listening;
        self.waiter = answer.waiter.or(self.waiter);
        self.place = place;
        self.last_token = answer.token;
        self.last_poll = now;
        self.expires_in_ms = answer.expires_in_ms;
        // Places only move forward and no interval outgrows its place's bound, so the row
        // is kept alive until the latest the next poll can come.
        self.promised = promise(place);
    }
}

#[async_trait(?Send)]
impl Waiting for PgCoordinator {
    fn queue_up(&self, resource: &str, _owner: &str, until: Option<Instant>) -> bool {
        *self.queue.borrow_mut() = Some(Queue::new(resource, until, Instant::now()));
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
                let keep = queue.place <= held_places(queue.hold_pace(), queue.held_most);
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
                } else if keep {
                    held_poll(queue.place, queue.pace())
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

    fn pushes_wakeups(&self) -> bool {
        true
    }

    async fn set_held_waiters(&self, most: i64) -> Result<(), Error> {
        let value = most.clamp(WINDOW, HELD_MOST).to_string();
        self.call(
            "set how many waiters keep a connection (`--held-waiters`)",
            true,
            "INSERT INTO __SCHEMA__.meta (key, value) VALUES ('held_waiters', $1) \
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            &[(&value, Type::TEXT)],
        )
        .await?;
        Ok(())
    }
}

impl PgCoordinator {
    /// The store's `held_waiters` as waiters use it (`None`: not set or not a number, and
    /// [`HELD_DEFAULT`] applies; `fence doctor` names a value waiters cannot use as it is).
    pub(super) async fn held_waiters(&self) -> Result<Option<i64>, Error> {
        let rows = self
            .call(
                "read how many waiters keep a connection",
                false,
                "SELECT m.value FROM __SCHEMA__.meta m WHERE m.key = 'held_waiters'",
                &[],
            )
            .await?;
        Ok(rows
            .first()
            .and_then(|row| row.get::<_, String>(0).parse::<i64>().ok())
            .map(|most| most.clamp(WINDOW, HELD_MOST)))
    }
}

impl PgCoordinator {
    /// A queued waiter's attempt: joins the queue (first call) or polls it; rejoins at the
    /// back, saying so, when its row was deleted while it was paused or cut off.
    pub(super) async fn poll_queue(
        &self,
        resource: &str,
        owner: &str,
        ttl: i64,
    ) -> Result<Answer, Error> {
        let (waiter, promise, listen_within) = self
            .queue
            .borrow()
            .as_ref()
            .map_or((None, FAR_MAX, WINDOW), |queue| {
                (queue.waiter, queue.promised, queue.listeners())
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
        // of its connection after the answer if the pace (and the store's `held_waiters`,
        // which the answer carries) says so.
        let live = i64::try_from((FAR_MAX + GRACE).as_millis()).unwrap_or(i64::MAX);
        let listen_within = HELD_DEFAULT;
        if let Some(queue) = self.queue.borrow_mut().as_mut() {
            queue.listen_within = listen_within;
        }
        let rows = self
            .call(
                &what,
                true,
                "SELECT e.*, (SELECT m.value FROM __SCHEMA__.meta m WHERE m.key = 'held_waiters') AS held_waiters \
                 FROM __SCHEMA__.wait_enter($1, $2, $3, $4, $5) e",
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

    /// Notes a busy poll's answer: place, pace, and the next promise.
    pub(super) fn queued(&self, answer: &Answer) {
        if let Some(queue) = self.queue.borrow_mut().as_mut() {
            queue.note(answer, Instant::now());
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
            held_waiters: None,
        };
        // Held since 1 s, the server's clock at 65 s: 64 s.
        assert_eq!(answer(Some(5_000)).held_for(), 64_000 * MS);
        assert_eq!(answer(Some(0)).held_for(), Duration::ZERO);
        assert_eq!(answer(None).held_for(), Duration::ZERO);
        let mut queue = Queue {
            waiter: Some(3),
            place: 2,
            promised: NEAR_POLL,
            last_token: Some(7),
            per_grant: 3 * MS,
            measured: true,
            held_for: answer(Some(5_000)).held_for(),
            ..Queue::new("r", None, Instant::now())
        };
        assert_eq!(
            queue.pace(),
            Pace {
                per_grant: 3 * MS,
                held_for: 64_000 * MS
            }
        );
        assert_eq!(held_places(queue.pace(), queue.held_most), WINDOW);
        queue.held_for = Duration::ZERO;
        assert_eq!(queue.pace().until(10), 30 * MS);
        assert_eq!(held_places(queue.pace(), queue.held_most), HELD_DEFAULT);
        assert_eq!(queue.listeners(), HELD_DEFAULT);
        // A store that lets fewer keep their connection: no more listen than that.
        queue.held_most = 3;
        assert_eq!(queue.listeners(), 3);
        queue.held_most = 64;
        assert_eq!(queue.listeners(), HELD_DEFAULT);
    }

    #[test]
    fn the_store_s_setting_bounds_the_held_places_and_the_pace_what_it_can_use() {
        // A fast queue: as many as the store allows.
        assert_eq!(held_places(paced(3 * MS), HELD_DEFAULT), HELD_DEFAULT);
        assert_eq!(held_places(paced(3 * MS), 64), 64);
        // The default holds those due within HOLD_SOONER (500 ms): at 100 ms a grant, 5.
        assert_eq!(held_places(paced(100 * MS), HELD_DEFAULT), 5);
        // 64 holds those due within 8 times as long: at 100 ms a grant, 40.
        assert_eq!(held_places(paced(100 * MS), 64), 40);
        // Never fewer than the window.
        assert_eq!(held_places(paced(FAR_MAX), 64), WINDOW);
    }

    /// A newcomer does not let go of its connection on the pace it joined with, only once
    /// its own polls saw the queue move (or its holder held longer than a hiccup).
    #[test]
    fn a_newcomer_keeps_its_connection_until_it_has_seen_the_queue_move() {
        let mut queue = Queue {
            waiter: Some(40),
            place: 40,
            held_most: 64,
            last_token: Some(7),
            per_grant: 134 * MS,
            held_for: 100 * MS,
            ..Queue::new("r", None, Instant::now())
        };
        // Joined at 134 ms a grant (a crowd's start): all 64 keep their connection.
        assert_eq!(held_places(queue.hold_pace(), queue.held_most), 64);
        // Its own polls saw 134 ms a grant: the 30 places due within 4 s (the 30th after
        // 100 + 29 × 134 = 3,986 ms).
        queue.measured = true;
        assert_eq!(held_places(queue.hold_pace(), queue.held_most), 30);
        // A holder past a hiccup says the queue is slow, measured or not: at 600 ms, 200 ms
        // a place ahead (2 × 100 ms past the hiccup), the 17 places due within 4 s.
        queue.measured = false;
        queue.held_for = 600 * MS;
        assert_eq!(held_places(queue.hold_pace(), queue.held_most), 17);
        // At a second and more, as long a place as it has held: the window and the one due
        // within 4 s (after 1 + 2 × 1 s).
        queue.held_for = 1_000 * MS;
        assert_eq!(held_places(queue.hold_pace(), queue.held_most), 3);
    }

    /// No step at the hiccup: a holder that has held a millisecond longer changes how many
    /// keep their connection, and how long the far waiters sleep, by a little (a review of a
    /// first version: at 0.50 s rather than 0.499 s, 64 → 8 kept connections, and place
    /// 100's sleep 0.45 s → 10 s). Past the hiccup, place 100 sleeps up to 98.5 ms longer
    /// per millisecond held (the holder's millisecond and 98 places ahead 2 ms each, halved).
    #[test]
    fn the_pace_ramps_past_a_hiccup_without_a_step() {
        let at = |held: u64| Pace {
            per_grant: 4 * MS,
            held_for: Duration::from_millis(held),
        };
        for held in [490, 499, 500, 501, 510, 600, 750, 990, 1_000, 1_010] {
            let (before, after) = (at(held - 1), at(held));
            assert!(
                held_places(before, 64) - held_places(after, 64) <= 2,
                "kept connections: {} behind a holder of {} ms, {} behind {held} ms",
                held_places(before, 64),
                held - 1,
                held_places(after, 64)
            );
            let (sooner, later) = (far_poll(100, before), far_poll(100, after));
            assert!(
                later <= sooner + 99 * MS,
                "place 100 sleeps {sooner:?} behind {} ms, {later:?} behind {held} ms",
                held - 1
            );
        }
        // Past twice the hiccup, every place ahead may take as long as the holder has held.
        assert_eq!(at(1_000).until(10), 11_000 * MS);
        assert_eq!(at(400).until(10), 440 * MS);
    }

    /// A lease lying free while the queue does not move (its head paused after it was told
    /// its turn) counts as held for as long: the far waiters back off through the stall
    /// instead of reconnecting at the pace of the queue before it (a review: ~2,700 new
    /// connections a second from 1,000 far waiters of a 4 ms-a-grant queue).
    #[test]
    fn a_free_lease_that_does_not_move_is_a_stall_that_lasts() {
        let free = |token: i64| Answer {
            status: "busy".into(),
            token: Some(token),
            owner: Some("head".into()),
            acquired_ms: Some(1_000),
            renewed_ms: Some(1_000),
            expires_ms: None,
            expires_in_ms: None,
            ttl_ms: Some(10_000),
            waiter: Some(40),
            place: Some(100),
            pace_ms: None,
            held_waiters: None,
        };
        let start = Instant::now();
        let mut queue = Queue {
            waiter: Some(40),
            place: 100,
            last_token: Some(7),
            per_grant: 4 * MS,
            measured: true,
            ..Queue::new("r", None, start)
        };
        // Moved (7 → 9) and free for now: no stall yet, the queue's own pace.
        queue.note(&free(9), start + 8 * MS);
        assert_eq!(queue.pace().held_for, Duration::ZERO);
        let fast = far_poll(100, queue.pace());
        assert!(fast < 300 * MS, "{fast:?}");
        // Three seconds later, still free at the same token: a 3 s stall.
        queue.note(&free(9), start + 3_008 * MS);
        assert_eq!(queue.pace().held_for, 3_000 * MS);
        assert_eq!(far_poll(100, queue.pace()), FAR_MAX);
        assert_eq!(held_places(queue.pace(), 64), WINDOW);
        // It moves again: back to the queue's pace.
        queue.note(&free(10), start + 3_100 * MS);
        assert_eq!(queue.pace().held_for, Duration::ZERO);
    }

    /// Whether a waiter has measured the queue itself follows its own polls: grants seen
    /// between two of them make it so, and (re)joining, after a lapse too, unmakes it.
    #[test]
    fn a_waiter_measures_the_queue_from_its_own_polls_and_forgets_on_rejoining() {
        let answer = |token: i64, pace_ms: Option<i64>| Answer {
            status: "busy".into(),
            token: Some(token),
            owner: Some("holder".into()),
            acquired_ms: Some(1_000),
            renewed_ms: Some(1_000),
            expires_ms: Some(11_000),
            expires_in_ms: Some(10_000),
            ttl_ms: Some(10_000),
            waiter: Some(40),
            place: Some(40),
            pace_ms,
            held_waiters: Some(64),
        };
        let start = Instant::now();
        let mut queue = Queue::new("r", None, start);
        // Joining: the resource's recent pace, not measured.
        queue.note(&answer(7, Some(134)), start);
        assert_eq!((queue.per_grant, queue.measured), (134 * MS, false));
        // A poll that saw no grant measures nothing.
        queue.note(&answer(7, None), start + 100 * MS);
        assert!(!queue.measured);
        // One that saw ten grants in 40 ms does.
        queue.note(&answer(17, None), start + 140 * MS);
        assert_eq!((queue.per_grant, queue.measured), (4 * MS, true));
        // Rejoining after its row lapsed: the joining pace again, and not its own.
        queue.note(&answer(90, Some(134)), start + 9_000 * MS);
        assert_eq!((queue.per_grant, queue.measured), (134 * MS, false));
        assert_eq!(queue.hold_pace().per_grant, Duration::ZERO);
        // Measured again, then rejoined with a new row on a resource with no recent
        // grants (no pace): it forgets, and samples no pace across the lapse.
        queue.note(&answer(100, None), start + 9_040 * MS);
        assert_eq!((queue.per_grant, queue.measured), (4 * MS, true));
        let rejoined = Answer {
            waiter: Some(41),
            ..answer(200, None)
        };
        queue.note(&rejoined, start + 20_000 * MS);
        assert_eq!((queue.per_grant, queue.measured), (4 * MS, false));
        // A pace of zero or less (a server clock that stepped back) is no pace.
        let stepped = Answer {
            waiter: Some(42),
            ..answer(200, Some(-5))
        };
        queue.note(&stepped, start + 30_000 * MS);
        assert_eq!((queue.per_grant, queue.measured), (4 * MS, false));
    }

    /// A queue going at `per_grant`, its lease just granted.
    fn paced(per_grant: Duration) -> Pace {
        Pace {
            per_grant,
            held_for: Duration::ZERO,
        }
    }

    /// One slow holder delays every waiter behind it by its own time, not by its time per
    /// place ahead (2026-12-07: a holder held 130–260 ms once as 64 workers started, the
    /// waiters past place ~30 let go of their connection and slept for seconds while the 30
    /// ahead of them were granted in a tenth of one; 4 runs of 60 stayed at 11–39/s).
    #[test]
    fn a_slow_holder_delays_the_waiters_behind_it_once_not_once_per_place() {
        let hiccup = Pace {
            per_grant: 4 * MS,
            held_for: 150 * MS,
        };
        // Due within 4 s: the holder's 150 ms, then 4 ms a place: all 64 keep their connection.
        assert_eq!(held_places(hiccup, 64), 64);
        // The default's 500 ms: still all 8.
        assert_eq!(held_places(hiccup, HELD_DEFAULT), HELD_DEFAULT);
        // A waiter at place 34 polls at (150 + 32 × 4) / 2 ms, not 32 × 150 / 2.
        assert_eq!(far_poll(34, hiccup), 139 * MS);
        assert_eq!(held_poll(34, hiccup), 139 * MS);
        // Behind a lease held for a minute, only the window keeps its connection, and the
        // far waiters poll as seldom as their bounds allow (FAR_STEP a place ahead).
        let long = Pace {
            per_grant: 4 * MS,
            held_for: 60_000 * MS,
        };
        assert_eq!(held_places(long, 64), WINDOW);
        let ten = |held: u64| Pace {
            per_grant: 4 * MS,
            held_for: Duration::from_millis(held),
        };
        assert_eq!(held_places(ten(1_400), 64), WINDOW);
        assert_eq!(held_places(ten(10_000), HELD_MOST), 6);
        assert_eq!(far_poll(3, long), FAR_STEP);
        assert_eq!(far_poll(100, long), FAR_MAX);
        // Held for more than a hiccup: every grant ahead may take as long. At place 40
        // behind 2 s (a thousand waiters would otherwise reconnect hundreds of times a
        // second between them), FAR_STEP a place ahead, not (2 s + 38 × 4 ms) / 2.
        let slow = Pace {
            per_grant: 4 * MS,
            held_for: 2_000 * MS,
        };
        assert_eq!(far_poll(40, slow), 38 * FAR_STEP);
        assert_eq!(held_places(slow, 64), 2);
    }

    #[test]
    fn a_held_waiter_polls_halfway_to_its_turn_down_to_a_millisecond() {
        assert_eq!(held_poll(3, paced(4 * MS)), 2 * MS);
        assert_eq!(held_poll(12, paced(4 * MS)), 20 * MS);
        assert_eq!(held_poll(3, paced(MS / 4)), MS);
        assert_eq!(held_poll(60, paced(100 * MS)), NEAR_POLL);
    }
}
