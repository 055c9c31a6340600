//! A history checker for leases and fenced writes (DESIGN §6, invariants I1–I7).
//!
//! A [`History`] is what a test did — every `fence` invocation as an [`Op`] (worker, kind,
//! resource, owner, token, start/end on the test's monotonic clock, exit code, parsed JSON) —
//! plus the durable state the stores were left in: the coordinator's event log
//! ([`CoordEvent`], with the coordinator's own timestamps), the target's accepted/rejected
//! write log ([`TargetEvent`]), the rows the writes produced ([`DataRow`], each carrying the
//! token bound to its transaction and the id of the op that wrote it) and the guard rows.
//!
//! [`check`] returns every [`Violation`] with the slice of history that shows it. The checks
//! only flag what the record proves; an op whose outcome is unknown (exit 8, a killed
//! process, a cut connection) is never assumed to have happened or not.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::Duration;

use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Acquire,
    Renew,
    Release,
    /// A fenced write through `fence write`.
    Write,
    /// A write by another path (raw SQL on a protected table): must be refused unless it
    /// carried a current token through `begin_write`.
    RawWrite,
}

/// Which of fence's write forms a write used, and so what fences it: the target's guard row
/// (the transaction form, `--sql`), the row's own token column (the row form, `--table`), or
/// the object's stored `fence-token` (`--from`). Each form is its own sequence of accepted
/// tokens: a row-form write is not ordered against the guard, nor an object against either.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WriteForm {
    Sql,
    Row,
    Object,
}

/// One recorded operation.
#[derive(Clone, Debug)]
pub struct Op {
    /// Unique id; fenced writes store it in the data they write.
    pub id: usize,
    pub worker: usize,
    pub kind: OpKind,
    pub resource: String,
    pub owner: String,
    /// The token the op carried (renew/release/write) or was granted (acquire, exit 0).
    pub token: Option<i64>,
    /// The TTL asked for (acquire, renew).
    pub ttl_ms: Option<i64>,
    /// On the test's monotonic clock, from the history's epoch.
    pub start: Duration,
    pub end: Duration,
    /// Exit status; -1 when the process was killed.
    pub code: i32,
    pub json: Value,
    /// The fault injected into this op, if any (for the report).
    pub fault: Option<String>,
    /// The op was cut off or killed before it could report: its outcome is unknown.
    pub cancelled: bool,
    /// The process ran with a skewed clock (faketime).
    pub skewed: bool,
    /// The write form (writes); `Sql` for every other kind.
    pub form: WriteForm,
}

impl Op {
    pub fn ok(&self) -> bool {
        self.code == 0 && !self.cancelled
    }

    /// A grant or renewal that took effect but whose answer came after the lease had run out
    /// (exit 5, `arrived_late`): applied, though the client was told the lease is lost.
    fn arrived_late(&self) -> bool {
        self.code == 5 && self.json["reason"] == "arrived_late"
    }

    /// A granted acquire that got a new token (not a reacquisition).
    fn new_grant(&self) -> bool {
        self.kind == OpKind::Acquire && self.ok() && self.json["reacquired"] != Value::Bool(true)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "op#{} w{} {:?}{} {} owner={} token={:?} ttl={:?} [{:.3}s..{:.3}s] exit={}{}{}{} {}",
            self.id,
            self.worker,
            self.kind,
            match self.form {
                WriteForm::Sql => "",
                WriteForm::Row => "(row)",
                WriteForm::Object => "(object)",
            },
            self.resource,
            self.owner,
            self.token,
            self.ttl_ms,
            self.start.as_secs_f64(),
            self.end.as_secs_f64(),
            self.code,
            if self.cancelled { " CANCELLED" } else { "" },
            if self.skewed { " SKEWED" } else { "" },
            self.fault
                .as_ref()
                .map(|f| format!(" fault={f}"))
                .unwrap_or_default(),
            compact(&self.json)
        )
    }
}

fn compact(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > 300 {
        s.truncate(300);
        s.push('…');
    }
    s
}

/// A row of the coordinator's append-only event log, oldest first per resource.
#[derive(Clone, Debug)]
pub struct CoordEvent {
    pub resource: String,
    /// Position in the log.
    pub seq: i64,
    /// The coordinator's clock (PostgreSQL: `clock_timestamp()`, µs), in microseconds.
    pub at_us: i64,
    pub kind: String,
    pub owner: Option<String>,
    pub token: Option<i64>,
    /// The TTL a grant or renewal set, when the record keeps it (else the TTL the owner's
    /// operations asked for is used).
    pub ttl_ms: Option<i64>,
}

