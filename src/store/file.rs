//! The local-directory coordinator (`file:///dir`), the embedded default store.
//!
//! Safe for many processes on one machine: every change to a resource happens under an
//! exclusive `flock` on its lock file, and lease records are replaced by write-to-temp and
//! rename; a grant of a new token is also fsynced (file and directory) before it is reported. Lease records are never deleted by fence; if one is removed by hand, the next
//! token is recovered from the event log, so tokens are not reused (I1).
//!
//! Expiry never uses the wall clock (I7): a lease records its deadline on the kernel's
//! `CLOCK_BOOTTIME` (monotonic, counting suspend) together with the boot id; a lease from
//! an earlier boot has expired. The wall-clock instants in the records are for display only.
//!
//! Layout: `leases/<name>.json`, `locks/<name>.lock`, `events/<name>.jsonl`, where `<name>`
//! is the resource percent-encoded (long names are shortened and suffixed with a hash; the
//! full name is stored inside the record and checked on every read).

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, ErrorKind, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::{ConflictKind, Error, Holder, LostReason};
use crate::store::{
    random_u64, ttl_ms, Coordinator, Event, Grant, InitReport, Lease, LeaseRef, Released,
    ResourceView, State, Waiter,
};

const FORMAT_VERSION: i32 = 1;

pub struct FileCoordinator {
    dir: PathBuf,
    boot_id: String,
}

/// A lease record as stored in `leases/<name>.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Record {
    resource: String,
    owner: String,
    token: i64,
    acquired_at_ms: i64,
    renewed_at_ms: i64,
    /// Wall-clock estimate of the expiry, for display only.
    expires_at_ms: i64,
    ttl_ms: i64,
    released: bool,
    boot_id: String,
    /// The deadline on `CLOCK_BOOTTIME`, in nanoseconds: what decides expiry.
    expires_boot_ns: u64,
}

/// A line of `events/<name>.jsonl`.
#[derive(Debug, Serialize, Deserialize)]
struct EventLine {
    at_ms: i64,
    kind: String,
    owner: Option<String>,
    token: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

/// "Now" on both clocks, read once per operation.
struct Now {
    wall_ms: i64,
    boot_ns: u64,
}

impl Now {
    fn read() -> Result<Now, Error> {
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Ok(Now {
            wall_ms,
            boot_ns: boottime_ns()?,
        })
    }
}

fn boottime_ns() -> Result<u64, Error> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_BOOTTIME exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return Err(Error::internal(
            format!(
                "cannot read the monotonic clock: {}",
                io::Error::last_os_error()
            ),
            "the local directory store needs CLOCK_BOOTTIME (Linux)",
        ));
    }
    Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

impl Record {
    /// Remaining lifetime in milliseconds (≤ 0: expired or released).
    fn expires_in_ms(&self, now: &Now, boot_id: &str) -> i64 {
        if self.released || self.boot_id != boot_id {
            return 0;
        }
        let left = i128::from(self.expires_boot_ns) - i128::from(now.boot_ns);
        i64::try_from(left.div_euclid(1_000_000)).unwrap_or(0)
    }

    fn is_live(&self, now: &Now, boot_id: &str) -> bool {
        !self.released && self.boot_id == boot_id && self.expires_boot_ns > now.boot_ns
    }

    fn lease(&self, now: &Now, boot_id: &str) -> Lease {
        Lease {
            resource: self.resource.clone(),
            owner: self.owner.clone(),
            token: self.token,
            acquired_at_ms: self.acquired_at_ms,
            renewed_at_ms: self.renewed_at_ms,
            expires_at_ms: self.expires_at_ms,
            expires_in_ms: self.expires_in_ms(now, boot_id),
            ttl_ms: self.ttl_ms,
        }
    }

    fn extend(&mut self, now: &Now, boot_id: &str, ttl_ms: i64) {
        self.renewed_at_ms = now.wall_ms;
        self.ttl_ms = ttl_ms;
        self.expires_at_ms = now.wall_ms.saturating_add(ttl_ms);
        self.boot_id = boot_id.to_owned();
        self.expires_boot_ns = now.boot_ns + u64::try_from(ttl_ms).unwrap_or(0) * 1_000_000;
        self.released = false;
    }
}

/// Holds the per-resource `flock` until dropped.
/// An exclusive `flock` on a lock file, held until dropped (the lock ends when the file is
/// closed).
pub(crate) struct Locked {
    _file: File,
}

