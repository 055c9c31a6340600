//! A change whose process dies between writing the lease record and appending its event
//! (directory store): the next operation on the resource appends the event, marked as
//! recorded late, before anything else. Found by the soak (issue 36): a `fence release`
//! SIGKILLed there left a history in which the next owner's grant came while the released
//! lease still looked live — an overlap that never happened. The process is killed at that
//! exact point by `strace`, which injects SIGKILL into its first write to the event log.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Output;

use crate::common::{self, Store};
use serde_json::Value;

/// The event log of `job` in the store.
pub(super) fn log_path(store: &Store) -> PathBuf {
    store.dir().join("events").join("job.jsonl")
}

/// The log's lines, parsed (every one must be an event).
fn lines(store: &Store) -> Vec<Value> {
    std::fs::read_to_string(log_path(store))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("an event line is JSON"))
        .collect()
}

/// The log's events, as fence reads them: a line that is not JSON (a torn append) is left out.
pub(super) fn events(store: &Store) -> Vec<Value> {
    std::fs::read_to_string(log_path(store))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Each event as `kind "owner" token`.
pub(super) fn kinds(store: &Store) -> Vec<String> {
    events(store)
        .iter()
        .map(|e| {
            format!(
                "{} {} {}",
                e["kind"].as_str().unwrap(),
                e["owner"],
                e["token"]
            )
        })
        .collect()
}

/// `fence args…` on `store` under strace: every write to the event log gets `inject`
/// (`signal=SIGKILL` kills fence at its first append, after the record was written;
/// `error=ENOSPC` fails them all).
pub(super) fn strace_log_writes(store: &Store, inject: &str, args: &[&str]) -> Output {
    // The log must exist for strace's path filter to name it: an empty file is a log with no
    // event.
    let path = log_path(store);
    if !path.exists() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "").unwrap();
    }
    let home = tempfile::tempdir().unwrap();
    common::clean_command("strace", home.path())
        .args(["-f", "-qq", "-o", "/dev/null", "-e", "trace=write"])
        .args(["-e", &format!("inject=write:{inject}"), "-P"])
        .arg(&path)
        .arg(common::fence_bin())
        .args(["--store", &store.url])
        .args(args)
        .output()
        .expect("strace runs (tests/run installs it)")
}

/// Runs `fence args…` on `store`, killed (SIGKILL) as it enters its first write to the event
/// log: after the record was written, before its event.
pub(super) fn killed_at_the_append(store: &Store, args: &[&str]) {
    let out = strace_log_writes(store, "signal=SIGKILL", args);
    // strace ends as its tracee did: killed by SIGKILL.
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "fence was to be killed at its append: {out:?}"
    );
}

/// The lease record of `job` in the store.
pub(super) fn record_path(store: &Store) -> PathBuf {
    store.dir().join("leases").join("job.json")
}

fn record(store: &Store) -> Value {
    serde_json::from_slice(&std::fs::read(record_path(store)).unwrap()).unwrap()
}

#[test]
fn a_release_killed_before_its_event_is_recorded_before_the_next_grant() {
    let store = Store::file();
    let a = store
        .fence()
        .acquire("job", &["--owner", "A", "--ttl", "10m"]);
    killed_at_the_append(
        &store,
        &[
            "release",
            "job",
            "--owner",
            "A",
            "--token",
            &a.token.to_string(),
        ],
    );
    // What the kill left: the record released, the log without the release.
    assert_eq!(record(&store)["released"], true);
    assert_eq!(kinds(&store), [r#"acquired "A" 1"#]);
    // The next grant (another owner: the lease is released) comes after the late release.
    let b = store
        .fence()
        .acquire("job", &["--owner", "B", "--ttl", "10m"]);
    assert_eq!(b.token, 2);
    assert_eq!(
        kinds(&store),
        [
            r#"acquired "A" 1"#,
            r#"released "A" 1"#,
            r#"acquired "B" 2"#
        ]
    );
    let events = lines(&store);
    let detail = events[1]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("recorded late"), "{detail}");
    // Dated when the release was decided, before B's grant, on the clock expiry is judged by.
    assert!(
        events[1]["boot_ns"].as_u64() < events[2]["boot_ns"].as_u64(),
        "{events:#?}"
    );
    // `fence log` shows it, in its place.
    let log = store
        .fence()
        .args(["log", "job", "--format", "json"])
        .run()
        .expect(0)
        .json();
    let shown: Vec<&str> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(shown, ["acquired", "released", "acquired"], "{log:#}");
}

#[test]
fn a_grant_killed_before_its_event_is_recorded_once_by_the_next_operation() {
    let store = Store::file();
    killed_at_the_append(&store, &["acquire", "job", "--owner", "A", "--ttl", "10m"]);
    // The grant stands (its record is written, the mark raised), unrecorded.
    assert_eq!(record(&store)["owner"], "A");
    assert!(lines(&store).is_empty());
    // B finds it held, and the grant is recorded: once, however many operations follow.
    for _ in 0..2 {
        store
            .fence()
            .args(["acquire", "job", "--owner", "B", "--ttl", "10m"])
            .run()
            .expect(3);
    }
    let events = lines(&store);
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(
        (&events[0]["kind"], &events[0]["owner"], &events[0]["token"]),
        (&Value::from("acquired"), &Value::from("A"), &Value::from(1))
    );
    assert!(events[0]["detail"]
        .as_str()
        .is_some_and(|d| d.contains("recorded late")));
}
