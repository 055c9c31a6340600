//! A lease record restored alone from an older copy, on the object-store coordinators (S3
//! through moto, GCS through fake-gcs-server). Written by an adversarial review after the
//! directory store's fix (`stores/file_store.rs` `a_restored_live_record_is_no_ones_lease`):
//! can an operator who restores an older version of `<prefix>/leases/<resource>` (the bytes
//! written back, or the version restored with its metadata, as S3's CopyObject of an older
//! version or GCS's rewrite of a noncurrent generation does) while every other object of the
//! resource stays as it is make fence
//! - take the old record for its owner's current lease (`renew`/`release` of its token
//!   accepted, `acquire` by its owner "reacquired" with exit 0),
//! - keep another owner out (`busy`) on the old record's account,
//! - issue a token that was issued before (I1)?
//!
//! The property (DESIGN §1, I1): every grant's token is above every token issued before for
//! the resource, "not after … a restored file"; a record below the highest token issued is
//! no one's lease. Every test reads the bucket itself, not only fence's answers.

use crate::common;

use common::objects::{self, Stored};
use common::proxy::{HttpProxy, HttpRequest};
use common::{acquire_for, Backend, Out, Store};

/// The key of `resource`'s lease record under the store's prefix.
pub(super) fn lease_key(store: &Store, resource: &str) -> String {
    let (_, prefix) = store.server();
    format!("{prefix}/leases/{}", objects::encode_key(resource))
}

/// The lease record's current version, read directly from the bucket.
pub(super) fn record(store: &Store, resource: &str) -> Stored {
    let (server, _) = store.server();
    server
        .get(&lease_key(store, resource))
        .expect("the lease record exists")
}

pub(super) fn body(stored: &Stored) -> serde_json::Value {
    serde_json::from_slice(&stored.body).expect("the lease record is JSON")
}

/// How the operator puts the old copy back.
#[derive(Clone, Copy, Debug)]
pub(super) enum Restore {
    /// The old bytes written over the record (a plain upload): no metadata.
    Bytes,
    /// The old version restored whole, its metadata with it (on GCS, fence's copy of the
    /// record in `fence-lease`).
    Version,
}

/// Writes `old` back over `resource`'s lease record, leaving every other object alone.
pub(super) fn restore(store: &Store, resource: &str, old: &Stored, how: Restore) {
    let (server, _) = store.server();
    let key = lease_key(store, resource);
    match how {
        // A plain upload (curl's `--data-binary`, as `Server::put` sends it, stores an empty
        // object on moto: its form content type).
        Restore::Bytes => server.put_with_metadata(&key, &old.body, &[]),
        Restore::Version => {
            let metadata: Vec<(&str, &str)> = old
                .metadata
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            server.put_with_metadata(&key, &old.body, &metadata);
        }
    }
    let now = record(store, resource);
    assert_eq!(now.body, old.body, "the old copy is the current version");
}

pub(super) fn fence(store: &Store, args: &[&str]) -> Out {
    let out = store.fence().args(args).args(["--format", "json"]).run();
    show(args, &out);
    out
}

/// `a` is granted the first token with a 10-minute TTL; the record of that grant (held, `a`,
/// token 1) is kept as the operator's old copy; then `a` releases, and `b` and `c` are each
/// granted and release. Returns (the old copy, a's token, the highest token issued).
fn history_with_an_old_copy(store: &Store, resource: &str) -> (Stored, i64, i64) {
    let first = acquire_for(store, resource, "a", "10m");
    let old = record(store, resource);
    eprintln!(
        "old copy (held by a): metadata keys {:?}\n  {}",
        old.metadata.keys().collect::<Vec<_>>(),
        String::from_utf8_lossy(&old.body)
    );
    common::release(store, resource, "a", first);
    let second = acquire_for(store, resource, "b", "10m");
    common::release(store, resource, "b", second);
    let last = acquire_for(store, resource, "c", "10m");
    common::release(store, resource, "c", last);
    assert!(first < second && second < last);
    eprintln!(
        "record before the restore (token {last} issued last):\n  {}",
        String::from_utf8_lossy(&record(store, resource).body)
    );
    (old, first, last)
}

