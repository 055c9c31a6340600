//! The late-answer checks (`Leases::grant_in_time`, `renew_in_time`, `still_in_time`,
//! `kept_in_time`) where `late_grants.rs` does not reach: the object-store coordinators (S3
//! through moto, GCS through fake-gcs-server), `fence renew` on them, `acquire --wait` and
//! `run --wait`, and a `fence` paused (SIGSTOP) while its grant is in flight. Written by an
//! adversarial review, which found `acquire --wait` on an object store exiting 0 with a lease
//! that ran out (and was taken over) while the waiter left its queue after the grant's check
//! (`acquire_wait_reports_no_lease_that_ran_out_while_it_left_the_queue`; mutant
//! `wait-exit-unchecked`).
//!
//! The property: fence never reports a lease as held (exit 0 from `acquire` or
//! `renew`, or `run` starting its command) when, by the store's own clock, the lease had run
//! out or belonged to someone else at that moment. Every test reads the bucket itself (the
//! lease record, its version's Last-Modified, its history), not only fence's answer.
//!
//! The faults are an HTTP proxy of the test's own rules in front of the object server
//! (`common::proxy::HttpProxy`): a request held before it reaches the server, or a request
//! the server applied at once whose answer is held back. Each hold is a gate the test opens
//! once the store's own state says the scenario is set (the record written, the lease
//! expired or taken over), never after a sleep.

use crate::common;

use std::process::Child;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::objects::{self, Server, Service};
use common::proxy::{HttpProxy, HttpRequest, Verdict};
use common::{Backend, Fence, Lease, Out, Store};

// ---------------------------------------------------------------------------------------------
// The gate: a rule of the proxy waits on it; the test opens it.
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct GateState {
    /// Requests that reached the gate.
    arrived: usize,
    open: bool,
}

#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

impl Gate {
    /// Called by the proxy's rule: counts the request, then waits until the test opens the
    /// gate (at most two minutes, so that a failed test never hangs the proxy's drop).
    fn pass(&self) {
        let mut state = self.state.lock().unwrap();
        state.arrived += 1;
        self.changed.notify_all();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while !state.open && std::time::Instant::now() < deadline {
            state = self
                .changed
                .wait_timeout(state, Duration::from_millis(50))
                .unwrap()
                .0;
        }
    }

    fn arrived(&self) -> usize {
        self.state.lock().unwrap().arrived
    }

    fn open(&self) {
        self.state.lock().unwrap().open = true;
        self.changed.notify_all();
    }
}

// ---------------------------------------------------------------------------------------------
// Which requests a rule picks.
// ---------------------------------------------------------------------------------------------

fn service_of(on: Backend) -> Service {
    match on {
        Backend::Gcs => Service::Gcs,
        _ => Service::S3,
    }
}

/// A write of a lease record (`<prefix>/leases/<resource>`): a grant, renewal or release.
fn lease_write(service: Service, request: &HttpRequest) -> bool {
    match service {
        Service::S3 => request.method == "PUT" && request.target.contains("/leases/"),
        Service::Gcs => {
            request.method == "POST"
                && request.target.contains("/upload/")
                && common::proxy::contains(&request.body, b"/leases/")
        }
    }
}

/// The deletion of a waiter's record (`<prefix>/waiters/<resource>/<id>`), as `--wait` ends
/// (S3: object_store deletes with a `POST ?delete` naming the key in its body).
fn waiter_delete(request: &HttpRequest) -> bool {
    (request.method == "DELETE" && request.target.to_ascii_lowercase().contains("waiters"))
        || (request.method == "POST"
            && request.target.ends_with("?delete")
            && common::proxy::contains(&request.body, b"/waiters/"))
}

/// The first request `pick` chooses is held before it reaches the server, until the gate
/// opens; everything else passes.
fn request_held(
    server: &Server,
    gate: &Arc<Gate>,
    pick: impl Fn(&HttpRequest) -> bool + Send + Sync + 'static,
) -> HttpProxy {
    let gate = Arc::clone(gate);
    let taken = Mutex::new(false);
    HttpProxy::start(
        server.addr(),
        Arc::new(move |request| {
            let first = pick(request) && !std::mem::replace(&mut *taken.lock().unwrap(), true);
            if first {
                gate.pass();
            }
            Verdict::Forward
        }),
    )
}

