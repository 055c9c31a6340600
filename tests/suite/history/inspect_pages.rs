//! `fence inspect --state`, `--limit` and `--after` (issue 25, item 3): the filters narrow the
//! answer correctly and the pages cover every resource exactly once, on every coordinator.

use crate::common;

use common::Store;
use serde_json::Value;

fn inspect(store: &Store, args: &[&str]) -> Value {
    store
        .fence()
        .args(["inspect", "--format", "json"])
        .args(args)
        .run()
        .expect(0)
        .json()
}

fn names(json: &Value) -> Vec<String> {
    json["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["resource"].as_str().unwrap().to_owned())
        .collect()
}

fn pages_and_states(store: &Store) {
    // r00..r09 held, r10..r14 released (free), r15 expired.
    for i in 0..16 {
        let name = format!("r{i:02}");
        // r15's lease only has to run out before the wait below ends: a second, so that a
        // grant a loaded machine answers in half a second is not already lost (100 ms was:
        // exit 5 "arrived late" on S3 beside other work, 2026-12-07).
        let ttl = if i == 15 { "1s" } else { "1m" };
        let out = store
            .fence()
            .args([
                "acquire", &name, "--owner", "o", "--ttl", ttl, "--format", "json",
            ])
            .run()
            .expect(0);
        if (10..15).contains(&i) {
            let token = out.json()["token"].as_i64().unwrap().to_string();
            store
                .fence()
                .args(["release", &name, "--owner", "o", "--token", &token])
                .run()
                .expect(0);
        }
    }
    common::wait_for("r15 to expire", std::time::Duration::from_secs(20), || {
        !inspect(store, &["--state", "expired"])["resources"]
            .as_array()
            .unwrap()
            .is_empty()
    });
    let held = names(&inspect(store, &["--state", "held"]));
    assert_eq!(
        held,
        (0..10).map(|i| format!("r{i:02}")).collect::<Vec<_>>()
    );
    let free = names(&inspect(store, &["--state", "free"]));
    assert_eq!(
        free,
        (10..15).map(|i| format!("r{i:02}")).collect::<Vec<_>>()
    );
    assert_eq!(names(&inspect(store, &["--state", "expired"])), ["r15"]);

    // Pages of 6: every resource once, in name order, each page naming the next cursor.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["--limit", "6"];
        if let Some(a) = &after {
            args.extend(["--after", a.as_str()]);
        }
        let page = inspect(store, &args);
        let got = names(&page);
        assert!(got.len() <= 6);
        seen.extend(got.clone());
        match page["next_after"].as_str() {
            Some(next) => {
                assert_eq!(Some(next), got.last().map(String::as_str));
                after = Some(next.to_owned());
            }
            None => break,
        }
    }
    assert_eq!(
        seen,
        (0..16).map(|i| format!("r{i:02}")).collect::<Vec<_>>()
    );
    // A filter that matches nothing says so.
    let out = store
        .fence()
        .args(["inspect", "--state", "held", "--after", "r99"])
        .run()
        .expect(0);
    assert!(out.stdout.contains("matches"), "{out:?}");
    assert!(out.stdout.starts_with("no resource in store"), "{out:?}");
}

per_coordinator!(pages_and_states);

/// Pages list the store: with named resources `--limit`/`--after` are usage errors (they
/// would skip or repeat names), as is `--limit 0`; a cursor may start with `-`.
#[test]
fn page_arguments_that_cannot_page_are_refused() {
    let store = Store::file();
    store.fence().args(["acquire", "--", "-x"]).run().expect(0);
    store.fence().args(["acquire", "a"]).run().expect(0);
    for args in [
        &["a", "--limit", "1"][..],
        &["a", "--after", "a"],
        &["--limit", "0"],
    ] {
        store.fence().args(["inspect"]).args(args).run().expect(2);
    }
    let page = inspect(&store, &["--after", "-x"]);
    assert_eq!(names(&page), ["a"]);
    let human = store
        .fence()
        .args(["inspect", "--limit", "1"])
        .run()
        .expect(0);
    assert!(human.stdout.contains("--after=-x"), "{human:?}");
}

