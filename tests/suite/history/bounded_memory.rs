//! Issue 37: what `fence log`, `fence inspect --history N` and `fence metrics` hold in memory
//! follows a page, not the history. Each scenario seeds a history of `SMALL` events and one of
//! ten times as many (written straight into the store's own format: fast), runs the same
//! command on both, and checks that the larger history's peak RSS (the child's own, from
//! `wait4`) is less than twice the smaller one's, and that nothing was lost on the way.
//! Memory, not time: nothing here is timed.

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;

use crate::common::{pg_exec, pg_query, Store};

/// Events of the smaller history; the larger has ten times as many. Before issue 37, 100,000
/// events cost fence about 7 times the memory of 10,000 (a `Vec` of every event, and the JSON
/// of all of them); a page-bounded reader costs the same for both.
const SMALL: usize = 10_000;

/// What a run of `fence` printed and how much memory it took at its peak.
struct Measured {
    /// Lines on stdout.
    lines: usize,
    /// JSON objects whose first key is `at` (events, in `inspect`'s answer).
    events: usize,
    /// The end of the last line (a JSON answer is one line).
    end: String,
    /// Peak resident set size, KiB (`ru_maxrss`).
    peak_kib: i64,
}

/// Runs `cmd` to its end, reading its stdout as it comes (so that a streaming fence is not
/// held up by a full pipe), and takes its rusage with `wait4`, which also reaps it. A child's
/// `ru_maxrss` starts from its parent's resident set when it was spawned (Linux keeps the
/// larger of the two across exec), so the test holds nothing large: it counts what fence
/// prints instead of keeping it.
#[allow(clippy::zombie_processes)]
fn measure(mut cmd: std::process::Command) -> Measured {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fence starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    let errors = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let (mut lines, mut events) = (0, 0);
    let mut end = String::new();
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    while reader.read_until(b'\n', &mut line).expect("stdout") > 0 {
        lines += 1;
        events += line.windows(6).filter(|w| w == b"{\"at\":").count();
        let tail = line.len().saturating_sub(200);
        end = String::from_utf8_lossy(&line[tail..]).into_owned();
        line.clear();
    }
    let pid = i32::try_from(child.id()).expect("a pid");
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill in; `pid` is our child,
    // not yet waited for (std's `Child` is never waited for here).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pointers are to live locals of the right types.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "wait4: {}", std::io::Error::last_os_error());
    let stderr = errors.join().unwrap_or_default();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "fence failed (status {status}): {stderr}"
    );
    Measured {
        lines,
        events,
        end,
        peak_kib: usage.ru_maxrss,
    }
}

/// The larger run's peak is less than twice the smaller's.
#[track_caller]
fn assert_bounded(what: &str, small: &Measured, large: &Measured) {
    eprintln!(
        "{what}: {SMALL} events {} KiB, {} events {} KiB",
        small.peak_kib,
        10 * SMALL,
        large.peak_kib
    );
    assert!(
        large.peak_kib < 2 * small.peak_kib,
        "{what}: the peak RSS grew with the history: {} KiB for {SMALL} events, {} KiB for {}",
        small.peak_kib,
        large.peak_kib,
        10 * SMALL
    );
}

/// The number of events in `inspect`'s JSON answer, a successful one.
#[track_caller]
fn inspected_events(answer: &Measured) -> usize {
    assert_eq!(answer.lines, 1, "one JSON answer");
    assert!(answer.end.contains("\"ok\":true"), "{}", answer.end);
    answer.events
}

