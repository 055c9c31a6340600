//! A fourth adversarial review: write ids on `file://` objects and PostgreSQL targets,
//! `fence inspect --id`, `fence run --id` completion records and `--metrics-file`, `fence
//! grant` / `fence protect` / `fence doctor`, `fence prune`, `file://` target names, and the
//! README's once-a-day recipes run as written — attacked the way careless users (a typo'd
//! schema, an `rm` of a published file, one id for two writes, a crontab, hosts in two time
//! zones, a token left in the environment), hostile local users and roles (a writer that may
//! create roles, a reader holding a lock) and dying or busy machines (`kill -9` mid-write, a
//! full disk, a stop signal, a leftover job) would. Each test asserts on durable state read
//! without fence (object bytes and sidecars, table rows and ledgers, a log the command appends
//! to, a metrics file); a test marked `FINDING` and ignored shows an open defect and fails
//! until it is fixed (`--run-ignored ignored-only` runs them).

use crate::common;
use common::own_db::OwnDb;
use common::{acquire, release};

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{pg_exec, pg_query, pg_try_exec, wait_for, Fence, Out, Store};
use serde_json::Value;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// `fence write RESOURCE --token T --target TARGET --from <body> [--id ID] [extra]`, JSON.
fn write_object(
    store: &Store,
    resource: &str,
    token: i64,
    target: &str,
    id: Option<&str>,
    body: &[u8],
    extra: &[&str],
) -> Out {
    let file = tempfile::NamedTempFile::new_in(store.home.path()).unwrap();
    std::fs::write(file.path(), body).unwrap();
    let mut fence = store
        .fence()
        .args(["write", resource, "--token", &token.to_string()])
        .args(["--target", target, "--owner", "writer", "--format", "json"])
        .args([std::ffi::OsStr::new("--from"), file.path().as_os_str()])
        .args(extra);
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

fn log_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

// ---------------------------------------------------------------------------------------
// 1. A `file://` object removed by hand: its sidecar still knows the highest token
// ---------------------------------------------------------------------------------------

/// A careless operator removes a published file (`rm report.csv`, to "regenerate it") while
/// its sidecar, which fence keeps beside it, still records token `new` and the write ids.
/// The displaced owner's late write with token `old` < `new` should still be refused (the
/// sidecar is right there, unlike an S3 object's metadata), and the generation should not
/// start again at 1 (the README: "`file://` generations never repeat").
#[test]
fn a_removed_file_object_still_refuses_a_stale_token() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let target = format!("file://{}/report.csv", dir.path().display());
    let old = acquire(&store, "report", "A");
    release(&store, "report", "A", old);
    let new = acquire(&store, "report", "B");
    write_object(&store, "report", new, &target, Some("pub-1"), b"v1", &[]).expect(0);
    write_object(&store, "report", new, &target, Some("pub-2"), b"v2", &[]).expect(0);
    assert_eq!(sidecar(dir.path(), "report.csv")["generation"], 2);
    // The operator removes the file, not knowing about the hidden sidecar.
    std::fs::remove_file(dir.path().join("report.csv")).unwrap();
    assert_eq!(
        sidecar(dir.path(), "report.csv")["metadata"]["fence-token"],
        new.to_string()
    );
    // The stale owner's late write, then (the file removed again if it landed) a replay of
    // pub-1. Every way it goes wrong is collected, so the failure says all of it.
    let mut wrong = Vec::new();
    let stale = write_object(&store, "report", old, &target, None, b"stale", &[]);
    if stale.code != 4 {
        wrong.push(format!(
            "stale token {old} < {new}: exit {} ({})",
            stale.code,
            stale.stdout.trim()
        ));
    }
    let generation = sidecar(dir.path(), "report.csv")["generation"]
        .as_u64()
        .unwrap();
    if generation < 2 {
        wrong.push(format!("the generation went back to {generation}"));
    }
    let _ = std::fs::remove_file(dir.path().join("report.csv"));
    let replay = write_object(&store, "report", new, &target, Some("pub-1"), b"v1", &[]);
    if replay.code != 0 || replay.json()["replayed"] != true {
        wrong.push(format!("pub-1 wrote again: {}", replay.stdout.trim()));
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

// ---------------------------------------------------------------------------------------
// 2. `fence inspect R --target URL --id KEY` where fence's schema or directory is not
// ---------------------------------------------------------------------------------------

/// After exit 8 the README says: `fence inspect R --target URL --id KEY`. An operator who
/// forgets the `--schema` the job used (it came from FENCE_SCHEMA in the crontab) asks a
/// schema that does not exist: the answer must not be "never applied there" with exit 0,
/// `applied: false` — the write did land — and the read-only question must create nothing.
#[test]
fn inspect_id_in_a_missing_schema_does_not_say_never_applied() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    let table = format!("{schema}_pub");
    pg_exec(&store.url, &format!("CREATE TABLE {table} (what text)"));
    let token = acquire(&store, "pub", "A");
    store
        .fence()
        .args(["write", "pub", "--token", &token.to_string()])
        .args(["--target", &store.url, "--id", "day-1"])
        .args(["--sql", &format!("INSERT INTO {table} VALUES ('x')")])
        .run()
        .expect(0);
    let rows: i64 = pg_query(&store.url, &format!("SELECT count(*) FROM {table}"))[0].get(0);
    assert_eq!(rows, 1);
    // Without the job's --schema (the default `fence`, absent from this database, or some
    // other schema name).
    let missing = format!("{schema}_typo");
    let out = Fence::bare(store.home.path())
        .args(["inspect", "pub", "--target", &store.url, "--id", "day-1"])
        .args(["--schema", &missing, "--format", "json"])
        .run();
    let created: i64 = pg_query(
        &store.url,
        &format!("SELECT count(*) FROM pg_namespace WHERE nspname = '{missing}'"),
    )[0]
    .get(0);
    pg_exec(
        &store.url,
        &format!("DROP SCHEMA IF EXISTS {missing} CASCADE; DROP TABLE {table}"),
    );
    assert_eq!(created, 0, "a read-only inspect created a schema");
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stdout.contains(&missing), "{out:?}");
}

/// The same question about a `file://` object in a directory that does not exist (a typo):
/// `fence write` to it is exit 2 (the directory is missing); `inspect --id` should not
/// answer "never applied" with exit 0 either.
#[test]
fn inspect_id_in_a_missing_directory_does_not_say_never_applied() {
    let store = Store::file();
    let target = format!("file://{}/no-such-dir/obj", store.home.path().display());
    let token = acquire(&store, "pub", "A");
    let write = write_object(&store, "pub", token, &target, Some("day-1"), b"x", &[]);
    assert_eq!(write.code, 2, "{write:?}");
    let out = store
        .fence()
        .args(["inspect", "pub", "--target", &target, "--id", "day-1"])
        .args(["--format", "json"])
        .run();
    assert_eq!(out.code, 2, "{out:?}");
}

