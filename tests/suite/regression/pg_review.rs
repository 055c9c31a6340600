//! Review 7: an adversarial review of the PostgreSQL coordinator (one-shot statements, the
//! waiters' queue, migrations) and the PostgreSQL fenced target (row form, transaction form),
//! against real PostgreSQL 15 through the suite's proxies and session options.
//!
//! The promise under attack (DESIGN §1, I1–I3): every grant's token is above every token
//! issued before; a stale token is refused (exit 4); fence never reports success for authority
//! it does not have, and never reports "nothing applied" for something that applied. Every
//! test reads the tables themselves as well as fence's answer.
//!
//! Tests named `held_…` were tried and held; the others showed a finding, fixed the same day:
//! the row form on a key no unique index covers (a stale write applied to part of a key, a
//! stale upsert inserted beside a newer row: now refused, exit 2), and a read-only target
//! reported as the caller's SQL failing (now unavailable, exit 7).

use std::time::{Duration, Instant};

use crate::common;

use common::fenced::{one, schema};
use common::proxy::{Mode, Proxy};
use common::{pg_exec, pg_query, Out, Store};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// `url` with `-c name=value` session options (libpq's `options`), for every setting given.
fn with_options(url: &str, settings: &[(&str, &str)]) -> String {
    let opts: Vec<String> = settings
        .iter()
        .map(|(k, v)| format!("-c%20{k}%3D{v}"))
        .collect();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options={}", opts.join("%20"))
}

/// The lease row of `resource`: (owner, token, live by the server's clock, last_event).
fn lease_row(store: &Store, resource: &str) -> Option<(Option<String>, i64, bool, String)> {
    let sql = format!(
        "SELECT owner, token, coalesce(expires_at > clock_timestamp(), false), last_event \
         FROM {}.leases WHERE resource = $1",
        schema(store)
    );
    store
        .pg_rows(&sql, resource)
        .first()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
}

/// How many events of `kind` name `owner` for `resource`.
fn events_of(store: &Store, resource: &str, kind: &str, owner: &str) -> usize {
    store
        .events(resource)
        .into_iter()
        .filter(|(k, o, _)| k == kind && o.as_deref() == Some(owner))
        .count()
}

fn acquire_json(store: &Store, url: &str, resource: &str, owner: &str, extra: &[&str]) -> Out {
    store
        .fence_at(url)
        .args(["acquire", resource, "--owner", owner, "--format", "json"])
        .args(extra)
        .run()
}

// ---------------------------------------------------------------------------------------------
// Row form: an upsert into a table whose key is not unique
// ---------------------------------------------------------------------------------------------

/// The row form compares the token row by row, so it needs one row per key. A newer holder
/// (token 2) upserts key 42, then the displaced holder (token 1) the same key: on a table
/// without a unique key, `INSERT … ON CONFLICT DO NOTHING` had no conflict to find and the
/// stale write inserted a second row for the key (exit 0). Now the row form refuses a key no
/// unique index covers (exit 2, naming the fix) before anything is written — the first write
/// too —, and with a primary key on `id` the stale upsert is refused as stale (exit 4).
#[test]
fn a_stale_upsert_into_a_table_without_a_unique_key_is_refused() {
    let store = Store::postgres();
    let s = schema(&store);
    let t = format!("{s}.jobs");
    pg_exec(
        &store.url,
        &format!(
            "CREATE SCHEMA {s}; CREATE TABLE {t} (id int, state text, last_fencing_token bigint)"
        ),
    );
    let write = |token: i64, state: &str| {
        store
            .fence()
            .args(["write", "jobs", "--token", &token.to_string()])
            .args(["--target", &store.url, "--table", &t])
            .args([
                "--key",
                "id=42",
                "--set",
                &format!("state={state}"),
                "--upsert",
            ])
            .args(["--format", "json"])
            .run()
    };
    let rows = || {
        one(
            &store.url,
            &format!(
                "SELECT coalesce(string_agg(state || '/' || last_fencing_token, ',' \
                 ORDER BY last_fencing_token), '') FROM {t} WHERE id = 42"
            ),
        )
    };
    let refused = write(2, "newer");
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(
        refused.json()["message"]
            .as_str()
            .unwrap()
            .contains("may name several rows"),
        "{refused:?}"
    );
    assert_eq!(rows(), "", "nothing written");
    pg_exec(&store.url, &format!("ALTER TABLE {t} ADD PRIMARY KEY (id)"));
    let newer = write(2, "newer").expect(0);
    assert_eq!(newer.json()["status"], "inserted", "{newer:?}");
    let stale = write(1, "stale");
    assert_eq!(
        (stale.code, rows().as_str()),
        (4, "newer/2"),
        "a write with token 1, below the token 2 stored for id=42, must be refused and change \
         nothing; fence answered {stale:?}"
    );
}

