//! The PostgreSQL coordinator and the PostgreSQL target's guard as a stateright model.
//!
//! The coordinator is the `leases` row of each resource (`src/coordinator/postgres/schema.sql`)
//! and the three one-shot statements that change it (`src/coordinator/pg_one_shot.rs`:
//! `ACQUIRE`, `RENEW`, `RELEASE`), each one autocommit statement that holds the row's lock
//! from its `UPDATE` to its commit. Statements on one row are therefore serialised, and the
//! model runs each as one atomic step ([`Action::Call`]) at the server's clock of that moment
//! (`clock_timestamp()`, read after the lock). A statement whose snapshot was older than its
//! lock answers `retry`, changes nothing and is sent again by fence
//! (`PgCoordinator::one_shot`): the same as one atomic step at the later moment, so `retry`
//! needs no action of its own.
//!
//! The guard is `begin_write` (`src/fenced/guard.sql`): a write with token t is accepted iff
//! t ≥ the highest token accepted for its resource, which it raises to t in the transaction
//! that carries the write's effect ([`Action::Write`]).
//!
//! Around them, what the protocol must survive: the server's clock advancing on its own
//! ([`Action::Tick`]; a client never sees it, so a client that takes no step while the clock
//! advances is paused, with a view of its lease as stale as the last answer it got), answers
//! lost after the commit ([`Action::CallLost`]; the client may send the statement again: an
//! acquire by the same owner reacquires), clients that go on after a refusal, and server
//! restarts (committed rows survive, statements in flight vanish or lose their answers: see
//! [`Action`]).
//!
//! Each client is its own owner (every `fence run` is, DESIGN §1). A ghost part of the state
//! ([`Ghost`]) records what the properties are about and no party can read: every grant's
//! token, the leases the server said were live until when, and the tokens of the effects the
//! target accepted.
//!
//! [`Mutant`] brings back one bug each, for the tests that show the checker finds it.

mod sql;
mod symmetry;

pub use super::ghost::Ghost;
pub use sql::{Event, Refusal, Row, Status};

use stateright::{Model, Property};

/// Clients (each its own owner) and resources of the model.
pub const CLIENTS: usize = 3;
pub const RESOURCES: usize = 2;
/// Every renaming of the clients and of the resources (3! and 2!), for the symmetry
/// reductions of both models: entry `i` is the new name of `i`.
pub const CLIENT_ORDERS: [[u8; CLIENTS]; 6] = [
    [0, 1, 2],
    [0, 2, 1],
    [1, 0, 2],
    [1, 2, 0],
    [2, 0, 1],
    [2, 1, 0],
];
pub const RESOURCE_ORDERS: [[u8; RESOURCES]; 2] = [[0, 1], [1, 0]];

/// A reading of the server's clock: one [`Action::Tick`] of the exhaustive check, or a
/// microsecond in a replay of a real history.
pub type Time = u32;
pub type Token = u8;

/// I1: every new grant's token is above every token granted before for its resource.
pub const I1: &str = "I1: a new grant's token is above every earlier grant's";
/// I3: at most one lease per resource is live by the server's clock.
pub const I3: &str = "I3: at most one live lease per resource, by the server's clock";
/// I2 as the target sees it: once an effect with token t was accepted, none with a lower
/// token is accepted later.
pub const FENCING: &str = "fencing: no effect is accepted after a newer token's effect";
/// Not vacuous: a holder is displaced while it still believes it holds its lease (paused).
pub const TAKEOVER: &str = "sometimes: a paused holder's lease is taken over";
/// Not vacuous: a newer token has written while a displaced holder still holds an older one,
/// so that holder's next write ([`Action::Write`]) is refused.
pub const STALE_WRITE_REFUSED: &str = "sometimes: a displaced holder's next write is refused";
/// Not vacuous: a grant applied whose answer was lost, and its client can retry.
pub const LOST_GRANT: &str = "sometimes: a grant's answer is lost and the lease is still live";

/// A statement a client sends: `fence acquire`, `fence renew`, `fence release`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Acquire(u8),
    /// Renew the lease (resource, token) the client holds.
    Renew(u8, Token),
    /// Release the lease (resource, token) the client holds.
    Release(u8, Token),
}

impl Op {
    pub fn resource(self) -> u8 {
        match self {
            Op::Acquire(r) | Op::Renew(r, _) | Op::Release(r, _) => r,
        }
    }
}

