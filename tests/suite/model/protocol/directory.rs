//! The local directory coordinator (`file:///dir`, `src/coordinator/file/`) and a fenced
//! target's guard as a stateright model.
//!
//! Every operation on a resource runs under an exclusive `flock` of its lock file
//! (`FileCoordinator::with_lock`, `src/coordinator/file/ops.rs`), which the kernel releases
//! when its process dies: operations on one resource are serialised, and the model runs each
//! as one atomic step ([`Action::Call`]) that reads the resource's files and writes them in
//! the order the code does. A process paused while it holds the lock only delays the others
//! (they give up after 30 s with exit 7 and nothing changed: no step).
//!
//! A resource's files ([`Files`]): the lease record (`leases/<name>.json`, replaced by
//! write-to-temp and rename, `sys::replace`), the high-water mark (`tokens/<name>.high`,
//! `counter::write`, fsynced before the token exists anywhere else) and the event log
//! (`events/<name>.jsonl`, `log::append`, never fsynced), of which only the highest token
//! matters here. A new grant's token is one above the highest of the three
//! (`FileCoordinator::next_token`). What processes read is the page cache
//! ([`Resource::cache`]); what a power loss keeps ([`Resource::disk`]) is what was synced:
//! the mark, always (no record is synced: `FileCoordinator::write_record`). What the kernel's
//! writeback flushed besides needs no step of its own: a record flushed at any earlier write
//! is of the earlier boot (not live) with a token at most the mark's, so the next grant
//! continues above the mark as it does over a missing record (the choice [`Kept::Synced`] or
//! [`Kept::Empty`] stands for it), and a log flushed in part stands between the synced and the
//! cached one, which a power loss's choices cover from both ends.
//!
//! What the protocol must survive: processes killed between any two of their writes
//! ([`End::Killed`]: the lock is released, what was written stays), a history append that
//! fails (a full disk: [`End::LogFailed`], the record written back to what it was, exit 7),
//! pauses (the clock advancing, [`Action::Tick`]: expiry is judged by `CLOCK_BOOTTIME`,
//! which every process on the machine shares), and a power loss ([`Action::PowerLoss`]):
//! every process dies with the machine, the boot id changes (every lease of the earlier boot
//! has expired, `Record::is_live`), and each file comes back as it was synced or as the
//! cache had it, a record renamed into place before its bytes were synced even empty (read
//! as missing, `FileCoordinator::read_record`).
//!
//! The target, the properties and the ghost state are the PostgreSQL model's
//! ([`super::postgres`]): each client is its own owner, and a write with token t is accepted
//! iff t is not below the highest accepted. [`Mutant`] brings back one bug each.

use stateright::{Model, Property};

use super::ghost::Ghost;
use super::postgres::{
    Op, PgModel, Time, Token, CLIENTS, CLIENT_ORDERS, FENCING, I1, I3, RESOURCES, RESOURCE_ORDERS,
    STALE_WRITE_REFUSED, TAKEOVER,
};

/// Not vacuous: a power loss took a resource's record, though tokens had been granted for it.
pub const RECORD_LOST: &str = "sometimes: a power loss leaves a record missing after grants";
/// Not vacuous: a grant's process was killed after it wrote the record, and the lease is live.
pub const KILLED_GRANT: &str = "sometimes: a grant's process is killed and its lease is live";

/// A lease record (`src/coordinator/file/record.rs`): its deadline on the boot's clock and the
/// boot it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Record {
    pub owner: u8,
    pub token: Token,
    pub expires: Time,
    pub released: bool,
    pub boot: u8,
}

/// A record as a later boot reads it: its expiry no longer matters (`Record::is_live`
/// compares boot ids first), so states that differ only in it are one.
fn settled(record: Record) -> Record {
    Record {
        expires: 0,
        ..record
    }
}

/// A resource's files: the record (None: missing or empty), the high-water mark (0: none yet)
/// and the highest token in the event log (0: none).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Files {
    pub record: Option<Record>,
    pub mark: Token,
    pub log: Token,
}

/// A resource's files as processes read them (`cache`) and as a power loss keeps them (`disk`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Resource {
    pub cache: Files,
    pub disk: Files,
}

/// Where a client is: as in the PostgreSQL model, its view of its lease changes only through
/// answers; a refusal leaves it where it was, and it stops using a lease when it drops it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Idle,
    Holding(u8, Token),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    /// `CLOCK_BOOTTIME`, which every process on the machine reads alike. It never goes back
    /// in the model: a power loss starts a new boot ([`State::boot`]) instead.
    pub clock: Time,
    pub boot: u8,
    pub resources: [Resource; RESOURCES],
    pub clients: [Phase; CLIENTS],
    /// The target's guard rows: the highest accepted token per resource (on another machine:
    /// a power loss of this one keeps them).
    pub guard: [Token; RESOURCES],
    pub ghost: Ghost,
}

