//! The supervision loop: the lease held while the command runs, renewed, and bounded.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitStatus;
use std::rc::Rc;
use std::time::Duration;

use rustix::process::{Pid, Signal};
use tokio::io::AsyncReadExt;
use tokio::time::{sleep_until, Instant};

use super::supervisor::{continue_process, reaper_report, Forked, Running};
use crate::cmd::Context;
use crate::coordinator::{Coordinator, Lease, LeaseRef};
use crate::error::{ConflictKind, Error, LostReason};
use crate::reaper::wire::Report;
use crate::signals::Interrupts;

/// How `fence run` holds its lease: the TTL asked for, how long before the bound the command
/// gets SIGTERM should no renewal be proven ([`Plan::grace`]), and `--kill-after`.
#[derive(Clone, Copy)]
pub(super) struct Plan {
    pub(super) ttl: Duration,
    /// `--kill-after`, but at most a fifth of the TTL (renewals go out every third of it, and
    /// what is left is for their retries): SIGTERM comes that long before the bound, SIGKILL
    /// at the bound, so nothing of the command outlives the bound.
    pub(super) grace: Duration,
    pub(super) kill_after: Duration,
    /// `--max-time`: how long the command may run before it is stopped.
    pub(super) max_time: Option<Duration>,
}

/// What [`hold`] saw by the time nothing of the command was left.
pub(super) struct Held {
    /// The reaper's status: the command's, passed on.
    pub(super) status: ExitStatus,
    /// Why the command was stopped before it ended on its own (the run then ends with this
    /// lost lease; the lease was released when it was still provably ours).
    pub(super) lost: Option<LostReason>,
    /// Processes of the command were left when it ended, and were stopped.
    pub(super) leftovers: bool,
    /// The first stop signal that reached the command.
    pub(super) interrupted: Option<i32>,
    /// The command was stopped because it ran past `--max-time`.
    pub(super) timed_out: bool,
    /// The lease was lost only after the command had finished inside it, on its own (the
    /// reaper saw it end before the bound, before fence signalled it): fence itself was
    /// paused or could not reach the store. The command's status stands.
    pub(super) lost_after: Option<LostReason>,
    /// The first stop signal sent to the command (by this process, or by the reaper at the
    /// bound), for the run's record.
    pub(super) sent: Option<Signal>,
    /// When the command's supervisor was seen to end, and the lease's bound then (bound
    /// clock ns): how long after the lease's bound the command ended.
    pub(super) ended_ns: u64,
    pub(super) bound: u64,
    /// The coordinator's connection, as the last renewal left it.
    pub(super) coordinator: Rc<dyn Coordinator>,
    /// The reaper, waited for or ending (it reported the command's end): kept until the lease
    /// is released, and dropped then (see `Forked`'s drop).
    pub(super) supervisor: Forked,
}

/// The command is being stopped: SIGTERM went out, SIGKILL is due at `graceful_until` (or at
/// the bound, whichever is first; at once once the lease is lost).
struct Stop {
    graceful_until: u64,
    /// When SIGKILL went out; it goes out again at every [`POLL`] until nothing is left.
    killed: Option<Instant>,
    /// Process groups made only of the command's processes (see
    /// [`crate::sys::kill_descendants_once`]).
    groups: Vec<Pid>,
    /// The processes that would not die were named.
    warned: bool,
}

impl Stop {
    fn until(graceful_until: u64) -> Option<Stop> {
        Some(Stop {
            graceful_until,
            killed: None,
            groups: Vec::new(),
            warned: false,
        })
    }
}

/// A renewal in flight: the connection it went on, when it was sent (bound clock ns), and its
/// answer (`None`: none in time).
type Renewal<'a> =
    Pin<Box<dyn Future<Output = (Rc<dyn Coordinator>, u64, Option<Result<Lease, Error>>)> + 'a>>;

