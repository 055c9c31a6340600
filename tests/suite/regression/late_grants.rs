//! Found while measuring issue 37 (2026-12-06): a PostgreSQL acquire that waited on a lock
//! (another transaction holding the lease row, or inserting the same new resource and then
//! rolling back) was granted with the clock it read *before* the wait, so after a wait longer
//! than the TTL `fence acquire` exited 0 with a lease that had already run out, and `fence run`
//! exited 5 ("expired before it was renewed") without starting its command. Now a grant whose
//! answer came more than half a TTL after its request was sent is renewed before it is
//! reported (same token, expiry counted from the renewal's request), and one that has run out
//! by its answer is a lost lease, `arrived_late`, exit 5, naming its token.
//!
//! The assertions are on the lease row: a renewed grant must have been written after the gate
//! opened, by the server's clock, which no timing of the test machine can fake.

use crate::common;

use std::time::{Duration, Instant};

use common::{pg_query, RowLock, Store};

/// The server's clock now, in microseconds since the epoch.
fn server_now_us(store: &Store) -> i64 {
    pg_query(
        &store.url,
        "SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::int8",
    )[0]
    .get(0)
}

/// The lease row of `resource`: owner, token, when it was last granted or renewed (µs since
/// the epoch), and whether it is live by the server's clock.
fn lease_row(store: &Store, resource: &str) -> (String, i64, i64, bool) {
    let sql = format!(
        "SELECT owner, token, (extract(epoch FROM renewed_at) * 1e6)::int8, \
         coalesce(expires_at > clock_timestamp(), false) FROM {}.leases WHERE resource = $1",
        store.schema.as_ref().unwrap()
    );
    let rows = store.pg_rows(&sql, resource);
    let row = rows.first().expect("the lease row");
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

/// Makes `resource` known to the store (a lease row) and leaves it free.
fn known_and_free(store: &Store, resource: &str) {
    let token = common::acquire(store, resource, "setup");
    common::release(store, resource, "setup", token);
}

/// The kinds of `resource`'s events that name `owner`, oldest first.
fn kinds_of(store: &Store, resource: &str, owner: &str) -> Vec<String> {
    store
        .events(resource)
        .into_iter()
        .filter(|(_, by, _)| by.as_deref() == Some(owner))
        .map(|(kind, _, _)| kind)
        .collect()
}

/// fence's answer, which must be exit 0 and a grant to `w` of `resource` whose lease row is
/// live and was last written after `opened` (the server's clock when the gate opened).
fn live_after(
    store: &Store,
    resource: &str,
    out: std::process::Output,
    opened: i64,
) -> (common::Out, serde_json::Value) {
    let out = common::Out::from(out).expect(0);
    let json = out.json();
    let (owner, held, written_us, live) = lease_row(store, resource);
    assert_eq!(
        (owner.as_str(), Some(held)),
        ("w", json["token"].as_i64()),
        "{out:?}"
    );
    assert!(live, "{out:?}");
    assert!(
        written_us >= opened,
        "the lease was last written {} ms before the gate opened: it carries the clock read before the wait ({out:?})",
        (opened - written_us) / 1000
    );
    (out, json)
}

/// A proxy to the test server that, once a connection sent an acquire, holds each of the
/// server's answers on it for `delay`; and the store's URL through it. The schema exists
/// (another resource was acquired directly), so that no first-use round trips are delayed.
fn answers_delayed(store: &Store, delay: Duration) -> (common::proxy::Proxy, String) {
    use common::proxy::{Mode, Proxy};
    common::acquire(store, "other", "setup");
    let proxy = Proxy::start(
        common::pg_upstream(),
        Mode::DelayAnswersOnceClientSends(b"-- fence: acquire".to_vec(), delay),
    );
    let url = common::pg_url_via(proxy.addr());
    (proxy, url)
}

/// Starts `fence ARGS`, waits until its statement (an acquire, or a renewal when ARGS say
/// `renew`) waits on `gate`'s lock, keeps it waiting for `hold`, then opens the gate (`roll_back`: rolls the gate's transaction back
/// instead of committing it). Returns fence's output and the server's clock just before the
/// gate opened.
fn through_gate(
    store: &Store,
    gate: RowLock,
    roll_back: bool,
    hold: Duration,
    args: &[&str],
) -> (std::process::Output, i64) {
    let schema = store.schema.clone().unwrap();
    let statement = if args[0] == "renew" {
        "fence: renew"
    } else {
        "fence: acquire"
    };
    let child = store.fence().args(args).spawn();
    common::wait_for(
        "fence's statement to wait on the gate's lock",
        Duration::from_secs(30),
        || common::lock_waiters(&store.url, &schema, statement) == 1,
    );
    // The scenario itself, not a synchronisation: how long the statement waits.
    let waiting = Instant::now();
    std::thread::sleep(hold);
    assert_eq!(
        common::lock_waiters(&store.url, &schema, statement),
        1,
        "fence's statement stopped waiting on the gate after {:?}: the test proves nothing",
        waiting.elapsed()
    );
    let opened = server_now_us(store);
    if roll_back {
        gate.roll_back();
    } else {
        gate.release();
    }
    let out = common::wait_output("fence", child, Duration::from_secs(60));
    (out, opened)
}

/// The TTL of the renewal tests, and how long their acquire waits on the gate: more than half
/// the TTL, and short of it by more than a loaded machine takes to see the wait and answer.
const TTL: &str = "4s";
const HALF_AND_MORE: Duration = Duration::from_millis(2_500);

/// A known resource, free, whose row another transaction holds `FOR UPDATE` for more than
/// half the TTL: the grant is renewed before it is reported, after the lock was let go.
#[test]
fn postgres_an_acquire_that_waited_half_its_ttl_on_a_row_lock_is_renewed_when_reported() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    known_and_free(&store, "r");
    let gate = RowLock::hold(&store.url, &format!("{schema}.leases"));
    let (out, opened) = through_gate(
        &store,
        gate,
        false,
        HALF_AND_MORE,
        &[
            "acquire", "r", "--owner", "w", "--ttl", TTL, "--format", "json",
        ],
    );
    let (out, json) = live_after(&store, "r", out, opened);
    assert!(
        json["notices"].to_string().contains("renewing it"),
        "{out:?}"
    );
    assert_eq!(
        store.events("r").last().map(|(kind, _, _)| kind.clone()),
        Some("renewed".to_owned())
    );
}

