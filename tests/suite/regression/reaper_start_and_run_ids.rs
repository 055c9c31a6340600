//! A seventh adversarial review, of three changes: `fence run` starts its reaper before it
//! asks for the lease and sends it the lease's first bound and the command's environment in
//! one start message; the directory store no longer fsyncs a lease record on a grant (only the
//! high-water mark); and a run id completed by one command is refused (exit 6, `id_reused`)
//! for another. Each test asserts on durable state read without fence where it can (files the
//! command writes, the store's own files and rows, /proc); a test marked `FINDING` and ignored
//! shows an open defect and fails until it is fixed (`--run-ignored only` runs them); the
//! others are attacks that hold ("Holds:").
//!
//! Fixed after the review (their tests run): the reaper started the command after its first
//! bound had passed (`the_command_never_starts_once_its_first_bound_has_passed`,
//! `a_reaper_continued_after_its_first_bound_starts_nothing`: it now checks the bound before
//! starting anything); a stop signal between a `--wait` run's grant and its start was
//! swallowed (`a_stop_signal_between_the_grant_and_the_start_…`: `fence run` handles signals
//! from its start); a reaper killed while waiting was a usage error about the command's path
//! (now internal, naming the supervisor); an out-of-range `--kill-after` (now refused when
//! parsed, at most 7 days); an old completion record whose owner contains `#cmd:` was refused
//! instead of skipped (a digest is 16 hex digits). The directory-store change was reverted
//! (a grant fsyncs its record again), which makes the power-loss findings below less likely,
//! not impossible: renewals and releases rewrite the record without fsync, as before.
//!
//! Fixed later the same night: a command refused by the process limit after the grant was
//! exit 2 with a hint about its path (now exit 7, naming the limit: the reaper reports the
//! error number); an empty lease record's "damaged" error did not name a power loss as a
//! cause (it does; the record still has to be moved aside, as the hint says).
//!
//! `renew` and `release` of a lease whose record is missing said "no lease has ever been
//! granted" (they now say the record is missing though the token was issued).
//!
//! Still open (ignored tests): an empty completion record re-runs the work on every run; a
//! missing record is "moved aside or deleted" to `inspect` (not a power loss, which the
//! reverted change made likely); `fence run` whose record goes missing ends "unreachable".

use crate::common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use common::process::{becomes, kill, processes_with};
use common::proxy::{Mode, Proxy};
use common::{pg_exec, pg_upstream, pg_url_via, wait_for, wait_output, Store};

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// The reapers (titled `fence __reaper …`: not a child of fence before it took its title,
/// whose command line is still fence's) whose command line holds `marker`, but for `fence`.
fn reapers_with(marker: &str, fence: u32) -> Vec<u32> {
    processes_with(marker)
        .into_iter()
        .filter(|pid| {
            *pid != fence
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.starts_with(b"fence __reaper "))
        })
        .collect()
}

/// Fails the test if any process whose command line holds `marker` is still running after a
/// generous while (a bound for a hang: they are expected to be gone at once).
#[track_caller]
fn nothing_left(marker: &str, what: &str) {
    assert!(
        becomes(Duration::from_secs(20), || processes_with(marker)
            .is_empty()),
        "{what} left {:?} running",
        processes_with(marker)
    );
}