/// One renewal of `lease`, as a future the loop of [`hold`] polls beside its timers (so that
/// no wait for the store delays the command's SIGTERM or SIGKILL): first, when `cancel_first`,
/// the cancel of the one that was left unanswered (queued behind a lock, it would otherwise
/// commit later, for a run that may have been reported lost by then), then, when `reconnect`,
/// a fresh connection. Waits for an answer until `bound`, and at least [`CLASSIFY_WITHIN`].
fn renewal<'a>(
    ctx: &'a Context,
    mut coordinator: Rc<dyn Coordinator>,
    lease: &LeaseRef,
    ttl: Duration,
    bound: u64,
    (reconnect, cancel_first): (bool, bool),
) -> Renewal<'a> {
    let lease = lease.clone();
    let wait = move || {
        Duration::from_nanos(bound.saturating_sub(crate::sys::bound_clock_ns()))
            .max(CLASSIFY_WITHIN)
    };
    Box::pin(async move {
        if cancel_first {
            coordinator.cancel_pending().await;
        }
        if reconnect {
            match tokio::time::timeout(wait(), ctx.coordinator()).await {
                Ok(Ok(fresh)) => coordinator = Rc::from(fresh),
                Ok(Err(err)) => return (coordinator, 0, Some(Err(err))),
                Err(_) => return (coordinator, 0, None),
            }
        }
        let sent = crate::sys::bound_clock_ns();
        let answer = tokio::time::timeout(wait(), coordinator.renew(&lease, Some(ttl)))
            .await
            .ok();
        (coordinator, sent, answer)
    })
}

/// Sleeps until `deadline` on the bound clock (forever for `u64::MAX`). The runtime's timers
/// do not count a suspend, so the clock is read again at least every [`TICK`].
async fn until(deadline: u64) {
    if deadline == u64::MAX {
        return std::future::pending().await;
    }
    loop {
        let now = crate::sys::bound_clock_ns();
        if now >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_nanos(deadline - now).min(TICK)).await;
    }
}

/// How often a wait for a bound reads the bound clock again (see [`until`]).
const TICK: Duration = Duration::from_millis(200);
/// How often the command's leftovers are looked at (and SIGKILLed again, once due).
const POLL: Duration = Duration::from_millis(10);
/// How long after SIGKILL processes that are still there are named (uninterruptible sleep).
const UNKILLABLE_AFTER: Duration = Duration::from_secs(2);

