//! The vocabulary of `fence log`: an event of a resource's history, the query that selects
//! events (names or globs, a time window, a limit) and an event as a log reads it. A leaf
//! module: coordinators and fenced targets both speak it, so neither depends on the other.

/// What happened to a resource: an event's kind. Its name ([`EventKind::as_str`], also its
/// `Display` and its serde form) is on the wire: JSON answers, the directory store's and the
/// object stores' event logs, PostgreSQL's `events.kind` and `write_events.kind`, `fence log
/// --kind`, Prometheus labels. Never rename one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A new token for a free or released lease.
    Acquired,
    /// The same owner's live lease, extended (the same token).
    Reacquired,
    /// A new token for another owner's expired lease.
    TakenOver,
    Renewed,
    Released,
    /// A lease's expiry, derived by `fence log` from the expiry it recorded; never stored.
    Expired,
    /// Renewals and releases refused (stale token, expired or released lease).
    RenewRejected,
    ReleaseRejected,
    /// Refused attempts, coalesced per owner and minute: an acquire of a lease another owner
    /// holds, a renew or release of a lease the caller does not hold.
    Busy,
    Conflict,
    /// A fenced write a target accepted or refused.
    WriteAccepted,
    WriteRejected,
    /// The directory store's retention cut its log here (carrying the highest token).
    Pruned,
    /// `fence run` started its command under the lease (a [`RunNote`] in `detail`).
    RunStarted,
    /// The command ended on its own, inside the lease (its status, how long it ran).
    RunFinished,
    /// fence stopped the command, or it ended stopped: a lost lease, `--max-time`, a signal
    /// passed on (which signal, why, how long after the lease's bound).
    RunStopped,
    /// A kind this fence does not know (written by another version of fence): read and shown
    /// as stored, never an error, matched by no `--kind` and counted by no metric.
    Other(String),
}

/// Every kind this fence writes or derives, in the order `--kind` lists them.
pub static KNOWN_KINDS: [EventKind; 16] = [
    EventKind::Acquired,
    EventKind::Reacquired,
    EventKind::TakenOver,
    EventKind::Renewed,
    EventKind::Released,
    EventKind::Expired,
    EventKind::RenewRejected,
    EventKind::ReleaseRejected,
    EventKind::Busy,
    EventKind::Conflict,
    EventKind::WriteAccepted,
    EventKind::WriteRejected,
    EventKind::Pruned,
    EventKind::RunStarted,
    EventKind::RunFinished,
    EventKind::RunStopped,
];

impl EventKind {
    /// The kind's name on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            EventKind::Acquired => "acquired",
            EventKind::Reacquired => "reacquired",
            EventKind::TakenOver => "taken_over",
            EventKind::Renewed => "renewed",
            EventKind::Released => "released",
            EventKind::Expired => "expired",
            EventKind::RenewRejected => "renew_rejected",
            EventKind::ReleaseRejected => "release_rejected",
            EventKind::Busy => "busy",
            EventKind::Conflict => "conflict",
            EventKind::WriteAccepted => "write_accepted",
            EventKind::WriteRejected => "write_rejected",
            EventKind::Pruned => "pruned",
            EventKind::RunStarted => "run_started",
            EventKind::RunFinished => "run_finished",
            EventKind::RunStopped => "run_stopped",
            EventKind::Other(name) => name,
        }
    }

    /// The kind named `name`; a name this fence does not know is [`EventKind::Other`].
    pub fn parse(name: &str) -> EventKind {
        KNOWN_KINDS
            .iter()
            .find(|k| k.as_str() == name)
            .cloned()
            .unwrap_or_else(|| EventKind::Other(name.to_owned()))
    }

    /// The refusal of `op` (`renew`, `release`) as the history records it
    /// (`renew_rejected`, `release_rejected`).
    pub fn rejected(op: &str) -> EventKind {
        EventKind::parse(&format!("{op}_rejected"))
    }

    /// A grant: a new token (`acquired`, `taken_over`).
    pub fn is_grant(&self) -> bool {
        matches!(self, EventKind::Acquired | EventKind::TakenOver)
    }

    /// What `fence run` recorded about its command (`run_started`, `run_finished`,
    /// `run_stopped`): no change to the lease.
    pub fn is_run(&self) -> bool {
        matches!(
            self,
            EventKind::RunStarted | EventKind::RunFinished | EventKind::RunStopped
        )
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Ordered by name, as the strings were (per-kind counts keep their order on disk).
impl Ord for EventKind {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for EventKind {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl serde::Serialize for EventKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for EventKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Ok(EventKind::parse(&name))
    }
}

/// One entry of a resource's append-only history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub at_ms: i64,
    pub kind: EventKind,
    pub owner: Option<String>,
    pub token: Option<i64>,
    pub detail: Option<String>,
    /// A grant or renewal: the TTL it asked for and the expiry it set, by the store's clock
    /// (`None` for events recorded before fence kept them).
    pub ttl_ms: Option<i64>,
    pub expires_at_ms: Option<i64>,
    /// A takeover: when the lease it took over had expired.
    pub previous_expires_at_ms: Option<i64>,
    /// A release: whether the lease was still live by the store's own clock, where the
    /// store says (the directory store: its clock is CLOCK_BOOTTIME, which a step of the wall
    /// clock does not move); elsewhere the event's times tell.
    pub live: Option<bool>,
    /// A target's accepted write: the rows it changed, where the target records them.
    pub rows: Option<i64>,
    /// Refused attempts (`busy`, `conflict`) coalesced into this event: how many, and when
    /// the last of them came (`at_ms` is the first).
    pub count: Option<i64>,
    pub last_at_ms: Option<i64>,
}

