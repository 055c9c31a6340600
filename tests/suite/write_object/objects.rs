//! Fenced object writes (issue 4) on S3 (moto and LocalStack), GCS (fake-gcs-server) and
//! `file://` objects, each with the coordinator of the same kind. Every test reads the stored
//! object back from the server (or the directory) itself: bytes, `fence-token` metadata,
//! version.

use crate::common;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::objects::{read_local, Server, Service, Stored};
use common::proxy::{Mode, Proxy};
use common::{wait_for, Backend, Out, Store};

/// One coordinator and a place for objects of the same kind.
struct Bed {
    store: Store,
    /// Where `file://` objects live (file beds only).
    dir: Option<tempfile::TempDir>,
}

impl Bed {
    fn new(backend: Backend) -> Bed {
        let store = Store::new(backend);
        let dir = (backend == Backend::File).then(|| tempfile::tempdir().unwrap());
        Bed { store, dir }
    }

    fn server(&self) -> Option<&Server> {
        self.store.objects.as_ref().map(|(server, _)| server)
    }

    /// The key of object `name` in the bucket (object stores).
    fn key(&self, name: &str) -> String {
        let (_, prefix) = self.store.server();
        format!("{prefix}/objects/{name}")
    }

    /// The `--target` URL of object `name`.
    fn target(&self, name: &str) -> String {
        match (&self.dir, self.server()) {
            (Some(dir), _) => format!("file://{}/{name}", dir.path().display()),
            (None, Some(server)) => server.url(&self.key(name)),
            _ => unreachable!(),
        }
    }

    /// What is stored for object `name`, read without fence.
    fn stored(&self, name: &str) -> Option<Stored> {
        match &self.dir {
            Some(dir) => read_local(&dir.path().join(name)),
            None => self.server().unwrap().get(&self.key(name)),
        }
    }

    /// Stores bytes without fence (an unfenced writer).
    fn put_unfenced(&self, name: &str, body: &[u8]) {
        match &self.dir {
            Some(dir) => std::fs::write(dir.path().join(name), body).unwrap(),
            None => self.server().unwrap().put(&self.key(name), body),
        }
    }

    /// `sh -c SCRIPT` in the store's home with the environment `fence` gets, the store given
    /// as `FENCE_STORE`.
    fn shell(&self, script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(script)
            .current_dir(self.store.home.path());
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.store.home.path())
            .env("LANG", "C.UTF-8")
            .env("FENCE_STORE", &self.store.url);
        if let Some(server) = self.server() {
            cmd.envs(server.env());
        }
        cmd
    }

    fn acquire(&self, owner: &str, ttl: &str) -> i64 {
        let out = self
            .store
            .fence()
            .args(["acquire", "res", "--owner", owner, "--ttl", ttl])
            .args(["--format", "json"])
            .run()
            .expect(0);
        out.json()["token"].as_i64().unwrap()
    }

    /// `fence write res --token TOKEN --target <name> --from FILE` with `extra` flags.
    fn write(&self, name: &str, token: i64, body: &[u8], extra: &[&str]) -> Out {
        let file = self
            .store
            .home
            .path()
            .join(format!("body-{token}-{}", body.len()));
        std::fs::write(&file, body).unwrap();
        self.store
            .fence()
            .args(["write", "res", "--token", &token.to_string()])
            .args(["--target", &self.target(name), "--from"])
            .args([&file])
            .args(["--format", "json"])
            .args(extra)
            .run()
    }
}

fn error_of(out: &Out) -> (String, serde_json::Value) {
    let json = out.json();
    (json["error"].as_str().unwrap_or_default().to_owned(), json)
}

// ---------------------------------------------------------------------------------------------
// 2. The seed scenario: a paused owner wakes up after a newer owner wrote.
// ---------------------------------------------------------------------------------------------