// ---------------------------------------------------------------------------------------
// 3. `fence grant` and roles that can make themselves more than a fenced writer
// ---------------------------------------------------------------------------------------

/// A database of its own (see `OwnDb`), with what these tests do in it.
struct Db(OwnDb);

impl std::ops::Deref for Db {
    type Target = OwnDb;
    fn deref(&self) -> &OwnDb {
        &self.0
    }
}

impl Db {
    fn new(tag: &str) -> Db {
        Db(OwnDb::new("rev4", tag))
    }

    fn contents(&self, table: &str) -> Vec<String> {
        pg_query(
            &self.admin(),
            &format!("SELECT t::text FROM {table} t ORDER BY 1"),
        )
        .iter()
        .map(|r| r.get(0))
        .collect()
    }

    /// The admin's side of the README's roles recipe for `role`: a table `ledger` the role
    /// may write, fence's schema, `ledger` protected for resource `r`, a current token
    /// written once through fence (so the guard row exists). Returns the token.
    fn protected_ledger(&self, role: &str, attributes: &str) -> i64 {
        let _ = pg_try_exec(&self.admin(), &format!("DROP ROLE IF EXISTS {role}"));
        pg_exec(
            &self.admin(),
            &format!(
                "CREATE ROLE {role} LOGIN {attributes};
                 CREATE TABLE ledger (day date PRIMARY KEY, amount int NOT NULL);
                 INSERT INTO ledger VALUES ('2026-12-01', 1);
                 GRANT SELECT, INSERT, UPDATE, DELETE ON ledger TO {role};"
            ),
        );
        self.fence()
            .args(["init", "--target", &self.admin_url()])
            .run()
            .expect(0);
        self.fence()
            .args(["protect", "--target", &self.admin_url()])
            .args(["--table", "ledger", "--resource", "r"])
            .run()
            .expect(0);
        let token: i64 = self
            .fence()
            .args(["acquire", "r", "--ttl", "1m", "--format", "json"])
            .run()
            .expect(0)
            .json()["token"]
            .as_i64()
            .unwrap();
        self.fence()
            .args(["write", "r", "--token", &token.to_string()])
            .args(["--target", &self.admin_url(), "--sql", "SELECT 1"])
            .run()
            .expect(0);
        token
    }

