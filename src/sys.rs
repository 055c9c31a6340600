//! System mechanics that know nothing of leases or tokens: randomness, file locks, atomic
//! replacement of files, the sweep of temporaries, the async runtime, and the processes
//! descended from this one (found and stopped through /proc). A leaf: it imports
//! nothing of fence's.
//!
//! Sharing rule (for the directory store and `file://` objects): a file fence creates in a
//! directory gets that directory's read and write bits (`dir mode & 0o666`), whatever the
//! creating process's umask. A directory shared by a group (`chmod 2775 dir`, set-group-id so
//! new files join the group) thus gets group-writable lock files, logs and high-water files; a
//! private one (`0700`) stays private. Only the file's owner can change its mode, so a file
//! someone else created keeps the mode it was given.
//!
//! Lock files hold nothing; only the `flock` on them matters, and it ends when the descriptor
//! is closed, so a killed process never leaves anything locked.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::fs::FlockOperation;
use rustix::io::Errno;
use rustix::process::{Pid, Signal};
use rustix::time::DynamicClockId;

/// Whether standard output was closed when the process started (`fence acquire R >&-`).
/// Rust's runtime reopens a closed standard descriptor on /dev/null before `main`, after
/// which writes to it succeed and vanish; so this is recorded earlier, by a function the C
/// runtime calls from `.init_array`.
static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn note_closed_stdout() {
    if rustix::io::fcntl_getfd(rustix::stdio::stdout()).is_err() {
        STDOUT_CLOSED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[used]
#[link_section = ".init_array"]
static NOTE_CLOSED_STDOUT: extern "C" fn() = note_closed_stdout;

/// Whether standard output was closed when fence started: what it prints there is lost.
pub fn stdout_was_closed() -> bool {
    STDOUT_CLOSED.load(std::sync::atomic::Ordering::Relaxed)
}

/// 64 random bits from the kernel (getrandom(2), else /dev/urandom): for owner ids, temporary
/// file names and jitter. Where neither answers, the standard library cannot key a HashMap
/// either, and panics as it does.
pub(crate) fn random_u64() -> u64 {
    getrandom::u64().expect("no random bytes from the kernel (getrandom(2), /dev/urandom)")
}

/// Applies the sharing rule to `file`, just opened or created at `path`. Best effort: a
/// file that cannot be changed (not ours) keeps its mode.
pub fn share(file: &File, path: &Path) {
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
    let mine = meta.uid() == rustix::process::geteuid().as_raw();
    if mine && meta.mode() & 0o777 != wanted {
        let _ = file.set_permissions(fs::Permissions::from_mode(wanted));
    }
}

/// The prefix of temporary files: `.tmp-<pid>-<random>`.
const TMP_PREFIX: &str = ".tmp-";

/// Replaces `path` with `body` by write-to-temp and rename; `durable` also fsyncs the file
/// before and the directory after the rename. Everything the rename's sync needs (the
/// directory's descriptor) is taken before the rename and the temporary file closed: an error
/// before the rename changed nothing. One after it (the directory's fsync failed: the disk)
/// is [`Unsynced`]: `path` holds `body`, which a power loss may take back.
pub fn replace(path: &Path, body: &[u8], durable: bool) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // Out of descriptors, a grant failed after its record was renamed into place, and left a
    // lease nobody held (review 21, when a grant's record was synced).
    let dir_file = if durable {
        Some(File::open(dir)?)
    } else {
        None
    };
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
        drop(file);
        rename_over(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    match dir_file.map(|dir| dir.sync_all()) {
        Some(Err(err)) => Err(io::Error::new(err.kind(), Unsynced(err))),
        _ => Ok(()),
    }
}

/// Puts the file `tmp` at `path`, in one step for whoever reads `path` (the old file or the
/// new one, never neither), as `rename` does. A regular file already at `path` is exchanged
/// with `tmp` (`renameat2` with `RENAME_EXCHANGE`) and then removed under `tmp`'s name:
/// ext4 writes out a file renamed *over* another inside the rename (its `auto_da_alloc`
/// heuristic allocates and submits the new file's blocks: 0.09–0.13 ms a lease record on this
/// project's VM, twice in every `fence run` on the directory store), not one exchanged with
/// it; neither rename waits for the disk, and a record is not synced either way
/// (docs/DESIGN.md §12). Where the exchange fails (nothing at `path`, something other than a
/// file there, a file system without it: NFS, some FUSE), a plain rename, with its own error.
/// Killed between the exchange and the removal, the process leaves the old file under a
/// temporary name, which [`sweep_temporaries`] removes as any other.
fn rename_over(tmp: &Path, path: &Path) -> io::Result<()> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    let file_there = fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_file());
    if file_there && renameat_with(CWD, tmp, CWD, path, RenameFlags::EXCHANGE).is_ok() {
        let _ = fs::remove_file(tmp);
        return Ok(());
    }
    fs::rename(tmp, path)
}

