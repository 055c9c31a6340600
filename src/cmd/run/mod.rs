//! `fence run`: hold a lease for a command's whole life, and stop the command when the lease
//! can no longer be proven.
//!
//! The lease counts as valid until `sent + TTL` by this machine's monotonic clock, where
//! `sent` is when the last successful renewal was sent: the coordinator extended the lease
//! at or after that instant, so this bound never outlives the coordinator's own expiry (I7:
//! no wall clock is compared). Transient renewal errors are ridden out only within that bound;
//! past it, or on a definite answer (expired, taken over), the command's whole process group
//! gets SIGTERM and, after `--kill-after`, SIGKILL.
//!
//! Run ids (`--id KEY`, `FENCE_RUN_ID`): the command gets `FENCE_RUN_ID` (without an id,
//! `run-<token>-<8 random hex>`: unique to this run, whatever the store, so a command's own
//! retries of a write are replays), and
//! `FENCE_RUN_PARENT_ID`, the same value: a `fence run` inside the command whose environment
//! still holds that id ignores it, or its second run of one resource would be "already done".
//! With an id given, once the command exits 0, still under the lease, fence records the run as
//! completed in the coordinator, as a resource of its own (`RESOURCE#done:KEY`, acquired and
//! released once: lease records are never deleted). A later run with the same id checks that
//! record once it holds the lease — so it is ordered after any run that completed — and skips
//! its command. The record's owner carries a digest of the command's arguments
//! (`OWNER#cmd:DIGEST`): a run with the id and other arguments is refused (exit 6, reason
//! `id_reused`), neither skipped (it is not the work that completed) nor run (the id says
//! this work was done). The record goes through the coordinator's own calls, so it is as durable and
//! as consistent as every lease (and needs nothing new from the stores); it is written only
//! after the command succeeded, so a crash in between means the next run runs again (which the
//! command's own `fence write --id "$FENCE_RUN_ID-…"` turns into replays), never a skip of
//! work not done.

mod hold;
mod ids;
mod record;
mod supervisor;

pub use supervisor::Reaper;

use std::rc::Rc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::cli::{Format, RunArgs};
use crate::cmd::acquire::default_owner;
use crate::cmd::{wait, Context};
use crate::coordinator::LeaseRef;
use crate::error::{ConflictKind, Error, LostReason};
use crate::exit::Exit;
use crate::output::Output;
use crate::signals::Interrupts;

use hold::{bound_of, hold, nanos, Held, Plan};
use ids::{
    command_digest, completed, done_marker, record_completed, report_done, run_id, COMMAND_MARK,
};
use record::{command_status, Ending, Recorder};
use supervisor::{reaper_gone, Terminal};

pub async fn run(
    args: RunArgs,
    reaper: Result<Reaper, Error>,
    ctx: &Context,
    out: &Output,
) -> Exit {
    let busy_exit = args.busy_exit_code;
    let report = args
        .metrics_file
        .clone()
        .map(|path| (path, args.resource.clone(), std::time::SystemTime::now()));
    let mut granted = Granted::default();
    let started = Instant::now();
    let (exit, reason) = match supervise(args, reaper, ctx, out, &mut granted).await {
        // A skipped run's status is its --done-exit-code: no command ran, none failed.
        Ok(exit) if granted.skipped => (exit, "already_done"),
        Ok(exit) => (
            exit,
            match granted.stopped {
                Some(reason) => reason,
                None if exit.code() == 0 => "ok",
                None => "command_failed",
            },
        ),
        Err(err) => {
            // A grant whose answer came after its lease ran out was still granted.
            if let Error::LeaseLost {
                token,
                reason: crate::error::LostReason::ArrivedLate,
                ..
            } = &err
            {
                granted.token = granted.token.or(Some(*token));
            }
            let exit = match (&err, busy_exit) {
                (Error::Busy { .. } | Error::WaitedOut { .. }, Some(code)) => Exit::Command(code),
                _ => err.exit(),
            };
            let hint_op = if granted.started {
                "run"
            } else {
                crate::error::RUN_UNSTARTED
            };
            (
                out.error_hinted("run", hint_op, ctx.store_display(), &err, exit),
                err.name(),
            )
        }
    };
    if let Some((path, resource, start)) = report {
        let outcome = super::run_metrics::Outcome {
            resource: &resource,
            start,
            duration: started.elapsed(),
            waited: granted.at.map_or(started.elapsed(), |at| at - started),
            token: granted.token,
            exit_code: exit.code(),
            reason,
        };
        if let Err(err) = super::run_metrics::write(&path, &outcome) {
            crate::terminal::warn(&format!(
                "warning: cannot write the run's metrics to `{}`: {err}",
                path.display()
            ));
        }
    }
    exit
}

