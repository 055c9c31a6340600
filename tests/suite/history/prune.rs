//! `fence prune` (issue 25): deletes old events and dead waiters' rows on PostgreSQL, keeps
//! the last N events per resource when asked, never touches a lease row (the next token of a
//! pruned resource is still above every token before), and the examples of its `--help` run
//! exactly as written.

use crate::common;

use std::process::Command;

use common::{pg_exec, pg_query, Store};
use serde_json::Value;

/// Grants and releases `resource` `times` times; returns the last token.
fn cycle(store: &Store, resource: &str, times: usize) -> i64 {
    let mut token = 0;
    for _ in 0..times {
        let out = store
            .fence()
            .args(["acquire", resource, "--owner", "o", "--format", "json"])
            .run()
            .expect(0);
        token = out.json()["token"].as_i64().unwrap();
        store
            .fence()
            .args([
                "release",
                resource,
                "--owner",
                "o",
                "--token",
                &token.to_string(),
            ])
            .run()
            .expect(0);
    }
    token
}

/// Moves the events of `resource` with a token up to `up_to` `days` into the past.
fn age(store: &Store, resource: &str, up_to: i64, days: u32) {
    let schema = store.schema.as_ref().unwrap();
    pg_exec(
        &store.url,
        &format!(
            "UPDATE {schema}.events SET at = at - interval '{days} days' \
             WHERE resource = '{resource}' AND token <= {up_to}"
        ),
    );
}

/// Every lease row, as text, for comparing before and after.
fn leases(store: &Store) -> Vec<String> {
    let schema = store.schema.as_ref().unwrap();
    pg_query(
        &store.url,
        &format!("SELECT l::text FROM {schema}.leases l ORDER BY resource"),
    )
    .iter()
    .map(|row| row.get(0))
    .collect()
}

fn tokens(store: &Store, resource: &str) -> Vec<i64> {
    store
        .events(resource)
        .into_iter()
        .filter_map(|(_, _, token)| token)
        .collect()
}

#[test]
fn old_events_go_the_counters_stay() {
    let store = Store::postgres();
    assert_eq!(cycle(&store, "a", 5), 5);
    assert_eq!(cycle(&store, "b", 2), 2);
    // a: tokens 1–3 are 40 days old, 4–5 new; b: all 40 days old.
    age(&store, "a", 3, 40);
    age(&store, "b", 2, 40);
    let before = leases(&store);

    let out = store
        .fence()
        .args([
            "prune",
            "--older-than",
            "30d",
            "--keep",
            "1",
            "--format",
            "json",
        ])
        .run()
        .expect(0);
    let json = out.json();
    assert_eq!(json["ok"], true);
    assert_eq!(json["op"], "prune");
    // a: its 6 old events (its last one is new, so --keep 1 keeps none of them); b: 3 of 4.
    assert_eq!(json["events_deleted"], 9, "{json}");
    assert_eq!(json["waiters_deleted"], 0);
    assert_eq!(json["resources"], 2);
    assert_eq!(json["keep"], 1);
    assert_eq!(tokens(&store, "a"), [4, 4, 5, 5]);
    assert_eq!(
        store.events("b"),
        [("released".to_owned(), Some("o".to_owned()), Some(2))]
    );
    assert_eq!(leases(&store), before, "prune changed a lease row");

    // Everything, by name: the history is empty, the counter is not.
    let out = store
        .fence()
        .args(["prune", "--older-than", "0s", "a", "b"])
        .run()
        .expect(0);
    assert!(
        out.stdout.starts_with("deleted 5 events older than "),
        "{out:?}"
    );
    assert!(out.stdout.contains("token counters untouched"), "{out:?}");
    assert!(store.events("a").is_empty() && store.events("b").is_empty());
    assert_eq!(leases(&store), before);
    let next = |resource: &str| {
        store
            .fence()
            .args(["acquire", resource, "--format", "json"])
            .run()
            .expect(0)
            .json()["token"]
            .as_i64()
            .unwrap()
    };
    assert_eq!(next("a"), 6);
    assert_eq!(next("b"), 3);
}

