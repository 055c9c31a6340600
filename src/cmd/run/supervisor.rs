//! The parent side of the supervisor (the reaper): its start, its pipes, the terminal.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::process::ExitStatus;
use std::time::Duration;

use rustix::process::{Pid, Signal};

use super::hold::nanos;
use super::lost;
use crate::cli::RunArgs;
use crate::coordinator::LeaseRef;
use crate::error::{Error, LostReason};
use crate::reaper::wire::{self, Failure, Report};

/// The lease's bound, sent to the reaper: should `fence run` be paused (SIGSTOP, a frozen
/// cgroup) or hang past it, the reaper, which does not renew anything, stops the command
/// there itself (SIGTERM, SIGKILL after `--kill-after`), so that it never runs on past the
/// last renewal this process could prove.
pub(super) struct Bounds(std::fs::File);

impl Bounds {
    /// Sends `bound` (bound clock ns), 8 bytes: one write, never split.
    pub(super) fn send(&self, bound: u64) {
        let _ = (&self.0).write_all(&wire::bound_message(bound));
    }
}

/// The terminal, when `fence run` held its foreground: the reaper hands it to the command's
/// process group before the command starts (which would otherwise stop as soon as it read the
/// terminal, while fence kept renewing), and fence takes it back when the command is done.
pub(super) struct Terminal {
    given: bool,
}

impl Terminal {
    /// Whether the reaper (`pid`, the leader of the command's group) took the terminal for
    /// that group (see [`crate::reaper`]), so that fence must take it back.
    pub(super) fn give(pid: Option<u32>) -> Terminal {
        let stdin = rustix::stdio::stdin();
        let given = pid.is_some_and(|pid| {
            rustix::termios::isatty(stdin)
                // SAFETY: a plain query (through libc: a foreground group outside this pid
                // namespace is 0, which rustix's `Pid` may not hold).
                && unsafe { libc::tcgetpgrp(0) } == pid as i32
        });
        Terminal { given }
    }

    pub(super) fn take_back(&self) {
        if !self.given {
            return;
        }
        // SAFETY: a background process group taking the terminal back must not be stopped by
        // SIGTTOU for it; the old action is restored at once.
        unsafe {
            let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::tcsetpgrp(0, libc::getpgrp());
            libc::signal(libc::SIGTTOU, old);
        }
    }
}

/// The reaper (see [`crate::reaper`]), forked in a new process group before the runtime
/// starts, so before the lease is asked for; it waits, starting nothing, until `Reaper::go`
/// sends what COMMAND needs. Dropped without `go` (busy, an error, a completed run id), it is
/// killed: COMMAND was never started.
pub struct Reaper {
    child: Option<Forked>,
    report: Option<std::fs::File>,
    /// The start message, then the lease's bounds (see [`Bounds`]).
    start: Option<std::fs::File>,
    pub(super) program: String,
}

impl Reaper {
    /// The reaper's pid: the process group the command will run in.
    pub(super) fn group(&self) -> Option<u32> {
        self.child.as_ref().and_then(Forked::id)
    }