/// A holds the lease and is stopped (SIGSTOP) before it writes; its lease expires; B acquires
/// and writes; A is continued and writes with its old token: refused, and the object still
/// holds B's bytes and token.
fn paused_owner_is_refused_after_a_newer_write(backend: Backend) {
    let bed = Bed::new(backend);
    let home = bed.store.home.path();
    std::fs::write(home.join("a.txt"), "written by A").unwrap();
    let fence = env!("CARGO_BIN_EXE_fence");
    let script = format!(
        r#"set -u
eval "$('{fence}' acquire res --owner A --ttl 1s --format env)"
echo "$FENCE_TOKEN" > token.tmp && mv token.tmp token
kill -STOP $$
'{fence}' write --target '{target}' --from a.txt --format json > out.json
echo $? > rc.tmp && mv rc.tmp rc
"#,
        target = bed.target("report")
    );
    let mut a = bed.shell(&script).stdout(Stdio::null()).spawn().unwrap();

    wait_for("A to acquire", Duration::from_secs(20), || {
        home.join("token").exists()
    });
    let a_token: i64 = std::fs::read_to_string(home.join("token"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // A stays stopped; its 1 s lease expires by the store's clock (the TTL and the store's
    // slack, with a wide margin for the bound).
    wait_for(
        "A's lease to expire",
        Duration::from_secs(1 + 30) + bed.store.expiry_slack(),
        || bed.store.lease("res").is_some_and(|(_, _, live)| !live),
    );
    let b_token = bed.acquire("B", "30s");
    assert!(b_token > a_token, "B's token {b_token} after A's {a_token}");
    bed.write("report", b_token, b"written by B", &[]).expect(0);

    // SAFETY: signalling a child we spawned.
    assert_eq!(unsafe { libc::kill(a.id() as i32, libc::SIGCONT) }, 0);
    assert!(a.wait().unwrap().success());
    let rc = std::fs::read_to_string(home.join("rc")).unwrap();
    let out: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(home.join("out.json")).unwrap()).unwrap();
    assert_eq!(rc.trim(), "4", "{out}");
    assert_eq!(out["error"], "stale_fencing_token", "{out}");
    assert_eq!(out["highest_token"], b_token, "{out}");

    let stored = bed.stored("report").expect("B's object");
    assert_eq!(stored.body, b"written by B");
    assert_eq!(stored.token(), Some(b_token));
    assert_eq!(stored.metadata.get("fence-owner").map(String::as_str), None);
    assert_eq!(
        stored.metadata.get("fence-resource").map(String::as_str),
        Some("res")
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Preconditions of the caller's own.
// ---------------------------------------------------------------------------------------------

fn version_of(out: &Out) -> String {
    out.json()["version"].as_str().unwrap().to_owned()
}

/// A stale `--if-generation-match` / `--if-match` is a conflict and changes nothing; so is
/// create-only (`--if-generation-match 0`) on an existing object.
fn own_preconditions_not_met_are_conflicts(backend: Backend) {
    let bed = Bed::new(backend);
    let token = bed.acquire("A", "30s");
    // Create-only on an absent object succeeds.
    let first = bed.write("doc", token, b"v1", &["--if-generation-match", "0"]);
    let v1 = version_of(&first.expect(0));
    let v2 = version_of(&bed.write("doc", token, b"v2", &[]).expect(0));
    assert_ne!(v1, v2);

    let stale_flag = if matches!(backend, Backend::S3 | Backend::LocalStack) {
        vec!["--if-match".to_owned(), v1.clone()]
    } else {
        vec!["--if-generation-match".to_owned(), v1.clone()]
    };
    let flags: Vec<&str> = stale_flag.iter().map(String::as_str).collect();
    let out = bed.write("doc", token, b"v3", &flags);
    assert_eq!(out.code, 6, "{out:?}");
    let (error, json) = error_of(&out);
    assert_eq!(error, "conflict", "{json}");
    assert_eq!(json["reason"], "version_mismatch", "{json}");
    assert_eq!(json["version"], v2.as_str(), "{json}");

    let out = bed.write("doc", token, b"v4", &["--if-generation-match", "0"]);
    assert_eq!(out.code, 6, "{out:?}");
    assert_eq!(error_of(&out).0, "conflict");

    let stored = bed.stored("doc").unwrap();
    assert_eq!(stored.body, b"v2", "refused writes left no trace");
    assert_eq!(stored.token(), Some(token));

    // The current version passes.
    let current = if matches!(backend, Backend::S3 | Backend::LocalStack) {
        vec!["--if-match".to_owned(), v2.clone()]
    } else {
        vec!["--if-generation-match".to_owned(), v2.clone()]
    };
    let flags: Vec<&str> = current.iter().map(String::as_str).collect();
    bed.write("doc", token, b"v5", &flags).expect(0);
    assert_eq!(bed.stored("doc").unwrap().body, b"v5");

    // inspect --target shows the version and the stored token.
    let view = bed
        .store
        .fence()
        .args([
            "inspect",
            "res",
            "--target",
            &bed.target("doc"),
            "--format",
            "json",
        ])
        .run()
        .expect(0)
        .json();
    assert_eq!(view["targets"][0]["highest_token"], token, "{view}");
    assert!(view["targets"][0]["version"].is_string(), "{view}");
}

/// An object written without fence has no token: the first fenced write takes it over,
/// conditioned on the version read; an object fenced by another resource is refused.
fn unfenced_and_foreign_objects(backend: Backend) {
    let bed = Bed::new(backend);
    let token = bed.acquire("A", "30s");
    bed.put_unfenced("plain", b"by hand");
    bed.write("plain", token, b"fenced", &[]).expect(0);
    let stored = bed.stored("plain").unwrap();
    assert_eq!(
        (stored.body.as_slice(), stored.token()),
        (&b"fenced"[..], Some(token))
    );

    let out = bed
        .store
        .fence()
        .args([
            "write",
            "other",
            "--token",
            "99",
            "--target",
            &bed.target("plain"),
        ])
        .args(["--from", "-", "--format", "json"])
        .run();
    assert_eq!(out.code, 6, "{out:?}");
    assert_eq!(bed.stored("plain").unwrap().body, b"fenced");
}

// ---------------------------------------------------------------------------------------------
// 4. Concurrent fenced writers with interleaved tokens.
// ---------------------------------------------------------------------------------------------

/// Twelve writers with tokens from the coordinator, started in shuffled order, all at once.
/// A watcher reads the object throughout: the stored token never goes down and the stored
/// bytes always name the stored token. Every write is applied, stale (4) or a lost race (6).
fn concurrent_writers_never_regress(backend: Backend) {
    let bed = Arc::new(Bed::new(backend));
    let mut tokens = Vec::new();
    for i in 0..12 {
        let owner = format!("w{i}");
        let token = bed.acquire(&owner, "30s");
        bed.store
            .fence()
            .args([
                "release",
                "res",
                "--owner",
                &owner,
                "--token",
                &token.to_string(),
            ])
            .run()
            .expect(0);
        tokens.push(token);
    }
    assert!(tokens.windows(2).all(|p| p[1] > p[0]), "{tokens:?}");
    // A fixed interleaving: high and low tokens alternate.
    let order: Vec<i64> = [7, 2, 11, 0, 5, 9, 1, 10, 3, 8, 4, 6]
        .iter()
        .map(|&i| tokens[i])
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::<(i64, Vec<u8>)>::new()));
    let watcher = {
        let (bed, stop, seen) = (bed.clone(), stop.clone(), seen.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if let Some(stored) = bed.stored("hot") {
                    seen.lock()
                        .unwrap()
                        .push((stored.token().unwrap_or(0), stored.body));
                }
            }
        })
    };
    let writers: Vec<_> = order
        .iter()
        .map(|&token| {
            let bed = bed.clone();
            thread::spawn(move || {
                let body = format!("token {token}");
                (token, bed.write("hot", token, body.as_bytes(), &[]))
            })
        })
        .collect();
    let results: Vec<(i64, Out)> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, Ordering::SeqCst);
    watcher.join().unwrap();

    for (token, out) in &results {
        assert!(
            [0, 4, 6].contains(&out.code),
            "token {token}: unexpected outcome {out:?}"
        );
    }
    let applied: Vec<i64> = results
        .iter()
        .filter(|(_, out)| out.code == 0)
        .map(|(t, _)| *t)
        .collect();
    assert!(!applied.is_empty(), "{results:?}");
    let stored = bed.stored("hot").unwrap();
    let top = stored.token().unwrap();
    assert_eq!(
        top,
        *applied.iter().max().unwrap(),
        "the highest applied token is stored"
    );
    assert_eq!(stored.body, format!("token {top}").as_bytes());
    for (token, out) in &results {
        if out.code == 4 {
            assert!(
                out.json()["highest_token"].as_i64().unwrap() > *token,
                "{out:?}"
            );
        }
    }

    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    for (token, body) in seen.iter() {
        assert_eq!(
            body,
            format!("token {token}").as_bytes(),
            "bytes of another token were stored with token {token}"
        );
    }
    for pair in seen.windows(2) {
        assert!(
            pair[1].0 >= pair[0].0,
            "the stored token went from {} to {}",
            pair[0].0,
            pair[1].0
        );
    }
    eprintln!(
        "{backend:?}: {} applied, {} stale, {} lost races, {} reads by the watcher",
        applied.len(),
        results.iter().filter(|(_, o)| o.code == 4).count(),
        results.iter().filter(|(_, o)| o.code == 6).count(),
        seen.len()
    );
}

