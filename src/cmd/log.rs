//! `fence log`: one ordered timeline of a store's lease events and its targets' fenced
//! writes, for "what happened at 03:00?" — who held what when, which TTL and expiry each
//! grant set, when a lease ran out, what each target accepted (and how many rows) and what
//! it refused — with the integrity warnings that history can prove.
//!
//! Expiries are not events a store writes (nothing happens when a lease runs out): they are
//! derived from the expiry each grant or renewal recorded, when nothing renewed or released
//! the lease before it, and shown as `expired` events at that instant.

use std::collections::HashMap;

use comfy_table::{presets, Table};
use serde_json::{json, Map, Value};

use crate::cli::LogArgs;
use crate::cmd::Context;
use crate::error::Error;
use crate::output::Report;
use crate::store::{Event, LogQuery, Logged, Pattern};
use crate::target::postgres::PgTarget;
use crate::target::TargetSpec;
use crate::time;

/// Where an event comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Store,
    /// The target's URL as shown.
    Target(String),
}

/// One line of the timeline.
#[derive(Clone, Debug)]
pub struct Entry {
    pub source: Source,
    pub logged: Logged,
    /// Derived from the history (an expiry), not written by the store.
    pub derived: bool,
}

/// Something the history proves wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    pub resource: String,
    /// `token_regressed`, `target_ahead` or `held_past_ttl`.
    pub kind: &'static str,
    pub message: String,
}

pub struct Timeline {
    entries: Vec<Entry>,
    warnings: Vec<Warning>,
    /// A source had more events in the window than `--limit`: older ones are left out.
    truncated: bool,
    store: String,
}

