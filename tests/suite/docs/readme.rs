//! The documents users read: the README and the guides in `docs/` (issues 2 and 34).
//!
//! README command 1 runs the main job on the embedded store with no server (issue 2, point 1):
//! the exact line from the README, run by bash in the repository, with its own state
//! directory, must acquire, release and inspect, and leave the lease in that directory. Every
//! shell block of every document is run by a test exactly as written; the README stays short
//! (at most 400 lines, the guides in `docs/`), and every relative link resolves.

use crate::common;

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

#[test]
fn readme_command_one_runs_on_the_embedded_store() {
    let root = env!("CARGO_MANIFEST_DIR");
    let command = common::doc_sh_block("<!-- readme-command-1 -->");
    let command = command.as_str();
    assert_eq!(
        command.lines().count(),
        1,
        "command 1 is one line: {command}"
    );

    let state = tempfile::tempdir().unwrap();
    let mut bash = Command::new("bash");
    bash.args(["-c", command])
        .current_dir(root)
        .env("XDG_STATE_HOME", state.path())
        .env_remove("FENCE_STORE")
        .env_remove("FENCE_OWNER")
        .env_remove("FENCE_RESOURCE")
        .env_remove("FENCE_TOKEN");
    // As a user's shell runs it: without what the test harness sets for the test binary
    // (CARGO_MANIFEST_DIR, CARGO_PKG_*…). Build scripts watch some of those (ring's watches
    // CARGO_MANIFEST_DIR), so with them `cargo run` rebuilt a C library and relinked fence,
    // a minute on a loaded machine, and replaced the binary the other tests were running.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name == "CARGO" || name.starts_with("NEXTEST") || harness_cargo_variable(&name) {
            bash.env_remove(&*name);
        }
    }
    let out = bash.output().unwrap();
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

/// Every shell block of the README and of `docs/*.md` is run by a test exactly as written:
/// each is marked, and the marker names the test that reads the block after it (through
/// `common::doc_sh_block`, which finds it in whichever document holds it). A new block without
/// a marker, a marker no test reads, a marker of one block used twice, or a set-up command
/// moved out of the README fails here.
#[test]
fn every_shell_block_of_the_documents_is_run_by_a_test() {
    // (marker, the file that reads the block after it, whether it may mark several blocks)
    const MARKERS: [(&str, &str, bool); 10] = [
        (
            "<!-- readme-command-1 -->",
            "tests/suite/docs/readme.rs",
            false,
        ),
        ("<!-- readme-command-2 -->", ".ci/run", false),
        (
            "<!-- install -->",
            "tests/suite/packaging/install.rs",
            false,
        ),
        ("<!-- recipe -->", "tests/suite/docs/recipes.rs", true),
        ("<!-- example -->", "tests/suite/docs/recipes.rs", true),
        (
            "<!-- readme-roles-recipe -->",
            "tests/suite/write_pg/roles.rs",
            false,
        ),
        (
            "<!-- recipe-once -->",
            "tests/suite/write_pg/write_ids.rs",
            false,
        ),
        (
            "<!-- recipe-once-object -->",
            "tests/suite/write_pg/write_ids.rs",
            false,
        ),
        ("<!-- prune-cron -->", "tests/suite/history/prune.rs", false),
        (
            "<!-- recipe-above -->",
            "tests/suite/write_pg/minted.rs",
            false,
        ),
    ];
    let root = env!("CARGO_MANIFEST_DIR");
    let mut unmarked = Vec::new();
    // Where each marker marks a block: (document, line).
    let mut marked: HashMap<&str, Vec<(String, usize)>> = HashMap::new();
    for (path, text) in common::documents() {
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for (i, line) in lines.iter().enumerate() {
            if !line.starts_with("```sh") {
                continue;
            }
            let marker = lines[..i].iter().rev().find(|l| !l.is_empty());
            match MARKERS.iter().find(|(m, _, _)| Some(m) == marker) {
                Some((marker, reader, _)) if *reader == ".ci/run" => {
                    // Set-up command 2 is what CI runs: `.ci/run` ends in exactly that command.
                    let block = lines[i + 1];
                    let ci = std::fs::read_to_string(format!("{root}/.ci/run")).unwrap();
                    assert!(
                        ci.contains(&format!("exec {block} \"$@\"")),
                        "{marker}: `.ci/run` does not run `{block}`"
                    );
                    marked
                        .entry(*marker)
                        .or_default()
                        .push((path.clone(), i + 1));
                }
                Some((marker, reader, _)) => {
                    let test = std::fs::read_to_string(format!("{root}/{reader}")).unwrap();
                    assert!(
                        test.contains(marker),
                        "{reader} does not read the block after {marker} ({path})"
                    );
                    marked
                        .entry(*marker)
                        .or_default()
                        .push((path.clone(), i + 1));
                }
                None => unmarked.push(format!("{path}, line {}: after {marker:?}", i + 1)),
            }
        }
    }
    assert!(
        unmarked.is_empty(),
        "shell blocks no test runs (mark each with the marker its test reads): {unmarked:?}"
    );
    for (marker, _, several) in MARKERS {
        let places = marked.get(marker).map_or(&[][..], Vec::as_slice);
        assert!(!places.is_empty(), "no document marks a block {marker}");
        assert!(
            several || places.len() == 1,
            "{marker} marks one block, in one document; it marks {places:?}"
        );
    }
    // The two set-up commands are the README's own.
    for marker in ["<!-- readme-command-1 -->", "<!-- readme-command-2 -->"] {
        assert_eq!(marked[marker][0].0, "README.md", "{marker} left the README");
    }
}