/// What a client learns from an answer (what fence prints and its exit status).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    Granted(Token),
    Busy,
    Renewed,
    Released,
    Refused,
}

/// Where a client is. Its view of its lease changes only through answers.
///
/// A client whose statement's answer was lost (exit 8) knows no more than before it sent it,
/// and may do anything it could do then: send the same statement again (an acquire by the
/// same owner reacquires, a release finds the lease already released), or anything else. So
/// "outcome unknown" needs no phase of its own: it is the phase the client was in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Holds nothing it knows of.
    Idle,
    /// Believes it holds the lease (resource, token): may renew, release and write with it.
    /// A refusal leaves it here (a script may go on after an exit status it ignores); it
    /// stops using the lease when it drops it ([`Action::Drop`]).
    Holding(u8, Token),
    /// [`Mutant::GuardApartFromEffect`] only: the guard accepted the token in a transaction
    /// of its own; the effect commits later in another.
    Checked(u8, Token),
}

/// The coordinator's server: its clock and its rows. `durable` is what a restart keeps: the
/// rows themselves, since each statement sets `synchronous_commit = on` and a commit is
/// answered once it is durable ([`Mutant::AsyncCommit`] drops that).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Server {
    pub clock: Time,
    pub rows: [Option<Row>; RESOURCES],
    pub durable: [Option<Row>; RESOURCES],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    pub server: Server,
    pub clients: [Phase; CLIENTS],
    /// The target's guard rows: the highest accepted token per resource (0: no row yet).
    pub guard: [Token; RESOURCES],
    pub ghost: Ghost,
}

/// The steps of the model. Each names the code it stands for.
///
/// A statement is one step from its client's point of view too: sent, applied under the row
/// lock, committed and answered ([`Action::Call`]), or applied with its answer lost
/// ([`Action::CallLost`]). A statement or an answer on its way for a while is the same as
/// its client pausing before or after it: the client does nothing meanwhile, and the server
/// sees the statement only when it applies it. A statement that never applies (the
/// connection failed first, or the server restarted before the commit) changes nothing
/// anyone knows: no step. A server restart does to each statement in flight one of these
/// and keeps every committed row (`synchronous_commit = on`), so [`Action::Restart`] changes
/// the server only under [`Mutant::AsyncCommit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The server's clock advances, on its own. Between two steps of a client any number of
    /// ticks may pass: a pause (SIGSTOP, a swapped-out process, a slow network).
    Tick(Time),
    /// The client runs `fence acquire` (`Idle`), or `fence renew` or `fence release` of the
    /// lease it holds (`Holding`). The server applies the statement and commits
    /// ([`PgModel::acquire`], [`PgModel::renew`], [`PgModel::release`]), and fence prints its
    /// answer (`src/cmd/acquire.rs`, `renew.rs`, `release.rs`).
    Call(u8, Op),
    /// As `Call`, but the answer is lost after the commit (a connection cut, a restart):
    /// the client learns nothing.
    CallLost(u8, Op),
    /// The client stops using its lease without releasing it (it crashed, or it heeded a
    /// refusal).
    Drop(u8),
    /// `fence write --token`: the fenced transaction, `begin_write` and the effect in one
    /// transaction (`src/fenced/postgres.rs` `fenced_script`; [`PgModel::guard_accepts`]).
    /// A refused write (exit 4) changes nothing, so only accepted writes are steps.
    Write(u8),
    /// [`Mutant::GuardApartFromEffect`] only: the effect's own transaction commits.
    Effect(u8),
    /// [`Mutant::AsyncCommit`] only: the server restarts and loses the commits not flushed.
    Restart,
    /// [`Mutant::AsyncCommit`] only: the WAL is flushed, commits become durable.
    Flush,
}

/// One bug each, brought back into the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// A takeover keeps the expired lease's token (`l.token` instead of `l.token + 1` in
    /// `ACQUIRE`'s SET). Breaks I1.
    TakeoverKeepsToken,
    /// Grants are answered before they are durable (`synchronous_commit = off` without the
    /// statements' `set_config`): a restart loses what was not flushed. Breaks I1.
    AsyncCommit,
    /// `ACQUIRE` judges expiry by the acquiring client's clock (a parameter) instead of
    /// `clock_timestamp()`; client 2's clock is one tick ahead. Breaks I3.
    ClientClock,
    /// `RENEW`'s UPDATE lacks `l.token = $3 AND l.owner = $2`: a late renewal stretches
    /// the newer owner's lease and is told it renewed its own. Breaks I3.
    RenewWithoutOwnerCheck,
    /// The guard's check commits in a transaction of its own, before the effect's. Breaks
    /// the fencing property.
    GuardApartFromEffect,
}

