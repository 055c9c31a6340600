//! `fence run` contains its command: nothing the command started writes after the lease could
//! have been granted to another owner, whichever of fence and its supervisor (`fence
//! __reaper`) is paused, stopped or killed, and whatever the command does to escape (ignore
//! SIGTERM, `setsid`, a double fork, `kill -STOP $PPID`).
//!
//! The commands append a wall-clock timestamp (`date +%s%N`) to a file every ~20 ms; the tests
//! compare those with the instant another owner's acquire was sent, and with the lease's
//! expiry as the store recorded it. Every command names its directory (an absolute path) on
//! its command line, so that every process of a run (fence, the reaper, the command, its
//! daemons) is found in /proc by that path, and killed should the test fail.
//!
//! `tests/mutants/` holds patches that bring back the bugs these tests guard against;
//! `tests/mutants/run` checks that each is caught.

use crate::common;
use crate::common::hung_fuse;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::process::{becomes, is_gone, kill, processes_with, read_pid};
use common::{timestamp_ms, wait_for, wait_output, Store};

/// A run's directory: the command's files, and the marker of its processes.
struct RunDir {
    dir: tempfile::TempDir,
}

impl RunDir {
    fn new() -> RunDir {
        RunDir {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The absolute path of `name` in the directory, as a shell word.
    fn file(&self, name: &str) -> String {
        let path: PathBuf = self.path().join(name);
        let text = path.to_str().unwrap().to_owned();
        assert!(!text.contains('\''), "{text}");
        text
    }

    /// The processes of this run that are still there (the path is on their command lines).
    fn processes(&self) -> Vec<u32> {
        processes_with(self.path().to_str().unwrap())
    }

    /// The timestamps (ns since the epoch) the command wrote to `name`, whole lines only.
    fn stamps(&self, name: &str) -> Vec<i128> {
        let text = std::fs::read_to_string(self.path().join(name)).unwrap_or_default();
        let whole = match text.rfind('\n') {
            Some(end) => &text[..end],
            None => "",
        };
        whole
            .lines()
            .map(|l| {
                l.trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("{name}: {l:?}: {e}"))
            })
            .collect()
    }
}

impl Drop for RunDir {
    /// Whatever the outcome, nothing of the run outlives the test: a paused fence included.
    fn drop(&mut self) {
        for pid in self.processes() {
            kill(pid, libc::SIGKILL);
            kill(pid, libc::SIGCONT);
        }
    }
}

/// Now, by the wall clock, in ns since the epoch (what `date +%s%N` prints).
fn wall_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128
}

/// `fence run job ARGS --format json -- sh -c SCRIPT` in the run's directory.
fn spawn_run(store: &Store, args: &[&str], script: &str, dir: &RunDir) -> Child {
    run_command(store, args, script, dir).spawn().unwrap()
}

/// The command of [`spawn_run`], to be spawned.
fn run_command(store: &Store, args: &[&str], script: &str, dir: &RunDir) -> std::process::Command {
    let mut fence = store
        .fence()
        .args(["run", "job", "--format", "json"])
        .args(args)
        .args(["--", "sh", "-c", script]);
    fence
        .cmd
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    fence.cmd
}

/// fence's exit code and its one JSON object.
fn outcome(out: &std::process::Output) -> (Option<i32>, serde_json::Value) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "fence's stdout is not one JSON object ({e}): {stdout:?}, stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), json)
}

/// `fence inspect job` as JSON: the resource's view.
fn view(store: &Store) -> serde_json::Value {
    store
        .fence()
        .args(["inspect", "job", "--format", "json"])
        .run()
        .expect(0)
        .json()["resources"][0]
        .clone()
}

/// The lease's expiry as the store recorded it, in ns since the epoch.
fn expiry_ns(store: &Store) -> i128 {
    let view = view(store);
    let at = view["expires_at"]
        .as_str()
        .unwrap_or_else(|| panic!("no expiry: {view}"));
    // fence shows milliseconds: the expiry is within the millisecond after.
    (timestamp_ms(at) as i128 + 1) * 1_000_000
}

/// How many events of `kind` the store logged for `job`.
fn count_events(store: &Store, kind: &str) -> usize {
    store
        .events("job")
        .iter()
        .filter(|(k, _, _)| k == kind)
        .count()
}

/// Waits until the lease is no longer live by the store's own clock.
fn wait_expired(store: &Store) {
    wait_for(
        "the run's lease to expire by the store's clock",
        Duration::from_secs(60),
        || store.lease("job").is_some_and(|(_, _, live)| !live),
    );
}

/// Has another owner acquire the lease, which must be granted: when that acquire was sent (a
/// lower bound of the grant), when it returned, and the token granted.
fn take_over(store: &Store) -> (i128, i128, i64) {
    let sent = wall_ns();
    let token = store
        .fence()
        .acquire("job", &["--owner", "contender", "--ttl", "1m"])
        .token;
    (sent, wall_ns(), token)
}

