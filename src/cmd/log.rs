//! `fence log`: one ordered timeline of a store's lease events and its targets' fenced
//! writes, for "what happened at 03:00?" — who held what when, which TTL and expiry each
//! grant set, when a lease ran out, what each target accepted (and how many rows) and what
//! it refused — with the integrity warnings that history can prove.
//!
//! Refused attempts (`busy`, `conflict`) are coalesced per resource, owner, kind and minute
//! by the store (a count, the first and last time), and shown at the first.
//!
//! Expiries are not events a store writes (nothing happens when a lease runs out): they are
//! derived from the expiry each grant or renewal recorded, when nothing renewed or released
//! the lease before it, and shown as `expired` events at that instant.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::cli::{Format, LogArgs};
use crate::cmd::{log_stream, Context};
use crate::coordinator::{Event, EventKind, LogQuery, Logged, Pattern};
use crate::error::Error;
use crate::exit::Exit;
use crate::fenced::target::FencedTarget;
use crate::fenced::{self, TargetSpec};
use crate::output::{self, Output, Report};
use crate::signals::Interrupts;
use crate::time;
use crate::timeline::{shown_detail, RunNote};

/// Where an event comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
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

/// What the history proves wrong, by name on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WarningKind {
    /// A grant whose token is not above an earlier grant's.
    TokenRegressed,
    /// A target that accepted a token above the highest the store issued.
    TargetAhead,
    /// A release, or a write a target accepted, after the lease expired.
    HeldPastTtl,
}

impl WarningKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WarningKind::TokenRegressed => "token_regressed",
            WarningKind::TargetAhead => "target_ahead",
            WarningKind::HeldPastTtl => "held_past_ttl",
        }
    }
}

/// Something the history proves wrong (on the wire: `resource`, `kind`, `message`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Warning {
    pub resource: String,
    pub kind: WarningKind,
    pub message: String,
}

pub struct Timeline {
    entries: Vec<Entry>,
    warnings: Vec<Warning>,
    /// A source had more events in the window than `--limit`: older ones are left out.
    truncated: bool,
    store: String,
}

/// A timeline of up to this many entries is printed as one report (a table for people, `ok`
/// first in JSON), as it always was; a longer one is written as it is read (see
/// [`run_and_print`]).
const WHOLE: usize = 10_000;

/// `fence log`, printed. The store is read twice, each time as a stream ([`History::log_each`]):
/// once to count what the filters let through (with a growing limit, as `--limit` counts
/// filtered events), once to write it, so that memory follows a page, not the window. A
/// timeline of more than [`WHOLE`] entries is written as it is read: ndjson as always; JSON
/// as the same object with `ok` last (so that a read failing midway still ends one JSON
/// object, with `"ok": false` and the error); for people each event on a line of its own,
/// its lease and detail indented below it (the narrow layout), instead of a table whose
/// columns would need every row first. Targets' events are read whole.
///
/// [`History::log_each`]: crate::coordinator::History::log_each
pub async fn run_and_print(args: LogArgs, ctx: &Context, out: &Output) -> Exit {
    match timeline(&args, ctx, out).await {
        Ok(exit) => exit,
        Err(err) => out.error("log", ctx.store_display(), &err),
    }
}

/// What the first reading of the store found.
#[derive(Default)]
struct Counted {
    /// Events read.
    read: usize,
    /// Entries (events and expiries) the filters let through.
    matching: usize,
    /// The resources of the timeline.
    names: BTreeSet<String>,
}