    /// Forks the reaper of `fence run`'s COMMAND: to be called while this process has one
    /// thread (before the runtime starts), and stdout untouched. With `--format json` the
    /// reaper's stdout, and so COMMAND's, is stderr: stdout carries fence's one JSON object.
    /// `caller_xfsz` is the SIGXFSZ disposition fence was started with (fence ignores it for
    /// itself), which COMMAND gets back.
    pub fn fork(
        args: &RunArgs,
        json: bool,
        caller_xfsz: libc::sighandler_t,
    ) -> Result<Reaper, Error> {
        let command = &args.command;
        let program = command.first().ok_or_else(|| {
            Error::usage(
                "no command to run",
                "put the command after `--`: fence run R -- ./job.sh",
            )
        })?;
        let cannot = |err: &dyn std::fmt::Display| {
            Error::usage(
                format!("cannot start fence's supervisor of the command: {err}"),
                "check the system's process and file limits; nothing was started and no lease was taken",
            )
        };
        // Every process the command starts is found there (`sys::kill_descendants`): without
        // it, a daemon that left the command's group could not be stopped.
        if !std::path::Path::new("/proc/self/stat").exists() {
            return Err(Error::usage(
                "fence run needs /proc mounted: it finds every process the command starts there, to stop them",
                "mount /proc (`mount -t proc proc /proc`) where fence runs; nothing was started and no lease was taken",
            ));
        }
        // Children this process had before (`sh -c 'job & exec fence run …'`) are not the
        // run's: never stopped as its leftovers.
        crate::sys::spare_children();
        // Named here, once, for both processes: the reaper makes the run's cgroup, and `fence
        // run` kills through it and removes it (see `reaper::cgroup`).
        let cgroup = crate::reaper::cgroup::plan(crate::reaper::cgroup::base().as_deref());
        let grace = super::grace(args);
        let millis = |d: Duration| d.as_millis().min(i64::MAX as u128) as u64;
        // Each (read end, write end): fence reads the report and writes the start message.
        let (report, report_end) = pipe().map_err(|err| cannot(&err))?;
        let (start_end, start) = pipe().map_err(|err| cannot(&err))?;
        let start = std::fs::File::from(start);
        // Should the reaper die (the OOM killer, a `kill -9` of the wrong pid), what it was
        // the subreaper of (daemons that left the command's group) is handed to us rather than
        // to init, so that nothing of the command outlives the run (`sys::kill_descendants`
        // once the reaper has been waited for).
        let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
        // Nor may the command, run as the same user, open this process's end of the report
        // pipe through /proc/<fence>/fd, stop fence and write a bound of its own choosing to
        // the reaper (a review did: the command ran past a takeover, and fence reported
        // exit 0): PR_SET_DUMPABLE 0 makes /proc/<fence>/fd root's, as the reaper's is.
        let _ =
            rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
        let parent = rustix::process::getpid();
        // Shown by `ps`, as it was when the reaper was a program of its own: the descriptors
        // are the reaper's ends of the pipes.
        let title = format!(
            "fence __reaper {} {} {} {} {} -- {}",
            parent.as_raw_pid(),
            report_end.as_raw_fd(),
            start_end.as_raw_fd(),
            millis(grace),
            millis(args.kill_after),
            command
                .iter()
                .map(|word| word.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ")
        );
        // SIGCHLD ignored (as fence may have been started) would have the kernel reap the
        // reaper as soon as it ends, and the reaper's COMMAND, their statuses lost; the
        // default only wakes who asks. For both processes: the reaper inherits it.
        // SAFETY: this process's own disposition; it has one thread.
        unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
        // SAFETY: this process has one thread (see above), so the child is a whole copy of
        // it; the child never returns from this block.
        match unsafe { libc::fork() } {
            -1 => Err(cannot(&std::io::Error::last_os_error())),
            0 => {
                // The reaper. Its own process group, and SIGUSR1 should fence die (the reaper
                // checks, once told to go, that fence is still its parent).
                let _ = rustix::process::setpgid(None, None);
                // SAFETY: dispositions of this one-threaded process. The signals the reaper
                // acts on take their default actions whatever fence was started with (one
                // ignored would be discarded, not waited for: SIGUSR1 ignored loses fence's
                // death; SIGCHLD was reset before the fork),
                // and so COMMAND gets the defaults of SIGINT, SIGTERM and SIGHUP, as it did
                // when the reaper was exec'd after fence caught them; SIGXFSZ is the caller's.
                unsafe {
                    for signal in [
                        libc::SIGINT,
                        libc::SIGTERM,
                        libc::SIGHUP,
                        libc::SIGUSR1,
                        libc::SIGUSR2,
                    ] {
                        libc::signal(signal, libc::SIG_DFL);
                    }
                    libc::signal(libc::SIGXFSZ, caller_xfsz);
                }
                let _ = rustix::process::set_parent_process_death_signal(Some(Signal::USR1));
                // fence's ends: with them open here, the reaper would never see its start
                // pipe end should fence die.
                drop(report);
                drop(start);
                if json {
                    let _ = rustix::stdio::dup2_stdout(rustix::stdio::stderr());
                }
                crate::sys::retitle(&title);
                let exit = crate::reaper::main(crate::reaper::Plan {
                    parent,
                    report: report_end,
                    start: start_end.into(),
                    grace_ms: millis(grace),
                    kill_after_ms: millis(args.kill_after),
                    command: command.clone(),
                    cgroup,
                });
                // SAFETY: ends the forked process at once: fence's own exit handlers and
                // buffers (copies of the parent's) are not the reaper's.
                unsafe { libc::_exit(exit.code().into()) }
            }
            pid => {
                drop(report_end);
                drop(start_end);
                // The reaper's end is seen by SIGCHLD (see `Forked`): a mask fence inherited
                // with it blocked would hide that end until a timer looked.
                // SAFETY: this process's own mask; it has one thread.
                unsafe {
                    let mut chld: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut chld);
                    libc::sigaddset(&mut chld, libc::SIGCHLD);
                    libc::sigprocmask(libc::SIG_UNBLOCK, &chld, std::ptr::null_mut());
                }
                let pid = Pid::from_raw(pid).ok_or_else(|| cannot(&"fork returned no pid"))?;
                // Also from here, so that the group exists before fence signals it, whichever
                // process runs first.
                let _ = rustix::process::setpgid(Some(pid), Some(pid));
                let child = Forked {
                    pid,
                    ended: None,
                    status: None,
                    reported: false,
                };
                Ok(Reaper {
                    child: Some(child),
                    report: Some(report),
                    start: Some(start),
                    program: program.to_string_lossy().into_owned(),
                })
            }
        }
    }

