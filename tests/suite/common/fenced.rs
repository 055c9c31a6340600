//! Helpers for tests of fenced PostgreSQL writes: a table in the store's own schema, its
//! contents as one string, the server's view of a test's sessions (tagged by
//! application_name), and a `fence` child's end within a deadline.

use std::process::Child;
use std::time::Duration;

use super::{pg_exec, pg_query, Store};

/// The store's schema (fence's tables, and the test's own).
pub fn schema(store: &Store) -> String {
    store.schema.clone().expect("a PostgreSQL store")
}

/// A target URL whose sessions carry `name` as application_name.
pub fn tagged_url(store: &Store, name: &str) -> String {
    format!("{}?application_name={name}", store.url)
}

/// The first column of the first row, as text ("" for NULL).
pub fn one(url: &str, sql: &str) -> String {
    let rows = pg_query(url, sql);
    rows[0].get::<_, Option<String>>(0).unwrap_or_default()
}

/// A table `<schema>.items (v int)`.
pub fn setup_table(store: &Store) -> String {
    let table = format!("{}.items", schema(store));
    pg_exec(
        &store.url,
        &format!(
            "CREATE SCHEMA IF NOT EXISTS {s}; CREATE TABLE {table} (v int)",
            s = schema(store)
        ),
    );
    table
}

/// The table's values, sorted, comma-separated.
pub fn values(store: &Store, table: &str) -> String {
    one(
        &store.url,
        &format!("SELECT coalesce(string_agg(v::text, ',' ORDER BY v), '') FROM {table}"),
    )
}

/// The sessions tagged `name`, as (state, wait event type, query).
pub fn backends(store: &Store, name: &str) -> Vec<(String, String, String)> {
    pg_query(
        &store.url,
        &format!(
            "SELECT coalesce(state, ''), coalesce(wait_event_type, ''), coalesce(query, '') \
             FROM pg_stat_activity WHERE application_name = '{name}'"
        ),
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

/// The exit code, stdout and stderr of a child, failing the test after `limit`.
pub fn finish(child: Child, limit: Duration) -> (i32, String, String) {
    let out = super::wait_output("the process", child, limit);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Takes `resource`'s lease away from its holder, as an operator would: releases it with the
/// holder's own owner and token.
pub fn release_as_operator(store: &Store, resource: &str) {
    let (owner, token, _) = store.lease(resource).expect("a lease");
    store
        .fence()
        .args([
            "release",
            resource,
            "--owner",
            &owner,
            "--token",
            &token.to_string(),
        ])
        .run()
        .expect(0);
}

/// A transaction another session keeps open (holding whatever `sql` locks) until released.
pub struct Held {
    release: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Held {
    /// Ends the transaction (as [`hold_in_transaction`] was told) and waits for the session.
    pub fn release(self) {
        self.release.send(()).unwrap();
        self.thread.join().unwrap();
    }
}

/// Runs `BEGIN; {sql}` on a session of its own and returns once it holds what `sql` locked;
/// the transaction ends with `end` when the [`Held`] is released.
pub fn hold_in_transaction(url: &str, sql: String, end: &'static str) -> Held {
    let url = url.to_owned();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (held, is_held) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        super::block_on(async move {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            client
                .batch_execute(&format!("BEGIN; {sql}"))
                .await
                .unwrap();
            held.send(()).unwrap();
            let _ = tokio::task::spawn_blocking(move || released.recv()).await;
            client.batch_execute(end).await.unwrap();
        })
    });
    is_held.recv().unwrap();
    Held { release, thread }
}

/// A coordinator schema at another version than this fence's, in `store`: a newer one (99) is
/// refused by acquire, renew and release (exit 2, naming the version) with nothing written;
/// an older one (4) is migrated, then used.
pub fn coordinator_schema_versions_are_checked(store: &Store) {
    let schema = store.schema.clone().unwrap();
    let held = store.fence().acquire("r", &["--owner", "a", "--ttl", "1h"]);
    let set_version = |v: &str| {
        pg_exec(
            &store.url,
            &format!("UPDATE {schema}.meta SET value = '{v}' WHERE key = 'schema_version'"),
        )
    };
    let leases = || -> String {
        pg_query(
            &store.url,
            &format!("SELECT string_agg(resource || ':' || token || ':' || coalesce(owner, '-') || ':' || (expires_at > now())::text, ' ' ORDER BY resource) FROM {schema}.leases"),
        )[0]
        .get(0)
    };
    let before = leases();
    set_version("99");
    let token = held.token.to_string();
    for args in [
        vec!["acquire", "other", "--owner", "b"],
        vec!["renew", "r", "--token", &token, "--owner", "a"],
        vec!["release", "r", "--token", &token, "--owner", "a"],
    ] {
        let out = store.fence().args(&args).args(["--format", "json"]).run();
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
        let message = out.json()["message"].as_str().unwrap().to_owned();
        assert!(
            message.contains("newer fence") && message.contains("version 99"),
            "{args:?}: {message}"
        );
    }
    assert_eq!(leases(), before, "a command wrote to a newer schema");
    set_version("4");
    store.fence().acquire("other", &["--owner", "b"]);
    let version: String = pg_query(
        &store.url,
        &format!("SELECT value FROM {schema}.meta WHERE key = 'schema_version'"),
    )[0]
    .get(0);
    assert_eq!(
        version,
        fence::coordinator::COORDINATOR_SCHEMA.version.to_string()
    );
}
