//! Review 22: adversarial review of what sits between fence and its stores and targets
//! (HTTP proxies, gateways, poolers). Each test states what the contract (docs/DESIGN.md §3,
//! §5, §6, §12) promises, what fence did instead, and asserts on durable state and exit
//! statuses.

use std::thread;

use crate::common;

use common::proxy::{HttpProxy, Verdict};
use common::{Backend, Out, Store};

/// How a `fence` process is told to send its object-store requests through a forward proxy
/// (the server's endpoint stays what it was).
#[derive(Clone, Copy, Debug)]
enum ProxyVar {
    /// `AWS_PROXY_URL` (S3 only: fence applies it, §12 "The AWS client settings are applied").
    Aws,
    /// `HTTP_PROXY`, which fence's HTTP client (reqwest) reads for S3 and GCS alike.
    Http,
}

impl ProxyVar {
    fn name(self) -> &'static str {
        match self {
            ProxyVar::Aws => "AWS_PROXY_URL",
            ProxyVar::Http => "HTTP_PROXY",
        }
    }
}

/// A forward proxy (the kind `AWS_PROXY_URL` or `HTTP_PROXY` names: requests arrive in
/// absolute form, `PUT http://host:port/key`) in front of the store's server that removes
/// every precondition from every request — a misconfigured corporate egress proxy or caching
/// gateway that rebuilds requests from a header allow-list.
pub(super) fn stripping_forward_proxy(store: &Store) -> HttpProxy {
    HttpProxy::forward(store.server().0.addr(), |request| {
        request.remove_header("if-match");
        request.remove_header("if-none-match");
        request.remove_query("ifGenerationMatch");
        Verdict::Forward
    })
}

/// `fence` on `store`, its requests going through the forward proxy `proxy` as `var` says.
fn through(store: &Store, proxy: &HttpProxy, var: ProxyVar) -> common::Fence {
    store
        .fence()
        .env(var.name(), proxy.endpoint())
        .env_remove("NO_PROXY")
}

/// FINDING: DESIGN §12 (object stores), "The proof belongs to the path fence uses now |
/// enforced: bound to endpoint + bucket … another endpoint is proven again, refused on
/// failure", and §6 I3 "At most one live lease per resource". The proof is bound to the
/// endpoint alone (`verify::identity`, src/object/verify.rs), but fence's HTTP client also
/// goes through a forward proxy when `AWS_PROXY_URL` (S3, applied on purpose in
/// `s3::client_builder`) or `HTTP_PROXY` (S3 and GCS: reqwest reads it, as neither client
/// calls `no_proxy()`) names one. A prefix proven directly and then reached through a
/// forward proxy that strips `If-None-Match`/`If-Match`/`ifGenerationMatch` is taken as
/// proven (the record's digest, or the lease record's `verified_for`, matches the endpoint):
/// eight owners racing for a fresh resource were all granted (exit 0, each told it holds the
/// lease, token 1 handed to several owners), where the same proxy named as the endpoint is
/// refused (exit 2, `a_proof_reached_through_a_stripping_proxy_is_not_trusted`). It should
/// bind the proof to the proxy too (prove again through it), so that every contender is
/// refused with exit 2 and nothing is granted.
fn a_proof_made_directly_is_not_trusted_through_a_forward_proxy(on: Backend, var: ProxyVar) {
    let store = Store::new(on);
    // Proven directly, as any first use does.
    let held = store
        .fence()
        .acquire("held", &["--owner", "direct", "--ttl", "60s"]);
    assert!(held.token >= 1);
    let proxy = stripping_forward_proxy(&store);
    race_through_the_stripper(&proxy, 5, || through(&store, &proxy, var));
}

