//! Review 14: adversarial tests of the PostgreSQL target, each failing on the code it was
//! written against (see the review's report). What each test holds is in its name; the
//! doc comment says what was done to break it and what fence did.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::fenced::{backends, finish, hold_in_transaction, one, schema, tagged_url};
use common::own_db::OwnDb;
use common::{env_or_panic, pg_exec, pg_query, pg_try_exec, wait_for, Fence, Out, Store};

/// How long the server may take to show a session's state change on a loaded machine.
const SERVER_SETTLES: Duration = Duration::from_secs(30);

/// A database of the test's own (see `OwnDb`), with what these tests do in it.
struct Db(OwnDb);

impl std::ops::Deref for Db {
    type Target = OwnDb;
    fn deref(&self) -> &OwnDb {
        &self.0
    }
}

impl Db {
    fn new(tag: &str) -> Db {
        Db(OwnDb::new("review14", tag))
    }

    /// A granted and released lease of `resource`: its token, and the next grant's is higher.
    fn token(&self, resource: &str) -> i64 {
        let lease = self.fence().acquire(resource, &[]);
        self.fence().release(&lease);
        lease.token
    }

    fn write(&self, role: &str, token: i64, sql: &str) -> Out {
        self.fence()
            .args(["write", "r", "--token", &token.to_string()])
            .args([
                "--target",
                &self.url(role),
                "--sql",
                sql,
                "--format",
                "json",
            ])
            .run()
    }

    fn rows(&self, sql: &str) -> Vec<String> {
        pg_query(&self.admin(), sql)
            .iter()
            .map(|r| r.get(0))
            .collect()
    }
}

fn drop_role(role: &str) {
    let _ = pg_try_exec(&OwnDb::server(), &format!("DROP ROLE IF EXISTS {role}"));
}

/// DESIGN §4 and §12: a password in a URL is never printed. tokio-postgres percent-decodes
/// the *names* of URL parameters as well as their values, so `?pass%77ord=SECRET` is the
/// password, and fence connects with it; `redact_url` only drops parameters spelled
/// `password=`, so the secret was printed: in the error of an unreachable target (exit 7),
/// in the JSON of a committed write (`"target"`), and in `acquire --format env`'s
/// `export FENCE_STORE=…` line (`url_has_password` said there was none).
#[test]
fn a_percent_encoded_password_parameter_is_never_printed() {
    let store = Store::postgres();
    let secret = env_or_panic("FENCE_TEST_PG_PASSWORD");
    let with_encoded_password = |port: &str| {
        format!(
            "postgres://{}@{}:{port}/{}?pass%77ord={secret}",
            env_or_panic("FENCE_TEST_PG_USER"),
            env_or_panic("FENCE_TEST_PG_HOST"),
            env_or_panic("FENCE_TEST_PG_DB"),
        )
    };
    let url = with_encoded_password(&env_or_panic("FENCE_TEST_PG_PORT"));
    // Nothing listens on port 1: the error names the target.
    let unreachable = store
        .fence()
        .args(["write", "r", "--token", "5", "--sql", "SELECT 1"])
        .args(["--target", &with_encoded_password("1"), "--format", "json"])
        .run();
    assert_eq!(unreachable.code, 7, "{unreachable:?}");
    // The password is the real one: the write connects and commits.
    let committed = store
        .fence()
        .args(["write", "r", "--token", "5", "--sql", "SELECT 1"])
        .args(["--target", &url, "--format", "json"])
        .run();
    assert_eq!(committed.code, 0, "{committed:?}");
    let exported = store
        .fence_at(&url)
        .args(["acquire", "other", "--format", "env"])
        .run();
    assert_eq!(exported.code, 0, "{exported:?}");
    for (what, out) in [
        ("the unreachable target's error", &unreachable),
        ("the committed write's JSON", &committed),
        ("acquire --format env", &exported),
    ] {
        assert!(
            !out.stdout.contains(&secret) && !out.stderr.contains(&secret),
            "{what} prints the password: {out:?}"
        );
    }
}

