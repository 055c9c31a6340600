//! The small process between `fence run` and its command, so that the command never outlives
//! its supervisor, however the supervisor dies (`kill -9`, the OOM killer).
//!
//! `fence run` starts its own binary as `fence __reaper PARENT -- COMMAND…` in a new process
//! group, with a parent-death signal (SIGUSR1) set before exec. The reaper starts COMMAND in
//! that group and waits for it. When `fence run` dies, the kernel sends the reaper SIGUSR1 and
//! the reaper kills the whole group with SIGKILL: the command and every descendant that stayed
//! in the group. SIGINT, SIGTERM and SIGHUP, which `fence run` sends to the group, are caught
//! (and so reset to their defaults in COMMAND by exec) so that the reaper stays to pass on
//! COMMAND's status: its exit code, or death by the same signal. If the reaper itself is
//! SIGKILLed, COMMAND gets SIGKILL too (its own parent-death signal).
//!
//! A command that cannot be started is reported to `fence run` on file descriptor 3 (the
//! reaper closes it once COMMAND runs), so `fence run` can say why and release the lease.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};

use crate::exit::Exit;

/// The argument that selects the reaper instead of the command line interface.
pub const ARG: &str = "__reaper";

/// The descriptor on which the reaper reports a command it could not start.
pub const REPORT_FD: i32 = 3;

/// Runs the reaper: `args` are `PARENT -- COMMAND…` (what follows [`ARG`]).
pub fn main(args: &[OsString]) -> Exit {
    let parent: Option<i32> = args.first().and_then(|a| a.to_str()?.parse().ok());
    let (Some(parent), Some(sep), Some((program, rest))) = (
        parent,
        args.get(1),
        args.get(2..).and_then(|c| c.split_first()),
    ) else {
        eprintln!("fence: error: `fence {ARG}` is started by `fence run`, not by hand");
        return Exit::Usage;
    };
    if sep != "--" {
        eprintln!("fence: error: `fence {ARG}` is started by `fence run`, not by hand");
        return Exit::Usage;
    }
    // SAFETY: installing async-signal-safe handlers before any other thread exists.
    unsafe {
        libc::signal(libc::SIGUSR1, kill_group as *const () as libc::sighandler_t);
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::signal(signal, stay as *const () as libc::sighandler_t);
        }
    }
    // `fence run` may have died between starting us and our parent-death signal taking hold.
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } != parent {
        kill_group(libc::SIGUSR1);
    }
    // SAFETY: fd 3 was set up by `fence run` for this report alone; we own it from here.
    let mut report = unsafe { std::fs::File::from_raw_fd(REPORT_FD) };
    // SAFETY: marks our own descriptor close-on-exec, so COMMAND does not inherit it.
    unsafe { libc::fcntl(REPORT_FD, libc::F_SETFD, libc::FD_CLOEXEC) };
    let mut command = std::process::Command::new(program);
    command.args(rest);
    // SAFETY: prctl is async-signal-safe; it runs in the child between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => {
            let _ = write!(report, "{err}");
            return Exit::Command(127);
        }
    };
    drop(report);
    let status = match child.wait() {
        Ok(status) => status,
        Err(_) => return Exit::Internal,
    };
    if let Some(signal) = status.signal() {
        // Die of the same signal, so `fence run` reports 128+N as for any command.
        // SAFETY: restoring the default action and raising a signal on ourselves.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::raise(signal);
        }
        return Exit::Command(128u8.wrapping_add(signal as u8));
    }
    Exit::Command(status.code().unwrap_or(1) as u8)
}

/// SIGINT, SIGTERM, SIGHUP: meant for the command, which gets them through the group.
extern "C" fn stay(_: libc::c_int) {}

/// `fence run` is gone: nothing may outlive it.
extern "C" fn kill_group(_: libc::c_int) {
    // SAFETY: kill(2) is async-signal-safe; the group is the one `fence run` made for us.
    unsafe { libc::kill(-libc::getpgrp(), libc::SIGKILL) };
}
