//! Refused attempts (busy acquisitions, conflicting renewals and releases, an object's
//! refused writes), as a coordinator's history records them: coalesced per resource, owner,
//! kind and minute.

use crate::error::{ConflictKind, Error};
use crate::timeline::EventKind;

/// Refused attempts are coalesced per resource, owner, kind and this long a window (a
/// count, and the first and last time), so that a busy loop cannot grow the history.
pub const ATTEMPT_MINUTE_MS: i64 = 60_000;

/// A refused attempt, as the history records it: `busy` (an acquire of a lease another
/// owner holds) or `conflict` (a renew or release of a lease the caller does not hold).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub resource: String,
    pub owner: String,
    /// `busy` or `conflict` (`write_rejected` for an object's refused write).
    pub kind: EventKind,
    /// Busy: the holder's token; conflict: the token presented.
    pub token: i64,
    pub detail: String,
}

impl Attempt {
    /// The attempt `op` by `owner` that `err` refused, when it is one the history records
    /// (stale, lost and other refusals are events of their own, or not the store's).
    pub fn of(op: &str, owner: &str, err: &Error) -> Option<Attempt> {
        let (resource, kind, token, detail) = match err {
            Error::Busy { resource, holder }
            | Error::WaitedOut {
                resource, holder, ..
            } => (
                resource,
                EventKind::Busy,
                holder.token,
                format!("held by `{}` (token {})", holder.owner, holder.token),
            ),
            Error::Conflict {
                resource,
                token,
                kind,
            } => {
                let why = match kind {
                    ConflictKind::NoLease => "no lease was ever granted".to_owned(),
                    ConflictKind::NeverIssued { highest_token } => {
                        format!("token never issued (highest {highest_token})")
                    }
                    ConflictKind::WrongOwner { holder } => {
                        format!("the lease is held by `{holder}`")
                    }
                    _ => return None,
                };
                (
                    resource,
                    EventKind::Conflict,
                    *token,
                    format!("{op} refused: {why}"),
                )
            }
            _ => return None,
        };
        Some(Attempt {
            resource: resource.clone(),
            owner: owner.to_owned(),
            kind,
            token,
            detail,
        })
    }
}