/// Every request `pick` chooses is held before it reaches the server until the gate opens.
fn requests_held(
    server: &Server,
    gate: &Arc<Gate>,
    pick: impl Fn(&HttpRequest) -> bool + Send + Sync + 'static,
) -> HttpProxy {
    let gate = Arc::clone(gate);
    HttpProxy::start(
        server.addr(),
        Arc::new(move |request| {
            if pick(request) {
                gate.pass();
            }
            Verdict::Forward
        }),
    )
}

/// The first request `pick` chooses goes to the server at once (which applies it); its
/// answer is held until the gate opens, then passed on as the server gave it.
fn answer_held(
    server: &Server,
    gate: &Arc<Gate>,
    pick: impl Fn(&HttpRequest) -> bool + Send + Sync + 'static,
) -> HttpProxy {
    let gate = Arc::clone(gate);
    let upstream = server.addr();
    let taken = Mutex::new(false);
    HttpProxy::start(
        upstream,
        Arc::new(move |request| {
            let first = pick(request) && !std::mem::replace(&mut *taken.lock().unwrap(), true);
            if !first {
                return Verdict::Forward;
            }
            let (status, headers, body) = exchange(upstream, request);
            gate.pass();
            Verdict::Reply {
                status,
                headers,
                body,
            }
        }),
    )
}

/// Sends `request` to `upstream` (one request, `Connection: close`) and reads the whole
/// answer: status, headers (without the framing ones, which the proxy writes itself), body.
fn exchange(
    upstream: std::net::SocketAddr,
    request: &HttpRequest,
) -> (u16, Vec<(String, String)>, String) {
    use std::io::{Read, Write};
    let mut server =
        std::net::TcpStream::connect_timeout(&upstream, Duration::from_secs(5)).expect("connect");
    server
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut out = format!("{} {} HTTP/1.1\r\n", request.method, request.target);
    for (name, value) in &request.headers {
        if !name.eq_ignore_ascii_case("connection") {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(&request.body);
    server.write_all(&bytes).expect("send upstream");
    let mut response = Vec::new();
    server.read_to_end(&mut response).expect("read upstream");
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let mut chunked = false;
    let mut headers = Vec::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
            continue;
        }
        if ["content-length", "connection"]
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n))
        {
            continue;
        }
        headers.push((name.to_owned(), value.to_owned()));
    }
    let mut body = response[split + 4..].to_vec();
    if chunked {
        let mut plain = Vec::new();
        let mut rest = &body[..];
        loop {
            let at = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&rest[..at])
                    .split(';')
                    .next()
                    .unwrap()
                    .trim(),
                16,
            )
            .unwrap();
            if size == 0 {
                break;
            }
            plain.extend_from_slice(&rest[at + 2..at + 2 + size]);
            rest = &rest[at + 2 + size + 2..];
        }
        body = plain;
    }
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

// ---------------------------------------------------------------------------------------------
// A store behind the gate.
// ---------------------------------------------------------------------------------------------

/// A new store on `on`'s service whose scenario requests go through a proxy with one of the
/// rules above around a gate of its own. Dropping it opens the gate before the proxy goes (the
/// proxy's drop joins the thread that waits on the gate), and the store after both.
struct Gated {
    gate: Arc<Gate>,
    proxy: HttpProxy,
    store: Store,
}

impl Gated {
    /// The store behind the proxy `hold` makes around the gate, its prefix proven through that
    /// proxy (the proof is bound to the endpoint), so that the scenario's requests are the
    /// lease's own.
    fn new(on: Backend, hold: impl FnOnce(&Server, &Arc<Gate>) -> HttpProxy) -> Gated {
        let store = Store::new(on);
        let gate = Arc::new(Gate::default());
        let proxy = hold(store.server().0, &gate);
        let gated = Gated { gate, proxy, store };
        gated.via().args(["init"]).run().expect(0);
        gated
    }

    /// The first write of a lease record goes to the server at once; its answer is held.
    fn lease_write_answer_held(on: Backend) -> Gated {
        let service = service_of(on);
        Gated::new(on, |server, gate| {
            answer_held(server, gate, move |r| lease_write(service, r))
        })
    }

    /// The first write of a lease record is held before it reaches the server.
    fn lease_write_held(on: Backend) -> Gated {
        let service = service_of(on);
        Gated::new(on, |server, gate| {
            request_held(server, gate, move |r| lease_write(service, r))
        })
    }

