//! The event log (`events/<name>.jsonl`): one JSON line per event, appended under the
//! resource's lock after the record it describes, and read from its end.
//!
//! The log is history, not the counter: it is not fsynced (a power loss may cost its last
//! lines; the high-water file keeps the token), and a failed append undoes the change it
//! describes (see `FileCoordinator::commit`). Retention: when a log grows past
//! [`MAX_LOG_BYTES`], it is rewritten to its last [`KEEP_EVENTS`] events after one `pruned`
//! event that carries the highest token issued, so the log alone still knows it, and how many
//! events of each kind were cut (`totals`), so that the counters of `fence metrics` do not go
//! down.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::sys::{replace, share};
use crate::timeline::EventKind;

/// A log larger than this is pruned at the next append.
pub(crate) const MAX_LOG_BYTES: u64 = 4 << 20;
/// How many of the most recent events pruning keeps.
pub(crate) const KEEP_EVENTS: usize = 10_000;
/// How far back from the end the log's highest token is looked for.
const TOKEN_SCAN_EVENTS: usize = 256;
/// Bytes read from the end at a time.
const CHUNK: u64 = 64 * 1024;

/// A line of `events/<name>.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct EventLine {
    pub at_ms: i64,
    /// The instant on CLOCK_BOOTTIME (ns, this boot) at which the store decided: expiry is
    /// judged on that clock, `at_ms` is the wall clock read with it, for people. A process
    /// preempted between the two reads makes them differ by the pause, so whoever checks
    /// leases against each other uses this one. Absent on lines of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_ns: Option<u64>,
    pub kind: EventKind,
    pub owner: Option<String>,
    pub token: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// A grant or renewal: its TTL and the expiry it set (wall clock, for display).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    /// A takeover: when the lease it took over had expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_expires_at_ms: Option<i64>,
    /// A `pruned` event: the events of each kind the cut removed (with the totals of the
    /// `pruned` events among them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub totals: Option<BTreeMap<EventKind, i64>>,
    /// The lease record's change this line follows (`Record::change`): a change's event
    /// carries its number, and the lines appended after it (refusals, runs) carry it too, so
    /// the last line tells whether the record's last change reached the log. Absent on lines
    /// of older versions and on `pruned` events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<u64>,
}

impl EventLine {
    /// An event of `kind` at `at_ms` that carries nothing else yet.
    pub fn new(kind: EventKind, at_ms: i64) -> EventLine {
        EventLine {
            at_ms,
            boot_ns: None,
            kind,
            owner: None,
            token: None,
            detail: None,
            ttl_ms: None,
            expires_at_ms: None,
            previous_expires_at_ms: None,
            totals: None,
            change: None,
        }
    }
}

/// The end of a log, most recent event first.
#[derive(Default)]
pub(super) struct Tail {
    pub events: Vec<EventLine>,
    /// Lines among those read that are not events (damaged, or torn by a crash).
    pub skipped: usize,
}

pub(super) fn append(path: &Path, event: &EventLine) -> io::Result<()> {
    let mut line = serde_json::to_vec(event).map_err(io::Error::other)?;
    line.push(b'\n');
    // Never through a symbolic link (see `sys::lock_exclusive_until`).
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    share(&file, path);
    file.write_all(&line)
}

/// Reads whole lines backwards from the end until `want` events are found or the file
/// starts: the cost depends on `want`, not on the log's length.
pub(super) fn tail(path: &Path, want: usize) -> io::Result<Tail> {
    tail_until(path, want, |_| false)
}

/// [`tail`] that also stops at the first event (from the end) for which `stop` holds, which
/// is not kept: `fence log --since` reads back to the start of its window only.
pub(super) fn tail_until(
    path: &Path,
    want: usize,
    stop: impl Fn(&EventLine) -> bool,
) -> io::Result<Tail> {
    let mut tail = Tail::default();
    let file = match File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(tail),
        Err(err) => return Err(err),
    };
    let mut pos = file.metadata()?.len();
    // The bytes after `pos` not yet split into lines: the start of a line that began earlier.
    let mut carry: Vec<u8> = Vec::new();
    let mut stopped = false;
    while tail.events.len() < want && !stopped {
        if pos == 0 {
            take(&carry, &mut tail, &stop);
            break;
        }
        let start = pos.saturating_sub(CHUNK);
        let mut chunk = vec![0; usize::try_from(pos - start).unwrap_or(0)];
        file.read_exact_at(&mut chunk, start)?;
        pos = start;
        chunk.extend_from_slice(&carry);
        let mut end = chunk.len();
        while tail.events.len() < want && !stopped {
            let Some(newline) = chunk[..end].iter().rposition(|&b| b == b'\n') else {
                break;
            };
            stopped = take(&chunk[newline + 1..end], &mut tail, &stop);
            end = newline;
        }
        chunk.truncate(end);
        carry = chunk;
    }
    Ok(tail)
}

