//! README command 1 runs the main job on the embedded store with no server (issue 2, point 1):
//! the exact line from the README, run by bash in the repository, with its own state
//! directory, must acquire, release and inspect, and leave the lease in that directory.

use std::process::Command;

#[test]
fn readme_command_one_runs_on_the_embedded_store() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let after = readme
        .split("<!-- readme-command-1 -->")
        .nth(1)
        .expect("README marks command 1");
    let command = after
        .split("```sh\n")
        .nth(1)
        .and_then(|block| block.split("\n```").next())
        .expect("command 1 is a sh block");
    assert_eq!(
        command.lines().count(),
        1,
        "command 1 is one line: {command}"
    );

    let state = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .args(["-c", command])
        .current_dir(root)
        .env("XDG_STATE_HOME", state.path())
        .env_remove("FENCE_STORE")
        .env_remove("FENCE_OWNER")
        .env_remove("FENCE_RESOURCE")
        .env_remove("FENCE_TOKEN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("working under token 1"), "{stdout}");
    assert!(
        stdout.contains("nightly-report") && stdout.contains("free"),
        "{stdout}"
    );
    let record = state.path().join("fence/leases/nightly-report.json");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(record).unwrap()).unwrap();
    assert_eq!(
        (record["token"].as_i64(), record["released"].as_bool()),
        (Some(1), Some(true))
    );
}
