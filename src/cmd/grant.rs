//! `fence grant`: give a role what a fenced writer (or a reader) needs in a target database,
//! or print the SQL for an admin to review and run.

use serde_json::{json, Map, Value};

use crate::cli::GrantArgs;
use crate::cmd::Context;
use crate::error::Error;
use crate::fenced::grant::GrantPlan;
use crate::fenced::postgres::PgTarget;
use crate::fenced::TargetSpec;
use crate::output::Report;

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
        let mut map = Map::new();
        map.insert("role".into(), json!(self.plan.role));
        map.insert(
            "access".into(),
            json!(if self.plan.reader { "reader" } else { "writer" }),
        );
        map.insert("applied".into(), json!(self.applied));
        map.insert("statements".into(), json!(self.plan.statements));
        map.insert("warnings".into(), json!(self.plan.warnings));
        map.insert("target".into(), json!(self.target));
        map
    }

    fn human(&self) -> String {
        let sql: String = self
            .plan
            .statements
            .iter()
            .map(|s| format!("{s};\n"))
            .collect();
        // Printed SQL stays runnable as is (`fence grant … --print | psql`); warnings are
        // SQL comments there.
        let mut text = if self.applied {
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
        };
        for warning in &self.plan.warnings {
            text.push_str(&format!("-- warning: {warning}\n"));
        }
        text
    }
}
