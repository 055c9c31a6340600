//! A cgroup (v2) of its own for each `fence run`, where fence may make one: what the command
//! starts stays in it, however it forks, and one write kills all of it at once.
//!
//! Without it, the reaper finds the command's processes by scanning /proc and kills the pids
//! it found: a fork chain (each process forks its successor and exits, in a session of its own
//! at every generation, or in the reaper's own process group) outruns every scan (review 8).
//! A cgroup holds every process forked inside it, and `cgroup.kill` (Linux 5.14) SIGKILLs
//! them all, those forked during the kill included.
//!
//! `fence run` names the run's cgroup (`fence-run-<its pid>-<pid namespace>-<random>`, under
//! the cgroup it was started in: see [`plan`]) before it forks the reaper, so both know it.
//! The reaper makes it while `fence run` asks for the lease, and forks the command's process
//! straight into it (`clone3` with `CLONE_INTO_CGROUP`, see `starter`): no process is ever
//! moved between cgroups on the way to the command's start (a move waits for an RCU grace
//! period: 0.3 ms typically, 10 ms at times). The reaper stays outside, so a kill spares it.
//! `fence run` kills through it should the reaper die, and removes it, with any cgroup left
//! empty below it, once the reaper has ended. A cgroup left behind (fence killed with its
//! reaper) is removed, once empty, by the next reaper made in the same place and the same pid
//! namespace; one with processes still in it is named by `fence doctor`
//! (`host.run_leftovers`). Limit: the cgroups of runs named in another pid namespace (a
//! sandbox's) are left to that namespace's runs: their pids mean nothing here.

//! Where fence may not make one (no cgroup2 mounted, a read-only cgroupfs in a container, a
//! user's cgroup not delegated to them, a kernel before 5.14), the scans of /proc stay the only
//! containment, with their documented limit; `fence doctor` says which applies
//! (`host.run_cgroup`). A command running as root, or as the user a delegated cgroup belongs
//! to, can move itself out (as it could stop the reaper): not contained, documented.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The prefix of a run cgroup's name (see [`plan`] for the rest).
pub const PREFIX: &str = "fence-run-";

/// The prefix of `fence doctor`'s scratch cgroup, named as a run's (a doctor killed during its
/// probe leaves it for the next run's sweep).
pub const DOCTOR_PREFIX: &str = "fence-doctor-";

/// This process's run cgroup (see [`plan`]), in `fence run` and in its reaper.
static RUN: OnceLock<PathBuf> = OnceLock::new();

/// The cgroup v2 directory this process is in, by /proc/self/cgroup and the cgroup2 mount of
/// /proc/self/mountinfo; `None` without one (cgroup v1 only, no /proc).
pub fn base() -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    base_of(&cgroups, &mounts)
}

/// [`base`] from the two files' texts.
fn base_of(cgroups: &str, mounts: &str) -> Option<PathBuf> {
    let own = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    mounts.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        if after.split(' ').next()? != "cgroup2" {
            return None;
        }
        let mut fields = before.split(' ').skip(3);
        let (root, point) = (unescape(fields.next()?), unescape(fields.next()?));
        // The mount shows the hierarchy from `root` down: our cgroup must be below it.
        let below = if root == "/" {
            own
        } else {
            own.strip_prefix(root.as_str())
                .filter(|rest| rest.is_empty() || rest.starts_with('/'))?
        };
        let below = below.trim_start_matches('/');
        Some(if below.is_empty() {
            PathBuf::from(point)
        } else {
            Path::new(&point).join(below)
        })
    })
}

/// A mountinfo field as the path it names (`\040` for a space, and so on).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|digits| {
            let text = std::str::from_utf8(digits).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// This process's pid namespace, as the number of its /proc/self/ns/pid link (`pid:[N]`): the
/// pids in run cgroups' names mean something only in the namespace that named them.
fn pid_namespace() -> u64 {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|link| {
            let text = link.to_string_lossy().into_owned();
            text.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
        })
        .unwrap_or(0)
}

