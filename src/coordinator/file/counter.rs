//! The durable high-water mark: `tokens/<name>.high` holds the highest token ever issued
//! for a resource, fsynced before the token is handed out.
//!
//! Why a third copy: the lease record and the event log each hold the highest token too,
//! but either can be lowered by one ordinary accident — a record restored from a backup or
//! snapshot, a damaged record moved aside, a log whose unsynced tail a power loss took. The
//! next token is one above the maximum of all three, so no single lowered or lost file can
//! make a token be issued twice; a record below the mark is reported as restored or rolled
//! back. (Restoring the whole store directory from one older copy lowers all three at once:
//! docs/guarantees.md says not to.)
//!
//! The file is 21 bytes (the token right-aligned in 20 columns and a newline), created by
//! write-and-rename and then rewritten in place: a write this small, inside one sector, lands
//! whole or not at all.

use std::fs::{self, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// What a high-water file holds.
pub(super) enum Mark {
    /// No file yet (a resource from before high-water files, or one never granted).
    Missing,
    Token(i64),
    /// The file exists but does not hold a number: what it holds instead.
    Damaged(String),
}

pub(super) fn read(path: &Path) -> io::Result<Mark> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(Mark::Missing),
        Err(err) => return Err(err),
    };
    let text = String::from_utf8_lossy(&bytes);
    Ok(match text.trim().parse::<i64>() {
        Ok(token) if token >= 0 => Mark::Token(token),
        _ => Mark::Damaged(format!(
            "it holds {} bytes that are not a token",
            bytes.len()
        )),
    })
}

/// Records `token` as the high-water mark and waits for the disk (file, and the directory
/// when the file is new).
pub(super) fn write(path: &Path, token: i64) -> io::Result<()> {
    let line = format!("{token:>20}\n");
    if !path.exists() {
        // A new file appears whole or not at all: created empty and then written, one cut
        // short (a full disk, `ulimit -f`) stayed damaged, and every later grant failed until
        // it was moved aside (review 21).
        return crate::sys::replace(path, line.as_bytes(), true);
    }
    // Never through a symbolic link (see `sys::lock_exclusive_until`): it is rewritten in place.
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.write_all_at(line.as_bytes(), 0)?;
    file.set_len(21)?;
    file.sync_data()
}
