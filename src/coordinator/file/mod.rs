//! The local-directory coordinator (`file:///dir`), the embedded default store.
//!
//! Safe for many processes on one machine: every change to a resource happens under an
//! exclusive `flock` on its lock file ([`lock`]), and lease records ([`record`]) are
//! replaced by write-to-temp and rename ([`disk`]). A grant of a new token first raises the
//! resource's durable high-water mark ([`counter`]), then writes the record (not synced: the
//! mark alone must survive a power loss, see `FileCoordinator::write_record`), then
//! appends to the event log ([`log`]); the next token is above the record's, the mark's and
//! the log's, so no single restored, damaged or lost file makes a token be issued twice (I1).
//! A change whose history entry cannot be written is undone and refused (exit 7).
//!
//! Layout: `leases/<name>.json`, `locks/<name>.lock`, `events/<name>.jsonl`,
//! `tokens/<name>.high`, `attempts/<name>.json` (refused attempts, see [`attempts`]), where `<name>` is the resource percent-encoded (long names are
//! shortened and suffixed with a hash; the full name is stored inside the record and checked
//! on every read). Operations: [`ops`] (acquire, renew, release), [`view`] (inspect),
//! [`waiters`] (who waits, for `--wait`).

mod attempts;
mod counter;
mod log;
mod ops;
mod record;
mod view;
mod waiters;

use std::fs;
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};

use crate::error::Error;

use log::EventLine;
use record::Record;

const FORMAT_VERSION: i32 = 1;

/// The missing parent that keeps the store at `dir` from being created: a store that does not
/// exist yet is created only below an existing directory, except the embedded default (whose
/// parents, `~/.local/state`, a fresh machine may lack). `fence doctor` applies the same rule.
pub fn refused_parent(dir: &Path) -> Option<&Path> {
    let parent = dir.parent().filter(|p| !dir.exists() && !p.exists())?;
    let default = crate::config::default_store_dir().ok();
    (default.as_deref() != Some(dir)).then_some(parent)
}

/// Fails (a usage error naming the missing parent) when the store at `dir` may not be created
/// (see [`refused_parent`]).
pub fn check_parent(dir: &Path) -> Result<(), Error> {
    let Some(parent) = refused_parent(dir) else {
        return Ok(());
    };
    Err(Error::usage(
        format!(
            "the store directory `{}` cannot be created: its parent `{}` does not exist",
            dir.display(),
            parent.display()
        ),
        format!(
            "check the path in --store (FENCE_STORE) for a typo; if it is right, create the parent first: mkdir -p {}",
            crate::error::shell_word(&parent.to_string_lossy())
        ),
    ))
}

/// Directories of the kernel's pseudo file systems: never a place for a store.
const KERNEL_DIRS: [&str; 3] = ["/proc", "/sys", "/dev"];

pub struct FileCoordinator {
    dir: PathBuf,
    boot_id: String,
    /// The refused attempts this process has recorded (a waiter's retries are one attempt).
    attempted: crate::coordinator::Attempted,
    /// The store's directories were found or made by this coordinator ([`Self::ensure`]):
    /// later operations only look that they are still there (a `fence run` locks its
    /// resource four times, and `mkdir` of each directory that exists cost more than a look).
    ensured: std::sync::atomic::AtomicBool,
}

/// The files of one resource.
struct Paths {
    lease: PathBuf,
    lock: PathBuf,
    events: PathBuf,
    high: PathBuf,
    /// What the last grant learnt of the log (see `log::highest_token_seen`).
    seen: PathBuf,
    /// What this grant learnt of the log, written to `seen` once its own writes are done.
    learnt: std::cell::RefCell<Option<log::Seen>>,
    attempts: PathBuf,
    /// The change the log's last line follows, as `FileCoordinator::catch_up` found it (0:
    /// none, or a line of an older version): the next change is numbered above it and the
    /// record's, so that a record lost or restored from an older copy does not number its
    /// next change at or below what the log already holds.
    logged: std::cell::Cell<u64>,
}

/// Where the kernel gives this boot's id.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