/// A directory store whose resource `r` has a log of `n` events (as fence writes them:
/// one JSON object per line, oldest first), alternately acquired and released.
fn file_store(n: usize) -> Store {
    let store = Store::file();
    let lease = store.fence().acquire("r", &["--owner", "seed"]);
    store
        .fence()
        .args([
            "release",
            "r",
            "--owner",
            "seed",
            "--token",
            &lease.token.to_string(),
        ])
        .run()
        .expect(0);
    let path = store.dir().join("events/r.jsonl");
    let mut log = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    for t in 1..=n {
        let kind = if t % 2 == 1 { "acquired" } else { "released" };
        writeln!(
            log,
            r#"{{"at_ms":{},"kind":"{kind}","owner":"cron/{t}","token":{t}}}"#,
            1_700_000_000_000_i64 + t as i64
        )
        .unwrap();
    }
    log.flush().unwrap();
    store
}

/// A PostgreSQL store whose resource `r` has `n` events before the two its acquire and
/// release wrote: renewals a day ago, oldest first, a second apart, each with a TTL of two
/// seconds (so each lease is renewed before it runs out, but the last).
fn postgres_store(n: usize) -> Store {
    let store = Store::postgres();
    let lease = store.fence().acquire("r", &["--owner", "seed"]);
    store
        .fence()
        .args([
            "release",
            "r",
            "--owner",
            "seed",
            "--token",
            &lease.token.to_string(),
        ])
        .run()
        .expect(0);
    let schema = store.schema.clone().unwrap();
    pg_exec(
        &store.url,
        &format!(
            "INSERT INTO {schema}.events (resource, at, kind, owner, token, ttl_ms, expires_at)
             SELECT 'r', now() - ({n} - i) * interval '1 second' - interval '1 day', 'renewed',
                    'holder', i, 2000,
                    now() - ({n} - i) * interval '1 second' - interval '1 day' + interval '2 seconds'
             FROM generate_series(1, {n}) AS i"
        ),
    );
    store
}

fn log_ndjson(store: &Store) -> Measured {
    let mut fence = store.fence();
    fence
        .cmd
        .args(["log", "r", "--limit", "100000000", "--format", "ndjson"]);
    measure(fence.cmd)
}

fn inspect_json(store: &Store) -> Measured {
    let mut fence = store.fence();
    fence
        .cmd
        .args(["inspect", "r", "--history", "100000000", "--format", "json"]);
    measure(fence.cmd)
}

#[test]
fn file_store_log_memory_follows_the_page_not_the_history() {
    let (small, large) = (file_store(SMALL), file_store(10 * SMALL));
    let (log_small, log_large) = (log_ndjson(&small), log_ndjson(&large));
    assert_eq!(log_small.lines, SMALL);
    assert_eq!(log_large.lines, 10 * SMALL);
    assert_bounded(
        "directory store, log --format ndjson",
        &log_small,
        &log_large,
    );
}

#[test]
fn file_store_inspect_and_metrics_memory_follows_the_page_not_the_history() {
    let (small, large) = (file_store(SMALL), file_store(10 * SMALL));
    let (inspect_small, inspect_large) = (inspect_json(&small), inspect_json(&large));
    assert_eq!(inspected_events(&inspect_small), SMALL);
    assert_eq!(inspected_events(&inspect_large), 10 * SMALL);
    assert_bounded(
        "directory store, inspect --history --format json",
        &inspect_small,
        &inspect_large,
    );
    let metrics = |store: &Store| {
        let mut fence = store.fence();
        fence.cmd.args(["metrics"]);
        measure(fence.cmd)
    };
    let (metrics_small, metrics_large) = (metrics(&small), metrics(&large));
    assert_bounded("directory store, metrics", &metrics_small, &metrics_large);
}

/// The events of `r` in the store.
fn pg_count(store: &Store) -> usize {
    let schema = store.schema.clone().unwrap();
    let rows = pg_query(
        &store.url,
        &format!("SELECT count(*) FROM {schema}.events WHERE resource = 'r'"),
    );
    usize::try_from(rows[0].get::<_, i64>(0)).unwrap()
}