/// A new resource whose row another transaction inserts, keeps uncommitted for more than
/// half the TTL, then rolls back: fence's insert went on after the wait with the clock it read
/// before it; the grant is renewed before it is reported.
#[test]
fn postgres_an_acquire_that_waited_half_its_ttl_on_a_rolled_back_insert_is_renewed_when_reported() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    // The schema exists (another resource), the resource does not.
    common::acquire(&store, "other", "setup");
    let gate = RowLock::hold_by(
        &store.url,
        &format!(
            "INSERT INTO {schema}.leases (resource, owner, token, ttl_ms, last_event) \
             VALUES ('n', 'someone', 1, 1000, 'acquired')"
        ),
    );
    let (out, opened) = through_gate(
        &store,
        gate,
        true,
        HALF_AND_MORE,
        &[
            "acquire", "n", "--owner", "w", "--ttl", TTL, "--format", "json",
        ],
    );
    let (out, json) = live_after(&store, "n", out, opened);
    assert_eq!(json["token"].as_i64(), Some(1), "{out:?}");
}

/// A wait on the row lock longer than the whole TTL: the grant came back with its lease run
/// out, so fence says so (exit 5 `arrived_late`, naming the token it was granted) instead of
/// exit 0; nothing else is granted to it.
#[test]
fn postgres_an_acquire_that_waited_past_its_ttl_on_a_row_lock_is_a_lost_lease() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    known_and_free(&store, "r");
    let gate = RowLock::hold(&store.url, &format!("{schema}.leases"));
    let (out, _) = through_gate(
        &store,
        gate,
        false,
        Duration::from_millis(1_300),
        &[
            "acquire", "r", "--owner", "w", "--ttl", "1s", "--format", "json",
        ],
    );
    let out = common::Out::from(out).expect(5);
    let json = out.json();
    assert_eq!(json["error"], "lease_lost", "{out:?}");
    assert_eq!(json["reason"], "arrived_late", "{out:?}");
    let (owner, held, _, live) = lease_row(&store, "r");
    assert_eq!((owner.as_str(), Some(held)), ("w", json["token"].as_i64()));
    assert!(!live, "the lease fence called lost is live: {out:?}");
    // One grant to it, and the renewal the store refused: it had expired.
    assert_eq!(
        kinds_of(&store, "r", "w"),
        ["acquired", "renew_rejected"],
        "{out:?}"
    );
}

