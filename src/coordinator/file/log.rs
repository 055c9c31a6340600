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
use std::io::{self, BufRead, BufReader, ErrorKind, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
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
    /// A release: whether the lease was still live by the store's clock (CLOCK_BOOTTIME and
    /// the boot id) when it was released, so that `fence log` needs no wall clock to tell
    /// (absent on lines of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<bool>,
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
            live: None,
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
        .read(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    share(&file, path);
    // A log that ends inside a line (a power loss, or an append the size limit cut short
    // and then undone) gets its line ended first: this event must not be glued to it.
    let len = file.metadata()?.len();
    if len > 0 {
        let mut last = [0];
        file.read_exact_at(&mut last, len - 1)?;
        if last[0] != b'\n' {
            line.insert(0, b'\n');
        }
    }
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
    tail_in_chunks(path, want, stop, CHUNK)
}

/// [`tail_until`], reading `chunk_len` bytes at a time.
fn tail_in_chunks(
    path: &Path,
    want: usize,
    stop: impl Fn(&EventLine) -> bool,
    chunk_len: u64,
) -> io::Result<Tail> {
    let mut tail = Tail::default();
    if want == 0 {
        return Ok(tail);
    }
    rev_lines(path, chunk_len, |line, _| {
        match serde_json::from_slice::<EventLine>(line) {
            Ok(event) if stop(&event) => false,
            Ok(event) => {
                tail.events.push(event);
                tail.events.len() < want
            }
            Err(_) => {
                tail.skipped += 1;
                true
            }
        }
    })?;
    Ok(tail)
}

/// Hands the log's lines to `each` from the last to the first, with the offset each starts
/// at, until `each` returns false: a chunk of `chunk_len` bytes (and the line that straddles
/// it) in memory at a time, whatever the log's length. Empty lines are passed over; a
/// missing log has no lines.
fn rev_lines(
    path: &Path,
    chunk_len: u64,
    mut each: impl FnMut(&[u8], u64) -> bool,
) -> io::Result<()> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    };
    let mut pos = file.metadata()?.len();
    // The bytes after `pos` not yet split into lines: the start of a line that began earlier.
    let mut carry: Vec<u8> = Vec::new();
    loop {
        if pos == 0 {
            if !carry.is_empty() {
                each(&carry, 0);
            }
            return Ok(());
        }
        let start = pos.saturating_sub(chunk_len);
        let mut chunk = vec![0; usize::try_from(pos - start).unwrap_or(0)];
        file.read_exact_at(&mut chunk, start)?;
        pos = start;
        chunk.extend_from_slice(&carry);
        let mut end = chunk.len();
        while let Some(newline) = chunk[..end].iter().rposition(|&b| b == b'\n') {
            let line = &chunk[newline + 1..end];
            end = newline;
            if !line.is_empty() && !each(line, start + newline as u64 + 1) {
                return Ok(());
            }
        }
        chunk.truncate(end);
        carry = chunk;
    }
}

/// The newest `want` events of the log, handed to `each` one at a time until it returns
/// false: most recent first (read backwards, as [`tail`]), or oldest first ([`Forward`]).
/// Memory follows a chunk, not the log: `inspect --history 2000000` on a log that long.
pub(super) fn each_newest(
    path: &Path,
    want: usize,
    oldest_first: bool,
    mut each: impl FnMut(EventLine) -> bool,
) -> io::Result<()> {
    if oldest_first {
        for event in Forward::open(path, want, |_| false, |_| true)? {
            if !each(event?) {
                break;
            }
        }
        return Ok(());
    }
    if want == 0 {
        return Ok(());
    }
    let mut found = 0;
    rev_lines(path, CHUNK, |line, _| {
        match serde_json::from_slice::<EventLine>(line) {
            Ok(event) => {
                found += 1;
                each(event) && found < want
            }
            Err(_) => true,
        }
    })
}

/// A segment of the log no longer than this is read into memory at once; a longer one is
/// read through a buffer of [`FORWARD_BUFFER`] bytes.
const SMALL_SEGMENT: u64 = 64 * 1024;
const FORWARD_BUFFER: usize = 16 * 1024;

