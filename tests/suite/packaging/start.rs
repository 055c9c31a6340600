//! What the `fence` binary loads as it starts (issue 37: a CLI that starts in milliseconds),
//! and that what it no longer loads is not missed.
//!
//! build.rs links GCC's unwinder into the binary (`libgcc_eh.a`) rather than loading
//! `libgcc_s.so.1` at every start (its constructor runs a dozen CPUID instructions, which a
//! virtual machine traps). The unwinder still has to work: fence catches one panic on
//! purpose, the runtime's when it cannot be built for want of file descriptors
//! (`sys::build_runtime`), and reports it as an error.

use crate::common;

use std::os::unix::process::CommandExt;
use std::process::Command;

/// The shared libraries the dynamic loader maps for `binary`, by `ldd` (glibc's, part of
/// every Debian system).
fn loaded_libraries(binary: &std::ffi::OsStr) -> String {
    let out = Command::new("ldd").arg(binary).output().expect("run ldd");
    assert!(
        out.status.success(),
        "ldd failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_binary_does_not_load_libgcc_s() {
    let libraries = loaded_libraries(&common::fence_bin());
    assert!(
        libraries.contains("libc.so"),
        "ldd did not list the C library, so this test reads nothing: {libraries}"
    );
    assert!(
        !libraries.contains("libgcc_s"),
        "fence loads libgcc_s at every start (build.rs links its unwinder in): {libraries}"
    );
}

/// At every open-file limit from 3 to 24 (the runtime cannot be built at some of them: its
/// signal driver panics inside tokio when its socket pair fails), `fence acquire` ends with
/// an error of its own, never a panic's message, an abort or a signal: the panic fence catches
/// unwinds through the unwinder build.rs links in.
#[test]
fn a_panic_caught_at_start_unwinds_without_libgcc_s() {
    let tmp = tempfile::tempdir().unwrap();
    let store = format!("file://{}", tmp.path().join("store").display());
    let mut runtime_refused = 0;
    for limit in 3u64..=24 {
        let mut cmd = common::clean_command(common::fence_bin(), tmp.path());
        let resource = format!("start-limit-{limit}");
        cmd.args(["--store", &store, "acquire", &resource, "--ttl", "5s"]);
        // SAFETY: one async-signal-safe call in the child, between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let rlimit = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &rlimit) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        let out = cmd.output().expect("run fence");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let said = format!("limit {limit}: {:?}, stderr: {stderr}", out.status);
        assert!(out.status.code().is_some(), "killed by a signal: {said}");
        assert!(!stderr.contains("panicked"), "a panic escaped: {said}");
        assert_ne!(out.status.code(), Some(101), "a panic's exit code: {said}");
        if stderr.contains("cannot start the async runtime") {
            assert_eq!(out.status.code(), Some(1), "{said}");
            runtime_refused += 1;
        }
        if limit == 24 {
            assert!(out.status.success(), "granted with 24 descriptors: {said}");
        }
    }
    assert!(
        runtime_refused > 0,
        "no limit from 3 to 24 stopped the runtime: this test no longer reaches the caught panic"
    );
}
