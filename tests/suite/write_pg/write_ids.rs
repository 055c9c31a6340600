//! Write ids (issue 20; objects in tests/suite/write_object/object_ids.rs): `fence write --id KEY` is applied at most once per
//! resource, whoever writes it and with whatever token, and re-running the command after an
//! `outcome_unknown` (exit 8) gives a definite answer. Asserted on row counts and the ledger:
//! - the connection cut after the whole transaction was sent: exit 8, then the same command
//!   exits 0, in both orders (the commit landed → replayed; it did not → applied now);
//! - A then B (newer token) with one id: B replays; B with a new id writes; A with a new id
//!   after B is stale;
//! - the same id with other SQL: exit 6 (`id_reused`), nothing run; the ledger row keeps the
//!   digest of the SQL that used the id, and a row without one (fence before version 4)
//!   replays whatever comes;
//! - the README's "publish exactly once" cron recipes (PostgreSQL; objects on `file://`, S3 and
//!   GCS), each run twice in a row and twice at once.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::proxy::{Mode, Proxy};
use common::{wait_for, Out, Store};

const COMMIT_QUERY: &[u8] = b"COMMIT\0";

fn schema(store: &Store) -> &str {
    store.schema.as_deref().unwrap()
}

fn count(store: &Store, table: &str) -> i64 {
    common::pg_query(&store.url, &format!("SELECT count(*) FROM {table}"))[0].get(0)
}

fn setup(store: &Store) -> String {
    let table = format!("{}.published", schema(store));
    common::pg_exec(
        &store.url,
        &format!(
            "CREATE SCHEMA IF NOT EXISTS {s}; CREATE TABLE {table} (what text)",
            s = schema(store)
        ),
    );
    table
}

fn write(store: &Store, target: &str, token: i64, id: &str, sql: &str) -> Out {
    store
        .fence()
        .args([
            "write",
            "r",
            "--token",
            &token.to_string(),
            "--target",
            target,
        ])
        .args(["--id", id, "--sql", sql, "--format", "json"])
        .run()
}

fn acquire(store: &Store, owner: &str) -> i64 {
    store
        .fence()
        .args([
            "acquire", "r", "--ttl", "100ms", "--owner", owner, "--format", "json",
        ])
        .run()
        .expect(0)
        .json()["token"]
        .as_i64()
        .unwrap()
}

/// Cuts the connection right after the message holding COMMIT reached the server.
fn cut_write(store: &Store, token: i64, id: &str, sql: &str) -> Out {
    let cut = Proxy::start(
        common::pg_upstream(),
        Mode::CutWhenClientSends(COMMIT_QUERY.to_vec()),
    );
    let out = write(store, &common::pg_url_via(cut.addr()), token, id, sql);
    assert_eq!(cut.cuts(), 1, "the proxy never saw COMMIT: {out:?}");
    cut.wait_backends_gone(&store.url);
    out
}

#[test]
fn rerunning_after_outcome_unknown_gives_a_definite_answer_in_both_orders() {
    let store = Store::postgres();
    let table = setup(&store);
    let token = acquire(&store, "a");
    // The schema exists before the cut write, so the cut write is the one message.
    write(&store, &store.url, token, "warm-up", "SELECT 1").expect(0);

    // 1. The commit landed: the server had the whole message and the statement is quick.
    let sql = format!("INSERT INTO {table} VALUES ('landed')");
    let out = cut_write(&store, token, "k-landed", &sql);
    assert_eq!(out.code, 8, "{out:?}");
    assert_eq!(count(&store, &table), 1, "the commit landed");
    let again = write(&store, &store.url, token, "k-landed", &sql)
        .expect(0)
        .json();
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["applied"]["token"], token);
    assert_eq!(count(&store, &table), 1, "published once");

    // 2. It did not land: the statement outlives the server's check of the client's socket
    //    (1 s), which finds it gone and rolls back.
    let sql = format!("INSERT INTO {table} VALUES ('lost'); SELECT pg_sleep(3)");
    let out = cut_write(&store, token, "k-lost", &sql);
    assert_eq!(out.code, 8, "{out:?}");
    assert_eq!(count(&store, &table), 1, "the commit did not land");
    let again = write(&store, &store.url, token, "k-lost", &sql)
        .expect(0)
        .json();
    assert_eq!(again["replayed"], false, "{again}");
    assert_eq!(count(&store, &table), 2);
    let third = write(&store, &store.url, token, "k-lost", &sql)
        .expect(0)
        .json();
    assert_eq!(third["replayed"], true, "{third}");
    assert_eq!(count(&store, &table), 2, "applied once");
}

