//! `fence inspect`: who holds what, with which token, and the recent history — the first
//! thing an operator reads during an incident. Times are the coordinator's.

use comfy_table::{presets, Table};
use serde_json::{json, Map, Value};

use crate::cli::{InspectArgs, StateFilter};
use crate::cmd::Context;
use crate::error::Error;
use crate::output::Report;
use crate::store::{Finding, InspectQuery, ResourceView, State};
use crate::target::object::{self as object_target, ObjectView};
use crate::target::postgres::{GuardView, PgTarget};
use crate::target::TargetSpec;
use crate::time;

/// Events shown per named resource when `--history` is not given.
const DEFAULT_HISTORY: usize = 5;

pub struct Inspected {
    views: Vec<ResourceView>,
    /// With `--limit`, when the page is full: the `--after` of the next page.
    next_after: Option<String>,
    /// `--state` or `--after` narrowed the answer.
    filtered: bool,
    /// What is wrong with the store's own files (damaged, restored, unreadable lines).
    findings: Vec<Finding>,
    /// The store read, as shown to people.
    store: String,
    /// The target's guard rows, with `--target`.
    targets: Option<(String, Targets)>,
}

/// What `--target` shows.
enum Targets {
    /// A database's guard rows, one per resource.
    Guards(Vec<GuardView>),
    /// An object's version and stored token.
    Object(ObjectView),
}

pub async fn run(args: InspectArgs, ctx: &Context) -> Result<Inspected, Error> {
    let history = args.history.unwrap_or(if args.resources.is_empty() {
        0
    } else {
        DEFAULT_HISTORY
    });
    let target = args
        .target
        .as_deref()
        .map(TargetSpec::resolve)
        .transpose()?;
    let coordinator = ctx.coordinator().await?;
    let query = InspectQuery {
        resources: &args.resources,
        history,
        state: args.state.map(|s| match s {
            StateFilter::Held => State::Held,
            StateFilter::Expired => State::Expired,
            StateFilter::Free => State::Free,
        }),
        after: args.after.as_deref(),
        limit: args.limit.map(|l| usize::try_from(l).unwrap_or(usize::MAX)),
    };
    let inspection = coordinator.inspect_query(&query).await?;
    let views = inspection.views;
    // A full page may be followed by more: the last name is the next page's cursor.
    let next_after = args
        .limit
        .filter(|&limit| views.len() as u64 >= limit)
        .and_then(|_| views.last().map(|v| v.resource.clone()));
    let targets = match target {
        Some(spec) => match &spec.object {
            Some(url) => Some((
                spec.display.clone(),
                Targets::Object(object_target::view(url).await?),
            )),
            None => {
                let names: Vec<String> = views.iter().map(|v| v.resource.clone()).collect();
                let guards = PgTarget::connect(&spec, &ctx.schema)
                    .await?
                    .guards(&names)
                    .await?;
                Some((spec.display, Targets::Guards(guards)))
            }
        },
        None => None,
    };
    Ok(Inspected {
        views,
        findings: inspection.findings,
        store: ctx.store_display().unwrap_or_default().to_owned(),
        targets,
        next_after,
        filtered: args.state.is_some() || args.after.is_some(),
    })
}