impl fmt::Display for CoordEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "coord#{} {} at={}us {} owner={:?} token={:?}",
            self.seq, self.resource, self.at_us, self.kind, self.owner, self.token
        )
    }
}

/// A row of the target's `write_events` (accepted in the write's own transaction, after the
/// guard row lock: for one resource the log order is the commit order).
#[derive(Clone, Debug)]
pub struct TargetEvent {
    pub resource: String,
    pub seq: i64,
    pub kind: String,
    pub owner: Option<String>,
    pub token: Option<i64>,
}

impl fmt::Display for TargetEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "target#{} {} {} owner={:?} token={:?}",
            self.seq, self.resource, self.kind, self.owner, self.token
        )
    }
}

/// A write the data shows applied: the token it carried and who wrote it. Transaction form:
/// a row of the data table (the token bound to its transaction). Row form: an entry of the
/// row's audit log (a trigger's, inside the write's statement). Object form: a line of the
/// object's content (each write appends one to the bytes it read, conditioned on their version).
#[derive(Clone, Debug)]
pub struct DataRow {
    pub resource: String,
    /// Commit order within the form: a sequence drawn after the guard or the row lock, or the
    /// line's position in the object.
    pub seq: i64,
    pub token: i64,
    /// The op id that wrote it.
    pub op: usize,
    pub form: WriteForm,
}

impl fmt::Display for DataRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "data#{} {} {:?} token={} by op#{}",
            self.seq, self.resource, self.form, self.token, self.op
        )
    }
}

/// Which clock the coordinator's event timestamps are on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordClock {
    /// The timestamps are the instants at which the coordinator's own clock decided
    /// (PostgreSQL's `clock_timestamp()`, µs; the file store's CLOCK_BOOTTIME when its events
    /// carry it): I3 is checked on them exactly, so a takeover 1 µs early is a violation.
    Authoritative,
    /// The timestamps track the deciding clock within `tolerance_us`: the file store stamps
    /// each event with the wall clock (whole ms) read together with the CLOCK_BOOTTIME that
    /// decided, so the two differ by the truncation (< 1 ms) plus the wall clock's slew over
    /// a lease's length. An overlap longer than the tolerance is a violation.
    Approximate { tolerance_us: i64 },
    /// An object store's record (S3, GCS): each change is dated by the Last-Modified of the
    /// lease record's version that made it, on the store's clock, to its resolution (S3: whole
    /// seconds, GCS: 1 ms). fence takes a lease over only once a probe object it writes is
    /// stamped at least `LM + ttl + resolution`, and the takeover's own version is stamped
    /// after the probe: a takeover stamped earlier than that — by one unit of the stamps — is
    /// a violation. A release ends the lease at its own stamp.
    Store { resolution_us: i64 },
    /// The timestamps cannot bound a lease (skewed processes stamp the file store's events
    /// with a faked wall clock): I3 is checked on the test's own clock only (a lower bound of
    /// every lease's validity).
    DisplayOnly,
}

#[derive(Clone, Debug)]
pub struct History {
    pub ops: Vec<Op>,
    pub coord: Vec<CoordEvent>,
    pub coord_clock: CoordClock,
    pub target: Vec<TargetEvent>,
    pub data: Vec<DataRow>,
    /// The guard rows: resource → highest accepted token.
    pub guards: BTreeMap<String, i64>,
    /// The token the row form's row (its token column) and the object (its `fence-token`)
    /// store at the end, per resource.
    pub stored: BTreeMap<(String, WriteForm), i64>,
    /// Faults injected (for the summary line).
    pub faults: usize,
    /// Whether `data` records every accepted write (false when a test writes rows some other
    /// way, so that I6 "accepted writes left their row" cannot be judged).
    pub data_complete: bool,
    /// Records the collection expected and did not find (an event file, a table): each is a
    /// violation, never an empty history.
    pub missing: Vec<String>,
}

impl History {
    pub fn new(coord_clock: CoordClock) -> History {
        History {
            ops: Vec::new(),
            coord: Vec::new(),
            coord_clock,
            target: Vec::new(),
            data: Vec::new(),
            guards: BTreeMap::new(),
            stored: BTreeMap::new(),
            faults: 0,
            data_complete: true,
            missing: Vec::new(),
        }
    }