async fn timeline(args: &LogArgs, ctx: &Context, out: &Output) -> Result<Exit, Error> {
    if let (Some(since), Some(until)) = (args.since, args.until) {
        if since >= until {
            return Err(Error::usage(
                format!(
                    "--since ({}) is not before --until ({}): the window holds no time",
                    crate::time::rfc3339(since),
                    crate::time::rfc3339(until)
                ),
                "swap them: --since is the start of the window, --until its end (a span such as 2h means that long ago)",
            ));
        }
    }
    let targets = resolve_targets(&args.targets, false)?;
    let patterns: Vec<Pattern> = args.resources.iter().map(|r| Pattern::new(r)).collect();
    let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
    let query = LogQuery {
        patterns: &patterns,
        since_ms: args.since,
        until_ms: args.until,
        limit,
    };
    let coordinator = ctx.coordinator().await?;
    coordinator.require_existing().await?;
    let now = now_ms();
    // The store's events in the window, read with a growing limit until `limit` of its
    // entries pass `--owner`, `--token` and `--kind` or the store has nothing older.
    let mut ask = limit;
    let (ask, mut truncated, counted) = loop {
        let mut counted = Counted::default();
        let mut expiries = Expiries::default();
        let count = |counted: &mut Counted, entry: Entry| {
            if entry.derived && !query.in_range(entry.logged.event.at_ms) {
                return;
            }
            counted.matching += usize::from(wanted(args, &entry));
            counted.names.insert(entry.logged.resource);
        };
        coordinator
            .log_each(
                &LogQuery {
                    limit: ask,
                    ..query
                },
                &mut |logged| {
                    counted.read += 1;
                    for entry in expiries.feed(logged) {
                        count(&mut counted, entry);
                    }
                    true
                },
            )
            .await?;
        for entry in expiries.due(now) {
            count(&mut counted, entry);
        }
        let more = counted.read >= ask;
        if !more || ask == usize::MAX || counted.matching >= limit {
            break (ask, more, counted);
        }
        ask = ask.saturating_mul(2);
    };
    // Entries each source has that pass the filters: the oldest beyond `limit` are left out.
    let mut matching: HashMap<Source, usize> = HashMap::from([(Source::Store, counted.matching)]);
    let mut names = counted.names;
    // Per target: the highest token it accepted, per resource of the timeline.
    let mut guards: Vec<(String, Vec<(String, i64)>)> = Vec::new();
    let mut read: Vec<(Source, Vec<Logged>)> = Vec::new();
    for spec in &targets {
        let target = fenced::target::open(spec, &ctx.schema).await?;
        target.require_existing().await?;
        let reader = target.as_ref();
        let (mut events, more) = read_growing(
            &query,
            |events| {
                events
                    .iter()
                    .filter(|l| wanted_event(args, &l.event))
                    .count()
            },
            |page| async move { reader.log(&page).await },
        )
        .await?;
        truncated |= more;
        let mut here = names.clone();
        here.extend(events.iter().map(|l| l.resource.clone()));
        // No resource in the timeline: nothing to compare (an empty list asks for every one).
        if !here.is_empty() {
            let here: Vec<String> = here.iter().cloned().collect();
            guards.push((spec.display.clone(), target.highest_tokens(&here).await?));
        }
        names.extend(events.iter().map(|l| l.resource.clone()));
        let source = Source::Target(spec.display.clone());
        *matching.entry(source.clone()).or_default() += events
            .iter()
            .filter(|l| wanted_event(args, &l.event))
            .count();
        // By time, each instant's events in the order the target gave them.
        events.sort_by_key(|l| l.at_us);
        read.push((source, events));
    }
    let mut ahead = Vec::new();
    if guards.iter().any(|(_, g)| !g.is_empty()) {
        let names: Vec<String> = guards
            .iter()
            .flat_map(|(_, g)| g.iter().map(|(resource, _)| resource.clone()))
            .collect();
        let issued: HashMap<String, Option<i64>> = coordinator
            .inspect(&names, 0)
            .await?
            .into_iter()
            .map(|v| (v.resource, v.token))
            .collect();
        for (target, guards) in &guards {
            for (resource, highest) in guards {
                let issued = issued.get(resource).copied().flatten();
                if let Some(message) = target_ahead(target, resource, *highest, issued) {
                    ahead.push(Warning {
                        resource: resource.clone(),
                        kind: WarningKind::TargetAhead,
                        message,
                    });
                }
            }
        }
    }
    truncated |= matching.values().any(|&n| n > limit);
    let shown: usize = matching.values().map(|&n| n.min(limit)).sum();
    let skip: HashMap<Source, usize> = matching
        .into_iter()
        .map(|(source, n)| (source, n.saturating_sub(limit)))
        .collect();
    let store = ctx.store_display().unwrap_or_default().to_owned();
    if shown <= WHOLE {
        let mut entries = Vec::new();
        let checks = log_stream::merge(
            args,
            &query,
            ask,
            now,
            coordinator.as_ref(),
            read,
            skip,
            &mut |entry| {
                entries.push(entry);
                true
            },
        )
        .await?;
        let mut warnings = checks.warnings;
        warnings.extend(ahead);
        let timeline = Timeline {
            entries,
            warnings,
            truncated,
            store,
        };
        return Ok(out.success("log", ctx.store_display(), &timeline));
    }
    let mut writer = log_stream::Streamed::start(out, &store);
    let merged = log_stream::merge(
        args,
        &query,
        ask,
        now,
        coordinator.as_ref(),
        read,
        skip,
        &mut |entry| writer.entry(&entry),
    )
    .await;
    match merged {
        Ok(checks) => {
            let mut warnings = checks.warnings;
            warnings.extend(ahead);
            writer.finish(&warnings, truncated, ctx);
            Ok(Exit::Success)
        }
        Err(err) => Ok(writer.fail(&err, ctx, out)),
    }
}