/// A name under a base for this process: `<prefix><pid>-<pid namespace>-<random>`.
pub fn unique_name(prefix: &str) -> String {
    format!(
        "{prefix}{}-{}-{:08x}",
        std::process::id(),
        pid_namespace(),
        crate::sys::random_u64() as u32
    )
}

/// In `fence run`, before it forks its reaper: the run's cgroup, to be made by the reaper under
/// `base` (the cgroup fence is in), named `fence-run-<fence's pid>-<pid namespace>-<random>`:
/// never the name of another run's, in this pid namespace or another that shares the cgroup
/// (a review: two sandboxes' runs, both pid 3, killed each other's commands), nor of one left
/// behind. Both processes know it from here on (see [`kill`] and [`remove`]).
pub fn plan(base: Option<&Path>) -> Option<PathBuf> {
    let dir = base?.join(unique_name(PREFIX));
    let _ = RUN.set(dir.clone());
    Some(dir)
}

/// In the reaper: makes the run's cgroup `dir` (see [`plan`]), for the command's process to
/// be forked into (see `starter`). The cgroup's directory, opened: `None` where fence may not
/// make one (see the module's documentation). First removes what runs that are gone left
/// empty under the same parent.
pub fn make(dir: Option<&Path>) -> Option<OwnedFd> {
    let dir = dir?;
    if let Some(base) = dir.parent() {
        sweep(base);
    }
    std::fs::create_dir(dir).ok()?;
    // cgroup.kill is what makes it worth it (Linux 5.14).
    let opened = dir
        .join("cgroup.kill")
        .exists()
        .then(|| {
            rustix::fs::open(
                dir,
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .ok()
        })
        .flatten();
    if opened.is_none() {
        let _ = std::fs::remove_dir(dir);
    }
    opened
}

/// In a process forked by the reaper when it could not be forked into the run's cgroup
/// (`clone3` refused: a kernel before 5.7, a seccomp policy): moves this process into it.
pub fn join() {
    if let Some(dir) = RUN.get() {
        let _ = write_to(dir, "cgroup.procs", "0");
    }
}

/// Writes `what` to the cgroup `dir`'s interface file `file` (`cgroup.procs`, `cgroup.kill`).
pub fn write_to(dir: &Path, file: &str, what: &str) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(file))
        .and_then(|mut f| f.write_all(what.as_bytes()))
}

/// Removes what the runs under `base` whose `fence run` is gone left empty (fence killed with
/// its reaper; a nested run's cgroup below a killed one's): only runs named in this pid
/// namespace, where their pid means their `fence run`. A run cgroup with processes still in it
/// is left for `fence doctor` to show (`rmdir` refuses it).
fn sweep(base: &Path) {
    let here = namespace_here();
    for run in runs(base) {
        if run.gone(here) == Some(true) {
            let _ = remove_tree(&run.dir);
        }
    }
}

/// A run's cgroup under a base (see [`plan`]).
pub struct Run {
    pub dir: PathBuf,
    /// The pid of its `fence run`, in [`Run::namespace`].
    pub pid: i32,
    /// The pid namespace that named it.
    pub namespace: u64,
}

impl Run {
    /// Whether its `fence run` is gone, as far as this process can tell, `here` being
    /// [`namespace_here`] (`None`: named in another pid namespace, or /proc shows another
    /// one's pids: `unshare --pid` without `--mount-proc`, where a review saw live runs'
    /// cgroups swept).
    pub fn gone(&self, here: Option<u64>) -> Option<bool> {
        (Some(self.namespace) == here).then(|| !Path::new(&format!("/proc/{}", self.pid)).exists())
    }
}

/// This process's pid namespace, where /proc shows it (its `self` is our pid); `None` where
/// /proc shows another namespace's pids: none of its runs can be told gone then.
pub fn namespace_here() -> Option<u64> {
    let ours = std::fs::read_link("/proc/self")
        .is_ok_and(|link| link.to_str() == Some(std::process::id().to_string().as_str()));
    ours.then(pid_namespace)
}

