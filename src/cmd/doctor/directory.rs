//! `fence doctor`'s checks of directories on this host: the directory store (its path,
//! filesystem, durability, permissions, existence and free space) and the directory of
//! `file://` objects (existence, permissions, filesystem, free space).

use std::path::Path;

use super::{Findings, Severity};

/// The `directory.filesystem` finding for `dir`, judged on `existing` (itself, or the
/// nearest parent that exists): a network filesystem cannot serialise `who` on several
/// machines (`remote_hint` says what to do instead).
fn filesystem_finding(
    existing: &Path,
    dir: &Path,
    who: &str,
    remote_hint: &str,
    f: &mut Findings<'_>,
) {
    match filesystem(existing) {
        Some((kind, Severity::Fail)) => f.add(
            "directory.filesystem",
            Severity::Fail,
            format!("`{}` is on {kind}: its file locks do not serialise {who} on different machines the way fence needs", dir.display()),
            remote_hint,
        ),
        Some((kind, Severity::Warn)) => f.add(
            "directory.filesystem",
            Severity::Warn,
            format!("`{}` is on {kind}: whether flock and rename are atomic depends on the filesystem behind it", dir.display()),
            "prefer a local filesystem (ext4, xfs, btrfs)",
        ),
        Some((kind, _)) => f.add(
            "directory.filesystem",
            Severity::Ok,
            format!("`{}` is on a local filesystem ({kind})", dir.display()),
            "",
        ),
        None => f.add(
            "directory.filesystem",
            Severity::Warn,
            format!("cannot tell the filesystem of `{}`", dir.display()),
            "",
        ),
    }
}

