//! The process that becomes COMMAND, forked by the reaper as soon as the reaper starts, so while
//! `fence run` asks for the lease: into the run's cgroup where there is one (`clone3` with
//! `CLONE_INTO_CGROUP`: born inside, never moved), and off the path to the command's start
//! (the fork is done by the time the lease is granted: only the exec is left).
//!
//! It waits, running nothing of the command, for [`Starter::go`]: one `G` and the command's
//! added environment (`KEY=VALUE` entries, each ended by a NUL) on its own pipe, then execs
//! COMMAND. Should that pipe end without a `G` (busy, an error, the reaper gone), it exits
//! without running anything; should the reaper die, its parent-death signal (SIGKILL) ends it;
//! a reaper that does not need it kills it and waits for it ([`Starter::abandon`]). On a
//! second pipe, closed on exec, it says `R` just before its exec, and after it why an exec
//! failed: the reaper reads it to its end, so a process that died before its exec (the OOM
//! killer) is told from a command that ran and died.
//!
//! Signals sent to the reaper's process group while it waits (blocked here, as in the reaper)
//! are discarded before the exec: they were the reaper's, and a process forked at the go, as
//! before, would never have had them (a review: a SIGHUP to the group during `--wait` killed
//! the command before it ran, reported as the command's death).

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;

use rustix::process::{Pid, Signal};

use super::wire::Failure;

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
    /// What `ps` shows of it until its exec.
    pub(super) title: String,
    /// The signals the reaper blocks and waits for: any of them pending is discarded.
    pub(super) watched: &'a [i32],
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

    /// Has it exec COMMAND with `env` added: its pid once COMMAND runs (its status is the
    /// reaper's to collect), or why not: the exec failed (the error number and what it means),
    /// or it died before its exec ([`Failure::Lost`]); it has been waited for then.
    pub(super) fn go(mut self, env: &[(OsString, OsString)]) -> Result<Pid, Failure> {
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
        let ready = told.first() == Some(&b'R');
        let after = told.strip_prefix(b"R").unwrap_or(&told);
        match after {
            [] if ready => Ok(self.pid),
            [b'E', a, b, c, d, message @ ..] => {
                wait(self.pid);
                Err(Failure::Exec {
                    errno: i32::from_le_bytes([*a, *b, *c, *d]),
                    message: String::from_utf8_lossy(message).into_owned(),
                })
            }
            _ => {
                wait(self.pid);
                Err(Failure::Lost)
            }
        }
    }

    /// Not needed (busy, an error, `fence run` gone): killed and waited for.
    pub(super) fn abandon(self) {
        let _ = rustix::process::kill_process(self.pid, Signal::KILL);
        wait(self.pid);
    }
}

/// Waits for the child `pid` to end.
fn wait(pid: Pid) {
    while let Err(rustix::io::Errno::INTR) =
        rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty())
    {}
}

/// `clone3` into the cgroup `dir`: the child's pid, or 0 in the child, which must run only
/// what a child of fork(2) may (async-signal-safe calls, in a process with threads).
pub(crate) fn clone_into(dir: &OwnedFd) -> std::io::Result<i32> {
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: dir.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: without CLONE_VM the child is a copy of this process, as after fork(2): it
    // returns here with 0, and the callers' children run only what such a child may.
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
    crate::sys::retitle(&exec.title);
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
    // Signals that reached the group while this process waited were the reaper's: an ignored
    // signal is discarded, pending or not, and the default comes back (std's exec unblocks
    // every signal before the hooks below run).
    // SAFETY: dispositions of this one-threaded process.
    unsafe {
        for &signal in exec.watched {
            let before = libc::signal(signal, libc::SIG_IGN);
            libc::signal(signal, before);
        }
    }
    let mut command = std::process::Command::new(exec.program);
    command.args(exec.args).envs(env);
    let (mask, stop_signals) = (exec.mask, exec.stop_signals.to_vec());
    let ready = failed.as_raw_fd();
    // SAFETY: sigprocmask, signal and write on this process, just before its exec.
    unsafe {
        command.pre_exec(move || {
            libc::sigprocmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
            for &signal in &stop_signals {
                libc::signal(signal, libc::SIG_DFL);
            }
            libc::write(ready, b"R".as_ptr().cast(), 1);
            Ok(())
        });
    }
    let err = command.exec();
    let mut told = vec![b'E'];
    told.extend_from_slice(&err.raw_os_error().unwrap_or(0).to_le_bytes());
    told.extend_from_slice(err.to_string().as_bytes());
    let _ = std::fs::File::from(failed).write_all(&told);
    // SAFETY: as above; 127, as a shell says "command not found".
    unsafe { libc::_exit(127) }
}
