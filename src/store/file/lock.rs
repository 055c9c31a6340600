//! The per-resource `flock` that serialises every change to a resource.
//!
//! Lock files (`locks/<name>.lock`) hold nothing; only the lock on them matters, and it ends
//! when the descriptor is closed, so a killed process never leaves a resource locked.

use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::disk::share;

/// An exclusive `flock` on a lock file, held until dropped (the lock ends when the file is
/// closed).
pub(crate) struct Locked {
    _file: File,
}

/// Opens (creating) `path` and takes an exclusive `flock` on it, retrying when interrupted.
/// A lock file fence creates gets the sharing rule of [`share`], so that every user who can
/// write the store's directory can open it. On failure, says which step failed ("open the
/// lock file" or "lock") with the OS error.
pub(crate) fn lock_exclusive(path: &Path) -> Result<Locked, (&'static str, io::Error)> {
    // Never through a symbolic link: in a shared directory another user could point it at
    // a file of ours, which `share` would then open up to the group.
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|err| ("open the lock file", err))?;
    share(&file, path);
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
