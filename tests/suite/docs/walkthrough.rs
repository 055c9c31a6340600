//! The README's incident walkthrough is a real `fence log` of a stopped run (issue 35): this
//! test plays the story — cron job A runs long, A's fence is paused (SIGSTOP), its supervisor
//! stops the job at the lease's bound, cron job B's run takes the lease over and finishes, A's
//! fence wakes and records the stop — and reads `fence log nightly-report` on a
//! 100-column terminal (a real pty, through `script`), as on-call would. The README's block
//! (after `<!-- walkthrough -->`) must be that output, up to what differs from run to run
//! (times, pids, random ids, durations, the number of renewals, table widths). With
//! `FENCE_UPDATE_WALKTHROUGH=1` the test writes its output into the README instead.

use crate::common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use common::process::kill;
use common::{wait_for, wait_output};

const MARKER: &str = "<!-- walkthrough -->";
const COMMAND: &str = "$ fence log nightly-report";

/// `fence ARGS` as cron runs it: the default store under `home`, in `dir`.
fn fence(home: &Path, dir: &Path, args: &[&str]) -> std::process::Command {
    let mut cmd = common::clean_command(common::fence_bin(), home);
    cmd.current_dir(dir).args(args);
    cmd
}

fn spawn_job(home: &Path, dir: &Path, owner: &str, work: &str) -> Child {
    fence(
        home,
        dir,
        &[
            "run",
            "nightly-report",
            "--owner",
            owner,
            "--ttl",
            "3s",
            "--",
            "./publish.sh",
        ],
    )
    .env("WORK", work)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap()
}

/// The story, then `fence log nightly-report` on a 100-column pty, with the home directory
/// replaced by the README's.
fn play() -> String {
    let home = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("publish.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n: > \"started-$FENCE_TOKEN\"\nsleep \"$WORK\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // Job A: a long one.
    let a = spawn_job(home.path(), dir.path(), "cron-a", "300");
    wait_for("A's job to start", Duration::from_secs(30), || {
        dir.path().join("started-1").exists()
    });
    kill(a.id(), libc::SIGSTOP);
    // A's lease runs out while its fence is paused: its supervisor stopped the job by then.
    wait_for("A's lease to expire", Duration::from_secs(60), || {
        let out = fence(
            home.path(),
            dir.path(),
            &["inspect", "nightly-report", "--format", "json"],
        )
        .output()
        .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .is_ok_and(|v| v["resources"][0]["state"] == "expired")
    });
    // Job B, the next cron turn, runs and finishes.
    let b = spawn_job(home.path(), dir.path(), "cron-b", "0");
    let b = wait_output("B's run", b, Duration::from_secs(60));
    assert_eq!(b.status.code(), Some(0), "{b:?}");
    // A's fence wakes: the lease was lost, the job stopped.
    kill(a.id(), libc::SIGCONT);
    let a = wait_output("A's run", a, Duration::from_secs(60));
    assert_eq!(a.status.code(), Some(5), "{a:?}");
    let line = format!(
        "stty rows 60 cols 100; exec '{}' log nightly-report",
        common::fence_bin().to_string_lossy()
    );
    let out = common::clean_command("script", home.path())
        .current_dir(dir.path())
        .args(["-qec", &line, "/dev/null"])
        .output()
        .expect("script(1) runs");
    String::from_utf8_lossy(&out.stdout)
        .replace('\r', "")
        .replace(&home.path().display().to_string(), "/home/cron")
}

/// The events: on a terminal too narrow for the table, `fence log` prints each event's time,
/// resource, kind, owner and token on a line (two spaces apart), and its lease and detail
/// indented below (wrapped). Each event as its fields and the rest without whitespace,
/// `renewed` ones left out, the name of the host the README's run was on (`on vm,`) and this
/// one's alike.
fn rows(shown: &str) -> Vec<Vec<String>> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let here = format!("on{},", host.trim());
    let mut rows: Vec<Vec<String>> = Vec::new();
    for line in shown.lines().skip(1) {
        if line.starts_with(' ') {
            let rest: String = line.chars().filter(|c| !c.is_whitespace()).collect();
            if let Some(row) = rows.last_mut() {
                row.last_mut().unwrap().push_str(&rest);
            }
        } else if !line.trim().is_empty() {
            let mut row: Vec<String> = line.split("  ").map(str::to_owned).collect();
            row.push(String::new());
            rows.push(row);
        }
    }
    // How many renewals a run gets in before its fence is paused, and how many refused ones
    // it sends once continued, depends on the machine's load: those rows are left out.
    rows.retain(|row| {
        row.get(2)
            .is_none_or(|event| event != "renewed" && event != "renew_rejected")
    });
    rows.iter()
        .map(|row| {
            row.iter()
                .map(|cell| {
                    normalise(&cell.replace(&here, "on_host,").replace("onvm,", "on_host,"))
                })
                .collect()
        })
        .collect()
}