/// The newest events of a log, oldest first, read forwards a buffer at a time: the offset of
/// the oldest of them is found backwards first ([`rev_lines`]), as [`tail_until`] finds
/// them. Lines that are not events are passed over.
pub(super) struct Forward {
    reader: Option<Box<dyn BufRead>>,
    /// Events still to read: those counted backwards (lines appended since are not among
    /// the newest that were asked for).
    left: usize,
    /// How many of them `keep` (given to [`Forward::open`]) holds for.
    pub kept: usize,
    line: Vec<u8>,
}

impl Forward {
    /// The newest `want` events, back to (not including) the first from the end for which
    /// `stop` holds; `kept` counts those for which `keep` holds.
    pub(super) fn open(
        path: &Path,
        want: usize,
        stop: impl Fn(&EventLine) -> bool,
        keep: impl Fn(&EventLine) -> bool,
    ) -> io::Result<Forward> {
        let mut forward = Forward {
            reader: None,
            left: 0,
            kept: 0,
            line: Vec::new(),
        };
        if want == 0 {
            return Ok(forward);
        }
        let mut from = None;
        rev_lines(path, CHUNK, |line, at| {
            match serde_json::from_slice::<EventLine>(line) {
                Ok(event) if stop(&event) => false,
                Ok(event) => {
                    forward.left += 1;
                    forward.kept += usize::from(keep(&event));
                    from = Some(at);
                    forward.left < want
                }
                Err(_) => true,
            }
        })?;
        let Some(from) = from else {
            return Ok(forward);
        };
        let mut file = File::open(path)?;
        let segment = file.metadata()?.len().saturating_sub(from);
        file.seek(SeekFrom::Start(from))?;
        forward.reader = Some(if segment <= SMALL_SEGMENT {
            let mut bytes = Vec::new();
            io::Read::read_to_end(&mut file, &mut bytes)?;
            Box::new(io::Cursor::new(bytes))
        } else {
            Box::new(BufReader::with_capacity(FORWARD_BUFFER, file))
        });
        Ok(forward)
    }
}

impl Iterator for Forward {
    type Item = io::Result<EventLine>;

    fn next(&mut self) -> Option<io::Result<EventLine>> {
        while self.left > 0 {
            let reader = self.reader.as_mut()?;
            self.line.clear();
            match reader.read_until(b'\n', &mut self.line) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(err) => return Some(Err(err)),
            }
            let text = self.line.strip_suffix(b"\n").unwrap_or(&self.line);
            if let Ok(event) = serde_json::from_slice::<EventLine>(text) {
                self.left -= 1;
                return Some(Ok(event));
            }
        }
        None
    }
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
            live: self.live,
            rows: None,
            count: None,
            last_at_ms: None,
        }
    }
}

/// The highest token among the log's last events (a `pruned` event carries the highest
/// before it). All of the
/// last [`TOKEN_SCAN_EVENTS`] are read, not only back to the last grant: a grant event can
/// carry an old token (`catch_up` records a restored record's grant late, after higher ones).
pub(super) fn highest_token(path: &Path) -> io::Result<Option<i64>> {
    Ok(tail(path, TOKEN_SCAN_EVENTS)?
        .events
        .iter()
        .filter_map(|e| e.token)
        .max())
}

/// What a grant learnt of the log (`tokens/<name>.seen`, a cache, never synced): the highest
/// token among the events up to `len` bytes of the log file `dev`/`ino`, whose bytes just
/// before `len` hash to `end`. The next grant then reads only what was appended since
/// instead of the last [`TOKEN_SCAN_EVENTS`] events (0.3 ms of a 5 ms `fence run`). Trusted
/// only while it still describes the log: the same file (not rewritten by retention nor
/// replaced), at least as long, its bytes at the end of the known part unchanged and ending
/// a line, the appended part short; and its own line whole (its checksum). Anything else
/// (a log truncated, restored or rewritten in place, a torn or hand-edited cache, another
/// user's cache it cannot rewrite) reads the last events as before. Either way the answer
/// is at least what the last [`TOKEN_SCAN_EVENTS`] events say.
#[derive(Debug, PartialEq)]
pub(super) struct Seen {
    dev: u64,
    ino: u64,
    len: u64,
    end: u64,
    highest: i64,
}

/// How many bytes before a known length [`Seen::end`] hashes.
const SEEN_END_BYTES: u64 = 64;

