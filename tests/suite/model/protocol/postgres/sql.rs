//! The coordinator's statements (`src/coordinator/pg_one_shot.rs`), the events they record,
//! and the guard's rule (`src/fenced/guard.sql`), as functions of the rows they find: the
//! model's steps call them, and the replay compares what they record with what the server
//! recorded.

use super::{Mutant, Op, PgModel, Server, Time, Token};

/// A resource's `leases` row. Rows are never deleted (a trigger refuses it), so the token
/// survives release and expiry; `expires: None` is a released lease (`expires_at IS NULL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Row {
    pub owner: u8,
    pub token: Token,
    pub expires: Option<Time>,
}

/// What a statement answered (the `status` column of the one-shot statements).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Acquired,
    TakenOver,
    /// The owner's own live lease, same token (a retry, or a second acquire).
    Reacquired,
    Busy,
    Renewed,
    Released,
    /// Releasing a released lease succeeds and records nothing.
    AlreadyReleased,
    Refused(Refusal),
}

/// Why a renew or release was refused (`src/coordinator/refusal.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    Stale,
    NeverIssued,
    WrongOwner,
    /// The caller's own lease, released.
    Released,
    /// The caller's own lease, expired.
    Expired,
    NoLease,
}

/// A row a statement writes to the coordinator's `events` table (the history `fence log`
/// reads), in the same transaction as its change of the lease row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: &'static str,
    pub owner: u8,
    pub token: Token,
    /// The expiry a grant or renewal set (`expires_at`).
    pub expires: Option<Time>,
    /// A takeover's previous expiry (`previous_expires_at`).
    pub previous_expires: Option<Time>,
    pub detail: Option<String>,
}

impl PgModel {
    /// `ACQUIRE` (`src/coordinator/pg_one_shot.rs`; `$4`, `--above`, NULL): no row yet, the
    /// `created` INSERT with token 1; else the `taken` UPDATE, whose WHERE takes a released
    /// or expired lease or the owner's own (judged by `clock_timestamp()` after the lock),
    /// keeping a live own lease's token (`reacquired`) and otherwise `token + 1`; a live
    /// lease of another owner is `busy`, nothing written. Every grant sets the expiry to
    /// now + TTL.
    pub fn acquire(&self, row: Option<Row>, now: Time, owner: u8) -> (Option<Row>, Status) {
        let now = if self.is(Mutant::ClientClock) {
            now + self.ahead[usize::from(owner)]
        } else {
            now
        };
        let expires = Some(now + self.ttl);
        let Some(row) = row else {
            let row = Row {
                owner,
                token: 1,
                expires,
            };
            return (Some(row), Status::Acquired);
        };
        let free = row.expires.is_none_or(|e| e <= now);
        if !free && row.owner != owner {
            return (Some(row), Status::Busy);
        }
        let live_mine = row.owner == owner && row.expires.is_some_and(|e| e > now);
        let (token, status) = if live_mine {
            (row.token, Status::Reacquired)
        } else if row.expires.is_none() || row.owner == owner {
            (row.token + 1, Status::Acquired)
        } else if self.is(Mutant::TakeoverKeepsToken) {
            (row.token, Status::TakenOver)
        } else {
            (row.token + 1, Status::TakenOver)
        };
        let row = Row {
            owner,
            token,
            expires,
        };
        (Some(row), status)
    }

    /// `RENEW` (`src/coordinator/pg_one_shot.rs`; `$4` NULL, the lease's TTL): the `renewed`
    /// UPDATE matches the row only with this owner and token and live by `clock_timestamp()`,
    /// and sets the expiry to now + TTL; otherwise the `refused` branch classifies the row.
    pub fn renew(
        &self,
        row: Option<Row>,
        now: Time,
        owner: u8,
        token: Token,
    ) -> (Option<Row>, Status) {
        let Some(row) = row else {
            return (None, Status::Refused(Refusal::NoLease));
        };
        let named =
            self.is(Mutant::RenewWithoutOwnerCheck) || (row.token == token && row.owner == owner);
        if named && row.expires.is_some_and(|e| e > now) {
            let row = Row {
                expires: Some(now + self.ttl),
                ..row
            };
            return (Some(row), Status::Renewed);
        }
        // Atomic here, so the statement's last branch (`retry`: live at the snapshot, changed
        // before the lock) cannot be reached: a live lease of this owner and token renewed.
        let refusal = Self::refusal(row, owner, token).unwrap_or(if row.expires.is_none() {
            Refusal::Released
        } else {
            Refusal::Expired
        });
        (Some(row), Status::Refused(refusal))
    }