/// What an I/O error that is the machine's limit means for a write that changed nothing
/// (every write of the directory store and of `file://` objects is a new file renamed into
/// place, an in-place rewrite of a mark that only rises, or an append undone on failure):
/// out of space or over the file size limit is exit 7, nothing applied; out of descriptors
/// names the limit. `None` for any other error.
pub fn limit_error(message: &str, err: &io::Error) -> Option<crate::error::Error> {
    use crate::error::Error;
    match err.raw_os_error()? {
        libc::ENOSPC | libc::EFBIG | libc::EDQUOT => Some(Error::unavailable(
            message.to_owned(),
            "free disk space or raise the file size limit (ulimit -f), then retry; nothing was applied",
        )),
        libc::EMFILE | libc::ENFILE => Some(Error::internal(
            message.to_owned(),
            "raise the open-file limit (`ulimit -n`; for ENFILE, the system's: fs.file-max), then retry",
        )),
        _ => None,
    }
}

/// The error of a [`replace`] that did replace the file, but whose directory's fsync failed.
#[derive(Debug)]
pub struct Unsynced(pub io::Error);

impl std::fmt::Display for Unsynced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "written, but not synced to the disk: {}", self.0)
    }
}

impl std::error::Error for Unsynced {}

impl Unsynced {
    /// Whether `err` is a [`replace`] that replaced its file all the same.
    pub fn is(err: &io::Error) -> bool {
        err.get_ref().is_some_and(|inner| inner.is::<Unsynced>())
    }
}