    /// Resolves once the reaper has ended (before [`Self::go`]: it was killed), with its pid.
    pub(super) async fn ended(&mut self) -> Option<u32> {
        match self.child.as_mut() {
            Some(child) => {
                let pid = child.id();
                let _ = child.wait().await;
                pid
            }
            None => std::future::pending().await,
        }
    }

    /// Has the reaper start COMMAND with `env` (fence's variables) under the lease's first
    /// `bound` (bound clock ns): the reaper enforces it from COMMAND's first instant, SIGTERM
    /// `grace` before it. Waits for its report that COMMAND runs (or why it could not start),
    /// never past `bound - grace`: a reaper stopped by its own command (`kill -STOP $PPID`) is
    /// continued every [`NUDGE`], and one that still has not answered then, or that ended
    /// without a word (killed between starting COMMAND and saying so), is treated as lost
    /// (`Running::answered` false: whatever it started is stopped by [`hold`](super::hold::hold)).
    pub(super) async fn go(
        mut self,
        lease: &LeaseRef,
        env: &[(&str, String)],
        bound: u64,
        grace: Duration,
    ) -> Result<Running, Error> {
        use tokio::io::AsyncReadExt;
        let program = std::mem::take(&mut self.program);
        let cannot = |err: &dyn std::fmt::Display| {
            Error::usage(
                format!("cannot start `{program}`: {err}"),
                "check the command's path and permissions; the lease was released",
            )
        };
        let message = wire::start_message(bound, env);
        let (Some(child), Some(report), Some(start)) =
            (self.child.take(), self.report.take(), self.start.take())
        else {
            return Err(cannot(
                &"fence's supervisor of the command was already used",
            ));
        };
        // Watched before the go is sent: failing here, nothing was started (the reaper sees
        // its start pipe close), so "nothing was run" holds and the run is on record as not
        // started; failing after the go, the command could be running unwatched.
        let mut report = tokio::net::unix::pipe::Receiver::from_file(report).map_err(|err| {
            Error::internal(
                format!("cannot watch fence's supervisor of the command: {err}"),
                "check the system's file limits; nothing was run and the lease was released",
            )
        })?;
        // One write into the empty pipe (a pipe holds 64 KiB, and the message is below the
        // argument limits), still blocking; from here on our end never blocks: a bound the
        // reaper has not read yet is replaced by the next one anyway.
        let sent = (&start).write_all(&message);
        let _ = rustix::fs::fcntl_setfl(&start, rustix::fs::OFlags::NONBLOCK);
        let bounds = Bounds(start);
        // The reaper writes one newline once COMMAND runs, or why it could not start and
        // closes its end. A reaper that dies before either closes it with nothing said.
        let give_up = bound.saturating_sub(nanos(grace));
        let mut first = [0u8; 1];
        let read = loop {
            match tokio::time::timeout(NUDGE, report.read(&mut first)).await {
                Ok(read) => break Some(read),
                // A last look before giving up: paused past `give_up` (SIGSTOP), this process
                // wakes with the timer fired and the reaper's answer unread (epoll_wait
                // returns EINTR after SIGCONT: the timers run before the pipe is looked at).
                Err(_) if crate::sys::bound_clock_ns() >= give_up => {
                    continue_process(child.id());
                    break crate::time::last_look(report.read(&mut first)).await.ok();
                }
                Err(_) => continue_process(child.id()),
            }
        };
        match (sent, read) {
            (Ok(()), Some(Ok(1))) if first[0] == wire::STARTED => Ok(Running {
                child,
                answered: true,
                bounds,
                report,
            }),
            // No answer in time, or the reaper ended (killed?) without saying whether it
            // started COMMAND, or its pipe could not be read: it had the start message, so
            // COMMAND may run, and what it started is ours now (its subreaper's orphans).
            // `hold` stops all of it, then releases the lease: exit 5, `supervisor_lost`.
            // Never "nothing was run".
            (Ok(()), None) | (Ok(()), Some(Ok(0))) | (Ok(()), Some(Err(_))) => Ok(Running {
                child,
                answered: false,
                bounds,
                report,
            }),
            // The start message never reached it: it started nothing.
            (Err(_), _) => Err(reaper_gone(
                child.id(),
                &program,
                "before it could be told to start it",
            )),
            (Ok(()), Some(read)) => {
                let mut why = Vec::new();
                if matches!(read, Ok(1)) {
                    why.push(first[0]);
                }
                // The reaper ends right after saying why: its end closes at once.
                let _ = tokio::time::timeout(NUDGE * 10, report.read_to_end(&mut why)).await;
                let why = String::from_utf8_lossy(&why).into_owned();
                // The reaper may have taken the terminal for its group before the exec failed:
                // taken back (a review: the caller's next read of its terminal failed).
                Terminal::give(child.id()).take_back();
                // The reaper ends right after saying why: waited for (bounded), so that the
                // run's cgroup goes with it (see `Forked`'s drop).
                let mut child = child;
                let _ = tokio::time::timeout(NUDGE * 10, child.wait()).await;
                let (errno, what) = match Failure::parse(&why) {
                    Failure::Expired => return Err(lost(lease, LostReason::Expired)),
                    Failure::Lost => {
                        return Err(Error::unavailable(
                            format!("the process fence's supervisor had ready to run `{program}` was killed before it could run it"),
                            "nothing was run and the lease was released: find what killed it (the OOM killer: `journalctl -k | grep -i oom`), then run the command again",
                        ))
                    }
                    Failure::Exec { errno, message } => (errno, message),
                };
                // A limit that passes is worth a retry.
                if matches!(errno, libc::EAGAIN | libc::ENOMEM) {
                    return Err(Error::unavailable(
                        format!("cannot start `{program}`: {what}"),
                        "a process or memory limit of this user was reached (`ulimit -u`); nothing was run and the lease was released: try again later",
                    ));
                }
                Err(cannot(&what))
            }
        }
    }
}

