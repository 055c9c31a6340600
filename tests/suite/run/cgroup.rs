//! `fence run` gives its command a cgroup of its own (`fence-run-<supervisor pid>`, under the
//! cgroup fence was started in) where the host lets it, and kills through `cgroup.kill`: fork
//! chains that outran every scan of /proc (review 8: in a new session at every generation, or
//! in the supervisor's own process group) are stopped at once, however `fence run` ends — the
//! command ending with them left behind, fence killed, its supervisor killed, fence paused
//! past the lease. Where the cgroup cannot be made, `fence run` still runs (the scans of /proc
//! alone) and `fence doctor` says so.
//!
//! These tests need a cgroup v2 hierarchy this process may write (as root here); each says
//! when it is skipped. Every assertion is on what outlives the run (the chains' own writes,
//! the processes left), not on fence's report alone.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::chains::*;
use common::process::{is_gone, kill, read_pid};
use common::{wait_for, wait_output, Store};

/// The cgroup2 mount (mounted from the hierarchy's root, as here): its mount point, and
/// whether it is mounted read-write.
fn cgroup2_mount() -> Option<(String, bool)> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let mut fields = before.split(' ').skip(3);
        let (root, point, options) = (fields.next()?, fields.next()?, fields.next()?);
        (after.starts_with("cgroup2 ") && root == "/")
            .then(|| (point.to_owned(), options.split(',').any(|o| o == "rw")))
    })
}

/// The cgroup v2 directory of this test process.
fn own_cgroup() -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let own = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    let (point, _) = cgroup2_mount()?;
    let below = own.trim_matches('/');
    Some(if below.is_empty() {
        PathBuf::from(point)
    } else {
        Path::new(&point).join(below)
    })
}

/// This test process's cgroup, where fence (started from here) makes its runs' cgroups. The
/// test is skipped (`None`) where fence may not: not root, or no cgroup v2 mounted
/// read-write. As root with one, fence must be able to: the test fails otherwise, rather
/// than skip on the machine that runs the suite (CI runs it as root).
fn usable_base() -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let writable = cgroup2_mount().is_some_and(|(_, rw)| rw);
    let Some(base) = own_cgroup().filter(|_| root && writable) else {
        eprintln!("skipped: not root, or no cgroup v2 mounted read-write here");
        return None;
    };
    let scratch = base.join(format!("fence-test-probe-{}", std::process::id()));
    let usable = std::fs::create_dir(&scratch).is_ok() && scratch.join("cgroup.kill").exists();
    let _ = std::fs::remove_dir(&scratch);
    assert!(
        usable,
        "as root, with cgroup v2 mounted read-write, a cgroup with cgroup.kill could not be made under {} (Linux before 5.14? cgroup.max.descendants reached?)",
        base.display()
    );
    Some(base)
}

/// A script that starts one fork chain per entry of `modes` in the background (0 stays in the
/// process group, 1 calls setsid at every generation, 2 once), SIGTERM ignored, writes its pid
/// to `cmd.pid` once every chain has written, then runs `tail`.
fn chains_then(dir: &RunDir, chain: &str, modes: &[u8], tail: &str) -> String {
    let mut script = "trap '' TERM; ".to_owned();
    for (i, mode) in modes.iter().enumerate() {
        script.push_str(&format!(
            "'{chain}' '{out}' '{stop}' {mode} 60 & ",
            out = dir.file(&format!("chain{}", i + 1)),
            stop = dir.file("stop"),
        ));
    }
    let written: Vec<String> = (1..=modes.len())
        .map(|i| format!("[ -s '{}' ]", dir.file(&format!("chain{i}"))))
        .collect();
    script.push_str(&format!(
        "until {}; do sleep 0.01; done; echo $$ > '{pid}'; {tail}",
        written.join(" && "),
        pid = dir.file("cmd.pid")
    ));
    script
}

/// The chains of the hardest kinds: two that leave their session at every generation, two
/// that stay in the supervisor's process group.
const HARD: [u8; 4] = [1, 1, 0, 0];

/// How many idle processes crowd /proc during the chain tests (see `chains::crowd`): with
/// them, the scans of /proc alone let the chains run on for seconds (about 10 s, until the
/// supervisor gives up, measured on this project's VM), where a cgroup's kill takes
/// milliseconds.
const CROWD: usize = 2000;