/// Removes the temporary files in `dir` whose process is gone (killed between creating and
/// renaming them). Returns how many were removed.
pub fn sweep_temporaries(dir: &Path) -> usize {
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
            .and_then(|pid| Pid::from_raw(pid.parse().ok()?))
        else {
            continue;
        };
        // Signal 0 only checks that the process exists.
        let gone = rustix::process::test_kill_process(pid) == Err(Errno::SRCH);
        if gone && fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// An exclusive `flock` on a lock file, held until dropped (the lock ends when the file is
/// closed).
pub struct Locked {
    _file: File,
}

/// Opens (creating) `path` and takes an exclusive `flock` on it, waiting no later than
/// `deadline`: `None` when it is still held then. Whoever holds a lock may be paused for good
/// (or be any local user who can read the lock file: `flock` works on a read-only
/// descriptor), so no caller waits without bound. A lock file fence creates gets the sharing
/// rule of [`share`], so that every user who can write the directory can open it; it is never
/// opened through a symbolic link. On failure, says which step failed ("open the lock file"
/// or "lock") with the OS error.
pub fn lock_exclusive_until(
    path: &Path,
    deadline: Instant,
) -> Result<Option<Locked>, (&'static str, io::Error)> {
    let file = open_lock_file(path)?;
    flock_until(
        file,
        path,
        FlockOperation::NonBlockingLockExclusive,
        deadline,
    )
}

/// A shared `flock` on an existing lock file opened read-only, waiting no later than
/// `deadline` (`None`: still held then): for readers who may not write the directory. Holders
/// of the exclusive lock are excluded, so no write is under way while it is held.
pub fn lock_shared_until(
    path: &Path,
    deadline: Instant,
) -> Result<Option<Locked>, (&'static str, io::Error)> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|err| ("open the lock file", err))?;
    flock_until(file, path, FlockOperation::NonBlockingLockShared, deadline)
}

fn open_lock_file(path: &Path) -> Result<File, (&'static str, io::Error)> {
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
    Ok(file)
}

/// Whether `path` still names `file` (the same inode). A lock file deleted or replaced while
/// this process waited for it locks nothing: whoever opens the path now gets another file,
/// and both would hold "the" lock. Its lock is then dropped and the path's file locked.
fn still_named(file: &File, path: &Path) -> Result<bool, (&'static str, io::Error)> {
    use std::os::unix::fs::MetadataExt;
    let held = file
        .metadata()
        .map_err(|err| ("check the lock file", err))?;
    match fs::symlink_metadata(path) {
        Ok(named) => Ok(named.dev() == held.dev() && named.ino() == held.ino()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(err) => Err(("check the lock file", err)),
    }
}

/// The lock file `path` names now, opened as `file` was (read-write and created, or
/// read-only for a shared lock).
fn reopen_lock_file(path: &Path, op: FlockOperation) -> Result<File, (&'static str, io::Error)> {
    if op == FlockOperation::NonBlockingLockShared {
        return OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|err| ("open the lock file", err));
    }
    open_lock_file(path)
}

/// Polls a non-blocking `flock` (`op`: exclusive or shared) until it is granted or `deadline`
/// passes, with pauses growing from 1 ms to 50 ms (a write holds the lock for milliseconds).
fn flock_until(
    mut file: File,
    path: &Path,
    op: FlockOperation,
    deadline: Instant,
) -> Result<Option<Locked>, (&'static str, io::Error)> {
    let mut pause = Duration::from_millis(1);
    loop {
        if try_flock(&file, op)? {
            if still_named(&file, path)? {
                return Ok(Some(Locked { _file: file }));
            }
            file = reopen_lock_file(path, op)?;
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// [`lock_exclusive_until`] for the async runtime: the pauses between tries are the runtime's,
/// so that a lock held by a paused process never blocks the thread (and every timer on it,
/// such as `fence run`'s bound on its command).
pub async fn lock_exclusive_by(
    path: &Path,
    deadline: Instant,
) -> Result<Option<Locked>, (&'static str, io::Error)> {
    let mut file = open_lock_file(path)?;
    let mut pause = Duration::from_millis(1);
    loop {
        if try_flock(&file, FlockOperation::NonBlockingLockExclusive)? {
            if still_named(&file, path)? {
                return Ok(Some(Locked { _file: file }));
            }
            file = open_lock_file(path)?;
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// One non-blocking `flock` (`op`): whether it was granted. The lock ends when `file` is
/// closed.
fn try_flock(file: &File, op: FlockOperation) -> Result<bool, (&'static str, io::Error)> {
    loop {
        match rustix::fs::flock(file, op) {
            Ok(()) => return Ok(true),
            Err(Errno::INTR) => {}
            Err(Errno::WOULDBLOCK) => return Ok(false),
            Err(err) => return Err(("lock", err.into())),
        }
    }
}

/// Has AWS-LC (the crypto under rustls, PostgreSQL's TLS, and the S3 and GCS clients) learn
/// the CPU's features, once per process, before its first use. This repository builds it
/// without its constructor (`.cargo/config.toml`), which would run CPUID at every start of
/// every fence, the directory store's runs included (issue 37); without it AWS-LC would take
/// the CPU for one without AES-NI, SHA or AVX and run its slower, portable code. (rustls's
/// AWS-LC provider initialises it as well when a TLS configuration is built, through its FIPS
/// check: this call does not rely on that.)
pub fn crypto_ready() {
    aws_lc_rs::init();
}

/// For the unit tests of the paths into AWS-LC (each test runs in a process of its own under
/// nextest): whether AWS-LC has learnt the CPU's features, as far as this CPU lets it show
/// (AES-NI and PCLMULQDQ, by /proc/cpuinfo); true on a CPU without them, where it cannot be
/// told.
#[cfg(test)]
pub(crate) fn aws_lc_knows_the_cpu() -> bool {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = cpuinfo.lines().find(|line| line.starts_with("flags"));
    let has = |flag: &str| flags.is_some_and(|line| line.split_whitespace().any(|f| f == flag));
    if !(has("aes") && has("pclmulqdq")) {
        return true;
    }
    // SAFETY: a query of AWS-LC's capability flags, no arguments.
    unsafe { aws_lc_sys::EVP_has_aes_hardware() == 1 }
}

/// The runtime, or why it could not start. tokio panics (instead of returning an error) when
/// its signal driver cannot make its socket pair, e.g. out of file descriptors: that panic is
/// caught, silently, and turned into the error it is.
pub fn build_runtime() -> Result<tokio::runtime::Runtime, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let built = std::panic::catch_unwind(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    });
    std::panic::set_hook(hook);
    match built {
        Ok(Ok(runtime)) => Ok(runtime),
        Ok(Err(err)) => Err(err.to_string()),
        Err(panic) => Err(plain_os_error(
            &panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "it panicked".to_owned()),
        )),
    }
}

/// A panic's text with the `Os { code: 24, kind: …, message: "Too many open files" }` it
/// debug-printed written as people read errors, by the error's own `Display`: `Too many open
/// files (os error 24)`.
fn plain_os_error(text: &str) -> String {
    const OS: &str = "Os { code: ";
    let Some(at) = text.find(OS) else {
        return text.to_owned();
    };
    let rest = &text[at..];
    let code = rest[OS.len()..]
        .split(',')
        .next()
        .and_then(|c| c.parse().ok());
    let (Some(code), Some(end)) = (code, rest.find(" }")) else {
        return text.to_owned();
    };
    format!(
        "{}{}{}",
        &text[..at],
        std::io::Error::from_raw_os_error(code),
        &rest[end + " }".len()..]
    )
}

/// A process, as its /proc/PID/stat shows it. A parent or group of 0 (the kernel's own
/// threads), or of -1 (the group of a process that is exiting right now), is none.
struct Process {
    pid: Pid,
    ppid: Option<Pid>,
    group: Option<Pid>,
    zombie: bool,
}

/// Every process /proc shows.
fn processes() -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| Pid::from_raw(e.ok()?.file_name().to_str()?.parse().ok()?))
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_pid())).ok()?;
            process(pid, &stat)
        })
        .collect()
}