/// The lease a run was granted, for `--metrics-file`.
#[derive(Default)]
struct Granted {
    token: Option<i64>,
    at: Option<Instant>,
    /// The run id was completed before: no command ran (reason `already_done`).
    skipped: bool,
    /// Why fence stopped the command itself (reason `max_time`).
    stopped: Option<&'static str>,
    /// The command was started (a lease lost before that stopped nothing).
    started: bool,
}

/// How long before the lease's bound the command gets SIGTERM, should no renewal be proven;
/// SIGKILL at the bound (see `Plan::grace`). The reaper is told it when it is forked.
fn grace(args: &RunArgs) -> Duration {
    args.kill_after.min(args.ttl / 5)
}

/// The reason, in the JSON answer and the metrics file, of a run stopped by `--max-time`.
const MAX_TIME: &str = "max_time";
/// Its exit status: timeout(1)'s.
const MAX_TIME_EXIT: u8 = 124;

/// The owner of this run's lease: unique to the run, so that two runs never share a lease,
/// whatever `--owner` they were given (only `acquire` reacquires a live lease of its own).
fn run_owner(given: Option<&str>) -> String {
    match given {
        Some(name) => format!(
            "{name}/{}/{:08x}",
            std::process::id(),
            crate::sys::random_u64() as u32
        ),
        None => default_owner(),
    }
}