/// The same stale write without `--upsert`, on a table where the key already has two rows
/// (written before fence, token NULL, and by the newer holder, token 2): the row form's one
/// conditional UPDATE of "the rows with that key" reported the stale token's write applied
/// to the NULL row (exit 0). A key no unique index covers is now refused (exit 2), nothing
/// changed; with a unique index on `id`, the stale write is refused as stale (exit 4).
#[test]
fn a_stale_row_write_is_not_applied_to_part_of_a_key_held_by_a_newer_token() {
    let store = Store::postgres();
    let s = schema(&store);
    let t = format!("{s}.jobs");
    pg_exec(
        &store.url,
        &format!(
            "CREATE SCHEMA {s}; CREATE TABLE {t} (id int, state text, last_fencing_token bigint);
             INSERT INTO {t} VALUES (42, 'old', NULL), (42, 'newer', 2);"
        ),
    );
    let write = |key: &str| {
        store
            .fence()
            .args(["write", "jobs", "--token", "1"])
            .args(["--target", &store.url, "--table", &t])
            .args(["--key", key, "--set", "state=stale"])
            .args(["--format", "json"])
            .run()
    };
    let rows = || {
        one(
            &store.url,
            &format!(
                "SELECT string_agg(coalesce(id::text, '-') || ':' || state || '/' \
                 || coalesce(last_fencing_token::text, '-'), ',' ORDER BY state) FROM {t}"
            ),
        )
    };
    let stale = write("id=42");
    assert_eq!(
        (stale.code, rows().as_str()),
        (2, "42:newer/2,42:old/-"),
        "token 1 is below the token 2 stored for id=42; fence answered {stale:?}"
    );
    pg_exec(
        &store.url,
        &format!("DELETE FROM {t} WHERE state = 'old'; CREATE UNIQUE INDEX ON {t} (id)"),
    );
    let stale = write("id=42");
    assert_eq!(stale.code, 4, "{stale:?}");
    assert_eq!(rows(), "42:newer/2", "nothing changed");
}

// ---------------------------------------------------------------------------------------------
// Session settings: read-only, serializable, statement_timeout, search_path
// ---------------------------------------------------------------------------------------------

/// `default_transaction_read_only = on` (a standby, or a role set so): nothing is applied,
/// and fence says so (exit 7), for acquire, renew and release; the lease is as it was.
#[test]
fn held_a_read_only_session_applies_nothing_and_says_so() {
    let store = Store::postgres();
    let lease = store
        .fence()
        .acquire("ro", &["--owner", "h", "--ttl", "1m"]);
    let ro = with_options(&store.url, &[("default_transaction_read_only", "on")]);
    let before = lease_row(&store, "ro");

    let other = acquire_json(&store, &ro, "ro-new", "x", &[]);
    assert_eq!(other.code, 7, "{other:?}");
    assert!(lease_row(&store, "ro-new").is_none());

    let t = lease.token.to_string();
    let renew = store
        .fence_at(&ro)
        .args(["renew", "ro", "--owner", "h", "--token", &t])
        .run();
    assert_eq!(renew.code, 7, "{renew:?}");
    let release = store
        .fence_at(&ro)
        .args(["release", "ro", "--owner", "h", "--token", &t])
        .run();
    assert_eq!(release.code, 7, "{release:?}");
    assert_eq!(lease_row(&store, "ro"), before, "the lease changed");
    assert!(lease_row(&store, "ro").unwrap().2, "still live");
}