/// Instants as milliseconds from `zero`, for a failure's message.
fn timeline(zero: i128, points: &[(&str, i128)]) -> String {
    points
        .iter()
        .map(|(what, at)| format!("{what} {:+.1} ms", (at - zero) as f64 / 1e6))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `pid` holds a lock (`flock`, as the directory store takes one per operation), from
/// /proc/locks; a process waiting for one (`->`) does not hold it.
fn holds_a_lock(pid: u32) -> bool {
    std::fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .filter(|line| !line.contains("->"))
        .any(|line| line.split_whitespace().nth(4) == Some(pid.to_string().as_str()))
}

/// Pauses fence (SIGSTOP) between two of its operations on the store: a directory store's
/// operation holds the resource's lock file, and a fence paused inside one holds every other
/// process off the resource for as long (the store's known limit, not what these tests are
/// about): paused there, it is continued and paused again a moment later.
fn pause_between_operations(pid: u32) {
    loop {
        kill(pid, libc::SIGSTOP);
        wait_for("fence to stop", Duration::from_secs(10), || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    stat.rsplit_once(") ")
                        .and_then(|(_, rest)| rest.chars().next())
                })
                .is_some_and(|state| state == 'T')
        });
        if !holds_a_lock(pid) {
            return;
        }
        kill(pid, libc::SIGCONT);
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Writes a wall-clock timestamp every ~20 ms and ignores SIGTERM (so do `date` and `sleep`:
/// an ignored signal stays ignored across exec). Its pid goes to `cmd.pid`.
fn stamping_script(dir: &RunDir) -> String {
    format!(
        "trap '' TERM; echo $$ > '{pid}'; while :; do date +%s%N >> '{stamps}'; sleep 0.02; done",
        pid = dir.file("cmd.pid"),
        stamps = dir.file("stamps"),
    )
}

/// A run renews for a while, then fence is paused (SIGSTOP) and stays paused past the TTL:
/// its reaper alone must stop the command (which ignores SIGTERM) by the bound, so that
/// nothing is written once the lease can be granted to another owner. Returns what the test
/// measured, for the assertions of each variant.
struct Paused {
    /// When fence was paused, wall clock ns.
    paused: i128,
    /// The lease's expiry by the store, as the paused run left it (ns).
    expiry: i128,
    /// When the contender's successful acquire was sent and when it returned (ns).
    granted: (i128, i128),
    /// The command's timestamps.
    stamps: Vec<i128>,
    /// fence's exit code and JSON once continued, and how long after the pause it exited.
    code: Option<i32>,
    json: serde_json::Value,
    exited_after_pause: Duration,
}

fn pause_fence_and_take_over(store: &Store, ttl: &str, kill_after: &str) -> Paused {
    let dir = RunDir::new();
    let fence = spawn_run(
        store,
        &["--ttl", ttl, "--kill-after", kill_after],
        &stamping_script(&dir),
        &dir,
    );
    let cmd = read_pid(&dir.path().join("cmd.pid"));
    // Six renewals: two TTLs of renewing (at TTL/3) before the pause.
    wait_for("six renewals", Duration::from_secs(60), || {
        count_events(store, "renewed") >= 6
    });
    pause_between_operations(fence.id());
    let paused_at = Instant::now();
    let paused = wall_ns();
    wait_expired(store);
    let expiry = expiry_ns(store);
    let (sent, returned, token) = take_over(store);
    let gone_at_grant = is_gone(cmd);
    // The command must be gone already. Were it not, it would show by writing again (every
    // 20 ms): wait for either, so that a command that outlives the bound is seen.
    wait_for(
        "the command to be gone, or to write after the grant",
        Duration::from_secs(20),
        || is_gone(cmd) || dir.stamps("stamps").iter().any(|s| *s >= sent),
    );
    let looked = wall_ns();
    let at_grant = dir.stamps("stamps");
    kill(fence.id(), libc::SIGCONT);
    let out = wait_output("the continued fence run", fence, Duration::from_secs(30));
    let exited_after_pause = paused_at.elapsed();
    let (code, json) = outcome(&out);
    assert_eq!(
        dir.processes(),
        Vec::<u32>::new(),
        "processes of the run are left after fence exited"
    );
    let stamps = dir.stamps("stamps");
    let mut points = vec![
        ("paused", paused),
        ("acquire sent", sent),
        ("acquire returned", returned),
        ("looked", looked),
    ];
    points.extend(stamps.iter().rev().take(5).rev().map(|s| ("write", *s)));
    assert_eq!(
        stamps.len(),
        at_grant.len(),
        "the command wrote after the contender's grant (command gone at the grant: \
         {gone_at_grant}); from the store's expiry: {}",
        timeline(expiry, &points)
    );
    // The contender's lease is untouched.
    let (owner, held, live) = store.lease("job").unwrap();
    assert_eq!((owner.as_str(), held, live), ("contender", token, true));
    Paused {
        paused,
        expiry,
        granted: (sent, returned),
        stamps,
        code,
        json,
        exited_after_pause,
    }
}

/// The last timestamp, and that the command still wrote after fence was paused (the test's
/// premise: the reaper, not fence, stopped it).
fn last_write(measured: &Paused) -> i128 {
    let last = *measured.stamps.last().expect("the command wrote");
    assert!(
        last > measured.paused,
        "the command stopped writing before fence was paused: the test proves nothing"
    );
    last
}

/// Paused fence, `--kill-after 30s`: the reaper SIGKILLs the command at the bound (the
/// last renewal sent + TTL − margin), not 30 s after its SIGTERM; no write is later than the
/// contender's grant (the acquire was sent after the lease had expired by the store's clock),
/// and fence, continued, exits 5 `taken_over` with nothing of the command left.
fn a_paused_fence_cannot_stretch_kill_after_past_the_bound(store: &Store) {
    let m = pause_fence_and_take_over(store, "2s", "30s");
    let last = last_write(&m);
    assert!(
        last < m.granted.0,
        "a write {} ms after the contender's acquire was sent",
        (last - m.granted.0) as f64 / 1e6
    );
    assert_eq!(m.code, Some(5), "{}", m.json);
    assert_eq!(
        (m.json["error"].as_str(), m.json["reason"].as_str()),
        (Some("lease_lost"), Some("taken_over")),
        "{}",
        m.json
    );
}

/// Paused fence, `--kill-after 1s`: the last write is before the lease's expiry as the store
/// recorded it (the slack is printed), hence before the contender's grant; fence, continued,
/// exits 5, taken over (how long after the pause is printed: that span holds the test's own
/// waits for the expiry and the takeover, so it is no property of fence's).
fn a_paused_fence_leaves_no_write_past_the_stores_expiry(store: &Store) {
    let m = pause_fence_and_take_over(store, "2s", "1s");
    let last = last_write(&m);
    eprintln!(
        "last write {:.1} ms before the store's expiry, {:.1} ms before the contender's acquire was sent ({:.1} ms before it returned)",
        (m.expiry - last) as f64 / 1e6,
        (m.granted.0 - last) as f64 / 1e6,
        (m.granted.1 - last) as f64 / 1e6,
    );
    assert!(
        last < m.expiry,
        "a write {:.1} ms after the store's expiry",
        (last - m.expiry) as f64 / 1e6
    );
    assert!(last < m.granted.0, "a write after the contender's grant");
    assert_eq!(m.code, Some(5), "{}", m.json);
    assert_eq!(m.json["reason"], "taken_over", "{}", m.json);
    eprintln!("fence exited {:?} after the pause", m.exited_after_pause);
}

/// The process group of a running process, from /proc.
fn group_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(") ").unwrap();
    rest.split_whitespace().nth(2).unwrap().parse().unwrap()
}

