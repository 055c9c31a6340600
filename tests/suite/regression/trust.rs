//! Review round 8 (issue 33): a helper attacked the PostgreSQL and directory-store trust
//! fixes without seeing how they were made. Each test is one of its findings, as it wrote it,
//! now fixed (or, for the socket watch toggled off and on again, the documented bound that
//! remains). The assertions are on durable state where there is one (the database's rows,
//! the store's tokens), else on what fence refuses.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::fenced::{backends, one, schema, setup_table, tagged_url, values};
use common::own_db::OwnDb;
use common::{pg_exec, pg_query, pg_try_exec, Fence, Store};

// ---------------------------------------------------------------------------------------
// A killed (or given-up) `fence write` never commits past its deadline.
// ---------------------------------------------------------------------------------------

/// Spawns `fence write r --sql SQL` tagged `tag`, waits until its backend is in `pg_sleep`,
/// SIGKILLs fence, then waits (at most 30 s) until the backend is gone.
fn kill_while_sleeping(store: &Store, token: i64, tag: &str, sql: &str, timeout: &str) {
    let within = Duration::from_secs(30);
    let url = tagged_url(store, tag);
    let mut child = store
        .fence()
        .args(["write", "r", "--token", &token.to_string(), "--owner", "a"])
        .args(["--target", &url, "--timeout", timeout, "--sql", sql])
        .cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    common::wait_for("the fenced write to sleep", Duration::from_secs(20), || {
        backends(store, tag)
            .iter()
            .any(|(state, wait, _)| state == "active" && wait == "Timeout")
    });
    child.kill().unwrap();
    child.wait().unwrap();
    // Until the killed client's backend is gone: its transaction has ended, one way or the
    // other (`within` is far above the sleep in the SQL).
    common::wait_for("the killed write's backend to end", within, || {
        backends(store, tag).is_empty()
    });
}

/// Finding 1, a documented limit: end_write compares client_connection_check_interval at its
/// end, so SQL that turns the watch off with set_config and back on before end_write runs
/// unwatched, and a SIGKILLed `fence write`'s transaction can still commit, within its
/// --timeout (the token's guard row stays locked meanwhile: no newer owner has written). What
/// holds is the bound: past --timeout by the server's clock, nothing commits. (The control,
/// without the toggle, is rolled back as soon as the server notices the closed socket.)
#[test]
fn a_killed_write_that_toggled_the_socket_watch_commits_nothing_past_its_timeout() {
    let store = Store::postgres();
    let table = setup_table(&store);
    let token = store
        .fence()
        .acquire("r", &["--owner", "a", "--ttl", "1h"])
        .token;
    // Control: left alone, the watch ends the backend of a killed fence.
    kill_while_sleeping(
        &store,
        token,
        "atk_cci_control",
        &format!("SELECT pg_sleep(4); INSERT INTO {table} VALUES (1)"),
        "30s",
    );
    assert_eq!(
        values(&store, &table),
        "",
        "control: the plain killed write committed"
    );
    // Off, sleep past the 2 s timeout, back on: end_write's deadline refuses the commit.
    kill_while_sleeping(
        &store,
        token,
        "atk_cci",
        &format!(
            "SELECT set_config('client_connection_check_interval', '0', true); \
             SELECT pg_sleep(4); INSERT INTO {table} VALUES (2); \
             SELECT set_config('client_connection_check_interval', '1s', true)"
        ),
        "2s",
    );
    assert_eq!(
        values(&store, &table),
        "",
        "a killed write committed past its --timeout"
    );
}