/// `fence run RESOURCE [extra] -- sh -c SCRIPT` in `dir`, started in the background.
fn spawn_run(store: &Store, resource: &str, dir: &Path, extra: &[&str], script: &str) -> Child {
    let mut fence = store.fence().args(["run", resource]).args(extra);
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

/// Starts `fence` in `dir` from a shell that ignores SIGTERM (`trap '' TERM`): an ignored
/// signal stays ignored across exec, so fence's command ignores the reaper's SIGTERM from its
/// very first instruction, as a command that traps it does once its trap is set (without this,
/// whether a command killed at once did its first step is a race).
fn spawn_ignoring_term(fence: common::Fence, dir: &Path) -> Child {
    let mut sh = common::clean_command("sh", dir);
    for (key, value) in fence.cmd.get_envs() {
        if let Some(value) = value {
            sh.env(key, value);
        }
    }
    sh.current_dir(dir)
        .args(["-c", "trap '' TERM; exec \"$@\"", "sh"])
        .arg(fence.cmd.get_program())
        .args(fence.cmd.get_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `fence run r --id ID [--format json] -- ARGS…` in `dir`, to its end.
fn run_with_id(store: &Store, dir: &Path, id: &str, command: &[&OsStr]) -> common::Out {
    let mut fence = store
        .fence()
        .args(["run", "r", "--id", id, "--format", "json", "--"])
        .args(command);
    fence.cmd.current_dir(dir);
    fence.run()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn schema(store: &Store) -> &str {
    store.schema.as_deref().unwrap()
}

// ---------------------------------------------------------------------------------------
// 1. The reaper started before the lease
// ---------------------------------------------------------------------------------------

/// FINDING: the command starts after its lease's first bound has passed, while another owner
/// holds the lease.
///
/// `fence run r --id late --ttl 1s` is granted `r`, then asks the store whether run `late`
/// completed (one more round trip, under the lease, before the start message). That answer is
/// held up (here by a proxy that holds the query naming `r#done:late`; in life a slow network,
/// a busy server, or fence paused by SIGSTOP or a frozen cgroup) until the lease has expired
/// by the store's clock and another owner has been granted `r`. Then fence gets its answer
/// (not completed) and sends the reaper the start message with the first bound, which is
/// already in the past (`Bounds::instant` saturates to "now"), and the reaper starts the
/// command without looking at the bound (`reaper::main` checks it only in its loop, after
/// `spawn`): the command runs, with the old token in FENCE_TOKEN, while `other` holds `r`.
/// It gets SIGTERM at the reaper's first look, but a command that does its work at once, or
/// traps SIGTERM, works without the lease (up to `--kill-after` more). Neither fence (before
/// `go`) nor the reaper (before `spawn`) checks that the bound is still ahead.
#[test]
fn the_command_never_starts_once_its_first_bound_has_passed() {
    let store = Store::postgres();
    store.fence().args(["init", "-q"]).run().expect(0);
    let gate = Proxy::start(
        pg_upstream(),
        Mode::HoldWhenClientSends(b"#done:late".to_vec()),
    );
    let dir = tempfile::tempdir().unwrap();
    let fence = store
        .fence_at(&pg_url_via(gate.addr()))
        .args([
            "run",
            "r",
            "--id",
            "late",
            "--ttl",
            "1s",
            "--kill-after",
            "1s",
        ])
        .args(["--", "sh", "-c", "echo \"$FENCE_TOKEN\" >> ran"]);
    let child = spawn_ignoring_term(fence, dir.path());
    wait_for(
        "the run's check of its id at the gate",
        Duration::from_secs(30),
        || gate.held() == 1,
    );
    let (first_owner, first_token, _) = store.lease("r").expect("the run was granted r");
    wait_for("the run's lease to expire", Duration::from_secs(30), || {
        store.lease("r").is_some_and(|(_, _, live)| !live)
    });
    let other = store
        .fence()
        .acquire("r", &["--ttl", "5m", "--owner", "other"]);
    gate.open();
    let out = wait_output("fence run", child, Duration::from_secs(60));
    let ran = lines(&dir.path().join("ran"));
    assert!(
        ran.is_empty(),
        "the command ran with token {ran:?} (the run's: {first_token}, owner {first_owner}) while `other` held r with token {}: {out:?}",
        other.token
    );
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        store.lease("r").map(|l| (l.0, l.2)),
        Some(("other".to_owned(), true))
    );
}

/// FINDING (same root as the one above, on the directory store, without a slow store): the
/// reaper is paused (SIGSTOP: a stray-looking `fence __reaper` stopped by hand, a debugger, or
/// the command itself) while `fence run --wait` waits. Granted, fence writes the start message
/// and then waits for the reaper's answer with a blocking read on its only thread, so it renews
/// nothing; the lease expires and another owner takes it. When the reaper is continued, it
/// starts the command although the bound it was sent has long passed, while `other` holds the
/// lease. Fixed: fence waits for the answer without blocking, continues the reaper meanwhile,
/// and gives up on it before the bound (killing whatever it started); the reaper never starts
/// the command past the bound. Here the reaper is stopped again and again, as a hostile
/// process would: the command either ran before `other`'s grant, or not at all.
#[test]
fn a_reaper_continued_after_its_first_bound_starts_nothing() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let holder = store
        .fence()
        .acquire("r", &["--ttl", "5m", "--owner", "holder"]);
    let ran = dir.path().join("ran");
    let marker = ran.to_str().unwrap().to_owned();
    let fence = store
        .fence()
        .args([
            "run",
            "r",
            "--wait",
            "5m",
            "--ttl",
            "1s",
            "--kill-after",
            "1s",
        ])
        .args(["--owner", "run", "--", "sh", "-c"])
        .args([format!("echo \"$FENCE_TOKEN $(date +%s%N)\" >> '{marker}'")]);
    let waiting = spawn_ignoring_term(fence, dir.path());
    let fence_pid = waiting.id();
    let reaper = || reapers_with(&marker, fence_pid);
    wait_for("the waiting run's reaper", Duration::from_secs(30), || {
        reaper().len() == 1
    });
    let reaper_pid = reaper()[0];
    let stopping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let stopper = {
        let stopping = stopping.clone();
        std::thread::spawn(move || {
            while stopping.load(std::sync::atomic::Ordering::SeqCst) {
                kill(reaper_pid, libc::SIGSTOP);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let _continue = Continue(reaper_pid);
    store.fence().release(&holder);
    wait_for(
        "the run's grant, then its end",
        Duration::from_secs(60),
        || {
            store
                .lease("r")
                .is_some_and(|(owner, _, live)| owner.starts_with("run/") && !live)
        },
    );
    let before_other = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let other = store
        .fence()
        .acquire("r", &["--ttl", "5m", "--owner", "other"]);
    stopping.store(false, std::sync::atomic::Ordering::SeqCst);
    stopper.join().unwrap();
    kill(reaper_pid, libc::SIGCONT);
    let out = wait_output("fence run", waiting, Duration::from_secs(60));
    let late: Vec<String> = lines(&ran)
        .into_iter()
        .filter(|line| {
            let at: u128 = line.split(' ').nth(1).unwrap().parse().unwrap();
            at >= before_other
        })
        .collect();
    assert!(
        late.is_empty(),
        "the command ran ({late:?}) after `other` was granted r with token {}: {out:?}",
        other.token
    );
    assert!(matches!(out.status.code(), Some(0 | 5)), "{out:?}");
}

/// SIGCONT to a process the test stopped, whatever the test's outcome.
struct Continue(u32);

impl Drop for Continue {
    fn drop(&mut self) {
        kill(self.0, libc::SIGCONT);
    }
}

/// FINDING: a stop signal that reaches `fence run --wait` between its grant and the command's
/// start is swallowed, and the command runs to its end as if nothing had been asked.
///
/// `--wait` installs fence's handlers for SIGINT, SIGTERM and SIGHUP while it waits (so a
/// signal ends the wait cleanly); the handlers stay in place (tokio never restores the default
/// action), but the listener is dropped when the wait ends, and `fence run` installs its own
/// only just before the start message. A signal in between — while the granting attempt's
/// answer is on its way, or, as here, while `--id` asks the store whether the run completed —
/// is caught by nobody: fence neither dies (the default action) nor passes it on. The command
/// starts and runs to its end, exit 0, and the run id is recorded as completed: `systemctl
/// stop`, a Ctrl-C, or the TERM of a deploy that wanted the job not to start is ignored, and
/// systemd waits for its stop timeout. The window is one round trip to the store on every
/// run that waited.
#[test]
fn a_stop_signal_between_the_grant_and_the_start_is_not_swallowed() {
    let store = Store::postgres();
    store.fence().args(["init", "-q"]).run().expect(0);
    let holder = store
        .fence()
        .acquire("r", &["--ttl", "5m", "--owner", "holder"]);
    let gate = Proxy::start(
        pg_upstream(),
        Mode::HoldWhenClientSends(b"#done:stop".to_vec()),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut fence = store
        .fence_at(&pg_url_via(gate.addr()))
        .args(["run", "r", "--id", "stop", "--wait", "5m", "--ttl", "1m"])
        .args(["--", "sh", "-c", "echo ran >> ran"]);
    let child = fence
        .cmd
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The run was refused once (busy): it waits, with its stop handlers in place.
    wait_for("the run to wait", Duration::from_secs(30), || {
        let json = store
            .fence()
            .args(["inspect", "r", "--format", "json"])
            .run()
            .json();
        json["resources"][0]["waiters"]
            .as_array()
            .is_some_and(|w| !w.is_empty())
    });
    store.fence().release(&holder);
    wait_for(
        "the granted run's check of its id at the gate",
        Duration::from_secs(30),
        || gate.held() == 1,
    );
    kill(child.id(), libc::SIGTERM);
    gate.open();
    let out = wait_output("fence run", child, Duration::from_secs(60));
    let ran = lines(&dir.path().join("ran"));
    assert!(
        ran.is_empty() && out.status.code() != Some(0),
        "SIGTERM before the start was ignored: the command ran ({ran:?}): {out:?}"
    );
}

/// Holds: fence paused (SIGSTOP) while it waits for a busy lease, then killed (SIGKILL), or
/// stopped with SIGTERM or SIGINT while it waits: fence and its idle reaper are gone, and the
/// command never runs, not even once the lease is free.
fn a_waiting_run_paused_killed_or_interrupted_leaves_nothing(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let holder = store
        .fence()
        .acquire("r", &["--ttl", "5m", "--owner", "holder"]);
    let ran = dir.path().join("ran");
    let marker = ran.to_str().unwrap().to_owned();
    let script = format!("touch '{marker}'");
    for (signal, paused) in [
        (libc::SIGKILL, true),
        (libc::SIGTERM, false),
        (libc::SIGINT, false),
        (libc::SIGHUP, false),
    ] {
        let waiting = spawn_run(store, "r", dir.path(), &["--wait", "5m"], &script);
        // fence and its reaper, idle until a grant.
        wait_for("the waiting run's reaper", Duration::from_secs(30), || {
            processes_with(&marker).len() >= 2
        });
        if paused {
            kill(waiting.id(), libc::SIGSTOP);
        }
        kill(waiting.id(), signal);
        // Bounded, and with fence's output on failure (once seen to hang a loaded CI run
        // past the test's 120 s limit, unexplained).
        let status = wait_output(
            &format!("the waiting run sent signal {signal}"),
            waiting,
            Duration::from_secs(60),
        )
        .status;
        assert_ne!(status.code(), Some(0), "signal {signal}: {status:?}");
        nothing_left(
            &marker,
            &format!("a waiting run stopped by signal {signal}"),
        );
    }
    store.fence().release(&holder);
    // The lease is free: nothing of those runs may take it now.
    let next = store.fence().acquire("r", &["--owner", "next"]);
    assert_eq!(next.token, holder.token + 1);
    assert!(!ran.exists(), "the command ran without the lease");
}

/// FINDING (exit code and hint): the reaper, idle while `fence run --wait` waits for a busy
/// lease (minutes or hours now, where it used to live only once the lease was granted), is
/// killed (the OOM killer, an admin's `kill`/`pkill` of a stray-looking `fence __reaper`).
/// fence does not notice until it has been granted the lease; then its start message finds no
/// reader and it fails with exit 2 (`usage`: "bad arguments or configuration; nothing was
/// attempted") and the hint "check the command's path and permissions; the lease was
/// released", though the arguments and the command are fine and a lease was taken (a token
/// used up, other waiters held back meanwhile). What holds: the command never runs, nothing is
/// left running, the lease is released. What should change: exit 7 or 1 (a local failure,
/// safe to retry) with a hint that names the supervisor's death, and preferably noticed while
/// waiting (the report pipe reads end-of-file) so that no lease is taken for nothing.
#[test]
fn a_reaper_killed_while_waiting_is_not_reported_as_a_usage_error() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let holder = store
        .fence()
        .acquire("r", &["--ttl", "5m", "--owner", "holder"]);
    let ran = dir.path().join("ran");
    let marker = ran.to_str().unwrap().to_owned();
    let waiting = spawn_run(
        &store,
        "r",
        dir.path(),
        &["--wait", "5m"],
        &format!("touch '{marker}'"),
    );
    let fence_pid = waiting.id();
    let reaper = || reapers_with(&marker, fence_pid);
    wait_for("the waiting run's reaper", Duration::from_secs(30), || {
        reaper().len() == 1
    });
    kill(reaper()[0], libc::SIGKILL);
    wait_for("the reaper to die", Duration::from_secs(30), || {
        reaper().is_empty()
    });
    store.fence().release(&holder);
    let out = wait_output("fence run", waiting, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!ran.exists(), "the command ran: {out:?}");
    nothing_left(&marker, "a run whose reaper was killed");
    assert_eq!(store.lease("r").map(|l| l.2), Some(false), "{out:?}");
    assert!(
        out.status.code() != Some(2) && !stderr.contains("check the command's path"),
        "a killed supervisor reported as a usage error about the command: {out:?}"
    );
}

/// Holds: the caller's descriptor 3 (`3>>log`) reaches the command at its number, and the
/// command gets no descriptor the same command started without fence would not get (none of
/// fence's pipes to its reaper, its lock files or store connections).
fn the_command_gets_the_callers_descriptors_and_no_others(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let list = "echo via-3 >&3; for f in /proc/$$/fd/*; do echo \"${f##*/}\"; done > fds";
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    // The baseline: the same command, started by a shell with the same descriptor 3.
    let baseline = common::clean_command("sh", dir.path())
        .current_dir(dir.path())
        .args(["-c", &format!("exec sh -c {} 3>>log", quote(list))])
        .status()
        .unwrap();
    assert!(baseline.success());
    let expected = lines(&dir.path().join("fds"));
    assert!(expected.contains(&"3".to_owned()), "{expected:?}");
    let mut fence = store.fence();
    let program = fence.cmd.get_program().to_owned();
    let args: Vec<String> = fence
        .cmd
        .get_args()
        .map(|a| quote(a.to_str().unwrap()))
        .collect();
    let line = format!(
        "exec {} {} run r -- sh -c {} 3>>log",
        quote(program.to_str().unwrap()),
        args.join(" "),
        quote(list)
    );
    fence.cmd = {
        let mut sh = common::clean_command("sh", dir.path());
        for (key, value) in fence.cmd.get_envs() {
            if let Some(value) = value {
                sh.env(key, value);
            }
        }
        sh.current_dir(dir.path()).args(["-c", &line]);
        sh
    };
    fence.run().expect(0);
    assert_eq!(lines(&dir.path().join("fds")), expected);
    assert_eq!(lines(&dir.path().join("log")), ["via-3", "via-3"]);
}

/// FINDING: a `--kill-after` too long for the reaper's argument (more than i64::MAX ms, e.g.
/// `300000000000y`, which `humantime` accepts) is found out only after the lease was taken.
///
/// `fence run` passes `--kill-after` to `fence __reaper` in milliseconds; the reaper reads it
/// as an i64, fails, and exits with "error: `fence __reaper` is started by `fence run`, not by
/// hand", a message about something the user did not do. fence, which started the reaper
/// before asking for the lease, takes the lease (a token used up, a grant and a release in
/// the history), then says "cannot start `echo`: fence's supervisor of the command ended
/// before starting it" with the hint "check the command's path and permissions", exit 2:
/// exit 2 promises "bad arguments or configuration; nothing was attempted", but a lease was
/// granted. The option's value should be refused (or capped) when it is parsed.
#[test]
fn an_out_of_range_kill_after_is_refused_before_the_lease() {
    let store = Store::file();
    let out = store
        .fence()
        .args(["run", "r", "--kill-after", "300000000000y", "--", "true"])
        .run();
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stderr.contains("--kill-after") && !out.stderr.contains("not by hand"),
        "the message does not name the option: {out:?}"
    );
    assert_eq!(store.lease("r"), None, "a lease was taken: {out:?}");
}

/// Holds: fence stopped while its acquire is on its way to PostgreSQL (held at a proxy), by
/// SIGTERM, SIGINT or SIGKILL: fence dies, its idle reaper with it, and the command never
/// runs, even though the server grants the lease once the acquire arrives (a lease of a dead
/// owner, held until its TTL, which fence cannot avoid).
#[test]
fn a_run_stopped_while_its_acquire_is_in_flight_starts_nothing() {
    let store = Store::postgres();
    store.fence().args(["init", "-q"]).run().expect(0);
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let marker = ran.to_str().unwrap().to_owned();
    for (signal, resource) in [
        (libc::SIGTERM, "term"),
        (libc::SIGINT, "int"),
        (libc::SIGKILL, "kill"),
    ] {
        let gate = Proxy::start(
            pg_upstream(),
            Mode::HoldWhenClientSends(b"'acquired'".to_vec()),
        );
        let mut fence = store
            .fence_at(&pg_url_via(gate.addr()))
            .args(["run", resource, "--ttl", "2s", "--", "touch", &marker]);
        let mut child = fence
            .cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for("the acquire at the gate", Duration::from_secs(30), || {
            gate.held() == 1
        });
        kill(child.id(), signal);
        let status = child.wait().unwrap();
        assert_ne!(status.code(), Some(0), "signal {signal}: {status:?}");
        nothing_left(
            &marker,
            &format!("a run stopped by signal {signal} while acquiring"),
        );
        gate.open();
        // The acquire reaches the server once the gate opens, or never (fence is gone): either
        // way the lease is free again within its TTL, and nothing ran.
        wait_for(
            "the dead run's lease to be free",
            Duration::from_secs(30),
            || store.lease(resource).is_none_or(|(_, _, live)| !live),
        );
        assert!(!ran.exists(), "signal {signal}: the command ran");
    }
}

/// FINDING (exit code and hint): at the process limit (`ulimit -u`, RLIMIT_NPROC), the reaper
/// starts (before the lease) but the command cannot (EAGAIN). fence has taken the lease by
/// then, releases it, and says "cannot start `sh`: Resource temporarily unavailable (os error
/// 11)" with the hint "check the command's path and permissions; the lease was released", exit
/// 2 (`usage`: "nothing was attempted"). The path is fine; the cause is a limit that passes
/// (EAGAIN), so this is a failure to retry (exit 7, "nothing was applied"), and the hint should
/// name the process limit, as the reaper's own EAGAIN does ("check the system's process and
/// file limits"). Run as root only (it runs fence as `nobody`, whose limit the kernel enforces).
#[test]
fn a_command_refused_by_the_process_limit_is_not_a_usage_error() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test runs as root");
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let fence = dir.path().join("fence");
    std::fs::copy(env!("CARGO_BIN_EXE_fence"), &fence).unwrap();
    std::fs::set_permissions(&fence, std::fs::Permissions::from_mode(0o755)).unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let ran = dir.path().join("ran");
    let out = common::clean_command("setpriv", dir.path())
        .current_dir(dir.path())
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["prlimit", "--nproc=2", "--"])
        .arg(&fence)
        .args(["--store", &url, "run", "r", "--", "touch"])
        .arg(&ran)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!ran.exists(), "{out:?}");
    let state = common::Fence::bare(dir.path())
        .args(["--store", &url, "inspect", "r", "--format", "json"])
        .run()
        .json();
    assert_ne!(state["resources"][0]["state"], "held", "{state}");
    assert!(
        stderr.contains("Resource temporarily unavailable"),
        "the limit did not bite as expected: {out:?}"
    );
    assert!(
        out.status.code() != Some(2) && !stderr.contains("check the command's path"),
        "a process limit reported as a usage error about the command's path: {stderr}"
    );
}

/// Holds: a caller that closed fence's standard descriptors (`<&- >&- 2>&-`, as some daemons
/// and cron setups do): the pipes to the reaper never land on 0, 1 or 2 (which the reaper
/// refuses), the command runs with descriptors 0–2 open, and the lease is released.
#[test]
fn a_run_with_its_standard_descriptors_closed_still_runs() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    for closed in ["<&-", ">&-", "2>&-", "<&- >&- 2>&-"] {
        let _ = std::fs::remove_file(dir.path().join("fds"));
        let line = format!(
            "exec '{}' --store '{}' run r -- sh -c 'for f in 0 1 2; do [ -e /proc/$$/fd/$f ] && echo $f; done > fds' {closed}",
            env!("CARGO_BIN_EXE_fence"),
            store.url
        );
        let status = common::clean_command("sh", dir.path())
            .current_dir(dir.path())
            .args(["-c", &line])
            .status()
            .unwrap();
        assert!(status.success(), "{closed}: {status:?}");
        assert_eq!(lines(&dir.path().join("fds")), ["0", "1", "2"], "{closed}");
        assert_eq!(store.lease("r").map(|l| l.2), Some(false), "{closed}");
    }
}

/// Holds: a store that fails after the reaper started (a store directory that is a file; a
/// PostgreSQL server that refuses connections) starts nothing and leaves no reaper.
#[test]
fn a_store_error_after_the_reaper_started_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let marker = ran.to_str().unwrap().to_owned();
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, "").unwrap();
    let refused = "postgres://fence:x@127.0.0.1:1/fence?sslmode=disable&connect_timeout=5";
    for url in [
        format!("file://{}/store", blocker.display()),
        refused.to_owned(),
    ] {
        let out = common::Fence::bare(dir.path())
            .args(["--store", &url, "run", "r", "--", "touch", &marker])
            .run();
        assert!(out.code != 0 && !out.stderr.is_empty(), "{url}: {out:?}");
        nothing_left(&marker, &format!("a run on `{url}`"));
        assert!(!ran.exists(), "{url}: the command ran without a lease");
    }
}

