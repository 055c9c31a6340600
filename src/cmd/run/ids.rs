//! Run ids: the completion records of `fence run --id`.

use std::ffi::OsString;
use std::time::Duration;

use serde::Serialize;

use crate::cli::{Format, RunArgs};
use crate::cmd::Context;
use crate::coordinator::{Coordinator, LeaseRef};
use crate::error::Error;
use crate::exit::Exit;
use crate::output::Output;

/// The resource that records run id `id` of `resource` as completed; refused (exit 2) when the
/// two do not fit a resource name.
pub(super) fn done_marker(resource: &str, id: &str) -> Result<String, Error> {
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
pub(super) const COMMAND_MARK: &str = "#cmd:";

/// The digest of a run's command, its arguments each ended by a NUL: a run id completed by
/// one command is not a skip for another.
pub(super) fn command_digest(command: &[OsString]) -> String {
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
pub(super) struct Done {
    at_ms: Option<i64>,
    owner: Option<String>,
    pub(super) digest: Option<String>,
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
pub(super) async fn completed(
    coordinator: &dyn Coordinator,
    marker: &str,
) -> Result<Option<Done>, Error> {
    let views = coordinator.inspect(&[marker.to_owned()], 1).await?;
    // A marker whose record a power loss emptied or took (the directory store syncs a
    // release's record only with its log) still has its events: completed all the same
    // (review 20: the job ran again).
    Ok(views
        .into_iter()
        .find(|v| v.token.is_some() || !v.events.is_empty())
        .map(|v| match v.events.first() {
            Some(event) => Done::new(Some(event.at_ms), event.owner.clone().or(v.owner)),
            None => Done::new(v.renewed_at_ms.or(v.acquired_at_ms), v.owner),
        }))
}

/// Records a run id as completed: the marker resource acquired and released at once, by this
/// run's owner with the command's digest (`OWNER#cmd:DIGEST`; with the run's TTL, which the
/// store accepted). Busy means another run is recording the same id right now: recorded.
pub(super) async fn record_completed(
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
pub(super) fn report_done(
    args: &RunArgs,
    id: &str,
    ctx: &Context,
    out: &Output,
    done: &Done,
) -> Exit {
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
pub(super) fn run_id(args: &RunArgs) -> Result<Option<String>, Error> {
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