/// Finding 2: a `DECLARE … CURSOR WITH HOLD` in the caller's SQL is materialised by COMMIT,
/// after end_write's checks (deadline, settings): its query ran arbitrary code there (here: it
/// turns off the client watch, swallows statement_timeout and fence's cancel, and writes 4 s
/// after the transaction began, with --timeout 1s), and the write committed past the
/// deadline. Now fence closes every cursor before end_write: the query never runs.
#[test]
fn a_cursor_with_hold_runs_nothing_after_end_write() {
    let store = Store::postgres();
    let s = schema(&store);
    setup_table(&store);
    pg_exec(
        &store.url,
        &format!(
            "CREATE TABLE {s}.late (v int, at timestamptz);
             CREATE FUNCTION {s}.late_write() RETURNS int LANGUAGE plpgsql AS $f$
             DECLARE t0 timestamptz := clock_timestamp();
             BEGIN
                 PERFORM set_config('client_connection_check_interval', '0', true);
                 WHILE clock_timestamp() < t0 + interval '4 seconds' LOOP
                     BEGIN
                         PERFORM pg_sleep(0.2);
                     EXCEPTION WHEN query_canceled THEN NULL;
                     END;
                 END LOOP;
                 INSERT INTO {s}.late VALUES (1, clock_timestamp());
                 RETURN 1;
             END $f$;"
        ),
    );
    let token = store
        .fence()
        .acquire("r", &["--owner", "a", "--ttl", "1h"])
        .token;
    let started = Instant::now();
    let out = store
        .fence()
        .args(["write", "r", "--token", &token.to_string(), "--owner", "a"])
        .args([
            "--target",
            &tagged_url(&store, "atk_hold"),
            "--timeout",
            "1s",
            "--format",
            "json",
        ])
        .args([
            "--sql",
            &format!("DECLARE c CURSOR WITH HOLD FOR SELECT {s}.late_write()"),
        ])
        .run();
    let fence_took = started.elapsed();
    // Until the write's backend is gone: the transaction fence may have given up on has
    // ended, committed or not (the cursor's query, if it ran, takes 4 s).
    common::wait_for(
        "the write's backend to end",
        Duration::from_secs(30),
        || backends(&store, "atk_hold").is_empty(),
    );
    let late = one(
        &store.url,
        &format!("SELECT coalesce(string_agg(v::text, ','), '') FROM {s}.late"),
    );
    assert_eq!(
        late, "",
        "SQL ran after end_write and committed past --timeout 1s (fence exited {} after {:?}: {})",
        out.code, fence_took, out.stdout
    );
}

// ---------------------------------------------------------------------------------------
// grant/doctor refuse writers that can reach the database another way.
// ---------------------------------------------------------------------------------------

/// A database of its own (see `OwnDb`) and roles of its own, dropped afterwards.
struct Db {
    db: OwnDb,
    roles: Vec<String>,
}

impl std::ops::Deref for Db {
    type Target = OwnDb;
    fn deref(&self) -> &OwnDb {
        &self.db
    }
}