/// The supervisor of the command ended before it was told to start it (`when`): nothing was
/// run, and no lease is kept, so the run may simply be retried.
pub(super) fn reaper_gone(pid: Option<u32>, program: &str, when: &str) -> Error {
    Error::unavailable(
        format!(
            "fence's supervisor of `{program}` (`fence __reaper`, pid {}) ended {when} (killed?)",
            pid.map_or_else(|| "?".to_owned(), |pid| pid.to_string())
        ),
        "nothing was run and no lease was kept: find what killed it (the OOM killer: `journalctl -k | grep -i oom`), then run the command again",
    )
}

/// How often `fence run` continues a reaper that has not answered yet (its own command may
/// have stopped it).
const NUDGE: Duration = Duration::from_millis(100);

/// SIGCONT to `pid` (the reaper): stopped, it could enforce no bound.
pub(super) fn continue_process(pid: Option<u32>) {
    if let Some(pid) = pid.and_then(|pid| Pid::from_raw(pid as i32)) {
        let _ = rustix::process::kill_process(pid, Signal::CONT);
    }
}

/// A reaper told to go: the process, whether it said the command started, its pipes.
pub(super) struct Running {
    pub(super) child: Forked,
    /// The reaper said COMMAND started in time; false when it never answered.
    pub(super) answered: bool,
    pub(super) bounds: Bounds,
    pub(super) report: tokio::net::unix::pipe::Receiver,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        // Never told to go: it starts nothing, and ends now, before fence does: no process of
        // the run outlives it. Told by its start pipe's end (closed here), it ends on its own,
        // with its command's process (forked in advance, never run) waited for and the run's
        // cgroup removed; one that has not within [`REAPER_QUITS`] is SIGKILLed. A SIGKILLed
        // process that started nothing ends within milliseconds; the wait is bounded all the
        // same.
        drop(self.start.take());
        if let Some(child) = self.child.as_mut() {
            let start = std::time::Instant::now();
            child.wait_until(start + REAPER_QUITS);
            child.start_kill();
            child.wait_until(start + REAPER_ENDS_WITHIN);
        }
    }
}

/// How long dropping an unused reaper waits for it to end on its own (see [`Reaper`]'s
/// `Drop`), then in all.
const REAPER_QUITS: Duration = Duration::from_millis(500);
const REAPER_ENDS_WITHIN: Duration = Duration::from_secs(2);

/// How long dropping a reaper that [reported](Forked::reported) the command's end waits for
/// its own end.
const REPORTED_ENDS_WITHIN: Duration = Duration::from_millis(100);

