//! Write ids on object targets (issue 20): `fence write --target OBJECT --from FILE --id KEY` on
//! S3 (moto), GCS (fake-gcs-server) and `file://` objects. Asserted on what the server (or the
//! directory) stores: bytes, version, `fence-token` / `fence-id` / `fence-ids` metadata.
//! - the connection cut after the PUT was sent: exit 8; the same command again exits 0 and the
//!   object holds the effect once, in both orders (the put landed → replayed, version
//!   unchanged; it did not → written now);
//! - A then B (newer token) with one id: B replays the same bytes, and other bytes under it are
//!   a conflict (`id_reused`, exit 6); B with a new id writes; A with a new id
//!   after B is stale; `inspect --id` shows the entry, and says so when an id is absent;
//! - two writers with one id at once (S3, GCS): the loser of the put race answers "replayed";
//! - a crash of a `file://` write, recreated on disk before and after its commit, also as
//!   seen by a reader who may not write the directory (and so settles nothing);
//! - the ledger keeps the last 8 ids across writes with and without ids;
//! - ids fence cannot keep are refused before anything is sent (exit 2).

use crate::common;

use std::time::Duration;

use common::objects::{read_local, Service, Stored};
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

    /// On the coordinator and object store of `service`.
    fn on(service: Service) -> Bed {
        Bed::new(match service {
            Service::S3 => Backend::S3,
            Service::Gcs => Backend::Gcs,
        })
    }

    /// The object service's address, for a proxy in front of it.
    fn upstream(&self) -> std::net::SocketAddr {
        let endpoint = &self.store.server().0.endpoint;
        endpoint.trim_start_matches("http://").parse().unwrap()
    }

    fn key(&self, name: &str) -> String {
        let (_, prefix) = self.store.server();
        format!("{prefix}/objects/{name}")
    }

    fn target(&self, name: &str) -> String {
        match &self.dir {
            Some(dir) => format!("file://{}/{name}", dir.path().display()),
            None => self.store.server().0.url(&self.key(name)),
        }
    }

    fn stored(&self, name: &str) -> Option<Stored> {
        match &self.dir {
            Some(dir) => read_local(&dir.path().join(name)),
            None => self.store.server().0.get(&self.key(name)),
        }
    }

    fn acquire(&self, owner: &str) -> i64 {
        self.store
            .fence()
            .args(["acquire", "res", "--owner", owner, "--ttl", "1m"])
            .args(["--format", "json"])
            .run()
            .expect(0)
            .json()["token"]
            .as_i64()
            .unwrap()
    }

    fn release(&self, owner: &str, token: i64) {
        self.store
            .fence()
            .args([
                "release",
                "res",
                "--owner",
                owner,
                "--token",
                &token.to_string(),
            ])
            .run()
            .expect(0);
    }

    /// `fence write res --token T --target <name> --from FILE --id ID --owner O`, through
    /// `endpoint` when given (S3 and GCS).
    fn write_via(
        &self,
        endpoint: Option<&str>,
        name: &str,
        token: i64,
        owner: &str,
        id: &str,
        body: &[u8],
    ) -> Out {
        self.write_command(endpoint, name, token, owner, id, body)
            .run()
    }

    /// The command [`Bed::write_via`] runs.
    fn write_command(
        &self,
        endpoint: Option<&str>,
        name: &str,
        token: i64,
        owner: &str,
        id: &str,
        body: &[u8],
    ) -> common::Fence {
        let file = self.store.home.path().join(format!("body-{id}-{token}"));
        std::fs::write(&file, body).unwrap();
        let mut fence = self.store.fence();
        if let Some(endpoint) = endpoint {
            let name = match self.store.server().0.service {
                Service::S3 => "AWS_ENDPOINT_URL",
                Service::Gcs => "FENCE_GCS_ENDPOINT",
            };
            fence = fence.env(name, endpoint);
        }
        fence
            .args(["write", "res", "--token", &token.to_string()])
            .args(["--target", &self.target(name), "--owner", owner, "--id", id])
            .args([std::ffi::OsStr::new("--from"), file.as_os_str()])
            .args(["--format", "json"])
    }

    fn write(&self, name: &str, token: i64, owner: &str, id: &str, body: &[u8]) -> Out {
        self.write_via(None, name, token, owner, id, body)
    }

    fn inspect_id(&self, name: &str, id: &str) -> Out {
        self.store
            .fence()
            .args(["inspect", "res", "--target", &self.target(name), "--id", id])
            .args(["--format", "json"])
            .run()
    }
}