/// Opens (creating) `path` and takes an exclusive `flock` on it, retrying when interrupted.
/// On failure, says which step failed ("open the lock file" or "lock") with the OS error.
pub(crate) fn lock_exclusive(path: &Path) -> Result<Locked, (&'static str, io::Error)> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|err| ("open the lock file", err))?;
    loop {
        // SAFETY: flock on a descriptor we own; the lock ends when `file` is closed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(Locked { _file: file });
        }
        let err = io::Error::last_os_error();
        if err.kind() != ErrorKind::Interrupted {
            return Err(("lock", err));
        }
    }
}

impl FileCoordinator {
    pub fn open(dir: &Path) -> Result<FileCoordinator, Error> {
        let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        Ok(FileCoordinator {
            dir: dir.to_owned(),
            boot_id,
        })
    }

    fn io_error(&self, what: &str, path: &Path, err: &io::Error) -> Error {
        let message = format!("cannot {what} `{}`: {err}", path.display());
        match err.kind() {
            ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem | ErrorKind::NotADirectory => {
                Error::usage(
                    message,
                    "choose a directory fence can write with `--store file:///path` (or FENCE_STORE), or fix its permissions",
                )
            }
            _ => Error::internal(message, "check the disk and the store directory, then retry"),
        }
    }

    /// Creates the store's directories (idempotent).
    fn ensure(&self) -> Result<(), Error> {
        for sub in ["leases", "locks", "events"] {
            let path = self.dir.join(sub);
            fs::create_dir_all(&path)
                .map_err(|err| self.io_error("create the store directory", &path, &err))?;
        }
        Ok(())
    }

    fn paths(&self, resource: &str) -> (PathBuf, PathBuf, PathBuf) {
        let name = encode_name(resource);
        (
            self.dir.join("leases").join(format!("{name}.json")),
            self.dir.join("locks").join(format!("{name}.lock")),
            self.dir.join("events").join(format!("{name}.jsonl")),
        )
    }

    fn lock(&self, path: &Path) -> Result<Locked, Error> {
        lock_exclusive(path).map_err(|(what, err)| self.io_error(what, path, &err))
    }