    pub fn summary(&self, violations: &[Violation]) -> String {
        format!(
            "checked {} operations, {} faults, {} violations",
            self.ops.len(),
            self.faults,
            violations.len()
        )
    }
}

#[derive(Clone, Debug)]
pub struct Violation {
    pub invariant: &'static str,
    pub message: String,
    /// The offending slice of history, one line per item.
    pub slice: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}: {}", self.invariant, self.message)?;
        for line in &self.slice {
            writeln!(f, "    {line}")?;
        }
        Ok(())
    }
}

fn v(invariant: &'static str, message: String, slice: Vec<String>) -> Violation {
    Violation {
        invariant,
        message,
        slice,
    }
}

const GRANT_KINDS: [&str; 2] = ["acquired", "taken_over"];

/// Runs every check.
pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    check_evidence(h, &mut out);
    check_i1(h, &mut out);
    check_i2(h, &mut out);
    check_i3(h, &mut out);
    check_i4(h, &mut out);
    check_i5(h, &mut out);
    check_i6(h, &mut out);
    out
}

/// Panics with every violation (and the seed, if given) when there is one; prints the summary.
#[track_caller]
pub fn assert_clean(h: &History, context: &str) {
    let violations = check(h);
    eprintln!("{context}: {}", h.summary(&violations));
    if !violations.is_empty() {
        let mut text = String::new();
        for violation in violations.iter().take(20) {
            text.push_str(&violation.to_string());
        }
        panic!(
            "{context}: {} violations (first 20):\n{text}",
            violations.len()
        );
    }
}

fn by_resource<T>(items: &[T], key: impl Fn(&T) -> &str) -> BTreeMap<&str, Vec<&T>> {
    let mut map: BTreeMap<&str, Vec<&T>> = BTreeMap::new();
    for item in items {
        map.entry(key(item)).or_default().push(item);
    }
    map
}

/// The evidence is complete: everything a client was told succeeded left its durable record,
/// so that no other check can pass for want of data. Every missing record the collection
/// noticed; every successful acquire, renew and release in the coordinator's event log with
/// its owner and token; every accepted write in the target's write log with its owner and
/// token, and (when the data is complete) its data row; a guard row for every resource that
/// was written.
fn check_evidence(h: &History, out: &mut Vec<Violation>) {
    for what in &h.missing {
        out.push(v(
            "evidence",
            format!("{what} is missing: the checks that need it cannot run"),
            vec![],
        ));
    }
    // How many durable events of each (resource, owner, token) and kind class there are,
    // against how many successful ops claim one.
    type Key<'a> = (&'a str, &'a str, i64);
    let count = |kinds: &[&str]| {
        let mut m: HashMap<Key, usize> = HashMap::new();
        for e in h.coord.iter().filter(|e| kinds.contains(&e.kind.as_str())) {
            if let (Some(owner), Some(token)) = (e.owner.as_deref(), e.token) {
                *m.entry((e.resource.as_str(), owner, token)).or_default() += 1;
            }
        }
        m
    };
    let grants = count(&["acquired", "taken_over", "reacquired"]);
    let renewals = count(&["renewed"]);
    let releases = count(&["released"]);
    let mut accepted: HashMap<Key, usize> = HashMap::new();
    for e in h.target.iter().filter(|e| e.kind == "write_accepted") {
        if let (Some(owner), Some(token)) = (e.owner.as_deref(), e.token) {
            *accepted
                .entry((e.resource.as_str(), owner, token))
                .or_default() += 1;
        }
    }
    let mut claimed: HashMap<(OpKind, Key), Vec<&Op>> = HashMap::new();
    for op in h.ops.iter().filter(|o| o.ok()) {
        if op.kind == OpKind::RawWrite {
            continue; // judged by I2: a raw write must not succeed at all
        }
        if op.kind == OpKind::Release && op.json["already_released"] == Value::Bool(true) {
            continue; // released before: nothing new to record
        }
        if op.kind == OpKind::Write && op.form != WriteForm::Sql {
            continue; // no write log: its data (I6) and the stored token (below) speak for it
        }
        let Some(token) = op.token else {
            out.push(v(
                "evidence",
                format!("a successful {:?} carries no token", op.kind),
                vec![op.to_string()],
            ));
            continue;
        };
        claimed
            .entry((op.kind, (op.resource.as_str(), op.owner.as_str(), token)))
            .or_default()
            .push(op);
    }
    let mut claims: Vec<_> = claimed.into_iter().collect();
    claims.sort_by_key(|(_, ops)| ops[0].id);
    for ((kind, key), ops) in claims {
        let (record, found) = match kind {
            OpKind::Acquire => ("grant in the coordinator's event log", grants.get(&key)),
            OpKind::Renew => (
                "`renewed` event in the coordinator's event log",
                renewals.get(&key),
            ),
            OpKind::Release => (
                "`released` event in the coordinator's event log",
                releases.get(&key),
            ),
            OpKind::Write => (
                "`write_accepted` event in the target's write log",
                accepted.get(&key),
            ),
            OpKind::RawWrite => continue,
        };
        // A reacquisition repeats the grant's token: one event per successful acquire.
        let found = found.copied().unwrap_or(0);
        if found < ops.len() {
            out.push(v(
                "evidence",
                format!(
                    "{} successful {kind:?}s of `{}` by {} with token {} but {found} {record}",
                    ops.len(),
                    key.0,
                    key.1,
                    key.2
                ),
                ops.iter().map(|o| o.to_string()).collect(),
            ));
        }
    }
    // Every resource something was written to has its guard row (transaction form), its row
    // a token (row form), the object a stored token (object form).
    let written: BTreeSet<(&str, WriteForm)> = h
        .ops
        .iter()
        .filter(|o| o.kind == OpKind::Write && o.ok())
        .map(|o| (o.resource.as_str(), o.form))
        .chain(
            h.target
                .iter()
                .filter(|e| e.kind == "write_accepted")
                .map(|e| (e.resource.as_str(), WriteForm::Sql)),
        )
        .chain(h.data.iter().map(|r| (r.resource.as_str(), r.form)))
        .collect();
    for (resource, form) in written {
        let (found, record) = match form {
            WriteForm::Sql => (h.guards.contains_key(resource), "guard row"),
            WriteForm::Row => (
                h.stored.contains_key(&(resource.to_owned(), form)),
                "token in its row's token column",
            ),
            WriteForm::Object => (
                h.stored.contains_key(&(resource.to_owned(), form)),
                "`fence-token` on its object",
            ),
        };
        if !found {
            out.push(v(
                "evidence",
                format!("`{resource}` was written ({form:?} form) but has no {record}"),
                vec![],
            ));
        }
    }
}

