//! `fence run` and `--wait` with real processes (issue 5): exit statuses pass through, a busy
//! resource never starts the command, renewal keeps a short lease alive through a long
//! command, a lost lease takes down the command's whole process group (grandchildren too),
//! SIGINT reaches the command and the lease is released, and waiters each get one turn with
//! increasing tokens.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::process::{is_gone, read_pid};
use common::{wait_for, Store};

fn run_cmd(store: &Store, args: &[&str], script: &str, dir: &Path) -> Command {
    let mut fence = store
        .fence()
        .args(["run"])
        .args(args)
        .args(["--", "sh", "-c", script]);
    fence.cmd.current_dir(dir).stdin(Stdio::null());
    fence.cmd
}

fn kill(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
}

fn exit_statuses_pass_through(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    for (script, code) in [
        ("exit 0", 0),
        ("exit 1", 1),
        ("exit 42", 42),
        ("kill -TERM $$", 143),
        ("kill -KILL $$", 137),
    ] {
        let out = run_cmd(store, &["job"], script, dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{script}: {out:?}");
    }
    // Each run released its lease: the next one could start, and the resource is free now.
    let view = store
        .fence()
        .args(["inspect", "job", "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(view["resources"][0]["state"], "free");
    assert_eq!(view["resources"][0]["token"], 5);
}

fn the_command_sees_its_lease(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let out = run_cmd(
        store,
        &["job", "--owner", "me"],
        "echo \"$FENCE_RESOURCE|${FENCE_OWNER%/*/*}|$FENCE_TOKEN\"",
        dir.path(),
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    // The owner is `me/<pid>/<8 hex>`: unique to this run.
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "job|me|1");
}

fn busy_without_wait_never_starts_the_command(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    store
        .fence()
        .args(["acquire", "job", "--owner", "other", "--ttl", "30s"])
        .run()
        .expect(0);
    let out = run_cmd(store, &["job", "--format", "json"], "touch ran", dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        !dir.path().join("ran").exists(),
        "the command ran although the resource was busy"
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["holder"]["owner"], "other");
}

fn sigint_reaches_the_command_and_releases_the_lease(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let mut fence = run_cmd(
        store,
        &["job", "--ttl", "5s"],
        "trap 'echo interrupted > got; exit 130' INT; touch started; while :; do sleep 0.05; done",
        dir.path(),
    )
    .spawn()
    .unwrap();
    wait_for("the command to start", Duration::from_secs(10), || {
        dir.path().join("started").exists()
    });
    kill(fence.id(), libc::SIGINT);
    let status = fence.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(
        dir.path().join("got").exists(),
        "SIGINT did not reach the command"
    );
    let view = store
        .fence()
        .args(["inspect", "job", "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(
        view["resources"][0]["state"], "free",
        "the lease was released"
    );
}

fn renewal_keeps_a_short_lease_alive_through_a_long_command(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let mut fence = run_cmd(
        store,
        &["job", "--ttl", "2s", "--owner", "runner"],
        "sleep 10",
        dir.path(),
    )
    .spawn()
    .unwrap();
    // (Through `inspect`, which also answers before the runner created a store's schema.)
    wait_for(
        "the runner to hold the lease",
        Duration::from_secs(30),
        || {
            let out = store
                .fence()
                .args(["inspect", "job", "--format", "json"])
                .run();
            if out.code != 0 {
                return false;
            }
            let lease = &out.json()["resources"][0];
            lease["state"] == "held"
                && lease["owner"]
                    .as_str()
                    .is_some_and(|owner| owner.starts_with("runner/"))
        },
    );
    // The scenario: wall-clock time well past the 2 s TTL (twice it, and more) must pass
    // while the command runs; only renewals can keep the lease held that long.
    sleep(Duration::from_secs(5));
    let out = store
        .fence()
        .args(["acquire", "job", "--owner", "intruder", "--format", "json"])
        .run()
        .expect(3);
    let holder = out.json()["holder"]["owner"].as_str().unwrap().to_owned();
    assert!(holder.starts_with("runner/"), "{holder}");
    let status = fence.wait().unwrap();
    assert!(status.success(), "{status:?}");
    // The runner held its one lease throughout: one grant, then only its renewals and, once
    // the command ended, its release (the run's own record, `run_*`, changes no lease).
    let events = store.events("job");
    let runner_token = events.first().and_then(|(_, _, token)| *token);
    let changes: Vec<&(String, Option<String>, Option<i64>)> = events
        .iter()
        .filter(|(kind, _, _)| !kind.ends_with("_rejected") && !kind.starts_with("run_"))
        .collect();
    assert!(
        changes
            .first()
            .is_some_and(|(kind, _, _)| kind == "acquired")
            && changes
                .last()
                .is_some_and(|(kind, _, _)| kind == "released")
            && changes[1..changes.len() - 1]
                .iter()
                .all(|(kind, _, _)| kind == "renewed")
            && changes.iter().all(|(_, owner, token)| {
                owner.as_deref().is_some_and(|o| o.starts_with("runner/")) && *token == runner_token
            }),
        "{events:?}"
    );
    let renewals = changes
        .iter()
        .filter(|(kind, _, _)| kind == "renewed")
        .count();
    // At ttl/3 the 10 s command sees about 15 renewals; 10 leaves a third of them to a loaded
    // machine, and is still twice the 5 that 10 s needs at the least to never lapse.
    assert!(
        renewals >= 10,
        "about every ttl/3: {renewals} renewals in 10 s"
    );
}

fn a_lost_lease_kills_the_whole_process_group(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let mut fence = run_cmd(
        store,
        &[
            "job",
            "--ttl",
            "1s",
            "--kill-after",
            "1s",
            "--format",
            "json",
        ],
        // `child` first, `grandchild` last and whole (renamed into place): once it exists,
        // both pids can be read.
        "echo $$ > child; sleep 1000 & echo $! > grandchild.tmp && mv grandchild.tmp grandchild; wait",
        dir.path(),
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    wait_for("the grandchild", Duration::from_secs(10), || {
        dir.path().join("grandchild").exists()
    });
    let (child, grandchild) = (
        read_pid(&dir.path().join("child")),
        read_pid(&dir.path().join("grandchild")),
    );
    // Pause fence itself past the TTL, let another owner take over, then resume it.
    kill(fence.id(), libc::SIGSTOP);
    wait_for(
        "the stopped runner's lease to expire by the coordinator's clock",
        Duration::from_secs(30),
        || store.lease("job").is_some_and(|(_, _, live)| !live),
    );
    let taken = store
        .fence()
        .args(["acquire", "job", "--owner", "usurper", "--format", "json"])
        .run()
        .expect(0);
    let newer = taken.json()["token"].as_i64().unwrap();
    kill(fence.id(), libc::SIGCONT);
    // Resumed, fence finds its lease lost and stops the command itself: the command would
    // run for 1000 s, so its end is fence's doing (exit 5, `taken_over` below, both
    // processes gone). How soon after the SIGCONT is not asserted: the lease was already
    // another owner's while fence was stopped, and the bound is a bound for a hang.
    let status = common::wait_exit(&mut fence, Duration::from_secs(30));
    assert_eq!(status, Some(5), "lease_lost");
    wait_for(
        "the child and grandchild to be gone",
        Duration::from_secs(10),
        || is_gone(child) && is_gone(grandchild),
    );
    let mut stdout = String::new();
    std::io::Read::read_to_string(fence.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        (json["error"].as_str(), json["reason"].as_str()),
        (Some("lease_lost"), Some("taken_over")),
        "{json}"
    );
    assert_eq!(json["highest_token"], newer);
    // The usurper's lease is untouched.
    let (owner, token, live) = store.lease("job").unwrap();
    assert_eq!((owner.as_str(), token, live), ("usurper", newer, true));
}

fn ten_waiters_each_get_one_turn_in_token_order(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let script = "echo \"$FENCE_TOKEN $FENCE_OWNER\" >> turns; sleep 0.1";
    let waiters: Vec<Child> = (0..10)
        .map(|i| {
            run_cmd(
                store,
                &[
                    "job",
                    "--wait",
                    "60s",
                    "--ttl",
                    "5s",
                    "--owner",
                    &format!("w{i}"),
                ],
                script,
                dir.path(),
            )
            .spawn()
            .unwrap()
        })
        .collect();
    for mut waiter in waiters {
        assert_eq!(
            common::wait_exit(&mut waiter, Duration::from_secs(60)),
            Some(0)
        );
    }
    let turns = std::fs::read_to_string(dir.path().join("turns")).unwrap();
    let turns: Vec<(i64, String)> = turns
        .lines()
        .map(|l| {
            let (token, owner) = l.split_once(' ').unwrap();
            (token.parse().unwrap(), owner.to_owned())
        })
        .collect();
    assert_eq!(turns.len(), 10, "{turns:?}");
    assert!(
        turns.windows(2).all(|w| w[1].0 > w[0].0),
        "tokens increase turn by turn: {turns:?}"
    );
    let mut owners: Vec<&str> = turns.iter().map(|t| t.1.as_str()).collect();
    owners.sort_unstable();
    owners.dedup();
    assert_eq!(owners.len(), 10, "each waiter exactly once: {turns:?}");
}

per_backend!(
    exit_statuses_pass_through,
    the_command_sees_its_lease,
    busy_without_wait_never_starts_the_command,
    sigint_reaches_the_command_and_releases_the_lease,
    renewal_keeps_a_short_lease_alive_through_a_long_command,
    a_lost_lease_kills_the_whole_process_group,
    ten_waiters_each_get_one_turn_in_token_order,
);

/// PostgreSQL waiters queue on one session advisory lock per resource (see `wait_turn` in
/// the schema): the head holds it and LISTENs, the others block in the server.
/// `(granted, waiting)` for `resource`'s queue in `store`'s schema.
/// The owners of the rows of the resource's queue of waiters, in arrival order (dead ones
/// included until a poll deletes them).
fn pg_queue(store: &Store, resource: &str) -> Vec<String> {
    let schema = store.schema.as_deref().unwrap();
    store
        .pg_rows(
            &format!("SELECT owner FROM {schema}.waiters WHERE resource = $1 ORDER BY id"),
            resource,
        )
        .iter()
        .map(|row| row.get(0))
        .collect()
}

fn pg_waiters(store: &Store, resource: &str) -> Vec<String> {
    let view = store
        .fence()
        .args(["inspect", resource, "--format", "json"])
        .run()
        .expect(0)
        .json();
    view["resources"][0]["waiters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["owner"].as_str().unwrap().to_owned())
        .collect()
}

fn pg_hold(store: &Store, resource: &str, owner: &str) -> i64 {
    store
        .fence()
        .args(["acquire", resource, "--owner", owner, "--ttl", "60s"])
        .args(["--format", "json"])
        .run()
        .expect(0)
        .json()["token"]
        .as_i64()
        .unwrap()
}

fn pg_release(store: &Store, resource: &str, owner: &str, token: i64) {
    store
        .fence()
        .args([
            "release",
            resource,
            "--owner",
            owner,
            "--token",
            &token.to_string(),
        ])
        .run()
        .expect(0);
}

fn pg_waiter(store: &Store, resource: &str, owner: &str) -> Child {
    store
        .fence()
        .args([
            "acquire", resource, "--owner", owner, "--wait", "30s", "--ttl", "60s",
        ])
        .args(["--format", "json"])
        .cmd
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Releases `holder`'s lease on `job`, lets every waiting `fence run` finish (each appends a
/// line to `dir/turns`), and returns those lines in the order the turns were taken.
fn release_and_take_turns(
    store: &Store,
    held: i64,
    waiters: Vec<Child>,
    dir: &Path,
) -> Vec<String> {
    pg_release(store, "job", "holder", held);
    for mut waiter in waiters {
        assert_eq!(
            common::wait_exit(&mut waiter, Duration::from_secs(30)),
            Some(0)
        );
    }
    let turns = std::fs::read_to_string(dir.join("turns")).unwrap();
    turns.lines().map(str::to_owned).collect()
}

fn granted_token(child: Child, owner: &str) -> i64 {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{owner}: {out:?}");
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["owner"], owner, "{got}");
    got["token"].as_i64().unwrap()
}

/// Waiters get the lease in the order they arrived, one at a time, from the durable queue.
#[test]
fn postgres_waiters_queue_and_are_served_in_arrival_order() {
    let store = Store::postgres();
    let dir = tempfile::tempdir().unwrap();
    let held = pg_hold(&store, "job", "holder");
    let mut waiters = Vec::new();
    for i in 0..4 {
        let owner = format!("w{i}");
        waiters.push(
            run_cmd(
                &store,
                &["job", "--wait", "30s", "--owner", &owner],
                "echo \"$FENCE_TOKEN ${FENCE_OWNER%/*/*}\" >> turns",
                dir.path(),
            )
            .spawn()
            .unwrap(),
        );
        // Each waiter is in the queue before the next one starts.
        wait_for("the waiter to queue", Duration::from_secs(10), || {
            pg_queue(&store, "job").len() == i + 1
        });
    }
    let queued: Vec<String> = pg_waiters(&store, "job")
        .iter()
        .map(|owner| owner.split('/').next().unwrap().to_owned())
        .collect();
    assert_eq!(queued, ["w0", "w1", "w2", "w3"]);
    let expected: Vec<String> = (0..4).map(|i| format!("{} w{i}", held + 1 + i)).collect();
    assert_eq!(
        release_and_take_turns(&store, held, waiters, dir.path()),
        expected
    );
    // Served waiters leave no trace: no row, and the grants are in the log.
    assert!(pg_queue(&store, "job").is_empty());
    assert!(pg_waiters(&store, "job").is_empty());
    assert_eq!(store.lease("job").map(|l| l.1), Some(held + 4));
}

/// A waiter paused (SIGSTOP) at the head of the queue cannot hold the others up for longer
/// than its heartbeat bound: its row is then deleted and skipped, and the next waiter takes
/// the lease; the paused waiter, resumed, rejoins at the back and is served later with a
/// higher token.
#[test]
fn postgres_a_paused_head_waiter_does_not_hold_up_the_queue() {
    let store = Store::postgres();
    let held = pg_hold(&store, "job", "holder");
    let paused = pg_waiter(&store, "job", "paused");
    wait_for(
        "the first waiter to head the queue",
        Duration::from_secs(10),
        || pg_queue(&store, "job") == ["paused"],
    );
    kill(paused.id(), libc::SIGSTOP);
    let next = pg_waiter(&store, "job", "next");
    wait_for(
        "the second waiter to queue",
        Duration::from_secs(10),
        || pg_waiters(&store, "job").len() == 2,
    );
    let released = Instant::now();
    pg_release(&store, "job", "holder", held);
    let token = granted_token(next, "next");
    assert_eq!(token, held + 1);
    // The bound is the property: without it the second waiter would wait for as long as the
    // paused waiter stays paused, for ever here. With it, at most a promised poll (FAR_MAX,
    // 10 s) plus the grace (5 s); the rest of the margin (15 s, as long as both) is for a
    // loaded machine.
    assert!(
        released.elapsed() < Duration::from_secs(10 + 5 + 15),
        "the second waiter was held up for {:?}",
        released.elapsed()
    );
    assert_eq!(
        store.lease("job"),
        Some(("next".to_owned(), held + 1, true))
    );
    kill(paused.id(), libc::SIGCONT);
    pg_release(&store, "job", "next", token);
    assert_eq!(granted_token(paused, "paused"), held + 2);
    assert_eq!(store.lease("job").map(|l| l.1), Some(held + 2));
}

/// The row of a waiter killed outright (no chance to unregister) is hidden by `inspect` once
/// its deadline passes (its promised poll plus a grace of 5 s) and deleted by the next
/// waiter to join.
#[test]
fn postgres_the_next_waiter_removes_the_rows_of_killed_waiters() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    let held = pg_hold(&store, "job", "holder");
    let raw = |store: &Store| -> Vec<String> {
        store
            .pg_rows(
                &format!("SELECT owner FROM {schema}.waiters WHERE resource = $1 ORDER BY id"),
                "job",
            )
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    let mut killed = pg_waiter(&store, "job", "killed");
    wait_for("the waiter to register", Duration::from_secs(10), || {
        pg_waiters(&store, "job") == ["killed"]
    });
    kill(killed.id(), libc::SIGKILL);
    killed.wait().unwrap();
    // Its deadline is at most its promised next poll (FAR_MAX, 10 s, behind a long lease)
    // plus the grace (5 s) after its last poll; the margin is for a loaded machine.
    wait_for(
        "its row to pass its deadline",
        Duration::from_secs(10 + 5 + 15),
        || pg_waiters(&store, "job").is_empty(),
    );
    assert_eq!(raw(&store), ["killed"], "the row outlives its process");
    let next = pg_waiter(&store, "job", "next");
    wait_for(
        "the next waiter to register",
        Duration::from_secs(10),
        || pg_waiters(&store, "job") == ["next"],
    );
    assert_eq!(raw(&store), ["next"]);
    pg_release(&store, "job", "holder", held);
    assert_eq!(granted_token(next, "next"), held + 1);
    assert!(raw(&store).is_empty());
}

/// A short `statement_timeout` (set for the role, or in the URL's `options` as here) does not
/// disturb waiters: nothing of theirs blocks in the server, each poll is one short statement,
/// and each still gets its turn in order.
#[test]
fn postgres_waiters_survive_a_short_statement_timeout() {
    let store = Store::postgres();
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "{}{}options=-c%20statement_timeout%3D100",
        store.url,
        if store.url.contains('?') { '&' } else { '?' }
    );
    let held = pg_hold(&store, "job", "holder");
    let waiters: Vec<Child> = (0..3)
        .map(|i| {
            let mut fence = common::Fence::bare(store.home.path())
                .args([
                    "--store",
                    &url,
                    "--schema",
                    store.schema.as_deref().unwrap(),
                ])
                .args(["run", "job", "--wait", "30s", "--owner", &format!("w{i}")])
                .args(["--", "sh", "-c", "echo \"$FENCE_TOKEN\" >> turns"]);
            fence.cmd.current_dir(dir.path()).stdin(Stdio::null());
            fence.cmd.spawn().unwrap()
        })
        .collect();
    wait_for("three waiters", Duration::from_secs(10), || {
        pg_waiters(&store, "job").len() == 3
    });
    // Each poll moves its waiter's deadline: the polls the waiters make from now on.
    let schema = store.schema.clone().unwrap();
    let deadlines = || -> Vec<String> {
        store
            .pg_rows(
                &format!(
                    "SELECT deadline::text FROM {schema}.waiters WHERE resource = $1 ORDER BY id"
                ),
                "job",
            )
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    let before = deadlines();
    // The scenario: the waiters wait through many statement timeouts (100 ms each), so the
    // time must pass; then the queue is read.
    sleep(Duration::from_millis(1500));
    wait_for("a waiter to poll", Duration::from_secs(30), || {
        deadlines() != before
    });
    assert_eq!(pg_waiters(&store, "job").len(), 3, "a waiter gave up");
    let expected: Vec<String> = (1..=3).map(|i| (held + i).to_string()).collect();
    assert_eq!(
        release_and_take_turns(&store, held, waiters, dir.path()),
        expected
    );
}

/// A coordinator statement the server cancels (a `statement_timeout` it cannot meet: here the
/// free lease's row is locked by another transaction for longer) was rolled back, so fence
/// sends it again a few times, then answers exit 7 — nothing applied, safe to retry — naming
/// the cancel and the setting, not exit 1 "unexpected". The lease is as it was.
#[test]
fn postgres_a_cancelled_statement_is_retried_then_unavailable() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    let held = pg_hold(&store, "job", "holder");
    store
        .fence()
        .args([
            "release",
            "job",
            "--owner",
            "holder",
            "--token",
            &held.to_string(),
        ])
        .run()
        .expect(0);
    let lock = common::fenced::hold_in_transaction(
        &store.url,
        format!("SELECT * FROM {schema}.leases WHERE resource = 'job' FOR UPDATE"),
        "ROLLBACK",
    );
    let url = format!(
        "{}{}options=-c%20statement_timeout%3D200",
        store.url,
        if store.url.contains('?') { '&' } else { '?' }
    );
    let out = common::Fence::bare(store.home.path())
        .args(["--store", &url, "--schema", &schema])
        .args(["acquire", "job", "--owner", "other"])
        .run();
    lock.release();
    assert_eq!(out.code, 7, "{out:?}");
    assert!(out.stderr.contains("cancelled"), "{out:?}");
    assert!(out.stderr.contains("statement_timeout"), "{out:?}");
    let (owner, token, live) = store.lease("job").unwrap();
    assert_eq!((owner.as_str(), token, live), ("holder", held, false));
}
