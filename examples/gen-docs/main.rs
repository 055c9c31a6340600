//! `cargo run --example gen-docs`: rewrites the generated files (completions, man pages, the
//! README's exit-code table) after a change to `src/cli.rs` or `src/exit.rs`, and removes
//! generated files that no longer belong. `tests/suite/cli/generated.rs` fails until this has been run.

mod docs;

use std::path::Path;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let generated = docs::generate();
    for (rel, contents) in &generated {
        let path = root.join(rel);
        if std::fs::read(&path).ok().as_ref() != Some(contents) {
            std::fs::create_dir_all(path.parent().expect("files live in a directory"))
                .unwrap_or_else(|err| panic!("creating the directory of {}: {err}", rel.display()));
            std::fs::write(&path, contents)
                .unwrap_or_else(|err| panic!("writing {}: {err}", rel.display()));
            println!("wrote {}", rel.display());
        }
    }
    for rel in docs::stale(root, &generated) {
        std::fs::remove_file(root.join(&rel))
            .unwrap_or_else(|err| panic!("removing {}: {err}", rel.display()));
        println!("removed {}", rel.display());
    }
    let path = root.join("README.md");
    let readme = std::fs::read_to_string(&path).expect("README.md is readable");
    let updated = docs::readme_with_exit_table(&readme).unwrap_or_else(|why| panic!("{why}"));
    if updated != readme {
        std::fs::write(&path, updated).expect("README.md is writable");
        println!("wrote README.md (exit codes)");
    }
}