/// Holds: the command sees fence's variables, not the caller's (`FENCE_TOKEN`, `FENCE_OWNER`,
/// `FENCE_RESOURCE`, `FENCE_RUN_PARENT_ID` set before), with `FENCE_STORE` byte for byte for a
/// store path holding `=`, spaces, a newline and non-ASCII; the caller's other variables
/// (values with `=`, newlines, non-UTF-8 bytes) pass through unchanged; `--format json` keeps
/// stdout to fence's one object.
#[test]
fn the_command_gets_fences_environment_whatever_the_caller_set() {
    let home = tempfile::tempdir().unwrap();
    let odd = home.path().join("a=b c\nd-é✓");
    let url = format!("file://{}", odd.display());
    let weird = OsStr::from_bytes(b"x=y\nFENCE_TOKEN=666\n\xff\xfe");
    let out = common::Fence::bare(home.path())
        .env("FENCE_TOKEN", "999")
        .env("FENCE_OWNER", "someone-else")
        .env("FENCE_RESOURCE", "elsewhere")
        .env("FENCE_RUN_PARENT_ID", "parent-of-nothing")
        .env("WEIRD", weird)
        .args([
            "--store", &url, "run", "r", "--owner", "me", "--format", "json",
        ])
        .args(["--", "sh", "-c", "env -0 > env; echo to-stdout"])
        .current_dir_run(home.path());
    let out = out.expect(0);
    // The command's stdout went to fence's stderr: stdout is fence's object alone.
    assert!(out.stderr.contains("to-stdout"), "{out:?}");
    let json = out.json();
    let env = std::fs::read(home.path().join("env")).unwrap();
    let vars: Vec<&[u8]> = env.split(|b| *b == 0).filter(|e| !e.is_empty()).collect();
    let get = |key: &str| -> Vec<Vec<u8>> {
        let prefix = format!("{key}=");
        vars.iter()
            .filter(|v| v.starts_with(prefix.as_bytes()))
            .map(|v| v[prefix.len()..].to_vec())
            .collect()
    };
    assert_eq!(get("FENCE_TOKEN"), [json["token"].to_string().into_bytes()]);
    assert_eq!(
        get("FENCE_OWNER"),
        [json["owner"].as_str().unwrap().as_bytes().to_vec()]
    );
    assert!(json["owner"].as_str().unwrap().starts_with("me/"), "{json}");
    assert_eq!(get("FENCE_RESOURCE"), [b"r".to_vec()]);
    assert_eq!(get("FENCE_STORE"), [url.as_bytes().to_vec()]);
    let run_id = json["run_id"].as_str().unwrap().as_bytes().to_vec();
    assert_eq!(get("FENCE_RUN_ID"), std::slice::from_ref(&run_id));
    assert_eq!(get("FENCE_RUN_PARENT_ID"), [run_id]);
    assert_eq!(get("WEIRD"), [weird.as_bytes().to_vec()]);
}

