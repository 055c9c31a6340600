//! The small process between `fence run` and its command, so that the command never outlives
//! its supervisor, however the supervisor dies (`kill -9`, the OOM killer).
//!
//! `fence run` forks the reaper before its own runtime starts (one process, not a second
//! program: no exec, no second load of the binary), in a new process group, with a
//! parent-death signal (SIGUSR1), and so before it asks for the lease. The reaper retitles
//! itself `fence __reaper PARENT REPORT_FD START_FD GRACE_MS KILL_AFTER_MS -- COMMAND…` (what
//! `ps` shows; the descriptors are its ends of the two pipes below) and starts nothing until
//! `fence run`, granted the lease, sends its start message on START_FD: the lease's first
//! bound and COMMAND's environment (`FENCE_TOKEN`…); should that pipe end first (busy, an
//! error, `fence run` gone), it exits without starting anything. Then it starts COMMAND in
//! that group and waits for it, for signals, and for the lease's later bounds on the same
//! pipe. When `fence run` dies, the kernel sends the reaper SIGUSR1 and the reaper SIGKILLs
//! every descendant and the whole group, itself included.
//! SIGINT, SIGTERM and SIGHUP, which `fence run` sends to the group, are blocked and taken one
//! at a time (their dispositions reset to the defaults at the fork, so COMMAND gets the
//! defaults), so that the reaper stays to pass on COMMAND's status (its exit code, or death by
//! the same signal), and passed on to descendants that left the group. SIGUSR2 from `fence
//! run` (a lost lease past `--kill-after`) SIGKILLs every descendant. If the reaper itself is
//! SIGKILLed, COMMAND gets SIGKILL too (its own parent-death signal) and `fence run` stops
//! what is left of the group.
//!
//! The reaper is also the command's subreaper: a descendant that leaves the group (`setsid`,
//! as daemons do) is handed to it when its parent ends, so the reaper finds it in /proc by its
//! parent links; when COMMAND ends, the reaper stops every descendant left. Such orphans are
//! waited for as they end, while COMMAND runs: none stays a zombie (holding its pid) until
//! COMMAND ends, however many a command leaves behind.
//!
//! A command that cannot be started is reported to `fence run` on the report pipe (both pipes
//! are close-on-exec, at whatever numbers they got in `fence run`, so that a descriptor the
//! caller handed down, `3>>log`, reaches COMMAND unchanged), so `fence run` can say why and
//! release the lease.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;

use rustix::process::{getpid, Pid, Signal};

use crate::exit::Exit;

pub mod cgroup;
pub(crate) mod starter;
pub mod wire;

use wire::{Failure, Report};

/// The terminal's stop signals, ignored by the reaper (default again in COMMAND).
const STOP_SIGNALS: [i32; 3] = [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU];

/// The signals the reaper blocks and takes one at a time (see [`main`]).
const WATCHED: [i32; 6] = [
    libc::SIGCHLD,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
];

/// The command's process is not needed (nothing is started): killed and waited for, and the
/// run's cgroup, empty now, removed.
fn abandon(starter: std::io::Result<starter::Starter>) {
    if let Ok(starter) = starter {
        starter.abandon();
    }
    cgroup::remove();
}

/// What `fence run` hands the reaper it forked.
pub struct Plan {
    /// `fence run`'s pid: the parent the reaper must still have once told to start COMMAND.
    pub parent: Pid,
    /// Where the reaper says that COMMAND started, why it could not, and how it ended
    /// ([`wire::Report`]).
    pub report: OwnedFd,
    /// Where `fence run`'s start message comes from, then the lease's bounds.
    pub start: OwnedFd,
    /// How long before the lease's bound COMMAND gets SIGTERM, should `fence run` not have
    /// proven a later bound by then; at the bound itself, SIGKILL.
    pub grace_ms: u64,
    /// What COMMAND's leftovers get between SIGTERM and SIGKILL once it ended
    /// (`--kill-after`), never past the bound.
    pub kill_after_ms: u64,
    /// COMMAND and its arguments (never empty).
    pub command: Vec<OsString>,
    /// The run's own cgroup (v2), for the reaper to make (see [`cgroup`]); `None` where there
    /// is no cgroup v2.
    pub cgroup: Option<std::path::PathBuf>,
}

