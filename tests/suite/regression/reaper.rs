//! A fifth adversarial review: `fence run`'s reaper and its leftovers report (a killed
//! reaper, fork chains, zombies, a paused supervisor, Ctrl-C at a terminal, stop signals a
//! command ignores, file descriptors a caller hands down, closed standard streams), the
//! PostgreSQL coordinator's retry of cancelled statements and the settings a role or database
//! can impose on it (`statement_timeout`, `lock_timeout`, `idle_session_timeout`,
//! `default_transaction_isolation`), the directory store under wall-clock jumps, damaged logs
//! and copies from another machine, the shared classification of renew and release refusals on
//! every coordinator, missing target schemas, foreign S3 metadata, and `fence bench`'s scratch
//! namespace. Each test asserts on durable state read without fence where it can (lease rows
//! and records, event logs, files the command writes); a test marked `FINDING` and ignored
//! shows an open defect and fails until it is fixed (`--run-ignored only` runs them).

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::process::{becomes, is_gone, kill, parent_of, read_pid, Reap};
use common::{env_or_panic, pg_exec, pg_query, wait_for, Fence, Out, Store};
use serde_json::Value;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn acquire(store: &Store, resource: &str, owner: &str, ttl: &str) -> i64 {
    store
        .fence()
        .args(["acquire", resource, "--owner", owner, "--ttl", ttl])
        .args(["--format", "json"])
        .run()
        .expect(0)
        .json()["token"]
        .as_i64()
        .unwrap()
}

/// `fence run RESOURCE [extra] -- sh -c SCRIPT` in `dir`, started in the background.
fn spawn_run(store: &Store, dir: &Path, extra: &[&str], script: &str) -> Child {
    let mut fence = store.fence().args(["run", "r"]).args(extra);
    fence = fence.args(["--", "sh", "-c", script]);
    fence
        .cmd
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn state(store: &Store, resource: &str) -> Value {
    store
        .fence()
        .args(["inspect", resource, "--format", "json"])
        .run()
        .expect(0)
        .json()["resources"][0]
        .clone()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `sh -c SCRIPT` with the clean environment fence gets, `$FENCE` naming the binary under
/// test and `$STORE` the store (for scripts that redirect fence's own descriptors).
fn shell(store: &Store, script: &str) -> Out {
    let output = common::clean_command("sh", store.home.path())
        .args(["-c", script])
        .env("FENCE", env!("CARGO_BIN_EXE_fence"))
        .env("STORE", &store.url)
        .current_dir(store.home.path())
        .output()
        .unwrap();
    Out::from(output)
}

// ---------------------------------------------------------------------------------------
// 1. `fence run`: what outlives the command, and what is reported as left over
// ---------------------------------------------------------------------------------------

/// SIGKILL of the reaper (the OOM killer picks it, an operator `kill -9`s the wrong pid)
/// while the command has a daemon (`setsid`, as every daemon does). The command dies of its
/// parent-death signal and `fence run` stops what is left of the *process group*, releases
/// the lease and exits — but the daemon left the group, and with its subreaper dead it is
/// handed to init, where nothing ever stops it: it works on without a lease while the next
/// holder runs. `fence run` should stop every descendant before it releases (itself a
/// subreaper, or a cgroup), or keep the lease until they are gone.
/// Fixed: `fence run` is a subreaper too; the reaper's orphans come to it, and it stops them
/// before it releases the lease.
#[test]
fn killing_the_reaper_stops_the_command_s_daemons_too() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let fence = spawn_run(
        &store,
        dir.path(),
        &["--ttl", "1m"],
        "setsid sleep 300 >/dev/null 2>&1 & echo $! > daemon; echo $$ > child; wait",
    );
    wait_for("the command", Duration::from_secs(30), || {
        dir.path().join("daemon").exists() && dir.path().join("child").exists()
    });
    let daemon = read_pid(&dir.path().join("daemon"));
    let child = read_pid(&dir.path().join("child"));
    let _reap = Reap(vec![daemon]);
    let reaper = parent_of(child);
    assert_ne!(reaper, fence.id(), "the command runs under a reaper");
    kill(reaper, libc::SIGKILL);
    let out = common::wait_output("fence run", fence, Duration::from_secs(60));
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    let released = state(&store, "r")["state"] == "free";
    assert!(
        !released || becomes(Duration::from_secs(5), || is_gone(daemon)),
        "the lease was released while the daemon {daemon} still runs: {out:?}"
    );
}

/// A chain of processes, each forking the next and exiting at once (how some supervisors,
/// `nohup`ed retry loops and malware keep themselves alive), started in a session of its own
/// and ignoring SIGTERM. The reaper finds descendants by one scan of /proc per signal, so
/// the member alive when its SIGKILL is sent is often one born after the scan: the chain
/// survives, `fence run` exits 0 with the lease released, and the chain works on unfenced
/// forever. A killer that loops until no descendant is left (or a cgroup, or a PID namespace)
/// would stop it. The attack is tried three times; one escape fails the test.
/// Fixed: after SIGTERM, the reaper sends SIGKILL again and again (up to 10 s) to every descendant still there or born since.
#[test]
fn a_fork_chain_left_by_the_command_does_not_outlive_the_run() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let chain = dir.path().join("chain.sh");
    // Each member forks the next (a function call in a background subshell: no exec, so
    // a member lives well under a millisecond) and exits; every 500 steps it execs a fresh
    // shell, whose function nesting starts again. `probe` asks the chain to say it lives.
    std::fs::write(
        &chain,
        "trap '' TERM\nd=${0%/*}\nn=0\nstep() {\n  [ -e \"$d/stop\" ] && exit 0\n  [ -e \"$d/probe\" ] && : > \"$d/seen\"\n  n=$((n + 1))\n  if [ \"$n\" -gt 500 ]; then sh \"$0\" & exit 0; fi\n  step &\n  exit 0\n}\nstep\n",
    )
    .unwrap();
    let stop = dir.path().join("stop");
    let _stop = StopFile(stop.clone());
    let mut escaped = Vec::new();
    for attempt in 0..3 {
        for file in ["stop", "probe", "seen"] {
            let _ = std::fs::remove_file(dir.path().join(file));
        }
        let script = format!(
            "setsid sh {0} >/dev/null 2>&1; setsid sh {0} >/dev/null 2>&1; exit 0",
            chain.display()
        );
        let fence = spawn_run(&store, dir.path(), &["--ttl", "1m"], &script);
        let out = common::wait_output("fence run", fence, Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        std::fs::write(dir.path().join("probe"), "").unwrap();
        if becomes(Duration::from_secs(3), || dir.path().join("seen").exists()) {
            // A chain that still runs ends at its next step once `stop` exists.
            escaped.push(attempt);
            break;
        }
    }
    assert!(
        escaped.is_empty(),
        "the chain outlived fence run (attempts {escaped:?}), the lease released"
    );
}

/// Creates its file when dropped: stops a chain whatever the test's outcome.
struct StopFile(std::path::PathBuf);

impl Drop for StopFile {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, "");
    }
}