/// I1: per resource, tokens of new grants strictly increase in the coordinator's grant order,
/// and an acquire that completed before another started got the lower token. (That every
/// reported grant is in the record is [`check_evidence`]'s.)
fn check_i1(h: &History, out: &mut Vec<Violation>) {
    for (resource, events) in by_resource(&h.coord, |e| &e.resource) {
        let mut events = events;
        events.sort_by_key(|e| e.seq);
        let mut last: Option<&CoordEvent> = None;
        for e in events
            .iter()
            .filter(|e| GRANT_KINDS.contains(&e.kind.as_str()))
        {
            if let (Some(prev), Some(t)) = (last, e.token) {
                if t <= prev.token.unwrap_or(0) {
                    out.push(v(
                        "I1",
                        format!(
                            "`{resource}`: token {t} granted after token {:?}",
                            prev.token
                        ),
                        vec![prev.to_string(), e.to_string()],
                    ));
                }
            }
            last = Some(e);
        }
    }
    // Real-time order: a grant that ended before another began has the lower token.
    for (resource, ops) in by_resource(&h.ops, |o| &o.resource) {
        let mut grants: Vec<&Op> = ops.into_iter().filter(|o| o.new_grant()).collect();
        grants.sort_by_key(|o| o.start);
        for (i, a) in grants.iter().enumerate() {
            for b in &grants[i + 1..] {
                if a.end < b.start && a.token >= b.token {
                    out.push(v(
                        "I1",
                        format!("`{resource}`: a later grant got a token not above an earlier one"),
                        vec![a.to_string(), b.to_string()],
                    ));
                }
            }
        }
    }
}

