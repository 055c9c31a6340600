//! Tokens survive a coordinator crash (DESIGN I1, §8 "Durability"): on a private PostgreSQL
//! cluster whose server default is `synchronous_commit = off`, grant tokens, crash the server
//! with `pg_ctl restart -m immediate` right after a grant was reported, and check that the
//! next grant's token is still greater. With asynchronous commit and no `SET LOCAL
//! synchronous_commit = on`, the last grants before a crash are lost and tokens repeat.
//!
//! Also: `fence run` rides out a coordinator restart shorter than its TTL, and stops its
//! command when the coordinator stays away longer (issue 5, point 3).
//!
//! The cluster is this test's own (the shared one from `tests/run` must not be restarted
//! under the other tests).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::cluster::Cluster;
use fence::config::StoreSpec;
use fence::store::LeaseRef;

#[test]
fn tokens_keep_rising_across_immediate_restarts_with_async_commit_default() {
    let cluster = Cluster::start();
    let spec = StoreSpec::resolve(Some(&cluster.url())).unwrap();
    let mut last_reported = 0;
    for cycle in 0..5 {
        let reported = common::block_on(async {
            let store = fence::store::open(&spec, "fence").await.expect("connect");
            let mut last = 0;
            for i in 0..20 {
                let owner = format!("cycle-{cycle}-{i}");
                let grant = store
                    .acquire("r", &owner, Duration::from_secs(30))
                    .await
                    .expect("acquire");
                assert!(
                    grant.lease.token > last_reported,
                    "token {} after {last_reported}",
                    grant.lease.token
                );
                last = grant.lease.token;
                let lease = LeaseRef {
                    resource: "r".into(),
                    owner,
                    token: last,
                };
                store.release(&lease).await.expect("release");
            }
            last
        });
        // Crash right after the grants were reported.
        cluster.pg_ctl("restart");
        last_reported = reported;
    }
    let after = common::block_on(async {
        let store = fence::store::open(&spec, "fence").await.expect("connect");
        store
            .acquire("r", "final", Duration::from_secs(30))
            .await
            .expect("acquire")
            .lease
            .token
    });
    assert!(
        after > last_reported,
        "token {after} after {last_reported}: a granted token was lost in a crash"
    );
    assert_eq!(after, 5 * 20 + 1, "no grant was lost and none repeated");
}

fn fence_run(cluster: &Cluster, ttl: &str, script: &str, dir: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_fence"))
        .args([
            "--store",
            &cluster.url(),
            "run",
            "job",
            "--ttl",
            ttl,
            "--kill-after",
            "1s",
            "--format",
            "json",
        ])
        .args(["--", "sh", "-c", script])
        .current_dir(dir)
        .env_remove("FENCE_STORE")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_for_file(path: &Path) {
    let start = std::time::Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `fence run` rides out a coordinator restart shorter than the TTL (it reconnects and
/// renews), and stops its command when the coordinator stays away longer than the TTL.
#[test]
fn run_survives_a_short_coordinator_restart_but_not_a_long_outage() {
    let cluster = Cluster::start();
    let dir = tempfile::tempdir().unwrap();

    let child = fence_run(
        &cluster,
        "4s",
        "touch started; sleep 6; touch finished",
        dir.path(),
    );
    wait_for_file(&dir.path().join("started"));
    std::thread::sleep(Duration::from_millis(500));
    cluster.pg_ctl("restart");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        dir.path().join("finished").exists(),
        "the command ran to its end"
    );

    let child = fence_run(
        &cluster,
        "2s",
        "touch started2; sleep 30; touch finished2",
        dir.path(),
    );
    wait_for_file(&dir.path().join("started2"));
    cluster.pg_ctl("stop");
    std::thread::sleep(Duration::from_millis(3500));
    cluster.pg_ctl("start");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (json["error"].as_str(), json["reason"].as_str()),
        (Some("lease_lost"), Some("unreachable")),
        "{json}"
    );
    assert!(
        !dir.path().join("finished2").exists(),
        "the command was stopped"
    );
}
