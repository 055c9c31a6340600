//! The real side of the replay: the scenario's `fence` processes against the test server,
//! and what the server recorded of them.

use std::time::Duration;

use crate::common::proxy::{Mode, Proxy};
use crate::common::{self, wait_for, Store};

use super::{OWNERS, RESOURCE, TTL_MS};
use crate::model::protocol::postgres::Token;

/// What a fence process of the scenario was asked to do.
#[derive(Clone, Copy, Debug)]
pub(super) enum Call {
    Acquire,
    Renew(Token),
    Release(Token),
    Write(Token),
}

/// A fence process of the scenario and what it answered.
#[derive(Debug)]
pub(super) struct Step {
    pub(super) client: u8,
    pub(super) call: Call,
    /// The proxy cut the connection once the statement was sent: fence got no answer.
    pub(super) lost: bool,
    pub(super) code: i32,
    /// The token a grant printed.
    pub(super) token: Option<Token>,
}

/// The scenario's fence processes, run one at a time.
struct Scenario<'a> {
    store: &'a Store,
    steps: Vec<Step>,
}

impl Scenario<'_> {
    fn run(&mut self, client: u8, call: Call) -> &Step {
        self.run_via(client, call, None)
    }

    /// Runs `call` through a proxy that cuts the connection right after fence sent the
    /// statement that carries `marker` (`-- fence: release`), so that the server applies it
    /// and fence never hears back (fence sends a statement whole, Parse to Sync, in one
    /// write; the replay fails if it did not apply); waits until the server has ended that
    /// session.
    fn run_lost(&mut self, client: u8, call: Call, marker: &[u8]) -> &Step {
        let proxy = Proxy::start(
            common::pg_upstream(),
            Mode::CutWhenClientSends(marker.to_vec()),
        );
        self.run_via(client, call, Some(&common::pg_url_via(proxy.addr())));
        assert_eq!(proxy.cuts(), 1, "the proxy cut the statement's connection");
        proxy.wait_backends_gone(&self.store.url);
        self.steps.last().unwrap()
    }

    fn run_via(&mut self, client: u8, call: Call, via: Option<&str>) -> &Step {
        let owner = OWNERS[usize::from(client)];
        let fence = match via {
            Some(url) => self.store.fence_at(url),
            None => self.store.fence(),
        };
        let token = |t: Token| t.to_string();
        let args: Vec<String> = match call {
            Call::Acquire => vec!["acquire".into(), "--ttl".into(), format!("{TTL_MS}ms")],
            Call::Renew(t) => vec!["renew".into(), "--token".into(), token(t)],
            Call::Release(t) => vec!["release".into(), "--token".into(), token(t)],
            Call::Write(t) => vec![
                "write".into(),
                "--token".into(),
                token(t),
                "--target".into(),
                self.store.url.clone(),
                "--sql".into(),
                format!("INSERT INTO {}.effects VALUES ({t})", self.schema()),
            ],
        };
        let out = fence
            .args(&args)
            .args([RESOURCE, "--owner", owner, "--format", "json"])
            .run();
        let token = match (call, out.code) {
            (Call::Acquire, 0) => Some(
                Token::try_from(out.json()["token"].as_i64().expect("a grant's token"))
                    .expect("a small token"),
            ),
            _ => None,
        };
        self.steps.push(Step {
            client,
            call,
            lost: via.is_some(),
            code: out.code,
            token,
        });
        self.steps.last().unwrap()
    }

    fn schema(&self) -> String {
        self.store.schema.clone().expect("a PostgreSQL store")
    }

    /// Waits until the lease on the resource has expired by the server's clock.
    fn wait_expired(&self) {
        wait_for(
            "the lease to expire by the server's clock",
            Duration::from_secs(20),
            || self.store.lease(RESOURCE).is_some_and(|(_, _, live)| !live),
        );
    }
}