/// A wait as long on a lock taken *before* the statement read its clock (the whole `leases`
/// table, locked `ACCESS EXCLUSIVE`): the answer came after the TTL, but the lease had not run
/// out, so its renewal is granted and the lease reported live (exit 0), not lost.
#[test]
fn postgres_an_acquire_that_waited_past_its_ttl_on_a_table_lock_is_renewed_not_lost() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    known_and_free(&store, "r");
    let gate = RowLock::hold_by(
        &store.url,
        &format!("LOCK TABLE {schema}.leases IN ACCESS EXCLUSIVE MODE"),
    );
    let (out, opened) = through_gate(
        &store,
        gate,
        false,
        Duration::from_millis(1_300),
        &[
            "acquire", "r", "--owner", "w", "--ttl", "1s", "--format", "json",
        ],
    );
    let (out, _) = live_after(&store, "r", out, opened);
    assert_eq!(
        kinds_of(&store, "r", "w"),
        ["acquired", "renewed"],
        "{out:?}"
    );
}

/// The directory store decides under a lock file: a grant that waited for it longer than the
/// TTL (another process holding it) counts from when the lock was taken, so it is reported
/// live, without a renewal, not lost.
#[test]
fn file_store_a_grant_that_waited_for_the_lock_file_past_its_ttl_is_live() {
    let store = Store::file();
    let first = store
        .fence()
        .acquire("r", &["--owner", "setup", "--ttl", "1s"]);
    store.fence().release(&first);
    let lock = store.dir().join("locks").join("r.lock");
    assert!(lock.exists(), "no lock file at {}", lock.display());
    // `flock` holds the lock file until the test lets it go (its stdin closes).
    let mut holder = std::process::Command::new("flock")
        .arg(&lock)
        .args(["sh", "-c", "echo held; read _"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start flock");
    let mut said = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut said,
    )
    .unwrap();
    assert_eq!(said.trim(), "held");
    let child = store
        .fence()
        .args([
            "acquire", "r", "--owner", "w", "--ttl", "1s", "--format", "json",
        ])
        .spawn();
    // The scenario itself: the grant waits for the lock longer than its TTL.
    std::thread::sleep(Duration::from_millis(1_300));
    drop(holder.stdin.take());
    holder.wait().unwrap();
    let out =
        common::Out::from(common::wait_output("fence", child, Duration::from_secs(60))).expect(0);
    let json = out.json();
    assert_eq!(json["notices"], serde_json::Value::Null, "{out:?}");
    let (owner, held, live) = store.lease("r").expect("the lease record");
    assert_eq!(
        (owner.as_str(), Some(held), live),
        ("w", json["token"].as_i64(), true)
    );
}

/// `fence run` behind the same lock for more than half its TTL: the command starts, under
/// the token the row holds, after a renewal written once the lock was let go.
#[test]
fn postgres_a_run_whose_grant_waited_half_its_ttl_on_a_row_lock_runs_its_command() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    known_and_free(&store, "job");
    let marker = store.home.path().join("ran");
    let script = format!("echo \"$FENCE_TOKEN\" > '{}'", marker.display());
    let gate = RowLock::hold(&store.url, &format!("{schema}.leases"));
    let (out, opened) = through_gate(
        &store,
        gate,
        false,
        HALF_AND_MORE,
        &[
            "run", "job", "--owner", "w", "--ttl", TTL, "--", "sh", "-c", &script,
        ],
    );
    let out = common::Out::from(out).expect(0);
    let ran: i64 = std::fs::read_to_string(&marker)
        .unwrap_or_else(|e| panic!("the command did not run ({e}): {out:?}"))
        .trim()
        .parse()
        .unwrap();
    let sql = format!(
        "SELECT kind, token, (extract(epoch FROM at) * 1e6)::int8 FROM {schema}.events \
         WHERE resource = $1 AND at IS NOT NULL ORDER BY at"
    );
    let events: Vec<(String, Option<i64>, i64)> = store
        .pg_rows(&sql, "job")
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    let started = events
        .iter()
        .position(|(kind, token, _)| kind == "run_started" && *token == Some(ran))
        .unwrap_or_else(|| panic!("no run_started event with token {ran}: {events:?}"));
    // Before the command started, its lease was renewed after the gate opened.
    assert!(
        events[..started]
            .iter()
            .any(|(kind, token, at)| kind == "renewed" && *token == Some(ran) && *at >= opened),
        "no renewal of token {ran} after the lock was let go before the run started: {events:?}"
    );
    let (owner, held, _, _) = lease_row(&store, "job");
    assert!(owner.starts_with('w'), "{owner}");
    assert_eq!(held, ran);
}

