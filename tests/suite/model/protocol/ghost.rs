//! The ghost part of the model's state: what the properties judge and no party of the
//! protocol reads (the tokens granted, the leases the server said were live, the tokens of
//! the effects the target accepted).

use super::postgres::{Time, Token, RESOURCES};

/// A lease the server said is live until `expires` (a grant, a reacquire or a renewal), by
/// its owner and token; dropped when released, or once the server's clock passes `expires`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Claim {
    pub owner: u8,
    pub token: Token,
    pub expires: Time,
}

/// What the properties judge and no party of the protocol reads (`Default`: nothing granted,
/// claimed or accepted yet, the models' first state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ghost {
    /// The highest token granted per resource (a restart cannot take it back).
    pub granted: [Token; RESOURCES],
    /// A new grant's token was not above an earlier grant's (I1 broken).
    pub reissued: bool,
    /// The live leases per resource, sorted. Two places are enough: a second live lease
    /// breaks I3 already.
    pub claims: [[Option<Claim>; 2]; RESOURCES],
    /// The highest token of an accepted effect per resource.
    pub effect: [Token; RESOURCES],
    /// An effect was accepted after a newer token's (the fencing property broken).
    pub late_effect: bool,
}

impl Ghost {
    /// Records that the server said `owner`'s lease with `token` is live until `expires`
    /// (None: released).
    pub(super) fn claim(&mut self, r: usize, owner: u8, token: Token, expires: Option<Time>) {
        let claims = &mut self.claims[r];
        let same = |c: &Option<Claim>| c.is_some_and(|c| c.owner == owner && c.token == token);
        let slot = claims
            .iter()
            .position(same)
            .or_else(|| claims.iter().position(Option::is_none));
        // No place: two other leases are live, so I3 was broken earlier on this path.
        if let Some(slot) = slot {
            claims[slot] = expires.map(|expires| Claim {
                owner,
                token,
                expires,
            });
            claims.sort();
        }
    }

    /// The server's clock reached `now`: leases that expired are no longer live.
    pub(super) fn expire(&mut self, now: Time) {
        for claims in &mut self.claims {
            for claim in claims.iter_mut() {
                if claim.is_some_and(|c| c.expires <= now) {
                    *claim = None;
                }
            }
            claims.sort();
        }
    }
}
