//! fence: leases with fencing tokens, for shell scripts, cron jobs and admin scripts.
//!
//! The program runs in three steps (STYLE: parse → resolve → execute): [`cli`] holds the clap
//! types, [`config`] validates them and reads the environment without touching the network,
//! and [`cmd`] runs one subcommand against a [`coordinator::Coordinator`]. Every outcome, success or
//! failure, is printed once by [`output`] and mapped to an [`exit::Exit`] code in one place.

pub mod cli;
pub mod cmd;
pub mod config;
pub mod coordinator;
pub mod error;
pub mod exit;
pub mod fenced;
pub mod metrics;
pub mod object;
pub mod output;
pub mod pg;
pub mod reaper;
pub mod signals;
pub mod sys;
pub mod terminal;
pub mod time;
pub mod timeline;
pub mod url;

use crate::exit::Exit;

/// Runs the program with the process's arguments and returns its exit status.
pub fn main() -> Exit {
    // SAFETY: ignoring SIGXFSZ at start-up, before any thread: a write past RLIMIT_FSIZE then fails with EFBIG, which fence reports, instead of killing it mid-operation.
    // The caller's own disposition is kept for `fence run`'s command (see `Reaper::fork`).
    let caller_xfsz = unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match cli::Cli::parse_with_sources(&args) {
        Ok(cli) => cli,
        Err(err) => {
            return match cli::refused(&err, &args) {
                cli::Refused::Shown => Exit::Success,
                cli::Refused::HelpForMissing => Exit::Usage,
                cli::Refused::Error { op, error, format } => {
                    output::parse_error(&op, &error, format)
                }
            }
        }
    };
    let out = output::Output::new(&cli.global);
    // `fence run`'s supervisor is forked now, while this process has one thread (see
    // `cmd::Reaper::fork`); what goes wrong is told where it was before, in the run.
    let reaper = match &cli.command {
        cli::Command::Run(args) => Some(cmd::Reaper::fork(
            args,
            out.format == cli::Format::Json,
            caller_xfsz,
        )),
        _ => None,
    };
    terminal::route_warnings(output::warnings_route(&cli.global, &cli.command));
    let runtime = match sys::build_runtime() {
        Ok(runtime) => runtime,
        Err(cause) => {
            let err = error::Error::Internal {
                message: format!("cannot start the async runtime: {cause}"),
                hint: "this is a resource limit (open files: `ulimit -n`; threads) or a bug; nothing was done".into(),
                source: None,
            };
            return out.error(cli.command.op(), None, &err);
        }
    };
    let exit = runtime.block_on(async {
        let exit = cmd::dispatch(cli, &out, reaper).await;
        pg::close_all().await;
        exit
    });
    // Warnings that no JSON answer carried (none was printed) are not lost: stderr.
    terminal::flush_warnings();
    exit
}