/// How an operation ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum End {
    /// Every write done, the answer printed.
    Answered,
    /// The process was killed after `writes` (≥ 1) of its writes (a grant of a new token
    /// writes the mark, the record, the log; a reacquire, renewal or release the record, the
    /// log); it printed nothing, and its client knows no more than before.
    Killed { writes: u8 },
    /// The history append failed (`FileCoordinator::commit`): the record was written back
    /// as it was (a grant's, released: its token is used up), and fence exits 7.
    LogFailed,
}

/// What a power loss keeps of a file that was written since it was last synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kept {
    /// What was synced last.
    Synced,
    /// What the page cache had.
    Cached,
    /// A record renamed into place before its bytes reached the disk: empty, read as missing.
    Empty,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `CLOCK_BOOTTIME` advances: between two steps of a client, a pause.
    Tick(Time),
    /// `fence acquire`, `fence renew`, `fence release` (`src/coordinator/file/ops.rs`:
    /// `grant`, `renew`, `release`; [`DirModel::plan`]), under the resource's lock.
    Call(u8, Op, End),
    /// The client stops using its lease without releasing it.
    Drop(u8),
    /// `fence write --token`: the target's guard and the effect in one transaction.
    Write(u8),
    /// The machine loses power and boots again: (record, log) kept of each resource.
    PowerLoss([(Kept, Kept); RESOURCES]),
}

/// One bug each, brought back into the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// The next token is above the record and the log only (the mark is written but not
    /// read). Breaks I1 when a power loss empties the record and takes the log's tail.
    IgnoreMark,
    /// The mark is written without `sync_data`. Breaks I1 at a power loss, as above.
    MarkNotSynced,
    /// A takeover keeps the expired lease's token. Breaks I1.
    TakeoverKeepsToken,
    /// A renewal matches the record whatever its owner and token. Breaks I3.
    RenewWithoutOwnerCheck,
    /// Expiry judged by the calling process's wall clock (client 2's is one tick ahead)
    /// instead of `CLOCK_BOOTTIME`. Breaks I3.
    WallClock,
}

/// The model's bounds and the bug it carries, if any.
#[derive(Clone, Copy, Debug)]
pub struct DirModel {
    pub ttl: Time,
    pub max_clock: Time,
    pub max_token: Token,
    /// How many power losses a path may have.
    pub max_boots: u8,
    pub mutant: Option<Mutant>,
    /// Explore one state of each class that differs only in clients' and resources' names.
    pub symmetric: bool,
}

/// What an operation decided under the lock: its writes in order, the record its history
/// failure writes back, and its answer.
struct Plan {
    /// A new token: the mark is raised to it first (a grant of a new token only).
    mark: Option<Token>,
    /// The record written (never synced: `FileCoordinator::write_record`).
    record: Option<Record>,
    /// The token of the event appended.
    log: Option<Token>,
    /// What `FileCoordinator::commit` writes back when the append fails.
    undo: Option<Record>,
    answer: Answer,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Granted(Token),
    NewToken(Token),
    Busy,
    Renewed,
    Released,
    AlreadyReleased,
    Refused,
}

impl DirModel {
    /// 3 clients, 2 resources, TTL 2, the clock up to 3, tokens up to 2, one power loss.
    pub fn bounded() -> DirModel {
        DirModel {
            ttl: 2,
            max_clock: 3,
            max_token: 2,
            max_boots: 1,
            mutant: None,
            symmetric: true,
        }
    }

    pub fn with(mutant: Mutant) -> DirModel {
        DirModel {
            mutant: Some(mutant),
            symmetric: false,
            ..DirModel::bounded()
        }
    }

    fn is(&self, mutant: Mutant) -> bool {
        self.mutant == Some(mutant)
    }

    /// `Record::is_live`: not released, of this boot, and its deadline ahead of the clock the
    /// process reads (`CLOCK_BOOTTIME`; the caller's wall clock under [`Mutant::WallClock`]).
    fn is_live(&self, record: &Record, state: &State, client: u8) -> bool {
        let ahead = Time::from(self.is(Mutant::WallClock) && client == 2);
        !record.released && record.boot == state.boot && record.expires > state.clock + ahead
    }

    fn extended(&self, record: Record, state: &State) -> Record {
        Record {
            expires: state.clock + self.ttl,
            released: false,
            boot: state.boot,
            ..record
        }
    }