/// A fenced write to a target that is read-only (a standby after a failover, or
/// `default_transaction_read_only` on the writer's role), whose SQL writes nothing
/// (`SELECT 1`): fence's own guard (`begin_write`) is what the server refuses. Nothing was
/// applied and the SQL is not at fault: exit 7 (unavailable, retry against the primary), as
/// the coordinator answers the same refusal, never exit 1 `sql_failed` "fix the SQL".
#[test]
fn a_fenced_write_refused_by_a_read_only_target_is_unavailable_not_the_sqls_fault() {
    let store = Store::postgres();
    let lease = store
        .fence()
        .acquire("rw", &["--owner", "h", "--ttl", "1m"]);
    let t = lease.token.to_string();
    let s = schema(&store);
    store
        .fence()
        .args(["write", "rw", "--token", &t, "--owner", "h"])
        .args(["--target", &store.url, "--sql", "SELECT 1"])
        .run()
        .expect(0);
    let guard = || {
        one(
            &store.url,
            &format!("SELECT highest_token || '/' || accepted_writes FROM {s}.guards WHERE resource = 'rw'"),
        )
    };
    let before = guard();
    let ro = with_options(&store.url, &[("default_transaction_read_only", "on")]);
    let write = store
        .fence()
        .args(["write", "rw", "--token", &t, "--owner", "h"])
        .args(["--target", &ro, "--sql", "SELECT 1", "--format", "json"])
        .run();
    assert_eq!(guard(), before, "nothing may be applied");
    assert_eq!(
        write.code, 7,
        "fence's own begin_write was refused by a read-only server: {write:?}"
    );
}

/// Eight acquirers of one free resource at once, every session SERIALIZABLE by default:
/// at most one grant, its token the next one, every other answer busy (3) or unavailable (7,
/// nothing applied); the history holds exactly the grants fence reported.
#[test]
fn held_serializable_sessions_grant_a_free_lease_once() {
    let store = Store::postgres();
    let first = store.fence().acquire("ser", &["--owner", "setup"]);
    store.fence().release(&first);
    let url = with_options(
        &store.url,
        &[("default_transaction_isolation", "serializable")],
    );
    for round in 0..3 {
        let children: Vec<_> = (0..8)
            .map(|i| {
                store
                    .fence_at(&url)
                    .args(["acquire", "ser", "--owner", &format!("w{round}-{i}")])
                    .args(["--ttl", "1m", "--format", "json"])
                    .spawn()
            })
            .collect();
        let outs: Vec<Out> = children
            .into_iter()
            .map(|c| Out::from(c.wait_with_output().unwrap()))
            .collect();
        let granted: Vec<(String, i64)> = outs
            .iter()
            .filter(|o| o.code == 0)
            .map(|o| {
                let j = o.json();
                (
                    j["owner"].as_str().unwrap().to_owned(),
                    j["token"].as_i64().unwrap(),
                )
            })
            .collect();
        for o in &outs {
            assert!([0, 3, 7].contains(&o.code), "{o:?}");
        }
        assert!(granted.len() <= 1, "{outs:?}");
        let row = lease_row(&store, "ser").unwrap();
        for (i, o) in outs.iter().enumerate() {
            let owner = format!("w{round}-{i}");
            let recorded = events_of(&store, "ser", "acquired", &owner)
                + events_of(&store, "ser", "taken_over", &owner);
            assert_eq!(recorded, usize::from(o.code == 0), "{owner}: {o:?}");
        }
        if let Some((owner, token)) = granted.first() {
            assert_eq!((row.0.as_deref(), row.1), (Some(owner.as_str()), *token));
            assert_eq!(*token, first.token + 1 + round);
            common::release(&store, "ser", owner, *token);
        } else {
            panic!("no grant at all in round {round}: {outs:?}");
        }
    }
}

/// A statement_timeout of 1 ms on fence's sessions: every exit 7 left no grant behind, every
/// exit 0 is on record.
#[test]
fn held_a_tiny_statement_timeout_never_hides_a_grant() {
    let store = Store::postgres();
    store.fence().acquire("st-setup", &["--owner", "setup"]);
    let url = with_options(&store.url, &[("statement_timeout", "1")]);
    let mut codes = Vec::new();
    for i in 0..20 {
        let resource = format!("st-{i}");
        let owner = format!("o{i}");
        let out = acquire_json(&store, &url, &resource, &owner, &["--ttl", "1m"]);
        codes.push(out.code);
        let row = lease_row(&store, &resource);
        match out.code {
            0 => {
                let row = row.expect("a lease row");
                assert_eq!(
                    (row.0.as_deref(), row.1),
                    (Some(owner.as_str()), out.json()["token"].as_i64().unwrap())
                );
            }
            7 => assert!(
                row.as_ref()
                    .is_none_or(|r| r.0.as_deref() != Some(owner.as_str())),
                "exit 7 (nothing applied) but the lease is {row:?}: {out:?}"
            ),
            _ => panic!("{out:?}"),
        }
    }
    eprintln!("exit codes under statement_timeout=1ms: {codes:?}");
}

