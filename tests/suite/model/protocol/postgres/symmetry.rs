//! The symmetry reduction of the exhaustive check: one state for each class of states that
//! differ only in the names of clients and resources ([`PgModel::symmetric`]).
//!
//! [`PgModel::symmetric`]: super::PgModel::symmetric

use super::{Phase, Row, State, CLIENTS, CLIENT_ORDERS, RESOURCES, RESOURCE_ORDERS};

impl Phase {
    /// This phase with resource r called `resources[r]`.
    fn renamed(self, resources: [u8; RESOURCES]) -> Phase {
        match self {
            Phase::Idle => Phase::Idle,
            Phase::Holding(r, t) => Phase::Holding(resources[usize::from(r)], t),
            Phase::Checked(r, t) => Phase::Checked(resources[usize::from(r)], t),
        }
    }
}

impl State {
    /// The least state, in `Ord`, among this one with its clients and resources renamed in
    /// every way that lists them in the order of [`State::resource_key`] and
    /// [`State::client_key`] (names only these keys cannot tell apart are tried both ways).
    /// Renaming a state renames its keys alike, so every state of a class has the same
    /// representative.
    pub(super) fn representative(&self) -> State {
        let mut least: Option<State> = None;
        let resource_keys = [self.resource_key(0), self.resource_key(1)];
        for resources in RESOURCE_ORDERS {
            // resources[r] is r's new name: the one named 0 must not have the larger key.
            let named_0 = usize::from(resources[0] != 0);
            if resource_keys[named_0] > resource_keys[1 - named_0] {
                continue;
            }
            let keys = [0, 1, 2].map(|c| self.client_key(c, resources));
            for clients in CLIENT_ORDERS {
                let mut named = [0; CLIENTS];
                for c in 0..CLIENTS {
                    named[usize::from(clients[c])] = c;
                }
                if keys[named[0]] > keys[named[1]] || keys[named[1]] > keys[named[2]] {
                    continue;
                }
                let renamed = self.renamed(clients, resources);
                if least.is_none_or(|least| renamed < least) {
                    least = Some(renamed);
                }
            }
        }
        least.expect("some order lists the keys sorted")
    }

    /// What renaming clients leaves of resource r.
    fn resource_key(&self, r: usize) -> impl Ord {
        let row = |row: Option<Row>| row.map(|row| (row.token, row.expires));
        let mut claims = self.ghost.claims[r].map(|c| c.map(|c| (c.token, c.expires)));
        claims.sort_unstable();
        (
            row(self.server.rows[r]),
            row(self.server.durable[r]),
            self.guard[r],
            self.ghost.granted[r],
            self.ghost.effect[r],
            claims,
        )
    }

    /// What client c is, with resource r called `resources[r]`: its phase, and the rows and
    /// claims that name it, in the new resources' order.
    fn client_key(&self, c: usize, resources: [u8; RESOURCES]) -> impl Ord {
        let owner = c as u8;
        let mut owns = [(false, false, 0u8); RESOURCES];
        for r in 0..RESOURCES {
            let mine = |row: Option<Row>| row.is_some_and(|row| row.owner == owner);
            let claims = self.ghost.claims[r].iter().flatten();
            owns[usize::from(resources[r])] = (
                mine(self.server.rows[r]),
                mine(self.server.durable[r]),
                claims.filter(|claim| claim.owner == owner).count() as u8,
            );
        }
        (self.clients[c].renamed(resources), owns)
    }

    /// This state with client c called `clients[c]` and resource r `resources[r]`. (Plain
    /// loops: the suite is built without optimisation, and this runs for every state
    /// generated, once or more.)
    fn renamed(&self, clients: [u8; CLIENTS], resources: [u8; RESOURCES]) -> State {
        let mut next = *self;
        for r in 0..RESOURCES {
            let to = usize::from(resources[r]);
            for (rows, from) in [
                (&mut next.server.rows, &self.server.rows),
                (&mut next.server.durable, &self.server.durable),
            ] {
                rows[to] = from[r];
                if let Some(row) = &mut rows[to] {
                    row.owner = clients[usize::from(row.owner)];
                }
            }
            next.guard[to] = self.guard[r];
            next.ghost.granted[to] = self.ghost.granted[r];
            next.ghost.effect[to] = self.ghost.effect[r];
            let claims = &mut next.ghost.claims[to];
            *claims = self.ghost.claims[r];
            for claim in claims.iter_mut().flatten() {
                claim.owner = clients[usize::from(claim.owner)];
            }
            claims.sort_unstable();
        }
        for (phase, to) in self.clients.into_iter().zip(clients) {
            next.clients[usize::from(to)] = phase.renamed(resources);
        }
        next
    }
}
