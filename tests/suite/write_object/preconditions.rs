//! Verify before trusting (issue 18): an object store is used as a coordinator, or as the
//! home of fenced objects, only after fence proved that it enforces the preconditions fence
//! relies on. The non-enforcing server is moto or fake-gcs-server behind an HTTP proxy of ours
//! that strips `If-None-Match` / `If-Match` (S3) or the `ifGenerationMatch` query parameter
//! (GCS): it answers every conditional put with success, exactly as s3rver and
//! gcp-storage-emulator do. Every test reads the bucket itself.

use crate::common;

use std::sync::Arc;
use std::thread;

use common::objects::{Server, Service};
use common::proxy::{HttpProxy, Verdict};
use common::{Backend, Fence, Lease, Out, Store};

/// The object service a store of `on` talks to (LocalStack speaks S3).
fn service_of(on: Backend) -> Service {
    match on {
        Backend::Gcs => Service::Gcs,
        _ => Service::S3,
    }
}

fn endpoint_var(service: Service) -> &'static str {
    match service {
        Service::S3 => "AWS_ENDPOINT_URL",
        Service::Gcs => "FENCE_GCS_ENDPOINT",
    }
}

/// A proxy in front of the test server that removes every precondition from every request.
fn ignoring(server: &Server) -> HttpProxy {
    HttpProxy::start(
        server.addr(),
        Arc::new(|request| {
            request.remove_header("if-match");
            request.remove_header("if-none-match");
            request.remove_query("ifGenerationMatch");
            Verdict::Forward
        }),
    )
}

/// A proxy that changes nothing (it counts).
fn passing(server: &Server) -> HttpProxy {
    HttpProxy::start(server.addr(), Arc::new(|_| Verdict::Forward))
}

/// `fence` on `store`, its requests going through `proxy`.
fn via(store: &Store, proxy: &HttpProxy) -> Fence {
    let service = store.server().0.service;
    store.fence().env(endpoint_var(service), proxy.endpoint())
}

/// The precondition the message must name.
fn precondition(service: Service) -> &'static str {
    match service {
        Service::S3 => "If-None-Match",
        Service::Gcs => "ifGenerationMatch",
    }
}

#[track_caller]
fn assert_refused(out: &Out, service: Service) {
    assert_eq!(out.code, 2, "{out:?}");
    let error = out.json();
    assert_eq!(error["error"], "usage", "{out:?}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(precondition(service)) && message.contains("does not enforce"),
        "the message names the ignored precondition: {message}"
    );
}

per_service!(
    ignoring_server_is_refused,
    races_never_grant_twice,
    verification_is_recorded_once,
    definite_answers_are_final,
    a_refusal_whose_body_never_comes_is_decided_by_its_status,
    event_failures_never_hide_what_happened,
    requests_per_operation,
    missing_bucket_is_named,
    history_survives_archiving,
    a_proof_reached_through_a_stripping_proxy_is_not_trusted,
    a_proof_copied_to_another_prefix_is_not_trusted,
    an_applied_write_whose_answer_was_lost_is_never_nothing_written,
    read_only_credentials_can_inspect,
    a_lost_answer_to_a_grant_or_release_is_reported_as_it_was,
);

/// The same on LocalStack's S3, a second S3 implementation.
mod localstack {
    #[test]
    fn ignoring_server_is_refused() {
        super::ignoring_server_is_refused(super::Backend::LocalStack)
    }
    #[test]
    fn races_never_grant_twice() {
        super::races_never_grant_twice(super::Backend::LocalStack)
    }
    #[test]
    fn verification_is_recorded_once() {
        super::verification_is_recorded_once(super::Backend::LocalStack)
    }
    #[test]
    fn definite_answers_are_final() {
        super::definite_answers_are_final(super::Backend::LocalStack)
    }
    #[test]
    fn event_failures_never_hide_what_happened() {
        super::event_failures_never_hide_what_happened(super::Backend::LocalStack)
    }
    #[test]
    fn requests_per_operation() {
        super::requests_per_operation(super::Backend::LocalStack)
    }
    #[test]
    fn missing_bucket_is_named() {
        super::missing_bucket_is_named(super::Backend::LocalStack)
    }
    #[test]
    fn history_survives_archiving() {
        super::history_survives_archiving(super::Backend::LocalStack)
    }
    #[test]
    fn a_proof_reached_through_a_stripping_proxy_is_not_trusted() {
        super::a_proof_reached_through_a_stripping_proxy_is_not_trusted(super::Backend::LocalStack)
    }
    #[test]
    fn a_proof_copied_to_another_prefix_is_not_trusted() {
        super::a_proof_copied_to_another_prefix_is_not_trusted(super::Backend::LocalStack)
    }
    #[test]
    fn an_applied_write_whose_answer_was_lost_is_never_nothing_written() {
        super::an_applied_write_whose_answer_was_lost_is_never_nothing_written(
            super::Backend::LocalStack,
        )
    }
    #[test]
    fn read_only_credentials_can_inspect() {
        super::read_only_credentials_can_inspect(super::Backend::LocalStack)
    }
    #[test]
    fn a_lost_answer_to_a_grant_or_release_is_reported_as_it_was() {
        super::a_lost_answer_to_a_grant_or_release_is_reported_as_it_was(super::Backend::LocalStack)
    }
}