/// DESIGN §12, "The writer cannot drop, replace or un-trigger a protected table": `grant`
/// refuses a writer that owns what a protected table depends on — types, the functions of
/// its defaults and checks, its parents — but not the function a trigger (or a row-level
/// security policy) of the table calls, though replacing it changes the table's rows just
/// the same. Here the application role owns `appfn.touch()`, called by a row trigger of the
/// protected `notes`: `fence grant` granted it (exit 0) and `doctor --target` said
/// `postgres.protection` ok. Then the writer, holding only a stale token (its own write
/// refused, exit 4), replaced the function; the next fenced write of the current holder
/// (exit 0) ran it inside its bound transaction, and the stale writer's row landed in the
/// protected `ledger`. Either `grant` refuses such a writer (exit 2, naming the function),
/// or nothing the stale writer planted lands.
#[test]
fn a_writer_that_owns_a_protected_tables_trigger_function_cannot_plant_a_write() {
    let writer = format!("review14_w_{}", common::process_tag());
    drop_role(&writer);
    let db = Db::new("trigger_fn");
    pg_exec(
        &db.admin(),
        &format!(
            "CREATE ROLE {writer} LOGIN;
             CREATE SCHEMA appfn AUTHORIZATION {writer};
             CREATE TABLE notes (id int PRIMARY KEY, v text);
             CREATE TABLE ledger (v text);
             CREATE FUNCTION appfn.touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
             ALTER FUNCTION appfn.touch() OWNER TO {writer};
             CREATE TRIGGER notes_touch BEFORE INSERT OR UPDATE ON notes
                 FOR EACH ROW EXECUTE FUNCTION appfn.touch();
             GRANT SELECT, INSERT, UPDATE ON notes, ledger TO {writer};"
        ),
    );
    for table in ["notes", "ledger"] {
        db.fence()
            .args(["protect", "--target", &db.admin_url(), "--table", table])
            .args(["--resource", "r"])
            .run()
            .expect(0);
    }
    let granted = db
        .fence()
        .args(["grant", "--target", &db.admin_url(), "--role", &writer])
        .args(["--format", "json"])
        .run();
    if granted.code == 2 {
        let message = granted.json()["message"].as_str().unwrap().to_owned();
        assert!(message.contains("touch"), "{message}");
    } else {
        assert_eq!(granted.code, 0, "{granted:?}");
        let stale = db.token("r");
        let current = db.token("r");
        db.write(&writer, current, "INSERT INTO notes VALUES (1, 'current')")
            .expect(0);
        // The stale owner cannot write itself...
        db.write(
            &writer,
            stale,
            "INSERT INTO ledger VALUES ('stale, refused')",
        )
        .expect(4);
        // ...but may replace the function, as the owner it is.
        pg_exec(
            &db.raw(&writer),
            "CREATE OR REPLACE FUNCTION appfn.touch() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO public.ledger VALUES ('planted by the stale owner'); RETURN NEW; END $$",
        );
        db.write(&writer, current, "UPDATE notes SET v = 'current, again'")
            .expect(0);
        assert_eq!(
            db.rows("SELECT v FROM ledger ORDER BY v"),
            Vec::<String>::new(),
            "a write of the stale owner landed in the protected table"
        );
    }
    drop(db);
    drop_role(&writer);
}

