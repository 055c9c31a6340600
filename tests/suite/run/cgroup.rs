//! `fence run` gives its command a cgroup of its own (`fence-run-<fence's pid>-…`, under the
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

/// The run cgroups under `base` named for the `fence run` of pid `fence`.
fn cells_of(base: &Path, fence: u32) -> Vec<PathBuf> {
    std::fs::read_dir(base)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("fence-run-{fence}-")))
        })
        .collect()
}

/// This process's pid namespace (the number in /proc/self/ns/pid's `pid:[N]`).
fn pid_namespace() -> String {
    let link = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let text = link.to_string_lossy().into_owned();
    text.trim_start_matches("pid:[")
        .trim_end_matches(']')
        .to_owned()
}

/// The command runs in `fence-run-<fence's pid>-<pid namespace>-<random>` below fence's own
/// cgroup, shown by `ps` as `fence __command` until it runs, and the cgroup is gone once the
/// run ends.
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
    let fence = spawn_run(&store, &["--ttl", "5s"], &script, &dir);
    let fence_pid = fence.id();
    let out = wait_output("fence run", fence, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&dir));
    let seen = std::fs::read_to_string(dir.path().join("cgroup")).unwrap();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let own = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
    let expected = format!(
        "0::{}/fence-run-{fence_pid}-{}-",
        own.trim_end_matches('/'),
        pid_namespace()
    );
    assert!(
        seen.lines()
            .any(|l| l.starts_with(&expected) && l.len() == expected.len() + 8),
        "the command's cgroup: {seen:?}, expected {expected:?} and 8 hex digits"
    );
    assert!(
        cells_of(&base, fence_pid).is_empty(),
        "left after the run: {:?}",
        cells_of(&base, fence_pid)
    );
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

/// A run of the [`HARD`] chains among a [`CROWD`] (`sh -c` writes the supervisor's pid to
/// `supervisor.pid`, starts the chains, waits until each has written, writes its own pid to
/// `cmd.pid`, then runs `tail`), returned once `cmd.pid` is there. `None`: skipped (no cgroup
/// here, or no C compiler).
struct Chains {
    store: Store,
    dir: RunDir,
    fence: std::process::Child,
    _crowd: RunDir,
}

impl Chains {
    fn start(args: &[&str], tail: &str) -> Option<Chains> {
        usable_base()?;
        let store = Store::file();
        let dir = RunDir::new();
        let chain = dir.chain()?;
        let crowd = crowd(&chain, CROWD);
        let script = format!(
            "echo $PPID > '{sup}'; {}",
            chains_then(&dir, &chain, &HARD, tail),
            sup = dir.file("supervisor.pid")
        );
        let fence = spawn_run(&store, args, &script, &dir);
        read_pid(&dir.path().join("cmd.pid"));
        Some(Chains {
            store,
            dir,
            fence,
            _crowd: crowd,
        })
    }
}

/// What the chains' command runs once they all wrote: until it is stopped.
const FOREVER: &str = "while :; do sleep 0.05; done";

/// The command ends and leaves fork chains behind, two that leave their session at every
/// generation and two in the supervisor's group, none stopping on SIGTERM: `fence run` ends
/// with none of them left (exit 0, the leftovers named) — the scans of /proc alone lost this
/// race (review 8).
#[test]
fn fork_chains_left_behind_by_the_command_are_stopped() {
    let Some(run) = Chains::start(&["--ttl", "30s", "--kill-after", "200ms"], "exit 0") else {
        return;
    };
    // Bound, not moved as a whole: the crowd and the store live until the test ends.
    let Chains { dir, fence, .. } = run;
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
    let Some(run) = Chains::start(&["--ttl", "2s"], FOREVER) else {
        return;
    };
    let Chains {
        store, dir, fence, ..
    } = run;
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
    let Some(run) = Chains::start(&["--ttl", "30s"], FOREVER) else {
        return;
    };
    let Chains { dir, fence, .. } = run;
    let supervisor = read_pid(&dir.path().join("supervisor.pid"));
    let fence_pid = fence.id();
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
    let left = cells_of(&usable_base().expect("checked by Chains::start"), fence_pid);
    assert!(left.is_empty(), "left after the run: {left:?}");
    assert_nothing_outlived(&dir, ended, "after fence run ended");
}

