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
    let elsewhere = HttpProxy::start(server.addr(), Arc::new(|_| Verdict::Forward));
    let to = elsewhere.endpoint();
    let gateway = {
        let to = to.clone();
        HttpProxy::start(
            server.addr(),
            Arc::new(move |request| Verdict::Redirect {
                status: 307,
                location: format!("{to}{}", request.target),
            }),
        )
    };
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
            message.contains(&format!("redirect (HTTP 307 to `{to}`)"))
                && message.contains("does not follow"),
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

/// A client setting of the AWS environment fence cannot use is refused with its name, not
/// ignored.
#[test]
fn an_unreadable_aws_client_setting_is_named() {
    let store = Store::new(Backend::S3);
    let out = store
        .fence()
        .env("AWS_ALLOW_INVALID_CERTIFICATES", "maybe")
        .args(["acquire", "r", "--owner", "A", "--format", "json"])
        .run();
    assert_ne!(out.code, 0, "{out:?}");
    let message = out.json()["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("AWS_ALLOW_INVALID_CERTIFICATES") && message.contains("maybe"),
        "{message}"
    );
}
