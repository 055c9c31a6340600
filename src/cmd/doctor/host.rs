//! `fence doctor`'s checks of this host: how much of what `fence run`'s command starts it lets
//! fence contain.

use super::{Findings, Severity};

/// How much of what `fence run`'s command starts this host lets fence find and stop (see
/// `fence run --help`): fence and its supervisor are subreapers, so every process the command
/// forks stays their descendant, found by its parent links in /proc, whatever process group or
/// session it moves to; the bounds are kept on CLOCK_BOOTTIME, which counts a suspend.
pub(super) fn containment(f: &mut Findings<'_>) {
    let check = "host.run_containment";
    // Set, read back, and cleared again.
    use rustix::process::{child_subreaper, getpid, set_child_subreaper};
    let set = set_child_subreaper(Some(getpid())).is_ok();
    let subreaper = set && matches!(child_subreaper(), Ok(Some(_)));
    let _ = set_child_subreaper(None);
    let proc_ok = std::fs::read_to_string("/proc/self/stat").is_ok();
    let boottime = crate::sys::boottime_ns().is_some();
    let limits = "not contained: processes started through another service (systemd-run, at, ssh, a container runtime), and a command that stops both `fence run` and its supervisor (`kill -STOP -1`)";
    match (subreaper, proc_ok, boottime) {
        (true, true, true) => f.add(
            check,
            Severity::Ok,
            format!("fence run contains every descendant: each process the command forks, also after setsid or a double fork, is stopped before the lease can pass to another owner; {limits}"),
            "",
        ),
        (true, true, false) => f.add(
            check,
            Severity::Warn,
            format!("fence run contains every descendant, but CLOCK_BOOTTIME cannot be read: a machine suspended while a command runs is not counted against its lease; {limits}"),
            "use a kernel of Linux 2.6.39 or later",
        ),
        (_, false, _) => f.add(
            check,
            Severity::Fail,
            "/proc cannot be read: fence run cannot find the command's processes (nor start its supervisor, /proc/self/exe)".to_owned(),
            "mount /proc (`mount -t proc proc /proc`) where fence runs",
        ),
        (false, true, _) => f.add(
            check,
            Severity::Warn,
            format!("process group only: this kernel refuses PR_SET_CHILD_SUBREAPER, so a process of the command that leaves its group (setsid, a double fork) may outlive the lease; {limits}"),
            "use Linux 3.4 or later (or a seccomp policy that allows prctl)",
        ),
    }
}