/// The ids the stored object's ledger holds, newest first.
fn ledger_ids(stored: &Stored) -> Vec<String> {
    let mut ids: Vec<String> = stored
        .metadata
        .get("fence-id")
        .cloned()
        .into_iter()
        .collect();
    if let Some(older) = stored.metadata.get("fence-ids") {
        ids.extend(
            older
                .split(';')
                .map(|e| e.split(',').next().unwrap().to_owned()),
        );
    }
    ids
}

macro_rules! per_object_store {
    ($($name:ident),* $(,)?) => {
        mod s3 { $( #[test] fn $name() { super::$name(crate::common::Backend::S3) } )* }
        mod gcs { $( #[test] fn $name() { super::$name(crate::common::Backend::Gcs) } )* }
        mod file { $( #[test] fn $name() { super::$name(crate::common::Backend::File) } )* }
    };
}

per_object_store!(
    an_id_is_applied_once_across_owners_and_tokens,
    the_ledger_keeps_the_last_ids
);

fn an_id_is_applied_once_across_owners_and_tokens(backend: Backend) {
    let bed = Bed::new(backend);
    let a = bed.acquire("A");
    let first = bed
        .write("obj", a, "A", "daily", b"from A")
        .expect(0)
        .json();
    assert_eq!(first["replayed"], false, "{first}");
    let version = first["version"].clone();
    bed.release("A", a);
    let b = bed.acquire("B");
    assert!(b > a);

    // B with the same id and other bytes: a conflict (the id was used for another write);
    // with the same bytes: a replay, naming A's write. Nothing is written either way.
    let reused = bed.write("obj", b, "B", "daily", b"from B");
    assert_eq!(reused.code, 6, "{reused:?}");
    assert_eq!(reused.json()["reason"], "id_reused", "{reused:?}");
    assert_eq!(reused.json()["applied_token"], a, "{reused:?}");
    let replay = bed
        .write("obj", b, "B", "daily", b"from A")
        .expect(0)
        .json();
    assert_eq!(replay["replayed"], true, "{replay}");
    assert_eq!(replay["applied"]["token"], a);
    assert_eq!(replay["applied"]["owner"], "A");
    assert_eq!(replay["applied"]["version"], version);
    let stored = bed.stored("obj").unwrap();
    assert_eq!(
        (stored.body.as_slice(), stored.token()),
        (&b"from A"[..], Some(a))
    );

    // B with a new id writes; the old id survives the write, in the ledger.
    let written = bed
        .write("obj", b, "B", "other", b"from B")
        .expect(0)
        .json();
    assert_eq!(written["replayed"], false, "{written}");
    let stored = bed.stored("obj").unwrap();
    assert_eq!(
        (stored.body.as_slice(), stored.token()),
        (&b"from B"[..], Some(b))
    );
    assert_eq!(ledger_ids(&stored), ["other", "daily"]);

    // A, stale now: a new id is refused; the old one is still "applied", by A.
    let late = bed.write("obj", a, "A", "late", b"late A");
    assert_eq!(late.code, 4, "{late:?}");
    assert_eq!(late.json()["highest_token"], b);
    let old = bed
        .write("obj", a, "A", "daily", b"from A")
        .expect(0)
        .json();
    assert_eq!(old["replayed"], true, "{old}");
    assert_eq!(old["applied"]["token"], a);
    // An older entry keeps its version and token, not its owner (see the ledger's bound).
    assert_eq!(old["applied"]["version"], version);
    let stored = bed.stored("obj").unwrap();
    assert_eq!(
        (stored.body.as_slice(), stored.token()),
        (&b"from B"[..], Some(b))
    );

    // inspect --id: the entry, and a clear "not recorded" for an id never written.
    let seen = bed.inspect_id("obj", "daily").expect(0).json();
    assert_eq!(seen["applied"], true, "{seen}");
    assert_eq!(seen["entry"]["token"], a);
    assert_eq!(seen["entry"]["version"], version);
    let current = bed.inspect_id("obj", "other").expect(0).json();
    assert_eq!(current["entry"]["owner"], "B", "{current}");
    let absent = bed.inspect_id("obj", "never").expect(0);
    assert_eq!(absent.json()["applied"], false, "{absent:?}");
    let human = bed
        .store
        .fence()
        .args([
            "inspect",
            "res",
            "--target",
            &bed.target("obj"),
            "--id",
            "never",
        ])
        .run()
        .expect(0);
    assert!(human.stdout.contains("not in the ledger"), "{human:?}");
}

/// Nine writes with ids and one without: the object remembers the last 8 ids; the oldest is
/// forgotten and writes again.
fn the_ledger_keeps_the_last_ids(backend: Backend) {
    let bed = Bed::new(backend);
    let token = bed.acquire("A");
    for n in 0..9 {
        let id = format!("id-{n}");
        bed.write("obj", token, "A", &id, id.as_bytes()).expect(0);
    }
    let file = bed.store.home.path().join("plain");
    std::fs::write(&file, "no id").unwrap();
    bed.store
        .fence()
        .args(["write", "res", "--token", &token.to_string()])
        .args(["--target", &bed.target("obj")])
        .args([std::ffi::OsStr::new("--from"), file.as_os_str()])
        .run()
        .expect(0);
    let stored = bed.stored("obj").unwrap();
    assert_eq!(stored.metadata.get("fence-id"), None);
    let ids = ledger_ids(&stored);
    assert_eq!(ids.len(), 7, "{ids:?}");
    assert_eq!(ids[0], "id-8");
    let replay = bed
        .write("obj", token, "A", "id-2", b"id-2")
        .expect(0)
        .json();
    assert_eq!(replay["replayed"], true, "{replay}");
    // An older entry keeps its digest too: other bytes under id-2 are refused.
    let reused = bed.write("obj", token, "A", "id-2", b"again");
    assert_eq!(reused.code, 6, "{reused:?}");
    assert_eq!(reused.json()["reason"], "id_reused", "{reused:?}");
    let forgotten = bed
        .write("obj", token, "A", "id-1", b"again")
        .expect(0)
        .json();
    assert_eq!(forgotten["replayed"], false, "{forgotten}");
    assert_eq!(bed.stored("obj").unwrap().body, b"again");
}

/// The connection is cut right after the put's `pattern` reached the server: exit 8. Returns
/// the write's output.
fn cut_write(bed: &Bed, pattern: &[u8], token: i64, id: &str, body: &[u8]) -> Out {
    let upstream = bed.upstream();
    let cut = Proxy::start_disarmed(upstream, Mode::CutWhenClientSends(pattern.to_vec()));
    let endpoint = format!("http://{}", cut.addr());
    // The prefix is proven through this endpoint first (a proof is bound to the endpoint it
    // was made through), then the cut is armed.
    bed.write_via(
        Some(&endpoint),
        "obj",
        token,
        "A",
        &format!("proof-{id}"),
        b"proof",
    )
    .expect(0);
    cut.arm();
    let out = bed.write_via(Some(&endpoint), "obj", token, "A", id, body);
    assert_eq!(cut.cuts(), 1, "the proxy never saw the put: {out:?}");
    out
}

/// Exit 8 and a rerun, in both orders: the put reached the server whole (it lands), or was
/// cut in the middle of its body (it does not).
fn rerunning_after_outcome_unknown_gives_a_definite_answer(service: Service) {
    let bed = Bed::on(service);
    let token = bed.acquire("A");
    // The object exists and is fenced: the cut write is the common path (a read, a put).
    bed.write("obj", token, "A", "warm-up", b"first").expect(0);

    // 1. Landed: the cut follows the last bytes of the request.
    let mut body = vec![b'l'; 100 * 1024];
    body.extend_from_slice(b"LANDED-END");
    let last = match service {
        Service::S3 => &b"LANDED-END"[..],
        // The multipart envelope ends with the closing boundary, `--<boundary>--\r\n`.
        Service::Gcs => &b"--\r\n"[..],
    };
    let out = cut_write(&bed, last, token, "k-landed", &body);
    assert_eq!(out.code, 8, "{out:?}");
    wait_for("the cut put to land", Duration::from_secs(20), || {
        bed.stored("obj")
            .is_some_and(|s| s.metadata.get("fence-id").map(String::as_str) == Some("k-landed"))
    });
    let landed = bed.inspect_id("obj", "k-landed").expect(0).json();
    let version = landed["entry"]["version"].clone();
    let again = bed
        .write("obj", token, "A", "k-landed", &body)
        .expect(0)
        .json();
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(
        again["applied"]["version"], version,
        "nothing written again"
    );
    assert_eq!(bed.stored("obj").unwrap().body, body);

    // 2. Not landed: the cut comes with the first part of a body several chunks long, so
    //    the server never gets the rest.
    let mut body = b"NOT-LANDED-START".to_vec();
    body.extend(vec![b'n'; 512 * 1024]);
    let out = cut_write(&bed, b"NOT-LANDED-START", token, "k-lost", &body);
    assert_eq!(out.code, 8, "{out:?}");
    let stored = bed.stored("obj").unwrap();
    assert_eq!(
        stored.metadata.get("fence-id").map(String::as_str),
        Some("proof-k-lost"),
        "the cut write did not land (the last is the warm-up write through the proxy)"
    );
    let again = bed
        .write("obj", token, "A", "k-lost", &body)
        .expect(0)
        .json();
    assert_eq!(again["replayed"], false, "{again}");
    let third = bed
        .write("obj", token, "A", "k-lost", &body)
        .expect(0)
        .json();
    assert_eq!(third["replayed"], true, "{third}");
    assert_eq!(
        third["applied"]["version"], again["version"],
        "written once"
    );
    let stored = bed.stored("obj").unwrap();
    assert_eq!(stored.body, body);
    assert_eq!(
        ledger_ids(&stored),
        [
            "k-lost",
            "proof-k-lost",
            "k-landed",
            "proof-k-landed",
            "warm-up"
        ]
    );
}

#[test]
fn s3_rerunning_after_outcome_unknown_gives_a_definite_answer() {
    rerunning_after_outcome_unknown_gives_a_definite_answer(Service::S3);
}

#[test]
fn gcs_rerunning_after_outcome_unknown_gives_a_definite_answer() {
    rerunning_after_outcome_unknown_gives_a_definite_answer(Service::Gcs);
}

#[test]
fn ids_fence_cannot_keep_are_refused_before_anything_is_sent() {
    let bed = Bed::new(Backend::File);
    for id in [
        "",
        "has space",
        "comma,inside",
        "semi;colon",
        &"x".repeat(65),
        "é",
    ] {
        let out = bed.write("obj", 1, "A", id, b"bytes");
        assert_eq!(out.code, 2, "`{id}`: {out:?}");
        assert!(
            out.json()["message"].as_str().unwrap().contains("write id"),
            "{out:?}"
        );
    }
    assert!(bed.stored("obj").is_none());
    assert!(!bed.dir.as_ref().unwrap().path().join("obj").exists());
}

/// A `fence write` to a `file://` object that crashed between its steps, recreated on disk
/// (the bytes in a temporary file, the next sidecar naming their inode): before the commit
/// (the rename of the bytes) the id is not applied and a rerun writes; after it, the id is
/// applied and the metadata catches up with the bytes at the next access.
#[test]
fn file_objects_settle_an_interrupted_write() {
    use std::os::unix::fs::MetadataExt;
    let bed = Bed::new(Backend::File);
    let token = bed.acquire("A");
    bed.write("obj", token, "A", "first", b"one").expect(0);
    let dir = bed.dir.as_ref().unwrap().path().to_owned();
    let sidecar = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.join(".obj.fence.json")).unwrap()).unwrap()
    };
    let next = dir.join(".obj.fence.next.json");
    let crash_with = |bytes: &[u8], id: &str| {
        let tmp = dir.join(format!(".fence-tmp-crashed-{id}"));
        std::fs::write(&tmp, bytes).unwrap();
        let mut pending = sidecar();
        pending["generation"] = (pending["generation"].as_u64().unwrap() + 1).into();
        pending["metadata"]["fence-id"] = id.into();
        pending["metadata"]["fence-id-digest"] = common::write_digest(bytes).into();
        pending["inode"] = std::fs::metadata(&tmp).unwrap().ino().into();
        std::fs::write(&next, pending.to_string()).unwrap();
        tmp
    };

    // 1. Before the commit: the bytes never reached the object.
    crash_with(b"two", "second");
    let out = bed
        .write("obj", token, "A", "second", b"two")
        .expect(0)
        .json();
    assert_eq!(out["replayed"], false, "{out}");
    assert!(!next.exists());
    let stored = bed.stored("obj").unwrap();
    assert_eq!(stored.body, b"two");
    assert_eq!(sidecar()["generation"], 2);
    assert_eq!(ledger_ids(&stored), ["second", "first"]);

    // 2. After the commit: the bytes are in place, the sidecar was not renamed yet.
    let tmp = crash_with(b"three", "third");
    std::fs::rename(&tmp, dir.join("obj")).unwrap();
    let seen = bed.inspect_id("obj", "third").expect(0).json();
    assert_eq!(seen["applied"], true, "{seen}");
    assert_eq!(seen["entry"]["version"], "3");
    assert!(!next.exists());
    let stored = bed.stored("obj").unwrap();
    assert_eq!(stored.body, b"three");
    assert_eq!(stored.metadata["fence-id"], "third");
    let again = bed
        .write("obj", token, "A", "third", b"three")
        .expect(0)
        .json();
    assert_eq!(again["replayed"], true, "{again}");
}

/// A reader who may read the directory but not write it (run as `nobody`, so root only) looks
/// an id up under a shared lock and settles nothing: a crashed write whose bytes landed counts
/// as applied, one whose bytes did not as not applied, and the next sidecar stays for the
/// next writer to settle.
#[test]
fn a_reader_without_write_access_judges_an_interrupted_write_without_settling_it() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let bed = Bed::new(Backend::File);
    let token = bed.acquire("A");
    bed.write("obj", token, "A", "first", b"one").expect(0);
    let dir = bed.dir.as_ref().unwrap().path().to_owned();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = tempfile::tempdir().unwrap();
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let fence = bin.path().join("fence");
    std::fs::copy(env!("CARGO_BIN_EXE_fence"), &fence).unwrap();
    let next = dir.join(".obj.fence.next.json");
    // A crashed write of id `second`: its next sidecar names the bytes in `tmp`.
    let tmp = dir.join(".obj.fence.tmp");
    std::fs::write(&tmp, b"two").unwrap();
    let mut pending: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(".obj.fence.json")).unwrap()).unwrap();
    pending["generation"] = 2.into();
    pending["metadata"]["fence-id"] = "second".into();
    pending["inode"] = std::fs::metadata(&tmp).unwrap().ino().into();
    std::fs::write(&next, pending.to_string()).unwrap();
    let lookup = |id: &str| -> serde_json::Value {
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&fence)
            .args(["inspect", "res", "--target", &bed.target("obj"), "--id", id])
            .args(["--format", "json"])
            .env_clear()
            .env("HOME", bin.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // Before the commit (the bytes not renamed over the object): not applied.
    assert_eq!(lookup("second")["applied"], false);
    assert_eq!(lookup("first")["applied"], true);
    // After the commit: applied, at the version the crashed write made.
    std::fs::rename(&tmp, dir.join("obj")).unwrap();
    let seen = lookup("second");
    assert_eq!(seen["applied"], true, "{seen}");
    assert_eq!(seen["entry"]["version"], "2", "{seen}");
    assert!(next.exists(), "a reader settled the write");
    // The next access by a user who may write the directory settles it.
    bed.inspect_id("obj", "second").expect(0);
    assert!(!next.exists());
    let stored = bed.stored("obj").unwrap();
    assert_eq!(stored.metadata["fence-id"], "second");
}

/// Two writers of one write (the same id and bytes: a retry racing the original) at once: A's
/// put is held on its way to the server until B has written; A's put then finds another
/// version, fence reads once more, sees the id applied, and answers "replayed" (exit 0): the
/// effect is there once, B's.
fn the_same_id_at_once_lands_once(service: Service) {
    let bed = Bed::on(service);
    let token = bed.acquire("A");
    bed.write("obj", token, "A", "warm-up", b"first").expect(0);
    let upstream = bed.upstream();
    let put = match service {
        Service::S3 => &b"PUT "[..],
        Service::Gcs => &b"POST "[..],
    };
    let held = Proxy::start(upstream, Mode::HoldWhenClientSends(put.to_vec()));
    let endpoint = format!("http://{}", held.addr());
    let a = std::thread::scope(|scope| {
        let a =
            scope.spawn(|| bed.write_via(Some(&endpoint), "obj", token, "A", "once", b"report"));
        wait_for("A's put to be held", Duration::from_secs(20), || {
            held.held() == 1
        });
        let b = bed
            .write("obj", token, "B", "once", b"report")
            .expect(0)
            .json();
        assert_eq!(b["replayed"], false, "{b}");
        held.open();
        a.join().unwrap()
    });
    let a = a.expect(0).json();
    assert_eq!(a["replayed"], true, "{a}");
    assert_eq!(a["applied"]["owner"], "B");
    let stored = bed.stored("obj").unwrap();
    assert_eq!(stored.body, b"report");
    assert_eq!(ledger_ids(&stored), ["once", "warm-up"]);
}

#[test]
fn s3_the_same_id_at_once_lands_once() {
    the_same_id_at_once_lands_once(Service::S3);
}

#[test]
fn gcs_the_same_id_at_once_lands_once() {
    the_same_id_at_once_lands_once(Service::Gcs);
}

/// fence paused (SIGSTOP) with its put in flight, past the request's timeout (30 s), while the
/// store applies it and the answer reaches fence's socket: once continued, fence reads the
/// answer it has and says the write applied (exit 0), not "may or may not have applied" (exit
/// 8). On resume the request's timer and the socket are ready at once, and the timer's task
/// runs first; the answer gets a last look (fence's timer, not reqwest's, which looks at its
/// timer before the answer). The put is held at a proxy until fence is stopped, so the answer
/// can only come while fence cannot read it.
fn an_answer_that_came_while_fence_was_paused_is_read(service: Service) {
    let bed = Bed::on(service);
    let token = bed.acquire("A");
    bed.write("obj", token, "A", "warm-up", b"first").expect(0);
    let upstream = bed.upstream();
    let gate = Proxy::start_disarmed(upstream, Mode::HoldWhenClientSends(b"PAUSED-PUT".to_vec()));
    let endpoint = format!("http://{}", gate.addr());
    // The prefix is proven through this endpoint first, then the gate is armed.
    bed.write_via(Some(&endpoint), "obj", token, "A", "proof", b"proof")
        .expect(0);
    gate.arm();
    let fence = bed.write_command(Some(&endpoint), "obj", token, "A", "paused", b"PAUSED-PUT");
    let child = fence.spawn();
    let pid = child.id();
    wait_for("the put at the gate", Duration::from_secs(30), || {
        gate.held() == 1
    });
    // fence sent its put (its request timer runs from before this instant).
    let sent = std::time::Instant::now();
    common::process::stop(pid);
    gate.open();
    wait_for("the put to land", Duration::from_secs(30), || {
        bed.stored("obj")
            .is_some_and(|s| s.metadata.get("fence-id").map(String::as_str) == Some("paused"))
    });
    // Past the request's timeout (30 s) with a margin; the proxy relays the answer at once.
    common::process::continue_at(pid, sent + Duration::from_secs(33));
    let out = Out::from(common::wait_output(
        "fence write",
        child,
        Duration::from_secs(60),
    ));
    let json = out.expect(0).json();
    assert_eq!(json["replayed"], false, "{json}");
    let stored = bed.stored("obj").unwrap();
    assert_eq!(stored.body, b"PAUSED-PUT");
    assert_eq!(ledger_ids(&stored), ["paused", "proof", "warm-up"]);
}

#[test]
fn s3_an_answer_that_came_while_fence_was_paused_is_read() {
    an_answer_that_came_while_fence_was_paused_is_read(Service::S3);
}

#[test]
fn gcs_an_answer_that_came_while_fence_was_paused_is_read() {
    an_answer_that_came_while_fence_was_paused_is_read(Service::Gcs);
}