/// A large write on a terminal shows a progress bar on stderr (bytes sent of the total; it
/// stays, showing every byte counted as sent), and
/// the object holds exactly the bytes; without a terminal, or with `-q` / `--format json`,
/// there is no bar. The terminal is a real pty (`script`).
fn large_writes_show_progress_on_a_terminal(backend: Backend) {
    let bed = Bed::new(backend);
    let token = bed.acquire("uploader", "5m");
    let body: Vec<u8> = (0..6_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let file = bed.store.home.path().join("large");
    std::fs::write(&file, &body).unwrap();
    let fence = env!("CARGO_BIN_EXE_fence");
    let on_tty = |extra: &str| {
        let line = format!(
            "stty cols 120 rows 40; TERM=xterm exec {fence} write res --token {token} --target '{}' --from '{}' {extra}",
            bed.target("large"),
            file.display()
        );
        let out = bed
            .shell("script -qfec \"$0\" /dev/null < /dev/null")
            .arg(&line)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let seen = on_tty("");
    assert!(
        seen.contains(&format!("writing {}", bed.target("large")))
            && seen.contains("] 5.72 MiB/5.72 MiB"),
        "no progress bar on the terminal: {seen:?}"
    );
    assert!(seen.contains("wrote"), "{seen:?}");
    let stored = bed.stored("large").expect("the object was written");
    assert_eq!(stored.token(), Some(token));
    assert!(stored.body == body, "the stored bytes differ from the file");
    for quiet in ["-q", "--format json"] {
        let seen = on_tty(quiet);
        assert!(!seen.contains("MiB"), "{quiet}: {seen:?}");
    }
    let out = bed.write("large", token, &body, &[]).expect(0);
    assert!(
        !out.stderr.contains("MiB"),
        "a bar without a terminal: {out:?}"
    );
}

/// Object names are data, not answers: an object whose name quotes a store's error code
/// (`NoSuchBucket`, `ExpiredToken`) is written like any other, the first time and the next.
fn names_that_quote_error_codes_are_just_names(backend: Backend) {
    let bed = Bed::new(backend);
    let token = bed.acquire("A", "30s");
    for name in ["NoSuchBucket", "ExpiredToken-expired"] {
        bed.write(name, token, b"first", &[]).expect(0);
        bed.write(name, token, b"second", &[]).expect(0);
        let stored = bed.stored(name).expect("the object");
        assert_eq!(stored.body, b"second");
        assert_eq!(stored.token(), Some(token));
    }
}

/// A `file://` write killed between writing its bytes and committing them leaves its
/// temporary files behind; the next write of that object replaces them, so nothing piles up,
/// and a link planted at a temporary name is never followed.
#[test]
fn a_crashed_file_write_leaves_nothing_behind_after_the_next_write() {
    let bed = Bed::new(Backend::File);
    let dir = bed.dir.as_ref().unwrap().path().to_owned();
    let token = bed.acquire("A", "30s");
    bed.write("obj", token, b"first", &[]).expect(0);
    // What a write killed before its renames leaves: the bytes and the next sidecar's text.
    std::fs::write(dir.join(".obj.fence.tmp"), b"half-written bytes").unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, b"not fence's").unwrap();
    std::os::unix::fs::symlink(&victim, dir.join(".obj.fence.next.tmp")).unwrap();
    bed.write("obj", token, b"second", &[]).expect(0);
    assert_eq!(bed.stored("obj").unwrap().body, b"second");
    assert_eq!(std::fs::read(&victim).unwrap(), b"not fence's");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [".obj.fence.json", ".obj.fence.lock", "obj", "victim"],
        "only the object, its sidecar and lock remain"
    );
}