impl Seen {
    fn encode(&self) -> String {
        let body = format!(
            "v1 {} {} {} {:016x} {}",
            self.dev, self.ino, self.len, self.end, self.highest
        );
        format!("{body} {:016x}\n", fnv1a(body.as_bytes()))
    }

    fn decode(text: &[u8]) -> Option<Seen> {
        let text = std::str::from_utf8(text).ok()?.strip_suffix('\n')?;
        let (body, check) = text.rsplit_once(' ')?;
        if u64::from_str_radix(check, 16).ok()? != fnv1a(body.as_bytes()) {
            return None;
        }
        let mut fields = body.split(' ');
        if fields.next()? != "v1" {
            return None;
        }
        let seen = Seen {
            dev: fields.next()?.parse().ok()?,
            ino: fields.next()?.parse().ok()?,
            len: fields.next()?.parse().ok()?,
            end: u64::from_str_radix(fields.next()?, 16).ok()?,
            highest: fields.next()?.parse().ok()?,
        };
        fields.next().is_none().then_some(seen)
    }
}

/// FNV-1a, 64 bits: tells a cache line or a log's bytes from another, not an adversary's
/// (whoever can write the store can lower the mark itself).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The hash of the log's last [`SEEN_END_BYTES`] bytes before `len`, if they end a line
/// (`None` for an empty log, or one that ends inside a line: an append in progress).
fn end_hash(file: &File, len: u64) -> io::Result<Option<u64>> {
    let start = len.saturating_sub(SEEN_END_BYTES);
    let mut bytes = vec![0; usize::try_from(len - start).unwrap_or(0)];
    file.read_exact_at(&mut bytes, start)?;
    Ok((bytes.last() == Some(&b'\n')).then(|| fnv1a(&bytes)))
}

/// The highest token of the log, read as [`highest_token`] does or, where `seen_path` still
/// describes the log (see [`Seen`]), from what it knew and the events appended since; and
/// what this read learnt, for a grant to keep for the next one ([`remember_seen`]; `None`
/// for a log that ends inside a line: an append in progress).
pub(super) fn highest_token_seen(
    path: &Path,
    seen_path: &Path,
) -> io::Result<(Option<i64>, Option<Seen>)> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok((None, None)),
        Err(err) => return Err(err),
    };
    let meta = file.metadata()?;
    let (dev, ino, len) = (meta.dev(), meta.ino(), meta.len());
    let known = std::fs::read(seen_path)
        .ok()
        .and_then(|bytes| Seen::decode(&bytes))
        .filter(|seen| {
            seen.dev == dev
                && seen.ino == ino
                && seen.len <= len
                && len - seen.len <= CHUNK
                && end_hash(&file, seen.len).ok().flatten() == Some(seen.end)
        });
    let highest = match known
        .and_then(|seen| appended_highest(&file, seen.len, len).map(|h| h.max(Some(seen.highest))))
    {
        Some(highest) => highest,
        None => highest_token(path)?,
    };
    let learnt = end_hash(&file, len).ok().flatten().map(|end| Seen {
        dev,
        ino,
        len,
        end,
        highest: highest.unwrap_or(0),
    });
    Ok((highest.filter(|&token| token > 0), learnt))
}

/// The highest token among the whole lines of the log's bytes `from..to` (`from` starts a
/// line); `None` inside when none carries one, `None` outside when they cannot be read.
fn appended_highest(file: &File, from: u64, to: u64) -> Option<Option<i64>> {
    let mut bytes = vec![0; usize::try_from(to - from).ok()?];
    file.read_exact_at(&mut bytes, from).ok()?;
    Some(
        bytes
            .split(|&b| b == b'\n')
            // Not the empty piece after the last newline: parsing it builds an error, whose
            // first use of memchr detects the CPU's features (a dozen CPUID instructions,
            // each a VM exit: 0.1 ms of a grant on a virtual machine).
            .filter(|line| !line.is_empty())
            .filter_map(|line| serde_json::from_slice::<EventLine>(line).ok())
            .filter_map(|event| event.token)
            .max(),
    )
}