    /// `RELEASE` (`src/coordinator/pg_one_shot.rs`): the `released` UPDATE matches the row
    /// only with this owner and token and not released yet (expired or not), and clears the
    /// expiry; a released lease of this owner and token is `already_released`.
    pub fn release(&self, row: Option<Row>, owner: u8, token: Token) -> (Option<Row>, Status) {
        let Some(row) = row else {
            return (None, Status::Refused(Refusal::NoLease));
        };
        if row.token == token && row.owner == owner && row.expires.is_some() {
            let row = Row {
                expires: None,
                ..row
            };
            return (Some(row), Status::Released);
        }
        match Self::refusal(row, owner, token) {
            Some(refusal) => (Some(row), Status::Refused(refusal)),
            None => (Some(row), Status::AlreadyReleased),
        }
    }

    /// The statements' `refused` CASE, in its order, for a row of another token or owner;
    /// None when the row is the caller's lease.
    fn refusal(row: Row, owner: u8, token: Token) -> Option<Refusal> {
        if row.token > token {
            Some(Refusal::Stale)
        } else if row.token < token {
            Some(Refusal::NeverIssued)
        } else if row.owner != owner {
            Some(Refusal::WrongOwner)
        } else {
            None
        }
    }

    /// `begin_write` (`src/fenced/guard.sql`): the guard row's upsert accepts `token` iff
    /// it is not below the highest accepted, and raises the highest to it.
    pub fn guard_accepts(highest: Token, token: Token) -> bool {
        token >= highest
    }

    /// Runs `client`'s statement `op` on the server at its clock: the row it leaves, and the
    /// status it answers.
    pub fn statement(&self, server: &Server, client: u8, op: Op) -> (Option<Row>, Status) {
        let row = server.rows[usize::from(op.resource())];
        match op {
            Op::Acquire(_) => self.acquire(row, server.clock, client),
            Op::Renew(_, token) => self.renew(row, server.clock, client, token),
            Op::Release(_, token) => self.release(row, client, token),
        }
    }

    /// The event `client`'s statement `op` writes, from the row it found (`before`), its
    /// status and the row it left: the `logged` CTE of a grant, renewal or release, or the
    /// `rejected` CTE of a renew or release refused for a token once valid here (stale,
    /// expired, released). Busy acquires, conflicts and second releases write none.
    pub fn event(
        client: u8,
        op: Op,
        before: Option<Row>,
        status: Status,
        after: Option<Row>,
    ) -> Option<Event> {
        let row = |row: Option<Row>| row.expect("a lease row");
        let event = |kind, row: Row| Event {
            kind,
            owner: row.owner,
            token: row.token,
            expires: row.expires,
            previous_expires: None,
            detail: None,
        };
        let rejected = |kind, token, detail| Event {
            kind,
            owner: client,
            token,
            expires: None,
            previous_expires: None,
            detail: Some(detail),
        };
        let issued_since = || format!("token {} issued since", row(before).token);
        Some(match (status, op) {
            (Status::Acquired, _) => event("acquired", row(after)),
            (Status::Reacquired, _) => event("reacquired", row(after)),
            (Status::TakenOver, _) => Event {
                previous_expires: row(before).expires,
                ..event("taken_over", row(after))
            },
            (Status::Renewed, _) => event("renewed", row(after)),
            (Status::Released, _) => event("released", row(after)),
            (Status::Refused(Refusal::Stale), Op::Renew(_, t)) => {
                rejected("renew_rejected", t, issued_since())
            }
            (Status::Refused(Refusal::Expired), Op::Renew(_, t)) => {
                rejected("renew_rejected", t, "expired".to_owned())
            }
            (Status::Refused(Refusal::Released), Op::Renew(_, t)) => {
                rejected("renew_rejected", t, "released".to_owned())
            }
            (Status::Refused(Refusal::Stale), Op::Release(_, t)) => {
                rejected("release_rejected", t, issued_since())
            }
            _ => return None,
        })
    }
}
