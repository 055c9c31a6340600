//! fence through PgBouncer in transaction pool mode (issue 15, item 6), the pooler `tests/run`
//! starts in front of the test server (`FENCE_TEST_PGBOUNCER_URL`). Each transaction may run
//! on another server connection there, so anything that leans on session state (named
//! prepared statements, advisory locks, LISTEN) breaks or leaks; fence must not.

use crate::common;

use std::process::{Child, Stdio};
use std::time::Duration;

use common::{env_or_panic, wait_exit, Store};

const ROUNDS: usize = 3;
const WORKERS: usize = 4;

/// A store reached through PgBouncer (its schema is checked directly, bypassing the pool).
fn pooled() -> Store {
    let mut store = Store::postgres();
    store.url = env_or_panic("FENCE_TEST_PGBOUNCER_URL");
    store
}

/// The rows left in the store's waiters table, read directly (not through the pool).
fn waiter_rows(store: &Store) -> i64 {
    let schema = store.schema.as_deref().unwrap();
    common::pg_query(
        &env_or_panic("FENCE_TEST_PG_URL"),
        &format!("SELECT count(*) FROM {schema}.waiters"),
    )[0]
    .get(0)
}

#[test]
fn acquire_renew_release_and_inspect_work_through_pgbouncer() {
    let store = pooled();
    store.fence().args(["init", "-q"]).run().expect(0);
    let lease = |args: &[&str]| store.fence().args(args).args(["--format", "json"]).run();
    let a = store
        .fence()
        .acquire("job", &["--owner", "a", "--ttl", "30s"]);
    let token = a.token.to_string();
    // Many statements on one client connection, each transaction on any server connection:
    // with named prepared statements the second use of each would have failed here.
    for _ in 0..5 {
        lease(&[
            "renew", "job", "--owner", "a", "--token", &token, "--ttl", "30s",
        ])
        .expect(0);
        let busy = lease(&["acquire", "job", "--owner", "b"]).expect(3).json();
        assert_eq!(busy["holder"]["owner"], "a");
    }
    store.fence().release(&a);
    let next = store
        .fence()
        .acquire("job", &["--owner", "b", "--ttl", "30s"]);
    assert_eq!(next.token, a.token + 1);
    let view = lease(&["inspect", "job", "--history", "3"])
        .expect(0)
        .json();
    assert_eq!(view["resources"][0]["owner"], "b");
    assert_eq!(store.lease("job"), Some(("b".to_owned(), next.token, true)));
}

/// Issue 15, done-when 5: four concurrent `fence run --wait` on one resource through the
/// pool, several rounds: every run exits 0, the critical sections (each logs its start and
/// end, renewing its 1 s lease meanwhile) never overlap and carry increasing tokens, and no
/// waiter rows are left behind.
#[test]
fn concurrent_waiting_runs_through_pgbouncer_never_overlap() {
    let store = pooled();
    waiting_runs_never_overlap(&store, ROUNDS, WORKERS, "0.5");
}

/// The same with more waiters keeping their connection than listen (`fence init
/// --held-waiters 16`, issue 37): behind the pool a kept connection is a client connection,
/// its `LISTEN` is lost with the server connection, and the held waiters only poll; a dozen
/// runs still take their turns one at a time, all served, nothing left queued.
#[test]
fn held_waiters_take_their_turns_through_pgbouncer() {
    let store = pooled();
    store
        .fence()
        .args(["init", "--held-waiters", "16"])
        .run()
        .expect(0);
    waiting_runs_never_overlap(&store, 1, 12, "0.1");
}

/// `rounds` rounds of `workers` concurrent `fence run --wait` on one resource, each section
/// logging its start and end around a `sleep hold`: every run exits 0, the sections never
/// overlap and carry increasing tokens, and no waiter rows are left behind.
fn waiting_runs_never_overlap(store: &Store, rounds: usize, workers: usize, hold: &str) {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..rounds {
        let mut runs: Vec<Child> = (0..workers)
            .map(|i| {
                let mut fence = store
                    .fence()
                    .args(["run", "job", "--wait", "120s", "--ttl", "1s"])
                    .args(["--owner", &format!("r{round}w{i}"), "--", "sh", "-c"])
                    .args([format!(
                        "echo \"start $FENCE_OWNER $FENCE_TOKEN\" >> log; sleep {hold}; echo \"end $FENCE_OWNER $FENCE_TOKEN\" >> log"
                    )]);
                fence
                    .cmd
                    .current_dir(dir.path())
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped());
                fence.cmd.spawn().unwrap()
            })
            .collect();
        for run in &mut runs {
            assert_eq!(wait_exit(run, Duration::from_secs(90)), Some(0));
        }
    }
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 2 * rounds * workers, "{log}");
    let mut last_token = 0;
    for pair in lines.chunks(2) {
        let start: Vec<&str> = pair[0].split(' ').collect();
        let end: Vec<&str> = pair[1].split(' ').collect();
        assert_eq!(
            (start[0], end[0], start[1], start[2]),
            ("start", "end", end[1], end[2]),
            "overlapping critical sections:\n{log}"
        );
        let token: i64 = start[2].parse().unwrap();
        assert!(token > last_token, "tokens out of order:\n{log}");
        last_token = token;
    }
    assert_eq!(waiter_rows(store), 0);
}

/// Issue 15, done-when 5 (the write half): fenced transactions and the row form land through
/// the pool, and a stale token is refused there too.
#[test]
fn fenced_writes_land_through_pgbouncer() {
    let store = pooled();
    let url = store.url.clone();
    let table = format!("{}_t", store.schema.as_deref().unwrap());
    let direct = env_or_panic("FENCE_TEST_PG_URL");
    common::pg_exec(
        &direct,
        &format!("CREATE TABLE {table} (k int PRIMARY KEY, v int, last_fencing_token bigint)"),
    );
    let acquire = |owner: &str| {
        store
            .fence()
            .acquire("job", &["--owner", owner, "--ttl", "30s"])
    };
    let write = |token: i64, args: &[&str]| {
        store
            .fence()
            .args([
                "write",
                "job",
                "--token",
                &token.to_string(),
                "--target",
                &url,
            ])
            .args(args)
            .run()
    };
    let a = acquire("a");
    let old = a.token;
    for k in 1..=3 {
        write(
            old,
            &[
                "--sql",
                &format!("INSERT INTO {table} VALUES ({k}, {k}, {old})"),
            ],
        )
        .expect(0);
    }
    store.fence().release(&a);
    let new = acquire("b").token;
    // The transaction form advances the resource's guard, the row form the row's own token.
    write(
        new,
        &["--sql", &format!("UPDATE {table} SET v = 30 WHERE k = 3")],
    )
    .expect(0);
    write(new, &["--table", &table, "--key", "k=1", "--set", "v=10"]).expect(0);
    write(old, &["--sql", &format!("UPDATE {table} SET v = 0")]).expect(4);
    write(old, &["--table", &table, "--key", "k=1", "--set", "v=0"]).expect(4);
    let rows: Vec<(i32, i32, i64)> = common::pg_query(
        &direct,
        &format!("SELECT k, v, last_fencing_token FROM {table} ORDER BY k"),
    )
    .iter()
    .map(|row| (row.get(0), row.get(1), row.get(2)))
    .collect();
    common::pg_exec(&direct, &format!("DROP TABLE {table}"));
    assert_eq!(rows, [(1, 10, new), (2, 2, old), (3, 30, old)]);
}