/// Runs a [`common::Fence`] in `dir`.
trait RunIn {
    fn current_dir_run(self, dir: &Path) -> common::Out;
}

impl RunIn for common::Fence {
    fn current_dir_run(mut self, dir: &Path) -> common::Out {
        self.cmd.current_dir(dir);
        self.run()
    }
}

/// Holds: a start message larger than a pipe's buffer (64 KiB): a PostgreSQL store URL of
/// 100 000 bytes (`connect_timeout=000…010`, which the client reads as 10; a long
/// `application_name` would not fit the server's startup packet), which the command gets whole
/// as FENCE_STORE.
#[test]
fn a_start_message_larger_than_a_pipe_reaches_the_command_whole() {
    let store = Store::postgres();
    store.fence().args(["init", "-q"]).run().expect(0);
    let separator = if store.url.contains('?') { '&' } else { '?' };
    let url = format!(
        "{}{separator}connect_timeout={}10",
        store.url,
        "0".repeat(100_000)
    );
    let dir = tempfile::tempdir().unwrap();
    let mut fence = store.fence_at(&url).args([
        "run",
        "r",
        "--",
        "sh",
        "-c",
        "printf %s \"$FENCE_STORE\" > store",
    ]);
    fence.cmd.current_dir(dir.path());
    let out = fence.run();
    assert_eq!(out.code, 0, "{}", &out.stderr[..out.stderr.len().min(2000)]);
    let seen = std::fs::read_to_string(dir.path().join("store")).unwrap();
    assert_eq!(seen.len(), url.len());
    assert!(seen == url, "FENCE_STORE differs from the URL given");
    assert_eq!(store.lease("r").map(|l| l.2), Some(false));
}