/// An answer of more than a page (1,000 resources) is read and printed page by page: the
/// JSON is still one object with every resource once, in name order, as the table holds
/// them; `--limit` past a page names the next cursor; people get aligned lines with each
/// resource's events below it.
#[test]
fn large_answers_are_streamed_page_by_page() {
    let store = Store::postgres();
    fill(&store);
    let schema = store.schema.clone().unwrap();
    let held: Vec<String> = common::pg_query(
        &store.url,
        &format!(
            "SELECT resource FROM {schema}.leases WHERE expires_at > now() ORDER BY resource COLLATE \"C\""
        ),
    )
    .iter()
    .map(|row| row.get(0))
    .collect();
    assert_eq!(held.len(), 1250);

    let answer = inspect(&store, &["--state", "held", "--history", "1"]);
    assert_eq!(answer["ok"], true);
    assert_eq!(answer["op"], "inspect");
    assert!(answer.get("next_after").is_none(), "{answer}");
    assert_eq!(names(&answer), held);
    for r in answer["resources"].as_array().unwrap() {
        let token = r["token"].as_i64().unwrap();
        assert_eq!(r["state"], "held");
        assert_eq!(r["events"].as_array().unwrap().len(), 1, "{r}");
        assert_eq!(r["events"][0]["token"], token);
    }
    // The same fields as a page small enough for one report.
    let small = inspect(
        &store,
        &["--state", "held", "--history", "1", "--limit", "3"],
    );
    assert_eq!(answer["store"], small["store"]);
    for (streamed, whole) in answer["resources"].as_array().unwrap()[..3]
        .iter()
        .zip(small["resources"].as_array().unwrap())
    {
        let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(streamed), keys(whole));
        assert_eq!(streamed["resource"], whole["resource"]);
        assert_eq!(streamed["events"], whole["events"]);
    }

    // --limit past a page: the first 1,200 by name, and the cursor of the next page.
    let page = inspect(&store, &["--limit", "1200"]);
    let got = names(&page);
    assert_eq!(got.len(), 1200);
    assert_eq!(got.first().map(String::as_str), Some("res-00001"));
    assert_eq!(page["next_after"], "res-01200");
    let rest = inspect(&store, &["--limit", "1500", "--after", "res-01200"]);
    assert_eq!(names(&rest).len(), 1300);
    assert!(rest.get("next_after").is_none(), "{rest}");

    let human = store
        .fence()
        .args(["inspect", "--state", "held", "--history", "1"])
        .run()
        .expect(0);
    let lines: Vec<&str> = human.stdout.lines().collect();
    assert!(lines[0].starts_with("store `"), "{}", lines[0]);
    assert!(
        lines[1].starts_with("RESOURCE   STATE  OWNER   TOKEN"),
        "{}",
        lines[1]
    );
    let rows: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("res-"))
        .collect();
    assert_eq!(rows.len(), 1250);
    assert!(
        rows[0].starts_with("res-00002  held   holder  2 "),
        "{}",
        rows[0]
    );
    let events = lines.iter().filter(|l| l.starts_with("  event ")).count();
    assert_eq!(events, 1250);
    assert!(
        lines[3].starts_with("  event ") && lines[3].contains("  acquired  holder  2"),
        "{}",
        lines[3]
    );
}

/// A streamed answer whose second page cannot be read still ends one JSON object: the first
/// page's resources, then `"ok": false` with the error and its exit status (7: a read, nothing
/// changed); for people, the lines printed so far and the error on stderr.
#[test]
fn a_stream_cut_midway_ends_with_the_error() {
    let store = Store::postgres();
    fill(&store);
    // The second page's names are sent only once the first page is printed.
    let proxy = common::proxy::Proxy::start(
        common::pg_upstream(),
        common::proxy::Mode::CutWhenClientSends(b"res-01001".to_vec()),
    );
    let via = common::pg_url_via(proxy.addr());
    let home = tempfile::tempdir().unwrap();
    let fence = || {
        common::Fence::bare(home.path()).args([
            "--store",
            &via,
            "--schema",
            store.schema.as_deref().unwrap(),
            "inspect",
        ])
    };
    let out = fence().args(["--format", "json"]).run().expect(7);
    let json = out.json();
    assert_eq!(json["ok"], false, "{json}");
    assert_eq!(json["error"], "unavailable", "{json}");
    assert_eq!(json["exit_code"], 7, "{json}");
    assert_eq!(names(&json).len(), 1000);
    assert_eq!(names(&json).last().map(String::as_str), Some("res-01000"));
    assert_eq!(proxy.cuts(), 1);

    let out = fence().run().expect(7);
    assert_eq!(
        out.stdout.lines().filter(|l| l.starts_with("res-")).count(),
        1000
    );
    assert!(
        out.stderr.contains("fence: error: lost PostgreSQL"),
        "{out:?}"
    );
}

/// 2,500 resources, the even ones held; one event each.
fn fill(store: &Store) {
    store.fence().args(["init"]).run().expect(0);
    let schema = store.schema.clone().unwrap();
    common::pg_exec(
        &store.url,
        &format!(
            "INSERT INTO {schema}.leases (resource, owner, token, acquired_at, renewed_at, expires_at, ttl_ms, last_event)
             SELECT format('res-%s', lpad(i::text, 5, '0')), 'holder', i, now(), now(),
                    CASE WHEN i % 2 = 0 THEN now() + interval '1 hour' END, 3600000,
                    CASE WHEN i % 2 = 0 THEN 'acquired' ELSE 'released' END
             FROM generate_series(1, 2500) AS i;
             INSERT INTO {schema}.events (resource, kind, owner, token)
             SELECT format('res-%s', lpad(i::text, 5, '0')), 'acquired', 'holder', i
             FROM generate_series(1, 2500) AS i;"
        ),
    );
}
