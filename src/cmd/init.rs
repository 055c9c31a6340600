//! `fence init`: create or migrate the store's own records ahead of first use.

use serde_json::{json, Map, Value};

use crate::cli::InitArgs;
use crate::cmd::Context;
use crate::error::Error;
use crate::output::Report;
use crate::store::InitReport;

pub struct Initialised {
    report: InitReport,
}

pub async fn run(_args: InitArgs, ctx: &Context) -> Result<Initialised, Error> {
    let coordinator = ctx.coordinator().await?;
    let report = coordinator.init().await?;
    Ok(Initialised { report })
}

impl Report for Initialised {
    fn json(&self) -> Map<String, Value> {
        let mut map = Map::new();
        map.insert("action".into(), json!(self.report.action));
        map.insert("schema_version".into(), json!(self.report.schema_version));
        map.insert("location".into(), json!(self.report.location));
        map
    }

    fn human(&self) -> String {
        let what = match self.report.action {
            "created" => "created",
            "migrated" => "migrated",
            _ => "already up to date:",
        };
        format!(
            "{what} {} (version {})\n",
            self.report.location, self.report.schema_version
        )
    }
}
