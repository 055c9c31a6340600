//! The object store fence talks to answers itself: a redirect is never followed (S3's session
//! token is a plain header, which an HTTP client keeps on a redirect to another host, and a
//! conditional write would be judged by a server fence never checked), and the client
//! settings of the AWS environment are applied, not dropped (a proxy the network requires).

use crate::common;

use std::sync::Arc;

use common::objects::Service;
use common::proxy::{HttpProxy, Mode, Proxy, Verdict};
use common::{Backend, Store};

per_service!(a_redirect_is_refused_not_followed);

/// A gateway that answers every request with `307 Temporary Redirect` to another server
/// (which forwards to the real one): `fence acquire` and `fence inspect` are refused at once
/// (exit 2, naming the redirect and where it pointed, not its path), the other server gets no
/// request at all, no credential appears in what fence printed, and the bucket holds no lease.
fn a_redirect_is_refused_not_followed(on: Backend) {
    let store = Store::new(on);
    let (server, _) = store.server();
    let (gateway, elsewhere) = HttpProxy::redirecting(server.addr());
    let to = elsewhere.endpoint();
    let (endpoint, secret_var) = match server.service {
        Service::S3 => ("AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"),
        Service::Gcs => ("FENCE_GCS_ENDPOINT", "GOOGLE_OAUTH_ACCESS_TOKEN"),
    };
    let secret = "fence-test-credential-7f3a9c";
    // A read (an HTTP client follows a redirect of a GET) and a write (the proof's probe).
    for args in [
        ["inspect", "r", "--format", "json"].as_slice(),
        ["acquire", "r", "--owner", "A", "--format", "json"].as_slice(),
    ] {
        let out = store
            .fence()
            .env(endpoint, gateway.endpoint())
            .env(secret_var, secret)
            .args(args)
            .run();
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
        let error = out.json();
        assert_eq!(error["error"], "usage", "{args:?}: {out:?}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains(&format!(
                "the server at `{}` answered with a redirect (HTTP 307 to `{to}`)",
                gateway.endpoint()
            )) && message.contains("does not follow"),
            "{args:?}: {message}"
        );
        assert!(
            !out.stdout.contains(secret) && !out.stderr.contains(secret),
            "{out:?}"
        );
    }
    assert!(!gateway.seen().is_empty(), "fence never asked the gateway");
    assert_eq!(
        elsewhere.seen(),
        Vec::<String>::new(),
        "a redirect was followed"
    );
    assert_eq!(store.lease("r"), None);
}

/// `AWS_PROXY_URL` is how a network that allows no direct connection is reached: fence's S3
/// client goes through it. The endpoint's name does not resolve here; only the proxy (a TCP
/// forwarder to the test server) can reach it, so a run that does not use the proxy fails
/// (exit 7, checked first). The lease is then in the bucket.
#[test]
fn s3_requests_go_through_aws_proxy_url() {
    let store = Store::new(Backend::S3);
    let (server, _) = store.server();
    let proxy = Proxy::start(server.addr(), Mode::Pass);
    // `.invalid` never resolves; moto takes a host that starts with `localhost` for
    // path-style requests (another name's first label would be taken for the bucket).
    let unresolvable = "http://localhost.fence-proxy-test.invalid";
    let direct = store
        .fence()
        .env("AWS_ENDPOINT_URL", unresolvable)
        .args(["acquire", "r", "--owner", "A", "--format", "json"])
        .run();
    assert_eq!(direct.code, 7, "the name must not resolve: {direct:?}");
    let out = store
        .fence()
        .env("AWS_ENDPOINT_URL", unresolvable)
        .env("AWS_PROXY_URL", format!("http://{}", proxy.addr()))
        .args(["acquire", "r", "--owner", "A", "--format", "json"])
        .run();
    assert_eq!(out.code, 0, "{out:?}");
    assert!(proxy.connections() > 0, "{out:?}");
    let (owner, token, live) = store.lease("r").expect("the lease is in the bucket");
    assert_eq!((owner.as_str(), live), ("A", true));
    assert_eq!(token, out.json()["token"].as_i64().unwrap());
}