/// Holds: many runs of one resource at once, all waiting: each command runs alone (a
/// directory it makes and removes is never there already), each with its own token, and no
/// reaper is left once they are done.
fn many_runs_at_once_each_run_alone(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().to_str().unwrap().to_owned();
    let script = format!(
        "mkdir '{marker}/inside' || echo overlap >> '{marker}/log'; \
         echo \"$FENCE_TOKEN\" >> '{marker}/tokens'; rmdir '{marker}/inside'"
    );
    let runs: Vec<Child> = (0..6)
        .map(|_| {
            spawn_run(
                store,
                "r",
                dir.path(),
                &["--wait", "5m", "--ttl", "30s"],
                &script,
            )
        })
        .collect();
    for run in runs {
        let out = wait_output("a concurrent run", run, Duration::from_secs(240));
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
    assert!(
        lines(&dir.path().join("log")).is_empty(),
        "two commands overlapped"
    );
    let mut tokens: Vec<i64> = lines(&dir.path().join("tokens"))
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 6, "{tokens:?}");
    nothing_left(&marker, "six runs");
}

// ---------------------------------------------------------------------------------------
// 2. The directory store's unsynced lease records
// ---------------------------------------------------------------------------------------

/// A grant then a release on the directory store, by `owner`: the token.
fn grant_and_release(store: &Store, owner: &str) -> i64 {
    let lease = store
        .fence()
        .acquire("z", &["--ttl", "1m", "--owner", owner]);
    store.fence().release(&lease);
    lease.token
}

/// Holds: whatever single file of a resource is lost, emptied, cut short or restored from an
/// older copy (the record, the mark, the log), the next token is above every token issued,
/// and a record below the mark is reported with its true causes (a power loss among them).
#[test]
fn no_single_lost_or_older_file_makes_a_token_repeat() {
    let store = Store::file();
    let record = store.dir().join("leases/z.json");
    let mark = store.dir().join("tokens/z.high");
    let log = store.dir().join("events/z.jsonl");
    let mut highest = grant_and_release(&store, "a");
    let older_record = std::fs::read(&record).unwrap();
    let older_mark = std::fs::read(&mark).unwrap();
    let older_log = std::fs::read(&log).unwrap();
    highest = highest.max(grant_and_release(&store, "b"));
    // The record restored from the older copy: a warning naming the causes, and a new token.
    std::fs::write(&record, &older_record).unwrap();
    let out = store
        .fence()
        .args(["acquire", "z", "--owner", "c", "--format", "json"])
        .run()
        .expect(0);
    let notices = out.json()["notices"].to_string();
    assert!(
        notices.contains("restored from an older copy")
            && notices.contains("a power loss took its last grant"),
        "{out:?}"
    );
    let token = out.json()["token"].as_i64().unwrap();
    assert!(token > highest, "token {token} after {highest}");
    highest = token;
    store.fence().release(&common::Lease {
        resource: "z".into(),
        owner: "c".into(),
        token,
    });
    // Each other single file: gone, emptied (log), cut short (log), restored (mark, log).
    type Fault<'a> = Box<dyn Fn() + 'a>;
    let faults: Vec<(&str, Fault)> = vec![
        (
            "record removed",
            Box::new(|| std::fs::remove_file(&record).unwrap()),
        ),
        (
            "mark removed",
            Box::new(|| std::fs::remove_file(&mark).unwrap()),
        ),
        (
            "mark restored",
            Box::new(|| std::fs::write(&mark, &older_mark).unwrap()),
        ),
        (
            "log removed",
            Box::new(|| std::fs::remove_file(&log).unwrap()),
        ),
        (
            "log emptied",
            Box::new(|| std::fs::write(&log, "").unwrap()),
        ),
        (
            "log restored, its last line torn",
            Box::new(|| {
                let mut torn = older_log.clone();
                torn.extend_from_slice(b"{\"at_ms\":1,\"kind\":\"acq");
                std::fs::write(&log, torn).unwrap()
            }),
        ),
    ];
    for (what, fault) in faults {
        fault();
        let token = grant_and_release(&store, "d");
        assert!(token > highest, "{what}: token {token} after {highest}");
        highest = token;
    }
}

