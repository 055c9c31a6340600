//! `fence log` (issue 19): the incident — A acquires with a TTL, A's lease runs out, B takes
//! over, B writes (3 rows), A's late renew and late write are refused, B releases — read back
//! as one timeline, in order, with TTLs, expiries and rows, in human, JSON and ndjson forms,
//! on the directory store and on PostgreSQL (with a PostgreSQL target either way); and the
//! filters narrow it to exactly the events they name.

use crate::common;

use std::time::Duration;

use common::follow::Follower;
use common::{env_or_panic, pg_exec, wait_for, Store};
use serde_json::Value;

/// The store, and the PostgreSQL database and schema the writes go to.
struct Incident {
    store: Store,
    /// The target (the store itself on PostgreSQL).
    target: Store,
}

impl Incident {
    fn new(store: Store) -> Incident {
        let target = Store::postgres();
        let incident = Incident { store, target };
        let schema = incident.schema();
        pg_exec(
            &incident.target.url,
            &format!(
                "CREATE SCHEMA {schema}; CREATE TABLE {schema}.totals (n int); \
                 INSERT INTO {schema}.totals VALUES (1), (2), (3)"
            ),
        );
        incident
    }

    /// fence's schema in the target, which holds the table too: the store's own on
    /// PostgreSQL (the store's database is the target).
    fn schema(&self) -> String {
        self.store
            .schema
            .clone()
            .or_else(|| self.target.schema.clone())
            .unwrap()
    }

    /// `fence` on the store, with the target's schema (the store's own on PostgreSQL).
    fn fence(&self) -> common::Fence {
        let fence = self.store.fence();
        match self.store.schema {
            Some(_) => fence,
            None => fence.args(["--schema", &self.schema()]),
        }
    }

    fn write(&self, owner: &str, token: &str) -> common::Out {
        let sql = format!("UPDATE {}.totals SET n = n + 10", self.schema());
        self.fence()
            .args(["write", "job", "--owner", owner, "--token", token])
            .args(["--target", &self.target.url, "--sql", &sql])
            .run()
    }

    /// Plays the incident; returns A's lease expiry as the store reported it.
    fn play(&self) -> String {
        let a = self
            .fence()
            .args([
                "acquire", "job", "--owner", "A", "--ttl", "1s", "--format", "json",
            ])
            .run()
            .expect(0)
            .json();
        assert_eq!(a["token"], 1);
        wait_for("A's lease to expire", Duration::from_secs(10), || {
            let view = self
                .fence()
                .args(["inspect", "job", "--format", "json"])
                .run()
                .expect(0)
                .json();
            view["resources"][0]["state"] == "expired"
        });
        let b = self
            .fence()
            .args([
                "acquire", "job", "--owner", "B", "--ttl", "30s", "--format", "json",
            ])
            .run()
            .expect(0)
            .json();
        assert_eq!(b["token"], 2);
        self.write("B", "2").expect(0);
        self.fence()
            .args(["renew", "job", "--owner", "A", "--token", "1"])
            .run()
            .expect(4);
        self.write("A", "1").expect(4);
        self.fence()
            .args(["release", "job", "--owner", "B", "--token", "2"])
            .run()
            .expect(0);
        a["lease_expires_at"].as_str().unwrap().to_owned()
    }

    fn log(&self, args: &[&str]) -> common::Out {
        self.fence()
            .args(["log", "--resource", "job", "--target", &self.target.url])
            .args(args)
            .run()
            .expect(0)
    }
}

const ORDER: [(&str, &str, i64); 7] = [
    ("acquired", "A", 1),
    ("expired", "A", 1),
    ("taken_over", "B", 2),
    ("write_accepted", "B", 2),
    ("renew_rejected", "A", 1),
    ("write_rejected", "A", 1),
    ("released", "B", 2),
];

fn kinds(events: &[Value]) -> Vec<(String, String, i64)> {
    events
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_owned(),
                e["owner"].as_str().unwrap_or("-").to_owned(),
                e["token"].as_i64().unwrap_or(0),
            )
        })
        .collect()
}

fn expected(filter: impl Fn(&(&str, &str, i64)) -> bool) -> Vec<(String, String, i64)> {
    ORDER
        .iter()
        .filter(|e| filter(e))
        .map(|(k, o, t)| (k.to_string(), o.to_string(), *t))
        .collect()
}