pub(super) fn directory(dir: &Path, f: &mut Findings<'_>) {
    // What the store itself refuses (kernel pseudo file systems, NUL bytes) fails here too.
    if let Err(err) = crate::coordinator::file::FileCoordinator::open(dir) {
        f.add(
            "directory.path",
            Severity::Fail,
            err.to_string(),
            &err.hint(),
        );
        return;
    }
    // The store may not exist yet; judge the nearest existing ancestor, which must be a
    // directory this user can write (the first acquire creates the rest).
    let existing = dir.ancestors().find(|p| p.exists()).unwrap_or(dir);
    if !existing.is_dir() {
        f.add(
            "directory.path",
            Severity::Fail,
            format!(
                "`{}` is not a directory, so no store can live at `{}`",
                existing.display(),
                dir.display()
            ),
            "point --store at a directory (file:///path/to/dir)",
        );
        return;
    }
    if access_denied(existing) {
        f.add(
            "directory.permissions",
            Severity::Fail,
            format!("this user cannot write `{}`", existing.display()),
            "fix the directory's owner or mode, or choose another --store",
        );
        return;
    }
    filesystem_finding(
        existing,
        dir,
        "processes",
        "put the store on a local filesystem, or use a PostgreSQL, S3 or GCS store for several machines",
        f,
    );
    // The store and every directory in it, symlinks followed (fence follows them too).
    let mut dirs = vec![existing.to_path_buf()];
    if dir.exists() {
        if let Ok(entries) = std::fs::read_dir(dir) {
            dirs.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
    }
    let volatile: Vec<String> = dirs
        .iter()
        .filter_map(|d| {
            let (kind, _) = filesystem(d)?;
            matches!(kind, "tmpfs" | "ramfs").then(|| format!("`{}` ({kind})", d.display()))
        })
        .collect();
    if !volatile.is_empty() {
        f.add(
            "directory.durability",
            Severity::Fail,
            format!(
                "the store `{}` keeps its files on a filesystem a reboot empties: {}; fence's tokens would start again at 1, below every token a protected resource has accepted (each new holder refused as stale), and a token number would stand for two leases",
                dir.display(),
                volatile.join(", ")
            ),
            "put the store, every directory in it included, on a disk-backed filesystem (for example file:///var/lib/fence)",
        );
    }
    store_permissions(dir, existing, &dirs, f);
    if !dir.exists() {
        if crate::coordinator::file::refused_parent(dir).is_some() {
            f.add(
                "directory.exists",
                Severity::Fail,
                format!(
                    "`{}` does not exist, nor does its parent: fence refuses to create it (a typo in --store?)",
                    dir.display()
                ),
                "check the path in --store (FENCE_STORE); if it is right, create its parent first (mkdir -p)",
            );
        } else {
            f.add(
                "directory.exists",
                Severity::Ok,
                format!(
                    "`{}` does not exist yet; the first acquire creates it",
                    dir.display()
                ),
                "",
            );
        }
        return;
    }
    match free_bytes(dir) {
        Some(free) if free < 64 << 20 => f.add(
            "directory.space",
            Severity::Warn,
            format!("only {} MiB free under `{}`", free >> 20, dir.display()),
            "free some space: a full disk fails acquisitions",
        ),
        Some(free) => f.add(
            "directory.space",
            Severity::Ok,
            format!("{} MiB free", free >> 20),
            "",
        ),
        None => {}
    }
}

/// A store directory, and each directory in it (`dirs`, symlinks followed), must not be
/// writable by every local user, sticky bit or not: one could plant or replace a lease record
/// (a forged holder, a token that goes down) or the lock files. Nor may a directory above it
/// (from `existing` up) be writable by every user without the sticky bit: one could move the
/// whole store aside and put an empty one in its place (tokens from 1 again).
fn store_permissions(
    dir: &Path,
    existing: &Path,
    dirs: &[std::path::PathBuf],
    f: &mut Findings<'_>,
) {
    use std::os::unix::fs::PermissionsExt;
    let mode_of = |d: &Path| std::fs::metadata(d).ok().map(|m| m.permissions().mode());
    let described = |d: &Path, mode: u32| format!("`{}` (mode {:o})", d.display(), mode & 0o7777);
    let inside: Vec<String> = dirs
        .iter()
        .filter(|d| d.starts_with(dir))
        .filter_map(|d| {
            let mode = mode_of(d)?;
            (mode & 0o002 != 0).then(|| described(d, mode))
        })
        .collect();
    // Above the store and above each directory in it, by their paths as written and as
    // resolved (a symlink's target can sit in a directory anyone may rename it out of).
    let mut tops: Vec<std::path::PathBuf> = vec![existing.to_path_buf()];
    tops.extend(dirs.iter().filter_map(|d| d.canonicalize().ok()));
    tops.extend(existing.canonicalize().ok());
    let mut above: Vec<String> = Vec::new();
    for top in &tops {
        for d in top.ancestors().filter(|d| *d != dir && *d != top.as_path()) {
            let Some(mode) = mode_of(d) else { continue };
            let line = described(d, mode);
            if mode & 0o002 != 0 && mode & 0o1000 == 0 && !above.contains(&line) {
                above.push(line);
            }
        }
    }
    if inside.is_empty() && above.is_empty() {
        f.add(
            "directory.permissions",
            Severity::Ok,
            format!("other users may not write `{}` or move it", dir.display()),
            "",
        );
        return;
    }
    if !inside.is_empty() {
        f.add(
            "directory.permissions",
            Severity::Fail,
            format!(
                "any local user may write {}: one can plant or replace a lease record (a forged holder, a token that goes back) or a lock file",
                inside.join(", ")
            ),
            "remove write access for others (`chmod -R o-w DIR`), or share the store through a group (`chmod 2770 DIR` and its subdirectories)",
        );
    }
    if !above.is_empty() {
        f.add(
            "directory.permissions",
            Severity::Fail,
            format!(
                "any local user may write {}, above the store, without the sticky bit: one can move `{}` aside and put an empty store in its place (tokens from 1 again)",
                above.join(", "),
                dir.display()
            ),
            "remove write access for others there (`chmod o-w DIR`), set the sticky bit (`chmod +t DIR`), or move the store",
        );
    }
}

/// The directory of a `file://` object target: it must exist (a write never creates it), be
/// writable by this user, be on a local filesystem (its `flock` serialises the writers), and
/// not be open to every local user (who could replace the sidecar, and so the token).
pub(super) fn object_directory(dir: &Path, f: &mut Findings<'_>) {
    use std::os::unix::fs::PermissionsExt;
    let mode = match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => meta.permissions().mode(),
        Ok(_) => {
            f.add(
                "directory.path",
                Severity::Fail,
                format!("`{}` is not a directory", dir.display()),
                "fix the path in --target: `file:///dir/name` names the file `name` in the directory `dir`",
            );
            return;
        }
        Err(err) => {
            f.add(
                "directory.exists",
                Severity::Fail,
                format!("cannot use the directory `{}`: {err}", dir.display()),
                "fix the path in --target, or create the directory (a write does not create it)",
            );
            return;
        }
    };
    if access_denied(dir) {
        f.add(
            "directory.permissions",
            Severity::Fail,
            format!("this user cannot write `{}`", dir.display()),
            "fix the directory's owner or mode, or write the object elsewhere",
        );
    } else if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        f.add(
            "directory.permissions",
            Severity::Fail,
            format!(
                "any local user may write `{}` (mode {:o}, no sticky bit): anyone can replace an object's sidecar `.<name>.fence.json`, and with it the highest token and the write ids",
                dir.display(),
                mode & 0o7777
            ),
            "remove write access for others (`chmod o-w DIR`), or share the directory through a group (`chmod 2770 DIR`)",
        );
    } else if mode & 0o002 != 0 {
        f.add(
            "directory.permissions",
            Severity::Warn,
            format!(
                "any local user may create files in `{}` (mode {:o}): one can plant fence's files beside an object before fence creates them",
                dir.display(),
                mode & 0o7777
            ),
            "remove write access for others (`chmod o-w DIR`), or share the directory through a group (`chmod 2770 DIR`)",
        );
    } else {
        f.add(
            "directory.permissions",
            Severity::Ok,
            format!(
                "this user may write `{}`, other users may not",
                dir.display()
            ),
            "",
        );
    }
    filesystem_finding(
        dir,
        dir,
        "writers",
        "keep `file://` objects on a local filesystem, or use S3 or GCS objects for writers on several machines",
        f,
    );
    if let Some(free) = free_bytes(dir).filter(|free| *free < 64 << 20) {
        f.add(
            "directory.space",
            Severity::Warn,
            format!("only {} MiB free under `{}`", free >> 20, dir.display()),
            "free some space: a full disk fails writes",
        );
    }
}