/// How long a run may take to stop the chains once it must: well above what the kill through
/// a cgroup takes (under 0.1 s), well below the scans' ~10 s.
const STOPPED_WITHIN: Duration = Duration::from_secs(4);

/// Asserts that nothing of the run is left and that no chain wrote at or after `since` (ns,
/// the wall clock: every process of the run was gone by then).
fn assert_nothing_outlived(dir: &RunDir, since: i128, what: &str) {
    std::thread::sleep(Duration::from_millis(100));
    let late = chain_writes_after(dir, HARD.len(), since);
    let left = dir.processes();
    dir.clean_up();
    assert!(
        late.is_empty() && left.is_empty(),
        "{what}: the fork chains wrote {} times after it, {} processes of the run left: {left:?}",
        late.len(),
        left.len()
    );
}

/// The command runs in `fence-run-<supervisor pid>` below fence's own cgroup, and the cgroup
/// is gone once the run ends.
#[test]
fn the_command_runs_in_a_cgroup_of_its_own_removed_with_the_run() {
    let Some(base) = usable_base() else { return };
    let store = Store::file();
    let dir = RunDir::new();
    let script = format!(
        "cat /proc/self/cgroup > '{cg}'; echo $PPID > '{sup}'",
        cg = dir.file("cgroup"),
        sup = dir.file("supervisor.pid")
    );
    let out = wait_output(
        "fence run",
        spawn_run(&store, &["--ttl", "5s"], &script, &dir),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&dir));
    let supervisor = read_pid(&dir.path().join("supervisor.pid"));
    let seen = std::fs::read_to_string(dir.path().join("cgroup")).unwrap();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let own = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
    let expected = format!("0::{}/fence-run-{supervisor}", own.trim_end_matches('/'));
    assert!(
        seen.lines().any(|l| l == expected),
        "the command's cgroup: {seen:?}, expected {expected:?}"
    );
    let cell = base.join(format!("fence-run-{supervisor}"));
    assert!(!cell.exists(), "{} left after the run", cell.display());
    let report = store
        .fence()
        .args(["doctor", "--format", "json"])
        .cmd
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    let finding = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "host.run_cgroup")
        .cloned()
        .unwrap_or_default();
    assert_eq!(finding["severity"], "ok", "{json}");
    let message = finding["message"].as_str().unwrap_or_default();
    assert!(message.contains(&base.display().to_string()), "{message}");
}

/// The command ends and leaves fork chains behind, two that leave their session at every
/// generation and two in the supervisor's group, none stopping on SIGTERM: `fence run` ends
/// with none of them left (exit 0, the leftovers named) — the scans of /proc alone lost this
/// race (review 8).
#[test]
fn fork_chains_left_behind_by_the_command_are_stopped() {
    if usable_base().is_none() {
        return;
    }
    let store = Store::file();
    let dir = RunDir::new();
    let Some(chain) = dir.chain() else { return };
    let _crowd = crowd(&chain, CROWD);
    let fence = spawn_run(
        &store,
        &["--ttl", "30s", "--kill-after", "200ms"],
        &chains_then(&dir, &chain, &HARD, "exit 0"),
        &dir,
    );
    read_pid(&dir.path().join("cmd.pid"));
    let command_ended = std::time::Instant::now();
    let out = wait_output("fence run", fence, Duration::from_secs(60));
    let took = command_ended.elapsed();
    eprintln!("fence run ended {took:?} after its command");
    let ended = wall_ns();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&dir));
    assert!(
        took < STOPPED_WITHIN,
        "fence run took {took:?} to stop the chains once its command ended (--kill-after 200ms)"
    );
    assert!(
        stderr_of(&dir).contains("left processes running"),
        "{}",
        stderr_of(&dir)
    );
    assert_nothing_outlived(&dir, ended, "after fence run ended");
}

