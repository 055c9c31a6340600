//! What `fence run` did with its command is on record (issue 35, item 3): `run_started` (run
//! id, fence's pid and host, the command's program (and, for a run with an id, the digest of
//! its arguments), its process group),
//! `run_finished` (exit status, how long it ran) and `run_stopped` (the signal, why, how long
//! after the lease's bound it ended) are in the store's history, between the grant and the
//! release, on every coordinator; `fence log R` and `fence inspect R` show them. The record
//! is best effort: a store that cannot take it changes no exit status. A run stopped for a
//! lost lease tells cron what to do (nothing by hand; `fence log R`).

use crate::common;

use std::time::Duration;

use common::process::kill;
use common::{wait_for, wait_output, Store};
use serde_json::Value;

/// `fence log job --format json`'s events, oldest first.
fn logged(store: &Store) -> Vec<Value> {
    store
        .fence()
        .args(["log", "job", "--format", "json"])
        .run()
        .expect(0)
        .json()["events"]
        .as_array()
        .unwrap()
        .clone()
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .filter(|e| e["derived"] != true)
        .map(|e| e["kind"].as_str().unwrap())
        .collect()
}

fn one<'a>(events: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = events.iter().filter(|e| e["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one `{kind}` event: {events:#?}");
    found[0]
}

/// The durable history (read from the store itself) has the run's events, with the run's
/// owner and token, between its grant and its release.
fn durable_kinds(store: &Store) -> Vec<String> {
    store
        .events("job")
        .into_iter()
        .map(|(kind, _, _)| kind)
        .collect()
}

