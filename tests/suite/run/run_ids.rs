//! Run ids (issue 20): `fence run RESOURCE --id KEY` (or `FENCE_RUN_ID`) on the directory store
//! and PostgreSQL. Asserted on what the command left behind (a log it appends to) and on the
//! store's record of the completed run:
//! - the command gets FENCE_RUN_ID; once it exited 0, a second run with the id starts nothing
//!   and exits 0 (or --done-exit-code), JSON `"skipped": true`;
//! - a run whose command failed is not recorded: the next run with the id runs;
//! - FENCE_RUN_ID from the environment counts as --id, except the one an enclosing run set;
//! - a resource and id too long to record are refused before anything starts (exit 2).

use crate::common;

use common::{Backend, Out, Store};

/// Whether the store holds the record of run `id` of `r` completed, read without fence.
fn recorded(store: &Store, id: &str) -> bool {
    match store.backend {
        Backend::File => store
            .dir()
            .join("leases")
            .join(format!("r%23done%3A{id}.json"))
            .exists(),
        _ => store.lease(&format!("r#done:{id}")).is_some(),
    }
}

fn log(store: &Store) -> Vec<String> {
    std::fs::read_to_string(store.home.path().join("log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `fence run r [extra] -- sh -c 'echo "$FENCE_RUN_ID" >> log; exit CODE'` in the store's home.
fn run(store: &Store, extra: &[&str], code: i32) -> Out {
    let log = store.home.path().join("log");
    store
        .fence()
        .args(["run", "r", "--ttl", "30s"])
        .args(extra)
        .args(["--", "sh", "-c"])
        .args([format!(
            "echo \"${{FENCE_RUN_ID-none}}\" >> '{}'; exit {code}",
            log.display()
        )])
        .run()
}

fn a_completed_run_is_skipped(store: &Store) {
    let first = run(store, &["--id", "day-1"], 0).expect(0);
    assert_eq!(log(store), ["day-1"], "{first:?}");
    assert!(recorded(store, "day-1"));
    let again = run(store, &["--id", "day-1"], 0).expect(0);
    assert_eq!(log(store), ["day-1"], "not run again");
    assert!(again.stderr.contains("already completed"), "{again:?}");
    run(store, &["--id", "day-1", "--done-exit-code", "9"], 0).expect(9);
    let json = run(store, &["--id", "day-1", "--format", "json"], 0)
        .expect(0)
        .json();
    assert_eq!(json["skipped"], true, "{json}");
    assert_eq!(json["run_id"], "day-1");
    assert!(json["completed"]["owner"].is_string(), "{json}");
    assert!(json["completed"]["at"].is_string(), "{json}");
    run(store, &["--id", "day-1", "-q"], 0).expect(0);
    assert_eq!(log(store), ["day-1"]);
    // The lease was released after each skip.
    let (_, _, live) = store.lease("r").unwrap();
    assert!(!live);
    // Another id runs; no id runs every time, with an id of its own (`run-<token>-<random>`:
    // tokens repeat across stores, so the token alone would not be unique).
    run(store, &["--id", "day-2"], 0).expect(0);
    run(store, &[], 0).expect(0);
    run(store, &[], 0).expect(0);
    let lines = log(store);
    assert_eq!(lines[..2], ["day-1", "day-2"]);
    let token = store.lease("r").unwrap().1;
    let own_id = |id: &str, token: i64| {
        let random = id
            .strip_prefix(&format!("run-{token}-"))
            .unwrap_or_else(|| panic!("`{id}` is not run-{token}-…"));
        assert!(
            random.len() == 8 && random.chars().all(|c| c.is_ascii_hexdigit()),
            "{id}"
        );
    };
    own_id(&lines[2], token - 1);
    own_id(&lines[3], token);
    let json = run(store, &["--format", "json"], 0).expect(0).json();
    own_id(json["run_id"].as_str().unwrap(), token + 1);
    // --done-exit-code without a run id has nothing to mean.
    run(store, &["--done-exit-code", "9"], 0).expect(2);
    assert_eq!(log(store).len(), 5);
}

/// A run id completed by one command is neither a skip nor a run for another (other
/// arguments): exit 6, `id_reused`, nothing started, the lease released; the command that
/// completed it is still skipped.
fn a_run_id_completed_by_another_command_is_refused(store: &Store) {
    run(store, &["--id", "job-1"], 0).expect(0);
    assert_eq!(log(store), ["job-1"]);
    let other = |extra: &[&str]| {
        store
            .fence()
            .args(["run", "r", "--id", "job-1"])
            .args(extra)
            .args(["--", "sh", "-c"])
            .args([format!(
                "echo other >> '{}'",
                store.home.path().join("log").display()
            )])
            .run()
    };
    let refused = other(&[]).expect(6);
    assert!(
        refused.stderr.contains("run id `job-1`") && refused.stderr.contains("different command"),
        "{refused:?}"
    );
    let json = other(&["--format", "json"]).expect(6).json();
    assert_eq!(json["reason"], "id_reused", "{json}");
    assert_eq!(json["run_id"], "job-1", "{json}");
    assert_eq!(log(store), ["job-1"], "the other command ran");
    let (_, _, live) = store.lease("r").unwrap();
    assert!(!live, "the lease was not released");
    // The command that completed the id is still a skip.
    run(store, &["--id", "job-1"], 0).expect(0);
    assert_eq!(log(store), ["job-1"]);
}

/// A `fence run` inside a run's command does not take the enclosing run's id as its own:
/// two inner runs of one resource both run (each with its own `run-<token>`).
fn an_inner_run_does_not_inherit_the_id(store: &Store) {
    let fence = env!("CARGO_BIN_EXE_fence");
    let path = store.home.path().join("log");
    let inner = format!(
        "{fence} run inner -- sh -c 'echo \"$FENCE_RUN_ID\" >> {log}'",
        log = path.display()
    );
    store
        .fence()
        .args(["run", "r", "--id", "outer", "--", "sh", "-c"])
        .args([format!("{inner} && {inner}")])
        .run()
        .expect(0);
    let lines = log(store);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines.iter().all(|l| l.starts_with("run-")), "{lines:?}");
    assert_ne!(lines[0], lines[1]);
    // An id the command sets itself is its own, and honoured.
    let own = format!(
        "FENCE_RUN_ID=step-2 {fence} run inner -- sh -c 'echo \"$FENCE_RUN_ID\" >> {log}'",
        log = path.display()
    );
    for outer in ["outer-2", "outer-3"] {
        store
            .fence()
            .args(["run", "r", "--id", outer, "--", "sh", "-c", &own])
            .run()
            .expect(0);
    }
    assert_eq!(
        log(store)[2..],
        ["step-2"],
        "the second inner step-2 was skipped"
    );
}

fn a_failed_run_is_not_recorded(store: &Store) {
    run(store, &["--id", "warm-up"], 0).expect(0);
    run(store, &["--id", "day-1"], 3).expect(3);
    assert!(!recorded(store, "day-1"));
    run(store, &["--id", "day-1"], 0).expect(0);
    assert!(recorded(store, "day-1"));
    run(store, &["--id", "day-1"], 0).expect(0);
    assert_eq!(
        log(store),
        ["warm-up", "day-1", "day-1"],
        "the failed run, then the one that worked"
    );
}

fn the_run_id_comes_from_the_environment_too(store: &Store) {
    let from_env = |code| {
        let log = store.home.path().join("log");
        store
            .fence()
            .env("FENCE_RUN_ID", "nightly-2026-12-04")
            .args(["run", "r", "--", "sh", "-c"])
            .args([format!("echo \"$FENCE_RUN_ID\" >> '{}'", log.display())])
            .run()
            .expect(code)
    };
    from_env(0);
    let skipped = from_env(0);
    assert!(skipped.stderr.contains("nightly-2026-12-04"), "{skipped:?}");
    assert_eq!(log(store), ["nightly-2026-12-04"]);
    // Bad ids from the environment are refused like bad flags.
    let out = store
        .fence()
        .env("FENCE_RUN_ID", "has space")
        .args(["run", "r", "--", "true"])
        .run()
        .expect(2);
    assert!(out.stderr.contains("write id"), "{out:?}");
    // The resource and id must fit one resource name.
    let long = "r".repeat(180);
    let out = store
        .fence()
        .args(["run", &long, "--id", "a-longer-id-than-fits", "--", "true"])
        .run()
        .expect(2);
    assert!(
        out.stderr.contains("shorter resource name or id"),
        "{out:?}"
    );
}

per_backend!(
    a_completed_run_is_skipped,
    a_failed_run_is_not_recorded,
    the_run_id_comes_from_the_environment_too,
    an_inner_run_does_not_inherit_the_id,
    a_run_id_completed_by_another_command_is_refused,
);
