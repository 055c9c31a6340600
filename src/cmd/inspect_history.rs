//! `fence inspect --history N` for a large N (issue 37): each resource's events are written
//! as the store reads them, so that memory follows a page, not N. The views (state, owner,
//! waiters) are read first with no events; then, per resource, its newest N events most
//! recent first (the answer), and once more oldest first, for the grants whose token is not
//! above an earlier one's (`token_regressed`).
//!
//! JSON: the same object as [`super::inspect::Inspected`]'s, except that `ok` comes last (as
//! in a streamed page answer), so that a read failing midway still ends one JSON object, with
//! `"ok": false` and the error. People: the resources' table, then each resource's events as
//! aligned lines (`AT  EVENT  OWNER  TOKEN  DETAIL`) instead of a table, whose columns would
//! need every event first.

use std::io::Write;

use serde_json::{Map, Value};

use super::inspect::{event_json, integrity_finding_json, json_fields, resource_json};
use crate::cli::{Format, InspectArgs};
use crate::cmd::Context;
use crate::coordinator::{Coordinator, Event, InspectQuery, ResourceView};
use crate::error::Error;
use crate::exit::Exit;
use crate::output::{self, Output};
use crate::terminal::terminal_safe;
use crate::time;
use crate::timeline::shown_detail;

/// Above this many events per resource, `inspect --history` streams.
pub const STREAM_HISTORY: usize = 1_000;

pub async fn print(
    args: &InspectArgs,
    query: InspectQuery<'_>,
    coordinator: &dyn Coordinator,
    ctx: &Context,
    out: &Output,
) -> Exit {
    let history = query.history;
    let inspection = match coordinator
        .inspect_query(&InspectQuery {
            history: 0,
            ..query
        })
        .await
    {
        Ok(inspection) => inspection,
        Err(err) => return out.error("inspect", ctx.store_display(), &err),
    };
    let next_after = args
        .limit
        .filter(|&limit| inspection.views.len() as u64 >= limit)
        .and_then(|_| inspection.views.last().map(|v| v.resource.clone()));
    let mut writer = Writer {
        out: std::io::BufWriter::new(std::io::stdout()),
        silent: out.format != Format::Json && out.quiet,
        broken: false,
    };
    let json = out.format == Format::Json;
    let store = ctx.store_display().unwrap_or_default();
    if json {
        writer.write("{\"op\":\"inspect\",\"resources\":[");
    } else {
        let mut table = output::table();
        table.set_header(super::inspect::COLUMNS);
        output::keep_whole(&mut table, &[1, 3]);
        for v in &inspection.views {
            table.add_row(super::inspect::row_cells(v));
        }
        let mut text = format!(
            "store `{}`:\n{}\n",
            terminal_safe(store, false),
            output::render(&table)
        );
        if !inspection.findings.is_empty() {
            text.push_str("\nintegrity warnings (the store's own files):\n");
            for f in &inspection.findings {
                text.push_str(&format!(
                    "  {}: {}\n",
                    f.kind,
                    terminal_safe(&f.message, false)
                ));
            }
        }
        for v in inspection.views.iter().filter(|v| !v.waiters.is_empty()) {
            text.push_str(&format!(
                "\nwaiting for `{}`, longest first:\n",
                super::inspect::cell(&v.resource)
            ));
            for w in &v.waiters {
                text.push_str(&format!(
                    "  {} (since {})\n",
                    super::inspect::cell(&w.owner),
                    time::rfc3339(w.since_ms)
                ));
            }
        }
        writer.write(&text);
    }
    let mut warnings: Vec<Value> = inspection
        .findings
        .iter()
        .map(integrity_finding_json)
        .collect();
    for (i, v) in inspection.views.iter().enumerate() {
        if let Err(err) = resource(
            &mut writer,
            json,
            i == 0,
            v,
            &inspection,
            history,
            coordinator,
        )
        .await
        {
            return fail(writer, json, &err, ctx, out);
        }
        match regressions(coordinator, v, history).await {
            Ok(found) => warnings.extend(found),
            Err(err) => return fail(writer, json, &err, ctx, out),
        }
        if writer.broken {
            return Exit::Success;
        }
    }
    if json {
        let mut end = Map::new();
        if let Some(next) = &next_after {
            end.insert("next_after".into(), Value::String(next.clone()));
        }
        if !warnings.is_empty() {
            end.insert("integrity_ok".into(), Value::Bool(false));
            end.insert("warnings".into(), Value::Array(warnings));
        }
        if let Some(store) = ctx.store_display() {
            end.insert("store".into(), Value::String(store.to_owned()));
        }
        output::add_notices(&mut end);
        end.insert("ok".into(), Value::Bool(true));
        writer.write(&format!("]{}\n", json_fields(end)));
    } else {
        let mut text = String::new();
        if let Some(next) = &next_after {
            text.push_str(&format!(
                "\nmore may follow: add --after={}\n",
                terminal_safe(&crate::error::shell_word(next), false)
            ));
        }
        for w in &warnings {
            if let Some(message) = w["message"]
                .as_str()
                .filter(|_| w["kind"] == "token_regressed")
            {
                text.push_str(&format!("\nwarning: {}\n", terminal_safe(message, false)));
            }
        }
        writer.write(&text);
    }
    writer.flush();
    Exit::Success
}

