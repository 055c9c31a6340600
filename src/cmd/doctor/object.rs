//! `fence doctor`'s checks of S3 and GCS object stores: the endpoint and credentials, whether
//! the server enforces conditional writes, whether a write's answer carries the store's own
//! clock, and the ABA note on S3 ETags.

use super::{Findings, Severity};

/// Whether the server enforces the conditional writes fence relies on: the verification
/// record under `dir` when there is one, else the proof itself (which writes scratch objects
/// under `<dir>/.fence/` and, when the server passes, the record).
pub(super) async fn preconditions(url: &crate::object::ObjectUrl, dir: &str, f: &mut Findings<'_>) {
    let api = match crate::object::open(url) {
        Ok(api) => api,
        Err(err) => {
            f.add(
                "object.preconditions",
                Severity::Fail,
                err.to_string(),
                &err.hint(),
            );
            return;
        }
    };
    match crate::object::verify::ensure(api.as_ref(), url, dir, false).await {
        Ok(true) => f.add(
            "object.preconditions",
            Severity::Ok,
            "the server enforces create-only and version-conditioned writes (verified)".into(),
            "",
        ),
        Ok(false) => f.add(
            "object.preconditions",
            Severity::Fail,
            "not verified: the check was skipped on purpose, so one lease may be granted to several owners".into(),
            "use a server that enforces conditional writes, and unset the variable that skips the check",
        ),
        Err(err) => f.add(
            "object.preconditions",
            Severity::Fail,
            err.to_string(),
            &err.hint(),
        ),
    }
    object_clock(api.as_ref(), dir, f).await;
}

/// Whether the time a write's answer carries is the store's own (issue 32, 4). Expiry is
/// judged by the time of fence's own writes as their answers give it: on S3 the HTTP `Date`
/// header (its answer to a put has no other), which a proxy in front of the store may write
/// itself (nginx does by default), from its own clock; on GCS the object's `updated`, the
/// store's own. So a scratch object is written, and the time its answer gave is compared
/// with the object's own timestamp (S3 `Last-Modified`, GCS `updated`) read back.
async fn object_clock(api: &dyn crate::object::ObjectApi, dir: &str, f: &mut Findings<'_>) {
    use crate::object::{Cond, Put};
    let check = "object.clock";
    let probe = if dir.is_empty() {
        format!(".fence/clock-{:016x}", crate::sys::random_u64())
    } else {
        format!("{dir}/.fence/clock-{:016x}", crate::sys::random_u64())
    };
    let none = std::collections::BTreeMap::new();
    let answered = match api.put(&probe, b"clock".to_vec(), &Cond::None, &none).await {
        Ok(Put::Done(meta)) => meta.last_modified_ms,
        Ok(Put::Lost) | Err(_) => return,
    };
    let stored = api.head(&probe).await;
    let _ = api.delete(&probe).await;
    let Ok(Some(stored)) = stored else {
        return;
    };
    // Both are floored to the store's resolution (S3: whole seconds), and the answer comes a
    // moment after the write: a second of resolution and two of latency are honest.
    let off = answered - stored.last_modified_ms;
    let slack = api.clock_resolution_ms() + 2_000;
    if off.abs() <= slack {
        f.add(
            check,
            Severity::Ok,
            format!("the time of a write's answer is the store's own ({off:+} ms from the object's timestamp)"),
            "",
        );
    } else {
        f.add(
            check,
            Severity::Fail,
            format!(
                "the time of a write's answer (the HTTP Date header) is {:.1} s {} the object's own timestamp: something in between (a proxy, a gateway) writes its own Date from another clock, and fence judges expiry by it, so a lease could be taken over while its holder still runs",
                off.abs() as f64 / 1000.0,
                if off > 0 { "ahead of" } else { "behind" }
            ),
            "let the proxy pass the store's Date header through (nginx: `proxy_pass_header Date;`), or reach the store directly",
        );
    }
}

/// How many resources `object.high_water` looks at (two reads each).
const HIGH_WATER_LIMIT: usize = 1_000;