/// fence is paused (SIGSTOP) and its lease runs out: the supervisor kills the chains at the
/// lease's bound, by its own clock; nothing writes after another owner's grant, and fence,
/// continued, exits 5.
#[test]
fn fork_chains_die_at_the_bound_while_fence_is_paused() {
    let Some(run) = Chains::start(&["--ttl", "2s"], FOREVER) else {
        return;
    };
    let Chains {
        store,
        mut dir,
        fence,
        ..
    } = run;
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

/// A run's cgroup left behind empty (fence and its supervisor killed together), with an empty
/// one below it, is removed by the next run's supervisor; one left with a process in a cgroup
/// below it is named by `fence doctor` (`host.run_leftovers`, with the way to stop them), and
/// kept.
#[test]
fn run_cgroups_left_behind_are_removed_or_named() {
    let Some(base) = usable_base() else { return };
    let store = Store::file();
    let ns = pid_namespace();
    let empty = base.join(format!("fence-run-{}-{ns}-0000000a", a_dead_pid()));
    let full = base.join(format!("fence-run-{}-{ns}-0000000b", a_dead_pid()));
    // An empty run cgroup with an empty one below it (a nested run's), and a full one whose
    // process is in a cgroup below it.
    std::fs::create_dir_all(empty.join("fence-run-1-1-00000001")).unwrap();
    std::fs::create_dir_all(full.join("worker")).unwrap();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    std::fs::write(full.join("worker/cgroup.procs"), sleeper.id().to_string()).unwrap();
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
        let _ = std::fs::remove_dir(full.join("worker"));
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

/// `cmd` (a fence command) run through `unshare --pid --fork --mount-proc`: in a pid namespace
/// of its own, where fence's pid is a small number like any other sandbox's. `None` where
/// this process may not make one.
fn in_a_pid_namespace(cmd: &std::process::Command) -> Option<std::process::Command> {
    let can = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !can {
        eprintln!("skipped: no pid namespace can be made here");
        return None;
    }
    let mut wrapped = std::process::Command::new("unshare");
    wrapped
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (key, value) in cmd.get_envs() {
        match value {
            Some(value) => wrapped.env(key, value),
            None => wrapped.env_remove(key),
        };
    }
    Some(wrapped)
}

/// Two runs, each in a pid namespace of its own (sandboxes) sharing one cgroup, where both
/// `fence run`s have the same pid: each command runs in a cgroup of its own run, and the
/// second run's `--max-time` kill leaves the first's command alone (a review: named by the
/// supervisor's pid alone, the second run had no cgroup and killed the first's command
/// through it).
#[test]
fn runs_in_two_pid_namespaces_that_share_a_cgroup_keep_to_their_own() {
    let Some(base) = usable_base() else { return };
    let store = Store::file();
    let dir = RunDir::new();
    let first = store.fence().args([
        "run",
        "first",
        "--format",
        "json",
        "--",
        "sh",
        "-c",
        &format!(
            "tail -1 /proc/self/cgroup > '{cg}'; sleep 3",
            cg = dir.file("first.cgroup")
        ),
    ]);
    let Some(mut first) = in_a_pid_namespace(&first.cmd) else {
        return;
    };
    let first = first.stdout(std::process::Stdio::piped()).spawn().unwrap();
    wait_for("the first run's command", Duration::from_secs(20), || {
        dir.path().join("first.cgroup").exists()
    });
    let second = store.fence().args([
        "run",
        "second",
        "--max-time",
        "1s",
        "--kill-after",
        "200ms",
        "--format",
        "json",
        "--",
        "sh",
        "-c",
        &format!(
            "trap '' TERM; tail -1 /proc/self/cgroup > '{cg}'; sleep 30",
            cg = dir.file("second.cgroup")
        ),
    ]);
    let second = in_a_pid_namespace(&second.cmd).unwrap().output().unwrap();
    let first = wait_output("the first run", first, Duration::from_secs(30));
    let cgroup = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
    let (a, b) = (cgroup("first.cgroup"), cgroup("second.cgroup"));
    eprintln!("first: {a}second: {b}");
    assert_eq!(
        second.status.code(),
        Some(124),
        "the second run, stopped by --max-time"
    );
    assert_eq!(
        first.status.code(),
        Some(0),
        "the first run's command was killed: {}",
        String::from_utf8_lossy(&first.stdout)
    );
    assert!(
        a.contains("/fence-run-") && b.contains("/fence-run-") && a != b,
        "{a} {b}"
    );
    let left: Vec<_> = [a, b]
        .iter()
        .map(|c| base.join(c.trim().rsplit('/').next().unwrap()))
        .filter(|cell| cell.exists())
        .collect();
    assert!(left.is_empty(), "left after the runs: {left:?}");
}

/// A run inside a run, the outer one stopped by `--max-time` (its kill takes the inner run
/// and its supervisor along), and a command that makes a cgroup of its own below its run's:
/// nothing is left under fence's cgroup (a review: a run cgroup with one below it could not be
/// removed, by anyone).
#[test]
fn nested_runs_and_the_command_s_own_cgroups_leave_nothing_behind() {
    let Some(base) = usable_base() else { return };
    let store = Store::file();
    let dir = RunDir::new();
    let fence_bin = store.fence().cmd.get_program().to_owned();
    let fence_bin = fence_bin.to_str().unwrap().to_owned();
    let outer = spawn_run(
        &store,
        &["--max-time", "1s", "--kill-after", "300ms"],
        &format!("exec '{fence_bin}' run inner -- sh -c 'trap \"\" TERM; sleep 30'"),
        &dir,
    );
    let outer_pid = outer.id();
    let out = wait_output("the outer run", outer, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(124), "{}", stderr_of(&dir));
    let own = spawn_run(
        &store,
        &[],
        "d=$(tail -1 /proc/self/cgroup | cut -d: -f3); d=\"$(grep ' - cgroup2 ' /proc/self/mountinfo | cut -d' ' -f5)$d\"; \
         mkdir \"$d/worker\" && sh -c \"echo \\$\\$ > '$d/worker/cgroup.procs'; exec sleep 0.2\"",
        &dir,
    );
    let own_pid = own.id();
    let out = wait_output(
        "the run whose command made a cgroup",
        own,
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&dir));
    wait_for("the runs' cgroups to go", Duration::from_secs(10), || {
        cells_of(&base, outer_pid).is_empty() && cells_of(&base, own_pid).is_empty()
    });
}

/// A signal sent to the supervisor's process group while the run waits for its lease (`kill
/// -HUP -- -PGID`): the command, once granted, still runs whole (a review: the process forked
/// in advance for it kept the signal pending and died of it at its exec, reported as the
/// command's death, exit 129, with a `run_started` on record). Until then `ps` shows that
/// process as `fence __command`, not as a second supervisor.
#[test]
fn a_signal_to_the_supervisor_s_group_while_waiting_is_not_the_command_s() {
    if usable_base().is_none() {
        return;
    }
    let store = Store::file();
    let dir = RunDir::new();
    let holder = store
        .fence()
        .args(["run", "job", "--ttl", "10s", "--", "sleep", "1.5"])
        .spawn();
    wait_for("the holder's lease", Duration::from_secs(20), || {
        store.lease("job").is_some_and(|(_, _, live)| live)
    });
    // With a run id, an interrupted run says so (it is not recorded as completed).
    let waiter = spawn_run(
        &store,
        &["--wait", "30s", "--id", "waited-1"],
        &format!(
            "echo ran > '{ran}'; sleep 0.3; echo done >> '{ran}'",
            ran = dir.file("ran")
        ),
        &dir,
    );
    let waiter_pid = waiter.id();
    let mut supervisor = 0;
    wait_for(
        "the waiter's supervisor and command process",
        Duration::from_secs(20),
        || {
            let children: Vec<u32> =
                std::fs::read_to_string(format!("/proc/{waiter_pid}/task/{waiter_pid}/children"))
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect();
            supervisor = children.first().copied().unwrap_or(0);
            supervisor != 0
                && std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children"))
                    .is_ok_and(|c| !c.trim().is_empty())
        },
    );
    let command: u32 =
        std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children"))
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
    // The forked process retitles itself just after the fork: read until it has (a single
    // read under load once saw the supervisor's own title, copied by the fork).
    let mut title = String::new();
    wait_for(
        "the command's process to take its title",
        Duration::from_secs(10),
        || {
            title = std::fs::read_to_string(format!("/proc/{command}/cmdline")).unwrap_or_default();
            title.starts_with("fence __command")
        },
    );
    // SAFETY: signals to the supervisor's process group.
    unsafe {
        for signal in [libc::SIGHUP, libc::SIGTERM, libc::SIGUSR1, libc::SIGUSR2] {
            libc::kill(-(supervisor as i32), signal);
        }
    }
    let out = wait_output("the waiting run", waiter, Duration::from_secs(30));
    let _ = wait_output("the holder", holder, Duration::from_secs(30));
    let ran = std::fs::read_to_string(dir.path().join("ran")).unwrap_or_default();
    assert!(
        title.starts_with("fence __command"),
        "the command's process before its exec: {title:?}"
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&dir));
    assert_eq!(ran, "ran\ndone\n", "the command ran whole");
    assert!(
        !stderr_of(&dir).contains("interrupted") && !stderr_of(&dir).contains("not recorded"),
        "the run is not an interrupted one: {}",
        stderr_of(&dir)
    );
    let (_, json) = outcome(&out);
    assert_eq!(json["exit_status"], 0, "{json}");
}