/// I2: per resource the target accepted tokens in non-decreasing order (write log and data,
/// both in commit order, the data per write form), the guard holds the highest token the
/// transaction form applied, and the row and the object store their last applied write's.
fn check_i2(h: &History, out: &mut Vec<Violation>) {
    for (resource, events) in by_resource(&h.target, |e| &e.resource) {
        let mut accepted: Vec<&TargetEvent> = events
            .into_iter()
            .filter(|e| e.kind == "write_accepted")
            .collect();
        accepted.sort_by_key(|e| e.seq);
        for pair in accepted.windows(2) {
            if pair[1].token < pair[0].token {
                out.push(v(
                    "I2",
                    format!(
                        "`{resource}`: the target accepted token {:?} after token {:?}",
                        pair[1].token, pair[0].token
                    ),
                    vec![pair[0].to_string(), pair[1].to_string()],
                ));
            }
        }
        let max = accepted.iter().filter_map(|e| e.token).max();
        // A missing guard row is `check_evidence`'s violation.
        if let (Some(max), Some(guard)) = (max, h.guards.get(resource)) {
            if *guard != max {
                out.push(v(
                    "I2",
                    format!("`{resource}`: guard row holds {guard}, highest accepted write {max}"),
                    vec![],
                ));
            }
        }
    }
    let mut by_form: BTreeMap<(&str, WriteForm), Vec<&DataRow>> = BTreeMap::new();
    for row in &h.data {
        by_form
            .entry((row.resource.as_str(), row.form))
            .or_default()
            .push(row);
    }
    for ((resource, form), rows) in by_form {
        let mut rows = rows;
        rows.sort_by_key(|r| r.seq);
        // The highest token seen so far, and the row that carried it.
        let mut high: Option<&DataRow> = None;
        for &row in &rows {
            match high {
                Some(prev) if row.token < prev.token => {
                    let mut slice = vec![prev.to_string(), row.to_string()];
                    slice.extend(
                        h.ops
                            .iter()
                            .filter(|o| o.id == prev.op || o.id == row.op)
                            .map(Op::to_string),
                    );
                    out.push(v(
                        "I2",
                        format!(
                            "`{resource}` ({form:?} form): a write with token {} landed after token {}",
                            row.token, prev.token
                        ),
                        slice,
                    ));
                }
                Some(prev) if row.token <= prev.token => {}
                _ => high = Some(row),
            }
        }
        if form != WriteForm::Sql {
            // The row's token column and the object's `fence-token` hold the last applied
            // write's token, which is the highest (a missing one is `check_evidence`'s).
            let last = rows.last().map(|r| r.token);
            let stored = h.stored.get(&(resource.to_owned(), form)).copied();
            if let (Some(last), Some(stored)) = (last, stored) {
                if stored != last {
                    out.push(v(
                        "I2",
                        format!(
                            "`{resource}` ({form:?} form): stores token {stored}, but the last applied write carries {last}"
                        ),
                        rows.iter().rev().take(3).map(|r| r.to_string()).collect(),
                    ));
                }
            }
            continue;
        }
        // A missing guard row is `check_evidence`'s violation.
        if let (Some(high), Some(guard)) = (high, h.guards.get(resource)) {
            if high.token > *guard {
                out.push(v(
                    "I2",
                    format!(
                        "`{resource}`: data carries token {} above the guard's {guard}",
                        high.token
                    ),
                    vec![high.to_string()],
                ));
            }
        }
    }
}

/// A lease as the coordinator's record shows it: start, effective end (expiry, or release).
#[derive(Debug)]
struct Span<'a> {
    token: i64,
    start_us: i64,
    end_us: i64,
    /// Ended by a release (no resolution is added to a release's stamp).
    released: bool,
    events: Vec<&'a CoordEvent>,
}

