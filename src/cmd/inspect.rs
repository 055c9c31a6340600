//! `fence inspect`: who holds what, with which token, and the recent history — the first
//! thing an operator reads during an incident. Times are the coordinator's.

use std::borrow::Cow;
use std::io::Write;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::cli::{Format, InspectArgs, StateFilter};
use crate::cmd::log::WarningKind;
use crate::cmd::Context;
use crate::coordinator::{
    Coordinator, EventKind, InspectQuery, IntegrityFinding, ResourceView, State,
};
use crate::error::Error;
use crate::exit::Exit;
use crate::fenced::target::TargetView;
use crate::fenced::{self, TargetSpec};
use crate::output::{self, Output, Report};
use crate::terminal::terminal_safe;
use crate::time;
use crate::timeline::{shown_detail, RunNote};

/// Events shown per named resource when `--history` is not given.
const DEFAULT_HISTORY: usize = 5;

pub struct Inspected {
    views: Vec<ResourceView>,
    /// With `--limit`, when the page is full: the `--after` of the next page.
    next_after: Option<String>,
    /// `--state` or `--after` narrowed the answer.
    filtered: bool,
    /// What is wrong with the store's own files (damaged, restored, unreadable lines).
    findings: Vec<IntegrityFinding>,
    /// The store read, as shown to people.
    store: String,
    /// The target's guard rows, with `--target`.
    targets: Option<(String, TargetView)>,
}

/// `fence inspect`, printed. An answer that may hold more than [`PAGE`] resources, from a
/// store that pages at the source (PostgreSQL) and without `--target`, is read and printed a
/// page at a time ([`stream`]): fence's memory then follows the page, not the store.
/// Anything else is read whole and printed as one report.
pub async fn run_and_print(args: InspectArgs, ctx: &Context, out: &Output) -> Exit {
    let fail = |err: Error| out.error("inspect", ctx.store_display(), &err);
    let coordinator = match ctx.coordinator().await {
        Ok(coordinator) => coordinator,
        Err(err) => return fail(err),
    };
    let query = query_of(&args);
    if args.target.is_none() && query.history > super::inspect_history::STREAM_HISTORY {
        return super::inspect_history::print(&args, query, coordinator.as_ref(), ctx, out).await;
    }
    let large = args.target.is_none()
        && args.resources.is_empty()
        && args.limit.is_none_or(|limit| limit > PAGE as u64);
    if large && coordinator.pages_at_source() {
        return stream(&args, coordinator.as_ref(), ctx, out).await;
    }
    match run(args, coordinator.as_ref(), ctx).await {
        Ok(report) => out.success("inspect", ctx.store_display(), &report),
        Err(err) => fail(err),
    }
}

/// The store query the arguments ask for.
fn query_of(args: &InspectArgs) -> InspectQuery<'_> {
    InspectQuery {
        resources: &args.resources,
        history: args.history.unwrap_or(if args.resources.is_empty() {
            0
        } else {
            DEFAULT_HISTORY
        }),
        state: args.state.map(|s| match s {
            StateFilter::Held => State::Held,
            StateFilter::Expired => State::Expired,
            StateFilter::Free => State::Free,
        }),
        after: args.after.as_deref(),
        limit: args.limit.map(|l| usize::try_from(l).unwrap_or(usize::MAX)),
    }
}

