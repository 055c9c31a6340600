//! `fence run` waits for the orphans its command leaves as soon as they end: a command that
//! keeps starting short-lived processes it does not wait for itself (`( job & )`, a daemon
//! that double-forks its workers) hands each one to the reaper, its subreaper, and one the
//! reaper did not wait for stayed a zombie until the command ended. About 900 a second piled
//! up that way (measured: 1,745 after two seconds), holding their pids: on a host with the
//! default `pid_max` of 32,768 the whole machine could fork nothing within half a minute.
//! fence, the subreaper of the reaper's own orphans, must not pile them up either.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::process::{is_gone, kill, parent_of, processes_with, read_pid, Reap};
use common::{wait_for, wait_output, Store};

/// How many orphans the command starts before the test lets it stop: with the bug they
/// are as many zombies by then, far above [`MOST_ZOMBIES`].
const ORPHANS: u64 = 3_000;

/// The most zombie children the reaper (or fence) may have at any look. A zombie lives from
/// its exit to the reaper's next turn (a SIGCHLD wakes it): the reaper was seen with at most
/// 20 at once in 17 runs on two cores (5 alone, 12 four at a time beside two busy loops;
/// fence never had one), so five times that. At the rate above it allows the reaper a tenth
/// of a second off the cores; with the bug the test fails after the first few hundred orphans.
const MOST_ZOMBIES: usize = 100;

/// How the processes of the run are found and stopped, whatever the outcome: the run's
/// directory is on the command line of fence, the reaper, the command and every fork of it.
struct RunDir(tempfile::TempDir);

impl RunDir {
    fn file(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    fn word(&self, name: &str) -> String {
        let text = self.file(name).to_str().unwrap().to_owned();
        assert!(!text.contains('\''), "{text}");
        text
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        for pid in processes_with(self.0.path().to_str().unwrap()) {
            kill(pid, libc::SIGKILL);
        }
    }
}

/// The zombie children of `parent`, from /proc.
fn zombie_children(parent: u32) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            let mut fields = stat
                .rsplit_once(") ")
                .map_or("", |(_, rest)| rest)
                .split(' ');
            let zombie = fields.next() == Some("Z");
            zombie && fields.next().and_then(|p| p.parse().ok()) == Some(parent)
        })
        .count()
}

/// How many orphans the command has started so far (it writes its count every hundred).
fn started(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0)
}

/// The command starts a daemon (`sleep`, left to the reaper), then orphans that end at once,
/// one after the other, until the test says stop; then waits for the test's word to exit 7.
/// While it runs, the reaper and fence never hold more than [`MOST_ZOMBIES`] zombies, and
/// none once the orphans stop; the run ends with the command's status, the daemon is found
/// among hundreds of reaped orphans and stopped as a leftover, and the lease is released.
#[test]
fn orphans_that_end_are_reaped_while_the_command_runs() {
    let store = Store::file();
    let dir = RunDir(tempfile::tempdir().unwrap());
    let script = format!(
        "echo $PPID > '{reaper}'; ( sleep 600 & echo $! > '{daemon}' ); i=0; \
         while [ ! -e '{stop}' ]; do ( true & ); i=$((i+1)); \
         case $i in *00) echo $i > '{count}';; esac; done; \
         echo > '{stopped}'; while [ ! -e '{exit}' ]; do sleep 0.02; done; exit 7",
        reaper = dir.word("reaper.pid"),
        daemon = dir.word("daemon.pid"),
        stop = dir.word("stop"),
        count = dir.word("count"),
        stopped = dir.word("stopped"),
        exit = dir.word("exit"),
    );
    let mut fence = store
        .fence()
        .args(["run", "job", "--format", "json", "--kill-after", "1s"])
        .args(["--", "sh", "-c", &script]);
    fence
        .cmd
        .current_dir(dir.0.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let fence = fence.cmd.spawn().unwrap();
    let fence_pid = fence.id();
    let reaper = read_pid(&dir.file("reaper.pid"));
    let daemon = read_pid(&dir.file("daemon.pid"));
    let _reap = Reap(vec![daemon]);
    // The premise: an orphan of the command is handed to the reaper.
    wait_for(
        "the daemon to be handed to the reaper",
        Duration::from_secs(20),
        || parent_of(daemon) == reaper,
    );

    let mut most = (0, 0);
    wait_for(
        &format!("the command to start {ORPHANS} orphans"),
        Duration::from_secs(120),
        || {
            let now = (zombie_children(reaper), zombie_children(fence_pid));
            most = (most.0.max(now.0), most.1.max(now.1));
            // Given up at once: with the bug every further orphan stays a zombie.
            assert!(
                now.0 <= MOST_ZOMBIES && now.1 <= MOST_ZOMBIES,
                "zombies pile up while the command runs: the reaper has {}, fence {} (after {} orphans)",
                now.0,
                now.1,
                started(&dir.file("count"))
            );
            started(&dir.file("count")) >= ORPHANS
        },
    );
    eprintln!(
        "at most {} zombie children of the reaper and {} of fence at any look, over {} orphans",
        most.0,
        most.1,
        started(&dir.file("count"))
    );

    std::fs::write(dir.file("stop"), "").unwrap();
    wait_for(
        "the command to stop starting orphans",
        Duration::from_secs(20),
        || dir.file("stopped").exists(),
    );
    wait_for(
        "the reaper to have no zombie child left",
        Duration::from_secs(20),
        || zombie_children(reaper) == 0,
    );
    assert!(!is_gone(reaper), "the premise: the command still runs");
    assert_eq!(zombie_children(fence_pid), 0, "fence has zombie children");

    std::fs::write(dir.file("exit"), "").unwrap();
    let out = wait_output("fence run", fence, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert!(
        stderr.contains("note: the command left processes running when it ended"),
        "the daemon was not found among the reaped orphans: {stderr}"
    );
    assert!(is_gone(daemon), "the daemon outlived the run");
    let view = store
        .fence()
        .args(["inspect", "job", "--format", "json"])
        .run()
        .expect(0)
        .json()["resources"][0]
        .clone();
    assert_eq!(
        (view["state"].as_str(), view["token"].as_i64()),
        (Some("free"), Some(1)),
        "the lease was not released: {view}"
    );
}
