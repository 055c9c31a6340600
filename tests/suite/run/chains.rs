//! What the containment tests of `fence run` share: a run's directory and a *fork chain*: a
//! small C program (compiled here with `cc`; the test is skipped without one) that forks its successor and exits, again and again, so that at any
//! instant one process of the chain exists, each living for well under a millisecond. A scan
//! of /proc followed by a kill of the pids it found (what `sys::kill_descendants_once` does)
//! finds a process that has already handed over to its successor. The chain appends a
//! wall-clock timestamp (ns) to its file every 20 ms, stops on its own once a stop file
//! exists or after a minute, and so never outlives the test for long, whatever fence does.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::process::{kill, processes_with};
use common::{wait_for, Store};

/// Starts `count` idle processes outside any run, from a directory of their own (so that they
/// are not taken for the run's: see [`RunDir::processes`]), ending after a minute or when the
/// returned directory is dropped: /proc then holds as many processes as a busy server's, and a
/// scan of it takes long enough for a fork chain to outrun it every time (with the ~70
/// processes of a test machine, the scans catch a chain within a few rounds). `chain` is the
/// fork chain's binary ([`RunDir::chain`]).
pub(super) fn crowd(chain: &str, count: usize) -> RunDir {
    let crowd = RunDir::new();
    let binary = crowd.file("crowd");
    std::fs::copy(chain, &binary).unwrap();
    let status = std::process::Command::new(&binary)
        .args([
            &crowd.file("ready"),
            &crowd.file("stop"),
            "3",
            &count.to_string(),
        ])
        .status()
        .unwrap();
    assert!(status.success(), "the crowd: {status:?}");
    crowd
}

/// The fork chain (see the module's documentation). `chain OUT STOP MODE LIFETIME_S`; MODE 0
/// stays in its process group, 1 calls setsid in every generation, 2 calls it once, first;
/// MODE 3 is no chain but a crowd: LIFETIME_S idle processes (see [`RunDir::crowd`]).
pub(super) const CHAIN_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc != 5) return 2;
    int fd = open(argv[1], O_WRONLY | O_APPEND | O_CREAT, 0644);
    const char *stop = argv[2];
    int mode = atoi(argv[3]);
    long lifetime = atol(argv[4]);
    struct timespec t0, now, last = {0, 0};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (mode == 3) {
        /* A crowd: LIFETIME_S idle processes (each ends after a minute), then one line. */
        for (long i = 0; i < lifetime; i++) {
            pid_t p = fork();
            if (p == 0) {
                alarm(60);
                for (;;) pause();
            }
        }
        if (write(fd, "0\n", 2) < 0) return 1;
        return 0;
    }
    if (mode == 2) {
        pid_t p = fork();
        if (p != 0) _exit(0);
        setsid();
    }
    for (;;) {
        pid_t p = fork();
        if (p < 0) { usleep(1000); continue; }
        if (p > 0) _exit(0);
        if (mode == 1) setsid();
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > lifetime) _exit(0);
        long since = (now.tv_sec - last.tv_sec) * 1000000000L + (now.tv_nsec - last.tv_nsec);
        if (since > 20000000L) {
            last = now;
            if (access(stop, F_OK) == 0) _exit(0);
            struct timespec w;
            clock_gettime(CLOCK_REALTIME, &w);
            char buf[64];
            int len = snprintf(buf, sizeof buf, "%lld%09ld\n", (long long)w.tv_sec, w.tv_nsec);
            if (write(fd, buf, len) < 0) _exit(1);
        }
    }
}
"#;

/// A run's directory: the command's files, and the marker of its processes (the directory's
/// path is on every one's command line).
pub(super) struct RunDir {
    dir: tempfile::TempDir,
    /// Processes to continue (SIGCONT) when the test ends: a paused fence.
    pub(super) paused: Vec<u32>,
}

impl RunDir {
    pub(super) fn new() -> RunDir {
        RunDir {
            dir: tempfile::tempdir().unwrap(),
            paused: Vec::new(),
        }
    }

    pub(super) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The absolute path of `name` in the directory, as a shell word (no quote in it).
    pub(super) fn file(&self, name: &str) -> String {
        let path: PathBuf = self.path().join(name);
        let text = path.to_str().unwrap().to_owned();
        assert!(!text.contains('\''), "{text}");
        text
    }

    pub(super) fn processes(&self) -> Vec<u32> {
        processes_with(self.path().to_str().unwrap())
    }

    /// The fork chain's binary, compiled into the directory; `None` without a C compiler.
    pub(super) fn chain(&self) -> Option<String> {
        let source = self.path().join("chain.c");
        std::fs::write(&source, CHAIN_C).unwrap();
        let binary = self.file("chain");
        let built = std::process::Command::new("cc")
            .args(["-O2", "-o", &binary])
            .arg(&source)
            .status();
        match built {
            Ok(status) if status.success() => Some(binary),
            other => {
                eprintln!("skipped: no C compiler to build the fork chain ({other:?})");
                None
            }
        }
    }

