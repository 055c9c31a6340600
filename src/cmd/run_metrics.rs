//! `fence run --metrics-file`: the run's outcome for node_exporter's textfile collector,
//! written whole or not at all (a temporary file beside it, renamed over it), so that a
//! scrape never reads half a file.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::metrics::{render, Family};

/// How a run ended.
pub struct Outcome<'a> {
    pub resource: &'a str,
    pub start: SystemTime,
    pub duration: Duration,
    /// From the start to the grant (the whole run when never granted).
    pub waited: Duration,
    pub token: Option<i64>,
    pub exit_code: u8,
    /// `ok`, `command_failed`, `already_done` (the run id was completed before: nothing
    /// ran), or the error's name (`busy`, `lease_lost`, …).
    pub reason: &'a str,
}

/// The outcome as exposition text.
pub fn text(outcome: &Outcome<'_>) -> String {
    let r = [("resource", outcome.resource)];
    let epoch = |t: SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    let mut start = Family::gauge(
        "fence_run_start_timestamp_seconds",
        "When the last `fence run` of the resource started (Unix time).",
    );
    start.add(&r, epoch(outcome.start));
    let mut end = Family::gauge(
        "fence_run_end_timestamp_seconds",
        "When it ended (Unix time).",
    );
    end.add(&r, epoch(outcome.start + outcome.duration));
    let mut duration = Family::gauge(
        "fence_run_duration_seconds",
        "How long it ran, waiting for the lease included.",
    );
    duration.add(&r, outcome.duration.as_secs_f64());
    let mut waited = Family::gauge(
        "fence_run_waited_seconds",
        "How long it waited for the lease (all of it when never granted).",
    );
    waited.add(&r, outcome.waited.as_secs_f64());
    let mut token = Family::gauge(
        "fence_run_token",
        "The fencing token it held (absent when never granted).",
    );
    if let Some(t) = outcome.token {
        token.add(&r, t as f64);
    }
    let mut code = Family::gauge("fence_run_exit_code", "fence's exit status.");
    code.add(&r, f64::from(outcome.exit_code));
    let mut reason = Family::gauge(
        "fence_run_outcome",
        "How it ended (value 1): reason `ok`, `command_failed`, `already_done`, or fence's error name.",
    );
    reason.add(
        &[("resource", outcome.resource), ("reason", outcome.reason)],
        1.0,
    );
    render(&[start, end, duration, waited, token, code, reason])
}

/// Writes the outcome to `path` atomically, through [`crate::sys::replace`]: a temporary
/// file the collector never reads (`.tmp-…`, not `*.prom`), created new (so a file or
/// symbolic link planted at its name is never written through), synced, renamed over `path`.
pub fn write(path: &Path, outcome: &Outcome<'_>) -> std::io::Result<()> {
    if path.file_name().is_none() {
        return Err(std::io::Error::other("the path names no file"));
    }
    crate::sys::replace(path, text(outcome).as_bytes(), true)
}
