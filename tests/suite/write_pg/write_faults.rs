//! Fenced writes to a PostgreSQL target when the network misbehaves (DESIGN §3 `write`, §5,
//! the §6 seed scenario "delay A's write in the network until B's lands → rejected").
//!
//! The real `fence` binary talks to the real test server through a loopback fault-injection
//! proxy (`common::proxy`), and every test judges the outcome on durable state read directly
//! with tokio-postgres, never through fence:
//! - a write held in the network until a newer owner has written is rejected (exit 4, I2/I6):
//!   the newer owner's row and guard token survive, and the late transaction never committed;
//! - a connection lost after COMMIT was sent is `outcome_unknown` (exit 8, never 0 or 4), with
//!   a hint to inspect, and the transaction is all-or-nothing, even with several statements;
//! - a connection lost while connecting (startup or authentication) is `unavailable` (exit 7):
//!   nothing was sent, nothing changed;
//! - a slow network alone does not stop a current token from writing.
//!
//! The proxy itself is checked against a local echo server (`proxy_*`).

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::proxy::{Mode, Proxy};
use common::{wait_for, Out, Store};

const RESOURCE: &str = "orders";

/// A target URL that reaches the test database through `proxy` (plain TCP, so the proxy can
/// see the protocol).
fn via(proxy: &Proxy) -> String {
    common::pg_url_via(proxy.addr())
}

fn schema(store: &Store) -> &str {
    store.schema.as_deref().expect("a PostgreSQL store")
}

/// Runs a script on the test database, directly.
fn exec(store: &Store, script: &str) {
    common::pg_exec(&store.url, script);
}

/// One query without parameters, directly.
fn rows(store: &Store, sql: &str) -> Vec<tokio_postgres::Row> {
    common::pg_query(&store.url, sql)
}

/// Creates `<schema>.data(id, v)` with the given rows and `<schema>.ledger(note)`, empty.
/// The store's schema holds them, so `Store`'s drop removes them too.
fn create_tables(store: &Store, data: &[(i32, &str)]) {
    let s = schema(store);
    let values: Vec<String> = data
        .iter()
        .map(|(id, v)| format!("({id}, '{v}')"))
        .collect();
    exec(
        store,
        &format!(
            "CREATE SCHEMA {s}; \
             CREATE TABLE {s}.data (id int PRIMARY KEY, v text NOT NULL); \
             CREATE TABLE {s}.ledger (note text NOT NULL); \
             INSERT INTO {s}.data VALUES {};",
            values.join(", ")
        ),
    );
}

