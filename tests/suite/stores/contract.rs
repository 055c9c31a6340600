//! The lease contract (DESIGN §3, §9), on every coordinator, checked against the durable
//! record and against JSON structs that reject unknown fields, so any change to the wire
//! format is deliberate.

use crate::common;

use std::time::Duration;

use common::{Backend, Store};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireOk {
    ok: bool,
    op: String,
    resource: String,
    owner: String,
    token: i64,
    reacquired: bool,
    lease_expires_at: String,
    ttl_ms: u64,
    store: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RenewOk {
    ok: bool,
    op: String,
    resource: String,
    owner: String,
    token: i64,
    lease_expires_at: String,
    ttl_ms: u64,
    store: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseOk {
    ok: bool,
    op: String,
    resource: String,
    owner: String,
    token: i64,
    already_released: bool,
    store: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HolderOut {
    owner: String,
    token: i64,
    expires_at: String,
    expires_in_ms: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorOut {
    ok: bool,
    op: String,
    error: String,
    exit_code: i32,
    message: String,
    hint: String,
    resource: Option<String>,
    owner: Option<String>,
    token: Option<i64>,
    highest_token: Option<i64>,
    holder: Option<HolderOut>,
    holder_owner: Option<String>,
    reason: Option<String>,
    /// How long `--wait` waited before giving up (busy after a wait).
    waited_ms: Option<i64>,
    store: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InspectOut {
    ok: bool,
    op: String,
    resources: Vec<ResourceOut>,
    store: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourceOut {
    resource: String,
    state: String,
    owner: Option<String>,
    token: Option<i64>,
    acquired_at: Option<String>,
    /// Held leases only.
    #[serde(default)]
    held_for_ms: Option<i64>,
    renewed_at: Option<String>,
    expires_at: Option<String>,
    expires_in_ms: Option<i64>,
    events: Vec<EventOut>,
    waiters: Vec<WaiterOut>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WaiterOut {
    owner: String,
    since: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventOut {
    at: String,
    kind: String,
    owner: Option<String>,
    token: Option<i64>,
    detail: Option<String>,
}

/// The answer, less its `notices`: the only warning these commands may give is a slow
/// store's late answer, renewed (`Leases::kept_in_time`: S3 through moto on a loaded machine
/// can take over half of a 100 ms TTL).
fn parse<T: serde::de::DeserializeOwned>(out: &common::Out) -> T {
    let mut json = out.json();
    if let Some(notices) = json.as_object_mut().and_then(|o| o.remove("notices")) {
        let late = |n: &serde_json::Value| n.as_str().is_some_and(|n| n.contains("renewing it"));
        assert!(
            notices.as_array().is_some_and(|all| all.iter().all(late)),
            "unexpected notices: {out:?}"
        );
    }
    serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

fn acquire(store: &Store, resource: &str, owner: &str, ttl: &str) -> AcquireOk {
    let out = store
        .fence()
        .args([
            "acquire", resource, "--owner", owner, "--ttl", ttl, "--format", "json",
        ])
        .run()
        .expect(0);
    let ok: AcquireOk = parse(&out);
    assert!(ok.ok && ok.op == "acquire" && ok.resource == resource && ok.owner == owner);
    ok
}

fn lease_cmd(store: &Store, op: &str, resource: &str, owner: &str, token: i64) -> common::Out {
    store
        .fence()
        .args([
            op,
            resource,
            "--owner",
            owner,
            "--token",
            &token.to_string(),
            "--format",
            "json",
        ])
        .run()
}

fn grants(store: &Store, resource: &str) -> Vec<i64> {
    store
        .events(resource)
        .into_iter()
        .filter(|(kind, _, _)| kind == "acquired" || kind == "taken_over")
        .map(|(_, _, token)| token.unwrap())
        .collect()
}

fn same_owner_reacquires_with_the_same_token(store: &Store) {
    let first = acquire(store, "job", "alice", "30s");
    assert!(!first.reacquired);
    assert_eq!(first.ttl_ms, 30_000);
    assert!(first.lease_expires_at.ends_with('Z'), "{first:?}");
    assert!(!first.store.contains("fence-test-secret"), "{first:?}");
    let again = acquire(store, "job", "alice", "1m");
    assert!(again.reacquired);
    assert_eq!(again.token, first.token);
    assert_eq!(again.ttl_ms, 60_000);
    let kinds: Vec<_> = store
        .events("job")
        .into_iter()
        .map(|(k, _, t)| (k, t))
        .collect();
    assert_eq!(
        kinds,
        [
            ("acquired".to_owned(), Some(first.token)),
            ("reacquired".to_owned(), Some(first.token))
        ]
    );
    assert_eq!(
        store.lease("job"),
        Some(("alice".to_owned(), first.token, true))
    );
}

fn another_owner_is_busy_with_the_holder_reported(store: &Store) {
    let held = acquire(store, "job", "alice", "30s");
    let out = store
        .fence()
        .args(["acquire", "job", "--owner", "bob", "--format", "json"])
        .run()
        .expect(3);
    let err: ErrorOut = parse(&out);
    assert!(!err.ok);
    assert_eq!(
        (err.op.as_str(), err.error.as_str(), err.exit_code),
        ("acquire", "busy", 3)
    );
    assert_eq!(err.resource.as_deref(), Some("job"));
    let holder = err.holder.expect("holder");
    assert_eq!((holder.owner.as_str(), holder.token), ("alice", held.token));
    assert!(
        holder.expires_in_ms > 20_000
            && holder.expires_in_ms <= 30_000 + store.expiry_slack().as_millis() as i64,
        "{holder:?}"
    );
    // Others are told when they may take over: the holder's expiry, plus the store's
    // timestamp resolution where it has one (object stores).
    let later =
        common::timestamp_ms(&holder.expires_at) - common::timestamp_ms(&held.lease_expires_at);
    assert!(
        (0..=store.expiry_slack().as_millis() as i64).contains(&later),
        "{holder:?} {held:?}"
    );
    assert!(
        err.message.contains("alice") && err.message.contains(&format!("token {}", held.token))
    );
    assert!(!err.hint.is_empty() && err.store.is_some());

    let human = store
        .fence()
        .args(["acquire", "job", "--owner", "bob"])
        .run()
        .expect(3);
    assert!(human.stdout.is_empty(), "{human:?}");
    let first_line = human.stderr.lines().next().unwrap();
    assert!(first_line.starts_with("fence: error: "), "{human:?}");
    assert!(
        first_line.contains("`alice`") && first_line.contains(&format!("token {}", held.token))
    );
    assert!(
        human.stderr.lines().nth(1).unwrap().starts_with("hint: "),
        "{human:?}"
    );

    // The refusal changed nothing and recorded no grant for bob.
    assert_eq!(
        store.lease("job"),
        Some(("alice".to_owned(), held.token, true))
    );
    assert!(store
        .events("job")
        .iter()
        .all(|(_, owner, _)| owner.as_deref() == Some("alice")));
}

fn renew_extends_and_keeps_or_changes_the_ttl(store: &Store) {
    let held = acquire(store, "job", "alice", "10s");
    let out = lease_cmd(store, "renew", "job", "alice", held.token).expect(0);
    let renewed: RenewOk = parse(&out);
    assert!(renewed.ok && renewed.op == "renew");
    assert_eq!((renewed.token, renewed.ttl_ms), (held.token, 10_000));
    assert_eq!(
        (renewed.resource.as_str(), renewed.owner.as_str()),
        ("job", "alice")
    );
    assert!(renewed.lease_expires_at >= held.lease_expires_at);
    assert!(!renewed.store.is_empty());
    let out = store
        .fence()
        .args([
            "renew",
            "job",
            "--owner",
            "alice",
            "--token",
            &held.token.to_string(),
            "--ttl",
            "2m",
        ])
        .args(["--format", "json"])
        .run()
        .expect(0);
    assert_eq!(parse::<RenewOk>(&out).ttl_ms, 120_000);
}

/// Waits until `resource`'s lease, granted for `ttl`, has expired by the store's own clock
/// (the durable record, as fence judges it). The deadline is the TTL and the store's slack
/// with a wide margin: a bound for a hang, not a timing.
fn wait_expired(store: &Store, resource: &str, ttl: Duration) {
    common::wait_for(
        &format!("the lease of `{resource}` to expire"),
        ttl + store.expiry_slack() + Duration::from_secs(30),
        || store.lease(resource).is_some_and(|(_, _, live)| !live),
    );
}

fn renew_after_expiry_is_lease_lost(store: &Store) {
    let held = acquire(store, "job", "alice", "200ms");
    wait_expired(store, "job", Duration::from_millis(200));
    let out = lease_cmd(store, "renew", "job", "alice", held.token).expect(5);
    let err: ErrorOut = parse(&out);
    assert_eq!((err.error.as_str(), err.exit_code), ("lease_lost", 5));
    assert_eq!(err.reason.as_deref(), Some("expired"));
    assert_eq!(
        (err.token, err.owner.as_deref()),
        (Some(held.token), Some("alice"))
    );
    // A late renew never revives the lease.
    assert_eq!(
        store.lease("job"),
        Some(("alice".to_owned(), held.token, false))
    );
    let last = store.events("job").pop().unwrap();
    assert_eq!(
        (last.0.as_str(), last.2),
        ("renew_rejected", Some(held.token))
    );
}

fn late_renew_and_release_are_stale_and_leave_the_newer_lease(store: &Store) {
    // A second, not 200 ms: a grant a loaded machine answers after half its TTL is renewed
    // at once (`renewed` events this test does not expect; seen on S3 beside other work).
    let old = acquire(store, "job", "alice", "1s");
    wait_expired(store, "job", Duration::from_secs(1));
    let new = acquire(store, "job", "bob", "30s");
    assert!(new.token > old.token);
    for op in ["renew", "release"] {
        let out = lease_cmd(store, op, "job", "alice", old.token).expect(4);
        let err: ErrorOut = parse(&out);
        assert_eq!(
            (err.op.as_str(), err.error.as_str(), err.exit_code),
            (op, "stale_fencing_token", 4)
        );
        assert_eq!(
            (err.token, err.highest_token),
            (Some(old.token), Some(new.token))
        );
        assert_eq!(
            store.lease("job"),
            Some(("bob".to_owned(), new.token, true))
        );
    }
    let kinds: Vec<String> = store.events("job").into_iter().map(|(k, _, _)| k).collect();
    assert_eq!(
        kinds,
        [
            "acquired",
            "taken_over",
            "renew_rejected",
            "release_rejected"
        ]
    );
    // The newer owner's lease still works.
    lease_cmd(store, "renew", "job", "bob", new.token).expect(0);
}

fn release_twice_succeeds_and_the_counter_survives(store: &Store) {
    let held = acquire(store, "job", "alice", "30s");
    let first: ReleaseOk =
        parse(&lease_cmd(store, "release", "job", "alice", held.token).expect(0));
    assert!(first.ok && first.op == "release" && !first.already_released);
    assert_eq!(
        (first.resource.as_str(), first.owner.as_str(), first.token),
        ("job", "alice", held.token)
    );
    assert!(!first.store.is_empty());
    let second: ReleaseOk =
        parse(&lease_cmd(store, "release", "job", "alice", held.token).expect(0));
    assert!(second.already_released);
    assert_eq!(
        store.lease("job"),
        Some(("alice".to_owned(), held.token, false))
    );
    // Free again: anyone may take it, and the token goes on up (never back to 1).
    let next = acquire(store, "job", "bob", "30s");
    assert!(next.token > held.token);
    // Renewing a released lease is lease_lost, not success.
    let err: ErrorOut = parse(&lease_cmd(store, "renew", "job", "alice", held.token).expect(4));
    assert_eq!(err.highest_token, Some(next.token));
    assert_eq!(grants(store, "job"), [held.token, next.token]);
}

fn renew_of_a_released_lease_is_lease_lost(store: &Store) {
    let held = acquire(store, "job", "alice", "30s");
    lease_cmd(store, "release", "job", "alice", held.token).expect(0);
    let err: ErrorOut = parse(&lease_cmd(store, "renew", "job", "alice", held.token).expect(5));
    assert_eq!(err.reason.as_deref(), Some("released"));
}

fn tokens_not_issued_to_this_owner_are_conflicts(store: &Store) {
    let err: ErrorOut = parse(&lease_cmd(store, "renew", "nothing", "alice", 1).expect(6));
    assert_eq!(
        (err.error.as_str(), err.reason.as_deref()),
        ("conflict", Some("no_lease"))
    );
    let held = acquire(store, "job", "alice", "30s");
    let err: ErrorOut = parse(&lease_cmd(store, "release", "job", "mallory", held.token).expect(6));
    assert_eq!(err.reason.as_deref(), Some("wrong_owner"));
    assert_eq!(err.holder_owner.as_deref(), Some("alice"));
    let err: ErrorOut = parse(&lease_cmd(store, "renew", "job", "alice", held.token + 5).expect(6));
    assert_eq!(
        (err.reason.as_deref(), err.highest_token),
        (Some("never_issued"), Some(held.token))
    );
    assert_eq!(
        store.lease("job"),
        Some(("alice".to_owned(), held.token, true))
    );
}

fn inspect_shows_state_owner_token_expiry_and_events(store: &Store) {
    let a = acquire(store, "alpha", "alice", "30s");
    lease_cmd(store, "renew", "alpha", "alice", a.token).expect(0);
    let b = acquire(store, "beta", "bob", "30s");
    lease_cmd(store, "release", "beta", "bob", b.token).expect(0);
    // Short, but not so short that an object store's grant (four requests since the
    // high-water object) answers after half of it on a loaded machine.
    acquire(store, "gamma", "carol", "500ms");
    wait_expired(store, "gamma", Duration::from_millis(500));

    let out = store
        .fence()
        .args([
            "inspect", "alpha", "beta", "gamma", "never", "--format", "json",
        ])
        .run()
        .expect(0);
    let view: InspectOut = parse(&out);
    assert!(view.ok && view.op == "inspect" && !view.store.is_empty());
    let names: Vec<&str> = view.resources.iter().map(|r| r.resource.as_str()).collect();
    assert_eq!(names, ["alpha", "beta", "gamma", "never"]);
    let [alpha, beta, gamma, never] = &view.resources[..] else {
        unreachable!()
    };

    assert_eq!(
        (alpha.state.as_str(), alpha.owner.as_deref(), alpha.token),
        ("held", Some("alice"), Some(a.token))
    );
    assert!(alpha.expires_in_ms.unwrap() > 20_000);
    assert!(
        alpha.acquired_at.is_some() && alpha.renewed_at.is_some() && alpha.expires_at.is_some()
    );
    // How long the live lease has been held, by the store's clock: held leases only.
    assert!(alpha.held_for_ms.is_some_and(|held| held >= 0), "{alpha:?}");
    assert!(never.held_for_ms.is_none(), "{never:?}");
    let kinds: Vec<&str> = alpha.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["renewed", "acquired"], "most recent first");
    assert!(alpha
        .events
        .iter()
        .all(|e| e.owner.as_deref() == Some("alice") && e.token == Some(a.token)));
    assert!(alpha.events[0].at >= alpha.events[1].at && alpha.events[0].detail.is_none());

    assert_eq!(
        (beta.state.as_str(), beta.owner.as_deref(), beta.token),
        ("free", None, Some(b.token))
    );
    assert_eq!(
        (beta.expires_at.as_deref(), beta.expires_in_ms),
        (None, None)
    );
    assert_eq!(beta.events[0].kind, "released");

    assert_eq!(gamma.state, "expired");
    assert!(gamma.expires_in_ms.unwrap() <= 0);

    assert_eq!(
        (never.state.as_str(), never.token, never.owner.as_deref()),
        ("free", None, None)
    );
    assert!(never.events.is_empty() && never.acquired_at.is_none());
    assert!(view.resources.iter().all(|r| r.waiters.is_empty()));

    // --history bounds the events; no names lists every resource without events.
    let view: InspectOut = parse(
        &store
            .fence()
            .args(["inspect", "alpha", "--history", "1", "--format", "json"])
            .run()
            .expect(0),
    );
    assert_eq!(view.resources[0].events.len(), 1);
    let view: InspectOut = parse(
        &store
            .fence()
            .args(["inspect", "--format", "json"])
            .run()
            .expect(0),
    );
    let names: Vec<&str> = view.resources.iter().map(|r| r.resource.as_str()).collect();
    assert_eq!(names, ["alpha", "beta", "gamma"]);
    assert!(view.resources.iter().all(|r| r.events.is_empty()));

    let human = store.fence().args(["inspect", "alpha"]).run().expect(0);
    assert!(
        human.stdout.contains("alpha")
            && human.stdout.contains("held")
            && human.stdout.contains("alice")
    );
    assert!(human.stdout.contains("renewed"), "{human:?}");
}

fn eval_idiom_carries_the_lease_to_renew_and_release(store: &Store) {
    // An owner with quotes and a command substitution must survive `eval` unchanged.
    let owner = r#"it's "$(touch pwned)" `x`"#;
    let fence = common::fence_bin();
    let fence = fence.to_string_lossy();
    let script = format!(
        r#"set -e
eval "$("{fence}" acquire 'odd name' --owner "$OWNER" --format env)"
test "$FENCE_OWNER" = "$OWNER"
"{fence}" renew --format json
"{fence}" release --format json
"#
    );
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c").arg(&script).current_dir(store.home.path());
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap())
        .env("HOME", store.home.path())
        .env("OWNER", owner)
        .env("FENCE_STORE", &store.url);
    if let Some(schema) = &store.schema {
        // `--format env` exports the URL without its password; the password comes from
        // the environment, as libpq's would (or from ~/.pgpass, see tests/suite/stores/pgpass.rs).
        cmd.env("FENCE_SCHEMA", schema)
            .env("PGPASSWORD", common::env_or_panic("FENCE_TEST_PG_PASSWORD"));
    }
    if let Some((server, _)) = &store.objects {
        cmd.envs(server.env());
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let renewed: RenewOk = serde_json::from_str(lines[0]).unwrap();
    let released: ReleaseOk = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(
        (renewed.owner.as_str(), renewed.resource.as_str()),
        (owner, "odd name")
    );
    assert!(!released.already_released);
    assert!(
        !store.home.path().join("pwned").exists(),
        "the owner name was executed"
    );
    let events = store.events(if store.backend == Backend::File {
        "odd%20name"
    } else {
        "odd name"
    });
    let kinds: Vec<&str> = events.iter().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(kinds, ["acquired", "renewed", "released"]);
}

fn quiet_prints_nothing_on_success(store: &Store) {
    let out = store
        .fence()
        .args(["-q", "acquire", "job", "--owner", "alice"])
        .run()
        .expect(0);
    assert_eq!((out.stdout.as_str(), out.stderr.as_str()), ("", ""));
    // Global flags are accepted after the subcommand too.
    let out = store
        .fence()
        .args(["acquire", "job", "--owner", "alice", "--quiet"])
        .run()
        .expect(0);
    assert!(out.stdout.is_empty());
}

/// `fence acquire job --owner OWNER --wait 20s`, started and seen waiting by `inspect`; returns
/// the process and that `inspect`.
// The caller waits for the returned process; a test that panics first leaves it to finish
// its 20-second wait on its own.
#[allow(clippy::zombie_processes)]
fn start_waiter(store: &Store, owner: &str) -> (std::process::Child, InspectOut) {
    let mut waiter = store
        .fence()
        .args([
            "acquire", "job", "--owner", owner, "--wait", "20s", "--format", "json",
        ])
        .cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut view = None;
    let shown = common::process::becomes(Duration::from_secs(10), || {
        let seen: InspectOut = parse(
            &store
                .fence()
                .args(["inspect", "job", "--format", "json"])
                .run()
                .expect(0),
        );
        let waiting = !seen.resources[0].waiters.is_empty();
        view = Some(seen);
        waiting
    });
    if !shown {
        let _ = waiter.kill();
        panic!(
            "the waiter never showed up: {:?}",
            waiter.wait_with_output()
        );
    }
    (waiter, view.unwrap())
}

/// Releases `held` (alice's lease on `job`) and checks that `waiter` got the next token.
fn release_to_waiter(store: &Store, held: &AcquireOk, waiter: std::process::Child, owner: &str) {
    lease_cmd(store, "release", "job", "alice", held.token).expect(0);
    let out = waiter.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let got: AcquireOk = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((got.owner.as_str(), got.token), (owner, held.token + 1));
}

fn waiters_show_in_inspect_and_get_the_lease_on_release(store: &Store) {
    let held = acquire(store, "job", "alice", "30s");
    let (waiter, view) = start_waiter(store, "patient");
    let w = &view.resources[0].waiters[0];
    assert_eq!(w.owner, "patient");
    assert!(w.since.ends_with('Z'));
    release_to_waiter(store, &held, waiter, "patient");
    let view: InspectOut = parse(
        &store
            .fence()
            .args(["inspect", "job", "--format", "json"])
            .run()
            .expect(0),
    );
    assert!(
        view.resources[0].waiters.is_empty(),
        "the waiter is gone once served"
    );
}

fn wait_gives_up_with_busy_after_its_duration(store: &Store) {
    acquire(store, "job", "alice", "30s");
    let start = std::time::Instant::now();
    let out = store
        .fence()
        .args([
            "acquire", "job", "--owner", "bob", "--wait", "300ms", "--format", "json",
        ])
        .run()
        .expect(3);
    // A lower bound (load only lengthens the wait): the waiter did not give up early.
    assert!(start.elapsed() >= Duration::from_millis(300));
    let err: ErrorOut = parse(&out);
    assert_eq!(err.holder.unwrap().owner, "alice");
    assert!(err.waited_ms.unwrap() >= 300, "{:?}", err.waited_ms);
}

/// The JSON answers are a public contract down to the byte: one compact line, keys in this
/// order. (Values vary; their names, order and layout do not.)
fn json_answers_keep_their_keys_in_order(store: &Store) {
    fn keys(out: &common::Out) -> Vec<String> {
        let value = out.json();
        assert_eq!(
            out.stdout.trim_end(),
            serde_json::to_string(&value).unwrap(),
            "one compact line"
        );
        value.as_object().unwrap().keys().cloned().collect()
    }
    let lease = ["resource", "owner", "token"];
    let with = |head: &[&str], tail: &[&str]| -> Vec<String> {
        ["ok", "op"]
            .iter()
            .chain(head)
            .chain(tail)
            .chain(&["store"])
            .map(|k| k.to_string())
            .collect()
    };
    let out = store
        .fence()
        .args(["init", "--format", "json"])
        .run()
        .expect(0);
    // PostgreSQL's adds how many waiters of a resource keep a connection (`--held-waiters`).
    let init: &[&str] = match store.backend {
        Backend::Postgres | Backend::PostgresAsync => {
            &["action", "schema_version", "location", "held_waiters"]
        }
        _ => &["action", "schema_version", "location"],
    };
    assert_eq!(keys(&out), with(init, &[]));
    let out = store
        .fence()
        .args(["acquire", "keys", "--owner", "o", "--format", "json"])
        .run()
        .expect(0);
    assert_eq!(
        keys(&out),
        with(&lease, &["reacquired", "lease_expires_at", "ttl_ms"])
    );
    let token = out.json()["token"].as_i64().unwrap();
    let out = lease_cmd(store, "renew", "keys", "o", token).expect(0);
    assert_eq!(keys(&out), with(&lease, &["lease_expires_at", "ttl_ms"]));
    let out = lease_cmd(store, "release", "keys", "o", token).expect(0);
    assert_eq!(keys(&out), with(&lease, &["already_released"]));
}

per_coordinator!(
    waiters_show_in_inspect_and_get_the_lease_on_release,
    wait_gives_up_with_busy_after_its_duration,
    same_owner_reacquires_with_the_same_token,
    another_owner_is_busy_with_the_holder_reported,
    renew_extends_and_keeps_or_changes_the_ttl,
    renew_after_expiry_is_lease_lost,
    late_renew_and_release_are_stale_and_leave_the_newer_lease,
    release_twice_succeeds_and_the_counter_survives,
    renew_of_a_released_lease_is_lease_lost,
    tokens_not_issued_to_this_owner_are_conflicts,
    inspect_shows_state_owner_token_expiry_and_events,
    eval_idiom_carries_the_lease_to_renew_and_release,
    quiet_prints_nothing_on_success,
    json_answers_keep_their_keys_in_order,
);

/// Removing a lease record by hand must not restart the counter (file store: recovered from
/// the event log; PostgreSQL: the delete is refused by a trigger).
#[test]
fn file_store_recovers_the_counter_when_a_record_is_deleted() {
    let store = Store::file();
    let first = acquire(&store, "job", "alice", "30s");
    lease_cmd(&store, "release", "job", "alice", first.token).expect(0);
    std::fs::remove_file(store.dir().join("leases/job.json")).unwrap();
    let next = acquire(&store, "job", "bob", "30s");
    assert!(next.token > first.token, "{next:?}");
}

#[test]
fn postgres_refuses_to_delete_lease_rows_or_lower_tokens() {
    let store = Store::postgres();
    let held = acquire(&store, "job", "alice", "30s");
    let schema = store.schema.clone().unwrap();
    let url = store.url.clone();
    let (delete, lower, rename) = common::block_on(async move {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let delete = client
            .execute(&format!("DELETE FROM {schema}.leases"), &[])
            .await
            .unwrap_err();
        let lower = client
            .execute(
                &format!("UPDATE {schema}.leases SET token = token - 1"),
                &[],
            )
            .await
            .unwrap_err();
        // A renamed record is a deleted one: the old name's next grant would be token 1.
        let rename = client
            .execute(
                &format!("UPDATE {schema}.leases SET resource = 'other', token = token + 1"),
                &[],
            )
            .await
            .unwrap_err();
        (
            delete.code().unwrap().code().to_owned(),
            lower.code().unwrap().code().to_owned(),
            rename.code().unwrap().code().to_owned(),
        )
    });
    assert_eq!(
        (delete.as_str(), lower.as_str(), rename.as_str()),
        ("LF004", "LF005", "LF004")
    );
    assert_eq!(
        store.lease("job"),
        Some(("alice".to_owned(), held.token, true))
    );
}

/// Every grant reports the expiry it wrote, not the previous holder's (review 13: with the
/// short acquire answering the snapshot's times, a takeover of an expired lease reported
/// that lease's expiry, already past, as its own, and exited 0). A takeover, a grant of a
/// released lease and a reacquire, each against the lease row.
#[test]
fn postgres_a_grant_reports_the_expiry_it_wrote() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    let url = store.url.clone();
    // How far the reported expiry is from the row's, in ms, and whether the row has expired.
    let against_row = move |reported: String| {
        let (schema, url) = (schema.clone(), url.clone());
        common::block_on(async move {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            let row = client
                .query_one(
                    &format!(
                        "SELECT (abs(extract(epoch FROM expires_at - $1::text::timestamptz)) * 1000)::float8, \
                         expires_at <= clock_timestamp() FROM {schema}.leases WHERE resource = 'job'"
                    ),
                    &[&reported],
                )
                .await
                .unwrap();
            (row.get::<_, f64>(0), row.get::<_, bool>(1))
        })
    };
    let first = acquire(&store, "job", "alice", "1s");
    let (apart, _) = against_row(first.lease_expires_at.clone());
    assert!(apart < 1.5, "first grant: {apart} ms from the row");
    // Until alice's lease has run out (a condition: a loaded machine may be slow).
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while !against_row(first.lease_expires_at.clone()).1 {
        assert!(
            std::time::Instant::now() < until,
            "alice's lease never ran out"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let taken = acquire(&store, "job", "bob", "60s");
    let (apart, expired) = against_row(taken.lease_expires_at.clone());
    assert!(
        apart < 1.5 && !expired,
        "takeover: {apart} ms from the row ({taken:?})"
    );
    let again = acquire(&store, "job", "bob", "60s");
    assert!(again.reacquired);
    let (apart, _) = against_row(again.lease_expires_at.clone());
    assert!(
        apart < 1.5,
        "reacquire: {apart} ms from the row ({again:?})"
    );
    lease_cmd(&store, "release", "job", "bob", again.token).expect(0);
    let granted = acquire(&store, "job", "carol", "60s");
    let (apart, _) = against_row(granted.lease_expires_at.clone());
    assert!(
        apart < 1.5,
        "after a release: {apart} ms from the row ({granted:?})"
    );
}

/// Issue 22: one-shot commands call no PL/pgSQL, so a new connection compiles none. The
/// store's role counts PL function calls (`track_functions = 'pl'`, set by the superuser for
/// its sessions); every path of acquire (grant, reacquire, busy, grant of a released lease,
/// takeover), renew (renewed, wrong owner, released, expired), release (released, twice,
/// stale) and `run` leaves `pg_stat_user_functions` without a function of fence's schema
/// (the guard trigger's function included), once every backend of the role has ended (a
/// backend flushes its counts before it leaves `pg_stat_activity`). The events show each
/// path did what it does, and the busy one neither wrote nor locked the row. Then a `--wait` acquire, PL/pgSQL by design, shows up: the check
/// can fail.
#[test]
fn postgres_one_shot_commands_call_no_plpgsql() {
    let (role, _) = common::pg_limited_role(20);
    let superuser = common::pg_superuser();
    common::pg_exec(
        &superuser,
        &format!("ALTER ROLE {role} SET track_functions = 'pl'"),
    );
    let mut store = Store::postgres();
    // The role owns the schema, so that the store's clean-up (as the role) can drop it.
    store.url = common::pg_socket_url(&role);
    let schema = store.schema.clone().unwrap();
    let called = || -> Vec<(String, i64)> {
        common::wait_for(
            "the role's backends to end",
            Duration::from_secs(30),
            || {
                common::pg_query(
                    &superuser,
                    &format!("SELECT 1 FROM pg_stat_activity WHERE usename = '{role}'"),
                )
                .is_empty()
            },
        );
        common::pg_query(
            &superuser,
            &format!(
                "SELECT funcname::text, calls FROM pg_stat_user_functions \
                 WHERE schemaname = '{schema}' ORDER BY 1"
            ),
        )
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
    };
    store.fence().args(["init", "-q"]).run().expect(0);
    assert_eq!(called(), [], "fence init called a function");

    let first = acquire(&store, "job", "alice", "30s");
    assert!(acquire(&store, "job", "alice", "30s").reacquired);
    // The row's version and locker: a busy answer neither writes nor locks it.
    let row_version = || -> (String, String) {
        let rows = common::pg_query(
            &superuser,
            &format!("SELECT xmin::text, xmax::text FROM {schema}.leases WHERE resource = 'job'"),
        );
        (rows[0].get(0), rows[0].get(1))
    };
    let before_busy = row_version();
    store
        .fence()
        .args(["acquire", "job", "--owner", "bob"])
        .run()
        .expect(3);
    assert_eq!(
        row_version(),
        before_busy,
        "a busy acquire wrote or locked the row"
    );
    lease_cmd(&store, "renew", "job", "alice", first.token).expect(0);
    lease_cmd(&store, "renew", "job", "bob", first.token).expect(6);
    lease_cmd(&store, "release", "job", "alice", first.token).expect(0);
    let twice: ReleaseOk =
        parse(&lease_cmd(&store, "release", "job", "alice", first.token).expect(0));
    assert!(twice.already_released);
    lease_cmd(&store, "renew", "job", "alice", first.token).expect(5);
    let short = acquire(&store, "job", "bob", "100ms");
    common::wait_for(
        "the lease to expire by the server's clock",
        Duration::from_secs(10),
        || {
            !common::pg_query(
                &superuser,
                &format!(
                    "SELECT 1 FROM {schema}.leases WHERE resource = 'job' \
                     AND expires_at <= clock_timestamp()"
                ),
            )
            .is_empty()
        },
    );
    lease_cmd(&store, "renew", "job", "bob", short.token).expect(5);
    let taken = acquire(&store, "job", "carol", "30s");
    lease_cmd(&store, "release", "job", "bob", short.token).expect(4);
    store
        .fence()
        .args(["run", "other", "--", "true"])
        .run()
        .expect(0);
    assert_eq!(called(), [], "a one-shot command called PL/pgSQL");

    let events: Vec<(String, String, i64, Option<String>)> = common::pg_query(
        &superuser,
        &format!(
            "SELECT kind, owner, token, detail FROM {schema}.events WHERE resource = 'job' ORDER BY id"
        ),
    )
    .iter()
    .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
    .collect();
    let event = |kind: &str, owner: &str, token: i64, detail: Option<&str>| {
        (
            kind.to_owned(),
            owner.to_owned(),
            token,
            detail.map(str::to_owned),
        )
    };
    assert_eq!(
        events,
        [
            event("acquired", "alice", 1, None),
            event("reacquired", "alice", 1, None),
            event("renewed", "alice", 1, None),
            event("released", "alice", 1, None),
            event("renew_rejected", "alice", 1, Some("released")),
            event("acquired", "bob", 2, None),
            event("renew_rejected", "bob", 2, Some("expired")),
            event("taken_over", "carol", 3, None),
            event("release_rejected", "bob", 2, Some("token 3 issued since")),
        ]
    );
    assert_eq!(
        store.lease("job"),
        Some(("carol".to_owned(), taken.token, true))
    );
    assert_eq!(taken.token, 3);

    store
        .fence()
        .args(["acquire", "queued", "--owner", "dave", "--wait", "5s", "-q"])
        .run()
        .expect(0);
    let waited: Vec<String> = called().into_iter().map(|(name, _)| name).collect();
    assert!(
        waited.contains(&"wait_enter".to_owned()),
        "the calls of a --wait acquire were not counted: {waited:?}"
    );
}

/// `fence init --format json`, which must succeed: its answer.
fn init_json(store: &Store) -> serde_json::Value {
    store
        .fence()
        .args(["init", "--format", "json"])
        .run()
        .expect(0)
        .json()
}

/// `fence init` creates the schema once and is idempotent; other commands create it lazily.
#[test]
fn postgres_init_is_idempotent() {
    let store = Store::postgres();
    let first = init_json(&store);
    assert_eq!(first["action"], "created");
    assert_eq!(first["schema_version"], 5);
    let again = init_json(&store);
    assert_eq!(again["action"], "up_to_date");
    let lazy = Store::postgres();
    acquire(&lazy, "job", "alice", "30s");
    let init = init_json(&lazy);
    assert_eq!(init["action"], "up_to_date");
}

/// A Postgres store in a schema whose name takes the 63 characters `--schema` allows.
fn longest_schema_store() -> Store {
    let mut store = Store::postgres();
    let unique = store.schema.clone().unwrap();
    let long = format!("{unique}_{}", "x".repeat(63 - unique.len() - 1));
    assert_eq!(long.len(), 63);
    store.schema = Some(long);
    store
}

/// `fence_<schema>`, fence's notification channel, is longer than PostgreSQL allows a channel
/// when the schema's name takes 58–63 characters: every release failed ("channel name too
/// long", exit 1) and no `--wait` could be granted. The channel is now cut to 63 bytes.
#[test]
fn postgres_a_schema_name_of_63_characters_releases_and_hands_over() {
    let store = longest_schema_store();
    let held = acquire(&store, "r", "alice", "30s");
    lease_cmd(&store, "release", "r", "alice", held.token).expect(0);
    // A waiter granted on a release (the release notifies, the granting poll too) and one
    // that gives up (its leave notifies).
    waiters_show_in_inspect_and_get_the_lease_on_release(&store);
    let (owner, patient, live) = store.lease("job").unwrap();
    assert_eq!((owner.as_str(), live), ("patient", true));
    lease_cmd(&store, "release", "job", "patient", patient).expect(0);
    wait_gives_up_with_busy_after_its_duration(&store);
    // What the store holds: alice's token of `job` after patient's, nobody waiting.
    let s = store.schema.clone().unwrap();
    let waiting: i64 = store.pg_rows(
        &format!("SELECT count(*) FROM {s}.waiters WHERE $1 = $1"),
        "",
    )[0]
    .get(0);
    let (owner, token, live) = store.lease("job").unwrap();
    assert_eq!(
        (owner.as_str(), token, live, waiting),
        ("alice", patient + 1, true, 0)
    );
}

/// A long-named schema made by an earlier fence keeps functions that notify on the whole
/// name: `fence init` makes them again, after which a `--wait` is granted; before it, the
/// failure says to run it.
#[test]
fn postgres_a_long_named_schema_of_an_earlier_fence_is_repaired_by_init() {
    let store = longest_schema_store();
    let s = store.schema.clone().unwrap();
    store.fence().args(["init", "-q"]).run().expect(0);
    // As the earlier fence made them: the channel named in full.
    let cut = format!("fence_{s}")[..63].to_owned();
    let full = format!("fence_{s}");
    let definitions: Vec<String> = store
        .pg_rows(
            "SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = $1 AND p.prokind = 'f' AND p.prosrc LIKE '%pg_notify%'",
            &s,
        )
        .iter()
        .map(|row| row.get::<_, String>(0).replace(&format!("'{cut}'"), &format!("'{full}'")))
        .collect();
    assert_eq!(definitions.len(), 3, "{definitions:?}");
    assert!(definitions.iter().all(|d| d.contains(&full)));
    let as_the_earlier_fence_left_them = || common::pg_exec(&store.url, &definitions.join(";\n"));
    as_the_earlier_fence_left_them();

    // The waiter's granting poll fails (and grants nothing): it says what to run.
    let held = acquire(&store, "job", "alice", "30s");
    let (waiter, _) = start_waiter(&store, "bob");
    lease_cmd(&store, "release", "job", "alice", held.token).expect(0);
    let out = waiter.wait_with_output().unwrap();
    // `--format json`: the error is the answer on stdout.
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("channel name too long")
            && said.contains(&format!("fence init --schema {s}")),
        "{said}"
    );
    assert_eq!(
        store.lease("job").map(|(owner, token, _)| (owner, token)),
        Some(("alice".to_owned(), held.token))
    );
    let held = acquire(&store, "job", "alice", "30s");
    let init = init_json(&store);
    assert_eq!(init["action"], "up_to_date");
    // Several at once (jobs that each run `fence init` as they start): each repairs or finds
    // it repaired, under the schema's lock. Without the lock, two replacing the same function
    // fail ("tuple concurrently updated"): 15 of 80 in 6 of 10 such rounds, measured.
    for _ in 0..6 {
        as_the_earlier_fence_left_them();
        let inits: Vec<std::process::Child> = (0..8)
            .map(|_| {
                store
                    .fence()
                    .args(["init", "--format", "json"])
                    .cmd
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for init in inits {
            let out = init.wait_with_output().unwrap();
            assert!(out.status.success(), "{out:?}");
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(json["action"], "up_to_date");
        }
    }
    // Repaired, `init` only reads: the functions are not made again.
    let versions = || -> Vec<String> {
        store
            .pg_rows(
                "SELECT p.proname || ':' || p.xmin::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
                 WHERE n.nspname = $1 ORDER BY 1",
                &s,
            )
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    let before = versions();
    store.fence().args(["init", "-q"]).run().expect(0);
    assert_eq!(versions(), before);
    let (waiter, _) = start_waiter(&store, "bob");
    release_to_waiter(&store, &held, waiter, "bob");
}

/// Makes `store`'s schema look as a version-1 or version-2 fence left it: the waiters table
/// of those versions (with a row), no queue functions of version 3, and (version 2) the
/// advisory-lock queue's functions.
fn downgrade_schema(store: &Store, version: u32) {
    let s = store.schema.clone().unwrap();
    let v2 = if version == 2 {
        format!(
            "CREATE FUNCTION {s}.wait_turn(p_resource text, p_timeout_ms bigint) RETURNS boolean
                 LANGUAGE sql AS $$ SELECT true $$;
             CREATE FUNCTION {s}.acquire_queued(p_resource text, p_owner text, p_ttl_ms bigint)
                 RETURNS void LANGUAGE sql AS $$ SELECT $$;
             CREATE FUNCTION {s}.leave_queue(p_resource text) RETURNS void LANGUAGE sql AS $$ SELECT $$;"
        )
    } else {
        String::new()
    };
    common::pg_exec(
        &store.url,
        &format!(
            "DROP FUNCTION {s}.wait_enter(text, text, bigint, bigint, bigint);
             DROP FUNCTION {s}.wait_poll(text, text, bigint, bigint, bigint, bigint);
             DROP FUNCTION {s}.wait_leave(text, bigint);
             DROP FUNCTION {s}.wait_answer(text, bigint);
             DROP TABLE {s}.waiters;
             CREATE TABLE {s}.waiters (resource text NOT NULL, owner text NOT NULL,
                 since timestamptz NOT NULL DEFAULT clock_timestamp(),
                 backend_pid int NOT NULL DEFAULT pg_backend_pid());
             INSERT INTO {s}.waiters (resource, owner) VALUES ('job', 'gone');
             CREATE FUNCTION {s}.wait_begin(p_resource text, p_owner text) RETURNS int
                 LANGUAGE sql AS $$ SELECT 0 $$;
             CREATE FUNCTION {s}.unwait(p_resource text) RETURNS void LANGUAGE sql AS $$ SELECT $$;
             {v2}
             UPDATE {s}.meta SET value = '{version}' WHERE key = 'schema_version';"
        ),
    );
}

fn schema_version(store: &Store) -> String {
    let s = store.schema.clone().unwrap();
    store.pg_rows(
        &format!("SELECT value FROM {s}.meta WHERE key = 'schema_version' AND $1 = $1"),
        "",
    )[0]
    .get(0)
}

/// The functions of the schema whose names start with `wait`, `unwait`, `leave` or
/// `acquire_queued`, sorted.
fn queue_functions(store: &Store) -> Vec<String> {
    let s = store.schema.clone().unwrap();
    store
        .pg_rows(
            "SELECT p.proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = $1 AND (p.proname LIKE 'wait%' OR p.proname IN ('unwait', 'leave_queue', 'acquire_queued')) \
             ORDER BY 1",
            &s,
        )
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// A version-1 or version-2 schema (waiters queued on session advisory locks) is migrated to
/// the current version (version 3 brought the durable queue) by `fence init`, and lazily by the first `--wait` waiter,
/// which then gets its lease; the old waiters table and functions are gone.
#[test]
fn postgres_a_version_1_or_2_schema_is_migrated() {
    let current = ["wait_answer", "wait_enter", "wait_leave", "wait_poll"];
    for version in [1, 2] {
        let store = Store::postgres();
        store.fence().args(["init", "-q"]).run().expect(0);
        downgrade_schema(&store, version);
        let init = init_json(&store);
        assert_eq!(
            (init["action"].as_str(), init["schema_version"].as_i64()),
            (Some("migrated"), Some(5))
        );
        assert_eq!(schema_version(&store), "5");
        assert_eq!(queue_functions(&store), current);

        downgrade_schema(&store, version);
        let held = acquire(&store, "job", "alice", "30s");
        // Its first call needs version 3's queue, so it migrates the schema.
        let (waiter, view) = start_waiter(&store, "bob");
        let owners: Vec<&str> = view.resources[0]
            .waiters
            .iter()
            .map(|w| w.owner.as_str())
            .collect();
        assert_eq!(owners, ["bob"], "the old table's row is gone");
        release_to_waiter(&store, &held, waiter, "bob");
        assert_eq!(schema_version(&store), "5");
        assert_eq!(queue_functions(&store), current);
    }
}

/// A schema a newer fence made is never "up to date" nor migrated backwards: `init` refuses
/// it (exit 2, naming both versions and what to do), and leaves it as it was.
#[test]
fn postgres_a_schema_from_a_newer_fence_is_refused() {
    let store = Store::postgres();
    store.fence().args(["init", "-q"]).run().expect(0);
    let s = store.schema.clone().unwrap();
    common::pg_exec(
        &store.url,
        &format!("UPDATE {s}.meta SET value = '99' WHERE key = 'schema_version'"),
    );
    let out = store
        .fence()
        .args(["init", "--format", "json"])
        .run()
        .expect(2);
    let err = out.json();
    assert_eq!(err["error"], "usage", "{err}");
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains("newer fence") && message.contains("version 99"),
        "{message}"
    );
    assert!(
        err["hint"].as_str().unwrap().contains("upgrade fence"),
        "{err}"
    );
    assert_eq!(schema_version(&store), "99", "the schema was left alone");
}

/// The PostgreSQL administration answers (`protect`, `grant`, `prune`) keep their keys in
/// order, as the lease answers do (`protect` and `grant` talk to a target only: no `store`).
#[test]
fn postgres_admin_answers_keep_their_keys_in_order() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    let role = format!("keys_{}", crate::common::process_tag());
    common::pg_exec(
        &store.url,
        &format!("CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (v int)"),
    );
    common::pg_exec(
        &common::pg_superuser(),
        &format!("CREATE ROLE {role} NOLOGIN"),
    );
    let keys = |args: &[&str]| -> Vec<String> {
        let out = store
            .fence()
            .args(args)
            .args(["--format", "json"])
            .run()
            .expect(0);
        let value = out.json();
        assert_eq!(
            out.stdout.trim_end(),
            serde_json::to_string(&value).unwrap()
        );
        value.as_object().unwrap().keys().cloned().collect()
    };
    let table = format!("{schema}.t");
    let protect = keys(&[
        "protect",
        "--target",
        &store.url,
        "--table",
        &table,
        "--resource",
        "r",
    ]);
    assert_eq!(
        protect,
        [
            "ok",
            "op",
            "table",
            "resource",
            "protected",
            "target",
            "covered",
            "covers_later_partitions",
            "warnings"
        ]
    );
    let grant = keys(&["grant", "--target", &store.url, "--role", &role, "--print"]);
    assert_eq!(
        grant,
        [
            "ok",
            "op",
            "role",
            "access",
            "applied",
            "statements",
            "warnings",
            "target"
        ]
    );
    // prune refuses a store that does not exist: make it.
    store.fence().args(["acquire", "r"]).run().expect(0);
    let prune = keys(&["prune", "--older-than", "1h"]);
    assert_eq!(
        prune,
        [
            "ok",
            "op",
            "events_deleted",
            "waiters_deleted",
            "resources",
            "before",
            "keep",
            "store"
        ]
    );
    common::pg_exec(&store.url, &format!("DROP SCHEMA {schema} CASCADE"));
    common::pg_exec(&common::pg_superuser(), &format!("DROP ROLE {role}"));
}

/// A trigger on `leases` that drops fence's insert of a new resource's row (a hostile or
/// careless role's): every round of the acquire then answers "not created" and writes
/// nothing. fence gives up with an error naming the cause after a bounded number of rounds
/// (review of issue 37: it looped at ~1,300 statements a second until killed); no row and no
/// event exist afterwards.
#[test]
fn postgres_a_trigger_that_drops_the_new_lease_row_is_an_error_not_a_loop() {
    let store = Store::postgres();
    let s = store.schema.clone().unwrap();
    store.fence().args(["init", "-q"]).run().expect(0);
    common::pg_exec(
        &store.url,
        &format!(
            "CREATE FUNCTION {s}.swallow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$; \
             CREATE TRIGGER swallow BEFORE INSERT ON {s}.leases FOR EACH ROW EXECUTE FUNCTION {s}.swallow()"
        ),
    );
    let started = std::time::Instant::now();
    let out = store
        .fence()
        .args(["acquire", "swallowed", "--owner", "x", "--ttl", "10s"])
        .run();
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.contains("did not settle") && out.stderr.contains(&format!("{s}.leases")),
        "{out:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "{:?}",
        started.elapsed()
    );
    let rows = common::pg_query(
        &store.url,
        &format!(
            "SELECT (SELECT count(*) FROM {s}.leases WHERE resource = 'swallowed') \
                  + (SELECT count(*) FROM {s}.events WHERE resource = 'swallowed')"
        ),
    );
    assert_eq!(rows[0].get::<_, i64>(0), 0);
}

/// The lease row before a case of the tests that compare the forms of a lease statement:
/// owner, token, and `expires_at` relative to now (None: released); None: no row.
type Before<'a> = Option<(&'a str, i64, Option<&'a str>)>;

/// Writes the row `before` for `resource` (acquired a minute ago, TTL 60 s), or nothing.
async fn insert_before(
    client: &tokio_postgres::Client,
    s: &str,
    resource: &str,
    before: Before<'_>,
) {
    let Some((owner, token, expires)) = before else {
        return;
    };
    let expires = expires
        .map(|e| format!("now() + interval '{e}'"))
        .unwrap_or_else(|| "NULL".to_owned());
    client
        .batch_execute(&format!(
            "INSERT INTO {s}.leases (resource, owner, token, acquired_at, renewed_at, expires_at, ttl_ms, last_event) \
             VALUES ('{resource}', '{owner}', {token}, now() - interval '1 minute', now() - interval '1 minute', {expires}, 60000, 'acquired')"
        ))
        .await
        .unwrap();
}

/// The answer of `full`, or of `fast` first when given, as fence sends them
/// (`PgCoordinator::one_shot_fast`): `full` (the full statement, or `ACQUIRE_NEW` after
/// `ACQUIRE_FAST`) when the fast one answered no row.
async fn fast_then_full(
    client: &tokio_postgres::Client,
    fast: Option<Statement<'_>>,
    full: Statement<'_>,
) -> tokio_postgres::Row {
    if let Some((sql, params)) = fast {
        if let Some(row) = client
            .query_typed(sql, params)
            .await
            .unwrap()
            .into_iter()
            .next()
        {
            return row;
        }
    }
    client.query_typed(full.0, full.1).await.unwrap().remove(0)
}

/// A statement's text and its typed parameters, as `query_typed` takes them.
type Statement<'a> = (
    &'a str,
    &'a [(
        &'a (dyn tokio_postgres::types::ToSql + Sync),
        tokio_postgres::types::Type,
    )],
);

/// What the forms must agree on after a case: the answer, the lease row (its times relative
/// to the case's start) and the resource's events, each as text.
async fn answer_row_events(
    client: &tokio_postgres::Client,
    s: &str,
    resource: &str,
    answer: &tokio_postgres::Row,
) -> (String, Vec<String>, Vec<String>) {
    let answer = format!(
        "{} token {:?} owner {:?} ttl {:?}",
        answer.get::<_, String>("status"),
        answer.get::<_, Option<i64>>("token"),
        answer.get::<_, Option<String>>("owner"),
        answer.get::<_, Option<i64>>("ttl_ms"),
    );
    let texts =
        |rows: Vec<tokio_postgres::Row>| -> Vec<String> { rows.iter().map(|r| r.get(0)).collect() };
    let row = client
        .query(
            &format!(
                "SELECT format('%s %s %s %s acquired_kept=%s renewed_now=%s previous_expiry=%s live=%s released=%s', \
                   owner, token, last_event, ttl_ms, acquired_at < now() - interval '30 seconds', \
                   renewed_at > now() - interval '30 seconds', \
                   CASE WHEN previous_expires_at IS NULL THEN 'none' \
                        WHEN previous_expires_at > now() THEN 'future' ELSE 'past' END, \
                   expires_at > now(), expires_at IS NULL) \
                 FROM {s}.leases WHERE resource = $1"
            ),
            &[&resource],
        )
        .await
        .unwrap();
    let events = client
        .query(
            &format!(
                "SELECT format('%s %s %s %s previous=%s expires=%s detail=%s', kind, owner, token, ttl_ms, \
                   previous_expires_at IS NOT NULL, expires_at IS NOT NULL, detail) \
                 FROM {s}.events WHERE resource = $1 ORDER BY id"
            ),
            &[&resource],
        )
        .await
        .unwrap();
    (answer, texts(row), texts(events))
}

/// Issue 34, 1: the token rule (I1) is written three times, as the PL/pgSQL `acquire()` the
/// waiters call, as the one-shot `ACQUIRE` statement (sent for `--above`), and as
/// `ACQUIRE_FAST` with `ACQUIRE_NEW`, which a plain `fence acquire` sends (`ACQUIRE_NEW`, a new
/// resource, when `ACQUIRE_FAST` answers no row, as `PgCoordinator::one_shot_fast` does). From the same state, on every branch (a new
/// resource, the owner's live lease, another owner's live lease, another owner's expired
/// lease, the owner's expired lease, a released lease), all must give the same answer, leave
/// the same lease row and write the same event (or none).
#[test]
fn postgres_the_two_forms_of_the_token_rule_agree_on_every_branch() {
    let store = Store::postgres();
    let s = store.schema.clone().unwrap();
    store.fence().args(["init", "-q"]).run().expect(0);
    // (case, the row before; None: no row)
    let cases: [(&str, Before); 6] = [
        ("new", None),
        ("mine_live", Some(("me", 7, Some("1 hour")))),
        ("other_live", Some(("other", 7, Some("1 hour")))),
        ("other_expired", Some(("other", 7, Some("-1 second")))),
        ("mine_expired", Some(("me", 7, Some("-1 second")))),
        ("released", Some(("other", 7, None))),
    ];
    let filled = |sql: &str| {
        sql.replace("__SCHEMA__", &s).replace(
            "__VERSION__",
            &fence::coordinator::COORDINATOR_SCHEMA.version.to_string(),
        )
    };
    let statement = filled(fence::coordinator::pg_one_shot::ACQUIRE);
    let fast = filled(fence::coordinator::pg_one_shot::ACQUIRE_FAST);
    let new = filled(fence::coordinator::pg_one_shot::ACQUIRE_NEW);
    let url = store.url.clone();
    common::block_on(async move {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let ttl: i64 = 30_000;
        for (case, before) in cases {
            let mut seen = Vec::new();
            for form in ["function", "statement", "fast"] {
                let resource = format!("{case}-{form}");
                insert_before(&client, &s, &resource, before).await;
                let answer = if form == "function" {
                    client
                        .query_one(
                            &format!(
                                "SELECT status, token, owner, ttl_ms FROM {s}.acquire($1, $2, $3)"
                            ),
                            &[&resource, &"me", &ttl],
                        )
                        .await
                        .unwrap()
                } else {
                    // Typed as fence sends it (`query_typed`): $3 alone would be read as float8.
                    // $4 is `--above`, which a plain acquire leaves NULL (the fast form has no $4).
                    use tokio_postgres::types::Type;
                    let params: &[(&(dyn tokio_postgres::types::ToSql + Sync), Type)] = &[
                        (&resource, Type::TEXT),
                        (&"me", Type::TEXT),
                        (&ttl, Type::INT8),
                        (&None::<i64>, Type::INT8),
                    ];
                    if form == "fast" {
                        let short = &params[..3];
                        fast_then_full(&client, Some((&fast, short)), (&new, short)).await
                    } else {
                        fast_then_full(&client, None, (&statement, params)).await
                    }
                };
                seen.push(answer_row_events(&client, &s, &resource, &answer).await);
            }
            assert_eq!(
                seen[0], seen[1],
                "{case}: the PL/pgSQL acquire() (left) and the one-shot ACQUIRE (right) disagree"
            );
            assert_eq!(
                seen[1], seen[2],
                "{case}: ACQUIRE (left) and ACQUIRE_FAST then ACQUIRE_NEW (right) disagree"
            );
        }
    });
}

/// The same for renew and release: the schema's PL/pgSQL `renew()` and `release()` (kept for
/// fence binaries of version 4), the one-shot `RENEW` and `RELEASE`, and their common cases
/// `RENEW_FAST` and `RELEASE_FAST`, which fence sends first (falling back to the full
/// statement when they answer no row), must give the same answer, lease row and events from
/// the same state on every branch: the owner's live lease, its expired one, its released one,
/// a newer token (stale), a token never issued, another owner's lease, no lease at all.
#[test]
fn postgres_the_forms_of_renew_and_release_agree_on_every_branch() {
    use tokio_postgres::types::{ToSql, Type};
    let store = Store::postgres();
    let s = store.schema.clone().unwrap();
    store.fence().args(["init", "-q"]).run().expect(0);
    let filled = |sql: &str| {
        sql.replace("__SCHEMA__", &s).replace(
            "__VERSION__",
            &fence::coordinator::COORDINATOR_SCHEMA.version.to_string(),
        )
    };
    use fence::coordinator::pg_one_shot::{RELEASE, RELEASE_FAST, RENEW, RENEW_FAST};
    let (renew, renew_fast) = (filled(RENEW), filled(RENEW_FAST));
    let (release, release_fast) = (filled(RELEASE), filled(RELEASE_FAST));
    // (case, the row before; None: no row). The call always names owner `me` and token 7.
    let cases: [(&str, Before); 7] = [
        ("no_lease", None),
        ("mine_live", Some(("me", 7, Some("1 hour")))),
        ("mine_expired", Some(("me", 7, Some("-1 second")))),
        ("mine_released", Some(("me", 7, None))),
        ("stale", Some(("other", 8, Some("1 hour")))),
        ("never_issued", Some(("me", 6, Some("1 hour")))),
        ("wrong_owner", Some(("other", 7, Some("1 hour")))),
    ];
    let url = store.url.clone();
    common::block_on(async move {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let token: i64 = 7;
        let ttl: Option<i64> = Some(45_000);
        for op in ["renew", "release"] {
            for (case, before) in cases {
                let mut seen = Vec::new();
                for form in ["function", "statement", "fast"] {
                    let resource = format!("{op}-{case}-{form}");
                    insert_before(&client, &s, &resource, before).await;
                    let renew_params: &[(&(dyn ToSql + Sync), Type)] = &[
                        (&resource, Type::TEXT),
                        (&"me", Type::TEXT),
                        (&token, Type::INT8),
                        (&ttl, Type::INT8),
                    ];
                    let (full, fast, params) = if op == "renew" {
                        (&renew, &renew_fast, renew_params)
                    } else {
                        (&release, &release_fast, &renew_params[..3])
                    };
                    let answer = if form == "function" {
                        let call = if op == "renew" {
                            format!("SELECT status, token, owner, ttl_ms FROM {s}.renew($1, $2, $3, $4)")
                        } else {
                            format!(
                                "SELECT status, token, owner, ttl_ms FROM {s}.release($1, $2, $3)"
                            )
                        };
                        client.query_typed(&call, params).await.unwrap().remove(0)
                    } else {
                        let fast = (form == "fast").then_some((fast.as_str(), params));
                        fast_then_full(&client, fast, (full, params)).await
                    };
                    seen.push(answer_row_events(&client, &s, &resource, &answer).await);
                }
                assert_eq!(
                    seen[1], seen[2],
                    "{op} {case}: the full statement (left) and the fast one then the full (right) disagree"
                );
                assert_eq!(
                    seen[0], seen[1],
                    "{op} {case}: the PL/pgSQL function (left) and the full statement (right) disagree"
                );
            }
        }
    });
}

/// `ACQUIRE_FAST` answers by joining the snapshot's lease row with the granted one (review 13,
/// a helper's: the contract tests above compare answers by status, token, owner and TTL
/// only). Another transaction holds the lease row (a lock, a takeover, a renewal, a release,
/// an own grant) while the statement runs, so that its UPDATE waits and re-checks the newest
/// row (EvalPlanQual) while its join reads the snapshot's. A grant must answer, in every
/// column, the row it left; a `busy` or `retry` the snapshot's row; never two rows.
#[test]
fn postgres_acquire_fast_answers_whole_rows_under_lock_waits() {
    use std::sync::Arc;
    use std::time::SystemTime;
    use tokio_postgres::types::Type;
    let store = Store::postgres();
    let s = store.schema.clone().unwrap();
    store.fence().args(["init", "-q"]).run().expect(0);
    let fast = fence::coordinator::pg_one_shot::ACQUIRE_FAST
        .replace("__SCHEMA__", &s)
        .replace(
            "__VERSION__",
            &fence::coordinator::COORDINATOR_SCHEMA.version.to_string(),
        );
    let url = store.url.clone();
    let take = |owner: &str, token: i64| {
        format!(
            "UPDATE {s}.leases SET owner = '{owner}', token = {token}, last_event = 'taken_over', \
             acquired_at = clock_timestamp(), renewed_at = clock_timestamp(), \
             expires_at = clock_timestamp() + interval '1 hour', ttl_ms = 3600000 WHERE resource = '@R'"
        )
    };
    let lock = format!("SELECT FROM {s}.leases WHERE resource = '@R' FOR UPDATE");
    let release = format!(
        "UPDATE {s}.leases SET expires_at = NULL, last_event = 'released' WHERE resource = '@R'"
    );
    let renew = format!(
        "UPDATE {s}.leases SET renewed_at = clock_timestamp(), expires_at = clock_timestamp() + interval '2 hours', \
         ttl_ms = 7200000, last_event = 'renewed' WHERE resource = '@R'"
    );
    // (case, the row before, what the other transaction does, whether it commits, expected
    // status); every case but `busy_being_released` waits on the other transaction's lock.
    let cases: Vec<(&str, Before, String, bool, &str)> = vec![
        (
            "lock_expired",
            Some(("other", 7, Some("-1 second"))),
            lock.clone(),
            true,
            "taken_over",
        ),
        (
            "lock_mine",
            Some(("me", 7, Some("1 hour"))),
            lock.clone(),
            true,
            "reacquired",
        ),
        (
            "taken_by_third",
            Some(("other", 7, Some("-1 second"))),
            take("third", 8),
            true,
            "retry",
        ),
        (
            "taken_rolled_back",
            Some(("other", 7, Some("-1 second"))),
            take("third", 8),
            false,
            "taken_over",
        ),
        (
            "taken_by_me_elsewhere",
            Some(("other", 7, Some("-1 second"))),
            take("me", 8),
            true,
            "reacquired",
        ),
        (
            "released_under_me",
            Some(("other", 7, Some("-1 second"))),
            release.clone(),
            true,
            "acquired",
        ),
        (
            "mine_released_elsewhere",
            Some(("me", 7, Some("1 hour"))),
            release.clone(),
            true,
            "acquired",
        ),
        (
            "mine_renewed_elsewhere",
            Some(("me", 7, Some("1 hour"))),
            renew.clone(),
            true,
            "reacquired",
        ),
        (
            "busy_being_released",
            Some(("other", 7, Some("1 hour"))),
            release.clone(),
            true,
            "busy",
        ),
        (
            "free_taken_by_third",
            Some(("other", 7, None)),
            take("third", 8),
            true,
            "retry",
        ),
    ];
    common::block_on(async move {
        let connect = || async {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            Arc::new(client)
        };
        let a = connect().await;
        let b = connect().await;
        // Watches `b` from outside `a`'s transaction: within a transaction, pg_stat_activity
        // keeps the snapshot it first read.
        let watch = connect().await;
        let b_pid: i32 = b
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        type Whole = (
            String,
            Option<i64>,
            Option<String>,
            Option<SystemTime>,
            Option<SystemTime>,
            Option<SystemTime>,
            Option<i64>,
        );
        let row_now = |client: Arc<tokio_postgres::Client>, resource: String| {
            let s = s.clone();
            async move {
                let r = client
                    .query_one(
                        &format!("SELECT token, owner, acquired_at, renewed_at, expires_at, ttl_ms FROM {s}.leases WHERE resource = $1"),
                        &[&resource],
                    )
                    .await
                    .unwrap();
                (
                    r.get::<_, Option<i64>>(0),
                    r.get::<_, Option<String>>(1),
                    r.get::<_, Option<SystemTime>>(2),
                    r.get::<_, Option<SystemTime>>(3),
                    r.get::<_, Option<SystemTime>>(4),
                    r.get::<_, Option<i64>>(5),
                )
            }
        };
        let mut wrong = Vec::new();
        for (case, before, change, commit, expected) in cases {
            let resource = format!("epq-{case}");
            insert_before(&a, &s, &resource, before).await;
            let snapshot = row_now(a.clone(), resource.clone()).await;
            a.batch_execute("BEGIN").await.unwrap();
            a.batch_execute(&change.replace("@R", &resource))
                .await
                .unwrap();
            let (b2, fast2, resource2) = (b.clone(), fast.clone(), resource.clone());
            let statement = tokio::spawn(async move {
                let ttl: i64 = 30_000;
                b2.query_typed(
                    &fast2,
                    &[
                        (&resource2, Type::TEXT),
                        (&"me", Type::TEXT),
                        (&ttl, Type::INT8),
                    ],
                )
                .await
                .unwrap()
            });
            // Until the statement waits on the row's lock or has answered (a condition, not a
            // time: a loaded machine may take long to send it).
            let mut waited = false;
            let until = std::time::Instant::now() + Duration::from_secs(60);
            while std::time::Instant::now() < until {
                if statement.is_finished() {
                    break;
                }
                let w: Option<String> = watch
                    .query_one(
                        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1",
                        &[&b_pid],
                    )
                    .await
                    .unwrap()
                    .get(0);
                if w.as_deref() == Some("Lock") {
                    waited = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            a.batch_execute(if commit { "COMMIT" } else { "ROLLBACK" })
                .await
                .unwrap();
            let rows = statement.await.unwrap();
            let after = row_now(a.clone(), resource.clone()).await;
            if rows.len() != 1 {
                wrong.push(format!("{case}: {} rows", rows.len()));
                continue;
            }
            let r = &rows[0];
            let answer: Whole = (
                r.get("status"),
                r.get("token"),
                r.get("owner"),
                r.get("acquired_at"),
                r.get("renewed_at"),
                r.get("expires_at"),
                r.get("ttl_ms"),
            );
            let status = answer.0.clone();
            let whole = (
                answer.1,
                answer.2.clone(),
                answer.3,
                answer.4,
                answer.5,
                answer.6,
            );
            let should = if matches!(status.as_str(), "busy" | "retry") {
                &snapshot
            } else {
                &after
            };
            if waited != (case != "busy_being_released") {
                wrong.push(format!("{case}: waited on the lock: {waited}"));
            }
            if status != expected {
                wrong.push(format!("{case}: answered {status}, expected {expected}"));
            }
            if &whole != should {
                wrong.push(format!(
                    "{case}: {status} answered {whole:?}, its row is {should:?}"
                ));
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    });
}
