//! A directory store that does not exist is not made by accident (issue 35, item 2). Two
//! crontabs with different `FENCE_STORE` values (or a `HOME` that differs under cron) would
//! each get a private store and lose mutual exclusion without a word. So: under a parent that
//! does not exist, every command but `fence init` refuses (exit 2) and creates nothing; where
//! only the store's own directory is missing, fence creates it and says so once, naming the
//! path (in `notices` with `--format json`); the default store is created silently; `fence
//! init` creates a store on purpose, parents included.

use crate::common;

use std::path::Path;

fn fence(home: &Path, store: &Path) -> common::Fence {
    common::Fence::bare(home).args(["--store", &format!("file://{}", store.display())])
}

fn note_count(stderr: &str, store: &Path) -> usize {
    stderr
        .matches(&format!(
            "note: created the store directory `{}`",
            store.display()
        ))
        .count()
}

#[test]
fn a_store_under_a_missing_parent_is_refused_by_every_command_but_init() {
    let home = tempfile::tempdir().unwrap();
    let parent = home.path().join("no-such-dir");
    let store = parent.join("store");
    let commands: &[&[&str]] = &[
        &["acquire", "job"],
        &["acquire", "job", "--wait", "1s"],
        &["run", "job", "--", "true"],
        &["renew", "job", "--owner", "o", "--token", "1"],
        &["release", "job", "--owner", "o", "--token", "1"],
        &["inspect"],
        &["log"],
        &["metrics"],
        &["doctor"],
    ];
    for args in commands {
        let out = fence(home.path(), &store).args(*args).run();
        assert_ne!(out.code, 0, "`fence {}` succeeded: {out:?}", args.join(" "));
        assert!(
            !parent.exists(),
            "`fence {}` created {}: {out:?}",
            args.join(" "),
            parent.display()
        );
    }
    let out = fence(home.path(), &store)
        .args(["acquire", "job"])
        .run()
        .expect(2);
    assert!(
        out.stderr.contains("its parent") && out.stderr.contains("mkdir -p"),
        "{out:?}"
    );

    // `fence init` is the way to make one there, parents included; then it is in use.
    fence(home.path(), &store).args(["init"]).run().expect(0);
    assert!(store.join("fence-store.json").exists());
    let out = fence(home.path(), &store)
        .args(["acquire", "job", "--owner", "o"])
        .run()
        .expect(0);
    assert_eq!(note_count(&out.stderr, &store), 0, "{out:?}");
}

#[test]
fn a_store_fence_creates_is_announced_once_naming_its_path() {
    let home = tempfile::tempdir().unwrap();
    let store = home.path().join("typo-store");
    let out = fence(home.path(), &store)
        .args(["acquire", "job", "--owner", "a"])
        .run()
        .expect(0);
    assert_eq!(note_count(&out.stderr, &store), 1, "{out:?}");
    assert!(store.join("leases").is_dir(), "the store was made");
    let out = fence(home.path(), &store)
        .args(["release", "job", "--owner", "a", "--token", "1"])
        .run()
        .expect(0);
    assert_eq!(note_count(&out.stderr, &store), 0, "said once: {out:?}");

    // `fence run`, and a script reading JSON: the note is in `notices`.
    let other = home.path().join("another-typo");
    let out = fence(home.path(), &other)
        .args(["run", "job", "--format", "json", "--", "true"])
        .run()
        .expect(0);
    assert_eq!(note_count(&out.stderr, &other), 1, "{out:?}");
    let third = home.path().join("third");
    let out = fence(home.path(), &third)
        .args(["acquire", "job", "--format", "json"])
        .run()
        .expect(0);
    let notices = out.json()["notices"].clone();
    assert!(
        notices.as_array().is_some_and(|n| n
            .iter()
            .any(|n| n.as_str().unwrap().contains("created the store directory"))),
        "{out:?}"
    );
    assert_eq!(out.stderr, "", "JSON carries it: {out:?}");
}

#[test]
fn the_default_store_is_created_without_a_note() {
    let home = tempfile::tempdir().unwrap();
    let state = home.path().join("state");
    let out = common::Fence::bare(home.path())
        .env("XDG_STATE_HOME", &state)
        .args(["acquire", "job"])
        .run()
        .expect(0);
    assert!(state.join("fence/leases").is_dir(), "{out:?}");
    assert_eq!(out.stderr, "", "{out:?}");
}