/// A command that sends SIGUSR1 and SIGUSR2 to its own process group (`kill -USR1 0`, as for
/// log rotation) — the group its supervisor leads: its run goes on (a review: the supervisor
/// took SIGUSR1 for fence's death and ended the run, exit 5 `supervisor_lost`).
#[test]
fn a_command_that_signals_its_own_group_keeps_its_run() {
    let store = Store::file();
    let dir = RunDir::new();
    let out = wait_output(
        "fence run",
        spawn_run(
            &store,
            &[],
            "trap 'echo usr1' USR1; trap 'echo usr2' USR2; kill -USR1 0; kill -USR2 0; sleep 0.3; echo done",
            &dir,
        ),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&dir));
    let (_, json) = outcome(&out);
    assert_eq!(json["exit_status"], 0, "{json}");
}

/// A command that cannot be started, run from a terminal: the caller gets the terminal's
/// foreground back, and its next read of the terminal works (a review: the supervisor had
/// taken it for its group, and the read failed with EIO).
#[test]
fn a_command_that_cannot_start_gives_the_terminal_back() {
    let store = Store::file();
    let fence = store.fence().cmd.get_program().to_str().unwrap().to_owned();
    let env: Vec<String> = store
        .fence()
        .cmd
        .get_envs()
        .filter_map(|(k, v)| Some(format!("{}='{}'", k.to_str()?, v?.to_str()?)))
        .collect();
    let script = format!(
        "{} '{fence}' run tt -- /nonexistent/command 2>/dev/null; echo rc=$?; if read x; then echo read-ok:$x; else echo read-failed; fi",
        env.join(" ")
    );
    let mut typist = std::process::Command::new("sh")
        .args(["-c", "sleep 1; echo typed"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = std::process::Command::new("script")
        .args(["-qec", &script, "/dev/null"])
        .stdin(typist.stdout.take().unwrap())
        .output();
    let _ = typist.wait();
    let Ok(out) = out else {
        eprintln!("skipped: no `script` to run it on a terminal");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("rc=2"), "{text}");
    assert!(text.contains("read-ok:typed"), "{text}");
}

/// `unshare --pid` without `--mount-proc`: /proc shows the pids of the namespace above, where
/// a run's pid means another process, or none. In such a namespace, a live run's cgroup is
/// neither swept by a second run's supervisor nor named by `fence doctor` as left behind (a
/// review saw both). The runs' pids are pushed past a thousand first, where the namespace
/// above has no process (checked), so that the bug would show.
#[test]
fn a_pid_namespace_without_its_own_proc_leaves_live_runs_alone() {
    let Some(base) = usable_base() else { return };
    let store = Store::file();
    let dir = RunDir::new();
    let can = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !can {
        eprintln!("skipped: no pid namespace can be made here");
        return;
    }
    let fenced = store.fence();
    let fence = fenced.cmd.get_program().to_str().unwrap().to_owned();
    let (cg, doctor) = (dir.file("first.cgroup"), dir.file("doctor.json"));
    let script = format!(
        "i=0; while [ $i -lt 1000 ]; do /bin/true; i=$((i+1)); done; \
         '{fence}' run first -- sh -c \"tail -1 /proc/self/cgroup > '{cg}'; sleep 2; echo done >> '{cg}'\" & \
         until grep -q fence-run- '{cg}' 2>/dev/null; do sleep 0.05; done; \
         '{fence}' run second -- true; echo second=$?; \
         '{fence}' doctor --format json > '{doctor}'; wait $!; echo first=$?"
    );
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--pid", "--fork", "setsid", "sh", "-c", &script]);
    for (k, v) in fenced.cmd.get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    let out = cmd.output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let seen = std::fs::read_to_string(&cg).unwrap_or_default();
    let name = seen
        .lines()
        .next()
        .unwrap_or_default()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let pid: u32 = name
        .strip_prefix("fence-run-")
        .and_then(|rest| rest.split('-').next()?.parse().ok())
        .unwrap_or(0);
    if pid == 0 || Path::new(&format!("/proc/{pid}")).exists() {
        eprintln!(
            "skipped: the first run's pid ({pid}, {name:?}) names a process of this namespace too"
        );
        return;
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&doctor).unwrap_or_default())
            .unwrap_or_default();
    let cell = base.join(&name);
    let named = json["findings"].as_array().into_iter().flatten().any(|f| {
        f["check"] == "host.run_leftovers"
            && f["message"]
                .as_str()
                .unwrap_or_default()
                .contains(&cell.display().to_string())
    });
    assert!(said.contains("second=0"), "{said}");
    assert!(
        said.contains("first=0"),
        "the live run was disturbed: {said}"
    );
    assert!(
        seen.ends_with("done\n"),
        "the first run's command did not finish: {seen:?}"
    );
    assert!(!named, "doctor named a live run as left behind: {json}");
}

/// Whether this process has a child that ended and was not waited for (a zombie).
fn has_a_zombie_child() -> bool {
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid on our own children, without reaping (WNOWAIT) or blocking.
    let found = unsafe {
        libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: the pid field of a siginfo filled by waitid.
    found == 0 && unsafe { info.si_pid() } != 0
}

/// This test process as a subreaper: what fence leaves behind when it exits becomes ours,
/// where a zombie would otherwise go to init (which, in a container, may never reap it).
/// Busy runs and commands that cannot be started leave no zombie and no cgroup (a review: one
/// or two zombies each, and the cgroup on most failed execs); a run killed while it waits for
/// its lease has its cgroup removed by its supervisor.
#[test]
fn busy_runs_failed_execs_and_killed_waiters_leave_nothing_behind() {
    let Some(base) = usable_base() else { return };
    // SAFETY: a flag of this process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let store = Store::file();
    let holder = store
        .fence()
        .args(["run", "job", "--ttl", "30s", "--", "sleep", "30"])
        .spawn();
    let holder_pid = holder.id();
    wait_for("the holder's lease", Duration::from_secs(20), || {
        store.lease("job").is_some_and(|(_, _, live)| live)
    });
    let mut pids = Vec::new();
    for i in 0..6 {
        let args: Vec<&str> = if i % 2 == 0 {
            vec!["run", "job", "--", "true"]
        } else {
            vec!["run", "other", "--", "/nonexistent/command"]
        };
        let mut fence = store.fence().args(&args);
        let child = fence
            .cmd
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        pids.push(child.id());
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(if i % 2 == 0 { 3 } else { 2 }),
            "{args:?}"
        );
    }
    std::thread::sleep(Duration::from_millis(200));
    let zombie = has_a_zombie_child();
    let left: Vec<PathBuf> = pids.iter().flat_map(|&p| cells_of(&base, p)).collect();
    let waiter = store
        .fence()
        .args(["run", "job", "--wait", "30s", "--", "true"])
        .spawn();
    let waiter_pid = waiter.id();
    wait_for("the waiter's cgroup", Duration::from_secs(20), || {
        !cells_of(&base, waiter_pid).is_empty()
    });
    kill(waiter_pid, libc::SIGKILL);
    let _ = wait_output("the waiter, killed", waiter, Duration::from_secs(10));
    let removed = common::process::becomes(Duration::from_secs(10), || {
        cells_of(&base, waiter_pid).is_empty()
    });
    kill(holder_pid, libc::SIGTERM);
    let _ = wait_output("the holder", holder, Duration::from_secs(30));
    // What fence left to this subreaper is reaped before the test ends.
    while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
    assert!(
        !zombie,
        "a zombie was left to this subreaper by busy runs or failed execs"
    );
    assert!(left.is_empty(), "cgroups left: {left:?}");
    assert!(
        removed,
        "the killed waiter's cgroup is still there: {:?}",
        cells_of(&base, waiter_pid)
    );
}

/// A `fence run` that a shell exec'd after starting a job of its own (`sh -c 'job & exec fence
/// run …'`): the job is fence's child, but not the run's. The run ends with its command, the
/// job untouched and not called a leftover (a review: fence stopped it, SIGTERM then SIGKILL
/// after `--kill-after`, and said the command had left it running).
#[test]
fn children_fence_had_before_the_run_are_not_its_leftovers() {
    let store = Store::file();
    let dir = RunDir::new();
    let fenced = store.fence();
    let script = format!(
        "sleep 30 >/dev/null 2>&1 & echo $! > '{job}'; exec '{fence}' run inherited --kill-after 5s -- true",
        job = dir.file("job.pid"),
        fence = fenced.cmd.get_program().to_str().unwrap()
    );
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", &script]);
    for (k, v) in fenced.cmd.get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    let started = std::time::Instant::now();
    let out = cmd.output().unwrap();
    let took = started.elapsed();
    let job = read_pid(&dir.path().join("job.pid"));
    let alive = !is_gone(job);
    kill(job, libc::SIGKILL);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("left processes running"), "{stderr}");
    assert!(alive, "the shell's own job was stopped with the run");
    assert!(
        took < Duration::from_secs(4),
        "the run took {took:?}: it waited for the job"
    );
}

