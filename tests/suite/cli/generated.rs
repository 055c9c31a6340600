//! The shell completions in `completions/`, the man pages in `man/` and the README's exit-code
//! table are generated from the clap definition in `src/cli.rs` and the exit-code table in
//! `src/exit.rs` by `cargo run --example gen-docs`, and checked in so that packagers can ship
//! them without building anything.
//!
//! Checked-in generated files drift silently: someone adds a flag, and the completions and man
//! pages keep describing the old command line. These tests regenerate every file in memory with
//! the same generator (`examples/gen-docs/docs.rs`) and fail if a checked-in file differs, is
//! missing, or is no longer generated; they never write. After a deliberate change to the
//! command line, run `cargo run --example gen-docs`.

#[path = "../../../examples/gen-docs/docs.rs"]
mod docs;

use std::fmt::Write as _;
use std::path::Path;

use clap::CommandFactory;
use fence::cli::Cli;

const FIX: &str = "run `cargo run --example gen-docs` to regenerate";

#[test]
fn cli_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn environment_lists_every_env_option() {
    fn collect(cmd: &clap::Command, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            if let Some(env) = arg.get_env() {
                out.push(env.to_string_lossy().into_owned());
            }
        }
        for sub in cmd.get_subcommands() {
            collect(sub, out);
        }
    }
    let mut envs = Vec::new();
    collect(&Cli::command(), &mut envs);
    let missing: Vec<_> = envs
        .iter()
        .filter(|env| !docs::ENVIRONMENT.iter().any(|(name, _)| name == env))
        .collect();
    assert!(
        missing.is_empty(),
        "options read {missing:?} from the environment, but ENVIRONMENT in \
         examples/gen-docs/docs.rs does not describe them for fence(1)"
    );
}

/// Every variable the source reads by name (`env::var("X")`, `var_os("X")`, and the
/// PostgreSQL module's `env("X")`) is named in fence(1)'s ENVIRONMENT, in an entry of its own
/// or in another's text (USER under PGUSER, HOME under XDG_STATE_HOME).
#[test]
fn environment_names_every_variable_the_source_reads() {
    fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let documented: String = docs::ENVIRONMENT
        .iter()
        .map(|(name, text)| format!("{name} {text}\n"))
        .collect();
    let mut read = std::collections::BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for opener in ["var(\"", "var_os(\"", " env(\"", "(env(\""] {
            for (at, _) in text.match_indices(opener) {
                let rest = &text[at + opener.len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if !name.is_empty() && rest[name.len()..].starts_with('"') {
                    read.insert(name);
                }
            }
        }
    }
    assert!(
        read.len() >= 20,
        "found too few reads to trust the scan: {read:?}"
    );
    let missing: Vec<_> = read
        .iter()
        .filter(|name| {
            !documented
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .any(|word| word == name.as_str())
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the source reads {missing:?} from the environment, but ENVIRONMENT in \
         examples/gen-docs/docs.rs does not name them for fence(1)"
    );
}

#[test]
fn generated_files_are_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let generated = docs::generate();
    let mut problems = String::new();
    for (rel, contents) in &generated {
        match std::fs::read(root.join(rel)) {
            Ok(on_disk) if &on_disk == contents => {}
            Ok(on_disk) => {
                let (line, want, have) = first_difference(contents, &on_disk);
                let _ = writeln!(
                    problems,
                    "  {}: differs from line {line}\n      generated: {want:?}\n      checked in: {have:?}",
                    rel.display()
                );
            }
            Err(_) => {
                let _ = writeln!(problems, "  {}: missing", rel.display());
            }
        }
    }
    for rel in docs::stale(root, &generated) {
        let _ = writeln!(problems, "  {}: stale, no longer generated", rel.display());
    }
    assert!(
        problems.is_empty(),
        "checked-in files differ from what src/cli.rs and src/exit.rs generate:\n{problems}{FIX}"
    );
}

/// The README's exit-code table, between its markers, is rendered from `src/exit.rs` like the
/// man pages and `--help`, so the three cannot drift.
#[test]
fn readme_exit_codes_come_from_the_exit_table() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let wanted = docs::readme_with_exit_table(&readme).unwrap_or_else(|why| panic!("{why}"));
    assert!(
        wanted == readme,
        "README's exit-code table differs from src/exit.rs; {FIX}"
    );
}

/// The 1-based number of the first line where `want` and `have` differ, and both lines there.
fn first_difference(want: &[u8], have: &[u8]) -> (usize, String, String) {
    let want = String::from_utf8_lossy(want);
    let have = String::from_utf8_lossy(have);
    let mut want_lines = want.lines();
    let mut have_lines = have.lines();
    let mut number = 1;
    loop {
        match (want_lines.next(), have_lines.next()) {
            (Some(w), Some(h)) if w == h => number += 1,
            (w, h) => {
                let show = |line: Option<&str>| line.unwrap_or("<end of file>").to_owned();
                return (number, show(w), show(h));
            }
        }
    }
}
