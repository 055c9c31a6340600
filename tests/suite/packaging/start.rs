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

/// The functions the dynamic loader runs before `main` (the binary's `.init_array`, filled by
/// relative relocations in a position-independent executable), by name: `readelf` and `nm`
/// (binutils, which the C toolchain that links fence brings).
fn constructors(binary: &std::ffi::OsStr) -> Vec<String> {
    let run = |program: &str, args: &[&str]| {
        let out = Command::new(program)
            .args(args)
            .arg(binary)
            .output()
            .unwrap_or_else(|err| panic!("run {program}: {err}"));
        assert!(out.status.success(), "{program} failed: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let hex = |text: &str| u64::from_str_radix(text, 16).ok();
    // `[22] .init_array INIT_ARRAY 0000000000b0c720 b0a720 000018 …`
    let sections = run("readelf", &["-W", "-S"]);
    let (start, size) = sections
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let at = fields.iter().position(|f| *f == ".init_array")?;
            Some((hex(fields.get(at + 2)?)?, hex(fields.get(at + 4)?)?))
        })
        .expect("the binary has an .init_array section");
    // `0000000000b0c720  0000000000000008 R_X86_64_RELATIVE  8d5c90`
    let targets: Vec<u64> = run("readelf", &["-W", "-r"])
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let offset = hex(fields.first()?)?;
            ((start..start + size).contains(&offset) && fields.get(2)?.ends_with("RELATIVE"))
                .then(|| hex(fields.get(3)?))
                .flatten()
        })
        .collect();
    assert_eq!(
        targets.len() as u64,
        size / 8,
        "every .init_array slot is a relative relocation: {targets:x?}"
    );
    let symbols = run("nm", &[]);
    targets
        .iter()
        .map(|target| {
            symbols
                .lines()
                .find_map(|line| {
                    let mut fields = line.split_whitespace();
                    let address = hex(fields.next()?)?;
                    fields.next()?;
                    (address == *target).then(|| fields.next().map(str::to_owned))?
                })
                .unwrap_or_else(|| format!("{target:#x}"))
        })
        .collect()
}

/// AWS-LC is built without its constructor (`.cargo/config.toml`), which ran CPUID at every
/// start; `sys::crypto_ready` has it learn the CPU before its first use instead. (The suite's
/// TLS and S3 tests show that crypto still works once it is called.)
#[test]
fn no_crypto_library_runs_at_start() {
    let names = constructors(&common::fence_bin());
    assert!(
        names.iter().any(|name| name.contains("note_closed_stdout")),
        "fence's own constructor was not found, so this test reads nothing: {names:?}"
    );
    assert!(
        !names.iter().any(|name| name.contains("do_library_init")),
        "AWS-LC's constructor runs at every start (AWS_LC_SYS_CFLAGS in .cargo/config.toml): {names:?}"
    );
}