/// I3 (and I7 for skewed processes): no two leases of a resource overlap.
fn check_i3(h: &History, out: &mut Vec<Violation>) {
    let skewed_owners: BTreeSet<&str> = h
        .ops
        .iter()
        .filter(|o| o.skewed)
        .map(|o| o.owner.as_str())
        .collect();
    let label = |owners: &[&str]| {
        if owners.iter().any(|o| skewed_owners.contains(o)) {
            "I7"
        } else {
            "I3"
        }
    };
    // (How far an overlap may go unflagged, what an expiry adds for the stamps' resolution.)
    let judged = match h.coord_clock {
        CoordClock::Authoritative => Some((0, 0)),
        CoordClock::Approximate { tolerance_us } => Some((tolerance_us, 0)),
        CoordClock::Store { resolution_us } => Some((0, resolution_us)),
        CoordClock::DisplayOnly => None,
    };
    if let Some((tolerance_us, resolution_us)) = judged {
        // TTL per (owner, op kind): what the owner's acquire/renew asked for, from every op
        // that may have taken effect (not from definite rejections). Owners are unique per
        // acquisition in the workloads; the largest asked-for TTL is the safe bound.
        let mut ttl: HashMap<(&str, OpKind), i64> = HashMap::new();
        for op in &h.ops {
            let maybe_applied = op.cancelled || !(1..=7).contains(&op.code) || op.arrived_late();
            if let (Some(t), true) = (op.ttl_ms, maybe_applied) {
                let e = ttl.entry((op.owner.as_str(), op.kind)).or_insert(t);
                *e = (*e).max(t);
            }
        }
        for (resource, events) in by_resource(&h.coord, |e| &e.resource) {
            let mut events = events;
            events.sort_by_key(|e| e.seq);
            let mut spans: Vec<Span> = Vec::new();
            for e in events {
                let Some(token) = e.token else { continue };
                let kind = if e.kind == "renewed" {
                    OpKind::Renew
                } else {
                    OpKind::Acquire
                };
                // A renewal inside an acquire (an answer that came late, renewed before it was
                // reported: `Leases::kept_in_time`) asks the acquire's TTL.
                let owner_ttl = e.ttl_ms.unwrap_or_else(|| {
                    e.owner
                        .as_deref()
                        .and_then(|o| {
                            ttl.get(&(o, kind))
                                .or_else(|| ttl.get(&(o, OpKind::Acquire)))
                        })
                        .copied()
                        .unwrap_or(i64::MAX / 4_000)
                });
                match e.kind.as_str() {
                    k if GRANT_KINDS.contains(&k) => spans.push(Span {
                        token,
                        start_us: e.at_us,
                        end_us: e.at_us + owner_ttl * 1000,
                        released: false,
                        events: vec![e],
                    }),
                    "renewed" | "reacquired" => {
                        // The lease now runs its TTL from this change (a shorter one
                        // shortens it), on every store.
                        if let Some(span) = spans.iter_mut().rev().find(|s| s.token == token) {
                            span.end_us = e.at_us + owner_ttl * 1000;
                            span.events.push(e);
                        }
                    }
                    "released" => {
                        if let Some(span) = spans.iter_mut().rev().find(|s| s.token == token) {
                            if e.at_us < span.end_us + resolution_us {
                                span.end_us = e.at_us;
                                span.released = true;
                            }
                            span.events.push(e);
                        }
                    }
                    _ => {}
                }
            }
            for pair in spans.windows(2) {
                let (a, b) = (&pair[0], &pair[1]);
                let end_us = if a.released {
                    a.end_us
                } else {
                    a.end_us + resolution_us
                };
                if b.start_us + tolerance_us < end_us {
                    let owners: Vec<&str> = a
                        .events
                        .iter()
                        .chain(&b.events)
                        .filter_map(|e| e.owner.as_deref())
                        .collect();
                    out.push(v(
                        label(&owners),
                        format!(
                            "`{resource}`: token {} granted {}us before token {}'s lease ended (coordinator clock)",
                            b.token,
                            end_us - b.start_us,
                            a.token
                        ),
                        a.events
                            .iter()
                            .chain(&b.events)
                            .map(|e| e.to_string())
                            .collect(),
                    ));
                }
            }
        }
    }
    // On the test's own clock, provable overlaps only: B's grant ended before A's lease can
    // have expired (A's last successful grant/renew *started* + TTL), and A had not been
    // released (no release of A completed before B began).
    for (resource, ops) in by_resource(&h.ops, |o| &o.resource) {
        let mut grants: Vec<&Op> = ops.iter().copied().filter(|o| o.new_grant()).collect();
        grants.sort_by_key(|o| o.end);
        // The ops of each lease (owner, token), so that a soak's history stays cheap to check.
        let mut of_lease: HashMap<(&str, i64), Vec<&Op>> = HashMap::new();
        for o in &ops {
            if let Some(t) = o.token {
                of_lease.entry((o.owner.as_str(), t)).or_default().push(o);
            }
        }
        for a in &grants {
            let (Some(ta), Some(ttl_a)) = (a.token, a.ttl_ms) else {
                continue;
            };
            let lease_ops = &of_lease[&(a.owner.as_str(), ta)];
            let valid_until = |before: Duration| {
                lease_ops
                    .iter()
                    .filter(|o| {
                        o.ok()
                            && matches!(o.kind, OpKind::Renew | OpKind::Acquire)
                            && o.start < before
                    })
                    .map(|o| o.start + Duration::from_millis(o.ttl_ms.unwrap_or(ttl_a) as u64))
                    .max()
                    .unwrap_or(a.start + Duration::from_millis(ttl_a as u64))
            };
            let latest = valid_until(Duration::MAX);
            // Only grants that ended after A's and before A's lease can have expired.
            let from = grants.partition_point(|b| b.end <= a.end);
            for b in grants[from..].iter().take_while(|b| b.end < latest) {
                let Some(tb) = b.token else { continue };
                if tb <= ta {
                    continue;
                }
                // A's lease is valid at least until `start + ttl` of each successful
                // grant/renew of it that started before B ended; any release attempt of A
                // that began before B's grant ended may have freed it.
                let released_before = lease_ops
                    .iter()
                    .any(|o| o.kind == OpKind::Release && o.start < b.end);
                if b.end < valid_until(b.end) && !released_before {
                    out.push(v(
                        label(&[a.owner.as_str(), b.owner.as_str()]),
                        format!(
                            "`{resource}`: token {tb} was granted while token {ta}'s lease was provably live (test clock)"
                        ),
                        vec![a.to_string(), b.to_string()],
                    ));
                }
            }
        }
    }
}

