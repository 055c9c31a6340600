//! `fence protect`: make every write path to a table, its partitions and its inheritance
//! children go through the fence; and `fence inspect --target … --table T`, which shows how a
//! table and everything below it is protected.

use comfy_table::{presets, Table};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::cli::{InspectArgs, ProtectArgs};
use crate::cmd::Context;
use crate::error::Error;
use crate::fenced::postgres::PgTarget;
use crate::fenced::protection::{Coverage, TreeProtection};
use crate::fenced::TargetSpec;
use crate::output::{self, Report};

pub struct Protected {
    coverage: Coverage,
    resource: Option<String>,
    removed: bool,
    target: String,
}

pub async fn run(args: ProtectArgs, ctx: &Context) -> Result<Protected, Error> {
    let spec = TargetSpec::resolve(&args.target)?;
    // Bad input is refused before connecting, whatever the database's state.
    crate::fenced::quote_table(&args.table)?;
    let target = PgTarget::connect(spec.postgres("`fence protect`")?, &ctx.schema).await?;
    let resource = args.resource.clone().unwrap_or_default();
    let coverage = target.protect(&args.table, &resource, args.remove).await?;
    Ok(Protected {
        coverage,
        resource: args.resource,
        removed: args.remove,
        target: spec.display,
    })
}

/// Names and text from the database, with control characters escaped for the terminal.
fn shown(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_debug().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

impl Report for Protected {
    fn json(&self) -> Map<String, Value> {
        #[derive(Serialize)]
        struct Json<'a> {
            table: &'a str,
            resource: Option<&'a str>,
            protected: bool,
            target: &'a str,
            covered: Vec<&'a str>,
            covers_later_partitions: bool,
            warnings: &'a [String],
        }
        let c = &self.coverage;
        output::fields(&Json {
            table: &c.table,
            resource: self.resource.as_deref(),
            protected: !self.removed,
            target: &self.target,
            covered: c.covered.iter().map(|t| t.table.as_str()).collect(),
            covers_later_partitions: c.covers_later_tables,
            warnings: &c.warnings,
        })
    }

    fn human(&self) -> String {
        let c = &self.coverage;
        let mut text = if self.removed {
            format!("{} is no longer protected by fence\n", shown(&c.table))
        } else {
            format!(
                "{} is protected: every write must carry a current token for `{}`\n",
                shown(&c.table),
                shown(self.resource.as_deref().unwrap_or_default())
            )
        };
        let verb = if self.removed {
            "triggers removed from"
        } else {
            "triggers on"
        };
        text.push_str(&format!("{verb}:\n"));
        for t in &c.covered {
            text.push_str(&format!("  {} ({})\n", shown(&t.table), t.kind));
        }
        if !self.removed && c.covers_later_tables {
            text.push_str("partitions and children added later are protected as they are added\n");
        }
        for warning in &c.warnings {
            text.push_str(&format!("warning: {}\n", shown(warning)));
        }
        text
    }
}

pub struct ProtectionReport {
    tree: TreeProtection,
    target: String,
}

/// `fence inspect --target URL --table T`.
pub async fn inspect(args: InspectArgs, ctx: &Context) -> Result<ProtectionReport, Error> {
    let url = args.target.as_deref().unwrap_or_default();
    let table = args.table.as_deref().unwrap_or_default();
    let spec = TargetSpec::resolve(url)?;
    crate::fenced::quote_table(table)?;
    let target = PgTarget::connect(spec.postgres("`fence inspect --table`")?, &ctx.schema).await?;
    Ok(ProtectionReport {
        tree: target.protection(table).await?,
        target: spec.display,
    })
}

impl Report for ProtectionReport {
    fn json(&self) -> Map<String, Value> {
        #[derive(Serialize)]
        struct Json<'a> {
            target: &'a str,
            tables: Vec<TableJson<'a>>,
            covers_later_partitions: bool,
        }
        /// A table of the tree; `resource` and `enabled` null where fence's triggers are not.
        #[derive(Serialize)]
        struct TableJson<'a> {
            table: &'a str,
            parent: Option<&'a str>,
            kind: &'static str,
            protected: bool,
            resource: Option<&'a str>,
            enabled: Option<&'a str>,
        }
        output::fields(&Json {
            target: &self.target,
            tables: self
                .tree
                .tables
                .iter()
                .map(|t| TableJson {
                    table: &t.table,
                    parent: t.parent.as_deref(),
                    kind: t.kind,
                    protected: t.protected(),
                    resource: t.resource.as_deref(),
                    enabled: t.enabled.as_deref(),
                })
                .collect(),
            covers_later_partitions: self.tree.covers_later_tables,
        })
    }

    fn human(&self) -> String {
        if self.tree.tables.is_empty() {
            return format!(
                "fence's schema is not in `{}` yet: nothing there is protected\n",
                self.target
            );
        }
        let dash = || "-".to_owned();
        let mut table = Table::new();
        table.load_preset(presets::UTF8_FULL_CONDENSED);
        table.set_header(["TABLE", "KIND", "PROTECTED", "RESOURCE", "TRIGGERS"]);
        for t in &self.tree.tables {
            let indent = "  ".repeat(usize::try_from(t.depth).unwrap_or_default());
            table.add_row([
                format!("{indent}{}", shown(&t.table)),
                t.kind.to_owned(),
                if t.protected() { "yes" } else { "NO" }.to_owned(),
                t.resource.as_deref().map_or_else(dash, shown),
                t.enabled.clone().unwrap_or_else(|| {
                    if t.resource.is_some() {
                        "incomplete".into()
                    } else {
                        dash()
                    }
                }),
            ]);
        }
        let later = if self.tree.covers_later_tables {
            "partitions and children added later are protected as they are added"
        } else {
            "partitions and children added later are NOT protected until `fence protect` runs again"
        };
        format!("{table}\n{later}\n")
    }
}