/// FINDING: a lease record that a power loss left empty (zero bytes) or cut short blocks its
/// resource, and the message names damage, not the power loss.
///
/// A grant no longer fsyncs the record, which is written to a new file and renamed into place:
/// after a power loss, a file system may keep the rename and not the bytes (ext4 without
/// `auto_da_alloc` for a new name, XFS), leaving `leases/<name>.json` empty or cut short. That
/// is now an expected state after a crash, and harmless to tokens (the mark was fsynced before
/// the token was handed out, and the next token goes above it, as for a missing record). Yet
/// every acquire and `fence run` of the resource fails with exit 1, "the lease record … is
/// damaged: EOF while parsing a value at line 1 column 0", until a person moves the file
/// aside: a cron job stays down after a reboot, and the message does not name the cause that
/// the change made likely (README: "a record or log entry that a power loss takes costs
/// nothing but history"). Either an empty/partial record is treated like a missing one (the
/// next token continues above the mark), or its message says it may be what a power loss
/// left of an unsynced record.
#[test]
fn an_empty_record_left_by_a_power_loss_names_its_cause_or_is_survived() {
    let store = Store::file();
    let record = store.dir().join("leases/z.json");
    let mut highest = grant_and_release(&store, "a");
    for (what, body) in [
        ("empty", &b""[..]),
        ("cut short", &br#"{"resource":"z","owner":"#[..]),
    ] {
        std::fs::write(&record, body).unwrap();
        let out = store
            .fence()
            .args(["acquire", "z", "--owner", "b", "--format", "json"])
            .run();
        if out.code == 0 {
            let token = out.json()["token"].as_i64().unwrap();
            assert!(token > highest, "{what}: token {token} after {highest}");
            highest = token;
            store.fence().release(&common::Lease {
                resource: "z".into(),
                owner: "b".into(),
                token,
            });
        } else {
            let message = out.json()["message"].as_str().unwrap().to_owned();
            assert!(
                message.contains("power") || message.contains("machine stopped"),
                "{what}: the record a power loss can leave is refused without naming that cause: {out:?}"
            );
        }
    }
}

/// Fixed FINDING: a run id's completion record that a power loss left empty made every later
/// run with that id run its command again, for ever (an empty record now reads as missing).
///
/// The completion record (`leases/r%23done%3A<id>.json`) is a lease record like any other, so
/// it is no longer synced either. Once a power loss left it empty (see the finding above),
/// `fence run --id` reads it as "not completed" (the damaged record has no token) and runs the
/// command again, which is the safe side; but recording the completion then fails on the same
/// damaged file ("warning: … could not be recorded as completed …: the lease record … is
/// damaged: EOF while parsing"), so the next run runs the work again, and so on: the id never
/// protects that job again until a person moves the file aside, and the warning names damage,
/// not the power loss. One re-run is the documented price of a lost record; every run after
/// it is not.
#[test]
fn an_emptied_completion_record_costs_one_rerun_not_every_run() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let cmd = format!("echo ran >> '{}'", log.display());
    let command = [OsStr::new("sh"), OsStr::new("-c"), OsStr::new(&cmd)];
    run_with_id(&store, dir.path(), "day-1", &command).expect(0);
    std::fs::write(store.dir().join("leases/r%23done%3Aday-1.json"), "").unwrap();
    let mut outs = Vec::new();
    for _ in 0..3 {
        outs.push(run_with_id(&store, dir.path(), "day-1", &command).expect(0));
    }
    assert!(
        lines(&log).len() <= 2,
        "the work ran {} times after one completion record was emptied: {outs:?}",
        lines(&log).len()
    );
}

/// Fixed FINDING (message): `inspect` blamed a person for a lease record a power loss took.
///
/// A record is now renamed into place without syncing the file or its directory, so after a
/// power loss the first record of a resource can be missing while its fsynced mark says a
/// token was issued. `inspect` reports `record_missing: the lease record … is missing (moved
/// aside or deleted)`, which sends the operator looking for who deleted it; the change made a
/// power loss the likelier cause, and the restored-record warning already says so
/// (`LOWERED`). The missing-record finding should name it too.
#[test]
fn a_missing_record_is_not_blamed_on_a_person_alone() {
    let store = Store::file();
    store.fence().acquire("z", &["--owner", "a"]);
    std::fs::remove_file(store.dir().join("leases/z.json")).unwrap();
    let out = store.fence().args(["inspect", "z"]).run();
    let finding = out
        .stdout
        .lines()
        .chain(out.stderr.lines())
        .find(|l| l.contains("record_missing"))
        .unwrap_or_else(|| panic!("no record_missing finding: {out:?}"))
        .to_owned();
    assert!(
        finding.contains("power") || finding.contains("machine stopped"),
        "{finding}"
    );
}

/// FINDING (message): a holder whose lease record went missing is told "no lease has ever
/// been granted on `z`" (exit 6), though the high-water mark and the log both say token 1 was.
///
/// A record below the mark is reported as restored, rolled back or lost in a power loss
/// (`FileCoordinator::refuse` checks the mark when the record is older), but a missing record
/// skips that check (`Refusal::NeverIssued` with no record), so `renew` and `release` name a
/// cause that is false and send the holder to check RESOURCE and --token. Records are moved
/// aside by hand (fence's own hint for a damaged one) and, now that they are not synced, lost
/// to power; the refusal should say the record is missing and that the token was issued.
/// Fixed for `renew` and `release` (they say the record is missing though the token was
/// issued, exit 1); `fence run` is the next test.
#[test]
fn a_missing_record_is_not_reported_as_never_granted() {
    let store = Store::file();
    let lease = store.fence().acquire("z", &["--ttl", "5m", "--owner", "a"]);
    std::fs::remove_file(store.dir().join("leases/z.json")).unwrap();
    for op in ["renew", "release"] {
        let out = store
            .fence()
            .args([op, "z", "--owner", "a", "--token", &lease.token.to_string()])
            .run();
        assert_ne!(out.code, 0, "{op}: {out:?}");
        assert!(
            !out.stderr.contains("no lease has ever been granted"),
            "{op} names a false cause: {out:?}"
        );
        assert!(out.stderr.contains("is missing"), "{op}: {out:?}");
    }
}

