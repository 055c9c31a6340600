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
/// tried as a run does it: a `fence-run-<pid>` cgroup made under this process's, a process
/// (`sleep`) moved into it, killed through `cgroup.kill`, the cgroup removed. And the run
/// cgroups there whose supervisor is gone with processes still in them: work of a run that
/// outlived it (`fence run` and its supervisor both killed).
pub(super) fn run_cgroup(f: &mut Findings<'_>) {
    use crate::reaper::cgroup;
    let check = "host.run_cgroup";
    let Some(base) = cgroup::base() else {
        f.add(
            check,
            Severity::Warn,
            "no cgroup v2 here (cgroup v1 only, or /proc/self/cgroup unreadable): fence run contains its command by scanning /proc, which a fork chain (a process that forks its successor and exits, in a new session each time, or in the supervisor's process group) can outrun".to_owned(),
            "use a system with the unified cgroup hierarchy (cgroup v2; Debian 11 and later by default)",
        );
        return;
    };
    match try_run_cgroup(&base) {
        Ok(()) => f.add(
            check,
            Severity::Ok,
            format!(
                "fence run gives its command a cgroup of its own under {}: everything the command starts is killed at once when it must stop, however it forks; not contained: a command running as root, or as the user the cgroup is delegated to, that moves itself to another cgroup",
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
    for (dir, pid) in cgroup::runs(&base) {
        let members = cgroup::members(&dir);
        if Path::new(&format!("/proc/{pid}")).exists() || members.is_empty() {
            continue;
        }
        f.add(
            "host.run_leftovers",
            Severity::Warn,
            format!(
                "{} holds {} process(es) of a fence run whose supervisor (pid {pid}) is gone: pid {}; they may still act on a lease that has passed to another owner",
                dir.display(),
                members.len(),
                members.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
            ),
            &format!(
                "see what they are (`ps -o pid,user,lstart,cmd -p {}`), then stop them all: `echo 1 > {}/cgroup.kill`",
                members.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(","),
                dir.display()
            ),
        );
    }
}

/// A run's cgroup made, a `sleep` moved in, killed through it, removed; why not, step named.
fn try_run_cgroup(base: &Path) -> Result<(), String> {
    use std::io::Write;
    let dir = base.join(format!(
        "{}{}",
        crate::reaper::cgroup::PREFIX,
        std::process::id()
    ));
    std::fs::create_dir(&dir).map_err(|err| format!("cannot make a cgroup: {err}"))?;
    let tried = (|| {
        if !dir.join("cgroup.kill").exists() {
            return Err("no cgroup.kill: Linux before 5.14".to_owned());
        }
        let mut sleeper = std::process::Command::new("sleep")
            .arg("60")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|err| format!("cannot start `sleep` to try it: {err}"))?;
        let write = |file: &str, what: &str| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join(file))
                .and_then(|mut f| f.write_all(what.as_bytes()))
        };
        let moved = write("cgroup.procs", &sleeper.id().to_string())
            .map_err(|err| format!("cannot move a process into it: {err}"));
        let killed = moved.and_then(|()| {
            write("cgroup.kill", "1").map_err(|err| format!("cannot kill through it: {err}"))
        });
        if killed.is_err() {
            let _ = sleeper.kill();
        }
        let status = sleeper.wait();
        killed?;
        use std::os::unix::process::ExitStatusExt;
        match status {
            Ok(status) if status.signal() == Some(libc::SIGKILL) => Ok(()),
            other => Err(format!("cgroup.kill did not kill: {other:?}")),
        }
    })();
    let start = std::time::Instant::now();
    while std::fs::remove_dir(&dir).is_err() && start.elapsed().as_millis() < 200 {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    tried
}