#[test]
fn postgres_log_memory_follows_the_page_not_the_history() {
    let (small, large) = (postgres_store(SMALL), postgres_store(10 * SMALL));
    let (log_small, log_large) = (log_ndjson(&small), log_ndjson(&large));
    // Every event, and one expiry: the last renewal's lease ran out a day ago.
    assert_eq!(log_small.lines, pg_count(&small) + 1);
    assert_eq!(log_large.lines, pg_count(&large) + 1);
    assert_bounded("PostgreSQL, log --format ndjson", &log_small, &log_large);
}

#[test]
fn postgres_inspect_memory_follows_the_page_not_the_history() {
    let (small, large) = (postgres_store(SMALL), postgres_store(10 * SMALL));
    let (inspect_small, inspect_large) = (inspect_json(&small), inspect_json(&large));
    assert_eq!(inspected_events(&inspect_small), pg_count(&small));
    assert_eq!(inspected_events(&inspect_large), pg_count(&large));
    assert_bounded(
        "PostgreSQL, inspect --history --format json",
        &inspect_small,
        &inspect_large,
    );
}

/// A timeline longer than fence prints as one report (10,000 entries) is written as it is
/// read; its expiries, found only at the resource's next event, still come at their instant
/// among the other resource's events, and every format says the same.
#[test]
fn a_long_timeline_is_written_in_time_order_in_every_format() {
    let store = Store::file();
    // `a`: a grant every 5 s whose lease runs 1 s, so each expiry is found 4 s late, at the
    // next grant; `b`: a run event every 0.7 s, some of them in those 4 s.
    let (grants, runs) = (2_000_i64, 8_000_i64);
    for (resource, n) in [("a", grants), ("b", runs)] {
        store.fence().acquire(resource, &["--owner", "seed"]);
        let path = store.dir().join(format!("events/{resource}.jsonl"));
        let mut log = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        for t in 1..=n {
            let line = if resource == "a" {
                let at = 1_700_000_000_000_i64 + 5_000 * t;
                format!(
                    r#"{{"at_ms":{at},"kind":"acquired","owner":"o{t}","token":{t},"ttl_ms":1000,"expires_at_ms":{}}}"#,
                    at + 1_000
                )
            } else {
                let at = 1_700_000_000_000_i64 + 700 * t;
                format!(r#"{{"at_ms":{at},"kind":"run_started","owner":"r{t}","token":1}}"#)
            };
            writeln!(log, "{line}").unwrap();
        }
        log.flush().unwrap();
    }
    let args = ["log", "--limit", "100000", "--format"];
    let ndjson = store.fence().args(args).args(["ndjson"]).run().expect(0);
    let lines: Vec<serde_json::Value> = ndjson
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("an ndjson line"))
        .collect();
    // Each grant and its expiry, each run event.
    let entries = usize::try_from(2 * grants + runs).unwrap();
    assert_eq!(lines.len(), entries);
    let at = |v: &serde_json::Value| v["at"].as_str().unwrap().to_owned();
    assert!(
        lines.windows(2).all(|w| at(&w[0]) <= at(&w[1])),
        "not in time order"
    );
    // b's run events up to 4.9 s, a's first grant (5 s), b's at 5.6 s, then a's expiry (6 s).
    assert_eq!(lines[9]["kind"], "expired", "{:#}", lines[9]);
    assert_eq!(lines[9]["resource"], "a");
    let json = store
        .fence()
        .args(args)
        .args(["json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(json["ok"], true);
    assert_eq!(json["truncated"], false);
    assert_eq!(json["integrity_ok"], true);
    assert_eq!(json["events"].as_array().unwrap(), &lines);
    let human = store.fence().args(args).args(["human"]).run().expect(0);
    let text = &human.stdout;
    assert!(text.starts_with("store `"), "{text:.300}");
    // The narrow layout: each grant's lease indented below it; an expiry's detail too.
    assert_eq!(
        text.lines().filter(|l| !l.starts_with("    ")).count(),
        1 + entries
    );
}