/// A daemon: a session of its own, SIGTERM ignored, appending to `name` every 20 ms, its pid
/// in `name.pid`.
fn daemon(dir: &RunDir, name: &str) -> String {
    format!(
        "setsid sh -c 'trap \"\" TERM; echo $$ > {pid}; while :; do echo x >> {out}; sleep 0.02; done' >/dev/null 2>&1",
        pid = dir.file(&format!("{name}.pid")),
        out = dir.file(name),
    )
}

/// The command starts a `setsid` daemon and a double-forked one (orphaned at once), both
/// ignoring SIGTERM, then the test SIGKILLs the reaper. fence must stop everything, daemons
/// included, release the lease and exit 5 `supervisor_lost` within `limit` of the kill.
fn kill_the_reaper_of_daemons(store: &Store, kill_after: &str, limit: Duration) {
    let dir = RunDir::new();
    let script = format!(
        "trap '' TERM; echo $PPID > '{reaper}'; {d1} & ( {d2} & ) & echo $$ > '{cmd}'; while :; do sleep 0.05; done",
        reaper = dir.file("reaper.pid"),
        d1 = daemon(&dir, "d1"),
        d2 = daemon(&dir, "d2"),
        cmd = dir.file("cmd.pid"),
    );
    let fence = spawn_run(
        store,
        &["--ttl", "2s", "--kill-after", kill_after],
        &script,
        &dir,
    );
    let cmd = read_pid(&dir.path().join("cmd.pid"));
    let reaper = read_pid(&dir.path().join("reaper.pid"));
    let d1 = read_pid(&dir.path().join("d1.pid"));
    let d2 = read_pid(&dir.path().join("d2.pid"));
    wait_for("both daemons to write", Duration::from_secs(20), || {
        ["d1", "d2"]
            .iter()
            .all(|d| std::fs::metadata(dir.path().join(d)).is_ok_and(|m| m.len() > 0))
    });
    // The premise: the daemons left the command's process group (the reaper leads it).
    assert_eq!(group_of(cmd), reaper);
    assert!(group_of(d1) != reaper && group_of(d2) != reaper);
    assert_eq!(common::process::parent_of(cmd), reaper);
    kill(reaper, libc::SIGKILL);
    let killed = Instant::now();
    let out = wait_output("fence run after its reaper was killed", fence, limit);
    eprintln!(
        "fence exited {:?} after its reaper was killed",
        killed.elapsed()
    );
    let (code, json) = outcome(&out);
    for (name, pid) in [
        ("command", cmd),
        ("setsid daemon", d1),
        ("double-forked daemon", d2),
    ] {
        assert!(
            is_gone(pid),
            "the {name} ({pid}, parent {:?}) outlived fence run ({code:?} {json}; stderr {})",
            common::process::parent_of(pid),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        dir.processes(),
        Vec::<u32>::new(),
        "processes of the run are left"
    );
    assert_eq!(code, Some(5), "{json}");
    assert_eq!(
        (json["error"].as_str(), json["reason"].as_str()),
        (Some("lease_lost"), Some("supervisor_lost")),
        "{json}"
    );
    assert_eq!(view(store)["state"], "free", "the lease was not released");
    let sizes =
        |dir: &RunDir| ["d1", "d2"].map(|d| std::fs::metadata(dir.path().join(d)).unwrap().len());
    let before = sizes(&dir);
    // Every process of the run is gone (above): nothing is left to write.
    assert!(dir.processes().is_empty());
    assert_eq!(sizes(&dir), before, "a daemon's file still grows");
}

/// With `--kill-after 1s`: fence exits within TTL + kill-after + 5 s of the kill.
fn killing_the_reaper_stops_the_daemons_and_ends_the_run(store: &Store) {
    kill_the_reaper_of_daemons(store, "1s", Duration::from_secs(2 + 1 + 5));
}

/// With `--kill-after 30s`: a killed reaper is no command that ended on its own, so what is
/// left gets no SIGTERM grace: fence exits within TTL + 5 s of the kill, not 30 s later.
fn killing_the_reaper_ends_the_run_without_waiting_for_kill_after(store: &Store) {
    kill_the_reaper_of_daemons(store, "30s", Duration::from_secs(2 + 5));
}

/// The reaper is killed while `fence run --wait` waits for a lease another owner holds: the
/// run ends at once, unavailable (nothing was run, safe to retry), without taking the lease —
/// the holder keeps it, and no token is issued for a command that could not be started.
#[test]
fn killing_the_reaper_while_waiting_ends_the_run_without_the_lease() {
    let store = Store::file();
    let holder = store
        .fence()
        .acquire("job", &["--owner", "holder", "--ttl", "60s"]);
    let dir = RunDir::new();
    let started = dir.file("started");
    let fence = spawn_run(
        &store,
        &["--wait", "60s"],
        &format!("echo yes > '{started}'"),
        &dir,
    );
    let mut reaper = None;
    wait_for("the reaper to start", Duration::from_secs(20), || {
        reaper = dir
            .processes()
            .into_iter()
            .find(|pid| common::process::parent_of(*pid) == fence.id());
        reaper.is_some()
    });
    kill(reaper.unwrap(), libc::SIGKILL);
    let out = wait_output(
        "fence run after its reaper was killed while waiting",
        fence,
        Duration::from_secs(20),
    );
    let (code, json) = outcome(&out);
    assert_eq!(
        (code, json["error"].as_str()),
        (Some(7), Some("unavailable")),
        "{json}"
    );
    assert!(
        json["message"]
            .as_str()
            .unwrap()
            .contains("while the lease was asked for"),
        "{json}"
    );
    assert!(!Path::new(&started).exists(), "the command ran");
    let view = view(&store);
    assert_eq!(
        (
            view["state"].as_str(),
            view["owner"].as_str(),
            view["token"].as_i64()
        ),
        (Some("held"), Some("holder"), Some(holder.token)),
        "{view}"
    );
    assert_eq!(count_events(&store, "acquired"), 1, "a token was issued");
    assert!(dir.processes().is_empty(), "processes of the run are left");
}

/// A command whose first act is `kill -STOP $PPID` (its reaper) writes for a while and exits
/// 3: fence continues the reaper, passes the status on, and releases the lease. Five times
/// (it hung about once in five before).
fn a_command_that_stops_its_reaper_still_ends_with_its_status(store: &Store) {
    for round in 0..5 {
        let dir = RunDir::new();
        let script = format!(
            "kill -STOP $PPID; i=0; while [ $i -lt 50 ]; do echo $i >> '{out}'; i=$((i+1)); sleep 0.02; done; exit 3",
            out = dir.file("out"),
        );
        let started = Instant::now();
        let fence = spawn_run(store, &["--ttl", "1s"], &script, &dir);
        let out = wait_output(
            &format!("round {round}: fence run of a command that stopped its reaper"),
            fence,
            Duration::from_secs(30),
        );
        let (code, json) = outcome(&out);
        eprintln!("round {round}: exit {code:?} after {:?}", started.elapsed());
        assert_eq!(code, Some(3), "round {round}: {json}");
        let lines = std::fs::read_to_string(dir.path().join("out")).unwrap();
        assert_eq!(
            lines.lines().count(),
            50,
            "round {round}: the command was cut short"
        );
        assert_eq!(view(store)["state"], "free", "round {round}");
        assert!(dir.processes().is_empty(), "round {round}");
    }
}

/// PostgreSQL: the command keeps its reaper stopped (`kill -STOP $PPID` at every write) and
/// ignores SIGTERM, while the test holds the lease's row locked, so that no renewal can be
/// proven. fence itself must kill the command by the bound: no write later than the expiry
/// the store recorded, exit 5 `unreachable`; and the renewal it left queued behind the lock
/// must not land once the lock goes (fence cancels it).
#[test]
fn postgres_fence_alone_enforces_the_bound_on_a_command_that_stops_its_reaper() {
    let store = Store::postgres();
    let dir = RunDir::new();
    let script = format!(
        "trap '' TERM; echo $$ > '{pid}'; while :; do kill -STOP $PPID; date +%s%N >> '{stamps}'; sleep 0.02; done",
        pid = dir.file("cmd.pid"),
        stamps = dir.file("stamps"),
    );
    let fence = spawn_run(
        &store,
        &["--ttl", "2s", "--kill-after", "30s"],
        &script,
        &dir,
    );
    let cmd = read_pid(&dir.path().join("cmd.pid"));
    let reaper = common::process::parent_of(cmd);
    wait_for("a renewal", Duration::from_secs(30), || {
        count_events(&store, "renewed") >= 1
    });
    let schema = store.schema.clone().unwrap();
    let lock = common::RowLock::hold(&store.url, &format!("{schema}.leases"));
    let locked = Instant::now();
    // No renewal can commit now: the expiry is fixed.
    let expiry = expiry_ns(&store);
    let renewals = count_events(&store, "renewed");
    let stopped = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
            .unwrap_or(false)
    };
    assert!(
        becomes(Duration::from_secs(5), || stopped(reaper)),
        "the premise: the command keeps its reaper stopped"
    );
    let out = wait_output(
        "fence run with its renewals blocked",
        fence,
        Duration::from_secs(2 + 15),
    );
    eprintln!("fence exited {:?} after the lock", locked.elapsed());
    let (code, json) = outcome(&out);
    let stamps = dir.stamps("stamps");
    let last = *stamps.last().unwrap();
    eprintln!(
        "last write {:.1} ms before the store's expiry",
        (expiry - last) as f64 / 1e6
    );
    assert!(
        last < expiry,
        "a write {:.1} ms after the store's expiry",
        (last - expiry) as f64 / 1e6
    );
    assert!(
        is_gone(cmd) && dir.processes().is_empty(),
        "processes of the run are left"
    );
    assert_eq!(code, Some(5), "{json}");
    assert_eq!(json["reason"], "unreachable", "{json}");
    lock.release();
    // Another owner gets the lease once it expired (a renewal that landed late would have
    // extended it for the run's owner, and shows in the log).
    wait_expired(&store);
    let (sent, _, token) = take_over(&store);
    assert!(last < sent);
    assert_eq!(
        count_events(&store, "renewed"),
        renewals,
        "a renewal landed after the run reported the lease lost: {:?}",
        store.events("job")
    );
    let (owner, held, live) = store.lease("job").unwrap();
    assert_eq!((owner.as_str(), held, live), ("contender", token, true));
}

