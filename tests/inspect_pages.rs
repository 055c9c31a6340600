//! `fence inspect --state`, `--limit` and `--after` (issue 25, item 3): the filters narrow the
//! answer correctly and the pages cover every resource exactly once, on every coordinator.

mod common;

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
        let ttl = if i == 15 { "100ms" } else { "1m" };
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
    let start = std::time::Instant::now();
    while inspect(store, &["--state", "expired"])["resources"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "r15 never expired"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
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
