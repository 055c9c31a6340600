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

use std::ffi::OsString;
use std::future::Future;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::ExitStatusExt;
use std::pin::Pin;
use std::process::ExitStatus;
use std::rc::Rc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::{sleep_until, Instant};

use crate::cli::{Format, RunArgs};
use crate::cmd::acquire::default_owner;
use crate::cmd::{wait, Context};
use crate::coordinator::{Coordinator, Lease, LeaseRef};
use crate::error::{ConflictKind, Error, LostReason};
use crate::exit::Exit;
use crate::output::Output;
use crate::reaper::wire::{self, Failure, Report};
use crate::signals::Interrupts;

/// The resource that records run id `id` of `resource` as completed; refused (exit 2) when the
/// two do not fit a resource name.
fn done_marker(resource: &str, id: &str) -> Result<String, Error> {
    let marker = format!("{resource}{}{id}", crate::config::DONE_MARK);
    crate::config::parse_name(&marker).map_err(|why| {
        Error::usage(
            format!("--id cannot be recorded for `{resource}`: `{marker}` is not a resource name ({why})"),
            format!(
                "use a shorter resource name or id: the two take at most {} bytes together",
                crate::config::MAX_NAME_BYTES - crate::config::DONE_MARK.len()
            ),
        )
    })
}

/// What separates the owner from the command's digest in a completion record's owner.
const COMMAND_MARK: &str = "#cmd:";

/// The digest of a run's command, its arguments each ended by a NUL: a run id completed by
/// one command is not a skip for another.
fn command_digest(command: &[OsString]) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut bytes = Vec::new();
    for arg in command {
        bytes.extend_from_slice(arg.as_bytes());
        bytes.push(0);
    }
    crate::fenced::write_digest(&bytes)
}

/// When, by whom and by which command (its digest: `None` in records of fence versions that
/// did not keep it) a run id was completed.
struct Done {
    at_ms: Option<i64>,
    owner: Option<String>,
    digest: Option<String>,
}

impl Done {
    /// Splits the digest off a completion record's owner (`OWNER#cmd:DIGEST`).
    fn new(at_ms: Option<i64>, owner: Option<String>) -> Done {
        // A digest is 16 hex digits: an older record's owner may hold the mark itself.
        let split = owner
            .as_deref()
            .and_then(|o| o.rsplit_once(COMMAND_MARK))
            .filter(|(_, digest)| {
                digest.len() == 16 && digest.bytes().all(|b| b.is_ascii_hexdigit())
            });
        match split {
            Some((owner, digest)) => Done {
                at_ms,
                owner: Some(owner.to_owned()),
                digest: Some(digest.to_owned()),
            },
            None => Done {
                at_ms,
                owner,
                digest: None,
            },
        }
    }
}

/// The completion record of a run id, if that run completed: its last event (the release
/// right after the command exited 0) says when and by whom, else the record itself.
async fn completed(coordinator: &dyn Coordinator, marker: &str) -> Result<Option<Done>, Error> {
    let views = coordinator.inspect(&[marker.to_owned()], 1).await?;
    Ok(views
        .into_iter()
        .find(|v| v.token.is_some())
        .map(|v| match v.events.first() {
            Some(event) => Done::new(Some(event.at_ms), event.owner.clone().or(v.owner)),
            None => Done::new(v.renewed_at_ms.or(v.acquired_at_ms), v.owner),
        }))
}

/// Records a run id as completed: the marker resource acquired and released at once, by this
/// run's owner with the command's digest (`OWNER#cmd:DIGEST`; with the run's TTL, which the
/// store accepted). Busy means another run is recording the same id right now: recorded.
async fn record_completed(
    coordinator: &dyn Coordinator,
    marker: &str,
    owner: &str,
    ttl: Duration,
) -> Result<(), Error> {
    match coordinator.acquire(marker, owner, ttl).await {
        Ok(grant) => coordinator
            .release(&LeaseRef {
                resource: marker.to_owned(),
                owner: owner.to_owned(),
                token: grant.lease.token,
            })
            .await
            .map(drop),
        Err(Error::Busy { .. }) => Ok(()),
        Err(err) => Err(err),
    }
}

