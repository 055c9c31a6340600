//! `fence log`'s second reading of the store ([`merge`]): the timeline's entries in time
//! order, checked and filtered as they pass, and, for a timeline too long to print as one
//! report, written as they come ([`Streamed`]). Memory follows [`REORDER`] entries, not the
//! window (issue 37).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::Write;

use serde::Serialize;
use serde_json::Value;

use super::log::{rank, tail_lines, wanted, Checks, Entry, Expiries, Source, Warning, TRUNCATED};
use crate::cli::{Format, LogArgs};
use crate::cmd::Context;
use crate::coordinator::{LogQuery, Logged};
use crate::error::Error;
use crate::exit::Exit;
use crate::output::{self, Output};

/// Entries held in time order before the oldest is written: an expiry is known only when the
/// resource's next event (or the end of the window) shows that nothing renewed or released
/// the lease in time, and belongs at its instant, among entries read after it. A timeline
/// whose expiries are found fewer than this many entries after their instant (every one of
/// up to this many entries) is in the exact order of a sort of all of it; an expiry found
/// later is written where it was found.
const REORDER: usize = 16_384;

/// The second reading: the store's entries (its events read again, with their expiries) and
/// the targets' events, in time order (held back up to [`REORDER`] entries), each checked
/// ([`Checks`]), and those the filters let through, but for the oldest `skip` of each
/// source, handed to `each` until it returns false. Returns the checks' findings.
#[allow(clippy::too_many_arguments)]
pub(super) async fn merge(
    args: &LogArgs,
    query: &LogQuery<'_>,
    ask: usize,
    now: i64,
    store: &dyn crate::coordinator::Coordinator,
    targets: Vec<(Source, Vec<Logged>)>,
    skip: HashMap<Source, usize>,
    each: &mut dyn FnMut(Entry) -> bool,
) -> Result<Checks, Error> {
    let mut merger = Merger {
        args,
        held: BinaryHeap::new(),
        seq: 0,
        targets: targets
            .into_iter()
            .map(|(source, events)| (source, events.into_iter().peekable()))
            .collect(),
        skip,
        checks: Checks::default(),
        going: true,
        each,
    };
    let mut expiries = Expiries::default();
    store
        .log_each(
            &LogQuery {
                limit: ask,
                ..*query
            },
            &mut |logged| {
                merger.targets_until(Some(logged.at_us));
                for entry in expiries.feed(logged) {
                    if !entry.derived || query.in_range(entry.logged.event.at_ms) {
                        merger.hold(0, entry);
                    }
                }
                merger.release(REORDER);
                merger.going
            },
        )
        .await?;
    for entry in expiries.due(now) {
        if query.in_range(entry.logged.event.at_ms) {
            merger.hold(0, entry);
        }
    }
    merger.targets_until(None);
    merger.release(0);
    Ok(merger.checks)
}

/// An entry held for its place: by time, rank, source (the store's first, then each
/// target's in the order given) and the order it came in.
struct Held {
    key: (i64, u8, usize, usize),
    entry: Entry,
}

impl PartialEq for Held {
    fn eq(&self, other: &Held) -> bool {
        self.key == other.key
    }
}

impl Eq for Held {}

impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Held) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Held {
    fn cmp(&self, other: &Held) -> std::cmp::Ordering {
        self.key.cmp(&other.key)
    }
}

struct Merger<'a, 'e> {
    args: &'a LogArgs,
    held: BinaryHeap<Reverse<Held>>,
    seq: usize,
    targets: Vec<(Source, std::iter::Peekable<std::vec::IntoIter<Logged>>)>,
    skip: HashMap<Source, usize>,
    checks: Checks,
    /// Whether `each` wants more.
    going: bool,
    each: &'e mut dyn FnMut(Entry) -> bool,
}

impl Merger<'_, '_> {
    fn hold(&mut self, source: usize, entry: Entry) {
        self.seq += 1;
        self.held.push(Reverse(Held {
            key: (entry.logged.at_us, rank(&entry), source, self.seq),
            entry,
        }));
    }

    /// Holds the targets' events up to `at_us` (all of them: `None`).
    fn targets_until(&mut self, at_us: Option<i64>) {
        for i in 0..self.targets.len() {
            while let Some(logged) = self.targets[i]
                .1
                .next_if(|l| at_us.is_none_or(|at| l.at_us <= at))
            {
                let entry = Entry {
                    source: self.targets[i].0.clone(),
                    logged,
                    derived: false,
                };
                self.hold(i + 1, entry);
            }
        }
    }

