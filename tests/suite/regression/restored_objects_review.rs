//! Review 5: an adversarial review of the object-store coordinator's high-water object
//! (`<prefix>/tokens/<resource>`, `src/coordinator/object.rs`: `high`, `raise_high`,
//! `restored`, `stale_copy` and their callers), on S3 (moto) and GCS (fake-gcs-server).
//!
//! The promise under attack (DESIGN §1, I1): every grant's token for a resource is above every
//! token issued before for it, and a stale token's renew / release is refused with exit 4;
//! fence never reports authority it does not have. Each test reads the bucket itself.
//!
//! Tests named `held_…` are evidence of what was tried and held; the others showed a finding
//! (all fixed the same day: a token issued twice after a reacquire or release that never
//! raised the object; a written-back copy shown held by `inspect`; a stale token's release
//! "already released"; refusals naming the wrong highest token; archived history overwritten
//! after a write-back; a refusal left unrecorded; a false "written back" from `doctor`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::restored_objects::{
    addresses, body, endpoint_var, fence, fence_via, grant, high_key, high_water, is_write,
    lease_key, record, release, show, write_back,
};
use crate::common;

use common::objects;
use common::proxy::{HttpProxy, Verdict};
use common::{Backend, Out, Store};

// ---------------------------------------------------------------------------------------------
// Helpers (self-contained: nothing here depends on other test files).
// ---------------------------------------------------------------------------------------------

/// The record's (owner, token, state), read directly.
fn record_summary(store: &Store, resource: &str) -> (String, i64, String) {
    let b = body(&record(store, resource));
    (
        b["owner"].as_str().unwrap_or_default().to_owned(),
        b["token"].as_i64().unwrap_or_default(),
        b["state"].as_str().unwrap_or_default().to_owned(),
    )
}

// ---------------------------------------------------------------------------------------------
// Finding A: `inspect` shows a written-back copy as the holder's live lease when a grant
// lands between its read of the record and its read of the high-water object.
// ---------------------------------------------------------------------------------------------

