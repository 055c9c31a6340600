//! The resolve step: validates names, durations, tokens and store URLs, and reads the
//! environment, without touching the network.
//!
//! Invalid input is a usage error (exit 2) with a hint; nothing is silently normalised, so a
//! resource name means exactly the bytes the user typed (DESIGN §1).

use std::path::PathBuf;
use std::time::Duration;

use crate::error::Error;
use crate::url::{redact_url, FilePathError};

/// The longest resource or owner name, in bytes.
pub const MAX_NAME_BYTES: usize = 200;
/// The shortest lease a coordinator grants.
pub const MIN_TTL: Duration = Duration::from_millis(100);
/// The longest lease a coordinator grants; longer jobs renew (or use `fence run`).
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The default lease length.
pub const DEFAULT_TTL: &str = "30s";

/// Checks a resource or owner name: 1–200 bytes of UTF-8, no control characters, no leading or
/// trailing whitespace. Used as a clap value parser, so environment values are checked too.
pub fn parse_name(value: &str) -> Result<String, String> {
    if value.is_empty() {
        return Err("a name cannot be empty".into());
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(format!(
            "a name is at most {MAX_NAME_BYTES} bytes; this one has {}",
            value.len()
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(format!(
            "a name cannot contain control characters (found {})",
            c.escape_unicode()
        ));
    }
    if value.trim() != value {
        return Err("a name cannot start or end with whitespace".into());
    }
    Ok(value.to_owned())
}

/// What marks the lease records `fence run --id` keeps of completed runs
/// (`RESOURCE#done:KEY`): reserved, so that no acquire, renew, release, run or write on such a
/// name can fake a completion (the next run would skip its command) or block one.
pub const DONE_MARK: &str = "#done:";

/// A resource a command takes, renews, releases, runs under or writes for: [`parse_name`],
/// and not one of the records `fence run --id` keeps.
pub fn parse_resource(value: &str) -> Result<String, String> {
    let name = parse_name(value)?;
    if name.contains(DONE_MARK) {
        return Err(format!(
            "names containing `{DONE_MARK}` are reserved for the records `fence run --id` keeps of completed runs"
        ));
    }
    Ok(name)
}

/// The longest write id (`--id`) or run id, in bytes: an object keeps its last
/// 8 ids in its metadata (`LEDGER_IDS` of the object targets), and S3 allows 2 KB of it in all.
pub const MAX_WRITE_ID_BYTES: usize = 64;

/// Checks a write id (`fence write --id`, `fence run --id`, `FENCE_RUN_ID`): 1 to 64 ASCII
/// letters, digits and `.` `_` `-` `:` `@` `+`. A narrow alphabet, so an id reads the same in
/// a shell, a URL, an HTTP header (object metadata) and a ledger line, and never needs
/// escaping.
pub fn parse_write_id(value: &str) -> Result<String, String> {
    if value.is_empty() {
        return Err("a write id cannot be empty".into());
    }
    if value.len() > MAX_WRITE_ID_BYTES {
        return Err(format!(
            "a write id is at most {MAX_WRITE_ID_BYTES} bytes; this one has {} (use a shorter one, e.g. publish-2026-12-04)",
            value.len()
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._-:@+".contains(*c)))
    {
        return Err(format!(
            "a write id is made of ASCII letters, digits and . _ - : @ + (found {c:?})"
        ));
    }
    Ok(value.to_owned())
}

/// Parses an instant for `--since`/`--until`: RFC 3339 (`2026-12-04T03:00:00Z`, an offset
/// such as `+02:00`, or no zone: local time, as `date` reads TZ; a space may stand for the
/// `T`), or a span back from now (`2h`, `30m`, `1d`). Milliseconds since the epoch.
pub fn parse_instant(value: &str) -> Result<i64, String> {
    let ms_since_epoch = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    };
    if let Ok(back) = humantime::parse_duration(value) {
        let now = ms_since_epoch(std::time::SystemTime::now());
        // A span longer than the time since 1970 means "from the start": every event.
        return Ok(now
            .saturating_sub(i64::try_from(back.as_millis()).unwrap_or(i64::MAX))
            .max(0));
    }
    let invalid = || {
        format!(
            "`{value}` is neither a time (RFC 3339, e.g. 2026-12-04T03:00:00Z or 2026-12-04T05:00:00+02:00) nor a span back from now (e.g. 2h, 30m)"
        )
    };
    // A trailing `±HH:MM` offset: humantime reads UTC only.
    let (stamp, offset_ms) = match value.len().checked_sub(6).map(|at| value.split_at(at)) {
        Some((stamp, zone))
            if stamp.contains(['T', 't', ' '])
                && zone.len() == 6
                && matches!(&zone[..1], "+" | "-")
                && &zone[3..4] == ":" =>
        {
            let hours: i64 = zone[1..3].parse().map_err(|_| invalid())?;
            let minutes: i64 = zone[4..6].parse().map_err(|_| invalid())?;
            let sign = if zone.starts_with('-') { -1 } else { 1 };
            (stamp, sign * (hours * 60 + minutes) * 60_000)
        }
        _ if value.ends_with(['Z', 'z']) => (value, 0),
        // No zone: the time on this machine's clock face (an operator reading an incident
        // report or a local log writes it so).
        _ => {
            let wall = ms_since_epoch(humantime::parse_rfc3339_weak(value).map_err(|_| invalid())?);
            return local_to_utc_ms(wall).ok_or_else(|| {
                format!("`{value}` cannot be read as a local time here (TZ); add Z or an offset such as +02:00")
            });
        }
    };
    let at = humantime::parse_rfc3339_weak(stamp).map_err(|_| invalid())?;
    Ok(ms_since_epoch(at) - offset_ms)
}

/// The instant whose local time (the TZ environment variable, else /etc/localtime) reads as
/// `wall_ms` read as UTC: the fields of that UTC time given to `mktime`, which resolves the
/// zone's offset and daylight saving time for that date.
fn local_to_utc_ms(wall_ms: i64) -> Option<i64> {
    let secs = libc::time_t::try_from(wall_ms.div_euclid(1000)).ok()?;
    // SAFETY: an all-zero `tm` is a valid value of the plain C struct (a null `tm_zone`
    // pointer included), which gmtime_r overwrites.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: gmtime_r reads `secs` and writes only into `tm`, both ours and valid.
    if unsafe { libc::gmtime_r(&secs, &mut tm) }.is_null() {
        return None;
    }
    // Let mktime decide whether daylight saving time is in effect on that date.
    tm.tm_isdst = -1;
    // SAFETY: mktime reads and normalises the `tm` we own; it reads TZ itself (tzset).
    let local = unsafe { libc::mktime(&mut tm) };
    if local == -1 {
        return None;
    }
    Some(local.saturating_mul(1000) + wall_ms.rem_euclid(1000))
}

/// Parses a lease length such as `250ms`, `30s`, `5m` or `1h`, within [`MIN_TTL`]..=[`MAX_TTL`].
pub fn parse_ttl(value: &str) -> Result<Duration, String> {
    let ttl = humantime::parse_duration(value).map_err(|err| {
        format!("`{value}` is not a duration ({err}); write e.g. 250ms, 30s, 5m, 1h")
    })?;
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(format!(
            "a lease lasts from {} to {}; `{value}` is outside that range",
            crate::time::duration(MIN_TTL),
            crate::time::duration(MAX_TTL)
        ));
    }
    Ok(ttl)
}

/// The longest `fence run --kill-after`: the grace between SIGTERM and SIGKILL.
pub const MAX_KILL_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// Parses `fence run --kill-after`: 0 to [`MAX_KILL_AFTER`].
pub fn parse_kill_after(value: &str) -> Result<Duration, String> {
    let grace = humantime::parse_duration(value)
        .map_err(|err| format!("`{value}` is not a duration ({err}); write e.g. 0s, 10s, 5m"))?;
    if grace > MAX_KILL_AFTER {
        return Err(format!(
            "the grace between SIGTERM and SIGKILL is at most {}; `{value}` is longer",
            crate::time::duration(MAX_KILL_AFTER)
        ));
    }
    Ok(grace)
}

/// The longest `fence write --timeout`: a fenced transaction holds its guard row's lock, so
/// every other writer of the resource waits behind it.
pub const MAX_WRITE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Parses `fence write --timeout`: 100ms to 24h.
pub fn parse_write_timeout(value: &str) -> Result<Duration, String> {
    let timeout = humantime::parse_duration(value).map_err(|err| {
        format!("`{value}` is not a duration ({err}); write e.g. 250ms, 30s, 5m, 1h")
    })?;
    if timeout < MIN_TTL || timeout > MAX_WRITE_TIMEOUT {
        return Err(format!(
            "a write may take from {} to {}; `{value}` is outside that range",
            crate::time::duration(MIN_TTL),
            crate::time::duration(MAX_WRITE_TIMEOUT)
        ));
    }
    Ok(timeout)
}

/// Parses `--wait [DURATION]`: a duration, or `forever` (what a bare `--wait` means).
pub fn parse_wait(value: &str) -> Result<Duration, String> {
    if value == "forever" {
        return Ok(Duration::MAX);
    }
    humantime::parse_duration(value)
        .map_err(|err| format!("`{value}` is not a duration ({err}); write e.g. 30s, 5m, or leave it out to wait forever"))
}

/// What `fence run` appends to `--owner` (`/<pid>/<8 hex>`) takes at most this many bytes.
pub const RUN_OWNER_SUFFIX: usize = 1 + 10 + 1 + 8;

/// Parses `fence run --owner`: a name with room for the per-run suffix.
pub fn parse_run_owner(value: &str) -> Result<String, String> {
    let name = parse_name(value)?;
    if name.len() + RUN_OWNER_SUFFIX > MAX_NAME_BYTES {
        return Err(format!(
            "`fence run` appends `/<pid>/<8 hex>` to the owner, so it may have at most {} bytes",
            MAX_NAME_BYTES - RUN_OWNER_SUFFIX
        ));
    }
    Ok(name)
}

/// Parses a fencing token: a positive 64-bit integer.
pub fn parse_token(value: &str) -> Result<i64, String> {
    match value.trim().parse::<i64>() {
        Ok(token) if token >= 1 => Ok(token),
        Ok(_) => Err(format!("tokens are positive integers; `{value}` is not")),
        Err(_) => Err(format!(
            "`{value}` is not a fencing token (a positive integer up to {})",
            i64::MAX
        )),
    }
}

/// The highest `--above N`: it leaves 2^32 tokens for the grants after it. Above that, one
/// recovery would use up a resource's tokens for good (every later grant refused), so a
/// target that accepted such a token is fenced under a new resource name instead.
pub const ABOVE_MAX: i64 = i64::MAX - (1 << 32);

/// Parses `fence acquire --above N`: a token the grant must exceed, a positive integer up to
/// [`ABOVE_MAX`].
pub fn parse_above(value: &str) -> Result<i64, String> {
    match value.trim().parse::<i64>() {
        Ok(n) if (1..=ABOVE_MAX).contains(&n) => Ok(n),
        Ok(n) if n > ABOVE_MAX => Err(format!(
            "--above {n} would leave fewer than 4,294,967,296 tokens for the grants after it (a token can be at most {}): the target's token was not issued by any store; fence that target under a new resource name instead",
            i64::MAX
        )),
        _ => Err(format!(
            "`{value}` is not a token to go above: --above takes the highest token the target accepted (`fence inspect RESOURCE --target URL` shows it), a positive integer up to {ABOVE_MAX}"
        )),
    }
}

/// Checks `--schema`: a plain lowercase SQL identifier, so it never needs quoting tricks.
pub fn parse_schema(value: &str) -> Result<String, String> {
    let mut chars = value.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    if first_ok
        && value.len() <= 63
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "`{value}` is not a schema name fence accepts: use 1–63 characters of a-z, 0-9 and _, not starting with a digit"
        ))
    }
}

