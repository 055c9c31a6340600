//! Objects with versions and preconditions: the one small interface that the object-store
//! coordinator and fenced object writes are built on (this module depends on neither).
//!
//! Every backend offers the same two guarantees, which is all fence relies on:
//! - a put conditioned on [`Cond::Create`] succeeds only when no object exists, and one
//!   conditioned on [`Cond::Match`] only when the object's current version is exactly the one
//!   read; a lost race is reported as [`Put::Lost`], never as success;
//! - `last_modified_ms` comes from the *store's* clock (DESIGN I7), with the resolution
//!   [`ObjectApi::clock_resolution_ms`] says (S3: whole seconds, rounded down).
//!
//! Backends: S3 through `object_store` (feature `s3`), GCS through its JSON API (feature
//! `gcs`), and `file://` objects that are ours (a per-object `flock`, generation and metadata
//! in a sidecar).

#[cfg(feature = "gcs")]
mod gcs;
#[cfg(feature = "gcs")]
mod gcs_auth;
mod local;
#[cfg(feature = "s3")]
mod s3;
#[cfg(any(feature = "s3", feature = "gcs"))]
mod upload;
pub mod verify;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use indicatif::ProgressBar;

use crate::error::Error;
pub use crate::url::{ObjectUrl, Service};

/// Metadata fence stores on a fenced object.
pub const META_TOKEN: &str = "fence-token";
pub const META_RESOURCE: &str = "fence-resource";
pub const META_OWNER: &str = "fence-owner";
/// The write id (`--id`) of the write that made this version.
pub const META_ID: &str = "fence-id";
/// The write ids of the versions before, newest first (the ledger of the object targets).
pub const META_IDS: &str = "fence-ids";
/// The digest of the bytes of the write that made this version (with `fence-id`): the same
/// id with other bytes is another write, refused rather than replayed.
pub const META_ID_DIGEST: &str = "fence-id-digest";
/// The digest of the endpoint and bucket the prefix's proof held for when this version was
/// written (`verify::identity`): a copy of the object elsewhere, or one read through a proxy,
/// does not match, and is proven again before it is written.
pub const META_PROVEN: &str = "fence-proven";

/// What a put is conditioned on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cond {
    /// No precondition (clock probes, event and waiter records: unique or disposable keys).
    None,
    /// Only when no object exists.
    Create,
    /// Only when the current version is exactly this one.
    Match(String),
}

/// The state of a stored object.
#[derive(Clone, Debug)]
pub struct Meta {
    /// The ETag (S3) or generation (GCS, `file://`) of this version.
    pub version: String,
    /// By the store's clock, milliseconds since the Unix epoch (rounded down).
    pub last_modified_ms: i64,
    pub metadata: BTreeMap<String, String>,
}

/// An object's bytes with the state they belong to.
#[derive(Clone, Debug)]
pub struct Fetched {
    pub meta: Meta,
    pub body: Vec<u8>,
}

/// The outcome of a conditional put.
#[derive(Debug)]
pub enum Put {
    Done(Meta),
    /// The precondition failed: another writer changed (or created) the object first.
    Lost,
}

/// One object service.
#[async_trait(?Send)]
pub trait ObjectApi {
    /// The object with its bytes, or `None` when absent.
    async fn get(&self, key: &str) -> Result<Option<Fetched>, Error>;

    /// The object's state without its bytes, or `None` when absent.
    async fn head(&self, key: &str) -> Result<Option<Meta>, Error>;