/// The run's lease is handed to another owner behind its back (an operator releases it with
/// the run's own token, and another owner acquires it): the next renewal is answered that the
/// lease is gone, a definite loss, so fence stops everything at once and renews no more. The
/// store shows exactly one refused renewal; fence exits 5 (`taken_over`, or `released` when
/// its renewal came between the release and the new grant) with nothing of the command left.
fn a_renewal_refused_as_lost_stops_the_command_at_once(store: &Store) {
    let dir = RunDir::new();
    let script = format!(
        "echo \"$FENCE_OWNER $FENCE_TOKEN\" > '{lease}.tmp' && mv '{lease}.tmp' '{lease}'; {rest}",
        lease = dir.file("lease"),
        rest = stamping_script(&dir),
    );
    let fence = spawn_run(
        store,
        &["--ttl", "3s", "--kill-after", "30s"],
        &script,
        &dir,
    );
    let cmd = read_pid(&dir.path().join("cmd.pid"));
    wait_for(
        "the lease's owner and token",
        Duration::from_secs(20),
        || dir.path().join("lease").exists(),
    );
    let text = std::fs::read_to_string(dir.path().join("lease")).unwrap();
    let (owner, token) = text.trim().split_once(' ').unwrap();
    wait_for("a renewal", Duration::from_secs(30), || {
        count_events(store, "renewed") >= 1
    });
    store
        .fence()
        .args(["release", "job", "--owner", owner, "--token", token])
        .run()
        .expect(0);
    let newer = store
        .fence()
        .acquire("job", &["--owner", "contender", "--ttl", "1m"])
        .token;
    let taken = Instant::now();
    let out = wait_output(
        "fence run whose lease was taken",
        fence,
        Duration::from_secs(3 + 10),
    );
    eprintln!("fence exited {:?} after the takeover", taken.elapsed());
    let (code, json) = outcome(&out);
    assert!(
        is_gone(cmd) && dir.processes().is_empty(),
        "processes of the run are left"
    );
    assert_eq!(code, Some(5), "{json}");
    let reason = json["reason"].as_str().unwrap_or_default();
    assert!(["taken_over", "released"].contains(&reason), "{json}");
    assert_eq!(
        count_events(store, "renew_rejected"),
        1,
        "fence went on renewing a lease it was told it had lost: {:?}",
        store.events("job")
    );
    let (holder, held, live) = store.lease("job").unwrap();
    assert_eq!((holder.as_str(), held, live), ("contender", newer, true));
}

