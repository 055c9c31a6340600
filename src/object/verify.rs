//! Verify before trusting (DESIGN §10): fence's guarantees rest entirely on the store refusing
//! a conditional put whose precondition does not hold. Many S3- and GCS-compatible servers
//! ignore `If-None-Match`, `If-Match` or `ifGenerationMatch` and store the object anyway; on
//! such a server fence would grant one lease to two owners without a sign. So before a
//! prefix is first used (as a coordinator, or as the home of fenced objects) fence proves on a
//! scratch object of its own that the server
//! - refuses a create-only put of an existing object with 412, leaving it unchanged;
//! - refuses a put conditioned on a version that is not the current one with 412, leaving it
//!   unchanged;
//! - accepts a put conditioned on the current version (otherwise no lease could ever be
//!   renewed),
//!
//! and records that in `<prefix>/.fence/verified` (JSON: when by the store's clock, against
//! which endpoint, by which fence), so that later processes pay one read at most, and usually
//! nothing (a lease record written after verification says so itself).
//!
//! A server that fails is refused with exit 2 naming the precondition it ignored. The only way
//! past is [`UNVERIFIED_ENV`], named so that nobody sets it by accident.
//!
//! `file://` objects are fence's own implementation and need no proof.

use std::collections::BTreeMap;

use serde_json::json;

use crate::error::Error;
use crate::object::{Cond, ObjectApi, ObjectUrl, Put, Service, META_PROVEN};

/// How many endpoints a verification record keeps (the newest).
const MAX_PROVEN: usize = 32;

/// Set to `1` to use a store whose preconditions are not verified (or were found ignored):
/// fence then warns on every use and may grant one lease to several owners.
pub const UNVERIFIED_ENV: &str = "FENCE_I_KNOW_THE_STORE_IGNORES_PRECONDITIONS";