/// I4: a renew or release changed only the current lease: in the coordinator's record every
/// `renewed`/`released` event names the token and owner of the latest grant; and a renew or
/// release the tool reported as successful is in that record.
fn check_i4(h: &History, out: &mut Vec<Violation>) {
    for (resource, events) in by_resource(&h.coord, |e| &e.resource) {
        let mut events = events;
        events.sort_by_key(|e| e.seq);
        let mut current: Option<&CoordEvent> = None;
        for e in events {
            match e.kind.as_str() {
                k if GRANT_KINDS.contains(&k) => current = Some(e),
                "renewed" | "released" | "reacquired" => {
                    let matches = current.is_some_and(|c| c.token == e.token && c.owner == e.owner);
                    if !matches {
                        out.push(v(
                            "I4",
                            format!(
                                "`{resource}`: {} by token {:?} while the current lease is {:?}",
                                e.kind,
                                e.token,
                                current.map(|c| (&c.owner, c.token))
                            ),
                            current
                                .iter()
                                .map(|c| c.to_string())
                                .chain([e.to_string()])
                                .collect(),
                        ));
                    }
                }
                _ => {}
            }
        }
    }
    // On the test clock: a renew or release that exited 0 did not start after a newer
    // grant of the resource had completed.
    for (resource, ops) in by_resource(&h.ops, |o| &o.resource) {
        for r in ops
            .iter()
            .filter(|o| matches!(o.kind, OpKind::Renew | OpKind::Release) && o.ok())
        {
            let Some(t) = r.token else { continue };
            if let Some(newer) = ops
                .iter()
                .find(|g| g.new_grant() && g.token.is_some_and(|tg| tg > t) && g.end < r.start)
            {
                // Once a newer token is granted, a renew or release of an older one must be
                // refused (exit 4): it may not change the newer lease.
                out.push(v(
                    "I4",
                    format!(
                        "`{resource}`: {:?} of token {t} succeeded after token {:?} was granted",
                        r.kind, newer.token
                    ),
                    vec![newer.to_string(), r.to_string()],
                ));
            }
        }
    }
}