pub async fn run(args: LogArgs, ctx: &Context) -> Result<Timeline, Error> {
    let targets = args
        .targets
        .iter()
        .map(|url| {
            let spec = TargetSpec::resolve(url)?;
            if spec.object.is_some() {
                return Err(Error::usage(
                    format!("`fence log --target` reads PostgreSQL targets, not `{}`", spec.display),
                    "an object's stored token and version are shown by `fence inspect RESOURCE --target URL`",
                ));
            }
            Ok(spec)
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let patterns: Vec<Pattern> = args.resources.iter().map(|r| Pattern::new(r)).collect();
    let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
    let query = LogQuery {
        patterns: &patterns,
        since_ms: args.since,
        until_ms: args.until,
        limit,
    };
    let coordinator = ctx.coordinator().await?;
    let store_events = coordinator.log(&query).await?;
    let mut truncated = store_events.len() >= limit;
    let mut entries = with_expiries(store_events, &query, now_ms());
    let mut guards = Vec::new();
    for spec in &targets {
        let target = PgTarget::connect(spec, &ctx.schema).await?;
        let events = target.log(&query).await?;
        truncated |= events.len() >= limit;
        let names = resources_of(&entries, &events);
        guards.push((spec.display.clone(), target.guards(&names).await?));
        entries.extend(events.into_iter().map(|logged| Entry {
            source: Source::Target(spec.display.clone()),
            logged,
            derived: false,
        }));
    }
    entries.sort_by_key(|e| (e.logged.at_us, rank(e)));
    let mut warnings = history_warnings(&entries);
    if !guards.is_empty() {
        let names: Vec<String> = guards
            .iter()
            .flat_map(|(_, g)| g.iter().map(|g| g.resource.clone()))
            .collect();
        let issued: HashMap<String, Option<i64>> = coordinator
            .inspect(&names, 0)
            .await?
            .into_iter()
            .map(|v| (v.resource, v.token))
            .collect();
        for (target, guards) in &guards {
            for g in guards {
                let Some(highest) = g.highest_token else {
                    continue;
                };
                let issued = issued.get(&g.resource).copied().flatten();
                if let Some(message) = target_ahead(target, &g.resource, highest, issued) {
                    warnings.push(Warning {
                        resource: g.resource.clone(),
                        kind: "target_ahead",
                        message,
                    });
                }
            }
        }
    }
    entries.retain(|e| {
        let ev = &e.logged.event;
        args.owner
            .as_ref()
            .is_none_or(|o| ev.owner.as_ref() == Some(o))
            && args.token.is_none_or(|t| ev.token == Some(t))
            && (args.kinds.is_empty() || args.kinds.contains(&ev.kind))
    });
    Ok(Timeline {
        entries,
        warnings,
        truncated,
        store: ctx.store_display().unwrap_or_default().to_owned(),
    })
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Within one instant: an expiry first (a takeover can only follow it), then the store's
/// events, then the targets'.
fn rank(entry: &Entry) -> u8 {
    match (&entry.source, entry.derived) {
        (_, true) => 0,
        (Source::Store, false) => 1,
        (Source::Target(_), false) => 2,
    }
}

/// The resources of a timeline and of a target's events, for the target's guard rows.
fn resources_of(entries: &[Entry], events: &[Logged]) -> Vec<String> {
    let mut names: Vec<String> = entries
        .iter()
        .map(|e| e.logged.resource.clone())
        .chain(events.iter().map(|l| l.resource.clone()))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A lease some grant or renewal set, not yet seen to end.
struct Open {
    owner: Option<String>,
    token: Option<i64>,
    ttl_ms: Option<i64>,
    expires_at_ms: i64,
}

/// The store's events (oldest first) with an `expired` event wherever a lease ran out before
/// anything renewed or released it: at the expiry its last grant or renewal set, when a later
/// event of the resource comes after that instant, or when that instant is past (`now_ms`).
/// A takeover whose taken-over grant is outside the window shows that lease's expiry from
/// what the takeover recorded.
pub fn with_expiries(events: Vec<Logged>, query: &LogQuery<'_>, now_ms: i64) -> Vec<Entry> {
    let mut open: HashMap<String, Open> = HashMap::new();
    let mut entries = Vec::with_capacity(events.len());
    let expired = |resource: &str, lease: Open| Entry {
        source: Source::Store,
        derived: true,
        logged: Logged {
            resource: resource.to_owned(),
            at_us: lease.expires_at_ms.saturating_mul(1000),
            event: Event {
                at_ms: lease.expires_at_ms,
                kind: "expired".into(),
                owner: lease.owner,
                token: lease.token,
                detail: Some(match lease.ttl_ms {
                    Some(ttl) => format!(
                        "not renewed or released within its TTL of {}",
                        time::span(ttl)
                    ),
                    None => "the lease taken over had run out".into(),
                }),
                ttl_ms: lease.ttl_ms,
                expires_at_ms: Some(lease.expires_at_ms),
                ..Event::default()
            },
        },
    };
    for logged in events {
        let ev = &logged.event;
        let resource = logged.resource.clone();
        if ev.kind == "taken_over" && !open.contains_key(&resource) {
            if let Some(previous) = ev.previous_expires_at_ms {
                open.insert(
                    resource.clone(),
                    Open {
                        owner: None,
                        token: None,
                        ttl_ms: None,
                        expires_at_ms: previous,
                    },
                );
            }
        }
        if ev.kind != "pruned"
            && open
                .get(&resource)
                .is_some_and(|o| o.expires_at_ms <= ev.at_ms)
        {
            if let Some(lease) = open.remove(&resource) {
                entries.push(expired(&resource, lease));
            }
        }
        match ev.kind.as_str() {
            "acquired" | "reacquired" | "taken_over" | "renewed" => match ev.expires_at_ms {
                Some(expires_at_ms) => {
                    open.insert(
                        resource,
                        Open {
                            owner: ev.owner.clone(),
                            token: ev.token,
                            ttl_ms: ev.ttl_ms,
                            expires_at_ms,
                        },
                    );
                }
                // Recorded before fence kept expiries: this lease's end is unknown.
                None => {
                    open.remove(&resource);
                }
            },
            "released" => {
                open.remove(&resource);
            }
            _ => {}
        }
        entries.push(Entry {
            source: Source::Store,
            logged,
            derived: false,
        });
    }
    let mut ran_out: Vec<(String, Open)> = open
        .into_iter()
        .filter(|(_, o)| o.expires_at_ms <= now_ms)
        .collect();
    ran_out.sort_by(|a, b| a.0.cmp(&b.0));
    entries.extend(ran_out.into_iter().map(|(r, o)| expired(&r, o)));
    entries.retain(|e| !e.derived || query.in_window(e.logged.event.at_ms));
    entries
}

/// What the timeline itself proves wrong: a grant whose token is not above the resource's
/// previous grant's; a release, or a write a target accepted, with a token whose lease had
/// already expired by the store's clock (the holder went on past its TTL).
pub fn history_warnings(entries: &[Entry]) -> Vec<Warning> {
    let mut warnings = Vec::new();
    let mut granted: HashMap<&str, i64> = HashMap::new();
    let mut expired: HashMap<(&str, i64), i64> = HashMap::new();
    for entry in entries {
        let resource = entry.logged.resource.as_str();
        let ev = &entry.logged.event;
        let Some(token) = ev.token else {
            continue;
        };
        match (ev.kind.as_str(), &entry.source) {
            ("acquired" | "taken_over", Source::Store) => {
                if let Some(&before) = granted.get(resource) {
                    if token <= before {
                        warnings.push(Warning {
                            resource: resource.to_owned(),
                            kind: "token_regressed",
                            message: token_regressed(resource, before, token, ev.at_ms),
                        });
                    }
                }
                granted.insert(
                    resource,
                    token.max(granted.get(resource).copied().unwrap_or(0)),
                );
            }
            ("expired", Source::Store) => {
                expired.insert((resource, token), ev.at_ms);
            }
            ("released", Source::Store) => {
                if let Some(&at) = expired.get(&(resource, token)) {
                    warnings.push(Warning {
                        resource: resource.to_owned(),
                        kind: "held_past_ttl",
                        message: format!(
                            "{} released `{resource}` (token {token}) at {}, {} after its lease expired at {} by the store's clock: whatever it did in between was done without a lease",
                            ev.owner.as_deref().unwrap_or("its owner"),
                            time::rfc3339(ev.at_ms),
                            time::span(ev.at_ms - at),
                            time::rfc3339(at)
                        ),
                    });
                }
            }
            ("write_accepted", Source::Target(target)) => {
                if let Some(&at) = expired.get(&(resource, token)) {
                    warnings.push(Warning {
                        resource: resource.to_owned(),
                        kind: "held_past_ttl",
                        message: format!(
                            "`{target}` accepted a write to `{resource}` with token {token} at {}, {} after that lease expired at {} by the store's clock (no newer token had written there yet): check what that write changed",
                            time::rfc3339(ev.at_ms),
                            time::span(ev.at_ms - at),
                            time::rfc3339(at)
                        ),
                    });
                }
            }
            _ => {}
        }
    }
    warnings
}

/// The warning for a grant whose token is not above an earlier grant's.
pub fn token_regressed(resource: &str, before: i64, token: i64, at_ms: i64) -> String {
    format!(
        "`{resource}` was granted token {token} at {}, not above token {before} granted before: the store's records were restored from an older copy or changed by hand, and two holders may share a token; find who holds which before trusting either",
        time::rfc3339(at_ms)
    )
}

/// A target that accepted a token above the highest the store issued for the resource: a
/// token it never issued was written there (a typo, a forgery, or a target fenced by another
/// coordinator), and the real holder's writes are now refused.
pub fn target_ahead(
    target: &str,
    resource: &str,
    highest: i64,
    issued: Option<i64>,
) -> Option<String> {
    issued.is_none_or(|issued| highest > issued).then(|| {
        format!(
            "`{target}` has accepted token {highest} for `{resource}`, above any this store issued ({}): check that the target is fenced by this store, and how that token was written",
            issued.map_or("none".to_owned(), |t| format!("up to {t}"))
        )
    })
}

fn opt_time(ms: Option<i64>) -> Value {
    ms.map_or(Value::Null, |ms| json!(time::rfc3339(ms)))
}

impl Entry {
    fn json(&self) -> Value {
        let ev = &self.logged.event;
        let mut object = json!({
            "at": time::rfc3339(ev.at_ms),
            "resource": self.logged.resource,
            "source": match self.source { Source::Store => "store", Source::Target(_) => "target" },
            "kind": ev.kind,
            "owner": ev.owner,
            "token": ev.token,
        });
        let map = object.as_object_mut().expect("an object");
        if let Source::Target(target) = &self.source {
            map.insert("target".into(), json!(target));
        }
        if ev.ttl_ms.is_some() {
            map.insert("ttl_ms".into(), json!(ev.ttl_ms));
        }
        if ev.expires_at_ms.is_some() {
            map.insert("expires_at".into(), opt_time(ev.expires_at_ms));
        }
        if ev.previous_expires_at_ms.is_some() {
            map.insert(
                "previous_expires_at".into(),
                opt_time(ev.previous_expires_at_ms),
            );
        }
        if ev.rows.is_some() {
            map.insert("rows".into(), json!(ev.rows));
        }
        if self.derived {
            map.insert("derived".into(), json!(true));
        }
        map.insert("detail".into(), json!(ev.detail));
        object
    }

    /// The LEASE column: the TTL and expiry a grant or renewal set, a takeover's previous
    /// expiry, a write's rows.
    fn lease_text(&self) -> String {
        let ev = &self.logged.event;
        let mut parts = Vec::new();
        if let (Some(ttl), Some(expires)) = (ev.ttl_ms, ev.expires_at_ms) {
            if ev.kind != "expired" {
                parts.push(format!(
                    "ttl {}, expires {}",
                    time::span(ttl),
                    time::rfc3339(expires)
                ));
            }
        }
        if let Some(previous) = ev.previous_expires_at_ms {
            parts.push(format!(
                "previous lease expired {}",
                time::rfc3339(previous)
            ));
        }
        if let Some(rows) = ev.rows {
            parts.push(format!("{rows} row{}", if rows == 1 { "" } else { "s" }));
        }
        parts.join("; ")
    }
}

impl Warning {
    fn json(&self) -> Value {
        json!({ "resource": self.resource, "kind": self.kind, "message": self.message })
    }
}

impl Report for Timeline {
    fn json(&self) -> Map<String, Value> {
        let mut map = Map::new();
        map.insert(
            "events".into(),
            Value::Array(self.entries.iter().map(Entry::json).collect()),
        );
        map.insert("truncated".into(), json!(self.truncated));
        map.insert("integrity_ok".into(), json!(self.warnings.is_empty()));
        map.insert(
            "warnings".into(),
            Value::Array(self.warnings.iter().map(Warning::json).collect()),
        );
        map
    }

    fn ndjson(&self) -> Option<Vec<Value>> {
        let mut lines: Vec<Value> = self.entries.iter().map(Entry::json).collect();
        lines.extend(self.warnings.iter().map(|w| {
            let mut line = w.json();
            line["kind"] = json!("warning");
            line["warning"] = json!(w.kind);
            line
        }));
        if self.truncated {
            lines.push(json!({
                "kind": "truncated",
                "message": "older events in the window were left out: narrow it with --since, or raise --limit",
            }));
        }
        Some(lines)
    }

    fn human(&self) -> String {
        let mut text = String::new();
        if self.entries.is_empty() {
            text.push_str(&format!("no events in store `{}` match\n", self.store));
        } else {
            let mut table = Table::new();
            table.load_preset(presets::UTF8_FULL_CONDENSED);
            table.set_header([
                "AT", "RESOURCE", "WHERE", "EVENT", "OWNER", "TOKEN", "LEASE", "DETAIL",
            ]);
            let dash = || "-".to_owned();
            for e in &self.entries {
                let ev = &e.logged.event;
                table.add_row([
                    time::rfc3339(ev.at_ms),
                    e.logged.resource.clone(),
                    match &e.source {
                        Source::Store => "store".to_owned(),
                        Source::Target(target) => target.clone(),
                    },
                    ev.kind.clone(),
                    ev.owner.clone().unwrap_or_else(dash),
                    ev.token.map_or_else(dash, |t| t.to_string()),
                    e.lease_text(),
                    ev.detail.clone().unwrap_or_default(),
                ]);
            }
            text.push_str(&format!("store `{}`, oldest first:\n{table}\n", self.store));
        }
        if self.truncated {
            text.push_str(
                "\nolder events in the window were left out: narrow it with --since, or raise --limit\n",
            );
        }
        for w in &self.warnings {
            text.push_str(&format!("\nwarning ({}): {}\n", w.kind, w.message));
        }
        text
    }
}