/// The name of the verification record under a prefix.
pub fn record_key(dir: &str) -> String {
    join(dir, ".fence/verified")
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

/// The endpoint requests go to, as the verification record names it.
fn endpoint(url: &ObjectUrl) -> String {
    match url.service {
        // The endpoint object_store uses (an ambiguous pair is refused before any request).
        Service::S3 => crate::object::s3_endpoint()
            .ok()
            .flatten()
            .map(|(_, endpoint)| endpoint)
            .unwrap_or_else(|| "https://s3.amazonaws.com".to_owned()),
        Service::Gcs => crate::object::gcs_endpoint(),
        Service::File => "file".into(),
    }
}

fn bypassed() -> bool {
    std::env::var(UNVERIFIED_ENV).is_ok_and(|v| v == "1")
}

fn warn_unverified(url: &ObjectUrl) {
    crate::terminal::warn(&format!(
        "WARNING: {UNVERIFIED_ENV}=1: using `{}` without proof that it enforces conditional writes; on a server that ignores them one lease can be granted to several owners",
        url.display
    ));
}

/// What a proof is bound to: the endpoint fence's requests go to — scheme, host and port,
/// lowercased, the scheme's default port and any user info left out —, the bucket, and the
/// proxy settings on the way (`route`: ` via …`). A proof made through one path says
/// nothing of another: a proxy in between may strip the preconditions, and a copy of the
/// prefix (`aws s3 sync`) may sit on a server that ignores them.
pub fn identity(url: &ObjectUrl) -> String {
    let endpoint = normalize(&endpoint(url));
    // Set at all, as the client reads it (a value that is not UTF-8 counts: review 23).
    let cgi = std::env::var_os("REQUEST_METHOD").is_some();
    let route = route(url.service, &endpoint, cgi, &|name| {
        std::env::var(name).ok()
    });
    match route {
        Some(route) => format!("{endpoint}/{} via {route}", url.bucket),
        None => format!("{endpoint}/{}", url.bucket),
    }
}

/// The proxy settings that decide which way fence's HTTP requests to `endpoint` (normalized)
/// go, as its clients read them, or `None` for none (review 22: a proof made directly was
/// trusted through a forward proxy named by `HTTP_PROXY` that stripped the preconditions, and
/// one lease was granted to eight owners). S3's `AWS_PROXY_URL` (with `AWS_PROXY_EXCLUDES`)
/// replaces the others; else the variables reqwest reads as curl does: `HTTPS_PROXY` or
/// `HTTP_PROXY` by the endpoint's scheme and `ALL_PROXY` (upper case before lower), with
/// `NO_PROXY` beside them, and none at all under CGI (`REQUEST_METHOD` set). Taken as
/// written, not evaluated (whether `NO_PROXY` spares this host, whether a value parses): the
/// same settings take the same way, and other settings are proven again. Proxy URLs as
/// [`normalize`] writes endpoints: without their user info (the identity is stored).
fn route(
    service: Service,
    endpoint: &str,
    cgi: bool,
    var: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    let set = |value: Option<String>| value.filter(|v| !v.is_empty());
    let mut parts = Vec::new();
    if service == Service::S3 {
        if let Some((_, url)) = crate::object::aws_vars("aws_proxy_url").pop() {
            parts.push(format!("proxy {}", normalize(&url)));
            if let Some((_, excludes)) = crate::object::aws_vars("aws_proxy_excludes").pop() {
                parts.push(format!("except {excludes}"));
            }
            return Some(parts.join(" "));
        }
    }
    if cgi {
        return None;
    }
    let first = |names: [&str; 2]| set(names.iter().find_map(|name| var(name)));
    let by_scheme = if endpoint.starts_with("http://") {
        ("http", first(["HTTP_PROXY", "http_proxy"]))
    } else {
        ("https", first(["HTTPS_PROXY", "https_proxy"]))
    };
    if let (scheme, Some(value)) = by_scheme {
        parts.push(format!("{scheme} {}", normalize(&value)));
    }
    if let Some(all) = first(["ALL_PROXY", "all_proxy"]) {
        parts.push(format!("all {}", normalize(&all)));
    }
    if parts.is_empty() {
        return None;
    }
    if let Some(no) = first(["NO_PROXY", "no_proxy"]) {
        parts.push(format!("except {no}"));
    }
    Some(parts.join(" "))
}

/// `https://User@Storage.GoogleAPIs.com:443/` → `https://storage.googleapis.com`.
pub fn normalize(endpoint: &str) -> String {
    let (scheme, rest) = endpoint.split_once("://").unwrap_or(("https", endpoint));
    let scheme = scheme.to_ascii_lowercase();
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let mut host_port = host_port.to_ascii_lowercase();
    let default = match scheme.as_str() {
        "https" => Some(":443"),
        "http" => Some(":80"),
        _ => None,
    };
    if let Some(default) = default {
        if let Some(bare) = host_port.strip_suffix(default) {
            host_port = bare.to_owned();
        }
    }
    format!("{scheme}://{host_port}")
}

/// The identities a verification record holds (see [`identity`]): `proven_for`, and the
/// single `endpoint` of records from fence versions before it (bound to `bucket`, the one
/// the record is read from).
fn proven_for(record: &[u8], bucket: &str) -> Vec<String> {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(record) else {
        return Vec::new();
    };
    let mut all: Vec<String> = json["proven_for"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if all.is_empty() {
        if let Some(endpoint) = json["endpoint"].as_str() {
            all.push(format!("{}/{bucket}", normalize(endpoint)));
        }
    }
    all
}

/// Makes sure `dir` (a key prefix in `url`'s bucket) was verified through the endpoint fence
/// talks to now ([`identity`]), verifying it now if not: a record made through another
/// endpoint (a proxy, a copy of the prefix on another server) is proven again here, and a
/// failure then names the mismatch. `force` verifies again even when a record matches
/// (`fence init`). `false` only when the check was skipped through [`UNVERIFIED_ENV`] (after
/// a loud warning).
pub async fn ensure(
    api: &dyn ObjectApi,
    url: &ObjectUrl,
    dir: &str,
    force: bool,
) -> Result<bool, Error> {
    if url.service == Service::File {
        return Ok(true);
    }
    let me = identity(url);
    let mine = crate::fenced::write_digest(me.as_bytes());
    // The endpoints a record holds are in its metadata too (their digests), so that the
    // common check is one HEAD; a record of an older fence is read whole.
    let mut proven = Vec::new();
    if let Some(meta) = api.head(&record_key(dir)).await? {
        let digests: Vec<&str> = meta
            .metadata
            .get(META_PROVEN)
            .map(|all| all.split(';').collect())
            .unwrap_or_default();
        if !force && digests.contains(&mine.as_str()) {
            return Ok(true);
        }
        if let Some(record) = api.get(&record_key(dir)).await? {
            proven = proven_for(&record.body, &url.bucket);
        }
        if !force && proven.contains(&me) {
            return Ok(true);
        }
    }
    if bypassed() {
        warn_unverified(url);
        return Ok(false);
    }
    if let Err(err) = prove(api, url, dir).await {
        let others: Vec<&String> = proven.iter().filter(|p| **p != me).collect();
        return Err(match (others.is_empty(), err) {
            (false, Error::Usage { message, hint, source }) => Error::Usage {
                source,
                message: format!(
                    "the proof in `{}` was made through {}, not through {me}; proven again through {me}: {message}",
                    record_key(dir),
                    others
                        .iter()
                        .map(|p| p.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                ),
                hint: format!(
                    "{hint}; a proxy in between, or a copy of the prefix on another server, must enforce conditional writes too"
                ),
            },
            (_, err) => err,
        });
    }
    if !proven.contains(&me) {
        proven.push(me);
    }
    // The newest endpoints, as many as metadata holds comfortably.
    let skip = proven.len().saturating_sub(MAX_PROVEN);
    let proven = &proven[skip..];
    let digests: Vec<String> = proven
        .iter()
        .map(|p| crate::fenced::write_digest(p.as_bytes()))
        .collect();
    let record = json!({
        "verified": ["create-only put of an existing object refused (412)", "put on a wrong version refused (412)", "put on the current version accepted"],
        "endpoint": crate::url::redact_url(&endpoint(url)),
        "proven_for": proven,
        "by": format!("fence {}", env!("CARGO_PKG_VERSION")),
    })
    .to_string();
    api.put(
        &record_key(dir),
        record.into_bytes(),
        &Cond::None,
        &BTreeMap::from([(META_PROVEN.to_owned(), digests.join(";"))]),
    )
    .await?;
    Ok(true)
}

/// What a failed check ignored, for the message.
fn ignored(url: &ObjectUrl, what: &str, how: &str) -> Error {
    Error::usage(
        format!(
            "`{}` (endpoint {}) does not enforce {what}: {how}; fence refuses to use a store that would let two owners hold one lease",
            url.display,
            crate::url::redact_url(&endpoint(url))
        ),
        format!(
            "use a server that enforces conditional writes atomically (AWS S3, Google Cloud Storage; see docs/object-stores.md, the object store requirements); only if you accept double grants, set {UNVERIFIED_ENV}=1"
        ),
    )
}

/// The condition names as the service spells them.
fn names(url: &ObjectUrl) -> (&'static str, &'static str) {
    match url.service {
        Service::Gcs => ("`ifGenerationMatch=0`", "`ifGenerationMatch=<generation>`"),
        _ => ("`If-None-Match: *`", "`If-Match: <etag>`"),
    }
}

/// A version that is certainly not `current`.
fn wrong_version(url: &ObjectUrl, current: &str) -> String {
    match url.service {
        Service::Gcs => current
            .parse::<u64>()
            .map_or_else(|_| "1".to_owned(), |g| (g + 1_000_000).to_string()),
        _ => {
            let wrong = "\"00000000000000000000000000000000\"";
            if current == wrong {
                "\"11111111111111111111111111111111\"".into()
            } else {
                wrong.into()
            }
        }
    }
}

/// Proves on a scratch object of its own that the server enforces the preconditions (see the
/// module's header); the scratch object is deleted whatever the outcome (a probe left behind,
/// without delete permission, is harmless: its name is never reused).
async fn prove(api: &dyn ObjectApi, url: &ObjectUrl, dir: &str) -> Result<(), Error> {
    let probe = join(
        dir,
        &format!(".fence/probe-{:016x}", crate::sys::random_u64()),
    );
    let proved = prove_on(api, url, &probe).await;
    let _ = api.delete(&probe).await;
    proved
}

async fn prove_on(api: &dyn ObjectApi, url: &ObjectUrl, probe: &str) -> Result<(), Error> {
    let (create, update) = names(url);
    let none = BTreeMap::new();
    let unsupported = |what: &str, err: Error| -> Error {
        match err {
            Error::Usage { .. } => err,
            other => Error::usage(
                format!(
                    "cannot verify that `{}` enforces {what}: {other}",
                    url.display
                ),
                "fix what the message names and run `fence init` again",
            ),
        }
    };
    let first = match api
        .put(probe, b"first".to_vec(), &Cond::Create, &none)
        .await
        .map_err(|err| unsupported(create, err))?
    {
        Put::Done(meta) => meta,
        Put::Lost => {
            return Err(ignored(
                url,
                create,
                "a create-only put of a new object was refused",
            ))
        }
    };
    let unchanged = |step: &'static str| async move {
        match api.get(probe).await? {
            Some(f) if f.body == b"first" => Ok(()),
            _ => Err(ignored(
                url,
                step,
                "the server answered 412 but the object changed",
            )),
        }
    };
    match api
        .put(probe, b"second".to_vec(), &Cond::Create, &none)
        .await
        .map_err(|err| unsupported(create, err))?
    {
        Put::Done(_) => {
            return Err(ignored(
                url,
                create,
                "a create-only put of an existing object replaced it instead of answering 412",
            ))
        }
        Put::Lost => unchanged(create).await?,
    }
    let wrong = Cond::Match(wrong_version(url, &first.version));
    match api
        .put(probe, b"third".to_vec(), &wrong, &none)
        .await
        .map_err(|err| unsupported(update, err))?
    {
        Put::Done(_) => {
            return Err(ignored(
                url,
                update,
                "a put conditioned on a version that is not the current one replaced the object instead of answering 412",
            ))
        }
        Put::Lost => unchanged(update).await?,
    }
    match api
        .put(
            probe,
            b"fourth".to_vec(),
            &Cond::Match(first.version),
            &none,
        )
        .await
        .map_err(|err| unsupported(update, err))?
    {
        Put::Done(_) => {}
        Put::Lost => {
            return Err(ignored(
                url,
                update,
                "a put conditioned on the current version was refused",
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{normalize, route, Service};

    #[test]
    fn the_route_is_every_proxy_setting_on_the_way_without_secrets() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let gcs = |pairs: &'static [(&'static str, &'static str)], endpoint| {
            let cgi = pairs.iter().any(|(name, _)| *name == "REQUEST_METHOD");
            route(Service::Gcs, endpoint, cgi, &env(pairs))
        };
        let https = "https://storage.googleapis.com";
        assert_eq!(gcs(&[], https), None);
        // Only the scheme's own variable and ALL_PROXY; NO_PROXY beside them.
        assert_eq!(gcs(&[("HTTP_PROXY", "http://p:3128")], https), None);
        assert_eq!(
            gcs(&[("HTTP_PROXY", "http://p:3128")], "http://127.0.0.1:4443").as_deref(),
            Some("http http://p:3128")
        );
        assert_eq!(
            gcs(
                &[
                    ("https_proxy", "http://User:Secret@Proxy:3128/"),
                    ("ALL_PROXY", "socks5://a@b:1080"),
                    ("no_proxy", "internal"),
                ],
                https
            )
            .as_deref(),
            Some("https http://proxy:3128 all socks5://b:1080 except internal")
        );
        // Upper case first, even empty (as reqwest reads them); NO_PROXY alone is no route.
        assert_eq!(
            gcs(&[("HTTPS_PROXY", ""), ("https_proxy", "http://p")], https),
            None
        );
        assert_eq!(gcs(&[("NO_PROXY", "*")], https), None);
        // Under CGI reqwest uses no proxy.
        assert_eq!(
            gcs(
                &[("REQUEST_METHOD", "GET"), ("HTTPS_PROXY", "http://p")],
                https
            ),
            None
        );
    }

    #[test]
    fn endpoints_are_compared_as_the_server_sees_them() {
        for spelled in [
            "https://storage.googleapis.com",
            "https://storage.googleapis.com:443",
            "HTTPS://Storage.GoogleAPIs.com/",
            "https://user:secret@storage.googleapis.com:443/storage/v1",
        ] {
            assert_eq!(
                normalize(spelled),
                "https://storage.googleapis.com",
                "{spelled}"
            );
        }
        assert_eq!(normalize("http://127.0.0.1:80"), "http://127.0.0.1");
        assert_eq!(normalize("http://127.0.0.1:9000"), "http://127.0.0.1:9000");
        assert_ne!(
            normalize("http://127.0.0.1:9000"),
            normalize("http://127.0.0.1:9001")
        );
    }
}