/// fence is killed (SIGKILL) while the chains run: its supervisor, told by its parent-death
/// signal, kills them all before it goes; nothing writes after another owner's grant.
#[test]
fn fork_chains_die_with_a_killed_fence() {
    if usable_base().is_none() {
        return;
    }
    let store = Store::file();
    let dir = RunDir::new();
    let Some(chain) = dir.chain() else { return };
    let _crowd = crowd(&chain, CROWD);
    let fence = spawn_run(
        &store,
        &["--ttl", "2s"],
        &chains_then(&dir, &chain, &HARD, "while :; do sleep 0.05; done"),
        &dir,
    );
    read_pid(&dir.path().join("cmd.pid"));
    let killed_at = wall_ns();
    kill(fence.id(), libc::SIGKILL);
    let out = wait_output("fence run, killed", fence, Duration::from_secs(10));
    assert_eq!(out.status.code(), None, "killed by a signal");
    // Not only by the lease's end: at once (the scans of /proc alone took seconds here).
    let within = killed_at + STOPPED_WITHIN.as_nanos() as i128 / 4;
    let late = chain_writes_after(&dir, HARD.len(), within);
    assert!(
        late.is_empty(),
        "the chains wrote {} times more than {:?} after fence was killed",
        late.len(),
        STOPPED_WITHIN / 4
    );
    wait_expired(&store);
    let (granted, _) = take_over(&store);
    assert_nothing_outlived(&dir, granted, "after another owner's grant");
}

/// The supervisor is killed (SIGKILL, as the OOM killer would) while the chains run: `fence
/// run` kills them through the run's cgroup, ends with exit 5 `supervisor_lost`, and removes
/// the cgroup.
#[test]
fn fork_chains_die_with_a_killed_supervisor() {
    let Some(base) = usable_base() else { return };
    let store = Store::file();
    let dir = RunDir::new();
    let Some(chain) = dir.chain() else { return };
    let script = format!(
        "echo $PPID > '{sup}'; {}",
        chains_then(&dir, &chain, &HARD, "while :; do sleep 0.05; done"),
        sup = dir.file("supervisor.pid")
    );
    let _crowd = crowd(&chain, CROWD);
    let fence = spawn_run(&store, &["--ttl", "30s"], &script, &dir);
    read_pid(&dir.path().join("cmd.pid"));
    let supervisor = read_pid(&dir.path().join("supervisor.pid"));
    kill(supervisor, libc::SIGKILL);
    let killed = std::time::Instant::now();
    let out = wait_output("fence run", fence, Duration::from_secs(60));
    let took = killed.elapsed();
    eprintln!("fence run ended {took:?} after its supervisor was killed");
    let ended = wall_ns();
    assert!(
        took < STOPPED_WITHIN,
        "fence run took {took:?} to stop the chains once its supervisor was killed"
    );
    let (code, json) = outcome(&out);
    assert_eq!(code, Some(5), "{json} {}", stderr_of(&dir));
    assert_eq!(json["reason"], "supervisor_lost", "{json}");
    let cell = base.join(format!("fence-run-{supervisor}"));
    assert!(!cell.exists(), "{} left after the run", cell.display());
    assert_nothing_outlived(&dir, ended, "after fence run ended");
}

/// fence is paused (SIGSTOP) and its lease runs out: the supervisor kills the chains at the
/// lease's bound, by its own clock; nothing writes after another owner's grant, and fence,
/// continued, exits 5.
#[test]
fn fork_chains_die_at_the_bound_while_fence_is_paused() {
    if usable_base().is_none() {
        return;
    }
    let store = Store::file();
    let mut dir = RunDir::new();
    let Some(chain) = dir.chain() else { return };
    let _crowd = crowd(&chain, CROWD);
    let fence = spawn_run(
        &store,
        &["--ttl", "2s"],
        &chains_then(&dir, &chain, &HARD, "while :; do sleep 0.05; done"),
        &dir,
    );
    read_pid(&dir.path().join("cmd.pid"));
    pause_between_operations(fence.id());
    dir.paused.push(fence.id());
    wait_expired(&store);
    let (granted, _) = take_over(&store);
    std::thread::sleep(Duration::from_millis(100));
    let late = chain_writes_after(&dir, HARD.len(), granted);
    let left = dir.processes();
    kill(fence.id(), libc::SIGCONT);
    let out = wait_output("fence run, continued", fence, Duration::from_secs(30));
    dir.clean_up();
    assert!(
        late.is_empty() && left.len() <= 2,
        "with fence paused past its lease, the chains wrote {} times after another owner's grant; left: {left:?}",
        late.len()
    );
    assert_eq!(out.status.code(), Some(5), "{}", stderr_of(&dir));
}