/// `data.v` by id.
fn data(store: &Store) -> Vec<(i32, String)> {
    rows(
        store,
        &format!("SELECT id, v FROM {}.data ORDER BY id", schema(store)),
    )
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

fn ledger(store: &Store) -> Vec<String> {
    rows(
        store,
        &format!("SELECT note FROM {}.ledger ORDER BY note", schema(store)),
    )
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The target's guard row for RESOURCE: (highest_token, accepted_writes).
fn guard(store: &Store) -> Option<(i64, i64)> {
    rows(
        store,
        &format!(
            "SELECT highest_token, accepted_writes FROM {}.guards WHERE resource = '{RESOURCE}'",
            schema(store)
        ),
    )
    .first()
    .map(|r| (r.get(0), r.get(1)))
}

/// How many writes with `token` the target committed (`write_accepted` is inserted by
/// `begin_write`, inside the fenced transaction itself).
fn accepted_with(store: &Store, token: i64) -> i64 {
    rows(
        store,
        &format!(
            "SELECT count(*) FROM {}.write_events WHERE resource = '{RESOURCE}' \
             AND kind = 'write_accepted' AND token = {token}",
            schema(store)
        ),
    )[0]
    .get(0)
}

fn acquire(store: &Store, owner: &str, ttl: &str) -> i64 {
    let out = store
        .fence()
        .args([
            "acquire", RESOURCE, "--owner", owner, "--ttl", ttl, "--format", "json",
        ])
        .run()
        .expect(0);
    out.json()["token"].as_i64().expect("a token")
}

/// A acquires (`ttl`) and writes once directly (`v = 'w1'`): the target's schema exists, so
/// A's next write is one pipeline. Returns A's token.
fn acquire_and_write_once(store: &Store, ttl: &str) -> i64 {
    let t = acquire(store, "A", ttl);
    write(
        store,
        "A",
        t,
        &store.url,
        &format!("UPDATE {}.data SET v = 'w1'", schema(store)),
    )
    .run()
    .expect(0);
    t
}

fn write(store: &Store, owner: &str, token: i64, target: &str, sql: &str) -> common::Fence {
    store.fence().args([
        "write",
        RESOURCE,
        "--owner",
        owner,
        "--token",
        &token.to_string(),
        "--target",
        target,
        "--sql",
        sql,
        "--format",
        "json",
    ])
}

/// Waits for a spawned fence with a deadline (killing it after), and collects what it did.
fn finish(child: Child, limit: Duration) -> Out {
    let output = common::wait_output("fence", child, limit);
    Out::from(output)
}

/// The cut-off fence must say the outcome is unknown, and tell the user to look first.
fn assert_outcome_unknown(out: &Out) {
    assert_eq!(
        out.code, 8,
        "a write cut off after COMMIT was sent: {out:?}"
    );
    let json = out.json();
    assert_eq!(json["ok"], false, "{out:?}");
    assert_eq!(json["op"], "write", "{out:?}");
    assert_eq!(json["error"], "outcome_unknown", "{out:?}");
    assert_eq!(json["exit_code"], 8, "{out:?}");
    let advice = format!(
        "{} {}",
        json["message"].as_str().unwrap_or_default(),
        json["hint"].as_str().unwrap_or_default()
    );
    assert!(
        advice.contains("inspect"),
        "the message or hint must tell the user to inspect before retrying: {out:?}"
    );
    assert!(
        advice.contains("may or may not"),
        "the message or hint must say the write may have applied: {out:?}"
    );
}

/// The protocol bytes of a simple-query `COMMIT` (the pipelined commit) end with `COMMIT\0`;
/// plain `COMMIT` would already match the `BEGIN ISOLATION LEVEL READ COMMITTED` before it.
const COMMIT_QUERY: &[u8] = b"COMMIT\0";

#[test]
fn write_delayed_in_flight_until_a_newer_owner_wrote_is_stale() {
    let store = Store::postgres();
    create_tables(&store, &[(1, "initial")]);
    let s = schema(&store).to_owned();

    // A holds a short lease and writes once, directly: the target has accepted token t.
    let t = acquire(&store, "A", "300ms");
    write(
        &store,
        "A",
        t,
        &store.url,
        &format!("UPDATE {s}.data SET v = 'A1' WHERE id = 1"),
    )
    .run()
    .expect(0);
    assert_eq!(guard(&store), Some((t, 1)));

    // A's next write is held in the network, just before its transaction reaches the server,
    // until B has written (a gate in the proxy: no timing to outrun on a loaded machine).
    let gate = Proxy::start(
        common::pg_upstream(),
        Mode::HoldWhenClientSends(b"begin_write".to_vec()),
    );
    let mut late = write(
        &store,
        "A",
        t,
        &via(&gate),
        &format!("UPDATE {s}.data SET v = 'A' WHERE id = 1"),
    );
    late.cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = late.cmd.spawn().expect("start A's write");
    wait_for(
        "A's transaction at the gate",
        Duration::from_secs(30),
        || gate.held() == 1,
    );

    // Meanwhile A's lease expires by the coordinator's clock, B takes over and writes.
    // (The 300 ms TTL with a wide margin: a bound for a hang.)
    wait_for("A's lease to expire", Duration::from_secs(30), || {
        store.lease(RESOURCE).is_some_and(|(_, _, live)| !live)
    });
    let t2 = acquire(&store, "B", "30s");
    assert!(t2 > t, "B's token {t2} must be above A's {t}");
    write(
        &store,
        "B",
        t2,
        &store.url,
        &format!("UPDATE {s}.data SET v = 'B' WHERE id = 1"),
    )
    .run()
    .expect(0);
    let b_committed = Instant::now();
    gate.open();

    let out = finish(child, Duration::from_secs(60));
    let a_arrived = gate
        .client_sent_at(b"begin_write")
        .unwrap_or_else(|| panic!("A's transaction never reached the server: {out:?}"));
    assert!(a_arrived > b_committed, "the gate let A through early");
    assert_eq!(
        out.code, 4,
        "the late write must be rejected as stale: {out:?}"
    );
    let json = out.json();
    assert_eq!(json["ok"], false, "{out:?}");
    assert_eq!(json["error"], "stale_fencing_token", "{out:?}");
    assert_eq!(json["exit_code"], 4, "{out:?}");
    assert_eq!(json["token"], t, "{out:?}");
    assert_eq!(json["highest_token"], t2, "{out:?}");

    // Durable state: B's write stands, the guard holds B's token, A's late transaction never
    // committed (only A's first write was accepted with t).
    assert_eq!(data(&store), vec![(1, "B".to_owned())]);
    assert_eq!(guard(&store), Some((t2, 2)));
    assert_eq!(accepted_with(&store, t), 1, "A's late write committed");
    assert_eq!(accepted_with(&store, t2), 1);
}

/// A current holder writes through a connection that is cut right after the pipeline (with
/// COMMIT) reached the server.
fn cut_during_commit(sql: &str) -> (Store, Out, i64) {
    let store = Store::postgres();
    create_tables(&store, &[(1, "old"), (2, "old")]);
    let s = schema(&store).to_owned();
    let t = acquire_and_write_once(&store, "30s");
    assert_eq!(guard(&store), Some((t, 1)));

    let cut = Proxy::start(
        common::pg_upstream(),
        Mode::CutWhenClientSends(COMMIT_QUERY.to_vec()),
    );
    let out = write(&store, "A", t, &via(&cut), &sql.replace("__S__", &s)).run();
    assert_eq!(cut.cuts(), 1, "the proxy never saw COMMIT: {out:?}");
    assert!(
        cut.client_sent_at(b"begin_write").is_some(),
        "the fenced transaction never reached the server: {out:?}"
    );
    cut.wait_backends_gone(&store.url);
    (store, out, t)
}

#[test]
fn connection_cut_during_commit_is_outcome_unknown() {
    let (store, out, t) = cut_during_commit("UPDATE __S__.data SET v = 'w2' WHERE id = 1");
    assert_outcome_unknown(&out);

    // What really happened is either the whole write or nothing, and the guard agrees.
    let applied = match data(&store).as_slice() {
        [(1, v1), (2, v2)] if v1 == "w2" && v2 == "w1" => true,
        [(1, v1), (2, v2)] if v1 == "w1" && v2 == "w1" => false,
        other => panic!("neither the write nor its absence: {other:?}"),
    };
    eprintln!("cut during COMMIT: the server applied the write: {applied}; fence said {out:?}");
    let writes = if applied { 2 } else { 1 };
    assert_eq!(guard(&store), Some((t, writes)));
    assert_eq!(accepted_with(&store, t), writes);

    // Having inspected, the holder (token still current) retries directly and succeeds.
    write(
        &store,
        "A",
        t,
        &store.url,
        &format!("UPDATE {}.data SET v = 'w3' WHERE id = 1", schema(&store)),
    )
    .run()
    .expect(0);
    assert_eq!(data(&store)[0], (1, "w3".to_owned()));
}

#[test]
fn connection_cut_during_commit_of_several_statements_is_all_or_nothing() {
    let (store, out, t) = cut_during_commit(
        "UPDATE __S__.data SET v = 'm' WHERE id = 1; \
         INSERT INTO __S__.ledger VALUES ('moved'); \
         UPDATE __S__.data SET v = 'm' WHERE id = 2",
    );
    assert_outcome_unknown(&out);

    let (rows, notes) = (data(&store), ledger(&store));
    let all = rows == vec![(1, "m".to_owned()), (2, "m".to_owned())] && notes == ["moved"];
    let none = rows == vec![(1, "w1".to_owned()), (2, "w1".to_owned())] && notes.is_empty();
    assert!(all || none, "half-applied: data {rows:?}, ledger {notes:?}");
    eprintln!("cut during COMMIT of 3 statements: the server applied them: {all}");
    let writes = if all { 2 } else { 1 };
    assert_eq!(guard(&store), Some((t, writes)));
    assert_eq!(accepted_with(&store, t), writes);
}

#[test]
fn connection_cut_while_connecting_is_unavailable() {
    let store = Store::postgres();
    create_tables(&store, &[(1, "old")]);
    let s = schema(&store).to_owned();
    let t = acquire_and_write_once(&store, "30s");

    // Cut right after the startup message (`user\0fence\0…`), then right after the client
    // starts SCRAM authentication: in both cases nothing of the write was ever sent.
    for (when, pattern) in [
        ("startup", &b"user\0"[..]),
        ("authentication", &b"SCRAM-SHA-256"[..]),
    ] {
        let cut = Proxy::start(
            common::pg_upstream(),
            Mode::CutWhenClientSends(pattern.to_vec()),
        );
        let out = write(
            &store,
            "A",
            t,
            &via(&cut),
            &format!("UPDATE {s}.data SET v = 'w2'"),
        )
        .run();
        assert_eq!(cut.cuts(), 1, "no cut during {when}: {out:?}");
        assert!(
            cut.client_sent_at(b"begin_write").is_none(),
            "the write itself went out before the cut during {when}: {out:?}"
        );
        assert_eq!(
            out.code, 7,
            "a connection lost during {when}, before anything was sent, is unavailable: {out:?}"
        );
        let json = out.json();
        eprintln!("cut during {when}: fence said {out:?}");
        assert_eq!(json["error"], "unavailable", "{out:?}");
        assert_eq!(json["exit_code"], 7, "{out:?}");
        cut.wait_backends_gone(&store.url);
        assert_eq!(data(&store), vec![(1, "w1".to_owned())], "during {when}");
        assert_eq!(guard(&store), Some((t, 1)), "during {when}");
    }
}

#[test]
fn write_through_a_slow_network_still_succeeds_with_a_current_token() {
    let store = Store::postgres();
    create_tables(&store, &[(1, "old")]);
    let s = schema(&store).to_owned();
    let t = acquire(&store, "A", "30s");
    let slow = Proxy::start(
        common::pg_upstream(),
        Mode::Delay(Duration::from_millis(300)),
    );
    let started = Instant::now();
    // The first write through the slow link also creates the target's schema.
    let out = write(
        &store,
        "A",
        t,
        &via(&slow),
        &format!("UPDATE {s}.data SET v = 'slow' WHERE id = 1 RETURNING v"),
    )
    .run()
    .expect(0);
    // The premise, a lower bound (load only lengthens it): the delays were injected.
    assert!(
        started.elapsed() >= Duration::from_millis(4 * 300),
        "the proxy did not slow the write down ({:?})",
        started.elapsed()
    );
    let json = out.json();
    assert_eq!(json["ok"], true, "{out:?}");
    assert_eq!(json["token"], t, "{out:?}");
    assert_eq!(json["statements"][0]["rows"][0][0], "slow", "{out:?}");
    assert_eq!(data(&store), vec![(1, "slow".to_owned())]);
    assert_eq!(guard(&store), Some((t, 1)));
    assert_eq!(accepted_with(&store, t), 1);
}

// --- the proxy itself, against a local echo server -------------------------------------------

/// An echo server that answers each chunk with the same bytes; stops after `conns` connections.
fn echo_server(conns: usize) -> (SocketAddr, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = thread::spawn(move || {
        for stream in listener.incoming().take(conns) {
            let mut stream = stream.unwrap();
            let mut buf = [0u8; 1024];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 || stream.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    });
    (addr, handle)
}

fn connect(proxy: &Proxy) -> TcpStream {
    let stream = TcpStream::connect(proxy.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
}

fn read_exactly(stream: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    stream.read_exact(&mut buf).unwrap();
    buf
}

#[test]
fn proxy_passes_delays_in_order_holds_and_cuts() {
    let (addr, echo) = echo_server(5);

    let pass = Proxy::start(addr, Mode::Pass);
    let mut c = connect(&pass);
    c.write_all(b"hello").unwrap();
    assert_eq!(read_exactly(&mut c, 5), b"hello");
    drop(c);

    let delay = Duration::from_secs(1);
    let slow = Proxy::start(addr, Mode::Delay(delay));
    let mut c = connect(&slow);
    let sent_one = Instant::now();
    c.write_all(b"one").unwrap();
    // The scenario: two sends apart in time, so that each is held from its own send.
    thread::sleep(Duration::from_millis(100));
    let sent_two = Instant::now();
    c.write_all(b"two").unwrap();
    assert_eq!(read_exactly(&mut c, 6), b"onetwo");
    let at = |chunk: &[u8]| slow.client_sent_at(chunk).expect("forwarded");
    assert!(at(b"one") >= sent_one + delay, "`one` was not held");
    // Each chunk is held `delay` from when it was sent, not the sum of the delays: the second
    // follows the first by about the gap between the sends, far less than another `delay`
    // (the margin is the rest of the second, for a scheduler late on a loaded machine). A
    // proxy that read both sends as one chunk (it did not run for 100 ms) forwarded them
    // together, held from the first.
    if slow.forwarded().len() == 2 {
        assert!(at(b"two") >= sent_two + delay, "`two` was not held");
        assert!(
            at(b"two") < at(b"one") + delay,
            "the delays added up: {:?} between the chunks",
            at(b"two") - at(b"one")
        );
    }
    drop(c);

    let cut = Proxy::start(addr, Mode::CutWhenClientSends(b"STOP".to_vec()));
    let mut c = connect(&cut);
    c.write_all(b"ping").unwrap();
    assert_eq!(read_exactly(&mut c, 4), b"ping");
    c.write_all(b"ST").unwrap();
    assert_eq!(read_exactly(&mut c, 2), b"ST");
    c.write_all(b"OP now").unwrap();
    // The chunk completing the pattern reached the server, its echo never reaches us.
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    assert_eq!(rest, b"", "nothing may arrive after the cut");
    assert_eq!(cut.cuts(), 1);
    wait_for(
        "the cut chunk to be forwarded",
        Duration::from_secs(5),
        || cut.client_sent_at(b"OP now").is_some(),
    );
    drop(c);

    // A gate: the chunk with the pattern, and what follows, wait until the test opens it.
    let gate = Proxy::start(addr, Mode::HoldWhenClientSends(b"WAIT".to_vec()));
    let mut c = connect(&gate);
    c.write_all(b"a").unwrap();
    assert_eq!(read_exactly(&mut c, 1), b"a");
    c.write_all(b"WAIT").unwrap();
    wait_for("the chunk at the gate", Duration::from_secs(30), || {
        gate.held() == 1
    });
    c.write_all(b"b").unwrap();
    assert!(gate.client_sent_at(b"WAIT").is_none(), "the gate leaked");
    gate.open();
    assert_eq!(read_exactly(&mut c, 5), b"WAITb");
    assert_eq!(gate.held(), 0);
    drop(c);

    // Dropping a proxy with a live, idle connection returns promptly.
    let idle = Proxy::start(addr, Mode::Pass);
    let _c = connect(&idle);
    wait_for("the proxy to accept", Duration::from_secs(5), || {
        idle.connections() == 1
    });
    // (Without its stop flag and read timeouts, the drop would hang for good: the bound is
    // only there to fail instead of hanging.)
    let dropping = thread::spawn(move || drop(idle));
    wait_for("the proxy's drop", Duration::from_secs(30), || {
        dropping.is_finished()
    });
    drop((pass, slow, cut, gate));
    echo.join().unwrap();
}

/// fence paused (SIGSTOP) with its fenced transaction in flight, past the write's `--timeout`,
/// while the server commits it and the answer reaches fence's socket: once continued, fence
/// reads the answer it has and says the write committed (exit 0), not "no answer" (exit 8,
/// outcome unknown): a timeout measures the server, not fence's own pause. (A write that
/// timed out cancels and waits for the answer, which says whether the COMMIT got in first.)
/// The transaction is held at a proxy until fence is stopped, so the answer can only come
/// while fence cannot read it.
#[test]
fn an_answer_that_came_while_fence_was_paused_is_read_not_timed_out() {
    let store = Store::postgres();
    create_tables(&store, &[(1, "old")]);
    let s = schema(&store).to_owned();
    let t = acquire_and_write_once(&store, "60s");

    let gate = Proxy::start(
        common::pg_upstream(),
        Mode::HoldWhenClientSends(b"begin_write".to_vec()),
    );
    let paused = write(
        &store,
        "A",
        t,
        &via(&gate),
        &format!("UPDATE {s}.data SET v = 'w2' WHERE id = 1"),
    )
    .args(["--timeout", "3s"]);
    let child = paused.spawn();
    let pid = child.id();
    wait_for(
        "the transaction at the gate",
        Duration::from_secs(30),
        || gate.held() == 1,
    );
    // fence sent its transaction (its request timer runs from before this instant).
    let sent = Instant::now();
    common::process::stop(pid);
    gate.open();
    wait_for("the server to commit", Duration::from_secs(30), || {
        guard(&store) == Some((t, 2))
    });
    // Past the write's timeout (3 s) with a margin; the proxy relays the answer at once.
    common::process::continue_at(pid, sent + Duration::from_secs(6));

    let out = finish(child, Duration::from_secs(60));
    assert_eq!(
        out.code, 0,
        "the answer was in fence's socket when it woke: {out:?}"
    );
    assert_eq!(out.json()["ok"], true, "{out:?}");
    assert!(
        !out.stderr.contains("did not answer"),
        "the server answered; fence was paused: {out:?}"
    );
    assert_eq!(data(&store), vec![(1, "w2".to_owned())]);
    assert_eq!(accepted_with(&store, t), 2);
}