/// [`spawn_run`], its stderr to the run's `stderr` file (read while it runs).
fn spawn_run_logging(store: &Store, args: &[&str], script: &str, dir: &RunDir) -> Child {
    run_command(store, args, script, dir)
        .stderr(std::fs::File::create(dir.file("stderr")).unwrap())
        .spawn()
        .unwrap()
}

/// A FUSE mount that never answers, or `None` (said) when this host cannot mount one: only
/// root can; as root (CI) a failure to mount fails the test.
fn hung_mount() -> Option<hung_fuse::HungFuse> {
    match hung_fuse::HungFuse::mount() {
        Ok(mount) => Some(mount),
        // SAFETY: getuid has no preconditions.
        Err(why) if unsafe { libc::getuid() } != 0 => {
            eprintln!("skipped: {why}");
            None
        }
        Err(why) => panic!("{why}"),
    }
}

/// The state letter of a process (`D`: uninterruptible sleep), from /proc.
fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.chars().next()
}

/// The command ends (exit 0), leaving a process that reads a file of a FUSE mount that never
/// answers: SIGTERM and SIGKILL leave it asleep in the kernel (state D). Returns the running
/// fence, the process's pid and the mount, once fence has said it would not die.
fn leave_an_unkillable_process(store: &Store, dir: &RunDir) -> (Child, u32, hung_fuse::HungFuse) {
    let mount = hung_mount().expect("checked by the caller");
    // The command ends only once the server has the read's request: a signal before that
    // would interrupt the read instead.
    let script = format!(
        "cat '{file}' & echo $! > '{pid}'; while [ ! -e '{go}' ]; do sleep 0.01; done; exit 0",
        file = mount.file().display(),
        pid = dir.file("stuck.pid"),
        go = dir.file("go"),
    );
    let fence = spawn_run_logging(store, &["--ttl", "3s", "--kill-after", "1s"], &script, dir);
    let stuck = read_pid(&dir.path().join("stuck.pid"));
    wait_for(
        "the server to read the request",
        Duration::from_secs(30),
        || mount.requests_read() > 0,
    );
    std::fs::write(dir.file("go"), "").unwrap();
    let said = becomes(Duration::from_secs(60), || {
        std::fs::read_to_string(dir.file("stderr"))
            .unwrap_or_default()
            .contains("did not end on SIGKILL")
    });
    assert!(
        said,
        "fence did not say that a process of the command would not die: stuck pid {stuck} in state {:?}, processes of the run {:?}; fence's stderr: {}",
        state_of(stuck),
        dir.processes(),
        std::fs::read_to_string(dir.file("stderr")).unwrap_or_default()
    );
    assert_eq!(
        state_of(stuck),
        Some('D'),
        "the leftover is not in uninterruptible sleep: the test proves nothing"
    );
    let stderr = std::fs::read_to_string(dir.file("stderr")).unwrap();
    assert!(stderr.contains(&format!("pid {stuck}")), "{stderr}");
    (fence, stuck, mount)
}

