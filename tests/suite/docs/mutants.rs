//! tests/mutants: the patches that bring back fixed bugs (`tests/mutants/run` applies each and
//! shows the suite catching it). A patch that no longer applies catches nothing and says
//! nothing, so every patch must still apply to the source as it is, and say which tests judge
//! it; and every mutant the design names must exist.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The names of tests/mutants/*.patch, without `.patch`.
fn patches() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root().join("tests/mutants"))
        .unwrap()
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".patch").map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

#[test]
fn every_mutant_still_applies_and_names_its_tests() {
    let names = patches();
    assert!(names.len() >= 40, "only {} mutants", names.len());
    let mut broken = Vec::new();
    for name in &names {
        let path = root().join(format!("tests/mutants/{name}.patch"));
        let text = std::fs::read_to_string(&path).unwrap();
        if !text.starts_with("tests: ") && !text.starts_with("lib: ") {
            broken.push(format!(
                "{name}: its first line is neither `tests: FILTERSET` nor `lib: FILTER`"
            ));
        }
        let check = Command::new("git")
            .current_dir(root())
            .args(["apply", "--check"])
            .arg(&path)
            .output()
            .expect("git runs");
        if !check.status.success() {
            broken.push(format!(
                "{name}: does not apply ({}); regenerate it against the code as it is",
                String::from_utf8_lossy(&check.stderr).trim()
            ));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The names in "mutant `a`" and "mutants `a`, `b` and `c`" of `text`.
fn named_mutants(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in text.match_indices("mutant") {
        let mut rest = &text[at + "mutant".len()..];
        rest = rest.strip_prefix('s').unwrap_or(rest);
        let Some(mut list) = rest.strip_prefix(" `") else {
            continue;
        };
        while let Some((name, after)) = list.split_once('`') {
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            {
                break;
            }
            names.push(name.to_string());
            match [", `", " and `"]
                .iter()
                .find_map(|sep| after.strip_prefix(sep))
            {
                Some(next) => list = next,
                None => break,
            }
        }
    }
    names
}

#[test]
fn every_mutant_the_design_names_exists() {
    let design = std::fs::read_to_string(root().join("docs/DESIGN.md")).unwrap();
    let named = named_mutants(&design);
    assert!(named.len() >= 15, "DESIGN.md names {} mutants", named.len());
    let patches = patches();
    let missing: Vec<&String> = named.iter().filter(|n| !patches.contains(n)).collect();
    assert!(
        missing.is_empty(),
        "docs/DESIGN.md names mutants that tests/mutants does not have: {missing:?}"
    );
    assert_eq!(
        named_mutants("mutants `a-b`, `c` and `d-e` (mutant `f`); mutant x"),
        ["a-b", "c", "d-e", "f"]
    );
}