    fn read_record(&self, path: &Path, resource: &str) -> Result<Option<Record>, Error> {
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(self.io_error("read the lease record", path, &err)),
        };
        let record: Record = serde_json::from_slice(&bytes).map_err(|err| {
            Error::internal(
                format!("the lease record `{}` is damaged: {err}", path.display()),
                "move it aside (fence recovers the token counter from the event log) and retry",
            )
        })?;
        if record.resource != resource {
            return Err(Error::internal(
                format!(
                    "`{}` holds the lease of `{}`, not of `{resource}` (shortened names collided)",
                    path.display(),
                    record.resource
                ),
                "use a shorter resource name",
            ));
        }
        Ok(Some(record))
    }

    /// Replaces a lease record atomically; `durable` also waits for the disk.
    ///
    /// Only a grant of a new token must survive a power loss (I1). Renewals, releases and
    /// reacquisitions need not: after a reboot every lease of the earlier boot has expired
    /// anyway (the boot id changed), and a process crash loses nothing the page cache holds.
    fn write_record(&self, path: &Path, record: &Record, durable: bool) -> Result<(), Error> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let tmp = dir.join(format!(".tmp-{}-{:016x}", std::process::id(), random_u64()));
        let body = serde_json::to_vec(record)
            .map_err(|err| Error::internal(err.to_string(), "report this bug"))?;
        let result = (|| -> io::Result<()> {
            let mut file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            file.write_all(&body)?;
            if durable {
                file.sync_all()?;
            }
            fs::rename(&tmp, path)?;
            if durable {
                File::open(dir)?.sync_all()?;
            }
            Ok(())
        })();
        if let Err(err) = result {
            let _ = fs::remove_file(&tmp);
            return Err(self.io_error("write the lease record", path, &err));
        }
        Ok(())
    }

    /// Appends to the event log: an audit trail, written after the record it describes and
    /// not fsynced (a power loss may cost its last lines, never a token).
    fn append_event(&self, path: &Path, event: &EventLine) -> Result<(), Error> {
        let mut line = serde_json::to_vec(event)
            .map_err(|err| Error::internal(err.to_string(), "report this bug"))?;
        line.push(b'\n');
        let result = (|| -> io::Result<()> {
            let mut file = OpenOptions::new().create(true).append(true).open(path)?;
            file.write_all(&line)
        })();
        result.map_err(|err| self.io_error("append to the event log", path, &err))
    }

    fn read_events(&self, path: &Path) -> Result<Vec<EventLine>, Error> {
        let file = match File::open(path) {
            Ok(file) => file,
            Err(err) if err.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(self.io_error("read the event log", path, &err)),
        };
        let mut events = Vec::new();
        for line in BufReader::new(file).lines() {
            let line = line.map_err(|err| self.io_error("read the event log", path, &err))?;
            // A torn last line (crash mid-append) is skipped; its grant was never reported.
            if let Ok(event) = serde_json::from_str::<EventLine>(&line) {
                events.push(event);
            }
        }
        Ok(events)
    }

    /// Runs `change` on a resource's record under its lock.
    fn with_lock<T>(
        &self,
        resource: &str,
        change: impl FnOnce(&Self, Option<Record>, &Path, &Path) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.ensure()?;
        let (lease_path, lock_path, events_path) = self.paths(resource);
        let _lock = self.lock(&lock_path)?;
        let record = self.read_record(&lease_path, resource)?;
        change(self, record, &lease_path, &events_path)
    }

    fn waiters_dir(&self, resource: &str) -> PathBuf {
        self.dir.join("waiters").join(encode_name(resource))
    }

    /// Waiter files with their waiter, or `None` when the process is gone.
    fn read_waiters(&self, dir: &Path) -> Vec<(PathBuf, Option<Waiter>)> {
        let Ok(entries) = fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|entry| {
                let path = entry.path();
                let pid: i32 = path.file_stem()?.to_str()?.parse().ok()?;
                // SAFETY: kill with signal 0 only checks that the process exists.
                let alive = unsafe { libc::kill(pid, 0) } == 0
                    || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
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
    fn waiters(&self, resource: &str) -> Vec<Waiter> {
        let mut waiters: Vec<Waiter> = self
            .read_waiters(&self.waiters_dir(resource))
            .into_iter()
            .filter_map(|(_, w)| w)
            .collect();
        waiters.sort_by_key(|w| w.since_ms);
        waiters
    }

    /// Classifies a renew or release whose owner/token/expiry did not match.
    fn refuse(
        &self,
        op: &str,
        lease: &LeaseRef,
        record: Option<&Record>,
        now: &Now,
        events: &Path,
    ) -> Result<Error, Error> {
        let Some(record) = record else {
            return Ok(Error::Conflict {
                resource: lease.resource.clone(),
                token: lease.token,
                kind: ConflictKind::NoLease,
            });
        };
        let error = if record.token > lease.token {
            Error::Stale {
                resource: lease.resource.clone(),
                token: lease.token,
                highest_token: record.token,
            }
        } else if record.token < lease.token {
            return Ok(Error::Conflict {
                resource: lease.resource.clone(),
                token: lease.token,
                kind: ConflictKind::NeverIssued {
                    highest_token: record.token,
                },
            });
        } else if record.owner != lease.owner {
            return Ok(Error::Conflict {
                resource: lease.resource.clone(),
                token: lease.token,
                kind: ConflictKind::WrongOwner {
                    holder: record.owner.clone(),
                },
            });
        } else {
            Error::LeaseLost {
                resource: lease.resource.clone(),
                owner: lease.owner.clone(),
                token: lease.token,
                reason: if record.released {
                    LostReason::Released
                } else {
                    LostReason::Expired
                },
            }
        };
        let detail = match &error {
            Error::Stale { highest_token, .. } => format!("token {highest_token} issued since"),
            Error::LeaseLost {
                reason: LostReason::Released,
                ..
            } => "released".into(),
            _ => "expired".into(),
        };
        self.append_event(
            events,
            &EventLine {
                at_ms: now.wall_ms,
                kind: format!("{op}_rejected"),
                owner: Some(lease.owner.clone()),
                token: Some(lease.token),
                detail: Some(detail),
            },
        )?;
        Ok(error)
    }
}

#[async_trait(?Send)]
impl Coordinator for FileCoordinator {
    async fn init(&self) -> Result<InitReport, Error> {
        let meta = self.dir.join("fence-store.json");
        let existed = meta.exists();
        self.ensure()?;
        if !existed {
            let body = serde_json::json!({ "format_version": FORMAT_VERSION }).to_string();
            fs::write(&meta, body).map_err(|err| self.io_error("write", &meta, &err))?;
        }
        Ok(InitReport {
            action: if existed { "up_to_date" } else { "created" },
            schema_version: FORMAT_VERSION,
            location: format!("directory `{}`", self.dir.display()),
        })
    }

    async fn acquire(&self, resource: &str, owner: &str, ttl: Duration) -> Result<Grant, Error> {
        let ttl = ttl_ms(ttl);
        self.with_lock(resource, |store, record, lease_path, events_path| {
            let now = Now::read()?;
            let (record, kind) = match record {
                Some(record) if record.is_live(&now, &store.boot_id) => {
                    if record.owner != owner {
                        return Err(Error::Busy {
                            resource: resource.to_owned(),
                            holder: Holder {
                                owner: record.owner.clone(),
                                token: record.token,
                                expires_at_ms: record.expires_at_ms,
                                expires_in_ms: record.expires_in_ms(&now, &store.boot_id),
                            },
                        });
                    }
                    let mut record = record;
                    record.extend(&now, &store.boot_id, ttl);
                    (record, "reacquired")
                }
                previous => {
                    let kind = match &previous {
                        Some(r) if !r.released && r.owner != owner => "taken_over",
                        _ => "acquired",
                    };
                    let highest = match &previous {
                        Some(r) => r.token,
                        // No record: recover the counter from the event log, if any.
                        None => store
                            .read_events(events_path)?
                            .iter()
                            .filter_map(|e| e.token)
                            .max()
                            .unwrap_or(0),
                    };
                    let mut record = Record {
                        resource: resource.to_owned(),
                        owner: owner.to_owned(),
                        token: highest + 1,
                        acquired_at_ms: now.wall_ms,
                        renewed_at_ms: now.wall_ms,
                        expires_at_ms: 0,
                        ttl_ms: ttl,
                        released: false,
                        boot_id: String::new(),
                        expires_boot_ns: 0,
                    };
                    record.extend(&now, &store.boot_id, ttl);
                    (record, kind)
                }
            };
            store.write_record(lease_path, &record, kind != "reacquired")?;
            store.append_event(
                events_path,
                &EventLine {
                    at_ms: now.wall_ms,
                    kind: kind.to_owned(),
                    owner: Some(owner.to_owned()),
                    token: Some(record.token),
                    detail: None,
                },
            )?;
            Ok(Grant {
                lease: record.lease(&Now::read()?, &store.boot_id),
                reacquired: kind == "reacquired",
            })
        })
    }

    async fn renew(&self, lease: &LeaseRef, ttl: Option<Duration>) -> Result<Lease, Error> {
        self.with_lock(&lease.resource, |store, record, lease_path, events_path| {
            let now = Now::read()?;
            match record {
                Some(mut record)
                    if record.token == lease.token
                        && record.owner == lease.owner
                        && record.is_live(&now, &store.boot_id) =>
                {
                    let ttl = ttl.map_or(record.ttl_ms, ttl_ms);
                    record.extend(&now, &store.boot_id, ttl);
                    store.write_record(lease_path, &record, false)?;
                    store.append_event(
                        events_path,
                        &EventLine {
                            at_ms: now.wall_ms,
                            kind: "renewed".into(),
                            owner: Some(lease.owner.clone()),
                            token: Some(lease.token),
                            detail: None,
                        },
                    )?;
                    Ok(record.lease(&Now::read()?, &store.boot_id))
                }
                other => Err(store.refuse("renew", lease, other.as_ref(), &now, events_path)?),
            }
        })
    }

    async fn release(&self, lease: &LeaseRef) -> Result<Released, Error> {
        self.with_lock(&lease.resource, |store, record, lease_path, events_path| {
            let now = Now::read()?;
            match record {
                Some(record)
                    if record.token == lease.token
                        && record.owner == lease.owner
                        && record.released =>
                {
                    Ok(Released::Already)
                }
                Some(mut record) if record.token == lease.token && record.owner == lease.owner => {
                    record.released = true;
                    store.write_record(lease_path, &record, false)?;
                    store.append_event(
                        events_path,
                        &EventLine {
                            at_ms: now.wall_ms,
                            kind: "released".into(),
                            owner: Some(lease.owner.clone()),
                            token: Some(lease.token),
                            detail: None,
                        },
                    )?;
                    Ok(Released::Now)
                }
                other => Err(store.refuse("release", lease, other.as_ref(), &now, events_path)?),
            }
        })
    }

    async fn inspect(
        &self,
        resources: &[String],
        history: usize,
    ) -> Result<Vec<ResourceView>, Error> {
        let now = Now::read()?;
        let mut names: Vec<String> = resources.to_vec();
        if names.is_empty() {
            let leases = self.dir.join("leases");
            let entries = match fs::read_dir(&leases) {
                Ok(entries) => entries,
                Err(err) if err.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
                Err(err) => return Err(self.io_error("list", &leases, &err)),
            };
            for entry in entries {
                let entry = entry.map_err(|err| self.io_error("list", &leases, &err))?;
                let file_name = entry.file_name();
                let Some(file_name) = file_name.to_str() else {
                    continue;
                };
                if file_name.starts_with('.') || !file_name.ends_with(".json") {
                    continue;
                }
                let bytes = fs::read(entry.path())
                    .map_err(|err| self.io_error("read", &entry.path(), &err))?;
                if let Ok(record) = serde_json::from_slice::<Record>(&bytes) {
                    names.push(record.resource);
                }
            }
            names.sort();
        }
        let mut views = Vec::with_capacity(names.len());
        for name in &names {
            let (lease_path, _, events_path) = self.paths(name);
            let mut view = match self.read_record(&lease_path, name)? {
                None => ResourceView::unknown(name),
                Some(record) => {
                    let live = record.is_live(&now, &self.boot_id);
                    let state = if record.released {
                        State::Free
                    } else if live {
                        State::Held
                    } else {
                        State::Expired
                    };
                    ResourceView {
                        resource: name.clone(),
                        state,
                        owner: (state != State::Free).then(|| record.owner.clone()),
                        token: Some(record.token),
                        acquired_at_ms: Some(record.acquired_at_ms),
                        renewed_at_ms: Some(record.renewed_at_ms),
                        expires_at_ms: (state != State::Free).then_some(record.expires_at_ms),
                        waiters: Vec::new(),
                        expires_in_ms: (state != State::Free)
                            .then(|| record.expires_in_ms(&now, &self.boot_id)),
                        events: Vec::new(),
                    }
                }
            };
            view.waiters = self.waiters(name);
            if history > 0 {
                let events = self.read_events(&events_path)?;
                view.events = events
                    .into_iter()
                    .rev()
                    .take(history)
                    .map(|e| Event {
                        at_ms: e.at_ms,
                        kind: e.kind,
                        owner: e.owner,
                        token: e.token,
                        detail: e.detail,
                    })
                    .collect();
            }
            views.push(view);
        }
        Ok(views)
    }

    async fn wait_begin(&self, resource: &str, owner: &str) -> Result<(), Error> {
        let dir = self.waiters_dir(resource);
        fs::create_dir_all(&dir).map_err(|err| self.io_error("create", &dir, &err))?;
        for (path, waiter) in self.read_waiters(&dir) {
            if waiter.is_none() {
                let _ = fs::remove_file(path);
            }
        }
        let since_ms = Now::read()?.wall_ms;
        let body = serde_json::json!({ "owner": owner, "since_ms": since_ms }).to_string();
        let path = dir.join(format!("{}.json", std::process::id()));
        fs::write(&path, body).map_err(|err| self.io_error("write", &path, &err))
    }

    async fn unwait(&self, resource: &str) -> Result<(), Error> {
        let path = self
            .waiters_dir(resource)
            .join(format!("{}.json", std::process::id()));
        match fs::remove_file(&path) {
            Err(err) if err.kind() != ErrorKind::NotFound => {
                Err(self.io_error("remove", &path, &err))
            }
            _ => Ok(()),
        }
    }

    async fn wait_for_release(&self, _resource: &str, max: Duration) -> Result<(), Error> {
        tokio::time::sleep(max).await;
        Ok(())
    }

    fn pushes_wakeups(&self) -> bool {
        false
    }
}

/// A file-name-safe, reversible-looking encoding of a resource name: bytes outside
/// `[A-Za-z0-9_.-]` (and a leading `.`) become `%XX`; names whose encoding is long are cut
/// and suffixed with a 64-bit FNV-1a hash of the full name.
fn encode_name(resource: &str) -> String {
    let mut out = String::with_capacity(resource.len());
    for (i, byte) in resource.bytes().enumerate() {
        let plain =
            byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' || (byte == b'.' && i > 0);
        if plain {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    if out.len() <= 180 {
        return out;
    }
    let mut cut = 120;
    while out.as_bytes()[cut - 1] == b'%' || out.as_bytes()[cut - 2] == b'%' {
        cut -= 1;
    }
    let hash = resource.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{}~{hash:016x}", &out[..cut])
}

#[cfg(test)]
mod tests {
    use super::encode_name;

    #[test]
    fn names_encode_safely() {
        assert_eq!(encode_name("nightly-report"), "nightly-report");
        assert_eq!(encode_name("a/b c"), "a%2Fb%20c");
        assert_eq!(encode_name(".."), "%2E.");
        let long = "ü".repeat(100);
        let encoded = encode_name(&long);
        assert!(encoded.len() < 200, "{encoded}");
        assert_ne!(encoded, encode_name(&"ü".repeat(99)));
    }
}