/// A process of the command that will not die on SIGKILL (uninterruptible sleep on a hung
/// mount): fence names it, keeps the lease renewed for as long as it is there (more than a
/// TTL here; another owner is refused), and releases the lease only once it has ended. The
/// run exits with the command's own status (0), saying how long the process outlived SIGKILL.
fn a_process_that_will_not_die_keeps_the_lease_until_it_ends(store: &Store) {
    if hung_mount().is_none() {
        return;
    }
    let dir = RunDir::new();
    let (fence, stuck, mut mount) = leave_an_unkillable_process(store, &dir);
    let renewed = count_events(store, "renewed");
    // Four more renewals (every TTL/3): more than a TTL past the SIGKILL.
    wait_for("four more renewals", Duration::from_secs(60), || {
        count_events(store, "renewed") >= renewed + 4
    });
    store
        .fence()
        .args(["acquire", "job", "--owner", "contender", "--ttl", "1m"])
        .run()
        .expect(3);
    assert_eq!(state_of(stuck), Some('D'));
    mount.release();
    let out = wait_output("the fence run", fence, Duration::from_secs(30));
    let (code, json) = outcome(&out);
    let stderr = std::fs::read_to_string(dir.file("stderr")).unwrap();
    assert_eq!(code, Some(0), "{json} {stderr}");
    assert!(
        stderr.contains("after SIGKILL; the lease was renewed until then"),
        "{stderr}"
    );
    assert!(is_gone(stuck));
    assert_eq!(dir.processes(), Vec::<u32>::new());
    // Released by the run, after it had renewed: the contender never held it.
    let events = store.events("job");
    assert_eq!(
        events.last().map(|(kind, _, _)| kind.as_str()),
        Some("released"),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .all(|(_, owner, _)| owner.as_deref() != Some("contender")),
        "{events:?}"
    );
}