/// A command that started a short job and `exec`ed into its last step (`job & exec tail`),
/// or any program that exits without waiting for a child that already ended: the ended
/// child is a zombie, handed to the reaper when the command exits. The reaper counts it among
/// the processes "left running" and tells `fence run`, which then refuses to record the run id
/// as completed ("it left processes running, which were stopped with it"): nothing was
/// running and nothing was stopped, yet every later run with the id runs the work again.
/// Fixed: the reaper reaps first and skips zombies when it looks for leftovers.
#[test]
fn a_finished_child_never_waited_for_is_not_a_leftover() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let script = "echo ran >> log; : & exec sleep 1";
    let first = spawn_run(&store, dir.path(), &["--id", "day-1"], script);
    let first = common::wait_output("the first run", first, Duration::from_secs(60));
    assert_eq!(first.status.code(), Some(0), "{first:?}");
    // The same command again (another one under a completed id is refused, not skipped).
    let again = store
        .fence()
        .args(["run", "r", "--id", "day-1", "--format", "json", "--"])
        .args(["sh", "-c", script]);
    let mut again = again;
    again.cmd.current_dir(dir.path());
    let again = again.run();
    assert_eq!(
        lines(&dir.path().join("log")),
        ["ran"],
        "the completed run ran again:\nfirst: {first:?}\nnext: {again:?}"
    );
    assert_eq!(again.json()["skipped"], true, "{again:?}");
}

/// `fence run` is paused (SIGSTOP by a debugger or a job-control mistake, a cgroup freezer,
/// swap storm) while its command is not: the lease expires by the store's clock and another
/// host takes it, yet the command goes on for as long as fence stays stopped — the reaper,
/// which runs, never learns the lease's bound. The README promises the command is stopped
/// when the lease can no longer be proven "(store unreachable, or fence itself was
/// paused)"; only a fence that wakes up does it. The reaper could hold the bound itself (fence
/// sends it each renewal) and stop the group when it passes.
/// Fixed: `fence run` sends the reaper the bound of every renewal, and the reaper stops the
/// command there on its own (SIGTERM, SIGKILL after `--kill-after`).
#[test]
fn a_paused_fence_run_does_not_leave_its_command_running_past_the_lease() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let fence = spawn_run(
        &store,
        dir.path(),
        &["--ttl", "2s", "--kill-after", "1s"],
        "echo $$ > child; while :; do sleep 0.05; done",
    );
    wait_for("the command", Duration::from_secs(30), || {
        dir.path().join("child").exists()
    });
    let child = read_pid(&dir.path().join("child"));
    let _reap = Reap(vec![child]);
    kill(fence.id(), libc::SIGSTOP);
    // Another owner gets the lease once it expired by the store's clock.
    store
        .fence()
        .args(["acquire", "r", "--owner", "other", "--ttl", "1m"])
        .args(["--wait", "60s"])
        .run()
        .expect(0);
    let stopped = becomes(Duration::from_secs(10), || is_gone(child));
    kill(fence.id(), libc::SIGCONT);
    let out = common::wait_output("fence run", fence, Duration::from_secs(60));
    assert!(
        stopped,
        "the command ran on under a paused fence while `other` held the lease: {out:?}"
    );
}

/// `fence run --id` typed at a terminal, and interrupted with Ctrl-C. The reaper gives the
/// command's process group the terminal's foreground (so that it can read the terminal), so
/// the terminal's SIGINT goes to the command's group and never to fence: fence does not know
/// the run was interrupted. The command's handler cleans up and exits 0 (`trap '…; exit 0'
/// INT`, the common idiom), and fence records the run id as completed — tomorrow's cron run
/// with the id skips work that was cut short. The same interruption sent to fence (`kill
/// -INT`) is not recorded (review 4). The reaper sees the signal too, and could report it.
/// Fixed: the reaper, in the command's group, gets the SIGINT too and reports it to fence
/// run, which does not record the run as completed.
#[test]
fn ctrl_c_at_a_terminal_is_an_interruption_too() {
    use std::io::Write;
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let command = format!(
        "{} --store {} run r --id day-1 -- sh -c 'trap \"echo interrupted >> {log}; exit 0\" INT; echo started >> {log}; sleep 30; echo finished >> {log}'",
        env!("CARGO_BIN_EXE_fence"),
        store.url,
        log = log.display()
    );
    // `script` runs the line on a terminal of its own, as a person would type it.
    let mut terminal = common::clean_command("script", store.home.path())
        .args(["-qfec", &command, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the command", Duration::from_secs(30), || {
        lines(&log).contains(&"started".to_owned())
    });
    // Ctrl-C, again until the command says it was interrupted (a keystroke that reaches
    // the terminal before its line settings are in place is read as text).
    let interrupted = || lines(&log).contains(&"interrupted".to_owned());
    for _ in 0..10 {
        terminal.stdin.as_mut().unwrap().write_all(b"\x03").unwrap();
        if becomes(Duration::from_secs(3), interrupted) {
            break;
        }
    }
    assert!(interrupted(), "Ctrl-C never reached the command");
    let code = common::wait_exit(&mut terminal, Duration::from_secs(60));
    let first = terminal.wait_with_output().unwrap();
    assert_eq!(code, Some(0), "{first:?}");
    let again = spawn_run(
        &store,
        dir.path(),
        &["--id", "day-1"],
        &format!("echo finished >> {}", log.display()),
    );
    let again = common::wait_output("the next run", again, Duration::from_secs(60));
    assert!(
        lines(&log).contains(&"finished".to_owned()),
        "the interrupted run was recorded as completed, and the next run skipped it: {:?}\nfirst: {first:?}\nnext: {again:?}",
        lines(&log)
    );
}

