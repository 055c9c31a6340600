//! `fence protect`: make every write path to a table go through the fence.

use serde_json::{json, Map, Value};

use crate::cli::ProtectArgs;
use crate::cmd::Context;
use crate::error::Error;
use crate::output::Report;
use crate::target::postgres::PgTarget;
use crate::target::TargetSpec;

pub struct Protected {
    table: String,
    resource: Option<String>,
    removed: bool,
    target: String,
}

pub async fn run(args: ProtectArgs, ctx: &Context) -> Result<Protected, Error> {
    let spec = TargetSpec::resolve(&args.target)?;
    let target = PgTarget::connect(spec.postgres("`fence protect`")?, &ctx.schema).await?;
    let resource = args.resource.clone().unwrap_or_default();
    let table = target.protect(&args.table, &resource, args.remove).await?;
    Ok(Protected {
        table,
        resource: args.resource,
        removed: args.remove,
        target: spec.display,
    })
}

impl Report for Protected {
    fn json(&self) -> Map<String, Value> {
        let mut map = Map::new();
        map.insert("table".into(), json!(self.table));
        map.insert("resource".into(), json!(self.resource));
        map.insert("protected".into(), json!(!self.removed));
        map.insert("target".into(), json!(self.target));
        map
    }

    fn human(&self) -> String {
        if self.removed {
            format!("{} is no longer protected by fence\n", self.table)
        } else {
            format!(
                "{} is protected: every write must carry a current token for `{}`\n",
                self.table,
                self.resource.as_deref().unwrap_or_default()
            )
        }
    }
}