/// The answer of a run whose id was completed before: nothing was started.
fn report_done(args: &RunArgs, id: &str, ctx: &Context, out: &Output, done: &Done) -> Exit {
    let at = done.at_ms.map(crate::time::rfc3339);
    if out.format == Format::Json {
        /// A skipped run: `completed` says when (null when unknown) and by whom.
        #[derive(Serialize)]
        struct Json<'a> {
            resource: &'a str,
            run_id: &'a str,
            skipped: bool,
            completed: Completed<'a>,
        }
        #[derive(Serialize)]
        struct Completed<'a> {
            at: Option<String>,
            owner: Option<&'a str>,
        }
        let answer = Json {
            resource: &args.resource,
            run_id: id,
            skipped: true,
            completed: Completed {
                at,
                owner: done.owner.as_deref(),
            },
        };
        out.json_answer(true, "run", ctx.store_display(), &answer);
    } else if !out.quiet {
        crate::terminal::warn(&format!(
            "run `{id}` of `{}` already completed{}{}: the command was not started",
            args.resource,
            at.map(|at| format!(" at {at}")).unwrap_or_default(),
            done.owner
                .as_deref()
                .map(|o| format!(" by `{o}`"))
                .unwrap_or_default()
        ));
    }
    Exit::Command(args.done_exit_code.unwrap_or(0))
}

/// The run id: `--id`, else `FENCE_RUN_ID` unless an enclosing `fence run` set it (its
/// `FENCE_RUN_PARENT_ID` is the same).
fn run_id(args: &RunArgs) -> Result<Option<String>, Error> {
    if let Some(id) = &args.id {
        return Ok(Some(id.clone()));
    }
    let Some(value) = std::env::var_os("FENCE_RUN_ID") else {
        return Ok(None);
    };
    if std::env::var_os("FENCE_RUN_PARENT_ID").as_ref() == Some(&value) {
        return Ok(None);
    }
    let value = value.to_string_lossy();
    crate::config::parse_write_id(&value)
        .map(Some)
        .map_err(|why| {
            Error::usage(
                format!("FENCE_RUN_ID is not a run id: {why}"),
                "set FENCE_RUN_ID to 1 to 64 of A-Z a-z 0-9 . _ - : @ +, or unset it",
            )
        })
}