impl Event {
    /// An event of `kind` at `at_ms` that carries nothing else yet.
    pub fn new(kind: EventKind, at_ms: i64) -> Event {
        Event {
            at_ms,
            kind,
            owner: None,
            token: None,
            detail: None,
            ttl_ms: None,
            expires_at_ms: None,
            previous_expires_at_ms: None,
            live: None,
            rows: None,
            count: None,
            last_at_ms: None,
        }
    }
}

/// What `fence run` records about its command in a run event (`run_started`,
/// `run_finished`, `run_stopped`): stored as JSON in the event's `detail`, so that every store
/// keeps it without a new column, and shown by `fence log` and `inspect` as a sentence (and
/// as the object `run` in JSON). Fields a run event does not have are absent; a note written by
/// another version of fence keeps what this one knows of it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunNote {
    /// `FENCE_RUN_ID`: `--id`, or `run-<token>-<8 hex>`.
    pub run_id: String,
    /// The machine `fence run` ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The `fence run` process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The process group the command runs in (its supervisor leads it): `kill -- -GROUP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<u32>,
    /// The command's program (its first word, as given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    /// The digest of the command's arguments (16 hex digits): the same for the same command.
    /// Only for runs with an id (`--id`), whose completion record keeps it anyway: unkeyed, it
    /// lets whoever reads the history confirm a guess of the arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The command's exit status (128 + N for a command killed by signal N); `fence run`
    /// itself exits 124 when `--max-time` stopped it, 5 when the lease was lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<u8>,
    /// `run_stopped`: the signal that ended the command, else the first stop signal it got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// `run_stopped`: why (`max_time`, `interrupted`, `not_started` — the command never ran —,
    /// or the lost lease's reason: `expired`, `taken_over`, `released`, `unreachable`,
    /// `supervisor_lost`, `unkillable`, `record_lost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How long the command ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<i64>,
    /// `run_stopped` for a lost lease: when the command ended, counted from the lease's bound
    /// (`fence run`'s own, at or before the store's expiry); negative: that long before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_lease_end_ms: Option<i64>,
    /// `run_finished`: the lease was lost only after the command had ended inside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_after: Option<String>,
}

impl RunNote {
    /// The note a run event carries, when its detail is one.
    pub fn of(event: &Event) -> Option<RunNote> {
        if !event.kind.is_run() {
            return None;
        }
        serde_json::from_str(event.detail.as_deref()?).ok()
    }

