//! The README's install steps work from a fresh clone (issue 16, item 7): the block marked
//! `<!-- install -->` runs line by line, exactly as written, in a `git clone` of this
//! repository with a throwaway HOME; then `fence` runs from `~/.cargo/bin`, `man fence` finds
//! the installed page through PATH, `man -k` (apropos) finds it in the index the block's
//! `mandb` line made, and the bash completion completes subcommands.
//!
//! Two things differ from a user's machine, through the environment only: cargo builds
//! offline from the already-fetched registry (the suite runs without a network), and the
//! release profile is compiled without optimisation (nor link-time optimisation) into its
//! own cached target directory, so that the test takes seconds once warm instead of a full
//! optimised build on every run.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn install_block() -> Vec<String> {
    common::doc_sh_block("<!-- install -->")
        .lines()
        .map(str::to_owned)
        .collect()
}

fn real_home() -> PathBuf {
    PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
}

/// Where the install test's builds are cached: beside the suite's own target directory.
fn install_target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir).with_file_name("fence-install-target"),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/install-test"),
    }
}

fn cargo_bin_dir() -> PathBuf {
    let cargo = std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from);
    cargo
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| real_home().join(".cargo/bin"))
}

#[test]
fn readme_install_steps_work_from_a_fresh_clone() {
    let tmp = tempfile::tempdir().unwrap();
    let clone = tmp.path().join("fence");
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let status = Command::new("git")
        .args(["clone", "-q", env!("CARGO_MANIFEST_DIR")])
        .arg(&clone)
        .status()
        .unwrap();
    assert!(status.success(), "git clone failed");

    let real = real_home();
    let path = format!(
        "{}:{}:/usr/bin:/bin",
        home.join(".cargo/bin").display(),
        cargo_bin_dir().display()
    );
    let env = |cmd: &mut Command| {
        cmd.env_clear()
            .env("HOME", &home)
            .env("PATH", &path)
            .env("LANG", "C.UTF-8")
            .env(
                "CARGO_HOME",
                std::env::var_os("CARGO_HOME").unwrap_or_else(|| real.join(".cargo").into()),
            )
            .env(
                "RUSTUP_HOME",
                std::env::var_os("RUSTUP_HOME").unwrap_or_else(|| real.join(".rustup").into()),
            )
            .env("CARGO_INSTALL_ROOT", home.join(".cargo"))
            .env("CARGO_NET_OFFLINE", "true")
            .env("CARGO_TARGET_DIR", install_target_dir())
            .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0")
            .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "256")
            .env("CARGO_PROFILE_RELEASE_LTO", "false")
            .env("CARGO_PROFILE_RELEASE_INCREMENTAL", "true");
    };
    for line in install_block() {
        let mut cmd = Command::new("bash");
        cmd.args(["-e", "-c", &line]).current_dir(&clone);
        env(&mut cmd);
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "`{line}` failed: {out:?}");
    }

    // `fence` from where cargo put it, through PATH alone.
    let mut cmd = Command::new("bash");
    cmd.args(["-c", "command -v fence && fence --version"])
        .current_dir(tmp.path());
    env(&mut cmd);
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.starts_with(&format!("{}/.cargo/bin/fence\n", home.display())),
        "{stdout}"
    );
    assert!(stdout.contains(env!("CARGO_PKG_VERSION")), "{stdout}");

    // `man fence` finds the page through PATH (../share/man of ~/.cargo/bin).
    let mut cmd = Command::new("man");
    cmd.args(["-P", "cat", "fence-run"]);
    env(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("busy-exit-code"),
        "{out:?}"
    );

    // `man -k` (apropos) finds the pages in the index the README's `mandb` line made: in that
    // directory alone (`-M`), so that no system-wide index of an earlier install can answer.
    let mut cmd = Command::new("apropos");
    cmd.args(["-M"])
        .arg(home.join(".cargo/share/man"))
        .arg("fence-run");
    env(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("fence-run (1)"),
        "{out:?}"
    );

    // The bash completion, from where the README installs it, completes subcommands.
    let mut cmd = Command::new("bash");
    cmd.args([
        "-c",
        "source ~/.local/share/bash-completion/completions/fence && \
         COMP_WORDS=(fence ac) && COMP_CWORD=1 && COMP_LINE='fence ac' && COMP_POINT=8 && \
         _fence fence ac fence && printf '%s\\n' \"${COMPREPLY[@]}\"",
    ]);
    env(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "acquire");
}