    /// Stores `body` under `key` with `metadata`, if `cond` holds.
    async fn put(
        &self,
        key: &str,
        body: Vec<u8>,
        cond: &Cond,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Put, Error>;

    /// Stores `body` unconditionally where the caller needs no answer but success (event and
    /// waiter records under unique names).
    async fn put_blind(&self, key: &str, body: Vec<u8>) -> Result<(), Error> {
        self.put(key, body, &Cond::None, &BTreeMap::new())
            .await
            .map(drop)
    }

    /// The names (relative to `prefix/`) of the objects directly under `prefix/`.
    async fn list(&self, prefix: &str) -> Result<Vec<String>, Error>;

    /// Removes an object (waiter records only: fence never deletes a lease or event).
    async fn delete(&self, key: &str) -> Result<(), Error>;

    /// Whether a small body is cheaper to keep a copy of in the object's metadata: GCS reads
    /// metadata (with the generation and a millisecond `updated`) in one request, the bytes
    /// with their generation in two.
    fn body_fits_metadata(&self) -> bool {
        false
    }

    /// The shortest lease TTL this store sustains, and why, if it has one: a holder renews at a
    /// third of its TTL, one write of the lease object each time.
    fn min_ttl(&self) -> Option<(i64, &'static str)> {
        None
    }

    /// How coarse `last_modified_ms` is: a lease counts as live for this much longer.
    fn clock_resolution_ms(&self) -> i64;

    /// When this client last sent a request, counting its last retry (a put retried after 429
    /// was applied by the attempt that got through): `None` where the client retries out of
    /// sight (S3's, whose store has no per-object write limit).
    fn last_sent(&self) -> Option<tokio::time::Instant> {
        None
    }

    /// Whether the store compares a version the caller names as an ETag (`--if-match`) and
    /// as a generation (`--if-generation-match`).
    fn version_kinds(&self) -> VersionKinds;
}

/// Which kinds of version a backend can compare.
#[derive(Clone, Copy, Debug)]
pub struct VersionKinds {
    pub etag: bool,
    pub generation: bool,
}

/// How long a read waits for a `file://` object's lock (a write waits its `--timeout`).
pub const LOCK_WAIT: Duration = Duration::from_secs(30);

/// Opens the object service a URL names (no network traffic yet).
pub fn open(url: &ObjectUrl) -> Result<Box<dyn ObjectApi>, Error> {
    open_reporting(url, ProgressBar::hidden(), LOCK_WAIT)
}

/// [`open`], with puts reporting the bytes sent on `bar` (which may be hidden), and
/// `file://` objects' locks waited for at most `lock_wait` from now in all.
pub fn open_reporting(
    url: &ObjectUrl,
    bar: ProgressBar,
    lock_wait: Duration,
) -> Result<Box<dyn ObjectApi>, Error> {
    match url.service {
        Service::File => Ok(Box::new(local::LocalObjects::new(
            PathBuf::from(&url.bucket),
            bar,
            lock_wait,
        ))),
        #[cfg(feature = "s3")]
        Service::S3 => Ok(Box::new(s3::S3Objects::new(
            &url.bucket,
            bar,
            url.names_object,
        )?)),
        #[cfg(feature = "gcs")]
        Service::Gcs => Ok(Box::new(gcs::GcsObjects::new(&url.bucket, bar)?)),
        #[allow(unreachable_patterns)]
        _ => Err(Error::usage(
            format!(
                "`{}`: this build of fence has no support for this object store",
                url.display
            ),
            "rebuild with the default cargo features (`s3`, `gcs`), or use `file://` or PostgreSQL",
        )),
    }
}

/// A key-safe, reversible encoding of a resource name for object keys: `[A-Za-z0-9-]` stay,
/// every other byte becomes `_XX` (so the key never needs escaping in any service).
pub fn encode_key(resource: &str) -> String {
    let mut out = String::with_capacity(resource.len());
    for byte in resource.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("_{byte:02X}"));
        }
    }
    out
}

/// An error talking to an object store, before anything was applied.
#[cfg(any(feature = "s3", feature = "gcs"))]
pub(crate) fn unavailable(display: &str, what: &str, err: impl std::fmt::Display) -> Error {
    Error::unavailable(
        format!("cannot {what} at `{display}`: {err}"),
        "check the endpoint, the network and the credentials (AWS_* / GOOGLE_OAUTH_ACCESS_TOKEN / GOOGLE_APPLICATION_CREDENTIALS), then retry",
    )
}