/// Eight owners race for each of `races` fresh resources, each with `fence()` (which sends its
/// requests through `proxy`, a stripping one), after the prefix was proven without it.
/// Asserts that the race went through the proxy, that no resource was granted to two owners
/// at once, and that every contender was refused as on a path never proven (exit 2).
pub(super) fn race_through_the_stripper(
    proxy: &HttpProxy,
    races: usize,
    fence: impl Fn() -> common::Fence,
) {
    let mut granted = Vec::new();
    let mut outs: Vec<Out> = Vec::new();
    for race in 0..races {
        let resource = format!("race-{race}");
        let contenders: Vec<_> = (0..8)
            .map(|n| {
                let fence = fence().args([
                    "acquire",
                    &resource,
                    "--owner",
                    &format!("o{n}"),
                    "--ttl",
                    "60s",
                    "--format",
                    "json",
                ]);
                thread::spawn(move || fence.run())
            })
            .collect();
        for out in contenders.into_iter().map(|t| t.join().unwrap()) {
            if out.code == 0 {
                granted.push((
                    resource.clone(),
                    out.json()["owner"].as_str().unwrap_or_default().to_owned(),
                    out.json()["token"].as_i64().unwrap_or_default(),
                ));
            }
            outs.push(out);
        }
    }
    assert!(
        !proxy.seen().is_empty(),
        "the premise: fence's requests went through the forward proxy"
    );
    let mut per_resource = std::collections::BTreeMap::<&str, Vec<(&str, i64)>>::new();
    for (resource, owner, token) in &granted {
        per_resource
            .entry(resource)
            .or_default()
            .push((owner, *token));
    }
    let doubled: Vec<_> = per_resource.iter().filter(|(_, g)| g.len() > 1).collect();
    assert!(
        doubled.is_empty(),
        "several owners were granted one resource at once through a proxy that strips the preconditions ({} grants in all): {doubled:?}",
        granted.len()
    );
    for out in &outs {
        assert_eq!(
            out.code, 2,
            "a path never proven is proven again and refused: {out:?}"
        );
    }
}

/// FINDING: DESIGN §12 (object stores), "The server enforces `If-Match`/`If-None-Match`/
/// `ifGenerationMatch` | enforced: proven on a scratch object before a prefix is first used;
/// checked by `doctor` (`object.preconditions`)", and §3 `doctor`: "checks of the set-up". The
/// same forward proxy as above (named by `AWS_PROXY_URL` or `HTTP_PROXY`), which strips every
/// precondition: `fence doctor` reports `object.preconditions` ok, because
/// `doctor::object::preconditions` calls `verify::ensure` without `force`, which accepts the
/// proof made directly (bound to the endpoint, not to the proxy). The set-up that lets every
/// racer be granted (previous test) passes the check meant to find it. It should prove the
/// path through the proxy and fail.
fn doctor_through_a_stripping_forward_proxy_fails_the_preconditions(on: Backend, var: ProxyVar) {
    let store = Store::new(on);
    store
        .fence()
        .acquire("held", &["--owner", "direct", "--ttl", "60s"]);
    let proxy = stripping_forward_proxy(&store);
    let out = through(&store, &proxy, var)
        .args(["doctor", "--format", "json"])
        .run();
    assert!(
        !proxy.seen().is_empty(),
        "the premise: doctor's requests went through the forward proxy: {out:?}"
    );
    let json = out.json();
    let found = common::doctor_findings(&json, "object.preconditions");
    assert_eq!(
        found.first().map(|f| f.0.as_str()),
        Some("fail"),
        "doctor passed a path that strips every precondition: {found:?}"
    );
    assert_eq!(out.code, 2, "{out:?}");
}

/// The other side of the two findings above: a forward proxy that passes requests on as they
/// are is proven through (once: the store's verification record then names the way through
/// it) and used, so that setting `HTTP_PROXY` or `AWS_PROXY_URL` costs a proof, not the store.
fn a_faithful_forward_proxy_is_proven_and_used(on: Backend, var: ProxyVar) {
    let store = Store::new(on);
    store
        .fence()
        .acquire("held", &["--owner", "direct", "--ttl", "60s"]);
    let proxy = HttpProxy::forward(store.server().0.addr(), |_| Verdict::Forward);
    // With a user and password, which the store must never see in the proof's record.
    let with_user = |fence: common::Fence| {
        let url = proxy
            .endpoint()
            .replacen("http://", "http://user:proxy-secret@", 1);
        fence.env(var.name(), url)
    };
    for n in 0..2 {
        let out = with_user(through(&store, &proxy, var))
            .args([
                "acquire",
                &format!("via-{n}"),
                "--owner",
                "p",
                "--format",
                "json",
            ])
            .run()
            .expect(0);
        assert_eq!(out.json()["token"], 1, "{out:?}");
    }
    let busy = with_user(through(&store, &proxy, var))
        .args(["acquire", "via-0", "--owner", "q"])
        .run();
    assert_eq!(busy.code, 3, "{busy:?}");
    let (server, prefix) = store.server();
    let record = server
        .get(&format!("{prefix}/.fence/verified"))
        .expect("the verification record");
    let record = String::from_utf8_lossy(&record.body);
    assert!(
        record.contains(" via ") && !record.contains("proxy-secret"),
        "the proof names the way through the proxy, without its password: {record}"
    );
}

