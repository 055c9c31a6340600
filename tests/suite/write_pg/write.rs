//! Fenced writes to PostgreSQL and `fence protect` (issue 3), asserting on the tables
//! themselves: a paused former owner is refused once a newer one has written, concurrent
//! writers with interleaved tokens never move a protected row backwards and leave no trace
//! when refused, raw psql cannot bypass a protected table, and the row form classifies
//! applied / stale / missing correctly, with hostile names quoted harmlessly.

use crate::common;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{wait_for, Store};
use serde_json::Value;

/// Runs SQL on the test database directly (not through fence).
fn sql(store: &Store, script: &str) {
    common::pg_exec(&store.url, script);
}

/// The first column of every row, as text.
fn column(store: &Store, query: &str) -> Vec<Option<String>> {
    let url = store.url.clone();
    let query = query.to_owned();
    common::block_on(async move {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let rows = client.simple_query(&query).await.unwrap();
        rows.iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some(r.get(0).map(str::to_owned)),
                _ => None,
            })
            .collect()
    })
}

fn one(store: &Store, query: &str) -> String {
    column(store, query).remove(0).unwrap_or_default()
}

fn schema(store: &Store) -> String {
    store.schema.clone().unwrap()
}

/// `fence write` against the store's database, with the store's schema.
fn write(store: &Store, resource: &str, token: i64, sql_text: &str) -> common::Out {
    store
        .fence()
        .args([
            "write",
            resource,
            "--token",
            &token.to_string(),
            "--target",
            &store.url,
            "--sql",
            sql_text,
        ])
        .args(["--format", "json"])
        .run()
}

/// Raw psql, as an admin script would use it: (success, stderr).
fn psql(store: &Store, script: &str) -> (bool, String) {
    let out = Command::new("psql")
        .args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            "VERBOSITY=verbose",
            &store.url,
            "-c",
            script,
        ])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap())
        .output()
        .expect("psql");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn acquire(store: &Store, resource: &str, owner: &str, ttl: &str) -> i64 {
    let out = store
        .fence()
        .args([
            "acquire", resource, "--owner", owner, "--ttl", ttl, "--format", "json",
        ])
        .run()
        .expect(0);
    out.json()["token"].as_i64().unwrap()
}