/// Pauses before the further attempts of a request that got a transient answer (429, or a 5xx
/// other than 501): about 3 s in all (plus jitter), so a lease renewed at a third of its TTL
/// still has time for the renewal (the minimum TTL on object stores is documented above it).
#[cfg(any(feature = "s3", feature = "gcs"))]
pub(crate) const RETRY_PAUSES_MS: [u64; 5] = [100, 200, 400, 800, 1_600];

/// Whether an HTTP status may change on retry: too many requests, or a server error other than
/// "not implemented".
#[cfg(any(feature = "s3", feature = "gcs"))]
pub(crate) fn transient(status: u16) -> bool {
    status == 429 || status == 408 || ((500..600).contains(&status) && status != 501)
}

/// The pause before attempt `n + 1` (`None`: give up), with up to 50% jitter so that many
/// processes throttled together do not return together.
#[cfg(any(feature = "s3", feature = "gcs"))]
pub(crate) fn retry_pause(n: usize) -> Option<std::time::Duration> {
    let base = *RETRY_PAUSES_MS.get(n)?;
    let jitter = crate::sys::random_u64() % (base / 2 + 1);
    Some(std::time::Duration::from_millis(base + jitter))
}

/// The machine-readable code of an error answer: S3's `<Code>` element, or the `reason` of
/// the first entry (else the `status`) of a Google JSON error.
#[cfg(any(feature = "s3", feature = "gcs"))]
pub(crate) fn error_code(body: &str) -> Option<String> {
    if let Some(start) = body.find("<Code>") {
        let rest = &body[start + "<Code>".len()..];
        return rest
            .find("</Code>")
            .map(|end| rest[..end].trim().to_owned());
    }
    let json: serde_json::Value = serde_json::from_str(body).ok()?;
    let error = &json["error"];
    error["errors"][0]["reason"]
        .as_str()
        .or_else(|| error["status"].as_str())
        .map(str::to_owned)
}

/// The variables object_store's `from_env` reads for AWS setting `lower` (it lowercases
/// every name that starts with `AWS_`): each one's name and value, in the environment's order.
pub(crate) fn aws_vars(lower: &str) -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, _)| name.starts_with("AWS_") && name.to_ascii_lowercase() == lower)
        .collect()
}

/// The S3 endpoint the environment names, as object_store's `from_env` reads it:
/// `AWS_ENDPOINT_URL_S3` first, else `AWS_ENDPOINT_URL` or `AWS_ENDPOINT` (in any case after
/// `AWS_`); with the variable it came from. Refused (exit 2, by name): an empty one (which
/// object_store would take as the endpoint, and fail on), two that name different servers
/// (which one object_store took would depend on the order of the environment), and a user or
/// password in it (S3 does not use them, and object_store's errors would show them).
pub(crate) fn s3_endpoint() -> Result<Option<(String, String)>, Error> {
    let pick = |vars: Vec<(String, String)>| -> Result<Option<(String, String)>, Error> {
        for (name, value) in &vars {
            check_endpoint(name, value)?;
        }
        let first = vars.first().cloned();
        if let Some((a, x)) = &first {
            if let Some((b, y)) = vars
                .iter()
                .find(|(_, y)| verify::normalize(y) != verify::normalize(x))
            {
                return Err(Error::usage(
                    format!(
                        "{a} and {b} name different S3 endpoints (`{}` and `{}`)",
                        crate::url::redact_url(x),
                        crate::url::redact_url(y)
                    ),
                    "set only one of them (AWS_ENDPOINT_URL_S3, if set, comes first)",
                ));
            }
        }
        Ok(first)
    };
    if let Some(found) = pick(aws_vars("aws_endpoint_url_s3"))? {
        return Ok(Some(found));
    }
    let mut generic = aws_vars("aws_endpoint_url");
    generic.extend(aws_vars("aws_endpoint"));
    pick(generic)
}

