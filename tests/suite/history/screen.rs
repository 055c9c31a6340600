//! Output fits the screen (issue 35, item 5): on a 100-column terminal (a real pty, made by
//! `script`), no line `log`, `inspect` or `doctor` prints is longer than 100 characters, long
//! names and owners included; piped, each row stays on one line (stable columns for `grep` and
//! `cut`), and `--format json` keeps every value whole.

use crate::common;

use common::{Backend, Store};

const LONG_RESOURCE: &str = "a-resource-whose-name-is-far-longer-than-any-column-can-show-at-once";
const LONG_OWNER: &str = "cron@a-host-with-a-long-name.example.internal/nightly-report-writer";

/// Runs `fence ARGS` in a pty of 100 columns and 50 rows; returns what it printed.
fn on_a_terminal(store: &Store, args: &str) -> String {
    let line = format!(
        "stty rows 50 cols 100; exec '{}' --store '{}' {args}",
        common::fence_bin().to_string_lossy(),
        store.url
    );
    let out = common::clean_command("script", store.home.path())
        .args(["-qec", &line, "/dev/null"])
        .output()
        .expect("script(1) runs");
    String::from_utf8_lossy(&out.stdout).replace('\r', "")
}

fn longest_line(text: &str) -> usize {
    text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
}

#[test]
fn log_inspect_and_doctor_fit_a_100_column_terminal() {
    let store = Store::new(Backend::File);
    for n in 0..3 {
        store
            .fence()
            .args([
                "acquire",
                &format!("{LONG_RESOURCE}-{n}"),
                "--owner",
                LONG_OWNER,
            ])
            .args(["--ttl", "10m"])
            .run()
            .expect(0);
    }
    for args in ["log", "inspect", "inspect --history 5", "doctor"] {
        let shown = on_a_terminal(&store, args);
        // `log` prints an event per line where its table's cells would wrap into narrow
        // columns; `inspect` keeps its table.
        let printed = match args {
            "doctor" => true,
            "log" => shown.matches(" token 1").count() == 3 && !shown.contains('┆'),
            _ => shown.contains("┆ 1 "),
        };
        assert!(
            printed,
            "`fence {args}` printed its events (token 1 in a column or field of its own): {shown}"
        );
        assert!(
            shown.lines().count() > 3,
            "`fence {args}` printed something: {shown}"
        );
        assert!(
            longest_line(&shown) <= 100,
            "`fence {args}` on a 100-column terminal printed a line of {}:\n{shown}",
            longest_line(&shown)
        );
    }

    // Piped: one line per row, whatever the width, and JSON keeps the values whole.
    let out = store.fence().args(["log"]).run().expect(0);
    let rows: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.contains(LONG_RESOURCE))
        .collect();
    assert_eq!(rows.len(), 3, "one line per event: {}", out.stdout);
    assert!(
        rows.iter().all(|row| row.contains(LONG_OWNER)),
        "{}",
        out.stdout
    );
    let out = store
        .fence()
        .args(["log", "--format", "json"])
        .run()
        .expect(0);
    assert!(out.stdout.contains(LONG_OWNER), "{}", out.stdout);
}
