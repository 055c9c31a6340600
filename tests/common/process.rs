//! Helpers for tests of processes: whether one still runs, a pid a command wrote down, a
//! signal sent to it.

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

/// The pid a command wrote to `path`.
pub fn read_pid(path: &Path) -> u32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// `signal` to a process the test started.
pub fn kill(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc::kill(pid as i32, signal) };
}