/// S3 in the wrong region answers 301 without a `Location`, naming the bucket's region in
/// `x-amz-bucket-region`: exit 2, and the hint is the region to set, not another server.
#[test]
fn a_bucket_in_another_region_is_named() {
    let store = Store::new(Backend::S3);
    let (server, _) = store.server();
    let gateway = HttpProxy::start(
        server.addr(),
        Arc::new(|_| {
            Verdict::Reply {
            status: 301,
            headers: vec![("x-amz-bucket-region".into(), "eu-west-1".into())],
            body: "<Error><Code>PermanentRedirect</Code><Message>The bucket you are attempting to access must be addressed using the specified endpoint.</Message></Error>".into(),
        }
        }),
    );
    let out = store
        .fence()
        .env("AWS_ENDPOINT_URL", gateway.endpoint())
        .args(["inspect", "r", "--format", "json"])
        .run();
    assert_eq!(out.code, 2, "{out:?}");
    let hint = out.json()["hint"].as_str().unwrap().to_owned();
    assert!(hint.contains("AWS_REGION=eu-west-1"), "{hint}");
}

/// The S3 endpoint is the one object_store uses, whichever variable names it
/// (`AWS_ENDPOINT_URL_S3` first, `AWS_ENDPOINT`, any case after `AWS_`, a scheme in
/// capitals): plain HTTP is allowed for a plain-HTTP endpoint (an empty `AWS_ALLOW_HTTP` is
/// unset), and the proof of preconditions is bound to that endpoint. It was bound to AWS's
/// default when another variable than `AWS_ENDPOINT_URL` named the server, so a copy of the
/// prefix on a server that ignores preconditions would have passed as proven.
#[test]
fn the_s3_endpoint_is_the_one_object_store_uses() {
    let server = Store::new(Backend::S3).server().0.clone();
    let endpoint = server.endpoint.clone();
    let loud = endpoint.replacen("http://", "HTTP://", 1);
    for (var, value, extra) in [
        ("AWS_ENDPOINT_URL_S3", endpoint.as_str(), None),
        ("AWS_ENDPOINT", endpoint.as_str(), None),
        ("AWS_endpoint_url_s3", endpoint.as_str(), None),
        ("AWS_ENDPOINT_URL", loud.as_str(), None),
        (
            "AWS_ENDPOINT_URL",
            endpoint.as_str(),
            Some(("AWS_ALLOW_HTTP", "")),
        ),
    ] {
        // A prefix of its own: the run that proves it names the endpoint in the proof.
        let store = Store::new(Backend::S3);
        let (_, prefix) = store.server();
        let mut fence = store.fence().env_remove("AWS_ENDPOINT_URL").env(var, value);
        if let Some((name, value)) = extra {
            fence = fence.env(name, value);
        }
        let out = fence
            .args(["acquire", "r", "--owner", "A", "--format", "json"])
            .run();
        assert_eq!(out.code, 0, "{var}={value} {extra:?}: {out:?}");
        let proof = proof_records(&server, prefix);
        assert!(proof.contains(&server.addr().to_string()), "{var}: {proof}");
        assert!(!proof.contains("amazonaws.com"), "{var}: {proof}");
    }
}