/// The high-water objects of an object store (`tokens/<resource>`: the highest token issued,
/// which catches an older copy of a lease object written back). Fence keeps them best effort:
/// a raise that fails is a warning on the grant, not an error, so credentials that may not
/// write under `tokens/`, or a store from before them, would leave the guard silently off.
/// Two checks: `object.high_water_writes` (a scratch object written, read back and deleted
/// there) and `object.high_water` (each resource's object against its lease record).
pub(super) async fn high_water(url: &crate::object::ObjectUrl, f: &mut Findings<'_>) {
    let coordinator = match crate::coordinator::ObjectCoordinator::open(url) {
        Ok(coordinator) => coordinator,
        Err(err) => {
            f.add(
                "object.high_water",
                Severity::Fail,
                err.to_string(),
                &err.hint(),
            );
            return;
        }
    };
    let tokens = format!("{}/tokens", url.display.trim_end_matches('/'));
    match coordinator.probe_high_water_writes().await {
        Ok(()) => f.add(
            "object.high_water_writes",
            Severity::Ok,
            format!("fence may write and read its high-water objects under `{tokens}/`"),
            "",
        ),
        Err(err) => f.add(
            "object.high_water_writes",
            Severity::Fail,
            format!(
                "fence cannot keep its high-water objects under `{tokens}/` ({err}): grants still work (each warns), but an older copy of a lease object written back would make its token live again and the next grant repeat a token; if reads fail too, every operation fails"
            ),
            &format!(
                "let fence's credentials read and write `{tokens}/*` as they do the lease objects, then run `fence doctor` again"
            ),
        ),
    }
    let report = match coordinator.high_water_report(HIGH_WATER_LIMIT).await {
        Ok(report) => report,
        Err(err) => {
            f.add(
                "object.high_water",
                Severity::Fail,
                format!("cannot compare the high-water objects with the lease records: {err}"),
                &err.hint(),
            );
            return;
        }
    };
    let names = |list: &mut dyn Iterator<Item = &String>| {
        let shown: Vec<String> = list.take(5).map(|r| format!("`{r}`")).collect();
        shown.join(", ")
    };
    let more = |n: usize| {
        if n > 5 {
            format!(" and {} more", n - 5)
        } else {
            String::new()
        }
    };
    for (resource, record, high) in &report.written_back {
        f.add(
            "object.high_water",
            Severity::Warn,
            format!(
                "the lease object of `{resource}` holds token {record}, below its high-water object's {high}: an older copy of it was written back (uploaded again, or a version restored); it is no one's lease (fence refuses token {record} as stale), and the next grant continues above {high}"
            ),
            "nothing to repair: the next grant rewrites the record; find who wrote the copy back (the bucket's access log), since a whole prefix written back from one copy would lower both",
        );
    }
    for (resource, record, high) in &report.behind {
        f.add(
            "object.high_water",
            Severity::Warn,
            format!(
                "the high-water object of `{resource}` says {high}, below its lease record's token {record}: a raise failed (its grant warned); until the holder's next renewal or the next grant raises it, an older copy written back would go unnoticed"
            ),
            "if it stays behind, check `object.high_water_writes`",
        );
    }
    if !report.damaged.is_empty() {
        f.add(
            "object.high_water",
            Severity::Warn,
            format!(
                "the high-water objects of {}{} hold no token (damaged): they are ignored until the next new token replaces them, and an older copy of their lease objects written back meanwhile would go unnoticed",
                names(&mut report.damaged.iter()),
                more(report.damaged.len())
            ),
            "a grant or a renewal of each replaces it; nothing else needs doing",
        );
    }
    if !report.missing.is_empty() {
        f.add(
            "object.high_water",
            Severity::Warn,
            format!(
                "{} of {} resources have no high-water object ({}{}): granted only by a fence from before it, or every raise failed; an older copy of their lease objects written back would go unnoticed",
                report.missing.len(),
                report.checked,
                names(&mut report.missing.iter()),
                more(report.missing.len())
            ),
            "the next grant or renewal of each creates it: a holder's renewal, or for a free resource `fence run <resource> -- true`",
        );
    }
    let clean = report.written_back.is_empty()
        && report.behind.is_empty()
        && report.damaged.is_empty()
        && report.missing.is_empty();
    if clean {
        let of = if report.checked < report.resources {
            format!(" (the first {} of {})", report.checked, report.resources)
        } else {
            String::new()
        };
        f.add(
            "object.high_water",
            Severity::Ok,
            format!(
                "{} resources{of}: each lease record's token is at its high-water object's",
                report.checked
            ),
            "",
        );
    }
}

/// What doctor can say about an S3 or GCS object store without writing to it.
pub(super) fn object_store(display: &str, f: &mut Findings<'_>) {
    let s3 = display.starts_with("s3://");
    let (endpoint, credentials) = if s3 {
        (
            crate::object::s3_endpoint()
                .ok()
                .flatten()
                .map_or_else(|| "AWS S3".into(), |(_, e)| crate::url::redact_url(&e)),
            if std::env::var_os("AWS_ACCESS_KEY_ID").is_some() {
                "AWS_ACCESS_KEY_ID"
            } else {
                "none found (AWS_ACCESS_KEY_ID is unset)"
            },
        )
    } else {
        (
            match crate::object::gcs_endpoint() {
                e if e == crate::object::GCS_DEFAULT_ENDPOINT => "Google Cloud Storage".into(),
                e => crate::url::redact_url(&e),
            },
            if std::env::var_os("GOOGLE_OAUTH_ACCESS_TOKEN").is_some() {
                "GOOGLE_OAUTH_ACCESS_TOKEN"
            } else if std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS").is_some() {
                "GOOGLE_APPLICATION_CREDENTIALS"
            } else {
                "none found"
            },
        )
    };
    f.add(
        "object.endpoint",
        Severity::Ok,
        format!("endpoint: {endpoint}; credentials: {credentials}"),
        "",
    );
    if s3 {
        f.add(
            "object.etag_aba",
            Severity::Warn,
            "S3 ETags are hashes of the bytes: a fenced object write can miss a newer writer that stored identical bytes between fence's read and its put".into(),
            "prefer GCS or file:// objects, or write bytes that differ per writer (see docs/object-stores.md)",
        );
    }
}