/// A source's events in the window, read with a growing limit until `limit` of them pass
/// `--owner`, `--token` and `--kind` (`matching` counts them) or the source has nothing
/// older: the limit applies to what the filters let through, not to what was read before
/// them. Returns everything read (the expiries and warnings are derived from all of it) and
/// whether older events may have been left out.
async fn read_growing<'q, F, Fut>(
    query: &LogQuery<'q>,
    matching: impl Fn(&[Logged]) -> usize,
    read: F,
) -> Result<(Vec<Logged>, bool), Error>
where
    F: Fn(LogQuery<'q>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Logged>, Error>>,
{
    let mut ask = query.limit;
    loop {
        let events = read(LogQuery {
            limit: ask,
            ..*query
        })
        .await?;
        let more = events.len() >= ask;
        if !more || ask == usize::MAX || matching(&events) >= query.limit {
            return Ok((events, more));
        }
        ask = ask.saturating_mul(2);
    }
}

/// Whether `--owner`, `--token` and `--kind` let the entry through.
pub(super) fn wanted(args: &LogArgs, entry: &Entry) -> bool {
    wanted_event(args, &entry.logged.event)
}

fn wanted_event(args: &LogArgs, ev: &Event) -> bool {
    args.owner.as_ref().is_none_or(|o| {
        ev.owner
            .as_deref()
            .is_some_and(|owner| Pattern::new(o).matches(owner))
    }) && args.token.is_none_or(|t| ev.token == Some(t))
        && (args.kinds.is_empty() || args.kinds.contains(&ev.kind))
}

/// The targets `--target` names: PostgreSQL databases, and objects (without `--follow`).
fn resolve_targets(urls: &[String], follow: bool) -> Result<Vec<TargetSpec>, Error> {
    urls.iter()
        .map(|url| {
            let spec = TargetSpec::resolve(url)?;
            if follow && spec.object.is_some() {
                return Err(Error::usage(
                    format!("`fence log --follow --target` reads PostgreSQL targets, not `{}`", spec.display),
                    "drop --follow to see the writes the object accepted (its current version and the ids it remembers)",
                ));
            }
            Ok(spec)
        })
        .collect()
}

/// How far back each poll of `--follow` reads again: an event is stamped inside its
/// transaction (or under its lock) and seen only once committed, so one that commits late
/// carries an earlier time than events already shown. Expiries wait as long, so that a
/// renewal committed late is not preceded by an expiry that did not happen.
const FOLLOW_LAG_MS: i64 = 2_000;

/// An event `--follow` has shown: from a target?, resource, time, kind, owner, token.
type SeenKey = (bool, String, i64, EventKind, Option<String>, Option<i64>);

/// `fence log --follow`: the events so far, then each new one as a line of its own, until a
/// stop signal (exit 0). A store or target that fails is read again at the next poll, with a
/// warning when it fails and when it answers again.
pub async fn follow(args: LogArgs, ctx: &Context, out: &Output) -> Exit {
    match follow_events(&args, ctx, out).await {
        Ok(()) => Exit::Success,
        Err(err) => out.error("log", ctx.store_display(), &err),
    }
}

async fn follow_events(args: &LogArgs, ctx: &Context, out: &Output) -> Result<(), Error> {
    if out.format == Format::Json {
        return Err(Error::usage(
            "`fence log --follow` prints one event per line, not one JSON object",
            "use --format ndjson (or human) with --follow",
        ));
    }
    let mut interrupts = Interrupts::install()?;
    let mut targets: Vec<(TargetSpec, Option<Box<dyn FencedTarget>>)> =
        resolve_targets(&args.targets, true)?
            .into_iter()
            .map(|spec| (spec, None))
            .collect();
    let patterns: Vec<Pattern> = args.resources.iter().map(|r| Pattern::new(r)).collect();
    let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
    let coordinator = ctx.coordinator().await?;
    // Once: a store or target schema that answers and is missing is a typo, not one that
    // will appear. Later failures (a restart) are waited out, and so is a target that does
    // not answer yet.
    coordinator.require_existing().await?;
    for (spec, target) in targets.iter_mut() {
        if let Ok(connected) = fenced::target::open(spec, &ctx.schema).await {
            connected.require_existing().await?;
            *target = Some(connected);
        }
    }
    let every = match ctx.store.as_ref().map(|s| &s.kind) {
        Some(crate::config::StoreKind::Postgres(_)) => Duration::from_millis(50),
        _ => Duration::from_millis(200),
    };
    let mut expiries = Expiries::default();
    // What was shown within the lag, so that reading it again shows nothing twice.
    let mut seen: HashMap<SeenKey, i64> = HashMap::new();
    let mut newest_ms = args.since;
    let mut failing: HashMap<String, bool> = HashMap::new();
    let mut first = true;
    loop {
        let since = if first {
            args.since
        } else {
            newest_ms.map(|ms| ms - FOLLOW_LAG_MS)
        };
        let query = LogQuery {
            patterns: &patterns,
            since_ms: since,
            until_ms: None,
            limit,
        };
        let mut fresh: Vec<(bool, Logged)> = Vec::new();
        let store = ctx.store_display().unwrap_or_default().to_owned();
        match coordinator.log(&query).await {
            Ok(events) => {
                recovered(&mut failing, &store);
                fresh.extend(events.into_iter().map(|l| (false, l)));
            }
            Err(err) => failed(&mut failing, &store, &err),
        }
        for (spec, target) in targets.iter_mut() {
            let read = match target {
                Some(t) => t.log(&query).await,
                None => match fenced::target::open(spec, &ctx.schema).await {
                    Ok(t) => target.insert(t).log(&query).await,
                    Err(err) => Err(err),
                },
            };
            match read {
                Ok(events) => {
                    recovered(&mut failing, &spec.display);
                    fresh.extend(events.into_iter().map(|mut l| {
                        l.resource = format!("{}\0{}", spec.display, l.resource);
                        (true, l)
                    }));
                }
                Err(err) => {
                    *target = None;
                    failed(&mut failing, &spec.display, &err);
                }
            }
        }
        fresh.retain(|(target, l)| {
            let key = (
                *target,
                l.resource.clone(),
                l.at_us,
                l.event.kind.clone(),
                l.event.owner.clone(),
                l.event.token,
            );
            seen.insert(key, l.event.at_ms).is_none()
        });
        fresh.sort_by_key(|(target, l)| (l.at_us, *target));
        let mut entries = Vec::new();
        for (target, mut logged) in fresh {
            newest_ms = Some(newest_ms.map_or(logged.event.at_ms, |n| n.max(logged.event.at_ms)));
            if target {
                let (display, resource) = logged
                    .resource
                    .split_once('\0')
                    .map(|(d, r)| (d.to_owned(), r.to_owned()))
                    .unwrap_or_default();
                logged.resource = resource;
                entries.push(Entry {
                    source: Source::Target(display),
                    logged,
                    derived: false,
                });
            } else {
                entries.extend(expiries.feed(logged));
            }
        }
        entries.extend(expiries.due(now_ms() - FOLLOW_LAG_MS));
        entries.sort_by_key(|e| (e.logged.at_us, rank(e)));
        if let Some(newest) = newest_ms {
            seen.retain(|_, at| *at >= newest - 2 * FOLLOW_LAG_MS);
        }
        for entry in entries.iter().filter(|e| wanted(args, e)) {
            let line = match out.format {
                Format::Ndjson => entry.json().to_string(),
                _ => crate::terminal::terminal_safe(&entry.line(), false).into_owned(),
            };
            if !out.quiet && output::try_print_line(&line).is_err() {
                // Nobody reads any more (a closed pipe): nothing left to do.
                return Ok(());
            }
        }
        first = false;
        tokio::select! {
            _ = interrupts.next() => return Ok(()),
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Notes a failed read of `source` (a warning the first time).
fn failed(failing: &mut HashMap<String, bool>, source: &str, err: &Error) {
    if !failing.insert(source.to_owned(), true).unwrap_or(false) {
        crate::terminal::warn(&format!(
            "warning: cannot read `{source}` ({err}); trying again"
        ));
    }
}

/// Notes a read of `source` that succeeded (a notice when it had failed).
fn recovered(failing: &mut HashMap<String, bool>, source: &str) {
    if failing.insert(source.to_owned(), false).unwrap_or(false) {
        crate::terminal::warn(&format!("reading `{source}` again"));
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Within one instant: an expiry first (a takeover can only follow it), then the store's
/// events, then the targets'.
pub(super) fn rank(entry: &Entry) -> u8 {
    match (&entry.source, entry.derived) {
        (_, true) => 0,
        (Source::Store, false) => 1,
        (Source::Target(_), false) => 2,
    }
}

/// A lease some grant or renewal set, not yet seen to end.
struct Open {
    owner: Option<String>,
    token: Option<i64>,
    ttl_ms: Option<i64>,
    expires_at_ms: i64,
}

/// The leases the events so far have set and not seen end, by resource.
#[derive(Default)]
pub struct Expiries {
    open: HashMap<String, Open>,
    /// The last expiry shown per resource: a takeover read after `--follow` showed its
    /// expiry (by the clock) must not show it again from the takeover's record of it.
    shown: HashMap<String, i64>,
}

impl Expiries {
    /// The entries for one store event, oldest first: the expiry of the resource's lease when
    /// this event comes after it, then the event.
    pub fn feed(&mut self, logged: Logged) -> Vec<Entry> {
        let mut entries = Vec::new();
        let ev = &logged.event;
        let resource = logged.resource.clone();
        if ev.kind == EventKind::TakenOver && !self.open.contains_key(&resource) {
            if let Some(previous) = ev
                .previous_expires_at_ms
                .filter(|previous| self.shown.get(&resource) != Some(previous))
            {
                self.open.insert(
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
        // The store's own word that the lease was live when this event came: it accepted a
        // renewal of it, or a release it says was of a live lease. The wall clock the event
        // times are read on may have stepped in between (review 21: an hour's step made
        // `fence log` show an expiry and a lease held past its TTL that the store never saw).
        let proven_live = |o: &Open| {
            o.token.is_some()
                && o.token == ev.token
                && match ev.kind {
                    EventKind::Renewed => true,
                    EventKind::Released => ev.live == Some(true),
                    _ => false,
                }
        };
        if ev.kind != EventKind::Pruned
            && self
                .open
                .get(&resource)
                .is_some_and(|o| o.expires_at_ms <= ev.at_ms && !proven_live(o))
        {
            if let Some(lease) = self.open.remove(&resource) {
                self.shown.insert(resource.clone(), lease.expires_at_ms);
                entries.push(expired(&resource, lease));
            }
        }
        match ev.kind {
            EventKind::Acquired
            | EventKind::Reacquired
            | EventKind::TakenOver
            | EventKind::Renewed => match ev.expires_at_ms {
                Some(expires_at_ms) => {
                    self.open.insert(
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
                    self.open.remove(&resource);
                }
            },
            EventKind::Released => {
                self.open.remove(&resource);
            }
            _ => {}
        }
        entries.push(Entry {
            source: Source::Store,
            logged,
            derived: false,
        });
        entries
    }

    /// The expiries at or before `now_ms` not yet shown, by resource name.
    pub fn due(&mut self, now_ms: i64) -> Vec<Entry> {
        let mut due: Vec<String> = self
            .open
            .iter()
            .filter(|(_, o)| o.expires_at_ms <= now_ms)
            .map(|(r, _)| r.clone())
            .collect();
        due.sort();
        due.into_iter()
            .filter_map(|r| {
                let lease = self.open.remove(&r)?;
                self.shown.insert(r.clone(), lease.expires_at_ms);
                Some(expired(&r, lease))
            })
            .collect()
    }
}

fn expired(resource: &str, lease: Open) -> Entry {
    Entry {
        source: Source::Store,
        derived: true,
        logged: Logged {
            resource: resource.to_owned(),
            at_us: lease.expires_at_ms.saturating_mul(1000),
            event: Event {
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
                ..Event::new(EventKind::Expired, lease.expires_at_ms)
            },
        },
    }
}

/// What the timeline itself proves wrong, entry by entry, oldest first: a grant whose token
/// is not above the resource's previous grant's; a release, or a write a target accepted,
/// with a token whose lease had already expired by the store's clock (the holder went on
/// past its TTL). It keeps a token per resource and one instant per expiry seen.
#[derive(Default)]
pub struct Checks {
    granted: HashMap<String, i64>,
    expired: HashMap<(String, i64), i64>,
    pub warnings: Vec<Warning>,
}

impl Checks {
    pub fn feed(&mut self, entry: &Entry) {
        let resource = entry.logged.resource.as_str();
        let ev = &entry.logged.event;
        let Some(token) = ev.token else {
            return;
        };
        match (&ev.kind, &entry.source) {
            (EventKind::Acquired | EventKind::TakenOver, Source::Store) => {
                let before = self.granted.get(resource).copied();
                if let Some(before) = before.filter(|&before| token <= before) {
                    self.warnings.push(Warning {
                        resource: resource.to_owned(),
                        kind: WarningKind::TokenRegressed,
                        message: token_regressed(resource, before, token, ev.at_ms),
                    });
                }
                self.granted
                    .insert(resource.to_owned(), token.max(before.unwrap_or(0)));
            }
            (EventKind::Expired, Source::Store) => {
                self.expired.insert((resource.to_owned(), token), ev.at_ms);
            }
            (EventKind::Released, Source::Store) => {
                if let Some(&at) = self.expired.get(&(resource.to_owned(), token)) {
                    self.warnings.push(Warning {
                        resource: resource.to_owned(),
                        kind: WarningKind::HeldPastTtl,
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
            (EventKind::WriteAccepted, Source::Target(target)) => {
                if let Some(&at) = self.expired.get(&(resource.to_owned(), token)) {
                    self.warnings.push(Warning {
                        resource: resource.to_owned(),
                        kind: WarningKind::HeldPastTtl,
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
/// coordinator), and the real holder's writes are now refused. The message names the
/// recovery, `fence acquire R --above HIGHEST` (its guide: docs/postgres-targets.md).
pub fn target_ahead(
    target: &str,
    resource: &str,
    highest: i64,
    issued: Option<i64>,
) -> Option<String> {
    issued.is_none_or(|issued| highest > issued).then(|| {
        format!(
            "`{target}` has accepted token {highest} for `{resource}`, above any this store issued ({}), so it refuses this store's holders as stale: check that the target is fenced by this store and how that token was written; then raise this store's tokens above it with `{}` and release that lease (docs/postgres-targets.md, \"A token the store never issued\")",
            issued.map_or("none".to_owned(), |t| format!("up to {t}")),
            crate::error::command_for("fence acquire", resource, &format!(" --above {highest}"))
        )
    })
}

/// One event of the JSON and ndjson answers: the keys in this order, the optional ones only
/// where the event has them (`last_at` with `count`, null when unknown; `derived` only when
/// true).
#[derive(Serialize)]
struct EntryJson<'a> {
    at: String,
    resource: &'a str,
    /// `store` or `target`.
    source: &'static str,
    kind: &'a EventKind,
    owner: Option<&'a str>,
    token: Option<i64>,
    /// The target's URL, for a target's event.
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_expires_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rows: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    count: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_at: Option<Option<String>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    derived: bool,
    detail: Option<String>,
    /// A run event's record (`run_started`, `run_finished`, `run_stopped`).
    #[serde(skip_serializing_if = "Option::is_none")]
    run: Option<RunNote>,
}

/// A warning as an ndjson line: `kind` is `warning`, `warning` says which.
#[derive(Serialize)]
struct WarningLine<'a> {
    resource: &'a str,
    kind: &'static str,
    message: &'a str,
    warning: &'static str,
}

/// The last ndjson line of an answer cut by `--limit`.
#[derive(Serialize)]
struct TruncatedLine {
    kind: &'static str,
    message: &'static str,
}

/// The JSON answer: the events, oldest first, and what the history proves wrong.
#[derive(Serialize)]
struct TimelineJson<'a> {
    events: Vec<EntryJson<'a>>,
    truncated: bool,
    integrity_ok: bool,
    warnings: &'a [Warning],
}

impl Entry {
    fn wire(&self) -> EntryJson<'_> {
        let ev = &self.logged.event;
        EntryJson {
            at: time::rfc3339(ev.at_ms),
            resource: &self.logged.resource,
            source: match self.source {
                Source::Store => "store",
                Source::Target(_) => "target",
            },
            kind: &ev.kind,
            owner: ev.owner.as_deref(),
            token: ev.token,
            target: match &self.source {
                Source::Store => None,
                Source::Target(target) => Some(target),
            },
            ttl_ms: ev.ttl_ms,
            expires_at: ev.expires_at_ms.map(time::rfc3339),
            previous_expires_at: ev.previous_expires_at_ms.map(time::rfc3339),
            rows: ev.rows,
            count: ev.count,
            last_at: ev.count.map(|_| ev.last_at_ms.map(time::rfc3339)),
            derived: self.derived,
            detail: shown_detail(ev),
            run: RunNote::of(ev),
        }
    }

    pub(super) fn json(&self) -> Value {
        output::value(&self.wire())
    }

    /// One line for `--follow`: the table's columns, separated by two spaces.
    fn line(&self) -> String {
        let ev = &self.logged.event;
        let mut fields = vec![
            time::rfc3339(ev.at_ms),
            shown(&self.logged.resource),
            self.place(),
            shown(&ev.kind.to_string()),
            shown(ev.owner.as_deref().unwrap_or("-")),
            ev.token
                .map_or_else(|| "-".into(), |t| format!("token {t}")),
        ];
        fields.extend(
            [
                self.lease_text(),
                shown(&shown_detail(ev).unwrap_or_default()),
            ]
            .into_iter()
            .filter(|f| !f.is_empty()),
        );
        fields.join("  ")
    }

    /// The WHERE column: the store, or the target's name (escaped, as every field from a
    /// store is).
    fn place(&self) -> String {
        match &self.source {
            Source::Store => "store".to_owned(),
            Source::Target(target) => shown(target),
        }
    }

    /// The event for a terminal too narrow for the table: time, resource (and where, for a
    /// target's), event, owner and token on one line; the lease and the detail, indented, on
    /// the next.
    pub(super) fn narrow(&self) -> String {
        let ev = &self.logged.event;
        let mut head = vec![time::rfc3339(ev.at_ms), shown(&self.logged.resource)];
        if let Source::Target(_) = &self.source {
            head.push(self.place());
        }
        head.push(shown(&ev.kind.to_string()));
        head.push(shown(ev.owner.as_deref().unwrap_or("-")));
        head.push(
            ev.token
                .map_or_else(|| "-".into(), |t| format!("token {t}")),
        );
        let mut text = head.join("  ");
        text.push('\n');
        for more in [
            self.lease_text(),
            shown(&shown_detail(ev).unwrap_or_default()),
        ] {
            if !more.is_empty() {
                text.push_str(&format!("    {more}\n"));
            }
        }
        text
    }

    /// The LEASE column: the TTL and expiry a grant or renewal set, a takeover's previous
    /// expiry, a write's rows, how many refused attempts a `busy` or `conflict` line stands
    /// for.
    fn lease_text(&self) -> String {
        let ev = &self.logged.event;
        let mut parts = Vec::new();
        if let (Some(ttl), Some(expires)) = (ev.ttl_ms, ev.expires_at_ms) {
            if ev.kind != EventKind::Expired {
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
        if let Some(count) = ev.count {
            parts.push(match (count, ev.last_at_ms) {
                (1, _) | (_, None) => {
                    format!("{count} attempt{}", if count == 1 { "" } else { "s" })
                }
                (_, Some(last)) => format!("{count} attempts, the last at {}", time::rfc3339(last)),
            });
        }
        parts.join("; ")
    }
}

/// A field from a store or a target, for a line or a table cell: every control, bidi and
/// invisible character escaped, a newline included, so that no field can fake a line of
/// fence's own (review 18: an owner with a newline printed a release that never happened).
fn shown(text: &str) -> String {
    crate::terminal::terminal_safe(text, false).into_owned()
}

/// What `--limit` left out, said at the end of the answer.
pub(super) const TRUNCATED: &str =
    "older events in the window were left out: narrow it with --since, or raise --limit";

/// The ndjson lines after the events: the warnings, then whether `--limit` left events out.
pub(super) fn tail_lines(warnings: &[Warning], truncated: bool) -> Vec<Value> {
    let mut lines: Vec<Value> = warnings
        .iter()
        .map(|w| {
            output::value(&WarningLine {
                resource: &w.resource,
                kind: "warning",
                message: &w.message,
                warning: w.kind.as_str(),
            })
        })
        .collect();
    if truncated {
        lines.push(output::value(&TruncatedLine {
            kind: "truncated",
            message: TRUNCATED,
        }));
    }
    lines
}

impl Report for Timeline {
    fn json(&self) -> Map<String, Value> {
        output::fields(&TimelineJson {
            events: self.entries.iter().map(Entry::wire).collect(),
            truncated: self.truncated,
            integrity_ok: self.warnings.is_empty(),
            warnings: &self.warnings,
        })
    }

    fn ndjson(&self) -> Option<Vec<Value>> {
        let mut lines: Vec<Value> = self.entries.iter().map(Entry::json).collect();
        lines.extend(tail_lines(&self.warnings, self.truncated));
        Some(lines)
    }

    fn human(&self) -> String {
        let mut text = String::new();
        if self.entries.is_empty() {
            text.push_str(&format!("no events in store `{}` match\n", self.store));
        } else {
            let mut table = output::table();
            table.set_header([
                "AT", "RESOURCE", "WHERE", "EVENT", "OWNER", "TOKEN", "LEASE", "DETAIL",
            ]);
            output::keep_whole(&mut table, &[0, 2, 3, 5]);
            let dash = || "-".to_owned();
            for e in &self.entries {
                let ev = &e.logged.event;
                table.add_row([
                    time::rfc3339(ev.at_ms),
                    shown(&e.logged.resource),
                    e.place(),
                    shown(&ev.kind.to_string()),
                    ev.owner.as_deref().map_or_else(dash, shown),
                    ev.token.map_or_else(dash, |t| t.to_string()),
                    e.lease_text(),
                    shown(&shown_detail(ev).unwrap_or_default()),
                ]);
            }
            if output::fits(&table) {
                text.push_str(&format!("store `{}`, oldest first:\n{table}\n", self.store));
            } else {
                // Too narrow a terminal for the table: an event per line, its lease and
                // detail indented below it (wrapped by the caller).
                text.push_str(&format!("store `{}`, oldest first:\n", self.store));
                for e in &self.entries {
                    text.push_str(&e.narrow());
                }
            }
        }
        if self.truncated {
            text.push_str(&format!("\n{TRUNCATED}\n"));
        }
        for w in &self.warnings {
            text.push_str(&format!(
                "\nwarning ({}): {}\n",
                w.kind.as_str(),
                shown(&w.message)
            ));
        }
        text
    }
}