/// Runs the reaper, in the process `fence run` forked for it (its own process group, a
/// parent-death signal set): waits for the start message, starts COMMAND, supervises it.
pub fn main(plan: Plan) -> Exit {
    let Plan {
        parent,
        report,
        start,
        grace_ms,
        kill_after_ms,
        command,
        cgroup,
    } = plan;
    let Some((program, rest)) = command.split_first() else {
        return Exit::Usage;
    };
    // The signals the reaper acts on are blocked and taken one at a time with sigtimedwait:
    // no handler, no race between looking at the command and a signal arriving. COMMAND gets
    // the original mask back before exec.
    let (watched, original) = block(&WATCHED);
    // A terminal's stop signals (Ctrl-Z reaches the command's group, the reaper's) must not
    // stop the reaper: stopped, it could enforce no bound. COMMAND gets the defaults back. Nor
    // may the command trace it (same user): PR_SET_DUMPABLE 0 refuses ptrace to non-root.
    // SAFETY: signal dispositions of this process only.
    unsafe {
        for signal in STOP_SIGNALS {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    // Orphaned descendants of COMMAND become our children, not init's, so that we can find
    // them (see `crate::sys::kill_descendants`).
    let _ = rustix::process::set_child_subreaper(Some(getpid()));
    // COMMAND's process, forked now, while `fence run` asks for the lease: into a cgroup of
    // the run's own where fence may make one, so that one write kills all it starts however
    // it forks (a fork chain outruns the scans of /proc: review 8). It runs nothing until
    // told to go.
    let cell = cgroup::make(cgroup.as_deref());
    let starter = starter::Starter::fork(
        cell.as_ref(),
        starter::Exec {
            title: format!(
                "fence __command -- {}",
                command
                    .iter()
                    .map(|word| word.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            watched: &WATCHED,
            program,
            args: rest,
            mask: original,
            stop_signals: &STOP_SIGNALS,
            close: &[report.as_raw_fd(), start.as_raw_fd()],
        },
    );
    drop(cell);
    let mut bounds = std::fs::File::from(start);
    // `fence run` starts us before it asks for the lease: wait for its go, the lease's first
    // bound and COMMAND's environment. Its end closed without them (busy, an error, or
    // `fence run` gone): nothing is started.
    let Some((first_bound, env)) = wire::read_start(&mut bounds) else {
        abandon(starter);
        return Exit::Success;
    };
    // Signals that reached our group while `fence run` waited for the lease were not sent by
    // it (it sends them only once COMMAND runs), nor by a terminal (our group has not its
    // foreground yet): discarded, as COMMAND's process discards them (a review: a SIGHUP then
    // made a whole run report itself interrupted; a SIGUSR2, killed at its start). fence's
    // death is looked at right below.
    // SAFETY: dispositions of this one-threaded process: ignoring a pending signal discards
    // it; the default comes back at once.
    unsafe {
        for signal in WATCHED.iter().filter(|&&s| s != libc::SIGCHLD) {
            let before = libc::signal(*signal, libc::SIG_IGN);
            libc::signal(*signal, before);
        }
    }
    // `fence run` may have died between starting us and our parent-death signal taking hold.
    if rustix::process::getppid() != Some(parent) {
        abandon(starter);
        crate::terminal::warn("error: `fence run` is gone; nothing was started");
        return Exit::Internal;
    }
    // Close-on-exec (as `fence run` made it), so COMMAND does not inherit it.
    let mut report = std::fs::File::from(report);
    // A bound already past (`fence run` was paused after its grant): COMMAND must not run at
    // all, not even until the first look at the bound below.
    if crate::sys::bound_clock_ns()
        >= first_bound.saturating_sub(grace_ms.saturating_mul(1_000_000))
    {
        abandon(starter);
        let _ = write!(report, "{}", Failure::Expired.encode());
        return Exit::Internal;
    }
    take_terminal(parent);
    // From here on the bounds are read without blocking.
    let _ = rustix::fs::fcntl_setfl(&bounds, rustix::fs::OFlags::NONBLOCK);
    let grace = grace_ms.saturating_mul(1_000_000);
    // The command is known by its pid from here on, and waited for with every other child
    // (see the loop below).
    let started = starter
        .map_err(|err| Failure::Exec {
            errno: err.raw_os_error().unwrap_or(0),
            message: err.to_string(),
        })
        .and_then(|starter| starter.go(&env));
    let command = match started {
        Ok(pid) => pid,
        Err(failure) => {
            // The error number first (`E11 …`), for `fence run` to tell a passing limit from
            // a command that cannot start.
            let _ = write!(report, "{}", failure.encode());
            cgroup::remove();
            return Exit::Command(127);
        }
    };
    // Started: one newline, and the pipe stays open for the end of the story (below).
    let _ = report.write_all(&[wire::STARTED]);
    let mut interrupted: Option<i32> = None;
    // The lease's bound as `fence run` last proved it (CLOCK_BOOTTIME ns): SIGTERM `grace`
    // before it, SIGKILL at it, to every descendant, again and again until the command ends.
    let mut bound = first_bound;
    let mut enforced = false;
    let mut groups = Vec::new();
    // When the command was seen to have ended, if that was before the bound (see below).
    let mut inside = None;
    let status = loop {
        // Every child that ended is waited for at every turn (a SIGCHLD wakes the loop), the
        // orphans handed to us as their subreaper too: a command that keeps starting
        // short-lived processes it does not wait for (`( job & )`, a daemon's double-forked
        // workers) would otherwise pile up a zombie each, holding its pid, until it ends. The
        // command's own status is kept.
        match crate::sys::reap_children_keeping(command) {
            Ok(Some(status)) => {
                // Seen now, so it ended no later: inside the lease if that is before the
                // latest bound, and this reaper never had to enforce one.
                let seen = crate::sys::bound_clock_ns();
                let latest = latest_bound(&mut bounds)
                    .filter(|_| !enforced)
                    .unwrap_or(bound);
                if !enforced && seen < latest {
                    inside = Some(seen);
                }
                bound = latest;
                break status;
            }
            Ok(None) => {}
            Err(_) => return Exit::Internal,
        }
        let now = crate::sys::bound_clock_ns();
        if !enforced {
            bound = latest_bound(&mut bounds).unwrap_or(bound);
        }
        let term_at = bound.saturating_sub(grace);
        let next = if now >= bound {
            // `fence run` did not prove the lease beyond this (paused, or hung): nothing of
            // the command runs past it, whatever `fence run` does.
            enforced = true;
            crate::sys::kill_descendants_once(&mut groups);
            10_000_000
        } else if now >= term_at {
            if !enforced {
                enforced = true;
                crate::sys::signal_descendants(Signal::TERM, false);
                crate::sys::signal_descendants(Signal::CONT, false);
            }
            bound - now
        } else {
            (term_at - now).min(1_000_000_000)
        };
        let timeout = libc::timespec {
            tv_sec: (next / 1_000_000_000) as libc::time_t,
            tv_nsec: (next % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: a siginfo for sigtimedwait to fill.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waits for one of the blocked signals of `watched`, at most a second.
        let signal = unsafe { libc::sigtimedwait(&watched, &mut info, &timeout) };
        // SAFETY: the sender's pid of the siginfo sigtimedwait filled (0 without one).
        let sender = unsafe { info.si_pid() };
        match Signal::from_named_raw(signal) {
            // SIGUSR1 and SIGUSR2 are `fence run`'s, and a command may send them to its own
            // group (`kill -USR1 0`, as for log rotation): that ended its run (a review). Only
            // fence's death (its parent-death signal: fence is no longer our parent) and a
            // SIGUSR2 from fence count.
            Some(Signal::USR1) if rustix::process::getppid() != Some(parent) => {
                // `fence run` died: nothing may outlive it, in the group or not. Killed until
                // none is left (a process that forks its successor in a session of its own
                // outran one scan: a review), groups as one; then the group `fence run` made
                // for us, and we go with it.
                crate::sys::kill_descendants(|| 0);
                cgroup::remove();
                let _ = rustix::process::kill_current_process_group(Signal::KILL);
            }
            Some(Signal::USR2) if sender == parent.as_raw_pid() => {
                crate::sys::kill_descendants_once(&mut groups)
            }
            Some(signal @ (Signal::INT | Signal::TERM | Signal::HUP)) => {
                interrupted.get_or_insert(signal.as_raw());
                // The group got it (from `fence run`, or the terminal); descendants that left
                // it did not.
                crate::sys::signal_descendants(signal, true);
                crate::sys::signal_descendants(Signal::CONT, true);
            }
            // SIGCHLD, a timeout: look at the command again.
            _ => {}
        }
    };
    // Descendants that left the process group (setsid: daemons) were handed to us as their
    // subreaper when their parents ended; none may outlive COMMAND, nor the bound: they get
    // SIGTERM and, --kill-after later but never past the bound, SIGKILL. The bound is the
    // latest `fence run` proved, read again at every look: it keeps renewing meanwhile.
    // `fence run` is told that some had to be stopped: their work was cut short, so the run
    // did not complete.
    let ended_at = crate::sys::bound_clock_ns();
    let kill_after = kill_after_ms.saturating_mul(1_000_000);
    let leftovers = crate::sys::kill_descendants(|| {
        if !enforced {
            bound = latest_bound(&mut bounds).unwrap_or(bound);
        }
        ended_at.saturating_add(kill_after).min(bound)
    });
    // One write (below a pipe's atomic size): the report is whole, or the reaper was killed
    // before it and `fence run` reads no `ended`.
    let told = Report {
        leftovers,
        bound: enforced,
        interrupted,
        inside: inside.filter(|_| !leftovers),
        at: Some(ended_at),
        ended: true,
        status: Some(status.into_raw()),
    };
    let _ = report.write_all(told.encode().as_bytes());
    drop(report);
    if let Some(signal) = status.signal() {
        // Die of the same signal, so `fence run` reports 128+N as for any command.
        // SAFETY: restoring the default action and raising a signal on ourselves.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::sigprocmask(libc::SIG_SETMASK, &original, std::ptr::null_mut());
            libc::raise(signal);
        }
        return Exit::Command(128u8.wrapping_add(signal as u8));
    }
    Exit::Command(status.code().unwrap_or(1) as u8)
}

/// When `fence run` holds the terminal's foreground, takes it for the command's group before
/// the command starts (a background group that reads the terminal is stopped), so that a
/// command that reads its terminal works as it would without fence. `fence run` takes it
/// back when the command is done.
fn take_terminal(parent: Pid) {
    let stdin = rustix::stdio::stdin();
    // Through libc: a group outside this pid namespace is 0 there, which rustix's `Pid` may not
    // hold (a review: `fence run` panicked, the lease kept until its TTL).
    // SAFETY: plain queries of the terminal and of a process group.
    let (foreground, parents) = unsafe { (libc::tcgetpgrp(0), libc::getpgid(parent.as_raw_pid())) };
    let Some(ours) = crate::sys::own_group() else {
        return;
    };
    if !(rustix::termios::isatty(stdin) && foreground > 0 && foreground == parents) {
        return;
    }
    // SIGTTOU is blocked around tcsetpgrp, as a background process group taking the
    // foreground must.
    let (_, before) = block(&[libc::SIGTTOU]);
    let _ = rustix::termios::tcsetpgrp(stdin, ours);
    // SAFETY: restores the mask of this single-threaded process.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, &before, std::ptr::null_mut()) };
}

/// Blocks `signals`; returns them as a set and the mask before.
fn block(signals: &[i32]) -> (libc::sigset_t, libc::sigset_t) {
    // SAFETY: sigset operations on sets we own; sigprocmask on this single-threaded process.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &signal in signals {
            libc::sigaddset(&mut set, signal);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, &mut before);
        (set, before)
    }
}

/// The newest bound `fence run` sent since the last look, if any (see [`wire::latest_bound`]).
fn latest_bound(bounds: &mut std::fs::File) -> Option<u64> {
    use std::io::Read;
    let mut latest = None;
    let mut buf = [0u8; 8 * 64];
    while let Ok(n @ 8..) = bounds.read(&mut buf) {
        latest = wire::latest_bound(&buf[..n]).or(latest);
    }
    latest
}