/// A gateway that answers reads of the lease record from a stale copy (a caching proxy in
/// front of S3) makes every conditional write of it fail (412), attempt after attempt: safe
/// (nothing is written), but fence said "changed under every one of 200 attempts", blaming
/// other writers (review 22, read from the code). Each version carries a fresh nonce, so a
/// store that refuses "not V" and then answers V again is serving stale reads: the message
/// says so, and names the way out.
#[test]
fn s3_stale_reads_of_the_lease_record_are_named_as_such() {
    let store = Store::new(Backend::S3);
    let (server, prefix) = store.server();
    // The record as it was after a's release: free.
    let token = common::acquire(&store, "r", "a");
    common::release(&store, "r", "a", token);
    let key = format!("{prefix}/leases/r");
    let old = server.get(&key).expect("the lease record");
    let metadata: Vec<(&str, &str)> = old
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    server.put_with_metadata(&format!("{prefix}/stale-r"), &old.body, &metadata);
    // The record moves on; the gateway keeps answering with the copy.
    let token = common::acquire(&store, "r", "c");
    common::release(&store, "r", "c", token);
    let lease_path = "/leases/r".to_owned();
    let stale_path = "/stale-r";
    let proxy = HttpProxy::forward(server.addr(), move |request| {
        let path = request
            .target
            .split('?')
            .next()
            .unwrap_or_default()
            .to_owned();
        if matches!(request.method.as_str(), "GET" | "HEAD") && path.ends_with(&lease_path) {
            let stale = format!("{}{stale_path}", &path[..path.len() - lease_path.len()]);
            request.target = request.target.replacen(&path, &stale, 1);
        }
        Verdict::Forward
    });
    let out = through(&store, &proxy, ProxyVar::Http)
        .args(["acquire", "r", "--owner", "b", "--format", "json"])
        .run();
    assert_eq!(out.code, 7, "nothing was written: {out:?}");
    let message = out.json()["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("stale") && !message.contains("changed under every"),
        "the cause is named: {out:?}"
    );
    let (owner, _, live) = store.lease("r").expect("the lease record");
    assert_eq!(
        (owner.as_str(), live),
        ("c", false),
        "the record is c's release, untouched"
    );
}

mod s3 {
    #[test]
    fn a_proof_made_directly_is_not_trusted_through_aws_proxy_url() {
        super::a_proof_made_directly_is_not_trusted_through_a_forward_proxy(
            super::Backend::S3,
            super::ProxyVar::Aws,
        )
    }
    #[test]
    fn a_proof_made_directly_is_not_trusted_through_http_proxy() {
        super::a_proof_made_directly_is_not_trusted_through_a_forward_proxy(
            super::Backend::S3,
            super::ProxyVar::Http,
        )
    }
    #[test]
    fn a_faithful_forward_proxy_is_proven_and_used() {
        super::a_faithful_forward_proxy_is_proven_and_used(
            super::Backend::S3,
            super::ProxyVar::Aws,
        );
        super::a_faithful_forward_proxy_is_proven_and_used(
            super::Backend::S3,
            super::ProxyVar::Http,
        );
    }
    #[test]
    fn doctor_through_a_stripping_forward_proxy_fails_the_preconditions() {
        super::doctor_through_a_stripping_forward_proxy_fails_the_preconditions(
            super::Backend::S3,
            super::ProxyVar::Aws,
        )
    }
}

