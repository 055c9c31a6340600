//! `fence metrics`: the monitors the fencing literature asks for — lease churn, stale-writer
//! rejections, current holders, waiters and how long they have waited — as Prometheus
//! metrics read from the store's state and history (and targets' write counts).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::cli::MetricsArgs;
use crate::cmd::Context;
use crate::coordinator::{EventKind, Pattern, State};
use crate::error::Error;
use crate::fenced::postgres::PgTarget;
use crate::fenced::TargetSpec;
use crate::metrics::{render, seconds, Family};
use crate::output::{self, Report};

pub struct Metrics {
    families: Vec<Family>,
}

/// The history's event kinds and the counter each is added to.
/// (Other kinds, unknown ones included, are counted by no metric.)
const COUNTED: [(EventKind, &str); 7] = [
    (EventKind::Acquired, "fence_lease_acquisitions_total"),
    (EventKind::TakenOver, "fence_lease_acquisitions_total"),
    (EventKind::TakenOver, "fence_lease_takeovers_total"),
    (EventKind::Renewed, "fence_lease_renewals_total"),
    (EventKind::Released, "fence_lease_releases_total"),
    (EventKind::RenewRejected, "fence_lease_rejections_total"),
    (EventKind::ReleaseRejected, "fence_lease_rejections_total"),
];

