//! `fence metrics` and `fence run --metrics-file` (issue 19) read back through a real
//! Prometheus text-format parser (the Python client's, from the metrics venv `tests/run`
//! prepares), and their values checked against the history `fence log` shows.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{pg_exec, wait_for, Store};

/// Samples by name and sorted labels, as prometheus_client's parser reads `text`.
fn parse(text: &str) -> BTreeMap<(String, Vec<(String, String)>), f64> {
    common::prometheus::samples(text)
        .into_iter()
        .map(|(name, labels, value)| ((name, labels), value))
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut labels: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.sort();
    labels
}

/// `fence metrics` after an incident — A's lease expires, B takes over and writes, A's renew
/// and two writes are refused, B releases — counts what the timeline shows.
fn metrics_match_the_history(store: Store) {
    let target = Store::postgres();
    let schema = store
        .schema
        .clone()
        .or_else(|| target.schema.clone())
        .unwrap();
    pg_exec(
        &target.url,
        &format!("CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (n int); INSERT INTO {schema}.t VALUES (1)"),
    );
    let fence = || {
        let fence = store.fence();
        match store.schema {
            Some(_) => fence,
            None => fence.args(["--schema", &schema]),
        }
    };
    let write = |owner: &str, token: &str| {
        fence()
            .args(["write", "job", "--owner", owner, "--token", token])
            .args(["--target", &target.url, "--sql"])
            .args([format!("UPDATE {schema}.t SET n = n + 1")])
            .run()
    };
    fence()
        .args(["acquire", "job", "--owner", "A", "--ttl", "1s", "-q"])
        .run()
        .expect(0);
    wait_for("A's lease to expire", Duration::from_secs(10), || {
        fence()
            .args(["inspect", "job", "--format", "json"])
            .run()
            .expect(0)
            .json()["resources"][0]["state"]
            == "expired"
    });
    fence()
        .args(["acquire", "job", "--owner", "B", "--ttl", "30s", "-q"])
        .run()
        .expect(0);
    write("B", "2").expect(0);
    fence()
        .args(["renew", "job", "--owner", "A", "--token", "1"])
        .run()
        .expect(4);
    write("A", "1").expect(4);
    write("A", "1").expect(4);
    fence()
        .args(["release", "job", "--owner", "B", "--token", "2"])
        .run()
        .expect(0);
    fence()
        .args(["acquire", "other", "--owner", "C", "--ttl", "1m", "-q"])
        .run()
        .expect(0);

    let text = fence()
        .args(["metrics", "--target", &target.url])
        .run()
        .expect(0)
        .stdout;
    let samples = parse(&text);
    let value = |name: &str, pairs: &[(&str, &str)]| {
        *samples
            .get(&(name.to_owned(), labels(pairs)))
            .unwrap_or_else(|| panic!("no {name} {pairs:?} in:\n{text}"))
    };
    let history = fence()
        .args(["log", "--target", &target.url, "--format", "json"])
        .run()
        .expect(0)
        .json();
    let count = |resource: &str, kinds: &[&str]| {
        history["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["resource"] == resource && kinds.contains(&e["kind"].as_str().unwrap()))
            .count() as f64
    };
    let job = [("resource", "job")];
    let t = target.url.replace(":fence-test-secret@", "@");
    let at_target = [("resource", "job"), ("target", t.as_str())];
    assert_eq!(
        value("fence_lease_acquisitions_total", &job),
        count("job", &["acquired", "taken_over"])
    );
    assert_eq!(value("fence_lease_acquisitions_total", &job), 2.0);
    assert_eq!(
        value("fence_lease_takeovers_total", &job),
        count("job", &["taken_over"])
    );
    assert_eq!(value("fence_lease_takeovers_total", &job), 1.0);
    assert_eq!(value("fence_lease_releases_total", &job), 1.0);
    assert_eq!(
        value(
            "fence_lease_rejections_total",
            &[("resource", "job"), ("op", "renew")]
        ),
        count("job", &["renew_rejected"])
    );
    assert_eq!(
        value("fence_fenced_writes_total", &at_target),
        count("job", &["write_accepted"])
    );
    assert_eq!(value("fence_fenced_writes_total", &at_target), 1.0);
    assert_eq!(
        value("fence_stale_writes_rejected_total", &at_target),
        count("job", &["write_rejected"])
    );
    assert_eq!(value("fence_stale_writes_rejected_total", &at_target), 2.0);
    // And against what the target holds: its durable write log, read without fence.
    let durable = |kind: &str| -> f64 {
        let rows = target.pg_rows(
            &format!(
                "SELECT count(*) FROM {schema}.write_events WHERE resource = 'job' AND kind = $1"
            ),
            kind,
        );
        rows[0].get::<_, i64>(0) as f64
    };
    assert_eq!(
        value("fence_fenced_writes_total", &at_target),
        durable("write_accepted")
    );
    assert_eq!(
        value("fence_stale_writes_rejected_total", &at_target),
        durable("write_rejected")
    );
    assert_eq!(value("fence_lease_held", &job), 0.0);
    assert_eq!(value("fence_lease_token", &job), 2.0);
    assert_eq!(value("fence_lease_held", &[("resource", "other")]), 1.0);
    assert_eq!(
        value(
            "fence_lease_holder_info",
            &[("resource", "other"), ("owner", "C")]
        ),
        1.0
    );
    assert!(
        value(
            "fence_lease_expiry_timestamp_seconds",
            &[("resource", "other")]
        ) > 1.7e9
    );
    // How long the holder has held it: when it was granted, by the store's clock, at or
    // before its expiry; and only for a live lease.
    let granted = value(
        "fence_lease_acquired_timestamp_seconds",
        &[("resource", "other")],
    );
    assert!(
        granted > 1.7e9
            && granted
                <= value(
                    "fence_lease_expiry_timestamp_seconds",
                    &[("resource", "other")]
                ),
        "{granted}"
    );
    assert!(
        !samples.keys().any(
            |(name, labels)| name == "fence_lease_acquired_timestamp_seconds"
                && labels.contains(&("resource".into(), "job".into()))
        ),
        "no holder of `job`, no grant time"
    );

    // --resource narrows it.
    let narrowed = parse(
        &fence()
            .args(["metrics", "--resource", "oth*"])
            .run()
            .expect(0)
            .stdout,
    );
    assert!(narrowed
        .keys()
        .all(|(_, l)| l.contains(&("resource".into(), "other".into()))));
    assert!(!narrowed.is_empty());
}

#[test]
fn file_store_metrics_match_the_history() {
    metrics_match_the_history(Store::file());
}

#[test]
fn postgres_metrics_match_the_history() {
    metrics_match_the_history(Store::postgres());
}

/// `fence run --metrics-file`: a run that held the lease, and one that found it busy, each
/// leave a parseable file whose token, status and reason match what happened; no temporary
/// file is left beside it.
fn run_metrics_file(store: Store) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fence.prom");
    let path_arg = path.to_str().unwrap();
    store
        .fence()
        .args([
            "run",
            "job",
            "--metrics-file",
            path_arg,
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .run()
        .expect(3);
    let samples = parse(&std::fs::read_to_string(&path).unwrap());
    let job = labels(&[("resource", "job")]);
    let get = |samples: &BTreeMap<_, f64>, name: &str| {
        samples.get(&(name.to_owned(), job.clone())).copied()
    };
    let log = store
        .fence()
        .args([
            "log",
            "--resource",
            "job",
            "--kind",
            "acquired",
            "--format",
            "json",
        ])
        .run()
        .expect(0)
        .json();
    let granted = log["events"][0]["token"].as_f64().unwrap();
    assert_eq!(get(&samples, "fence_run_token"), Some(granted));
    assert_eq!(get(&samples, "fence_run_exit_code"), Some(3.0));
    assert_eq!(
        samples.get(&(
            "fence_run_outcome".to_owned(),
            labels(&[("resource", "job"), ("reason", "command_failed")])
        )),
        Some(&1.0)
    );
    let start = get(&samples, "fence_run_start_timestamp_seconds").unwrap();
    let end = get(&samples, "fence_run_end_timestamp_seconds").unwrap();
    let duration = get(&samples, "fence_run_duration_seconds").unwrap();
    assert!((end - start - duration).abs() < 0.01 && duration > 0.0);
    assert!(get(&samples, "fence_run_waited_seconds").unwrap() <= duration);

    // Busy: no token, exit 3 and reason busy, the file replaced whole.
    store
        .fence()
        .args(["acquire", "job", "--owner", "other", "--ttl", "1m", "-q"])
        .run()
        .expect(0);
    store
        .fence()
        .args(["run", "job", "--metrics-file", path_arg, "-q", "--", "true"])
        .run()
        .expect(3);
    let samples = parse(&std::fs::read_to_string(&path).unwrap());
    assert_eq!(get(&samples, "fence_run_token"), None);
    assert_eq!(get(&samples, "fence_run_exit_code"), Some(3.0));
    assert_eq!(
        samples.get(&(
            "fence_run_outcome".to_owned(),
            labels(&[("resource", "job"), ("reason", "busy")])
        )),
        Some(&1.0)
    );
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["fence.prom"]);
}

#[test]
fn file_store_run_metrics_file() {
    run_metrics_file(Store::file());
}

#[test]
fn postgres_run_metrics_file() {
    run_metrics_file(Store::postgres());
}

/// The alerting rules of docs/incidents.md (the block marked `<!-- alerts -->`) name only
/// metrics `fence metrics` prints: a renamed family must not leave an alert that never fires.
#[test]
fn the_documented_alerts_name_metrics_fence_prints() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/incidents.md")).unwrap();
    let rules = doc
        .split("<!-- alerts -->")
        .nth(1)
        .and_then(|rest| rest.split("```yaml").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("docs/incidents.md has a yaml block marked <!-- alerts -->");
    let named: std::collections::BTreeSet<&str> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("fence_"))
        .collect();
    assert!(named.len() >= 3, "{named:?}");

    // A store's families are printed once a lease exists; a target's
    // (`fence_stale_writes_rejected_total`, with `--target`) are in the printer's source.
    let store = Store::file();
    store
        .fence()
        .args(["acquire", "job", "--owner", "A", "--ttl", "1m"])
        .run()
        .expect(0);
    let printed = parse(&store.fence().args(["metrics"]).run().expect(0).stdout);
    let source = std::fs::read_to_string(root.join("src/cmd/metrics.rs")).unwrap();
    for name in named {
        assert!(
            printed.keys().any(|(family, _)| family == name)
                || (name.starts_with("fence_stale_writes")
                    && source.contains(&format!("\"{name}\""))),
            "the alert names `{name}`, which fence metrics does not print"
        );
    }
}