/// `fence renew` behind a row lock for more than half the TTL: the renewal is renewed again
/// once it comes (two renewals, the second written after the lock was let go); for more than
/// the whole TTL: `arrived_late`, exit 5, the lease left to run out.
#[test]
fn postgres_a_renewal_that_waited_on_a_row_lock_is_renewed_again_or_lost() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    let lease = store.fence().acquire("r", &["--owner", "w", "--ttl", "1h"]);
    let token = lease.token.to_string();
    let renew = [
        "renew", "r", "--owner", "w", "--token", &token, "--format", "json",
    ];
    let gate = RowLock::hold(&store.url, &format!("{schema}.leases"));
    let (out, opened) = through_gate(
        &store,
        gate,
        false,
        HALF_AND_MORE,
        &[&renew[..], &["--ttl", TTL]].concat(),
    );
    let out = common::Out::from(out).expect(0);
    let (_, held, written_us, live) = lease_row(&store, "r");
    assert_eq!((held, live), (lease.token, true), "{out:?}");
    assert!(written_us >= opened, "{out:?}");
    let renewals = store
        .events("r")
        .iter()
        .filter(|(kind, _, _)| kind == "renewed")
        .count();
    assert_eq!(renewals, 2, "{:?}", store.events("r"));

    let gate = RowLock::hold(&store.url, &format!("{schema}.leases"));
    let (out, _) = through_gate(
        &store,
        gate,
        false,
        Duration::from_millis(1_300),
        &[&renew[..], &["--ttl", "1s"]].concat(),
    );
    let out = common::Out::from(out).expect(5);
    let json = out.json();
    assert_eq!(json["reason"], "arrived_late", "{out:?}");
    assert_eq!(json["token"].as_i64(), Some(lease.token), "{out:?}");
    assert!(
        !lease_row(&store, "r").3,
        "the lease fence called lost is live: {out:?}"
    );
}

/// A grant whose answer the network holds for more than half the TTL, released meanwhile
/// (with its token, by someone else): the renewal fence sends on the late answer is refused
/// as released, and fence says so (exit 5, `released`), not that the store was slow.
#[test]
fn postgres_a_late_grant_released_meanwhile_is_reported_released() {
    let store = Store::postgres();
    let (_proxy, url) = answers_delayed(&store, Duration::from_millis(2_500));
    let child = store
        .fence_at(&url)
        .args([
            "acquire", "r", "--owner", "w", "--ttl", "4s", "--format", "json",
        ])
        .spawn();
    let mut token = None;
    common::wait_for("the grant to be applied", Duration::from_secs(30), || {
        token = store
            .lease("r")
            .filter(|(owner, _, live)| owner == "w" && *live)
            .map(|(_, token, _)| token);
        token.is_some()
    });
    let lease = common::Lease {
        resource: "r".into(),
        owner: "w".into(),
        token: token.unwrap(),
    };
    store.fence().release(&lease);
    let out =
        common::Out::from(common::wait_output("fence", child, Duration::from_secs(60))).expect(5);
    let json = out.json();
    assert_eq!(json["reason"], "released", "{out:?}");
    assert_eq!(json["token"].as_i64(), Some(lease.token), "{out:?}");
    assert_eq!(
        kinds_of(&store, "r", "w"),
        ["acquired", "released", "renew_rejected"],
        "{out:?}"
    );
}

