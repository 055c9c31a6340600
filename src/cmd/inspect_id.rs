//! `fence inspect RESOURCE --target URL --id KEY`: one write id's entry in a target's ledger,
//! the answer to "did my write land?" after `outcome_unknown` without writing anything. Talks to
//! the target only (no coordinator). An id that is not there is an answer, not a failure: exit
//! 0, `"applied": false`.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::cli::InspectArgs;
use crate::cmd::write::{applied_when, AppliedJson};
use crate::cmd::Context;
use crate::error::Error;
use crate::fenced::target::Applied as Entry;
use crate::fenced::{self, TargetSpec};
use crate::output::{self, Report};

pub struct IdInspected {
    resource: String,
    id: String,
    target: String,
    entry: Option<Entry>,
    /// What "not there" means at this target: the number of ids it remembers, if bounded.
    remembers: Option<usize>,
}

pub async fn run(args: InspectArgs, ctx: &Context) -> Result<IdInspected, Error> {
    let (Some(id), Some(url)) = (args.id, args.target) else {
        unreachable!("dispatched on --id, which requires --target")
    };
    let [resource] = <[String; 1]>::try_from(args.resources).map_err(|_| {
        Error::usage(
            "--id looks up one write: name its RESOURCE",
            "write `fence inspect RESOURCE --target URL --id KEY`",
        )
    })?;
    let spec = TargetSpec::resolve(&url)?;
    let target = fenced::target::open(&spec, &ctx.schema).await?;
    target.require_existing().await?;
    let entry = target.applied(&resource, &id).await?;
    Ok(IdInspected {
        resource,
        id,
        target: spec.display,
        entry,
        remembers: target.remembers_ids(),
    })
}

impl Report for IdInspected {
    fn json(&self) -> Map<String, Value> {
        /// `entry` is null when the id is not in the ledger.
        #[derive(Serialize)]
        struct Json<'a> {
            resource: &'a str,
            target: &'a str,
            write_id: &'a str,
            applied: bool,
            entry: Option<AppliedJson<'a>>,
        }
        output::fields(&Json {
            resource: &self.resource,
            target: &self.target,
            write_id: &self.id,
            applied: self.entry.is_some(),
            entry: self.entry.as_ref().map(|e| {
                AppliedJson::new(e.at_ms, e.token, e.owner.as_deref(), e.version.as_deref())
            }),
        })
    }

    fn human(&self) -> String {
        match &self.entry {
            Some(e) => format!(
                "write `{}` of `{}` was applied to `{}` {}{}\n",
                self.id,
                self.resource,
                self.target,
                applied_when(e.at_ms, e.token, e.owner.as_deref()),
                e.version
                    .as_deref()
                    .map(|v| format!(" (version {v})"))
                    .unwrap_or_default()
            ),
            None if self.remembers.is_some() => format!(
                "write `{}` is not in the ledger of `{}`: it was never applied there, or it is older than the object's last {} ids\n",
                self.id,
                self.target,
                self.remembers.unwrap_or_default()
            ),
            None => format!(
                "write `{}` of `{}` is not in the ledger of `{}`: it was never applied there (or its ledger row was deleted)\n",
                self.id, self.resource, self.target
            ),
        }
    }
}
