//! Review 17: adversarial review of the object-store coordinators (`s3://`, `gs://`) and the
//! directory store (`file:///dir`, the default). Each test states what the contract
//! (docs/DESIGN.md §3, §5, §6, §7, §12; docs/object-stores.md) promises, what fence did
//! instead, and asserts on durable state (the store's own files and objects, `fence inspect`)
//! and on the exit status.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::restored_objects::{
    addresses, body, fence, fence_via, grant, hold_until, is_release_of, is_write, lease_key,
};
use crate::common;

use common::proxy::{HttpProxy, Verdict};
use common::{Backend, Out, Store};

// ---------------------------------------------------------------------------------------------
// 1. The directory store trusts whatever boot identity and boot clock a process reads.
// ---------------------------------------------------------------------------------------------

/// Whether this test process may make mount and time namespaces (root, `unshare`): the
/// directory-store tests below need them to give one fence process the view a chroot or a
/// container gives it; skipped otherwise.
fn can_unshare(args: &[&str]) -> bool {
    let ok = std::process::Command::new("unshare")
        .args(args)
        .arg("true")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: `unshare {}` is not allowed here", args.join(" "));
    }
    ok
}

/// `fence --store URL ARGS --format json`, started through `unshare UNSHARE -- sh -c SETUP`
/// (SETUP then execs fence), with the test's clean environment.
fn fence_unshared(store: &Store, unshare: &[&str], setup: &str, args: &[&str]) -> Out {
    let mut cmd = common::clean_command("unshare", store.home.path());
    cmd.args(unshare)
        .args(["sh", "-c", &format!("{setup} exec \"$0\" \"$@\"")])
        .arg(common::fence_bin())
        .args(["--store", &store.url])
        .args(args)
        .args(["--format", "json"]);
    let out = Out::from(cmd.output().expect("run unshare"));
    eprintln!(
        "$ unshare {} sh -c '{setup} exec fence …' {}\n  exit {}\n  stdout {}\n  stderr {}",
        unshare.join(" "),
        args.join(" "),
        out.code,
        out.stdout.trim(),
        out.stderr.trim()
    );
    out
}

/// `fence inspect RESOURCE --format json` (an ordinary process): (state, owner, token).
fn file_view(store: &Store, resource: &str) -> (String, String, i64) {
    let out = store
        .fence()
        .args(["inspect", resource, "--format", "json"])
        .run()
        .expect(0);
    let json = out.json();
    let view = &json["resources"][0];
    (
        view["state"].as_str().unwrap_or_default().to_owned(),
        view["owner"].as_str().unwrap_or_default().to_owned(),
        view["token"].as_i64().unwrap_or_default(),
    )
}

/// DESIGN §7 (the directory store: "Expiry uses the kernel's CLOCK_BOOTTIME with the boot id
/// (a lease from an earlier boot has expired)"), I3 (at most one live lease per resource) and
/// §10 "Fail closed". `a` holds `r` for 10 minutes. A second process on the same machine,
/// started where /proc is not mounted (a chroot without /proc; here an empty tmpfs over
/// /proc in a mount namespace of its own), asks for `r` as `b`.
///
/// Before: fence reads the boot id with `unwrap_or_default()` (src/coordinator/file/mod.rs,
/// `FileCoordinator::open`), so `b`'s process has the boot id "", takes a's record for a
/// lease of an earlier boot (expired), and is granted token 2 with exit 0 — while a's lease
/// has 10 minutes to run: two live owners (a `fence run` of a's keeps its command running
/// until its next renewal). And the other way round: b's record carries the boot id "", so
/// every ordinary process takes *it* for expired at once (here `c`, token 3).
fn a_process_without_the_boot_id_takes_over_no_live_lease(store: &Store) {
    if !can_unshare(&["-m"]) {
        return;
    }
    let a = store
        .fence()
        .acquire("r", &["--owner", "a", "--ttl", "10m"]);
    let out = fence_unshared(
        store,
        &["-m"],
        "mount -t tmpfs none /proc &&",
        &["acquire", "r", "--owner", "b", "--ttl", "10m"],
    );
    let (state, owner, token) = file_view(store, "r");
    assert!(
        out.code != 0 && (state.as_str(), owner.as_str(), token) == ("held", "a", a.token),
        "a holds `r` (token {}) for 10 minutes; a process that could not read the boot id was answered exit {} ({}), and the store now shows `{owner}` holding token {token} ({state})",
        a.token,
        out.code,
        out.stdout.trim()
    );
    // The other way round: a lease granted by such a process must be live for the others.
    let other = Store::file();
    let b = fence_unshared(
        &other,
        &["-m"],
        "mount -t tmpfs none /proc &&",
        &["acquire", "r", "--owner", "b", "--ttl", "10m"],
    );
    if b.code == 0 {
        let c = other
            .fence()
            .args([
                "acquire", "r", "--owner", "c", "--ttl", "10m", "--format", "json",
            ])
            .run();
        let (state, owner, token) = file_view(&other, "r");
        assert!(
            c.code == 3 && owner == "b",
            "b was granted `r` for 10 minutes (exit 0: {}); c then got exit {} ({}), and the store shows `{owner}` holding token {token} ({state})",
            b.stdout.trim(),
            c.code,
            c.stdout.trim()
        );
    }
}