impl Db {
    fn new(tag: &str) -> Db {
        Db {
            db: OwnDb::new("atk", tag),
            roles: Vec::new(),
        }
    }
    fn role(&mut self, tag: &str, options: &str) -> String {
        let role = format!("atk_{tag}_{}", std::process::id());
        let _ = pg_try_exec(&OwnDb::server(), &format!("DROP ROLE IF EXISTS {role}"));
        pg_exec(
            &OwnDb::server(),
            &format!("CREATE ROLE {role} LOGIN {options}"),
        );
        self.roles.push(role.clone());
        role
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        // The database first: its objects belong to the roles.
        let _ = pg_try_exec(
            &OwnDb::server(),
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
        for role in &self.roles {
            let _ = pg_try_exec(&OwnDb::server(), &format!("DROP ROLE IF EXISTS {role}"));
        }
    }
}

/// Finding 3: a writer that is a member of pg_execute_server_program was granted (`fence
/// grant` exit 0) and passed `doctor --target` as it; yet `COPY … TO PROGRAM` runs any program
/// as the server's OS user, which can open a connection of its own as the superuser and write
/// the protected table without a token (the helper did: psql over the server's socket). Now
/// grant refuses it (nothing granted) and doctor fails it, naming the REVOKE; the same for
/// pg_write_server_files (it can rewrite the server's configuration).
#[test]
fn members_of_the_server_access_roles_are_refused_and_failed() {
    for server_role in ["pg_execute_server_program", "pg_write_server_files"] {
        let mut db = Db::new("exec");
        let writer = db.role("exec", &format!("IN ROLE {server_role}"));
        db.fence()
            .args(["init", "--target", &db.admin_url()])
            .run()
            .expect(0);
        pg_exec(
            &db.admin(),
            "CREATE SCHEMA app; CREATE TABLE app.ledger (v text)",
        );
        db.fence()
            .args([
                "protect",
                "--target",
                &db.admin_url(),
                "--table",
                "app.ledger",
            ])
            .args(["--resource", "nightly"])
            .run()
            .expect(0);
        let grant = db
            .fence()
            .args(["grant", "--target", &db.admin_url(), "--role", &writer])
            .args(["--format", "json"])
            .run();
        assert_eq!(
            grant.code, 2,
            "grant accepted a {server_role} member: {grant:?}"
        );
        let json = grant.json();
        assert!(
            json["message"].as_str().unwrap().contains(server_role)
                && json["hint"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("REVOKE {server_role}")),
            "{json}"
        );
        let usage: bool = pg_query(
            &db.admin(),
            &format!("SELECT has_schema_privilege('{writer}', 'fence', 'USAGE')"),
        )[0]
        .get(0);
        assert!(!usage, "{writer} was granted");
        let doctor = db
            .fence()
            .args(["doctor", "--target", &db.url(&writer), "--format", "json"])
            .run();
        assert_eq!(
            doctor.code, 2,
            "doctor passed a {server_role} member: {doctor:?}"
        );
        let found = common::doctor_findings(&doctor.json(), "postgres.protection");
        assert!(
            found
                .iter()
                .any(|(severity, message, _)| severity == "fail" && message.contains(server_role)),
            "{found:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Schema versions are checked before anything is written.
// ---------------------------------------------------------------------------------------

/// Finding 4: the coordinator's one-shot statements carried the version check as a scalar
/// subquery on the `meta` row: without the row it was NULL, no cast failed, and acquire and
/// renew ran on a schema whose version nobody knew. Now a missing row reads as version 0:
/// the schema is migrated first (as the target side does).
#[test]
fn a_coordinator_without_a_version_row_is_migrated_before_use() {
    let store = Store::postgres();
    let s = schema(&store);
    let held = store.fence().acquire("r", &["--owner", "a", "--ttl", "1h"]);
    pg_exec(
        &store.url,
        &format!("DELETE FROM {s}.meta WHERE key = 'schema_version'"),
    );
    let out = store
        .fence()
        .args(["acquire", "other", "--owner", "b", "--format", "json"])
        .run();
    let renew = store
        .fence()
        .args([
            "renew",
            "r",
            "--owner",
            "a",
            "--token",
            &held.token.to_string(),
        ])
        .args(["--format", "json"])
        .run();
    let version: Vec<String> = pg_query(
        &store.url,
        &format!("SELECT value FROM {s}.meta WHERE key = 'schema_version'"),
    )
    .iter()
    .map(|r| r.get(0))
    .collect();
    let granted: Vec<i64> = pg_query(
        &store.url,
        &format!("SELECT token FROM {s}.leases WHERE resource = 'other'"),
    )
    .iter()
    .map(|r| r.get(0))
    .collect();
    let current = fence::coordinator::COORDINATOR_SCHEMA.version.to_string();
    assert!(
        granted.is_empty() || version == [current.clone()],
        "acquire wrote a lease (token {granted:?}) into a coordinator schema without a version (version now {version:?}); acquire exit {}, renew exit {}",
        out.code,
        renew.code
    );
}

/// Finding 5: a target version fence cannot parse as an integer ('6.1', as a newer fence might
/// write; '6 ' the same) was taken for a missing schema: version 5's DDL ran over it, and the
/// write went in. Now it is refused (exit 2, naming the version), in both forms, and the
/// schema is left as it is; the coordinator's too.
#[test]
fn a_target_at_an_unreadable_version_is_refused_and_left_alone() {
    let store = Store::postgres();
    let s = schema(&store);
    store
        .fence()
        .args(["init", "--target", &store.url])
        .run()
        .expect(0);
    let table = setup_table(&store);
    let token = store
        .fence()
        .acquire("r", &["--owner", "a", "--ttl", "1h"])
        .token;
    pg_exec(
        &store.url,
        &format!("UPDATE {s}.target_meta SET value = '6.1' WHERE key = 'schema_version'"),
    );
    let out = store
        .fence()
        .args(["write", "r", "--token", &token.to_string(), "--owner", "a"])
        .args(["--target", &store.url, "--format", "json"])
        .args(["--sql", &format!("INSERT INTO {table} VALUES (7)")])
        .run();
    let version = one(
        &store.url,
        &format!("SELECT value FROM {s}.target_meta WHERE key = 'schema_version'"),
    );
    assert_eq!(
        (values(&store, &table).as_str(), version.as_str()),
        ("", "6.1"),
        "a target at an unreadable version was migrated down and written (exit {}: {})",
        out.code,
        out.stdout.trim()
    );
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stdout.contains("cannot read"), "{out:?}");
    pg_exec(
        &store.url,
        &format!("CREATE TABLE {s}.accounts (id int PRIMARY KEY, v int, last_fencing_token bigint); INSERT INTO {s}.accounts VALUES (1, 0, 0)"),
    );
    let row = store
        .fence()
        .args(["write", "r", "--token", &token.to_string(), "--owner", "a"])
        .args(["--target", &store.url, "--format", "json"])
        .args([
            "--table",
            &format!("{s}.accounts"),
            "--key",
            "id=1",
            "--set",
            "v=7",
        ])
        .run();
    assert_eq!(row.code, 2, "{row:?}");
    assert_eq!(
        one(&store.url, &format!("SELECT v::text FROM {s}.accounts")),
        "0"
    );
    // The coordinator's version unreadable: acquire is refused, nothing granted. '05' too:
    // it reads as 5, but the statements' check compares the text, so it was "current" to the
    // session and refused by the statement, which failed again with a cast error (exit 1).
    for unreadable in ["6 ", "05"] {
        pg_exec(
            &store.url,
            &format!("UPDATE {s}.meta SET value = '{unreadable}' WHERE key = 'schema_version'"),
        );
        let acquire = store
            .fence()
            .args(["acquire", "other", "--owner", "b", "--format", "json"])
            .run();
        assert_eq!(acquire.code, 2, "{unreadable:?}: {acquire:?}");
        assert!(
            acquire.stdout.contains("cannot read"),
            "{unreadable:?}: {acquire:?}"
        );
        assert_eq!(
            one(
                &store.url,
                &format!("SELECT count(*)::text FROM {s}.leases WHERE resource = 'other'")
            ),
            "0"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Never-issued tokens are refused.
// ---------------------------------------------------------------------------------------

/// Finding 6: with --id, begin_write_once looks the id up before the token: a token above
/// anything the coordinator issued, with an id already applied, was answered as a replay (exit
/// 0). The version check (`check_write`) now comes first and refuses it (exit 6).
#[test]
fn a_never_issued_token_with_a_known_id_is_refused_not_replayed() {
    let store = Store::postgres();
    let table = setup_table(&store);
    let token = store
        .fence()
        .acquire("r", &["--owner", "a", "--ttl", "1h"])
        .token;
    let sql = format!("INSERT INTO {table} VALUES (1)");
    let write = |token: i64| {
        store
            .fence()
            .args(["write", "r", "--token", &token.to_string(), "--id", "k1"])
            .args(["--target", &store.url, "--format", "json", "--sql", &sql])
            .run()
    };
    write(token).expect(0);
    let forged = write(token + 1_000_000);
    assert_eq!(values(&store, &table), "1");
    assert_eq!(
        forged.code, 6,
        "a never-issued token was answered as a replay: {forged:?}"
    );
}

// ---------------------------------------------------------------------------------------
// doctor fails a directory store on tmpfs or open to every user.
// ---------------------------------------------------------------------------------------

/// Removes a directory tree (under /dev/shm) when dropped.
struct Cleanup(std::path::PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn doctor_json(store: &std::path::Path, home: &std::path::Path) -> (i32, serde_json::Value) {
    let out = Fence::bare(home)
        .args(["--store", &format!("file://{}", store.display())])
        .args(["doctor", "--format", "json"])
        .run();
    (out.code, out.json())
}

/// Finding 7: doctor looked at the store directory's filesystem and at the modes of the
/// directories directly in it, skipping symlinks; fence follows them. A store whose `leases`,
/// `tokens` and `events` are symlinks into a tmpfs, and whose `locks` is a symlink to a
/// directory every user may write (mode 777), passed doctor; a "reboot" (the tmpfs emptied)
/// then issued token 1 again. Now doctor follows the symlinks and fails it.
#[test]
fn store_directories_symlinked_to_tmpfs_or_open_directories_fail_doctor() {
    use std::os::unix::fs::PermissionsExt;
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipped: no /dev/shm");
        return;
    }
    let home = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = home.path().join("store");
    let volatile = shm.join(format!("fence-attack-{}", std::process::id()));
    let _cleanup = Cleanup(volatile.clone());
    let open = home.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::create_dir(&store).unwrap();
    for sub in ["tokens", "leases", "events"] {
        std::fs::create_dir_all(volatile.join(sub)).unwrap();
        std::os::unix::fs::symlink(volatile.join(sub), store.join(sub)).unwrap();
    }
    std::os::unix::fs::symlink(&open, store.join("locks")).unwrap();
    let fence =
        || Fence::bare(home.path()).args(["--store", &format!("file://{}", store.display())]);
    // A grant, released at once: the next owner gets the next token, without waiting.
    let token = |owner: &str| {
        let token = fence()
            .args(["acquire", "r", "--owner", owner, "--format", "json"])
            .run()
            .json()["token"]
            .as_i64()?;
        fence()
            .args([
                "release",
                "r",
                "--owner",
                owner,
                "--token",
                &token.to_string(),
            ])
            .run();
        Some(token)
    };
    let first = token("a");
    let second = token("b");
    let (code, json) = doctor_json(&store, home.path());
    // A reboot empties the tmpfs.
    for sub in ["tokens", "leases", "events"] {
        for e in std::fs::read_dir(volatile.join(sub)).unwrap().flatten() {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    let after = token("c");
    assert_eq!(
        code, 2,
        "doctor passed a store whose leases, tokens and events live on tmpfs and whose locks dir is mode 777 (tokens {first:?} and {second:?} issued before the 'reboot', {after:?} after): {json}"
    );
}

/// Finding 8: doctor checked the store directory and the directories in it, not the one that
/// holds it: a store in a parent every user may write (mode 777, no sticky bit) passed, yet
/// any local user can move the store aside and put an empty one of its own in its place (the
/// helper did, as `nobody`: token 1 granted again while its holder was live). Now it fails.
#[test]
fn a_store_under_a_world_writable_parent_fails_doctor() {
    use std::os::unix::fs::PermissionsExt;
    // In /tmp (a disk here; `nobody` cannot reach into the target dir under /root).
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let shared = home.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let store = shared.join("store");
    let fence =
        || Fence::bare(home.path()).args(["--store", &format!("file://{}", store.display())]);
    let held = fence()
        .args([
            "acquire", "r", "--owner", "a", "--ttl", "1h", "--format", "json",
        ])
        .run()
        .expect(0)
        .json()["token"]
        .as_i64()
        .unwrap();
    let (code, json) = doctor_json(&store, home.path());
    // Another local user (nobody) swaps the store, if this host lets the test run as it.
    let swapped = std::process::Command::new("runuser")
        .args(["-u", "nobody", "--", "sh", "-c"])
        .arg(format!(
            "mv '{0}' '{0}.old' && mkdir '{0}'",
            store.display()
        ))
        .status()
        .is_ok_and(|s| s.success());
    let next = if swapped {
        fence()
            .args(["acquire", "r", "--owner", "b", "--format", "json"])
            .run()
            .json()["token"]
            .as_i64()
    } else {
        None
    };
    assert_eq!(
        code, 2,
        "doctor passed a store inside a mode-777 parent (swapped by nobody: {swapped}; then `r`, held by `a` with token {held} for 1h, was granted to `b` with token {next:?}): {json}"
    );
}

// ---------------------------------------------------------------------------------------
// A second helper's findings on the same changes (directory store paths, doctor).
// ---------------------------------------------------------------------------------------

/// `fence` with HOME and XDG_STATE_HOME set, no --store: the embedded default store.
fn default_store_fence(home: &std::path::Path, xdg: &std::path::Path) -> Fence {
    Fence::bare(home).env("XDG_STATE_HOME", xdg)
}

/// The default store lives under XDG_STATE_HOME exactly as given: a `%` in it was decoded
/// as an escape (the default went through a `file://` URL), so the store went to another
/// directory, or (its parent missing) was refused as a typo.
#[test]
fn the_default_store_is_where_xdg_state_home_says_even_with_a_percent() {
    let home = tempfile::tempdir().unwrap();
    for xdg in [
        home.path().join("a%41b").join("state"),
        home.path().join("x%41y"),
    ] {
        default_store_fence(home.path(), &xdg)
            .args(["acquire", "r", "--ttl", "5s"])
            .run()
            .expect(0);
        assert!(
            xdg.join("fence").join("leases").is_dir(),
            "{}",
            xdg.display()
        );
        let out = default_store_fence(home.path(), &xdg)
            .args(["doctor", "--format", "json"])
            .run();
        let exists = common::doctor_findings(&out.json(), "directory.exists");
        assert!(exists.iter().all(|(s, _, _)| s != "fail"), "{exists:?}");
    }
    assert!(!home.path().join("aAb").exists() && !home.path().join("xAy").exists());
}

/// `fence bench` on the embedded default store of a fresh HOME (no `~/.local/state` yet):
/// its scratch directory inside the store was refused for a missing parent.
#[test]
fn bench_runs_on_the_default_store_of_a_fresh_home() {
    let home = tempfile::tempdir().unwrap();
    Fence::bare(home.path())
        .args(["bench", "--duration", "1s", "--workers", "1"])
        .run()
        .expect(0);
    assert!(home.path().join(".local/state/fence").is_dir());
}

/// doctor looked only at the directories above the store as its path is written: a store
/// reached through a symlink into a directory every user may write without the sticky bit,
/// or a `leases` directory that is a symlink into one, passed, though anyone can move the
/// real directory aside. Now the resolved paths are checked too.
#[test]
fn doctor_checks_the_directories_above_symlink_targets() {
    use std::os::unix::fs::PermissionsExt;
    let fails = |home: &std::path::Path, url: &str| {
        let out = Fence::bare(home)
            .args(["--store", url, "doctor", "--format", "json"])
            .run();
        let perms = common::doctor_findings(&out.json(), "directory.permissions");
        assert!(
            perms.iter().any(|(s, _, _)| s == "fail"),
            "{url}: {perms:?}"
        );
        assert_eq!(out.code, 2, "{url}");
    };
    // The store's parent is a symlink into ww/real.
    let home = tempfile::tempdir().unwrap();
    let ww = home.path().join("ww");
    std::fs::create_dir_all(ww.join("real")).unwrap();
    std::fs::create_dir_all(home.path().join("home")).unwrap();
    std::fs::set_permissions(&ww, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::os::unix::fs::symlink(ww.join("real"), home.path().join("home/link")).unwrap();
    let url = format!("file://{}/home/link/store", home.path().display());
    Fence::bare(home.path())
        .args(["--store", &url, "acquire", "r", "-q"])
        .run()
        .expect(0);
    fails(home.path(), &url);
    // `leases` is a symlink into ww2/leases.
    let home = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", home.path().display());
    Fence::bare(home.path())
        .args(["--store", &url, "acquire", "r", "-q"])
        .run()
        .expect(0);
    let ww = home.path().join("ww2");
    std::fs::create_dir_all(ww.join("leases")).unwrap();
    std::fs::set_permissions(&ww, std::fs::Permissions::from_mode(0o777)).unwrap();
    let leases = home.path().join("store/leases");
    for e in std::fs::read_dir(&leases).unwrap().flatten() {
        std::fs::rename(e.path(), ww.join("leases").join(e.file_name())).unwrap();
    }
    std::fs::remove_dir(&leases).unwrap();
    std::os::unix::fs::symlink(ww.join("leases"), &leases).unwrap();
    fails(home.path(), &url);
    // Ordinary set-ups still pass: a store in a temporary directory, a fresh default store.
    let store = Store::file();
    store.fence().acquire("r", &[]);
    store.fence().args(["doctor"]).run().expect(0);
    let home = tempfile::tempdir().unwrap();
    Fence::bare(home.path()).args(["doctor"]).run().expect(0);
}