    fn drop_role(&self, role: &str) {
        let server = OwnDb::server();
        let _ = pg_try_exec(
            &server,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
        let _ = pg_try_exec(&server, &format!("DROP ROLE IF EXISTS {role}"));
    }
}

/// The raw session of a writer that forges the proof of `begin_write`: a `bindings` row for
/// its own transaction with the current token, and the `fence.*` settings, then a write to
/// the protected table — no lease, no guard check, no write event.
fn forged_write(token: i64) -> String {
    format!(
        "BEGIN;
         INSERT INTO fence.bindings (txid, resource, token) VALUES (txid_current(), 'r', {token});
         SELECT set_config('fence.resource', 'r', true), set_config('fence.token', '{token}', true),
                set_config('fence.txid', txid_current()::text, true);
         UPDATE ledger SET amount = 666;
         COMMIT;"
    )
}

/// Holds: a role that may already write every table (`pg_write_all_data`, PostgreSQL 14+),
/// fence's `bindings` included, is refused by `fence grant`, as the README promises for "one
/// that may write fence's tables".
#[test]
fn grant_refuses_a_member_of_pg_write_all_data() {
    let db = Db::new("wad");
    let role = format!("rev4_wad_{}", std::process::id());
    db.protected_ledger(&role, "IN ROLE pg_write_all_data");
    let out = db
        .fence()
        .args(["grant", "--target", &db.admin_url(), "--role", &role])
        .run();
    db.drop_role(&role);
    assert_eq!(out.code, 2, "{out:?}");
}

/// A writer role created with CREATEROLE (common for an application that manages its own
/// users) is accepted by `fence grant`. On PostgreSQL 15 a CREATEROLE role may grant itself
/// membership in any non-superuser role, `pg_write_all_data` included, and then forge a
/// `bindings` row: the protected table is written without a lease or `begin_write`, so a
/// displaced holder (or no holder at all) writes past `fence protect`. `fence grant` should
/// refuse it (or at least warn), as it refuses a role that may write fence's tables.
#[test]
fn grant_refuses_a_role_that_can_make_itself_a_writer_of_fence_s_tables() {
    let db = Db::new("cr");
    let role = format!("rev4_cr_{}", std::process::id());
    let token = db.protected_ledger(&role, "CREATEROLE");
    let before = db.contents("ledger");
    let grant = db
        .fence()
        .args(["grant", "--target", &db.admin_url(), "--role", &role])
        .run();
    // Let in, the role goes on by itself: it joins pg_write_all_data and forges a binding.
    let mut shown = String::new();
    if grant.code == 0 {
        let escalate = pg_try_exec(
            &db.raw(&role),
            &format!("GRANT pg_write_all_data TO {role}"),
        );
        let forged = pg_try_exec(&db.raw(&role), &forged_write(token));
        let after = db.contents("ledger");
        shown = format!(
            "escalate: {escalate:?}; forged write: {forged:?}; ledger {before:?} -> {after:?}"
        );
    }
    db.drop_role(&role);
    assert_eq!(grant.code, 2, "{grant:?}\n{shown}");
}

// ---------------------------------------------------------------------------------------
// 4. `fence run --id`: what counts as completed, and when the lease stops covering the run
// ---------------------------------------------------------------------------------------

/// `fence run R --id KEY [extra] -- sh -c SCRIPT`, started in the background in `store`'s
/// home (the script appends to `log` there).
fn spawn_run(store: &Store, extra: &[&str], script: &str) -> std::process::Child {
    let mut fence = store.fence().args(["run", "r"]).args(extra);
    fence = fence.args(["--", "sh", "-c", script]);
    fence
        .cmd
        .current_dir(store.home.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Whether the leftover job whose pid the command wrote to `leftover` has stopped.
fn leftover_gone(store: &Store) -> bool {
    let pid = std::fs::read_to_string(store.home.path().join("leftover")).unwrap();
    !Path::new(&format!("/proc/{}", pid.trim())).exists()
}

/// Holds: the command exits 0 at once but leaves a background job that ignores SIGTERM (a
/// slow upload finishing, a `nohup`ed helper), with a TTL far below `--kill-after`. The
/// reaper stops leftovers (SIGTERM, SIGKILL a second later) before it reports the command's
/// end, while fence still renews, so the lease covers them until they are gone: the leftover
/// never works on after the lease, and a second run with the same id, waiting, is granted
/// only after the first released.
#[test]
fn leftovers_are_covered_by_the_lease_until_they_are_gone() {
    let store = Store::file();
    let log = store.home.path().join("log");
    let first = spawn_run(
        &store,
        &["--id", "day-1", "--ttl", "1s", "--kill-after", "8s"],
        "(trap '' TERM; sleep 30; echo A-leftover-done >> log) & echo $! > leftover; echo A >> log",
    );
    wait_for("the first command", Duration::from_secs(30), || {
        log_lines(&log).contains(&"A".to_owned())
    });
    let second = spawn_run(
        &store,
        &["--id", "day-1", "--ttl", "30s", "--wait", "20s"],
        "echo B >> log",
    );
    let first = common::wait_output("the first run", first, Duration::from_secs(60));
    // The leftover (asleep for far longer than any stop takes) is gone once the first run
    // has ended, and so before its lease was released.
    assert!(leftover_gone(&store), "first: {first:?}");
    let second = common::wait_output("the second run", second, Duration::from_secs(60));
    let lines = log_lines(&log);
    assert!(
        !lines.contains(&"A-leftover-done".to_owned()),
        "{lines:?}\nfirst: {first:?}\nsecond: {second:?}"
    );
    assert_eq!(lines[0], "A");
    assert!(first.status.success(), "{first:?}");
    assert!(second.status.success(), "{second:?}");
}

/// The same command: it exits 0 while its real work still runs in a background job, which
/// fence (rightly) kills once the command is done. fence then records the run id as
/// completed, although it has just killed the run's unfinished work: the next run with the
/// id skips it, and the work is never done.
#[test]
fn a_run_whose_leftovers_were_killed_is_not_recorded_as_completed() {
    let store = Store::file();
    let log = store.home.path().join("log");
    let first = spawn_run(
        &store,
        &["--id", "day-1"],
        "(trap '' TERM; sleep 30; echo A-leftover-done >> log) & echo $! > leftover; echo A >> log",
    );
    let first = common::wait_output("the first run", first, Duration::from_secs(60));
    assert_eq!(log_lines(&log), ["A"], "{first:?}");
    assert!(leftover_gone(&store), "first: {first:?}");
    let second = spawn_run(&store, &["--id", "day-1"], "echo B >> log");
    let second = common::wait_output("the second run", second, Duration::from_secs(60));
    assert_eq!(
        log_lines(&log),
        ["A", "B"],
        "first: {first:?}\nsecond: {second:?}"
    );
}

/// fence forwards a stop signal (systemd stopping the unit, an operator's Ctrl-C, cron's
/// timeout) to the command, whose handler cleans up and exits 0 — a common shell idiom
/// (`trap 'cleanup; exit 0' TERM`). fence knows it interrupted the run, yet records the run
/// id as completed, so every later run with the id skips work that was cut short.
#[test]
fn an_interrupted_run_is_not_recorded_as_completed() {
    let store = Store::file();
    let log = store.home.path().join("log");
    let run = spawn_run(
        &store,
        &["--id", "day-1"],
        "trap 'echo interrupted >> log; exit 0' TERM; echo started >> log; sleep 30 & wait; echo finished >> log",
    );
    wait_for("the command", Duration::from_secs(30), || {
        log_lines(&log).contains(&"started".to_owned())
    });
    // SAFETY: kill(2) on our own child, the fence process.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let first = common::wait_output("the interrupted run", run, Duration::from_secs(60));
    assert_eq!(log_lines(&log), ["started", "interrupted"], "{first:?}");
    let again = spawn_run(
        &store,
        &["--id", "day-1"],
        "echo started >> log; echo finished >> log",
    );
    let again = common::wait_output("the next run", again, Duration::from_secs(60));
    assert!(
        log_lines(&log).contains(&"finished".to_owned()),
        "the job never finished, and the next run skipped it:\nfirst: {first:?}\nnext: {again:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 5. A `file://` object write that runs out of space
// ---------------------------------------------------------------------------------------

/// Holds: a write that cannot be stored whole (a file size limit, like a full disk) leaves
/// the object's bytes, sidecar and ids as they were, leaves no temporary file, and a retry
/// with the same id then lands once.
#[test]
fn a_file_object_write_that_runs_out_of_space_changes_nothing() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let target = format!("file://{}/obj", dir.path().display());
    let token = acquire(&store, "r", "A");
    write_object(&store, "r", token, &target, Some("small"), b"small", &[]).expect(0);
    let before_side = sidecar(dir.path(), "obj");
    let big = tempfile::NamedTempFile::new_in(store.home.path()).unwrap();
    std::fs::write(big.path(), vec![b'x'; 64 * 1024]).unwrap();
    let mut fence = store.fence();
    let program = fence.cmd.get_program().to_owned();
    let args: Vec<_> = fence.cmd.get_args().map(|a| a.to_owned()).collect();
    // The same command under `ulimit -f 16` (16 KiB): fence ignores SIGXFSZ, so the write
    // fails with EFBIG instead of killing fence.
    fence.cmd = Command::new("sh");
    fence.cmd.env_clear().env("HOME", store.home.path());
    fence
        .cmd
        .args(["-c", "ulimit -f 16; exec \"$0\" \"$@\""])
        .arg(program)
        .args(args)
        .args([
            "write",
            "r",
            "--token",
            &token.to_string(),
            "--target",
            &target,
        ])
        .args(["--id", "big", "--format", "json", "--from"])
        .arg(big.path());
    let out = fence.run();
    assert_ne!(out.code, 0, "{out:?}");
    assert_ne!(out.code, 8, "a local write never ends in exit 8: {out:?}");
    assert_eq!(std::fs::read(dir.path().join("obj")).unwrap(), b"small");
    assert_eq!(sidecar(dir.path(), "obj"), before_side);
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [".obj.fence.json", ".obj.fence.lock", "obj"],
        "{out:?}"
    );
    let retry = store
        .fence()
        .args([
            "write",
            "r",
            "--token",
            &token.to_string(),
            "--target",
            &target,
        ])
        .args(["--id", "big", "--format", "json", "--from"])
        .args([big.path()])
        .run()
        .expect(0);
    assert_eq!(retry.json()["replayed"], false);
    assert_eq!(
        std::fs::read(dir.path().join("obj")).unwrap().len(),
        64 * 1024
    );
}

// ---------------------------------------------------------------------------------------
// 6. `fence doctor` on a writer that can bypass `protect`
// ---------------------------------------------------------------------------------------

/// `fence doctor --target WRITER_URL` judges whether `protect` holds against the role it
/// connects as, but only by ownership of fence's schema and superuser. A writer in
/// `pg_write_all_data` (which `fence grant` itself refuses, as one that may write fence's
/// tables) and one with CREATEROLE (which can join `pg_write_all_data` at will) can both
/// forge `bindings` rows; doctor should warn about them rather than report all ok.
#[test]
fn doctor_warns_about_writers_that_can_forge_bindings() {
    let db = Db::new("doc");
    let pid = std::process::id();
    let (wad, cr) = (format!("rev4_dwad_{pid}"), format!("rev4_dcr_{pid}"));
    db.protected_ledger(&wad, "IN ROLE pg_write_all_data");
    pg_exec(&db.admin(), &format!("DROP ROLE IF EXISTS {cr}; CREATE ROLE {cr} LOGIN CREATEROLE; GRANT USAGE ON SCHEMA fence TO {cr}"));
    let mut silent = Vec::new();
    for role in [&wad, &cr] {
        let out = db
            .fence()
            .args(["doctor", "--target", &db.url(role), "--format", "json"])
            .run();
        let json = out.json();
        let warned = json["findings"].as_array().unwrap().iter().any(|f| {
            f["subject"] != Value::Null
                && f["severity"] != "ok"
                && f["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(role.as_str())
        });
        if !warned {
            silent.push(format!("{role}: {}", out.stdout.trim()));
        }
    }
    db.drop_role(&cr);
    db.drop_role(&wad);
    assert!(silent.is_empty(), "{silent:#?}");
}

// ---------------------------------------------------------------------------------------
// 7. `fence run --metrics-file` for a run that was skipped
// ---------------------------------------------------------------------------------------

/// A run whose id was completed before starts nothing; with `--done-exit-code 9` (to tell
/// "already done" from "done now", as the README suggests) its metrics file must not say the
/// command failed: it never ran.
#[test]
fn a_skipped_run_s_metrics_do_not_say_the_command_failed() {
    let store = Store::file();
    let prom = store.home.path().join("run.prom");
    store
        .fence()
        .args(["run", "r", "--id", "day-1", "--", "true"])
        .run()
        .expect(0);
    store
        .fence()
        .args([
            "run",
            "r",
            "--id",
            "day-1",
            "--done-exit-code",
            "9",
            "--metrics-file",
        ])
        .args([&prom])
        .args(["--", "true"])
        .run()
        .expect(9);
    let text = std::fs::read_to_string(&prom).unwrap();
    let outcome = text
        .lines()
        .find(|l| l.starts_with("fence_run_outcome{"))
        .unwrap_or_default()
        .to_owned();
    assert!(
        !outcome.contains("command_failed") && !outcome.contains("\"ok\""),
        "{outcome}\n{text}"
    );
}

// ---------------------------------------------------------------------------------------
// 8. `run-<token>` ids from a second (or restored) coordinator
// ---------------------------------------------------------------------------------------

/// The README: a run without an id gets `run-<token>`, "unique to it", so that the
/// command's `fence write --id "$FENCE_RUN_ID-…"` retries are replays. Tokens are unique per
/// coordinator only: a cron job whose HOME differs from the shell's (the README's own
/// warning) uses another default store, and a restored store reissues tokens. Such a run's
/// write with a token below the object's would be refused as stale (exit 4, loud); because
/// ids are checked before tokens, it is instead a silent "replayed" (exit 0): the run
/// reports success and its new bytes were never written.
#[test]
fn run_token_ids_from_another_coordinator_do_not_replay_old_writes() {
    let first = Store::file();
    let second = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let target = format!("file://{}/report.csv", dir.path().display());
    let fence = env!("CARGO_BIN_EXE_fence");
    let publish = |store: &Store, body: &str| {
        let script = format!(
            "printf '{body}' > body && {fence} write --target '{target}' --id \"$FENCE_RUN_ID-publish\" --from body"
        );
        let mut run = store.fence().args(["run", "r", "--", "sh", "-c", &script]);
        run.cmd.current_dir(store.home.path());
        run.run()
    };
    publish(&first, "monday").expect(0);
    publish(&first, "tuesday").expect(0);
    assert_eq!(
        std::fs::read(dir.path().join("report.csv")).unwrap(),
        b"tuesday"
    );
    // The same job, under the other coordinator (token 1 again: `run-1`).
    let out = publish(&second, "wednesday");
    let body = std::fs::read(dir.path().join("report.csv")).unwrap();
    assert!(
        out.code == 4 || body == b"wednesday",
        "the run exited {} and the object still holds {:?}: {out:?}",
        out.code,
        String::from_utf8_lossy(&body)
    );
}

// ---------------------------------------------------------------------------------------
// 9. `kill -9` of `fence write --id` to a `file://` object at any point
// ---------------------------------------------------------------------------------------

/// Holds: writes of 1 MiB with ids, each SIGKILLed after a pseudo-random delay (fault
/// injection: before, during and after the bytes, the next sidecar and the renames). After
/// each kill, `fence inspect --id` answers, and what it answers matches the bytes read
/// without fence: applied ⇔ the object holds that write's bytes and its sidecar names its id.
/// Re-running the same command then makes the bytes land exactly once, and no temporary file
/// is left behind at the end.
#[test]
fn killed_file_object_writes_keep_bytes_and_ids_together() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let target = format!("file://{}/obj", dir.path().display());
    let token = acquire(&store, "r", "A");
    let body = |i: u32| {
        let mut bytes = format!("v{i}:").into_bytes();
        bytes.resize(1 << 20, b'a' + (i % 26) as u8);
        bytes
    };
    let write = |i: u32| {
        let path = store.home.path().join(format!("body-{i}"));
        std::fs::write(&path, body(i)).unwrap();
        store
            .fence()
            .args([
                "write",
                "r",
                "--token",
                &token.to_string(),
                "--target",
                &target,
            ])
            .args(["--id", &format!("id-{i}"), "--format", "json", "--from"])
            .args([&path])
    };
    // The kills are spread over twice what a whole write takes here and now (measured, not
    // assumed: a loaded machine or a debug build stretches it), so that they fall on both
    // sides of the commit.
    let started = std::time::Instant::now();
    write(0).run().expect(0);
    let span = u64::try_from(started.elapsed().as_micros() * 2)
        .unwrap()
        .max(1);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let (mut landed_by_kill, mut lost_by_kill) = (0, 0);
    let mut current: Option<u32> = Some(0);
    for i in 1..=40u32 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let delay = Duration::from_micros((seed >> 33) % span);
        let mut child = write(i)
            .cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let _ = child.kill();
        let _ = child.wait();
        let asked = store
            .fence()
            .args([
                "inspect",
                "r",
                "--target",
                &target,
                "--id",
                &format!("id-{i}"),
            ])
            .args(["--format", "json"])
            .run()
            .expect(0)
            .json();
        let applied = asked["applied"] == true;
        let bytes = std::fs::read(dir.path().join("obj")).ok();
        let named = std::fs::read(dir.path().join(".obj.fence.json"))
            .ok()
            .map(|b| serde_json::from_slice::<Value>(&b).unwrap()["metadata"]["fence-id"].clone());
        if applied {
            landed_by_kill += 1;
            assert_eq!(
                bytes,
                Some(body(i)),
                "write {i} applied but its bytes are not there"
            );
            assert_eq!(named, Some(Value::from(format!("id-{i}"))), "write {i}");
        } else {
            lost_by_kill += 1;
            assert_eq!(
                bytes,
                current.map(body),
                "write {i} not applied but the bytes changed"
            );
            assert_eq!(
                named,
                current.map(|c| Value::from(format!("id-{c}"))),
                "write {i}"
            );
        }
        let again = write(i).run().expect(0).json();
        assert_eq!(again["replayed"], applied, "write {i}: {again}");
        assert_eq!(std::fs::read(dir.path().join("obj")).unwrap(), body(i));
        current = Some(i);
    }
    // The kills fell on both sides of the commit.
    assert!(
        landed_by_kill > 0 && lost_by_kill > 0,
        "{landed_by_kill} / {lost_by_kill}"
    );
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [".obj.fence.json", ".obj.fence.lock", "obj"]);
}

// ---------------------------------------------------------------------------------------
// 10. Names fence accepts for `protect` and `file://` targets
// ---------------------------------------------------------------------------------------

/// `fence protect --resource` takes any name, but names containing `#done:` are reserved for
/// run records and refused by `fence write`: a table protected for such a resource can never
/// be written through fence again (every write is LF001/LF003). protect should refuse the
/// name (exit 2), as acquire, run and write do.
#[test]
fn protect_refuses_a_resource_no_write_can_use() {
    let store = Store::postgres();
    let s = store.schema.clone().unwrap();
    pg_exec(
        &store.url,
        &format!("CREATE SCHEMA IF NOT EXISTS {s}; CREATE TABLE {s}.t (n int)"),
    );
    let protect = store
        .fence()
        .args([
            "protect",
            "--target",
            &store.url,
            "--table",
            &format!("{s}.t"),
        ])
        .args(["--resource", "r#done:x"])
        .run();
    let write = store
        .fence()
        .args(["write", "r#done:x", "--token", "1", "--target", &store.url])
        .args(["--sql", &format!("INSERT INTO {s}.t VALUES (1)")])
        .run();
    assert_eq!(write.code, 2, "{write:?}");
    assert_eq!(protect.code, 2, "{protect:?}");
}

/// A `file://` target with `%00` in its name cannot name a file. It is refused, but as exit 1
/// (`internal`) with "check the disk, then retry": a wrong cause and a retry that cannot
/// help. The README gives exit 2 for `%00` in a store URL; a target should be the same.
#[test]
fn a_nul_in_a_file_target_is_a_usage_error() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let target = format!("file://{}/a%00b", dir.path().display());
    let token = acquire(&store, "r", "A");
    let write = write_object(&store, "r", token, &target, None, b"x", &[]);
    let inspect = store
        .fence()
        .args(["inspect", "r", "--target", &target, "--format", "json"])
        .run();
    assert_eq!(write.code, 2, "{write:?}");
    assert_eq!(inspect.code, 2, "{inspect:?}");
}