/// The same process, but fence is paused until the lease has expired and another owner holds
/// it: continued, fence waits for the process to end (nothing else can be done to it) and
/// exits 5 with `reason` `unkillable`, not a plain lost lease: what the process does when it
/// wakes is not contained, and the report says so.
fn a_process_that_will_not_die_past_the_lease_is_reported_unkillable(store: &Store) {
    if hung_mount().is_none() {
        return;
    }
    let dir = RunDir::new();
    let (fence, stuck, mut mount) = leave_an_unkillable_process(store, &dir);
    pause_between_operations(fence.id());
    wait_expired(store);
    let (_, _, token) = take_over(store);
    kill(fence.id(), libc::SIGCONT);
    mount.release();
    let out = wait_output("the fence run", fence, Duration::from_secs(30));
    let (code, json) = outcome(&out);
    assert_eq!(code, Some(5), "{json}");
    assert_eq!(
        (json["error"].as_str(), json["reason"].as_str()),
        (Some("lease_lost"), Some("unkillable")),
        "{json}"
    );
    assert!(is_gone(stuck));
    assert_eq!(dir.processes(), Vec::<u32>::new());
    let (owner, held, live) = store.lease("job").unwrap();
    assert_eq!((owner.as_str(), held, live), ("contender", token, true));
}

/// Every process of the run frozen at once past the lease's TTL and continued at once, as a
/// suspend of the machine does to them (the bound clock counts a suspend; the runtime's timers
/// do not, and here as there the reaper may stop the command before fence looks): fence
/// reports the lost lease (exit 5, `taken_over`), never the status of a command it killed.
fn a_run_frozen_past_its_lease_reports_it_lost(store: &Store) {
    let dir = RunDir::new();
    let fence = spawn_run(store, &["--ttl", "2s"], &stamping_script(&dir), &dir);
    read_pid(&dir.path().join("cmd.pid"));
    wait_for("three renewals", Duration::from_secs(60), || {
        count_events(store, "renewed") >= 3
    });
    // fence first, then the rest (the reaper, the command), as fast as the test can.
    let mut frozen = vec![fence.id()];
    pause_between_operations(fence.id());
    for pid in dir.processes() {
        if pid != fence.id() {
            kill(pid, libc::SIGSTOP);
            frozen.push(pid);
        }
    }
    wait_expired(store);
    let (_, _, token) = take_over(store);
    for pid in frozen.iter().rev() {
        kill(*pid, libc::SIGCONT);
    }
    let out = wait_output("the continued fence run", fence, Duration::from_secs(30));
    let (code, json) = outcome(&out);
    assert_eq!(code, Some(5), "{json}");
    assert_eq!(
        (json["error"].as_str(), json["reason"].as_str()),
        (Some("lease_lost"), Some("taken_over")),
        "{json}"
    );
    assert_eq!(dir.processes(), Vec::<u32>::new());
    let (owner, held, live) = store.lease("job").unwrap();
    assert_eq!((owner.as_str(), held, live), ("contender", token, true));
}