#[test]
fn an_id_is_applied_once_across_owners_and_tokens() {
    let store = Store::postgres();
    let table = setup(&store);
    let sql = format!("INSERT INTO {table} VALUES ('report')");
    let a = acquire(&store, "a");
    write(&store, &store.url, a, "daily", &sql).expect(0);
    // A's 100ms lease runs out; B takes over with a newer token.
    wait_for("A's lease to expire", Duration::from_secs(10), || {
        store
            .fence()
            .args(["acquire", "r", "--owner", "b", "--ttl", "1m"])
            .run()
            .code
            == 0
    });
    let b = store.lease("r").unwrap().1;
    assert!(b > a);
    let replay = write(&store, &store.url, b, "daily", &sql).expect(0).json();
    assert_eq!(replay["replayed"], true);
    assert_eq!(replay["applied"]["owner"], serde_json::Value::Null);
    assert_eq!(count(&store, &table), 1);
    // A replay advances nothing: the guard still holds A's token.
    let guard: i64 = common::pg_query(
        &store.url,
        &format!(
            "SELECT highest_token FROM {}.guards WHERE resource = 'r'",
            schema(&store)
        ),
    )[0]
    .get(0);
    assert_eq!(guard, a);
    write(&store, &store.url, b, "other", &sql).expect(0);
    assert_eq!(count(&store, &table), 2);
    // A, stale now, with a new id: refused; with the old id: the answer is still "applied".
    write(&store, &store.url, a, "late", &sql).expect(4);
    let old = write(&store, &store.url, a, "daily", &sql).expect(0).json();
    assert_eq!(old["replayed"], true);
    assert_eq!(count(&store, &table), 2);
    // inspect --id: the ledger entry, and a clear answer for an id never applied.
    let inspect = |id: &str| {
        store
            .fence()
            .args([
                "inspect", "r", "--target", &store.url, "--id", id, "--format", "json",
            ])
            .run()
            .expect(0)
            .json()
    };
    let seen = inspect("daily");
    assert_eq!(seen["applied"], true, "{seen}");
    assert_eq!(seen["entry"]["token"], a);
    assert_eq!(inspect("other")["entry"]["token"], b);
    assert_eq!(inspect("never")["applied"], false);
    let human = store
        .fence()
        .args(["inspect", "r", "--target", &store.url, "--id", "never"])
        .run()
        .expect(0);
    assert!(human.stdout.contains("not in the ledger"), "{human:?}");
}

#[test]
fn ids_are_for_the_transaction_form() {
    let store = Store::postgres();
    let out = store
        .fence()
        .args(["write", "r", "--token", "1", "--target", &store.url])
        .args(["--id", "x", "--table", "t", "--key", "id=1", "--set", "v=2"])
        .run()
        .expect(2);
    assert!(out.stderr.contains("--id"), "{out:?}");
}

/// The README's recipe, run as written by `sh` with the environment it names.
fn publish_once(store: &Store, bin: &std::path::Path, recipe: &str) -> std::process::Child {
    Command::new("sh")
        .args(["-c", recipe])
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("HOME", store.home.path())
        .env("FENCE_STORE", &store.url)
        .env("FENCE_SCHEMA", schema(store))
        // The table lives in the test's own schema: put it on the search_path.
        .env(
            "DB",
            format!("{}?options=-csearch_path%3D{}", store.url, schema(store)),
        )
        .spawn()
        .unwrap()
}

#[test]
fn the_readme_publish_once_recipe_publishes_once() {
    let recipe = common::doc_sh_block("<!-- recipe-once -->");
    let recipe = recipe.as_str();
    let store = Store::postgres();
    common::pg_exec(
        &store.url,
        &format!(
            "CREATE SCHEMA IF NOT EXISTS {s}; CREATE TABLE {s}.published (day date)",
            s = schema(&store)
        ),
    );
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_fence"), bin.path().join("fence")).unwrap();
    // Twice in a row, then twice at once.
    for _ in 0..2 {
        let status = publish_once(&store, bin.path(), recipe).wait().unwrap();
        assert!(status.success());
    }
    let both = [
        publish_once(&store, bin.path(), recipe),
        publish_once(&store, bin.path(), recipe),
    ];
    for mut child in both {
        assert!(child.wait().unwrap().success());
    }
    assert_eq!(count(&store, &format!("{}.published", schema(&store))), 1);
}