/// Which coordinator a store URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// `postgres://…` or `postgresql://…`: the URL exactly as given.
    Postgres(String),
    /// `file:///dir`: the embedded local-directory store.
    File(PathBuf),
    /// `s3://bucket/prefix` or `gs://bucket/prefix`: lease objects in a bucket.
    Object(crate::url::ObjectUrl),
}

/// A resolved store: what to connect to, and how to name it in output.
#[derive(Clone, Debug)]
pub struct StoreSpec {
    pub kind: StoreKind,
    /// The URL as the user gave it (may hold a password; never printed).
    pub url: String,
    /// The URL with any password removed: safe for output, logs and errors.
    pub display: String,
}

impl StoreSpec {
    /// Resolves `--store` / `FENCE_STORE` (already merged by clap), else the embedded default.
    pub fn resolve(flag: Option<&str>) -> Result<StoreSpec, Error> {
        let url = match flag {
            Some(url) => url.to_owned(),
            None => default_store_url()?,
        };
        let display = redact_url(&url);
        let kind = if let Some(rest) = url.strip_prefix("file://") {
            StoreKind::File(file_path(rest, &display)?)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            StoreKind::Postgres(url.clone())
        } else if let Some(parsed) = crate::url::ObjectUrl::parse(&url, false) {
            // `file://` was taken above: this is `s3://` or `gs://`.
            StoreKind::Object(parsed?)
        } else {
            return Err(Error::usage(
                format!("`{display}` is not a store URL fence understands"),
                "use `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, `file:///dir`, or leave --store and FENCE_STORE unset for the embedded default",
            ));
        };
        Ok(StoreSpec { kind, url, display })
    }
}

