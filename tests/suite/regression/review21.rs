//! Review 21: adversarial review of fence on a dying or constrained machine — a full disk and
//! a file size limit, too few file descriptors, the store directory removed under a running
//! lease, the wall clock stepped — on the directory store and `file://` targets. Each test
//! states what the contract (docs/DESIGN.md, docs/guarantees.md) promises, what fence did
//! instead, and asserts on durable state and exit statuses.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common;

use common::{Out, Store};

/// `fence --store STORE ARGS…` under `prlimit --fsize=BYTES` (RLIMIT_FSIZE, as `ulimit -f`).
fn under_fsize(store: &Store, bytes: u64, args: &[&str]) -> Out {
    let output = common::clean_command("prlimit", store.home.path())
        .arg(format!("--fsize={bytes}"))
        .arg("--")
        .arg(common::fence_bin())
        .args(["--store", &store.url])
        .args(args)
        .output()
        .expect("run prlimit (util-linux)");
    Out::from(output)
}

/// `fence --store STORE ARGS…` under `ulimit -n LIMIT` (RLIMIT_NOFILE).
fn under_nofile(store: &Store, limit: u32, args: &str) -> Out {
    let output = common::clean_command("sh", store.home.path())
        .arg("-c")
        .arg(format!(
            "ulimit -n {limit} && exec \"$0\" --store '{}' {args}",
            store.url
        ))
        .arg(common::fence_bin())
        .output()
        .unwrap();
    Out::from(output)
}

/// `fence --store STORE ARGS…` with the wall clock an hour fast (an NTP step, a VM resumed),
/// the monotonic clocks left honest (libfaketime's `FAKETIME_DONT_FAKE_MONOTONIC`).
fn an_hour_later(store: &Store, args: &[&str]) -> Out {
    let output = common::clean_command("faketime", store.home.path())
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .args(["-f", "+1h"])
        .arg(common::fence_bin())
        .args(["--store", &store.url])
        .args(args)
        .output()
        .expect("run faketime");
    Out::from(output)
}

fn inspect(store: &Store, resource: &str) -> Value {
    let json = store
        .fence()
        .args(["inspect", resource, "--format", "json"])
        .run()
        .expect(0)
        .json();
    json["resources"][0].clone()
}

/// FINDING: docs/guarantees.md: "A write that fails for want of space is exit 7 too", and
/// exit 7 is "unavailable (nothing applied, safe to retry)" (DESIGN §5); `FileCoordinator::
/// io_error` says of every write of the directory store that "one that fails for want of space
/// leaves the lease as it was". Not at a resource's first grant: the high-water mark
/// `tokens/<name>.high` is created, then written in place (`counter::write`); on a full disk
/// (here RLIMIT_FSIZE 0, as `ulimit -f 0`: the same ENOSPC/EFBIG path) the file is created and
/// its 21 bytes are not written. The acquire says exit 7 "free disk space … then retry;
/// nothing was applied", but the empty mark stays: once the disk has room again, every
/// acquire of the resource is exit 1 "the high-water file … is damaged: it holds 0 bytes"
/// (and `inspect` lists it as damaged), until an operator moves it aside. With a limit that
/// lets a few bytes through, the file keeps the leading spaces of the token (10 bytes, the
/// same). The retry the message promises should be granted (exit 0): the mark should be
/// written to a temporary file and renamed into place, or an empty or partial mark that a
/// failed first write left should count as no mark (the log and record still bound the token).
#[test]
fn a_first_grant_refused_for_a_full_disk_can_be_retried() {
    for limit in [0, 10] {
        let store = Store::file();
        let refused = under_fsize(&store, limit, &["acquire", "r", "--owner", "a"]);
        assert_eq!(refused.code, 7, "fsize {limit}: {refused:?}");
        assert!(refused.stderr.contains("retry"), "{refused:?}");
        // The disk has room again: the retry the message asked for.
        let retry = store
            .fence()
            .args(["acquire", "r", "--owner", "a", "--format", "json"])
            .run();
        let mark = std::fs::read(store.dir().join("tokens").join("r.high")).unwrap_or_default();
        assert_eq!(
            retry.code,
            0,
            "fsize {limit}: the retry after a full disk was refused; the mark holds {:?}: {retry:?}",
            String::from_utf8_lossy(&mark)
        );
        assert!(retry.json()["token"].as_i64().unwrap() >= 1, "{retry:?}");
    }
}

