//! Why a renew or release was refused: one classification for every coordinator. Each
//! coordinator finds the lease record (or none) under its own lock or in its own statement;
//! what that record means for the caller is decided here, once.

use crate::coordinator::LeaseRef;
use crate::error::{ConflictKind, Error, LostReason};

/// What a coordinator found where the caller's lease should be.
#[derive(Clone, Copy, Debug)]
pub struct Found<'a> {
    /// The record's token: the newest issued for the resource.
    pub token: i64,
    pub owner: &'a str,
    /// Whether it was released (else, when the caller's lease is not held, it expired).
    pub released: bool,
}

/// The refusal of a renew or release of `lease`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No record of the resource at all.
    NoLease,
    /// A newer token was issued since: the caller's lease is over, taken over.
    Stale { highest_token: i64 },
    /// The caller's token is above every token issued: it was never issued here.
    NeverIssued { highest_token: i64 },
    /// The token is the newest, but another owner holds it.
    WrongOwner { holder: String },
    /// The caller's own lease, no longer held.
    Lost(LostReason),
}

impl Refusal {
    /// Classifies the record found for a renew or release that did not go through: the
    /// caller's own token and owner on a lease no longer held is lost (released or expired).
    pub fn classify(lease: &LeaseRef, found: Option<Found<'_>>) -> Refusal {
        let Some(found) = found else {
            return Refusal::NoLease;
        };
        if found.token > lease.token {
            Refusal::Stale {
                highest_token: found.token,
            }
        } else if found.token < lease.token {
            Refusal::NeverIssued {
                highest_token: found.token,
            }
        } else if found.owner != lease.owner {
            Refusal::WrongOwner {
                holder: found.owner.to_owned(),
            }
        } else if found.released {
            Refusal::Lost(LostReason::Released)
        } else {
            Refusal::Lost(LostReason::Expired)
        }
    }

    /// The refusal a PostgreSQL statement answered with its status (`stale`, `expired`,
    /// `released`, `never_issued`, `wrong_owner`, `no_lease`); `None` for any other status.
    pub fn from_status(status: &str, highest_token: i64, holder: Option<&str>) -> Option<Refusal> {
        Some(match status {
            "stale" => Refusal::Stale { highest_token },
            "expired" => Refusal::Lost(LostReason::Expired),
            "released" => Refusal::Lost(LostReason::Released),
            "never_issued" => Refusal::NeverIssued { highest_token },
            "wrong_owner" => Refusal::WrongOwner {
                holder: holder.unwrap_or_default().to_owned(),
            },
            "no_lease" => Refusal::NoLease,
            _ => return None,
        })
    }

    /// What the `renew_rejected` / `release_rejected` event records, for a token that was
    /// once valid here (stale, expired, released); `None` for the conflicts, which are
    /// recorded as refused attempts instead.
    pub fn event_detail(&self) -> Option<String> {
        match self {
            Refusal::Stale { highest_token } => Some(format!("token {highest_token} issued since")),
            Refusal::Lost(LostReason::Released) => Some("released".to_owned()),
            // The store lost the record: no expiry or release happened, and the caller may
            // not even be its holder (the record that named the holder is gone).
            Refusal::Lost(LostReason::RecordLost) => None,
            Refusal::Lost(_) => Some("expired".to_owned()),
            _ => None,
        }
    }

    /// The error the caller gets: stale (4), lease lost (5) or conflict (6).
    pub fn into_error(self, lease: &LeaseRef) -> Error {
        let resource = lease.resource.clone();
        let token = lease.token;
        let conflict = |kind| Error::Conflict {
            resource: resource.clone(),
            token,
            kind,
        };
        match self {
            Refusal::NoLease => conflict(ConflictKind::NoLease),
            Refusal::NeverIssued { highest_token } => {
                conflict(ConflictKind::NeverIssued { highest_token })
            }
            Refusal::WrongOwner { holder } => conflict(ConflictKind::WrongOwner { holder }),
            Refusal::Stale { highest_token } => Error::Stale {
                resource,
                token,
                highest_token,
                target: None,
            },
            Refusal::Lost(reason) => Error::LeaseLost {
                resource,
                owner: lease.owner.clone(),
                token,
                reason,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(owner: &str, token: i64) -> LeaseRef {
        LeaseRef {
            resource: "r".into(),
            owner: owner.into(),
            token,
        }
    }

    fn found(token: i64, owner: &str, released: bool) -> Option<Found<'_>> {
        Some(Found {
            token,
            owner,
            released,
        })
    }

    #[test]
    fn every_refusal_is_told_apart() {
        let mine = lease("a", 5);
        assert_eq!(Refusal::classify(&mine, None), Refusal::NoLease);
        assert_eq!(
            Refusal::classify(&mine, found(6, "b", false)),
            Refusal::Stale { highest_token: 6 }
        );
        // A newer token decides before the owner: the caller's lease is over either way.
        assert_eq!(
            Refusal::classify(&mine, found(6, "a", false)),
            Refusal::Stale { highest_token: 6 }
        );
        assert_eq!(
            Refusal::classify(&mine, found(4, "a", false)),
            Refusal::NeverIssued { highest_token: 4 }
        );
        assert_eq!(
            Refusal::classify(&mine, found(5, "b", false)),
            Refusal::WrongOwner { holder: "b".into() }
        );
        assert_eq!(
            Refusal::classify(&mine, found(5, "a", true)),
            Refusal::Lost(LostReason::Released)
        );
        assert_eq!(
            Refusal::classify(&mine, found(5, "a", false)),
            Refusal::Lost(LostReason::Expired)
        );
    }

    #[test]
    fn statuses_and_errors_match_the_classification() {
        let mine = lease("a", 5);
        for (status, want) in [
            ("stale", Refusal::Stale { highest_token: 6 }),
            ("expired", Refusal::Lost(LostReason::Expired)),
            ("released", Refusal::Lost(LostReason::Released)),
            ("never_issued", Refusal::NeverIssued { highest_token: 6 }),
            ("wrong_owner", Refusal::WrongOwner { holder: "b".into() }),
            ("no_lease", Refusal::NoLease),
        ] {
            assert_eq!(Refusal::from_status(status, 6, Some("b")), Some(want));
        }
        assert_eq!(Refusal::from_status("granted", 6, None), None);
        let exit = |r: Refusal| r.into_error(&mine).exit().code();
        assert_eq!(exit(Refusal::Stale { highest_token: 6 }), 4);
        assert_eq!(exit(Refusal::Lost(LostReason::Expired)), 5);
        assert_eq!(exit(Refusal::NoLease), 6);
        assert_eq!(
            Refusal::Stale { highest_token: 6 }
                .event_detail()
                .as_deref(),
            Some("token 6 issued since")
        );
        assert_eq!(Refusal::NoLease.event_detail(), None);
    }
}