/// The model's bounds and the bug it carries, if any.
#[derive(Clone, Copy, Debug)]
pub struct PgModel {
    /// Every grant's and renewal's TTL, in clock units.
    pub ttl: Time,
    /// The exhaustive check's clock stops here ([`Action::Tick`] is disabled).
    pub max_clock: Time,
    /// States with a higher token are outside the check's boundary.
    pub max_token: Token,
    /// How far each client's own clock is ahead of the server's (read only by
    /// [`Mutant::ClientClock`]: the correct protocol never reads a client's clock, I7).
    pub ahead: [Time; CLIENTS],
    pub mutant: Option<Mutant>,
    /// Explore one state of each class that differs only in the clients' and resources'
    /// names ([`State::representative`]): the correct protocol treats every client and every
    /// resource alike, so the properties hold in all of a class or in none.
    pub symmetric: bool,
}

impl PgModel {
    /// The bounds of the exhaustive check: 3 clients, 2 resources, TTL 2, the clock up to 4,
    /// tokens up to 3 per resource.
    pub fn bounded() -> PgModel {
        PgModel {
            ttl: 2,
            max_clock: 4,
            max_token: 3,
            ahead: [0, 0, 1],
            mutant: None,
            symmetric: true,
        }
    }

    /// The model a replay runs a real history through: the clock in microseconds, the real
    /// TTL, no bounds, each client under its own name.
    pub fn replaying(ttl: Time) -> PgModel {
        PgModel {
            ttl,
            max_clock: Time::MAX,
            max_token: Token::MAX,
            ahead: [0; CLIENTS],
            mutant: None,
            symmetric: false,
        }
    }

    pub fn with(mutant: Mutant) -> PgModel {
        PgModel {
            mutant: Some(mutant),
            symmetric: false,
            ..PgModel::bounded()
        }
    }

    fn is(&self, mutant: Mutant) -> bool {
        self.mutant == Some(mutant)
    }

    /// [`Action::Call`]: the statement, its commit, and what the ghost records of it.
    fn apply(&self, state: &mut State, client: u8, op: Op) -> Answer {
        let r = usize::from(op.resource());
        let (row, status) = self.statement(&state.server, client, op);
        state.server.rows[r] = row;
        if !self.is(Mutant::AsyncCommit) {
            state.server.durable[r] = row;
        }
        let ghost = &mut state.ghost;
        let lease = |row: Option<Row>| row.expect("a grant or renewal leaves a row");
        match (status, op) {
            (Status::Acquired | Status::TakenOver, _) => {
                let row = lease(row);
                ghost.reissued |= row.token <= ghost.granted[r];
                ghost.granted[r] = ghost.granted[r].max(row.token);
                ghost.claim(r, client, row.token, row.expires);
                Answer::Granted(row.token)
            }
            (Status::Reacquired, _) => {
                let row = lease(row);
                ghost.claim(r, client, row.token, row.expires);
                Answer::Granted(row.token)
            }
            (Status::Renewed, Op::Renew(_, token)) => {
                // The client is told that *its* lease lives on, whichever row was changed.
                ghost.claim(r, client, token, lease(row).expires);
                Answer::Renewed
            }
            (Status::Released, Op::Release(_, token)) => {
                ghost.claim(r, client, token, None);
                Answer::Released
            }
            (Status::AlreadyReleased, _) => Answer::Released,
            (Status::Busy, _) => Answer::Busy,
            _ => Answer::Refused,
        }
    }

    /// [`Action::Write`] (and [`Action::Effect`]): the effect with `token` is accepted.
    fn effect(state: &mut State, r: usize, token: Token) {
        state.ghost.late_effect |= token < state.ghost.effect[r];
        state.ghost.effect[r] = state.ghost.effect[r].max(token);
    }
}