/// FINDING: DESIGN §5: exit 7 is "unavailable (nothing applied, safe to retry)", 1 is
/// "internal"; docs/guarantees.md: "A write that fails for want of space is exit 7 too".
/// A `fence write --from` to a `file://` target whose bytes do not fit (RLIMIT_FSIZE here,
/// `ulimit -f`; a full disk or quota takes the same path: ENOSPC, EFBIG, EDQUOT) writes
/// nothing — the object keeps its bytes and its sidecar its version — but fence answers exit 1
/// `internal`, "cannot write …: File too large", hint "check the disk, then retry": a caller
/// that retries on 7 and pages on 1 pages for a full disk, and the hint names neither space
/// nor the file size limit. `object::local::io_error` maps only PermissionDenied / NotFound /
/// NotADirectory and makes everything else internal, unlike the directory store's
/// `FileCoordinator::io_error`, which answers ENOSPC, EFBIG and EDQUOT with exit 7.
#[test]
fn a_file_object_write_that_does_not_fit_is_unavailable_not_internal() {
    let store = Store::file();
    let token = common::acquire_for(&store, "r", "a", "5m").to_string();
    let dir = store.home.path().join("objects");
    std::fs::create_dir(&dir).unwrap();
    let target = format!("file://{}/obj", dir.display());
    let small = store.home.path().join("small");
    std::fs::write(&small, b"first\n").unwrap();
    let big = store.home.path().join("big");
    std::fs::write(&big, vec![b'x'; 200_000]).unwrap();
    let write = |from: &Path| {
        vec![
            "write".to_owned(),
            "r".to_owned(),
            "--target".to_owned(),
            target.clone(),
            "--from".to_owned(),
            from.display().to_string(),
            "--owner".to_owned(),
            "a".to_owned(),
            "--token".to_owned(),
            token.clone(),
            "--format".to_owned(),
            "json".to_owned(),
        ]
    };
    let args = write(&small);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    store.fence().args(&args).run().expect(0);
    let sidecar = std::fs::read(dir.join(".obj.fence.json")).unwrap();

    let args = write(&big);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = under_fsize(&store, 100_000, &args);
    // Nothing applied: the object and its version are as they were.
    assert_eq!(std::fs::read(dir.join("obj")).unwrap(), b"first\n");
    assert_eq!(std::fs::read(dir.join(".obj.fence.json")).unwrap(), sidecar);
    assert_eq!(
        out.code, 7,
        "a write that did not fit, nothing applied, should be `unavailable`: {out:?}"
    );
}

/// FINDING: DESIGN §7 (directory store): "A change whose log entry cannot be written is undone
/// and refused", and `FileCoordinator::io_error`: a failed write "leaves the lease as it was";
/// DESIGN §3 `run`: "acquire, run a command, …, release when it ends". Out of file descriptors
/// (`ulimit -n`; here 14 for `fence run`, 12 for `fence acquire`), `fence run` fails with exit 1 "cannot write the lease record `…`:
/// Too many open files … raise the open-file limit, then retry" — yet the record *was*
/// written: `sys::replace` renames the record into place and only then opens the directory to
/// fsync it (a grant is durable), with the temporary file still open, which is one descriptor
/// too many. The error is returned after the rename and nothing undoes it: the store holds a
/// live lease (the run's own `owner/pid/random`, TTL 10 min) that no process holds and no one
/// can release by the run's owner, so the retry the hint asks for is refused as busy (exit 3)
/// for the whole TTL. A grant that fence reports as failed should leave no lease (undo it as a
/// failed log append is undone), or be reported as granted.
#[test]
fn a_grant_reported_as_failed_leaves_no_lease_behind() {
    let mut held = Vec::new();
    for limit in 5..=40 {
        for args in ["run r --ttl 10m -- true", "acquire r --owner b --ttl 10m"] {
            let store = Store::file();
            // The resource exists (its mark too), as it does once it is in use.
            let old = common::acquire_for(&store, "r", "x", "1m");
            common::release(&store, "r", "x", old);
            let out = under_nofile(&store, limit, args);
            if out.code == 0 {
                continue;
            }
            let view = inspect(&store, "r");
            if view["state"] == "held" {
                held.push(format!(
                    "ulimit -n {limit}, `fence {args}`: exit {}, {:?}; the store holds the lease of {} (token {})",
                    out.code,
                    out.stderr.lines().next().unwrap_or_default(),
                    view["owner"],
                    view["token"]
                ));
            }
        }
    }
    assert!(
        held.is_empty(),
        "a failed grant left a live lease behind:\n{}",
        held.join("\n")
    );
}