/// Adds a line's event to `tail`; true when it is the one to stop at (not added).
fn take(line: &[u8], tail: &mut Tail, stop: &impl Fn(&EventLine) -> bool) -> bool {
    if line.is_empty() {
        return false;
    }
    match serde_json::from_slice::<EventLine>(line) {
        Ok(event) if stop(&event) => return true,
        Ok(event) => tail.events.push(event),
        Err(_) => tail.skipped += 1,
    }
    false
}

impl EventLine {
    pub(super) fn into_event(self) -> crate::coordinator::Event {
        crate::coordinator::Event {
            at_ms: self.at_ms,
            kind: self.kind,
            owner: self.owner,
            token: self.token,
            detail: self.detail,
            ttl_ms: self.ttl_ms,
            expires_at_ms: self.expires_at_ms,
            previous_expires_at_ms: self.previous_expires_at_ms,
            rows: None,
            count: None,
            last_at_ms: None,
        }
    }
}

/// The highest token among the log's last events (every event after a grant carries that
/// grant's token or an older one, and a `pruned` event the highest before it).
pub(super) fn highest_token(path: &Path) -> io::Result<Option<i64>> {
    Ok(tail(path, TOKEN_SCAN_EVENTS)?
        .events
        .iter()
        .filter_map(|e| e.token)
        .max())
}

/// The change the log's last event follows: None when the log has no event, `Some(None)`
/// when its last event is of an older version (it carries none).
pub(super) fn last_change(path: &Path) -> io::Result<Option<Option<u64>>> {
    Ok(tail(path, 1)?.events.first().map(|e| e.change))
}

/// Whether the log has grown past [`MAX_LOG_BYTES`] and the retention applies.
pub(super) fn is_long(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.len() > MAX_LOG_BYTES)
}

/// Every event of the log, oldest first (lines that are not events are left out).
fn read_all(path: &Path) -> io::Result<Vec<EventLine>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    Ok(bytes
        .split(|&b| b == b'\n')
        .filter_map(|line| serde_json::from_slice(line).ok())
        .collect())
}

/// Adds an event to per-kind counts: one of its kind, or a `pruned` event's totals.
fn fold(totals: &mut BTreeMap<EventKind, i64>, event: &EventLine) {
    match &event.totals {
        Some(cut) => {
            for (kind, n) in cut {
                *totals.entry(kind.clone()).or_default() += n;
            }
        }
        None => *totals.entry(event.kind.clone()).or_default() += 1,
    }
}

/// How many events of each kind the resource's history has had: those in the log, and
/// those its retention cut (kept in its `pruned` events).
pub(super) fn totals(path: &Path) -> io::Result<BTreeMap<EventKind, i64>> {
    let mut totals = BTreeMap::new();
    for event in read_all(path)? {
        fold(&mut totals, &event);
    }
    Ok(totals)
}

/// Applies the retention: keeps the last [`KEEP_EVENTS`] events after a `pruned` event
/// carrying `high`, the highest token issued, and the counts of the events it removes. The
/// whole log is read (once per [`MAX_LOG_BYTES`] of appends) to count them.
pub(super) fn prune(path: &Path, high: i64, now_ms: i64) -> io::Result<()> {
    let events = read_all(path)?;
    let (cut, kept) = events.split_at(events.len().saturating_sub(KEEP_EVENTS));
    let mut totals = BTreeMap::new();
    for event in cut {
        fold(&mut totals, event);
    }
    let mut body = serde_json::to_vec(&EventLine {
        token: Some(high),
        detail: Some(format!(
            "older events removed by retention (the last {KEEP_EVENTS} are kept); {high} is the highest token issued"
        )),
        totals: Some(totals),
        ..EventLine::new(EventKind::Pruned, now_ms)
    })
    .map_err(io::Error::other)?;
    body.push(b'\n');
    for event in kept {
        body.extend(serde_json::to_vec(event).map_err(io::Error::other)?);
        body.push(b'\n');
    }
    replace(path, &body, true)
}
