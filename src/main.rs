//! The `fence` binary: parse, run, exit. Everything else lives in the library.

fn main() -> std::process::ExitCode {
    fence::main().into()
}