/// FINDING: DESIGN §12 (the directory store): a process that "cannot read
/// `/proc/sys/kernel/random/boot_id` (a chroot without /proc, a masked file) is refused (exit
/// 2)", and §4/§10: messages name the true cause. `FileCoordinator::open` reads the boot id with
/// `unwrap_or_default()`, so *any* error is "cannot read this boot's id … run fence where /proc
/// is mounted (in a chroot or container: mount proc there)": out of file descriptors
/// (`ulimit -n 12` for `fence run`, 9 for `acquire` and `inspect`; /proc is mounted) fence answers exit 2, a usage error,
/// and sends the operator to mount /proc, instead of naming the open-file limit as every other
/// EMFILE of the store does ("raise the open-file limit (`ulimit -n` …)", exit 1).
#[test]
fn an_open_file_limit_is_not_reported_as_a_missing_proc() {
    let mut wrong = Vec::new();
    for limit in 5..=40 {
        for args in ["run r --ttl 1m -- true", "acquire r --owner a", "inspect r"] {
            let store = Store::file();
            let out = under_nofile(&store, limit, args);
            // Naming the boot id's file is right when the cause named is the limit.
            let misled = out.stderr.contains("mount proc")
                || (out.stderr.contains("boot's id") && !out.stderr.contains("open-file limit"));
            if misled {
                wrong.push(format!(
                    "ulimit -n {limit}, `fence {args}`: exit {}: {}",
                    out.code,
                    out.stderr.trim()
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "an fd limit was reported as a missing /proc:\n{}",
        wrong.join("\n")
    );
}

/// FINDING: DESIGN §1: "Expiry is decided by the coordinator's clock, never by a worker's wall
/// clock"; I7; the directory store's clock is CLOCK_BOOTTIME (§7), and every event it logs
/// carries its `boot_ns`. §3 `log`: "expiries are derived from the recorded expiry … Warnings:
/// … held past TTL". A holder with a 30 s lease renews it at once and releases it, both
/// accepted by the store (by its clock the lease never ran out) — but the wall clock was
/// stepped an hour forward in between (an NTP step, a VM resumed). `fence log` derives an
/// `expired` event ("not renewed or released within its TTL of 30.0s") from the wall-clock
/// `expires_at_ms`, and warns `held_past_ttl`: "a released `r` (token 1) … 59m 30s after its
/// lease expired … by the store's clock: whatever it did in between was done without a
/// lease", `integrity_ok: false`. A false accusation: an operator audits writes that were
/// fenced correctly. The renewal the store accepted proves the lease live; a directory store's
/// expiry should be derived on its own clock (`boot_ns`), as a takeover is decided.
#[test]
fn a_wall_clock_step_does_not_make_the_log_report_a_lease_held_past_its_ttl() {
    let store = Store::file();
    let token = common::acquire_for(&store, "r", "a", "30s").to_string();
    let renew = an_hour_later(&store, &["renew", "r", "--owner", "a", "--token", &token]);
    assert_eq!(
        renew.code, 0,
        "the store's clock says the lease is live: {renew:?}"
    );
    let release = an_hour_later(&store, &["release", "r", "--owner", "a", "--token", &token]);
    assert_eq!(release.code, 0, "{release:?}");
    // A release alone after the step: the store says the lease was live.
    let other = common::acquire_for(&store, "s", "a", "30s").to_string();
    let release = an_hour_later(&store, &["release", "s", "--owner", "a", "--token", &other]);
    assert_eq!(release.code, 0, "{release:?}");
    let log = an_hour_later(&store, &["log", "r", "s", "--format", "json"]);
    assert_eq!(log.code, 0, "{log:?}");
    let log = log.json();
    let expired: Vec<&Value> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "expired")
        .collect();
    assert!(
        expired.is_empty(),
        "the log shows an expiry the store never saw: {log}"
    );
    assert_eq!(log["warnings"], serde_json::json!([]), "{log}");
    assert_eq!(log["integrity_ok"], true, "{log}");
}

/// FINDING: DESIGN §3 `run`: "stop the command's process group when the lease is lost (exit
/// 5) … A definite loss (taken over, expired) is SIGKILL at once", and §7: "a renew or release
/// of a lease whose record is missing … is a lost lease (`record_lost`, exit 5)". The store
/// directory is removed while `fence run` holds its lease (a cleanup script, a
/// misconfigured tmpfiles rule); the next acquire makes a new, empty store and is granted
/// token 1 — the running command's own token. The run's next renewal is answered "token 1 for
/// `r` belongs to `b`, not to this owner" (a conflict, exit 6 class), which `hold.rs` treats as
/// a passing failure ("a lost connection, a timeout, local I/O"): it retries and lets the
/// command run on beside the new holder until its bound (up to the TTL after its last
/// renewal), then reports "could not be renewed before it ran out (the store was unreachable,
/// or this process was paused)" — neither happened, and the store's run record says
/// `unreachable` too. A renewal that finds its token held by another owner, or its record gone,
/// is a definite loss: the command should be stopped then, with a reason that says the lease
/// record is gone or taken.
#[test]
fn a_run_whose_store_was_removed_stops_at_its_next_renewal_and_says_why() {
    let store = Store::file();
    let ticks = store.home.path().join("ticks");
    let run = store
        .fence()
        .args(["run", "r", "--ttl", "30s", "--", "sh", "-c"])
        .args([format!(
            "while :; do echo tick >> '{}'; sleep 0.1; done",
            ticks.display()
        )])
        .spawn();
    common::wait_for("the command to run", Duration::from_secs(30), || {
        ticks.exists()
    });
    std::fs::remove_dir_all(store.dir()).unwrap();
    let taken = common::acquire_for(&store, "r", "b", "10m");
    let since = Instant::now();
    let out = Out::from(common::wait_output(
        "the run whose store was removed",
        run,
        Duration::from_secs(120),
    ));
    let ran_on = since.elapsed();
    assert_eq!(taken, 1, "the new store starts again at token 1");
    assert_eq!(out.code, 5, "{out:?}");
    // Renewals go out every TTL/3 (10 s); the bound is 27 s after the last one.
    assert!(
        ran_on < Duration::from_secs(15) && !out.stderr.contains("unreachable"),
        "the command ran on for {ran_on:?} after the new holder of its token was granted, and \
         the store, which answered every renewal, is blamed: {out:?}"
    );
}
