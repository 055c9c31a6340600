//! Timestamps as fence shows them: RFC 3339 UTC with milliseconds, and short relative spans.
//!
//! Coordinators report instants as milliseconds since the Unix epoch by *their* clock; this
//! module only formats them (and reads this machine's clock for views that cannot ask the
//! store). Nothing here decides expiry (DESIGN I7). And [`answer_within`]: a request's
//! timeout that measures the server, not fence's own pauses.

use std::time::{Duration, UNIX_EPOCH};

/// This machine's wall clock, in milliseconds since the Unix epoch (0 before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `2026-12-02T16:00:30.123Z` for milliseconds since the epoch. An instant before the epoch
/// (no clock fence reads gives one; `prune --older-than` an age beyond it computes one) is
/// shown as the epoch: the formatter cannot show earlier ones, and panicked on them.
pub fn rfc3339(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(ms.max(0).unsigned_abs());
    humantime::format_rfc3339_millis(at).to_string()
}

/// A span such as `250ms`, `12.3s`, `4m 10s`, `1h 30m` or `24h`: the one way fence prints
/// durations, and one that `--ttl`, `--wait` and `--timeout` accept back.
pub fn span(ms: i64) -> String {
    let ms = ms.unsigned_abs();
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    if ms < 60_000 {
        return format!("{:.1}s", ms as f64 / 1000.0);
    }
    let secs = ms / 1000;
    let parts = [(secs / 3600, "h"), (secs / 60 % 60, "m"), (secs % 60, "s")];
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// [`span`] of a [`Duration`].
pub fn duration(d: Duration) -> String {
    span(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `expires in 12.3s` or `expired 2.0s ago`.
pub fn expires_in(ms: i64) -> String {
    if ms > 0 {
        format!("expires in {}", span(ms))
    } else {
        format!("expired {} ago", span(ms))
    }
}

/// How long a request whose timeout passed is still looked at (see [`answer_within`]).
const LAST_LOOK: Duration = Duration::from_millis(100);

/// `request`'s answer within `limit`, or `Err` once it passed. A process paused (SIGSTOP, a
/// frozen VM, swap) past the limit wakes with its timer fired and the answer, if the server
/// sent it meanwhile, still unread in the connection, whose task has not run yet (the timer's
/// task runs first): the request gets `LAST_LOOK` more before it counts as lost, so that an
/// answer that is there is not reported as none (exit 8 for a write, a lease held reported as
/// failed). Request timeouts go through here (PostgreSQL, S3, GCS); a lease's own bounds in
/// `fence run` do not: they count from the send, and a lease runs out whether fence was
/// paused or not.
pub async fn answer_within<F: std::future::Future>(
    limit: Duration,
    request: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let mut request = std::pin::pin!(request);
    match tokio::time::timeout(limit, &mut request).await {
        Ok(answer) => Ok(answer),
        Err(_) => last_look(request).await,
    }
}

/// `request`'s answer if it comes within `LAST_LOOK`: for a wait whose own timer fired,
/// which may be this process's pause (see [`answer_within`]).
pub async fn last_look<F: std::future::Future>(
    request: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    tokio::time::timeout(LAST_LOOK, request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(rfc3339(1_796_227_230_123), "2026-12-02T16:00:30.123Z");
        // Before the epoch: shown as the epoch, never a panic.
        assert_eq!(rfc3339(-1), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(i64::MIN), "1970-01-01T00:00:00.000Z");
        assert_eq!(span(250), "250ms");
        assert_eq!(span(12_345), "12.3s");
        assert_eq!(span(250_000), "4m 10s");
        assert_eq!(span(86_400_000), "24h");
        assert_eq!(span(5_400_000), "1h 30m");
        assert_eq!(duration(Duration::from_secs(10)), "10.0s");
        assert_eq!(expires_in(-2_000), "expired 2.0s ago");
    }
}