/// Seed scenario 1: A acquires, is paused (SIGSTOP) past expiry, B acquires and writes,
/// A resumes and writes → A is refused (exit 4) and B's row stays.
#[test]
fn a_paused_owner_resumed_after_a_newer_write_is_refused() {
    let store = Store::postgres();
    let s = schema(&store);
    sql(&store, &format!("CREATE SCHEMA {s}; CREATE TABLE {s}.cell (id int PRIMARY KEY, v text); INSERT INTO {s}.cell VALUES (1, 'init');"));
    let work = tempfile::tempdir().unwrap();
    let fence = env!("CARGO_BIN_EXE_fence");
    let script = format!(
        r#"eval "$('{fence}' --store "$URL" --schema {s} acquire job --owner A --ttl 300ms --format env)" || exit 99
echo "$FENCE_TOKEN" > token
kill -STOP $$
'{fence}' write --target "$URL" --sql "UPDATE {s}.cell SET v = 'A'" --format json > out.json
echo $? > code
"#
    );
    let mut a = Command::new("sh")
        .args(["-c", &script])
        .current_dir(work.path())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap())
        .env("HOME", work.path())
        .env("URL", &store.url)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = a.id();
    wait_for("A to stop itself", Duration::from_secs(10), || {
        common::process::state(pid) == Some('T')
    });
    let token_a: i64 = std::fs::read_to_string(work.path().join("token"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_for(
        "A's lease to expire by the coordinator's clock",
        Duration::from_secs(10),
        || store.lease("job").is_some_and(|(_, _, live)| !live),
    );

    let token_b = acquire(&store, "job", "B", "30s");
    assert!(token_b > token_a);
    write(
        &store,
        "job",
        token_b,
        &format!("UPDATE {s}.cell SET v = 'B'"),
    )
    .expect(0);

    assert_eq!(unsafe_kill(pid, libc::SIGCONT), 0);
    assert!(a.wait().unwrap().success());
    let code = std::fs::read_to_string(work.path().join("code")).unwrap();
    let out: Value =
        serde_json::from_str(&std::fs::read_to_string(work.path().join("out.json")).unwrap())
            .unwrap();
    assert_eq!(code.trim(), "4", "{out}");
    assert_eq!(
        (out["error"].as_str(), out["highest_token"].as_i64()),
        (Some("stale_fencing_token"), Some(token_b))
    );
    assert_eq!(one(&store, &format!("SELECT v FROM {s}.cell")), "B");
    assert_eq!(
        one(
            &store,
            &format!("SELECT highest_token FROM {s}.guards WHERE resource = 'job'")
        ),
        token_b.to_string()
    );
    let kinds = column(
        &store,
        &format!("SELECT kind || ':' || token FROM {s}.write_events ORDER BY id"),
    );
    let kinds: Vec<String> = kinds.into_iter().flatten().collect();
    assert_eq!(
        kinds,
        [
            format!("write_accepted:{token_b}"),
            format!("write_rejected:{token_a}")
        ]
    );

    // An operator sees the lease and what the target accepted and rejected, side by side.
    let view = store
        .fence()
        .args(["inspect", "job", "--target", &store.url, "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(view["resources"][0]["token"], token_b);
    let target = &view["targets"][0];
    assert_eq!(
        (
            target["resource"].as_str(),
            target["highest_token"].as_i64()
        ),
        (Some("job"), Some(token_b))
    );
    assert_eq!(
        (
            target["accepted_writes"].as_i64(),
            target["rejected_writes"].as_i64()
        ),
        (Some(1), Some(1))
    );
    assert!(!target["target"]
        .as_str()
        .unwrap()
        .contains("fence-test-secret"));
}

fn unsafe_kill(pid: u32, signal: i32) -> i32 {
    // SAFETY: kill(2) with a pid we spawned; no memory is involved.
    unsafe { libc::kill(pid as i32, signal) }
}

/// Concurrent writers with interleaved tokens (randomised, several seconds): the protected
/// row's token never decreases, every accepted write is there, every refused one left no trace.
#[test]
fn concurrent_writers_with_interleaved_tokens_never_go_backwards() {
    let store = Store::postgres();
    let s = schema(&store);
    sql(
        &store,
        &format!(
            "CREATE SCHEMA {s};
             CREATE TABLE {s}.cell (id int PRIMARY KEY, token bigint NOT NULL, writes int NOT NULL);
             INSERT INTO {s}.cell VALUES (1, 0, 0);
             CREATE TABLE {s}.audit (old_token bigint, new_token bigint);
             CREATE TABLE {s}.history (nonce text PRIMARY KEY, token bigint);
             CREATE FUNCTION {s}.audit() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN INSERT INTO {s}.audit VALUES (OLD.token, NEW.token); RETURN NEW; END $$;
             CREATE TRIGGER audit AFTER UPDATE ON {s}.cell FOR EACH ROW EXECUTE FUNCTION {s}.audit();"
        ),
    );
    store
        .fence()
        .args([
            "protect",
            "--target",
            &store.url,
            "--table",
            &format!("{s}.cell"),
            "--resource",
            "hot",
        ])
        .run()
        .expect(0);

    let highest = Arc::new(AtomicI64::new(1));
    let start = Instant::now();
    let results: Vec<(String, i64, i32)> = (0..6)
        .map(|w| {
            let (url, schema, highest, s) = (store.url.clone(), store.schema.clone().unwrap(), highest.clone(), s.clone());
            let home = store.home.path().to_owned();
            thread::spawn(move || {
                let mut seen = Vec::new();
                let mut rng = 0x2545_f491_4f6c_dd1d_u64.wrapping_mul(w + 1);
                let mut i = 0;
                while start.elapsed() < Duration::from_secs(4) {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    // Mostly the newest token, sometimes a newer one, sometimes an old one.
                    let token = match rng % 4 {
                        0 => highest.fetch_add(1, Ordering::SeqCst) + 1,
                        1 => (highest.load(Ordering::SeqCst) - 2).max(1),
                        _ => highest.load(Ordering::SeqCst),
                    };
                    let nonce = format!("w{w}-{i}");
                    i += 1;
                    let out = common::Fence::bare(&home)
                        .args(["--schema", &schema, "write", "hot", "--token", &token.to_string(), "--target", &url])
                        .args(["--sql", &format!("UPDATE {s}.cell SET token = {token}, writes = writes + 1; INSERT INTO {s}.history VALUES ('{nonce}', {token})")])
                        .run();
                    seen.push((nonce, token, out.code));
                }
                seen
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();

    let accepted: Vec<_> = results.iter().filter(|r| r.2 == 0).collect();
    let refused: Vec<_> = results.iter().filter(|r| r.2 == 4).collect();
    assert!(
        results.iter().all(|r| r.2 == 0 || r.2 == 4),
        "only 0 or 4: {results:?}"
    );
    assert!(
        accepted.len() >= 20 && refused.len() >= 5,
        "{} accepted, {} refused",
        accepted.len(),
        refused.len()
    );
    let regressions = one(
        &store,
        &format!("SELECT count(*) FROM {s}.audit WHERE new_token < old_token"),
    );
    assert_eq!(regressions, "0", "the protected row's token went backwards");
    let history: Vec<String> = column(&store, &format!("SELECT nonce FROM {s}.history"))
        .into_iter()
        .flatten()
        .collect();
    for (nonce, token, _) in &accepted {
        assert!(
            history.contains(nonce),
            "accepted write {nonce} (token {token}) is missing"
        );
    }
    for (nonce, token, _) in &refused {
        assert!(
            !history.contains(nonce),
            "refused write {nonce} (token {token}) left a trace"
        );
    }
    assert_eq!(
        one(&store, &format!("SELECT writes FROM {s}.cell")),
        accepted.len().to_string()
    );
    let max_accepted = accepted.iter().map(|r| r.1).max().unwrap();
    assert_eq!(
        one(&store, &format!("SELECT token FROM {s}.cell")),
        max_accepted.to_string()
    );
    assert_eq!(
        one(
            &store,
            &format!("SELECT highest_token FROM {s}.guards WHERE resource = 'hot'")
        ),
        max_accepted.to_string()
    );
}

/// With `protect` installed, no path but a current token writes; `--remove` restores access.
#[test]
fn protect_refuses_every_write_path_without_a_current_token() {
    let store = Store::postgres();
    let s = schema(&store);
    let t = format!("{s}.t");
    sql(&store, &format!("CREATE SCHEMA {s}; CREATE TABLE {t} (id int, v text); INSERT INTO {t} VALUES (1, 'orig');"));
    let out = store
        .fence()
        .args([
            "protect",
            "--target",
            &store.url,
            "--table",
            &t,
            "--resource",
            "ledger",
            "--format",
            "json",
        ])
        .run()
        .expect(0);
    assert_eq!(out.json()["protected"], true);
    // Idempotent.
    store
        .fence()
        .args([
            "protect",
            "--target",
            &store.url,
            "--table",
            &t,
            "--resource",
            "ledger",
        ])
        .run()
        .expect(0);
    let contents = || {
        column(&store, &format!("SELECT v FROM {t} ORDER BY id"))
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
    };

    // No guard row yet: refused with LF003 even with settings.
    let (ok, err) = psql(&store, &format!("BEGIN; SELECT set_config('fence.resource','ledger',true), set_config('fence.token','1',true), set_config('fence.txid', txid_current()::text, true); UPDATE {t} SET v = 'x'; COMMIT;"));
    assert!(!ok && err.contains("LF003"), "{err}");

    write(&store, "ledger", 5, &format!("UPDATE {t} SET v = 'five'")).expect(0);
    assert_eq!(contents(), ["five"]);

    for statement in [
        format!("UPDATE {t} SET v = 'raw'"),
        format!("INSERT INTO {t} VALUES (2, 'raw')"),
        format!("DELETE FROM {t}"),
        format!("TRUNCATE {t}"),
    ] {
        let (ok, err) = psql(&store, &statement);
        assert!(
            !ok && err.contains("LF001") && err.contains("ledger"),
            "{statement}: {err}"
        );
        assert!(
            err.contains("fence write"),
            "the message names the fix: {err}"
        );
    }
    // A session-level SET carries no authority.
    let (ok, err) = psql(
        &store,
        &format!(
            "SET fence.resource = 'ledger'; SET fence.token = '5'; UPDATE {t} SET v = 'session'"
        ),
    );
    assert!(!ok && err.contains("LF001"), "{err}");
    // Settings forged with set_config carry no authority, whatever the token: an old one,
    // or the current one read from the guard row.
    for forged in ["4", "5"] {
        let (ok, err) = psql(&store, &format!("BEGIN; SELECT set_config('fence.resource','ledger',true), set_config('fence.token','{forged}',true), set_config('fence.txid', txid_current()::text, true); UPDATE {t} SET v = 'forged'; COMMIT;"));
        assert!(!ok && err.contains("LF001"), "token {forged}: {err}");
    }
    // An old token through begin_write is stale.

    let (ok, err) = psql(&store, &format!("BEGIN; SELECT {s}.begin_write('ledger', 4, 'admin'); UPDATE {t} SET v = 'old'; COMMIT;"));
    assert!(!ok && err.contains("LF002"), "{err}");
    // A made-up higher token that never went through begin_write.
    let (ok, err) = psql(&store, &format!("BEGIN; SELECT set_config('fence.resource','ledger',true), set_config('fence.token','99',true), set_config('fence.txid', txid_current()::text, true); UPDATE {t} SET v = 'forged'; COMMIT;"));
    assert!(!ok && err.contains("LF001"), "{err}");
    assert_eq!(contents(), ["five"], "no rejected path changed the table");

    // The documented admin path with the current token works.
    let (ok, err) = psql(&store, &format!("BEGIN; SELECT {s}.begin_write('ledger', 5, 'admin'); UPDATE {t} SET v = 'admin'; COMMIT;"));
    assert!(ok, "{err}");
    assert_eq!(contents(), ["admin"]);
    // fence write: current token works, an older one is stale.
    write(&store, "ledger", 6, &format!("UPDATE {t} SET v = 'six'")).expect(0);
    let out = write(&store, "ledger", 5, &format!("UPDATE {t} SET v = 'late'")).expect(4);
    assert_eq!(out.json()["highest_token"], 6);
    assert_eq!(contents(), ["six"]);

    store
        .fence()
        .args(["protect", "--target", &store.url, "--table", &t, "--remove"])
        .run()
        .expect(0);
    let (ok, err) = psql(&store, &format!("UPDATE {t} SET v = 'plain'"));
    assert!(ok, "{err}");
    assert_eq!(contents(), ["plain"]);
}

/// Two writes with the same token are both applied, one after the other in commit order
/// (the README states this rule): the second waits for the first's guard-row lock. The first
/// is held inside its transaction by a gate (a row lock the test holds), so the second is
/// seen waiting for the guard row, on the server, for as long as the test likes.
#[test]
fn two_writes_with_the_same_token_are_serialised_and_both_applied() {
    let store = Store::postgres();
    let s = schema(&store);
    sql(&store, &format!("CREATE SCHEMA {s}; CREATE TABLE {s}.log (at timestamptz DEFAULT clock_timestamp(), v text); CREATE TABLE {s}.gate (x int); INSERT INTO {s}.gate VALUES (1);"));
    write(&store, "same", 7, "SELECT 1").expect(0);
    let gate = common::RowLock::hold(&store.url, &format!("{s}.gate"));
    let spawn_write = |v: &'static str, then: String| {
        let (url, schema, home) = (store.url.clone(), s.clone(), store.home.path().to_owned());
        thread::spawn(move || {
            common::Fence::bare(&home)
                .args([
                    "--schema", &schema, "write", "same", "--token", "7", "--target", &url,
                ])
                .args([
                    "--sql",
                    &format!("INSERT INTO {schema}.log (v) VALUES ('{v}'){then}"),
                ])
                .run()
        })
    };
    // The first holds the guard row (begin_write ran) and waits at the gate.
    let first = spawn_write("first", format!("; SELECT x FROM {s}.gate FOR UPDATE"));
    wait_for(
        "the first write at the gate",
        Duration::from_secs(30),
        || common::lock_waiters(&store.url, &s, "gate FOR UPDATE") == 1,
    );
    // The second waits too: its script takes no other lock than the guard row's. (A session
    // shows its whole script as its query, so each is told apart by its own SQL.)
    let second = spawn_write("second", String::new());
    wait_for(
        "the second write to wait for the guard row",
        Duration::from_secs(30),
        || common::lock_waiters(&store.url, &s, "log (v) VALUES ('second')") == 1,
    );
    assert!(!first.is_finished() && !second.is_finished());
    gate.release();
    first.join().unwrap().expect(0);
    second.join().unwrap().expect(0);
    let order: Vec<String> = column(&store, &format!("SELECT v FROM {s}.log ORDER BY at"))
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(order, ["first", "second"]);
    assert_eq!(
        one(
            &store,
            &format!("SELECT accepted_writes FROM {s}.guards WHERE resource = 'same'")
        ),
        "3"
    );
}

/// The caller's SQL failing is `sql_failed` (exit 1), rolled back, never stale or success.
#[test]
fn failing_sql_rolls_back_and_reports_sql_failed() {
    let store = Store::postgres();
    let s = schema(&store);
    sql(&store, &format!("CREATE SCHEMA {s}; CREATE TABLE {s}.t (v int CHECK (v < 10)); INSERT INTO {s}.t VALUES (1);"));
    let out = write(
        &store,
        "r",
        3,
        &format!("UPDATE {s}.t SET v = 2; UPDATE {s}.t SET v = 20"),
    )
    .expect(1);
    let json = out.json();
    assert_eq!(
        (json["error"].as_str(), json["sqlstate"].as_str()),
        (Some("sql_failed"), Some("23514"))
    );
    assert_eq!(
        one(&store, &format!("SELECT v FROM {s}.t")),
        "1",
        "the first statement was rolled back too"
    );
    let out = write(
        &store,
        "r",
        3,
        &format!("UPDATE {s}.t SET v = 2 RETURNING v, 'x' AS label"),
    )
    .expect(0);
    let json = out.json();
    assert_eq!(json["statements"][0]["rows_affected"], 1);
    assert_eq!(
        json["statements"][0]["columns"],
        serde_json::json!(["v", "label"])
    );
    assert_eq!(
        json["statements"][0]["rows"],
        serde_json::json!([["2", "x"]])
    );
}

fn row_write(store: &Store, token: i64, table: &str, args: &[&str]) -> common::Out {
    store
        .fence()
        .args([
            "write",
            "rows",
            "--token",
            &token.to_string(),
            "--target",
            &store.url,
            "--table",
            table,
        ])
        .args(args)
        .args(["--format", "json"])
        .run()
}

/// Row form: missing (6), upsert, applied, stale (4) with the row unchanged, same token again.
#[test]
fn row_form_tells_applied_stale_and_missing_apart() {
    let store = Store::postgres();
    let s = schema(&store);
    let t = format!("{s}.jobs");
    sql(&store, &format!("CREATE SCHEMA {s}; CREATE TABLE {t} (id int PRIMARY KEY, state text, tries int, last_fencing_token bigint);"));
    let row = || {
        one(&store, &format!("SELECT state || '/' || coalesce(tries::text, '-') || '/' || last_fencing_token FROM {t} WHERE id = 42"))
    };

    let out = row_write(&store, 3, &t, &["--key", "id=42", "--set", "state=new"]).expect(6);
    assert_eq!(out.json()["reason"], "row_missing");
    assert_eq!(one(&store, &format!("SELECT count(*) FROM {t}")), "0");
    let out = row_write(
        &store,
        3,
        &t,
        &[
            "--key",
            "id=42",
            "--set",
            "state=new",
            "--set",
            "tries=0",
            "--upsert",
        ],
    )
    .expect(0);
    assert_eq!(out.json()["status"], "inserted");
    assert_eq!(row(), "new/0/3");
    let out = row_write(
        &store,
        5,
        &t,
        &["--key", "id=42", "--set", "state=running", "--upsert"],
    )
    .expect(0);
    assert_eq!(out.json()["status"], "applied");
    assert_eq!(row(), "running/0/5");
    let out = row_write(&store, 4, &t, &["--key", "id=42", "--set", "state=stale"]).expect(4);
    assert_eq!(out.json()["highest_token"], 5);
    assert_eq!(row(), "running/0/5");
    row_write(
        &store,
        5,
        &t,
        &["--key", "id=42", "--set", "state=done", "--set", "tries=1"],
    )
    .expect(0);
    assert_eq!(row(), "done/1/5");
    // A value that does not fit its column is a usage error, and nothing changes.
    row_write(&store, 6, &t, &["--key", "id=42", "--set", "tries=many"]).expect(2);
    assert_eq!(row(), "done/1/5");
}

/// Hostile table, column and key names are quoted, values are bound: nothing is injected.
#[test]
fn row_form_quotes_hostile_names_and_binds_values() {
    let store = Store::postgres();
    let s = schema(&store);
    let table = r#"wé"ird; DROP TABLE sentinel; --"#;
    let key = r#"i"d; --"#;
    let col = r#"stäte'); DROP TABLE sentinel; --"#;
    let q = |name: &str| format!("\"{}\"", name.replace('"', "\"\""));
    sql(
        &store,
        &format!(
            "CREATE SCHEMA {s}; CREATE TABLE {s}.sentinel (x int);
             CREATE TABLE {s}.{} ({} int PRIMARY KEY, {} text, last_fencing_token bigint);",
            q(table),
            q(key),
            q(col)
        ),
    );
    let value = "'); DROP TABLE sentinel; --";
    let full = format!("{s}.{table}");
    row_write(
        &store,
        1,
        &full,
        &[
            "--key",
            &format!("{key}=7"),
            "--set",
            &format!("{col}={value}"),
            "--upsert",
        ],
    )
    .expect(0);
    assert_eq!(
        one(&store, &format!("SELECT {} FROM {s}.{}", q(col), q(table))),
        value
    );
    assert_eq!(
        one(&store, &format!("SELECT count(*) FROM {s}.sentinel")),
        "0",
        "sentinel still exists"
    );
    // Names that do not exist are refused, not executed.
    let out = row_write(
        &store,
        1,
        &format!("{s}.sentinel; DROP TABLE {s}.sentinel"),
        &["--key", "x=1", "--set", "x=2"],
    )
    .expect(2);
    assert!(
        out.json()["message"].as_str().unwrap().contains("no table"),
        "{out:?}"
    );
    row_write(
        &store,
        1,
        &full,
        &["--key", "nope\"=1", "--set", &format!("{col}=v")],
    )
    .expect(2);
    assert_eq!(
        one(&store, &format!("SELECT count(*) FROM {s}.sentinel")),
        "0"
    );
}

/// Concurrent row-form writers with interleaved tokens: only 0 or 4, the stored token ends
/// at the highest accepted one and every refusal carried a lower token than what was stored.
#[test]
fn row_form_classifies_correctly_under_concurrent_writers() {
    let store = Store::postgres();
    let s = schema(&store);
    let t = format!("{s}.cell");
    sql(&store, &format!("CREATE SCHEMA {s}; CREATE TABLE {t} (id int PRIMARY KEY, v text, last_fencing_token bigint); INSERT INTO {t} VALUES (1, 'init', NULL);"));
    let start = Instant::now();
    let results: Vec<(i64, i32, Value)> = (0..6u64)
        .map(|w| {
            let (url, schema, t) = (store.url.clone(), s.clone(), t.clone());
            let home = store.home.path().to_owned();
            thread::spawn(move || {
                let mut out = Vec::new();
                let mut rng = 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(w + 3);
                while start.elapsed() < Duration::from_secs(3) {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let token = 1 + (start.elapsed().as_millis() / 50) as i64 + (rng % 5) as i64;
                    let run = common::Fence::bare(&home)
                        .args([
                            "--schema",
                            &schema,
                            "write",
                            "rows",
                            "--token",
                            &token.to_string(),
                            "--target",
                            &url,
                        ])
                        .args([
                            "--table",
                            &t,
                            "--key",
                            "id=1",
                            "--set",
                            &format!("v=w{w}t{token}"),
                            "--format",
                            "json",
                        ])
                        .run();
                    let json = run.json();
                    out.push((token, run.code, json));
                }
                out
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert!(results.iter().all(|r| r.1 == 0 || r.1 == 4), "{results:?}");
    let max_accepted = results
        .iter()
        .filter(|r| r.1 == 0)
        .map(|r| r.0)
        .max()
        .unwrap();
    let stored: i64 = one(&store, &format!("SELECT last_fencing_token FROM {t}"))
        .parse()
        .unwrap();
    assert_eq!(stored, max_accepted);
    for (token, _, json) in results.iter().filter(|r| r.1 == 4) {
        let newer = json["highest_token"].as_i64().unwrap();
        assert!(
            newer > *token,
            "a refusal must name a newer stored token: {json}"
        );
    }
    let v = one(&store, &format!("SELECT v FROM {t}"));
    assert!(
        v.ends_with(&format!("t{stored}")),
        "the stored value belongs to the stored token: {v}"
    );
}