/// Fixed FINDING (message): `fence run` whose record goes missing retried its renewal as if
/// the store were unreachable, then says "the store was unreachable, or this process was
/// paused" (the warning before it names the missing record): the lease is lost either way.
#[test]
fn a_run_whose_record_goes_missing_names_the_cause() {
    let store = Store::file();
    let dir = tempfile::tempdir().unwrap();
    let run = spawn_run(
        &store,
        "q",
        dir.path(),
        &["--ttl", "2s"],
        "echo $$ > pid; exec sleep 60",
    );
    wait_for("the command", Duration::from_secs(30), || {
        dir.path().join("pid").exists()
    });
    std::fs::remove_file(store.dir().join("leases/q.json")).unwrap();
    let out = wait_output("fence run", run, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert!(
        !stderr.contains("no lease has ever been granted") && !stderr.contains("unreachable"),
        "fence run names a false cause: {stderr}"
    );
}

// ---------------------------------------------------------------------------------------
// 3. Run ids and the command's digest
// ---------------------------------------------------------------------------------------

/// Holds: the digest tells arguments apart by their boundaries (`a b` against `a` `b`), empty
/// arguments (one more `""`), and non-UTF-8 bytes that read the same once made lossy
/// (`\xff` against `\xfe`): each other command is refused (exit 6, nothing run), the same
/// command is skipped.
fn run_ids_tell_argument_boundaries_and_bytes_apart(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!("echo \"$FENCE_RUN_ID $#\" >> '{}'", log.display());
    let s = |a: &str| OsStr::new(a).to_owned();
    let base = |extra: &[std::ffi::OsString]| {
        let mut c = vec![s("sh"), s("-c"), s(&script), s("x")];
        c.extend_from_slice(extra);
        c
    };
    let cases: Vec<(&str, Vec<std::ffi::OsString>, Vec<std::ffi::OsString>)> = vec![
        ("boundaries", base(&[s("a b")]), base(&[s("a"), s("b")])),
        ("empty", base(&[]), base(&[s("")])),
        (
            "bytes",
            base(&[OsStr::from_bytes(b"\xff").to_owned()]),
            base(&[OsStr::from_bytes(b"\xfe").to_owned()]),
        ),
    ];
    for (id, first, other) in cases {
        let first: Vec<&OsStr> = first.iter().map(|a| a.as_os_str()).collect();
        let other: Vec<&OsStr> = other.iter().map(|a| a.as_os_str()).collect();
        run_with_id(store, dir.path(), id, &first).expect(0);
        let refused = run_with_id(store, dir.path(), id, &other).expect(6).json();
        assert_eq!(refused["reason"], "id_reused", "{id}: {refused}");
        assert_eq!(refused["run_id"], id, "{refused}");
        let skipped = run_with_id(store, dir.path(), id, &first).expect(0).json();
        assert_eq!(skipped["skipped"], true, "{id}: {skipped}");
    }
    assert_eq!(lines(&log).len(), 3, "{:?}", lines(&log));
    assert_eq!(store.lease("r").map(|l| l.2), Some(false));
}

/// Holds: a skipped run and a refused one start nothing, leave no reaper, and release the
/// lease; FENCE_RUN_ID from the environment is checked the same way as `--id`.
fn skipped_and_refused_runs_start_nothing_and_leave_nothing(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let marker = log.to_str().unwrap().to_owned();
    let run = |args: &[&str], env_id: Option<&str>| {
        let mut fence = store
            .fence()
            .args(["run", "r", "--format", "json"])
            .args(args)
            .args(["--", "sh", "-c", &format!("echo ran >> '{marker}'"), "x"]);
        if let Some(id) = env_id {
            fence = fence.env("FENCE_RUN_ID", id);
        }
        fence.run()
    };
    run(&["--id", "day-1"], None).expect(0);
    run(&["--id", "day-1"], None).expect(0);
    nothing_left(&marker, "a skipped run");
    let refused = store
        .fence()
        .args(["run", "r", "--id", "day-1", "--format", "json", "--"])
        .args(["sh", "-c", &format!("echo other >> '{marker}'"), "x"])
        .run()
        .expect(6)
        .json();
    assert_eq!(refused["reason"], "id_reused", "{refused}");
    nothing_left(&marker, "a refused run");
    // The same from the environment.
    run(&[], Some("day-1")).expect(0);
    let refused = store
        .fence()
        .env("FENCE_RUN_ID", "day-1")
        .args(["run", "r", "--format", "json", "--"])
        .args(["sh", "-c", &format!("echo other >> '{marker}'"), "x"])
        .run()
        .expect(6)
        .json();
    assert_eq!(refused["run_id"], "day-1", "{refused}");
    nothing_left(&marker, "a refused run with FENCE_RUN_ID");
    assert_eq!(lines(&log), ["ran"]);
    assert_eq!(store.lease("r").map(|l| l.2), Some(false));
}

/// Holds: several hosts (processes) run one id at once, half with one command and half with
/// another, all waiting for the lease: exactly one command runs; the runs of that command are
/// skipped (exit 0), those of the other refused (exit 6).
fn one_id_run_at_once_by_two_commands_completes_once(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().to_str().unwrap().to_owned();
    let runs: Vec<(char, Child)> = (0..6)
        .map(|i| {
            let which = if i % 2 == 0 { 'A' } else { 'B' };
            let script = format!("echo {which} >> '{marker}/log'");
            let child = spawn_run(
                store,
                "r",
                dir.path(),
                &["--wait", "5m", "--id", "once", "--format", "json"],
                &script,
            );
            (which, child)
        })
        .collect();
    let mut codes = Vec::new();
    for (which, run) in runs {
        let out = wait_output("a run of id `once`", run, Duration::from_secs(240));
        codes.push((
            which,
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ));
    }
    let ran = lines(&dir.path().join("log"));
    assert_eq!(ran.len(), 1, "{ran:?} {codes:?}");
    let winner = ran[0].chars().next().unwrap();
    for (which, code, stdout) in &codes {
        let want = if *which == winner { 0 } else { 6 };
        assert_eq!(
            *code,
            Some(want),
            "{which} (winner {winner}): {stdout} {codes:?}"
        );
    }
    nothing_left(&marker, "runs of one id");
}

/// The completion record of run `id` of `r` rewritten as fence versions before the digest
/// wrote it: the owner alone, without `#cmd:DIGEST` (in the record and in its events).
fn strip_digest(store: &Store, id: &str) {
    let marker = format!("r#done:{id}");
    match store.backend {
        common::Backend::File => {
            let name = marker.replace('#', "%23").replace(':', "%3A");
            for path in [
                store.dir().join("leases").join(format!("{name}.json")),
                store.dir().join("events").join(format!("{name}.jsonl")),
            ] {
                let text = std::fs::read_to_string(&path).unwrap();
                let stripped = regex_strip(&text);
                assert_ne!(stripped, text, "{}", path.display());
                std::fs::write(&path, stripped).unwrap();
            }
        }
        _ => pg_exec(
            &store.url,
            &format!(
                "UPDATE {s}.leases SET owner = regexp_replace(owner, '#cmd:[0-9a-f]{{16}}$', '') \
                 WHERE resource = '{marker}'; \
                 UPDATE {s}.events SET owner = regexp_replace(owner, '#cmd:[0-9a-f]{{16}}$', '') \
                 WHERE resource = '{marker}'",
                s = schema(store)
            ),
        ),
    }
}

/// `text` without any `#cmd:` followed by 16 hex digits (and a closing quote).
fn regex_strip(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#cmd:") {
        let after = &rest[at + 5..];
        let hex = after.chars().take_while(|c| c.is_ascii_hexdigit()).count();
        out.push_str(&rest[..at]);
        if hex == 16 {
            rest = &after[16..];
        } else {
            out.push_str("#cmd:");
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Holds: a completion record written before digests were kept (owner without `#cmd:`) is
/// still a skip, for the same command and for another.
fn an_old_record_without_a_digest_is_still_a_skip(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let cmd = format!("echo ran >> '{}'", log.display());
    let command = [OsStr::new("sh"), OsStr::new("-c"), OsStr::new(&cmd)];
    run_with_id(store, dir.path(), "old", &command).expect(0);
    strip_digest(store, "old");
    let skipped = run_with_id(store, dir.path(), "old", &command)
        .expect(0)
        .json();
    assert_eq!(skipped["skipped"], true, "{skipped}");
    let other = [
        OsStr::new("sh"),
        OsStr::new("-c"),
        OsStr::new("echo other >> log"),
    ];
    let skipped = run_with_id(store, dir.path(), "old", &other)
        .expect(0)
        .json();
    assert_eq!(skipped["skipped"], true, "{skipped}");
    assert_eq!(lines(&log), ["ran"]);
}

/// FINDING: a completion record written before digests were kept, by a run whose owner
/// contains `#cmd:` (`--owner 'etl#cmd:nightly'`, or FENCE_OWNER), is refused as `id_reused`
/// (exit 6) for the very command that completed it, instead of skipped.
///
/// `Done::new` splits the record's owner at its last `#cmd:` and takes whatever follows as the
/// digest, without checking that it is one (16 hex digits): the old record's owner
/// `etl#cmd:nightly/<pid>/<hex>` yields the "digest" `nightly/<pid>/<hex>`, which never equals
/// the command's, so every retry of a run that did complete is refused (exit 6) after the
/// upgrade — the README promises records without a digest still skip. Owner names may contain
/// `#` (`parse_name` allows it), and `--owner` is free text.
fn an_old_record_whose_owner_contains_the_mark_is_still_a_skip(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let cmd = format!("echo ran >> '{}'", log.display());
    let mut fence = store
        .fence()
        .args([
            "run",
            "r",
            "--id",
            "old",
            "--owner",
            "etl#cmd:nightly",
            "--",
        ])
        .args(["sh", "-c", &cmd]);
    fence.cmd.current_dir(dir.path());
    fence.run().expect(0);
    strip_digest(store, "old");
    let command = [OsStr::new("sh"), OsStr::new("-c"), OsStr::new(&cmd)];
    let again = run_with_id(store, dir.path(), "old", &command);
    assert_eq!(
        again.code, 0,
        "the command that completed run `old` (an old record, owner with `#cmd:`) was refused: {again:?}"
    );
    assert_eq!(again.json()["skipped"], true, "{again:?}");
    assert_eq!(lines(&log), ["ran"]);
}

/// Holds: an owner containing `#cmd:` and something that looks like a digest (of another
/// command) cannot make a new record skip for that other command: the digest fence appends
/// last is the one read.
fn an_owner_that_fakes_a_digest_does_not_skip_another_command(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let a = format!("echo a >> '{}'", log.display());
    let b = format!("echo b >> '{}'", log.display());
    // The digest fence would keep for command b, planted in the owner of the run of a.
    let mut bytes = Vec::new();
    for arg in ["sh", "-c", b.as_str()] {
        bytes.extend_from_slice(arg.as_bytes());
        bytes.push(0);
    }
    let fake = common::write_digest(&bytes);
    let owner = format!("x#cmd:{fake}");
    let mut fence = store
        .fence()
        .args(["run", "r", "--id", "k", "--owner", &owner, "--"])
        .args(["sh", "-c", &a]);
    fence.cmd.current_dir(dir.path());
    fence.run().expect(0);
    let command = [OsStr::new("sh"), OsStr::new("-c"), OsStr::new(&b)];
    let other = run_with_id(store, dir.path(), "k", &command)
        .expect(6)
        .json();
    assert_eq!(other["reason"], "id_reused", "{other}");
    assert_eq!(lines(&log), ["a"]);
}

/// Holds: the longest owner `fence run` accepts (180 bytes, before its `/<pid>/<hex>`) still
/// records a completion (its record's owner is then 221 bytes with `#cmd:DIGEST`), read back
/// whole: a retry is skipped and names that owner, another command is refused.
fn the_longest_run_owner_still_records_its_digest(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let owner = format!("{}é", "o".repeat(178));
    assert_eq!(owner.len(), 180);
    let log = dir.path().join("log");
    let cmd = format!("echo ran >> '{}'", log.display());
    let mut fence = store
        .fence()
        .args(["run", "r", "--id", "long", "--owner", &owner, "--"])
        .args(["sh", "-c", &cmd]);
    fence.cmd.current_dir(dir.path());
    fence.run().expect(0);
    let command = [OsStr::new("sh"), OsStr::new("-c"), OsStr::new(&cmd)];
    let skipped = run_with_id(store, dir.path(), "long", &command)
        .expect(0)
        .json();
    assert_eq!(skipped["skipped"], true, "{skipped}");
    let by = skipped["completed"]["owner"].as_str().unwrap();
    assert!(
        by.starts_with(&format!("{owner}/")) && !by.contains("#cmd:"),
        "{by}"
    );
    let other = [
        OsStr::new("sh"),
        OsStr::new("-c"),
        OsStr::new("echo other >> log"),
    ];
    run_with_id(store, dir.path(), "long", &other).expect(6);
    assert_eq!(lines(&log), ["ran"]);
}

mod reaper_waits {
    use super::*;
    per_backend!(
        a_waiting_run_paused_killed_or_interrupted_leaves_nothing,
        many_runs_at_once_each_run_alone,
        the_command_gets_the_callers_descriptors_and_no_others,
    );
}

mod digests {
    use super::*;
    per_coordinator!(
        run_ids_tell_argument_boundaries_and_bytes_apart,
        skipped_and_refused_runs_start_nothing_and_leave_nothing,
        an_owner_that_fakes_a_digest_does_not_skip_another_command,
        the_longest_run_owner_still_records_its_digest,
    );
}

mod concurrent_ids {
    use super::*;
    per_backend!(one_id_run_at_once_by_two_commands_completes_once);
}

mod old_records {
    use super::*;
    per_backend!(an_old_record_without_a_digest_is_still_a_skip);
}

/// The finding above on each store whose records the test can rewrite (see
/// [`an_old_record_whose_owner_contains_the_mark_is_still_a_skip`]).
mod old_records_with_the_mark_in_the_owner {
    use super::*;

    #[test]
    fn file_store() {
        an_old_record_whose_owner_contains_the_mark_is_still_a_skip(&Store::file());
    }

    #[test]
    fn postgres() {
        let store = Store::postgres();
        store.fence().args(["init", "-q"]).run().expect(0);
        an_old_record_whose_owner_contains_the_mark_is_still_a_skip(&store);
    }
}