/// fence goes on once its supervisor reports the command's end, without waiting for the
/// supervisor's own exit, only when the run's cgroup is empty. A command running as root can
/// write a whole report into the supervisor's report pipe (through /proc/PID/fd, at the
/// number the supervisor's title shows) while it keeps running: that forged report must not
/// end the run. The command forges one saying it ended with status 0, works on for a second
/// (a snapshot of the store's history then), and exits 5: fence exits 5 when it does, and the
/// lease was not released while it ran.
#[test]
fn a_report_forged_by_the_command_does_not_end_its_run() {
    let Some(_) = usable_base() else { return };
    let store = Store::file();
    let dir = RunDir::new();
    let history = store.dir().join("events").join("job.jsonl");
    let script = format!(
        "fd=$(cut -d' ' -f4 /proc/$PPID/cmdline) && printf 'status 0\\nended\\n' > /proc/$PPID/fd/$fd \
         && echo forged > '{forged}' && sleep 1 && cp '{history}' '{snapshot}' && exit 5",
        forged = dir.file("forged"),
        history = history.display(),
        snapshot = dir.file("history-while-running"),
    );
    let fence = spawn_run(&store, &["--ttl", "10s"], &script, &dir);
    let out = wait_output("fence run", fence, Duration::from_secs(30));
    assert!(
        dir.path().join("forged").exists(),
        "the command could not forge its report: {}",
        stderr_of(&dir)
    );
    assert_eq!(out.status.code(), Some(5), "{}", stderr_of(&dir));
    let snapshot = std::fs::read_to_string(dir.path().join("history-while-running"))
        .expect("the command ran to its end");
    assert!(
        snapshot.contains("\"acquired\"") && !snapshot.contains("\"released\""),
        "the lease was released while the command ran: {snapshot}"
    );
    let kinds: Vec<String> = store.events("job").into_iter().map(|e| e.0).collect();
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("released"),
        "{kinds:?}"
    );
}