/// PostgreSQL's answers held for half the TTL (1.5 s of 3 s) from the first renewal on: the
/// store applies each renewal long before fence hears of it, and the next one goes out a third
/// of the TTL after that answer, too late. The bound counts from when a renewal was sent, so
/// the command (which ignores SIGTERM) writes nothing later than the first renewal's send +
/// TTL (the bound it proved, plus the margin that absorbs a SIGKILL's landing), whatever the
/// later answers say; fence exits 5 (`unreachable`: the lease was proven too late).
#[test]
fn postgres_renewal_answers_delayed_by_half_the_ttl_stop_the_command_by_the_bound() {
    use common::proxy::{Mode, Proxy};
    let store = Store::postgres();
    store
        .fence()
        .acquire("other", &["--owner", "setup", "--ttl", "1s"]);
    let proxy = Proxy::start(
        common::pg_upstream(),
        Mode::DelayAnswersOnceClientSends(b"-- fence: renew".to_vec(), Duration::from_millis(1500)),
    );
    let dir = RunDir::new();
    let (zero_instant, zero_wall) = (Instant::now(), wall_ns());
    let mut fence = store
        .fence_at(&common::pg_url_via(proxy.addr()))
        .args(["run", "job", "--format", "json", "--ttl", "3s"])
        .args(["--", "sh", "-c", &stamping_script(&dir)]);
    fence
        .cmd
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let fence = fence.cmd.spawn().unwrap();
    let out = wait_output("the fence run", fence, Duration::from_secs(30));
    let (code, json) = outcome(&out);
    assert_eq!(
        code,
        Some(5),
        "{json} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json["reason"], "unreachable", "{json}");
    let first_renewal = proxy
        .client_sent_at(b"-- fence: renew")
        .expect("fence sent a renewal");
    let sent = zero_wall + (first_renewal - zero_instant).as_nanos() as i128;
    let stamps = dir.stamps("stamps");
    let last = *stamps.last().expect("the command wrote");
    let limit = sent + Duration::from_secs(3).as_nanos() as i128;
    eprintln!(
        "last write {:.1} ms after the first renewal was sent",
        (last - sent) as f64 / 1e6
    );
    assert!(
        last < limit,
        "a write {:.1} ms past the first renewal's send + TTL",
        (last - limit) as f64 / 1e6
    );
    assert!(
        count_events(&store, "renewed") >= 1,
        "no renewal reached the store: the test proves nothing"
    );
    assert_eq!(dir.processes(), Vec::<u32>::new());
}

/// PostgreSQL behind a proxy that holds every request for `delay` (answers are not delayed):
/// the run still keeps its lease through a command of eight seconds, more than two TTLs of
/// 3 s (exit 0, released), and no other owner is granted it meanwhile (a contender keeps
/// asking, and is refused every time). Returns the renewals the store logged.
fn delayed_requests_keep_the_lease(delay: Duration) {
    use common::proxy::{Mode, Proxy};
    let store = Store::postgres();
    // The schema is made beforehand, directly (its first use takes three more round trips).
    store
        .fence()
        .acquire("other", &["--owner", "setup", "--ttl", "1s"]);
    let proxy = Proxy::start(common::pg_upstream(), Mode::Delay(delay));
    let dir = RunDir::new();
    let script = format!(
        "end=$(( $(date +%s) + 8 )); while [ $(date +%s) -lt $end ]; do date +%s%N >> '{stamps}'; sleep 0.02; done",
        stamps = dir.file("stamps"),
    );
    let mut fence = store
        .fence_at(&common::pg_url_via(proxy.addr()))
        .args(["run", "job", "--format", "json", "--ttl", "3s"])
        .args(["--", "sh", "-c", &script]);
    fence
        .cmd
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut fence = fence.cmd.spawn().unwrap();
    let requests = |proxy: &Proxy| {
        let forwarded = proxy.forwarded();
        let first = forwarded.first().map(|f| f.at);
        forwarded
            .iter()
            .map(|f| {
                let text = String::from_utf8_lossy(&f.bytes);
                let what = text
                    .split_once("-- fence: ")
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .unwrap_or("(connect)")
                    .to_owned();
                format!("{what} +{:?}", f.at - first.unwrap())
            })
            .collect::<Vec<_>>()
    };
    wait_for(
        "the command to start, or fence to end",
        Duration::from_secs(60),
        || dir.path().join("stamps").exists() || fence.try_wait().unwrap().is_some(),
    );
    let mut refused = 0;
    while fence.try_wait().unwrap().is_none() {
        let sent = wall_ns();
        let out = store
            .fence()
            .args(["acquire", "job", "--owner", "contender", "--ttl", "1m"])
            .run();
        if out.code == 0 {
            // Granted: only once the run had released its lease (its command done, fence
            // about to exit), and after the command's last write.
            let events = store.events("job");
            let at = |kind: &str, contender: bool| {
                events.iter().position(|(k, owner, _)| {
                    k == kind && (owner.as_deref() == Some("contender")) == contender
                })
            };
            let last = dir.stamps("stamps").last().copied().unwrap_or(0);
            assert!(
                at("released", false).is_some_and(|r| Some(r) < at("acquired", true))
                    && last < sent,
                "another owner was granted the lease during the run (last write {:.1} ms after that acquire was sent): {events:?}; requests: {:?}",
                (last - sent) as f64 / 1e6,
                requests(&proxy)
            );
            break;
        }
        assert_eq!(out.code, 3, "{out:?}");
        refused += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = wait_output("the delayed fence run", fence, Duration::from_secs(5));
    let (code, json) = outcome(&out);
    assert_eq!(
        code,
        Some(0),
        "{json} {}; requests: {:?}",
        String::from_utf8_lossy(&out.stderr),
        requests(&proxy)
    );
    assert!(refused > 0, "the command never started");
    let renewals = count_events(&store, "renewed");
    eprintln!("{renewals} renewals; requests: {:?}", requests(&proxy));
    let events = store.events("job");
    assert!(renewals >= 2, "{events:?}");
    assert!(
        events
            .iter()
            .any(|(kind, owner, _)| kind == "released" && owner.as_deref() != Some("contender")),
        "the run did not release its lease: {events:?}"
    );
}

/// Requests held for a thirtieth of the TTL (100 ms).
#[test]
fn postgres_requests_delayed_by_a_thirtieth_of_the_ttl_keep_the_lease() {
    delayed_requests_keep_the_lease(Duration::from_millis(100));
}

/// Requests held for a tenth of the TTL (300 ms): five round trips before the first renewal's
/// answer (three of SCRAM, the acquire, the renewal), all counted in the first bound.
#[test]
fn postgres_requests_delayed_by_a_tenth_of_the_ttl_keep_the_lease() {
    delayed_requests_keep_the_lease(Duration::from_millis(300));
}

per_backend!(
    a_paused_fence_cannot_stretch_kill_after_past_the_bound,
    a_paused_fence_leaves_no_write_past_the_stores_expiry,
    killing_the_reaper_stops_the_daemons_and_ends_the_run,
    killing_the_reaper_ends_the_run_without_waiting_for_kill_after,
    a_command_that_stops_its_reaper_still_ends_with_its_status,
    a_renewal_refused_as_lost_stops_the_command_at_once,
    a_process_that_will_not_die_keeps_the_lease_until_it_ends,
    a_process_that_will_not_die_past_the_lease_is_reported_unkillable,
    a_run_frozen_past_its_lease_reports_it_lost,
);
