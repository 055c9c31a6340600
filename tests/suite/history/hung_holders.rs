//! Hung holders are visible (issue 35, item 4): `fence metrics` counts every acquisition refused
//! as busy, by resource (`fence_lease_busy_refusals_total`, the counter to alert on when a
//! `--busy-exit-code 0 -q` cron job silently never runs), and the counter never goes down when
//! `fence prune` deletes the attempts it counted; `fence inspect` shows how long the live lease
//! has been held; `fence doctor --held-over D` warns on each lease held longer than D.

use crate::common;

use std::time::Duration;

use common::{wait_for, Backend, Store};
use serde_json::Value;

fn busy_refusals(store: &Store, resource: &str) -> Option<f64> {
    let text = store.fence().args(["metrics"]).run().expect(0).stdout;
    common::prometheus::samples(&text)
        .into_iter()
        .find(|(name, labels, _)| {
            name == "fence_lease_busy_refusals_total"
                && labels == &[("resource".to_owned(), resource.to_owned())]
        })
        .map(|(_, _, value)| value)
}

fn busy_refusals_are_counted_by_resource(store: &Store) {
    common::acquire(store, "job", "holder");
    common::acquire(store, "other", "holder");
    // Three refused cron runs (the recommended form: exit 0, no output) and one acquire.
    for _ in 0..3 {
        let out = store
            .fence()
            .args(["run", "job", "--busy-exit-code", "0", "-q", "--", "true"])
            .run()
            .expect(0);
        assert!(out.stderr.is_empty(), "{out:?}");
    }
    store
        .fence()
        .args(["acquire", "job", "--owner", "someone"])
        .run()
        .expect(3);
    assert_eq!(busy_refusals(store, "job"), Some(4.0));
    assert_eq!(busy_refusals(store, "other"), Some(0.0));
}

per_backend!(busy_refusals_are_counted_by_resource);

/// `fence prune` deletes the refused attempts it counted; the counter stays.
#[test]
fn busy_refusals_do_not_go_down_when_pruned() {
    let store = Store::new(Backend::Postgres);
    common::acquire(&store, "job", "holder");
    for _ in 0..2 {
        store
            .fence()
            .args(["acquire", "job", "--owner", "someone"])
            .run()
            .expect(3);
    }
    assert_eq!(busy_refusals(&store, "job"), Some(2.0));
    store
        .fence()
        .args(["prune", "--older-than", "0s"])
        .run()
        .expect(0);
    let kept: Vec<tokio_postgres::Row> = store.pg_rows(
        &format!(
            "SELECT count(*) FROM {}.attempts WHERE resource = $1",
            store.schema.as_ref().unwrap()
        ),
        "job",
    );
    assert_eq!(kept[0].get::<_, i64>(0), 0, "prune deleted the attempts");
    assert_eq!(busy_refusals(&store, "job"), Some(2.0));
    store
        .fence()
        .args(["acquire", "job", "--owner", "someone"])
        .run()
        .expect(3);
    assert_eq!(busy_refusals(&store, "job"), Some(3.0));
}

/// Object stores do not record refused attempts: no counter that would always read 0.
#[test]
fn object_stores_have_no_busy_counter() {
    let store = Store::new(Backend::S3);
    common::acquire(&store, "job", "holder");
    store
        .fence()
        .args(["acquire", "job", "--owner", "someone"])
        .run()
        .expect(3);
    let text = store.fence().args(["metrics"]).run().expect(0).stdout;
    assert!(!text.contains("fence_lease_busy_refusals_total"), "{text}");
}

fn view(store: &Store) -> Value {
    store
        .fence()
        .args(["inspect", "job", "--format", "json"])
        .run()
        .expect(0)
        .json()["resources"][0]
        .clone()
}

fn doctor_warns_on_a_lease_held_too_long(store: &Store) {
    common::acquire(store, "job", "stuck-job");
    // Held for more than a second by the store's clock (S3's counts whole seconds);
    // renewals do not restart it.
    wait_for(
        "the lease to be held a second",
        Duration::from_secs(30),
        || view(store)["held_for_ms"].as_i64().unwrap() > 1000,
    );
    store
        .fence()
        .args(["renew", "job", "--owner", "stuck-job", "--token", "1"])
        .run()
        .expect(0);
    let held = view(store)["held_for_ms"].as_i64().unwrap();
    assert!(held > 1000, "a renewal does not restart it: {held}");
    let human = store.fence().args(["inspect", "job"]).run().expect(0);
    assert!(human.stdout.contains("(held "), "{human:?}");
    let out = store
        .fence()
        .args(["doctor", "--held-over", "1s", "--format", "json"])
        .run()
        .expect(0);
    let json = out.json();
    let warned: Vec<&Value> = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "leases.held_over")
        .collect();
    assert_eq!(warned.len(), 1, "{json}");
    assert_eq!(warned[0]["severity"], "warn", "{json}");
    let message = warned[0]["message"].as_str().unwrap();
    assert!(
        message.contains("`job`") && message.contains("stuck-job") && message.contains("token 1"),
        "{message}"
    );
    assert!(
        warned[0]["fix"].as_str().unwrap().contains("log job"),
        "{json}"
    );
    // Under the threshold: ok, and the count of held leases.
    let json = store
        .fence()
        .args(["doctor", "--held-over", "1h", "--format", "json"])
        .run()
        .expect(0)
        .json();
    let ok: Vec<&Value> = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "leases.held_over")
        .collect();
    assert_eq!(ok.len(), 1, "{json}");
    assert_eq!(ok[0]["severity"], "ok", "{json}");
    assert!(
        ok[0]["message"].as_str().unwrap().contains("1 held now"),
        "{json}"
    );
}

mod doctor {
    use super::*;
    per_coordinator!(doctor_warns_on_a_lease_held_too_long);
}

#[test]
fn held_over_is_refused_when_it_is_not_a_duration() {
    let store = Store::new(Backend::File);
    for bad in ["0s", "soon"] {
        let out = store
            .fence()
            .args(["doctor", "--held-over", bad])
            .run()
            .expect(2);
        assert!(out.stderr.contains("--held-over"), "{out:?}");
    }
}