/// Writes the cache in place (it is only a cache: not synced; a torn line fails its
/// checksum), shared as the store's other files are. Only under the resource's lock (no
/// append is then half done), and after the grant's own writes: a cache created on a nearly
/// full disk must not take the block its record needed (a review found a grant that failed
/// for that, after the space was freed).
pub(super) fn remember_seen(path: &Path, seen: &Seen) {
    let Ok(file) = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    else {
        return;
    };
    share(&file, path);
    let line = seen.encode();
    if file.write_all_at(line.as_bytes(), 0).is_ok() {
        let _ = file.set_len(line.len() as u64);
    }
}

/// The change the log's last event follows: None when the log has no event, `Some(None)`
/// when its last event is of an older version (it carries none).
pub(super) fn last_change(path: &Path) -> io::Result<Option<Option<u64>>> {
    // One line is wanted, read on every operation: a page at a time, not a chunk.
    Ok(tail_in_chunks(path, 1, |_| false, 4096)?
        .events
        .first()
        .map(|e| e.change))
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
/// those its retention cut (kept in its `pruned` events). The log is read a line at a time.
pub(super) fn totals(path: &Path) -> io::Result<BTreeMap<EventKind, i64>> {
    let mut totals = BTreeMap::new();
    let file = match File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(totals),
        Err(err) => return Err(err),
    };
    let mut reader = BufReader::with_capacity(CHUNK as usize, file);
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(totals);
        }
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        if let Ok(event) = serde_json::from_slice::<EventLine>(text) {
            fold(&mut totals, &event);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn log_of(lines: &[&str]) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        for line in lines {
            writeln!(file, "{line}").unwrap();
        }
        file
    }

    const RECORDED_LATE_PROBE: &str = "recorded late";

    fn event(kind: &str, token: i64) -> String {
        format!(r#"{{"at_ms":1700000000000,"kind":"{kind}","owner":"o","token":{token}}}"#)
    }

    /// A log line of exactly the same length for every token of one digit, longer than the
    /// bytes [`Seen::end`] hashes.
    fn long_event(token: i64) -> String {
        format!(
            r#"{{"at_ms":1700000000000,"kind":"acquired","owner":"an-owner-with-a-long-name","token":{token}}}"#
        )
    }

    /// The scan's answer with the cache written by a first read, after `then` changed the
    /// log (and with the cache as `then` left it).
    fn seen_after(lines: &[&str], then: impl FnOnce(&Path, &Path)) -> Option<i64> {
        let dir = tempfile::tempdir().unwrap();
        let (log, seen) = (dir.path().join("r.jsonl"), dir.path().join("r.seen"));
        std::fs::write(
            &log,
            lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
        )
        .unwrap();
        grant_read(&log, &seen);
        assert!(seen.exists(), "a grant's read left no cache");
        then(&log, &seen);
        grant_read(&log, &seen)
    }

    /// What a grant reads of the log, keeping what it learnt as a grant does.
    fn grant_read(log: &Path, seen: &Path) -> Option<i64> {
        let (highest, learnt) = highest_token_seen(log, seen).unwrap();
        if let Some(learnt) = learnt {
            remember_seen(seen, &learnt);
        }
        highest
    }

    #[test]
    fn a_grant_reads_what_the_last_one_learnt_and_the_events_appended_since() {
        let appended = |log: &Path, _: &Path| {
            let mut file = OpenOptions::new().append(true).open(log).unwrap();
            writeln!(file, "{}", event("released", 4)).unwrap();
            writeln!(file, "{}", event("acquired", 5)).unwrap();
        };
        assert_eq!(seen_after(&[&event("acquired", 4)], appended), Some(5));
        // The cache is what is read, not the whole tail: one that says more is believed.
        let lied = |log: &Path, seen: &Path| {
            let mut known = Seen::decode(&std::fs::read(seen).unwrap()).unwrap();
            known.highest = 50;
            std::fs::write(seen, known.encode()).unwrap();
            appended(log, seen);
        };
        assert_eq!(seen_after(&[&event("acquired", 4)], lied), Some(50));
    }

    #[test]
    fn a_cache_that_no_longer_describes_the_log_is_not_believed() {
        let before: &[&str] = &[&long_event(1), &long_event(1)];
        // Rewritten in place (the same file, as long): its last bytes differ.
        let rewritten = |log: &Path, _: &Path| {
            let file = OpenOptions::new().write(true).open(log).unwrap();
            let line = format!("{}\n", long_event(7));
            file.write_all_at(line.as_bytes(), line.len() as u64)
                .unwrap();
        };
        assert_eq!(seen_after(before, rewritten), Some(7));
        // Replaced by another file whose last line is the same (a restore, retention).
        let replaced = |log: &Path, _: &Path| {
            let other = log.with_extension("new");
            std::fs::write(&other, format!("{}\n{}\n", long_event(7), long_event(1))).unwrap();
            std::fs::rename(&other, log).unwrap();
        };
        assert_eq!(seen_after(before, replaced), Some(7));
        // Shorter than it knew.
        let truncated = |log: &Path, _: &Path| {
            std::fs::write(log, format!("{}\n", event("acquired", 7))).unwrap();
        };
        assert_eq!(seen_after(before, truncated), Some(7));
        // The cache's own line torn or edited: its checksum.
        let torn = |_: &Path, seen: &Path| {
            let text = std::fs::read_to_string(seen).unwrap();
            let (body, check) = text.trim_end().rsplit_once(' ').unwrap();
            let (body, highest) = body.rsplit_once(' ').unwrap();
            assert_eq!(highest, "7");
            std::fs::write(seen, format!("{body} 1 {check}\n")).unwrap();
        };
        assert_eq!(seen_after(&[&long_event(7), &long_event(1)], torn), Some(7));
        // More appended since than a chunk: the last events are read as before.
        let long = |log: &Path, _: &Path| {
            let mut file = OpenOptions::new().append(true).open(log).unwrap();
            writeln!(file, "{}", event("acquired", 8)).unwrap();
            for _ in 0..(CHUNK as usize / 60) {
                writeln!(file, "{}", event("renewed", 8)).unwrap();
            }
        };
        assert_eq!(seen_after(before, long), Some(8));
    }

    #[test]
    fn a_log_that_ends_inside_a_line_is_not_cached() {
        let dir = tempfile::tempdir().unwrap();
        let (log, seen) = (dir.path().join("r.jsonl"), dir.path().join("r.seen"));
        std::fs::write(&log, format!("{}\n{{\"at_ms\":17", event("acquired", 3))).unwrap();
        assert_eq!(grant_read(&log, &seen), Some(3));
        assert!(!seen.exists(), "a cache of a log that ends inside a line");
        // Nor is one believed that says so (an append was in progress when it was read).
        let file = File::open(&log).unwrap();
        let len = file.metadata().unwrap().len();
        assert_eq!(end_hash(&file, len).unwrap(), None);
        assert_eq!(highest_token_seen(&log, &seen).unwrap(), (Some(3), None));
    }

    #[test]
    fn the_cache_line_reads_back_and_refuses_what_it_did_not_write() {
        let seen = Seen {
            dev: 2049,
            ino: 77,
            len: 1234,
            end: 0xfeed,
            highest: 42,
        };
        let line = seen.encode();
        assert_eq!(Seen::decode(line.as_bytes()), Some(seen));
        assert_eq!(Seen::decode(line.replace("42", "41").as_bytes()), None);
        assert_eq!(Seen::decode(line.trim_end().as_bytes()), None);
        assert_eq!(Seen::decode(b""), None);
        assert_eq!(Seen::decode(line.replace("v1", "v2").as_bytes()), None);
    }

    #[test]
    fn the_highest_token_is_the_highest_of_the_last_events_not_of_the_last_grant() {
        // A grant recorded late (`catch_up`, after a restored record) carries an old token
        // after higher ones: the scan must not stop at it (a review found a token issued
        // twice when it did).
        let late = format!(
            r#"{{"at_ms":1700000000000,"kind":"acquired","owner":"a","token":1,"detail":"{RECORDED_LATE_PROBE}"}}"#
        );
        let log = log_of(&[
            &event("acquired", 2),
            &event("acquired", 3),
            &event("run_finished", 3),
            &late,
            &event("released", 1),
        ]);
        assert_eq!(highest_token(log.path()).unwrap(), Some(3));
        let log = log_of(&[
            &event("acquired", 7),
            "not an event",
            &event("renew_rejected", 9),
        ]);
        assert_eq!(highest_token(log.path()).unwrap(), Some(9));
        assert_eq!(highest_token(log_of(&[]).path()).unwrap(), None);
        assert_eq!(
            highest_token(Path::new("/nonexistent/fence/log")).unwrap(),
            None
        );
    }
}
