//! The command line's edges (issue 2, acceptance point 5) and PostgreSQL connection features,
//! run through the real binary.
//!
//! Proves that bad names, durations, tokens, store URLs and options are usage errors (exit 2)
//! with a one-line cause and a hint, in human and JSON form, and never a panic; that an
//! unreachable server is `unavailable` (exit 7) quickly; that a refused login, a missing
//! database, missing privileges and TLS failures are usage errors that say what to fix; that
//! `sslmode=require`, `verify-full`, unix sockets and the `PG*` environment work against the
//! server `tests/run` starts; that `--help`, `--version`, global flags after the subcommand and
//! the default store behave as documented; and that no password ever reaches stdout or stderr.

use crate::common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{env_or_panic, Fence, Out, Store};
use serde_json::Value;

/// A password that must never be printed, whatever else goes wrong.
const SECRET: &str = "SECRETPW";

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A file store for tests that never get as far as touching it.
fn file_fence() -> (Store, Fence) {
    let store = Store::file();
    let fence = store.fence();
    (store, fence)
}

/// Asserts the shape of a human-format failure: exit `code`, nothing on stdout, and exactly
/// `fence: error: <cause>` then `hint: <hint>` on stderr. Returns (cause, hint).
#[track_caller]
fn human_failure(out: &Out, code: i32) -> (String, String) {
    assert_no_panic(out);
    assert_eq!(out.code, code, "unexpected exit status: {out:?}");
    assert!(out.stdout.is_empty(), "stdout must be empty: {out:?}");
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "one cause line and one hint line: {out:?}");
    assert!(
        !out.stderr.chars().any(|c| c.is_control() && c != '\n'),
        "a control character reached the terminal raw: {out:?}"
    );
    let cause = lines[0]
        .strip_prefix("fence: error: ")
        .unwrap_or_else(|| panic!("first line is not `fence: error: …`: {out:?}"));
    let hint = lines[1]
        .strip_prefix("hint: ")
        .unwrap_or_else(|| panic!("second line is not `hint: …`: {out:?}"));
    assert!(
        !cause.trim().is_empty() && !hint.trim().is_empty(),
        "{out:?}"
    );
    (cause.to_owned(), hint.to_owned())
}

/// Asserts the shape of a JSON failure: exit `code`, exactly one JSON object on stdout with
/// `ok: false`, the snake_case `error` and the `exit_code`. Returns the object.
#[track_caller]
fn json_failure(out: &Out, code: i32, error: &str) -> Value {
    assert_no_panic(out);
    assert_eq!(out.code, code, "unexpected exit status: {out:?}");
    assert_eq!(
        out.stdout.lines().count(),
        1,
        "exactly one line on stdout: {out:?}"
    );
    let v = out.json();
    assert_eq!(v["ok"], Value::Bool(false), "{out:?}");
    assert_eq!(v["error"], error, "{out:?}");
    assert_eq!(v["exit_code"], code, "{out:?}");
    assert!(
        v["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{out:?}"
    );
    assert!(v["hint"].as_str().is_some_and(|h| !h.is_empty()), "{out:?}");
    v
}

#[track_caller]
fn assert_no_panic(out: &Out) {
    assert!(
        !out.stderr.contains("panicked") && !out.stdout.contains("panicked"),
        "fence panicked: {out:?}"
    );
}

#[track_caller]
fn assert_no_secret(out: &Out, secret: &str) {
    assert!(
        !out.stdout.contains(secret) && !out.stderr.contains(secret),
        "the secret `{secret}` was printed: {out:?}"
    );
}

/// A successful JSON acquire: returns the object after checking the essentials.
#[track_caller]
fn json_acquired(out: &Out, resource: &str) -> Value {
    assert_no_panic(out);
    assert_eq!(out.code, 0, "acquire failed: {out:?}");
    let v = out.json();
    assert_eq!(v["ok"], Value::Bool(true), "{out:?}");
    assert_eq!(v["op"], "acquire", "{out:?}");
    assert_eq!(v["resource"], resource, "{out:?}");
    assert!(v["token"].as_i64().is_some_and(|t| t >= 1), "{out:?}");
    v
}

fn pg_port() -> u16 {
    env_or_panic("FENCE_TEST_PG_PORT")
        .parse()
        .expect("FENCE_TEST_PG_PORT is a port")
}

fn pg_password() -> String {
    env_or_panic("FENCE_TEST_PG_PASSWORD")
}

/// `postgres://fence:<password>@<host>:<port>/fence_test<query>` for the test server.
fn pg_url(host: &str, port: u16, query: &str) -> String {
    format!(
        "postgres://{}:{}@{host}:{port}/{}{query}",
        env_or_panic("FENCE_TEST_PG_USER"),
        pg_password(),
        env_or_panic("FENCE_TEST_PG_DB"),
    )
}

/// `fence --store URL --schema <the store's fresh schema>`, in the store's clean environment.
fn pg_fence(store: &Store, url: &str) -> Fence {
    Fence::bare(store.home.path()).args([
        "--store",
        url,
        "--schema",
        store.schema.as_deref().expect("a PostgreSQL store"),
    ])
}

/// Acquires `resource` through `url` and checks that the lease landed in the test database
/// under the store's schema (read back over a separate connection).
#[track_caller]
fn acquire_via(store: &Store, url: &str, resource: &str) -> Value {
    let out = pg_fence(store, url)
        .args([
            "acquire", resource, "--owner", "cli-test", "--format", "json",
        ])
        .run();
    assert_no_secret(&out, &pg_password());
    let v = json_acquired(&out, resource);
    let token = v["token"].as_i64().unwrap();
    assert_eq!(
        store.lease(resource),
        Some(("cli-test".to_owned(), token, true)),
        "the lease is not in the test database: {out:?}"
    );
    v
}

/// Asserts that no lease on `resource` exists in the store's schema (which may not exist).
#[track_caller]
fn assert_no_lease(store: &Store, resource: &str) {
    let schema = store.schema.as_deref().expect("a PostgreSQL store");
    let rows = store.pg_rows(
        "SELECT to_regclass($1) IS NOT NULL",
        &format!("{schema}.leases"),
    );
    if rows[0].get::<_, bool>(0) {
        assert_eq!(
            store.lease(resource),
            None,
            "a lease on `{resource}` exists"
        );
    }
}

/// A TCP port on 127.0.0.1 that nothing listens on (bound, then released).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().unwrap().port()
}

