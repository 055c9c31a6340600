//! File mechanics shared by the parts of the store: atomic replacement, the permission rule
//! for a shared store, and the sweep of temporary files left by killed processes.
//!
//! Sharing rule: a file fence creates in a store directory gets that directory's read and
//! write bits (`dir mode & 0o666`), whatever the creating process's umask. A store shared by
//! a group (`chmod 2775 dir`, set-group-id so new files join the group) thus gets
//! group-writable lock files, logs and high-water files; a private store (`0700`) stays
//! private. Only the file's owner can change its mode, so a file someone else created keeps
//! the mode it was given.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::store::random_u64;

/// Applies the sharing rule to `file`, just opened or created at `path`. Best effort: a
/// file that cannot be changed (not ours) keeps its mode.
pub(super) fn share(file: &File, path: &Path) {
    let Some(dir_mode) = path
        .parent()
        .and_then(|dir| fs::metadata(dir).ok())
        .map(|m| m.mode())
    else {
        return;
    };
    let wanted = dir_mode & 0o666;
    let Ok(meta) = file.metadata() else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    let mine = meta.uid() == unsafe { libc::geteuid() };
    if mine && meta.mode() & 0o777 != wanted {
        let _ = file.set_permissions(fs::Permissions::from_mode(wanted));
    }
}

/// The prefix of temporary files: `.tmp-<pid>-<random>`.
const TMP_PREFIX: &str = ".tmp-";

/// Replaces `path` with `body` by write-to-temp and rename; `durable` also fsyncs the file
/// before and the directory after the rename.
pub(super) fn replace(path: &Path, body: &[u8], durable: bool) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        "{TMP_PREFIX}{}-{:016x}",
        std::process::id(),
        random_u64()
    ));
    let result = (|| -> io::Result<()> {
        let mut file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        share(&file, &tmp);
        file.write_all(body)?;
        if durable {
            file.sync_all()?;
        }
        fs::rename(&tmp, path)?;
        if durable {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Removes the temporary files in `dir` whose process is gone (killed between creating and
/// renaming them). Returns how many were removed.
pub(super) fn sweep_temporaries(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(TMP_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks that the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone && fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}