/// Writes one resource: for JSON its object, the events streamed in place of `events`; for
/// people its events as lines, most recent first.
async fn resource(
    writer: &mut Writer,
    json: bool,
    first: bool,
    v: &ResourceView,
    inspection: &crate::coordinator::Inspection,
    history: usize,
    coordinator: &dyn Coordinator,
) -> Result<(), Error> {
    let mut shown = 0usize;
    let mut line = |writer: &mut Writer, e: Event| {
        if json {
            let comma = if shown == 0 { "" } else { "," };
            writer.write(&format!("{comma}{}", event_json(&e)));
        } else {
            if shown == 0 {
                writer.write(&format!(
                    "\nlast events of `{}`, most recent first:\n",
                    super::inspect::cell(&v.resource)
                ));
            }
            let dash = || "-".to_owned();
            let text = format!(
                "{}  {}  {}  {}  {}",
                time::rfc3339(e.at_ms),
                super::inspect::cell(e.kind.as_str()),
                e.owner.as_deref().map_or_else(dash, super::inspect::cell),
                e.token.map_or_else(dash, |t| t.to_string()),
                super::inspect::cell(&shown_detail(&e).unwrap_or_default())
            );
            writer.write(&format!("{}\n", text.trim_end()));
        }
        shown += 1;
        !writer.broken
    };
    if !json {
        return coordinator
            .history_each(&v.resource, history, false, &mut |e| line(writer, e))
            .await;
    }
    let fields = resource_json(v, &inspection.findings);
    writer.write(if first { "{" } else { ",{" });
    let mut comma = "";
    for (key, value) in fields {
        writer.write(&format!("{comma}{}:", Value::String(key.clone())));
        comma = ",";
        if key == "events" {
            writer.write("[");
            let read = coordinator
                .history_each(&v.resource, history, false, &mut |e| line(writer, e))
                .await;
            writer.write("]");
            if read.is_err() {
                // Close the resource's object: the error's fields close the answer.
                writer.write("}");
            }
            read?;
        } else {
            writer.write(&value.to_string());
        }
    }
    writer.write("}");
    Ok(())
}

/// The `token_regressed` warnings among the resource's newest `history` events, read oldest
/// first, as [`super::inspect::Inspected`] finds them.
async fn regressions(
    coordinator: &dyn Coordinator,
    v: &ResourceView,
    history: usize,
) -> Result<Vec<Value>, Error> {
    let mut found = Vec::new();
    let mut before: Option<i64> = None;
    coordinator
        .history_each(&v.resource, history, true, &mut |e| {
            if let Some(token) = e.token.filter(|_| e.kind.is_grant()) {
                if let Some(b) = before.filter(|&b| token <= b) {
                    let mut w = Map::new();
                    w.insert("resource".into(), Value::String(v.resource.clone()));
                    w.insert("kind".into(), Value::String("token_regressed".into()));
                    w.insert(
                        "message".into(),
                        Value::String(super::log::token_regressed(&v.resource, b, token, e.at_ms)),
                    );
                    found.push(Value::Object(w));
                }
                before = Some(before.map_or(token, |b| b.max(token)));
            }
            true
        })
        .await?;
    Ok(found)
}

/// A read that failed midway: JSON closes its object with the error's fields and `"ok":
/// false`; for people the error goes to stderr, as always.
fn fail(mut writer: Writer, json: bool, err: &Error, ctx: &Context, out: &Output) -> Exit {
    let exit = err.exit();
    if !json {
        writer.flush();
        return out.error("inspect", ctx.store_display(), err);
    }
    let mut tail = output::error_fields("inspect", err, ctx.store_display(), exit);
    tail.insert("ok".into(), Value::Bool(false));
    writer.write(&format!("]{}\n", json_fields(tail)));
    writer.flush();
    exit
}

/// Stdout, buffered; a write that fails (a closed pipe) ends the answer quietly.
struct Writer {
    out: std::io::BufWriter<std::io::Stdout>,
    /// `--quiet` for people: nothing on stdout.
    silent: bool,
    broken: bool,
}

impl Writer {
    fn write(&mut self, text: &str) {
        if !self.silent && !self.broken && self.out.write_all(text.as_bytes()).is_err() {
            self.broken = true;
        }
    }

    fn flush(&mut self) {
        if self.out.flush().is_err() {
            self.broken = true;
        }
    }
}
