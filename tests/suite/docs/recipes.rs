//! Every documented way of guarding a step fails closed (issue 16, item 1).
//!
//! The recipes are taken from where users copy them: the blocks of the README and of
//! `docs/*.md` marked `<!-- recipe -->`, and the examples in `fence <command> --help` (which
//! the man pages are generated from) that guard a step. Each runs exactly as written, in bash
//! and in dash, with and without `set -e`, against four stores: free, busy (held by another
//! owner), unreachable, and misconfigured. The guarded steps (`step_one`, `step_two`,
//! `./report.sh`, `./generate-report.sh`) are stand-ins that log that they ran. Only with the
//! free store may they run, and then every lease is released afterwards.

use crate::common;

use std::process::Command;

/// The stand-ins for the steps a recipe guards.
const STEPS: [&str; 4] = ["step_one", "step_two", "report.sh", "generate-report.sh"];

/// The resources the recipes use, held by someone else for the busy case.
const RESOURCES: [&str; 4] = ["db-migration", "nightly-report", "job", "report"];

fn readme_recipes() -> Vec<String> {
    doc_blocks("<!-- recipe -->")
}

/// The sh blocks marked `marker` in the README and `docs/*.md`.
fn doc_blocks(marker: &str) -> Vec<String> {
    common::doc_sh_blocks(marker)
        .into_iter()
        .map(|(_, block)| block)
        .collect()
}

/// Example paragraphs of every subcommand's --help that guard a step: consecutive lines
/// indented by two spaces, up to a blank line.
fn help_recipes() -> Vec<String> {
    help_examples()
        .into_iter()
        .filter(|recipe| STEPS.iter().any(|step| recipe.contains(step)))
        .collect()
}

/// Every example paragraph of every subcommand's --help (the man pages are generated from
/// the same text).
fn help_examples() -> Vec<String> {
    let fence = env!("CARGO_BIN_EXE_fence");
    let mut recipes = Vec::new();
    for sub in [
        "acquire", "run", "renew", "release", "inspect", "log", "metrics", "write", "protect",
        "init", "bench", "prune",
    ] {
        let out = Command::new(fence).args([sub, "--help"]).output().unwrap();
        let help = String::from_utf8(out.stdout).unwrap();
        let mut paragraph: Vec<&str> = Vec::new();
        for line in help.lines().chain([""]) {
            match line.strip_prefix("  ") {
                Some(code) if !code.starts_with(' ') || !paragraph.is_empty() => {
                    paragraph.push(code)
                }
                _ => {
                    let recipe = paragraph.join("\n");
                    if recipe.starts_with("fence ")
                        || recipe.starts_with("eval ")
                        || recipe.contains("| fence ")
                    {
                        recipes.push(recipe);
                    }
                    paragraph.clear();
                }
            }
        }
    }
    recipes
}

#[test]
fn the_recipes_are_found() {
    let readme = readme_recipes();
    assert!(readme.len() >= 3, "{readme:?}");
    let help = help_recipes();
    assert!(help.len() >= 3, "{help:?}");
}

/// A scratch directory with the stand-in steps and `fence` on PATH.
struct Bench {
    dir: tempfile::TempDir,
}

