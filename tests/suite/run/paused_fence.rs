//! `fence run` tells the truth about a command that finished inside its lease (issue 35,
//! item 1). Only fence is paused (SIGSTOP: a GC pause, swap, a debugger); its supervisor and
//! the command run on, and the command finishes well before the lease's bound. When fence is
//! continued, past the lease's expiry, its lease is gone, but the command did all its work
//! inside it: fence exits with the command's status (0), warns that the lease was lost only
//! afterwards, and leaves the lease alone (it is not its to release). Exit 5 would send
//! on-call to rerun a job that finished. A command the lease's bound had to stop is still exit
//! 5: containment.rs covers that.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::process::kill;
use common::{wait_for, wait_output, Store};

fn a_command_that_finished_before_fence_woke_keeps_its_status(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let done = dir.path().join("done");
    let script = format!(
        "touch '{}'; sleep 0.3; touch '{}'",
        started.display(),
        done.display()
    );
    let mut fence = store
        .fence()
        .args([
            "run", "job", "--ttl", "3s", "--format", "json", "--", "sh", "-c",
        ])
        .args([&script]);
    fence
        .cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = fence.cmd.spawn().unwrap();
    wait_for("the command to start", Duration::from_secs(30), || {
        started.exists()
    });
    kill(child.id(), libc::SIGSTOP);
    wait_for("the command to finish", Duration::from_secs(30), || {
        done.exists()
    });
    // Paused past the lease: the store shows it expired.
    wait_for(
        "the store to show the lease expired",
        Duration::from_secs(60),
        || {
            let view = store
                .fence()
                .args(["inspect", "job", "--format", "json"])
                .run()
                .json();
            view["resources"][0]["state"] == "expired"
        },
    );
    // Someone else holds it now.
    store
        .fence()
        .args(["acquire", "job", "--owner", "next", "--ttl", "1m"])
        .run()
        .expect(0);
    kill(child.id(), libc::SIGCONT);
    let out = wait_output("fence run", child, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the command's status, not 5: {stderr}"
    );
    assert!(
        stderr.contains("the command finished inside its lease"),
        "{stderr}"
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["exit_status"], 0, "{json}");
    // The newer owner's lease is untouched: fence did not release what was not its own.
    let view = store
        .fence()
        .args(["inspect", "job", "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(view["resources"][0]["owner"], "next", "{view}");
    assert_eq!(view["resources"][0]["state"], "held", "{view}");
}

/// The other side: a lease taken away while fence is awake (released by hand with the run's
/// owner and token) is lost *before* the command ends: fence stops the command itself, well
/// inside the bound, and the run is exit 5, however quickly the command then ended.
fn a_command_fence_stopped_for_a_lost_lease_is_exit_5(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let lease = dir.path().join("lease");
    let script = format!(
        "echo \"$FENCE_OWNER $FENCE_TOKEN\" > '{}.tmp' && mv '{0}.tmp' '{0}'; sleep 300",
        lease.display()
    );
    let mut fence = store
        .fence()
        .args([
            "run", "job", "--ttl", "3s", "--format", "json", "--", "sh", "-c",
        ])
        .args([&script]);
    fence
        .cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = fence.cmd.spawn().unwrap();
    wait_for("the command to start", Duration::from_secs(30), || {
        lease.exists()
    });
    let text = std::fs::read_to_string(&lease).unwrap();
    let (owner, token) = text.trim().split_once(' ').unwrap();
    store
        .fence()
        .args(["release", "job", "--owner", owner, "--token", token])
        .run()
        .expect(0);
    let out = wait_output("fence run", child, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(
        !stderr.contains("finished inside its lease"),
        "fence stopped it: {stderr}"
    );
}

per_backend!(
    a_command_that_finished_before_fence_woke_keeps_its_status,
    a_command_fence_stopped_for_a_lost_lease_is_exit_5
);