#[test]
fn named_resources_only_and_dead_waiters() {
    let store = Store::postgres();
    cycle(&store, "a", 2);
    cycle(&store, "b", 2);
    age(&store, "a", 2, 10);
    age(&store, "b", 2, 10);
    let schema = store.schema.clone().unwrap();
    // One waiter dead (past its deadline) on each resource, one alive on a.
    pg_exec(
        &store.url,
        &format!(
            "INSERT INTO {schema}.waiters (resource, owner, deadline) VALUES
               ('a', 'dead-a', clock_timestamp() - interval '1 minute'),
               ('b', 'dead-b', clock_timestamp() - interval '1 minute'),
               ('a', 'alive', clock_timestamp() + interval '1 hour')"
        ),
    );
    let json = store
        .fence()
        .args(["prune", "a", "--older-than", "1d", "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(json["events_deleted"], 4, "{json}");
    assert_eq!(json["waiters_deleted"], 1, "{json}");
    assert!(store.events("a").is_empty());
    assert_eq!(store.events("b").len(), 4);
    let waiters = |sql: &str| -> Vec<String> {
        pg_query(
            &store.url,
            &format!("SELECT owner FROM {schema}.waiters {sql} ORDER BY id"),
        )
        .iter()
        .map(|row| row.get(0))
        .collect()
    };
    assert_eq!(waiters(""), ["dead-b", "alive"]);
    // Every resource: b's dead waiter goes, the live one stays; nothing is old enough now.
    let json = store
        .fence()
        .args(["prune", "--older-than", "30d", "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(json["events_deleted"], 0, "{json}");
    assert_eq!(json["waiters_deleted"], 1, "{json}");
    assert_eq!(waiters(""), ["alive"]);
    assert_eq!(store.events("b").len(), 4);
}

/// A store that does not exist (a typo'd --schema) is refused (exit 2, naming the schema) and
/// left as it is (no schema created); the directory store prunes by itself and says so (exit
/// 2); a bad duration is a usage error.
#[test]
fn nothing_to_prune_and_other_stores() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    let out = store
        .fence()
        .args(["prune", "--older-than", "30d", "--format", "json"])
        .run()
        .expect(2);
    assert_eq!(out.json()["error"], "usage");
    assert!(
        out.json()["message"].as_str().unwrap().contains(&schema),
        "{out:?}"
    );
    let exists = pg_query(
        &store.url,
        &format!("SELECT count(*) FROM pg_namespace WHERE nspname = '{schema}'"),
    );
    assert_eq!(exists[0].get::<_, i64>(0), 0, "prune created the schema");

    let file = Store::file();
    file.fence().args(["acquire", "x"]).run().expect(0);
    let out = file
        .fence()
        .args(["prune", "--older-than", "30d", "--format", "json"])
        .run()
        .expect(2);
    assert_eq!(out.json()["error"], "usage");
    assert!(
        out.json()["hint"]
            .as_str()
            .unwrap()
            .contains("10,000 events"),
        "{out:?}"
    );
    assert_eq!(file.events("x").len(), 1);
    let s3 = Store::new(common::Backend::S3);
    let out = s3
        .fence()
        .args(["prune", "--older-than", "30d", "--format", "json"])
        .run()
        .expect(2);
    assert!(
        out.json()["message"]
            .as_str()
            .unwrap()
            .contains("PostgreSQL stores only"),
        "{out:?}"
    );
    store
        .fence()
        .args(["prune", "--older-than", "a month"])
        .run()
        .expect(2);
    store.fence().args(["prune"]).run().expect(2);
}

/// The lines of `fence prune --help`'s examples, exactly as shown.
fn help_examples() -> Vec<String> {
    let out = Command::new(common::fence_bin())
        .args(["prune", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    help.lines()
        .filter_map(|line| line.strip_prefix("  "))
        .filter(|line| line.starts_with("fence prune "))
        .map(str::to_owned)
        .collect()
}

/// The documented cron line (the block after `<!-- prune-cron -->`), exactly as shown.
fn readme_examples() -> Vec<String> {
    common::doc_sh_block("<!-- prune-cron -->")
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn help_examples_run_as_written() {
    let examples = help_examples();
    assert_eq!(examples.len(), 3, "{examples:?}");
    let store = Store::postgres();
    cycle(&store, "nightly-report", 2);
    cycle(&store, "other", 1);
    age(&store, "nightly-report", 2, 10);
    age(&store, "other", 1, 40);
    let run = |example: &str| {
        let bin = std::path::Path::new(env!("CARGO_BIN_EXE_fence"))
            .parent()
            .unwrap();
        let out = Command::new("sh")
            .args(["-c", example])
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("HOME", store.home.path())
            .env("FENCE_STORE", &store.url)
            .env("FENCE_SCHEMA", store.schema.as_ref().unwrap())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "`{example}`: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    // 30 days: only `other`'s events are that old.
    assert!(run(&examples[0]).starts_with("deleted 2 events"));
    assert!(store.events("other").is_empty());
    assert_eq!(store.events("nightly-report").len(), 4);
    // 7 days, keeping 100: nightly-report's 4 events are all among its last 100.
    assert!(run(&examples[1]).starts_with("deleted 0 events"));
    assert_eq!(store.events("nightly-report").len(), 4);
    let json: Value = serde_json::from_str(run(&examples[2]).trim()).unwrap();
    assert_eq!(json["events_deleted"], 0);
    assert_eq!(store.events("nightly-report").len(), 4);

    // The README's cron line: silent; a month kept, and the last 100 of each resource.
    let readme = readme_examples();
    assert_eq!(readme.len(), 1, "{readme:?}");
    let schema = store.schema.as_ref().unwrap();
    pg_exec(
        &store.url,
        &format!(
            "INSERT INTO {schema}.events (resource, at, kind, owner, token)
             SELECT 'other', now() - interval '40 days', 'renewed', 'o', i
             FROM generate_series(1, 200) AS i"
        ),
    );
    assert_eq!(run(&readme[0]), "");
    assert_eq!(tokens(&store, "other"), (101..=200).collect::<Vec<i64>>());
    assert_eq!(store.events("nightly-report").len(), 4);
}

/// A role that may read fence's tables but not delete from them is told what prune needs
/// (exit 2), and nothing is deleted.
#[test]
fn a_role_without_delete_is_told_what_prune_needs() {
    let store = Store::postgres();
    cycle(&store, "a", 1);
    let schema = store.schema.clone().unwrap();
    let (role, url) = common::pg_limited_role(5);
    pg_exec(
        &store.url,
        &format!(
            "GRANT USAGE ON SCHEMA {schema} TO {role};
             GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role};
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role};"
        ),
    );
    let home = tempfile::tempdir().unwrap();
    let out = common::Fence::bare(home.path())
        .args(["--store", &url, "--schema", &schema])
        .args(["prune", "--older-than", "0s", "--format", "json"])
        .run()
        .expect(2);
    let json = out.json();
    assert!(
        json["message"]
            .as_str()
            .unwrap()
            .contains("permission denied"),
        "{json}"
    );
    assert!(
        json["hint"]
            .as_str()
            .unwrap()
            .contains("DELETE on its `events`"),
        "{json}"
    );
    assert_eq!(store.events("a").len(), 2);
}

/// The connection lost after a batch was sent: exit 8 (the batch may have been deleted),
/// saying to run it again; run again, it finishes the job.
#[test]
fn a_connection_lost_midway_is_outcome_unknown() {
    let store = Store::postgres();
    cycle(&store, "a", 2);
    age(&store, "a", 2, 40);
    let proxy = common::proxy::Proxy::start(
        common::pg_upstream(),
        common::proxy::Mode::CutWhenClientSends(b"WITH cut AS".to_vec()),
    );
    let via = common::pg_url_via(proxy.addr());
    let schema = store.schema.clone().unwrap();
    let home = tempfile::tempdir().unwrap();
    let out = common::Fence::bare(home.path())
        .args(["--store", &via, "--schema", &schema])
        .args(["prune", "--older-than", "30d", "--format", "json"])
        .run()
        .expect(8);
    let json = out.json();
    assert_eq!(json["error"], "outcome_unknown", "{json}");
    assert!(
        json["hint"]
            .as_str()
            .unwrap()
            .contains("run the same `fence prune` again"),
        "{json}"
    );
    assert_eq!(proxy.cuts(), 1);
    let json = store
        .fence()
        .args(["prune", "--older-than", "30d", "--format", "json"])
        .run()
        .expect(0)
        .json();
    // The cut batch may or may not have committed; either way nothing old is left.
    assert!(store.events("a").is_empty(), "{json}");
    assert_eq!(store.lease("a").map(|l| l.1), Some(2));
}

/// Issue 33, 5: `prune` keeps what `fence run --id` rests on. A run id completed by one
/// command, then everything pruned (`--older-than 0s`): the same id with other arguments is
/// still refused (exit 6 `id_reused`, not started), and with the same command it is still
/// skipped as completed (exit 0, nothing run).
#[test]
fn prune_keeps_what_run_ids_rest_on() {
    let store = Store::postgres();
    let home = tempfile::tempdir().unwrap();
    let marker = home.path().join("ran");
    let run = |args: &[&str]| {
        store
            .fence()
            .args(["run", "day", "--id", "day1", "--format", "json", "--"])
            .args(args)
            .run()
    };
    run(&["true"]).expect(0);
    store
        .fence()
        .args(["prune", "--older-than", "0s"])
        .run()
        .expect(0);
    let touch = format!("touch '{}'", marker.display());
    let out = run(&["sh", "-c", &touch]);
    assert_eq!(out.code, 6, "{out:?}");
    assert_eq!(out.json()["reason"], "id_reused", "{out:?}");
    assert!(!marker.exists(), "the other command ran");
    let out = run(&["true"]).expect(0);
    assert_eq!(out.json()["skipped"], true, "{out:?}");
}

/// Issue 33, 5: `prune` deletes coordinator history only. A write id applied to a target in
/// the store's own database (same schema), then everything pruned: the same write again is a
/// replay (exit 0, `replayed`, its SQL not run again), and other SQL under that id is still
/// refused (exit 6 `id_reused`).
#[test]
fn prune_leaves_write_ids_alone() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    let table = format!("{schema}.ledger");
    let token = store
        .fence()
        .acquire("r", &["--owner", "a"])
        .token
        .to_string();
    pg_exec(&store.url, &format!("CREATE TABLE {table} (v int)"));
    let write = |sql: &str| {
        store
            .fence()
            .args([
                "write", "r", "--token", &token, "--owner", "a", "--id", "w1",
            ])
            .args(["--target", &store.url, "--format", "json", "--sql", sql])
            .run()
    };
    let insert = format!("INSERT INTO {table} VALUES (1)");
    write(&insert).expect(0);
    store
        .fence()
        .args(["prune", "--older-than", "0s"])
        .run()
        .expect(0);
    let again = write(&insert).expect(0);
    assert_eq!(again.json()["replayed"], true, "{again:?}");
    let other = write(&format!("INSERT INTO {table} VALUES (2)"));
    assert_eq!(other.code, 6, "{other:?}");
    assert_eq!(other.json()["reason"], "id_reused", "{other:?}");
    let rows: i64 = pg_query(&store.url, &format!("SELECT count(*) FROM {table}"))[0].get(0);
    assert_eq!(rows, 1, "a write id's SQL ran twice");
}