/// DESIGN §12, "A commit is durable": every fenced write sets `synchronous_commit = on`
/// last, "whatever the database, the role or the caller's SQL set". It does so with an
/// unqualified `set_config(…)` in the script, resolved through the session's search_path,
/// which an ordinary writer role may set for itself (`ALTER ROLE … SET search_path`) to a
/// schema of its own ahead of `pg_catalog`, holding a `set_config(text, text, boolean)` that
/// sets nothing. On a target that commits asynchronously (this cluster's default, as in
/// `target_trust.rs`), the current holder's write was acknowledged (exit 0) and lost in a
/// crash right after, with its guard row; the stale owner's write was then accepted (exit 0,
/// I2 broken). The stale write must be refused (exit 4) and the current one survive.
#[test]
fn a_writer_role_cannot_make_a_fenced_commit_asynchronous() {
    // As target_trust.rs: asynchronous commits are flushed only every ten seconds.
    let cluster = Cluster::start_with("wal_writer_delay = 10s\nwal_writer_flush_after = 1GB\n");
    let admin = cluster.url();
    let writer = format!(
        "postgres:///postgres?host={}&user=app",
        cluster.dir.path().display()
    );
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join("store")).unwrap();
    let fence = || {
        Fence::bare(home.path()).env(
            "FENCE_STORE",
            format!("file://{}/store", home.path().display()),
        )
    };
    pg_exec(
        &admin,
        "CREATE ROLE app LOGIN; CREATE SCHEMA appfn AUTHORIZATION app;
         CREATE TABLE ledger (v text); GRANT SELECT, INSERT ON ledger TO app;",
    );
    fence().args(["init", "--target", &admin]).run().expect(0);
    fence()
        .args([
            "protect",
            "--target",
            &admin,
            "--table",
            "ledger",
            "--resource",
            "r",
        ])
        .run()
        .expect(0);
    fence()
        .args(["grant", "--target", &admin, "--role", "app"])
        .run()
        .expect(0);
    let write = |token: i64, value: &str| {
        fence()
            .args([
                "write",
                "r",
                "--token",
                &token.to_string(),
                "--target",
                &writer,
            ])
            .args(["--sql", &format!("INSERT INTO ledger VALUES ('{value}')")])
            .args(["--format", "json"])
            .run()
    };
    let a = fence().acquire("r", &["--owner", "a"]);
    write(a.token, "a1").expect(0);
    fence().release(&a);
    let b = fence().acquire("r", &["--owner", "b"]);
    assert!(b.token > a.token);
    // The writer role, on its own: a set_config of its own ahead of pg_catalog's.
    let app = format!(
        "host={} user=app dbname=postgres",
        cluster.dir.path().display()
    );
    pg_exec(
        &app,
        "CREATE FUNCTION appfn.set_config(text, text, boolean) RETURNS text LANGUAGE sql AS 'SELECT $2';
         ALTER ROLE app SET search_path = appfn, pg_catalog, public;",
    );
    write(b.token, "b1").expect(0);
    cluster.pg_ctl("restart");
    let stale = write(a.token, "stale");
    let rows: Vec<String> = pg_query(&admin, "SELECT v FROM ledger ORDER BY v")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        stale.code, 4,
        "the stale write after a crash: {stale:?} (rows {rows:?})"
    );
    assert_eq!(rows, ["a1", "b1"]);
}

/// DESIGN §10, "what fence gives up on, it cancels on the server"; §12, "A killed `fence
/// write` cannot commit later". The row form takes neither `--timeout` nor a cancel: with
/// the row locked by another transaction, `fence write --table … --timeout 1s` waited 10 s
/// (its request timeout), exited 8 ("may or may not have been applied"), and left its
/// statement waiting on the server, which applied the stale-by-then write as soon as the
/// lock was released, long after fence had exited. The write must end within its timeout,
/// cancelled on the server: exit 7, nothing left running, the row unchanged once the lock
/// is released.
#[test]
fn a_row_write_that_outlives_its_timeout_is_cancelled_not_left_to_commit() {
    let store = Store::postgres();
    let s = schema(&store);
    let table = format!("{s}.acct");
    pg_exec(
        &store.url,
        &format!(
            "CREATE SCHEMA IF NOT EXISTS {s};
             CREATE TABLE {table} (id int PRIMARY KEY, v text, last_fencing_token bigint);
             INSERT INTO {table} VALUES (1, 'before', 0);"
        ),
    );
    let name = format!("fence-{s}-rowtimeout");
    let lock = hold_in_transaction(
        &store.url,
        format!("SELECT * FROM {table} WHERE id = 1 FOR UPDATE"),
        "COMMIT",
    );
    let started = Instant::now();
    let out = store
        .fence()
        .args([
            "write",
            "r",
            "--token",
            "5",
            "--target",
            &tagged_url(&store, &name),
        ])
        .args(["--table", &table, "--key", "id=1", "--set", "v=late"])
        .args(["--timeout", "1s", "--format", "json"])
        .run();
    let took = started.elapsed();
    let left_running = backends(&store, &name)
        .into_iter()
        .filter(|(state, _, _)| state == "active")
        .count();
    lock.release();
    // Whatever was left running ends once the lock is gone.
    wait_for("the row write's session to end", SERVER_SETTLES, || {
        backends(&store, &name)
            .iter()
            .all(|(state, _, _)| state != "active")
    });
    let row = one(&store.url, &format!("SELECT v FROM {table} WHERE id = 1"));
    assert_eq!(
        (out.code, left_running, row.as_str()),
        (7, 0, "before"),
        "exit code, statements left running, the row after the lock's release (took {took:?}): {out:?}"
    );
}