/// On a server that ignores preconditions `init`, `acquire` and `write --from` are refused
/// (exit 2, naming the precondition), and nothing of fence's is stored: no lease record, no
/// verification record, no object written, no scratch probe left behind.
fn ignoring_server_is_refused(on: Backend) {
    let service = service_of(on);
    let store = Store::new(on);
    let (server, prefix) = store.server();
    let proxy = ignoring(server);
    let out = via(&store, &proxy).args(["init", "--format", "json"]).run();
    assert_refused(&out, service);
    let out = via(&store, &proxy)
        .args([
            "acquire", "res", "--owner", "a", "--ttl", "30s", "--format", "json",
        ])
        .run();
    assert_refused(&out, service);
    let file = store.home.path().join("body");
    std::fs::write(&file, "bytes").unwrap();
    let target = server.url(&format!("{prefix}/objects/obj"));
    let out = via(&store, &proxy)
        .args([
            "write", "res", "--token", "1", "--target", &target, "--from",
        ])
        .args([&file])
        .args(["--format", "json"])
        .run();
    assert_refused(&out, service);
    let stored = server.list(prefix);
    assert!(
        stored.is_empty(),
        "nothing was stored, not even the scratch probes of the failed proofs: {stored:?}"
    );
    assert!(
        !proxy.seen().is_empty(),
        "the premise: fence's requests went through the proxy"
    );
}

/// Ten races of two owners for a fresh resource on the ignoring server: never two grants
/// (without the check, every race gave two).
fn races_never_grant_twice(on: Backend) {
    let store = Store::new(on);
    let (server, prefix) = store.server();
    let proxy = ignoring(server);
    for race in 0..10 {
        let resource = format!("race-{race}");
        let contenders: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|owner| {
                let fence = via(&store, &proxy).args([
                    "acquire", &resource, "--owner", owner, "--ttl", "30s", "--format", "json",
                ]);
                thread::spawn(move || fence.run())
            })
            .collect();
        let outs: Vec<Out> = contenders.into_iter().map(|t| t.join().unwrap()).collect();
        let grants = outs.iter().filter(|o| o.code == 0).count();
        assert!(grants <= 1, "race {race}: two grants: {outs:?}");
        for out in &outs {
            assert!([2, 3].contains(&out.code), "race {race}: {out:?}");
        }
    }
    let leases = server.list(&format!("{prefix}/leases"));
    assert!(leases.is_empty(), "no lease record was stored: {leases:?}");
}