    /// The note as an event's detail.
    pub fn detail(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The note as a sentence, for the DETAIL column.
    pub fn describe(&self, kind: &EventKind) -> String {
        let ran = self
            .duration_ms
            .map(|ms| format!(" after {}", crate::time::span(ms)));
        let status = self
            .exit_status
            .map(|code| format!("exit {code}"))
            .unwrap_or_else(|| "exit status unknown".to_owned());
        // What a command chose (its program, its run id) is shown escaped: a newline in it
        // must not make a line of its own in `fence log`.
        let safe = |text: &str| crate::terminal::terminal_safe(text, false).into_owned();
        let mut text = format!("run {}", safe(&self.run_id));
        match kind {
            EventKind::RunStarted => {
                if let Some(program) = &self.program {
                    text.push_str(&format!(": {}", safe(program)));
                }
                if let Some(digest) = &self.command {
                    text.push_str(&format!(" (command {digest})"));
                }
                match (self.host.as_deref().map(safe), self.pid) {
                    (Some(host), Some(pid)) => {
                        text.push_str(&format!(", fence pid {pid} on {host}"))
                    }
                    (Some(host), None) => text.push_str(&format!(", on {host}")),
                    (None, Some(pid)) => text.push_str(&format!(", fence pid {pid}")),
                    (None, None) => {}
                }
                if let Some(group) = self.group {
                    text.push_str(&format!(", process group {group}"));
                }
            }
            EventKind::RunFinished => {
                text.push_str(&format!(": {status}{}", ran.unwrap_or_default()));
                if let Some(lost) = &self.lost_after {
                    text.push_str(&format!("; the lease was lost only afterwards ({lost})"));
                }
            }
            _ if self.reason.as_deref() == Some("not_started") => {
                text.push_str(": its command was not started");
            }
            _ => {
                text.push_str(" stopped");
                if let Some(reason) = &self.reason {
                    text.push_str(&format!(" ({})", reason_words(reason)));
                }
                if let Some(signal) = &self.signal {
                    text.push_str(&format!(" by {signal}"));
                }
                text.push_str(&format!(": {status}{}", ran.unwrap_or_default()));
                if let Some(ms) = self.after_lease_end_ms {
                    text.push_str(&match ms {
                        ms if ms < 0 => format!(
                            "; it ended {} before the lease's bound",
                            crate::time::span(ms.saturating_neg())
                        ),
                        ms => format!(
                            "; it ended {} after the lease's bound",
                            crate::time::span(ms)
                        ),
                    });
                }
            }
        }
        text
    }
}

/// A `run_stopped` reason in words.
fn reason_words(reason: &str) -> &str {
    match reason {
        "max_time" => "it ran past --max-time",
        "interrupted" => "fence run was asked to stop",
        "expired" => "the lease expired before it was renewed",
        "taken_over" => "the lease was taken over",
        "released" => "the lease was released under it",
        "unreachable" => "the lease could not be renewed in time",
        "supervisor_lost" => "its supervisor was lost",
        "unkillable" => "a process would not die on SIGKILL",
        "record_lost" => "the store no longer recorded the lease",
        other => other,
    }
}

/// An event's detail as shown: a run event's note as a sentence, any other detail as stored.
pub fn shown_detail(event: &Event) -> Option<String> {
    match RunNote::of(event) {
        Some(note) => Some(note.describe(&event.kind)),
        None => event.detail.clone(),
    }
}

/// A resource name or a glob of them: `*` any run of characters, `?` one character; `\*`,
/// `\?` and `\\` stand for the character itself (a backslash before any other character is
/// itself), so that a name holding `*` or `?` can be named alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern(Vec<Part>);

/// One element of a [`Pattern`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// `*`: any run of characters.
    Any,
    /// `?`: one character.
    One,
    Char(char),
}