/// A cgroup where no cgroup may be made below it (`cgroup.max.descendants` 0, as a host may
/// set): `fence run` runs all the same, on the scans of /proc alone — a daemon that leaves its
/// session once is still stopped — and `fence doctor` warns that fence cannot make one.
#[test]
fn without_a_cgroup_of_its_own_fence_run_falls_back_and_doctor_says_so() {
    use std::os::unix::process::CommandExt;
    let Some(base) = usable_base() else { return };
    let store = Store::file();
    let dir = RunDir::new();
    let Some(chain) = dir.chain() else { return };
    let fenced = base.join(format!("fence-test-nocg-{}", std::process::id()));
    std::fs::create_dir(&fenced).unwrap();
    std::fs::write(fenced.join("cgroup.max.descendants"), "0").unwrap();
    let procs = fenced.join("cgroup.procs");
    let into_it = |cmd: &mut std::process::Command| {
        let procs = procs.clone();
        // SAFETY: only writes a file between fork and exec.
        unsafe {
            cmd.pre_exec(move || std::fs::write(&procs, "0"));
        }
    };
    let fence = spawn_run_with(
        &store,
        &["--ttl", "10s", "--kill-after", "200ms"],
        &chains_then(&dir, &chain, &[2], "exit 0"),
        &dir,
        into_it,
    );
    let out = wait_output("fence run", fence, Duration::from_secs(60));
    let ended = wall_ns();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&dir));
    std::thread::sleep(Duration::from_millis(100));
    let late = chain_writes_after(&dir, 1, ended);
    assert!(late.is_empty(), "a daemon outlived the run: {late:?}");
    let mut doctor = store.fence().args(["doctor", "--format", "json"]);
    into_it(&mut doctor.cmd);
    let report = doctor.cmd.output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    let finding = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "host.run_cgroup")
        .cloned()
        .unwrap_or_default();
    wait_for(
        "the test's cgroup to empty",
        Duration::from_secs(10),
        || std::fs::read_to_string(&procs).is_ok_and(|p| p.trim().is_empty()),
    );
    let _ = std::fs::remove_dir(&fenced);
    assert_eq!(finding["severity"], "warn", "{json}");
    let message = finding["message"].as_str().unwrap_or_default();
    assert!(message.contains("cannot make a cgroup"), "{message}");
    assert!(message.contains("fork chain"), "{message}");
    assert!(is_gone(read_pid(&dir.path().join("cmd.pid"))));
}

/// A pid no process has now: a child's, once waited for.
fn a_dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    child.id()
}

/// A run's cgroup left behind empty (fence and its supervisor killed together) is removed by
/// the next run's supervisor; one left with processes in it is named by `fence doctor`
/// (`host.run_leftovers`, with the way to stop them), and kept.
#[test]
fn run_cgroups_left_behind_are_removed_or_named() {
    let Some(base) = usable_base() else { return };
    let store = Store::file();
    let empty = base.join(format!("fence-run-{}", a_dead_pid()));
    let full = base.join(format!("fence-run-{}", a_dead_pid()));
    std::fs::create_dir(&empty).unwrap();
    std::fs::create_dir(&full).unwrap();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    std::fs::write(full.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
    store
        .fence()
        .args(["run", "swept", "--", "true"])
        .run()
        .expect(0);
    let (code, json) = {
        let out = store
            .fence()
            .args(["doctor", "--format", "json"])
            .cmd
            .output()
            .unwrap();
        (
            out.status.code(),
            serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap(),
        )
    };
    let named: Vec<serde_json::Value> = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "host.run_leftovers")
        .cloned()
        .collect();
    let still_full = full.exists();
    let _ = std::fs::write(full.join("cgroup.kill"), "1");
    let _ = sleeper.wait();
    wait_for("the left cgroup to empty", Duration::from_secs(10), || {
        std::fs::remove_dir(&full).is_ok() || !full.exists()
    });
    assert!(
        !empty.exists(),
        "an empty run cgroup of a dead supervisor was not removed"
    );
    assert!(still_full, "a run cgroup with processes in it was removed");
    assert_eq!(code, Some(0), "{json}");
    let ours: Vec<&serde_json::Value> = named
        .iter()
        .filter(|f| {
            f["message"]
                .as_str()
                .unwrap_or_default()
                .contains(&full.display().to_string())
        })
        .collect();
    assert_eq!(ours.len(), 1, "{json}");
    assert_eq!(ours[0]["severity"], "warn", "{json}");
    let message = ours[0]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("pid {}", sleeper.id())),
        "{message}"
    );
    assert!(
        ours[0]["fix"].as_str().unwrap().contains("cgroup.kill"),
        "{json}"
    );
}