/// Holds: SIGTERM to `fence run` whose command ignores it (`trap '' TERM`, a program that
/// finishes its batch first). fence passes it on and keeps renewing while the command runs:
/// the lease is never given up under a living command (another owner stays busy), the
/// command's own exit status comes back, and the run id is not recorded as completed.
#[test]
fn a_command_ignoring_a_forwarded_sigterm_keeps_its_lease_until_it_ends() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let script = "trap '' TERM; echo $$ > child; while [ ! -e finish ]; do sleep 0.05; done; echo finished >> log; exit 0";
    let fence = spawn_run(
        &store,
        dir.path(),
        &["--ttl", "1s", "--id", "day-1"],
        script,
    );
    wait_for("the command", Duration::from_secs(30), || {
        dir.path().join("child").exists()
    });
    let child = read_pid(&dir.path().join("child"));
    let _reap = Reap(vec![child]);
    let token = state(&store, "r")["token"].as_i64().unwrap();
    kill(fence.id(), libc::SIGTERM);
    // Three renewals after the signal: well past the 1 s TTL, the lease still held.
    let renewals = || {
        store
            .events("r")
            .iter()
            .filter(|(kind, _, _)| kind == "renewed")
            .count()
    };
    let before = renewals();
    wait_for("renewals after SIGTERM", Duration::from_secs(60), || {
        renewals() >= before + 3
    });
    assert!(!is_gone(child));
    let now = state(&store, "r");
    assert_eq!(now["state"], "held", "{now}");
    assert_eq!(now["token"].as_i64(), Some(token), "{now}");
    store
        .fence()
        .args(["acquire", "r", "--owner", "other"])
        .run()
        .expect(3);
    std::fs::write(dir.path().join("finish"), "").unwrap();
    let out = common::wait_output("fence run", fence, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(state(&store, "r")["state"], "free");
    // Interrupted, so not recorded: the next run with the id runs its command.
    let again = spawn_run(&store, dir.path(), &["--id", "day-1"], "echo again >> log");
    let again = common::wait_output("the next run", again, Duration::from_secs(60));
    assert_eq!(
        lines(&dir.path().join("log")),
        ["finished", "again"],
        "{again:?}"
    );
}

/// A caller hands the command a descriptor beyond the standard three (`3>>job.log`, a
/// script's `exec 3>&1` to keep its stdout aside, a socket passed by systemd as fd 3):
/// `fence run` puts its report pipe on fd 3 of the reaper, which the command then does not
/// get at all — `echo >&3` fails with "Bad file descriptor", where without fence it works.
/// fence should keep the caller's descriptors as they were (put its pipe on another number,
/// or move the caller's fd 3 back before the command starts).
/// Fixed: the report pipe keeps the number it got in `fence run`, passed to the reaper as
/// an argument; the caller's descriptors reach the command unchanged.
#[test]
fn the_caller_s_descriptor_3_reaches_the_command() {
    let store = Store::file();
    let out = shell(
        &store,
        "\"$FENCE\" --store \"$STORE\" run r -- sh -c 'echo via-fd-3 >&3' 3>>fd3.log",
    );
    let written = std::fs::read_to_string(store.home.path().join("fd3.log")).unwrap_or_default();
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(written, "via-fd-3\n", "{out:?}");
}

/// Holds: `fence run` started with its standard input and output closed (`<&- >&-`, as
/// some daemons and cron wrappers start jobs): the command runs, its status passes through,
/// the lease is released; with `--format json`, the same.
#[test]
fn run_with_stdin_and_stdout_closed_passes_the_status_through() {
    let store = Store::file();
    let out = shell(
        &store,
        "\"$FENCE\" --store \"$STORE\" run r -- sh -c 'echo ran >> log; exit 7' <&- >&-; echo \"rc=$?\" >&2",
    );
    assert!(out.stderr.contains("rc=7"), "{out:?}");
    let out = shell(
        &store,
        "\"$FENCE\" --store \"$STORE\" run r --format json -- sh -c 'echo ran >> log; exit 0' <&- >&-; echo \"rc=$?\" >&2",
    );
    assert!(out.stderr.contains("rc=0"), "{out:?}");
    assert_eq!(lines(&store.home.path().join("log")), ["ran", "ran"]);
    assert_eq!(state(&store, "r")["state"], "free");
}