pub async fn run(
    args: InspectArgs,
    coordinator: &dyn Coordinator,
    ctx: &Context,
) -> Result<Inspected, Error> {
    let target = args
        .target
        .as_deref()
        .map(TargetSpec::resolve)
        .transpose()?;
    let inspection = coordinator.inspect_query(&query_of(&args)).await?;
    let views = inspection.views;
    // A full page may be followed by more: the last name is the next page's cursor.
    let next_after = args
        .limit
        .filter(|&limit| views.len() as u64 >= limit)
        .and_then(|_| views.last().map(|v| v.resource.clone()));
    let targets = match target {
        Some(spec) => {
            let names: Vec<String> = views.iter().map(|v| v.resource.clone()).collect();
            let target = fenced::target::open(&spec, &ctx.schema).await?;
            // A schema that is not there is a wrong --schema, not a target that accepted
            // nothing: "no write landed" would be a wrong answer after a takeover.
            target.require_existing().await?;
            Some((spec.display, target.view(&names).await?))
        }
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
    fn integrity_warnings(&self) -> Vec<(WarningKind, String, String)> {
        let mut warnings: Vec<(WarningKind, String, String)> = self
            .target_warnings()
            .into_iter()
            .map(|(resource, message)| (WarningKind::TargetAhead, resource, message))
            .collect();
        for v in &self.views {
            let mut before: Option<i64> = None;
            // Most recent first in a view: oldest first here.
            for e in v.events.iter().rev() {
                let Some(token) = e.token.filter(|_| e.kind.is_grant()) else {
                    continue;
                };
                if let Some(before) = before.filter(|&b| token <= b) {
                    warnings.push((
                        WarningKind::TokenRegressed,
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
            Some((_, TargetView::Guards(guards))) => guards
                .iter()
                .filter_map(|g| Some((g.resource.as_str(), g.highest_token?)))
                .collect(),
            Some((_, TargetView::Object(o))) => {
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

/// One resource of the JSON answer (`resources[]`), keys in this order; `reason` only for a
/// damaged resource, so that a healthy store's answer keeps its shape.
#[derive(Serialize)]
struct ResourceJson<'a> {
    resource: &'a str,
    /// `held`, `expired` or `free`.
    state: &'static str,
    owner: Option<&'a str>,
    token: Option<i64>,
    acquired_at: Option<String>,
    /// How long the live lease's holder has held it (held leases only).
    #[serde(skip_serializing_if = "Option::is_none")]
    held_for_ms: Option<i64>,
    renewed_at: Option<String>,
    expires_at: Option<String>,
    expires_in_ms: Option<i64>,
    /// Most recent first.
    events: Vec<EventJson<'a>>,
    /// Longest waiting first.
    waiters: Vec<WaiterJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

#[derive(Serialize)]
struct EventJson<'a> {
    at: String,
    kind: &'a EventKind,
    owner: Option<&'a str>,
    token: Option<i64>,
    detail: Option<String>,
    /// A run event's record (`run_started`, `run_finished`, `run_stopped`).
    #[serde(skip_serializing_if = "Option::is_none")]
    run: Option<RunNote>,
}

#[derive(Serialize)]
struct WaiterJson<'a> {
    owner: &'a str,
    since: String,
}

/// One resource of the JSON answer without its events (`events` is empty), for an answer
/// whose events are written as they are read.
pub(super) fn resource_json(v: &ResourceView, findings: &[IntegrityFinding]) -> Map<String, Value> {
    output::fields(&ResourceJson {
        events: Vec::new(),
        ..ResourceJson::of(v, findings)
    })
}

/// One event of a resource's `events`.
pub(super) fn event_json(e: &crate::coordinator::Event) -> Value {
    output::value(&EventJson::of(e))
}

/// A finding of the store's own files, as an entry of `warnings`.
pub(super) fn integrity_finding_json(f: &IntegrityFinding) -> Value {
    output::value(&WarningJson {
        resource: f.resource.as_str().into(),
        kind: f.kind,
        message: f.message.as_str().into(),
    })
}

impl<'a> EventJson<'a> {
    fn of(e: &'a crate::coordinator::Event) -> EventJson<'a> {
        EventJson {
            at: time::rfc3339(e.at_ms),
            kind: &e.kind,
            owner: e.owner.as_deref(),
            token: e.token,
            detail: shown_detail(e),
            run: RunNote::of(e),
        }
    }
}

impl<'a> ResourceJson<'a> {
    fn of(v: &'a ResourceView, findings: &'a [IntegrityFinding]) -> ResourceJson<'a> {
        ResourceJson {
            resource: &v.resource,
            state: v.state.as_str(),
            owner: v.owner.as_deref(),
            token: v.token,
            acquired_at: v.acquired_at_ms.map(time::rfc3339),
            held_for_ms: held_for_ms(v),
            renewed_at: v.renewed_at_ms.map(time::rfc3339),
            expires_at: v.expires_at_ms.map(time::rfc3339),
            expires_in_ms: v.expires_in_ms,
            events: v.events.iter().map(EventJson::of).collect(),
            waiters: v
                .waiters
                .iter()
                .map(|w| WaiterJson {
                    owner: &w.owner,
                    since: time::rfc3339(w.since_ms),
                })
                .collect(),
            reason: findings
                .iter()
                .find(|f| f.resource == v.resource && f.kind == "damaged")
                .map(|f| f.message.as_str()),
        }
    }
}

/// The JSON answer after `ok` and `op`: `integrity_ok` (false) and `warnings` only when
/// something is wrong, so that a healthy store's answer keeps its shape; `targets` with
/// `--target`.
#[derive(Serialize)]
struct InspectJson<'a> {
    resources: Vec<ResourceJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_after: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    integrity_ok: Option<bool>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<WarningJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    targets: Option<Vec<TargetJson<'a>>>,
}

/// A finding of the store's own files, or what the history proves wrong.
#[derive(Serialize)]
struct WarningJson<'a> {
    resource: Cow<'a, str>,
    /// A finding's (`damaged`, `restored`, …) or a [`WarningKind`].
    kind: &'static str,
    message: Cow<'a, str>,
}

/// What `--target` shows: an object's stored token, or a database's guard rows.
#[derive(Serialize)]
#[serde(untagged)]
enum TargetJson<'a> {
    Object {
        target: &'a str,
        resource: Option<&'a str>,
        highest_token: Option<i64>,
        version: Option<&'a str>,
        updated_at: Option<String>,
        updated_by: Option<&'a str>,
    },
    Guard {
        target: &'a str,
        resource: &'a str,
        highest_token: Option<i64>,
        updated_at: Option<String>,
        updated_by: Option<&'a str>,
        accepted_writes: i64,
        rejected_writes: i64,
    },
}

/// The fields that close a streamed answer, `ok` last.
#[derive(Serialize)]
struct StreamEnd<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    next_after: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<&'a str>,
    ok: bool,
}

pub(super) const COLUMNS: [&str; 7] = [
    "RESOURCE", "STATE", "OWNER", "TOKEN", "ACQUIRED", "RENEWED", "EXPIRES",
];

/// One line of `text` for a cell: a name holding a newline (which fence refuses, but any
/// writer of the store's tables can store) must not print a row of its own.
pub(super) fn cell(text: &str) -> String {
    terminal_safe(text, false).into_owned()
}

/// One resource's cells under [`COLUMNS`].
pub(super) fn row_cells(v: &ResourceView) -> [String; 7] {
    let dash = || "-".to_owned();
    let expires = match (v.expires_at_ms, v.expires_in_ms) {
        (Some(at), Some(left)) => format!("{} ({})", time::expires_in(left), time::rfc3339(at)),
        _ => dash(),
    };
    [
        cell(&v.resource),
        v.state.as_str().to_owned(),
        v.owner.as_deref().map_or_else(dash, cell),
        v.token.map_or_else(dash, |t| t.to_string()),
        match (v.acquired_at_ms, held_for_ms(v)) {
            (Some(at), Some(held)) => format!("{} (held {})", time::rfc3339(at), time::span(held)),
            (at, _) => at.map_or_else(dash, time::rfc3339),
        },
        v.renewed_at_ms.map_or_else(dash, time::rfc3339),
        expires,
    ]
}

/// How long the live lease's holder has held it since it was granted, by the store's clock
/// (its now is the expiry less what was left of it when it answered).
fn held_for_ms(v: &ResourceView) -> Option<i64> {
    if v.state != State::Held {
        return None;
    }
    let now = v.expires_at_ms?.checked_sub(v.expires_in_ms?)?;
    Some(now.saturating_sub(v.acquired_at_ms?).max(0))
}

/// Resources per page of a streamed answer.
const PAGE: usize = 1_000;

/// An answer of more than one page, read and printed a page at a time. One that fits in a
/// page is printed as [`Inspected`] always was. Each page is its own read, so pages are
/// consistent in themselves, not with each other (a resource acquired meanwhile may be
/// missing from a later page's `--state held`).
async fn stream(
    args: &InspectArgs,
    coordinator: &dyn Coordinator,
    ctx: &Context,
    out: &Output,
) -> Exit {
    let wanted = args.limit.map(|l| usize::try_from(l).unwrap_or(usize::MAX));
    let mut after = args.after.clone();
    let mut shown = 0;
    let mut printer: Option<Printer> = None;
    loop {
        let limit = wanted.map_or(PAGE, |wanted| (wanted - shown).min(PAGE));
        let query = InspectQuery {
            after: after.as_deref(),
            limit: Some(limit),
            ..query_of(args)
        };
        let page = match coordinator.inspect_query(&query).await {
            Ok(page) => page,
            Err(err) => {
                return match printer {
                    Some(printer) => printer.fail(&err, ctx),
                    None => out.error("inspect", ctx.store_display(), &err),
                }
            }
        };
        let full = page.views.len() >= limit;
        let printer = match printer.as_mut() {
            Some(printer) => printer,
            None if !full => {
                let report = Inspected {
                    views: page.views,
                    next_after: None,
                    filtered: args.state.is_some() || args.after.is_some(),
                    findings: page.findings,
                    store: ctx.store_display().unwrap_or_default().to_owned(),
                    targets: None,
                };
                return out.success("inspect", ctx.store_display(), &report);
            }
            None => printer.insert(Printer::start(out, ctx, &page.views)),
        };
        shown += page.views.len();
        after = page.views.last().map(|v| v.resource.clone());
        // A closed stdout (`| head`) ends the answer; no one reads the rest.
        if printer.page(&page.views).is_err() {
            return Exit::Success;
        }
        let limited = wanted.is_some_and(|wanted| shown >= wanted);
        if !full || limited {
            let _ = printer.finish(after.filter(|_| limited).as_deref(), ctx);
            return Exit::Success;
        }
    }
}

/// Writes a streamed answer: JSON (`{"op": "inspect", "resources": [` …, then the closing
/// fields with `ok` last, so that a read failing midway still ends one JSON object, with
/// `"ok": false` and the error) or, for people, aligned lines instead of a table (a table's
/// columns need every row first), each resource's waiters and events indented below it.
struct Printer<'a> {
    json: bool,
    /// `--quiet` for people: nothing on stdout.
    silent: bool,
    /// Column widths, from the header and the first page.
    widths: [usize; 7],
    /// No resource written yet (JSON's commas).
    first: bool,
    out: std::io::BufWriter<std::io::Stdout>,
    settings: &'a Output,
}

impl<'a> Printer<'a> {
    fn start(out: &'a Output, ctx: &Context, first_page: &[ResourceView]) -> Printer<'a> {
        let json = out.format == Format::Json;
        let mut widths = COLUMNS.map(|c| c.chars().count());
        for v in first_page {
            for (width, cell) in widths.iter_mut().zip(row_cells(v)) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut printer = Printer {
            json,
            silent: !json && out.quiet,
            widths,
            first: true,
            out: std::io::BufWriter::new(std::io::stdout()),
            settings: out,
        };
        let store = ctx.store_display().unwrap_or_default();
        let head = if json {
            "{\"op\":\"inspect\",\"resources\":[".to_owned()
        } else {
            let header = printer.line(&COLUMNS.map(str::to_owned));
            format!("store `{}`:\n{header}\n", terminal_safe(store, false))
        };
        let _ = printer.write(&head);
        printer
    }

    /// Cells padded to the column widths, two spaces apart.
    fn line(&self, cells: &[String; 7]) -> String {
        let mut line = String::new();
        for (cell, width) in cells.iter().zip(self.widths) {
            line.push_str(&format!("{cell:<width$}  "));
        }
        line.trim_end().to_owned()
    }

    fn write(&mut self, text: &str) -> std::io::Result<()> {
        if self.silent {
            return Ok(());
        }
        self.out.write_all(text.as_bytes())
    }

    fn page(&mut self, views: &[ResourceView]) -> std::io::Result<()> {
        for v in views {
            if self.json {
                let comma = if std::mem::take(&mut self.first) {
                    ""
                } else {
                    ","
                };
                let resource = output::value(&ResourceJson::of(v, &[]));
                self.write(&format!("{comma}{resource}"))?;
                continue;
            }
            let mut text = self.line(&row_cells(v));
            for w in &v.waiters {
                text.push_str(&format!(
                    "\n  waiting since {}: {}",
                    time::rfc3339(w.since_ms),
                    cell(&w.owner)
                ));
            }
            for e in &v.events {
                let dash = || "-".to_owned();
                let event = format!(
                    "\n  event {}  {}  {}  {}  {}",
                    time::rfc3339(e.at_ms),
                    cell(e.kind.as_str()),
                    e.owner.as_deref().map_or_else(dash, cell),
                    e.token.map_or_else(dash, |t| t.to_string()),
                    cell(&shown_detail(e).unwrap_or_default())
                );
                text.push_str(event.trim_end());
            }
            let text = terminal_safe(&text, true).into_owned();
            self.write(&format!("{text}\n"))?;
        }
        self.out.flush()
    }

    /// The end of a complete answer; `next_after` when `--limit` was reached.
    fn finish(&mut self, next_after: Option<&str>, ctx: &Context) -> std::io::Result<()> {
        let tail = if self.json {
            let mut end = output::fields(&StreamEnd {
                next_after,
                store: ctx.store_display(),
                ok: true,
            });
            output::add_notices(&mut end);
            format!("]{}\n", json_fields(end))
        } else {
            next_after.map_or_else(String::new, |next| {
                format!(
                    "\nmore may follow: add --after={}\n",
                    terminal_safe(&crate::error::shell_word(next), false)
                )
            })
        };
        self.write(&tail)?;
        self.out.flush()
    }

    /// The end of an answer cut short by `err`: for JSON the error's fields and `"ok": false`
    /// close the object; for people the error goes to stderr, as always.
    fn fail(mut self, err: &Error, ctx: &Context) -> Exit {
        let exit = err.exit();
        if !self.json {
            let _ = self.out.flush();
            return self.settings.error("inspect", ctx.store_display(), err);
        }
        let mut tail = output::error_fields("inspect", err, ctx.store_display(), exit);
        tail.insert("ok".into(), Value::Bool(false));
        let _ = self.write(&format!("]{}\n", json_fields(tail)));
        let _ = self.out.flush();
        exit
    }
}

/// `,"key":value…}`: the fields that close a streamed JSON object.
pub(super) fn json_fields(fields: Map<String, Value>) -> String {
    let mut text = String::new();
    for (key, value) in fields {
        text.push_str(&format!(",{}:{value}", Value::String(key)));
    }
    text.push('}');
    text
}

impl Report for Inspected {
    fn json(&self) -> Map<String, Value> {
        let mut warnings: Vec<WarningJson> = self
            .findings
            .iter()
            .map(|f| WarningJson {
                resource: f.resource.as_str().into(),
                kind: f.kind,
                message: f.message.as_str().into(),
            })
            .collect();
        warnings.extend(
            self.integrity_warnings()
                .into_iter()
                .map(|(kind, resource, message)| WarningJson {
                    resource: resource.into(),
                    kind: kind.as_str(),
                    message: message.into(),
                }),
        );
        let targets = self
            .targets
            .as_ref()
            .map(|(target, targets)| match targets {
                TargetView::Object(o) => vec![TargetJson::Object {
                    target,
                    resource: o.resource.as_deref(),
                    highest_token: o.token,
                    version: o.version.as_deref(),
                    updated_at: o.updated_at_ms.map(time::rfc3339),
                    updated_by: o.owner.as_deref(),
                }],
                TargetView::Guards(guards) => guards
                    .iter()
                    .map(|g| TargetJson::Guard {
                        target,
                        resource: &g.resource,
                        highest_token: g.highest_token,
                        updated_at: g.updated_at_ms.map(time::rfc3339),
                        updated_by: g.updated_by.as_deref(),
                        accepted_writes: g.accepted_writes,
                        rejected_writes: g.rejected_writes,
                    })
                    .collect(),
            });
        output::fields(&InspectJson {
            resources: self
                .views
                .iter()
                .map(|v| ResourceJson::of(v, &self.findings))
                .collect(),
            next_after: self.next_after.as_deref(),
            integrity_ok: (!warnings.is_empty()).then_some(false),
            warnings,
            targets,
        })
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
        let mut table = output::table();
        table.set_header(COLUMNS);
        output::keep_whole(&mut table, &[1, 3]);
        for v in &self.views {
            table.add_row(row_cells(v));
        }
        let mut text = format!("store `{}`:\n{}\n", self.store, output::render(&table));
        if !self.findings.is_empty() {
            text.push_str("\nintegrity warnings (the store's own files):\n");
            for f in &self.findings {
                text.push_str(&format!("  {}: {}\n", f.kind, f.message));
            }
        }
        if let Some((target, TargetView::Object(o))) = &self.targets {
            let mut t = output::table();
            t.set_header([
                "OBJECT",
                "VERSION",
                "RESOURCE",
                "STORED TOKEN",
                "UPDATED",
                "BY",
            ]);
            // Each cell escaped whole, newlines too (review 18: an owner with a newline in a
            // `file://` object's sidecar broke the row onto a line of its own).
            t.add_row([
                cell(target),
                o.version.as_deref().map_or_else(|| "(absent)".into(), cell),
                o.resource.as_deref().map_or_else(dash, cell),
                o.token.map_or_else(dash, |t| t.to_string()),
                o.updated_at_ms.map_or_else(dash, time::rfc3339),
                o.owner.as_deref().map_or_else(dash, cell),
            ]);
            text.push_str(&format!("\nfenced object:\n{}\n", output::render(&t)));
        }
        if let Some((target, TargetView::Guards(guards))) = &self.targets {
            let mut t = output::table();
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
                    cell(&g.resource),
                    g.highest_token.map_or_else(dash, |t| t.to_string()),
                    g.updated_at_ms.map_or_else(dash, time::rfc3339),
                    g.updated_by
                        .as_deref()
                        .filter(|o| !o.is_empty())
                        .map_or_else(dash, cell),
                    g.accepted_writes.to_string(),
                    g.rejected_writes.to_string(),
                ]);
            }
            text.push_str(&format!(
                "\nfenced writes at `{}`:\n{}\n",
                cell(target),
                output::render(&t)
            ));
        }
        for v in self.views.iter().filter(|v| !v.waiters.is_empty()) {
            text.push_str(&format!(
                "\nwaiting for `{}`, longest first:\n",
                cell(&v.resource)
            ));
            for w in &v.waiters {
                text.push_str(&format!(
                    "  {} (since {})\n",
                    cell(&w.owner),
                    time::rfc3339(w.since_ms)
                ));
            }
        }
        for v in self.views.iter().filter(|v| !v.events.is_empty()) {
            let mut events = output::table();
            events.set_header(["AT", "EVENT", "OWNER", "TOKEN", "DETAIL"]);
            output::keep_whole(&mut events, &[0, 1, 3]);
            for e in &v.events {
                events.add_row([
                    time::rfc3339(e.at_ms),
                    cell(e.kind.as_str()),
                    e.owner.as_deref().map_or_else(dash, cell),
                    e.token.map_or_else(dash, |t| t.to_string()),
                    cell(&shown_detail(e).unwrap_or_default()),
                ]);
            }
            text.push_str(&format!(
                "\nlast events of `{}`, most recent first:\n{}\n",
                cell(&v.resource),
                output::render(&events)
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