    /// What `client`'s operation decides from the files it reads under the lock.
    fn plan(&self, state: &State, client: u8, op: Op) -> Plan {
        let files = state.resources[usize::from(op.resource())].cache;
        let refused = |answer| Plan {
            mark: None,
            record: None,
            log: None,
            undo: None,
            answer,
        };
        let record = files.record;
        match op {
            // `grant`: a live record of another owner is busy; the owner's own live lease is
            // reacquired with its token (not synced); otherwise a new token, one above the
            // record's, the mark's and the log's (`next_token`), the mark raised and synced,
            // the record written (not synced), the event appended.
            Op::Acquire(_) => match record.filter(|r| self.is_live(r, state, client)) {
                Some(r) if r.owner != client => refused(Answer::Busy),
                Some(r) => Plan {
                    mark: None,
                    record: Some(self.extended(r, state)),
                    log: Some(r.token),
                    undo: Some(r),
                    answer: Answer::Granted(r.token),
                },
                None => {
                    let recorded = record.map_or(0, |r| r.token);
                    let issued = if self.is(Mutant::IgnoreMark) {
                        files.log
                    } else {
                        files.mark.max(files.log)
                    };
                    let takeover = record.is_some_and(|r| !r.released && r.owner != client);
                    let token = if takeover && self.is(Mutant::TakeoverKeepsToken) {
                        recorded
                    } else {
                        recorded.max(issued) + 1
                    };
                    let granted = Record {
                        owner: client,
                        token,
                        expires: state.clock + self.ttl,
                        released: false,
                        boot: state.boot,
                    };
                    Plan {
                        mark: Some(token),
                        record: Some(granted),
                        log: Some(token),
                        undo: Some(Record {
                            released: true,
                            ..granted
                        }),
                        answer: Answer::NewToken(token),
                    }
                }
            },
            // `renew`: only the owner's live lease of this token, extended (not synced).
            Op::Renew(_, token) => match record {
                Some(r)
                    if (self.is(Mutant::RenewWithoutOwnerCheck)
                        || (r.token == token && r.owner == client))
                        && self.is_live(&r, state, client) =>
                {
                    Plan {
                        mark: None,
                        record: Some(self.extended(r, state)),
                        log: Some(r.token),
                        undo: Some(r),
                        answer: Answer::Renewed,
                    }
                }
                // A refusal may append a `renew_rejected` event: its token is at most the
                // record's, so it never raises the next token.
                _ => refused(Answer::Refused),
            },
            // `release`: the owner's lease of this token, live or expired, marked released
            // (not synced); released already: nothing written.
            Op::Release(_, token) => match record {
                Some(r) if r.token == token && r.owner == client && r.released => {
                    refused(Answer::AlreadyReleased)
                }
                Some(r) if r.token == token && r.owner == client => Plan {
                    mark: None,
                    record: Some(Record {
                        released: true,
                        ..r
                    }),
                    log: Some(token),
                    undo: Some(r),
                    answer: Answer::Released,
                },
                _ => refused(Answer::Refused),
            },
        }
    }

    /// The writes `plan` makes, in order: mark, record, log.
    fn writes(plan: &Plan) -> u8 {
        [
            plan.mark.is_some(),
            plan.record.is_some(),
            plan.log.is_some(),
        ]
        .into_iter()
        .map(u8::from)
        .sum()
    }

    /// Carries out `plan`'s writes as `end` lets it; the answer the client hears, if any.
    fn apply(&self, next: &mut State, client: u8, op: Op, plan: &Plan, end: End) -> Option<Answer> {
        let r = usize::from(op.resource());
        let mut left = match end {
            End::Killed { writes } => writes,
            End::Answered | End::LogFailed => Self::writes(plan),
        };
        let files = &mut next.resources[r];
        if let (Some(token), true) = (plan.mark, left > 0) {
            left -= 1;
            files.cache.mark = token;
            if !self.is(Mutant::MarkNotSynced) {
                files.disk.mark = token;
            }
        }
        let mut written = None;
        if let (Some(record), true) = (plan.record, left > 0) {
            left -= 1;
            files.cache.record = Some(record);
            written = Some(record);
        }
        if let (Some(token), true) = (plan.log, left > 0) {
            if end == End::LogFailed {
                // Written back, not synced; no one was told of the lease the lock hid.
                files.cache.record = plan.undo;
                return None;
            }
            files.cache.log = files.cache.log.max(token);
        }
        // The ghost: new grants, and what the store now says is live (a written record).
        if let Some(record) = written {
            let ghost = &mut next.ghost;
            if let Answer::NewToken(token) = plan.answer {
                ghost.reissued |= token <= ghost.granted[r];
                ghost.granted[r] = ghost.granted[r].max(token);
            }
            let expires = (!record.released).then_some(record.expires);
            match (plan.answer, op) {
                // The client is told that its own lease lives on, whichever record changed.
                (Answer::Renewed, Op::Renew(_, token)) => {
                    ghost.claim(r, client, token, expires);
                }
                _ => ghost.claim(r, record.owner, record.token, expires),
            }
        }
        (end == End::Answered).then_some(plan.answer)
    }
}