/// The fields of a /proc/PID/stat line after the command's name (which is in parentheses and
/// may hold anything): field 3 (the state) first.
fn stat_fields(stat: &str) -> Option<std::str::Split<'_, char>> {
    Some(stat.rsplit_once(") ")?.1.split(' '))
}

/// The process `pid` of a /proc/PID/stat line.
fn process(pid: Pid, stat: &str) -> Option<Process> {
    let mut fields = stat_fields(stat)?;
    let zombie = fields.next()? == "Z";
    let mut number = || fields.next()?.parse::<i32>().ok();
    let ppid = Pid::from_raw(number()?.max(0));
    let group = Pid::from_raw(number()?.max(0));
    Some(Process {
        pid,
        ppid,
        group,
        zombie,
    })
}

/// The processes descended from this one (zombies included), by the parent links.
fn family(all: &[Process]) -> Vec<&Process> {
    // Linear in the processes: a command with thousands of them must not hold up the kill
    // (a review measured 15–30 s past a lease with 1,500, when this was quadratic).
    let mut children: std::collections::HashMap<Pid, Vec<&Process>> =
        std::collections::HashMap::new();
    for p in all {
        if let Some(parent) = p.ppid {
            children.entry(parent).or_default().push(p);
        }
    }
    let mut found: Vec<&Process> = Vec::new();
    let me = rustix::process::getpid();
    let spared = spared();
    let mut next = vec![me];
    while let Some(parent) = next.pop() {
        for &p in children.get(&parent).map_or(&[][..], Vec::as_slice) {
            // Our own children from before `fence run` (see [`SPARED`]), and theirs, are not
            // the run's.
            if parent == me && spared.contains(&p.pid) {
                continue;
            }
            next.push(p.pid);
            found.push(p);
        }
    }
    found
}