/// A schema of the test's own, first in search_path, holding tables named like fence's: every
/// grant goes to fence's schema, none to the look-alike.
#[test]
fn held_look_alike_tables_earlier_in_search_path_are_not_used() {
    let store = Store::postgres();
    let s = schema(&store);
    let evil = format!("{s}_evil");
    store.fence().acquire("sp", &["--owner", "setup"]);
    pg_exec(
        &store.url,
        &format!(
            "CREATE SCHEMA {evil};
             CREATE TABLE {evil}.leases (LIKE {s}.leases INCLUDING ALL);
             CREATE TABLE {evil}.events (LIKE {s}.events INCLUDING ALL);
             CREATE TABLE {evil}.meta (LIKE {s}.meta INCLUDING ALL);
             INSERT INTO {evil}.meta SELECT * FROM {s}.meta;"
        ),
    );
    let url = with_options(&store.url, &[("search_path", &format!("{evil},public"))]);
    let out = acquire_json(&store, &url, "sp2", "a", &[]).expect(0);
    assert_eq!(out.json()["token"], 1);
    assert!(lease_row(&store, "sp2").is_some());
    let n = one(
        &store.url,
        &format!("SELECT count(*)::text FROM {evil}.leases"),
    );
    assert_eq!(n, "0");
    pg_exec(&store.url, &format!("DROP SCHEMA {evil} CASCADE"));
}

// ---------------------------------------------------------------------------------------------
// The waiters' queue
// ---------------------------------------------------------------------------------------------

/// Rows of the waiters' queue for `resource`.
fn waiters(store: &Store, resource: &str) -> i64 {
    let sql = format!(
        "SELECT count(*) FROM {}.waiters WHERE resource = $1",
        schema(store)
    );
    store.pg_rows(&sql, resource)[0].get(0)
}

/// A waiter (`acquire --wait`) whose granting poll reaches the server but whose answer is
/// lost (the proxy cuts the connection as it forwards `wait_poll`): the grant committed, so
/// fence must not say "nothing applied" (exit 7) nor "busy" (exit 3); it says granted (0) or
/// unknown (8), and the lease row is the waiter's.
#[test]
fn held_a_waiters_granting_poll_whose_answer_is_lost_is_never_nothing() {
    let store = Store::postgres();
    let holder = store
        .fence()
        .acquire("wq", &["--owner", "h", "--ttl", "1m"]);
    // Two proxies in a row: the outer holds the waiter's first poll until the holder has
    // released, so that the poll the inner one cuts is the one that grants.
    let proxy = Proxy::start(
        common::pg_upstream(),
        Mode::CutWhenClientSends(b"wait_poll".to_vec()),
    );
    let gate = Proxy::start(
        proxy.addr(),
        Mode::HoldWhenClientSends(b"wait_poll".to_vec()),
    );
    let via = common::pg_url_via(gate.addr());
    let child = store
        .fence_at(&via)
        .args([
            "acquire", "wq", "--owner", "w", "--ttl", "1m", "--wait", "20s",
        ])
        .args(["--format", "json"])
        .spawn();
    common::wait_for("the waiter's first poll", Duration::from_secs(20), || {
        gate.held() == 1
    });
    assert_eq!(waiters(&store, "wq"), 1);
    store.fence().release(&holder);
    gate.open();
    let out = Out::from(common::wait_output(
        "the waiter",
        child,
        Duration::from_secs(40),
    ));
    let row = lease_row(&store, "wq").unwrap();
    eprintln!("waiter: {out:?}; lease {row:?}; cuts {}", proxy.cuts());
    assert!(proxy.cuts() >= 1, "the premise: a poll was cut");
    match out.code {
        0 => assert_eq!(
            (row.0.as_deref(), row.1, row.2),
            (Some("w"), out.json()["token"].as_i64().unwrap(), true)
        ),
        8 => {}
        _ => panic!("the waiter said {out:?} while the lease is {row:?}"),
    }
    if row.0.as_deref() == Some("w") {
        assert_eq!(row.1, holder.token + 1);
    }
}

