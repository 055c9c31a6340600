//! What a person sees who types too little (issue 35, item 7): `fence` alone prints the help as
//! it is laid out for reading, on stderr, and exits 2 (a usage error, nothing done); counts in
//! sentences agree with their nouns.

use crate::common;

use common::{Backend, Store};

#[test]
fn fence_alone_prints_the_help_laid_out_on_stderr_and_exits_2() {
    let home = tempfile::tempdir().unwrap();
    let out = common::Fence::bare(home.path()).run().expect(2);
    assert_eq!(out.stdout, "", "nothing on stdout: {out:?}");
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert!(
        lines.len() > 20,
        "the help, one line per entry, not one line: {out:?}"
    );
    assert!(
        lines.iter().all(|line| line.chars().count() <= 100),
        "laid out for a terminal: {out:?}"
    );
    assert!(
        out.stderr.contains("Usage: fence [OPTIONS] <COMMAND>"),
        "{out:?}"
    );
    for command in ["acquire", "run", "write", "log", "doctor"] {
        assert!(
            lines
                .iter()
                .any(|line| line.trim_start().starts_with(&format!("{command} "))),
            "`{command}` on a line of its own: {out:?}"
        );
    }
    // Asked for JSON, a script still gets one object naming the missing command.
    let out = common::Fence::bare(home.path())
        .args(["--format", "json"])
        .run()
        .expect(2);
    let answer = out.json();
    assert_eq!(answer["error"], "usage", "{out:?}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("requires a subcommand"),
        "{out:?}"
    );
}

#[test]
fn prune_counts_agree_with_their_nouns() {
    let store = Store::new(Backend::Postgres);
    store
        .fence()
        .args(["acquire", "one", "--owner", "a", "--ttl", "1m"])
        .run()
        .expect(0);
    let out = store
        .fence()
        .args(["prune", "--older-than", "0s"])
        .run()
        .expect(0);
    assert!(
        out.stdout.contains(" of 1 resource,") || out.stdout.contains(" of 1 resource "),
        "one resource, singular: {out:?}"
    );
    assert!(
        !out.stdout.contains(" 1 resources") && !out.stdout.contains(" 1 events"),
        "{out:?}"
    );
}

/// The man pages are ASCII: `man` under the C locale (cron's, a minimal container's) drops
/// "…" and warns `can't find special character` for each one (issue 35, item 7); groff's named
/// characters (`\(em`) render everywhere.
#[test]
fn the_man_pages_read_the_same_in_the_c_locale() {
    let man = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("man");
    let mut pages = 0;
    for entry in std::fs::read_dir(&man).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let odd: Vec<(usize, char)> = text
            .lines()
            .enumerate()
            .flat_map(|(n, line)| {
                line.chars()
                    .filter(|c| !c.is_ascii())
                    .map(move |c| (n + 1, c))
            })
            .collect();
        assert!(odd.is_empty(), "{}: not ASCII at {odd:?}", path.display());
        pages += 1;
    }
    assert!(pages >= 15, "{pages} man pages");
}
