//! Review 23: adversarial review of review 21's and 22's fixes (the proof bound to the proxy
//! settings, class 08 as a lost connection, the directory store's failed changes, `fence run`
//! stopping on a refused renewal, `fence log`'s expiries, escaped globs). Each test states
//! what the contract (docs/DESIGN.md §5, §10, §12) promises, what fence did instead, and
//! asserts on durable state and exit statuses.

use crate::common;

use super::review22::{race_through_the_stripper, stripping_forward_proxy};
use common::{Backend, Store};

// ---------------------------------------------------------------------------------------------
// The proof's route (`verify::route`) against the way reqwest (hyper-util's proxy matcher)
// really goes.
// ---------------------------------------------------------------------------------------------

/// FINDING: DESIGN §12 (object stores) "The proof belongs to the path fence uses now |
/// enforced: bound to endpoint + bucket + the forward-proxy settings fence's HTTP client reads
/// (… none under CGI) … another endpoint or proxy is proven again, refused on failure", and §6
/// I3 "At most one live lease per resource". reqwest
/// (hyper-util's `Builder::from_env`) takes any `REQUEST_METHOD` as CGI (`var_os`: set at
/// all), and then uses no proxy; `verify::route` asks `std::env::var`, which is an error for a
/// value that is not UTF-8, and so binds the proof to the `HTTP_PROXY` that the client ignored.
/// A proof made directly (under such a `REQUEST_METHOD`) carries the identity `… via http
/// <proxy>`, and is trusted by a later command, without `REQUEST_METHOD`, whose requests do go
/// through that proxy, which strips every precondition: owners racing for one resource were
/// all granted. `route` should read `REQUEST_METHOD` as the client does (set at all), so that
/// the second command proves the path through the proxy and is refused (exit 2).
#[test]
fn s3_a_proof_made_under_a_request_method_that_is_not_utf8_is_not_trusted_through_the_proxy() {
    use std::os::unix::ffi::OsStrExt;
    let store = Store::new(Backend::S3);
    let proxy = stripping_forward_proxy(&store);
    store
        .fence()
        .env("REQUEST_METHOD", std::ffi::OsStr::from_bytes(b"G\xffT"))
        .env("HTTP_PROXY", proxy.endpoint())
        .acquire("held", &["--owner", "direct", "--ttl", "60s"]);
    assert!(
        proxy.seen().is_empty(),
        "the premise: under CGI the client went direct: {:?}",
        proxy.seen()
    );
    race_through_the_stripper(&proxy, 3, || {
        store.fence().env("HTTP_PROXY", proxy.endpoint())
    });
}

// ---------------------------------------------------------------------------------------------
// Class 08 raised by the caller's own SQL.
// ---------------------------------------------------------------------------------------------

/// FINDING: DESIGN §5 "1 internal (and `sql_failed`: the caller's own SQL failed and was
/// rolled back) … 8 outcome_unknown", and §12 "A refusal of fence's own guard statements is
/// the target's, not the SQL's … the other errors of those classes can be the SQL's own … and
/// stay `sql_failed`". Review 22 made every class-08 error a lost connection
/// (`PgTarget::classify`, src/fenced/postgres.rs: `connected` filters class 08 out before
/// anything else), but the server also sends class 08 as an ordinary ERROR for something the
/// caller's SQL did, on a connection that is fine: postgres_fdw or a function that reaches
/// another server answers 08001 "could not connect to server" when that server is down (here
/// a function raising it, as such a wrapper does). The write was rolled back (the data is as
/// it was) and the session answered, yet fence said exit 8 "lost
/// PostgreSQL … may or may not have committed", blaming the target's connection and sending
/// the caller to `fence inspect` for a write that was definitely not applied. It should be
/// exit 1 `sql_failed` (only a FATAL, or an error after which the connection is gone, is a
/// lost connection).
#[test]
fn postgres_a_connection_error_raised_by_the_callers_sql_is_sql_failed_not_outcome_unknown() {
    let store = Store::postgres();
    let s = store.schema.clone().unwrap();
    common::pg_exec(
        &store.url,
        &format!(
            "CREATE SCHEMA {s}; CREATE TABLE {s}.data (id int PRIMARY KEY, v text NOT NULL); \
             INSERT INTO {s}.data VALUES (1, 'old'); \
             CREATE FUNCTION {s}.pull_from_replica() RETURNS void LANGUAGE plpgsql AS $f$ \
             BEGIN RAISE EXCEPTION 'could not connect to server \"replica\"' \
             USING ERRCODE = '08001'; END $f$;"
        ),
    );
    let token = common::acquire(&store, "orders", "A");
    let out = store
        .fence()
        .args(["write", "orders", "--owner", "A", "--token"])
        .args([token.to_string()])
        .args(["--target", &store.url, "--id", "sync-1"])
        .args([
            "--sql",
            &format!("UPDATE {s}.data SET v = 'new' WHERE id = 1; SELECT {s}.pull_from_replica()"),
        ])
        .args(["--format", "json"])
        .run();
    let v: String =
        common::pg_query(&store.url, &format!("SELECT v FROM {s}.data WHERE id = 1"))[0].get(0);
    assert_eq!(v, "old", "the premise: the write was rolled back: {out:?}");
    assert_eq!(
        out.code, 1,
        "the caller's SQL failed (SQLSTATE 08001 from its own function) on a live connection and was rolled back: sql_failed, not outcome unknown: {out:?}"
    );
    assert!(
        !out.stdout.contains("lost PostgreSQL"),
        "the target's connection was not lost: {out:?}"
    );
}