/// `value` of variable `name` as an S3 endpoint: `http(s)://host[:port]` and at most a path,
/// refused by name otherwise (object_store panics on a port that is not a number, or a value
/// without a scheme), and refused with a user or password (S3 does not use them, and
/// object_store's errors would show them), wherever an `@` is (a password may hold `/`).
fn check_endpoint(name: &str, value: &str) -> Result<(), Error> {
    let shown = crate::url::redact_url(value);
    let bad = |why: &str| {
        Error::usage(
            format!("{name} is `{shown}`, {why}"),
            format!("set {name} to the S3 endpoint as http(s)://host[:port], or unset it"),
        )
    };
    if value.is_empty() {
        return Err(Error::usage(
            format!("{name} is set but empty"),
            format!("unset {name}, or set it to the S3 endpoint (https://host[:port])"),
        ));
    }
    let Some((scheme, rest)) = value.split_once("://") else {
        return Err(bad("which has no scheme (http:// or https://)"));
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(bad("whose scheme is neither http nor https"));
    }
    if rest.contains('@') {
        return Err(Error::usage(
            format!("{name} holds a user or password (`{shown}`), which S3 does not use"),
            format!("remove the user and password from {name}: S3 credentials are AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
        ));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let (host, port) = match authority.strip_prefix('[') {
        // An IPv6 address: `[::1]` or `[::1]:9000`.
        Some(v6) => match v6.split_once(']') {
            Some((host, after)) if !host.is_empty() => match after {
                "" => (host, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None => return Err(bad("whose host is not a host")),
                },
            },
            _ => return Err(bad("whose host is not a host")),
        },
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b));
    if !host_ok {
        return Err(bad("whose host is not a host name or address"));
    }
    if port.is_some_and(|port| port.parse::<u16>().map_or(true, |p| p == 0)) {
        return Err(bad("whose port is not a number from 1 to 65535"));
    }
    Ok(())
}

/// The GCS endpoint the environment names (`FENCE_GCS_ENDPOINT`, else
/// `STORAGE_EMULATOR_HOST`, which may leave out the scheme: http), else Google's; with the
/// scheme always written out, as requests go.
pub(crate) fn gcs_endpoint() -> String {
    let endpoint = std::env::var("FENCE_GCS_ENDPOINT")
        .or_else(|_| std::env::var("STORAGE_EMULATOR_HOST"))
        .unwrap_or_else(|_| GCS_DEFAULT_ENDPOINT.into());
    if endpoint.contains("://") {
        endpoint
    } else {
        format!("http://{endpoint}")
    }
}

/// Google's own GCS endpoint.
pub(crate) const GCS_DEFAULT_ENDPOINT: &str = "https://storage.googleapis.com";

/// A definite answer (a 4xx, or 501) to a request: the server refused it, nothing was
/// applied, and asking again will not help. `credentials` names where the credentials came
/// from, for 401/403 and expired tokens.
#[cfg(any(feature = "s3", feature = "gcs"))]
pub(crate) fn refused(
    display: &str,
    what: &str,
    status: u16,
    body: &str,
    credentials: &str,
) -> Error {
    // By the error's code, never by its message: the message may quote the object's key.
    let expired = matches!(
        error_code(body).as_deref(),
        Some("ExpiredToken" | "TokenRefreshRequired")
    );
    let body: String = body.chars().take(300).collect();
    let bucket = display.split("://").nth(1).unwrap_or(display);
    match status {
        404 => Error::usage(
            format!("cannot {what}: the bucket `{bucket}` does not exist (HTTP 404 from `{display}`)"),
            "create the bucket, or fix the bucket name in the URL",
        ),
        501 => Error::usage(
            format!("cannot {what} at `{display}`: the server does not implement this request (HTTP 501 Not Implemented; nothing was written): {body}"),
            "use a server that implements conditional writes (see docs/object-stores.md, the object store requirements)",
        ),
        401 | 403 | 400 if expired => Error::unavailable(
            format!("cannot {what} at `{display}`: the credentials have expired ({credentials}; HTTP {status}, nothing was written)"),
            format!("renew the credentials ({credentials}), then retry"),
        ),
        401 => Error::unavailable(
            format!("cannot {what} at `{display}`: the credentials have expired or are invalid ({credentials}; HTTP 401, nothing was written)"),
            format!("renew the credentials ({credentials}), then retry"),
        ),
        403 => Error::unavailable(
            format!("cannot {what} at `{display}`: the credentials were refused ({credentials}; HTTP {status}, nothing was written): {body}"),
            format!("check the credentials ({credentials}) and the permissions on the bucket, then retry"),
        ),
        429 => Error::unavailable(
            format!("cannot {what} at `{display}`: the server kept answering HTTP 429 Too Many Requests (nothing was written)"),
            "write less often to the same object (a longer --ttl renews less often), then retry",
        ),
        _ => Error::unavailable(
            format!("cannot {what} at `{display}`: the server refused the request with HTTP {status} (nothing was written): {body}"),
            "nothing was changed; fix what the server names, then retry",
        ),
    }
}

/// A request the server answered with a redirect, which fence does not follow: nothing was
/// applied. `settings` names the settings that point fence at servers (the bucket's, and
/// the credentials'); the message names the server that redirected. `endpoint_var`: the
/// variable that names S3's endpoint, if one does (then the region alone does not move it).
#[cfg(any(feature = "s3", feature = "gcs"))]
pub(crate) fn redirected(
    display: &str,
    what: &str,
    redirect: &upload::Redirected,
    settings: &str,
    endpoint_var: Option<&str>,
) -> Error {
    let hint = match (&redirect.region, endpoint_var) {
        (Some(region), None) => format!("the bucket is in region `{region}`, as S3 answered: set AWS_REGION={region}"),
        (Some(region), Some(var)) => format!("the bucket is in region `{region}`, as S3 answered: point {var} at that region's endpoint, and set AWS_REGION={region}"),
        (None, _) => format!("point the setting that names `{}` ({settings}) at a server that answers itself, not at one that redirects", redirect.from),
    };
    Error::usage(
        format!("cannot {what} at `{display}`: {redirect}; a request sent on would carry fence's credentials to another server, and a conditional write be judged there (nothing was changed)"),
        hint,
    )
}

/// An error during a put whose outcome cannot be known.
#[cfg(any(feature = "s3", feature = "gcs"))]
pub(crate) fn put_unknown(display: &str, key: &str, err: impl std::fmt::Display) -> Error {
    Error::outcome_unknown(
        format!("the write of `{key}` at `{display}` may or may not have applied: {err}"),
        "inspect the object (its version and fence-token metadata) before retrying",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_encode_every_byte_outside_the_safe_set() {
        assert_eq!(encode_key("a/b c_d"), "a_2Fb_20c_5Fd");
    }

    #[test]
    #[cfg(any(feature = "s3", feature = "gcs"))]
    fn expired_credentials_are_known_by_their_code_not_their_message() {
        let s3 = "<Error><Code>ExpiredToken</Code><Message>The provided token has expired.</Message></Error>";
        let skew = "<Error><Code>RequestExpired</Code><Message>Request has expired</Message><Key>expired-token</Key></Error>";
        let gcs =
            r#"{"error":{"code":403,"message":"ExpiredToken","errors":[{"reason":"forbidden"}]}}"#;
        assert_eq!(error_code(s3).as_deref(), Some("ExpiredToken"));
        assert_eq!(error_code(skew).as_deref(), Some("RequestExpired"));
        assert_eq!(error_code(gcs).as_deref(), Some("forbidden"));
        assert_eq!(error_code("not an error document"), None);
        let message = |body: &str| refused("s3://b", "write", 403, body, "env").to_string();
        assert!(message(s3).contains("expired"), "{}", message(s3));
        for body in [skew, gcs] {
            assert!(
                !message(body).contains("credentials have expired"),
                "{}",
                message(body)
            );
        }
    }
}