/// After the restore, `renew` and `release` with the old token are stale (exit 4): the
/// record is an older copy, no one's lease.
fn a_restored_record_s_token_is_neither_renewed_nor_released(on: Backend) {
    let mut wrong = Vec::new();
    for how in [Restore::Bytes, Restore::Version] {
        let store = Store::new(on);
        let (old, first, last) = history_with_an_old_copy(&store, "r");
        if matches!((on, how), (Backend::Gcs, Restore::Version)) {
            assert!(
                old.metadata.contains_key("fence-lease"),
                "GCS lease records carry fence's copy in metadata: {:?}",
                old.metadata
            );
        }
        for op in ["renew", "release"] {
            restore(&store, "r", &old, how);
            let out = fence(
                &store,
                &[op, "r", "--owner", "a", "--token", &first.to_string()],
            );
            let after = record(&store, "r");
            if out.code != 4 || out.json()["error"] != "stale_fencing_token" {
                wrong.push(format!(
                    "{how:?} restore, {op} of token {first} after token {last} was issued: exit {}, {}\n  record after: {}",
                    out.code,
                    out.stdout.trim(),
                    String::from_utf8_lossy(&after.body)
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// After the restore, the old record's owner asking again gets a new token above every one
/// issued, not the old one "reacquired".
fn a_restored_record_is_not_reacquired_by_its_old_owner(on: Backend) {
    let store = Store::new(on);
    let (old, first, last) = history_with_an_old_copy(&store, "r");
    restore(&store, "r", &old, Restore::Bytes);
    let out = fence(&store, &["acquire", "r", "--owner", "a", "--ttl", "10m"]);
    let after = record(&store, "r");
    let json = out.json();
    assert!(
        out.code == 0 && json["reacquired"] == false && json["token"].as_i64().unwrap() > last,
        "acquire by `a` after the restore of its token-{first} record (token {last} issued): {out:?}\nrecord after: {}",
        String::from_utf8_lossy(&after.body)
    );
}

/// After the restore, another owner is not kept out by the old copy: it is granted a token
/// above every one issued.
fn a_restored_record_keeps_no_one_out(on: Backend) {
    let store = Store::new(on);
    let (old, _first, last) = history_with_an_old_copy(&store, "r");
    restore(&store, "r", &old, Restore::Bytes);
    let out = fence(&store, &["acquire", "r", "--owner", "d", "--ttl", "10m"]);
    let after = record(&store, "r");
    assert!(
        out.code == 0 && out.json()["token"].as_i64().unwrap() > last,
        "acquire by `d` after the restore (token {last} issued): {out:?}\nrecord after: {}",
        String::from_utf8_lossy(&after.body)
    );
}

/// An old copy of a released record (no lease at all): the next grant's token is still above
/// every token issued (I1), not the old copy's plus one.
fn a_restored_released_record_does_not_reissue_a_token(on: Backend) {
    let store = Store::new(on);
    let first = acquire_for(&store, "r", "a", "10m");
    common::release(&store, "r", "a", first);
    let old = record(&store, "r");
    assert_eq!(body(&old)["state"], "released");
    let second = acquire_for(&store, "r", "b", "10m");
    common::release(&store, "r", "b", second);
    let last = acquire_for(&store, "r", "c", "10m");
    common::release(&store, "r", "c", last);
    restore(&store, "r", &old, Restore::Bytes);
    let out = fence(&store, &["acquire", "r", "--owner", "d", "--ttl", "10m"]);
    let after = record(&store, "r");
    let token = out.json()["token"].as_i64();
    assert!(
        out.code == 0 && token.unwrap() > last,
        "tokens {first}, {second}, {last} were issued; after the restore of the released token-{first} record `d` got {token:?}: {out:?}\nrecord after: {}",
        String::from_utf8_lossy(&after.body)
    );
}

/// The consequence at a fenced object target: `b` holds token 2 (live, 10 minutes) and has
/// written with it; the old copy of the released token-1 record is restored; `d` asks. It
/// must get a token above 2 (I1), and no two live holders may share one (I3).
fn a_restored_record_does_not_give_a_live_holder_s_token_to_another(on: Backend) {
    let store = Store::new(on);
    let (server, prefix) = store.server();
    let target = server.url(&format!("{prefix}/target/obj"));
    let first = acquire_for(&store, "r", "a", "10m");
    common::release(&store, "r", "a", first);
    let old = record(&store, "r");
    let second = acquire_for(&store, "r", "b", "10m");
    let write = |owner: &str, token: i64, bytes: &str| {
        let file = store.home.path().join(format!("{owner}-{token}"));
        std::fs::write(&file, bytes).unwrap();
        fence(
            &store,
            &[
                "write",
                "r",
                "--token",
                &token.to_string(),
                "--owner",
                owner,
                "--target",
                &target,
                "--from",
                file.to_str().unwrap(),
            ],
        )
    };
    let by_b = write("b", second, "written by b");
    assert_eq!(by_b.code, 0, "{by_b:?}");
    restore(&store, "r", &old, Restore::Bytes);
    let out = fence(&store, &["acquire", "r", "--owner", "d", "--ttl", "10m"]);
    let token = out.json()["token"].as_i64();
    let by_d = token.map(|t| write("d", t, "written by d"));
    // b, whose lease by its own clock still runs, writes again with its token.
    let by_b_again = write("b", second, "written by b again");
    let stored = server.get(&format!("{prefix}/target/obj"));
    assert!(
        out.code == 0 && token.unwrap() > second,
        "b holds token {second} (live) and wrote with it; after the restore of the released token-{first} record, `d` got {token:?}: {out:?}\n  d's write with it: {by_d:?}\n  b's write after it: {by_b_again:?}\n  target after: {:?}",
        stored.map(|s| (String::from_utf8_lossy(&s.body).into_owned(), s.metadata))
    );
}

/// A lease that expired by its own time (and was taken over since) does not come back to
/// life when its record is restored: the restore's own Last-Modified is not a renewal.
fn an_expired_lease_restored_is_not_renewed(on: Backend) {
    let store = Store::new(on);
    let first = acquire_for(&store, "r", "a", "3s");
    let old = record(&store, "r");
    store.wait_expired("r");
    let second = acquire_for(&store, "r", "b", "10m");
    common::release(&store, "r", "b", second);
    restore(&store, "r", &old, Restore::Bytes);
    let out = fence(
        &store,
        &["renew", "r", "--owner", "a", "--token", &first.to_string()],
    );
    let after = record(&store, "r");
    assert!(
        out.code == 4 || out.code == 5,
        "renew of token {first}, expired and taken over by token {second}, after its record was restored: {out:?}\nrecord after: {}",
        String::from_utf8_lossy(&after.body)
    );
}

/// What `inspect` and `doctor` say of a restored record: the directory store's `inspect`
/// names one (`integrity_ok: false`, a `restored` warning); an object store should not show
/// it as the current holder's lease without a word.
fn inspect_and_doctor_name_a_restored_record(on: Backend) {
    let store = Store::new(on);
    let (old, first, last) = history_with_an_old_copy(&store, "r");
    restore(&store, "r", &old, Restore::Bytes);
    let inspect = fence(&store, &["inspect", "r", "--history", "10"]);
    let doctor = fence(&store, &["doctor"]);
    let view = &inspect.json()["resources"][0];
    let flagged = inspect.json()["integrity_ok"] == false
        || inspect.stdout.contains("restored")
        || inspect.stderr.contains("restored");
    let doctor_says = doctor.stdout.contains("restored") || doctor.stderr.contains("restored");
    assert!(
        (view["state"] != "held" || view["token"].as_i64() != Some(first)) || flagged || doctor_says,
        "after the restore of a's token-{first} record (token {last} issued), inspect shows it held without a word: {inspect:?}\ndoctor: {doctor:?}"
    );
}

/// The high-water object's token, read directly (`None`: no object).
pub(super) fn high_water(store: &Store, resource: &str) -> Option<i64> {
    let (server, prefix) = store.server();
    let stored = server.get(&format!(
        "{prefix}/tokens/{}",
        objects::encode_key(resource)
    ))?;
    String::from_utf8_lossy(&stored.body).trim().parse().ok()
}

/// A damaged high-water object stops no one: the holder renews (a warning says it is
/// ignored), and the next new token replaces it. One left behind the live token (a grant
/// whose raise failed or whose answer was lost, a store from before it existed; here: its
/// token written lower by hand) catches up at the holder's next renewal, so that an older
/// copy of the record written back afterwards is still caught. (A review found the damaged
/// object failing every operation, and a lagging one letting a written-back copy repeat a
/// token.)
fn a_damaged_or_lagging_high_water_object_stops_no_one_and_catches_up(on: Backend) {
    let store = Store::new(on);
    let (server, prefix) = store.server();
    let key = format!("{prefix}/tokens/{}", objects::encode_key("r"));
    let first = acquire_for(&store, "r", "a", "10m");
    let old = record(&store, "r");
    server.put_with_metadata(&key, b"garbage", &[]);
    let out = fence(
        &store,
        &["renew", "r", "--owner", "a", "--token", &first.to_string()],
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.json()["notices"].to_string().contains("damaged"),
        "{out:?}"
    );
    fence(
        &store,
        &[
            "release",
            "r",
            "--owner",
            "a",
            "--token",
            &first.to_string(),
        ],
    );
    let second = acquire_for(&store, "r", "b", "10m");
    assert_eq!(high_water(&store, "r"), Some(second));
    // Lagging: the object says token 1 while b holds token 2; b's renewal raises it.
    server.put_with_metadata(&key, b"1\n", &[]);
    let out = fence(
        &store,
        &["renew", "r", "--owner", "b", "--token", &second.to_string()],
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(high_water(&store, "r"), Some(second));
    // Now a's old record written back is no one's lease: b's lease is not taken over.
    restore(&store, "r", &old, Restore::Bytes);
    let out = fence(&store, &["acquire", "r", "--owner", "c", "--ttl", "10m"]);
    assert_eq!(
        out.code, 0,
        "a's old copy was taken for a live lease: {out:?}"
    );
    assert!(
        out.json()["token"].as_i64().unwrap() > second,
        "token {second} was issued again: {out:?}"
    );
}

/// A grant whose answer was lost (the server stored the record, the proxy answered 503) is
/// recognised by its nonce on the retry, and raises the high-water object as any written
/// grant does: else the resource stays unguarded until the holder's first renewal, and an
/// older copy written back before it makes the next grant repeat the token. (Review 4 found
/// this path untested.)
fn a_grant_whose_answer_was_lost_raises_the_high_water_object(on: Backend) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use common::proxy::{HttpProxy, Verdict};

    let store = Store::new(on);
    let (server, _) = store.server();
    let first = acquire_for(&store, "r", "a", "10m");
    let old = record(&store, "r");
    fence(
        &store,
        &[
            "release",
            "r",
            "--owner",
            "a",
            "--token",
            &first.to_string(),
        ],
    );
    // The record's key as S3 (the path) and GCS's multipart upload (its body) show it.
    let key = lease_key(&store, "r");
    let lost = Arc::new(AtomicUsize::new(0));
    let counted = lost.clone();
    let proxy = HttpProxy::start(
        server.addr(),
        Arc::new(move |request| {
            let write = matches!(request.method.as_str(), "PUT" | "POST");
            let to_record = request.target.contains(&format!("/{key}"))
                || common::proxy::contains(&request.body, key.as_bytes());
            if write && to_record && counted.fetch_add(1, Ordering::SeqCst) == 0 {
                Verdict::ForwardThenAnswer { status: 503 }
            } else {
                Verdict::Forward
            }
        }),
    );
    let endpoint = match server.service {
        objects::Service::S3 => "AWS_ENDPOINT_URL",
        objects::Service::Gcs => "FENCE_GCS_ENDPOINT",
    };
    let out = store
        .fence()
        .env(endpoint, proxy.endpoint())
        .args([
            "acquire", "r", "--owner", "b", "--ttl", "10m", "--format", "json",
        ])
        .run()
        .expect(0);
    let second = out.json()["token"].as_i64().unwrap();
    assert!(
        lost.load(Ordering::SeqCst) >= 1,
        "the premise: the grant's answer was lost: {:?}",
        proxy.seen()
    );
    assert_eq!(body(&record(&store, "r"))["owner"], "b", "{out:?}");
    assert_eq!(
        high_water(&store, "r"),
        Some(second),
        "a grant recognised by its nonce left the high-water object behind: {out:?}"
    );
    // What it guards: a's old record written back is no one's lease, and the next token is
    // new.
    restore(&store, "r", &old, Restore::Bytes);
    let third = acquire_for(&store, "r", "c", "10m");
    assert!(third > second, "token {third} issued again after {second}");
}

crate::per_service!(
    a_grant_whose_answer_was_lost_raises_the_high_water_object,
    a_restored_record_s_token_is_neither_renewed_nor_released,
    a_restored_record_is_not_reacquired_by_its_old_owner,
    a_restored_record_keeps_no_one_out,
    a_restored_released_record_does_not_reissue_a_token,
    a_restored_record_does_not_give_a_live_holder_s_token_to_another,
    an_expired_lease_restored_is_not_renewed,
    inspect_and_doctor_name_a_restored_record,
    a_damaged_or_lagging_high_water_object_stops_no_one_and_catches_up,
);

// ---------------------------------------------------------------------------------------------
// Shared with restored_objects_review.rs and restored_objects_history.rs
// ---------------------------------------------------------------------------------------------

pub(super) fn high_key(store: &Store, resource: &str) -> String {
    let (_, prefix) = store.server();
    format!("{prefix}/tokens/{}", objects::encode_key(resource))
}

/// An operator writes `old` back over the lease record (its bytes, as a plain upload),
/// leaving every other object alone.
pub(super) fn write_back(store: &Store, resource: &str, old: &Stored) {
    restore(store, resource, old, Restore::Bytes);
}

pub(super) fn show(args: &[&str], out: &Out) {
    eprintln!(
        "$ fence {}\n  exit {}\n  stdout {}\n  stderr {}",
        args.join(" "),
        out.code,
        out.stdout.trim(),
        out.stderr.trim()
    );
}

/// The variable that points fence at an endpoint of the test's choosing (a proxy).
pub(super) fn endpoint_var(store: &Store) -> &'static str {
    match store.server().0.service {
        objects::Service::S3 => "AWS_ENDPOINT_URL",
        objects::Service::Gcs => "FENCE_GCS_ENDPOINT",
    }
}

/// `fence ARGS --format json` through `proxy`.
pub(super) fn fence_via(store: &Store, proxy: &HttpProxy, args: &[&str]) -> Out {
    let out = store
        .fence()
        .env(endpoint_var(store), proxy.endpoint())
        .args(args)
        .args(["--format", "json"])
        .run();
    show(args, &out);
    out
}

/// Whether `request` is addressed to object `key` (S3: the path; GCS: the percent-encoded
/// name in the path, or the name in a multipart upload's body).
pub(super) fn addresses(request: &HttpRequest, key: &str) -> bool {
    let encoded = key.replace('/', "%2F");
    let target = request.target.split('?').next().unwrap_or_default();
    target.ends_with(&format!("/{key}"))
        || target.ends_with(&format!("/{encoded}"))
        || (request.method == "POST"
            && common::proxy::contains(&request.body, format!("\"{key}\"").as_bytes()))
}

pub(super) fn is_write(request: &HttpRequest) -> bool {
    matches!(request.method.as_str(), "PUT" | "POST")
}

/// Whether `request` writes a released version of the lease object `key`.
pub(super) fn is_release_of(request: &HttpRequest, key: &str) -> bool {
    is_write(request)
        && addresses(request, key)
        && common::proxy::contains(&request.body, b"\"state\":\"released\"")
}

/// Holds a proxied request until `go` is set (at most a minute, so a failed test ends).
pub(super) fn hold_until(go: &std::sync::atomic::AtomicBool) {
    let start = std::time::Instant::now();
    while !go.load(std::sync::atomic::Ordering::SeqCst)
        && start.elapsed() < std::time::Duration::from_secs(60)
    {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A grant that must succeed: its token.
pub(super) fn grant(store: &Store, resource: &str, owner: &str, ttl: &str) -> i64 {
    let args = ["acquire", resource, "--owner", owner, "--ttl", ttl];
    let out = fence(store, &args);
    assert_eq!(out.code, 0, "the grant to `{owner}` (a premise): {out:?}");
    out.json()["token"].as_i64().expect("a token")
}

/// A release that must succeed.
pub(super) fn release(store: &Store, resource: &str, owner: &str, token: i64) {
    let token = token.to_string();
    let out = fence(
        store,
        &["release", resource, "--owner", owner, "--token", &token],
    );
    assert_eq!(out.code, 0, "the release by `{owner}` (a premise): {out:?}");
}