/// FINDING: the same promise for the row form (DESIGN §5: 8 is "outcome unknown", for a
/// request that may have applied; §12 "Nothing but fence acts on the row form's update … what
/// such a trigger does instead … is its own"). A trigger on the table that reaches another
/// server (through postgres_fdw or a wrapper of it) raises 08001 when that server is down;
/// the row write is rolled back on a session that answered. `pg::classify_request`
/// (src/pg/classify.rs) now takes every class-08 error for a lost connection, so the write is
/// exit 8, "lost PostgreSQL … may or may not have been applied", while the same trigger
/// raising any other error is reported as a definite failure. The SQLSTATE's class does not
/// tell who sent it: the row write should be answered as for any other error of the trigger's
/// (the connection is there, nothing was applied), not as a lost connection.
#[test]
fn postgres_a_connection_error_raised_by_a_trigger_on_a_row_write_is_not_a_lost_connection() {
    let store = Store::postgres();
    let s = store.schema.clone().unwrap();
    let t = format!("{s}.jobs");
    let raising = |code: &str| {
        format!(
            "CREATE OR REPLACE FUNCTION {s}.push_to_replica() RETURNS trigger LANGUAGE plpgsql \
             AS $f$ BEGIN RAISE EXCEPTION 'could not connect to server \"replica\"' \
             USING ERRCODE = '{code}'; END $f$;"
        )
    };
    common::pg_exec(
        &store.url,
        &format!(
            "CREATE SCHEMA {s}; \
             CREATE TABLE {t} (id int PRIMARY KEY, state text, last_fencing_token bigint); \
             INSERT INTO {t} VALUES (1, 'old', NULL); {} \
             CREATE TRIGGER push BEFORE UPDATE ON {t} FOR EACH ROW \
             EXECUTE FUNCTION {s}.push_to_replica();",
            raising("P0001")
        ),
    );
    let token = common::acquire(&store, "jobs", "A");
    let write = |n: u32| {
        store
            .fence()
            .args(["write", "jobs", "--owner", "A", "--token"])
            .args([token.to_string()])
            .args(["--target", &store.url, "--table", &t, "--key", "id=1"])
            .args(["--set", &format!("state=new{n}"), "--format", "json"])
            .run()
    };
    let plain = write(1);
    common::pg_exec(&store.url, &raising("08001"));
    let connection = write(2);
    let state: String =
        common::pg_query(&store.url, &format!("SELECT state FROM {t} WHERE id = 1"))[0].get(0);
    assert_eq!(
        state, "old",
        "the premise: both writes were rolled back: {plain:?} {connection:?}"
    );
    assert_ne!(plain.code, 0, "the premise: the trigger refused: {plain:?}");
    assert_eq!(
        connection.code, plain.code,
        "the same trigger's refusal, with SQLSTATE 08001 instead of P0001 on a live connection, is answered as a lost connection: {connection:?} (P0001: {plain:?})"
    );
}