fn file_path(rest: &str, display: &str) -> Result<PathBuf, Error> {
    crate::url::file_path(rest).map_err(|err| match err {
        FilePathError::NotAbsolute => Error::usage(
            format!("`{display}` does not name an absolute directory"),
            "write the path after `file://` in full, e.g. `file:///var/lib/fence` (three slashes)",
        ),
        FilePathError::BadEscape => Error::usage(
            format!("`{display}` has a malformed %-escape"),
            "escape bytes as %XX with two hex digits, or write the path plainly",
        ),
    })
}

/// `file://$XDG_STATE_HOME/fence`, falling back to `$HOME/.local/state/fence`.
pub fn default_store_url() -> Result<String, Error> {
    // `%` escaped, since the URL is decoded again: the directory is the one given.
    Ok(format!(
        "file://{}",
        default_store_dir()?
            .display()
            .to_string()
            .replace('%', "%25")
    ))
}

/// The embedded default store's directory: `$XDG_STATE_HOME/fence`, falling back to
/// `$HOME/.local/state/fence`. The only store fence creates with missing parents.
pub fn default_store_dir() -> Result<PathBuf, Error> {
    let base =
        match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
            Some(state) => PathBuf::from(state),
            None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
                Some(home) => PathBuf::from(home).join(".local/state"),
                None => return Err(Error::usage(
                    "no store given and neither XDG_STATE_HOME nor HOME is set",
                    "pass `--store file:///some/dir` or `--store postgres://…`, or set FENCE_STORE",
                )),
            },
        };
    if !base.is_absolute() {
        return Err(Error::usage(
            format!(
                "the default store directory `{}` is not absolute",
                base.display()
            ),
            "set XDG_STATE_HOME or HOME to an absolute path, or pass `--store file:///dir`",
        ));
    }
    Ok(base.join("fence"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants() {
        assert_eq!(
            parse_instant("2026-12-02T16:00:30.123Z"),
            Ok(1_796_227_230_123)
        );
        assert_eq!(
            parse_instant("2026-12-02T18:00:30.123+02:00"),
            Ok(1_796_227_230_123)
        );
        assert_eq!(parse_instant("2026-12-02 16:00:30Z"), Ok(1_796_227_230_000));
        // Without a zone: local time, which depends on TZ (tests/log.rs sets it in a child).
        assert!(parse_instant("2026-12-02 16:00:30").is_ok());
        let back = parse_instant("2h").unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        assert!((now - back - 7_200_000).abs() < 60_000);
        assert!(parse_instant("yesterday").is_err());
    }

    #[test]
    fn above_takes_a_positive_integer_with_room_above_it() {
        assert_eq!(parse_above("99"), Ok(99));
        assert_eq!(parse_above("1"), Ok(1));
        assert_eq!(parse_above(&ABOVE_MAX.to_string()), Ok(ABOVE_MAX));
        for bad in ["0", "-1", "abc", "1.5", "", "9223372036854775808"] {
            let err = parse_above(bad).unwrap_err();
            assert!(err.contains("positive integer up to"), "{bad:?}: {err}");
        }
        for high in [ABOVE_MAX + 1, i64::MAX - 1, i64::MAX] {
            let err = parse_above(&high.to_string()).unwrap_err();
            assert!(err.contains("new resource name"), "{high}: {err}");
        }
    }

    #[test]
    fn names() {
        assert!(parse_name("nightly-report").is_ok());
        assert!(parse_name("ünïcode/with spaces inside").is_ok());
        assert!(parse_name("").is_err());
        assert!(parse_name(" lead").is_err());
        assert!(parse_name("trail\u{3000}").is_err());
        assert!(parse_name("bell\u{7}").is_err());
        assert!(parse_name(&"x".repeat(200)).is_ok());
        assert!(parse_write_id("publish-2026-12-04").is_ok());
        assert!(parse_write_id("nightly:run@host+1_a.b").is_ok());
        assert!(parse_write_id(&"x".repeat(64)).is_ok());
        assert!(parse_write_id(&"x".repeat(65)).is_err());
        assert!(parse_write_id("").is_err());
        assert!(parse_write_id("a b").is_err());
        assert!(parse_write_id("a,b").is_err());
        assert!(parse_write_id("é").is_err());
        assert!(parse_name(&"x".repeat(201)).is_err());
    }

    #[test]
    fn ttls_and_tokens() {
        assert_eq!(parse_ttl("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_ttl("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_ttl("abc").is_err());
        assert!(parse_ttl("99ms").is_err());
        assert!(parse_ttl("25h").is_err());
        assert_eq!(parse_token("42"), Ok(42));
        assert!(parse_token("0").is_err());
        assert!(parse_token("-1").is_err());
        assert!(parse_token("9223372036854775808").is_err());
    }

    #[test]
    fn store_urls() {
        let spec = StoreSpec::resolve(Some("file:///tmp/a%20b")).unwrap();
        assert_eq!(spec.kind, StoreKind::File(PathBuf::from("/tmp/a b")));
        assert!(StoreSpec::resolve(Some("file://relative")).is_err());
        assert!(StoreSpec::resolve(Some("redis://x")).is_err());
        assert!(StoreSpec::resolve(Some("postgres://u:p@h/db")).is_ok());
        assert!(StoreSpec::resolve(Some("s3://bucket/fence/prod")).is_ok());
        assert!(StoreSpec::resolve(Some("gs://b")).is_err());
    }
}