/// The same promise, with the boot clock: a process in a time namespace (`unshare --time`,
/// as CRIU's restore of a container makes one) reads CLOCK_BOOTTIME shifted by the offset
/// the kernel shows in /proc/self/timens_offsets, and the same boot id. `a` holds `r` for 10
/// minutes; `b`, in a namespace whose boot clock is 100,000 s ahead, asks for it.
///
/// Before: b's "now" is past a's deadline: a's live lease is taken over (token 2, exit 0).
/// DESIGN §12 names libfaketime as a documented limit (a faked clock in the process); a time
/// namespace is the kernel's own, and it says so (the offset is readable), so fence can
/// correct for it or refuse, as it refuses a store without the boot clock.
fn a_process_in_a_time_namespace_takes_over_no_live_lease(store: &Store) {
    if !can_unshare(&["--time", "--boottime", "1"]) {
        return;
    }
    let a = store
        .fence()
        .acquire("r", &["--owner", "a", "--ttl", "10m"]);
    let out = fence_unshared(
        store,
        &["--time", "--boottime", "100000"],
        "",
        &["acquire", "r", "--owner", "b", "--ttl", "10m"],
    );
    let (state, owner, token) = file_view(store, "r");
    assert!(
        out.code != 0 && (state.as_str(), owner.as_str(), token) == ("held", "a", a.token),
        "a holds `r` (token {}) for 10 minutes; a process whose boot clock runs 100000 s ahead (a time namespace) was answered exit {} ({}), and the store now shows `{owner}` holding token {token} ({state})",
        a.token,
        out.code,
        out.stdout.trim()
    );
}

mod file_store {
    #[test]
    fn a_process_without_the_boot_id_takes_over_no_live_lease() {
        super::a_process_without_the_boot_id_takes_over_no_live_lease(&crate::common::Store::file())
    }