    /// The timestamps (ns since the epoch) in `name`, whole lines only.
    pub(super) fn stamps(&self, name: &str) -> Vec<i128> {
        let text = std::fs::read_to_string(self.path().join(name)).unwrap_or_default();
        let whole = match text.rfind('\n') {
            Some(end) => &text[..end],
            None => "",
        };
        whole
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Stops every process of the run: the chains by their stop file (a kill by pid races
    /// them as it races fence), the rest by SIGKILL; a paused fence is continued.
    pub(super) fn clean_up(&self) {
        let _ = std::fs::write(self.path().join("stop"), b"");
        for pid in &self.paused {
            kill(*pid, libc::SIGCONT);
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            let left = self.processes();
            if left.is_empty() {
                return;
            }
            if start.elapsed() > Duration::from_millis(500) {
                for pid in left {
                    kill(pid, libc::SIGKILL);
                    kill(pid, libc::SIGCONT);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        self.clean_up();
    }
}

pub(super) fn wall_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128
}

/// `fence run job ARGS --format json -- sh -c SCRIPT` in the run's directory, stderr to the
/// run's `stderr` file.
pub(super) fn spawn_run(store: &Store, args: &[&str], script: &str, dir: &RunDir) -> Child {
    spawn_run_with(store, args, script, dir, |_| {})
}

/// [`spawn_run`], with `hook` to change fence's command first.
pub(super) fn spawn_run_with(
    store: &Store,
    args: &[&str],
    script: &str,
    dir: &RunDir,
    hook: impl Fn(&mut std::process::Command),
) -> Child {
    let mut fence = store
        .fence()
        .args(["run", "job", "--format", "json"])
        .args(args)
        .args(["--", "sh", "-c", script]);
    let stderr = std::fs::File::create(dir.path().join("stderr")).unwrap();
    fence
        .cmd
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr);
    hook(&mut fence.cmd);
    fence.cmd.spawn().unwrap()
}

pub(super) fn stderr_of(dir: &RunDir) -> String {
    std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default()
}

/// fence's exit code and its JSON object (null when stdout holds none).
pub(super) fn outcome(out: &std::process::Output) -> (Option<i32>, serde_json::Value) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null);
    (out.status.code(), json)
}

pub(super) fn count_events(store: &Store, kind: &str) -> usize {
    store
        .events("job")
        .iter()
        .filter(|(k, _, _)| k == kind)
        .count()
}

/// Waits until the lease is no longer live by the store's own clock.
pub(super) fn wait_expired(store: &Store) {
    wait_for(
        "the run's lease to expire by the store's clock",
        Duration::from_secs(60),
        || store.lease("job").is_some_and(|(_, _, live)| !live),
    );
}

/// Another owner acquires the lease, which must be granted: when the acquire was sent (a
/// lower bound of the grant) and the token.
pub(super) fn take_over(store: &Store) -> (i128, i64) {
    let sent = wall_ns();
    let token = store
        .fence()
        .acquire("job", &["--owner", "contender", "--ttl", "1m"])
        .token;
    (sent, token)
}

/// Whether `pid` holds a `flock` (the directory store holds one per operation).
pub(super) fn holds_a_lock(pid: u32) -> bool {
    std::fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .filter(|line| !line.contains("->"))
        .any(|line| line.split_whitespace().nth(4) == Some(pid.to_string().as_str()))
}

/// Pauses fence (SIGSTOP) between two of its operations on the store (paused inside one, it
/// would hold the resource's lock file, and with it every contender, for as long).
pub(super) fn pause_between_operations(pid: u32) {
    loop {
        kill(pid, libc::SIGSTOP);
        wait_for("fence to stop", Duration::from_secs(10), || {
            common::process::state(pid) == Some('T')
        });
        if !holds_a_lock(pid) {
            return;
        }
        kill(pid, libc::SIGCONT);
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The chains' timestamps written at or after `since` (ns), from the files `chain1`…
pub(super) fn chain_writes_after(dir: &RunDir, chains: usize, since: i128) -> Vec<i128> {
    (1..=chains)
        .flat_map(|i| dir.stamps(&format!("chain{i}")))
        .filter(|&at| at >= since)
        .collect()
}

/// A script that starts `chains` fork chains of `mode` in the background, writes its pid to
/// `cmd.pid` and waits, SIGTERM ignored.
pub(super) fn chains_script(dir: &RunDir, chain: &str, chains: usize, mode: u8) -> String {
    let mut script = "trap '' TERM; ".to_owned();
    for i in 1..=chains {
        script.push_str(&format!(
            "'{chain}' '{out}' '{stop}' {mode} 60 & ",
            out = dir.file(&format!("chain{i}")),
            stop = dir.file("stop"),
        ));
    }
    script.push_str(&format!(
        "echo $$ > '{pid}'; while :; do sleep 0.05; done",
        pid = dir.file("cmd.pid")
    ));
    script
}

pub(super) fn wait_chains_write(dir: &RunDir, chains: usize) {
    wait_for("the chains to write", Duration::from_secs(20), || {
        (1..=chains).all(|i| !dir.stamps(&format!("chain{i}")).is_empty())
    });
}