impl Pattern {
    pub fn new(text: &str) -> Pattern {
        let mut parts = Vec::with_capacity(text.len());
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            parts.push(match c {
                '*' => Part::Any,
                '?' => Part::One,
                '\\' => match chars.next_if(|next| matches!(next, '*' | '?' | '\\')) {
                    Some(escaped) => Part::Char(escaped),
                    None => Part::Char('\\'),
                },
                c => Part::Char(c),
            });
        }
        Pattern(parts)
    }

    /// The one name the pattern matches, when it has no wildcard.
    pub fn exact(&self) -> Option<String> {
        self.0
            .iter()
            .map(|part| match part {
                Part::Char(c) => Some(*c),
                Part::Any | Part::One => None,
            })
            .collect()
    }

    /// Whether `name` matches: `*` any run of characters, `?` one. Linear in the product of
    /// the two lengths (the usual greedy match that backtracks only to the last `*`): a
    /// recursive match took exponential time on patterns such as `*a*a*a*a*a*b`.
    pub fn matches(&self, name: &str) -> bool {
        let pattern = &self.0;
        let name: Vec<char> = name.chars().collect();
        let (mut p, mut n) = (0, 0);
        // After the last `*` seen: where in the pattern, and where in the name it resumed.
        let mut star: Option<(usize, usize)> = None;
        while n < name.len() {
            match pattern.get(p) {
                Some(Part::Any) => {
                    star = Some((p + 1, n));
                    p += 1;
                }
                Some(Part::One) => {
                    p += 1;
                    n += 1;
                }
                Some(&Part::Char(c)) if c == name[n] => {
                    p += 1;
                    n += 1;
                }
                _ => match star {
                    Some((after, resumed)) => {
                        p = after;
                        n = resumed + 1;
                        star = Some((after, resumed + 1));
                    }
                    None => return false,
                },
            }
        }
        pattern[p..].iter().all(|&part| part == Part::Any)
    }

    /// The pattern for SQL `LIKE` (whose escape character is the backslash).
    pub fn like(&self) -> String {
        let mut like = String::with_capacity(self.0.len() + 4);
        for part in &self.0 {
            match *part {
                Part::Any => like.push('%'),
                Part::One => like.push('_'),
                Part::Char(c @ ('%' | '_' | '\\')) => {
                    like.push('\\');
                    like.push(c);
                }
                Part::Char(c) => like.push(c),
            }
        }
        like
    }
}

/// Which events to read.
#[derive(Clone, Copy, Debug)]
pub struct LogQuery<'a> {
    /// The resources (every one when empty).
    pub patterns: &'a [Pattern],
    /// Only events at or after this instant (milliseconds since the epoch).
    pub since_ms: Option<i64>,
    /// Only events before this instant.
    pub until_ms: Option<i64>,
    /// At most this many, the most recent.
    pub limit: usize,
}

impl LogQuery<'_> {
    /// The names to read when every pattern is one (for indexed lookups); `None`: list.
    pub fn exact_names(&self) -> Option<Vec<String>> {
        if self.patterns.is_empty() {
            return None;
        }
        self.patterns.iter().map(Pattern::exact).collect()
    }

    pub fn matches(&self, resource: &str) -> bool {
        self.patterns.is_empty() || self.patterns.iter().any(|p| p.matches(resource))
    }

    pub fn in_range(&self, at_ms: i64) -> bool {
        self.since_ms.is_none_or(|since| at_ms >= since)
            && self.until_ms.is_none_or(|until| at_ms < until)
    }
}

/// One event of one resource, as a log reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    pub resource: String,
    /// Microseconds since the epoch where the store keeps them (PostgreSQL), else the
    /// millisecond times 1000: what orders the events of several sources.
    pub at_us: i64,
    pub event: Event,
}

/// Sorts by time (stably: each resource's own order stays) and keeps the `limit` newest.
pub fn newest(logged: &mut Vec<Logged>, limit: usize) {
    logged.sort_by_key(|l| l.at_us);
    if logged.len() > limit {
        logged.drain(..logged.len() - limit);
    }
}

#[cfg(test)]
mod tests {
    use super::{EventKind, Pattern, KNOWN_KINDS};

    #[test]
    fn event_kinds_keep_their_names() {
        let names: Vec<&str> = KNOWN_KINDS.iter().map(EventKind::as_str).collect();
        assert_eq!(
            names,
            [
                "acquired",
                "reacquired",
                "taken_over",
                "renewed",
                "released",
                "expired",
                "renew_rejected",
                "release_rejected",
                "busy",
                "conflict",
                "write_accepted",
                "write_rejected",
                "pruned",
                "run_started",
                "run_finished",
                "run_stopped"
            ]
        );
        for kind in &KNOWN_KINDS {
            assert_eq!(&EventKind::parse(kind.as_str()), kind);
            assert_eq!(kind.to_string(), kind.as_str());
            let json = serde_json::to_string(kind).unwrap();
            assert_eq!(json, format!("\"{kind}\""));
            assert_eq!(&serde_json::from_str::<EventKind>(&json).unwrap(), kind);
        }
        assert_eq!(EventKind::rejected("renew"), EventKind::RenewRejected);
        assert_eq!(EventKind::rejected("release"), EventKind::ReleaseRejected);
    }

