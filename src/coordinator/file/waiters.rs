//! Waiters (`waiters/<name>/<pid>.json`): processes blocked in `acquire --wait` or
//! `run --wait`, shown by `inspect`; a file whose process is gone is ignored and removed by
//! the next waiter.

use std::fs;
use std::path::{Path, PathBuf};

use rustix::io::Errno;
use rustix::process::Pid;

use super::{encode_name, FileCoordinator};
use crate::coordinator::Waiter;

impl FileCoordinator {
    pub(super) fn waiters_dir(&self, resource: &str) -> PathBuf {
        self.dir.join("waiters").join(encode_name(resource))
    }

    /// Waiter files with their waiter, or `None` when the process is gone.
    pub(super) fn read_waiters(&self, dir: &Path) -> Vec<(PathBuf, Option<Waiter>)> {
        let Ok(entries) = fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|entry| {
                let path = entry.path();
                let pid: i32 = path.file_stem()?.to_str()?.parse().ok()?;
                // Signal 0 only checks that the process exists (a pid of 0 or less: none).
                let alive = Pid::from_raw(pid.max(0)).is_some_and(|pid| {
                    matches!(
                        rustix::process::test_kill_process(pid),
                        Ok(()) | Err(Errno::PERM)
                    )
                });
                let waiter = fs::read(&path)
                    .ok()
                    .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
                    .and_then(|v| {
                        Some(Waiter {
                            owner: v["owner"].as_str()?.to_owned(),
                            since_ms: v["since_ms"].as_i64()?,
                        })
                    });
                Some((path, waiter.filter(|_| alive)))
            })
            .collect()
    }

    /// The live waiters of a resource, longest waiting first.
    pub(super) fn waiters(&self, resource: &str) -> Vec<Waiter> {
        let mut waiters: Vec<Waiter> = self
            .read_waiters(&self.waiters_dir(resource))
            .into_iter()
            .filter_map(|(_, w)| w)
            .collect();
        waiters.sort_by_key(|w| w.since_ms);
        waiters
    }
}