/// This process's group; `None` when it is outside this pid namespace (getpgrp says 0 then,
/// which rustix's `getpgrp` may not return: it panicked, a review found).
pub(crate) fn own_group() -> Option<Pid> {
    // SAFETY: getpgrp has no preconditions.
    Pid::from_raw(unsafe { libc::getpgrp() })
}

/// `signal` to every live descendant (only to those outside our process group when
/// `outside`: the group itself got it already).
pub(crate) fn signal_descendants(signal: Signal, outside: bool) {
    let ours = own_group();
    for p in family(&processes()) {
        let skipped = p.zombie || (outside && p.group == ours);
        if !skipped {
            let _ = rustix::process::kill_process(p.pid, signal);
        }
    }
}

/// SIGKILL to every live descendant, and to every process group other than ours whose
/// members are all descendants (remembered in `groups`, and killed again at every call): a
/// group is killed as one, so a process that forks its successor and exits (a respawning
/// loop in a session of its own) cannot slip between a scan of /proc and the kill.
pub(crate) fn kill_descendants_once(groups: &mut Vec<Pid>) {
    // The run's cgroup first, where there is one: everything in it at once, whatever it
    // forks meanwhile (see `reaper::cgroup`). Then, for what is not in it (no cgroup here, or
    // a process moved out), the groups already known, before the scan of /proc takes its
    // time; then every descendant found, then the groups new in this scan. Linear in the
    // processes.
    crate::reaper::cgroup::kill();
    for &group in groups.iter() {
        let _ = rustix::process::kill_process_group(group, Signal::KILL);
    }
    let all = processes();
    let family = family(&all);
    for p in family.iter().filter(|p| !p.zombie) {
        let _ = rustix::process::kill_process(p.pid, Signal::KILL);
    }
    let members: std::collections::HashSet<Pid> = family.iter().map(|p| p.pid).collect();
    // Per group: whether every member is a descendant.
    let mut only_family: std::collections::HashMap<Pid, bool> = std::collections::HashMap::new();
    for p in &all {
        if let Some(group) = p.group {
            *only_family.entry(group).or_insert(true) &= members.contains(&p.pid);
        }
    }
    let ours = own_group();
    for group in family.iter().filter_map(|p| p.group) {
        let new = Some(group) != ours
            && !group.is_init()
            && only_family.get(&group) == Some(&true)
            && !groups.contains(&group);
        if new {
            groups.push(group);
            let _ = rustix::process::kill_process_group(group, Signal::KILL);
        }
    }
}

/// The live descendants of this process (zombies left out): their pids, for a report of what
/// would not die.
pub(crate) fn live_descendants() -> Vec<i32> {
    family(&processes())
        .iter()
        .filter(|p| !p.zombie)
        .map(|p| p.pid.as_raw_pid())
        .collect()
}

/// Rewrites this process's command line as `ps` and `/proc/PID/cmdline` show it, as
/// setproctitle(3) does: `title` is written, words separated by spaces, over the memory of
/// the original arguments, and past them over the environment's strings, which are copied
/// away first, each entry as it is (the kernel then reads the title up to its end). A title
/// longer than that space is cut short. For a forked process that will not exec (the
/// reaper), while it has one thread.
pub(crate) fn retitle(title: &str) {
    let Some((start, arg_end, end)) = title_area() else {
        return;
    };
    let end = if end > arg_end && move_environment() {
        end
    } else {
        arg_end
    };
    let bytes = title.as_bytes();
    let len = end - start;
    let n = bytes.len().min(len - 1);
    // SAFETY: [start, end) is this process's argument (and, once moved, environment) strings,
    // on its own stack, as the kernel reports them; nothing refers to them any more (the
    // arguments were copied at start-up, the environment just above). The last byte stays
    // NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), start as *mut u8, n);
        std::ptr::write_bytes((start + n) as *mut u8, 0, len - n);
    }
}

extern "C" {
    /// The C library's environment (environ(7)).
    static mut environ: *mut *mut libc::c_char;
}