    /// A kind written by another version of fence is read, kept and written back as it was.
    #[test]
    fn unknown_event_kinds_are_kept_as_stored() {
        let kind: EventKind = serde_json::from_str("\"lease_teleported\"").unwrap();
        assert_eq!(kind, EventKind::Other("lease_teleported".into()));
        assert_eq!(kind.as_str(), "lease_teleported");
        assert_eq!(
            serde_json::to_string(&kind).unwrap(),
            "\"lease_teleported\""
        );
        // Per-kind counts keep their order on disk: by name, as when kinds were strings.
        let counts: std::collections::BTreeMap<EventKind, i64> =
            serde_json::from_str(r#"{"acquired":1,"lease_teleported":2,"busy":3,"taken_over":4}"#)
                .unwrap();
        assert_eq!(
            serde_json::to_string(&counts).unwrap(),
            r#"{"acquired":1,"busy":3,"lease_teleported":2,"taken_over":4}"#
        );
    }

    #[test]
    fn globs() {
        let p = Pattern::new("nightly-*");
        assert!(p.matches("nightly-report") && p.matches("nightly-") && !p.matches("daily"));
        assert!(Pattern::new("a?c").matches("abc") && !Pattern::new("a?c").matches("ac"));
        // A name holding `*` or `?` can be named alone: `\*`, `\?`, `\\` are the characters.
        let star = Pattern::new(r"job\*");
        assert!(star.matches("job*") && !star.matches("job-1") && !star.matches("job"));
        assert_eq!(star.exact().as_deref(), Some("job*"));
        let one = Pattern::new(r"a\?");
        assert!(one.matches("a?") && !one.matches("ab"));
        let slash = Pattern::new(r"a\\*");
        assert!(slash.matches(r"a\") && slash.matches(r"a\x") && !slash.matches("ax"));
        assert_eq!(slash.exact(), None);
        // A backslash before anything else is itself.
        let plain = Pattern::new(r"a\b\");
        assert!(plain.matches(r"a\b\") && !plain.matches("ab"));
        assert_eq!(plain.exact().as_deref(), Some(r"a\b\"));
        assert_eq!(Pattern::new(r"x\*%_\y*?").like(), r"x*\%\_\\y%_");
        // Against the plain recursive definition, on every pattern and name over a small
        // alphabet (the recursion is exponential only on long inputs).
        fn reference(p: &[char], n: &[char]) -> bool {
            match p.split_first() {
                None => n.is_empty(),
                Some(('*', rest)) => (0..=n.len()).any(|skip| reference(rest, &n[skip..])),
                Some(('?', rest)) => !n.is_empty() && reference(rest, &n[1..]),
                Some((c, rest)) => n.first() == Some(c) && reference(rest, &n[1..]),
            }
        }
        let words = |alphabet: &[char], max: usize| {
            let mut all = vec![String::new()];
            let mut last = vec![String::new()];
            for _ in 0..max {
                last = last
                    .iter()
                    .flat_map(|w| alphabet.iter().map(move |c| format!("{w}{c}")))
                    .collect();
                all.extend(last.iter().cloned());
            }
            all
        };
        for pattern in words(&['a', 'b', '*', '?'], 4) {
            for name in words(&['a', 'b'], 4) {
                let (p, n): (Vec<char>, Vec<char>) =
                    (pattern.chars().collect(), name.chars().collect());
                assert_eq!(
                    Pattern::new(&pattern).matches(&name),
                    reference(&p, &n),
                    "{pattern:?} on {name:?}"
                );
            }
        }
        assert_eq!(Pattern::new("job").exact().as_deref(), Some("job"));
        assert_eq!(Pattern::new("a_b%*").like(), "a\\_b\\%%");
    }
}
