//! A made-up token on a separate target is told truthfully (issue 35, item 6). With the
//! coordinator elsewhere (here the directory store), a PostgreSQL target cannot tell a minted
//! token from a real one: `--token 99 --owner forger` is accepted, and the real holder's next
//! write is refused (exit 4). The refusal must not claim the store granted token 99 (it did
//! not): it names the target, says a newer owner *or* a token the store never issued, and
//! points at `fence inspect R --target URL`, which warns that 99 is above any token issued
//! and names the recovery: `fence acquire R --above 99`, then a release. On the directory,
//! PostgreSQL and S3 stores, that grants 100, the next ordinary grant 101, and the target takes
//! that holder's writes again (its guard row and table say so); `--above` never takes a live
//! lease, nor raises the owner's own; the guide's recovery runs as written.

use crate::common;

use common::{env_or_panic, Backend, Store};

#[test]
fn a_minted_token_on_a_separate_target_is_not_called_a_grant() {
    let store = Store::new(Backend::File);
    let target = env_or_panic("FENCE_TEST_PG_URL");
    let schema = format!("minted_{}", crate::common::process_tag());
    let fence = |args: &[&str]| {
        store
            .fence()
            .args(args)
            .args(["--schema", &schema])
            .env("PGCONNECT_TIMEOUT", "10")
    };
    fence(&["init", "--target", &target]).run().expect(0);
    let lease = fence(&["acquire", "report", "--ttl", "5m", "--format", "json"])
        .run()
        .expect(0)
        .json();
    let token = lease["token"].as_i64().unwrap().to_string();
    let owner = lease["owner"].as_str().unwrap().to_owned();

    // A token nobody issued, typed from an example.
    fence(&[
        "write", "report", "--token", "99", "--owner", "forger", "--target", &target, "--sql",
        "SELECT 1",
    ])
    .run()
    .expect(0);

    // The real holder is refused; the words say what may have happened, not a grant.
    let out = fence(&[
        "write", "report", "--token", &token, "--owner", &owner, "--target", &target, "--sql",
        "SELECT 1",
    ])
    .run()
    .expect(4);
    assert!(
        out.stderr.contains("token 99 is newer"),
        "the refusal as before: {out:?}"
    );
    assert!(
        !out.stderr.contains("granted again"),
        "the store granted nothing: {out:?}"
    );
    assert!(
        out.stderr.contains("the target has accepted token 99")
            && out.stderr.contains("never issued")
            && out.stderr.contains("--target"),
        "{out:?}"
    );
    let json = fence(&[
        "write", "report", "--token", &token, "--owner", &owner, "--target", &target, "--sql",
        "SELECT 1", "--format", "json",
    ])
    .run()
    .expect(4)
    .json();
    assert_eq!(json["error"], "stale_fencing_token", "{json}");
    assert_eq!(json["highest_token"], 99, "{json}");
    assert!(json["target"].as_str().is_some(), "which target: {json}");

    // What the hint points at tells the two apart: 99 is above any token the store issued.
    let out = fence(&["inspect", "report", "--target", &target])
        .run()
        .expect(0);
    assert!(
        out.stdout.contains("above any this store issued")
            || out.stderr.contains("above any this store issued"),
        "{out:?}"
    );

    // The store's lease is untouched: the holder still holds it, with its own token.
    let view = fence(&["inspect", "report", "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(
        view["resources"][0]["token"].to_string(),
        token,
        "the store issued nothing new: {view}"
    );
}

/// A coordinator and a PostgreSQL target it does not hold (a database or schema without its
/// `leases`), so that the target cannot tell a made-up token from a real one: the case of
/// issue 35, item 6, on every kind of coordinator.
struct Separate {
    store: Store,
    /// The target's URL; its fence schema is `schema`.
    target: String,
    /// `--schema`: the target's (and, on PostgreSQL, the coordinator's too, in another database).
    schema: String,
    /// The target's own throwaway schema in the test database (coordinators other than
    /// PostgreSQL), dropped with it.
    target_store: Option<Store>,
}

impl Separate {
    fn new(backend: Backend) -> Separate {
        let store = Store::new(backend);
        let (target, schema, target_store) = match &store.schema {
            // The same schema name, in the second database: no `leases` table there.
            Some(schema) => (
                env_or_panic("FENCE_TEST_PG_ASYNC_URL"),
                schema.clone(),
                None,
            ),
            None => {
                let target = Store::postgres();
                (
                    target.url.clone(),
                    target.schema.clone().unwrap(),
                    Some(target),
                )
            }
        };
        let separate = Separate {
            store,
            target,
            schema,
            target_store,
        };
        separate
            .fence(&["init", "--target", &separate.target])
            .run()
            .expect(0);
        common::pg_exec(
            &separate.target,
            &format!("CREATE TABLE {}.items (v bigint)", separate.schema),
        );
        separate
    }

    fn fence(&self, args: &[&str]) -> common::Fence {
        let fence = self.store.fence();
        let fence = match self.store.schema {
            Some(_) => fence,
            None => fence.args(["--schema", &self.schema]),
        };
        fence.args(args).env("PGCONNECT_TIMEOUT", "10")
    }

    /// A fenced write of the row `v` with `token` as `owner`, which must end with `code`.
    fn write(&self, owner: &str, token: i64, v: i64, code: i32) -> common::Out {
        let insert = format!("INSERT INTO {}.items VALUES ({v})", self.schema);
        self.fence(&[
            "write",
            "report",
            "--owner",
            owner,
            "--target",
            &self.target,
        ])
        .args(["--token", &token.to_string(), "--sql", &insert])
        .run()
        .expect(code)
    }

    /// The target's guard row for `report` (its highest accepted token) and its table.
    fn target_state(&self) -> (String, String) {
        let s = &self.schema;
        (
            common::fenced::one(
                &self.target,
                &format!("SELECT highest_token::text FROM {s}.guards WHERE resource = 'report'"),
            ),
            common::fenced::one(
                &self.target,
                &format!("SELECT string_agg(v::text, ',' ORDER BY v) FROM {s}.items"),
            ),
        )
    }

    /// `inspect report --target`'s integrity warnings.
    fn target_warnings(&self) -> serde_json::Value {
        self.fence(&[
            "inspect",
            "report",
            "--target",
            &self.target,
            "--format",
            "json",
        ])
        .run()
        .expect(0)
        .json()["warnings"]
            .clone()
    }

    /// The store's grants of `report` as `fence log` shows them: (token, detail).
    fn logged_grants(&self) -> Vec<(i64, Option<String>)> {
        let log = self
            .fence(&["log", "--resource", "report", "--format", "json"])
            .run()
            .expect(0)
            .json();
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "acquired" || e["kind"] == "taken_over")
            .map(|e| {
                (
                    e["token"].as_i64().unwrap(),
                    e["detail"].as_str().map(str::to_owned),
                )
            })
            .collect()
    }
}