/// The run cgroups under `base`.
pub fn runs(base: &Path) -> Vec<Run> {
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name();
            let name = name.to_str()?;
            let rest = name
                .strip_prefix(PREFIX)
                .or_else(|| name.strip_prefix(DOCTOR_PREFIX))?;
            let mut parts = rest.split('-');
            let pid = parts.next()?.parse().ok()?;
            let namespace = parts.next()?.parse().ok()?;
            Some(Run {
                dir: entry.path(),
                pid,
                namespace,
            })
        })
        .collect()
}

/// The pids in the cgroup `dir` and in every cgroup below it (a nested `fence run`'s, or the
/// command's own).
pub fn members(dir: &Path) -> Vec<i32> {
    let mut pids: Vec<i32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    for below in children(dir) {
        pids.extend(members(&below));
    }
    pids
}

/// The cgroups just below `dir`: its directories.
fn children(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes the cgroup `dir` and every cgroup below it, deepest first (a cgroup with one below
/// it cannot be removed): those with processes in them stay, and with them the ones above.
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    for below in children(dir) {
        let _ = remove_tree(&below);
    }
    std::fs::remove_dir(dir)
}

/// SIGKILLs every process in this process's run cgroup (and in cgroups below it), if there is
/// one, at once: those it forks meanwhile too.
pub fn kill() {
    if let Some(dir) = RUN.get() {
        let _ = write_to(dir, "cgroup.kill", "1");
    }
}

/// Whether the run's cgroup exists and no process is left in it, or below it (its
/// `cgroup.events` says `populated 0`, the kernel's own count): false without one, or when it
/// cannot be read. What the command started stays in it (only root can move out).
pub fn emptied() -> bool {
    let Some(dir) = RUN.get() else {
        return false;
    };
    std::fs::read_to_string(dir.join("cgroup.events"))
        .is_ok_and(|events| events.lines().any(|line| line == "populated 0"))
}

/// Removes this process's run cgroup once nothing is in it (from `fence run`, its reaper
/// ended; from the reaper, once it killed): tried for up to 50 ms while processes killed a
/// moment ago leave it; a cgroup still busy then is left to the next reaper's `sweep`.
pub fn remove() {
    let Some(dir) = RUN.get() else {
        return;
    };
    let start = std::time::Instant::now();
    loop {
        match remove_tree(dir) {
            Err(err)
                if err.raw_os_error() == Some(libc::EBUSY)
                    && start.elapsed() < std::time::Duration::from_millis(50) =>
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "\
24 30 0:22 / /sys rw,nosuid - sysfs sysfs rw
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn the_base_is_the_cgroup2_mount_and_this_process_s_path() {
        assert_eq!(
            base_of("1:cpu:/\n0::/system.slice/cron.service\n", MOUNTS),
            Some(PathBuf::from(
                "/sys/fs/cgroup/unified/system.slice/cron.service"
            ))
        );
        assert_eq!(
            base_of("0::/\n", MOUNTS),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        // cgroup v1 only: none.
        assert_eq!(base_of("1:cpu:/\n", MOUNTS), None);
        assert_eq!(
            base_of("0::/a\n", "24 30 0:22 / /sys rw - sysfs sysfs rw\n"),
            None
        );
    }

    #[test]
    fn a_mount_of_part_of_the_hierarchy_is_followed() {
        let mounts = "41 31 0:38 /box /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            base_of("0::/box/job\n", mounts),
            Some(PathBuf::from("/sys/fs/cgroup/job"))
        );
        assert_eq!(
            base_of("0::/box\n", mounts),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        // Not below the mount's root (`/boxes` is not below `/box`): not reachable there.
        assert_eq!(base_of("0::/boxes/job\n", mounts), None);
    }

    #[test]
    fn escaped_mount_points_are_read() {
        let mounts = "41 31 0:38 / /mnt/cgroup\\040two rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            base_of("0::/\n", mounts),
            Some(PathBuf::from("/mnt/cgroup two"))
        );
    }
}