/// The forked reaper, as a `tokio::process::Child` would have it: waited for by its pid,
/// woken by SIGCHLD (pidfds are not everywhere: seccomp profiles refuse them).
pub(super) struct Forked {
    pid: Pid,
    /// SIGCHLD, from the first wait on: taken before each look, so that an end between the
    /// look and the wait is not missed.
    ended: Option<tokio::signal::unix::Signal>,
    status: Option<ExitStatus>,
    /// Its report said the command ended, and the run's cgroup was empty then: it is only
    /// ending itself (see [`Self::reported`]).
    reported: bool,
}

impl Forked {
    /// Its pid, until it has been waited for.
    pub(super) fn id(&self) -> Option<u32> {
        self.status
            .is_none()
            .then(|| self.pid.as_raw_pid().unsigned_abs())
    }

    /// Its status if it has ended (waited for then), without blocking.
    pub(super) fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        use std::os::unix::process::ExitStatusExt;
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        loop {
            match rustix::process::waitpid(Some(self.pid), rustix::process::WaitOptions::NOHANG) {
                Ok(Some((_, ended))) => {
                    let status = ExitStatus::from_raw(ended.as_raw());
                    self.status = Some(status);
                    return Ok(Some(status));
                }
                Ok(None) => return Ok(None),
                Err(rustix::io::Errno::INTR) => {}
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// Waits for it to end (cancel-safe).
    pub(super) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if self.ended.is_none() {
            self.ended = Some(tokio::signal::unix::signal(
                tokio::signal::unix::SignalKind::child(),
            )?);
        }
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            if let Some(ended) = self.ended.as_mut() {
                ended.recv().await;
            }
        }
    }

    /// Its report said the command ended (with its status) and the run's cgroup holds no
    /// process: nothing of the command is left, and the reaper does nothing more but end.
    /// `fence run` goes on without waiting for that end (0.1 ms: its exit, then SIGCHLD); the
    /// run's cgroup is removed when this is dropped, the reaper's end then waited for only if
    /// it has come.
    pub(super) fn reported(&mut self) {
        self.reported = true;
    }

    /// Waits, blocking, until it has ended or `deadline` has passed: looked at after a pause
    /// that grows from 20 us to 1 ms (a reaper that is ending ends within a millisecond).
    fn wait_until(&mut self, deadline: std::time::Instant) {
        let mut pause = Duration::from_micros(20);
        while matches!(self.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// SIGKILL, unless it has been waited for (its pid may be another's by then).
    pub(super) fn start_kill(&mut self) {
        if self.status.is_none() {
            let _ = rustix::process::kill_process(self.pid, Signal::KILL);
        }
    }
}

impl Drop for Forked {
    /// A reaper that ended is waited for (not left a zombie until fence ends), with what it
    /// left to us as their subreaper that has ended already (not waited for: a child fence
    /// had before, `sh -c 'job & exec fence run …'`, is not the run's), and the run's cgroup
    /// removed; one that has not is left alone: it ends on its own (its start pipe closed),
    /// or is fence's to stop (one that [reported](Self::reported) the command's end is waited
    /// for a moment, and the run's cgroup, empty, removed all the same).
    fn drop(&mut self) {
        if matches!(self.try_wait(), Ok(Some(_))) {
            // The command's process, should the reaper have been killed before it could wait
            // for it, is ours: it dies of its own parent-death signal, at once.
            crate::sys::reap_children();
            crate::reaper::cgroup::remove();
        } else if self.reported {
            // Still ending, its report whole: waited for a moment (its exit takes 0.1 ms),
            // so that fence does not end before it and leave it, an orphan, to whoever is
            // subreaper above: a `fence run` around this one took it for a leftover (a
            // review). One that has not ended by then is left to end on its own.
            self.wait_until(std::time::Instant::now() + REPORTED_ENDS_WITHIN);
            if matches!(self.try_wait(), Ok(Some(_))) {
                crate::sys::reap_children();
            }
            crate::reaper::cgroup::remove();
        }
    }
}

/// A pipe, both ends close-on-exec: (read end, write end).
fn pipe() -> std::io::Result<(std::fs::File, std::os::fd::OwnedFd)> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    Ok((read.into(), write))
}

/// What the reaper said as it ended (read once the reaper is gone: the pipe is then at its
/// end), after what was read of it before (`read`).
pub(super) async fn reaper_report(
    report: &mut tokio::net::unix::pipe::Receiver,
    read: Vec<u8>,
) -> Report {
    use tokio::io::AsyncReadExt;
    let mut rest = read;
    // The reaper is gone, so its end is closed: the read ends at once.
    let _ = tokio::time::timeout(NUDGE * 10, report.read_to_end(&mut rest)).await;
    Report::parse(&String::from_utf8_lossy(&rest))
}