fn access_denied(dir: &Path) -> bool {
    use rustix::fs::Access;
    rustix::fs::access(dir, Access::WRITE_OK | Access::EXEC_OK).is_err()
}

/// The filesystem's kind and how much to trust it, from statfs(2)'s magic number.
fn filesystem(path: &Path) -> Option<(&'static str, Severity)> {
    #[allow(clippy::unnecessary_cast)]
    let magic = rustix::fs::statfs(path).ok()?.f_type as i64;
    Some(match magic {
        0x6969 => ("NFS", Severity::Fail),
        0x517b => ("SMB", Severity::Fail),
        0xff53_4d42 | 0xfe53_4d42 => ("CIFS/SMB2", Severity::Fail),
        0x0027_e0eb => ("cgroup", Severity::Warn),
        0x6573_5546 => ("FUSE", Severity::Warn),
        0xef53 => ("ext2/3/4", Severity::Ok),
        0x5846_5342 => ("xfs", Severity::Ok),
        0x9123_683e => ("btrfs", Severity::Ok),
        0x0102_1994 => ("tmpfs", Severity::Ok),
        0x8584_58f6 => ("ramfs", Severity::Ok),
        0x794c_7630 => ("overlayfs", Severity::Ok),
        0x2fc1_2fc1 => ("zfs", Severity::Ok),
        _ => ("an unrecognised filesystem", Severity::Warn),
    })
}

fn free_bytes(path: &Path) -> Option<u64> {
    let vfs = rustix::fs::statvfs(path).ok()?;
    Some(vfs.f_bavail * vfs.f_frsize)
}