impl Model for DirModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let files = Files {
            record: None,
            mark: 0,
            log: 0,
        };
        vec![State {
            clock: 0,
            boot: 0,
            resources: [Resource {
                cache: files,
                disk: files,
            }; RESOURCES],
            clients: [Phase::Idle; CLIENTS],
            guard: [0; RESOURCES],
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.clock < self.max_clock {
            actions.push(Action::Tick(1));
        }
        for (c, phase) in (0..).zip(state.clients) {
            let ops = match phase {
                Phase::Idle => (0..).take(RESOURCES).map(Op::Acquire).collect::<Vec<_>>(),
                Phase::Holding(r, t) => {
                    actions.extend([Action::Write(c), Action::Drop(c)]);
                    vec![Op::Renew(r, t), Op::Release(r, t)]
                }
            };
            for op in ops {
                actions.push(Action::Call(c, op, End::Answered));
                actions.push(Action::Call(c, op, End::LogFailed));
                for writes in 1..=3 {
                    actions.push(Action::Call(c, op, End::Killed { writes }));
                }
            }
        }
        if state.boot < self.max_boots {
            let choices = |r: &Resource| {
                let records: &[Kept] = if r.cache.record == r.disk.record {
                    &[Kept::Synced]
                } else {
                    &[Kept::Synced, Kept::Cached, Kept::Empty]
                };
                let logs: &[Kept] = if r.cache.log == r.disk.log {
                    &[Kept::Synced]
                } else {
                    &[Kept::Synced, Kept::Cached]
                };
                records
                    .iter()
                    .flat_map(|k| logs.iter().map(move |l| (*k, *l)))
                    .collect::<Vec<_>>()
            };
            let [a, b] = [choices(&state.resources[0]), choices(&state.resources[1])];
            for ka in &a {
                for kb in &b {
                    actions.push(Action::PowerLoss([*ka, *kb]));
                }
            }
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut next = *state;
        let phase = state.clients;
        match action {
            Action::Tick(by) => {
                next.clock = state.clock.checked_add(by)?;
                next.ghost.expire(next.clock);
            }
            Action::Call(c, op, end) => {
                let plan = self.plan(state, c, op);
                match end {
                    // Killed before its first write changes nothing: no step. Killed after its
                    // last, the client did not hear the answer (and may send it again).
                    End::Killed { writes } if writes > Self::writes(&plan) => return None,
                    // Killed after an append that raised nothing (a renewal's, a release's, a
                    // reacquisition's: the log has their token) is the state of a kill just
                    // before it: one step for both.
                    End::Killed { writes }
                        if writes == Self::writes(&plan)
                            && plan.log.is_some_and(|t| {
                                t <= state.resources[usize::from(op.resource())].cache.log
                            }) =>
                    {
                        return None
                    }
                    // A renewal's or release's undo writes back the record it found: the same
                    // state as no step. A grant's leaves its token used up.
                    End::LogFailed if plan.mark.is_none() => return None,
                    _ => {}
                }
                let answer = self.apply(&mut next, c, op, &plan, end);
                let learnt = match answer {
                    Some(Answer::Granted(t) | Answer::NewToken(t)) => {
                        Phase::Holding(op.resource(), t)
                    }
                    Some(Answer::Busy | Answer::Released | Answer::AlreadyReleased) => Phase::Idle,
                    Some(Answer::Renewed | Answer::Refused) | None => phase[usize::from(c)],
                };
                next.clients[usize::from(c)] = learnt;
            }
            Action::Drop(c) => {
                let Phase::Holding(..) = phase[usize::from(c)] else {
                    return None;
                };
                next.clients[usize::from(c)] = Phase::Idle;
            }
            Action::Write(c) => {
                let Phase::Holding(r, t) = phase[usize::from(c)] else {
                    return None;
                };
                let r = usize::from(r);
                if !PgModel::guard_accepts(next.guard[r], t) {
                    return None;
                }
                next.guard[r] = t;
                next.ghost.late_effect |= t < next.ghost.effect[r];
                next.ghost.effect[r] = next.ghost.effect[r].max(t);
            }
            Action::PowerLoss(kept) => {
                next.boot += 1;
                next.clients = [Phase::Idle; CLIENTS];
                // Every holder died with the machine, and the new boot id expires every lease.
                next.ghost.expire(Time::MAX);
                for (r, (record, log)) in next.resources.iter_mut().zip(kept) {
                    let files = Files {
                        record: match record {
                            Kept::Synced => r.disk.record,
                            Kept::Cached => r.cache.record.map(settled),
                            Kept::Empty => None,
                        },
                        mark: r.disk.mark,
                        log: match log {
                            Kept::Cached => r.cache.log,
                            Kept::Synced | Kept::Empty => r.disk.log,
                        },
                    };
                    r.cache = files;
                    r.disk = files;
                }
            }
        }
        Some(if self.symmetric {
            next.representative()
        } else {
            next
        })
    }

    fn within_boundary(&self, state: &State) -> bool {
        state.resources.iter().all(|r| {
            r.cache.mark <= self.max_token
                && r.cache.record.is_none_or(|rec| rec.token <= self.max_token)
        })
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(I1, |_, s: &State| !s.ghost.reissued),
            Property::always(I3, |_, s: &State| {
                s.ghost.claims.iter().all(|claims| {
                    let live = claims.iter().flatten().filter(|c| c.expires > s.clock);
                    live.count() <= 1
                })
            }),
            Property::always(FENCING, |_, s: &State| !s.ghost.late_effect),
            Property::sometimes(TAKEOVER, |_, s: &State| {
                (0..).zip(s.clients).any(|(c, phase)| match phase {
                    Phase::Holding(r, t) => s.resources[usize::from(r)]
                        .cache
                        .record
                        .is_some_and(|rec| rec.owner != c && rec.token > t),
                    Phase::Idle => false,
                })
            }),
            Property::sometimes(STALE_WRITE_REFUSED, |_, s: &State| {
                s.clients.iter().any(|phase| match phase {
                    Phase::Holding(r, t) => *t < s.guard[usize::from(*r)],
                    Phase::Idle => false,
                })
            }),
            Property::sometimes(RECORD_LOST, |_, s: &State| {
                s.boot > 0
                    && (0..RESOURCES)
                        .any(|r| s.resources[r].cache.record.is_none() && s.ghost.granted[r] > 0)
            }),
            Property::sometimes(KILLED_GRANT, |_, s: &State| {
                (0..).zip(s.clients).any(|(c, phase)| {
                    phase == Phase::Idle
                        && s.resources.iter().any(|r| {
                            r.cache.record.is_some_and(|rec| {
                                rec.owner == c
                                    && !rec.released
                                    && rec.boot == s.boot
                                    && rec.expires > s.clock
                            })
                        })
                })
            }),
        ]
    }
}

