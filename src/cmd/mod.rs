//! One module per subcommand; this dispatcher only resolves the shared context and routes.

mod acquire;
mod init;
mod inspect;
mod release;
mod renew;

use crate::cli::{Cli, Command, Format};
use crate::config::StoreSpec;
use crate::error::Error;
use crate::exit::Exit;
use crate::output::{Output, Report};
use crate::store::{self, Coordinator};

/// What every command needs, resolved before anything touches the network.
pub struct Context {
    pub store: StoreSpec,
    pub schema: String,
}

impl Context {
    /// Connects to (or opens) the configured coordinator.
    pub async fn coordinator(&self) -> Result<Box<dyn Coordinator>, Error> {
        store::open(&self.store, &self.schema).await
    }
}

pub async fn dispatch(cli: Cli, out: &Output) -> Exit {
    let op = cli.command.op();
    if out.format == Format::Env && !matches!(cli.command, Command::Acquire(_)) {
        let err = Error::usage(
            format!("`--format env` only applies to `fence acquire`, not to `fence {op}`"),
            "use --format human or --format json",
        );
        return out.error(op, None, &err);
    }
    let ctx = match StoreSpec::resolve(cli.global.store.as_deref()) {
        Ok(store) => Context {
            store,
            schema: cli.global.schema.clone(),
        },
        Err(err) => return out.error(op, None, &err),
    };
    let result: Result<Box<dyn Report>, Error> = match cli.command {
        Command::Acquire(args) => acquire::run(args, &ctx).await.map(boxed),
        Command::Renew(args) => renew::run(args, &ctx).await.map(boxed),
        Command::Release(args) => release::run(args, &ctx).await.map(boxed),
        Command::Inspect(args) => inspect::run(args, &ctx).await.map(boxed),
        Command::Init(args) => init::run(args, &ctx).await.map(boxed),
    };
    match result {
        Ok(report) => out.success(op, &ctx, report.as_ref()),
        Err(err) => out.error(op, Some(&ctx.store.display), &err),
    }
}

fn boxed<R: Report + 'static>(report: R) -> Box<dyn Report> {
    Box::new(report)
}