/// Every answer held back longer than the TTL (a proxy delays the server's answers once an
/// acquire was sent): fence exits 5 `arrived_late`, naming the token it was granted, and
/// starts nothing; the store shows that one grant, and it is not live.
#[test]
fn postgres_grants_that_arrive_after_their_ttl_are_a_lost_lease_not_a_success() {
    let store = Store::postgres();
    let (_proxy, url) = answers_delayed(&store, Duration::from_millis(700));
    let out = store
        .fence_at(&url)
        .args([
            "acquire", "late", "--owner", "w", "--ttl", "300ms", "--format", "json",
        ])
        .run()
        .expect(5);
    let json = out.json();
    assert_eq!(json["error"], "lease_lost", "{out:?}");
    assert_eq!(json["reason"], "arrived_late", "{out:?}");
    let (owner, held, _, live) = lease_row(&store, "late");
    assert_eq!(owner, "w");
    assert_eq!(json["token"].as_i64(), Some(held), "{out:?}");
    assert!(!live, "the lease fence called lost is still live");
    // One grant, and its renewal, which reached the store after the lease had expired.
    let kinds: Vec<String> = store
        .events("late")
        .into_iter()
        .map(|(kind, _, _)| kind)
        .collect();
    assert_eq!(kinds, ["acquired", "renew_rejected"], "{out:?}");

    // `fence run` the same way: the command never starts; its metrics name the token.
    let marker = store.home.path().join("ran");
    let metrics = store.home.path().join("run.prom");
    let out = store
        .fence_at(&url)
        .args([
            "run", "late-run", "--owner", "w", "--ttl", "300ms", "--format", "json",
        ])
        .args(["--metrics-file", &metrics.display().to_string()])
        .args(["--", "touch", &marker.display().to_string()])
        .run()
        .expect(5);
    assert_eq!(out.json()["reason"], "arrived_late", "{out:?}");
    assert!(!marker.exists(), "the command ran: {out:?}");
    let (_, held, _, _) = lease_row(&store, "late-run");
    let text = std::fs::read_to_string(&metrics).unwrap();
    assert!(
        text.contains(&format!("fence_run_token{{resource=\"late-run\"}} {held}")),
        "{text}"
    );
}

/// Answers that stay late through every renewal, yet each inside the TTL: the last one leaves
/// less than a quarter of the TTL to the run's bound, too little to record the start and start
/// the command before it. `fence run` releases the lease and says it arrived late; the command
/// never starts and no start is on record. (Each answer is held 3.2 s of a 4 s TTL: counted
/// from its request, the last renewal leaves at most 0.8 s, under the quarter of 1 s, as long
/// as the statement itself takes under 0.8 s.)
#[test]
fn postgres_a_run_whose_renewals_stay_late_does_not_start_its_command() {
    let store = Store::postgres();
    let (_proxy, url) = answers_delayed(&store, Duration::from_millis(3200));
    let marker = store.home.path().join("ran");
    let out = store
        .fence_at(&url)
        .args([
            "run", "slow", "--owner", "w", "--ttl", "4s", "--format", "json", "--",
        ])
        .args(["touch", &marker.display().to_string()])
        .run()
        .expect(5);
    let json = out.json();
    assert_eq!(json["error"], "lease_lost", "{out:?}");
    assert_eq!(json["reason"], "arrived_late", "{out:?}");
    assert!(!marker.exists(), "the command ran: {out:?}");
    // `fence run --owner w` holds as `w/PID/NONCE`.
    let (owner, held, _, live) = lease_row(&store, "slow");
    assert!(owner.starts_with("w/"), "{owner}");
    assert_eq!(json["token"].as_i64(), Some(held), "{out:?}");
    assert!(!live, "the lease was left live: {out:?}");
    assert_eq!(
        kinds_of(&store, "slow", &owner),
        ["acquired", "renewed", "renewed", "renewed", "released"],
        "{out:?}"
    );
}
