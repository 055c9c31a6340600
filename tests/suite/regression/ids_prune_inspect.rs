//! A second adversarial review: write ids on objects and PostgreSQL, `fence run --id`,
//! `fence prune`, streamed `fence inspect` and `fence doctor`'s connection sizing, attacked
//! the way careless users, hostile users and dying machines would. Each test names its attack
//! and asserts the fail-closed or durable outcome on the real state (objects, sidecars, rows,
//! files). A test marked `Fixed FINDING` failed on the code it was written against (the
//! comment says what happened then) and is kept as a regression test; one marked `FINDING`
//! and ignored is open.

use crate::common;
use common::{acquire, release};

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::objects::Stored;
use common::{pg_exec, pg_query, wait_for, Backend, Fence, Out, Store};
use serde_json::Value;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// `fence write RESOURCE --token T --target TARGET --from <body> [--id ID]`, JSON.
fn write_object(
    store: &Store,
    resource: &str,
    token: i64,
    target: &str,
    id: Option<&str>,
    body: &[u8],
) -> Out {
    write_object_as(store, "writer", resource, token, target, id, body)
}

/// [`write_object`] by `owner`.
fn write_object_as(
    store: &Store,
    owner: &str,
    resource: &str,
    token: i64,
    target: &str,
    id: Option<&str>,
    body: &[u8],
) -> Out {
    let file = tempfile::NamedTempFile::new_in(store.home.path()).unwrap();
    std::fs::write(file.path(), body).unwrap();
    let mut fence = store
        .fence()
        .args(["write", resource, "--token", &token.to_string()])
        .args(["--target", target, "--owner", owner, "--format", "json"])
        .args([std::ffi::OsStr::new("--from"), file.path().as_os_str()]);
    if let Some(id) = id {
        fence = fence.args(["--id", id]);
    }
    fence.run()
}

/// A `file://` object's sidecar (`.<name>.fence.json`) as JSON.
fn sidecar(dir: &Path, name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join(format!(".{name}.fence.json"))).unwrap())
        .unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// An object target and a way to read it back, on S3 (moto), GCS or `file://`.
struct Object<'a> {
    store: &'a Store,
    dir: Option<tempfile::TempDir>,
}

