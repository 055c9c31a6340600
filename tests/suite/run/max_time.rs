//! A hung job is boundable (issue 35, item 4): `fence run --max-time D` stops a command that
//! has run for D (SIGTERM to everything it started, SIGKILL after `--kill-after`), releases
//! the lease so that the next run need not wait for the TTL, and exits 124 as timeout(1) does,
//! with the reason `max_time` in the JSON answer and the metrics file. On every coordinator.
//! A command that ends in time keeps its own status.

use crate::common;

use std::path::Path;

use common::{wait_for, Store};

/// The command: writes its pid, then sleeps far past the bound (ignoring SIGTERM if asked).
fn hanging(dir: &Path, ignore_term: bool) -> String {
    format!(
        "{}echo $$ > '{}'; sleep 300 & wait",
        if ignore_term { "trap '' TERM; " } else { "" },
        dir.join("pid").display()
    )
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| !stat.contains(") Z "))
            .unwrap_or(false)
}

fn a_command_past_max_time_is_stopped_and_the_lease_released(store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("run.prom");
    let out = store
        .fence()
        .args([
            "run",
            "job",
            "--ttl",
            "20s",
            "--max-time",
            "2s",
            "--kill-after",
            "1s",
        ])
        .args(["--format", "json", "--metrics-file"])
        .args([&metrics])
        .args(["--", "sh", "-c", &hanging(dir.path(), true)])
        .run();
    assert_eq!(out.code, 124, "exit 124, as timeout(1): {out:?}");
    let json = out.json();
    assert_eq!(json["stopped"], "max_time", "{json}");
    assert!(
        out.stderr.contains("--max-time"),
        "says why it stopped the command: {out:?}"
    );
    let pid: u32 = std::fs::read_to_string(dir.path().join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_for(
        "the command (which ignored SIGTERM) to be gone",
        std::time::Duration::from_secs(10),
        || !alive(pid),
    );
    let prom = std::fs::read_to_string(&metrics).unwrap();
    assert!(prom.contains("reason=\"max_time\""), "{prom}");
    // Released, not left to expire: another owner gets it at once.
    store
        .fence()
        .args(["acquire", "job", "--owner", "next", "--ttl", "1m"])
        .run()
        .expect(0);
    let events = store.events("job");
    assert!(
        events.iter().any(|(kind, _, _)| kind == "released"),
        "{events:?}"
    );
}

fn a_command_that_ends_in_time_keeps_its_status(store: &Store) {
    store
        .fence()
        .args([
            "run",
            "job",
            "--ttl",
            "20s",
            "--max-time",
            "1m",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .run()
        .expect(3);
}

per_coordinator!(
    a_command_past_max_time_is_stopped_and_the_lease_released,
    a_command_that_ends_in_time_keeps_its_status
);

#[test]
fn max_time_is_refused_when_it_is_not_a_duration() {
    let store = Store::new(common::Backend::File);
    let out = store
        .fence()
        .args(["run", "job", "--max-time", "soon", "--", "true"])
        .run()
        .expect(2);
    assert!(out.stderr.contains("--max-time"), "{out:?}");
    assert!(store.events("job").is_empty(), "nothing ran");
}

/// What the command left running when it ended gets SIGTERM and then the whole `--kill-after`
/// before SIGKILL, however long ago fence's supervision loop last woke up (a renewal every
/// third of a 30 s TTL). It got less once: the grace was counted from the loop's last turn,
/// so a leftover that ignored SIGTERM was killed at once. The leftover stamps the time
/// every 100 ms; its last stamp comes `--kill-after` after the command ended, or later.
#[test]
fn leftovers_get_the_whole_kill_after() {
    let store = Store::new(common::Backend::File);
    let dir = tempfile::tempdir().unwrap();
    let stamps = dir.path().join("stamps");
    let ended = dir.path().join("ended");
    // The command ends only once its leftover ignores SIGTERM (its first stamp is written
    // after the trap): on a loaded machine the leftover may not have run a line yet when the
    // command exits, and a SIGTERM then would end it at once, whatever fence's grace.
    let script = format!(
        "sleep 4; (trap '' TERM; while :; do date +%s%N >> '{stamps}'; sleep 0.1; done) & \
         while [ ! -s '{stamps}' ]; do sleep 0.01; done; date +%s%N > '{ended}'; exit 0",
        stamps = stamps.display(),
        ended = ended.display()
    );
    let out = store
        .fence()
        .args(["run", "job", "--ttl", "30s", "--kill-after", "3s", "--"])
        .args(["sh", "-c", &script])
        .run()
        .expect(0);
    assert!(
        out.stderr
            .contains("note: the command left processes running when it ended"),
        "the stop is not silent: {out:?}"
    );
    let ended: i128 = std::fs::read_to_string(&ended)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let last: i128 = std::fs::read_to_string(&stamps)
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .parse()
        .unwrap();
    // A lower bound: a loaded machine only makes the leftover live longer.
    assert!(
        last - ended >= 2_700_000_000,
        "the leftover was killed {:.2}s after the command ended, before --kill-after 3s",
        (last - ended) as f64 / 1e9
    );
}

/// `ps` names the supervisor `fence __reaper …` (its argv[0] is `fence`), not
/// `/proc/self/exe __reaper …` (issue 35, item 7): the command's parent is the supervisor.
#[test]
fn ps_shows_the_supervisor_as_fence() {
    let store = Store::new(common::Backend::File);
    let out = store
        .fence()
        .args([
            "run",
            "job",
            "--",
            "sh",
            "-c",
            "tr '\\0' ' ' < /proc/$PPID/cmdline",
        ])
        .run()
        .expect(0);
    assert!(out.stdout.starts_with("fence __reaper "), "{out:?}");
}

/// The supervisor is forked, not a program of its own, and takes its title over its arguments
/// and its environment (as setproctitle does), which it copies away first: the command still
/// gets the caller's environment whole, byte for byte, an empty value, one with `=` and a
/// newline and bytes that are not UTF-8, one of 100 kB, and an entry whose name starts with
/// `=` (as Windows-born environments have; rebuilding the environment with `setenv` panicked
/// on it, and nothing ran).
#[test]
fn the_command_gets_the_callers_environment_whole() {
    use std::os::unix::ffi::OsStrExt;
    let store = Store::new(common::Backend::File);
    let odd: &[u8] = b"a=b c\n\xff\xfe end";
    let long = "x".repeat(100_000);
    // `env -0` itself, not through a shell (dash leaves out a name that starts with `=`).
    let out = common::clean_command(common::fence_bin(), store.home.path())
        .env("ODD_VALUE", std::ffi::OsStr::from_bytes(odd))
        .env("EMPTY_VALUE", "")
        .env("LONG_VALUE", &long)
        .env("=C:", "C:\\odd")
        .args(["--store", &store.url, "run", "job", "--", "env", "-0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let entries: Vec<&[u8]> = out.stdout.split(|b| *b == 0).collect();
    let mut odd_entry = b"ODD_VALUE=".to_vec();
    odd_entry.extend_from_slice(odd);
    for want in [
        odd_entry,
        b"EMPTY_VALUE=".to_vec(),
        format!("LONG_VALUE={long}").into_bytes(),
        format!("HOME={}", store.home.path().display()).into_bytes(),
        b"FENCE_RESOURCE=job".to_vec(),
        b"=C:=C:\\odd".to_vec(),
    ] {
        assert!(
            entries.contains(&&want[..]),
            "{} missing from the command's environment",
            String::from_utf8_lossy(&want[..want.len().min(40)])
        );
    }
}

/// An environment of 30,000 variables is copied in linear time (rebuilding it with `setenv`
/// took seconds, under load past the supervisor's answer's deadline: `supervisor_lost`, the
/// command never ran), under a 3 s TTL.
#[test]
fn a_run_with_thirty_thousand_variables_runs_its_command() {
    let store = Store::new(common::Backend::File);
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let mut fence = store.fence();
    for i in 0..30_000 {
        fence = fence.env(&format!("MANY_{i}"), "x");
    }
    fence
        .args(["run", "job", "--ttl", "3s", "--", "sh", "-c"])
        .args([format!("echo \"$MANY_29999\" > '{}'", ran.display())])
        .run()
        .expect(0);
    assert_eq!(std::fs::read_to_string(&ran).unwrap(), "x\n");
}

/// A title longer than fence's arguments and environment together (a short argv[0], a
/// command line shorter than the supervisor's numbers, an environment of one variable) is
/// cut to that space, never past it, and the run is whole.
#[test]
fn a_title_longer_than_its_space_is_cut() {
    use std::os::unix::process::CommandExt;
    let home = tempfile::tempdir().unwrap();
    let script = "tr '\\0' ' ' < /proc/$PPID/cmdline";
    let args = ["run", "j", "--", "/bin/sh", "-c", script];
    let out = std::process::Command::new(common::fence_bin())
        .arg0("f")
        .env_clear()
        .env("HOME", home.path())
        .args(args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.starts_with("fence __reaper "), "{shown:?}");
    // Each argument and the one variable with its NUL, less the NUL that ends the title.
    let space = "f".len()
        + 1
        + args.iter().map(|a| a.len() + 1).sum::<usize>()
        + format!("HOME={}", home.path().display()).len()
        + 1;
    // The kernel reads a title past the arguments up to its NUL, which `tr` turned into a
    // space.
    let title = shown.strip_suffix(' ').unwrap_or(&shown);
    assert_eq!(title.len(), space - 1, "{shown:?}");
    assert!(!title.ends_with("cmdline"), "not cut: {shown:?}");
}
