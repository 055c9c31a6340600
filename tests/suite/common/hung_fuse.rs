//! A FUSE file system that answers nothing but its handshake: a process that looks up a file
//! in it waits in the kernel, and once this server has read the request the wait is
//! uninterruptible (state `D`): SIGKILL does not end it. That is how a hung NFS or FUSE mount,
//! or a failing disk, leaves a process that fence cannot stop. [`HungFuse::release`] (or drop)
//! aborts the connection: the waiting calls fail, and a process killed meanwhile dies.
//!
//! Mounting needs root (CAP_SYS_ADMIN) and `/dev/fuse`; [`HungFuse::mount`] says why not.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use tempfile::TempDir;

const FUSE_INIT: u32 = 26;
/// `fuse_in_header`: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding.
const IN_HEADER: usize = 40;

pub struct HungFuse {
    dir: TempDir,
    stop: Arc<AtomicBool>,
    server: Option<JoinHandle<File>>,
    /// Requests the server has read (and will never answer), the handshake excluded.
    read: Arc<AtomicUsize>,
}

impl HungFuse {
    /// Mounts it on a fresh directory, or says why this host cannot.
    pub fn mount() -> Result<HungFuse, String> {
        let device = File::options()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .map_err(|err| format!("cannot open /dev/fuse: {err}"))?;
        let dir = tempfile::tempdir().map_err(|err| err.to_string())?;
        let target = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
        let options = std::ffi::CString::new(format!(
            "fd={},rootmode=40000,user_id={},group_id={}",
            device.as_raw_fd(),
            unsafe { libc::getuid() },
            unsafe { libc::getgid() }
        ))
        .unwrap();
        // SAFETY: every pointer is a live NUL-terminated string.
        let mounted = unsafe {
            libc::mount(
                c"fence-hung".as_ptr(),
                target.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                options.as_ptr().cast(),
            )
        };
        if mounted != 0 {
            return Err(format!(
                "cannot mount a FUSE file system (needs root): {}",
                std::io::Error::last_os_error()
            ));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let read = Arc::new(AtomicUsize::new(0));
        let server = {
            let (stop, read) = (Arc::clone(&stop), Arc::clone(&read));
            std::thread::spawn(move || serve(device, &stop, &read))
        };
        Ok(HungFuse {
            dir,
            stop,
            server: Some(server),
            read,
        })
    }

    /// A file in it: any access hangs.
    pub fn file(&self) -> PathBuf {
        self.dir.path().join("hung")
    }

    /// How many requests the server has read: a process waiting on one of them sleeps
    /// uninterruptibly once a signal that kills it arrives.
    pub fn requests_read(&self) -> usize {
        self.read.load(Ordering::SeqCst)
    }

    /// Aborts the connection (every waiting call fails) and unmounts.
    pub fn release(&mut self) {
        let Some(server) = self.server.take() else {
            return;
        };
        self.stop.store(true, Ordering::SeqCst);
        // Closing the device aborts the connection: the waiting requests end with ENOTCONN.
        drop(server.join().expect("the FUSE server thread"));
        let target =
            std::ffi::CString::new(self.dir.path().as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a live NUL-terminated string.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

impl Drop for HungFuse {
    fn drop(&mut self) {
        self.release();
    }
}

/// Answers the handshake, then reads every request and answers none, until `stop`. Polls, so
/// that the device can be closed (a read blocked on it would keep it open).
fn serve(mut device: File, stop: &AtomicBool, read: &AtomicUsize) -> File {
    let mut buf = vec![0u8; 1 << 20 | 4096];
    while !stop.load(Ordering::SeqCst) {
        let mut poll = libc::pollfd {
            fd: device.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut poll, 1, 50) } <= 0 {
            continue;
        }
        let Ok(n) = device.read(&mut buf) else {
            continue;
        };
        if n < IN_HEADER {
            continue;
        }
        let word = |at: usize| u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap());
        let opcode = word(4);
        let unique = u64::from_ne_bytes(buf[8..16].try_into().unwrap());
        if opcode != FUSE_INIT {
            read.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        // fuse_init_out: major, minor, max_readahead, flags, max_background and
        // congestion_threshold (u16 each), max_write, time_gran, max_pages and map_alignment
        // (u16 each), flags2, 7 unused words: 64 bytes after the 16 of fuse_out_header.
        let (major, minor) = (word(IN_HEADER), word(IN_HEADER + 4));
        let mut init = Vec::with_capacity(64);
        init.extend_from_slice(&major.to_ne_bytes());
        init.extend_from_slice(&minor.to_ne_bytes());
        init.extend_from_slice(&0u32.to_ne_bytes());
        init.extend_from_slice(&0u32.to_ne_bytes());
        init.extend_from_slice(&1u16.to_ne_bytes());
        init.extend_from_slice(&1u16.to_ne_bytes());
        init.extend_from_slice(&4096u32.to_ne_bytes());
        init.extend_from_slice(&1u32.to_ne_bytes());
        init.extend_from_slice(&1u16.to_ne_bytes());
        init.extend_from_slice(&0u16.to_ne_bytes());
        init.resize(64, 0);
        let mut reply = Vec::with_capacity(80);
        reply.extend_from_slice(&80u32.to_ne_bytes());
        reply.extend_from_slice(&0i32.to_ne_bytes());
        reply.extend_from_slice(&unique.to_ne_bytes());
        reply.extend_from_slice(&init);
        let _ = device.write_all(&reply);
    }
    device
}