/// `fence acquire R >&-` (a script whose stdout was closed by its caller, or a typo'd
/// redirection): the lease is granted and the token printed nowhere — the runtime reopens a
/// closed stdout on /dev/null — so fence exits 0 while nobody knows the token or the generated
/// owner, and the lease stays held for its whole TTL. Like any tool whose output is its
/// result, fence should fail (non-zero) when it cannot deliver the grant, and give the lease
/// back.
/// Fixed: fence notes a closed standard output before the runtime reopens it, and acquire
/// refuses (exit 2) before asking the store for anything.
#[test]
fn acquire_with_stdout_closed_does_not_exit_0_silently() {
    let store = Store::file();
    store.fence().args(["init"]).run().expect(0);
    let mut wrong = Vec::new();
    for (resource, format) in [("r1", "human"), ("r2", "env"), ("r3", "json")] {
        let out = shell(
            &store,
            &format!(
                "\"$FENCE\" --store \"$STORE\" acquire {resource} --format {format} >&-; echo \"rc=$?\" >&2"
            ),
        );
        let held = state(&store, resource)["state"] == "held";
        if out.stderr.contains("rc=0") || held {
            wrong.push(format!(
                "--format {format}: held {held}, {}",
                out.stderr.trim()
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

// ---------------------------------------------------------------------------------------
// 2. PostgreSQL: cancelled statements, and what a role's settings do to the coordinator
// ---------------------------------------------------------------------------------------

/// A login role of its own that may create schemas, and a store on it with a fence schema
/// (created before any setting is put on the role).
fn role_store() -> (Store, String, String) {
    let store = Store::postgres();
    let (role, url) = common::pg_limited_role(20);
    Fence::bare(store.home.path())
        .args(["--store", &url, "--schema", store.schema.as_ref().unwrap()])
        .args(["init"])
        .run()
        .expect(0);
    (store, role, url)
}

fn as_role(store: &Store, url: &str) -> Fence {
    Fence::bare(store.home.path()).args([
        "--store",
        url,
        "--schema",
        store.schema.as_ref().unwrap(),
    ])
}

/// The role's lease row as the superuser reads it: (owner, token, live).
fn role_lease(store: &Store, resource: &str) -> (String, i64, bool) {
    let rows = pg_query(
        &common::pg_superuser(),
        &format!(
            "SELECT owner, token, coalesce(expires_at > clock_timestamp(), false) \
             FROM {}.leases WHERE resource = '{resource}'",
            store.schema.as_ref().unwrap()
        ),
    );
    (rows[0].get(0), rows[0].get(1), rows[0].get(2))
}

/// The role's events of `resource`, oldest first: (kind, owner, token).
fn role_events(store: &Store, resource: &str) -> Vec<(String, Option<String>, Option<i64>)> {
    pg_query(
        &common::pg_superuser(),
        &format!(
            "SELECT kind, owner, token FROM {}.events WHERE resource = '{resource}' ORDER BY id",
            store.schema.as_ref().unwrap()
        ),
    )
    .iter()
    .map(|row| (row.get(0), row.get(1), row.get(2)))
    .collect()
}

fn set_on_role(role: &str, setting: &str) {
    pg_exec(
        &common::pg_superuser(),
        &format!("ALTER ROLE {role} SET {setting}"),
    );
}

fn drop_role(store: &Store, role: &str) {
    let schema = store.schema.as_ref().unwrap();
    let db = env_or_panic("FENCE_TEST_PG_DB");
    pg_exec(
        &common::pg_superuser(),
        &format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE;
             BEGIN;
             SELECT pg_advisory_xact_lock(hashtext('fence-test-database-grants'));
             REVOKE ALL ON DATABASE {db} FROM {role};
             COMMIT;
             DROP ROLE {role};"
        ),
    );
}

/// A session holding `UPDATE … SET ttl_ms = ttl_ms` on `resource`'s lease row in an open
/// transaction: a concurrent change, as another fence's renewal would make, committed when
/// the test says.
struct RowUpdate {
    psql: Child,
}

impl RowUpdate {
    fn hold(url: &str, schema: &str, resource: &str) -> RowUpdate {
        use std::io::Write;
        let name = format!("fence-review5-{}", std::process::id());
        let mut psql = Command::new("psql")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", url])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("PGAPPNAME", &name)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        writeln!(
            psql.stdin.as_mut().unwrap(),
            "BEGIN; UPDATE {schema}.leases SET ttl_ms = ttl_ms WHERE resource = '{resource}';"
        )
        .unwrap();
        let sql = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}' \
             AND state = 'idle in transaction'"
        );
        wait_for("the row update", Duration::from_secs(30), || {
            pg_query(url, &sql)[0].get::<_, i64>(0) == 1
        });
        RowUpdate { psql }
    }

    fn commit(mut self) {
        use std::io::Write;
        let mut stdin = self.psql.stdin.take().unwrap();
        writeln!(stdin, "COMMIT;").unwrap();
        drop(stdin);
        assert!(self.psql.wait().unwrap().success());
    }
}

impl Drop for RowUpdate {
    fn drop(&mut self) {
        if self.psql.stdin.is_some() {
            let _ = self.psql.kill();
            let _ = self.psql.wait();
        }
    }
}

/// Holds: a role whose `statement_timeout` (1 s, well above a busy answer on a loaded
/// machine) cancels every attempt of a renew and a release that wait for a row lock (another
/// session holds the lease row): each is sent three times, then exit 7 (`unavailable`: nothing applied), and the durable lease and its
/// events are exactly as before — not half-released, no refusal recorded. A busy acquire
/// takes no lock and is answered at once. Then, without the timeout, an administrator's
/// `pg_cancel_backend` of a waiting release: it is sent again, applied once (one `released`
/// event), exit 0.
#[test]
fn cancelled_coordinator_statements_apply_once_or_not_at_all() {
    let (store, role, url) = role_store();
    let schema = store.schema.clone().unwrap();
    let lease = as_role(&store, &url).acquire("r", &["--owner", "A", "--ttl", "10m"]);
    let events_before = role_events(&store, "r");
    set_on_role(&role, "statement_timeout = '1s'");
    let gate = common::RowLock::hold(&common::pg_superuser(), &format!("{schema}.leases"));
    let token = lease.token.to_string();
    let renew = as_role(&store, &url)
        .args([
            "renew", "r", "--owner", "A", "--token", &token, "--format", "json",
        ])
        .run();
    let release = as_role(&store, &url)
        .args([
            "release", "r", "--owner", "A", "--token", &token, "--format", "json",
        ])
        .run();
    let busy = as_role(&store, &url)
        .args(["acquire", "r", "--owner", "B", "--format", "json"])
        .run();
    gate.release();
    assert_eq!(renew.code, 7, "{renew:?}");
    assert_eq!(release.code, 7, "{release:?}");
    assert_eq!(busy.code, 3, "{busy:?}");
    let (owner, held_token, live) = role_lease(&store, "r");
    assert_eq!((owner.as_str(), held_token, live), ("A", lease.token, true));
    assert_eq!(role_events(&store, "r"), events_before);

    pg_exec(
        &common::pg_superuser(),
        &format!("ALTER ROLE {role} RESET statement_timeout"),
    );
    let gate = common::RowLock::hold(&common::pg_superuser(), &format!("{schema}.leases"));
    let mut release = as_role(&store, &url)
        .args([
            "release", "r", "--owner", "A", "--token", &token, "--format", "json",
        ])
        .cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let waiting = || -> Option<(i32, String)> {
        pg_query(
            &common::pg_superuser(),
            &format!(
                "SELECT pid, query_start::text FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND usename = '{role}' \
                 AND position('fence: release' in query) > 0"
            ),
        )
        .first()
        .map(|row| (row.get(0), row.get(1)))
    };
    // What was seen waiting is what is cancelled: asked again, the answer may be none (the
    // statement between two attempts, on a loaded machine).
    let mut seen = None;
    wait_for("the release to wait", Duration::from_secs(30), || {
        seen = waiting();
        seen.is_some()
    });
    let (pid, started) = seen.unwrap();
    pg_exec(
        &common::pg_superuser(),
        &format!("SELECT pg_cancel_backend({pid})"),
    );
    // The cancelled attempt was rolled back; the next one, on the same connection, waits
    // for the lock again.
    wait_for(
        "the retried release to wait",
        Duration::from_secs(30),
        || {
            waiting().is_some_and(|(again, at)| again == pid && at != started)
                || release.try_wait().unwrap().is_some()
        },
    );
    gate.release();
    let code = common::wait_exit(&mut release, Duration::from_secs(60));
    let out = release.wait_with_output().unwrap();
    assert_eq!(code, Some(0), "{out:?}");
    let released = role_events(&store, "r")
        .iter()
        .filter(|(kind, _, _)| kind == "released")
        .count();
    assert_eq!(released, 1);
    assert!(!role_lease(&store, "r").2);
    drop_role(&store, &role);
}

/// Holds: a role whose `idle_session_timeout` (300 ms) closes `fence run`'s connection
/// between renewals (every TTL/3 = 2 s), as a DBA's guard against idle sessions would: each
/// renewal finds its connection closed and goes out on a fresh one, within the lease's bound,
/// so the command runs to its end (exit 0) and the lease is released. (A TTL of 1.5 s left a
/// renewal and its reconnection 0.5 s before the SIGTERM: too little on a loaded machine.)
#[test]
fn an_idle_session_timeout_does_not_cost_a_run_its_lease() {
    let (store, role, url) = role_store();
    set_on_role(&role, "idle_session_timeout = '300ms'");
    let out = as_role(&store, &url)
        .args(["run", "r", "--ttl", "6s", "--", "sh", "-c", "sleep 7"])
        .run();
    let renewed = role_events(&store, "r")
        .iter()
        .filter(|(kind, _, _)| kind == "renewed")
        .count();
    let (_, _, live) = role_lease(&store, "r");
    drop_role(&store, &role);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(renewed >= 2, "{renewed} renewals: {out:?}");
    assert!(!live);
}

/// A lease lost mid-run on PostgreSQL: another session holds the lease row's lock (a
/// long-running admin transaction, a stuck vacuum of a partition), so `fence run`'s renewal
/// waits. Holds: the lease cannot be proven in time, so the command is stopped and fence exits
/// 5. But the renewal fence gave up on is left running on the server: once the lock is let
/// go, it commits — the lease of a run that reported it lost, whose command is dead, is
/// renewed for another TTL (a waiter stays blocked that long, and `fence log` shows a renewal
/// after the loss). DESIGN §10: "what fence gives up on, it cancels on the server" — as
/// fenced writes do (a cancel request, or `client_connection_check_interval`).
/// Fixed: a renewal that did not answer in time is cancelled on the server (a cancel
/// request on its connection) before fence tries again on a fresh one.
#[test]
fn a_renewal_fence_run_gave_up_on_does_not_commit_later() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fence = spawn_run(
        &store,
        dir.path(),
        &["--ttl", "2s", "--kill-after", "1s"],
        "echo $$ > child; while :; do sleep 0.05; done",
    );
    wait_for("the command", Duration::from_secs(30), || {
        dir.path().join("child").exists()
    });
    let child = read_pid(&dir.path().join("child"));
    let _reap = Reap(vec![child]);
    let gate = common::RowLock::hold(&store.url, &format!("{schema}.leases"));
    let out = common::wait_output("fence run", fence, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert!(becomes(Duration::from_secs(10), || is_gone(child)));
    let renewals = || {
        store
            .events("r")
            .iter()
            .filter(|(kind, _, _)| kind == "renewed")
            .count()
    };
    let before = renewals();
    gate.release();
    // Whatever was queued behind the lock has run (or was cancelled) once no one waits.
    wait_for("the queued statements", Duration::from_secs(30), || {
        common::lock_waiters(&store.url, &schema, "fence: renew") == 0
    });
    // fence run stops the command before the store's expiry (by the bound's margin): the
    // lease then runs out at the expiry its last renewal gave it, never renewed again.
    wait_for("the lease to run out", Duration::from_secs(5), || {
        !store.lease("r").unwrap().2
    });
    assert_eq!(
        renewals(),
        before,
        "a renewal committed after fence run reported the lease lost: {out:?}"
    );
}

/// A `lock_timeout` set on the role or database (a common guard against lock pile-ups): a
/// renew that waits for the lease row past it is rolled back by the server (SQLSTATE 55P03),
/// so nothing was applied and a retry is safe — exit 7. fence reports it as exit 1
/// (`internal`, "this is unexpected; check the server log"), which scripts treat as a bug, and
/// `fence release` the same, though the cancellation by `statement_timeout` is exit 7.
/// Fixed: a statement rolled back by lock_timeout is sent again, up to 3 times, then exit 7.
#[test]
fn a_lock_timeout_on_the_role_is_unavailable_not_internal() {
    let (store, role, url) = role_store();
    let schema = store.schema.clone().unwrap();
    let lease = as_role(&store, &url).acquire("r", &["--owner", "A", "--ttl", "10m"]);
    set_on_role(&role, "lock_timeout = '200ms'");
    let gate = common::RowLock::hold(&common::pg_superuser(), &format!("{schema}.leases"));
    let token = lease.token.to_string();
    let renew = as_role(&store, &url)
        .args([
            "renew", "r", "--owner", "A", "--token", &token, "--format", "json",
        ])
        .run();
    let release = as_role(&store, &url)
        .args([
            "release", "r", "--owner", "A", "--token", &token, "--format", "json",
        ])
        .run();
    gate.release();
    let (_, _, live) = role_lease(&store, "r");
    drop_role(&store, &role);
    assert!(live, "the lease changed");
    assert_eq!(renew.code, 7, "{renew:?}");
    assert_eq!(release.code, 7, "{release:?}");
}

/// A database or role whose `default_transaction_isolation` is `repeatable read` (or
/// `serializable`, which some teams set everywhere). fence's one-shot statements run in
/// autocommit with the default isolation; a takeover racing another session's change of the
/// same lease row (here an open transaction's update, as a concurrent renewal or grant makes)
/// gets "could not serialize access due to concurrent update" (40001) instead of
/// re-reading the row as READ COMMITTED does. Nothing was applied, the answer should be the
/// grant (retried) — fence exits 1 `internal`.
/// Fixed: a serialization failure (or deadlock) rolled the statement back, so it is sent again, up to 3 times, then exit 7.
#[test]
fn a_repeatable_read_default_does_not_break_acquire() {
    let (store, role, url) = role_store();
    let schema = store.schema.clone().unwrap();
    let first = as_role(&store, &url).acquire("r", &["--owner", "A", "--ttl", "100ms"]);
    wait_for("the lease to expire", Duration::from_secs(30), || {
        !role_lease(&store, "r").2
    });
    set_on_role(&role, "default_transaction_isolation = 'repeatable read'");
    let update = RowUpdate::hold(&common::pg_superuser(), &schema, "r");
    let mut acquire = as_role(&store, &url)
        .args([
            "acquire", "r", "--owner", "B", "--ttl", "1m", "--format", "json",
        ])
        .cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the acquire to wait", Duration::from_secs(30), || {
        common::lock_waiters(&common::pg_superuser(), &schema, "fence: acquire") == 1
            || acquire.try_wait().unwrap().is_some()
    });
    update.commit();
    let code = common::wait_exit(&mut acquire, Duration::from_secs(60));
    let out = acquire.wait_with_output().unwrap();
    let (owner, token, _) = role_lease(&store, "r");
    drop_role(&store, &role);
    assert_eq!(code, Some(0), "{out:?}");
    assert_eq!((owner.as_str(), token), ("B", first.token + 1));
}