/// The README is where a user starts (issue 34): at most 400 lines; the guides live in
/// `docs/`, each linked from it.
#[test]
fn the_readme_stays_short_and_links_every_guide() {
    let documents = common::documents();
    let (_, readme) = &documents[0];
    let lines = readme.lines().count();
    assert!(
        lines <= 400,
        "README.md has {lines} lines, more than 400: move a guide to docs/ and link it from the \
         README's Guides"
    );
    let linked: Vec<String> = links(readme)
        .into_iter()
        .map(|(target, _)| target)
        .collect();
    for (path, _) in &documents[1..] {
        assert!(
            linked.iter().any(|target| target == path),
            "README.md does not link {path}"
        );
    }
}

/// Every relative link of the README and of `docs/*.md` names a file that exists, and its
/// `#anchor`, if any, a heading of that file (as GitHub makes anchors from headings).
#[test]
fn every_relative_link_of_the_documents_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let documents = common::documents();
    let mut broken = Vec::new();
    let mut checked = 0;
    for (path, text) in &documents {
        let dir = Path::new(path).parent().unwrap();
        for (target, anchor) in links(text) {
            checked += 1;
            let file = if target.is_empty() {
                Path::new(path).to_path_buf()
            } else {
                normalise(&dir.join(&target))
            };
            if !root.join(&file).exists() {
                broken.push(format!("{path}: ({target}) names no file"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            let headings = match std::fs::read_to_string(root.join(&file)) {
                Ok(text) if file.extension().is_some_and(|e| e == "md") => anchors(&text),
                _ => Vec::new(),
            };
            if !headings.contains(&anchor) {
                broken.push(format!(
                    "{path}: ({target}#{anchor}) names no heading of {}; its anchors: {headings:?}",
                    file.display()
                ));
            }
        }
    }
    assert!(checked >= documents.len(), "only {checked} links found");
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

/// `a/../b` as `b`: a link from `docs/` to `../README.md` names `README.md`.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                assert!(out.pop(), "{} leaves the repository", path.display());
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The relative links of a Markdown document, as (path, anchor): every `](target)` outside
/// code, but for URLs with a scheme. `#anchor` alone is ("", Some(anchor)).
fn links(markdown: &str) -> Vec<(String, Option<String>)> {
    let prose = prose(markdown);
    prose
        .split("](")
        .skip(1)
        .filter_map(|rest| {
            let target = rest.split([')', ' ', '\n']).next().unwrap_or_default();
            if target.contains("://") || target.starts_with("mailto:") {
                return None;
            }
            Some(match target.split_once('#') {
                Some((file, anchor)) => (file.to_owned(), Some(anchor.to_owned())),
                None => (target.to_owned(), None),
            })
        })
        .collect()
}

/// The anchors GitHub gives a Markdown document's headings: the heading's text (code spans,
/// emphasis and links reduced to their text) lowercased, every character but letters, digits,
/// `-`, `_` and spaces dropped, spaces turned into `-`; a repeated anchor gets `-1`, `-2`, ….
fn anchors(markdown: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = Vec::new();
    for line in prose_lines(markdown) {
        let trimmed = line.trim_start_matches('#');
        let level = line.len() - trimmed.len();
        if !(1..=6).contains(&level) || !trimmed.starts_with(' ') || line.starts_with(' ') {
            continue;
        }
        let text = without_links(trimmed.trim().trim_end_matches('#'));
        let slug: String = text
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        anchors.push(match *n {
            0 => slug.clone(),
            n => format!("{slug}-{n}"),
        });
        *n += 1;
    }
    anchors
}

/// `[text](target)` as `text`; backquotes and `*` dropped.
fn without_links(heading: &str) -> String {
    let mut out = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some((text, after)) = rest[open + 1..].split_once("](") else {
            break;
        };
        let Some(close) = after.find(')') else { break };
        out.push_str(&rest[..open]);
        out.push_str(text);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out.replace(['`', '*'], "")
}

/// The lines of a Markdown document outside fenced code blocks.
fn prose_lines(markdown: &str) -> Vec<&str> {
    let mut in_code = false;
    markdown
        .lines()
        .filter(|line| {
            let fence = line.trim_start().starts_with("```");
            if fence {
                in_code = !in_code;
            }
            !fence && !in_code
        })
        .collect()
}

/// A Markdown document outside code: fenced blocks dropped, inline code spans (which may run
/// over lines, and be delimited by several backquotes) blanked.
fn prose(markdown: &str) -> String {
    let text = prose_lines(markdown).join("\n");
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find('`') {
        let ticks = rest[start..].len() - rest[start..].trim_start_matches('`').len();
        let delimiter = &rest[start..start + ticks];
        let after = &rest[start + ticks..];
        // A span ends at the next run of exactly as many backquotes.
        let mut end = None;
        let mut from = 0;
        while let Some(at) = after[from..].find(delimiter) {
            let at = from + at;
            let run = after[at..].len() - after[at..].trim_start_matches('`').len();
            if run == ticks {
                end = Some(at);
                break;
            }
            from = at + run;
        }
        out.push_str(&rest[..start]);
        match end {
            Some(end) => {
                out.push(' ');
                rest = &after[end + ticks..];
            }
            None => {
                out.push_str(delimiter);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A variable cargo or nextest sets for a test binary, not one of the user's (CARGO_HOME,
/// CARGO_TARGET_DIR and the like stay).
fn harness_cargo_variable(name: &str) -> bool {
    [
        "CARGO_PKG_",
        "CARGO_BIN_EXE_",
        "CARGO_MANIFEST_",
        "CARGO_CRATE_",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
    ]
    .iter()
    .any(|prefix| name.starts_with(prefix))
}
