//! Found while measuring issue 37 (2026-12-06): a PostgreSQL acquire that waited on a lock
//! (another transaction holding the lease row, or inserting the same new resource and then
//! rolling back) was granted with the clock it read *before* the wait, so after a wait longer
//! than the TTL `fence acquire` exited 0 with a lease that had already run out, and `fence run`
//! exited 5 ("expired before it was renewed") without starting its command. Now a grant whose
//! answer came more than half a TTL after its request was sent is acquired again (the same
//! owner's live lease: same token, expiry counted from the new request); one that has run out
//! by the last of four answers is a lost lease, `arrived_late`, exit 5.
//!
//! The assertions are on the lease row: it must have been written after the gate opened, by
//! the server's clock, which no timing of the test machine can fake.

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

/// Starts `fence ARGS` (a request for `resource` with a TTL of 1 s), waits until its
/// statement waits on `gate`'s lock, keeps it waiting for longer than the TTL, then opens
/// the gate (`roll_back`: rolls the gate's transaction back instead of committing it).
/// Returns fence's output and the server's clock just before the gate opened.
fn through_gate(
    store: &Store,
    gate: RowLock,
    roll_back: bool,
    args: &[&str],
) -> (std::process::Output, i64) {
    let schema = store.schema.clone().unwrap();
    let child = store.fence().args(args).spawn();
    common::wait_for(
        "fence's acquire to wait on the gate's lock",
        Duration::from_secs(30),
        || common::lock_waiters(&store.url, &schema, "fence: acquire") == 1,
    );
    // The scenario itself, not a synchronisation: the wait must outlast the TTL.
    let waiting = Instant::now();
    std::thread::sleep(Duration::from_millis(1_300));
    assert_eq!(
        common::lock_waiters(&store.url, &schema, "fence: acquire"),
        1,
        "fence's acquire stopped waiting on the gate after {:?}: the test proves nothing",
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

/// A known resource, free, whose row another transaction holds `FOR UPDATE` for longer
/// than the TTL: the grant is reported live and was written after the lock was let go.
#[test]
fn postgres_an_acquire_that_waited_past_its_ttl_on_a_row_lock_is_live_when_reported() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    let token = common::acquire(&store, "r", "setup");
    common::release(&store, "r", "setup", token);
    let gate = RowLock::hold(&store.url, &format!("{schema}.leases"));
    let (out, opened) = through_gate(
        &store,
        gate,
        false,
        &[
            "acquire", "r", "--owner", "w", "--ttl", "1s", "--format", "json",
        ],
    );
    let out = common::Out::from(out).expect(0);
    let json = out.json();
    let (owner, held, written_us, _) = lease_row(&store, "r");
    assert_eq!((owner.as_str(), Some(held)), ("w", json["token"].as_i64()));
    assert!(
        written_us >= opened,
        "the grant was written {} ms before the lock it waited on was let go: it carries the clock read before the wait ({out:?})",
        (opened - written_us) / 1000
    );
}

/// A new resource whose row another transaction inserts, keeps uncommitted for longer than
/// the TTL, then rolls back: fence's insert went on after the wait with the clock it read
/// before it; the grant is renewed (a new token: the first had run out) before it is reported.
#[test]
fn postgres_an_acquire_that_waited_past_its_ttl_on_a_rolled_back_insert_is_live_when_reported() {
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
        &[
            "acquire", "n", "--owner", "w", "--ttl", "1s", "--format", "json",
        ],
    );
    let out = common::Out::from(out).expect(0);
    let json = out.json();
    let (owner, held, written_us, _) = lease_row(&store, "n");
    assert_eq!((owner.as_str(), Some(held)), ("w", json["token"].as_i64()));
    assert!(
        written_us >= opened,
        "the grant was written {} ms before the insert it waited on was rolled back ({out:?})",
        (opened - written_us) / 1000
    );
}

/// `fence run` behind the same lock: the command starts, under the token the row holds.
#[test]
fn postgres_a_run_whose_grant_waited_past_its_ttl_on_a_row_lock_runs_its_command() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    let token = common::acquire(&store, "job", "setup");
    common::release(&store, "job", "setup", token);
    let marker = store.home.path().join("ran");
    let script = format!("echo \"$FENCE_TOKEN\" > '{}'", marker.display());
    let gate = RowLock::hold(&store.url, &format!("{schema}.leases"));
    let (out, opened) = through_gate(
        &store,
        gate,
        false,
        &[
            "run", "job", "--owner", "w", "--ttl", "1s", "--", "sh", "-c", &script,
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
    assert!(
        events
            .iter()
            .any(|(kind, token, _)| kind == "run_started" && *token == Some(ran)),
        "no run_started event with token {ran}: {events:?}"
    );
    let (owner, held, written_us, _) = lease_row(&store, "job");
    assert!(owner.starts_with("w"), "{owner}");
    assert_eq!(held, ran);
    // Released since; the grant it ran under was written after the gate opened.
    let (_, _, granted_us) = events
        .iter()
        .rfind(|(kind, token, _)| {
            *token == Some(ran) && ["acquired", "reacquired"].contains(&kind.as_str())
        })
        .unwrap_or_else(|| panic!("no grant of token {ran}: {events:?}"));
    assert!(
        *granted_us >= opened && written_us >= opened,
        "the run's grant was written before the lock was let go: {events:?}"
    );
}

/// Every answer held back longer than the TTL (a proxy delays the server's answers once an
/// acquire was sent): the grant is asked for four times, each lease runs out before its
/// answer arrives, and fence exits 5 `arrived_late`, starting nothing. The store shows four
/// grants to that owner, the last one the token fence names, and none of them live.
#[test]
fn postgres_grants_that_always_arrive_after_their_ttl_are_a_lost_lease_not_a_success() {
    use common::proxy::{Mode, Proxy};
    let store = Store::postgres();
    common::acquire(&store, "other", "setup");
    let proxy = Proxy::start(
        common::pg_upstream(),
        Mode::DelayAnswersOnceClientSends(
            b"-- fence: acquire".to_vec(),
            Duration::from_millis(700),
        ),
    );
    let url = common::pg_url_via(proxy.addr());
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
    assert!(!live, "the lease fence gave up on is still live");
    let grants = store
        .events("late")
        .iter()
        .filter(|(kind, owner, _)| kind == "acquired" && owner.as_deref() == Some("w"))
        .count();
    assert_eq!(grants, 4, "{:?}", store.events("late"));

    // `fence run` the same way: the command never starts.
    let marker = store.home.path().join("ran");
    let out = store
        .fence_at(&url)
        .args([
            "run", "late-run", "--owner", "w", "--ttl", "300ms", "--format", "json",
        ])
        .args(["--", "touch", &marker.display().to_string()])
        .run()
        .expect(5);
    assert_eq!(out.json()["reason"], "arrived_late", "{out:?}");
    assert!(!marker.exists(), "the command ran: {out:?}");
}