impl Bench {
    fn new() -> Bench {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_fence"), bin.join("fence")).unwrap();
        for step in STEPS {
            let path = if step.ends_with(".sh") {
                dir.path().join(step)
            } else {
                bin.join(step)
            };
            std::fs::write(
                &path,
                format!("#!/bin/sh\necho \"{step} ${{FENCE_TOKEN:-none}}\" >> \"$RECIPE_LOG\"\n"),
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Bench { dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// Runs `recipe` in `shell`, with `set -e` first if asked, against `store`.
    fn run(&self, shell: &str, set_e: bool, recipe: &str, store: &str) -> std::process::Output {
        let _ = std::fs::remove_file(self.dir.path().join("log"));
        let script = if set_e {
            format!("set -e\n{recipe}\n")
        } else {
            format!("{recipe}\n")
        };
        Command::new(shell)
            .args(["-c", &script])
            .current_dir(self.dir.path())
            .env_clear()
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", self.dir.path().join("bin").display()),
            )
            .env("HOME", self.dir.path())
            .env("RECIPE_LOG", self.dir.path().join("log"))
            .env("FENCE_STORE", store)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    }
}

fn fence_with(store: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fence"));
    cmd.env_clear().args(["--store", store]);
    cmd
}

/// Each resource's state in `store`.
fn states(store: &str) -> Vec<(String, String)> {
    let out = fence_with(store)
        .args(["inspect", "--format", "json"])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    json["resources"]
        .as_array()
        .map(|all| {
            all.iter()
                .map(|r| {
                    (
                        r["resource"].as_str().unwrap().to_owned(),
                        r["state"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn check(recipe: &str) {
    let bench = Bench::new();
    for shell in ["bash", "dash"] {
        for set_e in [false, true] {
            let case = format!("{shell}, set -e: {set_e}, recipe:\n{recipe}\n");
            // Free: the steps run, and no lease is left held.
            let free = format!("file://{}/free-{shell}-{set_e}", bench.dir.path().display());
            let out = bench.run(shell, set_e, recipe, &free);
            assert!(out.status.success(), "free store failed: {case}{out:?}");
            assert!(
                !bench.log().is_empty(),
                "no step ran with a free store: {case}"
            );
            assert!(
                !bench.log().contains("none"),
                "a step ran without a token: {case}"
            );
            let held: Vec<_> = states(&free)
                .into_iter()
                .filter(|(_, s)| s == "held")
                .collect();
            assert!(held.is_empty(), "leases left held: {held:?} {case}");

            // Busy: someone else holds every resource the recipes use.
            let busy = format!("file://{}/busy-{shell}-{set_e}", bench.dir.path().display());
            for resource in RESOURCES {
                let status = fence_with(&busy)
                    .args([
                        "acquire",
                        resource,
                        "--owner",
                        "someone-else",
                        "--ttl",
                        "10m",
                    ])
                    .status()
                    .unwrap();
                assert!(status.success());
            }
            let failing = [
                ("busy", busy.clone()),
                (
                    "unreachable",
                    "postgres://nobody@127.0.0.1:9/none?connect_timeout=2&sslmode=disable"
                        .to_owned(),
                ),
                ("misconfigured", "nosuch://store".to_owned()),
            ];
            for (what, store) in failing {
                let out = bench.run(shell, set_e, recipe, &store);
                // The cron recipe: an overlap with the previous run is silent and exit 0.
                if what == "busy" && recipe.contains("--busy-exit-code 0 -q") {
                    assert_eq!(out.status.code(), Some(0), "{case}{out:?}");
                    assert!(
                        out.stdout.is_empty() && out.stderr.is_empty(),
                        "{case}{out:?}"
                    );
                }
                assert!(
                    bench.log().is_empty(),
                    "a guarded step ran with a {what} store: {case}{}{out:?}",
                    bench.log()
                );
            }
            for (resource, state) in states(&busy) {
                assert_eq!(
                    state, "held",
                    "{resource} was taken from its holder: {case}"
                );
            }
        }
    }
}

#[test]
fn readme_recipes_fail_closed() {
    for recipe in readme_recipes() {
        check(&recipe);
    }
}

#[test]
fn help_recipes_fail_closed() {
    for recipe in help_recipes() {
        check(&recipe);
    }
}

/// Examples that name example hosts (`postgres://app@db/app`, `s3://bucket/…`) cannot succeed
/// here; run exactly as written, each must end with one of fence's documented statuses (or the
/// shell's own for a missing stand-in command), never a crash.
#[test]
fn every_other_example_runs_and_fails_cleanly() {
    let bench = Bench::new();
    let examples: Vec<String> = help_examples()
        .into_iter()
        .filter(|e| !STEPS.iter().any(|step| e.contains(step)))
        .chain(doc_blocks("<!-- example -->"))
        .collect();
    assert!(examples.len() >= 8, "{examples:?}");
    let store = format!("file://{}/examples", bench.dir.path().display());
    for example in examples {
        // `some-command` stands for the user's producer of bytes.
        let script =
            format!("some_command() {{ echo data; }}\nalias some-command=some_command\n{example}");
        let out = bench.run(
            "bash",
            false,
            &format!("shopt -s expand_aliases\n{script}"),
            &store,
        );
        let code = out.status.code();
        assert!(
            matches!(code, Some(0..=8) | Some(127)),
            "`{example}` ended with {code:?}: {out:?}"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "`{example}`: {stderr}");
    }
}
