//! `fence grant`: give a role what a fenced writer (or a reader) needs in a target database,
//! or print the SQL for an admin to review and run.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::cli::GrantArgs;
use crate::cmd::Context;
use crate::error::Error;
use crate::fenced::postgres::PgTarget;
use crate::fenced::privileges::GrantPlan;
use crate::fenced::TargetSpec;
use crate::output::{self, Report};

pub struct Granted {
    plan: GrantPlan,
    applied: bool,
    target: String,
}

pub async fn run(args: GrantArgs, ctx: &Context) -> Result<Granted, Error> {
    let spec = TargetSpec::resolve(&args.target)?;
    let target = PgTarget::connect(spec.postgres("`fence grant`")?, &ctx.schema).await?;
    let plan = target.grant_plan(&args.role, args.reader).await?;
    if !args.print {
        target.apply_grant(&plan).await?;
    }
    Ok(Granted {
        plan,
        applied: !args.print,
        target: spec.display,
    })
}

impl Report for Granted {
    fn json(&self) -> Map<String, Value> {
        #[derive(Serialize)]
        struct Json<'a> {
            role: &'a str,
            access: &'a str,
            applied: bool,
            statements: &'a [String],
            /// Always empty since `grant` refuses what it once warned about (a writer that
            /// owns a protected table); kept for scripts that read it.
            warnings: &'a [String],
            target: &'a str,
        }
        output::fields(&Json {
            role: &self.plan.role,
            access: if self.plan.reader { "reader" } else { "writer" },
            applied: self.applied,
            statements: &self.plan.statements,
            warnings: &[],
            target: &self.target,
        })
    }

    fn human(&self) -> String {
        let sql: String = self
            .plan
            .statements
            .iter()
            .map(|s| format!("{s};\n"))
            .collect();
        // Printed SQL stays runnable as is (`fence grant … --print | psql`).
        if self.applied {
            let access = if self.plan.reader {
                "a reader"
            } else {
                "a fenced writer"
            };
            format!(
                "granted `{}` what {access} needs at `{}`:\n{sql}",
                self.plan.role, self.target
            )
        } else {
            sql
        }
    }
}