// ---------------------------------------------------------------------------------------
// 3. The directory store: wall-clock jumps, and a store from another machine
// ---------------------------------------------------------------------------------------

/// `fence` under a wall clock three hours fast (`faketime`, monotonic clocks honest: an NTP
/// step, a VM restored from a snapshot), acquiring and releasing a resource of the directory
/// store; then an honest process takes it. The store decides by CLOCK_BOOTTIME and its log is
/// appended in order under the resource's lock, and each event records its `boot_ns` — but
/// `fence log` orders the timeline by the wall-clock stamps, so the honest grant of token 2
/// comes "before" token 1 and the log says `token_regressed`: "the store's records were
/// restored from an older copy or changed by hand, and two holders may share a token",
/// `integrity_ok: false`; it also shows the honest holder's live lease as `expired` (a
/// derived expiry, dated in the future, because the fast process's events sort after it). A
/// false alarm that sends an operator after a restore that never happened (and teaches them
/// to ignore the warning). Within one boot, the order of a
/// resource's events is the log's order (and `boot_ns`).
/// Fixed: the directory store orders a resource's events by its log (the order it decided
/// in); each event keeps its own time.
#[test]
fn a_fast_wall_clock_does_not_make_the_log_report_a_regression() {
    let store = Store::file();
    let fast = |args: &[&str]| {
        let out = common::clean_command("faketime", store.home.path())
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .args([
                "-f",
                "+3h",
                env!("CARGO_BIN_EXE_fence"),
                "--store",
                &store.url,
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    fast(&["acquire", "r", "--owner", "fast", "--ttl", "1m"]);
    fast(&["release", "r", "--owner", "fast", "--token", "1"]);
    let honest = acquire(&store, "r", "honest", "1m");
    assert_eq!(honest, 2);
    let log = store
        .fence()
        .args(["log", "--resource", "r", "--format", "json"])
        .run()
        .expect(0)
        .json();
    let tokens: Vec<i64> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "acquired")
        .filter_map(|e| e["token"].as_i64())
        .collect();
    assert_eq!(log["warnings"], serde_json::json!([]), "{log}");
    assert_eq!(log["integrity_ok"], true, "{log}");
    assert_eq!(tokens, [1, 2], "{log}");
}

/// Holds: a directory store copied from another machine (or restored onto a rebooted one)
/// whose record holds a live lease of *that* boot: here the record's boot id is rewritten.
/// The lease counts as expired (it belongs to another boot), a new owner takes it over with
/// a token above every one issued, and the former holder's renew is refused as stale (4).
/// A record whose boot id was edited to this boot's, with a deadline far in the future, is
/// what a hand edit could do; not attempted here.
#[test]
fn a_lease_from_another_machine_s_boot_is_expired_here() {
    let store = Store::file();
    let token = acquire(&store, "r", "A", "10m");
    let path = store.dir().join("leases").join("r.json");
    let mut record: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    record["boot_id"] = Value::String("00000000-1111-2222-3333-444444444444".into());
    std::fs::write(&path, record.to_string()).unwrap();
    let now = state(&store, "r");
    assert_eq!(now["state"], "expired", "{now}");
    let taken = acquire(&store, "r", "B", "1m");
    assert!(taken > token);
    let renew = store
        .fence()
        .args(["renew", "r", "--owner", "A", "--token", &token.to_string()])
        .args(["--format", "json"])
        .run();
    assert_eq!(renew.code, 4, "{renew:?}");
    let kinds: Vec<String> = store.events("r").into_iter().map(|e| e.0).collect();
    assert!(kinds.contains(&"taken_over".to_owned()), "{kinds:?}");
}

/// A hand-edited or damaged event log (a bit flip, a bad restore, an editor's mistake) with
/// a token line at the top of the 64-bit range: the next token is "above the record's, the
/// mark's and the log's" — `i64::MAX + 1`. A debug build panics (exit 101, no JSON object for
/// `--format json`); a release build wraps to `-9223372036854775808`, grants it with exit 0,
/// and writes it to the high-water mark (I1: tokens only go up). The store should refuse the
/// grant (exit 1, naming the damaged file) when no token is left above the highest.
/// Fixed: the grant is refused (exit 1) naming the damaged record; no token wraps.
#[test]
fn a_token_at_the_end_of_the_range_is_not_wrapped() {
    let store = Store::file();
    let token = acquire(&store, "r", "A", "1m");
    store
        .fence()
        .args([
            "release",
            "r",
            "--owner",
            "A",
            "--token",
            &token.to_string(),
        ])
        .run()
        .expect(0);
    let log = store.dir().join("events").join("r.jsonl");
    let mut text = std::fs::read_to_string(&log).unwrap();
    text.push_str(
        "{\"at_ms\":1,\"kind\":\"acquired\",\"owner\":\"X\",\"token\":9223372036854775807}\n",
    );
    std::fs::write(&log, text).unwrap();
    let out = store
        .fence()
        .args(["acquire", "r", "--owner", "B", "--format", "json"])
        .run();
    let high = std::fs::read_to_string(store.dir().join("tokens").join("r.high")).unwrap();
    let high: i64 = high.trim().parse().unwrap();
    assert!(high > 0, "the high-water mark went to {high}: {out:?}");
    assert_eq!(out.code, 1, "{out:?}");
    assert_eq!(out.json()["ok"], false, "{out:?}");
}

/// The refusal's words: an owner released its lease and acquired the resource again under
/// the same `--owner` (a script's retry loop), and a late renew of its *old* token comes in.
/// Exit 4 is right (a newer token exists), but the hint says "another owner has acquired `r`
/// since", which is false: the newer token is the same owner's. An operator chasing "another
/// owner" looks for a second host that does not exist. The message should name the holder of
/// the newer token, or not guess.
/// Fixed: the hint says the resource was granted again (with the newer token) and where to see by whom.
#[test]
fn a_stale_refusal_does_not_blame_another_owner_that_does_not_exist() {
    let store = Store::file();
    let old = acquire(&store, "r", "A", "1m");
    store
        .fence()
        .args(["release", "r", "--owner", "A", "--token", &old.to_string()])
        .run()
        .expect(0);
    let new = acquire(&store, "r", "A", "1m");
    assert!(new > old);
    let out = renew_as(&store, "r", "A", old);
    assert_eq!(out.code, 4, "{out:?}");
    let json = out.json();
    let words = format!("{} {}", json["message"], json["hint"]);
    assert!(!words.contains("another owner"), "{words}");
}

// ---------------------------------------------------------------------------------------
// 4. Renew and release refusals, on every coordinator
// ---------------------------------------------------------------------------------------

fn renew_as(store: &Store, resource: &str, owner: &str, token: i64) -> Out {
    store
        .fence()
        .args([
            "renew",
            resource,
            "--owner",
            owner,
            "--token",
            &token.to_string(),
        ])
        .args(["--format", "json"])
        .run()
}

fn release_as(store: &Store, resource: &str, owner: &str, token: i64) -> Out {
    store
        .fence()
        .args([
            "release",
            resource,
            "--owner",
            owner,
            "--token",
            &token.to_string(),
        ])
        .args(["--format", "json"])
        .run()
}

/// Holds: one table of refusals, the same exit code and reason on every coordinator — wrong
/// owner (6), a token above every one issued (6), no lease at all (6), the owner's own
/// released lease (5 `released`; a second release is success), the same owner name
/// re-acquiring (its old token is stale: 4, for renew and release), an expired lease (renew
/// 5 `expired`, while its release still succeeds), and after a takeover by another owner
/// (4 for the former holder).
fn refusals_are_classified_alike(store: &Store) {
    let mut wrong = Vec::new();
    let mut check = |what: &str, out: Out, code: i32, reason: Option<&str>| {
        let json = out.json();
        if out.code != code || (reason.is_some() && json["reason"].as_str() != reason) {
            wrong.push(format!(
                "{what}: expected {code} {reason:?}, got {}: {json}",
                out.code
            ));
        }
    };
    let t1 = acquire(store, "r", "A", "1m");
    check("renew, wrong owner", renew_as(store, "r", "B", t1), 6, None);
    check(
        "release, wrong owner",
        release_as(store, "r", "B", t1),
        6,
        None,
    );
    check(
        "renew, never issued",
        renew_as(store, "r", "A", t1 + 5),
        6,
        None,
    );
    check("renew, no lease", renew_as(store, "none", "A", t1), 6, None);
    check("release", release_as(store, "r", "A", t1), 0, None);
    check(
        "renew, released",
        renew_as(store, "r", "A", t1),
        5,
        Some("released"),
    );
    check("release again", release_as(store, "r", "A", t1), 0, None);
    let t2 = acquire(store, "r", "A", "1m");
    check(
        "renew, old token, same owner",
        renew_as(store, "r", "A", t1),
        4,
        None,
    );
    check(
        "release, old token, same owner",
        release_as(store, "r", "A", t1),
        4,
        None,
    );
    check("renew, current", renew_as(store, "r", "A", t2), 0, None);
    let e1 = acquire(store, "e", "A", "1s");
    wait_for("the lease to expire", Duration::from_secs(30), || {
        state(store, "e")["state"] == "expired"
    });
    check(
        "renew, expired",
        renew_as(store, "e", "A", e1),
        5,
        Some("expired"),
    );
    let e2 = acquire(store, "e", "B", "1m");
    assert!(e2 > e1);
    check("renew, taken over", renew_as(store, "e", "A", e1), 4, None);
    check(
        "release, taken over",
        release_as(store, "e", "A", e1),
        4,
        None,
    );
    check(
        "renew, the new holder",
        renew_as(store, "e", "B", e2),
        0,
        None,
    );
    assert!(wrong.is_empty(), "{wrong:#?}");
}

per_coordinator!(refusals_are_classified_alike);

// ---------------------------------------------------------------------------------------
// 5. Known weak spots: missing target schemas, `fence bench`'s scratch namespace
// ---------------------------------------------------------------------------------------

/// `fence inspect R --target postgres://…` with a `--schema` that does not exist in the
/// target database (a typo, or the job's FENCE_SCHEMA forgotten): the question is read-only,
/// so it must create nothing (it does not), and it must not answer as if the target had
/// simply accepted no write — after a takeover an operator checks exactly this to see whether
/// the old holder's write landed, and "nothing accepted" is then a wrong answer. Exit 2
/// naming the schema, as `inspect --id` does.
/// Fixed: exit 2 naming the schema (`--schema`), as `inspect --id` and `log --target` do.
#[test]
fn inspect_target_in_a_missing_schema_fails_and_creates_nothing() {
    let store = Store::file();
    acquire(&store, "r", "A", "1m");
    let url = env_or_panic("FENCE_TEST_PG_URL");
    let missing = format!("r5_missing_{}", std::process::id());
    let out = store
        .fence()
        .args(["inspect", "r", "--target", &url, "--schema", &missing])
        .args(["--format", "json"])
        .run();
    let created: i64 = pg_query(
        &url,
        &format!("SELECT count(*) FROM pg_namespace WHERE nspname = '{missing}'"),
    )[0]
    .get(0);
    pg_exec(&url, &format!("DROP SCHEMA IF EXISTS {missing} CASCADE"));
    assert_eq!(created, 0, "a read-only inspect created a schema: {out:?}");
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stdout.contains(&missing), "{out:?}");
}

/// `fence log --follow --target postgres://…` with a target schema that does not exist: like
/// a missing store schema, it must fail at once (exit 2), not follow nothing forever. It
/// runs on, printing nothing, its failing query repeated five times a second (each one an
/// ERROR in the server's log) until it is killed.
/// Fixed: a target that answers is checked once at the start; a missing schema is exit 2.
#[test]
fn log_follow_of_a_missing_target_schema_fails_closed() {
    let store = Store::file();
    acquire(&store, "r", "A", "1m");
    let url = env_or_panic("FENCE_TEST_PG_URL");
    let missing = format!("r5_missing_follow_{}", std::process::id());
    let mut follow = store
        .fence()
        .args(["log", "--follow", "--target", &url, "--schema", &missing])
        .args(["--format", "ndjson"])
        .cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let code = common::wait_exit(&mut follow, Duration::from_secs(30));
    let out = follow.wait_with_output().unwrap();
    let created: i64 = pg_query(
        &url,
        &format!("SELECT count(*) FROM pg_namespace WHERE nspname = '{missing}'"),
    )[0]
    .get(0);
    pg_exec(&url, &format!("DROP SCHEMA IF EXISTS {missing} CASCADE"));
    assert_eq!(created, 0, "{out:?}");
    assert_eq!(code, Some(2), "{out:?}");
}

/// `fence bench` names its scratch namespace after its pid alone (`fence_bench_<pid>`) on a
/// shared PostgreSQL server. Two benches whose fence has the same pid — every container
/// started the same way runs it as pid 1, and so does this test, in two PID namespaces —
/// share one schema: their numbers mix, and the first to finish drops the schema under the
/// other (`DROP SCHEMA … CASCADE`); a bench killed with SIGKILL leaves its schema for the
/// next one with its pid to adopt. The scratch name needs a random part.
/// Fixed: the scratch name has a random part (`fence_bench_<pid>_<hex>`).
#[test]
fn two_benches_with_the_same_pid_do_not_share_a_scratch_schema() {
    let store = Store::postgres();
    let home = store.home.path();
    let bench = |duration: &str| {
        let mut cmd = common::clean_command("unshare", home);
        cmd.args([
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "--kill-child",
        ])
        .arg(env!("CARGO_BIN_EXE_fence"))
        .args(["--store", &store.url, "bench", "--workers", "1"])
        .args(["--duration", duration, "--format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        cmd
    };
    // The scratch schemas (oid, name) there are; one dropped and made again gets a new oid.
    let scratch = || -> Vec<(u32, String)> {
        pg_query(
            &store.url,
            "SELECT oid, nspname::text FROM pg_namespace WHERE nspname LIKE 'fence\\_bench\\_%'",
        )
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
    };
    let before = scratch();
    let mut long = bench("2m").spawn().unwrap();
    let mut first = Vec::new();
    wait_for(
        "the first bench's scratch schema",
        Duration::from_secs(60),
        || {
            first = scratch()
                .into_iter()
                .filter(|s| !before.contains(s))
                .collect();
            !first.is_empty() || long.try_wait().unwrap().is_some()
        },
    );
    let short = bench("1s").output().unwrap();
    let first_running = long.try_wait().unwrap().is_none();
    let after = scratch();
    // SIGKILL (unshare passes it on): what a killed bench leaves is removed here.
    let _ = long.kill();
    let long = long.wait_with_output().unwrap();
    for (_, name) in scratch().iter().filter(|s| !before.contains(s)) {
        pg_exec(&store.url, &format!("DROP SCHEMA IF EXISTS {name} CASCADE"));
    }
    assert!(short.status.success(), "{short:?}");
    assert!(first_running, "the first bench ended early: {long:?}");
    let gone: Vec<_> = first.iter().filter(|s| !after.contains(s)).collect();
    assert!(
        gone.is_empty(),
        "the second bench dropped the scratch schema {gone:?} of the first one while it ran (now {after:?})"
    );
}

/// An S3 object whose user metadata another client wrote with raw non-ASCII bytes
/// (`x-amz-meta-author: José` sent as it is, which S3 servers store and return): fence's
/// S3 client refuses the whole response ("Metadata value … contained non UTF-8
/// characters"), so `fence write --from` and `inspect --target` of that object fail after
/// ten seconds of retries with exit 7 `unavailable` and a hint to check "the endpoint, the
/// network and the credentials, then retry" — forever: no retry can succeed, and the cause
/// named is wrong. fence reads only its own `fence-*` keys; a foreign header should be
/// ignored (the write goes through), or at least be a definite error that names it.
fn foreign_non_ascii_metadata(store: &Store) {
    let (server, prefix) = store.server();
    let key = format!("{prefix}/objects/report");
    server.put_with_metadata(&key, b"raw", &[("author", "José")]);
    let target = server.url(&key);
    let token = acquire(store, "res", "A", "1m");
    let file = store.home.path().join("body");
    std::fs::write(&file, b"fenced").unwrap();
    let write = store
        .fence()
        .args([
            "write",
            "res",
            "--token",
            &token.to_string(),
            "--owner",
            "A",
        ])
        .args(["--target", &target, "--format", "json"])
        .args([std::ffi::OsStr::new("--from"), file.as_os_str()])
        .run();
    let inspect = store
        .fence()
        .args(["inspect", "res", "--target", &target, "--format", "json"])
        .run();
    let mut wrong = Vec::new();
    for (what, out) in [("write", &write), ("inspect --target", &inspect)] {
        let message = out.json()["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if out.code == 7 || (out.code != 0 && !message.contains("author")) {
            wrong.push(format!("{what}: exit {}: {message}", out.code));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    if write.code == 0 {
        assert_eq!(server.get(&key).unwrap().body, b"fenced");
    }
}

/// Fixed: an answer the client cannot read is a definite error (exit 1) naming the header,
/// not retried as if the network had failed.
#[test]
fn foreign_non_ascii_metadata_s3() {
    foreign_non_ascii_metadata(&Store::new(common::Backend::S3));
}

/// Fixed: an answer the client cannot read is a definite error (exit 1) naming the header,
/// not retried as if the network had failed.
#[test]
fn foreign_non_ascii_metadata_localstack() {
    foreign_non_ascii_metadata(&Store::new(common::Backend::LocalStack));
}