impl FileCoordinator {
    pub fn open(dir: &Path) -> Result<FileCoordinator, Error> {
        let shown = dir.display();
        if dir.as_os_str().as_encoded_bytes().contains(&0) {
            return Err(Error::usage(
                format!(
                    "the store path `{}` contains a NUL byte (`%00`)",
                    shown.to_string().escape_default()
                ),
                "write the directory's path after `file://` without `%00`",
            ));
        }
        if KERNEL_DIRS.iter().any(|k| dir.starts_with(k)) {
            return Err(Error::usage(
                format!("`{shown}` is inside a kernel pseudo file system, not a directory that can keep leases"),
                "choose a directory on a real disk with `--store file:///path` (or FENCE_STORE)",
            ));
        }
        // A lease of this boot is told from one of an earlier boot by the boot id; a process
        // that could not read it (no /proc: a chroot, a masked file) took every live lease
        // for one of another boot, and its own looked expired to everyone (review 17).
        // Only a missing or empty file is a missing /proc: out of descriptors, the reading
        // failed too, and the operator was sent to mount /proc (review 21).
        let boot_id = match fs::read_to_string(BOOT_ID) {
            Ok(text) => text.trim().to_owned(),
            Err(err) => {
                let message = format!("cannot read this boot's id from `{BOOT_ID}`: {err}");
                if let Some(limit) = crate::sys::limit_error(&message, &err) {
                    return Err(limit);
                }
                String::new()
            }
        };
        if boot_id.is_empty() {
            return Err(Error::usage(
                format!("cannot read this boot's id from `{BOOT_ID}`: the directory store `{shown}` tells a lease of this boot from one of an earlier boot by it, and would take every live lease for an earlier boot's"),
                "run fence where /proc is mounted (in a chroot or container: mount proc there), or use a PostgreSQL or object store",
            ));
        }
        Ok(FileCoordinator {
            dir: dir.to_owned(),
            boot_id,
            attempted: crate::coordinator::Attempted::default(),
            ensured: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn io_error(&self, what: &str, path: &Path, err: &io::Error) -> Error {
        let message = format!("cannot {what} `{}`: {err}", path.display());
        match err.kind() {
            // Not a permission: the whole file system (mounted read-only, or remounted so by
            // the kernel after disk errors). It was told to "fix its permissions" (review 21).
            ErrorKind::ReadOnlyFilesystem => Error::usage(
                format!("{message} (the file system holding the store is read-only)"),
                "remount it read-write if it was mounted so on purpose; if the kernel remounted it after disk errors (see dmesg), fix the disk or choose another directory with `--store file:///path` (or FENCE_STORE); nothing was applied",
            ),
            ErrorKind::PermissionDenied | ErrorKind::NotADirectory => {
                Error::usage(
                    message,
                    "choose a directory fence can write with `--store file:///path` (or FENCE_STORE), or fix its permissions",
                )
            }
            // A write that fails for want of space leaves the lease as it was.
            _ => crate::sys::limit_error(&message, err).unwrap_or_else(|| {
                Error::internal(message, "check the disk and the store directory, then retry")
            }),
        }
    }

    /// Creates the store's directories (idempotent). A store whose parent directory does
    /// not exist is refused, unless it is the embedded default: `file:///var/lib/fnece/x`,
    /// mistyped, would otherwise be created silently, with all its parents, and guard a
    /// private set of leases no other process sees.
    ///
    /// A store created here, other than the default, is announced on stderr, naming its path:
    /// a typo in `--store` then shows in the first cron mail instead of a lease nobody else
    /// sees. `fence init` ([`Self::create`]) creates a store on purpose, parents included.
    fn ensure(&self) -> Result<(), Error> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.ensured.load(Relaxed) && self.directories().iter().all(|dir| dir.is_dir()) {
            return Ok(());
        }
        check_parent(&self.dir)?;
        let default = crate::config::default_store_dir().ok();
        // Of the commands that find the store missing at once, exactly one makes its
        // directory (`mkdir` is atomic), and that one says so.
        let made = default.as_deref() != Some(self.dir.as_path())
            && match fs::create_dir(&self.dir) {
                Ok(()) => true,
                Err(err) if err.kind() == ErrorKind::AlreadyExists => false,
                Err(err) => {
                    return Err(self.io_error("create the store directory", &self.dir, &err))
                }
            };
        self.create_directories()?;
        self.ensured.store(true, Relaxed);
        if made {
            crate::terminal::warn(&format!(
                "note: created the store directory `{}`: a new, empty store (leases in any other store do not count here); if you meant another, check --store (FENCE_STORE)",
                self.dir.display()
            ));
        }
        Ok(())
    }

    /// Creates the store's directories, and any missing parent of the store's own (`fence
    /// init`: asked for, so neither refused nor announced).
    fn create(&self) -> Result<(), Error> {
        self.create_directories()
    }

    fn create_directories(&self) -> Result<(), Error> {
        for path in self.directories() {
            fs::create_dir_all(&path)
                .map_err(|err| self.io_error("create the store directory", &path, &err))?;
        }
        Ok(())
    }

    fn directories(&self) -> [PathBuf; 4] {
        ["leases", "locks", "events", "tokens"].map(|sub| self.dir.join(sub))
    }

    fn paths(&self, resource: &str) -> Paths {
        let name = encode_name(resource);
        Paths {
            lease: self.dir.join("leases").join(format!("{name}.json")),
            lock: self.dir.join("locks").join(format!("{name}.lock")),
            events: self.dir.join("events").join(format!("{name}.jsonl")),
            high: self.dir.join("tokens").join(format!("{name}.high")),
            seen: self.dir.join("tokens").join(format!("{name}.seen")),
            learnt: std::cell::RefCell::new(None),
            attempts: self.dir.join("attempts").join(format!("{name}.json")),
            logged: std::cell::Cell::new(0),
        }
    }

    fn read_record(&self, paths: &Paths, resource: &str) -> Result<Option<Record>, Error> {
        let path = &paths.lease;
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(self.io_error("read the lease record", path, &err)),
        };
        if bytes.iter().all(|&byte| byte == 0) {
            // What a power loss leaves of a record put in place before its bytes reached the
            // disk (records are not synced; a file exchanged into place is written back within
            // the kernel's 30 s, see `sys::replace`): empty (ext4's ordered data, XFS), or as
            // long as it was but zeros (its blocks never written: ext4 without a journal). As
            // if missing, the next token continuing above the synced high-water mark. Its
            // holders, local processes, died with the machine.
            return Ok(None);
        }
        let record: Record = serde_json::from_slice(&bytes).map_err(|err| {
            Error::internal(
                format!(
                    "the lease record `{}` is damaged ({err}): a power loss while fence rewrote it (lease records are not synced to disk) or an edit by hand leaves it so",
                    path.display()
                ),
                format!(
                    "move it aside and retry: the next token continues above the high-water mark in `{}` and the event log, so no token is issued twice (the lease it described, if live, is lost)",
                    paths.high.display()
                ),
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

    /// The highest token issued by the high-water file and the log (not the record). What
    /// the log read learnt is kept in `paths.learnt`, for a grant to write once its own
    /// writes are done (see `log::highest_token_seen`); other callers leave it unused.
    fn issued(&self, paths: &Paths) -> Result<i64, Error> {
        let mark = match counter::read(&paths.high)
            .map_err(|err| self.io_error("read the high-water mark", &paths.high, &err))?
        {
            counter::Mark::Token(token) => token,
            counter::Mark::Missing => 0,
            counter::Mark::Damaged(what) => {
                return Err(Error::internal(
                    format!("the high-water file `{}` is damaged: {what}", paths.high.display()),
                    "move it aside and retry: the next token continues above the lease record and the event log",
                ))
            }
        };
        let (logged, learnt) = log::highest_token_seen(&paths.events, &paths.seen)
            .map_err(|err| self.io_error("read the event log", &paths.events, &err))?;
        paths.learnt.replace(learnt);
        Ok(mark.max(logged.unwrap_or(0)))
    }

    /// The highest token issued, for telling a restored or rolled-back lease record (its
    /// token below it) from the live one on every operation: the high-water mark, or, only
    /// when it is missing or damaged, [`Self::issued`] (which reads the log too; 0 if that
    /// fails as well).
    fn marked(&self, paths: &Paths) -> i64 {
        match counter::read(&paths.high) {
            Ok(counter::Mark::Token(token)) => token,
            _ => self.issued(paths).unwrap_or(0),
        }
    }

    /// Replaces a lease record atomically, without waiting for the disk: no change of a
    /// record must survive a power loss. A grant's token already has, in the high-water mark
    /// (synced before the record is written: I1), and after a reboot every lease of the
    /// earlier boot has expired anyway (the boot id changed) and its holders, local processes,
    /// died with the machine; a record the power loss took back (to an earlier one, empty, or
    /// zeros: one exchanged into place is written out only within the kernel's writeback
    /// delay, see `sys::replace`) is older than the mark and no one's lease. A process crash loses nothing the page
    /// cache holds. (Until issue 37 a grant's record was synced too, file and directory: two
    /// of its three syncs, 0.4 ms of a `fence run`; the model of the store, which loses power
    /// and keeps of each file what was synced or cached, holds I1, I3 and fencing without it.)
    fn write_record(&self, path: &Path, record: &Record) -> Result<(), Error> {
        let body = serde_json::to_vec(record)
            .map_err(|err| Error::internal(err.to_string(), "report this bug"))?;
        crate::sys::replace(path, &body, false)
            .map_err(|err| self.io_error("write the lease record", path, &err))
    }

    /// Writes `record` as the resource's next change (numbered above `previous`, the change
    /// of the record it replaces, and above the log's last line), carrying its `event`, and
    /// appends `event`; when the append fails, writes `undo` back and refuses (exit 7:
    /// nothing applied), or, if even that fails, reports the outcome as unknown (exit 8).
    /// `what` completes "the lease on `r` was not …".
    fn commit(
        &self,
        paths: &Paths,
        record: &Record,
        undo: &Record,
        event: &EventLine,
        previous: u64,
        what: &str,
    ) -> Result<(), Error> {
        let change = previous.max(paths.logged.get()) + 1;
        let event = &EventLine {
            change: Some(change),
            ..event.clone()
        };
        let record = &Record {
            change,
            event: Some(event.clone()),
            ..record.clone()
        };
        self.write_record(&paths.lease, record)?;
        let Err(err) = log::append(&paths.events, event) else {
            paths.logged.set(change);
            if log::is_long(&paths.events) {
                let pruned = self
                    .issued(paths)
                    .map_err(|err| err.to_string())
                    .and_then(|high| {
                        log::prune(&paths.events, high.max(record.token), event.at_ms)
                            .map_err(|err| err.to_string())
                    });
                if let Err(err) = pruned {
                    crate::terminal::warn(&format!(
                        "warning: cannot prune the event log `{}`: {err}; it keeps growing until that succeeds",
                        paths.events.display()
                    ));
                }
            }
            return Ok(());
        };
        let events = paths.events.display();
        let resource = &record.resource;
        match self.write_record(&paths.lease, undo) {
            Ok(()) => Err(Error::unavailable(
                format!("the lease on `{resource}` was not {what}: its history could not be written to `{events}`: {err}"),
                "free disk space or raise the file size limit (ulimit -f), then retry; nothing was applied (a token this used up is never issued again)",
            )),
            Err(undo_err) => Err(Error::OutcomeUnknown {
                message: format!(
                    "the lease on `{resource}` was {what} with token {}, but its history could not be written to `{events}` ({err}) and undoing it failed: {undo_err}",
                    record.token
                ),
                hint: format!(
                    "fix the disk, then run `fence inspect {}` to see whether the lease is held, and release it with its owner and token if so",
                    crate::error::resource_word(resource)
                ),
                source: None,
            }),
        }
    }
}

/// What a late event's detail says.
const RECORDED_LATE: &str = "recorded late: this change was missing from the log (the process that made it was killed before writing it here, or the line was lost)";

impl FileCoordinator {
    /// Appends the event of the record's last change when the log does not have it: its
    /// process was killed between writing the record and appending the event (or a power
    /// loss took the log's last lines). The log's last line tells: every line after a change
    /// carries its number. Run under the resource's lock before anything else is appended; a
    /// failure is a warning (the history misses the event, the lease is as the record says).
    fn catch_up(&self, paths: &Paths, record: Option<&Record>) {
        let last = log::last_change(&paths.events);
        if let Ok(Some(Some(logged))) = last {
            paths.logged.set(logged);
        }
        let Some(record) = record else {
            return;
        };
        let appended = match last {
            Ok(last) => match unlogged(record, last.flatten(), RECORDED_LATE) {
                Some(late) => log::append(&paths.events, &late),
                None => return,
            },
            Err(err) => Err(err),
        };
        match appended {
            Ok(()) => paths.logged.set(paths.logged.get().max(record.change)),
            Err(err) => crate::terminal::warn(&format!(
                "warning: the history `{}` misses the last change of `{}` (token {}), and it cannot be added: {err}",
                paths.events.display(),
                record.resource,
                record.token
            )),
        }
    }
}

/// What a pending event's detail says (`inspect` before the next change records it late).
const NOT_LOGGED_YET: &str = "not in the log yet: the process that made this change was killed before writing it there, or a power loss took the line; the record holds it, and the next change of the resource records it in the log";

/// The event of `record`'s last change, with `note` added to its detail, when the log does
/// not have it: `last` is the change number of the log's last line (`None`: no line, or a
/// line of an older version, which never follows a record's event — only this version writes
/// one).
fn unlogged(record: &Record, last: Option<u64>, note: &str) -> Option<EventLine> {
    let event = record.event.as_ref()?;
    if last.is_some_and(|logged| logged >= record.change) {
        return None;
    }
    let detail = match &event.detail {
        Some(detail) => format!("{detail}; {note}"),
        None => note.to_owned(),
    };
    Some(EventLine {
        detail: Some(detail),
        ..event.clone()
    })
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
