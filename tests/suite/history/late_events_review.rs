//! Review of the late events (commit 3c44421): states in which an event of a change whose
//! process died between the lease record and the event log stays missing. Each test kills
//! fence at its append with `strace`, as `late_events.rs` does.

use std::path::PathBuf;

use super::late_events::{killed_at_the_append, kinds, log_path, record_path, strace_log_writes};
use crate::common::{acquire, release, Store};
use serde_json::Value;

/// A record lost (emptied by a power loss: renewals and releases are not synced; or moved
/// aside, as the damaged-record hint says) restarts the record's change number at 1 while
/// the log's last line keeps the old, higher one: the first grant after it, killed before
/// its event, compares as already logged and is never recorded.
#[test]
fn a_grant_killed_right_after_a_lost_record_is_recorded_late() {
    let store = Store::file();
    let a = acquire(&store, "job", "A");
    for _ in 0..2 {
        store
            .fence()
            .args(["renew", "job", "--owner", "A", "--token", &a.to_string()])
            .run()
            .expect(0);
    }
    release(&store, "job", "A", a);
    // What a power loss leaves of a record renamed into place but not synced.
    std::fs::write(record_path(&store), "").unwrap();
    killed_at_the_append(&store, &["acquire", "job", "--owner", "B", "--ttl", "10m"]);
    store
        .fence()
        .args(["acquire", "job", "--owner", "C", "--ttl", "10m"])
        .run()
        .expect(3);
    let kinds = kinds(&store);
    assert!(
        kinds.contains(&r#"acquired "B" 2"#.to_owned()),
        "B's grant (it holds the lease) is missing from the history: {kinds:#?}"
    );
}

/// A log whose last line is torn (a power loss, or an append cut short by a full disk or
/// RLIMIT_FSIZE before its undo) ends without a newline: the late event is appended onto the
/// fragment, makes one line that is not JSON, and the next change's event, on a line of its
/// own, hides that it is missing.
#[test]
fn a_late_event_after_a_torn_last_line_is_not_lost() {
    let store = Store::file();
    let a = acquire(&store, "job", "A");
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(log_path(&store))
        .unwrap();
    std::io::Write::write_all(&mut log, br#"{"at_ms":17"#).unwrap();
    drop(log);
    killed_at_the_append(
        &store,
        &["release", "job", "--owner", "A", "--token", &a.to_string()],
    );
    assert_eq!(acquire(&store, "job", "B"), 2);
    assert_eq!(
        kinds(&store),
        [
            r#"acquired "A" 1"#,
            r#"released "A" 1"#,
            r#"acquired "B" 2"#
        ]
    );
}

/// A grant refused for a full disk (exit 7) undoes itself by writing back a record that
/// carries no event: the change before it, killed before its event and not yet caught up
/// (the same full disk failed the catch-up), is dropped from the record and never recorded.
#[test]
fn a_late_event_survives_a_grant_refused_for_a_full_disk() {
    let store = Store::file();
    let a = acquire(&store, "job", "A");
    killed_at_the_append(
        &store,
        &["release", "job", "--owner", "A", "--token", &a.to_string()],
    );
    let out = strace_log_writes(
        &store,
        "error=ENOSPC",
        &["acquire", "job", "--owner", "B", "--ttl", "10m"],
    );
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    // The disk has room again.
    let c = acquire(&store, "job", "C");
    let kinds = kinds(&store);
    assert!(
        kinds.contains(&r#"released "A" 1"#.to_owned()),
        "A's release is missing from the history: {kinds:#?} (C got token {c})"
    );
}

/// The first change after an upgrade: the log's last line is of the older version (no
/// change number) and the record the new version wrote is its change 1, with its event. A
/// process killed between the two leaves the change unrecorded for good ("nothing to
/// compare"), though nothing but the new version can have written the record's event.
#[test]
fn the_first_change_after_an_upgrade_killed_before_its_event_is_recorded_late() {
    let store = Store::file();
    let a = acquire(&store, "job", "A");
    // As fence before 3c44421 wrote them: no `change`, no `event`.
    let strip = |path: PathBuf, keys: &[&str]| {
        let text = std::fs::read_to_string(&path).unwrap();
        let mut out = String::new();
        for line in text.lines() {
            let mut v: Value = serde_json::from_str(line).unwrap();
            for key in keys {
                v.as_object_mut().unwrap().remove(*key);
            }
            out.push_str(&v.to_string());
            out.push('\n');
        }
        std::fs::write(&path, out).unwrap();
    };
    strip(log_path(&store), &["change"]);
    strip(record_path(&store), &["change", "event"]);
    killed_at_the_append(
        &store,
        &["release", "job", "--owner", "A", "--token", &a.to_string()],
    );
    assert_eq!(acquire(&store, "job", "B"), 2);
    assert_eq!(
        kinds(&store),
        [
            r#"acquired "A" 1"#,
            r#"released "A" 1"#,
            r#"acquired "B" 2"#
        ]
    );
}