/// An event as the server recorded it: times in microseconds since the Unix epoch.
#[derive(Debug)]
pub(super) struct Recorded {
    pub(super) kind: String,
    pub(super) owner: Option<String>,
    pub(super) token: Option<i64>,
    pub(super) at: i64,
    pub(super) expires: Option<i64>,
    pub(super) previous_expires: Option<i64>,
    pub(super) detail: Option<String>,
}

/// What the server recorded of the scenario, read once it ended.
pub(super) struct Recording {
    /// The coordinator's `events` of the resource, in order.
    pub(super) events: Vec<Recorded>,
    /// The target's `write_events` of the resource, in order: (kind, token).
    pub(super) writes: Vec<(String, i64)>,
    /// The lease row: owner, token, expiry (µs since the epoch).
    pub(super) lease: (String, i64, Option<i64>),
    /// The guard row's highest token.
    pub(super) highest: i64,
}

impl Recording {
    pub(super) fn read(store: &Store) -> Recording {
        let schema = store.schema.clone().expect("a PostgreSQL store");
        let us = |column: &str| format!("(extract(epoch FROM {column}) * 1000000)::bigint");
        let events = format!(
            "SELECT kind, owner, token, {}, {}, {}, detail FROM {schema}.events \
             WHERE resource = $1 ORDER BY id",
            us("at"),
            us("expires_at"),
            us("previous_expires_at")
        );
        let writes = format!(
            "SELECT kind, token FROM {schema}.write_events WHERE resource = $1 ORDER BY id"
        );
        let lease = format!(
            "SELECT owner, token, {} FROM {schema}.leases WHERE resource = $1",
            us("expires_at")
        );
        let highest = format!("SELECT highest_token FROM {schema}.guards WHERE resource = $1");
        let lease = &store.pg_rows(&lease, RESOURCE)[0];
        Recording {
            events: store
                .pg_rows(&events, RESOURCE)
                .iter()
                .map(|row| Recorded {
                    kind: row.get(0),
                    owner: row.get(1),
                    token: row.get(2),
                    at: row.get(3),
                    expires: row.get(4),
                    previous_expires: row.get(5),
                    detail: row.get(6),
                })
                .collect(),
            writes: store
                .pg_rows(&writes, RESOURCE)
                .iter()
                .map(|row| (row.get(0), row.get(1)))
                .collect(),
            lease: (lease.get(0), lease.get(1), lease.get(2)),
            highest: store.pg_rows(&highest, RESOURCE)[0].get(0),
        }
    }
}

/// The scenario `replay`'s header describes, on a fresh schema of the test server.
pub(super) fn scenario(store: &Store) -> Vec<Step> {
    let (a, b, c) = (0, 1, 2);
    let mut run = Scenario {
        store,
        steps: Vec::new(),
    };
    let t1 = run.run(a, Call::Acquire).token.expect("a's grant");
    run.run(a, Call::Renew(t1));
    common::pg_exec(
        &store.url,
        &format!("CREATE TABLE {}.effects (token bigint)", run.schema()),
    );
    run.run(a, Call::Write(t1));
    run.wait_expired();
    // a, paused past its lease: renews late, is taken over, and goes on regardless.
    run.run(a, Call::Renew(t1));
    let t2 = run.run(b, Call::Acquire).token.expect("b takes over");
    run.run(c, Call::Acquire);
    run.run(a, Call::Renew(t1));
    run.run(a, Call::Release(t1));
    run.run(b, Call::Write(t2));
    run.run(a, Call::Write(t1));
    // Lost answers: a release sent again, a grant sent again by the same owner.
    run.run_lost(b, Call::Release(t2), b"-- fence: release");
    run.run(b, Call::Release(t2));
    run.run_lost(c, Call::Acquire, b"-- fence: acquire");
    let t3 = run.run(c, Call::Acquire).token.expect("c's grant, again");
    run.run(c, Call::Write(t3));
    run.run(c, Call::Release(t3));
    run.steps
}