/// Runs fence, killing it after `limit`. Returns its output (None if it had to be killed) and
/// how long it ran.
fn run_with_deadline(mut fence: Fence, limit: Duration) -> (Option<Out>, Duration) {
    let start = Instant::now();
    let mut child = fence
        .cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fence");
    loop {
        if child.try_wait().expect("wait for fence").is_some() {
            let output = child.wait_with_output().expect("collect output");
            let out = Out::from(output);
            return (Some(out), start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return (None, start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Percent-encodes everything but unreserved characters (for a unix-socket host in a URL).
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A TCP relay to the test server that records every byte the client sent, so a test can
/// see whether the conversation was encrypted.
struct Relay {
    port: u16,
    host: String,
    from_client: Arc<Mutex<Vec<u8>>>,
}

impl Relay {
    fn start(bind: &str) -> Relay {
        let listener = TcpListener::bind((bind, 0)).expect("bind relay");
        let port = listener.local_addr().unwrap().port();
        let upstream: SocketAddr = format!("127.0.0.1:{}", pg_port()).parse().unwrap();
        let from_client = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&from_client);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(upstream) else {
                    return;
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let record = Arc::clone(&record);
                std::thread::spawn(move || pump(client, server, Some(record)));
                std::thread::spawn(move || pump(s2, c2, None));
            }
        });
        Relay {
            port,
            host: bind.to_owned(),
            from_client,
        }
    }

    fn sent(&self) -> Vec<u8> {
        self.from_client.lock().unwrap().clone()
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, record: Option<Arc<Mutex<Vec<u8>>>>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(record) = &record {
                    record.lock().unwrap().extend_from_slice(&buf[..n]);
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// PostgreSQL's SSLRequest packet: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// Whether the client asked for TLS, then spoke TLS (a handshake record follows at once), and
/// never sent its startup message (`user\0fence\0…`) in clear text.
fn looks_like_tls(sent: &[u8]) -> bool {
    sent.len() > 16
        && sent.starts_with(&SSL_REQUEST)
        && sent[8] == 0x16
        && !contains(sent, b"user\0fence\0")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

// ---------------------------------------------------------------------------------------------
// 1. Names
// ---------------------------------------------------------------------------------------------

/// Each bad name, with what the cause line must say about it.
fn bad_names() -> Vec<(String, &'static str)> {
    vec![
        (String::new(), "empty"),
        ("x".repeat(201), "200 bytes"),
        ("line\nbreak".into(), "control character"),
        ("tab\there".into(), "control character"),
        ("bell\u{7}".into(), "control character"),
        (" leading".into(), "whitespace"),
        ("trailing ".into(), "whitespace"),
    ]
}

#[test]
fn bad_resource_names_are_usage_errors_for_acquire() {
    let store = Store::file();
    for (name, problem) in bad_names() {
        let out = store.fence().args(["acquire", &name]).run();
        let (cause, _hint) = human_failure(&out, 2);
        assert!(cause.contains(problem), "{name:?}: {out:?}");
        assert!(cause.contains("RESOURCE"), "{name:?}: {out:?}");
        let shown: String = name.chars().flat_map(char::escape_debug).collect();
        assert!(
            cause.contains(&format!("'{shown}'")),
            "the value is quoted as typed, escaped: {name:?}: {out:?}"
        );

        let out = store
            .fence()
            .args(["acquire", &name, "--format", "json"])
            .run();
        let v = json_failure(&out, 2, "usage");
        assert_eq!(v["op"], "acquire", "{out:?}");
        assert!(v["message"].as_str().unwrap().contains(problem), "{out:?}");

        // `--format=json`, and the flag before the subcommand, are honoured too.
        for args in [
            vec!["acquire", &name, "--format=json"],
            vec!["--format", "json", "acquire", &name],
        ] {
            let out = store.fence().args(args).run();
            json_failure(&out, 2, "usage");
        }
    }
    // A 200-byte name is the longest accepted: the limit is exact.
    let longest = "x".repeat(200);
    store.fence().args(["acquire", &longest]).run().expect(0);
    // Nothing invalid was ever stored.
    let leases = std::fs::read_dir(store.dir().join("leases"))
        .unwrap()
        .count();
    assert_eq!(leases, 1);
}

#[test]
fn bad_resource_names_from_fence_resource_are_usage_errors_for_renew_and_release() {
    let store = Store::file();
    for op in ["renew", "release"] {
        for (name, problem) in bad_names() {
            let out = store
                .fence()
                .env("FENCE_RESOURCE", &name)
                .args([op, "--owner", "o", "--token", "1"])
                .run();
            let (cause, _) = human_failure(&out, 2);
            assert!(cause.contains(problem), "{op} {name:?}: {out:?}");

            let out = store
                .fence()
                .env("FENCE_RESOURCE", &name)
                .args([op, "--owner", "o", "--token", "1", "--format", "json"])
                .run();
            let v = json_failure(&out, 2, "usage");
            assert_eq!(v["op"], op, "{out:?}");
        }
        // The same names as an argument.
        for (name, problem) in bad_names() {
            let out = store
                .fence()
                .args([op, &name, "--owner", "o", "--token", "1"])
                .run();
            let (cause, _) = human_failure(&out, 2);
            assert!(cause.contains(problem), "{op} {name:?}: {out:?}");
        }
    }
}

#[test]
fn owner_with_a_control_character_is_a_usage_error() {
    let store = Store::file();
    for owner in ["bad\u{7}owner", "bad\nowner", ""] {
        let out = store.fence().args(["acquire", "r", "--owner", owner]).run();
        let (cause, _) = human_failure(&out, 2);
        assert!(cause.contains("--owner"), "{owner:?}: {out:?}");

        let out = store
            .fence()
            .env("FENCE_OWNER", owner)
            .args(["release", "r", "--token", "1", "--format", "json"])
            .run();
        json_failure(&out, 2, "usage");
    }
    let out = store
        .fence()
        .args(["renew", "r", "--owner", "x\u{1b}[31m", "--token", "1"])
        .run();
    let (cause, _) = human_failure(&out, 2);
    assert!(cause.contains("control character"), "{out:?}");
    assert!(!store.dir().join("leases").exists(), "nothing was stored");
}

// ---------------------------------------------------------------------------------------------
// 2. Durations and tokens
// ---------------------------------------------------------------------------------------------

#[test]
fn bad_ttls_are_usage_errors() {
    let store = Store::file();
    for (ttl, problem) in [
        ("abc", "not a duration"),
        ("50ms", "100ms"),
        ("99ms", "100ms"),
        ("25h", "outside"),
        ("", "duration"),
    ] {
        let out = store.fence().args(["acquire", "r", "--ttl", ttl]).run();
        let (cause, hint) = human_failure(&out, 2);
        assert!(
            cause.contains("--ttl") && cause.contains(problem),
            "{ttl:?}: {out:?}"
        );
        assert!(hint.contains("fence acquire --help"), "{out:?}");

        let out = store
            .fence()
            .args(["renew", "r", "--owner", "o", "--token", "1", "--ttl", ttl])
            .args(["--format", "json"])
            .run();
        let v = json_failure(&out, 2, "usage");
        assert_eq!(v["op"], "renew");
    }
    // The bounds themselves are accepted.
    let out = store
        .fence()
        .args(["acquire", "r", "--ttl", "100ms", "--format", "json"])
        .run();
    assert_eq!(json_acquired(&out, "r")["ttl_ms"], 100);
    let out = store
        .fence()
        .args(["acquire", "s", "--ttl", "24h", "--format", "json"])
        .run();
    assert_eq!(json_acquired(&out, "s")["ttl_ms"], 86_400_000);
}

#[test]
fn bad_tokens_are_usage_errors() {
    let store = Store::file();
    let bad = ["0", "-1", "abc", "9223372036854775808", "1.5", ""];
    for op in ["renew", "release"] {
        for token in bad {
            let out = store
                .fence()
                .args([op, "r", "--owner", "o", "--token", token])
                .run();
            let (cause, hint) = human_failure(&out, 2);
            assert!(cause.contains("--token"), "{op} {token:?}: {out:?}");
            assert!(hint.contains(&format!("fence {op} --help")), "{out:?}");

            let out = store
                .fence()
                .args([
                    op, "r", "--owner", "o", "--token", token, "--format", "json",
                ])
                .run();
            let v = json_failure(&out, 2, "usage");
            assert_eq!(v["op"], op, "{out:?}");

            if !token.is_empty() {
                let out = store
                    .fence()
                    .env("FENCE_TOKEN", token)
                    .args([op, "r", "--owner", "o"])
                    .run();
                human_failure(&out, 2);
            }
        }
    }
    // The largest token parses (and is simply unknown to this store).
    let out = store
        .fence()
        .args([
            "release",
            "r",
            "--owner",
            "o",
            "--token",
            "9223372036854775807",
        ])
        .run();
    assert_no_panic(&out);
    assert_ne!(out.code, 2, "i64::MAX is a valid token: {out:?}");
}

// ---------------------------------------------------------------------------------------------
// 3. Store URLs and other options
// ---------------------------------------------------------------------------------------------

#[test]
fn malformed_store_urls_are_usage_errors_that_never_print_the_password() {
    let home = tempfile::tempdir().unwrap();
    let cases = [
        ("redis://x".to_owned(), "store URL"),
        ("file://relative/path".to_owned(), "absolute"),
        (
            format!("postgres://u:{SECRET}@host:notaport/db"),
            "not a valid PostgreSQL URL",
        ),
        (
            format!("postgres://fence:{SECRET}@127.0.0.1:1/db?sslmode=bogus"),
            "sslmode `bogus`",
        ),
        (
            format!("postgres://fence@127.0.0.1:1/db?sslmode=bogus&password={SECRET}"),
            "sslmode `bogus`",
        ),
        (
            format!("postgres://fence:{SECRET}@127.0.0.1:1/db?connect_timeout=abc"),
            "not a valid PostgreSQL URL",
        ),
        ("s3://Bucket/prefix".to_owned(), "bucket name"),
        ("gs://bucket/a//b".to_owned(), "empty"),
    ];
    for (url, problem) in &cases {
        let out = Fence::bare(home.path())
            .args(["acquire", "r", "--store", url])
            .run();
        let (cause, _hint) = human_failure(&out, 2);
        assert!(cause.contains(problem), "{url}: {out:?}");
        assert_no_secret(&out, SECRET);

        let out = Fence::bare(home.path())
            .args(["--format", "json", "acquire", "r", "--store", url])
            .run();
        json_failure(&out, 2, "usage");
        assert_no_secret(&out, SECRET);

        // From FENCE_STORE too, for a lease command.
        let out = Fence::bare(home.path())
            .env("FENCE_STORE", url)
            .args(["release", "r", "--owner", "o", "--token", "1"])
            .run();
        human_failure(&out, 2);
        assert_no_secret(&out, SECRET);
    }
    // Nothing was created under HOME by any of them.
    assert_eq!(std::fs::read_dir(home.path()).unwrap().count(), 0);
}

/// A password holding characters that delimit URL parts (`/`, `?`) is still a password to the
/// PostgreSQL driver, which connects with it, so it must be redacted all the same.
#[test]
fn passwords_with_url_delimiters_are_never_printed() {
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    for (password, secret_part) in [
        ("SEC/RETPW", "RETPW"),
        ("SEC?RETPW", "RETPW"),
        ("SEC#RETPW", "RETPW"),
        ("SEC@RETPW", "SEC"),
    ] {
        let url = format!("postgres://fence:{password}@127.0.0.1:{port}/db");
        for format in ["human", "json"] {
            let out = Fence::bare(home.path())
                .args(["acquire", "r", "--store", &url, "--format", format])
                .run();
            assert_no_panic(&out);
            assert!(out.code == 2 || out.code == 7, "{url}: {out:?}");
            assert_no_secret(&out, secret_part);
        }
    }
}

#[test]
fn bad_schema_is_a_usage_error() {
    let (_store, fence) = file_fence();
    let out = fence.args(["acquire", "r", "--schema", "Bad;Name"]).run();
    let (cause, _) = human_failure(&out, 2);
    assert!(
        cause.contains("--schema") && cause.contains("Bad;Name"),
        "{out:?}"
    );

    let (_store, fence) = file_fence();
    let out = fence
        .env("FENCE_SCHEMA", "drop table x")
        .args(["--format", "json", "inspect"])
        .run();
    json_failure(&out, 2, "usage");
}

#[test]
fn env_format_is_only_for_acquire() {
    for op in [
        vec!["renew", "r", "--owner", "o", "--token", "1"],
        vec!["release", "r", "--owner", "o", "--token", "1"],
        vec!["inspect"],
    ] {
        let (store, fence) = file_fence();
        std::fs::remove_dir(store.dir()).unwrap();
        let mut out = fence.args(&op).args(["--format", "env"]).run();
        // stdout is for `eval`: a comment saying why, then a command that fails with 2.
        let stdout = std::mem::take(&mut out.stdout);
        assert!(stdout.starts_with("# fence "), "{stdout}");
        assert!(stdout.ends_with("\n(exit 2)\n"), "{stdout}");
        let (cause, hint) = human_failure(&out, 2);
        assert!(cause.contains("--format env"), "{out:?}");
        assert!(hint.contains("--format human"), "{out:?}");
        assert!(!store.dir().exists(), "nothing touched the store: {out:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// 4. An unreachable server
// ---------------------------------------------------------------------------------------------

#[test]
fn a_server_that_refuses_connections_is_unavailable_at_once() {
    let store = Store::postgres();
    let url = format!("postgres://fence:{SECRET}@127.0.0.1:{}/db", free_port());

    let start = Instant::now();
    let out = pg_fence(&store, &url).args(["acquire", "r"]).run();
    let (cause, hint) = human_failure(&out, 7);
    // "At once" is the property: a refused connection is answered, not waited on like a
    // silent server until the connect timeout (10 s by default); 5 s is half that.
    assert!(start.elapsed() < Duration::from_secs(5), "{out:?}");
    assert!(cause.contains("cannot reach PostgreSQL"), "{out:?}");
    assert!(cause.contains("postgres://fence@127.0.0.1:"), "{out:?}");
    assert!(hint.contains("safe to retry"), "{out:?}");
    assert_no_secret(&out, SECRET);

    for op in [
        vec!["acquire", "r"],
        vec!["renew", "r", "--owner", "o", "--token", "1"],
        vec!["release", "r", "--owner", "o", "--token", "1"],
        vec!["inspect"],
        vec!["init"],
    ] {
        let out = pg_fence(&store, &url)
            .args(&op)
            .args(["--format", "json"])
            .run();
        let v = json_failure(&out, 7, "unavailable");
        assert_eq!(v["op"], op[0], "{out:?}");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("cannot reach PostgreSQL"),
            "{out:?}"
        );
        assert!(
            v["store"]
                .as_str()
                .is_some_and(|s| s.starts_with("postgres://fence@127.0.0.1:")),
            "{out:?}"
        );
        assert_no_secret(&out, SECRET);
    }
}

/// A server that accepts TCP connections but never says anything (a hung host, a black-holed
/// load balancer): with `connect_timeout=1` fence must give up within a few seconds, exit 7.
#[test]
fn a_server_that_never_answers_is_unavailable_within_the_connect_timeout() {
    let store = Store::postgres();
    // The kernel completes the handshake for the backlog; nobody ever reads or writes.
    let black_hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = black_hole.local_addr().unwrap().port();
    for query in ["?connect_timeout=1", "?connect_timeout=1&sslmode=disable"] {
        let url = format!("postgres://fence:{SECRET}@127.0.0.1:{port}/db{query}");
        let fence = pg_fence(&store, &url).args(["acquire", "r", "--format", "json"]);
        let (out, took) = run_with_deadline(fence, Duration::from_secs(10));
        let out = out.unwrap_or_else(|| {
            panic!("{query}: fence was still waiting after {took:?} and had to be killed")
        });
        // The property: the URL's connect_timeout (1 s) bounds the wait, not the default
        // (10 s); 6 s is far above the one and below the other.
        assert!(
            took < Duration::from_secs(6),
            "{query}: took {took:?}: {out:?}"
        );
        json_failure(&out, 7, "unavailable");
        assert_no_secret(&out, SECRET);
    }
    drop(black_hole);
}

// ---------------------------------------------------------------------------------------------
// 5. Refused logins, missing databases, missing privileges
// ---------------------------------------------------------------------------------------------

#[test]
fn a_wrong_password_is_a_usage_error_that_never_prints_it() {
    let store = Store::postgres();
    let wrong = "wrong-Secret-41";
    let url = format!(
        "postgres://fence:{wrong}@{}:{}/{}",
        env_or_panic("FENCE_TEST_PG_HOST"),
        pg_port(),
        env_or_panic("FENCE_TEST_PG_DB")
    );
    let out = pg_fence(&store, &url).args(["acquire", "r"]).run();
    let (cause, hint) = human_failure(&out, 2);
    assert!(cause.contains("refused the login"), "{out:?}");
    assert!(cause.contains("password authentication failed"), "{out:?}");
    assert!(hint.contains("password"), "{out:?}");
    assert_no_secret(&out, wrong);

    let out = pg_fence(&store, &url)
        .args(["acquire", "r", "--format", "json"])
        .run();
    let v = json_failure(&out, 2, "usage");
    assert!(v["hint"].as_str().unwrap().contains("password"), "{out:?}");
    assert_no_secret(&out, wrong);

    // The same through PGPASSWORD.
    let url = format!(
        "postgres://fence@127.0.0.1:{}/{}",
        pg_port(),
        env_or_panic("FENCE_TEST_PG_DB")
    );
    let out = pg_fence(&store, &url)
        .env("PGPASSWORD", wrong)
        .args(["acquire", "r"])
        .run();
    let (cause, _) = human_failure(&out, 2);
    assert!(cause.contains("refused the login"), "{out:?}");
    assert_no_secret(&out, wrong);
    assert_no_lease(&store, "r");
}

/// Over TCP the server wants a password; with none in the URL or PGPASSWORD the hint must
/// say so, not send the user to check host and port.
#[test]
fn a_missing_password_is_a_usage_error_that_says_so() {
    let store = Store::postgres();
    let url = format!(
        "postgres://fence@127.0.0.1:{}/{}",
        pg_port(),
        env_or_panic("FENCE_TEST_PG_DB")
    );
    let out = pg_fence(&store, &url).args(["acquire", "r"]).run();
    let (cause, hint) = human_failure(&out, 2);
    assert!(cause.contains("password"), "{out:?}");
    assert!(hint.contains("PGPASSWORD"), "{out:?}");
    assert_no_lease(&store, "r");
}

#[test]
fn a_missing_database_is_a_usage_error_naming_it() {
    let store = Store::postgres();
    let url = format!(
        "postgres://fence:{}@127.0.0.1:{}/no_such_db_41",
        pg_password(),
        pg_port()
    );
    let out = pg_fence(&store, &url).args(["acquire", "r"]).run();
    let (cause, hint) = human_failure(&out, 2);
    assert!(
        cause.contains("\"no_such_db_41\" does not exist"),
        "{out:?}"
    );
    assert!(hint.contains("database"), "{out:?}");
    assert_no_secret(&out, &pg_password());

    let out = pg_fence(&store, &url)
        .args(["inspect", "--format", "json"])
        .run();
    let v = json_failure(&out, 2, "usage");
    assert!(
        v["message"].as_str().unwrap().contains("no_such_db_41"),
        "{out:?}"
    );
    assert_no_secret(&out, &pg_password());
}

fn noauth_url() -> String {
    format!(
        "postgres://{}:{}@127.0.0.1:{}/{}",
        env_or_panic("FENCE_TEST_PG_NOAUTH_USER"),
        env_or_panic("FENCE_TEST_PG_NOAUTH_PASSWORD"),
        pg_port(),
        env_or_panic("FENCE_TEST_PG_DB")
    )
}

/// A user who may connect but not create schemas gets a usage error pointing at `fence init`
/// when fence's schema does not exist yet.
#[test]
fn a_user_who_may_not_create_the_schema_is_told_to_run_init() {
    let store = Store::postgres();
    let secret = env_or_panic("FENCE_TEST_PG_NOAUTH_PASSWORD");
    for op in [vec!["acquire", "r"], vec!["init"]] {
        let out = pg_fence(&store, &noauth_url()).args(&op).run();
        let (cause, hint) = human_failure(&out, 2);
        assert!(cause.contains("permission denied"), "{out:?}");
        assert!(
            cause.contains(store.schema.as_deref().unwrap()),
            "the cause names the schema: {out:?}"
        );
        assert!(hint.contains("fence init"), "{out:?}");
        assert_no_secret(&out, &secret);

        let out = pg_fence(&store, &noauth_url())
            .args(&op)
            .args(["--format", "json"])
            .run();
        json_failure(&out, 2, "usage");
        assert_no_secret(&out, &secret);
    }
    // Nothing was created.
    let rows = store.pg_rows(
        "SELECT count(*) FROM pg_namespace WHERE nspname = $1",
        store.schema.as_deref().unwrap(),
    );
    assert_eq!(rows[0].get::<_, i64>(0), 0);
}

/// The schema exists (created by its owner) but this user has no rights on it: a usage error
/// about privileges, never `internal`.
#[test]
fn a_user_without_privileges_on_an_existing_schema_is_a_usage_error() {
    let store = Store::postgres();
    store.fence().args(["init"]).run().expect(0);
    let secret = env_or_panic("FENCE_TEST_PG_NOAUTH_PASSWORD");
    let out = pg_fence(&store, &noauth_url()).args(["acquire", "r"]).run();
    let (cause, hint) = human_failure(&out, 2);
    assert!(cause.contains("permission denied"), "{out:?}");
    assert!(hint.contains("privileges"), "{out:?}");
    assert_no_secret(&out, &secret);
    assert_no_lease(&store, "r");
}

// ---------------------------------------------------------------------------------------------
// 6. TLS
// ---------------------------------------------------------------------------------------------

#[test]
fn sslmode_require_connects_over_tls() {
    let store = Store::postgres();
    let host = env_or_panic("FENCE_TEST_PG_HOST");
    let v = acquire_via(&store, &pg_url(&host, pg_port(), "?sslmode=require"), "a");
    assert!(!v["store"].as_str().unwrap().contains(&pg_password()));

    // Through a relay that records what the client sent: TLS from the first byte after the
    // SSLRequest, and no clear-text startup message.
    let relay = Relay::start("127.0.0.1");
    acquire_via(
        &store,
        &pg_url(&relay.host, relay.port, "?sslmode=require"),
        "b",
    );
    assert!(looks_like_tls(&relay.sent()), "not TLS: {:?}", relay.sent());

    // The check can fail: with sslmode=disable the relay sees the startup message in clear.
    let relay = Relay::start("127.0.0.1");
    acquire_via(
        &store,
        &pg_url(&relay.host, relay.port, "?sslmode=disable"),
        "c",
    );
    let sent = relay.sent();
    assert!(!looks_like_tls(&sent) && contains(&sent, b"user\0fence\0"));

    // PGSSLMODE is honoured when the URL says nothing.
    let relay = Relay::start("127.0.0.1");
    let url = pg_url(&relay.host, relay.port, "");
    let out = pg_fence(&store, &url)
        .env("PGSSLMODE", "require")
        .args(["acquire", "d", "--format", "json"])
        .run();
    json_acquired(&out, "d");
    assert!(looks_like_tls(&relay.sent()));
}

#[test]
fn verify_full_connects_by_name_and_by_address() {
    let store = Store::postgres();
    let ca = env_or_panic("FENCE_TEST_PG_CA");
    let query = format!("?sslmode=verify-full&sslrootcert={}", percent_encode(&ca));
    acquire_via(&store, &pg_url("localhost", pg_port(), &query), "by-name");
    acquire_via(
        &store,
        &pg_url("127.0.0.1", pg_port(), &query),
        "by-address",
    );

    // The relay proves it was TLS.
    let relay = Relay::start("127.0.0.1");
    acquire_via(&store, &pg_url(&relay.host, relay.port, &query), "relayed");
    assert!(looks_like_tls(&relay.sent()));

    // PGSSLMODE / PGSSLROOTCERT instead of the URL.
    let out = pg_fence(&store, &pg_url("localhost", pg_port(), ""))
        .env("PGSSLMODE", "verify-full")
        .env("PGSSLROOTCERT", &ca)
        .args(["acquire", "by-env", "--format", "json"])
        .run();
    json_acquired(&out, "by-env");
}

/// The certificate names `localhost` and `127.0.0.1`; a relay on 127.0.0.2 reaches the same
/// server under an address the certificate does not name.
#[test]
fn verify_full_rejects_a_host_the_certificate_does_not_name() {
    let store = Store::postgres();
    let ca = env_or_panic("FENCE_TEST_PG_CA");
    let relay = Relay::start("127.0.0.2");
    let query = format!("?sslmode=verify-full&sslrootcert={}", percent_encode(&ca));
    let url = pg_url(&relay.host, relay.port, &query);
    let out = pg_fence(&store, &url).args(["acquire", "r"]).run();
    let (cause, hint) = human_failure(&out, 2);
    assert!(cause.contains("TLS"), "{out:?}");
    assert!(
        hint.contains("sslrootcert") || hint.contains("host"),
        "{out:?}"
    );
    assert_no_secret(&out, &pg_password());
    assert_no_lease(&store, "r");

    // verify-ca checks the chain only, so the same address is fine.
    let query = format!("?sslmode=verify-ca&sslrootcert={}", percent_encode(&ca));
    acquire_via(&store, &pg_url(&relay.host, relay.port, &query), "r");
}

/// A self-signed certificate (`CN=other`) that signed nothing the server uses.
fn throwaway_cert(dir: &Path) -> std::path::PathBuf {
    let (key, cert) = (dir.join("other.key"), dir.join("other.pem"));
    let status = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=other", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run openssl");
    assert!(status.success(), "openssl req failed");
    cert
}

#[test]
fn verify_full_rejects_a_certificate_from_another_ca() {
    let store = Store::postgres();
    let dir = tempfile::tempdir().unwrap();
    let cert = throwaway_cert(dir.path());
    for host in ["localhost", "127.0.0.1"] {
        for mode in ["verify-full", "verify-ca"] {
            let query = format!(
                "?sslmode={mode}&sslrootcert={}",
                percent_encode(&cert.display().to_string())
            );
            let url = pg_url(host, pg_port(), &query);
            let out = pg_fence(&store, &url).args(["acquire", "r"]).run();
            let (cause, hint) = human_failure(&out, 2);
            assert!(cause.contains("TLS"), "{host} {mode}: {out:?}");
            assert!(hint.contains("sslrootcert"), "{out:?}");
            assert_no_secret(&out, &pg_password());

            let out = pg_fence(&store, &url)
                .args(["acquire", "r", "--format", "json"])
                .run();
            json_failure(&out, 2, "usage");
        }
    }
    assert_no_lease(&store, "r");
}

/// `sslrootcert` may hold several certificates, as with libpq (cloud providers ship bundles):
/// the server's CA anywhere in the file is enough.
#[test]
fn verify_full_accepts_a_bundle_of_root_certificates() {
    let store = Store::postgres();
    let dir = tempfile::tempdir().unwrap();
    let other = throwaway_cert(dir.path());
    let ca = std::fs::read_to_string(env_or_panic("FENCE_TEST_PG_CA")).unwrap();
    let other = std::fs::read_to_string(other).unwrap();
    // The server's CA first, then another, and the other way round.
    for (i, pem) in [format!("{ca}{other}"), format!("{other}{ca}")]
        .iter()
        .enumerate()
    {
        let bundle = dir.path().join(format!("bundle{i}.pem"));
        std::fs::write(&bundle, pem).unwrap();
        let query = format!(
            "?sslmode=verify-full&sslrootcert={}",
            percent_encode(&bundle.display().to_string())
        );
        acquire_via(
            &store,
            &pg_url("localhost", pg_port(), &query),
            &format!("r{i}"),
        );
    }
}

#[test]
fn verify_full_with_a_missing_or_bad_root_certificate_is_a_usage_error() {
    let store = Store::postgres();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-ca.pem");
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "this is not a certificate\n").unwrap();
    for (path, problem) in [
        (&missing, "cannot read the CA certificate"),
        (&not_pem, "not a PEM certificate"),
    ] {
        let query = format!(
            "?sslmode=verify-full&sslrootcert={}",
            percent_encode(&path.display().to_string())
        );
        let out = pg_fence(&store, &pg_url("localhost", pg_port(), &query))
            .args(["acquire", "r"])
            .run();
        let (cause, hint) = human_failure(&out, 2);
        assert!(cause.contains(problem), "{out:?}");
        assert!(cause.contains(&path.display().to_string()), "{out:?}");
        assert!(hint.contains("sslrootcert"), "{out:?}");
        assert_no_secret(&out, &pg_password());
    }
    // Without sslrootcert, the default is ~/.postgresql/root.crt under fence's (empty) HOME.
    let out = pg_fence(
        &store,
        &pg_url("localhost", pg_port(), "?sslmode=verify-full"),
    )
    .args(["acquire", "r"])
    .run();
    let (cause, _) = human_failure(&out, 2);
    assert!(cause.contains(".postgresql/root.crt"), "{out:?}");
}

// ---------------------------------------------------------------------------------------------
// 7. Unix sockets (trust auth there; TCP needs a password, so success without one proves
//    the socket was used)
// ---------------------------------------------------------------------------------------------

#[test]
fn a_unix_socket_given_as_a_host_parameter() {
    let store = Store::postgres();
    let url = format!(
        "postgres:///{}?host={}&port={}&user={}",
        env_or_panic("FENCE_TEST_PG_DB"),
        percent_encode(&env_or_panic("FENCE_TEST_PG_SOCKET_DIR")),
        pg_port(),
        env_or_panic("FENCE_TEST_PG_USER"),
    );
    let v = acquire_via(&store, &url, "r");
    assert_eq!(v["store"], url.as_str());
    // sslmode=require is moot on a socket (as with libpq), not an error.
    acquire_via(&store, &format!("{url}&sslmode=require"), "s");
}

#[test]
fn a_unix_socket_given_as_a_percent_encoded_host() {
    let store = Store::postgres();
    let url = format!(
        "postgres://{}@{}:{}/{}",
        env_or_panic("FENCE_TEST_PG_USER"),
        percent_encode(&env_or_panic("FENCE_TEST_PG_SOCKET_DIR")),
        pg_port(),
        env_or_panic("FENCE_TEST_PG_DB"),
    );
    acquire_via(&store, &url, "r");
}

// ---------------------------------------------------------------------------------------------
// 8. PG* fallbacks
// ---------------------------------------------------------------------------------------------

#[test]
fn pg_environment_fills_in_an_empty_url_over_tcp() {
    let store = Store::postgres();
    for (i, url) in ["postgres://", "postgresql:///"].into_iter().enumerate() {
        let resource = format!("r{i}");
        let out = pg_fence(&store, url)
            .env("PGHOST", env_or_panic("FENCE_TEST_PG_HOST"))
            .env("PGPORT", pg_port().to_string())
            .env("PGUSER", env_or_panic("FENCE_TEST_PG_USER"))
            .env("PGPASSWORD", pg_password())
            .env("PGDATABASE", env_or_panic("FENCE_TEST_PG_DB"))
            .args([
                "acquire", &resource, "--owner", "cli-test", "--format", "json",
            ])
            .run();
        let v = json_acquired(&out, &resource);
        assert_eq!(v["store"], url, "{out:?}");
        assert_no_secret(&out, &pg_password());
        let token = v["token"].as_i64().unwrap();
        assert_eq!(
            store.lease(&resource),
            Some(("cli-test".to_owned(), token, true))
        );
    }
    // The env password is really used: without it, the login is refused.
    let out = pg_fence(&store, "postgres://")
        .env("PGHOST", env_or_panic("FENCE_TEST_PG_HOST"))
        .env("PGPORT", pg_port().to_string())
        .env("PGUSER", env_or_panic("FENCE_TEST_PG_USER"))
        .env("PGDATABASE", env_or_panic("FENCE_TEST_PG_DB"))
        .args(["acquire", "x"])
        .run();
    human_failure(&out, 2);
}

#[test]
fn pg_environment_with_a_socket_directory_as_pghost() {
    let store = Store::postgres();
    let out = pg_fence(&store, "postgresql:///")
        .env("PGHOST", env_or_panic("FENCE_TEST_PG_SOCKET_DIR"))
        .env("PGPORT", pg_port().to_string())
        .env("PGUSER", env_or_panic("FENCE_TEST_PG_USER"))
        .env("PGDATABASE", env_or_panic("FENCE_TEST_PG_DB"))
        .args(["acquire", "r", "--owner", "cli-test", "--format", "json"])
        .run();
    let v = json_acquired(&out, "r");
    let token = v["token"].as_i64().unwrap();
    assert_eq!(store.lease("r"), Some(("cli-test".to_owned(), token, true)));

    let out = pg_fence(&store, "postgres://")
        .env("PGPORT", "notaport")
        .args(["acquire", "r"])
        .run();
    let (cause, _) = human_failure(&out, 2);
    assert!(cause.contains("PGPORT"), "{out:?}");
}

// ---------------------------------------------------------------------------------------------
// 9. Help, version, global flags
// ---------------------------------------------------------------------------------------------

#[test]
fn help_lists_the_exit_codes_and_version_works() {
    let home = tempfile::tempdir().unwrap();
    let out = Fence::bare(home.path()).args(["--help"]).run().expect(0);
    for (code, name) in [
        ("0", "-"),
        ("1", "internal"),
        ("2", "usage"),
        ("3", "busy"),
        ("4", "stale_fencing_token"),
        ("5", "lease_lost"),
        ("6", "conflict"),
        ("7", "unavailable"),
        ("8", "outcome_unknown"),
    ] {
        assert!(
            out.stdout.lines().any(|line| {
                let mut words = line.split_whitespace();
                words.next() == Some(code)
                    && words.next().map(|w| w.trim_end_matches(',')) == Some(name)
            }),
            "exit {code} {name} missing from --help: {}",
            out.stdout
        );
    }
    assert!(out.stderr.is_empty(), "{out:?}");

    let out = Fence::bare(home.path())
        .args(["acquire", "--help"])
        .run()
        .expect(0);
    assert!(out.stdout.contains("--ttl <DURATION>"), "{out:?}");
    assert!(
        out.stdout.contains("--store <URL>"),
        "global flags listed: {out:?}"
    );

    let out = Fence::bare(home.path())
        .args(["help", "renew"])
        .run()
        .expect(0);
    assert!(out.stdout.contains("--token <TOKEN>"), "{out:?}");

    let out = Fence::bare(home.path()).args(["--version"]).run().expect(0);
    assert_eq!(
        out.stdout.trim(),
        format!("fence {}", env!("CARGO_PKG_VERSION")),
        "{out:?}"
    );

    // No subcommand at all is a usage error, not a success.
    let out = Fence::bare(home.path()).run();
    assert_no_panic(&out);
    assert_eq!(out.code, 2, "{out:?}");
    let out = Fence::bare(home.path()).args(["frobnicate"]).run();
    human_failure(&out, 2);
    assert!(std::fs::read_dir(home.path()).unwrap().next().is_none());
}

#[test]
fn global_flags_work_after_the_subcommand() {
    let store = Store::file();
    let out = Fence::bare(store.home.path())
        .args(["acquire", "r", "--format", "json", "--store", &store.url])
        .run();
    let v = json_acquired(&out, "r");
    assert_eq!(v["store"], store.url.as_str());
    assert!(store.dir().join("leases").is_dir());

    let pg = Store::postgres();
    let out = Fence::bare(pg.home.path())
        .args(["acquire", "r", "--owner", "cli-test", "--format", "json"])
        .args([
            "--schema",
            pg.schema.as_deref().unwrap(),
            "--store",
            &pg.url,
        ])
        .args(["-q", "--color", "never"])
        .run();
    let v = json_acquired(&out, "r");
    assert_no_secret(&out, &pg_password());
    assert_eq!(
        pg.lease("r"),
        Some(("cli-test".to_owned(), v["token"].as_i64().unwrap(), true))
    );
}

// ---------------------------------------------------------------------------------------------
// 10. The default store
// ---------------------------------------------------------------------------------------------

fn dir_entries(path: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(path)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn the_default_store_lives_under_home() {
    let home = tempfile::tempdir().unwrap();
    let out = Fence::bare(home.path())
        .args(["acquire", "r", "--format", "json"])
        .run();
    let v = json_acquired(&out, "r");
    let dir = home.path().join(".local/state/fence");
    assert_eq!(v["store"], format!("file://{}", dir.display()), "{out:?}");
    assert!(dir_entries(&dir).contains(&"leases".to_owned()), "{out:?}");
    assert!(dir.join("leases").read_dir().unwrap().next().is_some());

    // The same store is found again: the same owner reacquires with the same token.
    let owner = v["owner"].as_str().unwrap();
    let out = Fence::bare(home.path())
        .args(["acquire", "r", "--owner", owner, "--format", "json"])
        .run();
    let again = json_acquired(&out, "r");
    assert_eq!(again["token"], v["token"]);
    assert_eq!(again["reacquired"], true);
}

#[test]
fn the_default_store_follows_xdg_state_home() {
    let home = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let out = Fence::bare(home.path())
        .env("XDG_STATE_HOME", state.path())
        .args(["acquire", "r", "--format", "json"])
        .run();
    let v = json_acquired(&out, "r");
    let dir = state.path().join("fence");
    assert_eq!(v["store"], format!("file://{}", dir.display()), "{out:?}");
    assert!(dir_entries(&dir).contains(&"leases".to_owned()), "{out:?}");
    assert!(
        !home.path().join(".local").exists(),
        "nothing under HOME when XDG_STATE_HOME is set"
    );

    // FENCE_STORE beats the default, and --store beats FENCE_STORE.
    let other = tempfile::tempdir().unwrap();
    let other_url = format!("file://{}", other.path().display());
    let out = Fence::bare(home.path())
        .env("XDG_STATE_HOME", state.path())
        .env("FENCE_STORE", &other_url)
        .args(["acquire", "s", "--format", "json"])
        .run();
    assert_eq!(json_acquired(&out, "s")["store"], other_url.as_str());
    let flag = tempfile::tempdir().unwrap();
    let flag_url = format!("file://{}", flag.path().display());
    let out = Fence::bare(home.path())
        .env("FENCE_STORE", &other_url)
        .args(["acquire", "t", "--store", &flag_url, "--format", "json"])
        .run();
    assert_eq!(json_acquired(&out, "t")["store"], flag_url.as_str());
    assert!(flag.path().join("leases").is_dir());
}

/// A long-lived session (`fence run`'s renewals, waiters, bench workers) prepares a statement
/// on its second use. Behind a transaction-mode pooler (PgBouncer) the prepared statement can
/// be missing on the server connection the next transaction gets: fence then runs it
/// unprepared, as on its first use, instead of failing. `DEALLOCATE ALL` on the session's own
/// connection makes the statements vanish here.
#[test]
fn a_vanished_prepared_statement_is_run_unprepared() {
    use fence::pg::session::{SchemaSpec, Session};
    use tokio_postgres::types::Type;
    static SPEC: SchemaSpec = SchemaSpec {
        meta_table: "meta",
        version: 1,
        sql: "CREATE SCHEMA IF NOT EXISTS __SCHEMA__;
              CREATE TABLE IF NOT EXISTS __SCHEMA__.meta (key text PRIMARY KEY, value text NOT NULL);
              CREATE TABLE IF NOT EXISTS __SCHEMA__.hits (n bigint NOT NULL);
              INSERT INTO __SCHEMA__.meta VALUES ('schema_version', '1') ON CONFLICT DO NOTHING;",
        purpose: "test",
    };
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    common::block_on(async {
        let session = Session::open(&store.url, "the test server", &schema, &SPEC)
            .await
            .unwrap();
        session.migrate().await.unwrap();
        let insert = "INSERT INTO __SCHEMA__.hits VALUES ($1) RETURNING n";
        let run = |n: i64| {
            let session = &session;
            async move {
                let rows = session
                    .call("insert", true, insert, &[(&n, Type::INT8)])
                    .await
                    .unwrap_or_else(|err| panic!("insert {n}: {err}"));
                assert_eq!(rows[0].get::<_, i64>(0), n);
            }
        };
        for n in 1..=3 {
            run(n).await;
        }
        session
            .client
            .batch_execute("DEALLOCATE ALL")
            .await
            .unwrap();
        for n in 4..=6 {
            run(n).await;
        }
    });
    // Each insert ran exactly once.
    let rows = store.pg_rows(
        &format!("SELECT string_agg(n::text, ',' ORDER BY n) FROM {schema}.hits WHERE $1 = $1"),
        "",
    );
    assert_eq!(rows[0].get::<_, String>(0), "1,2,3,4,5,6");
}