/// fence reads its supervisor's report pipe while the command runs (to go on as soon as the
/// report comes). A command running as root that floods that pipe (through /proc/PID/fd) for
/// three seconds, under a two-second lease, keeps neither fence from renewing the lease nor
/// its memory bounded: the run ends with the command's status, its lease never lost (a review
/// lost it when every read re-parsed all that had been read, before the timers).
#[test]
fn a_command_flooding_its_supervisors_report_pipe_does_not_cost_the_lease() {
    let Some(_) = usable_base() else { return };
    let store = Store::file();
    let dir = RunDir::new();
    let script = format!(
        "r=$PPID; fd=$(cut -d' ' -f4 /proc/$r/cmdline) && echo flooding > '{flooding}' \
         && timeout 3 yes 0123456789abcdef > /proc/$r/fd/$fd; exit 7",
        flooding = dir.file("flooding"),
    );
    let fence = spawn_run(&store, &["--ttl", "2s"], &script, &dir);
    let out = wait_output("fence run", fence, Duration::from_secs(30));
    assert!(
        dir.path().join("flooding").exists(),
        "the command did not start its flood: {}",
        stderr_of(&dir)
    );
    assert_eq!(out.status.code(), Some(7), "{}", stderr_of(&dir));
    let kinds: Vec<String> = store.events("job").into_iter().map(|e| e.0).collect();
    assert!(
        kinds.iter().filter(|k| *k == "renewed").count() >= 3
            && kinds.last().map(String::as_str) == Some("released"),
        "{kinds:?}"
    );
}