    /// Every deletion of a waiter's record is held before it reaches the server.
    fn waiter_deletes_held(on: Backend) -> Gated {
        Gated::new(on, |server, gate| {
            requests_held(server, gate, waiter_delete)
        })
    }

    /// `fence` on the store, its requests going through the proxy.
    fn via(&self) -> Fence {
        let var = match self.store.server().0.service {
            Service::S3 => "AWS_ENDPOINT_URL",
            Service::Gcs => "FENCE_GCS_ENDPOINT",
        };
        self.store.fence().env(var, self.proxy.endpoint())
    }

    /// Waits until a request (or its answer), `what`, is held at the gate.
    fn wait_held(&self, what: &str) {
        common::wait_for(what, Duration::from_secs(60), || self.gate.arrived() >= 1);
    }

    /// Opens the gate and waits for `child`'s outcome.
    fn let_go(&self, child: Child) -> Out {
        self.gate.open();
        outcome(child)
    }
}

impl Drop for Gated {
    fn drop(&mut self) {
        self.gate.open();
    }
}

/// What `child`, a `fence`, did (a bound of a minute for a hang).
fn outcome(child: Child) -> Out {
    Out::from(common::wait_output("fence", child, Duration::from_secs(60)))
}

// ---------------------------------------------------------------------------------------------
// The store's durable state.
// ---------------------------------------------------------------------------------------------

/// The lease record as stored, with the time of its version by the store's clock.
#[derive(Debug)]
#[allow(dead_code)] // read through Debug in the failure messages
struct Record {
    owner: String,
    token: i64,
    state: String,
    ttl_ms: i64,
    /// The Last-Modified of this version (S3: whole seconds).
    written_ms: i64,
    /// The store's clock when the record was read (a probe object's Last-Modified).
    now_ms: i64,
}

impl Record {
    /// Held, and not past its TTL by the store's clock (without the resolution fence adds).
    fn live(&self) -> bool {
        self.state == "held" && self.now_ms < self.written_ms + self.ttl_ms
    }
}

/// The lease record of `resource`, one version's body and time, and the store's clock just
/// after it was read.
fn record(store: &Store, resource: &str) -> Option<Record> {
    let (server, prefix) = store.server();
    let key = format!("{prefix}/leases/{}", objects::encode_key(resource));
    for _ in 0..10 {
        let stored = server.get(&key)?;
        let (version, written_ms) = server.stat(&key)?;
        if stored.version.as_deref() != Some(version.as_str()) {
            continue;
        }
        let body: serde_json::Value = serde_json::from_slice(&stored.body).unwrap();
        return Some(Record {
            owner: body["owner"].as_str().unwrap().to_owned(),
            token: body["token"].as_i64().unwrap(),
            state: body["state"].as_str().unwrap().to_owned(),
            ttl_ms: body["ttl_ms"].as_i64().unwrap(),
            written_ms,
            now_ms: store_now_ms(store),
        });
    }
    panic!("the lease record of `{resource}` kept changing while it was read");
}

/// The store's clock now: the Last-Modified of a scratch object the test writes.
fn store_now_ms(store: &Store) -> i64 {
    let (server, prefix) = store.server();
    let key = format!("{prefix}/review-clock");
    server.put(&key, b"now");
    server.stat(&key).expect("the clock object").1
}

/// Waits until `resource`'s record is `owner`'s.
fn wait_owned_by(store: &Store, resource: &str, owner: &str) {
    common::wait_for(
        &format!("`{resource}` to be written for `{owner}`"),
        Duration::from_secs(60),
        || record(store, resource).is_some_and(|r| r.owner.starts_with(owner) && r.state == "held"),
    );
}

/// Waits until `resource`'s lease is over by the store's clock, resolution included (fence's
/// `inspect`, through no proxy, shows it expired), and the record agrees.
fn wait_run_out(store: &Store, resource: &str) {
    store.wait_expired(resource);
    let now = record(store, resource).unwrap();
    assert!(!now.live(), "inspect says expired, the record not: {now:?}");
}