/// The same as above for a stop signal: `fence run` sends SIGTERM to its command when the
/// lease is lost, and the transaction form then cancels its transaction on the server (exit
/// 7). The row form installs no handler: fence died of the signal (no exit code), and its
/// statement, waiting on a row lock, applied once the lock was released, after the lease it
/// was written under was gone.
#[test]
fn a_row_write_stopped_by_sigterm_is_cancelled_on_the_server() {
    let store = Store::postgres();
    let s = schema(&store);
    let table = format!("{s}.acct");
    pg_exec(
        &store.url,
        &format!(
            "CREATE SCHEMA IF NOT EXISTS {s};
             CREATE TABLE {table} (id int PRIMARY KEY, v text, last_fencing_token bigint);
             INSERT INTO {table} VALUES (1, 'before', 0);"
        ),
    );
    let name = format!("fence-{s}-rowsigterm");
    let lock = hold_in_transaction(
        &store.url,
        format!("SELECT * FROM {table} WHERE id = 1 FOR UPDATE"),
        "COMMIT",
    );
    let mut fence = store.fence();
    fence
        .cmd
        .args([
            "write",
            "r",
            "--token",
            "5",
            "--target",
            &tagged_url(&store, &name),
        ])
        .args(["--table", &table, "--key", "id=1", "--set", "v=late"])
        // Far beyond the test's own limits: only the signal can end this write in time (a
        // fence that ignored it ended at the default --timeout, 30 s, and passed).
        .args(["--timeout", "10m"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = fence.cmd.spawn().expect("start fence write");
    wait_for("the row write to wait for the lock", SERVER_SETTLES, || {
        backends(&store, &name)
            .iter()
            .any(|(state, wait, _)| state == "active" && wait == "Lock")
    });
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (code, _, stderr) = finish(child, SERVER_SETTLES);
    let left_running = backends(&store, &name)
        .into_iter()
        .filter(|(state, _, _)| state == "active")
        .count();
    lock.release();
    wait_for("the row write's session to end", SERVER_SETTLES, || {
        backends(&store, &name)
            .iter()
            .all(|(state, _, _)| state != "active")
    });
    let row = one(&store.url, &format!("SELECT v FROM {table} WHERE id = 1"));
    assert_eq!(
        (code, left_running, row.as_str()),
        (7, 0, "before"),
        "exit code, statements left running, the row after the lock's release: {stderr}"
    );
}

/// DESIGN §5 and §9: exit 1 `sql_failed` is "the caller's own SQL failed", and its hint
/// says "fix the SQL and run it again". A session terminated by the server while the
/// caller's SQL ran (`pg_terminate_backend`, SQLSTATE 57P01, as in a fast shutdown or a
/// failover) was reported exactly so — exit 1, "fix the SQL" — though nothing is wrong with
/// the SQL and nothing was applied: that is `unavailable`, exit 7 (review 7 made the same
/// distinction for fence's guard statements only).
#[test]
fn a_session_terminated_while_the_sql_runs_is_unavailable_not_sql_failed() {
    let store = Store::postgres();
    let s = schema(&store);
    let table = format!("{s}.items");
    pg_exec(
        &store.url,
        &format!("CREATE SCHEMA IF NOT EXISTS {s}; CREATE TABLE {table} (v int)"),
    );
    let name = format!("fence-{s}-terminated");
    let mut fence = store.fence();
    fence
        .cmd
        .args([
            "write",
            "r",
            "--token",
            "5",
            "--target",
            &tagged_url(&store, &name),
        ])
        .args([
            "--sql",
            &format!("INSERT INTO {table} VALUES (1); SELECT pg_sleep(60)"),
        ])
        .args(["--format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = fence.cmd.spawn().expect("start fence write");
    wait_for("the write to reach pg_sleep", SERVER_SETTLES, || {
        backends(&store, &name).iter().any(|(state, wait, query)| {
            state == "active" && wait == "Timeout" && query.contains("pg_sleep")
        })
    });
    pg_exec(
        &store.url,
        &format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{name}'"
        ),
    );
    let (code, stdout, _) = finish(child, SERVER_SETTLES);
    assert_eq!(
        one(&store.url, &format!("SELECT count(*)::text FROM {table}")),
        "0"
    );
    assert_eq!(code, 7, "{stdout}");
}
