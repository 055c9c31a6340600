//! One module per subcommand; this dispatcher only resolves the shared context and routes.

mod acquire;
mod bench;
mod doctor;
mod grant;
mod init;
mod inspect;
mod inspect_history;
mod inspect_id;
mod log;
mod log_stream;
mod metrics;
mod protect;
mod prune;
mod release;
mod renew;
mod run;
mod run_metrics;

pub use run::Reaper;
pub mod wait;
mod write;

use crate::cli::{Cli, Command, Format};
use crate::config::StoreSpec;
use crate::coordinator::{self, Coordinator};
use crate::error::Error;
use crate::exit::Exit;
use crate::output::{Output, Report};

/// What every command needs, resolved before anything touches the network.
pub struct Context {
    /// The coordinator; `None` for commands that only talk to a target (`write`, `protect`).
    pub store: Option<StoreSpec>,
    pub schema: String,
    /// `fence write`: the store (as --store, FENCE_STORE or the default name it) where a
    /// refused object write is recorded, best effort, when it resolves. Not `store`, which
    /// would add a `store` field to write's answer.
    pub history: Option<StoreSpec>,
}

impl Context {
    /// Connects to (or opens) the configured coordinator.
    pub async fn coordinator(&self) -> Result<Box<dyn Coordinator>, Error> {
        match &self.store {
            Some(store) => coordinator::open(store, &self.schema).await,
            None => Err(Error::internal(
                "this command has no store configured",
                "this is a bug in fence; please report it",
            )),
        }
    }

    /// The store URL without its password, when there is one.
    pub fn store_display(&self) -> Option<&str> {
        self.store.as_ref().map(|s| s.display.as_str())
    }
}

pub async fn dispatch(cli: Cli, out: &Output, reaper: Option<Result<Reaper, Error>>) -> Exit {
    let op = cli.command.op();
    if out.format == Format::Env && !matches!(cli.command, Command::Acquire(_)) {
        let err = Error::usage(
            format!("`--format env` only applies to `fence acquire`, not to `fence {op}`"),
            "use --format human or --format json",
        );
        return out.error(op, None, &err);
    }
    if out.format == Format::Ndjson && !matches!(cli.command, Command::Log(_)) {
        let err = Error::usage(
            format!("`--format ndjson` only applies to `fence log`, not to `fence {op}`"),
            "use --format human or --format json",
        );
        return out.error(op, None, &err);
    }
    // Commands that only talk to a target need no store.
    let needs_store = match &cli.command {
        Command::Write(_) | Command::Protect(_) | Command::Grant(_) => false,
        Command::Init(args) => args.target.is_none(),
        Command::Inspect(args) => args.table.is_none() && args.id.is_none(),
        _ => true,
    };
    let store = if needs_store {
        match StoreSpec::resolve(cli.global.store.as_deref()) {
            Ok(store) => Some(store),
            Err(err) => return out.error(op, None, &err),
        }
    } else {
        None
    };
    let history = match &cli.command {
        Command::Write(_) => StoreSpec::resolve(cli.global.store.as_deref()).ok(),
        _ => None,
    };
    crate::output::note_schema(&cli.global.schema);
    let ctx = Context {
        store,
        schema: cli.global.schema.clone(),
        history,
    };
    let result: Result<Box<dyn Report>, Error> = match cli.command {
        Command::Acquire(args) => return acquire::run_and_print(args, &ctx, out).await,
        Command::Run(args) => {
            let reaper = reaper.unwrap_or_else(|| {
                Err(Error::internal(
                    "fence run's supervisor was not started",
                    "this is a bug in fence; nothing was run",
                ))
            });
            return run::run(args, reaper, &ctx, out).await;
        }
        Command::Renew(args) => renew::run(args, &ctx).await.map(boxed),
        Command::Release(args) => release::run(args, &ctx).await.map(boxed),
        Command::Inspect(args) if args.table.is_some() => {
            protect::inspect(args, &ctx).await.map(boxed)
        }
        Command::Inspect(args) if args.id.is_some() => inspect_id::run(args, &ctx).await.map(boxed),
        Command::Inspect(args) => return inspect::run_and_print(args, &ctx, out).await,
        Command::Log(mut args) => {
            // `fence log R` is `fence log --resource R`.
            args.resources.append(&mut args.names);
            if args.follow {
                return log::follow(args, &ctx, out).await;
            }
            return log::run_and_print(args, &ctx, out).await;
        }
        Command::Metrics(args) => metrics::run(args, &ctx).await.map(boxed),
        Command::Write(args) => write::run(*args, &ctx, out).await.map(boxed),
        Command::Protect(args) => protect::run(args, &ctx).await.map(boxed),
        Command::Grant(args) => grant::run(args, &ctx).await.map(boxed),
        Command::Init(args) => init::run(args, &ctx).await.map(boxed),
        Command::Doctor(args) => return doctor::run(args, &ctx, out).await,
        Command::Bench(args) => bench::run(args, &ctx, out).await.map(boxed),
        Command::Prune(args) => prune::run(args, &ctx).await.map(boxed),
    };
    match result {
        Ok(report) => out.success(op, ctx.store_display(), report.as_ref()),
        Err(err) => out.error(op, ctx.store_display(), &err),
    }
}

fn boxed<R: Report + 'static>(report: R) -> Box<dyn Report> {
    Box::new(report)
}