pub async fn run(args: RunArgs, ctx: &Context, out: &Output) -> Exit {
    let busy_exit = args.busy_exit_code;
    let report = args
        .metrics_file
        .clone()
        .map(|path| (path, args.resource.clone(), std::time::SystemTime::now()));
    let mut granted = Granted::default();
    let started = Instant::now();
    let (exit, reason) = match supervise(args, ctx, out, &mut granted).await {
        // A skipped run's status is its --done-exit-code: no command ran, none failed.
        Ok(exit) if granted.skipped => (exit, "already_done"),
        Ok(exit) => (
            exit,
            if exit.code() == 0 {
                "ok"
            } else {
                "command_failed"
            },
        ),
        Err(err) => {
            let exit = match (&err, busy_exit) {
                (Error::Busy { .. } | Error::WaitedOut { .. }, Some(code)) => Exit::Command(code),
                _ => err.exit(),
            };
            (
                out.error_as("run", ctx.store_display(), &err, exit),
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
}

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
    let digest = command_digest(&args.command);
    // Handlers go in before anything else: a stop signal before the command starts ends the
    // run without starting it (the lease, if granted by then, released), never with the
    // default action half-way, nor unseen between a `--wait`'s grant and the start; and a
    // signal sent as soon as the command is visible is forwarded to it.
    let mut interrupts = Interrupts::install()?;
    // Started now, it gets ready while the lease is asked for; it starts nothing until `go`.
    // SIGTERM that long before the bound, SIGKILL at it (see `Plan::grace`).
    let grace = args.kill_after.min(args.ttl / 5);
    let mut reaper = Reaper::start(&args.command, grace, out)?;
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
    let (coordinator, grant, sent) = tokio::select! {
        biased;
        asked = &mut asked => asked?,
        // The supervisor died while the lease was asked for (a `--wait` can be long): no
        // lease is taken for a command that could not be started (one granted meanwhile is
        // released).
        pid = reaper.ended() => {
            if let Ok(Ok((coordinator, grant, _))) =
                tokio::time::timeout(Duration::from_secs(2), &mut asked).await
            {
                let _ = coordinator
                    .release(&LeaseRef {
                        resource: args.resource.clone(),
                        owner: owner.clone(),
                        token: grant.lease.token,
                    })
                    .await;
            }
            return Err(reaper_gone(pid, &reaper.program, "while the lease was asked for"));
        }
        (_, name) = interrupts.next() => {
            if let Ok(Ok((coordinator, grant, _))) =
                tokio::time::timeout(Duration::from_secs(2), &mut asked).await
            {
                let _ = coordinator
                    .release(&LeaseRef {
                        resource: args.resource.clone(),
                        owner: owner.clone(),
                        token: grant.lease.token,
                    })
                    .await;
            }
            return Err(interrupted(name, &format!("while asking for `{}`", args.resource)));
        }
    };
    *granted = Granted {
        token: Some(grant.lease.token),
        at: Some(Instant::now()),
        skipped: false,
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
            if done.digest.as_ref().is_some_and(|d| *d != digest) {
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
    let running = match reaper.go(&lease, &env, bound, grace).await {
        Ok(running) => running,
        Err(err) => {
            let _ = coordinator.release(&lease).await;
            return Err(err);
        }
    };
    let terminal = Terminal::give(running.child.id().map(|pid| pid as i32));
    let plan = Plan {
        ttl,
        grace,
        kill_after: args.kill_after,
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
        coordinator,
    } = held?;
    if let Some(reason) = lost_reason {
        return Err(lost(&lease, reason));
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
        let recorder = format!("{owner}{COMMAND_MARK}{digest}");
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
    let code = status
        .code()
        .map(|c| c as u8)
        .or_else(|| status.signal().map(|s| 128 + s as u8))
        .unwrap_or(1);
    if out.format == Format::Json {
        /// A run that ended: its lease, its command's status, its run id.
        #[derive(Serialize)]
        struct Json<'a> {
            resource: &'a str,
            owner: &'a str,
            token: i64,
            exit_status: u8,
            run_id: &'a str,
        }
        let answer = Json {
            resource: &lease.resource,
            owner: &lease.owner,
            token: lease.token,
            exit_status: code,
            run_id: &given_id,
        };
        out.json_answer(true, "run", ctx.store_display(), &answer);
    }
    Ok(Exit::Command(code))
}

/// How `fence run` holds its lease: the TTL asked for, how long before the bound the command
/// gets SIGTERM should no renewal be proven ([`Plan::grace`]), and `--kill-after`.
#[derive(Clone, Copy)]
struct Plan {
    ttl: Duration,
    /// `--kill-after`, but at most a fifth of the TTL (renewals go out every third of it, and
    /// what is left is for their retries): SIGTERM comes that long before the bound, SIGKILL
    /// at the bound, so nothing of the command outlives the bound.
    grace: Duration,
    kill_after: Duration,
}

/// What [`hold`] saw by the time nothing of the command was left.
struct Held {
    /// The reaper's status: the command's, passed on.
    status: ExitStatus,
    /// Why the command was stopped before it ended on its own (the run then ends with this
    /// lost lease; the lease was released when it was still provably ours).
    lost: Option<LostReason>,
    /// Processes of the command were left when it ended, and were stopped.
    leftovers: bool,
    /// The first stop signal that reached the command.
    interrupted: Option<i32>,
    /// The coordinator's connection, as the last renewal left it.
    coordinator: Rc<dyn Coordinator>,
}

/// The command is being stopped: SIGTERM went out, SIGKILL is due at `graceful_until` (or at
/// the bound, whichever is first; at once once the lease is lost).
struct Stop {
    graceful_until: u64,
    /// When SIGKILL went out; it goes out again at every [`POLL`] until nothing is left.
    killed: Option<Instant>,
    /// Process groups made only of the command's processes (see
    /// [`crate::sys::kill_descendants_once`]).
    groups: Vec<i32>,
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
async fn hold(
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
    let pgid = child.id().map(|pid| pid as i32);
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
    // What the reaper said as it ended (read once it has been waited for).
    let mut told = Report::default();
    if !answered {
        lost = Some(LostReason::SupervisorLost);
        stop = Stop::until(0);
    }
    loop {
        if status.is_some() {
            crate::sys::reap_children();
            if !crate::sys::has_children() {
                break;
            }
        }
        let now = crate::sys::bound_clock_ns();
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
        tokio::select! {
            biased;
            _ = until(kill_at) => {
                if let Some(stop) = stop.as_mut() {
                    forward(pgid, libc::SIGKILL);
                    crate::sys::kill_descendants_once(&mut stop.groups);
                    stop.killed = Some(Instant::now());
                }
            }
            _ = until(term_at) => {
                // No renewal was proven in time: the command stops before the bound. The
                // reaper, on the same bound by its own clock, sends the SIGTERM (once: a
                // second one would run a shell's trap twice); it is continued in case its
                // command stopped it, and the SIGKILL at the bound is ours too. Without a
                // reaper any more, what is left gets the SIGTERM from here.
                unproven = true;
                if status.is_none() {
                    continue_process(child.id());
                } else {
                    crate::sys::signal_descendants(libc::SIGTERM, false);
                    crate::sys::signal_descendants(libc::SIGCONT, false);
                }
                stop = Stop::until(now.saturating_add(nanos(plan.kill_after)));
            }
            waited = child.wait(), if status.is_none() => {
                let waited = waited.map_err(|err| Error::internal(
                    format!("cannot wait for the command: {err}"),
                    "check the system's process limits",
                ))?;
                status = Some(waited);
                // Its report is complete now (its end of the pipe closed with it): a reaper
                // that did not say it ended on its own was killed, and what it left is stopped
                // at once, not after --kill-after (nothing supervised it any more).
                told = reaper_report(&mut report).await;
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
                        crate::sys::signal_descendants(libc::SIGTERM, false);
                        crate::sys::signal_descendants(libc::SIGCONT, false);
                        stop = Stop::until(now.saturating_add(nanos(plan.kill_after)));
                    }
                }
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
                    interrupted.get_or_insert(signal);
                    forward(pgid, signal);
                    forward(pgid, libc::SIGCONT);
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
                    Some(Err(Error::Stale { highest_token, .. })) => {
                        lost.get_or_insert(LostReason::TakenOver { highest_token });
                        renewing = false;
                        stop.get_or_insert_with(|| Stop::until(0).expect("some"));
                    }
                    Some(Err(Error::LeaseLost { reason, .. })) => {
                        lost.get_or_insert(reason);
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
        }
    }
    let status = status.expect("the loop ends once the reaper was waited for");

    // The reaper stopped the command at the bound: this process did not prove one in time
    // (paused, or the machine was suspended, which the runtime's timers do not count).
    unproven |= told.bound;
    if lost.is_none() && unproven {
        // Ask once why, for the report (the renewal in flight, or a new one).
        let asked = match in_flight.take() {
            // Its coordinator (a fresh one, after a reconnect) kept what refused it.
            Some(flight) => match tokio::time::timeout(CLASSIFY_WITHIN, flight).await {
                Ok((used, _, answer)) => {
                    coordinator = used;
                    answer
                }
                Err(_) => None,
            },
            None => tokio::time::timeout(CLASSIFY_WITHIN, coordinator.renew(lease, None))
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
            Some(Err(Error::Stale { highest_token, .. })) => {
                LostReason::TakenOver { highest_token }
            }
            Some(Err(Error::LeaseLost { reason, .. })) => reason,
            Some(Ok(_)) => {
                // Still ours by the store's clock, but too late to prove in time: hand it
                // back, nothing of the command is left.
                let _ = coordinator.release(lease).await;
                LostReason::Unreachable
            }
            _ => LostReason::Unreachable,
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
    if lost == Some(LostReason::SupervisorLost) {
        // Nothing of the command is left and the lease is still ours: hand it back.
        let _ = coordinator.release(lease).await;
    }
    Ok(Held {
        status,
        lost,
        leftovers: leftovers || told.leftovers,
        interrupted: interrupted.or(told.interrupted),
        coordinator,
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
fn bound_of(sent: u64, ttl: Duration, expires_in_ms: i64) -> u64 {
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

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// How long to wait, once the lease could not be proven, for the store to say why.
const CLASSIFY_WITHIN: Duration = Duration::from_secs(1);

fn retry_after(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(20), Duration::from_millis(500))
}

fn lost(lease: &LeaseRef, reason: LostReason) -> Error {
    Error::LeaseLost {
        resource: lease.resource.clone(),
        owner: lease.owner.clone(),
        token: lease.token,
        reason,
    }
}

fn forward(pgid: Option<i32>, signal: i32) {
    if let Some(pgid) = pgid {
        // SAFETY: kill(2) on the command's own process group; no memory is involved.
        unsafe { libc::kill(-pgid, signal) };
    }
}

/// The lease's bound, sent to the reaper: should `fence run` be paused (SIGSTOP, a frozen
/// cgroup) or hang past it, the reaper, which does not renew anything, stops the command
/// there itself (SIGTERM, SIGKILL after `--kill-after`), so that it never runs on past the
/// last renewal this process could prove.
struct Bounds(std::fs::File);

impl Bounds {
    /// Sends `bound` (bound clock ns), 8 bytes: one write, never split.
    fn send(&self, bound: u64) {
        let _ = (&self.0).write_all(&wire::bound_message(bound));
    }
}

/// The terminal, when `fence run` held its foreground: the reaper hands it to the command's
/// process group before the command starts (which would otherwise stop as soon as it read the
/// terminal, while fence kept renewing), and fence takes it back when the command is done.
struct Terminal {
    given: bool,
}

impl Terminal {
    /// Whether the reaper took the terminal for the command's group (see
    /// [`crate::reaper`]), so that fence must take it back.
    fn give(pgid: Option<i32>) -> Terminal {
        // SAFETY: isatty/tcgetpgrp on standard input.
        let given =
            pgid.is_some_and(|pgid| unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == pgid });
        Terminal { given }
    }

    fn take_back(&self) {
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

/// The reaper (see [`crate::reaper`]), started in a new process group before the lease is
/// asked for, so that its start overlaps the coordinator's round trips; it waits, starting
/// nothing, until [`Reaper::go`] sends what COMMAND needs. Dropped without `go` (busy, an
/// error, a completed run id), it is killed: COMMAND was never started.
struct Reaper {
    child: Option<tokio::process::Child>,
    report: Option<std::fs::File>,
    /// The start message, then the lease's bounds (see [`Bounds`]).
    start: Option<std::fs::File>,
    program: String,
}

impl Reaper {
    fn start(command: &[OsString], grace: Duration, out: &Output) -> Result<Reaper, Error> {
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
        // Each (read end, write end): fence reads the report and writes the start message.
        let (report, report_end) = pipe().map_err(|err| cannot(&err))?;
        let (start_end, start) = pipe().map_err(|err| cannot(&err))?;
        let start = std::fs::File::from(start);
        // Should the reaper die (the OOM killer, a `kill -9` of the wrong pid), what it was
        // the subreaper of (daemons that left the command's group) is handed to us rather than
        // to init, so that nothing of the command outlives the run (`sys::kill_descendants`
        // once the reaper has been waited for).
        // SAFETY: prctl on this process only.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
        let parent = std::process::id().to_string();
        let mut cmd = tokio::process::Command::new("/proc/self/exe");
        let raw_report = report_end.as_raw_fd();
        let raw_start = start_end.as_raw_fd();
        cmd.arg(crate::reaper::ARG)
            .arg(&parent)
            .arg(raw_report.to_string())
            .arg(raw_start.to_string())
            .arg(grace.as_millis().min(i64::MAX as u128).to_string())
            .arg("--")
            .args(command)
            .process_group(0);
        if out.format == Format::Json {
            // stdout carries fence's one JSON object; the command's output goes to stderr.
            cmd.stdout(std::io::stderr());
        }
        // SAFETY: between fork and exec only async-signal-safe calls: fcntl lets the two
        // pipes through the exec, at their own numbers (the caller's descriptors stay as they
        // were), prctl sets the signal the reaper gets when this process dies.
        unsafe {
            cmd.pre_exec(move || {
                if libc::fcntl(raw_report, libc::F_SETFD, 0) < 0
                    || libc::fcntl(raw_start, libc::F_SETFD, 0) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGUSR1);
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|err| {
            if std::path::Path::new("/proc/self/exe").exists() {
                cannot(&err)
            } else {
                Error::usage(
                    format!(
                        "cannot start fence's supervisor of the command (/proc/self/exe): {err}"
                    ),
                    "fence run needs /proc mounted; nothing was started and no lease was taken",
                )
            }
        })?;
        Ok(Reaper {
            child: Some(child),
            report: Some(report),
            start: Some(start),
            program: program.to_string_lossy().into_owned(),
        })
    }

    /// Resolves once the reaper has ended (before [`Self::go`]: it was killed), with its pid.
    async fn ended(&mut self) -> Option<u32> {
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
    /// (`Running::answered` false: whatever it started is stopped by [`hold`]).
    async fn go(
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
        // One write into the empty pipe (a pipe holds 64 KiB, and the message is below the
        // argument limits), still blocking; from here on our end never blocks: a bound the
        // reaper has not read yet is replaced by the next one anyway.
        let sent = (&start).write_all(&message);
        // SAFETY: O_NONBLOCK on our own end of the pipe.
        unsafe { libc::fcntl(start.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        let bounds = Bounds(start);
        let mut report = tokio::net::unix::pipe::Receiver::from_file(report).map_err(|err| {
            Error::internal(
                format!("cannot watch fence's supervisor of the command: {err}"),
                "check the system's file limits; nothing was run and the lease was released",
            )
        })?;
        // The reaper writes one newline once COMMAND runs, or why it could not start and
        // closes its end. A reaper that dies before either closes it with nothing said.
        let give_up = bound.saturating_sub(nanos(grace));
        let mut first = [0u8; 1];
        let read = loop {
            match tokio::time::timeout(NUDGE, report.read(&mut first)).await {
                Ok(read) => break Some(read),
                Err(_) if crate::sys::bound_clock_ns() >= give_up => break None,
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
            // started COMMAND: it had the start message, so COMMAND may run, and what it
            // started is ours now (its subreaper's orphans). `hold` stops all of it, then
            // releases the lease: exit 5, `supervisor_lost`. Never "nothing was run".
            (Ok(()), None) | (Ok(()), Some(Ok(0))) => Ok(Running {
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
                let (errno, what) = match Failure::parse(&why) {
                    Failure::Expired => return Err(lost(lease, LostReason::Expired)),
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
fn reaper_gone(pid: Option<u32>, program: &str, when: &str) -> Error {
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
fn continue_process(pid: Option<u32>) {
    if let Some(pid) = pid {
        // SAFETY: kill(2) on our own child, the reaper.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    }
}

/// A reaper told to go: the process, whether it said the command started, its pipes.
struct Running {
    child: tokio::process::Child,
    /// The reaper said COMMAND started in time; false when it never answered.
    answered: bool,
    bounds: Bounds,
    report: tokio::net::unix::pipe::Receiver,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        // Never told to go: it starts nothing, and ends now (its pipe closes with us too),
        // before fence does: no process of the run outlives it. A SIGKILLed process that
        // started nothing ends within milliseconds; the wait is bounded all the same.
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
            let start = std::time::Instant::now();
            while matches!(child.try_wait(), Ok(None)) && start.elapsed() < REAPER_ENDS_WITHIN {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// How long dropping an unused reaper waits for it to end (see [`Reaper`]'s `Drop`).
const REAPER_ENDS_WITHIN: Duration = Duration::from_secs(2);

/// A pipe, both ends close-on-exec: (read end, write end).
fn pipe() -> std::io::Result<(std::fs::File, std::os::fd::OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors, which we own from here.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}

/// What the reaper said as it ended (read once the reaper is gone: the pipe is then at its
/// end).
async fn reaper_report(report: &mut tokio::net::unix::pipe::Receiver) -> Report {
    use tokio::io::AsyncReadExt;
    let mut rest = Vec::new();
    // The reaper is gone, so its end is closed: the read ends at once.
    let _ = tokio::time::timeout(NUDGE * 10, report.read_to_end(&mut rest)).await;
    Report::parse(&String::from_utf8_lossy(&rest))
}