impl State {
    /// The least state, in `Ord`, among this one with its clients and resources renamed in
    /// every way (3! × 2!): every state of a class has the same.
    fn representative(&self) -> State {
        let mut least = *self;
        for resources in RESOURCE_ORDERS {
            for clients in CLIENT_ORDERS {
                let renamed = self.renamed(clients, resources);
                if renamed < least {
                    least = renamed;
                }
            }
        }
        least
    }

    /// This state with client c called `clients[c]` and resource r `resources[r]`.
    fn renamed(&self, clients: [u8; CLIENTS], resources: [u8; RESOURCES]) -> State {
        let client = |c: u8| clients[usize::from(c)];
        let mut out = *self;
        for (c, phase) in self.clients.iter().enumerate() {
            out.clients[usize::from(clients[c])] = match *phase {
                Phase::Idle => Phase::Idle,
                Phase::Holding(r, t) => Phase::Holding(resources[usize::from(r)], t),
            };
        }
        for (r, &to) in resources.iter().enumerate() {
            let to = usize::from(to);
            let mut res = self.resources[r];
            for files in [&mut res.cache, &mut res.disk] {
                if let Some(rec) = &mut files.record {
                    rec.owner = client(rec.owner);
                }
            }
            out.resources[to] = res;
            out.guard[to] = self.guard[r];
            out.ghost.granted[to] = self.ghost.granted[r];
            out.ghost.effect[to] = self.ghost.effect[r];
            let mut claims = self.ghost.claims[r];
            for claim in claims.iter_mut().flatten() {
                claim.owner = client(claim.owner);
            }
            claims.sort();
            out.ghost.claims[to] = claims;
        }
        out
    }
}