/// The record is an older copy written back (a's token 1, held, 10 minutes; tokens up to 2
/// issued since, the high-water object says 2). `inspect` reads the record (a, token 1), and
/// before it reads the high-water object, `d` is granted token 3 (which raises the object to
/// 3). `inspect` then finds token 1 below 3, reads the record again, finds d's token 3 (not
/// below), and so decides the copy was *not* restored — and reports what it read first: `a`
/// holding token 1, live. Token 1 is stale since token 2 was issued; at no moment was it
/// anyone's lease. (The proxy holds inspect's read of `tokens/r` until d's grant is done.)
fn inspect_does_not_show_a_written_back_copy_held_when_a_grant_lands_between_its_reads(
    on: Backend,
) {
    let store = Store::new(on);
    let (server, _) = store.server();
    let first = grant(&store, "r", "a", "10m");
    let old = record(&store, "r");
    release(&store, "r", "a", first);
    let second = grant(&store, "r", "b", "10m");
    release(&store, "r", "b", second);
    assert_eq!(high_water(&store, "r"), Some(second));
    write_back(&store, "r", &old);

    let tokens = high_key(&store, "r");
    let held = Arc::new(AtomicBool::new(false));
    let go = Arc::new(AtomicBool::new(false));
    let (held2, go2) = (held.clone(), go.clone());
    let proxy = HttpProxy::start(
        server.addr(),
        Arc::new(move |request| {
            if request.method == "GET"
                && addresses(request, &tokens)
                && !held2.swap(true, Ordering::SeqCst)
            {
                let start = Instant::now();
                while !go2.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            Verdict::Forward
        }),
    );
    let child = store
        .fence()
        .env(endpoint_var(&store), proxy.endpoint())
        .args(["inspect", "r", "--format", "json"])
        .spawn();
    common::wait_for(
        "inspect's read of the high-water object",
        Duration::from_secs(20),
        || held.load(Ordering::SeqCst),
    );
    // Between inspect's two reads: d is granted (the copy is no one's lease).
    let third = grant(&store, "r", "d", "10m");
    assert!(
        third > second,
        "I1 (a premise): token {third} after {second}"
    );
    assert_eq!(high_water(&store, "r"), Some(third));
    go.store(true, Ordering::SeqCst);
    let output = common::wait_output("inspect", child, Duration::from_secs(60));
    let out = Out::from(output);
    show(&["inspect", "r", "(through the proxy)"], &out);
    assert_eq!(out.code, 0, "{out:?}");
    let view = &out.json()["resources"][0];
    let (owner, token, state) = record_summary(&store, "r");
    assert!(
        !(view["state"] == "held" && view["token"].as_i64() == Some(first)),
        "inspect showed the written-back copy (`a`, token {first}) as a live lease, though token {second} was issued before inspect started and token {third} during it: {view}\n  record now: owner {owner}, token {token}, {state}; high-water {:?}",
        high_water(&store, "r")
    );
}

// ---------------------------------------------------------------------------------------------
// Finding B: a stale token whose *released* record was written back: `release` answers exit 0
// ("already released") and `renew` exit 5, not exit 4.
// ---------------------------------------------------------------------------------------------

/// a holds token 1 and releases it; the released record is kept as the old copy. b and c are
/// granted tokens 2 and 3 (c holds, live). The copy is written back. Token 1 is stale (3
/// issued since): its `release` and `renew` must be refused with exit 4. `release` checks
/// `!c.held()` (→ `Released::Already`, exit 0) before `stale_copy`, and `renew`'s refusal is
/// classified on the record alone (same token, released → lease lost, exit 5).
/// Without the write-back the same commands are exit 4 (checked first, as the baseline).
fn a_stale_token_whose_released_record_was_written_back_is_refused_as_stale(on: Backend) {
    let store = Store::new(on);
    let first = grant(&store, "r", "a", "10m");
    release(&store, "r", "a", first);
    let old = record(&store, "r");
    assert_eq!(body(&old)["state"], "released");
    let second = grant(&store, "r", "b", "10m");
    release(&store, "r", "b", second);
    let third = grant(&store, "r", "c", "10m");
    let t1 = first.to_string();
    let mut wrong = Vec::new();
    // Baseline: without a write-back, token 1 is stale for both.
    for op in ["release", "renew"] {
        let out = fence(&store, &[op, "r", "--owner", "a", "--token", &t1]);
        assert_eq!(out.code, 4, "baseline {op} of stale token {first}: {out:?}");
    }
    write_back(&store, "r", &old);
    for op in ["release", "renew"] {
        let out = fence(&store, &[op, "r", "--owner", "a", "--token", &t1]);
        if out.code != 4 {
            wrong.push(format!(
                "{op} of token {first} (token {third} issued since, high-water {:?}) after a's released record was written back: exit {}, {}",
                high_water(&store, "r"),
                out.code,
                out.stdout.trim()
            ));
        }
    }
    let (owner, token, state) = record_summary(&store, "r");
    assert!(
        wrong.is_empty(),
        "{}\n  record after: owner {owner}, token {token}, {state}",
        wrong.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Finding C: the refusals of renew/release ignore the high-water object: the newest holder is
// told its token was "never issued" (exit 6) with `highest_token` the copy's; a stale token
// is told a highest token below the one issued.
// ---------------------------------------------------------------------------------------------

/// (1) b holds token 2 (the newest issued; the high-water object says 2). a's older record
/// (token 1, held) is written back. b renews: fence answers exit 6 `never_issued` naming
/// highest token 1 — but token 2 was issued (the high-water object says so), and it is
/// b's lease that the write-back lost (the directory store answers such a renewal exit 5,
/// `record_lost`). (2) With tokens 1..3 issued and b's held token-2 record written back, a's
/// renew of token 1 is exit 4, but names highest token 2, not 3.
fn refusals_after_a_write_back_name_the_highest_token_issued(on: Backend) {
    let mut wrong = Vec::new();
    {
        let store = Store::new(on);
        let first = grant(&store, "r", "a", "10m");
        let old = record(&store, "r");
        release(&store, "r", "a", first);
        let second = grant(&store, "r", "b", "10m");
        assert_eq!(high_water(&store, "r"), Some(second));
        write_back(&store, "r", &old);
        let t2 = second.to_string();
        for op in ["renew", "release"] {
            let out = fence(&store, &[op, "r", "--owner", "b", "--token", &t2]);
            let json = out.json();
            let named = json["highest_token"].as_i64();
            if out.code == 6 || json["error"] == "never_issued" || named.is_some_and(|h| h < second)
            {
                wrong.push(format!(
                    "{op} by b of token {second} (issued: the high-water object says {:?}) after a's token-{first} record was written back: exit {}, {}",
                    high_water(&store, "r"),
                    out.code,
                    out.stdout.trim()
                ));
            }
        }
    }
    {
        let store = Store::new(on);
        let first = grant(&store, "r", "a", "10m");
        release(&store, "r", "a", first);
        let second = grant(&store, "r", "b", "10m");
        let old = record(&store, "r");
        release(&store, "r", "b", second);
        let third = grant(&store, "r", "c", "10m");
        release(&store, "r", "c", third);
        write_back(&store, "r", &old);
        let t1 = first.to_string();
        let out = fence(&store, &["renew", "r", "--owner", "a", "--token", &t1]);
        let named = out.json()["highest_token"].as_i64();
        if out.code != 4 || named != Some(third) {
            wrong.push(format!(
                "renew of stale token {first} after b's token-{second} record was written back (token {third} issued, high-water {:?}): exit {}, highest_token {named:?}: {}",
                high_water(&store, "r"),
                out.code,
                out.stdout.trim()
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Finding D: after a write-back, the record's write numbers (`seq`) start again below those
// already used, so archive names repeat: fence's own later writes overwrite archived
// history (grants of tokens issued vanish), and `inspect --history` orders old events as the
// newest and reports tokens as regressed.
// ---------------------------------------------------------------------------------------------

/// Every `acquired`/`taken_over` change's token found in the bucket's archive objects under
/// `events/<enc>/` (durable history, apart from the record), and with `record` in the
/// record's own history too.
fn granted_tokens_in_bucket(
    store: &Store,
    resource: &str,
    record: bool,
) -> std::collections::BTreeSet<i64> {
    let (server, prefix) = store.server();
    let mut tokens = std::collections::BTreeSet::new();
    let mut changes: Vec<serde_json::Value> = Vec::new();
    if let Some(rec) = server.get(&lease_key(store, resource)).filter(|_| record) {
        changes.extend(
            body(&rec)["history"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
    }
    let dir = format!("{prefix}/events/{}", objects::encode_key(resource));
    for key in server.list(&dir) {
        let key = if key.starts_with(&dir) {
            key
        } else {
            format!("{dir}/{key}")
        };
        if let Some(stored) = server.get(&key) {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&stored.body) {
                changes.extend(v["changes"].as_array().cloned().unwrap_or_default());
            }
        }
    }
    for c in changes {
        if matches!(c["kind"].as_str(), Some("acquired" | "taken_over")) {
            if let Some(t) = c["token"].as_i64() {
                tokens.insert(t);
            }
        }
    }
    tokens
}

/// 12 grant/release cycles (tokens 1..12, record writes 1..24: the changes of writes 1..16
/// are archived in two objects, `…01-0-archive` and `…09-0-archive`). The record as it was
/// after write 4 (token 2 released) is written back; then 10 more cycles (tokens 13..22,
/// writes numbered 5..24 again). The grants of tokens 3..8 were in archive objects before
/// the write-back (durable, apart from the record); after it, fence's own archives of the new
/// writes 5..16 take the same names and replace them. Right after the first new grant,
/// `inspect --history` already orders the archived writes 6..16 above it (newest first) and
/// hides archived write 5 (the grant of token 3) behind the new write 5.
fn history_archived_before_a_write_back_survives_later_writes(on: Backend) {
    let store = Store::new(on);
    let mut old = None;
    let mut issued = Vec::new();
    for i in 0..12 {
        let owner = format!("o{i}");
        let token = grant(&store, "r", &owner, "10m");
        release(&store, "r", &owner, token);
        issued.push(token);
        if i == 1 {
            old = Some(record(&store, "r"));
        }
    }
    let old = old.unwrap();
    assert_eq!(body(&old)["seq"], 4, "the copy is write 4: {}", body(&old));
    let archived_before = granted_tokens_in_bucket(&store, "r", false);
    eprintln!(
        "grants in archive objects before the write-back: {archived_before:?}; with the record's: {:?}",
        granted_tokens_in_bucket(&store, "r", true)
    );
    let (server, prefix) = store.server();
    let dir = format!("{prefix}/events/{}", objects::encode_key("r"));
    eprintln!("event objects before: {:?}", server.list(&dir));
    write_back(&store, "r", &old);

    // One grant after the write-back: what `inspect --history` shows.
    let next = grant(&store, "r", "n0", "10m");
    assert!(next > *issued.last().unwrap(), "I1 (a premise)");
    let inspect = fence(&store, &["inspect", "r", "--history", "100"]);
    let json = inspect.json();
    let events = json["resources"][0]["events"].clone();
    let newest = events[0].clone();
    let shown: Vec<i64> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "acquired")
        .filter_map(|e| e["token"].as_i64())
        .collect();
    let regressed = json["warnings"].to_string();
    release(&store, "r", "n0", next);
    issued.push(next);
    for i in 1..10 {
        let owner = format!("n{i}");
        let token = grant(&store, "r", &owner, "10m");
        release(&store, "r", &owner, token);
        issued.push(token);
    }
    eprintln!("event objects after: {:?}", server.list(&dir));
    let after = granted_tokens_in_bucket(&store, "r", true);
    let lost: Vec<i64> = archived_before.difference(&after).copied().collect();
    let log = fence(&store, &["log", "r"]);
    let mut wrong = Vec::new();
    if !lost.is_empty() {
        wrong.push(format!(
            "grants of tokens {lost:?}, in archive objects before the write-back, were overwritten by fence's later archives (grants anywhere in the bucket after: {after:?})"
        ));
    }
    if newest["token"].as_i64() != Some(next) {
        wrong.push(format!(
            "right after token {next} was granted, `inspect --history` showed as the newest event: {newest}"
        ));
    }
    let hidden: Vec<i64> = archived_before
        .iter()
        .copied()
        .filter(|t| !shown.contains(t))
        .collect();
    if !hidden.is_empty() {
        wrong.push(format!(
            "right after token {next} was granted, `inspect --history 100` showed grants of {shown:?}: the archived grants of {hidden:?} were missing"
        ));
    }
    if regressed.contains("token_regressed") {
        wrong.push(format!(
            "`inspect --history` reported a token regression though every token was above the last: {regressed}"
        ));
    }
    assert!(
        wrong.is_empty(),
        "tokens issued: {issued:?}\n{}\n  fence log: {}",
        wrong.join("\n"),
        log.stdout.trim()
    );
}

// ---------------------------------------------------------------------------------------------
// Finding E: a grant whose answer was lost (exit 8) and that its owner then asks again
// ("reacquired", exit 0) never raises the high-water object — a reacquire does not raise it,
// nor does a release — with no warning anywhere. An older copy written back afterwards (one
// the object *does* catch: below it) then makes the next grant repeat the token the owner
// was told it holds.
// ---------------------------------------------------------------------------------------------

/// p1 is granted token 1 and releases; its released record is the old copy. p2 is granted
/// token 2 and releases (the high-water object says 2). a's grant reaches the store (token 3)
/// but its connection is lost before the answer (exit 8: "may or may not have applied").
/// a asks again: "reacquired", token 3, exit 0, no warning — and the high-water object still
/// says 2. a does its job and releases (no renewal: a job shorter than a third of its TTL).
/// p1's copy (token 1, below the object's 2, so it is recognised as written back) is written
/// back, and d is granted: token 3 again — the token a was told it held and worked under (I1).
/// A variant with the copy at the object's own token (`same_token`) shows the documented
/// limit's "no token repeats" failing the same way.
fn a_grant_reacquired_after_a_lost_answer_leaves_no_token_to_repeat(on: Backend) {
    let mut wrong = Vec::new();
    // (the copy at the object's own token, a releases without asking again)
    for (same_token, release_only) in [(false, false), (true, false), (false, true)] {
        let store = Store::new(on);
        let (server, _) = store.server();
        let first = grant(&store, "r", "p1", "10m");
        release(&store, "r", "p1", first);
        let mut old = record(&store, "r");
        if !same_token {
            let second = grant(&store, "r", "p2", "10m");
            release(&store, "r", "p2", second);
        } else {
            old = record(&store, "r");
        }
        let high_before = high_water(&store, "r");

        let key = lease_key(&store, "r");
        let cut = Arc::new(AtomicUsize::new(0));
        let counted = cut.clone();
        let proxy = HttpProxy::start(
            server.addr(),
            Arc::new(move |request| {
                if is_write(request)
                    && addresses(request, &key)
                    && counted.fetch_add(1, Ordering::SeqCst) == 0
                {
                    Verdict::ForwardThenCut
                } else {
                    Verdict::Forward
                }
            }),
        );
        let lost = fence_via(
            &store,
            &proxy,
            &["acquire", "r", "--owner", "a", "--ttl", "10m"],
        );
        assert!(
            cut.load(Ordering::SeqCst) >= 1,
            "premise: the grant's write was cut after the server got it: {:?}",
            proxy.seen()
        );
        let (owner, token, state) = record_summary(&store, "r");
        assert_eq!(
            (owner.as_str(), state.as_str()),
            ("a", "held"),
            "premise: the grant applied: {lost:?}"
        );
        assert_eq!(lost.code, 8, "premise: the answer was lost: {lost:?}");
        // a asks again ("reacquired"), or, as exit 8's hint says, inspects first and finds
        // its token there (then works under it and releases).
        let again = if release_only {
            fence(&store, &["inspect", "r"])
        } else {
            fence(&store, &["acquire", "r", "--owner", "a", "--ttl", "10m"])
        };
        assert_eq!(again.code, 0, "{again:?}");
        let told = if release_only {
            let view = &again.json()["resources"][0];
            assert_eq!(view["owner"], "a", "{again:?}");
            view["token"].as_i64().unwrap()
        } else {
            again.json()["token"].as_i64().unwrap()
        };
        assert_eq!(told, token, "a is told the token its lost grant wrote");
        let high_after_reacquire = high_water(&store, "r");
        // While a holds its token (reacquired), a copy written back must not let another
        // be granted it: the object is raised by the reacquire itself, not only by a later
        // renewal or release.
        if !release_only && high_after_reacquire.is_none_or(|h| h < told) {
            wrong.push(format!(
                "a holds token {told} (reacquired, exit 0) but the high-water object says {high_after_reacquire:?}: a copy written back now would give token {told} to another while a holds it"
            ));
        }
        release(&store, "r", "a", told);
        let high_after_release = high_water(&store, "r");
        let doctor = fence(&store, &["doctor"]);
        let said = common::doctor_findings(&doctor.json(), "object.high_water");
        write_back(&store, "r", &old);
        let out = fence(&store, &["acquire", "r", "--owner", "d", "--ttl", "10m"]);
        assert_eq!(out.code, 0, "{out:?}");
        let d = out.json()["token"].as_i64().unwrap();
        if d <= told {
            wrong.push(format!(
                "{}{}: token {told} was granted to `a` (exit 0 on its {}, notices: {}) and issued again to `d` (token {d}) after the released token-{} copy was written back; high-water object before a's grant {high_before:?}, after a's reacquire/inspect {high_after_reacquire:?}, after its release {high_after_release:?}; doctor before the write-back: {said:?}",
                if same_token { "copy at the object's token" } else { "copy below the object" },
                if release_only { ", a inspected and released" } else { ", a reacquired" },
                if release_only { "inspect" } else { "reacquire" },
                again.json()["notices"],
                body(&old)["token"]
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The same gap reached by a crash instead of a lost answer: a's grant writes its record
/// (token 3) and is killed (SIGKILL: an OOM kill, a node lost) before it raises the
/// high-water object (the proxy holds that put). a's supervisor starts the job again: its
/// `acquire` is "reacquired", exit 0, no warning; the job releases. An older copy written
/// back (token 1, below the object's 2) makes the next grant repeat token 3.
fn a_grant_killed_before_its_raise_then_reacquired_leaves_no_token_to_repeat(on: Backend) {
    let store = Store::new(on);
    let (server, _) = store.server();
    let first = grant(&store, "r", "p1", "10m");
    release(&store, "r", "p1", first);
    let old = record(&store, "r");
    let second = grant(&store, "r", "p2", "10m");
    release(&store, "r", "p2", second);
    let tokens = high_key(&store, "r");
    let held = Arc::new(AtomicBool::new(false));
    let go = Arc::new(AtomicBool::new(false));
    let (held2, go2) = (held.clone(), go.clone());
    let proxy = HttpProxy::start(
        server.addr(),
        Arc::new(move |request| {
            if is_write(request) && addresses(request, &tokens) {
                held2.store(true, Ordering::SeqCst);
                let start = Instant::now();
                while !go2.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                return Verdict::Cut;
            }
            Verdict::Forward
        }),
    );
    let mut child = store
        .fence()
        .env(endpoint_var(&store), proxy.endpoint())
        .args([
            "acquire", "r", "--owner", "a", "--ttl", "10m", "--format", "json",
        ])
        .spawn();
    common::wait_for("a's raise", Duration::from_secs(20), || {
        held.load(Ordering::SeqCst)
    });
    child.kill().unwrap();
    let _ = child.wait();
    go.store(true, Ordering::SeqCst);
    drop(proxy);
    let (owner, token, state) = record_summary(&store, "r");
    assert_eq!((owner.as_str(), state.as_str()), ("a", "held"), "premise");
    assert_eq!(high_water(&store, "r"), Some(second), "premise: not raised");
    let again = fence(&store, &["acquire", "r", "--owner", "a", "--ttl", "10m"]);
    assert_eq!(again.code, 0, "{again:?}");
    let told = again.json()["token"].as_i64().unwrap();
    assert_eq!(told, token);
    let high_after_reacquire = high_water(&store, "r");
    release(&store, "r", "a", told);
    write_back(&store, "r", &old);
    let out = fence(&store, &["acquire", "r", "--owner", "d", "--ttl", "10m"]);
    assert_eq!(out.code, 0, "{out:?}");
    let d = out.json()["token"].as_i64().unwrap();
    assert!(
        d > told,
        "token {told} was granted to `a` (reacquired, exit 0: {}) and issued again to `d` ({d}); high-water object after a's reacquire: {high_after_reacquire:?}",
        again.stdout.trim()
    );
}

// ---------------------------------------------------------------------------------------------
// Finding F: a renewal or release refused by the high-water object (`stale_copy`) is not
// recorded, while the same refusal decided on the record alone is (`renew_rejected`).
// ---------------------------------------------------------------------------------------------

/// The names of the refusal event objects (`<seq>-1-…`) under `events/<enc>/`, with their
/// bodies.
fn refusal_events(store: &Store, resource: &str) -> Vec<String> {
    let (server, prefix) = store.server();
    let dir = format!("{prefix}/events/{}", objects::encode_key(resource));
    server
        .list(&dir)
        .into_iter()
        .filter_map(|key| {
            let stored = server.get(&key)?;
            let text = String::from_utf8_lossy(&stored.body).into_owned();
            text.contains("rejected").then_some(text)
        })
        .collect()
}

/// Baseline: a's renew of token 1 after tokens 2 and 3 were issued is exit 4 and leaves a
/// `renew_rejected` event in the bucket. After a's held token-1 record is written back, the
/// same renew is exit 4 (refused by the high-water object) and leaves none: `fence log`
/// misses a refused stale token — the very event an operator looks for after a write-back.
fn a_stale_renewal_refused_by_the_high_water_object_is_recorded(on: Backend) {
    let store = Store::new(on);
    let first = grant(&store, "r", "a", "10m");
    let old = record(&store, "r");
    release(&store, "r", "a", first);
    let second = grant(&store, "r", "b", "10m");
    release(&store, "r", "b", second);
    let t1 = first.to_string();
    let out = fence(&store, &["renew", "r", "--owner", "a", "--token", &t1]);
    assert_eq!(out.code, 4, "{out:?}");
    let baseline = refusal_events(&store, "r");
    assert_eq!(
        baseline.len(),
        1,
        "baseline: the refusal is recorded: {baseline:?}"
    );
    write_back(&store, "r", &old);
    let out = fence(&store, &["renew", "r", "--owner", "a", "--token", &t1]);
    assert_eq!(out.code, 4, "{out:?}");
    let after = refusal_events(&store, "r");
    assert_eq!(
        after.len(),
        2,
        "the renewal of stale token {first} refused by the high-water object left no event: {after:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Finding H (minor): `fence doctor`'s `object.high_water` reads the record before the
// high-water object, so a grant between the two reads is reported as "an older copy written
// back" — a false accusation of a write-back (a warning, nothing changed).
// ---------------------------------------------------------------------------------------------

/// a holds nothing; the record is b's released token 2, the object says 2. Doctor reads the
/// record (token 2); before it reads the high-water object, c is granted token 3 (the object
/// is raised to 3). Doctor then reports `r`'s lease object "holds token 2, below its
/// high-water object's 3: an older copy of it was written back" — nothing was written back.
fn doctor_does_not_report_a_write_back_when_a_grant_lands_between_its_reads(on: Backend) {
    let store = Store::new(on);
    let (server, _) = store.server();
    let first = grant(&store, "r", "a", "10m");
    release(&store, "r", "a", first);
    let second = grant(&store, "r", "b", "10m");
    release(&store, "r", "b", second);
    let tokens = high_key(&store, "r");
    let held = Arc::new(AtomicBool::new(false));
    let go = Arc::new(AtomicBool::new(false));
    let (held2, go2) = (held.clone(), go.clone());
    let proxy = HttpProxy::start(
        server.addr(),
        Arc::new(move |request| {
            if request.method == "GET"
                && addresses(request, &tokens)
                && !held2.swap(true, Ordering::SeqCst)
            {
                let start = Instant::now();
                while !go2.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            Verdict::Forward
        }),
    );
    let child = store
        .fence()
        .env(endpoint_var(&store), proxy.endpoint())
        .args(["doctor", "--format", "json"])
        .spawn();
    common::wait_for(
        "doctor's read of the high-water object",
        Duration::from_secs(30),
        || held.load(Ordering::SeqCst),
    );
    let third = grant(&store, "r", "c", "10m");
    go.store(true, Ordering::SeqCst);
    let out = Out::from(common::wait_output(
        "doctor",
        child,
        Duration::from_secs(60),
    ));
    show(&["doctor (through the proxy)"], &out);
    let findings = common::doctor_findings(&out.json(), "object.high_water");
    assert!(
        !findings.iter().any(|(_, msg, _)| msg.contains("written back")),
        "no copy was written back (tokens {first}, {second}, {third} granted in order, the record and the object read directly: {:?}, {:?}), yet doctor says: {findings:?}",
        record_summary(&store, "r"),
        high_water(&store, "r")
    );
}

// ---------------------------------------------------------------------------------------------
// What held (these pass): kept as evidence of what was tried.
// ---------------------------------------------------------------------------------------------

/// Held: eight owners race for a resource whose record is a written-back copy (a's token 1,
/// held, live by its new Last-Modified; token 3 issued). Exactly one is granted, with a token
/// above 3; the rest are busy on the winner (not on the copy); the high-water object ends at
/// the winner's token.
fn held_racing_grants_over_a_written_back_copy_issue_one_new_token(on: Backend) {
    let store = Store::new(on);
    let first = grant(&store, "r", "a", "10m");
    let old = record(&store, "r");
    release(&store, "r", "a", first);
    let second = grant(&store, "r", "b", "10m");
    release(&store, "r", "b", second);
    let third = grant(&store, "r", "c", "10m");
    release(&store, "r", "c", third);
    write_back(&store, "r", &old);
    let children: Vec<_> = (0..8)
        .map(|i| {
            store
                .fence()
                .args(["acquire", "r", "--owner", &format!("w{i}"), "--ttl", "10m"])
                .args(["--format", "json"])
                .spawn()
        })
        .collect();
    let outs: Vec<Out> = children
        .into_iter()
        .map(|c| Out::from(common::wait_output("acquire", c, Duration::from_secs(60))))
        .collect();
    let granted: Vec<i64> = outs
        .iter()
        .filter(|o| o.code == 0)
        .map(|o| o.json()["token"].as_i64().unwrap())
        .collect();
    let (owner, token, state) = record_summary(&store, "r");
    assert_eq!(granted.len(), 1, "{outs:#?}");
    assert!(granted[0] > third, "{granted:?} after {third}");
    assert_eq!((token, state.as_str()), (granted[0], "held"));
    for o in outs.iter().filter(|o| o.code != 0) {
        assert_eq!(o.code, 3, "{o:?}");
        assert!(o.stdout.contains(&owner), "busy on the winner: {o:?}");
    }
    assert_eq!(high_water(&store, "r"), Some(granted[0]));
}

/// Held: a grant whose raise of the high-water object loses to a newer raise (the proxy holds
/// b's raise until c has taken over and raised it higher) never lowers it: b's put is
/// conditioned on the version b read, so it is refused and b reads the higher token.
fn held_a_late_raise_never_lowers_the_high_water_object(on: Backend) {
    let store = Store::new(on);
    let (server, _) = store.server();
    let first = grant(&store, "r", "a", "10m");
    release(&store, "r", "a", first);
    let tokens = high_key(&store, "r");
    let held = Arc::new(AtomicBool::new(false));
    let go = Arc::new(AtomicBool::new(false));
    let (held2, go2) = (held.clone(), go.clone());
    let proxy = HttpProxy::start(
        server.addr(),
        Arc::new(move |request| {
            if is_write(request)
                && addresses(request, &tokens)
                && !held2.swap(true, Ordering::SeqCst)
            {
                let start = Instant::now();
                while !go2.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            Verdict::Forward
        }),
    );
    // b: a short lease, so that c may take it over while b's raise is held.
    let ttl = "2s";
    let child = store
        .fence()
        .env(endpoint_var(&store), proxy.endpoint())
        .args([
            "acquire", "r", "--owner", "b", "--ttl", ttl, "--format", "json",
        ])
        .spawn();
    common::wait_for("b's raise", Duration::from_secs(20), || {
        held.load(Ordering::SeqCst)
    });
    let b_token = record_summary(&store, "r").1;
    store.wait_expired("r");
    let c = grant(&store, "r", "c", "10m");
    assert!(c > b_token);
    assert_eq!(high_water(&store, "r"), Some(c));
    go.store(true, Ordering::SeqCst);
    let out = Out::from(common::wait_output("b", child, Duration::from_secs(60)));
    show(&["acquire (b, through the proxy)"], &out);
    assert_eq!(
        high_water(&store, "r"),
        Some(c),
        "b's late raise to {b_token} lowered the high-water object below c's {c}"
    );
}

/// Held: `acquire --above N` over a written-back copy held by the same owner: a new token
/// above both N and the high-water object, never the copy's token reacquired.
fn held_above_over_a_written_back_copy_is_a_new_token(on: Backend) {
    let store = Store::new(on);
    let first = grant(&store, "r", "a", "10m");
    let old = record(&store, "r");
    release(&store, "r", "a", first);
    let second = grant(&store, "r", "b", "10m");
    release(&store, "r", "b", second);
    write_back(&store, "r", &old);
    let out = fence(
        &store,
        &[
            "acquire", "r", "--owner", "a", "--ttl", "10m", "--above", "1",
        ],
    );
    assert_eq!(out.code, 0, "{out:?}");
    let json = out.json();
    assert_eq!(json["reacquired"], false, "{out:?}");
    assert!(json["token"].as_i64().unwrap() > second, "{out:?}");
    assert_eq!(high_water(&store, "r"), json["token"].as_i64());
}

/// Held: a deleted lease record with its high-water object left: the next grant continues
/// above the object (create-only put of a new record), never at 1.
fn held_a_deleted_record_does_not_restart_tokens(on: Backend) {
    let store = Store::new(on);
    let (server, _) = store.server();
    let first = grant(&store, "r", "a", "10m");
    release(&store, "r", "a", first);
    let second = grant(&store, "r", "b", "10m");
    release(&store, "r", "b", second);
    server.delete(&lease_key(&store, "r"));
    let third = grant(&store, "r", "c", "10m");
    assert!(third > second, "token {third} after {second}");
    assert_eq!(high_water(&store, "r"), Some(third));
}

/// Held (doctor): after a write-back `object.high_water` names it (warn), and doctor changes
/// neither the record nor the high-water object; its scratch object under `tokens/` is gone.
fn held_doctor_names_a_write_back_and_changes_nothing(on: Backend) {
    let store = Store::new(on);
    let (server, prefix) = store.server();
    let first = grant(&store, "r", "a", "10m");
    let old = record(&store, "r");
    release(&store, "r", "a", first);
    let second = grant(&store, "r", "b", "10m");
    release(&store, "r", "b", second);
    write_back(&store, "r", &old);
    let before = (record(&store, "r").body, high_water(&store, "r"));
    let out = fence(&store, &["doctor"]);
    let findings = common::doctor_findings(&out.json(), "object.high_water");
    let writes = common::doctor_findings(&out.json(), "object.high_water_writes");
    assert!(
        findings
            .iter()
            .any(|(sev, msg, _)| sev == "warn" && msg.contains("written back")),
        "{findings:?}"
    );
    assert!(writes.iter().all(|(sev, _, _)| sev == "ok"), "{writes:?}");
    assert_eq!((record(&store, "r").body, high_water(&store, "r")), before);
    let left: Vec<String> = server
        .list(&format!("{prefix}/tokens"))
        .into_iter()
        .filter(|k| k.contains(".doctor"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Held: `fence run` whose record is written back. a's record (token 1, held) is the old
/// copy; b runs `sleep 120` under `fence run --ttl 30s` (token 2, renewals every 10 s). a's
/// copy is written back right after b's grant and left alone past b's next renewal (12 s):
/// that renewal is refused `never_issued` (exit 6, Finding C), which `run` takes for a
/// passing failure and retries every 0.5 s. Then c is granted (token 3): b's next retry is
/// stale and its command stopped within a couple of seconds (exit 5, "taken over"): the
/// overlap is bounded by the retry interval, not by b's bound. (Tried because Finding C
/// made `run` see a conflict; it held.)
fn held_run_stops_soon_after_its_written_back_record_is_taken_over(on: Backend) {
    let store = Store::new(on);
    let first = grant(&store, "r", "a", "10m");
    let old = record(&store, "r");
    release(&store, "r", "a", first);
    let child = store
        .fence()
        .args([
            "run", "r", "--owner", "b", "--ttl", "30s", "--", "sleep", "120",
        ])
        .spawn();
    common::wait_for("b's grant", Duration::from_secs(30), || {
        let (owner, _, state) = record_summary(&store, "r");
        owner.starts_with("b") && state == "held"
    });
    let b_token = record_summary(&store, "r").1;
    write_back(&store, "r", &old);
    std::thread::sleep(Duration::from_secs(12));
    let (owner, token, _) = record_summary(&store, "r");
    assert_eq!(
        (owner.as_str(), token),
        ("a", first),
        "the copy is still there"
    );
    let at = Instant::now();
    let c = grant(&store, "r", "c", "10m");
    assert!(c > b_token, "premise (I1): token {c} after {b_token}");
    let output = common::wait_output("b's run", child, Duration::from_secs(90));
    let stopped_after = at.elapsed();
    let out = Out::from(output);
    show(&["run r --owner b --ttl 30s -- sleep 120"], &out);
    assert!(
        stopped_after < Duration::from_secs(4) && out.code == 5,
        "b's command (token {b_token}) ran {stopped_after:?} after c was granted token {c}; exit {}: {}",
        out.code,
        out.stderr.trim()
    );
}

crate::per_service!(
    inspect_does_not_show_a_written_back_copy_held_when_a_grant_lands_between_its_reads,
    a_stale_token_whose_released_record_was_written_back_is_refused_as_stale,
    refusals_after_a_write_back_name_the_highest_token_issued,
    history_archived_before_a_write_back_survives_later_writes,
    a_grant_reacquired_after_a_lost_answer_leaves_no_token_to_repeat,
    a_grant_killed_before_its_raise_then_reacquired_leaves_no_token_to_repeat,
    a_stale_renewal_refused_by_the_high_water_object_is_recorded,
    doctor_does_not_report_a_write_back_when_a_grant_lands_between_its_reads,
    held_run_stops_soon_after_its_written_back_record_is_taken_over,
    held_racing_grants_over_a_written_back_copy_issue_one_new_token,
    held_a_late_raise_never_lowers_the_high_water_object,
    held_above_over_a_written_back_copy_is_a_new_token,
    held_a_deleted_record_does_not_restart_tokens,
    held_doctor_names_a_write_back_and_changes_nothing,
);