fn a_run_is_on_record(store: &Store) {
    let out = store
        .fence()
        .args(["run", "job", "--format", "json", "--id", "nightly-1"])
        .args(["--", "sh", "-c", "exit 3"])
        .run()
        .expect(3);
    let answer = out.json();
    let events = logged(store);
    assert_eq!(
        kinds(&events),
        ["acquired", "run_started", "run_finished", "released"],
        "{events:#?}"
    );
    assert_eq!(
        durable_kinds(store),
        ["acquired", "run_started", "run_finished", "released"]
    );
    let started = one(&events, "run_started");
    assert_eq!(started["owner"], answer["owner"], "{started}");
    assert_eq!(started["token"], answer["token"], "{started}");
    let run = &started["run"];
    assert_eq!(run["run_id"], answer["run_id"], "{started}");
    assert_eq!(run["program"], "sh", "{started}");
    assert!(run["pid"].as_u64().is_some_and(|pid| pid > 1), "{started}");
    assert!(run["group"].as_u64().is_some(), "{started}");
    assert!(
        run["host"].as_str().is_some_and(|h| !h.is_empty()),
        "{started}"
    );
    // A run with an id: the digest its completion record keeps anyway.
    let digest = run["command"].as_str().unwrap();
    assert!(
        digest.len() == 16 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "{started}"
    );
    let detail = started["detail"].as_str().unwrap();
    assert!(
        detail.contains(answer["run_id"].as_str().unwrap()) && detail.contains("sh"),
        "the detail is a sentence, not JSON: {detail}"
    );
    let finished = one(&events, "run_finished");
    assert_eq!(finished["run"]["exit_status"], 3, "{finished}");
    assert!(
        finished["run"]["duration_ms"].as_i64().is_some(),
        "{finished}"
    );
    assert!(
        finished["detail"].as_str().unwrap().contains("exit 3"),
        "{finished}"
    );
    // `inspect` lists them among the resource's last events.
    let view = store
        .fence()
        .args(["inspect", "job", "--history", "10", "--format", "json"])
        .run()
        .expect(0)
        .json();
    let shown: Vec<&str> = view["resources"][0]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        shown,
        ["released", "run_finished", "run_started", "acquired"],
        "{view}"
    );
    // `--kind` selects them.
    let only = store
        .fence()
        .args(["log", "job", "--kind", "run_finished", "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(only["events"].as_array().unwrap().len(), 1, "{only}");
}

fn a_run_past_max_time_is_on_record_as_stopped(store: &Store) {
    store
        .fence()
        .args(["run", "job", "--ttl", "20s", "--max-time", "1s"])
        .args(["--kill-after", "1s", "--", "sleep", "300"])
        .run()
        .expect(124);
    let events = logged(store);
    assert_eq!(
        kinds(&events),
        ["acquired", "run_started", "run_stopped", "released"],
        "{events:#?}"
    );
    let stopped = one(&events, "run_stopped");
    let run = &stopped["run"];
    assert_eq!(run["reason"], "max_time", "{stopped}");
    assert_eq!(run["signal"], "SIGTERM", "{stopped}");
    assert_eq!(run["exit_status"], 143, "{stopped}");
    assert!(run["duration_ms"].as_i64().unwrap() >= 1000, "{stopped}");
    assert!(run.get("after_lease_end_ms").is_none(), "{stopped}");
    let detail = stopped["detail"].as_str().unwrap();
    assert!(
        detail.contains("--max-time") && detail.contains("SIGTERM"),
        "{detail}"
    );
}

/// A command that cannot be executed: the run recorded `run_started`, so the end is on
/// record too (`run_stopped`, reason `not_started`), before the release.
fn a_run_whose_command_never_ran_is_on_record_as_not_started(store: &Store) {
    let out = store
        .fence()
        .args([
            "run",
            "job",
            "--format",
            "json",
            "--",
            "/nonexistent/fence-test",
        ])
        .run()
        .expect(2);
    assert!(out.stdout.contains("/nonexistent/fence-test"), "{out:?}");
    let events = logged(store);
    assert_eq!(
        kinds(&events),
        ["acquired", "run_started", "run_stopped", "released"],
        "{events:#?}"
    );
    assert_eq!(
        durable_kinds(store),
        ["acquired", "run_started", "run_stopped", "released"]
    );
    let stopped = one(&events, "run_stopped");
    let run = &stopped["run"];
    assert_eq!(run["reason"], "not_started", "{stopped}");
    assert_eq!(run["run_id"], one(&events, "run_started")["run"]["run_id"]);
    assert!(run.get("exit_status").is_none(), "{stopped}");
    let detail = stopped["detail"].as_str().unwrap();
    assert!(detail.contains("was not started"), "{detail}");
}

per_coordinator!(
    a_run_is_on_record,
    a_run_past_max_time_is_on_record_as_stopped,
    a_run_whose_command_never_ran_is_on_record_as_not_started
);

/// A lease lost while fence was paused (on the directory store and PostgreSQL).
mod lost {
    use super::*;

    /// fence is paused (SIGSTOP) while a long command runs: its supervisor stops the command at
    /// the lease's bound, another owner takes the lease over, and when fence is continued it
    /// records the stop — reason, signal, and that the command ended at the bound — and tells
    /// cron that there is nothing to do by hand, and where to look.
    fn a_run_stopped_for_a_lost_lease_is_on_record(store: &Store) {
        let dir = tempfile::tempdir().unwrap();
        let started = dir.path().join("started");
        let script = format!("touch '{}'; exec sleep 300", started.display());
        let fence = store
            .fence()
            .args(["run", "job", "--ttl", "2s", "--kill-after", "1s", "--"])
            .args(["sh", "-c", &script]);
        let child = fence.spawn();
        wait_for("the command to start", Duration::from_secs(30), || {
            started.exists()
        });
        kill(child.id(), libc::SIGSTOP);
        store.wait_expired("job");
        store
            .fence()
            .args(["acquire", "job", "--owner", "next", "--ttl", "1m"])
            .run()
            .expect(0);
        kill(child.id(), libc::SIGCONT);
        let out = wait_output("fence run", child, Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(5), "{stderr}");
        assert!(
            stderr.contains(" log job` shows the run's record")
                && !stderr.contains("fence acquire"),
            "the hint says where to look, not to acquire by hand: {stderr}"
        );
        let events = logged(store);
        let stopped = one(&events, "run_stopped");
        let run = &stopped["run"];
        assert_eq!(run["reason"], "taken_over", "{stopped}");
        assert_eq!(
            run["signal"], "SIGTERM",
            "the supervisor's SIGTERM: {stopped}"
        );
        assert_eq!(run["exit_status"], 143, "{stopped}");
        // The supervisor stopped it at the bound, on its own clock: SIGTERM a fifth of the
        // TTL before it, SIGKILL at it. The bound is a tenth of the TTL (200 ms) before the
        // store's expiry, which the command did not reach (a SIGKILL lands in far less).
        let after = run["after_lease_end_ms"].as_i64().unwrap();
        assert!(after < 200, "ended {after} ms after the bound: {stopped}");
        // Recorded after the takeover, with the run's own (older) token.
        let order = kinds(&events);
        let taken = order.iter().position(|k| *k == "taken_over").unwrap();
        let at = order.iter().position(|k| *k == "run_stopped").unwrap();
        assert!(taken < at, "{order:?}");
        assert_eq!(stopped["token"], 1, "{stopped}");
        assert!(durable_kinds(store).contains(&"run_stopped".to_owned()));
    }

    per_backend!(a_run_stopped_for_a_lost_lease_is_on_record);
}

/// The record is best effort: a store that refuses it (here, the directory store's log made
/// read-only after the grant) costs a warning, never the command's status.
#[test]
fn an_unrecorded_run_event_changes_no_exit_status() {
    let store = Store::new(common::Backend::File);
    store.fence().args(["init"]).run().expect(0);
    let log = store.dir().join("events").join("job.jsonl");
    // The command makes the log unwritable once it runs: run_finished cannot be appended
    // (as root, permissions do not stop appends: a directory in the file's place does).
    let script = format!(
        "mv '{log}' '{log}.kept' && mkdir '{log}'",
        log = log.display()
    );
    let out = store
        .fence()
        .args(["run", "job", "--", "sh", "-c", &script])
        .run();
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.contains("`run_finished` event of run")
            && out.stderr.contains("the run is not affected"),
        "{out:?}"
    );
}

/// fence asked to stop (SIGTERM, as systemd or a shutdown sends it) passes it to the command,
/// and records the stop: reason `interrupted`, the signal.
#[test]
fn an_interrupted_run_is_on_record_as_stopped() {
    let store = Store::new(common::Backend::File);
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let script = format!("touch '{}'; exec sleep 300", started.display());
    let fence = store
        .fence()
        .args(["run", "job", "--ttl", "30s", "--"])
        .args(["sh", "-c", &script]);
    let child = fence.spawn();
    wait_for("the command to start", Duration::from_secs(30), || {
        started.exists()
    });
    kill(child.id(), libc::SIGTERM);
    let out = wait_output("fence run", child, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(143), "{out:?}");
    let events = logged(&store);
    assert_eq!(
        kinds(&events),
        ["acquired", "run_started", "run_stopped", "released"],
        "{events:#?}"
    );
    let run = &one(&events, "run_stopped")["run"];
    assert_eq!(run["reason"], "interrupted", "{run}");
    assert_eq!(run["signal"], "SIGTERM", "{run}");
    assert_eq!(run["exit_status"], 143, "{run}");
}
