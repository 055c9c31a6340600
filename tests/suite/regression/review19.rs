//! Review 19: adversarial review of commit ceff2fd (reviews 17 and 18's fixes): the secrets
//! redacted from values that are not URLs, and hints that name a resource starting with `-`.
//! Each test states what the contract (docs/DESIGN.md §5, §10) promises, what fence did
//! instead, and asserts on the exit status and on what a person or script does with the output.

use std::time::Duration;

use crate::common;

use common::{Backend, Out, Store};

// ---------------------------------------------------------------------------------------------
// 1. A password in a libpq keyword/value string that `redact_keywords` does not parse as libpq.
// ---------------------------------------------------------------------------------------------

const SECRET: &str = "hunter2";

/// FINDING: DESIGN §10, "Secrets are never printed". Review 18's fix (`redact_loose` and
/// `redact_keywords`, src/url.rs) drops `password=` words from a store value that is not a URL
/// before the refusal "`…` is not a store URL fence understands" echoes it. But it splits the
/// value on the space character alone and ends a quoted value at the first word ending in
/// `'`, while libpq (the syntax the value is written in, `PQconnectdb`) separates pairs by any
/// white space and takes a backslash as an escape, in quoted and unquoted values alike; and
/// the user info of a value without `://` is cut at its first `@`, while a URL's host part is
/// cut after its last `@` (a password holding an `@`). So fence still prints, on stderr and
/// in the JSON `message` (exit 2):
/// - `host=127.0.0.1<TAB>password=hunter2 dbname=app` whole (a tab before the keyword; a
///   newline likewise: a conninfo pasted from a file of several lines);
/// - `user=app password='a b\' hunter2' host=db` as `user=app hunter2' host=db`;
/// - `user=app password=a\ hunter2 host=db` as `user=app hunter2 host=db`;
/// - `postgresql:/app:p@hunter2@127.0.0.1:1/app` as `postgresql@hunter2@127.0.0.1:1/app`.
///
/// The fix belongs in `redact_keywords` (split on any ASCII white space, honour `\` escapes
/// inside and outside quotes) and `redact_loose` (the user info ends at the last `@` before
/// the host, as `redact_url` cuts the host part; or drop everything before the last `@`).
#[test]
fn a_password_in_a_keyword_value_string_is_never_printed_whatever_its_spacing_or_escapes() {
    let store = Store::new(Backend::File);
    let home = store.home.path();
    let values = [
        format!("host=127.0.0.1\tpassword={SECRET} dbname=app"),
        format!("host=127.0.0.1\npassword={SECRET} dbname=app"),
        format!("user=app password='a b\\' {SECRET}' host=db"),
        format!("user=app password=a\\ {SECRET} host=db"),
        format!("postgresql:/app:p@{SECRET}@127.0.0.1:1/app"),
    ];
    let mut leaks = Vec::new();
    for value in &values {
        for format in ["human", "json"] {
            let out = common::Fence::bare(home)
                .args(["--store", value, "--format", format, "inspect"])
                .run()
                .expect(2);
            if out.stdout.contains(SECRET) || out.stderr.contains(SECRET) {
                leaks.push(format!("--store {value:?} ({format}): {out:?}"));
            }
        }
    }
    assert!(
        leaks.is_empty(),
        "the password is printed:\n{}",
        leaks.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// 2. `doctor --held-over`'s hint for a resource named like an option.
// ---------------------------------------------------------------------------------------------

/// FINDING: review 18's fix made every hint put a resource that starts with `-` after `--`
/// (src/error.rs `command_for`/`resource_word`), so that the command runs as written. The
/// finding `leases.held_over` of `fence doctor --held-over` (src/cmd/doctor/mod.rs) still
/// builds its command with `shell_word` alone: for a lease on `-x` its fix says "`fence log
/// -x` shows its run", and that command, run as written, is a usage error (exit 2,
/// "unexpected argument '-x' found"), not the log it promises. The fix belongs in
/// `doctor::held_over` (src/cmd/doctor/mod.rs): `resource_word(&v.resource)`.
#[test]
fn doctors_held_over_hint_for_a_resource_named_like_an_option_runs_as_written() {
    let store = Store::new(Backend::File);
    store
        .fence()
        .args(["acquire", "--owner", "a", "--ttl", "10m", "--", "-x"])
        .run()
        .expect(0);
    let mut fix = String::new();
    common::wait_for(
        "doctor to find `-x` held over 1ms",
        Duration::from_secs(30),
        || {
            let out = store
                .fence()
                .args(["doctor", "--held-over", "1ms", "--format", "json"])
                .run();
            let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_default();
            let found = json["findings"].as_array().and_then(|findings| {
                findings
                    .iter()
                    .find(|f| f["check"] == "leases.held_over")
                    .and_then(|f| f["fix"].as_str().map(str::to_owned))
            });
            match found {
                Some(found) => {
                    fix = found;
                    true
                }
                None => false,
            }
        },
    );
    let command = fix
        .split('`')
        .find(|part| part.starts_with("fence ") && part.contains(" log "))
        .unwrap_or_else(|| panic!("the fix names a log command: {fix}"));
    let ran = Out::from(
        common::clean_command("sh", store.home.path())
            .args([
                "-c",
                &format!("fence() {{ \"$FENCE_BIN\" \"$@\"; }}; {command}"),
            ])
            .env("FENCE_BIN", common::fence_bin())
            .env("FENCE_STORE", &store.url)
            .output()
            .expect("sh runs"),
    );
    assert!(
        ran.code == 0 && ran.stdout.contains("acquired"),
        "doctor's fix says `{command}`; run as written it answered exit {}: {ran:?}",
        ran.code
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Object stores: two releases of one lease, both told they released it.
// ---------------------------------------------------------------------------------------------

/// FINDING: DESIGN §3 (`release` is idempotent: a second release of the same lease is
/// "already released", JSON `already_released: true`) and §12 (a retry is recognised by its
/// nonce, as *this call's* write). Review 17 made a release also recognise "its own"
/// Released change in a later record's history by (seq, owner, token) alone
/// (src/coordinator/object.rs `release`). Two releases of `a`'s lease (token 1) run at once
/// (a `fence run` ending while its operator releases by hand with `--owner a --token 1`):
/// both read version 1 and put version 2 conditioned on it; `B` wins; `A`'s put is refused
/// 412 (the proxy holds it until B is done: not a race). A reads again: B's record, whose
/// history has a Released change numbered 2 by `a` with token 1 — exactly what A had tried.
///
/// Before review 17, A saw the record released by someone else and answered "already
/// released" (as the directory and PostgreSQL stores answer the second of two releases).
/// Now both A and B report `already_released: false`: A claims a release it never made
/// (its write was refused), and a script that acts on who released (logs, metrics, "I freed
/// it") is told twice. The fix belongs in `release`: recognise a change by something only
/// this call's write carries (its nonce, kept in the history's change), not (seq, owner,
/// token).
fn a_release_refused_by_another_release_of_the_same_lease_says_already_released(on: Backend) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::restored_objects::{
        body, endpoint_var, grant, hold_until, is_release_of, lease_key,
    };
    use common::proxy::{HttpProxy, Verdict};

    let store = Store::new(on);
    let (server, _) = store.server();
    let token = grant(&store, "r", "a", "10m");
    let key = lease_key(&store, "r");
    let held = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(AtomicBool::new(false));
    let (counted, let_go) = (held.clone(), go.clone());
    let proxy = HttpProxy::start(
        server.addr(),
        Arc::new(move |request| {
            if is_release_of(request, &key) && counted.fetch_add(1, Ordering::SeqCst) == 0 {
                hold_until(&let_go);
            }
            Verdict::Forward
        }),
    );
    let a = {
        let fence = store
            .fence()
            .env(endpoint_var(&store), proxy.endpoint())
            .args([
                "release",
                "r",
                "--owner",
                "a",
                "--token",
                &token.to_string(),
            ])
            .args(["--format", "json"]);
        std::thread::spawn(move || fence.run())
    };
    common::wait_for(
        "A's release put held in the proxy",
        Duration::from_secs(60),
        || held.load(Ordering::SeqCst) >= 1,
    );
    let b = super::restored_objects::fence(
        &store,
        &[
            "release",
            "r",
            "--owner",
            "a",
            "--token",
            &token.to_string(),
        ],
    );
    assert_eq!(b.code, 0, "the premise: B released the lease: {b:?}");
    assert_eq!(
        body(&super::restored_objects::record(&store, "r"))["state"],
        "released",
        "the premise: B's release is the record"
    );
    go.store(true, Ordering::SeqCst);
    let a = a.join().expect("A's thread");
    super::restored_objects::show(&["release (A, its put refused by B's)"], &a);
    let record = body(&super::restored_objects::record(&store, "r"));
    let releases = record["history"]
        .as_array()
        .map_or(0, |h| h.iter().filter(|c| c["kind"] == "released").count());
    assert_eq!(releases, 1, "the premise: one release applied: {record}");
    let claims = [&a, &b]
        .iter()
        .filter(|out| out.code == 0 && out.json()["already_released"] == false)
        .count();
    assert!(
        a.code == 0 && claims == 1,
        "one release was applied (B's); A's put was refused, yet A answered exit {} ({}) and B ({}): {claims} of them say they released it",
        a.code,
        a.stdout.trim(),
        b.stdout.trim()
    );
}

crate::per_service!(a_release_refused_by_another_release_of_the_same_lease_says_already_released,);
