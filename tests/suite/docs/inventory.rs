//! docs/DESIGN.md §12, the assumption inventory, names for each assumption the tests that hold
//! it (a file of this suite, then test names). A renamed or deleted test must not leave the
//! inventory pointing at nothing: every file it names exists under `tests/suite/`, and every
//! test name after a file is a test function in that file (`s3_…` names a family by its start).
//! A file under `src/` (`src/sys.rs`) names that module's own unit tests.
//! A line without a test says so (`none: …`, or a document that holds the limit).

use std::path::Path;

/// The inventory's rows: (the assumption, its test column).
fn inventory_rows() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(root.join("docs/DESIGN.md")).unwrap();
    let start = design
        .find("## 12. Assumption inventory")
        .expect("DESIGN.md has §12");
    let end = start + design[start..].find("\n## 13.").expect("§13 follows §12");
    design[start..end]
        .lines()
        .filter(|line| line.starts_with('|') && !line.starts_with("|---"))
        .map(|line| {
            let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
            (
                cells[0].trim().to_string(),
                cells.last().unwrap().trim().to_string(),
            )
        })
        .filter(|(first, _)| first != "Assumption")
        .collect()
}

/// The backticked words of a cell, in order.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

fn test_functions(source: &str) -> Vec<String> {
    source
        .split("fn ")
        .skip(1)
        .filter_map(|rest| rest.split(['(', '<', ' ']).next())
        .map(str::to_string)
        .collect()
}

#[test]
fn every_test_the_assumption_inventory_names_exists() {
    let suite = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/suite");
    let rows = inventory_rows();
    assert!(rows.len() >= 30, "the inventory has {} rows", rows.len());
    let mut missing = Vec::new();
    for (assumption, tests) in &rows {
        let spans = code_spans(tests);
        if !spans.iter().any(|span| span.ends_with(".rs")) {
            assert!(
                tests.starts_with("none") || tests.contains(".md"),
                "the inventory line {assumption:?} names no test and says nothing of why: {tests:?}"
            );
            continue;
        }
        let mut functions: Vec<String> = Vec::new();
        let mut file = String::new();
        for span in spans {
            if span.ends_with(".rs") {
                file = span.to_string();
                let at = if span.starts_with("src/") {
                    Path::new(env!("CARGO_MANIFEST_DIR")).join(span)
                } else {
                    suite.join(span)
                };
                match std::fs::read_to_string(at) {
                    Ok(source) => functions = test_functions(&source),
                    Err(err) => {
                        missing.push(format!("{assumption:?}: tests/suite/{span}: {err}"));
                        functions.clear();
                    }
                }
            } else if span
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '…')
                && span.contains('_')
            {
                let found = match span.split_once('…') {
                    Some((start, _)) => functions.iter().any(|f| f.starts_with(start)),
                    None => functions.iter().any(|f| f == span),
                };
                if !found {
                    missing.push(format!(
                        "{assumption:?}: no test {span} in tests/suite/{file}"
                    ));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/DESIGN.md §12 names tests that do not exist:\n{}",
        missing.join("\n")
    );
}

/// docs/DESIGN.md §11, the source map, names every file under `src/` (a `mod.rs` by its
/// folder), so the map a maintainer reads first is the code as it is.
#[test]
fn the_source_map_names_every_source_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(root.join("docs/DESIGN.md")).unwrap();
    let start = design.find("## 11. Source map").expect("DESIGN.md has §11");
    let end = start + design[start..].find("\n## 12.").expect("§12 follows §11");
    let map = &design[start..end];
    let mut unnamed = Vec::new();
    let mut folders = vec![root.join("src")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let named = if name == "mod.rs" {
                let parent = path
                    .parent()
                    .unwrap()
                    .file_name()
                    .unwrap()
                    .to_string_lossy();
                map.contains(&format!("{parent}/"))
            } else {
                map.contains(&name)
            };
            if !named {
                unnamed.push(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    unnamed.sort();
    assert!(
        unnamed.is_empty(),
        "docs/DESIGN.md §11 does not name these source files:\n{}",
        unnamed.join("\n")
    );
}