/// The README's object recipe, run as written by `sh` in a directory holding `report.csv`,
/// against a coordinator and an object of the same kind: twice in a row, then twice at once.
/// One effect: the object was written once (one version, the run's write id), and the run is
/// recorded as completed.
fn the_readme_object_recipe_publishes_once(backend: common::Backend) {
    let recipe = common::doc_sh_block("<!-- recipe-once-object -->");
    let recipe = recipe.as_str();
    let store = Store::new(backend);
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("report.csv"), "day,total\n").unwrap();
    let (object, read): (String, Box<dyn Fn() -> common::objects::Stored>) = match backend {
        common::Backend::File => {
            let path = work.path().join("published.csv");
            let sidecar = work.path().join(".published.csv.fence.json");
            (
                format!("file://{}", path.display()),
                Box::new(move || {
                    let meta: serde_json::Value =
                        serde_json::from_slice(&std::fs::read(&sidecar).unwrap()).unwrap();
                    assert_eq!(meta["generation"], 1, "written once: {meta}");
                    common::objects::Stored {
                        body: std::fs::read(&path).unwrap(),
                        metadata: meta["metadata"]
                            .as_object()
                            .unwrap()
                            .iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                            .collect(),
                        version: meta["generation"].as_u64().map(|g| g.to_string()),
                    }
                }),
            )
        }
        _ => {
            let (server, prefix) = store.server();
            let key = format!("{prefix}/published.csv");
            let server = server.clone();
            (
                server.url(&key),
                Box::new(move || server.get(&key).unwrap()),
            )
        }
    };
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_fence"), bin.path().join("fence")).unwrap();
    let spawn = || {
        let mut sh = Command::new("sh");
        sh.args(["-c", recipe])
            .current_dir(work.path())
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", bin.path().display()))
            .env("HOME", store.home.path())
            .env("FENCE_STORE", &store.url)
            .env("OBJECT", &object);
        if let Some((server, _)) = &store.objects {
            sh.envs(server.env());
        }
        sh.spawn().unwrap()
    };
    for _ in 0..2 {
        assert!(spawn().wait().unwrap().success());
    }
    let both = [spawn(), spawn()];
    for mut child in both {
        assert!(child.wait().unwrap().success());
    }
    let stored = read();
    assert_eq!(stored.body, b"day,total\n");
    let id = stored.metadata["fence-id"].clone();
    assert!(
        id.starts_with("publish-") && id.ends_with("-upload"),
        "{id}"
    );
    assert_eq!(
        stored.metadata.get("fence-ids"),
        None,
        "one write: {stored:?}"
    );
    let day = id.trim_end_matches("-upload");
    let done = store
        .fence()
        .args([
            "inspect",
            &format!("publish#done:{day}"),
            "--format",
            "json",
        ])
        .run()
        .expect(0)
        .json();
    assert_eq!(done["resources"][0]["token"], 1, "{done}");
}

#[test]
fn the_readme_object_recipe_publishes_once_on_file_objects() {
    the_readme_object_recipe_publishes_once(common::Backend::File);
}

#[test]
fn the_readme_object_recipe_publishes_once_on_s3() {
    the_readme_object_recipe_publishes_once(common::Backend::S3);
}

#[test]
fn the_readme_object_recipe_publishes_once_on_gcs() {
    the_readme_object_recipe_publishes_once(common::Backend::Gcs);
}

/// One id, two different writes: the second (other SQL) is refused as a conflict, after the
/// ledger row recorded the first's digest; the first again is a replay. A ledger row without
/// a digest (written by fence before target schema version 4) replays any SQL, as it did.
#[test]
fn an_id_used_for_other_sql_is_a_conflict() {
    let store = Store::postgres();
    let table = setup(&store);
    let extract = format!("INSERT INTO {table} VALUES ('extract')");
    let load = format!("INSERT INTO {table} VALUES ('load')");
    let token = acquire(&store, "a");
    write(&store, &store.url, token, "run-7", &extract).expect(0);
    let digest: Option<String> = common::pg_query(
        &store.url,
        &format!(
            "SELECT digest FROM {}.write_ledger WHERE resource = 'r' AND write_id = 'run-7'",
            schema(&store)
        ),
    )[0]
    .get(0);
    assert_eq!(digest, Some(common::write_digest(extract.as_bytes())));

    let reused = write(&store, &store.url, token, "run-7", &load);
    assert_eq!(reused.code, 6, "{reused:?}");
    let json = reused.json();
    assert_eq!(json["error"], "conflict", "{json}");
    assert_eq!(json["reason"], "id_reused", "{json}");
    assert_eq!(json["write_id"], "run-7", "{json}");
    assert_eq!(json["applied_token"], token, "{json}");
    assert!(
        json["message"]
            .as_str()
            .unwrap()
            .contains("different write")
            && json["hint"].as_str().unwrap().contains("its own --id"),
        "{json}"
    );
    let again = write(&store, &store.url, token, "run-7", &extract)
        .expect(0)
        .json();
    assert_eq!(again["replayed"], true, "{again}");
    let rows: Vec<String> = common::pg_query(&store.url, &format!("SELECT what FROM {table}"))
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, ["extract"]);

    common::pg_exec(
        &store.url,
        &format!("UPDATE {}.write_ledger SET digest = NULL", schema(&store)),
    );
    let legacy = write(&store, &store.url, token, "run-7", &load)
        .expect(0)
        .json();
    assert_eq!(legacy["replayed"], true, "{legacy}");
    assert_eq!(count(&store, &table), 1);
}
