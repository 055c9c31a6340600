//! A made-up token on a separate target is told truthfully (issue 35, item 6). With the
//! coordinator elsewhere (here the directory store), a PostgreSQL target cannot tell a minted
//! token from a real one: `--token 99 --owner forger` is accepted, and the real holder's next
//! write is refused (exit 4). The refusal must not claim the store granted token 99 (it did
//! not): it names the target, says a newer owner *or* a token the store never issued, and
//! points at `fence inspect R --target URL`, which warns that 99 is above any token issued.

use crate::common;

use common::{env_or_panic, Backend, Store};

#[test]
fn a_minted_token_on_a_separate_target_is_not_called_a_grant() {
    let store = Store::new(Backend::File);
    let target = env_or_panic("FENCE_TEST_PG_URL");
    let schema = format!("minted_{}", std::process::id());
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