fn incident_timeline(store: Store) {
    let incident = Incident::new(store);
    let a_expires = incident.play();
    let json = incident.log(&["--format", "json"]).json();
    let events = json["events"].as_array().unwrap().clone();
    assert_eq!(kinds(&events), expected(|_| true), "{json:#}");
    assert_eq!(json["integrity_ok"], true, "{json:#}");
    assert_eq!(json["truncated"], false);
    // A's grant: its TTL and the expiry it set; the expiry at that instant; B's takeover says
    // when A's lease had expired; B's write changed the 3 rows.
    assert_eq!(events[0]["ttl_ms"], 1000);
    assert_eq!(events[0]["expires_at"], a_expires.as_str());
    assert_eq!(events[1]["at"], a_expires.as_str());
    assert_eq!(events[1]["derived"], true);
    assert_eq!(events[2]["ttl_ms"], 30000);
    assert_eq!(events[2]["previous_expires_at"], a_expires.as_str());
    assert_eq!(events[3]["rows"], 3);
    assert_eq!(events[3]["source"], "target");
    assert_eq!(events[5]["source"], "target");
    let times: Vec<&str> = events.iter().map(|e| e["at"].as_str().unwrap()).collect();
    let mut sorted = times.clone();
    sorted.sort();
    assert_eq!(times, sorted, "oldest first");

    // ndjson: the same events, one object per line.
    let ndjson = incident.log(&["--format", "ndjson"]);
    let lines: Vec<Value> = ndjson
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines, events);

    // Human: one table row per event, in the same order, with the TTL and the rows.
    let human = incident.log(&[]).stdout;
    let rows: Vec<&str> = human.lines().filter(|l| l.contains(" job ")).collect();
    assert_eq!(rows.len(), ORDER.len(), "{human}");
    for (row, (kind, owner, token)) in rows.iter().zip(ORDER) {
        let cells: Vec<&str> = row.split('┆').map(|c| c.trim()).collect();
        assert_eq!((cells[3], cells[4]), (kind, owner), "{human}");
        assert_eq!(cells[5], token.to_string(), "{human}");
    }
    assert!(rows[0].contains("ttl 1.0s, expires"), "{human}");
    assert!(
        rows[2].contains(&format!("previous lease expired {a_expires}")),
        "{human}"
    );
    assert!(rows[3].contains("3 rows"), "{human}");

    // Filters.
    let filtered = |args: &[&str]| {
        let mut all = vec!["--format", "json"];
        all.extend_from_slice(args);
        kinds(incident.log(&all).json()["events"].as_array().unwrap())
    };
    assert_eq!(filtered(&["--owner", "A"]), expected(|e| e.1 == "A"));
    assert_eq!(filtered(&["--owner", "?"]), expected(|_| true));
    assert_eq!(filtered(&["--owner", "B*"]), expected(|e| e.1 == "B"));
    assert_eq!(filtered(&["--token", "2"]), expected(|e| e.2 == 2));
    assert_eq!(
        filtered(&["--kind", "write_rejected", "--kind", "expired"]),
        expected(|e| e.0 == "write_rejected" || e.0 == "expired")
    );
    let takeover = events[2]["at"].as_str().unwrap();
    let released = events[6]["at"].as_str().unwrap();
    assert_eq!(
        filtered(&["--since", takeover, "--until", released]),
        expected(|e| !["acquired", "expired", "released"].contains(&e.0))
    );
    assert_eq!(filtered(&["--since", "1h"]), expected(|_| true));
    assert_eq!(filtered(&["--until", "2h"]), expected(|_| false));
    // A glob, and a resource with no events.
    let all = incident
        .fence()
        .args(["log", "--resource", "j*", "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(all["events"].as_array().unwrap().len(), 5);
    let none = incident
        .fence()
        .args(["log", "--resource", "other", "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(none["events"], Value::Array(Vec::new()));
    // --limit keeps the newest, and says so.
    let limited = incident
        .fence()
        .args([
            "log",
            "--resource",
            "job",
            "--limit",
            "2",
            "--format",
            "json",
        ])
        .run()
        .expect(0)
        .json();
    assert_eq!(limited["truncated"], true);
    assert_eq!(
        kinds(limited["events"].as_array().unwrap()),
        expected(|e| e.0 == "renew_rejected" || e.0 == "released")
    );
}

#[test]
fn file_store_incident_timeline() {
    incident_timeline(Store::file());
}

#[test]
fn postgres_incident_timeline() {
    incident_timeline(Store::postgres());
}

/// `--format ndjson` is for `fence log` only; a failure is one JSON line.
#[test]
fn ndjson_is_for_log_only() {
    let store = Store::file();
    let out = store
        .fence()
        .args(["inspect", "--format", "ndjson"])
        .run()
        .expect(2);
    let err = out.json();
    assert_eq!(err["error"], "usage");
    let bad = store
        .fence()
        .args(["log", "--since", "yesterday", "--format", "ndjson"])
        .run()
        .expect(2);
    assert_eq!(bad.json()["ok"], false);
    // --follow prints a stream: one JSON object cannot hold it.
    let follow = store
        .fence()
        .args(["log", "--follow", "--format", "json"])
        .run()
        .expect(2);
    assert_eq!(follow.json()["error"], "usage");
}

/// A version-3 schema (events without TTLs) is read as it is, and `fence init` migrates it:
/// the grants after that carry their TTL and expiry.
#[test]
fn postgres_a_version_3_schema_is_read_then_migrated() {
    let store = Store::postgres();
    let s = store.schema.clone().unwrap();
    store
        .fence()
        .args(["acquire", "job", "--owner", "A", "--ttl", "5s", "-q"])
        .run()
        .expect(0);
    pg_exec(
        &store.url,
        &format!(
            "ALTER TABLE {s}.events DROP COLUMN ttl_ms, DROP COLUMN expires_at, \
             DROP COLUMN previous_expires_at; \
             ALTER TABLE {s}.leases DROP COLUMN previous_expires_at; \
             UPDATE {s}.meta SET value = '3' WHERE key = 'schema_version'"
        ),
    );
    let log = |store: &Store| {
        store
            .fence()
            .args(["log", "--format", "json"])
            .run()
            .expect(0)
            .json()["events"]
            .as_array()
            .unwrap()
            .clone()
    };
    let before = log(&store);
    assert_eq!(kinds(&before), [("acquired".into(), "A".into(), 1)]);
    assert_eq!(before[0].get("ttl_ms"), None);
    let init = store
        .fence()
        .args(["init", "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(
        (init["action"].as_str(), init["schema_version"].as_i64()),
        (Some("migrated"), Some(5))
    );
    store
        .fence()
        .args(["release", "job", "--owner", "A", "--token", "1"])
        .run()
        .expect(0);
    store
        .fence()
        .args(["acquire", "job", "--owner", "B", "--ttl", "7s", "-q"])
        .run()
        .expect(0);
    let after = log(&store);
    assert_eq!(after.len(), 3);
    assert_eq!(
        (after[2]["kind"].as_str(), after[2]["ttl_ms"].as_i64()),
        (Some("acquired"), Some(7000))
    );
}

/// The warnings of a timeline, as (kind, resource).
fn warnings(json: &Value) -> Vec<(String, String)> {
    json["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["kind"].as_str().unwrap().to_owned(),
                w["resource"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// A lease used past its TTL — a write accepted with its token and a release after its expiry,
/// by the store's clock — is warned about; so is a target that accepted a token above every
/// token the store issued. Both in the timeline, and the latter in `inspect` too.
fn integrity_held_past_ttl_and_target_ahead(store: Store) {
    let incident = Incident::new(store);
    incident
        .fence()
        .args(["acquire", "job", "--owner", "A", "--ttl", "1s", "-q"])
        .run()
        .expect(0);
    wait_for("A's lease to expire", Duration::from_secs(10), || {
        let view = incident
            .fence()
            .args(["inspect", "job", "--format", "json"])
            .run()
            .expect(0)
            .json();
        view["resources"][0]["state"] == "expired"
    });
    // No newer token has written: the target cannot know, and accepts.
    incident.write("A", "1").expect(0);
    incident
        .fence()
        .args(["release", "job", "--owner", "A", "--token", "1"])
        .run()
        .expect(0);
    let json = incident.log(&["--format", "json"]).json();
    assert_eq!(
        kinds(json["events"].as_array().unwrap()),
        [
            ("acquired".into(), "A".into(), 1),
            ("expired".into(), "A".into(), 1),
            ("write_accepted".into(), "A".into(), 1),
            ("released".into(), "A".into(), 1),
        ]
    );
    assert_eq!(json["integrity_ok"], false);
    assert_eq!(
        warnings(&json),
        [
            ("held_past_ttl".into(), "job".into()),
            ("held_past_ttl".into(), "job".into())
        ],
        "{json:#}"
    );

    // The target's guard row raised by hand above anything the store issued.
    pg_exec(
        &incident.target.url,
        &format!(
            "UPDATE {}.guards SET highest_token = 9 WHERE resource = 'job'",
            incident.schema()
        ),
    );
    let json = incident.log(&["--format", "json"]).json();
    assert!(
        warnings(&json).contains(&("target_ahead".into(), "job".into())),
        "{json:#}"
    );
    let human = incident.log(&[]).stdout;
    assert!(human.contains("warning (target_ahead): "), "{human}");
    let inspect = incident
        .fence()
        .args([
            "inspect",
            "job",
            "--target",
            &incident.target.url,
            "--format",
            "json",
        ])
        .run()
        .expect(0)
        .json();
    assert_eq!(inspect["integrity_ok"], false);
    assert_eq!(inspect["warnings"][0]["kind"], "target_ahead");
}

#[test]
fn file_store_integrity_held_past_ttl_and_target_ahead() {
    integrity_held_past_ttl_and_target_ahead(Store::file());
}

#[test]
fn postgres_integrity_held_past_ttl_and_target_ahead() {
    integrity_held_past_ttl_and_target_ahead(Store::postgres());
}

/// A grant whose token is not above an earlier grant's (a store restored from an older copy)
/// is warned about in the timeline and in `inspect`; the healthy history before it is not.
fn integrity_token_regressed(store: &Store, regress: impl Fn(&Store)) {
    for owner in ["A", "B"] {
        store
            .fence()
            .args(["acquire", "job", "--owner", owner, "--ttl", "30s", "-q"])
            .run()
            .expect(0);
        let token = if owner == "A" { "1" } else { "2" };
        store
            .fence()
            .args(["release", "job", "--owner", owner, "--token", token])
            .run()
            .expect(0);
    }
    let log = |store: &Store| {
        store
            .fence()
            .args(["log", "--format", "json"])
            .run()
            .expect(0)
            .json()
    };
    let healthy = log(store);
    assert_eq!(healthy["integrity_ok"], true, "{healthy:#}");
    regress(store);
    let json = log(store);
    assert_eq!(
        warnings(&json),
        [("token_regressed".into(), "job".into())],
        "{json:#}"
    );
    let inspect = store
        .fence()
        .args(["inspect", "job", "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(
        inspect["warnings"][0]["kind"], "token_regressed",
        "{inspect:#}"
    );
}

#[test]
fn file_store_integrity_token_regressed() {
    integrity_token_regressed(&Store::file(), |store| {
        let log = store.dir().join("events/job.jsonl");
        let mut text = std::fs::read_to_string(&log).unwrap();
        text.push_str(r#"{"at_ms":4102444800000,"kind":"acquired","owner":"C","token":1}"#);
        text.push('\n');
        std::fs::write(&log, text).unwrap();
    });
}

#[test]
fn postgres_integrity_token_regressed() {
    integrity_token_regressed(&Store::postgres(), |store| {
        let s = store.schema.clone().unwrap();
        pg_exec(
            &store.url,
            &format!(
                "INSERT INTO {s}.events (resource, kind, owner, token) VALUES ('job', 'acquired', 'C', 1)"
            ),
        );
    });
}

/// `fence log --follow --format ndjson --resource job`, from `cmd` (a fence command).
fn follow(mut cmd: std::process::Command) -> Follower {
    cmd.args(["log", "--follow", "--format", "ndjson", "--resource", "job"]);
    Follower::start(cmd)
}

/// Runs `fence` (from `cmd`) to its end.
fn ended(mut cmd: std::process::Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// `--follow` prints what another process does as it happens (while it runs, each change
/// before the next is made), in order, and ends cleanly on SIGINT. How soon is its poll's
/// matter and the machine's, not asserted: the bounds are for a hang.
#[test]
fn file_store_follow_prints_events_as_they_happen() {
    let store = Store::file();
    store
        .fence()
        .args(["acquire", "job", "--owner", "A", "--ttl", "1m", "-q"])
        .run()
        .expect(0);
    let follower = follow(store.fence().cmd);
    let first = follower.next("acquired", Duration::from_secs(10));
    assert_eq!(first["owner"], "A");
    ended(
        store
            .fence()
            .args(["release", "job", "--owner", "A", "--token", "1"])
            .cmd,
    );
    let released = follower.next("released", Duration::from_secs(10));
    assert_eq!(
        (released["owner"].as_str(), released["token"].as_i64()),
        (Some("A"), Some(1))
    );
    ended(
        store
            .fence()
            .args(["acquire", "job", "--owner", "B", "--ttl", "1m", "-q"])
            .cmd,
    );
    let acquired = follower.next("acquired", Duration::from_secs(10));
    assert_eq!(acquired["token"], 2);
    follower.interrupt();
}

/// Issue 33, 8: `--follow` showed a lease's expiry when its time came, then again (with no
/// owner or token) when the takeover that followed it was read. Once is right.
#[test]
fn follow_shows_an_expiry_once_when_a_takeover_follows() {
    let store = Store::file();
    store
        .fence()
        .args(["acquire", "job", "--owner", "A", "--ttl", "1s", "-q"])
        .run()
        .expect(0);
    let follower = follow(store.fence().cmd);
    let expired = follower.next("expired", Duration::from_secs(20));
    assert_eq!(
        (expired["owner"].as_str(), expired["token"].as_i64()),
        (Some("A"), Some(1))
    );
    store
        .fence()
        .args(["acquire", "job", "--owner", "B", "--ttl", "1m", "-q"])
        .run()
        .expect(0);
    let mut between = follower.until("a taken_over event", Duration::from_secs(10), |line| {
        line["kind"] == "taken_over"
    });
    between.pop();
    assert!(
        between.iter().all(|l| l["kind"] != "expired"),
        "the expiry was shown again: {between:?}"
    );
    follower.interrupt();
}

/// On PostgreSQL too, and through a restart of the server (a private cluster): the events
/// after the restart are printed once it answers again, none twice.
#[test]
fn postgres_follow_survives_a_restart() {
    let cluster = common::cluster::Cluster::start();
    let fence = || {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fence"));
        cmd.env_remove("FENCE_STORE")
            .args(["--store", &cluster.url()]);
        cmd
    };
    let mut acquire = fence();
    acquire.args(["acquire", "job", "--owner", "A", "--ttl", "1m", "-q"]);
    ended(acquire);
    let follower = follow(fence());
    follower.next("acquired", Duration::from_secs(10));
    let mut release = fence();
    release.args(["release", "job", "--owner", "A", "--token", "1"]);
    ended(release);
    follower.next("released", Duration::from_secs(10));

    cluster.pg_ctl("restart");
    let mut acquire = fence();
    acquire.args(["acquire", "job", "--owner", "B", "--ttl", "1m", "-q"]);
    ended(acquire);
    // Printed once the server answers again: the restart did not end the follow.
    let acquired = follower.next("acquired", Duration::from_secs(30));
    assert_eq!(
        (acquired["owner"].as_str(), acquired["token"].as_i64()),
        (Some("B"), Some(2))
    );
    // Nothing is printed twice.
    let mut release = fence();
    release.args(["release", "job", "--owner", "B", "--token", "2"]);
    ended(release);
    let released = follower.next("released", Duration::from_secs(10));
    assert_eq!(released["owner"], "B");
    assert!(
        follower.lines.try_iter().all(|l| l["kind"] != "acquired"),
        "an event was printed twice"
    );
    follower.interrupt();
}

/// Every coordinator's grants and renewals carry their TTL and the expiry they set, and a
/// lease that ran out shows as `expired` before the takeover that followed it.
fn lease_events_carry_ttl_and_expiry(store: &Store) {
    store
        .fence()
        .args(["acquire", "job", "--owner", "A", "--ttl", "1s", "-q"])
        .run()
        .expect(0);
    wait_for("A's lease to expire", Duration::from_secs(20), || {
        store
            .fence()
            .args(["acquire", "job", "--owner", "B", "--ttl", "30s", "-q"])
            .run()
            .code
            == 0
    });
    store
        .fence()
        .args([
            "renew", "job", "--owner", "B", "--token", "2", "--ttl", "5s",
        ])
        .run()
        .expect(0);
    store
        .fence()
        .args(["release", "job", "--owner", "B", "--token", "2"])
        .run()
        .expect(0);
    // B's busy attempts while A's lease lasted are recorded too (not on object stores).
    let json = store
        .fence()
        .args(["log", "--resource", "job", "--format", "json"])
        .args([
            "--kind",
            "acquired",
            "--kind",
            "expired",
            "--kind",
            "taken_over",
        ])
        .args(["--kind", "renewed", "--kind", "released"])
        .run()
        .expect(0)
        .json();
    let events = json["events"].as_array().unwrap();
    assert_eq!(
        kinds(events),
        [
            ("acquired".into(), "A".into(), 1),
            ("expired".into(), "A".into(), 1),
            ("taken_over".into(), "B".into(), 2),
            ("renewed".into(), "B".into(), 2),
            ("released".into(), "B".into(), 2),
        ],
        "{json:#}"
    );
    for (i, ttl) in [(0, 1000), (2, 30000), (3, 5000)] {
        let at = common::timestamp_ms(events[i]["at"].as_str().unwrap());
        let expires = common::timestamp_ms(events[i]["expires_at"].as_str().unwrap());
        assert_eq!(
            (events[i]["ttl_ms"].as_i64(), expires - at),
            (Some(ttl), ttl),
            "{json:#}"
        );
    }
    assert_eq!(events[1]["at"], events[0]["expires_at"]);
}

per_coordinator!(lease_events_carry_ttl_and_expiry);

/// The rows a write changed are its own, also when consecutive writes share one server
/// connection behind a transaction-mode pooler (whose sessions keep counts of earlier
/// transactions): 3 rows, then 2, then 3 again, each counted alone.
#[test]
fn rows_are_counted_per_write_behind_a_pooler() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    let pooled = env_or_panic("FENCE_TEST_PGBOUNCER_URL");
    pg_exec(
        &store.url,
        &format!(
            "CREATE SCHEMA {schema}; CREATE TABLE {schema}.totals (n int); \
             INSERT INTO {schema}.totals VALUES (1), (2), (3)"
        ),
    );
    for (sql, token) in [
        (format!("UPDATE {schema}.totals SET n = n + 1"), "1"),
        (format!("DELETE FROM {schema}.totals WHERE n >= 3"), "1"),
        (
            format!("INSERT INTO {schema}.totals VALUES (7), (8), (9)"),
            "1",
        ),
    ] {
        store
            .fence()
            .args([
                "write", "job", "--token", token, "--target", &pooled, "--sql", &sql,
            ])
            .run()
            .expect(0);
    }
    // `fence log` refuses a coordinator that was never created (a typo in --schema): these
    // tokens were handed out elsewhere, so create it empty.
    store.fence().args(["init", "-q"]).run().expect(0);
    let json = store
        .fence()
        .args(["log", "--target", &store.url, "--format", "json"])
        .run()
        .expect(0)
        .json();
    let rows: Vec<i64> = json["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["rows"].as_i64().unwrap())
        .collect();
    assert_eq!(rows, [3, 2, 3], "{json:#}");
}

/// `--since`/`--until` without a zone are local time, as TZ says (here UTC+9 and UTC−5);
/// with `Z`, and as a span back, they are what they say whatever TZ is.
#[test]
fn times_without_a_zone_are_local_time() {
    let store = Store::file();
    store
        .fence()
        .args(["acquire", "job", "--owner", "A", "-q"])
        .run()
        .expect(0);
    let json = store
        .fence()
        .args(["log", "--format", "json"])
        .run()
        .expect(0)
        .json();
    let at = humantime::parse_rfc3339(json["events"][0]["at"].as_str().unwrap()).unwrap();
    let minute = Duration::from_secs(60);
    // The clock-face time a minute before the event, in a zone `east` of UTC, without a zone.
    let local = |east: i64| {
        let face = if east >= 0 {
            at - minute + Duration::from_secs(east.unsigned_abs())
        } else {
            at - minute - Duration::from_secs(east.unsigned_abs())
        };
        let text = humantime::format_rfc3339_seconds(face).to_string();
        text.trim_end_matches('Z').replace('T', " ")
    };
    let events = |tz: &str, args: &[&str]| {
        store
            .fence()
            .env("TZ", tz)
            .args(["log", "--format", "ndjson"])
            .args(args)
            .run()
            .expect(0)
            .stdout
            .lines()
            .count()
    };
    for (tz, east) in [("JST-9", 9 * 3600), ("COT5", -5 * 3600)] {
        let before = local(east);
        // Read as UTC, these would be hours off: the event would fall on the other side.
        assert_eq!(
            events(tz, &["--since", &before]),
            1,
            "{tz} --since {before}"
        );
        assert_eq!(
            events(tz, &["--until", &before]),
            0,
            "{tz} --until {before}"
        );
        let utc = humantime::format_rfc3339_seconds(at - minute).to_string();
        assert_eq!(events(tz, &["--since", &utc]), 1, "{tz} --since {utc}");
        assert_eq!(events(tz, &["--until", &utc]), 0, "{tz} --until {utc}");
        assert_eq!(events(tz, &["--since", "1h"]), 1);
        assert_eq!(events(tz, &["--until", "1h"]), 0);
    }
}

/// The refused attempts a store recorded, as the store keeps them (read without fence):
/// (owner, kind, count) summed over minutes, sorted.
fn stored_attempts(store: &Store) -> Vec<(String, String, i64)> {
    let mut rows: Vec<(String, String, i64)> = match &store.schema {
        Some(schema) => store
            .pg_rows(
                &format!(
                    "SELECT owner, kind, sum(count)::int8 FROM {schema}.attempts \
                     WHERE resource = $1 GROUP BY 1, 2"
                ),
                "job",
            )
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect(),
        None => {
            let path = store.home.path().join("store/attempts/job.json");
            let windows: Vec<Value> =
                serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
            let mut sums = std::collections::BTreeMap::new();
            for w in windows {
                *sums
                    .entry((
                        w["owner"].as_str().unwrap().to_owned(),
                        w["kind"].as_str().unwrap().to_owned(),
                    ))
                    .or_insert(0) += w["count"].as_i64().unwrap();
            }
            sums.into_iter().map(|((o, k), n)| (o, k, n)).collect()
        }
    };
    rows.sort();
    rows
}

/// Busy acquisitions and conflicting renewals/releases are recorded, one line per owner,
/// kind and minute with a count ("who else tried"), and shown by `fence log`; a waiter's
/// polls are one attempt; the refusals' exit codes are what they were.
fn refused_attempts_are_recorded(store: &Store) {
    let fence = || store.fence();
    fence()
        .args(["acquire", "job", "--owner", "A", "--ttl", "1m", "-q"])
        .run()
        .expect(0);
    for _ in 0..3 {
        fence()
            .args(["acquire", "job", "--owner", "B", "-q"])
            .run()
            .expect(3);
    }
    fence()
        .args(["acquire", "job", "--owner", "C", "--wait", "700ms", "-q"])
        .run()
        .expect(3);
    fence()
        .args(["renew", "job", "--owner", "B", "--token", "1"])
        .run()
        .expect(6);
    fence()
        .args(["release", "job", "--owner", "D", "--token", "99"])
        .run()
        .expect(6);
    // A stale renewal is an event of its own (renew_rejected), not an attempt.
    let expected = [
        ("B".to_owned(), "busy".to_owned(), 3),
        ("B".to_owned(), "conflict".to_owned(), 1),
        ("C".to_owned(), "busy".to_owned(), 1),
        ("D".to_owned(), "conflict".to_owned(), 1),
    ];
    assert_eq!(stored_attempts(store), expected);

    let lines: Vec<Value> = fence()
        .args(["log", "--resource", "job", "--format", "ndjson"])
        .args(["--kind", "busy", "--kind", "conflict"])
        .run()
        .expect(0)
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut shown: std::collections::BTreeMap<(String, String), i64> = Default::default();
    for line in &lines {
        let key = (
            line["owner"].as_str().unwrap().to_owned(),
            line["kind"].as_str().unwrap().to_owned(),
        );
        *shown.entry(key).or_default() += line["count"].as_i64().unwrap();
        assert!(line["last_at"].as_str().unwrap() >= line["at"].as_str().unwrap());
        if line["kind"] == "busy" {
            assert_eq!(line["token"], 1, "the holder's token: {line}");
            assert!(line["detail"].as_str().unwrap().contains("`A`"), "{line}");
        }
    }
    let shown: Vec<(String, String, i64)> =
        shown.into_iter().map(|((o, k), n)| (o, k, n)).collect();
    assert_eq!(shown, expected);
    let human = fence()
        .args(["log", "--resource", "job", "--owner", "B", "--kind", "busy"])
        .run()
        .expect(0)
        .stdout;
    assert!(
        human.contains("busy") && human.contains("attempt"),
        "{human}"
    );
}

#[test]
fn file_store_refused_attempts_are_recorded() {
    refused_attempts_are_recorded(&Store::file());
}

#[test]
fn postgres_refused_attempts_are_recorded() {
    refused_attempts_are_recorded(&Store::postgres());
}

/// A refused attempt that cannot be recorded is still refused with its own exit code, with
/// a warning.
#[test]
fn an_unrecorded_attempt_keeps_its_exit_code() {
    let file = Store::file();
    let pg = Store::postgres();
    for store in [&file, &pg] {
        store
            .fence()
            .args(["acquire", "job", "--owner", "A", "--ttl", "1m", "-q"])
            .run()
            .expect(0);
    }
    // The directory store: `attempts` is a file, so no attempts file can be made in it.
    std::fs::write(file.home.path().join("store/attempts"), "in the way").unwrap();
    // PostgreSQL: a trigger refuses every row.
    let schema = pg.schema.clone().unwrap();
    pg_exec(
        &pg.url,
        &format!(
            "CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'no attempts here'; END $$; \
             CREATE TRIGGER refuse BEFORE INSERT ON {schema}.attempts \
             FOR EACH ROW EXECUTE FUNCTION {schema}.refuse();"
        ),
    );
    for store in [&file, &pg] {
        let busy = store
            .fence()
            .args(["acquire", "job", "--owner", "B", "--format", "json"])
            .run();
        assert_eq!(busy.code, 3, "{busy:?}");
        assert_eq!(busy.json()["error"], "busy");
        assert!(
            busy.json()["notices"]
                .to_string()
                .contains("was not recorded"),
            "{busy:?}"
        );
        let conflict = store
            .fence()
            .args(["release", "job", "--owner", "B", "--token", "1"])
            .run();
        assert_eq!(conflict.code, 6, "{conflict:?}");
    }
}

/// A late write refused by an object target leaves a trace `fence log` finds: the refusing
/// `fence write` records it in the coordinator's history (`write_rejected`, from the store),
/// and `fence log --target OBJECT` shows the writes the object accepted (its current version
/// and the ids it remembers), interleaved with the leases.
fn object_refusals_leave_a_trace(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let object = format!("file://{}/report.json", dir.path().display());
    let bytes = dir.path().join("bytes");
    std::fs::write(&bytes, "{}").unwrap();
    let fence = || store.fence();
    let write = |owner: &str, token: &str, id: &str| {
        fence()
            .args(["write", "job", "--owner", owner, "--token", token])
            .args(["--target", &object, "--id", id, "--from"])
            .args([&bytes])
            .run()
    };
    fence()
        .args(["acquire", "job", "--owner", "A", "-q"])
        .run()
        .expect(0);
    fence()
        .args(["release", "job", "--owner", "A", "--token", "1"])
        .run()
        .expect(0);
    fence()
        .args(["acquire", "job", "--owner", "B", "-q"])
        .run()
        .expect(0);
    write("B", "2", "w1").expect(0);
    write("B", "2", "w2").expect(0);
    let late = write("A", "1", "w3");
    assert_eq!(late.code, 4, "{late:?}");
    assert!(!late.stderr.contains("warning"), "{late:?}");
    assert_eq!(
        stored_attempts(store),
        [("A".to_owned(), "write_rejected".to_owned(), 1)]
    );
    let json = fence()
        .args([
            "log",
            "--resource",
            "job",
            "--target",
            &object,
            "--format",
            "json",
        ])
        .run()
        .expect(0)
        .json();
    let events = json["events"].as_array().unwrap();
    let seen: Vec<(String, String, String, i64)> = events
        .iter()
        .map(|e| {
            (
                e["source"].as_str().unwrap().to_owned(),
                e["kind"].as_str().unwrap().to_owned(),
                e["owner"].as_str().unwrap_or("-").to_owned(),
                e["token"].as_i64().unwrap(),
            )
        })
        .collect();
    let row = |source: &str, kind: &str, owner: &str, token: i64| {
        (source.to_owned(), kind.to_owned(), owner.to_owned(), token)
    };
    assert_eq!(
        seen,
        [
            row("store", "acquired", "A", 1),
            row("store", "released", "A", 1),
            row("store", "acquired", "B", 2),
            // The older version keeps its id and token, not its owner.
            row("target", "write_accepted", "-", 2),
            row("target", "write_accepted", "B", 2),
            row("store", "write_rejected", "A", 1),
        ],
        "{json:#}"
    );
    assert!(events[3]["detail"].as_str().unwrap().contains("id w1"));
    assert!(events[4]["detail"].as_str().unwrap().contains("id w2"));
    assert_eq!(events[4]["target"], object.as_str());
    let refused = events[5]["detail"].as_str().unwrap();
    assert!(
        refused.contains(&object) && refused.contains("accepted token 2"),
        "{refused}"
    );
    assert_eq!(json["integrity_ok"], true, "{json:#}");
}

#[test]
fn file_store_object_refusals_leave_a_trace() {
    object_refusals_leave_a_trace(&Store::file());
}

#[test]
fn postgres_object_refusals_leave_a_trace() {
    object_refusals_leave_a_trace(&Store::postgres());
}

/// A version-4 schema (no `attempts`, no `event_totals`) is never used as it stands (issue
/// 33, 4): `fence log` and `fence metrics` read it as it is, and the first acquire migrates it
/// to the current version before it answers (busy, exit 3, no warning), so its refused
/// attempt is recorded.
#[test]
fn postgres_a_version_4_schema_is_migrated_by_the_first_acquire() {
    let store = Store::postgres();
    let s = store.schema.clone().unwrap();
    store
        .fence()
        .args(["acquire", "job", "--owner", "A", "--ttl", "1m", "-q"])
        .run()
        .expect(0);
    pg_exec(
        &store.url,
        &format!(
            "DROP TABLE {s}.attempts; DROP TABLE {s}.event_totals; \
             UPDATE {s}.meta SET value = '4' WHERE key = 'schema_version'"
        ),
    );
    let version = |store: &Store| -> String {
        store.pg_rows(
            &format!("SELECT value FROM {s}.meta WHERE key = 'schema_version' AND $1 = $1"),
            "",
        )[0]
        .get(0)
    };
    let log = store
        .fence()
        .args(["log", "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(kinds(log["events"].as_array().unwrap()).len(), 1, "{log:#}");
    store.fence().args(["metrics"]).run().expect(0);
    assert_eq!(version(&store), "4", "a read migrated the schema");
    let busy = store.fence().args(["acquire", "job", "--owner", "B"]).run();
    assert_eq!(busy.code, 3, "{busy:?}");
    assert!(!busy.stderr.contains("warning"), "{busy:?}");
    assert_eq!(
        version(&store),
        fence::coordinator::COORDINATOR_SCHEMA.version.to_string()
    );
    assert_eq!(
        stored_attempts(&store),
        [("B".to_owned(), "busy".to_owned(), 1)]
    );
}

/// An event of a kind this fence does not know (written by another version of fence) is
/// read, not an error: `log` and `inspect` show it as stored, `--kind` matches it with no
/// known kind, and `metrics` counts it in no metric.
fn unknown_kinds_are_shown_as_stored(store: &Store, insert: impl Fn(&Store)) {
    let lease = store
        .fence()
        .acquire("job", &["--owner", "A", "--ttl", "1m"]);
    store.fence().release(&lease);
    insert(store);
    let kinds_of = |events: &Value| -> Vec<(String, String)> {
        events
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let owner = e["owner"].as_str().unwrap_or("-").to_owned();
                (e["kind"].as_str().unwrap().to_owned(), owner)
            })
            .collect()
    };
    let teleported = ("lease_teleported".to_owned(), "Z".to_owned());
    let log = store
        .fence()
        .args(["log", "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert!(kinds_of(&log["events"]).contains(&teleported), "{log:#}");
    let acquired = store
        .fence()
        .args([
            "log", "--kind", "acquired", "--kind", "released", "--format", "json",
        ])
        .run()
        .expect(0)
        .json();
    assert_eq!(
        kinds_of(&acquired["events"]),
        [
            ("acquired".into(), "A".into()),
            ("released".into(), "A".into())
        ]
    );
    let inspect = store
        .fence()
        .args(["inspect", "job", "--format", "json"])
        .run()
        .expect(0)
        .json();
    let events = &inspect["resources"][0]["events"];
    assert!(kinds_of(events).contains(&teleported), "{inspect:#}");
    let metrics = store
        .fence()
        .args(["metrics", "--format", "json"])
        .run()
        .expect(0)
        .json();
    let acquisitions: Vec<f64> = metrics["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["name"] == "fence_lease_acquisitions_total")
        .map(|m| m["value"].as_f64().unwrap())
        .collect();
    assert_eq!(acquisitions, [1.0], "{metrics:#}");
}

#[test]
fn file_store_unknown_kinds_are_shown_as_stored() {
    unknown_kinds_are_shown_as_stored(&Store::file(), |store| {
        let log = store.dir().join("events/job.jsonl");
        let mut text = std::fs::read_to_string(&log).unwrap();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        text.push_str(&format!(
            r#"{{"at_ms":{now_ms},"kind":"lease_teleported","owner":"Z","token":1}}"#
        ));
        text.push('\n');
        std::fs::write(&log, text).unwrap();
    });
}

#[test]
fn postgres_unknown_kinds_are_shown_as_stored() {
    unknown_kinds_are_shown_as_stored(&Store::postgres(), |store| {
        let s = store.schema.clone().unwrap();
        pg_exec(
            &store.url,
            &format!(
                "INSERT INTO {s}.events (resource, kind, owner, token) VALUES ('job', 'lease_teleported', 'Z', 1)"
            ),
        );
    });
}

/// A resource whose name holds `*` or `?` can be named alone: `\*` and `\?` stand for the
/// characters (a reviewer found `fence log 'a*'` could only ever mean every `a…`), in `fence
/// log`'s names and `--resource`, in `--owner` and in `fence metrics --resource`, on each
/// kind of store (PostgreSQL filters with LIKE, the others match in fence).
fn a_name_holding_a_wildcard_can_be_named_alone(store: &Store) {
    for (resource, owner) in [("job*", "ops?"), ("job-1", "ops1"), (r"job\x", r"ops\")] {
        store
            .fence()
            .args(["acquire", resource, "--owner", owner, "-q"])
            .run()
            .expect(0);
    }
    let logged = |args: &[&str]| -> Vec<String> {
        let out = store
            .fence()
            .args(["log", "--format", "json"])
            .args(args)
            .run()
            .expect(0);
        let mut names: Vec<String> = out.json()["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["resource"].as_str().unwrap().to_owned())
            .collect();
        names.dedup();
        names
    };
    assert_eq!(logged(&[r"job\*"]), ["job*"]);
    assert_eq!(logged(&["--resource", r"job\*"]), ["job*"]);
    assert_eq!(logged(&["--owner", r"ops\?"]), ["job*"]);
    // A backslash before anything else is itself; `\\` is one backslash.
    assert_eq!(logged(&[r"job\x"]), [r"job\x"]);
    assert_eq!(logged(&[r"job\\x"]), [r"job\x"]);
    assert_eq!(logged(&["--owner", r"ops\\"]), [r"job\x"]);
    let mut all = logged(&["job*"]);
    all.sort();
    assert_eq!(all, ["job*", "job-1", r"job\x"]);
    let metrics = store
        .fence()
        .args(["metrics", "--resource", r"job\*"])
        .run()
        .expect(0);
    assert!(
        metrics.stdout.contains(r#"resource="job*""#) && !metrics.stdout.contains("job-1"),
        "{metrics:?}"
    );
}

#[test]
fn file_store_a_name_holding_a_wildcard_can_be_named_alone() {
    a_name_holding_a_wildcard_can_be_named_alone(&Store::file());
}

#[test]
fn postgres_a_name_holding_a_wildcard_can_be_named_alone() {
    a_name_holding_a_wildcard_can_be_named_alone(&Store::postgres());
}

#[test]
fn s3_a_name_holding_a_wildcard_can_be_named_alone() {
    a_name_holding_a_wildcard_can_be_named_alone(&Store::new(common::Backend::S3));
}