macro_rules! per_object_store {
    ($($name:ident),* $(,)?) => {
        mod s3 { $( #[test] fn $name() { super::$name(crate::common::Backend::S3) } )* }
        mod localstack { $( #[test] fn $name() { super::$name(crate::common::Backend::LocalStack) } )* }
        mod gcs { $( #[test] fn $name() { super::$name(crate::common::Backend::Gcs) } )* }
        mod file { $( #[test] fn $name() { super::$name(crate::common::Backend::File) } )* }
    };
}

per_object_store!(
    paused_owner_is_refused_after_a_newer_write,
    own_preconditions_not_met_are_conflicts,
    unfenced_and_foreign_objects,
    concurrent_writers_never_regress,
    large_writes_show_progress_on_a_terminal,
    names_that_quote_error_codes_are_just_names,
);

// ---------------------------------------------------------------------------------------------
// A newer writer wins the race between fence's read and its conditional put.
// ---------------------------------------------------------------------------------------------

/// A's requests go through a proxy that holds A's put at a gate, after A's read has reached
/// the server; B then writes with a newer token, and the gate opens: A's put carries the
/// version A read, the store refuses it, fence reads once more and reports the newer token
/// (4). B's bytes stay. (A gate, not a delay: no timing for B to outrun on a loaded machine.)
fn lost_race_to_a_newer_writer_is_stale(service: Service) {
    let backend = match service {
        Service::S3 => Backend::S3,
        Service::Gcs => Backend::Gcs,
    };
    let bed = Bed::new(backend);
    let server = bed.server().unwrap().clone();
    let a_token = bed.acquire("A", "30s");
    bed.write("raced", a_token, b"first", &[]).expect(0);
    bed.store
        .fence()
        .args([
            "release",
            "res",
            "--owner",
            "A",
            "--token",
            &a_token.to_string(),
        ])
        .run()
        .expect(0);
    let upstream = server
        .endpoint
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let put = match service {
        Service::S3 => &b"PUT "[..],
        Service::Gcs => &b"POST "[..],
    };
    let gate = Proxy::start(upstream, Mode::HoldWhenClientSends(put.to_vec()));
    let endpoint = format!("http://{}", gate.addr());
    let env_name = match service {
        Service::S3 => "AWS_ENDPOINT_URL",
        Service::Gcs => "FENCE_GCS_ENDPOINT",
    };
    let file = bed.store.home.path().join("a.txt");
    std::fs::write(&file, "from A").unwrap();
    let a = {
        let mut fence = bed.store.fence();
        fence.cmd.env(env_name, &endpoint);
        let target = bed.target("raced");
        thread::spawn(move || {
            fence
                .args([
                    "write",
                    "res",
                    "--token",
                    &a_token.to_string(),
                    "--target",
                    &target,
                ])
                .args([std::ffi::OsStr::new("--from"), file.as_os_str()])
                .args(["--format", "json"])
                .run()
        })
    };
    let read = match service {
        Service::S3 => &b"HEAD "[..],
        Service::Gcs => &b"GET "[..],
    };
    wait_for("A's put at the gate", Duration::from_secs(30), || {
        gate.held() == 1
    });
    assert!(
        gate.client_sent_at(read).is_some(),
        "the premise: A's read reached the server before its put"
    );
    let b_token = bed.acquire("B", "30s");
    bed.write("raced", b_token, b"from B", &[]).expect(0);
    let b_done = Instant::now();
    gate.open();
    let out = a.join().unwrap();
    let a_put = gate.client_sent_at(put).expect("A sent its put");
    assert!(
        a_put > b_done,
        "the premise: A's put reached the server after B's write"
    );
    assert_eq!(out.code, 4, "{out:?}");
    assert_eq!(out.json()["highest_token"], b_token);
    let stored = bed.stored("raced").unwrap();
    assert_eq!(
        (stored.body.as_slice(), stored.token()),
        (&b"from B"[..], Some(b_token))
    );
}

#[test]
fn s3_lost_race_to_a_newer_writer_is_stale() {
    lost_race_to_a_newer_writer_is_stale(Service::S3);
}

#[test]
fn gcs_lost_race_to_a_newer_writer_is_stale() {
    lost_race_to_a_newer_writer_is_stale(Service::Gcs);
}

// ---------------------------------------------------------------------------------------------
// 5. Loopback only.
// ---------------------------------------------------------------------------------------------

/// tests/run re-executes itself in a network namespace of its own (`FENCE_TEST_NETNS=1`):
/// then loopback is the only interface, and anything else is unreachable, whatever a test or
/// fence is configured with.
#[test]
fn the_suite_runs_where_only_loopback_exists() {
    match std::env::var("FENCE_TEST_NETNS").as_deref() {
        Ok("1") => {}
        Ok("0") => {
            eprintln!("tests/run could not make a network namespace here: configuration only");
            return;
        }
        other => panic!("FENCE_TEST_NETNS is {other:?}: run the suite through tests/run"),
    }
    // /proc/net/dev lists the interfaces of this process's network namespace.
    let dev = std::fs::read_to_string("/proc/net/dev").unwrap();
    let interfaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|line| line.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(interfaces, ["lo"], "{dev}");
    for outside in ["169.254.169.254:80", "8.8.8.8:443", "142.250.74.27:443"] {
        let err = std::net::TcpStream::connect_timeout(
            &outside.parse().unwrap(),
            std::time::Duration::from_secs(2),
        )
        .expect_err(outside);
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::NetworkUnreachable,
            "{outside}: {err}"
        );
    }
    // The servers the tests use answer here.
    for service in [Service::S3, Service::Gcs] {
        let server = Server::new(service);
        let addr = server.endpoint.trim_start_matches("http://");
        std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    }
}

/// Every object store the tests use is on loopback, and fence gets fixed test credentials, so
/// the S3 client never looks for instance credentials (169.254.169.254) and the GCS client
/// never resolves storage.googleapis.com.
#[test]
fn the_tests_reach_nothing_but_loopback() {
    for service in [Service::S3, Service::Gcs] {
        let server = Server::new(service);
        assert!(server.endpoint.starts_with("http://127.0.0.1:"));
        let env = server.env();
        let names: Vec<&str> = env.iter().map(|(k, _)| *k).collect();
        match service {
            Service::S3 => assert!(
                names.contains(&"AWS_ACCESS_KEY_ID") && names.contains(&"AWS_ENDPOINT_URL"),
                "{names:?}"
            ),
            Service::Gcs => assert_eq!(names, ["FENCE_GCS_ENDPOINT"]),
        }
    }
    for name in [
        "AWS_PROFILE",
        "AWS_CONFIG_FILE",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ] {
        assert!(
            std::env::var_os(name).is_none(),
            "{name} leaked into the tests"
        );
    }
    // A fence without an endpoint must not be what a test runs: `Store::fence` sets one.
    let store = Store::new(Backend::S3);
    let fence = store.fence();
    let envs: Vec<_> = fence.cmd.get_envs().collect();
    assert!(envs.iter().any(|(k, v)| *k == "AWS_ENDPOINT_URL"
        && v.is_some_and(|v| v.to_str().unwrap().starts_with("http://127.0.0.1:"))));
}

// ---------------------------------------------------------------------------------------------
// GCS service-account keys.
// ---------------------------------------------------------------------------------------------

/// An OAuth token endpoint on loopback for service-account keys: it checks the JWT's RS256
/// signature against `public_key` (with openssl) and its claims, and answers with a fresh
/// access token, or with `invalid_grant`. Returns its address and the tokens it issued.
fn token_endpoint(
    public_key: std::path::PathBuf,
    email: &'static str,
) -> (String, Arc<Mutex<Vec<String>>>) {
    use base64::Engine;
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let uri = format!("http://{}/token", listener.local_addr().unwrap());
    let issued = Arc::new(Mutex::new(Vec::new()));
    let (audience, tokens) = (uri.clone(), issued.clone());
    thread::spawn(move || {
        for (n, stream) in listener.incoming().enumerate() {
            let mut stream = stream.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 8192];
            let body = loop {
                let got = stream.read(&mut buf).unwrap();
                assert!(got > 0, "the token request ended early");
                request.extend_from_slice(&buf[..got]);
                let text = String::from_utf8_lossy(&request).into_owned();
                if let Some(end) = text.find("\r\n\r\n") {
                    let length: usize = text[..end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    if request.len() >= end + 4 + length {
                        break text[end + 4..end + 4 + length].to_owned();
                    }
                }
            };
            let assertion = body
                .split('&')
                .find_map(|kv| kv.strip_prefix("assertion="))
                .unwrap_or_default()
                .to_owned();
            let parts: Vec<&str> = assertion.split('.').collect();
            let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
            let verified = parts.len() == 3 && {
                let dir = tempfile::tempdir().unwrap();
                std::fs::write(dir.path().join("msg"), format!("{}.{}", parts[0], parts[1]))
                    .unwrap();
                std::fs::write(dir.path().join("sig"), b64.decode(parts[2]).unwrap()).unwrap();
                let out = Command::new("openssl")
                    .args(["dgst", "-sha256", "-verify"])
                    .arg(&public_key)
                    .arg("-signature")
                    .arg(dir.path().join("sig"))
                    .arg(dir.path().join("msg"))
                    .output()
                    .unwrap();
                let claims: serde_json::Value =
                    serde_json::from_slice(&b64.decode(parts[1]).unwrap()).unwrap();
                out.status.success()
                    && body.contains(
                        "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer",
                    )
                    && claims["iss"] == email
                    && claims["aud"] == audience.as_str()
                    && claims["scope"]
                        .as_str()
                        .is_some_and(|s| s.contains("devstorage"))
                    && claims["exp"].as_u64() > claims["iat"].as_u64()
            };
            let (status, answer) = if verified {
                let token = format!("ya29.fence-test-{n}-{}", std::process::id());
                tokens.lock().unwrap().push(token.clone());
                (
                    "200 OK",
                    serde_json::json!({"access_token": token, "expires_in": 3600, "token_type": "Bearer"}),
                )
            } else {
                (
                    "400 Bad Request",
                    serde_json::json!({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}),
                )
            };
            let answer = answer.to_string();
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    (uri, issued)
}

/// `GOOGLE_APPLICATION_CREDENTIALS` names a service-account key: fence signs a JWT with it,
/// exchanges it once for an access token at the key's `token_uri`, and sends that token with
/// its GCS requests (seen on the wire by a proxy in front of fake-gcs-server). A key the
/// endpoint refuses, and a key file that is not one, are usage errors naming the file, with
/// no secret in the output, and the object keeps its bytes.
#[test]
fn gcs_service_account_keys_are_exchanged_for_tokens() {
    let bed = Bed::new(Backend::Gcs);
    let home = bed.store.home.path();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(home)
            .output()
            .unwrap();
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    let rsa = [
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
    ];
    for pem in ["key.pem", "other.pem"] {
        openssl(&[&rsa[..], &[pem]].concat());
    }
    openssl(&["pkey", "-in", "key.pem", "-pubout", "-out", "pub.pem"]);
    let email = "fence-test@fence-test.iam.gserviceaccount.com";
    let (token_uri, issued) = token_endpoint(home.join("pub.pem"), email);
    let key_file = |name: &str, pem: &str| {
        let path = home.join(name);
        let key = serde_json::json!({
            "type": "service_account",
            "project_id": "fence-test",
            "private_key_id": "k1",
            "private_key": std::fs::read_to_string(home.join(pem)).unwrap(),
            "client_email": email,
            "token_uri": token_uri,
        });
        std::fs::write(&path, key.to_string()).unwrap();
        path
    };
    let good = key_file("good.json", "key.pem");
    let unknown = key_file("unknown.json", "other.pem");
    let not_a_key = home.join("not-a-key.json");
    std::fs::write(&not_a_key, r#"{"type": "authorized_user"}"#).unwrap();

    let server = bed.server().unwrap().clone();
    let proxy = Proxy::start(
        server
            .endpoint
            .trim_start_matches("http://")
            .parse()
            .unwrap(),
        Mode::Pass,
    );
    let token = bed.acquire("sa", "5m");
    std::fs::write(home.join("body"), "written with a service account").unwrap();
    let write = |credentials: &std::path::Path| {
        let mut fence = bed.store.fence();
        fence
            .cmd
            .env("FENCE_GCS_ENDPOINT", format!("http://{}", proxy.addr()))
            .env("GOOGLE_APPLICATION_CREDENTIALS", credentials);
        fence
            .args([
                "write",
                "res",
                "--token",
                &token.to_string(),
                "--target",
                &bed.target("sa"),
            ])
            .args([
                std::ffi::OsStr::new("--from"),
                home.join("body").as_os_str(),
            ])
            .args(["--format", "json"])
            .run()
    };
    write(&good).expect(0);
    let tokens = issued.lock().unwrap().clone();
    assert_eq!(tokens.len(), 1, "one token per process: {tokens:?}");
    let bearer = format!("Bearer {}", tokens[0]);
    let requests: Vec<_> = proxy
        .forwarded()
        .into_iter()
        .filter(|f| f.bytes.starts_with(b"GET ") || f.bytes.starts_with(b"POST "))
        .collect();
    assert!(requests.len() >= 2, "a read and a write: {requests:?}");
    for request in &requests {
        let text = String::from_utf8_lossy(&request.bytes);
        assert!(
            text.contains(&bearer),
            "a request without the token: {text}"
        );
    }
    let stored = bed.stored("sa").unwrap();
    assert_eq!(
        (stored.body.as_slice(), stored.token()),
        (&b"written with a service account"[..], Some(token))
    );

    // A command that talks to GCS twice (the `gs://` coordinator and a `gs://` target)
    // exchanges the key once.
    let before = proxy.forwarded().len();
    let mut inspect = bed.store.fence();
    inspect
        .cmd
        .env("FENCE_GCS_ENDPOINT", format!("http://{}", proxy.addr()))
        .env("GOOGLE_APPLICATION_CREDENTIALS", &good);
    let view = inspect
        .args(["inspect", "res", "--target", &bed.target("sa")])
        .args(["--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(view["targets"][0]["highest_token"], token, "{view}");
    assert_eq!(view["resources"][0]["state"], "held", "{view}");
    let tokens = issued.lock().unwrap().clone();
    assert_eq!(tokens.len(), 2, "one token per process: {tokens:?}");
    let bearer = format!("Bearer {}", tokens[1]);
    let requests: Vec<_> = proxy.forwarded()[before..]
        .iter()
        .filter(|f| f.bytes.starts_with(b"GET ") || f.bytes.starts_with(b"POST "))
        .map(|f| String::from_utf8_lossy(&f.bytes).into_owned())
        .collect();
    assert!(
        requests.len() >= 2,
        "the lease and the target: {requests:?}"
    );
    for text in &requests {
        assert!(
            text.contains(&bearer),
            "a request without the token: {text}"
        );
    }

    std::fs::write(home.join("body"), "must not land").unwrap();
    for (file, why) in [(&unknown, "refused it"), (&not_a_key, "service_account")] {
        let out = write(file);
        assert_eq!(out.code, 2, "{out:?}");
        let message = out.json()["message"].as_str().unwrap().to_owned();
        assert!(
            message.contains(&file.display().to_string()) && message.contains(why),
            "{message}"
        );
        assert!(!format!("{out:?}").contains("PRIVATE KEY"), "{out:?}");
    }
    assert_eq!(issued.lock().unwrap().len(), 2);
    assert_eq!(
        bed.stored("sa").unwrap().body,
        b"written with a service account"
    );
}