/// A queued `acquire --wait` whose process is SIGKILLed is never granted: its row dies at its
/// deadline, the next waiter takes the lease after the release, and nothing is granted to the
/// dead one meanwhile.
#[test]
fn held_a_dead_waiter_is_never_granted() {
    let store = Store::postgres();
    let holder = store
        .fence()
        .acquire("dq", &["--owner", "h", "--ttl", "1m"]);
    let mut dead = store
        .fence()
        .args([
            "acquire", "dq", "--owner", "dead", "--ttl", "1m", "--wait", "60s",
        ])
        .spawn();
    common::wait_for("the first waiter's row", Duration::from_secs(20), || {
        waiters(&store, "dq") == 1
    });
    let live = store
        .fence()
        .args([
            "acquire", "dq", "--owner", "live", "--ttl", "1m", "--wait", "60s",
        ])
        .args(["--format", "json"])
        .spawn();
    common::wait_for("the second waiter's row", Duration::from_secs(20), || {
        waiters(&store, "dq") == 2
    });
    dead.kill().unwrap();
    let _ = dead.wait();
    store.fence().release(&holder);
    let started = Instant::now();
    let out = Out::from(common::wait_output(
        "the live waiter",
        live,
        Duration::from_secs(40),
    ))
    .expect(0);
    eprintln!("granted after {:?}", started.elapsed());
    assert_eq!(out.json()["token"].as_i64(), Some(holder.token + 1));
    assert_eq!(events_of(&store, "dq", "acquired", "dead"), 0);
    let row = lease_row(&store, "dq").unwrap();
    assert_eq!((row.0.as_deref(), row.1), (Some("live"), holder.token + 1));
}

// ---------------------------------------------------------------------------------------------
// Migrations under live leases
// ---------------------------------------------------------------------------------------------

/// The schema's version row set back to 4 (as an older fence left it) while a lease is held
/// and a waiter queued: the holder's renewal migrates and renews (same token), the waiter is
/// granted the next token after the release, and no token is issued twice.
#[test]
fn held_a_migration_under_a_held_lease_and_a_queued_waiter_keeps_tokens() {
    let store = Store::postgres();
    let s = schema(&store);
    let holder = store
        .fence()
        .acquire("mq", &["--owner", "h", "--ttl", "1m"]);
    let waiter = store
        .fence()
        .args([
            "acquire", "mq", "--owner", "w", "--ttl", "1m", "--wait", "60s",
        ])
        .args(["--format", "json"])
        .spawn();
    common::wait_for("the waiter's row", Duration::from_secs(20), || {
        waiters(&store, "mq") == 1
    });
    pg_exec(
        &store.url,
        &format!("UPDATE {s}.meta SET value = '4' WHERE key = 'schema_version'"),
    );
    let t = holder.token.to_string();
    store
        .fence()
        .args(["renew", "mq", "--owner", "h", "--token", &t])
        .run()
        .expect(0);
    let version = one(
        &store.url,
        &format!("SELECT value FROM {s}.meta WHERE key = 'schema_version'"),
    );
    assert_eq!(version, "5");
    assert_eq!(lease_row(&store, "mq").unwrap().1, holder.token);
    store.fence().release(&holder);
    let out = Out::from(common::wait_output(
        "the waiter",
        waiter,
        Duration::from_secs(40),
    ))
    .expect(0);
    assert_eq!(out.json()["token"].as_i64(), Some(holder.token + 1));
    let tokens: Vec<i64> = pg_query(
        &store.url,
        &format!(
            "SELECT token FROM {s}.events WHERE resource = 'mq' AND kind IN ('acquired', 'taken_over') ORDER BY id"
        ),
    )
    .iter()
    .map(|r| r.get(0))
    .collect();
    assert_eq!(tokens, vec![holder.token, holder.token + 1]);
}