/// I5: every accepted write carries a token that a completed acquisition reported to the
/// owner that wrote (keyed by resource, owner and token: a token reported to one owner and
/// used by another is a violation); tokens of cancelled acquisitions never wrote, renewed or
/// released.
fn check_i5(h: &History, out: &mut Vec<Violation>) {
    type Key<'a> = (&'a str, &'a str, i64);
    let reported: BTreeSet<Key> = h
        .ops
        .iter()
        .filter(|o| o.kind == OpKind::Acquire && o.ok())
        .filter_map(|o| Some((o.resource.as_str(), o.owner.as_str(), o.token?)))
        .collect();
    // Tokens the coordinator granted to acquisitions that never completed.
    let cancelled_owners: BTreeSet<&str> = h
        .ops
        .iter()
        .filter(|o| o.kind == OpKind::Acquire && o.cancelled)
        .map(|o| o.owner.as_str())
        .collect();
    let cancelled_tokens: BTreeSet<(&str, i64)> = h
        .coord
        .iter()
        .filter(|e| GRANT_KINDS.contains(&e.kind.as_str()))
        .filter(|e| {
            e.owner
                .as_deref()
                .is_some_and(|o| cancelled_owners.contains(o))
        })
        .filter_map(|e| Some((e.resource.as_str(), e.token?)))
        .collect();
    let judge = |resource: &str, owner: Option<&str>, token: Option<i64>| -> Option<String> {
        let Some(token) = token else {
            return Some("an accepted write carries no token".into());
        };
        if cancelled_tokens.contains(&(resource, token)) {
            return Some(format!(
                "`{resource}`: token {token}, a cancelled acquisition's, wrote"
            ));
        }
        let owner = owner.unwrap_or_default();
        (!reported.contains(&(resource, owner, token))).then(|| {
            format!("`{resource}`: token {token} wrote as `{owner}`, to whom no completed acquisition reported it")
        })
    };
    for e in h.target.iter().filter(|e| e.kind == "write_accepted") {
        if let Some(message) = judge(&e.resource, e.owner.as_deref(), e.token) {
            out.push(v("I5", message, vec![e.to_string()]));
        }
    }
    let ops: HashMap<usize, &Op> = h.ops.iter().map(|o| (o.id, o)).collect();
    for row in &h.data {
        // A row of no recorded op is I6's violation.
        let Some(op) = ops.get(&row.op) else { continue };
        if let Some(message) = judge(&row.resource, Some(&op.owner), Some(row.token)) {
            out.push(v("I5", message, vec![row.to_string(), op.to_string()]));
        }
    }
    // A renew/release succeeding with a cancelled acquisition's token.
    for op in h.ops.iter().filter(|o| {
        matches!(o.kind, OpKind::Renew | OpKind::Release)
            && o.ok()
            && o.token
                .is_some_and(|t| cancelled_tokens.contains(&(o.resource.as_str(), t)))
    }) {
        out.push(v(
            "I5",
            "a cancelled acquisition's token was renewed or released".into(),
            vec![op.to_string()],
        ));
    }
}

/// I6: a rejected write (exit 4, 6, 1, 7) left no trace; an accepted one (exit 0) left
/// exactly its row; an outcome-unknown one (exit 8, killed) left at most one.
fn check_i6(h: &History, out: &mut Vec<Violation>) {
    let mut rows_by_op: HashMap<usize, Vec<&DataRow>> = HashMap::new();
    for row in &h.data {
        rows_by_op.entry(row.op).or_default().push(row);
    }
    let ids: BTreeSet<usize> = h.ops.iter().map(|o| o.id).collect();
    for row in &h.data {
        if !ids.contains(&row.op) {
            out.push(v(
                "I6",
                "a data row written by no recorded operation".into(),
                vec![row.to_string()],
            ));
        }
    }
    for op in h
        .ops
        .iter()
        .filter(|o| matches!(o.kind, OpKind::Write | OpKind::RawWrite))
    {
        let rows = rows_by_op.get(&op.id).map(Vec::as_slice).unwrap_or(&[]);
        let slice = || {
            std::iter::once(op.to_string())
                .chain(rows.iter().map(|r| r.to_string()))
                .collect::<Vec<_>>()
        };
        if op.kind == OpKind::RawWrite && op.ok() {
            out.push(v(
                "I2",
                "a write by another path than begin_write was accepted by a protected table".into(),
                slice(),
            ));
        }
        let rejected = !op.cancelled && (1..=7).contains(&op.code);
        if rejected && !rows.is_empty() {
            out.push(v(
                "I6",
                format!("a write rejected with exit {} left data", op.code),
                slice(),
            ));
        } else if op.ok() && h.data_complete && rows.len() != 1 {
            out.push(v(
                "I6",
                format!(
                    "a write reported as applied left {} rows, not 1",
                    rows.len()
                ),
                slice(),
            ));
        } else if rows.len() > 1 {
            out.push(v("I6", "a write applied more than once".into(), slice()));
        }
        if let (true, Some(row)) = (op.kind == OpKind::Write, rows.first()) {
            if Some(row.token) != op.token {
                out.push(v(
                    "I6",
                    format!(
                        "a write with token {:?} stored token {}",
                        op.token, row.token
                    ),
                    slice(),
                ));
            }
        }
    }
}

/// A small xorshift64* generator: reproducible from its seed, no dependencies.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1) ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..hi` (hi exclusive, hi > lo).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo).max(1)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }
}