/// On an enforcing server the first acquire (no `init`) proves the prefix and records it in
/// `<prefix>/.fence/verified` (with the endpoint); its scratch probe is gone; the lease record
/// says it was written after the proof. A second process reads no verification record at all;
/// `init` proves the prefix again.
fn verification_is_recorded_once(on: Backend) {
    let store = Store::new(on);
    let (server, prefix) = store.server();
    store
        .fence()
        .args(["acquire", "res", "--owner", "a", "--ttl", "30s"])
        .run()
        .expect(0);
    let record = server
        .get(&format!("{prefix}/.fence/verified"))
        .expect("the verification record");
    let record: serde_json::Value = serde_json::from_slice(&record.body).unwrap();
    assert_eq!(record["endpoint"], server.endpoint.as_str(), "{record}");
    assert_eq!(record["verified"].as_array().unwrap().len(), 3, "{record}");
    let fence_dir = server.list(&format!("{prefix}/.fence"));
    assert_eq!(fence_dir, [format!("{prefix}/.fence/verified")]);
    let lease = server
        .get(&format!("{prefix}/leases/res"))
        .expect("the lease record");
    let lease: serde_json::Value = serde_json::from_slice(&lease.body).unwrap();
    assert_eq!(lease["verified"], true, "{lease}");

    let direct = record["proven_for"][0].as_str().unwrap().to_owned();
    assert!(direct.ends_with(&format!("/{}", server.bucket)), "{record}");
    // A proof is bound to the endpoint it was made through: the first use through another
    // (here an honest proxy) proves the prefix again, there, and the record names both.
    let proxy = passing(server);
    via(&store, &proxy)
        .args(["acquire", "other", "--owner", "b", "--ttl", "30s"])
        .run()
        .expect(0);
    let record = server.get(&format!("{prefix}/.fence/verified")).unwrap();
    let record: serde_json::Value = serde_json::from_slice(&record.body).unwrap();
    let proven: Vec<&str> = record["proven_for"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(proven.len(), 2, "{record}");
    assert!(proven.contains(&direct.as_str()), "{record}");
    assert!(
        proven.iter().any(|p| p.contains(&proxy.endpoint())),
        "{record}"
    );
    // From then on: one read of the record for a fresh resource, none for a lease written
    // through this endpoint.
    let before = proxy.seen().len();
    via(&store, &proxy)
        .args(["acquire", "third", "--owner", "b", "--ttl", "30s"])
        .run()
        .expect(0);
    via(&store, &proxy)
        .args(["acquire", "third", "--owner", "b", "--ttl", "30s"])
        .run()
        .expect(0);
    let seen = proxy.seen()[before..].to_vec();
    assert!(
        seen.iter().filter(|r| r.contains(".fence")).count() == 1,
        "one read of the record (the fresh resource), none for the verified lease: {seen:?}"
    );
    let out = store
        .fence()
        .args(["init", "--format", "json"])
        .run()
        .expect(0);
    assert!(out.stdout.contains("verified"), "{out:?}");
}

/// The one way past the check: the loudly named variable. fence warns, and records no proof.
#[test]
fn the_check_is_skipped_only_when_asked_loudly() {
    let store = Store::new(Backend::S3);
    let (server, prefix) = store.server();
    let proxy = ignoring(server);
    let out = via(&store, &proxy)
        .env("FENCE_I_KNOW_THE_STORE_IGNORES_PRECONDITIONS", "1")
        .args(["acquire", "res", "--owner", "a", "--ttl", "30s"])
        .run()
        .expect(0);
    assert!(
        out.stderr.contains("WARNING") && out.stderr.contains("several owners"),
        "{out:?}"
    );
    assert!(server.get(&format!("{prefix}/.fence/verified")).is_none());
    let lease = server.get(&format!("{prefix}/leases/res")).unwrap();
    let lease: serde_json::Value = serde_json::from_slice(&lease.body).unwrap();
    assert_eq!(lease["verified"], false, "{lease}");
}

// ---------------------------------------------------------------------------------------------
// Definite answers are not retried; what was applied is reported as applied.
// ---------------------------------------------------------------------------------------------

/// A proxy that answers `status` to the requests `pick` selects and forwards the rest.
fn answering(
    server: &Server,
    status: u16,
    pick: impl Fn(&common::proxy::HttpRequest) -> bool + Send + Sync + 'static,
) -> HttpProxy {
    HttpProxy::start(
        server.addr(),
        Arc::new(move |request| {
            if pick(request) && !proof_request(request) {
                Verdict::Answer {
                    status,
                    body: format!("<Error><Code>Proxy{status}</Code><Message>answered by the test proxy</Message></Error>"),
                }
            } else {
                Verdict::Forward
            }
        }),
    )
}

/// Whether a request is part of the proof (`.fence/`) or of `init` (`fence-store.json`): a
/// proof is bound to the endpoint it was made through, so a store reached through a test proxy
/// is proven through it first (`init`), and the proxies that fail requests let that through.
fn proof_request(request: &common::proxy::HttpRequest) -> bool {
    [&b".fence/"[..], b".fence%2F", b"fence-store.json"]
        .iter()
        .any(|name| {
            common::proxy::contains(request.target.as_bytes(), name)
                || common::proxy::contains(&request.body, name)
        })
}

/// `init` through `proxy`: the prefix is proven through the endpoint the test then uses.
/// Returns how many requests the proxy had seen by then.
fn proven_via(store: &Store, proxy: &HttpProxy) -> usize {
    via(store, proxy).args(["init"]).run().expect(0);
    proxy.seen().len()
}

/// Whether a request is a conditional write of a lease record.
fn conditional_write(service: Service, request: &common::proxy::HttpRequest) -> bool {
    match service {
        Service::S3 => {
            request.method == "PUT"
                && (request.header("if-none-match").is_some()
                    || request.header("if-match").is_some())
        }
        Service::Gcs => request.method == "POST" && request.target.contains("ifGenerationMatch"),
    }
}

/// A store whose prefix is already verified (so the proxy's answers reach the lease path).
fn verified_store(on: Backend) -> Store {
    let store = Store::new(on);
    store.fence().args(["init"]).run().expect(0);
    store
}

/// 501 to the conditional put: exit 2 at once, one request, the status named; 400: exit 7,
/// equally at once. Nothing is stored and nothing is called unknown.
fn definite_answers_are_final(on: Backend) {
    let service = service_of(on);
    for (status, code) in [(501, 2), (400, 7)] {
        let store = verified_store(on);
        let (server, prefix) = store.server();
        let proxy = answering(server, status, move |r| conditional_write(service, r));
        let proven = proven_via(&store, &proxy);
        let out = via(&store, &proxy)
            .args([
                "acquire", "res", "--owner", "a", "--ttl", "30s", "--format", "json",
            ])
            .run();
        assert_eq!(out.code, code, "HTTP {status}: {out:?}");
        let message = out.json()["message"].as_str().unwrap().to_owned();
        assert!(
            message.contains(&format!("HTTP {status}")) && message.contains("nothing was written"),
            "{message}"
        );
        let writes = proxy.seen()[proven..]
            .iter()
            .filter(|r| r.starts_with("PUT") || r.starts_with("POST"))
            .count();
        // "At once" is this: asked once, no retry (how soon fence answered is not asserted).
        assert_eq!(writes, 1, "asked once: {:?}", proxy.seen());
        assert!(server.list(&format!("{prefix}/leases")).is_empty());
    }
}

/// A refusal (501 to the conditional put) whose head came but whose body never does (a proxy
/// or server that stalls mid-answer): its status says nothing was written, so it is exit 2 as
/// with the whole answer, within seconds, not exit 8 "may or may not have applied" once the
/// request's 30 s timeout has passed waiting for a body that only explains the refusal.
fn a_refusal_whose_body_never_comes_is_decided_by_its_status(on: Backend) {
    let service = service_of(on);
    let store = verified_store(on);
    let (server, prefix) = store.server();
    let proxy = HttpProxy::start(
        server.addr(),
        Arc::new(move |request| {
            if conditional_write(service, request) && !proof_request(request) {
                Verdict::AnswerWithoutBody { status: 501 }
            } else {
                Verdict::Forward
            }
        }),
    );
    proven_via(&store, &proxy);
    let out = via(&store, &proxy)
        .args([
            "acquire", "res", "--owner", "a", "--ttl", "30s", "--format", "json",
        ])
        .run();
    assert_eq!(out.code, 2, "{out:?}");
    let message = out.json()["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("HTTP 501") && message.contains("nothing was written"),
        "{message}"
    );
    assert!(server.list(&format!("{prefix}/leases")).is_empty());
}

/// A change and its event are one write (the record keeps its history): with every write of
/// an event object answered 429, `acquire` still succeeds without a warning and `inspect`
/// shows the holder and the `acquired` event. A refusal's event (written beside the record)
/// that keeps getting 429 does not turn the refusal into "unavailable": `renew` of a released
/// lease is still exit 5, with a warning.
fn event_failures_never_hide_what_happened(on: Backend) {
    let service = service_of(on);
    let store = verified_store(on);
    let (server, _) = store.server();
    let proxy = answering(server, 429, move |r| match service {
        Service::S3 => r.method == "PUT" && r.target.contains("/events/"),
        // Events and clock probes are the only unconditional uploads.
        Service::Gcs => r.method == "POST" && !r.target.contains("ifGenerationMatch"),
    });
    proven_via(&store, &proxy);
    let out = via(&store, &proxy)
        .args([
            "acquire", "res", "--owner", "a", "--ttl", "60s", "--format", "json",
        ])
        .run();
    assert_eq!(out.code, 0, "{out:?}");
    assert!(!out.stderr.contains("warning"), "{out:?}");
    let lease = Lease {
        resource: "res".into(),
        owner: "a".into(),
        token: out.json()["token"].as_i64().unwrap(),
    };
    let token = lease.token;
    let view = store
        .fence()
        .args(["inspect", "res", "--history", "5", "--format", "json"])
        .run()
        .expect(0)
        .json();
    let resource = &view["resources"][0];
    assert_eq!(resource["state"], "held", "{view}");
    assert_eq!(resource["owner"], "a", "{view}");
    assert_eq!(resource["token"], token, "{view}");
    assert_eq!(resource["events"][0]["kind"], "acquired", "{view}");
    assert_eq!(resource["events"][0]["owner"], "a", "{view}");

    store.fence().release(&lease);
    let out = via(&store, &proxy)
        .args([
            "renew",
            "res",
            "--owner",
            "a",
            "--token",
            &token.to_string(),
        ])
        .args(["--format", "json"])
        .run();
    assert_eq!(out.code, 5, "{out:?}");
    let notices = out.json()["notices"].to_string();
    assert!(
        notices.contains("missing from the history") && notices.contains("429"),
        "{out:?}"
    );
}

/// Requests per operation on the common path, counted through a proxy: `acquire` of a free
/// resource and `release`: 3 each (the high-water object, the record, the conditional write;
/// a new token one more put, raising the high-water object); a fenced write of an object
/// fence wrote before (with or without a write id): 2 (the read and the conditional write;
/// on S3 4, with the coordinator's highest token); `renew`: 4 (its expiry is judged by the
/// store's clock, read from a write of the resource's clock probe).
fn requests_per_operation(on: Backend) {
    let service = service_of(on);
    let store = verified_store(on);
    let (server, prefix) = store.server();
    let target = server.url(&format!("{prefix}/objects/obj"));
    let file = store.home.path().join("body");
    std::fs::write(&file, "bytes").unwrap();
    // One counting proxy, through which the prefix is proven first (a proof is bound to the
    // endpoint it was made through), and the resource and the object exist, written through
    // it (the first use of each is not the common path).
    let proxy = passing(server);
    proven_via(&store, &proxy);
    let lease = via(&store, &proxy).acquire("res", &["--owner", "a", "--ttl", "60s"]);
    let token = lease.token.to_string();
    via(&store, &proxy)
        .args([
            "write", "res", "--token", &token, "--target", &target, "--from",
        ])
        .args([&file])
        .run()
        .expect(0);
    via(&store, &proxy).release(&lease);
    let count = |args: &[&str]| {
        let before = proxy.seen().len();
        let out = via(&store, &proxy)
            .args(args)
            .args(["--format", "json"])
            .run();
        (out, proxy.seen()[before..].to_vec())
    };
    // Reading the high-water object (`tokens/<resource>`) costs one request (on GCS its
    // metadata, which holds a copy of the token: its bytes would take a second); a new token
    // raises it with one more put.
    let high_read = 1;
    let (out, seen) = count(&["acquire", "res", "--owner", "b", "--ttl", "60s"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(seen.len(), 2 + high_read + 1, "acquire: {seen:?}");
    let token = out.json()["token"].as_i64().unwrap().to_string();
    let (out, seen) = count(&["renew", "res", "--owner", "b", "--token", &token]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(seen.len(), 3 + high_read, "renew: {seen:?}");
    let (out, seen) = count(&[
        "write",
        "res",
        "--token",
        &token,
        "--target",
        &target,
        "--from",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    // On S3 the coordinator is asked for the highest token right before the put (an ETag
    // does not change with the token alone: see `an_identical_newer_write_does_not_let_a_paused_stale_write_through`).
    let write_requests = match service {
        Service::S3 => 3 + high_read,
        Service::Gcs => 2,
    };
    assert_eq!(seen.len(), write_requests, "write: {seen:?}");
    // With a write id: the same read and put (the ledger is in the metadata read anyway).
    let (out, seen) = count(&[
        "write",
        "res",
        "--token",
        &token,
        "--target",
        &target,
        "--from",
        file.to_str().unwrap(),
        "--id",
        "counted",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(seen.len(), write_requests, "write --id: {seen:?}");
    let (out, seen) = count(&["release", "res", "--owner", "b", "--token", &token]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(seen.len(), 2 + high_read, "release: {seen:?}");
    let stored = server.get(&format!("{prefix}/objects/obj")).unwrap();
    assert_eq!(stored.token().map(|t| t.to_string()), Some(token));
}

/// A bucket that does not exist is a usage error naming it, for the coordinator and for
/// `inspect --target` (never `(absent)` with exit 0).
fn missing_bucket_is_named(on: Backend) {
    let service = service_of(on);
    let store = Store::new(on);
    let scheme = match service {
        Service::S3 => "s3",
        Service::Gcs => "gs",
    };
    let out = store
        .fence_at(&format!("{scheme}://nosuchbucket/p"))
        .args([
            "acquire", "res", "--owner", "a", "--ttl", "30s", "--format", "json",
        ])
        .run();
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.json()["message"]
            .as_str()
            .unwrap()
            .contains("bucket `nosuchbucket` does not exist"),
        "{out:?}"
    );
    // `renew` and `release` too: a read in a missing bucket is not "no lease has ever been
    // granted" (GCS said exit 6 where S3 said exit 2; issue 32, 6).
    for verb in ["renew", "release"] {
        let out = store
            .fence_at(&format!("{scheme}://nosuchbucket/p"))
            .args([
                verb, "res", "--owner", "a", "--token", "1", "--format", "json",
            ])
            .run();
        assert_eq!(out.code, 2, "{verb}: {out:?}");
        assert!(
            out.json()["message"]
                .as_str()
                .unwrap()
                .contains("bucket `nosuchbucket` does not exist"),
            "{verb}: {out:?}"
        );
    }
    let out = store
        .fence()
        .args(["inspect", "--target", &format!("{scheme}://nosuchbucket/x")])
        .args(["--format", "json"])
        .run();
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stdout.contains("nosuchbucket"), "{out:?}");
}

/// The record keeps its latest changes and archives older ones: after 12 grants and releases
/// the whole history (24 changes) is durable, in order, without duplicates, partly in an
/// archive object; `inspect --history` shows all of it, newest first.
fn history_survives_archiving(on: Backend) {
    let store = Store::new(on);
    let (server, prefix) = store.server();
    for n in 1..=12 {
        let owner = format!("o{n}");
        let lease = store
            .fence()
            .acquire("res", &["--owner", &owner, "--ttl", "30s"]);
        assert_eq!(lease.token, n);
        store.fence().release(&lease);
    }
    let expected: Vec<(String, Option<String>, Option<i64>)> = (1..=12)
        .flat_map(|n| {
            ["acquired", "released"].map(|kind| (kind.to_owned(), Some(format!("o{n}")), Some(n)))
        })
        .collect();
    assert_eq!(store.events("res"), expected);
    let archives: Vec<String> = server
        .list(&format!("{prefix}/events/res"))
        .into_iter()
        .filter(|k| k.ends_with("-archive"))
        .collect();
    assert!(!archives.is_empty(), "older changes were archived");
    let view = store
        .fence()
        .args(["inspect", "res", "--history", "30", "--format", "json"])
        .run()
        .expect(0)
        .json();
    let shown: Vec<(String, Option<String>, Option<i64>)> = view["resources"][0]["events"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_owned(),
                e["owner"].as_str().map(str::to_owned),
                e["token"].as_i64(),
            )
        })
        .collect();
    assert_eq!(shown, expected);
}

/// Names are checked before anything is sent: an object URL ending in `/` (a directory), a key
/// with a newline, and a resource whose object names would pass 1024 bytes are usage errors,
/// and nothing reaches the server.
#[test]
fn bad_names_are_refused_before_sending() {
    let store = Store::new(Backend::S3);
    let (server, prefix) = store.server();
    let proxy = passing(server);
    let file = store.home.path().join("body");
    std::fs::write(&file, "bytes").unwrap();
    for target in [
        server.url(&format!("{prefix}/dir/")),
        server.url(&format!("{prefix}/a\nb")),
    ] {
        let out = via(&store, &proxy)
            .args([
                "write", "res", "--token", "1", "--target", &target, "--from",
            ])
            .args([&file])
            .args(["--format", "json"])
            .run();
        assert_eq!(out.code, 2, "{target:?}: {out:?}");
    }
    // The longest resource name (200 bytes, 600 once encoded) under a long prefix.
    let resource = "é".repeat(100);
    let long_prefix = format!("{prefix}/{}", "p".repeat(500));
    let out = store
        .fence_at(&server.url(&long_prefix))
        .env("AWS_ENDPOINT_URL", proxy.endpoint())
        .args([
            "acquire", &resource, "--owner", "a", "--ttl", "30s", "--format", "json",
        ])
        .run();
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stdout.contains("1024"), "{out:?}");
    assert_eq!(proxy.seen(), Vec::<String>::new());
}

/// Expired S3 session credentials (S3 answers 400 `ExpiredToken`) are named as expired, exit
/// 7 at once, not "unreachable" and not retried.
#[test]
fn expired_s3_session_credentials_are_named() {
    let store = verified_store(Backend::S3);
    let (server, _) = store.server();
    let proxy = HttpProxy::start(
        server.addr(),
        Arc::new(|_| {
            Verdict::Answer {
            status: 400,
            body: "<Error><Code>ExpiredToken</Code><Message>The provided token has expired.</Message></Error>".into(),
        }
        }),
    );
    let out = via(&store, &proxy)
        .env("AWS_SESSION_TOKEN", "session-token-secret")
        .args([
            "acquire", "res", "--owner", "a", "--ttl", "30s", "--format", "json",
        ])
        .run();
    assert_eq!(out.code, 7, "{out:?}");
    let message = out.json()["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("expired") && message.contains("AWS_SESSION_TOKEN"),
        "{message}"
    );
    assert!(!format!("{out:?}").contains("session-token-secret"));
    assert_eq!(proxy.seen().len(), 1, "asked once: {:?}", proxy.seen());
}

/// The proof is bound to what it proved (issue 32, 1): a prefix proven directly on an
/// enforcing server, then reached through a proxy that strips the preconditions (a
/// misconfigured gateway), is refused by every command — exit 2 naming the mismatch — in ten
/// races of eight owners for a fresh resource (0 grants), and for `renew`, `release` and
/// `write` of what was written directly. Without the binding every race granted token 1 to
/// all eight.
fn a_proof_reached_through_a_stripping_proxy_is_not_trusted(on: Backend) {
    let service = service_of(on);
    let (store, lease, target, file) = held_and_written(on);
    let (server, prefix) = store.server();
    let proxy = ignoring(server);
    refused_everywhere(&store, &store.url, &proxy, service, &target, &file, &lease);
    let leases = server.list(&format!("{prefix}/leases"));
    assert_eq!(
        leases,
        [format!("{prefix}/leases/held")],
        "no grant: {leases:?}"
    );
}

/// The same for a copy of the prefix (`aws s3 sync` keeps keys and metadata: the proof
/// record, the lease record, the fenced object) used through a server that ignores
/// preconditions: the copied proof names another endpoint, is proven again and refused.
fn a_proof_copied_to_another_prefix_is_not_trusted(on: Backend) {
    let service = service_of(on);
    let (store, lease, _, file) = held_and_written(on);
    let (server, prefix) = store.server();
    let copy = format!("{prefix}-copy");
    for key in server.list(prefix) {
        if !key.starts_with(&format!("{prefix}/")) {
            continue;
        }
        let stored = server.get(&key).unwrap();
        let metadata: Vec<(&str, &str)> = stored
            .metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let copied = format!("{copy}{}", &key[prefix.len()..]);
        server.put_with_metadata(&copied, &stored.body, &metadata);
    }
    assert!(server.get(&format!("{copy}/.fence/verified")).is_some());
    let proxy = ignoring(server);
    let target = server.url(&format!("{copy}/objects/obj"));
    refused_everywhere(
        &store,
        &server.url(&copy),
        &proxy,
        service,
        &target,
        &file,
        &lease,
    );
    let leases = server.list(&format!("{copy}/leases"));
    assert_eq!(
        leases,
        [format!("{copy}/leases/held")],
        "no grant: {leases:?}"
    );
}

/// A verified store where `a` holds `held` and wrote the object `objects/obj` (its bytes in
/// the file `body`), all directly: (the store, the lease, the object's URL, the file).
fn held_and_written(on: Backend) -> (Store, Lease, String, std::path::PathBuf) {
    let store = verified_store(on);
    let (server, prefix) = store.server();
    let lease = store
        .fence()
        .acquire("held", &["--owner", "a", "--ttl", "60s"]);
    let target = server.url(&format!("{prefix}/objects/obj"));
    let file = store.home.path().join("body");
    std::fs::write(&file, "bytes").unwrap();
    let token = lease.token.to_string();
    store
        .fence()
        .args([
            "write", "held", "--token", &token, "--target", &target, "--from",
        ])
        .args([&file])
        .run()
        .expect(0);
    (store, lease, target, file)
}

/// Every command on the store at `url` through `proxy` is refused, naming the mismatch: 10
/// races of 8 owners for fresh resources, `renew` and `release` of `lease`, `write` to
/// `target`.
fn refused_everywhere(
    store: &Store,
    url: &str,
    proxy: &HttpProxy,
    service: Service,
    target: &str,
    file: &std::path::Path,
    lease: &Lease,
) {
    let service_var = endpoint_var(service);
    let through = || store.fence_at(url).env(service_var, proxy.endpoint());
    let mismatch = |out: &Out| {
        assert_refused(out, service);
        let message = out.json()["message"].as_str().unwrap().to_owned();
        assert!(
            message.contains("was made through") && message.contains(&proxy.endpoint()),
            "the message names the mismatch: {message}"
        );
    };
    for race in 0..10 {
        let resource = format!("race-{race}");
        let contenders: Vec<_> = (0..8)
            .map(|n| {
                let fence = through().args([
                    "acquire",
                    &resource,
                    "--owner",
                    &format!("o{n}"),
                    "--ttl",
                    "30s",
                    "--format",
                    "json",
                ]);
                thread::spawn(move || fence.run())
            })
            .collect();
        for out in contenders.into_iter().map(|t| t.join().unwrap()) {
            mismatch(&out);
        }
    }
    let token = lease.token.to_string();
    for verb in ["renew", "release"] {
        let out = through()
            .args([
                verb, "held", "--owner", "a", "--token", &token, "--format", "json",
            ])
            .run();
        mismatch(&out);
    }
    let out = through()
        .args([
            "write", "held", "--token", &token, "--target", target, "--from",
        ])
        .args([file])
        .args(["--format", "json"])
        .run();
    mismatch(&out);
}

/// An object write whose put applied but whose answer was lost (a 503 from a proxy after the
/// server stored it) is retried by the client, and the retry meets the version it made itself
/// (412). fence reported exit 6 "another writer replaced the object … nothing was written",
/// though the object held exactly its bytes and its token (issue 32, 3). Now: exit 0 or 8
/// (outcome unknown, naming the version), never "nothing was written"; for a create and for
/// an update.
fn an_applied_write_whose_answer_was_lost_is_never_nothing_written(on: Backend) {
    let service = service_of(on);
    let store = verified_store(on);
    let (server, prefix) = store.server();
    let key = format!("{prefix}/objects/obj");
    let target = server.url(&key);
    let name = "objects/obj".to_owned();
    let lost = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = lost.clone();
    let proxy = HttpProxy::start(
        server.addr(),
        Arc::new(move |request| {
            let to_object = request.target.contains(&name)
                || common::proxy::contains(&request.body, name.as_bytes())
                || common::proxy::contains(&request.body, name.replace('/', "%2F").as_bytes());
            if !proof_request(request)
                && conditional_write(service, request)
                && to_object
                && counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0
            {
                Verdict::ForwardThenAnswer { status: 503 }
            } else {
                Verdict::Forward
            }
        }),
    );
    proven_via(&store, &proxy);
    let lease = store
        .fence()
        .acquire("res", &["--owner", "a", "--ttl", "60s"]);
    let token = lease.token.to_string();
    for (round, bytes) in [(0, "created"), (1, "updated")] {
        lost.store(0, std::sync::atomic::Ordering::SeqCst);
        let file = store.home.path().join("body");
        std::fs::write(&file, bytes).unwrap();
        let out = via(&store, &proxy)
            .args([
                "write", "res", "--token", &token, "--target", &target, "--from",
            ])
            .args([&file])
            .args(["--format", "json"])
            .run();
        assert!(
            lost.load(std::sync::atomic::Ordering::SeqCst) >= 1,
            "round {round}: the premise: an answer was lost: {:?}",
            proxy.seen()
        );
        assert!(matches!(out.code, 0 | 8), "round {round}: {out:?}");
        assert!(
            !out.stdout.contains("nothing was written")
                && !out.stderr.contains("nothing was written"),
            "round {round}: {out:?}"
        );
        let stored = server.get(&key).unwrap();
        assert_eq!(
            stored.body,
            bytes.as_bytes(),
            "round {round}: the write applied"
        );
        assert_eq!(stored.token(), Some(lease.token), "round {round}");
    }
}

/// S3 ABA (issue 32, 5): an ETag is made by the bytes alone, so a writer paused after its
/// read, while a newer token writes the same bytes, used to land its stale put (exit 0) and
/// lower the object's token, letting its later stale writes through too. Now the coordinator
/// is asked right before the put: the paused writer is refused (exit 4) and the object keeps
/// the newer token. The pause is made exact by a proxy that holds the request the writer
/// sends right after reading the object (the put before the change, the coordinator's read
/// after it), until the newer token has written. On moto and LocalStack.
fn a_paused_writer_meets_identical_newer_bytes(backend: Backend) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let store = Store::new(backend);
    store.fence().args(["init"]).run().expect(0);
    let (server, prefix) = store.server();
    let key = format!("{prefix}/objects/obj");
    let target = server.url(&key);
    let file = store.home.path().join("body");
    std::fs::write(&file, "same bytes").unwrap();
    let first = store
        .fence()
        .acquire("res", &["--owner", "a", "--ttl", "60s"]);
    let one = first.token.to_string();
    let write = |fence: common::Fence, token: &str| {
        fence
            .args([
                "write", "res", "--token", token, "--target", &target, "--from",
            ])
            .args([&file])
            .args(["--format", "json"])
    };
    write(store.fence(), &one).run().expect(0);
    // After the writer's read of the object (a HEAD of its key), its next request waits.
    let read = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(AtomicBool::new(false));
    // S3 reads the object with a HEAD of its key; GCS with a GET of its metadata, the key
    // percent-encoded in the path.
    let encoded = key.replace('/', "%2F");
    let (read2, go2, object) = (read.clone(), go.clone(), key.clone());
    let proxy = HttpProxy::start(
        server.addr(),
        Arc::new(move |request| {
            if proof_request(request) {
                return Verdict::Forward;
            }
            let of_object = request.target.contains(&object) || request.target.contains(&encoded);
            let reads = request.method == "HEAD"
                || (request.method == "GET" && request.target.contains("/storage/v1/b/"));
            if reads && of_object && read2.load(Ordering::SeqCst) == 0 {
                read2.store(1, Ordering::SeqCst);
            } else if read2.load(Ordering::SeqCst) == 1 {
                read2.store(2, Ordering::SeqCst);
                while !go2.load(Ordering::SeqCst) {
                    thread::sleep(std::time::Duration::from_millis(5));
                }
            }
            Verdict::Forward
        }),
    );
    proven_via(&store, &proxy);
    let paused = {
        let fence = write(via(&store, &proxy), &one);
        thread::spawn(move || fence.run())
    };
    common::wait_for(
        "the writer to read the object",
        std::time::Duration::from_secs(30),
        || read.load(Ordering::SeqCst) >= 2,
    );
    store.fence().release(&first);
    let second = store
        .fence()
        .acquire("res", &["--owner", "b", "--ttl", "60s"]);
    let two = second.token.to_string();
    write(store.fence(), &two).run().expect(0);
    go.store(true, Ordering::SeqCst);
    let out = paused.join().unwrap();
    assert_eq!(out.code, 4, "the paused writer's token 1 is stale: {out:?}");
    assert_eq!(out.json()["highest_token"], second.token, "{out:?}");
    let stored = server.get(&key).unwrap();
    assert_eq!(stored.token(), Some(second.token), "the newer token stays");
    // And the stale writer's next write is refused by the object itself.
    let out = write(store.fence(), &one).run();
    assert_eq!(out.code, 4, "{out:?}");
}

#[test]
fn s3_a_paused_writer_meets_identical_newer_bytes() {
    a_paused_writer_meets_identical_newer_bytes(Backend::S3);
}

/// On GCS every write makes a new generation, identical bytes or not: the paused writer's put
/// (conditioned on the generation it read) fails, and the re-read finds the newer token.
#[test]
fn gcs_a_paused_writer_meets_identical_newer_bytes() {
    a_paused_writer_meets_identical_newer_bytes(Backend::Gcs);
}

#[test]
fn localstack_a_paused_writer_meets_identical_newer_bytes() {
    a_paused_writer_meets_identical_newer_bytes(Backend::LocalStack);
}

/// `inspect` writes a clock probe to judge liveness by the store's clock; with credentials
/// that may only read (every write answered 403), it used to fail with exit 7 (issue 32, 6).
/// Now it shows the records, judging liveness by this machine's clock, and warns so.
fn read_only_credentials_can_inspect(on: Backend) {
    let store = verified_store(on);
    let (server, _) = store.server();
    store
        .fence()
        .acquire("res", &["--owner", "a", "--ttl", "60s"]);
    let proxy = answering(server, 403, |r| r.method == "PUT" || r.method == "POST");
    let out = via(&store, &proxy)
        .args(["inspect", "res", "--format", "json"])
        .run();
    assert_eq!(out.code, 0, "{out:?}");
    let view = out.json();
    assert_eq!(view["resources"][0]["state"], "held", "{view}");
    assert_eq!(view["resources"][0]["owner"], "a", "{view}");
    let notices = view["notices"].to_string();
    assert!(
        notices.contains("clock probe") && notices.contains("this machine's clock"),
        "{out:?}"
    );
}

/// A 503 after the store applied an acquire's or a release's put: the client asks again, and
/// its retry meets its own version. fence reported the grant as `reacquired` and the release
/// as `already_released` (issue 32, 6). Now it recognises its own write (the nonce it stored)
/// and reports what happened: acquired (not reacquired), released.
fn a_lost_answer_to_a_grant_or_release_is_reported_as_it_was(on: Backend) {
    let service = service_of(on);
    use std::sync::atomic::{AtomicBool, Ordering};
    let store = verified_store(on);
    let (server, _) = store.server();
    let armed = Arc::new(AtomicBool::new(false));
    let trigger = armed.clone();
    let proxy = HttpProxy::start(
        server.addr(),
        Arc::new(move |request| {
            let record = request.target.contains("leases")
                || common::proxy::contains(&request.body, b"leases/res")
                || common::proxy::contains(&request.body, b"leases%2Fres");
            if record
                && conditional_write(service, request)
                && trigger.swap(false, Ordering::SeqCst)
            {
                Verdict::ForwardThenAnswer { status: 503 }
            } else {
                Verdict::Forward
            }
        }),
    );
    proven_via(&store, &proxy);
    armed.store(true, Ordering::SeqCst);
    let out = via(&store, &proxy)
        .args([
            "acquire", "res", "--owner", "a", "--ttl", "60s", "--format", "json",
        ])
        .run();
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        !armed.load(Ordering::SeqCst),
        "the premise: an answer was lost"
    );
    let json = out.json();
    assert_eq!(json["reacquired"], false, "{json}");
    let token = json["token"].as_i64().unwrap().to_string();
    armed.store(true, Ordering::SeqCst);
    let out = via(&store, &proxy)
        .args([
            "release", "res", "--owner", "a", "--token", &token, "--format", "json",
        ])
        .run();
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        !armed.load(Ordering::SeqCst),
        "the premise: an answer was lost"
    );
    assert_eq!(out.json()["already_released"], false, "{out:?}");
}