impl Inspected {
    /// What the history shows wrong: targets that accepted a token above the highest the
    /// coordinator issued for the resource ([`super::log::target_ahead`]), and grants whose
    /// token is not above an earlier grant's among the events shown. Kind, resource, message.
    fn integrity_warnings(&self) -> Vec<(&'static str, String, String)> {
        let mut warnings: Vec<(&'static str, String, String)> = self
            .target_warnings()
            .into_iter()
            .map(|(resource, message)| ("target_ahead", resource, message))
            .collect();
        for v in &self.views {
            let mut before: Option<i64> = None;
            // Most recent first in a view: oldest first here.
            for e in v.events.iter().rev() {
                let (Some(token), "acquired" | "taken_over") = (e.token, e.kind.as_str()) else {
                    continue;
                };
                if let Some(before) = before.filter(|&b| token <= b) {
                    warnings.push((
                        "token_regressed",
                        v.resource.clone(),
                        super::log::token_regressed(&v.resource, before, token, e.at_ms),
                    ));
                }
                before = Some(before.map_or(token, |b| b.max(token)));
            }
        }
        warnings
    }

    fn target_warnings(&self) -> Vec<(String, String)> {
        let accepted: Vec<(&str, i64)> = match &self.targets {
            Some((_, Targets::Guards(guards))) => guards
                .iter()
                .filter_map(|g| Some((g.resource.as_str(), g.highest_token?)))
                .collect(),
            Some((_, Targets::Object(o))) => {
                o.resource.as_deref().zip(o.token).into_iter().collect()
            }
            None => Vec::new(),
        };
        let target = self.targets.as_ref().map_or("", |(t, _)| t.as_str());
        accepted
            .into_iter()
            .filter_map(|(resource, highest)| {
                let issued = self.views.iter().find(|v| v.resource == resource)?.token;
                super::log::target_ahead(target, resource, highest, issued)
                    .map(|message| (resource.to_owned(), message))
            })
            .collect()
    }
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
                let mut resource = json!({
                    "resource": v.resource,
                    "state": v.state.as_str(),
                    "owner": v.owner,
                    "token": v.token,
                    "acquired_at": opt_time(v.acquired_at_ms),
                    "renewed_at": opt_time(v.renewed_at_ms),
                    "expires_at": opt_time(v.expires_at_ms),
                    "expires_in_ms": v.expires_in_ms,
                    "events": events,
                    "waiters": v.waiters.iter().map(|w| json!({
                        "owner": w.owner,
                        "since": time::rfc3339(w.since_ms),
                    })).collect::<Vec<_>>(),
                });
                // Only for a damaged resource: the answer for a healthy store keeps its shape.
                if let Some(f) = self
                    .findings
                    .iter()
                    .find(|f| f.resource == v.resource && f.kind == "damaged")
                {
                    resource["reason"] = json!(f.message);
                }
                resource
            })
            .collect();
        let mut map = Map::new();
        map.insert("resources".into(), Value::Array(resources));
        if let Some(next) = &self.next_after {
            map.insert("next_after".into(), json!(next));
        }
        // Only when something is wrong, so that a healthy store's answer keeps its shape.
        let mut warnings: Vec<Value> = self
            .findings
            .iter()
            .map(|f| json!({ "resource": f.resource, "kind": f.kind, "message": f.message }))
            .collect();
        warnings.extend(
            self.integrity_warnings()
                .into_iter()
                .map(|(kind, resource, message)| json!({ "resource": resource, "kind": kind, "message": message })),
        );
        if !warnings.is_empty() {
            map.insert("integrity_ok".into(), json!(false));
            map.insert("warnings".into(), Value::Array(warnings));
        }
        if let Some((target, Targets::Object(o))) = &self.targets {
            let entry = json!({
                "target": target,
                "resource": o.resource,
                "highest_token": o.token,
                "version": o.version,
                "updated_at": opt_time(o.updated_at_ms),
                "updated_by": o.owner,
            });
            map.insert("targets".into(), Value::Array(vec![entry]));
        }
        if let Some((target, Targets::Guards(guards))) = &self.targets {
            let guards: Vec<Value> = guards
                .iter()
                .map(|g| {
                    json!({
                        "target": target,
                        "resource": g.resource,
                        "highest_token": g.highest_token,
                        "updated_at": opt_time(g.updated_at_ms),
                        "updated_by": g.updated_by,
                        "accepted_writes": g.accepted_writes,
                        "rejected_writes": g.rejected_writes,
                    })
                })
                .collect();
            map.insert("targets".into(), Value::Array(guards));
        }
        map
    }

    fn human(&self) -> String {
        if self.views.is_empty() {
            return if self.filtered {
                format!("no resource in store `{}` matches\n", self.store)
            } else {
                format!("no leases in store `{}` yet\n", self.store)
            };
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
        let mut text = format!("store `{}`:\n{table}\n", self.store);
        if !self.findings.is_empty() {
            text.push_str("\nintegrity warnings (the store's own files):\n");
            for f in &self.findings {
                text.push_str(&format!("  {}: {}\n", f.kind, f.message));
            }
        }
        if let Some((target, Targets::Object(o))) = &self.targets {
            let mut t = Table::new();
            t.load_preset(presets::UTF8_FULL_CONDENSED);
            t.set_header([
                "OBJECT",
                "VERSION",
                "RESOURCE",
                "STORED TOKEN",
                "UPDATED",
                "BY",
            ]);
            t.add_row([
                target.clone(),
                o.version.clone().unwrap_or_else(|| "(absent)".into()),
                o.resource.clone().unwrap_or_else(dash),
                o.token.map_or_else(dash, |t| t.to_string()),
                o.updated_at_ms.map_or_else(dash, time::rfc3339),
                o.owner.clone().unwrap_or_else(dash),
            ]);
            text.push_str(&format!("\nfenced object:\n{t}\n"));
        }
        if let Some((target, Targets::Guards(guards))) = &self.targets {
            let mut t = Table::new();
            t.load_preset(presets::UTF8_FULL_CONDENSED);
            t.set_header([
                "RESOURCE",
                "HIGHEST ACCEPTED TOKEN",
                "UPDATED",
                "BY",
                "ACCEPTED",
                "REJECTED",
            ]);
            for g in guards {
                t.add_row([
                    g.resource.clone(),
                    g.highest_token.map_or_else(dash, |t| t.to_string()),
                    g.updated_at_ms.map_or_else(dash, time::rfc3339),
                    g.updated_by
                        .clone()
                        .filter(|o| !o.is_empty())
                        .unwrap_or_else(dash),
                    g.accepted_writes.to_string(),
                    g.rejected_writes.to_string(),
                ]);
            }
            text.push_str(&format!("\nfenced writes at `{target}`:\n{t}\n"));
        }
        for v in self.views.iter().filter(|v| !v.waiters.is_empty()) {
            text.push_str(&format!("\nwaiting for `{}`, longest first:\n", v.resource));
            for w in &v.waiters {
                text.push_str(&format!(
                    "  {} (since {})\n",
                    w.owner,
                    time::rfc3339(w.since_ms)
                ));
            }
        }
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
        if let Some(next) = &self.next_after {
            text.push_str(&format!(
                "\nmore may follow: add --after={}\n",
                crate::error::shell_word(next)
            ));
        }
        for (_, _, warning) in self.integrity_warnings() {
            text.push_str(&format!("\nwarning: {warning}\n"));
        }
        text
    }
}
