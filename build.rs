//! Links GCC's unwinder into fence itself (`libgcc_eh.a`) instead of loading `libgcc_s.so.1`
//! at every start, on Linux with glibc (issue 37: "a CLI that starts in milliseconds").
//!
//! Rust's standard library asks for the shared `libgcc_s` there (its unwinder: panics,
//! backtraces); loading it costs every invocation its relocations and its constructor,
//! `__cpu_indicator_init`, a dozen CPUID instructions that a virtual machine traps (6.7 µs
//! each on the project's VM). Measured (docs/performance.md, "GCC's unwinder linked in"): a C
//! program that only loads `libgcc_s` starts 0.115 ms later; `fence run` on the directory
//! store 0.18 ms faster without it. The same archive is what a `crt-static` build of Rust
//! links. `tests/suite/packaging/start.rs` holds both facts: the binary does not ask for
//! `libgcc_s`, and a panic fence catches at its start still unwinds.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let static_crt = var("CARGO_CFG_TARGET_FEATURE")
        .split(',')
        .any(|feature| feature == "crt-static");
    // With crt-static the standard library links this archive itself.
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" && !static_crt
    {
        // Found by the C compiler driver that links (its own library directory).
        println!("cargo:rustc-link-lib=static:-bundle=gcc_eh");
    }
}