// ---------------------------------------------------------------------------------------
// 11. The lock of a `file://` object
// ---------------------------------------------------------------------------------------

/// Every access to a `file://` object takes an exclusive `flock` on `.<name>.fence.lock`, and
/// waits for it without a bound. A former writer paused while it holds the lock (the very
/// pause fence exists for: SIGSTOP, swap, a long GC), or any local user who can merely read
/// the lock file (flock works on a read-only descriptor), blocks the current owner's
/// `fence write` for as long as it likes: `--timeout` does not apply, and fence never
/// answers 7 ("nothing applied, safe to retry"). Expected: the write gives up within its
/// timeout, exit 7, nothing written.
#[test]
fn a_held_object_lock_does_not_block_a_writer_forever() {
    use std::os::fd::AsRawFd;
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let target = format!("file://{}/obj", dir.path().display());
    let token = acquire(&store, "r", "A");
    write_object(&store, "r", token, &target, None, b"v1", &[]).expect(0);
    // Another process's hold on the lock, through a read-only descriptor.
    let lock = std::fs::File::open(dir.path().join(".obj.fence.lock")).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let body = store.home.path().join("body");
    std::fs::write(&body, b"v2").unwrap();
    let child = store
        .fence()
        .args([
            "write",
            "r",
            "--token",
            &token.to_string(),
            "--target",
            &target,
        ])
        .args(["--timeout", "1s", "--format", "json", "--from"])
        .args([&body])
        .cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::wait_output("the blocked write", child, Duration::from_secs(20));
    drop(lock);
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert_eq!(std::fs::read(dir.path().join("obj")).unwrap(), b"v1");
}