/// Copies every entry of the environment to the heap, byte for byte (whatever it holds: an
/// entry without `=`, a name that starts with one), and points `environ` at the copies, for
/// the life of the process. False, the environment untouched, when memory runs out.
fn move_environment() -> bool {
    // SAFETY: one thread (see `retitle`): nothing reads or changes the environment
    // meanwhile. Each entry is a NUL-terminated string until the array's null pointer.
    unsafe {
        let mut copies: Vec<*mut libc::c_char> = Vec::new();
        let mut entry = environ;
        while !entry.is_null() && !(*entry).is_null() {
            let copy = libc::strdup(*entry);
            if copy.is_null() {
                for copy in copies {
                    libc::free(copy.cast());
                }
                return false;
            }
            copies.push(copy);
            entry = entry.add(1);
        }
        copies.push(std::ptr::null_mut());
        environ = copies.leak().as_mut_ptr();
    }
    true
}

/// Where this process's argument strings start and end, and where the space a title may
/// take ends (the environment's strings' end, when they follow the arguments).
fn title_area() -> Option<(usize, usize, usize)> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat_fields(&stat)?.collect();
    // proc(5): arg_start, arg_end, env_start and env_end are fields 48 to 51.
    let field = |n: usize| -> Option<usize> { fields.get(n - 3)?.trim().parse().ok() };
    let (arg_start, arg_end, env_start, env_end) = (field(48)?, field(49)?, field(50)?, field(51)?);
    if arg_start == 0 || arg_end <= arg_start {
        return None;
    }
    let end = if env_start == arg_end && env_end > env_start {
        env_end
    } else {
        arg_end
    };
    Some((arg_start, arg_end, end))
}

/// Whether this process has a child, live or ended and not yet waited for. Every descendant
/// descends from a child (a subreaper's orphans become its children), so none means no
/// descendant at all: an exact answer, where a scan of /proc can miss a process born or
/// reparented while it reads.
pub(crate) fn has_children() -> bool {
    // With WNOWAIT it only looks; it fails (ECHILD) exactly when there is no child.
    use rustix::process::{WaitId, WaitIdOptions};
    let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
    if rustix::process::waitid(WaitId::All, options).is_err() {
        return false;
    }
    let spared = spared();
    if spared.is_empty() {
        return true;
    }
    // Some children are this process's own, from before (see [`spare_children`]): only the
    // others count. Where the kernel does not list children, all of them do.
    match children() {
        Some(children) => children.iter().any(|child| !spared.contains(child)),
        None => true,
    }
}

/// The children of [`SPARED`] not yet waited for.
fn spared() -> Vec<Pid> {
    SPARED.lock().map(|s| s.clone()).unwrap_or_default()
}

/// Children this process had before it became a `fence run` (`sh -c 'job & exec fence run
/// …'`): not the command's, so neither its leftovers nor to be stopped with it (a review:
/// fence killed such a job and said the command had left it running).
/// Each leaves the list once waited for: its pid may then be a new child's, a leftover's.
static SPARED: std::sync::Mutex<Vec<Pid>> = std::sync::Mutex::new(Vec::new());

/// Records this process's children of now as not the run's (see [`SPARED`]): called by `fence
/// run` before it forks anything.
pub(crate) fn spare_children() {
    if let Ok(mut spared) = SPARED.lock() {
        *spared = children().unwrap_or_default();
    }
}

/// This process's live children, as /proc lists them per thread; `None` where it does not.
fn children() -> Option<Vec<Pid>> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    let mut found = Vec::new();
    for task in tasks.filter_map(|t| t.ok()) {
        let list = std::fs::read_to_string(task.path().join("children")).ok()?;
        found.extend(
            list.split_whitespace()
                .filter_map(|p| Pid::from_raw(p.parse().ok()?)),
        );
    }
    Some(found)
}

/// Reaps every child that has ended, without blocking. Reaps any child, so a caller must
/// have waited for the children it waits for itself.
pub(crate) fn reap_children() {
    while let Ok(Some((pid, _))) = rustix::process::wait(rustix::process::WaitOptions::NOHANG) {
        if let Ok(mut spared) = SPARED.lock() {
            spared.retain(|p| *p != pid);
        }
    }
}

