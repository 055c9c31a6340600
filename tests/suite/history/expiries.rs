//! One `expired` per lease that ran out (issue 35, item 7: a second, null-owner `expired` was
//! seen after a takeover). A's lease runs out, B takes it over: `fence log` shows A's expiry
//! once, with A's owner and token, before B's takeover; with a window that starts after A's
//! grant, the expiry the takeover recorded is shown once, without an owner (the grant that set
//! it is outside the window; directory store and PostgreSQL, whose takeovers record it).

use crate::common;

use common::{Backend, Store};
use serde_json::Value;

fn expiries(store: &Store, args: &[&str]) -> Vec<Value> {
    let log = store
        .fence()
        .args(["log", "job", "--format", "json"])
        .args(args)
        .run()
        .expect(0)
        .json();
    log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "expired")
        .cloned()
        .collect()
}

fn a_lease_taken_over_expired_once(store: &Store) {
    store
        .fence()
        .args(["acquire", "job", "--owner", "A", "--ttl", "3s"])
        .run()
        .expect(0);
    let granted = store
        .fence()
        .args(["log", "job", "--format", "json"])
        .run()
        .expect(0)
        .json()["events"][0]["at"]
        .as_str()
        .unwrap()
        .to_owned();
    store.wait_expired("job");
    store
        .fence()
        .args(["acquire", "job", "--owner", "B", "--ttl", "1m"])
        .run()
        .expect(0);
    let all = expiries(store, &[]);
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(
        (&all[0]["owner"], &all[0]["token"]),
        (&Value::from("A"), &Value::from(1))
    );
    // A window that starts after A's grant: the takeover's record of the expiry, once (object
    // stores keep no previous expiry with a takeover: none is shown there).
    if !matches!(store.backend, Backend::File | Backend::Postgres) {
        return;
    }
    let since = chrono_after(&granted, 1);
    let windowed = expiries(store, &["--since", &since]);
    assert_eq!(windowed.len(), 1, "{windowed:#?}");
    assert!(windowed[0]["owner"].is_null(), "{windowed:#?}");
}

/// `at` (RFC 3339, milliseconds, `Z`) plus `ms` milliseconds, in the same form.
fn chrono_after(at: &str, ms: i64) -> String {
    let (stem, frac) = at.trim_end_matches('Z').rsplit_once('.').unwrap();
    let millis: i64 = frac.parse::<i64>().unwrap() + ms;
    assert!(millis < 1000, "{at}");
    format!("{stem}.{millis:03}Z")
}

per_coordinator!(a_lease_taken_over_expired_once);