impl<'a> Object<'a> {
    fn new(store: &'a Store) -> Object<'a> {
        let dir = (store.backend == Backend::File).then(|| tempfile::tempdir().unwrap());
        Object { store, dir }
    }

    fn key(&self, name: &str) -> String {
        format!("{}/objects/{name}", self.store.server().1)
    }

    fn target(&self, name: &str) -> String {
        match &self.dir {
            Some(dir) => format!("file://{}/{name}", dir.path().display()),
            None => self.store.server().0.url(&self.key(name)),
        }
    }

    fn stored(&self, name: &str) -> Option<Stored> {
        match &self.dir {
            Some(dir) => {
                let body = std::fs::read(dir.path().join(name)).ok()?;
                let metadata = sidecar(dir.path(), name)["metadata"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                    .collect();
                let version = sidecar(dir.path(), name)["generation"]
                    .as_u64()
                    .map(|g| g.to_string());
                Some(Stored {
                    body,
                    metadata,
                    version,
                })
            }
            None => self.store.server().0.get(&self.key(name)),
        }
    }
}

macro_rules! per_object_store {
    ($($name:ident),* $(,)?) => {
        mod s3 { $( #[test] fn $name() { super::$name(&crate::common::Store::new(crate::common::Backend::S3)) } )* }
        mod gcs { $( #[test] fn $name() { super::$name(&crate::common::Store::new(crate::common::Backend::Gcs)) } )* }
        mod file { $( #[test] fn $name() { super::$name(&crate::common::Store::new(crate::common::Backend::File)) } )* }
    };
}

// ---------------------------------------------------------------------------------------
// 1. Write ids on objects
// ---------------------------------------------------------------------------------------

/// Holds: ids are compared byte for byte on every object store: `Nightly-1` and `nightly-1`
/// are two writes (a store that folded case would skip the second), and a 64-byte id made of
/// every punctuation fence accepts replays exactly.
fn ids_differ_by_case_and_odd_ids_replay(store: &Store) {
    let object = Object::new(store);
    let target = object.target("obj");
    let token = acquire(store, "res", "A");
    let first = write_object(store, "res", token, &target, Some("Nightly-1"), b"one");
    assert_eq!(first.expect(0).json()["replayed"], false);
    let other = write_object(store, "res", token, &target, Some("nightly-1"), b"two");
    assert_eq!(other.expect(0).json()["replayed"], false);
    assert_eq!(object.stored("obj").unwrap().body, b"two");
    let odd = format!("{}.:@+_-", "Zz9".repeat(19));
    assert_eq!(odd.len(), 63);
    let odd = format!("{odd}x");
    write_object(store, "res", token, &target, Some(&odd), b"three").expect(0);
    let again = write_object(store, "res", token, &target, Some(&odd), b"three").expect(0);
    assert_eq!(again.json()["replayed"], true, "{again:?}");
    let again = write_object(store, "res", token, &target, Some("Nightly-1"), b"one").expect(0);
    assert_eq!(again.json()["replayed"], true, "{again:?}");
    let stored = object.stored("obj").unwrap();
    assert_eq!(stored.body, b"three");
    assert_eq!(stored.metadata["fence-id"], odd);
}

/// Non-ASCII resource and owner names (UTF-8 is legal in both) in the object's metadata.
/// GCS and `file://` (holds): they survive, the second write of the same resource is not
/// refused as "another resource's object", and a newer token still wins.
/// Fixed FINDING (S3): the first write stored them (moto kept the raw bytes) and every later
/// read of the object failed to parse its metadata, so every fenced write of it was exit 7
/// "unavailable, check the endpoint and the credentials" for good. S3 metadata is ASCII:
/// such names are refused before anything is sent (exit 2).
fn non_ascii_names_survive_object_metadata(store: &Store) {
    let object = Object::new(store);
    let target = object.target("obj");
    let resource = "café-über";
    if store.backend == Backend::S3 {
        let token = acquire(store, "res", "A");
        write_object(store, "res", token, &target, None, b"one").expect(0);
        let owner = write_object_as(store, "José", "res", token, &target, None, b"two");
        assert_eq!(owner.code, 2, "{owner:?}");
        let other = acquire(store, resource, "A");
        let named = write_object(store, resource, other, &target, None, b"two");
        assert_eq!(named.code, 2, "{named:?}");
        assert!(named.json()["message"]
            .as_str()
            .unwrap()
            .contains("not ASCII"));
        assert_eq!(object.stored("obj").unwrap().body, b"one");
        return;
    }
    let a = acquire(store, resource, "José");
    let write =
        |token, id, body: &[u8]| write_object_as(store, "José", resource, token, &target, id, body);
    write(a, Some("w-1"), b"one").expect(0);
    write(a, Some("w-2"), b"two").expect(0);
    release(store, resource, "José", a);
    let b = acquire(store, resource, "Zoë");
    write(b, None, b"three").expect(0);
    let stale = write(a, None, b"stale");
    assert_eq!(stale.code, 4, "{stale:?}");
    assert_eq!(object.stored("obj").unwrap().body, b"three");
}

per_object_store!(
    ids_differ_by_case_and_odd_ids_replay,
    non_ascii_names_survive_object_metadata
);

/// Fixed FINDING: a `file://` target may name fence's own bookkeeping beside another object:
/// `fence write other --token <other's> --target file:///d/.obj.fence.json` replaced obj's
/// sidecar with whatever bytes the writer chose, so a holder of any lease could lower obj's
/// stored token (a stale writer of obj's resource then got through: exit 0) or forge its
/// write ids. fence's own files (`.<name>.fence.json`, `.fence.next.json`, `.fence.lock`,
/// `.fence-tmp-…`) are not objects: exit 2, nothing written.
#[test]
fn a_file_target_cannot_name_fence_s_own_bookkeeping() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let target = |name: &str| format!("file://{}/{name}", dir.path().display());
    let old = acquire(&store, "res", "A");
    release(&store, "res", "A", old);
    let new = acquire(&store, "res", "B");
    write_object(&store, "res", new, &target("obj"), Some("real"), b"new").expect(0);
    let before = sidecar(dir.path(), "obj");

    let other = acquire(&store, "other", "M");
    let mut forged = before.clone();
    forged["metadata"]["fence-token"] = "1".into();
    forged["metadata"]["fence-id"] = "publish-today".into();
    for name in [
        ".obj.fence.json",
        ".obj.fence.next.json",
        ".obj.fence.lock",
        ".fence-tmp-1-0000000000000000",
    ] {
        let out = write_object(
            &store,
            "other",
            other,
            &target(name),
            None,
            forged.to_string().as_bytes(),
        );
        assert_eq!(out.code, 2, "{name}: {out:?}");
    }
    assert_eq!(sidecar(dir.path(), "obj"), before);
    assert!(!dir.path().join(".obj.fence.next.json").exists());
    let stale = write_object(&store, "res", old, &target("obj"), None, b"stale");
    assert_eq!(stale.code, 4, "{stale:?}");
    assert_eq!(std::fs::read(dir.path().join("obj")).unwrap(), b"new");
}

/// Holds: metadata forged by a raw writer fails closed. A raw PUT claiming a huge token for
/// the resource makes every fenced write stale (exit 4, bytes unchanged) and `inspect
/// --target` flags the token as never issued; entries of `fence-ids` that do not parse are
/// ignored, never taken as "applied".
#[test]
fn forged_object_metadata_fails_closed() {
    let store = Store::new(Backend::S3);
    let object = Object::new(&store);
    let token = acquire(&store, "res", "A");
    let target = object.target("obj");
    write_object(&store, "res", token, &target, Some("w-1"), b"fenced").expect(0);
    let (server, _) = store.server();
    let key = object.key("obj");
    server.put_with_metadata(
        &key,
        b"raw",
        &[
            ("fence-resource", "res"),
            ("fence-token", "999999999"),
            ("fence-ids", "w-2;w-3,x,1,v;,5,1,v;w-4,5,1"),
        ],
    );
    let out = write_object(&store, "res", token, &target, Some("w-2"), b"late");
    assert_eq!(out.code, 4, "{out:?}");
    assert_eq!(out.json()["highest_token"], 999_999_999);
    let stored = object.stored("obj").unwrap();
    assert_eq!(stored.body, b"raw");
    let seen = store
        .fence()
        .args(["inspect", "res", "--target", &target, "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(seen["integrity_ok"], false, "{seen}");
    assert_eq!(seen["warnings"][0]["kind"], "target_ahead", "{seen}");
    for id in ["w-2", "w-3", "w-4"] {
        let seen = store
            .fence()
            .args(["inspect", "res", "--target", &target, "--id", id])
            .args(["--format", "json"])
            .run()
            .expect(0)
            .json();
        assert_eq!(seen["applied"], false, "{id}: {seen}");
    }
}

/// Holds: eight concurrent writers of one `file://` object with one id, each with bytes of its
/// own: exactly one writes, the others are refused as other writes under an applied id (exit
/// 6, `id_reused`; the flock orders them), and the object has one version.
#[test]
fn concurrent_writers_of_one_id_on_a_file_object_land_once() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let target = format!("file://{}/obj", dir.path().display());
    let token = acquire(&store, "res", "A");
    let outs: Vec<Out> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|n| {
                let (store, target) = (&store, &target);
                scope.spawn(move || {
                    write_object(
                        store,
                        "res",
                        token,
                        target,
                        Some("once"),
                        format!("from {n}").as_bytes(),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let written = outs.iter().filter(|out| out.code == 0).count();
    assert_eq!(written, 1, "{outs:?}");
    for out in outs.iter().filter(|out| out.code != 0) {
        assert_eq!(
            (out.code, out.json()["reason"].as_str()),
            (6, Some("id_reused")),
            "{out:?}"
        );
    }
    assert_eq!(sidecar(dir.path(), "obj")["generation"], 1);
}

/// Fixed FINDING (shared directories, which the README recommends for a group): fence opened
/// its lock files following symbolic links and then gave the file it found the directory's
/// mode. Another member of the group who planted `.obj.fence.lock` → a victim's private file
/// had that file made group- and world-writable (0600 → 0666 here) by the victim's next
/// fenced write. The directory store's lock, high-water and log files were opened the same
/// way: the high-water write overwrote the first 21 bytes of whatever the link named, the log
/// appended to it. A symbolic link is never fence's file: the write fails, the file it names
/// is left alone.
#[test]
fn planted_symlinks_in_a_shared_directory_are_not_followed() {
    let victims = tempfile::tempdir().unwrap();
    let victim = |name: &str| {
        let path = victims.path().join(name);
        std::fs::write(&path, b"private: do not touch\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    };
    let untouched = |path: &Path| {
        assert_eq!(mode(path), 0o600, "{}", path.display());
        assert_eq!(
            std::fs::read(path).unwrap(),
            b"private: do not touch\n",
            "{}",
            path.display()
        );
    };

    // A `file://` object in a directory everyone may write.
    let store = Store::file();
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let lock = victim("lock");
    std::os::unix::fs::symlink(&lock, shared.path().join(".obj.fence.lock")).unwrap();
    let token = acquire(&store, "res", "A");
    let target = format!("file://{}/obj", shared.path().display());
    let out = write_object(&store, "res", token, &target, None, b"bytes");
    assert_ne!(out.code, 0, "{out:?}");
    untouched(&lock);
    assert!(!shared.path().join("obj").exists());

    // A directory store shared the same way.
    let store = Store::file();
    store.fence().args(["init"]).run().expect(0);
    let dir = store.dir();
    for sub in ["", "locks", "tokens", "events", "leases"] {
        std::fs::set_permissions(dir.join(sub), std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    for (sub, file) in [
        ("locks", "res.lock"),
        ("tokens", "res.high"),
        ("events", "res.jsonl"),
    ] {
        let path = victim(file);
        std::os::unix::fs::symlink(&path, dir.join(sub).join(file)).unwrap();
        let out = store
            .fence()
            .args(["acquire", "res", "--owner", "A", "--ttl", "1m"])
            .run();
        assert_ne!(out.code, 0, "{sub}: {out:?}");
        untouched(&path);
        std::fs::remove_file(dir.join(sub).join(file)).unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// 1b. Write ids on PostgreSQL
// ---------------------------------------------------------------------------------------

/// The test table of `store`'s schema, created fresh: `<schema>_t(n int)`.
fn pg_table(store: &Store) -> String {
    let table = format!("{}_t", store.schema.as_ref().unwrap());
    pg_exec(
        &store.url,
        &format!("DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (n int)"),
    );
    table
}

fn pg_write(store: &Store, token: i64, id: &str, sql: &str) -> Out {
    store
        .fence()
        .args(["write", "res", "--token", &token.to_string()])
        .args(["--target", &store.url, "--id", id, "--sql", sql])
        .args(["--format", "json"])
        .run()
}

/// Holds: the caller's own SQL raising fence's "already applied" SQLSTATE (LF011, with a
/// DETAIL shaped like the ledger's) is the caller's failure (exit 1, `sql_failed`, rolled
/// back), never "replayed": only fence's guard, before the SQL, speaks for the ledger; and
/// the id stays unused, so the next write with it applies.
#[test]
fn the_caller_s_sql_cannot_fake_a_replay() {
    let store = Store::postgres();
    let table = pg_table(&store);
    let token = acquire(&store, "res", "A");
    let fake = format!(
        "INSERT INTO {table} VALUES (1); DO $$ BEGIN RAISE EXCEPTION 'write x of res was already applied' \
         USING ERRCODE = 'LF011', DETAIL = '{{\"applied_at\": 1, \"token\": 1, \"owner\": \"x\"}}'; END $$"
    );
    let out = pg_write(&store, token, "pub-1", &fake);
    assert_eq!(out.code, 1, "{out:?}");
    assert_eq!(out.json()["error"], "sql_failed", "{out:?}");
    let count = |sql: &str| pg_query(&store.url, sql)[0].get::<_, i64>(0);
    assert_eq!(count(&format!("SELECT count(*) FROM {table}")), 0);
    let out = pg_write(
        &store,
        token,
        "pub-1",
        &format!("INSERT INTO {table} VALUES (2)"),
    );
    assert_eq!(out.expect(0).json()["replayed"], false);
    assert_eq!(count(&format!("SELECT count(*) FROM {table}")), 1);
    // Ids are case-sensitive on PostgreSQL too.
    let out = pg_write(
        &store,
        token,
        "PUB-1",
        &format!("INSERT INTO {table} VALUES (3)"),
    );
    assert_eq!(out.expect(0).json()["replayed"], false);
    assert_eq!(count(&format!("SELECT count(*) FROM {table}")), 2);
    pg_exec(&store.url, &format!("DROP TABLE {table}"));
}

// ---------------------------------------------------------------------------------------
// 5. `fence doctor`: connection sizing
// ---------------------------------------------------------------------------------------

/// Fixed FINDING: the connection-sizing check read its answer as one `|`-joined line, so a
/// role whose name holds a `|` (legal, quoted) split into too many fields and the check said
/// nothing at all: no warning for a role with CONNECTION LIMIT 4 or none. The check now
/// warns for it, naming the role quoted as SQL needs it.
#[test]
fn doctor_sizes_a_role_whose_name_holds_a_bar() {
    let role = format!("ops|jobs\"{}", crate::common::process_tag());
    let quoted = format!("\"{}\"", role.replace('"', "\"\""));
    let db = common::env_or_panic("FENCE_TEST_PG_DB");
    pg_exec(
        &common::pg_superuser(),
        &format!(
            "CREATE ROLE {quoted} LOGIN PASSWORD 'bar-secret' CONNECTION LIMIT 4;
             GRANT CONNECT ON DATABASE {db} TO {quoted};"
        ),
    );
    let url = format!(
        "postgres://{}:bar-secret@{}:{}/{db}?sslmode=disable",
        percent(&role),
        common::env_or_panic("FENCE_TEST_PG_HOST"),
        common::env_or_panic("FENCE_TEST_PG_PORT"),
    );
    let home = tempfile::tempdir().unwrap();
    let out = Fence::bare(home.path())
        .args(["--store", &url, "doctor", "--format", "json"])
        .run();
    let json = out.json();
    pg_exec(
        &common::pg_superuser(),
        &format!("REVOKE CONNECT ON DATABASE {db} FROM {quoted}; DROP ROLE {quoted}"),
    );
    let found: Vec<&Value> = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "postgres.connections")
        .collect();
    assert_eq!(found.len(), 1, "{json}");
    assert_eq!(found[0]["severity"], "warn", "{json}");
    let message = found[0]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("role `{role}` has CONNECTION LIMIT 4")),
        "{json}"
    );
    let fix = found[0]["fix"].as_str().unwrap();
    assert!(
        fix.contains(&format!("ALTER ROLE {quoted} CONNECTION LIMIT 10")),
        "{fix}"
    );
}

/// Fixed FINDING: the schema-owner check (a target whose fence schema the connecting role
/// owns: `protect` does not hold against it) read its answer split on `|` too, so when the
/// role's name held one it said nothing: no warning for exactly the set-up it exists to catch.
#[test]
fn doctor_flags_a_schema_owner_whose_name_holds_a_bar() {
    let role = format!("own|er\"{}", crate::common::process_tag());
    let quoted = format!("\"{}\"", role.replace('"', "\"\""));
    let schema = format!("bar_owned_{}", crate::common::process_tag());
    let db = common::env_or_panic("FENCE_TEST_PG_DB");
    pg_exec(
        &common::pg_superuser(),
        &format!(
            "CREATE ROLE {quoted} LOGIN PASSWORD 'bar-secret' CONNECTION LIMIT 20;
             GRANT CONNECT ON DATABASE {db} TO {quoted};
             CREATE SCHEMA {schema} AUTHORIZATION {quoted};"
        ),
    );
    let url = format!(
        "postgres://{}:bar-secret@{}:{}/{db}?sslmode=disable",
        percent(&role),
        common::env_or_panic("FENCE_TEST_PG_HOST"),
        common::env_or_panic("FENCE_TEST_PG_PORT"),
    );
    let home = tempfile::tempdir().unwrap();
    let out = Fence::bare(home.path())
        .args([
            "--store", &url, "--schema", &schema, "doctor", "--target", &url,
        ])
        .args(["--format", "json"])
        .run();
    let json = out.json();
    pg_exec(
        &common::pg_superuser(),
        &format!(
            "DROP SCHEMA {schema} CASCADE; REVOKE CONNECT ON DATABASE {db} FROM {quoted}; DROP ROLE {quoted}"
        ),
    );
    let owner: Vec<&Value> = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "postgres.schema_owner" && f["subject"] != "store")
        .collect();
    assert_eq!(owner.len(), 1, "{json}");
    assert_eq!(owner[0]["severity"], "fail", "{json}");
    assert!(
        owner[0]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("the connecting role `{role}`")),
        "{json}"
    );
}

fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// 4. `fence inspect`, streamed
// ---------------------------------------------------------------------------------------

/// `n` released resources `res-00001`… straight into the store's tables, plus `extra` names.
fn fill(store: &Store, n: u32, extra: &[&str]) {
    store.fence().args(["init"]).run().expect(0);
    let schema = store.schema.clone().unwrap();
    pg_exec(
        &store.url,
        &format!(
            "INSERT INTO {schema}.leases (resource, owner, token, ttl_ms, last_event)
             SELECT format('res-%s', lpad(i::text, 5, '0')), 'holder', i, 1000, 'released'
             FROM generate_series(1, {n}) AS i"
        ),
    );
    for name in extra {
        store.pg_rows(
            &format!(
                "INSERT INTO {schema}.leases (resource, owner, token, ttl_ms, last_event) \
                 VALUES ($1, 'holder', 1, 1000, 'released')"
            ),
            name,
        );
    }
}

fn names(json: &Value) -> Vec<String> {
    json["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["resource"].as_str().unwrap().to_owned())
        .collect()
}

/// Fixed FINDING: a streamed answer (more than 1,000 resources) escaped control characters
/// per line but kept newlines, so a name holding a newline (which fence refuses, but any
/// writer of the table can store) printed a line of its own, here a fake row saying
/// `deploy` is held by `root`. Each cell is made one line before it is laid out.
#[test]
fn a_streamed_answer_keeps_one_line_per_resource() {
    let store = Store::postgres();
    let fake = "evil\ndeploy  held   root    99";
    fill(&store, 1100, &[fake, "zz\u{1b}[2Jclear"]);
    let out = store.fence().args(["inspect"]).run().expect(0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    // The store line, the header, one line per resource.
    assert_eq!(lines.len(), 2 + 1102, "{}", &out.stdout[..400]);
    assert!(
        !lines.iter().any(|l| l.starts_with("deploy")),
        "a fake row was printed"
    );
    assert!(!out.stdout.contains('\u{1b}'));
    let json = store
        .fence()
        .args(["inspect", "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert!(names(&json).iter().any(|n| n == fake));

    // A small answer, as one report with each resource's last events: the same.
    let store = Store::postgres();
    fill(&store, 0, &[fake]);
    let schema = store.schema.clone().unwrap();
    store.pg_rows(
        &format!(
            "INSERT INTO {schema}.events (resource, kind, owner, token) VALUES ($1, 'acquired', 'holder', 1)"
        ),
        fake,
    );
    let out = store
        .fence()
        .args(["inspect", "--history", "1"])
        .run()
        .expect(0);
    assert!(
        !out.stdout.lines().any(|l| l.starts_with("deploy")),
        "{}",
        out.stdout
    );
}

/// Holds: resources created and changed between the pages of a streamed answer (the second
/// page's read held at a proxy meanwhile) are never listed twice or out of order; every
/// resource that existed throughout is listed once, and one created after the cursor is
/// listed too.
#[test]
fn resources_changing_between_pages_are_never_repeated_or_skipped() {
    let store = Store::postgres();
    fill(&store, 2000, &[]);
    let proxy = common::proxy::Proxy::start(
        common::pg_upstream(),
        common::proxy::Mode::HoldWhenClientSends(b"res-01000".to_vec()),
    );
    let via = common::pg_url_via(proxy.addr());
    let home = tempfile::tempdir().unwrap();
    let schema = store.schema.clone().unwrap();
    let out = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            Fence::bare(home.path())
                .args(["--store", &via, "--schema", &schema])
                .args(["inspect", "--format", "json"])
                .run()
        });
        wait_for("the second page's read", Duration::from_secs(30), || {
            proxy.held() == 1
        });
        for name in ["res-00000-new", "res-01500-new", "zzz-new"] {
            acquire(&store, name, "late");
        }
        let token = acquire(&store, "res-00001", "late");
        release(&store, "res-00001", "late", token);
        acquire(&store, "res-01999", "late");
        proxy.open();
        reader.join().unwrap()
    });
    let json = out.expect(0).json();
    assert_eq!(json["ok"], true);
    let got = names(&json);
    assert!(got.windows(2).all(|w| w[0] < w[1]), "repeated or unordered");
    for i in 1..=2000 {
        assert!(
            got.binary_search(&format!("res-{i:05}")).is_ok(),
            "res-{i:05} skipped"
        );
    }
    assert!(got.binary_search(&"res-01500-new".to_owned()).is_ok());
    assert!(got.binary_search(&"zzz-new".to_owned()).is_ok());
}

/// Holds: `--limit` that ends exactly at the last resource names a cursor ("more may
/// follow"), and the page after it is empty and says so: a loop over pages ends.
#[test]
fn a_cursor_past_the_last_resource_ends_the_pages() {
    let store = Store::postgres();
    fill(&store, 1500, &[]);
    for limit in ["1500", "3"] {
        let after = if limit == "3" { "res-01497" } else { "" };
        let mut args = vec!["inspect", "--format", "json", "--limit", limit];
        if !after.is_empty() {
            args.extend(["--after", after]);
        }
        let page = store.fence().args(&args).run().expect(0).json();
        assert_eq!(page["next_after"], "res-01500", "{limit}");
        let next = store
            .fence()
            .args(["inspect", "--format", "json", "--limit", limit])
            .args(["--after", "res-01500"])
            .run()
            .expect(0)
            .json();
        assert_eq!(names(&next), Vec::<String>::new());
        assert!(next.get("next_after").is_none(), "{next}");
    }
}

/// Fixed FINDING: names that differ only by an invisible character (a zero-width space,
/// U+200B, legal in a name) printed identically for people, so `inspect` showed `deploy` held
/// by two owners at once, or the wrong `deploy` free. Invisible format characters are shown
/// escaped, like control and bidi characters.
#[test]
fn names_that_differ_invisibly_are_shown_apart() {
    let store = Store::postgres();
    acquire(&store, "deploy", "alice");
    acquire(&store, "deploy\u{200b}", "mallory");
    let out = store.fence().args(["inspect"]).run().expect(0);
    assert!(!out.stdout.contains('\u{200b}'), "{}", out.stdout);
    assert!(out.stdout.contains("deploy\\u{200b}"), "{}", out.stdout);
}

// ---------------------------------------------------------------------------------------
// 2. `fence run --id`
// ---------------------------------------------------------------------------------------

/// `fence run r --id ID -- sh -c 'echo ran >> log; SCRIPT'` in the store's home.
fn run_once(store: &Store, id: &str, script: &str) -> Out {
    let log = store.home.path().join("log");
    store
        .fence()
        .args(["run", "r", "--ttl", "2s", "--id", id, "--", "sh", "-c"])
        .args([format!("echo ran >> '{}'; {script}", log.display())])
        .run()
}

fn runs(store: &Store) -> usize {
    std::fs::read_to_string(store.home.path().join("log"))
        .unwrap_or_default()
        .lines()
        .count()
}

/// Fixed FINDING: the completion record was an ordinary resource, so anyone who may acquire
/// resources faked a completed run by acquiring `r#done:ID` themselves: the next `fence run r
/// --id ID` started nothing and exited 0, "already completed by `mallory`" (the day's work
/// silently never ran). `#done:` names are reserved: acquire, renew, release, run and write
/// refuse them (exit 2), and the run runs.
#[test]
fn acquiring_the_completion_record_directly_does_not_fake_a_run() {
    let store = Store::file();
    for verb in [
        &[
            "acquire",
            "r#done:day-1",
            "--owner",
            "mallory",
            "--ttl",
            "1s",
        ][..],
        &["run", "r#done:day-1", "--", "true"],
        &[
            "release",
            "r#done:day-1",
            "--owner",
            "mallory",
            "--token",
            "1",
        ],
    ] {
        let out = store.fence().args(verb).run();
        assert_eq!(out.code, 2, "{verb:?}: {out:?}");
        assert!(out.stderr.contains("reserved"), "{out:?}");
    }
    run_once(&store, "day-1", "exit 0").expect(0);
    assert_eq!(runs(&store), 1, "the run was skipped");
}

/// Holds: the completion record survives `fence prune --older-than 0s`: the record is a lease
/// row, which prune never touches, and prune keeps its events too (they hold the digest of the
/// command that completed it; `prune.rs` `prune_keeps_what_run_ids_rest_on`).
#[test]
fn a_completed_run_stays_completed_after_prune() {
    let store = Store::postgres();
    run_once(&store, "day-1", "exit 0").expect(0);
    store
        .fence()
        .args(["prune", "--older-than", "0s"])
        .run()
        .expect(0);
    let kept: Vec<String> = store
        .events("r#done:day-1")
        .into_iter()
        .map(|(kind, _, _)| kind)
        .collect();
    assert_eq!(kept, ["acquired", "released"]);
    let again = run_once(&store, "day-1", "exit 0").expect(0);
    assert!(again.stderr.contains("already completed"), "{again:?}");
    assert_eq!(runs(&store), 1);
}

/// Holds: the coordinator's connection killed by the server while the command runs (a
/// failover, an admin's pg_terminate_backend) does not lose the completion record: fence
/// records it on a fresh connection, and the next run with the id is skipped.
#[test]
fn a_run_whose_connection_died_meanwhile_is_still_recorded() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    // Exits 3 unless fence's connection was there to kill.
    let kill = format!(
        "n=$(psql -X -tA -c \"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE pid <> pg_backend_pid() AND query LIKE '%{schema}.%'\" '{}'); [ \"$n\" -ge 1 ] || exit 3",
        store.url
    );
    // A TTL far above what a reconnect can take on a loaded machine: the run must ride out
    // the killed connection, not race its lease.
    let log = store.home.path().join("log");
    store
        .fence()
        .args([
            "run", "r", "--ttl", "30s", "--id", "day-1", "--", "sh", "-c",
        ])
        .args([format!("echo ran >> '{}'; {kill}", log.display())])
        .run()
        .expect(0);
    assert!(store.lease("r#done:day-1").is_some(), "not recorded");
    // The same command (another one under a completed id is refused, not skipped).
    let again = run_once(&store, "day-1", &kill).expect(0);
    assert!(again.stderr.contains("already completed"), "{again:?}");
    assert_eq!(runs(&store), 1);
}

/// Holds: fence killed (SIGKILL) while its command runs records nothing, even though the
/// command did its work: the next run with the id, once the lease expired, runs again
/// (the README's "never a skip of work not done").
#[test]
fn a_killed_fence_run_is_not_recorded_as_completed() {
    let store = Store::file();
    // The command's parent is the reaper; the reaper's parent is fence.
    let out = run_once(
        &store,
        "day-1",
        "kill -9 $(awk '{print $4}' /proc/$PPID/stat); sleep 5",
    );
    assert_eq!(out.code, -1, "fence died of SIGKILL: {out:?}");
    // The directory store's name of the record `r#done:day-1`.
    let record = store.dir().join("leases").join("r%23done%3Aday-1.json");
    assert!(!record.exists());
    wait_for("the lease to expire", Duration::from_secs(30), || {
        store
            .fence()
            .args(["inspect", "r", "--format", "json"])
            .run()
            .json()["resources"][0]["state"]
            != "held"
    });
    run_once(&store, "day-1", "exit 0").expect(0);
    assert_eq!(runs(&store), 2);
    assert!(record.exists());
}

/// Holds: the completion check failing (the connection cut as it asks) fails closed: the
/// command never starts, the exit status is not 0, and the run's lease is released.
#[test]
fn a_failed_completion_check_starts_nothing() {
    let store = Store::postgres();
    store.fence().args(["init"]).run().expect(0);
    let proxy = common::proxy::Proxy::start(
        common::pg_upstream(),
        common::proxy::Mode::CutWhenClientSends(b"r#done:day-1".to_vec()),
    );
    let home = tempfile::tempdir().unwrap();
    let log = home.path().join("log");
    let out = Fence::bare(home.path())
        .args(["--store", &common::pg_url_via(proxy.addr())])
        .args(["--schema", store.schema.as_deref().unwrap()])
        .args([
            "run", "r", "--ttl", "30s", "--id", "day-1", "--", "sh", "-c",
        ])
        .args([format!("echo ran >> '{}'", log.display())])
        .run();
    assert!(out.code != 0 && out.code != 3, "{out:?}");
    assert_eq!(proxy.cuts(), 1);
    assert!(!log.exists(), "the command ran");
    let (_, _, live) = store.lease("r").unwrap();
    assert!(!live, "the run's lease was left held");
}

// ---------------------------------------------------------------------------------------
// 3. `fence prune`
// ---------------------------------------------------------------------------------------

/// Holds: prune deleting every event (`--older-than 0s`, no `--keep`) again and again while
/// three resources are granted and released never makes a token repeat or go down: tokens
/// come from the lease rows, which prune never touches.
#[test]
fn prune_during_grants_never_lowers_a_token() {
    let store = Store::postgres();
    store.fence().args(["init"]).run().expect(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    let tokens: Vec<Vec<i64>> = std::thread::scope(|scope| {
        let workers: Vec<_> = ["a", "b", "c"]
            .into_iter()
            .map(|resource| {
                let (store, done) = (&store, &done);
                scope.spawn(move || {
                    let mut seen = Vec::new();
                    for _ in 0..15 {
                        let token = acquire(store, resource, "o");
                        release(store, resource, "o", token);
                        seen.push(token);
                    }
                    done.store(true, std::sync::atomic::Ordering::SeqCst);
                    seen
                })
            })
            .collect();
        let mut prunes = 0;
        while !done.load(std::sync::atomic::Ordering::SeqCst) || prunes < 3 {
            store
                .fence()
                .args(["prune", "--older-than", "0s"])
                .run()
                .expect(0);
            prunes += 1;
        }
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    for (resource, seen) in ["a", "b", "c"].into_iter().zip(tokens) {
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{resource}: {seen:?}");
        let (_, token, _) = store.lease(resource).unwrap();
        assert_eq!(token, *seen.last().unwrap());
        let next = acquire(&store, resource, "o");
        assert_eq!(next, token + 1);
    }
}

/// Holds: odd durations, counts and names never widen what prune deletes: a negative or
/// malformed age and a negative `--keep` are usage errors, an age past the epoch deletes
/// nothing, and a name written as SQL is only a name.
#[test]
fn prune_arguments_are_taken_literally() {
    let store = Store::postgres();
    for resource in ["a", "b"] {
        let token = acquire(&store, resource, "o");
        release(&store, resource, "o", token);
    }
    let events = |store: &Store| store.events("a").len() + store.events("b").len();
    assert_eq!(events(&store), 4);
    for args in [
        &["--older-than", "-1s"][..],
        &["--older-than", "1 day; DROP"],
        &["--older-than", "0s", "--keep", "-1"],
        &["--older-than", "0s", "--keep", "4294967296"],
    ] {
        let out = store.fence().args(["prune"]).args(args).run();
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
    }
    store
        .fence()
        .args(["prune", "--older-than", "100000000y"])
        .run()
        .expect(0);
    store
        .fence()
        .args(["prune", "--older-than", "0s", "--keep", "4294967295"])
        .run()
        .expect(0);
    store
        .fence()
        .args([
            "prune",
            "--older-than",
            "0s",
            "x') OR true --",
            "a' OR 'a'='a",
        ])
        .run()
        .expect(0);
    assert_eq!(events(&store), 4);
    let schema = store.schema.clone().unwrap();
    assert_eq!(
        pg_query(&store.url, &format!("SELECT count(*) FROM {schema}.leases"))[0].get::<_, i64>(0),
        2
    );
}

// ---------------------------------------------------------------------------------------
// 1c. More on ids: damaged `file://` state, and two PostgreSQL writers with one id
// ---------------------------------------------------------------------------------------

/// Holds: a damaged next sidecar (a torn or hand-edited `.obj.fence.next.json`) is dropped,
/// never applied: the object keeps its token and ids, and a stale writer is still refused. A
/// damaged sidecar itself stops every write (exit 1, nothing written) instead of letting the
/// object count as unfenced.
#[test]
fn damaged_file_object_state_fails_closed() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let target = format!("file://{}/obj", dir.path().display());
    let old = acquire(&store, "res", "A");
    release(&store, "res", "A", old);
    let new = acquire(&store, "res", "B");
    write_object(&store, "res", new, &target, Some("w-1"), b"new").expect(0);
    let next = dir.path().join(".obj.fence.next.json");
    std::fs::write(&next, b"{\"generation\": 9, \"metadata\": {\"fence-tok").unwrap();
    let stale = write_object(&store, "res", old, &target, None, b"stale");
    assert_eq!(stale.code, 4, "{stale:?}");
    assert!(!next.exists());
    let replay = write_object(&store, "res", new, &target, Some("w-1"), b"new").expect(0);
    assert_eq!(replay.json()["replayed"], true);

    let side = dir.path().join(".obj.fence.json");
    std::fs::write(&side, b"{\"generation\": 1, \"metad").unwrap();
    let out = write_object(&store, "res", old, &target, None, b"stale");
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.json()["message"].as_str().unwrap().contains("damaged"));
    assert_eq!(std::fs::read(dir.path().join("obj")).unwrap(), b"new");
}

/// Holds: two `fence write --id` of one write (one id, the same SQL) on PostgreSQL at once
/// (both past the ledger check, both waiting on the guard row, held by a test transaction):
/// one applies, the other answers "replayed" (exit 0), and the row is inserted once.
#[test]
fn two_postgres_writers_of_one_id_at_once_apply_once() {
    let store = Store::postgres();
    let table = pg_table(&store);
    let token = acquire(&store, "res", "A");
    pg_write(&store, token, "warm-up", "SELECT 1").expect(0);
    let schema = store.schema.clone().unwrap();
    let gate = common::RowLock::hold(&store.url, &format!("{schema}.guards"));
    let outs: Vec<Out> = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let (store, table) = (&store, &table);
                scope.spawn(move || {
                    pg_write(
                        store,
                        token,
                        "once",
                        &format!("INSERT INTO {table} VALUES (7)"),
                    )
                })
            })
            .collect();
        wait_for(
            "both writers at the guard row",
            Duration::from_secs(30),
            || common::lock_waiters(&store.url, &schema, "begin_write_once") == 2,
        );
        gate.release();
        writers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let replayed: Vec<bool> = outs
        .into_iter()
        .map(|out| out.expect(0).json()["replayed"].as_bool().unwrap())
        .collect();
    assert_eq!(replayed.iter().filter(|r| **r).count(), 1, "{replayed:?}");
    let rows = pg_query(&store.url, &format!("SELECT count(*) FROM {table}"));
    assert_eq!(rows[0].get::<_, i64>(0), 1);
    pg_exec(&store.url, &format!("DROP TABLE {table}"));
}

/// Holds: an id replayed after the object was removed by hand and then written by another
/// resource is that resource's object now: exit 6 ("another resource's object"), neither
/// "replayed" (its ledger is the other resource's) nor written.
#[test]
fn an_id_replayed_on_an_object_another_resource_took_over_is_a_conflict() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let target = format!("file://{}/obj", dir.path().display());
    let token = acquire(&store, "res", "A");
    write_object(&store, "res", token, &target, Some("pub-1"), b"mine").expect(0);
    for name in ["obj", ".obj.fence.json"] {
        std::fs::remove_file(dir.path().join(name)).unwrap();
    }
    let other = acquire(&store, "other", "B");
    write_object(&store, "other", other, &target, Some("pub-1"), b"theirs").expect(0);
    let out = write_object(&store, "res", token, &target, Some("pub-1"), b"mine");
    assert_eq!(out.code, 6, "{out:?}");
    assert_eq!(std::fs::read(dir.path().join("obj")).unwrap(), b"theirs");
}

/// Holds: two runs of one id at once, the second waiting (`--wait`) behind the first: the
/// first records its completion before it releases the lease, so the second, granted the
/// lease, finds the record and starts nothing. The command ran once.
fn a_waiting_run_of_a_completed_id_starts_nothing(store: &Store) {
    let gate = store.home.path().join("gate");
    let log = store.home.path().join("log");
    let run = |extra: &[&str]| {
        let mut fence = store
            .fence()
            .args(["run", "r", "--ttl", "30s", "--id", "day-1"])
            .args(extra)
            .args(["--", "sh", "-c"])
            .args([format!(
                "echo ran >> '{}'; while [ ! -e '{}' ]; do sleep 0.05; done",
                log.display(),
                gate.display()
            )]);
        fence
            .cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        fence.cmd.spawn().unwrap()
    };
    let first = run(&[]);
    wait_for("the first run's command", Duration::from_secs(30), || {
        log.exists()
    });
    let second = run(&["--wait", "1m"]);
    wait_for("the second run to queue", Duration::from_secs(30), || {
        store
            .fence()
            .args(["inspect", "r", "--format", "json"])
            .run()
            .json()["resources"][0]["waiters"]
            .as_array()
            .is_some_and(|w| w.len() == 1)
            || store.backend == Backend::File
    });
    std::fs::write(&gate, b"").unwrap();
    let first = common::wait_output("the first run", first, Duration::from_secs(60));
    let second = common::wait_output("the second run", second, Duration::from_secs(60));
    assert!(first.status.success(), "{first:?}");
    assert!(second.status.success(), "{second:?}");
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("already completed"),
        "{second:?}"
    );
    assert_eq!(runs(store), 1);
}

per_backend!(a_waiting_run_of_a_completed_id_starts_nothing);

/// Documented limit (README, *Write ids on objects*): a put that bypasses fence replaces an S3
/// or GCS object's metadata, so the object forgets its token and its ids: an old id writes
/// again, and on GCS a token below the last fenced one is accepted. On S3 the coordinator is
/// asked for the highest token right before the put (issue 32, 5), which refuses the old
/// token all the same. On a `file://` object the sidecar stays: the token and the ids survive
/// a plain write of the file.
fn a_raw_overwrite_resets_what_the_object_remembers(store: &Store) {
    let object = Object::new(store);
    let target = object.target("obj");
    let old = acquire(store, "res", "A");
    release(store, "res", "A", old);
    let new = acquire(store, "res", "B");
    write_object(store, "res", new, &target, Some("pub-1"), b"fenced").expect(0);
    match &object.dir {
        Some(dir) => std::fs::write(dir.path().join("obj"), b"raw").unwrap(),
        None => store.server().0.put(&object.key("obj"), b"raw"),
    }
    let stale = write_object(store, "res", old, &target, None, b"stale");
    let replay = write_object(store, "res", new, &target, Some("pub-1"), b"fenced").expect(0);
    if object.dir.is_some() {
        assert_eq!(stale.code, 4, "{stale:?}");
        assert_eq!(replay.json()["replayed"], true, "{replay:?}");
        assert_eq!(object.stored("obj").unwrap().body, b"raw");
    } else {
        let asks_the_coordinator = store.backend == common::Backend::S3;
        assert_eq!(
            stale.code,
            if asks_the_coordinator { 4 } else { 0 },
            "{stale:?}"
        );
        assert_eq!(replay.json()["replayed"], false, "{replay:?}");
        assert_eq!(object.stored("obj").unwrap().body, b"fenced");
    }
}

mod raw {
    per_object_store!(a_raw_overwrite_resets_what_the_object_remembers);
    use super::a_raw_overwrite_resets_what_the_object_remembers;
}
