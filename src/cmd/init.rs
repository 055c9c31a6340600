//! `fence init`: create or migrate the store's own records ahead of first use, or, with
//! `--target`, fence's schema in a target database (prepared by the admin, who owns it).

use serde_json::{Map, Value};

use crate::cli::InitArgs;
use crate::cmd::Context;
use crate::coordinator::{InitAction, InitReport};
use crate::error::Error;
use crate::fenced::postgres::PgTarget;
use crate::fenced::TargetSpec;
use crate::output::{self, Report};

pub struct Initialised {
    report: InitReport,
}

pub async fn run(args: InitArgs, ctx: &Context) -> Result<Initialised, Error> {
    if let Some(url) = &args.target {
        return init_target(url, ctx).await;
    }
    // Refused before anything is created.
    let postgres = matches!(
        ctx.store.as_ref().map(|store| &store.kind),
        Some(crate::config::StoreKind::Postgres(_))
    );
    if args.held_waiters.is_some() && !postgres {
        return Err(crate::coordinator::held_waiters_elsewhere());
    }
    let coordinator = ctx.coordinator().await?;
    let mut report = coordinator.init().await?;
    if let Some(most) = args.held_waiters {
        coordinator.set_held_waiters(most).await?;
        report.held_waiters = Some(most);
    }
    Ok(Initialised { report })
}

async fn init_target(url: &str, ctx: &Context) -> Result<Initialised, Error> {
    let spec = TargetSpec::resolve(url)?;
    let target = PgTarget::connect(spec.postgres("`fence init --target`")?, &ctx.schema).await?;
    let (before, schema_version) = target.session().init().await?;
    Ok(Initialised {
        report: InitReport {
            action: InitAction::of(before, schema_version),
            schema_version,
            location: format!("schema `{}` in {}", ctx.schema, spec.display),
            held_waiters: None,
        },
    })
}

impl Report for Initialised {
    fn json(&self) -> Map<String, Value> {
        output::fields(&self.report)
    }

    fn human(&self) -> String {
        let what = match self.report.action {
            InitAction::Created => "created",
            InitAction::Migrated => "migrated",
            InitAction::UpToDate => "already up to date:",
        };
        let held = self
            .report
            .held_waiters
            .map(|most| format!("; up to {most} waiters of a resource keep a connection"))
            .unwrap_or_default();
        format!(
            "{what} {} (version {}){held}\n",
            self.report.location, self.report.schema_version
        )
    }
}
