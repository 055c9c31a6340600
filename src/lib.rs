//! fence: leases with fencing tokens, for shell scripts, cron jobs and admin scripts.
//!
//! The program runs in three steps (STYLE: parse → resolve → execute): [`cli`] holds the clap
//! types, [`config`] validates them and reads the environment without touching the network,
//! and [`cmd`] runs one subcommand against a [`store::Coordinator`]. Every outcome, success or
//! failure, is printed once by [`output`] and mapped to an [`exit::Exit`] code in one place.

pub mod cli;
pub mod cmd;
pub mod config;
pub mod error;
pub mod exit;
pub mod object;
pub mod output;
pub mod pg;
pub mod reaper;
pub mod signals;
pub mod store;
pub mod target;
pub mod time;

use clap::Parser;

use crate::exit::Exit;

/// Runs the program with the process's arguments and returns its exit status.
pub fn main() -> Exit {
    // SAFETY: ignoring SIGXFSZ at start-up, before any thread: a write past RLIMIT_FSIZE then fails with EFBIG, which fence reports, instead of killing it mid-operation.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == reaper::ARG) {
        return reaper::main(&args[2..]);
    }
    let cli = match cli::Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(err) => return output::clap_error(&err, &args),
    };
    let out = output::Output::new(&cli.global);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            let err = error::Error::Internal {
                message: format!("cannot start the async runtime: {err}"),
                hint: "this is a bug or a resource limit (threads, file descriptors); report it"
                    .into(),
            };
            return out.error(cli.command.op(), None, &err);
        }
    };
    runtime.block_on(async {
        let exit = cmd::dispatch(cli, &out).await;
        pg::close_all().await;
        exit
    })
}