/// Holds the lease while the command runs, and until nothing of it is left.
///
/// Renewals go out every TTL/3 until then, also while the command is being stopped; each one
/// proven moves the bound (sent + granted) and is passed on to the reaper. Should none be
/// proven, the command gets SIGTERM `grace` before the bound and SIGKILL at the bound, from
/// this process and, on its own clock, from the reaper (whichever of the two is still able:
/// either may be paused or killed). A definite answer that the lease is gone (taken over,
/// expired) stops everything with SIGKILL at once. When the command ends on its own, what it
/// left running (in its group or not: every process it started descends from this one, the
/// subreaper of the reaper's orphans) gets SIGTERM and, after `--kill-after` (never past the
/// bound), SIGKILL — while the lease is renewed. The reaper is continued at every renewal (the
/// command may stop it); one that never said the command started, or that was killed, is
/// lost: everything is stopped at once, and the run ends with `supervisor_lost`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn hold(
    ctx: &Context,
    lease: &LeaseRef,
    mut coordinator: Rc<dyn Coordinator>,
    running: Running,
    interrupts: &mut Interrupts,
    mut bound: u64,
    plan: Plan,
) -> Result<Held, Error> {
    let Running {
        mut child,
        answered,
        bounds,
        mut report,
    } = running;
    let pgid = child.id().and_then(|pid| Pid::from_raw(pid as i32));
    let every = plan.ttl / 3;
    // The first renewal a third of the TTL after the command started, as every later one
    // after the one before (GCS allows one write per second to the lease record, and a TTL of
    // 3 s renews every second); but after a slow grant (more than half of that third gone
    // since it was asked for), a third of the TTL after it was asked for.
    let since_sent = (plan.ttl - margin(plan.ttl)).saturating_sub(Duration::from_nanos(
        bound.saturating_sub(crate::sys::bound_clock_ns()),
    ));
    let first = if since_sent > every / 2 {
        every.saturating_sub(since_sent)
    } else {
        every
    };
    let mut next_renew = Instant::now() + first;
    let mut in_flight: Option<Renewal> = None;
    let mut renewing = true;
    let (mut reconnect, mut cancel_first) = (false, false);
    let mut last_error: Option<String> = None;
    let mut status: Option<ExitStatus> = None;
    let mut lost: Option<LostReason> = None;
    let mut unproven = false;
    let mut stop: Option<Stop> = None;
    let mut leftovers = false;
    let mut interrupted: Option<i32> = None;
    // A process that did not die on SIGKILL was still there once the lease was not proven.
    let mut outlived = false;
    // What the reaper said as it ended (read once it has been waited for, or as soon as it
    // said it, see below), and what of it was read before its end.
    let mut told = Report::default();
    let mut said = Vec::new();
    // Its report pipe reached its end or failed: only its end is waited for.
    let mut unsaid = false;
    let mut chunk = vec![0u8; REPORT_KEPT];
    // It reported the command's end and status, with the run's cgroup empty: the loop ends
    // without waiting for the reaper's own end.
    let mut reported = false;
    // `--max-time`: when the command is stopped, however its lease fares.
    let max_at = plan
        .max_time
        .and_then(|limit| Instant::now().checked_add(limit));
    // The same limit on the bound clock, to tell a command that ended past it on its own.
    let max_at_ns = plan
        .max_time
        .map(|limit| crate::sys::bound_clock_ns().saturating_add(nanos(limit)));
    let mut timed_out = false;
    let mut sent: Option<Signal> = None;
    let mut ended_ns = 0;
    if !answered {
        lost = Some(LostReason::SupervisorLost);
        stop = Stop::until(0);
    }
    loop {
        if reported {
            break;
        }
        if status.is_some() {
            crate::sys::reap_children();
            if !crate::sys::has_children() {
                break;
            }
        }
        // A branch that starts a grace period reads the clock when it runs, not when this turn
        // of the loop began (a turn may wait a third of the TTL): --kill-after is given whole.
        let term_at = match stop {
            None => bound.saturating_sub(nanos(plan.grace)),
            Some(_) => u64::MAX,
        };
        let kill_at = match &stop {
            Some(Stop { killed: None, .. }) if lost.is_some() => 0,
            Some(Stop {
                killed: None,
                graceful_until,
                ..
            }) => (*graceful_until).min(bound),
            _ => u64::MAX,
        };
        // The command's end is looked at first, and directly: after a pause (fence stopped,
        // the machine suspended) the runtime runs its timers before it learns that the
        // supervisor ended meanwhile, and a command that finished inside its lease and before
        // `--max-time` would be reported stopped by them (see [`ended_meanwhile`]).
        let exited = match status {
            None => child.try_wait().map_err(cannot_wait)?,
            Some(_) => None,
        };
        tokio::select! {
            biased;
            waited = async {
                match exited {
                    Some(ended) => Ok(ended),
                    None => child.wait().await,
                }
            }, if status.is_none() => {
                let waited = waited.map_err(cannot_wait)?;
                status = Some(waited);
                ended_ns = crate::sys::bound_clock_ns();
                // Its report is complete now (its end of the pipe closed with it): a reaper
                // that did not say it ended on its own was killed, and what it left is stopped
                // at once, not after --kill-after (nothing supervised it any more).
                told = reaper_report(&mut report, std::mem::take(&mut said)).await;
                // A whole report's status is the command's, even when the reaper did not end
                // as it does after one (killed in that instant: the OOM killer), whichever of
                // its end and its report this process saw first (a review).
                if let Some(command) = told.command_status() {
                    status = Some(command);
                }
                let killed_here = stop.as_ref().is_some_and(|s| s.killed.is_some());
                if !told.ended && !killed_here {
                    lost.get_or_insert(LostReason::SupervisorLost);
                }
                // The reaper has been waited for: any child of ours now is an orphan of the
                // command (the reaper died before it could stop them all).
                crate::sys::reap_children();
                if crate::sys::has_children() {
                    leftovers = true;
                    if lost.is_some() {
                        stop.get_or_insert_with(|| Stop::until(0).expect("some"));
                    } else if stop.is_none() {
                        crate::sys::signal_descendants(Signal::TERM, false);
                        crate::sys::signal_descendants(Signal::CONT, false);
                        stop = Stop::until(crate::sys::bound_clock_ns().saturating_add(nanos(plan.kill_after)));
                    }
                }
            }
            _ = until(kill_at) => {
                if ended_meanwhile(&mut child, status)? {
                    continue;
                }
                if let Some(stop) = stop.as_mut() {
                    if status.is_none() {
                        sent.get_or_insert(Signal::KILL);
                    }
                    forward(pgid, Signal::KILL);
                    crate::sys::kill_descendants_once(&mut stop.groups);
                    stop.killed = Some(Instant::now());
                }
            }
            _ = until(term_at) => {
                if ended_meanwhile(&mut child, status)? {
                    continue;
                }
                // No renewal was proven in time: the command stops before the bound. The
                // reaper, on the same bound by its own clock, sends the SIGTERM (once: a
                // second one would run a shell's trap twice); it is continued in case its
                // command stopped it, and the SIGKILL at the bound is ours too. Without a
                // reaper any more, what is left gets the SIGTERM from here.
                unproven = true;
                if status.is_none() {
                    sent.get_or_insert(Signal::TERM);
                    continue_process(child.id());
                } else {
                    crate::sys::signal_descendants(Signal::TERM, false);
                    crate::sys::signal_descendants(Signal::CONT, false);
                }
                stop = Stop::until(crate::sys::bound_clock_ns().saturating_add(nanos(plan.kill_after)));
            }
            _ = sleep_until(max_at.unwrap_or_else(Instant::now)),
                if max_at.is_some() && !timed_out && stop.is_none() && status.is_none() => {
                if ended_meanwhile(&mut child, status)? {
                    continue;
                }
                // Ran past --max-time: stopped as an interrupt would stop it (the reaper
                // passes the SIGTERM on to what left the group), SIGKILL after --kill-after,
                // never past the bound; the lease is renewed meanwhile and released after.
                timed_out = true;
                sent.get_or_insert(Signal::TERM);
                forward(pgid, Signal::TERM);
                forward(pgid, Signal::CONT);
                stop = Stop::until(crate::sys::bound_clock_ns().saturating_add(nanos(plan.kill_after)));
            }
            _ = tokio::time::sleep(POLL), if status.is_some() => {
                if let Some(Stop { killed: Some(at), groups, warned, .. }) = stop.as_mut() {
                    crate::sys::kill_descendants_once(groups);
                    // Still there past the bound (or a definite loss): the lease can be
                    // another owner's while it may yet wake up and write.
                    if *warned && (gone(lost) || crate::sys::bound_clock_ns() >= bound) {
                        outlived = true;
                    }
                    if !*warned && at.elapsed() >= UNKILLABLE_AFTER {
                        *warned = true;
                        crate::terminal::warn(&format!(
                            "warning: processes of the command did not end on SIGKILL (in uninterruptible sleep?): pid {}; fence renews the lease until they end",
                            crate::sys::live_descendants()
                                .iter()
                                .map(|p| p.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                    }
                }
            }
            (signal, _) = interrupts.next() => {
                if status.is_none() {
                    interrupted.get_or_insert(signal.as_raw());
                    sent.get_or_insert(signal);
                    forward(pgid, signal);
                    forward(pgid, Signal::CONT);
                } else if let Some(stop) = stop.as_mut() {
                    // Asked again while the leftovers are stopped: no more grace.
                    stop.graceful_until = 0;
                }
            }
            _ = sleep_until(next_renew), if renewing && in_flight.is_none() => {
                if status.is_none() {
                    continue_process(child.id());
                }
                in_flight = Some(renewal(
                    ctx,
                    coordinator.clone(),
                    lease,
                    plan.ttl,
                    bound,
                    (reconnect, cancel_first),
                ));
            }
            (used, sent, answer) = async { in_flight.as_mut().expect("guarded").await }, if in_flight.is_some() => {
                in_flight = None;
                coordinator = used;
                match answer {
                    Some(Ok(renewed)) => {
                        (reconnect, cancel_first) = (false, false);
                        last_error = None;
                        bound = bound_of(sent, plan.ttl, renewed.expires_in_ms);
                        if status.is_none() {
                            bounds.send(bound);
                        }
                        // A third of the TTL after the answer: GCS takes one write per
                        // second to the lease record, and at the shortest TTL it allows (3 s)
                        // renewals sent a third of the TTL apart could land closer than that.
                        next_renew = Instant::now() + every;
                    }
                    Some(Err(err)) if definite_loss(&err).is_some() => {
                        lost = lost.or(definite_loss(&err));
                        renewing = false;
                        stop.get_or_insert_with(|| Stop::until(0).expect("some"));
                    }
                    other => {
                        // Anything else may pass (a lost connection, a timeout, local I/O):
                        // try again soon on a fresh connection, cancelling the unanswered one.
                        cancel_first = other.is_none();
                        last_error = Some(match other {
                            Some(Err(err)) => err.to_string(),
                            _ => match coordinator.connect_refusal() {
                                Some(refusal) => format!(
                                    "no answer in time: PostgreSQL was refusing connections ({refusal})"
                                ),
                                None => "no answer in time".to_owned(),
                            },
                        });
                        reconnect = true;
                        next_renew = Instant::now() + retry_after(plan.ttl);
                    }
                }
            }
            // The reaper writes its report in one write, once the command and all it started
            // are gone, and then only ends (its exit, then SIGCHLD above: 0.1 ms). A whole
            // report with the command's status is taken at once, if the kernel agrees that
            // nothing is left: the run's cgroup holds no process. (Lines a command running as
            // root forged into the pipe, through /proc, would otherwise end the run while it
            // runs: it is in that cgroup.) Without a cgroup, or with one still populated, the
            // reaper's end is waited for, as before. Last of the branches, and only the
            // newest few KiB kept: a command running as root that floods the pipe neither
            // keeps this loop from its timers and renewals nor fills its memory (a review).
            read = report.read(&mut chunk), if status.is_none() && !unsaid => {
                match read {
                    Ok(n) if n > 0 => said.extend_from_slice(&chunk[..n]),
                    // Its end of the pipe closed (it is ending, or was killed) or the pipe
                    // failed: its end is waited for.
                    _ => {
                        unsaid = true;
                        continue;
                    }
                }
                if said.len() > 2 * REPORT_KEPT {
                    said.drain(..said.len() - REPORT_KEPT);
                }
                if !said.ends_with(b"\nended\n") {
                    continue;
                }
                let whole = Report::parse(&String::from_utf8_lossy(&said));
                if let Some(command) = whole.command_status() {
                    if crate::reaper::cgroup::emptied() {
                        status = Some(command);
                        ended_ns = crate::sys::bound_clock_ns();
                        told = whole;
                        child.reported();
                        reported = true;
                    }
                }
            }
        }
    }
    let status = status.expect("the loop ends once the reaper was waited for");
    // The command's end was handled before a due SIGTERM timer (see [`ended_meanwhile`]): no
    // renewal was proven in time all the same.
    if stop.is_none() && crate::sys::bound_clock_ns() >= bound.saturating_sub(nanos(plan.grace)) {
        unproven = true;
    }

    // The reaper stopped the command at the bound: this process did not prove one in time
    // (paused, or the machine was suspended, which the runtime's timers do not count).
    unproven |= told.bound;
    if told.bound {
        // The reaper's SIGTERM at the bound, on its own clock.
        sent.get_or_insert(Signal::TERM);
    }
    // When the reaper saw the command end: this process may have been paused then.
    let ended_ns = told.at.unwrap_or(ended_ns);
    // It ended on its own, past --max-time, before fence could stop it (fence was paused, or
    // the machine suspended): its status stands, but not without a word.
    if let (false, Some(limit), Some(at)) = (timed_out, plan.max_time, max_at_ns) {
        // Leftovers or not: the command itself ended on its own, not at the bound.
        let on_its_own = told.ended
            && !told.bound
            && told.at.is_some()
            && sent.is_none()
            && interrupted.is_none()
            && told.interrupted.is_none();
        // By more than a wake-up's jitter: a command that ends as the limit comes, while
        // fence is awake, is no news.
        if on_its_own && ended_ns > at.saturating_add(nanos(Duration::from_secs(1))) {
            crate::terminal::warn(&format!(
                "warning: the command ran past --max-time {} (it ended {} after the limit, on its own, while fence was paused or the machine suspended); its status stands",
                crate::time::duration(limit),
                crate::time::duration(Duration::from_nanos(ended_ns - at)),
            ));
        }
    }
    if lost.is_none() && unproven {
        // Ask once why, for the report (the renewal in flight, or a new one).
        let asked = match in_flight.take() {
            // Its coordinator (a fresh one, after a reconnect) kept what refused it.
            Some(flight) => match crate::time::answer_within(CLASSIFY_WITHIN, flight).await {
                Ok((used, _, answer)) => {
                    coordinator = used;
                    answer
                }
                Err(_) => None,
            },
            None => crate::time::answer_within(CLASSIFY_WITHIN, coordinator.renew(lease, None))
                .await
                .ok(),
        };
        if asked.is_none() {
            // Unanswered, it must not renew the lease later (see `cancel_pending`).
            coordinator.cancel_pending().await;
        }
        // Why the renewals failed: this last answer, else the last failed attempt, and what
        // the server said when it refused a new connection.
        let failed = match &asked {
            Some(Err(err)) if !matches!(err, Error::Stale { .. } | Error::LeaseLost { .. }) => {
                Some(err.to_string())
            }
            _ => None,
        }
        .or(last_error);
        let refused = coordinator
            .connect_refusal()
            .filter(|refusal| {
                !failed
                    .as_ref()
                    .is_some_and(|f| f.contains(refusal.as_str()))
            })
            .map(|refusal| format!("PostgreSQL was refusing connections ({refusal})"));
        let cause = match (failed, refused) {
            (Some(failed), Some(refused)) => Some(format!("{failed}; {refused}")),
            (failed, refused) => failed.or(refused),
        };
        lost = Some(match asked {
            Some(Ok(_)) => {
                // Still ours by the store's clock, but too late to prove in time: hand it
                // back, nothing of the command is left.
                let _ = coordinator.release(lease).await;
                LostReason::Unreachable
            }
            Some(Err(err)) => definite_loss(&err).unwrap_or(LostReason::Unreachable),
            None => LostReason::Unreachable,
        });
        if let Some(cause) = cause {
            crate::terminal::warn(&format!("the last renewal attempt failed: {cause}"));
        }
    }
    if let Some(Stop {
        killed: Some(at),
        warned: true,
        ..
    }) = &stop
    {
        // It ended past the bound: so was it there past it (fence may have been paused).
        if outlived || gone(lost) || crate::sys::bound_clock_ns() >= bound {
            lost = Some(LostReason::Unkillable);
        } else {
            crate::terminal::warn(&format!(
                "warning: the last process of the command ended {:.1}s after SIGKILL; the lease was renewed until then",
                at.elapsed().as_secs_f64()
            ));
        }
    }
    // The reaper saw the command end before the bound, with nothing left running, and then
    // reported: so the command ended inside its lease, and not by this process's hand (a
    // lost lease is stopped with SIGKILL to the whole group, the reaper included, which then
    // reports nothing). Whatever became of the lease since (this process was paused past it,
    // or the store could not be reached), the command's status stands.
    let mut lost_after = None;
    if told.inside.is_some() && gone(lost) && lost != Some(LostReason::Unkillable) {
        lost_after = lost.take();
    }
    if lost == Some(LostReason::SupervisorLost) {
        // Nothing of the command is left and the lease is still ours: hand it back.
        let _ = coordinator.release(lease).await;
    }
    Ok(Held {
        status,
        lost,
        leftovers: leftovers || told.leftovers,
        interrupted: interrupted.or(told.interrupted),
        timed_out,
        lost_after,
        sent,
        ended_ns,
        bound,
        coordinator,
        supervisor: child,
    })
}

/// Whether `lost` says the lease may be another owner's now (`supervisor_lost` does not: the
/// lease is still renewed then).
fn gone(lost: Option<LostReason>) -> bool {
    lost.is_some_and(|reason| reason != LostReason::SupervisorLost)
}

/// The lease's bound on the bound clock (see [`crate::sys::bound_clock_ns`]): when the request
/// that obtained it was sent, plus what the coordinator granted (never more than the TTL asked
/// for), less [`margin`]. The coordinator extended the lease at or after `sent`, so the bound
/// is before the coordinator's own expiry, by the margin at least, and no wall clock is
/// compared (I7). Nothing of the command runs past it: SIGKILL goes out there.
pub(super) fn bound_of(sent: u64, ttl: Duration, expires_in_ms: i64) -> u64 {
    let granted = Duration::from_millis(expires_in_ms.max(0) as u64);
    sent.saturating_add(nanos(ttl.min(granted).saturating_sub(margin(ttl))))
}

/// How much earlier than the store's expiry the command is killed: the time a SIGKILL takes
/// to land (a scan of /proc, a wake-up on a loaded machine) comes out of it, so that the
/// command is gone before another owner can be granted the lease. A tenth of the TTL, at most
/// a second: a twentieth (100 ms at a TTL of 2 s) was once seen overrun on a machine so
/// starved that the command's own writes were 400 ms apart.
fn margin(ttl: Duration) -> Duration {
    (ttl / 10).min(Duration::from_secs(1))
}

pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// How long to wait, once the lease could not be proven, for the store to say why.
const CLASSIFY_WITHIN: Duration = Duration::from_secs(1);

fn retry_after(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(20), Duration::from_millis(500))
}

/// How much of the reaper's report pipe [`hold`] keeps of what it read before the reaper's
/// end: the newest bytes (its report is a few lines, in one write, and the last report
/// counts).
const REPORT_KEPT: usize = 4096;

/// Whether the command ended by the time a timer of [`hold`] fired (after a pause, both come
/// due at once, and the timer is looked at first): its end is then handled first, at the
/// next turn of the loop, and the timer seen again after it.
fn ended_meanwhile(child: &mut Forked, status: Option<ExitStatus>) -> Result<bool, Error> {
    Ok(status.is_none() && child.try_wait().map_err(cannot_wait)?.is_some())
}

fn cannot_wait(err: std::io::Error) -> Error {
    Error::internal(
        format!("cannot wait for the command: {err}"),
        "check the system's process limits",
    )
}

fn forward(pgid: Option<Pid>, signal: Signal) {
    if let Some(pgid) = pgid {
        let _ = rustix::process::kill_process_group(pgid, signal);
    }
}

/// The loss a renewal's refusal proves, if it proves one: taken over, lost, or a lease the
/// store does not know (no lease, its token never issued, or held by another owner: its
/// record was removed, reset or restored, and another owner may hold the token now). Anything
/// else may pass. The store that did not know the lease was retried as a passing failure, and
/// the command ran on beside the new holder of its token until its bound (review 21).
fn definite_loss(err: &Error) -> Option<LostReason> {
    match err {
        Error::Stale { highest_token, .. } => Some(LostReason::TakenOver {
            highest_token: *highest_token,
        }),
        Error::LeaseLost { reason, .. } => Some(*reason),
        Error::Conflict {
            kind:
                ConflictKind::NoLease
                | ConflictKind::NeverIssued { .. }
                | ConflictKind::WrongOwner { .. },
            ..
        } => Some(LostReason::RecordLost),
        _ => None,
    }
}
