//! `fence doctor`'s checks of this host: how much of what `fence run`'s command starts it lets
//! fence contain.

use std::path::Path;

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

/// Whether `fence run` can give its command a cgroup of its own here (see `reaper::cgroup`),
/// tried as a run does it: a scratch cgroup made under this process's, a process forked into
/// it (`clone3`, else forked and moved in), killed through `cgroup.kill`, the cgroup removed.
/// And the run cgroups there whose `fence run` is gone with processes still in them (or in
/// cgroups below them): work of a run that outlived it (`fence run` and its supervisor both
/// killed).
pub(super) fn run_cgroup(f: &mut Findings<'_>) {
    use crate::reaper::cgroup;
    let check = "host.run_cgroup";
    let Some(base) = cgroup::base() else {
        f.add(
            check,
            Severity::Warn,
            "fence finds no cgroup v2 directory of its own here (cgroup v1 only, no cgroup2 mount, or this process's cgroup outside the one mounted): fence run contains its command by scanning /proc, which a fork chain (a process that forks its successor and exits, in a new session each time, or in the supervisor's process group) can outrun".to_owned(),
            "use a system with the unified cgroup hierarchy (cgroup v2; Debian 11 and later by default), with it mounted where fence runs",
        );
        return;
    };
    match try_run_cgroup(&base) {
        Ok(how) => f.add(
            check,
            Severity::Ok,
            format!(
                "fence run gives its command a cgroup of its own under {} ({how}): everything the command starts is killed at once when it must stop, however it forks; not contained: a command running as root, or as the user the cgroup is delegated to, that moves itself to another cgroup",
                base.display()
            ),
            "",
        ),
        Err(why) => f.add(
            check,
            Severity::Warn,
            format!(
                "fence run cannot give its command a cgroup of its own under {} ({why}): it contains the command by scanning /proc, which a fork chain (a process that forks its successor and exits, in a new session each time, or in the supervisor's process group) can outrun",
                base.display()
            ),
            "run fence as root, or in a cgroup delegated to its user (systemd: `Delegate=yes` in the unit, or `systemd-run --user --scope -p Delegate=yes fence run …`), on cgroup v2 with Linux 5.14 or later (cgroup.kill)",
        ),
    }
    let here = cgroup::namespace_here();
    for run in cgroup::runs(&base) {
        if run.gone(here) != Some(true) || run.dir.to_string_lossy().contains(cgroup::DOCTOR_PREFIX)
        {
            continue;
        }
        let members = cgroup::members(&run.dir);
        if members.is_empty() {
            continue;
        }
        let pids: Vec<String> = members.iter().map(|p| p.to_string()).collect();
        f.add(
            "host.run_leftovers",
            Severity::Warn,
            format!(
                "{} holds {} process(es) of a fence run (pid {}) that is gone: pid {}; they may still act on a lease that has passed to another owner",
                run.dir.display(),
                members.len(),
                run.pid,
                pids.join(", ")
            ),
            &format!(
                "see what they are (`ps -o pid,user,lstart,cmd -p {}`), then stop them all: `echo 1 > {}/cgroup.kill`",
                pids.join(","),
                run.dir.display()
            ),
        );
    }
}

/// A scratch cgroup made, a process forked into it, killed through it, removed: how the
/// process got in, or why not, step named.
fn try_run_cgroup(base: &Path) -> Result<&'static str, String> {
    let dir = base.join(crate::reaper::cgroup::unique_name(
        crate::reaper::cgroup::DOCTOR_PREFIX,
    ));
    std::fs::create_dir(&dir).map_err(|err| format!("cannot make a cgroup: {err}"))?;
    let tried = (|| {
        if !dir.join("cgroup.kill").exists() {
            return Err("no cgroup.kill: Linux before 5.14".to_owned());
        }
        let opened = rustix::fs::open(
            &dir,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|err| format!("cannot open it: {err}"))?;
        let (pid, how) = match crate::reaper::starter::clone_into(&opened) {
            Ok(pid) => (pid, "forked into it"),
            // SAFETY: the child only waits to be killed (async-signal-safe calls).
            Err(_) => (
                unsafe { libc::fork() },
                "forked and moved in: clone3 refused",
            ),
        };
        if pid == 0 {
            // SAFETY: async-signal-safe calls only, in the child; it ends within a minute
            // whatever happens.
            unsafe {
                libc::alarm(60);
                loop {
                    libc::pause();
                }
            }
        }
        if pid < 0 {
            return Err(format!("cannot fork: {}", std::io::Error::last_os_error()));
        }
        let write = |file: &str, what: &str| crate::reaper::cgroup::write_to(&dir, file, what);
        let inside = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| {
            c.lines()
                .any(|l| l.starts_with("0::") && dir.ends_with(l[3..].trim_start_matches('/')))
        });
        let moved = if inside {
            Ok(())
        } else {
            write("cgroup.procs", &pid.to_string())
                .map_err(|err| format!("cannot move a process into it: {err}"))
        };
        let killed = moved.and_then(|()| {
            write("cgroup.kill", "1").map_err(|err| format!("cannot kill through it: {err}"))
        });
        if killed.is_err() {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        killed?;
        if waited == pid && libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL {
            Ok(how)
        } else {
            Err(format!("cgroup.kill did not kill (status {status})"))
        }
    })();
    let start = std::time::Instant::now();
    while std::fs::remove_dir(&dir).is_err() && start.elapsed().as_millis() < 200 {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    tried
}