impl Drop for Separate {
    fn drop(&mut self) {
        if self.target_store.is_none() && !std::thread::panicking() {
            common::pg_exec(
                &self.target,
                &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema),
            );
        }
    }
}

/// The recovery (issue 35, item 6): after a made-up token 99 on a separate target, the real
/// holder is refused; `acquire --above 99` (once the holder is gone) grants 100, says so in
/// the store's history, and from then on ordinary grants continue above it, so that the
/// next holder's writes are accepted again. Asserted on the store's lease record, the
/// target's guard row and table, and the history; `--above` never takes a live lease.
fn a_store_raised_above_a_minted_token_fences_the_target_again(backend: Backend) {
    let pair = Separate::new(backend);
    let holder = pair
        .fence(&[])
        .acquire("report", &["--owner", "holder", "--ttl", "5m"]);
    assert_eq!(holder.token, 1, "a new resource's first grant");
    pair.write("holder", 1, 1, 0);
    pair.write("forger", 99, 99, 0);
    pair.write("holder", 1, 2, 4);
    assert_eq!(pair.target_state(), ("99".into(), "1,99".into()));

    // The warning names the recovery.
    let warnings = pair.target_warnings();
    assert_eq!(warnings[0]["kind"], "target_ahead", "{warnings}");
    assert!(
        warnings[0]["message"]
            .as_str()
            .unwrap()
            .contains("`fence acquire report --above 99`"),
        "{warnings}"
    );

    // Not while another owner holds the lease: busy, and nothing changed.
    let events = pair.store.events("report");
    let out = pair
        .fence(&["acquire", "report", "--above", "99", "--owner", "operator"])
        .run()
        .expect(3);
    assert!(out.stderr.contains("held by `holder`"), "{out:?}");
    assert_eq!(pair.store.lease("report"), Some(("holder".into(), 1, true)));
    assert_eq!(
        pair.store.events("report"),
        events,
        "the busy --above wrote nothing"
    );

    common::release(&pair.store, "report", "holder", 1);
    let raised = pair
        .fence(&[])
        .acquire("report", &["--owner", "operator", "--above", "99"]);
    assert_eq!(raised.token, 100, "above 99 and above every token issued");
    assert_eq!(
        pair.store.lease("report"),
        Some(("operator".into(), 100, true))
    );
    assert_eq!(
        pair.logged_grants(),
        [
            (1, None),
            (100, Some("token raised above 99 (--above)".to_owned()))
        ],
        "the jump is recorded as deliberate"
    );

    // A retry after a lost answer is a reacquire of the same token, which is above 99.
    let out = pair
        .fence(&["acquire", "report", "--above", "99", "--owner", "operator"])
        .args(["--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(
        (out["token"].as_i64(), out["reacquired"].as_bool()),
        (Some(100), Some(true))
    );
    // Its own live lease cannot be raised further: a reacquire keeps the token.
    let events = pair.store.events("report");
    let out = pair
        .fence(&["acquire", "report", "--above", "100", "--owner", "operator"])
        .run()
        .expect(2);
    assert!(
        out.stderr.contains("not above 100")
            && out
                .stderr
                .contains("fence release report --owner operator --token 100"),
        "{out:?}"
    );
    assert_eq!(
        pair.store.lease("report"),
        Some(("operator".into(), 100, true))
    );
    assert_eq!(
        pair.store.events("report"),
        events,
        "the refused --above wrote nothing"
    );
    common::release(&pair.store, "report", "operator", 100);

    // From now on ordinary grants continue above 99, and the target accepts them.
    let next = pair
        .fence(&[])
        .acquire("report", &["--owner", "next", "--ttl", "5m"]);
    assert_eq!(next.token, 101);
    pair.write("next", 101, 101, 0);
    assert_eq!(pair.target_state(), ("101".into(), "1,99,101".into()));
    assert!(
        pair.target_warnings().is_null(),
        "the target is no longer ahead"
    );
    let log = pair
        .fence(&[
            "log",
            "--resource",
            "report",
            "--target",
            &pair.target,
            "--format",
            "json",
        ])
        .run()
        .expect(0)
        .json();
    assert_eq!(
        log["warnings"],
        serde_json::json!([]),
        "a raised token is no regression: {log}"
    );
    assert_eq!(log["integrity_ok"], true, "{log}");
}

mod file_store {
    #[test]
    fn acquire_above_a_minted_token_lets_the_next_holder_write() {
        super::a_store_raised_above_a_minted_token_fences_the_target_again(super::Backend::File);
    }
}

mod postgres {
    #[test]
    fn acquire_above_a_minted_token_lets_the_next_holder_write() {
        super::a_store_raised_above_a_minted_token_fences_the_target_again(
            super::Backend::Postgres,
        );
    }
}

mod s3 {
    #[test]
    fn acquire_above_a_minted_token_lets_the_next_holder_write() {
        super::a_store_raised_above_a_minted_token_fences_the_target_again(super::Backend::S3);
    }
}

/// `--above N` takes a positive integer with room above it, never with `--wait` (a recovery
/// is asked once, not queued for): anything else is a usage error, and nothing is granted.
#[test]
fn acquire_above_refuses_what_is_not_a_token_to_go_above() {
    let store = Store::new(Backend::File);
    for (above, says) in [
        ("0", "not a token to go above"),
        ("abc", "not a token to go above"),
        ("1.5", "not a token to go above"),
        ("9223372036854775807", "new resource name"),
        ("9223372036854775808", "not a token to go above"),
    ] {
        let out = store
            .fence()
            .args(["acquire", "report", "--above", above])
            .run()
            .expect(2);
        assert!(
            out.stderr.contains("--above") && out.stderr.contains(says),
            "{above}: {out:?}"
        );
        let json = store
            .fence()
            .args(["acquire", "report", "--format", "json", "--above", above])
            .run()
            .expect(2)
            .json();
        assert_eq!(json["error"], "usage", "{above}: {json}");
    }
    let out = store
        .fence()
        .args(["acquire", "report", "--above", "-1"])
        .run()
        .expect(2);
    assert!(out.stderr.contains("-1"), "{out:?}");
    let out = store
        .fence()
        .args(["acquire", "report", "--above", "99", "--wait", "1s"])
        .run()
        .expect(2);
    assert!(out.stderr.contains("--wait"), "{out:?}");
    assert_eq!(store.lease("report"), None, "nothing was granted");
    // The highest N there can be leaves 2^32 tokens for the grants after it; above that, a
    // new resource name (one recovery must not use up a resource's tokens for good).
    let out = store
        .fence()
        .args(["acquire", "report", "--above", "9223372036854775806"])
        .run()
        .expect(2);
    assert!(out.stderr.contains("new resource name"), "{out:?}");
    let top = store
        .fence()
        .acquire("report", &["--above", "9223372032559808511"]);
    assert_eq!(top.token, 9_223_372_032_559_808_512);
}

/// The recovery in docs/postgres-targets.md ("A token the store never issued"), run by bash
/// exactly as written, with the store and the target's schema in the environment and the
/// target in `$DB`: after it, the store's tokens continue above the made-up 99, and the next
/// holder's write is accepted.
#[test]
fn the_documented_recovery_from_a_minted_token_runs_as_written() {
    let recipe = common::doc_sh_block("<!-- recipe-above -->");
    let pair = Separate::new(Backend::File);
    let holder = pair
        .fence(&[])
        .acquire("report", &["--owner", "holder", "--ttl", "5m"]);
    pair.write("forger", 99, 99, 0);
    pair.write("holder", holder.token, 1, 4);
    pair.fence(&[]).release(&holder);

    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(common::fence_bin(), bin.path().join("fence")).unwrap();
    let out = common::clean_command("bash", pair.store.home.path())
        .args(["-c", &format!("set -e\n{recipe}")])
        .env("PATH", format!("{}:/usr/bin:/bin", bin.path().display()))
        .env("FENCE_STORE", &pair.store.url)
        .env("FENCE_SCHEMA", &pair.schema)
        .env("DB", &pair.target)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{recipe}\n{stdout}{stderr}");
    assert!(
        format!("{stdout}{stderr}").contains("`fence acquire report --above 99`"),
        "inspect named the recovery: {stdout}{stderr}"
    );
    let (_, token, live) = pair.store.lease("report").unwrap();
    assert_eq!(
        (token, live),
        (100, false),
        "granted above 99, and released"
    );
    let next = pair.fence(&[]).acquire("report", &["--owner", "next"]);
    assert_eq!(next.token, 101);
    pair.write("next", 101, 101, 0);
    assert_eq!(pair.target_state(), ("101".into(), "99,101".into()));
}