/// Settings that contradict each other are refused by name before any request: a
/// plain-HTTP endpoint with `AWS_ALLOW_HTTP=false`, and two endpoint variables that disagree.
#[test]
fn contradictory_s3_endpoint_settings_are_refused_by_name() {
    let store = Store::new(Backend::S3);
    let (server, _) = store.server();
    let out = store
        .fence()
        .env("AWS_ALLOW_HTTP", "false")
        .args(["acquire", "r", "--owner", "A", "--format", "json"])
        .run();
    assert_eq!(out.code, 2, "{out:?}");
    let message = out.json()["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("AWS_ENDPOINT_URL") && message.contains("AWS_ALLOW_HTTP"),
        "{message}"
    );
    let out = store
        .fence()
        .env(
            "AWS_ENDPOINT",
            format!("http://127.0.0.1:{}", server.addr().port() + 1),
        )
        .args(["acquire", "r", "--owner", "A", "--format", "json"])
        .run();
    assert_eq!(out.code, 2, "{out:?}");
    let message = out.json()["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("AWS_ENDPOINT_URL and AWS_ENDPOINT"),
        "{message}"
    );
    // Endpoints object_store would take and panic on (empty, no scheme, a port that is not
    // one), and ones with a user and password (S3 does not use them; errors would show them),
    // a password with a `/` in it, or in the spelling object_store takes last.
    let secret = "fence-test-password-41c7";
    let with_user = |password: &str| {
        server
            .endpoint
            .replacen("://", &format!("://user:{password}@"), 1)
    };
    let port = server.addr().port();
    for (var, value, also) in [
        ("AWS_ENDPOINT_URL_S3", String::new(), None),
        ("AWS_ENDPOINT_URL", format!("127.0.0.1:{port}"), None),
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:abc".to_owned(), None),
        ("AWS_ENDPOINT_URL", with_user(secret), None),
        ("AWS_ENDPOINT_URL", with_user(&format!("a/{secret}")), None),
        (
            "AWS_ENDPOINT",
            with_user(secret),
            Some(("AWS_ENDPOINT_URL", server.endpoint.clone())),
        ),
    ] {
        let mut fence = store.fence().env(var, &value);
        if let Some((name, value)) = also {
            fence = fence.env(name, value);
        }
        let out = fence
            .args(["acquire", "r", "--owner", "A", "--format", "json"])
            .run();
        assert_eq!(out.code, 2, "{var}={value}: {out:?}");
        let message = out.json()["message"].as_str().unwrap().to_owned();
        assert!(message.contains(var), "{message}");
        assert!(!format!("{out:?}").contains(secret), "{out:?}");
    }
    assert_eq!(store.lease("r"), None);
    // The same endpoint spelled twice is no contradiction.
    store
        .fence()
        .env("AWS_ENDPOINT", format!("{}/", server.endpoint))
        .args(["acquire", "r", "--owner", "A", "--format", "json"])
        .run()
        .expect(0);
}

/// Client settings fence cannot use are refused by name, not ignored: a flag that is neither
/// true nor false, and two that object_store would drop without a word, a user agent that is
/// not a header value and a proxy CA that is not a certificate (a file name, say).
#[test]
fn unusable_aws_client_settings_are_refused_by_name() {
    let store = Store::new(Backend::S3);
    for (var, value) in [
        ("AWS_ALLOW_INVALID_CERTIFICATES", "maybe"),
        ("AWS_USER_AGENT", "fence\nagent"),
        ("AWS_PROXY_CA_CERTIFICATE", "/etc/ssl/certs/proxy.pem"),
    ] {
        let out = store
            .fence()
            .env("AWS_PROXY_URL", "http://127.0.0.1:9")
            .env(var, value)
            .args(["acquire", "r", "--owner", "A", "--format", "json"])
            .run();
        assert_ne!(out.code, 0, "{var}: {out:?}");
        let message = out.json()["message"].as_str().unwrap().to_owned();
        assert!(message.contains(var), "{var}: {message}");
    }
}

/// `STORAGE_EMULATOR_HOST` may leave out the scheme (requests then go over http): the proof
/// is bound to the endpoint as requests go (it was bound to https), and a user and password
/// in it never reach the bucket's proof record (it was written there whole).
#[test]
fn a_gcs_endpoint_without_a_scheme_is_proven_as_requests_go() {
    let store = Store::new(Backend::Gcs);
    let (server, prefix) = store.server();
    let host = server.endpoint.trim_start_matches("http://").to_owned();
    let secret = "fence-test-password-9d2e";
    store
        .fence()
        .env_remove("FENCE_GCS_ENDPOINT")
        .env("STORAGE_EMULATOR_HOST", format!("user:{secret}@{host}"))
        .args(["acquire", "r", "--owner", "A", "--format", "json"])
        .run()
        .expect(0);
    let proof = proof_records(server, prefix);
    assert!(proof.contains(&format!("http://{host}/")), "{proof}");
    assert!(!proof.contains("https://"), "{proof}");
    assert!(!proof.contains(secret), "{proof}");
}

/// Every record under a prefix's `.fence/` (the proof of preconditions), as stored: bodies
/// and metadata, one a line.
fn proof_records(server: &common::objects::Server, prefix: &str) -> String {
    server
        .list(&format!("{prefix}/.fence"))
        .into_iter()
        .filter_map(|key| server.get(&key))
        .map(|stored| {
            format!(
                "{} {:?}",
                String::from_utf8_lossy(&stored.body),
                stored.metadata
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