impl Model for PgModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            server: Server {
                clock: 0,
                rows: [None; RESOURCES],
                durable: [None; RESOURCES],
            },
            clients: [Phase::Idle; CLIENTS],
            guard: [0; RESOURCES],
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.server.clock < self.max_clock {
            actions.push(Action::Tick(1));
        }
        for (c, phase) in (0..).zip(state.clients) {
            match phase {
                Phase::Idle => {
                    for r in (0..).take(RESOURCES) {
                        let op = Op::Acquire(r);
                        actions.extend([Action::Call(c, op), Action::CallLost(c, op)]);
                    }
                }
                Phase::Holding(r, t) => actions.extend([
                    // A renewal's lost answer leaves the client where its answer would.
                    Action::Call(c, Op::Renew(r, t)),
                    Action::Call(c, Op::Release(r, t)),
                    Action::CallLost(c, Op::Release(r, t)),
                    Action::Write(c),
                    Action::Drop(c),
                ]),
                Phase::Checked(..) => actions.push(Action::Effect(c)),
            }
        }
        if state.server.durable != state.server.rows {
            actions.extend([Action::Restart, Action::Flush]);
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut next = *state;
        let phase = |c: u8| state.clients[usize::from(c)];
        let set = |next: &mut State, c: u8, phase: Phase| next.clients[usize::from(c)] = phase;
        match action {
            Action::Tick(by) => {
                next.server.clock = state.server.clock.checked_add(by)?;
                next.ghost.expire(next.server.clock);
            }
            Action::Call(c, op) | Action::CallLost(c, op) => {
                let may = match (phase(c), op) {
                    (Phase::Idle, Op::Acquire(_)) => true,
                    (Phase::Holding(r, t), Op::Renew(r2, t2) | Op::Release(r2, t2)) => {
                        (r, t) == (r2, t2)
                    }
                    _ => false,
                };
                if !may {
                    return None;
                }
                let answer = self.apply(&mut next, c, op);
                if let Action::Call(..) = action {
                    let learnt = match (answer, op) {
                        (Answer::Granted(t), _) => Phase::Holding(op.resource(), t),
                        (Answer::Busy | Answer::Released, _) => Phase::Idle,
                        (Answer::Renewed | Answer::Refused, _) => phase(c),
                    };
                    set(&mut next, c, learnt);
                }
            }
            Action::Drop(c) => {
                let Phase::Holding(..) = phase(c) else {
                    return None;
                };
                set(&mut next, c, Phase::Idle);
            }
            Action::Write(c) => {
                let Phase::Holding(r, t) = phase(c) else {
                    return None;
                };
                let highest = &mut next.guard[usize::from(r)];
                if !Self::guard_accepts(*highest, t) {
                    return None;
                }
                *highest = t;
                if self.is(Mutant::GuardApartFromEffect) {
                    set(&mut next, c, Phase::Checked(r, t));
                } else {
                    Self::effect(&mut next, usize::from(r), t);
                }
            }
            Action::Effect(c) => {
                let Phase::Checked(r, t) = phase(c) else {
                    return None;
                };
                Self::effect(&mut next, usize::from(r), t);
                set(&mut next, c, Phase::Holding(r, t));
            }
            Action::Restart => next.server.rows = next.server.durable,
            Action::Flush => next.server.durable = next.server.rows,
        }
        Some(if self.symmetric {
            next.representative()
        } else {
            next
        })
    }

    fn within_boundary(&self, state: &State) -> bool {
        state
            .server
            .rows
            .iter()
            .flatten()
            .all(|row| row.token <= self.max_token)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(I1, |_, s: &State| !s.ghost.reissued),
            Property::always(I3, |_, s: &State| {
                s.ghost.claims.iter().all(|claims| {
                    let live = claims
                        .iter()
                        .flatten()
                        .filter(|c| c.expires > s.server.clock);
                    live.count() <= 1
                })
            }),
            Property::always(FENCING, |_, s: &State| !s.ghost.late_effect),
            Property::sometimes(TAKEOVER, |_, s: &State| {
                (0..).zip(s.clients).any(|(c, phase)| match phase {
                    Phase::Holding(r, t) => s.server.rows[usize::from(r)]
                        .is_some_and(|row| row.owner != c && row.token > t),
                    _ => false,
                })
            }),
            Property::sometimes(STALE_WRITE_REFUSED, |_, s: &State| {
                s.clients.iter().any(|phase| match phase {
                    Phase::Holding(r, t) => *t < s.guard[usize::from(*r)],
                    _ => false,
                })
            }),
            Property::sometimes(LOST_GRANT, |_, s: &State| {
                (0..).zip(s.clients).any(|(c, phase)| {
                    phase == Phase::Idle
                        && s.server.rows.iter().flatten().any(|row| {
                            row.owner == c && row.expires.is_some_and(|e| e > s.server.clock)
                        })
                })
            }),
        ]
    }
}