/// Reaps every child that has ended, without blocking, as [`reap_children`] does, but keeps
/// the status of `kept` should it be one of them: for a subreaper that waits for one child
/// (the reaper, for its command) while the orphans handed to it end, so that they are waited
/// for as they end instead of staying zombies (each holds its pid) until that child ends.
/// `Ok(None)`: `kept` has not ended. An error when no child is left and `kept` was not among
/// those reaped (it was waited for elsewhere: its status is lost).
///
/// A scan of /proc finds a child by its pid, which its zombie holds until it is reaped: the
/// caller reaps between its scans, never during one, so that a pid it found is still its
/// child's when it signals it.
pub(crate) fn reap_children_keeping(kept: Pid) -> io::Result<Option<std::process::ExitStatus>> {
    use std::os::unix::process::ExitStatusExt;
    let mut status = None;
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::NOHANG) {
            Ok(Some((pid, ended))) if pid == kept => {
                status = Some(std::process::ExitStatus::from_raw(ended.as_raw()));
            }
            Ok(Some(_)) | Err(Errno::INTR) => {}
            Ok(None) => return Ok(status),
            Err(Errno::CHILD) if status.is_some() => return Ok(status),
            Err(err) => return Err(err.into()),
        }
    }
}

/// How long the killing goes on at most (a process that cannot die: stuck in the kernel).
const KILL_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// Stops every descendant of this process: SIGTERM, then once the bound clock reaches
/// `kill_at()` (asked again at every look, so the deadline may move) SIGKILL again
/// and again to every one still there or born since (and to the process groups only they
/// are in), until this process has no child left; reaps them all (a subreaper's orphans), so
/// none is left a zombie. Returns whether any was left. Reaps any child, so a caller must
/// have waited for the children it waits for itself. Blocking: for the reaper, which has no
/// runtime (`fence run` does the same in its own loop, between renewals).
pub(crate) fn kill_descendants(mut kill_at: impl FnMut() -> u64) -> bool {
    reap_children();
    if !has_children() {
        return false;
    }
    signal_descendants(Signal::TERM, false);
    signal_descendants(Signal::CONT, false);
    while bound_clock_ns() < kill_at() {
        reap_children();
        if !has_children() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut groups = Vec::new();
    let start = std::time::Instant::now();
    while start.elapsed() < KILL_FOR {
        reap_children();
        if !has_children() {
            break;
        }
        kill_descendants_once(&mut groups);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    reap_children();
    true
}

/// CLOCK_BOOTTIME in nanoseconds: monotonic, and counting time the machine was suspended
/// (a lease runs out during a suspend too). `None` where it cannot be read.
pub(crate) fn boottime_ns() -> Option<u64> {
    clock_ns(DynamicClockId::Boottime)
}

/// CLOCK_BOOTTIME as the machine counts it, outside any time namespace: a process in one
/// (`unshare --time --boottime N`) reads the machine's clock shifted by its namespace's offset,
/// and compared with other processes' readings took over a live lease of the directory store
/// as expired (review 17). The offset (`/proc/self/timens_offsets`, Linux 5.6; none where
/// that file is missing) is read once and taken off.
pub(crate) fn host_boottime_ns() -> Option<u64> {
    static OFFSET_NS: std::sync::OnceLock<i128> = std::sync::OnceLock::new();
    let offset = *OFFSET_NS.get_or_init(|| {
        std::fs::read_to_string("/proc/self/timens_offsets")
            .ok()
            .and_then(|text| boottime_offset_ns(&text))
            .unwrap_or(0)
    });
    let shifted = i128::from(boottime_ns()?) - offset;
    u64::try_from(shifted).ok()
}

/// The `boottime` line of `/proc/self/timens_offsets` ("boottime <seconds> <nanoseconds>"),
/// in nanoseconds.
fn boottime_offset_ns(text: &str) -> Option<i128> {
    let line = text.lines().find(|line| line.starts_with("boottime"))?;
    let mut words = line.split_whitespace().skip(1);
    let secs: i128 = words.next()?.parse().ok()?;
    let nanos: i128 = words.next()?.parse().ok()?;
    Some(secs * 1_000_000_000 + nanos)
}

/// The clock of `fence run`'s bounds, in nanoseconds, read by fence and by the reaper alike:
/// CLOCK_BOOTTIME (a suspend counts: a lease runs out during one too), or CLOCK_MONOTONIC on
/// a kernel without it (before Linux 2.6.39).
pub(crate) fn bound_clock_ns() -> u64 {
    boottime_ns()
        .or_else(|| clock_ns(DynamicClockId::Known(rustix::time::ClockId::Monotonic)))
        .unwrap_or(0)
}

fn clock_ns(clock: DynamicClockId<'_>) -> Option<u64> {
    let ts = rustix::time::clock_gettime_dynamic(clock).ok()?;
    Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_namespaces_boottime_offset_is_read() {
        let text = "monotonic           0         0\nboottime       100000  5\n";
        assert_eq!(boottime_offset_ns(text), Some(100_000_000_000_005));
        assert_eq!(boottime_offset_ns("boottime -3 0\n"), Some(-3_000_000_000));
        assert_eq!(boottime_offset_ns("monotonic 1 0\n"), None);
    }

    #[test]
    fn a_debug_printed_os_error_reads_as_an_error() {
        assert_eq!(
            plain_os_error(
                r#"failed to create UnixStream: Os { code: 24, kind: Uncategorized, message: "Too many open files" }"#
            ),
            "failed to create UnixStream: Too many open files (os error 24)"
        );
        assert_eq!(plain_os_error("it panicked"), "it panicked");
    }

    #[test]
    fn proc_stat_lines() {
        let pid = Pid::from_raw(42).unwrap();
        let p = process(pid, "42 (sh) S 7 42 7 34816 42 4194304 0\n").unwrap();
        assert_eq!(
            (p.ppid, p.group, p.zombie),
            (Pid::from_raw(7), Some(pid), false)
        );
        // A name with `) ` in it; a zombie.
        let p = process(pid, "42 (a) b) Z 7 9 7 0 -1 4194304 0\n").unwrap();
        assert_eq!(
            (p.ppid, p.group, p.zombie),
            (Pid::from_raw(7), Pid::from_raw(9), true)
        );
        // A kernel thread (no parent, no group), and a process exiting right now (group -1).
        let p = process(pid, "42 (kthreadd) S 0 0 0 0 -1 2129984 0\n").unwrap();
        assert_eq!((p.ppid, p.group), (None, None));
        let p = process(pid, "42 (cat) D 7 -1 -1 0 -1 4194560 0\n").unwrap();
        assert_eq!((p.ppid, p.group), (Pid::from_raw(7), None));
        assert!(process(pid, "42 (cat) D x 1").is_none());
    }

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replace_puts_the_new_body_in_place_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        // Nothing there yet, then a file to replace, synced or not.
        for (body, durable) in [("first", false), ("second", false), ("third", true)] {
            replace(&path, body.as_bytes(), durable).unwrap();
            assert_eq!(fs::read_to_string(&path).unwrap(), body);
            assert_eq!(names(dir.path()), ["r.json"]);
        }
    }

    #[test]
    fn replace_does_not_swap_a_directory_into_a_temporary_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("inside"), "kept").unwrap();
        assert!(replace(&path, b"body", false).is_err());
        assert_eq!(fs::read_to_string(path.join("inside")).unwrap(), "kept");
        assert_eq!(names(dir.path()), ["r.json"]);
    }

    /// Whoever reads the file while it is replaced (`fence inspect`, `fence log` read records
    /// without the resource's lock) finds the old body or the new one, whole: never no file
    /// and never a part.
    #[test]
    fn a_reader_never_finds_a_replaced_file_missing_or_partial() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        let bodies = ["a".repeat(300), "b".repeat(700)];
        replace(&path, bodies[0].as_bytes(), false).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        let seen = std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                let mut reads = 0u64;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let read = fs::read_to_string(&path);
                    assert!(
                        read.as_ref().is_ok_and(|body| bodies.contains(body)),
                        "read {reads}: {read:?}"
                    );
                    reads += 1;
                }
                reads
            });
            for i in 0..3000 {
                replace(&path, bodies[i % 2].as_bytes(), false).unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            reader.join().unwrap()
        });
        assert!(seen > 0);
        assert_eq!(names(dir.path()), ["r.json"]);
    }
}