    /// Passes on the oldest entries held until `keep` are left.
    fn release(&mut self, keep: usize) {
        while self.held.len() > keep {
            let Some(Reverse(Held { entry, .. })) = self.held.pop() else {
                return;
            };
            self.checks.feed(&entry);
            if !self.going || !wanted(self.args, &entry) {
                continue;
            }
            if let Some(skip) = self.skip.get_mut(&entry.source).filter(|n| **n > 0) {
                *skip -= 1;
                continue;
            }
            self.going = (self.each)(entry);
        }
    }
}

/// A timeline written as it is read (see [`super::log::run_and_print`]).
pub(super) struct Streamed<'a> {
    out: std::io::BufWriter<std::io::Stdout>,
    settings: &'a Output,
    /// No event written yet (JSON's commas).
    first: bool,
    broken: bool,
}

impl<'a> Streamed<'a> {
    pub(super) fn start(settings: &'a Output, store: &str) -> Streamed<'a> {
        let mut streamed = Streamed {
            out: std::io::BufWriter::new(std::io::stdout()),
            settings,
            first: true,
            broken: false,
        };
        match settings.format {
            Format::Json => streamed.write("{\"op\":\"log\",\"events\":["),
            Format::Human => streamed.write(&format!(
                "store `{}`, oldest first:\n",
                crate::terminal::terminal_safe(store, false)
            )),
            _ => {}
        }
        streamed
    }

    fn write(&mut self, text: &str) {
        let silent = self.settings.quiet && self.settings.format == Format::Human;
        if !silent && !self.broken && self.out.write_all(text.as_bytes()).is_err() {
            self.broken = true;
        }
    }

    /// Writes an entry; false once nobody reads any more (a closed pipe).
    pub(super) fn entry(&mut self, entry: &Entry) -> bool {
        match self.settings.format {
            Format::Json => {
                let comma = if std::mem::take(&mut self.first) {
                    ""
                } else {
                    ","
                };
                self.write(&format!("{comma}{}", entry.json()));
            }
            Format::Human => {
                let narrow = entry.narrow();
                let text = crate::terminal::terminal_safe(narrow.trim_end(), true);
                self.write(&format!("{}\n", output::fit(&text)));
            }
            _ => self.write(&format!("{}\n", entry.json())),
        }
        !self.broken
    }

    pub(super) fn finish(mut self, warnings: &[Warning], truncated: bool, ctx: &Context) {
        match self.settings.format {
            Format::Json => {
                let mut end = output::fields(&StreamedEnd {
                    truncated,
                    integrity_ok: warnings.is_empty(),
                    warnings,
                    store: ctx.store_display(),
                });
                output::add_notices(&mut end);
                end.insert("ok".into(), Value::Bool(true));
                let mut text = String::from("]");
                for (key, value) in end {
                    text.push_str(&format!(",{}:{value}", Value::String(key)));
                }
                text.push_str("}\n");
                self.write(&text);
            }
            Format::Human => {
                let mut text = String::new();
                if truncated {
                    text.push_str(&format!("\n{TRUNCATED}\n"));
                }
                for w in warnings {
                    text.push_str(&format!("\nwarning ({}): {}\n", w.kind.as_str(), w.message));
                }
                let text = crate::terminal::terminal_safe(&text, true);
                self.write(&output::fit(&text));
            }
            _ => {
                for line in tail_lines(warnings, truncated) {
                    self.write(&format!("{line}\n"));
                }
            }
        }
        let _ = self.out.flush();
    }

    /// A read that failed midway: JSON closes its object with the error's fields and `"ok":
    /// false`; ndjson and people get the error as always (a line more, or on stderr).
    pub(super) fn fail(mut self, err: &Error, ctx: &Context, out: &Output) -> Exit {
        if self.settings.format != Format::Json {
            let _ = self.out.flush();
            return out.error("log", ctx.store_display(), err);
        }
        let exit = err.exit();
        let mut tail = output::error_fields("log", err, ctx.store_display(), exit);
        tail.insert("ok".into(), Value::Bool(false));
        let mut text = String::from("]");
        for (key, value) in tail {
            text.push_str(&format!(",{}:{value}", Value::String(key)));
        }
        text.push_str("}\n");
        self.write(&text);
        let _ = self.out.flush();
        exit
    }
}

/// The fields that close a streamed JSON answer, before `notices` and `ok`.
#[derive(Serialize)]
struct StreamedEnd<'a> {
    truncated: bool,
    integrity_ok: bool,
    warnings: &'a [Warning],
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<&'a str>,
}