pub async fn run(args: MetricsArgs, ctx: &Context) -> Result<Metrics, Error> {
    let targets = args
        .targets
        .iter()
        .map(|url| {
            let spec = TargetSpec::resolve(url)?;
            spec.postgres("`fence metrics --target`")?;
            Ok(spec)
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let patterns: Vec<Pattern> = args.resources.iter().map(|r| Pattern::new(r)).collect();
    let wanted = |name: &str| patterns.is_empty() || patterns.iter().any(|p| p.matches(name));
    let coordinator = ctx.coordinator().await?;
    coordinator.require_existing().await?;
    let views: Vec<_> = coordinator
        .inspect(&[], 0)
        .await?
        .into_iter()
        .filter(|v| wanted(&v.resource))
        .collect();
    let mut counts: BTreeMap<(&str, String, &str), i64> = BTreeMap::new();
    for (resource, kind, n) in coordinator.event_counts().await? {
        if !wanted(&resource) {
            continue;
        }
        for (counted, family) in COUNTED.iter().filter(|(k, _)| *k == kind) {
            let op = match counted {
                EventKind::RenewRejected => "renew",
                EventKind::ReleaseRejected => "release",
                _ => "",
            };
            *counts.entry((family, resource.clone(), op)).or_default() += n;
        }
    }
    let mut acquisitions = Family::counter(
        "fence_lease_acquisitions_total",
        "Grants of a new token (acquired or taken over), from the store's history.",
    );
    let mut takeovers = Family::counter(
        "fence_lease_takeovers_total",
        "Grants that took over another owner's expired lease, from the store's history.",
    );
    let mut renewals = Family::counter(
        "fence_lease_renewals_total",
        "Renewals, from the store's history.",
    );
    let mut releases = Family::counter(
        "fence_lease_releases_total",
        "Releases, from the store's history.",
    );
    let mut rejections = Family::counter(
        "fence_lease_rejections_total",
        "Renewals and releases refused (stale token, expired or released lease), by operation.",
    );
    // Every resource shown has each counter, 0 when its history has none.
    for v in &views {
        for family in [
            &mut acquisitions,
            &mut takeovers,
            &mut renewals,
            &mut releases,
        ] {
            let n = counts
                .get(&(family.name(), v.resource.clone(), ""))
                .copied()
                .unwrap_or(0);
            family.add(&[("resource", &v.resource)], n as f64);
        }
        for op in ["renew", "release"] {
            let n = counts
                .get(&("fence_lease_rejections_total", v.resource.clone(), op))
                .copied()
                .unwrap_or(0);
            rejections.add(&[("resource", &v.resource), ("op", op)], n as f64);
        }
    }
    // Busy refusals: every refused acquisition, where the store records them.
    let mut busy = Family::counter(
        "fence_lease_busy_refusals_total",
        "Acquisitions refused because another owner held the lease (each attempt; a waiter's polls are one), from the store's record of refused attempts (directory store, PostgreSQL; absent for object stores, which do not record them).",
    );
    if let Some(attempts) = coordinator.attempt_counts().await? {
        let mut refused: BTreeMap<&str, i64> = BTreeMap::new();
        for (resource, kind, n) in &attempts {
            if *kind == EventKind::Busy {
                *refused.entry(resource.as_str()).or_default() += n;
            }
        }
        for v in &views {
            let n = refused.get(v.resource.as_str()).copied().unwrap_or(0);
            busy.add(&[("resource", &v.resource)], n as f64);
        }
    }
    let mut held = Family::gauge(
        "fence_lease_held",
        "1 while a live lease is held on the resource, by the store's clock.",
    );
    let mut holder = Family::gauge(
        "fence_lease_holder_info",
        "The owner of the live lease (value 1).",
    );
    let mut token = Family::gauge(
        "fence_lease_token",
        "The highest fencing token the store has issued for the resource.",
    );
    let mut acquired = Family::gauge(
        "fence_lease_acquired_timestamp_seconds",
        "When the live lease's holder was granted it (Unix time, the store's clock): `time() - this` is how long it has held the resource.",
    );
    let mut expires = Family::gauge(
        "fence_lease_expiry_timestamp_seconds",
        "When the live lease expires unless renewed (Unix time, the store's clock).",
    );
    let mut waiters = Family::gauge(
        "fence_lease_waiters",
        "Processes waiting for the resource (`--wait`), where the store knows them.",
    );
    let mut oldest = Family::gauge(
        "fence_lease_oldest_waiter_since_timestamp_seconds",
        "Since when the longest waiter has waited (Unix time).",
    );
    for v in &views {
        let r = [("resource", v.resource.as_str())];
        let live = v.state == State::Held;
        held.add(&r, if live { 1.0 } else { 0.0 });
        if let (true, Some(owner)) = (live, &v.owner) {
            holder.add(&[("resource", &v.resource), ("owner", owner)], 1.0);
        }
        if let Some(t) = v.token {
            token.add(&r, t as f64);
        }
        if let (true, Some(at)) = (live, v.acquired_at_ms) {
            acquired.add(&r, seconds(at));
        }
        if let (true, Some(at)) = (live, v.expires_at_ms) {
            expires.add(&r, seconds(at));
        }
        waiters.add(&r, v.waiters.len() as f64);
        if let Some(since) = v.waiters.iter().map(|w| w.since_ms).min() {
            oldest.add(&r, seconds(since));
        }
    }
    let mut accepted = Family::counter(
        "fence_fenced_writes_total",
        "Fenced writes the target accepted, by target and resource.",
    );
    let mut refused = Family::counter(
        "fence_stale_writes_rejected_total",
        "Writes the target refused for a stale token, by target and resource.",
    );
    for spec in &targets {
        let target = PgTarget::connect(spec, &ctx.schema).await?;
        target.require_existing().await?;
        let guards = target.guards(&[]).await?;
        for g in guards.iter().filter(|g| wanted(&g.resource)) {
            let labels = [("target", spec.display.as_str()), ("resource", &g.resource)];
            accepted.add(&labels, g.accepted_writes as f64);
            refused.add(&labels, g.rejected_writes as f64);
        }
    }
    Ok(Metrics {
        families: vec![
            acquisitions,
            takeovers,
            renewals,
            releases,
            rejections,
            busy,
            held,
            holder,
            token,
            acquired,
            expires,
            waiters,
            oldest,
            accepted,
            refused,
        ],
    })
}

/// One sample of the JSON answer (`metrics[]`): its family, its labels in their order, and
/// its value (a float, as in the exposition).
#[derive(Serialize)]
struct SampleJson<'a> {
    name: &'a str,
    labels: Labels<'a>,
    value: f64,
}

/// A sample's labels as one JSON object, in the order the family gives them.
struct Labels<'a>(&'a [(&'static str, String)]);

impl Serialize for Labels<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

impl Report for Metrics {
    fn json(&self) -> Map<String, Value> {
        #[derive(Serialize)]
        struct Json<'a> {
            metrics: Vec<SampleJson<'a>>,
        }
        let metrics = self
            .families
            .iter()
            .flat_map(|f| {
                f.samples().iter().map(|(labels, value)| SampleJson {
                    name: f.name(),
                    labels: Labels(labels),
                    value: *value,
                })
            })
            .collect();
        output::fields(&Json { metrics })
    }

    fn human(&self) -> String {
        render(&self.families)
    }

    /// Label values carry what the store holds (an owner may hold any character but NUL);
    /// the exposition escapes only `\`, `"` and newlines, so anything else must reach the
    /// scraper as stored.
    fn machine_text(&self) -> bool {
        true
    }
}