async fn supervise(
    args: RunArgs,
    reaper: Result<Reaper, Error>,
    ctx: &Context,
    out: &Output,
    granted: &mut Granted,
) -> Result<Exit, Error> {
    let owner = run_owner(args.owner.as_deref());
    let id = run_id(&args)?;
    if id.is_none() && args.done_exit_code.is_some() {
        return Err(Error::usage(
            "--done-exit-code needs a run id",
            "give the run an id with --id KEY (or FENCE_RUN_ID)",
        ));
    }
    let marker = id
        .as_deref()
        .map(|id| done_marker(&args.resource, id))
        .transpose()?;
    // Only a run id keeps it (and its SHA-256 code detects the CPU's features on first use:
    // CPUID instructions, each a VM exit, on every run otherwise).
    let digest = id.is_some().then(|| command_digest(&args.command));
    // Handlers go in before anything else: a stop signal before the command starts ends the
    // run without starting it (the lease, if granted by then, released), never with the
    // default action half-way, nor unseen between a `--wait`'s grant and the start; and a
    // signal sent as soon as the command is visible is forwarded to it.
    let mut interrupts = Interrupts::install()?;
    // Forked at start-up, it got ready while this process started; it starts nothing until
    // `go`.
    let grace = grace(&args);
    let mut reaper = reaper?;
    let interrupted = |name: &str, what: &str| {
        Error::unavailable(
            format!("interrupted by {name} {what}; the command was not started"),
            "nothing was run; run the command again to run it",
        )
    };
    let asked = async {
        let coordinator = ctx.coordinator().await?;
        // The bound starts before the granted attempt was sent (not before a `--wait`).
        let (grant, sent) = wait::acquire_sent(
            coordinator.as_ref(),
            &args.resource,
            &owner,
            args.ttl,
            args.wait,
            out,
        )
        .await?;
        Ok::<_, Error>((coordinator, grant, sent))
    };
    // A signal while the lease is asked for ends the run, as the default action did (a grant
    // in flight then lives until its TTL), but says so. A `--wait` that is waiting ends on the
    // signal itself and leaves its queue: it is given a moment for that (and a lease granted
    // meanwhile is released).
    tokio::pin!(asked);
    let asked_for = tokio::select! {
        biased;
        asked = &mut asked => Ok(asked?),
        // The supervisor died while the lease was asked for (a `--wait` can be long): no
        // lease is taken for a command that could not be started.
        pid = reaper.ended() => {
            Err(reaper_gone(pid, &reaper.program, "while the lease was asked for"))
        }
        (_, name) = interrupts.next() => {
            Err(interrupted(name, &format!("while asking for `{}`", args.resource)))
        }
    };
    let (coordinator, grant, sent) = match asked_for {
        Ok(granted) => granted,
        Err(err) => {
            // Given up while asking: a grant already in flight is released.
            if let Ok(Ok((coordinator, grant, _))) =
                crate::time::answer_within(Duration::from_secs(2), &mut asked).await
            {
                let _ = coordinator
                    .release(&LeaseRef {
                        resource: args.resource.clone(),
                        owner: owner.clone(),
                        token: grant.lease.token,
                    })
                    .await;
            }
            return Err(err);
        }
    };
    *granted = Granted {
        token: Some(grant.lease.token),
        at: Some(Instant::now()),
        skipped: false,
        stopped: None,
        started: false,
    };
    let lease = LeaseRef {
        resource: args.resource.clone(),
        owner: owner.clone(),
        token: grant.lease.token,
    };
    let ttl = args.ttl;
    // When the granted attempt was sent, on the bound clock (which counts a suspend).
    let sent = crate::sys::bound_clock_ns().saturating_sub(nanos(sent.elapsed()));
    let bound = bound_of(sent, ttl, grant.lease.expires_in_ms);
    // Checked under the lease: a run that completed released it only after its record.
    if let Some(marker) = &marker {
        let done = completed(coordinator.as_ref(), marker).await;
        if !matches!(done, Ok(None)) {
            let _ = coordinator.release(&lease).await;
        }
        if let Some(done) = done? {
            let id = id.as_deref().unwrap_or_default();
            if done
                .digest
                .as_ref()
                .is_some_and(|d| Some(d) != digest.as_ref())
            {
                return Err(Error::Conflict {
                    resource: args.resource.clone(),
                    token: lease.token,
                    kind: ConflictKind::RunIdReused {
                        run_id: id.to_owned(),
                    },
                });
            }
            granted.skipped = true;
            return Ok(report_done(&args, id, ctx, out, &done));
        }
    }
    if let Some(name) = interrupts.pending() {
        let _ = coordinator.release(&lease).await;
        return Err(interrupted(
            name,
            &format!(
                "once `{}` was granted; the lease was released",
                args.resource
            ),
        ));
    }

    // Tokens are unique per coordinator only: a second (or restored) store issues the same
    // ones, so the random part keeps ids derived from this run's from replaying another's.
    let given_id = id.clone().unwrap_or_else(|| {
        format!(
            "run-{}-{:08x}",
            lease.token,
            crate::sys::random_u64() as u32
        )
    });
    let mut env = vec![
        ("FENCE_RESOURCE", lease.resource.clone()),
        ("FENCE_OWNER", lease.owner.clone()),
        ("FENCE_TOKEN", lease.token.to_string()),
        ("FENCE_SCHEMA", ctx.schema.clone()),
    ];
    if let Some(store) = &ctx.store {
        env.push(("FENCE_STORE", store.url.clone()));
    }
    env.push(("FENCE_RUN_ID", given_id.clone()));
    env.push(("FENCE_RUN_PARENT_ID", given_id.clone()));
    // The digest of the arguments only where a run id keeps it anyway (its completion
    // record): unkeyed, it would let whoever reads the history confirm a guess of them.
    let recorder = Recorder::new(
        &lease,
        &given_id,
        &args.command[0],
        digest.as_deref(),
        reaper.group(),
    );
    // A grant whose answers kept coming late leaves too little of its bound to record the
    // start and start the command (the reaper would refuse at the bound, and the history
    // would show a start that never was): not started, and said so.
    if crate::sys::bound_clock_ns().saturating_add(nanos(ttl / 4)) >= bound {
        let _ = coordinator.release(&lease).await;
        return Err(Error::LeaseLost {
            resource: lease.resource.clone(),
            owner: lease.owner.clone(),
            token: lease.token,
            reason: crate::error::LostReason::ArrivedLate,
        });
    }
    // On record before the command starts, so that the history has it first whatever
    // becomes of this process; bounded by a quarter of the TTL (the bound runs meanwhile).
    recorder.started(coordinator.as_ref(), ttl / 4).await;
    let running = match reaper.go(&lease, &env, bound, grace).await {
        Ok(running) => {
            granted.started = true;
            running
        }
        Err(err) => {
            // `run_started` is on record: so is what became of it, before the release.
            recorder.not_started(coordinator.as_ref()).await;
            let _ = coordinator.release(&lease).await;
            return Err(err);
        }
    };
    let terminal = Terminal::give(running.child.id());
    let plan = Plan {
        ttl,
        grace,
        kill_after: args.kill_after,
        max_time: args.max_time,
    };
    let held = hold(
        ctx,
        &lease,
        Rc::from(coordinator),
        running,
        &mut interrupts,
        bound,
        plan,
    )
    .await;
    terminal.take_back();
    let Held {
        status,
        lost: lost_reason,
        leftovers,
        interrupted,
        timed_out,
        lost_after,
        sent,
        ended_ns,
        bound,
        coordinator,
        supervisor,
    } = held?;
    let ending = Ending {
        status,
        lost: lost_reason,
        lost_after,
        timed_out,
        interrupted,
        sent,
        ended_ns,
        bound,
    };
    recorder.ended(coordinator.as_ref(), &ending).await;
    if let Some(reason) = lost_reason {
        return Err(lost(&lease, reason));
    }
    if timed_out {
        granted.stopped = Some(MAX_TIME);
        crate::terminal::warn(&format!(
            "stopped the command: it ran past --max-time {} (SIGTERM, then SIGKILL after --kill-after); the lease is released, exit {}",
            crate::time::duration(args.max_time.unwrap_or_default()),
            MAX_TIME_EXIT
        ));
    }
    if let Some(reason) = lost_after {
        crate::terminal::warn(&format!(
            "warning: the command finished inside its lease; only afterwards was the lease on `{}` (token {}) lost (it {}): fence itself was paused, or the store could not be reached. The command's exit status stands; nothing of it ran past the lease",
            lease.resource,
            lease.token,
            crate::error::lost_reason_words(reason)
        ));
    }
    if leftovers {
        crate::terminal::warn(
            "note: the command left processes running when it ended (a background job?); they were stopped: SIGTERM, then SIGKILL after --kill-after",
        );
    }
    // A run id is recorded as completed only for a run that ended on its own, whole:
    // exit 0, not asked to stop, nothing of it still running that had to be stopped.
    let incomplete = match (interrupted, leftovers) {
        (Some(signal), _) => Some(format!(
            "it was interrupted (signal {signal} reached it)"
        )),
        (None, true) => Some(
            "it left processes running, which were stopped with it (a background job's work may be cut short)"
                .to_owned(),
        ),
        (None, false) => None,
    };
    if let (Some(_), Some(0), Some(why)) = (&marker, status.code(), &incomplete) {
        crate::terminal::warn(&format!(
            "warning: the command exited 0, but {why}: run `{}` is not recorded as completed, so the next run with this id runs it again",
            id.as_deref().unwrap_or_default()
        ));
    }
    if let (Some(marker), Some(0), None) = (&marker, status.code(), &incomplete) {
        let recorder = format!("{owner}{COMMAND_MARK}{}", digest.unwrap_or_default());
        let mut recorded = record_completed(coordinator.as_ref(), marker, &recorder, ttl).await;
        if matches!(
            recorded,
            Err(Error::Unavailable { .. } | Error::OutcomeUnknown { .. })
        ) {
            // The connection may have died while the command ran (as for the release below):
            // recording is safe to try again, once, on a fresh one (busy means recorded).
            if let Ok(fresh) = ctx.coordinator().await {
                recorded = record_completed(fresh.as_ref(), marker, &recorder, ttl).await;
            }
        }
        if let Err(err) = recorded {
            crate::terminal::warn(&format!(
                "warning: the command succeeded but run `{}` could not be recorded as completed (the next run with this id runs it again): {err}",
                id.as_deref().unwrap_or_default()
            ));
        }
    }
    // A lease lost after the command finished is not ours to release.
    if lost_after.is_none() {
        let mut released = coordinator.release(&lease).await;
        if matches!(
            released,
            Err(Error::Unavailable { .. } | Error::OutcomeUnknown { .. })
        ) {
            // The connection may have been closed while the command ran (a server's
            // idle_session_timeout, a restart): a release is safe to send again, once, on a
            // fresh one (a second release of the token is "already released").
            if let Ok(fresh) = ctx.coordinator().await {
                released = fresh.release(&lease).await;
            }
        }
        if let Err(err) = released {
            crate::terminal::warn(&format!(
                "warning: the command ended but its lease could not be released: {err}"
            ));
        }
    }
    // A reaper that reported the command's end was ending meanwhile: waited for now.
    drop(supervisor);
    let code = if timed_out {
        MAX_TIME_EXIT
    } else {
        command_status(status)
    };
    if out.format == Format::Json {
        /// A run that ended: its lease, its command's status, its run id.
        #[derive(Serialize)]
        struct Json<'a> {
            resource: &'a str,
            owner: &'a str,
            token: i64,
            exit_status: u8,
            run_id: &'a str,
            /// Why fence stopped the command itself (`max_time`); absent when it ended on
            /// its own.
            #[serde(skip_serializing_if = "Option::is_none")]
            stopped: Option<&'a str>,
        }
        let answer = Json {
            resource: &lease.resource,
            owner: &lease.owner,
            token: lease.token,
            exit_status: code,
            run_id: &given_id,
            stopped: timed_out.then_some(MAX_TIME),
        };
        out.json_answer(true, "run", ctx.store_display(), &answer);
    }
    Ok(Exit::Command(code))
}

fn lost(lease: &LeaseRef, reason: LostReason) -> Error {
    Error::LeaseLost {
        resource: lease.resource.clone(),
        owner: lease.owner.clone(),
        token: lease.token,
        reason,
    }
}