/// The kinds of `resource`'s events, with their owners' first word, oldest first.
fn kinds(store: &Store, resource: &str) -> Vec<String> {
    store
        .events(resource)
        .into_iter()
        .map(|(kind, owner, token)| {
            let owner = owner.unwrap_or_default();
            let owner = owner.split('/').next().unwrap_or_default().to_owned();
            format!("{kind}:{owner}:{}", token.unwrap_or_default())
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// acquire --wait / run --wait: the waiter's record is deleted after the late check.
// ---------------------------------------------------------------------------------------------

/// The shape of both: `fence ARGS` (owner `w`, a 2 s TTL, `--wait`; through the proxy of
/// `waiter_deletes_held`) queues behind `h`'s live lease on `r`, and is let in by the release
/// of `h`'s lease once the waiter's record is on the store. Once the waiter's grant is written
/// and the deletion of its waiter record (sent after the grant was checked for lateness) is
/// held at the gate, the lease runs out by the store's clock and `x` takes it over. Returns
/// (the gate still closed) the waiter, w's grant as the record showed it, and x's lease.
fn waiter_outlived_by_its_lease(g: &Gated, args: &[&str]) -> (Child, Record, Lease) {
    let store = &g.store;
    let holder = store.fence().acquire("r", &["--owner", "h", "--ttl", "1h"]);
    let child = g.via().args(args).spawn();
    let (server, prefix) = store.server();
    let waiters = format!("{prefix}/waiters/{}", objects::encode_key("r"));
    common::wait_for("the waiter's record", Duration::from_secs(60), || {
        !server.list(&waiters).is_empty()
    });
    store.fence().release(&holder);
    wait_owned_by(store, "r", "w");
    assert!(
        common::process::becomes(Duration::from_secs(60), || g.gate.arrived() >= 1),
        "the deletion of the waiter's record never came; the proxy saw {:#?}",
        g.proxy.seen()
    );
    let granted = record(store, "r").unwrap();
    wait_run_out(store, "r");
    let next = store.fence().acquire("r", &["--owner", "x", "--ttl", "1h"]);
    (child, granted, next)
}

/// `fence acquire --wait` is granted; the request that deletes its waiter record is held until
/// the lease ran out by the store's clock and another owner took it over. fence must not then
/// exit 0 with the old token.
fn acquire_wait_reports_no_lease_that_ran_out_while_it_left_the_queue(on: Backend) {
    let g = Gated::waiter_deletes_held(on);
    let (child, granted, next) = waiter_outlived_by_its_lease(
        &g,
        &[
            "acquire", "r", "--owner", "w", "--ttl", "2s", "--wait", "60s", "--format", "json",
        ],
    );
    let now = record(&g.store, "r").unwrap();
    assert_eq!((now.owner.as_str(), now.token), ("x", next.token));
    let out = g.let_go(child);
    assert_ne!(
        out.code,
        0,
        "fence reported token {} held, yet by the store's clock it had run out and `x` held token {} when fence answered\n\
         fence: {out:?}\nw's grant: {granted:?}\nnow: {now:?}\nevents: {:?}",
        granted.token,
        next.token,
        kinds(&g.store, "r")
    );
    assert_eq!(out.code, 5, "{out:?}");
    assert_eq!(out.json()["error"], "lease_lost", "{out:?}");
}

/// `fence run --wait` the same way: its bound counts from the grant's request, so the time
/// spent deleting the waiter record leaves it too little to start the command; it must not.
fn run_wait_starts_nothing_when_leaving_the_queue_outlived_the_lease(on: Backend) {
    let g = Gated::waiter_deletes_held(on);
    let marker = g.store.home.path().join("ran");
    let script = format!("echo \"$FENCE_TOKEN\" > '{}'", marker.display());
    let (child, granted, next) = waiter_outlived_by_its_lease(
        &g,
        &[
            "run", "r", "--owner", "w", "--ttl", "2s", "--wait", "60s", "--format", "json", "--",
            "sh", "-c", &script,
        ],
    );
    let out = g.let_go(child);
    assert!(
        !marker.exists(),
        "the command ran under token {} after `x` took the lease over with token {}: {out:?}",
        granted.token,
        next.token
    );
    assert_eq!(out.code, 5, "{out:?}");
    assert_eq!(out.json()["error"], "lease_lost", "{out:?}");
    // Nothing was stopped: the hint must not say the command was.
    let hint = out.json()["hint"].as_str().unwrap_or_default().to_owned();
    assert!(hint.starts_with("the command was not started"), "{hint}");
    let now = record(&g.store, "r").unwrap();
    assert_eq!(
        (now.owner.as_str(), now.token),
        ("x", next.token),
        "{now:?}"
    );
    let events = kinds(&g.store, "r");
    assert!(
        !events.iter().any(|e| e.starts_with("run_started")),
        "{events:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// acquire / renew whose answer is held: applied at once, heard of after the lease ran out.
// ---------------------------------------------------------------------------------------------

/// The shape of the two `acquire` scenarios: `w`'s `acquire` of `r` (a 2 s TTL) is applied at
/// once and its answer held. Returns (the gate still closed) the `acquire` once w's grant is
/// on the store and has run out by the store's clock.
fn an_acquire_answered_after_its_ttl(on: Backend) -> (Gated, Child) {
    let g = Gated::lease_write_answer_held(on);
    let child = g
        .via()
        .args([
            "acquire", "r", "--owner", "w", "--ttl", "2s", "--format", "json",
        ])
        .spawn();
    g.wait_held("the grant's answer to be held");
    wait_owned_by(&g.store, "r", "w");
    wait_run_out(&g.store, "r");
    (g, child)
}

/// `fence acquire`: the grant is applied; its answer is held until the lease ran out by the
/// store's clock. Exit 5 `arrived_late`, naming the token the record holds; the record not
/// live, and only a refused renewal of w's after the grant.
fn an_acquire_answered_after_its_lease_ran_out_is_lost(on: Backend) {
    let (g, child) = an_acquire_answered_after_its_ttl(on);
    let out = g.let_go(child);
    let now = record(&g.store, "r").unwrap();
    assert_eq!(out.code, 5, "{out:?}\n{now:?}\n{:?}", kinds(&g.store, "r"));
    let json = out.json();
    assert_eq!(json["reason"], "arrived_late", "{out:?}");
    assert_eq!(json["token"].as_i64(), Some(now.token), "{out:?}");
    assert!(!now.live(), "{now:?}");
    assert_eq!(
        kinds(&g.store, "r"),
        [
            format!("acquired:w:{}", now.token),
            format!("renew_rejected:w:{}", now.token)
        ]
    );
}

/// The same, and another owner took the lease over before the answer came: exit 5, the
/// lease taken over (not a success), and the record is the other owner's.
fn an_acquire_answered_after_a_takeover_is_lost(on: Backend) {
    let (g, child) = an_acquire_answered_after_its_ttl(on);
    let next = g
        .store
        .fence()
        .acquire("r", &["--owner", "x", "--ttl", "1h"]);
    let out = g.let_go(child);
    let now = record(&g.store, "r").unwrap();
    assert_eq!(out.code, 5, "{out:?}\n{now:?}\n{:?}", kinds(&g.store, "r"));
    assert_eq!(out.json()["error"], "lease_lost", "{out:?}");
    assert_eq!(json_token(&out), Some(next.token - 1), "{out:?}");
    assert_eq!((now.owner.as_str(), now.token), ("x", next.token));
}

fn json_token(out: &Out) -> Option<i64> {
    out.json()["token"].as_i64()
}

/// The shape of the two `renew` scenarios: `w` holds `r` (an hour, granted past the proxy);
/// its `renew` with `ttl` goes through the proxy, is applied at once and its answer held.
/// Returns (the gate still closed) w's lease and the `renew`, once its answer is held.
fn a_renewal_answer_held(on: Backend, ttl: &str) -> (Gated, Lease, Child) {
    let g = Gated::lease_write_answer_held(on);
    let lease = g
        .store
        .fence()
        .acquire("r", &["--owner", "w", "--ttl", "1h"]);
    let token = lease.token.to_string();
    let child = g
        .via()
        .args([
            "renew", "r", "--owner", "w", "--token", &token, "--ttl", ttl,
        ])
        .args(["--format", "json"])
        .spawn();
    g.wait_held("the renewal's answer to be held");
    (g, lease, child)
}

/// `fence renew`: the renewal is applied, its answer held until the lease ran out by the
/// store's clock: exit 5 `arrived_late`; the record not live, its last change w's renewal
/// and the refused one after it.
fn a_renewal_answered_after_its_lease_ran_out_is_lost(on: Backend) {
    let (g, lease, child) = a_renewal_answer_held(on, "2s");
    wait_run_out(&g.store, "r");
    let out = g.let_go(child);
    let now = record(&g.store, "r").unwrap();
    assert_eq!(out.code, 5, "{out:?}\n{now:?}\n{:?}", kinds(&g.store, "r"));
    let json = out.json();
    assert_eq!(json["reason"], "arrived_late", "{out:?}");
    assert_eq!(json["token"].as_i64(), Some(lease.token), "{out:?}");
    assert!(!now.live(), "{now:?}");
    let t = lease.token;
    assert_eq!(
        kinds(&g.store, "r"),
        [
            format!("acquired:w:{t}"),
            format!("renewed:w:{t}"),
            format!("renew_rejected:w:{t}")
        ]
    );
}

/// `fence renew` whose answer is held more than half its TTL but less than all of it: the
/// lease is renewed again before it is reported (exit 0 with a notice), and that second
/// renewal was written after the answer was let go, by the store's clock.
fn a_renewal_answered_past_half_its_ttl_is_renewed_again(on: Backend) {
    let (g, lease, child) = a_renewal_answer_held(on, "8s");
    // The scenario itself, not a synchronisation: how long the answer is held (over half
    // the TTL of 8 s, well short of all of it).
    std::thread::sleep(Duration::from_millis(4_800));
    let opened = store_now_ms(&g.store);
    let held = record(&g.store, "r").unwrap();
    assert!(held.live(), "the renewal ran out while held: {held:?}");
    let out = g.let_go(child).expect(0);
    let json = out.json();
    assert!(
        json["notices"].to_string().contains("renewing it"),
        "{out:?}"
    );
    let now = record(&g.store, "r").unwrap();
    assert!(now.live(), "{now:?}");
    // S3 stamps whole seconds (rounded down): the renewal is in the second the gate opened or
    // later.
    let resolution = if service_of(on) == Service::S3 {
        1_000
    } else {
        0
    };
    assert!(
        now.written_ms + resolution >= opened,
        "the lease was last written {} ms before the answer was let go: {now:?} {out:?}",
        opened - now.written_ms
    );
    let t = lease.token;
    assert_eq!(
        kinds(&g.store, "r"),
        [
            format!("acquired:w:{t}"),
            format!("renewed:w:{t}"),
            format!("renewed:w:{t}")
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// A fence paused (SIGSTOP) while its grant is in flight.
// ---------------------------------------------------------------------------------------------

/// The grant's put is held at the proxy; fence is stopped; the put goes through (the store
/// writes the lease and answers a stopped process); the lease runs out by the store's clock
/// (and, with `takeover`, another owner takes it); then fence is continued. It must say the
/// lease is lost, exit 5.
fn a_fence_paused_while_its_grant_was_in_flight(on: Backend, takeover: bool) {
    let g = Gated::lease_write_held(on);
    let store = &g.store;
    let child = g
        .via()
        .args([
            "acquire", "r", "--owner", "w", "--ttl", "2s", "--format", "json",
        ])
        .spawn();
    let pid = child.id();
    let _reap = common::process::Reap(vec![pid]);
    g.wait_held("the grant's put to be held");
    common::process::stop(pid);
    g.gate.open();
    wait_owned_by(store, "r", "w");
    let granted = record(store, "r").unwrap();
    wait_run_out(store, "r");
    let next = takeover.then(|| store.fence().acquire("r", &["--owner", "x", "--ttl", "1h"]));
    common::process::continue_at(pid, std::time::Instant::now());
    let out = outcome(child);
    let now = record(store, "r").unwrap();
    assert_eq!(
        out.code,
        5,
        "{out:?}\ngranted: {granted:?}\nnow: {now:?}\n{:?}",
        kinds(store, "r")
    );
    let json = out.json();
    assert_eq!(json["error"], "lease_lost", "{out:?}");
    assert_eq!(json["token"].as_i64(), Some(granted.token), "{out:?}");
    match next {
        Some(next) => assert_eq!((now.owner.as_str(), now.token), ("x", next.token)),
        None => {
            assert_eq!(json["reason"], "arrived_late", "{out:?}");
            assert!(!now.live(), "{now:?}");
        }
    }
}

fn a_fence_paused_while_its_grant_was_in_flight_says_it_ran_out(on: Backend) {
    a_fence_paused_while_its_grant_was_in_flight(on, false)
}

fn a_fence_paused_while_its_grant_was_in_flight_says_it_was_taken(on: Backend) {
    a_fence_paused_while_its_grant_was_in_flight(on, true)
}

crate::per_service!(
    acquire_wait_reports_no_lease_that_ran_out_while_it_left_the_queue,
    run_wait_starts_nothing_when_leaving_the_queue_outlived_the_lease,
    an_acquire_answered_after_its_lease_ran_out_is_lost,
    an_acquire_answered_after_a_takeover_is_lost,
    a_renewal_answered_after_its_lease_ran_out_is_lost,
    a_renewal_answered_past_half_its_ttl_is_renewed_again,
    a_fence_paused_while_its_grant_was_in_flight_says_it_ran_out,
    a_fence_paused_while_its_grant_was_in_flight_says_it_was_taken,
);

// ---------------------------------------------------------------------------------------------
// PostgreSQL: a queued waiter (`--wait`) whose granting poll is answered late.
// ---------------------------------------------------------------------------------------------

/// `fence ARGS` waits (through a proxy that, once the waiter's first poll of the queue was
/// sent, holds every answer of its connection for `delay`) behind `h`'s lease on `r`, which
/// is released once the waiter is queued. Returns fence's output.
fn pg_waiter_answered_late(store: &Store, delay: Duration, args: &[&str]) -> Out {
    use common::proxy::{Mode, Proxy};
    let holder = store.fence().acquire("r", &["--owner", "h", "--ttl", "1h"]);
    let proxy = Proxy::start(
        common::pg_upstream(),
        Mode::DelayAnswersOnceClientSends(b"wait_poll".to_vec(), delay),
    );
    let url = common::pg_url_via(proxy.addr());
    let child = store.fence_at(&url).args(args).spawn();
    let sql = format!(
        "SELECT count(*) FROM {}.waiters WHERE resource = $1",
        store.schema.as_ref().unwrap()
    );
    common::wait_for("the waiter to be queued", Duration::from_secs(60), || {
        store.pg_rows(&sql, "r")[0].get::<_, i64>(0) == 1
    });
    store.fence().release(&holder);
    Out::from(common::wait_output("fence", child, Duration::from_secs(60)))
}

/// The kinds of `r`'s events by owners starting with `w`, oldest first.
fn pg_kinds_of_w(store: &Store) -> Vec<String> {
    store
        .events("r")
        .into_iter()
        .filter(|(_, by, _)| by.as_deref().is_some_and(|o| o.starts_with('w')))
        .map(|(kind, _, _)| kind)
        .collect()
}

/// `fence acquire --wait` on PostgreSQL whose granting poll (and every answer after it) comes
/// back after the TTL: exit 5 `arrived_late`, the row not live, w's grant and its refused
/// renewal on record.
#[test]
fn postgres_a_waiter_whose_granting_poll_came_after_its_ttl_is_a_lost_lease() {
    let store = Store::postgres();
    let out = pg_waiter_answered_late(
        &store,
        Duration::from_millis(1_500),
        &[
            "acquire", "r", "--owner", "w", "--ttl", "1s", "--wait", "60s", "--format", "json",
        ],
    );
    let row = store.lease("r").unwrap();
    assert_eq!(out.code, 5, "{out:?}\n{row:?}\n{:?}", store.events("r"));
    let json = out.json();
    assert_eq!(json["reason"], "arrived_late", "{out:?}");
    assert_eq!((row.0.as_str(), Some(row.1)), ("w", json["token"].as_i64()));
    assert!(!row.2, "the lease fence called lost is live: {out:?}");
    assert_eq!(
        pg_kinds_of_w(&store),
        ["acquired", "renew_rejected"],
        "{out:?}"
    );
}

/// `fence run --wait` the same way: the command never starts.
#[test]
fn postgres_a_run_whose_granting_poll_came_after_its_ttl_starts_nothing() {
    let store = Store::postgres();
    let marker = store.home.path().join("ran");
    let out = pg_waiter_answered_late(
        &store,
        Duration::from_millis(1_500),
        &[
            "run",
            "r",
            "--owner",
            "w",
            "--ttl",
            "1s",
            "--wait",
            "60s",
            "--format",
            "json",
            "--",
            "touch",
            &marker.display().to_string(),
        ],
    );
    assert!(!marker.exists(), "the command ran: {out:?}");
    assert_eq!(out.code, 5, "{out:?}\n{:?}", store.events("r"));
    assert_eq!(out.json()["reason"], "arrived_late", "{out:?}");
    let (owner, _, live) = store.lease("r").unwrap();
    assert!(owner.starts_with("w/"), "{owner}");
    assert!(!live, "the lease was left live: {out:?}");
    assert!(
        !pg_kinds_of_w(&store).iter().any(|k| k == "run_started"),
        "{:?}",
        store.events("r")
    );
}
