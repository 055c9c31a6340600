//! `file:///dir/name` objects: the bytes live at the path itself, so other programs read them
//! as a plain file; the generation and fence's metadata live in a sidecar `.<name>.fence.json`
//! beside it. object_store's `LocalFileSystem` cannot do conditional updates or attributes
//! (DESIGN §7), so this backend is ours.
//!
//! Every read and write of an object happens under an exclusive `flock` on `.<name>.fence.lock`
//! (a reader who may not write the directory takes a shared one through a read-only descriptor),
//! waited for no longer than the access allows (a write's `--timeout`: any process that can read
//! the lock file can hold it, so an unbounded wait could last for ever);
//! a write compares the generation, then commits the bytes and the metadata together: the new
//! bytes go to a temporary file (fsync), the new sidecar to `.<name>.fence.next.json` naming
//! that file's inode (write-to-temp, fsync, rename), then the bytes are renamed over the object
//! — the commit — and the next sidecar over the sidecar, each followed by a directory fsync.
//! Whoever takes the exclusive lock next finishes or undoes a write a crash interrupted: a next
//! sidecar whose inode is the object's was committed (it becomes the sidecar), any other is
//! dropped; a reader under the shared lock changes nothing and judges the files the same way. So
//! the metadata (token, write ids) never describes bytes that did not land, nor the reverse.
//! Generations increase by one per write and never repeat. A file written at the path without
//! fence has generation 1 and no token until fence writes it.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::object::{Cond, Fetched, Meta, ObjectApi, Put, VersionKinds};
use crate::sys::{lock_exclusive_until, lock_shared_until, Locked};