/// A copy of the fence binary that any user may run (the test's own lives under /root).
fn public_fence(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let copy = dir.join("fence");
    std::fs::copy(env!("CARGO_BIN_EXE_fence"), &copy).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy
}

/// `fence inspect R --target file:///dir/obj --id KEY` is the README's read-only answer to
/// "did my write land?". On-call staff who may read the published directory but not write
/// it cannot ask: the lookup opens (or creates) the object's lock file for writing.
#[test]
fn a_reader_of_the_directory_can_inspect_an_object() {
    if unsafe { libc::geteuid() } != 0 {
        // Only root can run a command as another user here; nothing to show otherwise.
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let target = format!("file://{}/obj", dir.path().display());
    let token = acquire(&store, "r", "A");
    write_object(&store, "r", token, &target, Some("id-1"), b"v1", &[]).expect(0);
    let bin = tempfile::tempdir().unwrap();
    let fence = public_fence(bin.path());
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&fence)
        .args([
            "inspect", "r", "--target", &target, "--id", "id-1", "--format", "json",
        ])
        .env_clear()
        .env("HOME", bin.path())
        .env(
            "FENCE_STORE",
            format!("file://{}/nostore", bin.path().display()),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(json["applied"], true, "{json}");
}

// ---------------------------------------------------------------------------------------
// 12. `fence prune` pointed at the wrong schema
// ---------------------------------------------------------------------------------------

/// The README's daily prune from cron (`fence prune --older-than 30d --keep 100 --quiet`)
/// with a schema that does not exist — the job's FENCE_SCHEMA missing from the crontab, or
/// the wrong database — should fail loudly (exit 2), not report success while the real
/// store's history keeps growing.
#[test]
fn prune_of_a_missing_schema_fails_loudly() {
    let store = Store::postgres();
    let token = acquire(&store, "r", "A");
    release(&store, "r", "A", token);
    let schema = store.schema.clone().unwrap();
    let out = Fence::bare(store.home.path())
        .args([
            "prune",
            "--store",
            &store.url,
            "--schema",
            &format!("{schema}_typo"),
        ])
        .args(["--older-than", "0s", "--format", "json"])
        .run();
    assert_eq!(store.events("r").len(), 2, "the real store was not pruned");
    assert_eq!(out.code, 2, "{out:?}");
}

/// A `file://` object whose name leaves no room for fence's files beside it (`.<name>.fence.
/// next.json` is 17 bytes longer than the name; Linux allows 255) cannot be fenced. That is
/// fair, but it is reported as exit 1 `internal` with "check the disk, then retry" — a wrong
/// cause, and a retry that can never help — instead of a usage error naming the limit.
#[test]
fn an_object_name_too_long_for_fence_s_files_is_a_usage_error() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let token = acquire(&store, "r", "A");
    let mut wrong = Vec::new();
    for len in [239, 250] {
        let target = format!("file://{}/{}", dir.path().display(), "n".repeat(len));
        let out = write_object(&store, "r", token, &target, None, b"x", &[]);
        if out.code != 2 {
            wrong.push(format!("{len}: {}", out.stdout.trim()));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

// ---------------------------------------------------------------------------------------
// 13. `fence doctor --target file:///…`
// ---------------------------------------------------------------------------------------

/// `fence doctor --target file:///dir/obj` reports the object's "endpoint" as Google Cloud
/// Storage with no credentials, and checks nothing of the directory that holds the object
/// and its sidecar: a directory that does not exist, or one any local user may rewrite
/// (mode 0777, no sticky bit: anyone can replace the sidecar and so the token), is all "ok".
#[test]
fn doctor_checks_a_file_target_s_directory_not_gcs() {
    use std::os::unix::fs::PermissionsExt;
    let store = Store::file();
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let targets = [
        format!("file://{}/obj", open.path().display()),
        format!("file://{}/missing/obj", store.home.path().display()),
    ];
    let out = store
        .fence()
        .args(["doctor", "--format", "json"])
        .args(targets.iter().flat_map(|t| ["--target", t.as_str()]))
        .run();
    let json = out.json();
    let findings = json["findings"].as_array().unwrap();
    let about = |target: &str| -> Vec<&Value> {
        findings.iter().filter(|f| f["subject"] == target).collect()
    };
    let mut wrong = Vec::new();
    for target in &targets {
        let mine = about(target);
        if mine.iter().any(|f| {
            f["message"]
                .as_str()
                .unwrap()
                .contains("Google Cloud Storage")
        }) {
            wrong.push(format!("{target}: called Google Cloud Storage: {mine:?}"));
        }
        if mine.iter().all(|f| f["severity"] == "ok") {
            wrong.push(format!("{target}: all ok: {mine:?}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

// ---------------------------------------------------------------------------------------
// 14. A token from the environment, for another resource
// ---------------------------------------------------------------------------------------

/// Inside `fence run A` (or after `eval "$(fence acquire A --format env)"`), FENCE_RESOURCE
/// is A and FENCE_TOKEN is A's token. A script that writes another resource's object, `fence
/// write B --target … --from …`, gets B from its argument and the token from the environment:
/// A's token, which means nothing for B. fence writes it as B's: a write by someone who never
/// held B's lease gets through, and since A's counter is ahead of B's, B's real holder is then
/// refused as stale until B's tokens catch up. fence can see the mismatch (the token came
/// with FENCE_RESOURCE=A) and should refuse it (exit 2).
#[test]
fn a_token_from_the_environment_is_not_used_for_another_resource() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let target = format!("file://{}/b.csv", dir.path().display());
    let b_old = acquire(&store, "B", "b-host");
    release(&store, "B", "b-host", b_old);
    let b = acquire(&store, "B", "b-host");
    write_object(&store, "B", b, &target, None, b"from B's holder", &[]).expect(0);
    for _ in 0..5 {
        let earlier = acquire(&store, "A", "a-host");
        release(&store, "A", "a-host", earlier);
    }
    let a = acquire(&store, "A", "a-host");
    assert!(a > b);
    let body = store.home.path().join("a-body");
    std::fs::write(&body, b"from A's script").unwrap();
    let out = store
        .fence()
        .env("FENCE_RESOURCE", "A")
        .env("FENCE_OWNER", "a-host")
        .env("FENCE_TOKEN", a.to_string())
        .args([
            "write", "B", "--target", &target, "--format", "json", "--from",
        ])
        .args([&body])
        .run();
    let after = std::fs::read(dir.path().join("b.csv")).unwrap();
    let holder = write_object(&store, "B", b, &target, None, b"B again", &[]);
    assert_eq!(
        after, b"from B's holder",
        "A's token wrote B's object: {out:?}\nB's holder then: {holder:?}"
    );
    assert_eq!(out.code, 2, "{out:?}");
    assert_eq!(holder.code, 0, "{holder:?}");
}

// ---------------------------------------------------------------------------------------
// 15. The README's "publish exactly once a day" recipe on hosts in two time zones
// ---------------------------------------------------------------------------------------

/// The README's PostgreSQL recipe names the day's write by the client's `date +%F` and
/// publishes the server's `current_date`. Two hosts of one fleet whose local dates differ
/// (one in UTC, one in UTC+14 or UTC−12, or a host whose TZ is not the database's) — the
/// "overlapping host" the README says the id protects against — make two different ids for
/// one server day: the day is published twice. (And on the day after, the ahead host's id is
/// already used: that day is skipped.) Run as written, in `sh`, at the same moment.
#[test]
fn the_publish_once_recipe_publishes_once_across_time_zones() {
    let recipe = common::doc_sh_block("<!-- recipe-once -->");
    let recipe = recipe.as_str();
    let store = Store::postgres();
    let s = store.schema.clone().unwrap();
    pg_exec(
        &store.url,
        &format!("CREATE SCHEMA IF NOT EXISTS {s}; CREATE TABLE {s}.published (day date)"),
    );
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_fence"), bin.path().join("fence")).unwrap();
    // A zone whose date differs from UTC's right now: UTC+14 from 10:00 UTC on, else UTC−12.
    let hour: i32 = pg_query(
        &store.url,
        "SELECT extract(hour FROM now() AT TIME ZONE 'UTC')::int",
    )[0]
    .get(0);
    let other = if hour >= 10 {
        "Etc/GMT-14"
    } else {
        "Etc/GMT+12"
    };
    for tz in ["UTC", other] {
        let status = Command::new("sh")
            .args(["-c", recipe])
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", bin.path().display()))
            .env("HOME", store.home.path())
            .env("TZ", tz)
            .env("FENCE_STORE", &store.url)
            .env("FENCE_SCHEMA", &s)
            .env(
                "DB",
                format!(
                    "{}?options=-csearch_path%3D{s}%20-ctimezone%3DUTC",
                    store.url
                ),
            )
            .status()
            .unwrap();
        assert!(status.success(), "{tz}: {status:?}");
    }
    let rows: Vec<String> = pg_query(
        &store.url,
        &format!("SELECT day::text FROM {s}.published ORDER BY 1"),
    )
    .iter()
    .map(|r| r.get(0))
    .collect();
    let ids: Vec<String> = pg_query(
        &store.url,
        &format!("SELECT write_id FROM {s}.write_ledger ORDER BY 1"),
    )
    .iter()
    .map(|r| r.get(0))
    .collect();
    assert_eq!(rows.len(), 1, "published {rows:?} under ids {ids:?}");
}

// ---------------------------------------------------------------------------------------
// 16. One id reused for two different writes
// ---------------------------------------------------------------------------------------

/// A careless script gives two different writes of one run the same id (`--id
/// "$FENCE_RUN_ID"` twice: the README says each write needs an id of its own, but nothing
/// stops it). Fixed: the ledger keeps a digest of the SQL or bytes beside the id, and the
/// second write — other SQL, other bytes — is refused as a conflict (exit 6, reason
/// `id_reused`) instead of answered "replayed" without running; the same SQL or bytes again
/// is still a replay. Asserted on what the database and the object hold.
#[test]
fn one_id_for_two_different_writes_is_a_conflict() {
    let store = Store::postgres();
    let s = store.schema.clone().unwrap();
    pg_exec(
        &store.url,
        &format!("CREATE SCHEMA IF NOT EXISTS {s}; CREATE TABLE {s}.steps (what text)"),
    );
    let token = acquire(&store, "job", "A");
    let sql_write = |sql: &str| {
        store
            .fence()
            .args(["write", "job", "--token", &token.to_string()])
            .args(["--target", &store.url, "--id", "run-7", "--format", "json"])
            .args(["--sql", sql])
            .run()
    };
    sql_write(&format!("INSERT INTO {s}.steps VALUES ('extract')")).expect(0);
    let second = sql_write(&format!("INSERT INTO {s}.steps VALUES ('load')"));
    let steps: Vec<String> = pg_query(&store.url, &format!("SELECT what FROM {s}.steps"))
        .iter()
        .map(|r| r.get(0))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let target = format!("file://{}/obj", dir.path().display());
    write_object(
        &store,
        "job",
        token,
        &target,
        Some("run-7"),
        b"extract",
        &[],
    )
    .expect(0);
    let object = write_object(&store, "job", token, &target, Some("run-7"), b"load", &[]);
    // The same write again is still a replay.
    let again = sql_write(&format!("INSERT INTO {s}.steps VALUES ('extract')"));
    let object_again = write_object(
        &store,
        "job",
        token,
        &target,
        Some("run-7"),
        b"extract",
        &[],
    );
    let mut wrong = Vec::new();
    for (what, out) in [("SQL", &second), ("object", &object)] {
        if out.code == 6 && out.json()["reason"] != "id_reused" {
            wrong.push(format!("{what}: reason {}", out.stdout.trim()));
        }
    }
    for (what, out) in [("SQL", &again), ("object", &object_again)] {
        if out.code != 0 || out.json()["replayed"] != true {
            wrong.push(format!(
                "{what} retry: exit {} ({})",
                out.code,
                out.stdout.trim()
            ));
        }
    }
    if steps != ["extract"] {
        wrong.push(format!("steps {steps:?}"));
    }
    let bytes = std::fs::read(dir.path().join("obj")).unwrap();
    if bytes != b"extract" {
        wrong.push(format!(
            "object holds {:?}",
            String::from_utf8_lossy(&bytes)
        ));
    }
    if second.code != 6 {
        wrong.push(format!(
            "SQL: exit {} ({}), steps {steps:?}",
            second.code,
            second.stdout.trim()
        ));
    }
    if object.code != 6 {
        wrong.push(format!(
            "object: exit {} ({})",
            object.code,
            object.stdout.trim()
        ));
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

// ---------------------------------------------------------------------------------------
// 17. The "from cron" recipe pasted into a crontab
// ---------------------------------------------------------------------------------------

/// What cron does to a crontab command (crontab(5)): the first unescaped `%` ends the
/// command, the rest is its standard input, every further `%` a newline.
fn as_cron_runs_it(line: &str) -> (String, String) {
    let mut parts = vec![String::new()];
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'%') => {
                parts.last_mut().unwrap().push('%');
                chars.next();
            }
            '%' if parts.len() == 1 => parts.push(String::new()),
            '%' => parts.last_mut().unwrap().push('\n'),
            c => parts.last_mut().unwrap().push(c),
        }
    }
    let input = if parts.len() == 2 {
        parts.pop().unwrap()
    } else {
        String::new()
    };
    (parts.pop().unwrap(), input)
}

/// "**Publish exactly once a day, from cron.**" — the recipe is a `sh` line with
/// `$(date +%F)`. Pasted into a crontab as the section's title invites (the README's cron
/// example above it is a crontab), cron cuts the command at the `%`: `sh` gets an
/// unterminated quote, nothing runs, nothing is published, every day. The README (and `fence
/// run --help`) should write `\%` for a crontab, or say so.
#[test]
fn the_publish_once_recipe_survives_a_crontab() {
    let recipe = common::doc_sh_block("<!-- recipe-once -->");
    let recipe = recipe.as_str();
    let store = Store::postgres();
    let s = store.schema.clone().unwrap();
    pg_exec(
        &store.url,
        &format!("CREATE SCHEMA IF NOT EXISTS {s}; CREATE TABLE {s}.published (day date)"),
    );
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_fence"), bin.path().join("fence")).unwrap();
    let (command, input) = as_cron_runs_it(recipe);
    let mut child = Command::new("sh")
        .args(["-c", &command])
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.path().display()))
        .env("HOME", store.home.path())
        .env("FENCE_STORE", &store.url)
        .env("FENCE_SCHEMA", &s)
        .env("DB", format!("{}?options=-csearch_path%3D{s}", store.url))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let rows: i64 = pg_query(&store.url, &format!("SELECT count(*) FROM {s}.published"))[0].get(0);
    assert_eq!(rows, 1, "cron ran `{command}`: {out:?}");
}

// ---------------------------------------------------------------------------------------
// 18. Ids at the edges of their alphabet and length, on a PostgreSQL target
// ---------------------------------------------------------------------------------------

/// Holds: ids made of every allowed punctuation and of the maximum length are recorded and
/// looked up exactly (inspect --id finds them, and only them); one byte longer, an empty id
/// and one with a space or a `%` are refused before anything is sent (exit 2, no ledger row);
/// and one id on two resources is two writes (the ledger is per resource).
#[test]
fn ids_at_the_edges_round_trip_on_postgres() {
    let store = Store::postgres();
    let s = store.schema.clone().unwrap();
    pg_exec(
        &store.url,
        &format!("CREATE SCHEMA IF NOT EXISTS {s}; CREATE TABLE {s}.w (id text)"),
    );
    let a = acquire(&store, "a", "A");
    let b = acquire(&store, "b", "B");
    let write = |resource: &str, token: i64, id: &str| {
        store
            .fence()
            .args(["write", resource, "--token", &token.to_string()])
            .args(["--target", &store.url, "--format", "json"])
            .args([
                "--id",
                id,
                "--sql",
                &format!("INSERT INTO {s}.w VALUES ('{resource}')"),
            ])
            .run()
    };
    let odd = "A-z_0.9:@+";
    let longest = "x".repeat(64);
    for id in [odd, longest.as_str()] {
        assert_eq!(write("a", a, id).expect(0).json()["replayed"], false);
        assert_eq!(write("a", a, id).expect(0).json()["replayed"], true);
        assert_eq!(write("b", b, id).expect(0).json()["replayed"], false);
    }
    for bad in ["x".repeat(65), String::new(), "a b".into(), "a%20b".into()] {
        write("a", a, &bad).expect(2);
    }
    let ledger: Vec<(String, String)> = pg_query(
        &store.url,
        &format!("SELECT resource, write_id FROM {s}.write_ledger ORDER BY 1, 2"),
    )
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    let mut want = vec![];
    for resource in ["a", "b"] {
        for id in [odd, longest.as_str()] {
            want.push((resource.to_owned(), id.to_owned()));
        }
    }
    want.sort();
    assert_eq!(ledger, want);
    let rows: i64 = pg_query(&store.url, &format!("SELECT count(*) FROM {s}.w"))[0].get(0);
    assert_eq!(rows, 4);
    let look = |id: &str| {
        store
            .fence()
            .args([
                "inspect", "a", "--target", &store.url, "--id", id, "--format", "json",
            ])
            .run()
            .expect(0)
            .json()["applied"]
            .clone()
    };
    assert_eq!(look(odd), true);
    assert_eq!(look(&longest), true);
    assert_eq!(look("A-z_0.9:@"), false, "a prefix is another id");
    assert_eq!(look("a-z_0.9:@+"), false, "ids are case-sensitive");
}

/// The README: "a target ending in `/` names a directory, not an object (exit 2 …)". For
/// `file://` targets the trailing slash is dropped instead: `file:///dir/obj/` writes the
/// object `obj`, and `file:///dir/` tries to write the directory itself as an object of its
/// parent, failing with exit 1 "Is a directory … check the disk, then retry".
#[test]
fn a_file_target_ending_in_a_slash_is_refused() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let token = acquire(&store, "r", "A");
    let mut wrong = Vec::new();
    for target in [
        format!("file://{}/obj/", dir.path().display()),
        format!("file://{}/", dir.path().display()),
    ] {
        let out = write_object(&store, "r", token, &target, None, b"x", &[]);
        if out.code != 2 {
            wrong.push(format!("{target}: exit {} {}", out.code, out.stdout.trim()));
        }
    }
    let written = dir.path().join("obj").exists();
    assert!(
        wrong.is_empty() && !written,
        "object `obj` written: {written}; {wrong:#?}"
    );
}

// ---------------------------------------------------------------------------------------
// 19. Two hosts racing one run id on the S3 and GCS coordinators
// ---------------------------------------------------------------------------------------

/// Holds: two `fence run r --id day-1 --wait` started together against an S3 (moto) or GCS
/// (fake-gcs-server) coordinator: the command runs once; the other run is granted after the
/// first released, finds the completion record and starts nothing (exit 0, "already
/// completed"). The record is the `r#done:day-1` lease object, read back without fence.
#[test]
fn two_runs_of_one_id_on_object_coordinators_run_once() {
    for backend in [common::Backend::S3, common::Backend::Gcs] {
        let store = Store::new(backend);
        let log = store.home.path().join("log");
        let go = store.home.path().join("go");
        let script = "echo run >> log; while [ ! -e go ]; do sleep 0.05; done";
        let runs: Vec<_> = (0..2)
            .map(|_| {
                spawn_run(
                    &store,
                    &["--id", "day-1", "--ttl", "5s", "--wait", "60s"],
                    script,
                )
            })
            .collect();
        wait_for("a command", Duration::from_secs(60), || {
            !log_lines(&log).is_empty()
        });
        std::fs::write(&go, b"").unwrap();
        let outs: Vec<_> = runs
            .into_iter()
            .map(|run| common::wait_output("a run", run, Duration::from_secs(120)))
            .collect();
        assert_eq!(log_lines(&log), ["run"], "{backend:?}: {outs:?}");
        assert!(
            outs.iter().all(|o| o.status.success()),
            "{backend:?}: {outs:?}"
        );
        assert_eq!(
            outs.iter()
                .filter(|o| String::from_utf8_lossy(&o.stderr).contains("already completed"))
                .count(),
            1,
            "{backend:?}: {outs:?}"
        );
        let (_, token, live) = store.lease("r#done:day-1").expect("the completion record");
        assert!(token >= 1 && !live, "{backend:?}");
    }
}

// ---------------------------------------------------------------------------------------
// 20. A usage error that is reported as "unavailable"
// ---------------------------------------------------------------------------------------

/// `--id` with the row form is a usage error (exit 2), but fence connects to the database
/// before it says so: with the database down, the answer is exit 7 "nothing was done, so it
/// is safe to retry" — a retry loop (the README's "7 … retry") then spins on a command that
/// can never succeed. The command's own comment says bad input is refused before connecting.
#[test]
fn a_row_form_id_is_refused_before_connecting() {
    let store = Store::file();
    let out = store
        .fence()
        .args(["write", "r", "--token", "1"])
        .args([
            "--target",
            "postgres://u@127.0.0.1:1/x?connect_timeout=2&sslmode=disable",
        ])
        .args(["--table", "t", "--key", "id=1", "--set", "v=2", "--id", "k"])
        .args(["--format", "json"])
        .run();
    assert_eq!(out.code, 2, "{out:?}");
}
