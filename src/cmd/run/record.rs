//! The run's own events in the store's history (`run_started`, `run_finished`,
//! `run_stopped`), so that `fence log R` tells what became of each run: best effort, bounded
//! in time, never changing the exit status or the lease (a failure is a warning).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use rustix::process::Signal;
use tokio::time::Instant;

use crate::coordinator::{Coordinator, EventKind, LeaseRef, RunEvent, RunNote};

/// How long a run event may take before the run goes on without it.
const RECORD_WITHIN: Duration = Duration::from_secs(2);
/// The `run_stopped` reason of a run whose command never ran.
const NOT_STARTED: &str = "not_started";

/// What a run records: its lease and the note every one of its events starts from.
pub(super) struct Recorder {
    lease: LeaseRef,
    base: RunNote,
    started: Instant,
}

/// How a run ended, as [`super::hold::Held`] saw it.
pub(super) struct Ending {
    pub(super) status: ExitStatus,
    pub(super) lost: Option<crate::error::LostReason>,
    pub(super) lost_after: Option<crate::error::LostReason>,
    pub(super) timed_out: bool,
    pub(super) interrupted: Option<i32>,
    pub(super) sent: Option<Signal>,
    pub(super) ended_ns: u64,
    pub(super) bound: u64,
}

impl Recorder {
    /// For the command `program` (its first word), with argument digest `digest` (runs with
    /// an id), started in process group `group`.
    pub(super) fn new(
        lease: &LeaseRef,
        run_id: &str,
        program: &std::ffi::OsStr,
        digest: Option<&str>,
        group: Option<u32>,
    ) -> Recorder {
        Recorder {
            lease: lease.clone(),
            base: RunNote {
                run_id: run_id.to_owned(),
                group,
                program: Some(program.to_string_lossy().into_owned()),
                command: digest.map(str::to_owned),
                ..RunNote::default()
            },
            started: Instant::now(),
        }
    }

    /// `run_started`, before the command starts: waited for at most `within`.
    pub(super) async fn started(&self, coordinator: &dyn Coordinator, within: Duration) {
        let note = RunNote {
            host: Some(crate::cmd::acquire::hostname()),
            pid: Some(std::process::id()),
            ..self.base.clone()
        };
        record(
            coordinator,
            &self.lease,
            &EventKind::RunStarted,
            &note,
            within.min(RECORD_WITHIN),
        )
        .await;
    }

    /// `run_finished` or `run_stopped`.
    pub(super) async fn ended(&self, coordinator: &dyn Coordinator, ending: &Ending) {
        let (kind, note) = self.ending_note(ending);
        record(coordinator, &self.lease, &kind, &note, RECORD_WITHIN).await;
    }

    /// `run_stopped` with the reason `not_started`: the run recorded `run_started`, but its
    /// command never ran (it could not be executed, or its process was lost first).
    pub(super) async fn not_started(&self, coordinator: &dyn Coordinator) {
        let note = RunNote {
            run_id: self.base.run_id.clone(),
            reason: Some(NOT_STARTED.to_owned()),
            duration_ms: Some(
                i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX),
            ),
            ..RunNote::default()
        };
        record(
            coordinator,
            &self.lease,
            &EventKind::RunStopped,
            &note,
            RECORD_WITHIN,
        )
        .await;
    }

    fn ending_note(&self, e: &Ending) -> (EventKind, RunNote) {
        let mut note = RunNote {
            run_id: self.base.run_id.clone(),
            exit_status: Some(command_status(e.status)),
            duration_ms: Some(
                i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX),
            ),
            ..RunNote::default()
        };
        let reason = match (e.lost, e.timed_out, e.interrupted) {
            (Some(lost), _, _) => {
                if lost != crate::error::LostReason::SupervisorLost {
                    let after = i128::from(e.ended_ns) - i128::from(e.bound);
                    note.after_lease_end_ms = Some((after / 1_000_000) as i64);
                }
                Some(lost.name())
            }
            (None, true, _) => Some("max_time"),
            (None, false, Some(_)) => Some("interrupted"),
            (None, false, None) => None,
        };
        let Some(reason) = reason else {
            note.lost_after = e.lost_after.map(|lost| lost.name().to_owned());
            return (EventKind::RunFinished, note);
        };
        note.reason = Some(reason.to_owned());
        note.signal = e
            .status
            .signal()
            .or(e.interrupted)
            .or(e.sent.map(Signal::as_raw))
            .map(signal_name);
        (EventKind::RunStopped, note)
    }
}

/// The command's status as `fence run` passes it on: its exit code, or 128 + the signal
/// that killed it.
pub(super) fn command_status(status: ExitStatus) -> u8 {
    status
        .code()
        .map(|c| c as u8)
        .or_else(|| status.signal().map(|s| 128 + s as u8))
        .unwrap_or(1)
}

/// A signal's name (`SIGTERM`), or `signal N`.
fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        _ => return format!("signal {signal}"),
    };
    name.to_owned()
}

async fn record(
    coordinator: &dyn Coordinator,
    lease: &LeaseRef,
    kind: &EventKind,
    note: &RunNote,
    within: Duration,
) {
    let run = RunEvent {
        resource: &lease.resource,
        owner: &lease.owner,
        token: lease.token,
        kind,
        note,
    };
    let why = match crate::time::answer_within(within, coordinator.record_run(&run)).await {
        Ok(Ok(())) => return,
        Ok(Err(err)) => err.to_string(),
        Err(_) => format!("no answer within {}", crate::time::duration(within)),
    };
    crate::terminal::warn(&format!(
        "warning: the `{kind}` event of run {} was not recorded in the history of `{}` ({why}); the run is not affected",
        note.run_id, lease.resource
    ));
}

#[cfg(test)]
mod tests {
    use super::signal_name;

    #[test]
    fn signals_are_named() {
        assert_eq!(signal_name(libc::SIGTERM), "SIGTERM");
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(40), "signal 40");
    }
}