pub struct LocalObjects {
    dir: PathBuf,
    /// Counts the bytes of object bodies written (hidden unless `fence write` shows it).
    bar: ProgressBar,
    /// How long an object's lock is waited for (a write's `--timeout`), and until when.
    lock_wait: Duration,
    deadline: Instant,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Sidecar {
    generation: u64,
    last_modified_ms: i64,
    metadata: BTreeMap<String, String>,
    /// In a next sidecar only: the inode of the bytes it describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    inode: Option<u64>,
}

fn io_error(what: &str, path: &Path, err: &io::Error) -> Error {
    let message = format!("cannot {what} `{}`: {err}", path.display());
    match err.kind() {
        ErrorKind::PermissionDenied | ErrorKind::NotFound | ErrorKind::NotADirectory => {
            Error::usage(
                message,
                "check that the directory exists and fence may write to it",
            )
        }
        // Every write is a new file renamed into place (a failed rename's sync is
        // `rename_into`'s): one that fails for want of space changed nothing (it was exit 1,
        // "internal": review 21).
        _ => crate::sys::limit_error(&message, err)
            .unwrap_or_else(|| Error::internal(message, "check the disk, then retry")),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl LocalObjects {
    /// Objects in `dir`; every access gives up on an object's lock `lock_wait` from now.
    pub fn new(dir: PathBuf, bar: ProgressBar, lock_wait: Duration) -> LocalObjects {
        LocalObjects {
            dir,
            bar,
            lock_wait,
            deadline: Instant::now() + lock_wait,
        }
    }

    /// The temporary file a write of `key`'s bytes (`part` "") or of its next sidecar (`part`
    /// "next.") goes through. One fixed name per object: writes of an object hold its lock, so
    /// no two use it at once, and the next write replaces what a crashed one left.
    fn temp(&self, key: &str, part: &str) -> PathBuf {
        self.dir.join(format!(".{key}.fence.{part}tmp"))
    }

    fn paths(&self, key: &str) -> (PathBuf, PathBuf, PathBuf) {
        (
            self.dir.join(key),
            self.dir.join(format!(".{key}.fence.json")),
            self.dir.join(format!(".{key}.fence.lock")),
        )
    }

    fn next_sidecar(sidecar: &Path) -> PathBuf {
        sidecar.with_extension("next.json")
    }

    /// The next sidecar a crashed write left, if any, and whether its bytes landed (were
    /// renamed over the object, whose inode it names). Changes nothing.
    fn pending(&self, object: &Path, sidecar: &Path) -> Result<Option<(Sidecar, bool)>, Error> {
        let next = Self::next_sidecar(sidecar);
        let pending: Sidecar = match fs::read(&next) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_default(),
            Err(err) if err.kind() == ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(io_error("read", &next, &err)),
        };
        let landed = match fs::metadata(object) {
            Ok(meta) => pending.inode == Some(meta.ino()),
            Err(err) if err.kind() == ErrorKind::NotFound => false,
            Err(err) => return Err(io_error("read", object, &err)),
        };
        Ok(Some((pending, landed)))
    }

    /// Finishes or undoes a write a crash interrupted (call under the exclusive lock): the
    /// next sidecar of bytes that were renamed into place becomes the sidecar; any other is
    /// dropped.
    fn settle(&self, object: &Path, sidecar: &Path) -> Result<(), Error> {
        let Some((_, landed)) = self.pending(object, sidecar)? else {
            return Ok(());
        };
        let next = Self::next_sidecar(sidecar);
        let done = if landed {
            fs::rename(&next, sidecar)
        } else {
            fs::remove_file(&next)
        };
        done.and_then(|()| File::open(&self.dir)?.sync_all())
            .map_err(|err| io_error("write", sidecar, &err))
    }

    /// Fails (exit 2) unless the object's directory exists: a missing one is a typo in the
    /// URL, never an object that is merely absent (as a missing bucket is on S3 and GCS).
    fn check_dir(&self) -> Result<(), Error> {
        match fs::metadata(&self.dir) {
            Ok(meta) if meta.is_dir() => Ok(()),
            Ok(_) => Err(Error::usage(
                format!("`{}` is not a directory", self.dir.display()),
                "fix the path in the URL: `file:///dir/name` names the file `name` in the directory `dir`",
            )),
            Err(err) if err.kind() == ErrorKind::NotFound => Err(Error::usage(
                format!("the directory `{}` does not exist", self.dir.display()),
                "fix the path in the URL, or create the directory (`mkdir -p`) before the first write",
            )),
            Err(err) => Err(io_error("read", &self.dir, &err)),
        }
    }

    fn lock(&self, path: &Path) -> Result<Locked, Error> {
        lock_exclusive_until(path, self.deadline)
            .map_err(|(what, err)| io_error(what, path, &err))?
            .ok_or_else(|| self.still_locked(path))
    }

    /// The lock a read takes, and whether under it a crashed write may be settled. A reader
    /// who may not write the directory (or the lock file) takes a shared lock through a
    /// read-only descriptor, which excludes writers all the same, and settles nothing. Without
    /// a lock file, and unable to create one, no fence write has begun here: nothing to wait for.
    fn lock_for_read(&self, path: &Path) -> Result<(Option<Locked>, bool), Error> {
        let read_only = |err: &io::Error| {
            err.kind() == ErrorKind::PermissionDenied || err.raw_os_error() == Some(libc::EROFS)
        };
        match lock_exclusive_until(path, self.deadline) {
            Ok(Some(lock)) => Ok((Some(lock), true)),
            Ok(None) => Err(self.still_locked(path)),
            Err((_, err)) if read_only(&err) => match lock_shared_until(path, self.deadline) {
                Ok(Some(lock)) => Ok((Some(lock), false)),
                Ok(None) => Err(self.still_locked(path)),
                Err((_, err)) if err.kind() == ErrorKind::NotFound => Ok((None, false)),
                Err((what, err)) => Err(io_error(what, path, &err)),
            },
            Err((what, err)) => Err(io_error(what, path, &err)),
        }
    }

    /// The lock was still held at the deadline: nothing was done, and its holder may be any
    /// process that can read the lock file, so it is named for the operator to find.
    fn still_locked(&self, lock: &Path) -> Error {
        Error::unavailable(
            format!(
                "the lock file `{}` was still locked after {}: another fence write to the object is under way or paused (a stopped or swapped-out process), or another local process that can read the file holds a lock on it; nothing was changed",
                lock.display(),
                crate::time::duration(self.lock_wait)
            ),
            format!(
                "find the holder with `fuser -v {}` (or `lsof`); it is safe to retry, with a longer --timeout if a slow write holds it",
                crate::error::shell_word(&lock.display().to_string())
            ),
        )
    }

    /// The current state (call under the lock): `None` when the object is absent. With
    /// `settle` (the exclusive lock) a crashed write is finished or undone first; without it
    /// (a reader's shared lock) the state is judged as settling would leave it.
    ///
    /// An object removed by hand (`rm`) whose sidecar is still there is still there for fence,
    /// empty: its sidecar keeps the highest token it accepted and its write ids, so a stale
    /// writer stays refused, an id is still a replay, and generations go on counting up.
    fn state(&self, object: &Path, sidecar: &Path, settle: bool) -> Result<Option<Sidecar>, Error> {
        // A link's name has a sidecar of its own (none), so a write through `current ->
        // data` was checked against no token and renamed over the link: a stale holder's
        // bytes where every reader of `current` looks, with exit 0 (review 15).
        if let Ok(meta) = fs::symlink_metadata(object) {
            if meta.file_type().is_symlink() {
                let file = fs::canonicalize(object).map_or_else(
                    |_| "the file it points to".to_owned(),
                    |file| format!("`file://{}`", file.display()),
                );
                return Err(Error::usage(
                    format!(
                        "`{}` is a symbolic link: fence keeps a file's token beside the file's own name, so it neither reads nor writes through a link (a write would check no token and replace the link); nothing was read or written",
                        object.display()
                    ),
                    format!("name the file itself, {file}"),
                ));
            }
        }
        let landed = if settle {
            self.settle(object, sidecar)?;
            None
        } else {
            match self.pending(object, sidecar)? {
                Some((next, true)) => Some(next),
                _ => None,
            }
        };
        if let Some(next) = landed {
            return Ok(Some(Sidecar {
                inode: None,
                ..next
            }));
        }
        let recorded = match fs::read(sidecar) {
            Ok(bytes) => Some(serde_json::from_slice::<Sidecar>(&bytes).map_err(|err| {
                Error::internal(
                    format!("the sidecar `{}` is damaged: {err}", sidecar.display()),
                    "restore it from a backup, or move it aside (the object then counts as unfenced)",
                )
            })?),
            Err(err) if err.kind() == ErrorKind::NotFound => None,
            Err(err) => return Err(io_error("read", sidecar, &err)),
        };
        match fs::metadata(object) {
            // An object written without fence has no sidecar: generation 1, no metadata.
            Ok(meta) => Ok(Some(recorded.unwrap_or_else(|| {
                Sidecar {
                    generation: 1,
                    last_modified_ms: meta
                        .modified()
                        .ok()
                        .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
                        .map_or(0, |d| d.as_millis() as i64),
                    metadata: BTreeMap::new(),
                    inode: None,
                }
            }))),
            Err(err) if err.kind() == ErrorKind::NotFound => Ok(recorded),
            Err(err) => Err(io_error("read", object, &err)),
        }
    }

    /// Replaces `path` atomically with `bytes` through `tmp` (durable once this returns),
    /// counting them on `bar` as they are written. Call under the object's lock.
    fn replace(
        &self,
        tmp: PathBuf,
        path: &Path,
        bytes: &[u8],
        bar: &ProgressBar,
    ) -> Result<(), Error> {
        let tmp = self.write_temp(tmp, path, bytes, bar)?;
        self.rename_into(&tmp, path)
    }

    /// Writes `bytes` to the temporary file `tmp` meant for `path` (fsynced), counting them on
    /// `bar`. Call under the object's lock: whatever is at `tmp` is a crashed write's leftover
    /// and is removed first; the file is then created new, never opened through a link.
    fn write_temp(
        &self,
        tmp: PathBuf,
        path: &Path,
        bytes: &[u8],
        bar: &ProgressBar,
    ) -> Result<PathBuf, Error> {
        let result = (|| -> io::Result<()> {
            match fs::remove_file(&tmp) {
                Err(err) if err.kind() != ErrorKind::NotFound => return Err(err),
                _ => {}
            }
            let mut file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            bar.set_length(bytes.len() as u64);
            bar.set_position(0);
            for chunk in bytes.chunks(1 << 20) {
                file.write_all(chunk)?;
                bar.inc(chunk.len() as u64);
            }
            file.sync_all()
        })();
        match result {
            Ok(()) => Ok(tmp),
            Err(err) => {
                let _ = fs::remove_file(&tmp);
                Err(io_error("write", path, &err))
            }
        }
    }

    /// Renames `tmp` over `path` and makes the rename durable. The directory is opened
    /// first, so that an error before the rename changed nothing; a failed fsync after it is
    /// an unknown outcome (the rename stands, a power loss may take it back).
    fn rename_into(&self, tmp: &Path, path: &Path) -> Result<(), Error> {
        let renamed = File::open(&self.dir).and_then(|dir| fs::rename(tmp, path).map(|()| dir));
        let dir = renamed.map_err(|err| {
            let _ = fs::remove_file(tmp);
            io_error("write", path, &err)
        })?;
        dir.sync_all().map_err(|err| Error::OutcomeUnknown {
            message: format!(
                "`{}` was written, but the disk did not confirm it: {err}",
                path.display()
            ),
            hint: "check the disk (dmesg), then read the object back: the write stands unless a power loss takes it back".into(),
            source: None,
        })
    }

    fn meta(state: Sidecar) -> Meta {
        Meta {
            version: state.generation.to_string(),
            last_modified_ms: state.last_modified_ms,
            metadata: state.metadata,
        }
    }
}

#[async_trait(?Send)]
impl ObjectApi for LocalObjects {
    async fn get(&self, key: &str) -> Result<Option<Fetched>, Error> {
        let (object, sidecar, lock) = self.paths(key);
        self.check_dir()?;
        let (_lock, settle) = self.lock_for_read(&lock)?;
        let Some(state) = self.state(&object, &sidecar, settle)? else {
            return Ok(None);
        };
        let body = match fs::read(&object) {
            Ok(body) => body,
            // Removed by hand, its sidecar kept (see `state`): an empty object.
            Err(err) if err.kind() == ErrorKind::NotFound => Vec::new(),
            Err(err) => return Err(io_error("read", &object, &err)),
        };
        Ok(Some(Fetched {
            meta: Self::meta(state),
            body,
        }))
    }

    async fn head(&self, key: &str) -> Result<Option<Meta>, Error> {
        let (object, sidecar, lock) = self.paths(key);
        self.check_dir()?;
        let (_lock, settle) = self.lock_for_read(&lock)?;
        Ok(self.state(&object, &sidecar, settle)?.map(Self::meta))
    }

    async fn put(
        &self,
        key: &str,
        body: Vec<u8>,
        cond: &Cond,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Put, Error> {
        let (object, sidecar, lock) = self.paths(key);
        self.check_dir()?;
        let _lock = self.lock(&lock)?;
        let current = self.state(&object, &sidecar, true)?;
        let holds = match (cond, &current) {
            (Cond::None, _) => true,
            (Cond::Create, current) => current.is_none(),
            (Cond::Match(version), Some(state)) => state.generation.to_string() == *version,
            (Cond::Match(_), None) => false,
        };
        if !holds {
            return Ok(Put::Lost);
        }
        // The bytes first, out of sight; then the sidecar that names them; then the commit.
        let bytes = self.write_temp(self.temp(key, ""), &object, &body, &self.bar)?;
        let inode = fs::metadata(&bytes)
            .map_err(|err| io_error("write", &object, &err))?
            .ino();
        let mut next = Sidecar {
            generation: current.map_or(0, |s| s.generation) + 1,
            last_modified_ms: now_ms(),
            metadata: metadata.clone(),
            inode: Some(inode),
        };
        let text = serde_json::to_vec(&next)
            .map_err(|err| Error::internal(err.to_string(), "report this bug"))?;
        let pending = Self::next_sidecar(&sidecar);
        if let Err(err) = self.replace(
            self.temp(key, "next."),
            &pending,
            &text,
            &ProgressBar::hidden(),
        ) {
            let _ = fs::remove_file(&bytes);
            // The sidecar that would name the bytes is not the commit: nothing was applied.
            return Err(match err {
                Error::OutcomeUnknown { message, .. } => Error::unavailable(
                    message,
                    "nothing was applied (the object is as it was): check the disk (dmesg), then retry",
                ),
                other => other,
            });
        }
        if let Err(err) = self.rename_into(&bytes, &object) {
            // Whether the rename happened decides, as after a crash.
            let _ = self.settle(&object, &sidecar);
            return Err(err);
        }
        // Committed: a failure from here on is finished by the next access (see `settle`).
        let _ = self.settle(&object, &sidecar);
        next.inode = None;
        Ok(Put::Done(Self::meta(next)))
    }

    async fn list(&self, _prefix: &str) -> Result<Vec<String>, Error> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(io_error("list", &self.dir, &err)),
        };
        Ok(entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| !name.starts_with('.'))
            .collect())
    }

    async fn delete(&self, key: &str) -> Result<(), Error> {
        let (object, sidecar, lock) = self.paths(key);
        let _lock = self.lock(&lock)?;
        let pending = Self::next_sidecar(&sidecar);
        let temps = [self.temp(key, ""), self.temp(key, "next.")];
        for path in [object, sidecar, pending].into_iter().chain(temps) {
            match fs::remove_file(&path) {
                Err(err) if err.kind() != ErrorKind::NotFound => {
                    return Err(io_error("remove", &path, &err))
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn clock_resolution_ms(&self) -> i64 {
        1
    }

    fn version_kinds(&self) -> VersionKinds {
        VersionKinds {
            etag: false,
            generation: true,
        }
    }
}
