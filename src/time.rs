//! Timestamps as fence shows them: RFC 3339 UTC with milliseconds, and short relative spans.
//!
//! Coordinators report instants as milliseconds since the Unix epoch by *their* clock; this
//! module only formats them. Nothing here decides expiry (DESIGN I7).

use std::time::{Duration, UNIX_EPOCH};

/// `2026-12-02T16:00:30.123Z` for milliseconds since the epoch.
pub fn rfc3339(ms: i64) -> String {
    let at = if ms >= 0 {
        UNIX_EPOCH + Duration::from_millis(ms.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
    };
    humantime::format_rfc3339_millis(at).to_string()
}

/// A span such as `12.3s`, `4m 10s` or `250ms`.
pub fn span(ms: i64) -> String {
    let ms = ms.unsigned_abs();
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        humantime::format_duration(Duration::from_secs(ms / 1000)).to_string()
    }
}

/// `expires in 12.3s` or `expired 2.0s ago`.
pub fn expires_in(ms: i64) -> String {
    if ms > 0 {
        format!("expires in {}", span(ms))
    } else {
        format!("expired {} ago", span(ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(rfc3339(1_796_227_230_123), "2026-12-02T16:00:30.123Z");
        assert_eq!(span(250), "250ms");
        assert_eq!(span(12_345), "12.3s");
        assert_eq!(span(250_000), "4m 10s");
        assert_eq!(expires_in(-2_000), "expired 2.0s ago");
    }
}