/// What differs from run to run: runs of 8 or more hex digits (ids, digests) become `H`,
/// other digits `#`, a duration (`215ms`, `2.0s`, `1m 2s`) `D`, and whether the stopped job
/// ended before or after the lease's bound (before, unless the machine is starved).
fn normalise(cell: &str) -> String {
    let chars: Vec<char> = cell.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let hex = chars[i..]
            .iter()
            .take_while(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
            .count();
        if hex >= 8 {
            out.push('H');
            i += hex;
            continue;
        }
        if chars[i].is_ascii_digit() {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push(chars[i]);
        }
        i += 1;
    }
    out.replace("#.#s", "D")
        .replace("#ms", "D")
        .replace("#m#s", "D")
        .replace("#s", "D")
        .replace("Dafterthelease's", "Dbeforethelease's")
}

/// The README's block: its lines between the ```text fences after the marker.
fn readme_block(readme: &str) -> Option<(usize, usize)> {
    let lines: Vec<&str> = readme.lines().collect();
    let at = lines.iter().position(|l| l.trim() == MARKER)?;
    let open = at + 1 + lines[at + 1..].iter().position(|l| l.starts_with("```"))?;
    let close = open
        + 1
        + lines[open + 1..]
            .iter()
            .position(|l| l.starts_with("```"))?;
    Some((open + 1, close))
}

#[test]
fn the_readme_shows_a_real_log_of_a_stopped_run() {
    let shown = play();
    let table = rows(&shown);
    let events: Vec<&str> = table.iter().map(|row| row[2].as_str()).collect();
    assert_eq!(
        events,
        [
            "acquired",
            "run_started",
            "expired",
            "taken_over",
            "run_started",
            "run_finished",
            "released",
            "run_stopped"
        ],
        "{shown}"
    );
    assert!(
        shown.contains("SIGTERM") && shown.contains("the lease's bound"),
        "{shown}"
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let (from, to) =
        readme_block(&readme).expect("README.md has a ```text block after <!-- walkthrough -->");
    let lines: Vec<&str> = readme.lines().collect();
    if std::env::var_os("FENCE_UPDATE_WALKTHROUGH").is_some() {
        let mut text: Vec<String> = lines[..from].iter().map(|l| (*l).to_owned()).collect();
        text.push(COMMAND.to_owned());
        text.extend(shown.trim_end().lines().map(str::to_owned));
        text.extend(lines[to..].iter().map(|l| (*l).to_owned()));
        std::fs::write(&path, text.join("\n") + "\n").unwrap();
        return;
    }
    assert_eq!(
        lines[from], COMMAND,
        "the block starts with the command it shows"
    );
    let block = lines[from + 1..to].join("\n");
    assert_eq!(
        rows(&block),
        table,
        "the README's walkthrough (after {MARKER}) is not what `fence log` prints now; \
         rewrite it with FENCE_UPDATE_WALKTHROUGH=1 tests/run -E 'test(/^docs::walkthrough/)'.\n\
         Now:\n{shown}"
    );
    let header = |text: &str| text.lines().next().map(normalise);
    assert_eq!(header(&block), header(&shown));
}
