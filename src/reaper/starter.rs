//! The process that becomes COMMAND, forked by the reaper as soon as the reaper starts, so while
//! `fence run` asks for the lease: into the run's cgroup where there is one (`clone3` with
//! `CLONE_INTO_CGROUP`: born inside, never moved), and off the path to the command's start
//! (the fork is done by the time the lease is granted: only the exec is left).
//!
//! It waits, running nothing of the command, for [`Starter::go`]: one `G` and the command's
//! added environment (`KEY=VALUE` entries, each ended by a NUL) on its own pipe, then execs
//! COMMAND. Should that pipe end without a `G` (busy, an error, the reaper gone), it exits
//! without running anything; should the reaper die, its parent-death signal (SIGKILL) ends it.
//! An exec that fails is told on a second pipe, closed on exec: the reaper reads it to its end,
//! empty once COMMAND runs.

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;

use rustix::process::{Pid, Signal};

/// The struct `clone3` reads (linux/sched.h), up to `cgroup` (CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// What the forked process needs to exec COMMAND once told to.
pub(super) struct Exec<'a> {
    pub(super) program: &'a OsStr,
    pub(super) args: &'a [OsString],
    /// The signal mask COMMAND gets back (the reaper blocks the signals it waits for).
    pub(super) mask: libc::sigset_t,
    /// The terminal's stop signals, ignored by the reaper: default again in COMMAND.
    pub(super) stop_signals: &'a [i32],
    /// The reaper's descriptors the forked process closes at once (its pipes to `fence run`).
    pub(super) close: &'a [RawFd],
}

/// The forked process, waiting for its go.
pub(super) struct Starter {
    pid: Pid,
    /// Where the go is written (see the module's documentation).
    go: std::fs::File,
    /// Where a failed exec is told; empty once COMMAND runs.
    failed: std::fs::File,
}

impl Starter {
    /// Forks the process that will exec `exec` once told to: into the cgroup whose directory
    /// `cgroup` is, where `clone3` allows (else forked as usual and moved in, see
    /// `cgroup::join`). To be called while this process has one thread.
    pub(super) fn fork(cgroup: Option<&OwnedFd>, exec: Exec<'_>) -> std::io::Result<Starter> {
        let (go_read, go) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let (failed, failed_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let reaper = rustix::process::getpid();
        let forked = cgroup.and_then(|dir| clone_into(dir).ok());
        let pid = match forked {
            Some(pid) => pid,
            // SAFETY: this process has one thread; the child only runs `child`, which never
            // returns.
            None => match unsafe { libc::fork() } {
                -1 => return Err(std::io::Error::last_os_error()),
                0 => {
                    if cgroup.is_some() {
                        super::cgroup::join();
                    }
                    0
                }
                pid => pid,
            },
        };
        if pid == 0 {
            drop(go);
            drop(failed);
            child(reaper, go_read, failed_write, exec);
        }
        Ok(Starter {
            pid: Pid::from_raw(pid).ok_or_else(|| std::io::Error::other("fork returned no pid"))?,
            go: go.into(),
            failed: failed.into(),
        })
    }

    /// Has it exec COMMAND with `env` added: its pid once COMMAND runs, or why the exec failed
    /// (the error number and what it means). A starter that died before (killed) is COMMAND
    /// ended: its status is the reaper's to collect.
    pub(super) fn go(mut self, env: &[(OsString, OsString)]) -> Result<Pid, (i32, String)> {
        let mut message = vec![b'G'];
        for (key, value) in env {
            message.extend_from_slice(key.as_bytes());
            message.push(b'=');
            message.extend_from_slice(value.as_bytes());
            message.push(0);
        }
        let _ = self.go.write_all(&message);
        drop(self.go);
        let mut told = Vec::new();
        let _ = self.failed.read_to_end(&mut told);
        if told.len() < 4 {
            return Ok(self.pid);
        }
        let errno = i32::from_le_bytes([told[0], told[1], told[2], told[3]]);
        Err((errno, String::from_utf8_lossy(&told[4..]).into_owned()))
    }
}

/// `clone3` into the cgroup `dir`: the child's pid, or 0 in the child.
fn clone_into(dir: &OwnedFd) -> std::io::Result<i32> {
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: dir.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: without CLONE_VM the child is a copy of this one-threaded process, as after
    // fork(2): it returns here with 0 and only runs `child`, which never returns.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(pid as i32)
}

/// The forked process: waits for its go, then execs COMMAND; never returns.
fn child(reaper: Pid, go: OwnedFd, failed: OwnedFd, exec: Exec<'_>) -> ! {
    // Dies with the reaper, and not after it: it may have died before this took hold.
    let _ = rustix::process::set_parent_process_death_signal(Some(Signal::KILL));
    if rustix::process::getppid() != Some(reaper) {
        // SAFETY: ends this forked process at once.
        unsafe { libc::_exit(0) }
    }
    for &fd in exec.close {
        // SAFETY: the reaper's descriptors, copies of which this process never uses.
        unsafe { libc::close(fd) };
    }
    let mut message = Vec::new();
    let _ = std::fs::File::from(go).read_to_end(&mut message);
    let Some(env) = message.strip_prefix(b"G") else {
        // SAFETY: as above.
        unsafe { libc::_exit(0) }
    };
    let env = env
        .split(|b| *b == 0)
        .filter(|entry| !entry.is_empty())
        .filter_map(|entry| {
            let at = entry.iter().position(|b| *b == b'=')?;
            Some((
                OsStr::from_bytes(&entry[..at]),
                OsStr::from_bytes(&entry[at + 1..]),
            ))
        });
    let mut command = std::process::Command::new(exec.program);
    command.args(exec.args).envs(env);
    let (mask, stop_signals) = (exec.mask, exec.stop_signals.to_vec());
    // SAFETY: sigprocmask and signal on this process, just before its exec.
    unsafe {
        command.pre_exec(move || {
            libc::sigprocmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
            for &signal in &stop_signals {
                libc::signal(signal, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    let err = command.exec();
    let mut told = err.raw_os_error().unwrap_or(0).to_le_bytes().to_vec();
    told.extend_from_slice(err.to_string().as_bytes());
    let _ = std::fs::File::from(failed).write_all(&told);
    // SAFETY: as above; 127, as a shell says "command not found".
    unsafe { libc::_exit(127) }
}