mod gcs {
    #[test]
    fn a_faithful_forward_proxy_is_proven_and_used() {
        super::a_faithful_forward_proxy_is_proven_and_used(
            super::Backend::Gcs,
            super::ProxyVar::Http,
        );
    }
    #[test]
    fn a_proof_made_directly_is_not_trusted_through_http_proxy() {
        super::a_proof_made_directly_is_not_trusted_through_a_forward_proxy(
            super::Backend::Gcs,
            super::ProxyVar::Http,
        )
    }
    #[test]
    fn doctor_through_a_stripping_forward_proxy_fails_the_preconditions() {
        super::doctor_through_a_stripping_forward_proxy_fails_the_preconditions(
            super::Backend::Gcs,
            super::ProxyVar::Http,
        )
    }
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL through a pooler whose server connection is lost after the server got a request.
// ---------------------------------------------------------------------------------------------

/// A PgBouncer of the test's own (transaction pooling, as the suite's), whose server
/// connections go through `upstream` (a proxy of the test's in front of the server), so that
/// the test can cut the pooler's server connection while a statement is in flight. Stopped
/// (SIGKILL to its pid) when dropped.
struct Bouncer {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Bouncer {
    fn start(upstream: std::net::SocketAddr) -> Bouncer {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let user = common::env_or_panic("FENCE_TEST_PG_USER");
        let password = common::env_or_panic("FENCE_TEST_PG_PASSWORD");
        let db = common::env_or_panic("FENCE_TEST_PG_DB");
        let users = dir.path().join("userlist.txt");
        std::fs::write(&users, format!("\"{user}\" \"{password}\"\n")).unwrap();
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n{db} = host={} port={} dbname={db}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\nauth_type = trust\nauth_file = {}\npool_mode = transaction\nmax_client_conn = 100\ndefault_pool_size = 4\nignore_startup_parameters = extra_float_digits\nserver_tls_sslmode = disable\n",
                upstream.ip(),
                upstream.port(),
                users.display()
            ),
        )
        .unwrap();
        for file in [&users, &ini] {
            std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let bin = if std::path::Path::new("/usr/sbin/pgbouncer").exists() {
            "/usr/sbin/pgbouncer".to_owned()
        } else {
            "pgbouncer".to_owned()
        };
        // PgBouncer refuses to run as root: as root, as the server's user (as tests/run does).
        let root = unsafe { libc::geteuid() } == 0;
        let mut cmd = if root {
            let mut cmd = std::process::Command::new("setpriv");
            cmd.args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
                &bin,
            ]);
            cmd
        } else {
            std::process::Command::new(&bin)
        };
        let child = cmd
            .arg(&ini)
            .current_dir(dir.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        common::wait_for(
            "the test's pgbouncer to listen",
            std::time::Duration::from_secs(20),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        Bouncer {
            child,
            port,
            _dir: dir,
        }
    }

    /// The test database through this pooler.
    fn url(&self) -> String {
        common::pg_url_via(format!("127.0.0.1:{}", self.port).parse().unwrap())
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// FINDING: DESIGN §5 "8 outcome_unknown (inspect, or rerun with the same `--id`)", §3
/// `acquire` ("a retry after a lost answer is safe"), and §12 (PostgreSQL) "After the guard, a
/// session the server ended (a connection exception …) is exit 7 too, or 8 once `end_write`
/// answered (the COMMIT may have run)". Directly, a connection lost after the request reached
/// the server is exit 8 (`write_faults.rs` `connection_cut_during_commit_is_outcome_unknown`).
/// Through PgBouncer (transaction pooling, which §8 and `write_pg/pgbouncer.rs` support) the
/// same loss — the pooler's server connection gone after the server got the statement —
/// reaches fence as the pooler's own error, FATAL `server conn crashed?` with SQLSTATE 08P01
/// (class 08, connection exception), before any answer. The coordinator
/// (`pg::classify::classify_request`, src/pg/classify.rs) treats only the shutdown codes as a
/// lost connection, so the acquire is `Error::Database`, exit 1 "this is unexpected; check the
/// server log", although its grant committed (the lease row names the owner with a token):
/// the caller is told neither that it may hold the lease nor to retry. It should be exit 8
/// (the grant may have applied; a retry with the same owner reacquires).
#[test]
fn postgres_an_acquire_whose_pooler_lost_the_server_after_it_applied_is_outcome_unknown() {
    use common::proxy::{Mode, Proxy};
    let store = Store::postgres();
    // The store's schema and the resource's row exist (made directly, the lease released), so
    // the acquire through the pooler is one statement, the short form that grants.
    let first = common::acquire(&store, "r", "W");
    common::release(&store, "r", "W", first);
    let cut = Proxy::start(
        common::pg_upstream(),
        Mode::CutWhenClientSends(b"-- fence: acquire".to_vec()),
    );
    let bouncer = Bouncer::start(cut.addr());
    let out = store
        .fence_at(&bouncer.url())
        .args([
            "acquire", "r", "--owner", "A", "--ttl", "5m", "--format", "json",
        ])
        .run();
    assert_eq!(
        cut.cuts(),
        1,
        "the premise: the pooler's server connection was cut: {out:?}"
    );
    cut.wait_backends_gone(&store.url);
    let (owner, token, live) = store
        .lease("r")
        .expect("the premise: the grant reached the server and committed");
    assert_eq!(
        (owner.as_str(), live, token > first),
        ("A", true, true),
        "the premise: the grant committed: {out:?}"
    );
    assert_eq!(
        out.code, 8,
        "an acquire whose grant committed (A holds token {token}) but whose answer the pooler lost must be outcome unknown: {out:?}"
    );
}

/// FINDING: the same for a fenced write (DESIGN §5: 8 "outcome unknown (inspect, or rerun
/// with the same `--id`)"; §12 "A refusal of fence's own guard statements is the target's …
/// After the guard, a session the server ended … is exit 7 too, or 8 once `end_write`
/// answered"). The server runs a fenced transaction's one message whole before it sends a
/// byte (its answers are flushed at the end), so when the pooler loses its server connection
/// after forwarding the message, fence has seen no statement complete (`completed` is 0) and
/// the pooler's 08P01 is taken for a refusal of fence's guard
/// (`PgTarget::classify`, src/fenced/postgres.rs: `guard && refused_by_the_server` →
/// `pg::request_error` → `Error::Database`): exit 1, "this is unexpected", while the write
/// committed (the row changed, the guard counted it). A rerun with the same `--id` then
/// replays: the caller who took exit 1 as "failed" and did something else has both. It should
/// be exit 8, naming `fence inspect` and "may or may not".
#[test]
fn postgres_a_write_whose_pooler_lost_the_server_after_it_committed_is_outcome_unknown() {
    use common::proxy::{Mode, Proxy};
    let store = Store::postgres();
    let s = store.schema.clone().unwrap();
    common::pg_exec(
        &store.url,
        &format!(
            "CREATE SCHEMA {s}; CREATE TABLE {s}.data (id int PRIMARY KEY, v text NOT NULL); \
             INSERT INTO {s}.data VALUES (1, 'old');"
        ),
    );
    let token = common::acquire(&store, "orders", "A");
    let write = |target: &str, v: &str| {
        store
            .fence()
            .args(["write", "orders", "--owner", "A", "--token"])
            .args([token.to_string()])
            .args(["--target", target, "--id", &format!("set-{v}")])
            .args([
                "--sql",
                &format!("UPDATE {s}.data SET v = '{v}' WHERE id = 1"),
            ])
            .args(["--format", "json"])
            .run()
    };
    // The target's schema exists (made directly): the write through the pooler is one message.
    write(&store.url, "w1").expect(0);
    let cut = Proxy::start(
        common::pg_upstream(),
        Mode::CutWhenClientSends(b"end_write".to_vec()),
    );
    let bouncer = Bouncer::start(cut.addr());
    let out = write(&bouncer.url(), "w2");
    assert_eq!(
        cut.cuts(),
        1,
        "the premise: the pooler's server connection was cut: {out:?}"
    );
    cut.wait_backends_gone(&store.url);
    let v: String =
        common::pg_query(&store.url, &format!("SELECT v FROM {s}.data WHERE id = 1"))[0].get(0);
    assert_eq!(
        v, "w2",
        "the premise: the write committed on the server: {out:?}"
    );
    assert_eq!(
        out.code, 8,
        "a write that committed but whose answer the pooler lost must be outcome unknown: {out:?}"
    );
    let json = out.json();
    let advice = format!("{} {}", json["message"], json["hint"]);
    // What to check is the target's ledger and the data, not only the store.
    assert!(
        advice.contains("inspect")
            && advice.contains("may or may not")
            && advice.contains("--target"),
        "{out:?}"
    );
}
