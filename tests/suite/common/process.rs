//! Helpers for tests of processes: whether one still runs, a pid a command wrote down, a
//! signal sent to it, its parent, and the processes a test leaves behind.

use std::path::Path;

/// Gone, or a zombie: no longer running either way.
pub fn is_gone(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    matches!(
        stat.rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next()),
        Some('Z') | Some('X')
    )
}

/// The pid a command wrote to `path` (`echo $! > path`). A shell creates the file before it
/// writes the line, so a test that waited for the file to exist can read it empty: wait for the
/// whole line (under load this takes a scheduling slice or two; 20 s is far above any seen).
pub fn read_pid(path: &Path) -> u32 {
    let start = std::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = text.strip_suffix('\n') {
            return line
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("{}: {line:?} is not a pid: {e}", path.display()));
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "{} did not get a whole line in 20 s: {text:?}",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A process's state letter from /proc (`R`, `S`, `T` stopped, `Z`…), or `None` once gone.
pub fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
}

/// Stops `pid` (SIGSTOP) and waits until it is stopped.
#[track_caller]
pub fn stop(pid: u32) {
    kill(pid, libc::SIGSTOP);
    assert!(
        becomes(std::time::Duration::from_secs(10), || state(pid)
            == Some('T')),
        "process {pid} did not stop on SIGSTOP"
    );
}

/// Continues `pid`, stopped by [`stop`], once `at` has come (now, if it has), checking that
/// it stayed stopped until then.
#[track_caller]
pub fn continue_at(pid: u32, at: std::time::Instant) {
    std::thread::sleep(at.saturating_duration_since(std::time::Instant::now()));
    assert_eq!(
        state(pid),
        Some('T'),
        "process {pid} ran while it had to be stopped"
    );
    kill(pid, libc::SIGCONT);
}

/// `signal` to a process the test started.
pub fn kill(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc::kill(pid as i32, signal) };
}

/// The parent of a running process, from /proc.
pub fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(") ").unwrap();
    rest.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Whether `signal` is pending for process `pid`: sent, and not yet taken by a handler (nor
/// by the default action) in any of its threads, from /proc.
pub fn signal_pending(pid: u32, signal: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let bit = 1u64 << (signal - 1);
    status.lines().any(|line| {
        line.strip_prefix("ShdPnd:")
            .or_else(|| line.strip_prefix("SigPnd:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .is_some_and(|mask| mask & bit != 0)
    })
}

/// Whether `check` holds at some point within `limit` (polled every 20 ms).
pub fn becomes(limit: std::time::Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if check() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    check()
}

/// SIGKILLs the processes a test left behind (those still running), whatever its outcome.
pub struct Reap(pub Vec<u32>);

impl Drop for Reap {
    fn drop(&mut self) {
        for pid in &self.0 {
            if !is_gone(*pid) {
                kill(*pid, libc::SIGKILL);
            }
        }
    }
}

/// The live processes whose command line holds `marker` (a reaper's holds its command's).
pub fn processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(marker) && !is_gone(pid) {
            found.push(pid);
        }
    }
    found
}