    #[test]
    fn a_process_in_a_time_namespace_takes_over_no_live_lease() {
        super::a_process_in_a_time_namespace_takes_over_no_live_lease(&crate::common::Store::file())
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Object stores: a release whose answer was lost, and a waiter granted meanwhile.
// ---------------------------------------------------------------------------------------------

/// Every event object of `resource` whose kind is `kind`: (its name, its body).
fn event_objects_of(store: &Store, resource: &str, kind: &str) -> Vec<(String, serde_json::Value)> {
    let (server, prefix) = store.server();
    let dir = format!("{prefix}/events/{}", common::objects::encode_key(resource));
    server
        .list(&dir)
        .into_iter()
        .filter_map(|key| {
            let stored = server.get(&key)?;
            let value: serde_json::Value = serde_json::from_slice(&stored.body).ok()?;
            (value["kind"] == kind).then_some((key, value))
        })
        .collect()
}

/// docs/object-stores.md ("A definite answer is never asked again and never called
/// unknown"; DESIGN §12 "A lost answer means "unknown", not "nothing": … a retry … recognised
/// by its nonce (acquire, release)") and §3 (`release` is idempotent; exit 4 means a newer
/// token was issued while the caller held its lease). `a` holds `r`; `fence release` is sent;
/// the store applies it, and the answer is lost (a 503 from a gateway after the backend
/// stored it, as S3's "InternalError" may be). fence asks again after its retry pause
/// (100–150 ms); in that pause a waiter `b` (polling every ≤ 250 ms) is granted the free lease
/// (token 2). The retry meets b's version (412).
///
/// Before: the release is answered exit 4 `stale_fencing_token` ("token 1 is stale: token 2 is
/// newer": a's lease taken over while it held it) and a `release_rejected` event object is
/// stored — for a release that applied, before b was granted anything (b's record carries
/// a's `released` change in its own history). The proxy holds the retry until b's grant is
/// done, so the pause is as long as the test needs, not a race.
fn a_release_whose_answer_was_lost_is_not_refused_as_stale_after_a_waiter_took_the_lease(
    on: Backend,
) {
    let store = Store::new(on);
    let (server, _) = store.server();
    let first = grant(&store, "r", "a", "10m");
    let key = lease_key(&store, "r");
    let releases = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(AtomicBool::new(false));
    let (counted, let_go) = (releases.clone(), go.clone());
    let proxy = HttpProxy::start(
        server.addr(),
        Arc::new(move |request| {
            if !is_release_of(request, &key) {
                return Verdict::Forward;
            }
            if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                return Verdict::ForwardThenAnswer { status: 503 };
            }
            hold_until(&let_go);
            Verdict::Forward
        }),
    );
    let released = {
        let store_url = store.url.clone();
        let fence = store
            .fence()
            .env(
                super::restored_objects::endpoint_var(&store),
                proxy.endpoint(),
            )
            .args([
                "release",
                "r",
                "--owner",
                "a",
                "--token",
                &first.to_string(),
            ])
            .args(["--format", "json"]);
        eprintln!("releasing through a proxy in front of {store_url}");
        std::thread::spawn(move || fence.run())
    };
    common::wait_for(
        "the release applied, its answer lost, and its retry held",
        Duration::from_secs(60),
        || releases.load(Ordering::SeqCst) >= 2,
    );
    assert_eq!(
        body(&super::restored_objects::record(&store, "r"))["state"],
        "released",
        "the premise: the release was applied before its retry"
    );
    let second = grant(&store, "r", "b", "10m");
    assert!(second > first, "the premise: b was granted a new token");
    go.store(true, Ordering::SeqCst);
    let out = released.join().expect("the release's thread");
    super::restored_objects::show(&["release (answer lost, b granted meanwhile)"], &out);
    let rejected: Vec<_> = event_objects_of(&store, "r", "release_rejected")
        .into_iter()
        .filter(|(_, v)| v["owner"] == "a" && v["token"] == first)
        .collect();
    assert!(
        out.code == 0 && rejected.is_empty(),
        "a's release of token {first} was applied (b's grant of token {second} came after it), but fence answered exit {} ({}) and stored {} `release_rejected` event(s): {rejected:?}",
        out.code,
        out.stdout.trim(),
        rejected.len()
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Object stores: a lease record deleted under its holder.
// ---------------------------------------------------------------------------------------------

/// DESIGN §3 (`renew`: "Newer token → 4; expired → 5") and §7/§12: the directory store
/// answers a renew or release of a lease whose record is missing, though its token was
/// issued, with `lease_lost` `record_lost` (exit 5), and docs/object-stores.md promises the
/// object stores the same semantics and exit codes ("a refused renew or release is judged by
/// the [high-water] object too … equal to it with the record below it record_lost"). `a`
/// holds `r` (token 1); the lease object is deleted (an operator's cleanup, a lifecycle rule
/// on `leases/`); `tokens/r` still says 1.
///
/// Before: `renew` and `release` of token 1 are exit 6 `conflict` (`no_lease`: "no lease has
/// ever been granted"), which `fence run` takes for a passing failure and retries (its
/// command keeps running until its bound, or until another owner's grant makes a retry
/// stale) instead of stopping at once.
fn a_holder_whose_lease_record_was_deleted_is_told_it_lost_the_lease(on: Backend) {
    let store = Store::new(on);
    let (server, _) = store.server();
    let token = grant(&store, "r", "a", "10m");
    server.delete(&lease_key(&store, "r"));
    assert_eq!(
        super::restored_objects::high_water(&store, "r"),
        Some(token),
        "the premise: the high-water object says token {token} was issued"
    );
    let mut wrong = Vec::new();
    for op in ["renew", "release"] {
        let out = fence(
            &store,
            &[op, "r", "--owner", "a", "--token", &token.to_string()],
        );
        let json = out.json();
        if out.code != 5 || json["error"] != "lease_lost" {
            wrong.push(format!(
                "{op} of token {token} (issued, its record deleted): exit {}, {}",
                out.code,
                out.stdout.trim()
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// 4. Object stores: the last attempt of a contended decision.
// ---------------------------------------------------------------------------------------------

/// DESIGN §5 (exit 7: "unavailable (nothing applied, safe to retry)") and docs/object-stores.md
/// ("A definite answer is never asked again and never called unknown"; a retried conditional
/// put that had applied "answers 412: the caller reads again and sees its own write"). A
/// grant whose conditional put loses its race is decided again, at most 200 times
/// (`MAX_ATTEMPTS`); then fence gives up with exit 7, "nothing was changed by this request;
/// retry". Here the first 199 conditional puts of `r`'s record are refused 412 (lost races,
/// as under heavy contention), and the 200th is applied by the server and its answer lost
/// (503); the retry of that put meets its own version (412).
///
/// Before: exit 7 "changed under every one of 200 attempts … nothing was changed by this
/// request" — while the record holds the grant (owner `a`, held for 10 minutes): the caller,
/// told nothing applied, does not know it holds the lease, and with a default owner its
/// retry is refused busy until the TTL runs out. Every earlier attempt's write is recognised
/// by its nonce on the next read; the last attempt's is never read again. (`release` and
/// `renew` share the loop and its ending.)
fn an_applied_last_attempt_is_not_reported_as_nothing_changed(on: Backend) {
    let store = Store::new(on);
    let (server, _) = store.server();
    let key = lease_key(&store, "r");
    let puts = Arc::new(AtomicUsize::new(0));
    let counted = puts.clone();
    let proxy = HttpProxy::start(
        server.addr(),
        Arc::new(move |request| {
            if !(is_write(request) && addresses(request, &key)) {
                return Verdict::Forward;
            }
            match counted.fetch_add(1, Ordering::SeqCst) {
                0..=198 => Verdict::Answer {
                    status: 412,
                    body: "<Error><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions you specified did not hold</Message></Error>".into(),
                },
                199 => Verdict::ForwardThenAnswer { status: 503 },
                _ => Verdict::Forward,
            }
        }),
    );
    let out = fence_via(
        &store,
        &proxy,
        &["acquire", "r", "--owner", "a", "--ttl", "10m"],
    );
    let puts = puts.load(Ordering::SeqCst);
    assert!(
        puts >= 200,
        "the premise: the 200th conditional put was applied and its answer lost ({puts} puts)"
    );
    let record = body(&super::restored_objects::record(&store, "r"));
    assert_eq!(
        (record["owner"].as_str(), record["state"].as_str()),
        (Some("a"), Some("held")),
        "the premise: the last attempt's grant is the record: {record}"
    );
    assert!(
        out.code == 0 || out.code == 8,
        "the record holds a's grant (token {}, 10 minutes), but fence answered exit {} ({})",
        record["token"],
        out.code,
        out.stdout.trim()
    );
}

crate::per_service!(
    a_release_whose_answer_was_lost_is_not_refused_as_stale_after_a_waiter_took_the_lease,
    a_holder_whose_lease_record_was_deleted_is_told_it_lost_the_lease,
    an_applied_last_attempt_is_not_reported_as_nothing_changed,
);
