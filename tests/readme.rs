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

/// Every shell block of the README is run by a test exactly as written: each is marked, and
/// the marker names the test that reads the block after it. A new block without a marker, or
/// a marker no test reads, fails here.
#[test]
fn every_shell_block_of_the_readme_is_run_by_a_test() {
    // (marker, the file that reads the block after it)
    const MARKERS: [(&str, &str); 9] = [
        ("<!-- readme-command-1 -->", "tests/readme.rs"),
        ("<!-- readme-command-2 -->", ".ci/run"),
        ("<!-- install -->", "tests/install.rs"),
        ("<!-- recipe -->", "tests/recipes.rs"),
        ("<!-- example -->", "tests/recipes.rs"),
        ("<!-- readme-roles-recipe -->", "tests/roles.rs"),
        ("<!-- recipe-once -->", "tests/write_ids.rs"),
        ("<!-- recipe-once-object -->", "tests/write_ids.rs"),
        ("<!-- prune-cron -->", "tests/prune.rs"),
    ];
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let lines: Vec<&str> = readme.lines().map(str::trim).collect();
    let mut unmarked = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with("```sh") {
            continue;
        }
        let marker = lines[..i].iter().rev().find(|l| !l.is_empty());
        match MARKERS.iter().find(|(m, _)| Some(m) == marker) {
            Some((marker, reader)) if *reader == ".ci/run" => {
                // Set-up command 2 is what CI runs: `.ci/run` ends in exactly that command.
                let block = lines[i + 1];
                let ci = std::fs::read_to_string(format!("{root}/.ci/run")).unwrap();
                assert!(
                    ci.contains(&format!("exec {block} \"$@\"")),
                    "{marker}: `.ci/run` does not run `{block}`"
                );
            }
            Some((marker, reader)) => {
                let test = std::fs::read_to_string(format!("{root}/{reader}")).unwrap();
                assert!(
                    test.contains(marker),
                    "{reader} does not read the README block after {marker}"
                );
            }
            None => unmarked.push(format!("line {}: after {marker:?}", i + 1)),
        }
    }
    assert!(
        unmarked.is_empty(),
        "README shell blocks no test runs (mark each with the marker its test reads): {unmarked:?}"
    );
}
