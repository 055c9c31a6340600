//! Review 20: adversarial review of run ids (`fence run --id`), write ids and `fence prune` on
//! the directory and PostgreSQL stores. Each test states what the contract (docs/DESIGN.md §3,
//! §5, §12) promises, what fence did instead, and asserts on durable state and exit statuses.

use std::path::PathBuf;

use crate::common;

use common::{Out, Store};

fn log(store: &Store) -> Vec<String> {
    std::fs::read_to_string(store.home.path().join("log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `fence run r --id ID -- sh -c 'echo WORD >> log'` in the store's home.
fn run(store: &Store, id: &str, word: &str) -> Out {
    let log = store.home.path().join("log");
    store
        .fence()
        .args(["run", "r", "--ttl", "30s", "--id", id, "--format", "json"])
        .args(["--", "sh", "-c"])
        .args([format!("echo {word} >> '{}'", log.display())])
        .run()
}

/// The directory store's completion record of run `id` of `r`, and its log.
fn done_files(store: &Store, id: &str) -> (PathBuf, PathBuf) {
    let dir = store.dir();
    (
        dir.join("leases").join(format!("r%23done%3A{id}.json")),
        dir.join("events").join(format!("r%23done%3A{id}.jsonl")),
    )
}

/// FINDING: DESIGN §3 `run`: a run whose command exited 0 is recorded, "and a later run with
/// the id skips its command"; §12 (the directory store) models a power loss that leaves "a
/// record renamed into place before its bytes as empty": a release's record is not synced.
/// The completion record of a run id is an acquire and a release of `r#done:ID`, so a power
/// loss after the run can leave `leases/r%23done%3AID.json` empty. The store knows what
/// happened: `fence inspect` warns `record_missing` ("taken by a power loss before it was
/// synced; token 1 was issued") and lists the marker's `acquired` and `released` events, owner
/// `…#cmd:DIGEST`. But `completed` (src/cmd/run/ids.rs) counts a run id as completed only
/// when the marker's view has a token, and the view of a missing or empty record has none:
/// the next run with the id runs the job again (exit 0, a second line in the log) although
/// the store's own history holds its completion.
fn a_completion_record_emptied_by_a_power_loss_is_not_forgotten(store: &Store) {
    run(store, "day-1", "ran").expect(0);
    assert_eq!(log(store), ["ran"]);
    let (record, events) = done_files(store, "day-1");
    assert!(std::fs::read_to_string(&events)
        .unwrap()
        .contains("released"));
    // The power loss: the release's record renamed into place, its bytes never written.
    std::fs::write(&record, "").unwrap();
    let inspect = store
        .fence()
        .args(["inspect", "r#done:day-1", "--format", "json"])
        .run()
        .expect(0);
    assert!(
        inspect.stdout.contains("record_missing") && inspect.stdout.contains("\"released\""),
        "the store knows the run id was completed: {inspect:?}"
    );
    let again = run(store, "day-1", "ran").expect(0);
    assert_eq!(
        log(store),
        ["ran"],
        "a completed run id was run again after its record was emptied: {again:?}"
    );
    assert_eq!(again.json()["skipped"], true, "{again:?}");
}

/// FINDING: DESIGN §3 `run`: a later run with the id "with other arguments … is refused
/// (exit 6, `id_reused`), neither skipped nor run". On the directory store the log is not
/// synced (§12: "a power loss that took the log's last lines"), and the record carries the
/// change's event so that it can be recorded late — but only by the next *write* under the
/// resource's lock; `inspect` does not. With the marker's log lost, `completed` (src/cmd/run/
/// ids.rs) takes the digest from the first event (none) or else the view's owner, and the
/// view hides the owner of a released record (src/coordinator/file/view.rs: `owner` only
/// when `shown`), although the record itself holds `OWNER#cmd:DIGEST`. So the digest is
/// `None`, taken for a record of a fence version that kept none, and the run with another
/// command is *skipped* (exit 0, "already completed", JSON `skipped: true`) instead of
/// refused with exit 6: the caller is told its work is done when it was never run.
fn a_run_id_whose_marker_log_was_lost_still_refuses_another_command(store: &Store) {
    run(store, "job-1", "first").expect(0);
    let (record, events) = done_files(store, "job-1");
    assert!(std::fs::read_to_string(&record).unwrap().contains("#cmd:"));
    // The power loss took the marker's log lines (never synced); the record survived.
    std::fs::write(&events, "").unwrap();
    let other = run(store, "job-1", "other");
    assert_eq!(log(store), ["first"], "{other:?}");
    assert_eq!(
        other.code, 6,
        "another command under a completed run id was skipped, not refused: {other:?}"
    );
    assert_eq!(other.json()["reason"], "id_reused", "{other:?}");
    // The command that completed it is still skipped.
    let same = run(store, "job-1", "first").expect(0);
    assert_eq!(same.json()["skipped"], true, "{same:?}");
    assert_eq!(log(store), ["first"]);
}

mod file_store {
    use super::*;

    #[test]
    fn a_completion_record_emptied_by_a_power_loss_is_not_forgotten() {
        super::a_completion_record_emptied_by_a_power_loss_is_not_forgotten(&Store::file());
    }

    #[test]
    fn a_run_id_whose_marker_log_was_lost_still_refuses_another_command() {
        super::a_run_id_whose_marker_log_was_lost_still_refuses_another_command(&Store::file());
    }
}
