//! `fence inspect`: who holds what, with which token, and the recent history — the first
//! thing an operator reads during an incident. Times are the coordinator's.

use comfy_table::{presets, Table};
use serde_json::{json, Map, Value};

use crate::cli::InspectArgs;
use crate::cmd::Context;
use crate::error::Error;
use crate::output::Report;
use crate::store::ResourceView;
use crate::time;

/// Events shown per named resource when `--history` is not given.
const DEFAULT_HISTORY: usize = 5;

pub struct Inspected {
    views: Vec<ResourceView>,
}

pub async fn run(args: InspectArgs, ctx: &Context) -> Result<Inspected, Error> {
    let history = args.history.unwrap_or(if args.resources.is_empty() {
        0
    } else {
        DEFAULT_HISTORY
    });
    let coordinator = ctx.coordinator().await?;
    let views = coordinator.inspect(&args.resources, history).await?;
    Ok(Inspected { views })
}

fn opt_time(ms: Option<i64>) -> Value {
    ms.map_or(Value::Null, |ms| json!(time::rfc3339(ms)))
}

impl Report for Inspected {
    fn json(&self) -> Map<String, Value> {
        let resources: Vec<Value> = self
            .views
            .iter()
            .map(|v| {
                let events: Vec<Value> = v
                    .events
                    .iter()
                    .map(|e| {
                        json!({
                            "at": time::rfc3339(e.at_ms),
                            "kind": e.kind,
                            "owner": e.owner,
                            "token": e.token,
                            "detail": e.detail,
                        })
                    })
                    .collect();
                json!({
                    "resource": v.resource,
                    "state": v.state.as_str(),
                    "owner": v.owner,
                    "token": v.token,
                    "acquired_at": opt_time(v.acquired_at_ms),
                    "renewed_at": opt_time(v.renewed_at_ms),
                    "expires_at": opt_time(v.expires_at_ms),
                    "expires_in_ms": v.expires_in_ms,
                    "events": events,
                })
            })
            .collect();
        let mut map = Map::new();
        map.insert("resources".into(), Value::Array(resources));
        map
    }

    fn human(&self) -> String {
        if self.views.is_empty() {
            return "no leases in this store yet\n".into();
        }
        let dash = || "-".to_owned();
        let mut table = Table::new();
        table.load_preset(presets::UTF8_FULL_CONDENSED);
        table.set_header([
            "RESOURCE", "STATE", "OWNER", "TOKEN", "ACQUIRED", "RENEWED", "EXPIRES",
        ]);
        for v in &self.views {
            let expires = match (v.expires_at_ms, v.expires_in_ms) {
                (Some(at), Some(left)) => {
                    format!("{} ({})", time::expires_in(left), time::rfc3339(at))
                }
                _ => dash(),
            };
            table.add_row([
                v.resource.clone(),
                v.state.as_str().to_owned(),
                v.owner.clone().unwrap_or_else(dash),
                v.token.map_or_else(dash, |t| t.to_string()),
                v.acquired_at_ms.map_or_else(dash, time::rfc3339),
                v.renewed_at_ms.map_or_else(dash, time::rfc3339),
                expires,
            ]);
        }
        let mut text = format!("{table}\n");
        for v in self.views.iter().filter(|v| !v.events.is_empty()) {
            let mut events = Table::new();
            events.load_preset(presets::UTF8_FULL_CONDENSED);
            events.set_header(["AT", "EVENT", "OWNER", "TOKEN", "DETAIL"]);
            for e in &v.events {
                events.add_row([
                    time::rfc3339(e.at_ms),
                    e.kind.clone(),
                    e.owner.clone().unwrap_or_else(dash),
                    e.token.map_or_else(dash, |t| t.to_string()),
                    e.detail.clone().unwrap_or_default(),
                ]);
            }
            text.push_str(&format!(
                "\nlast events of `{}`, most recent first:\n{events}\n",
                v.resource
            ));
        }
        text
    }
}
