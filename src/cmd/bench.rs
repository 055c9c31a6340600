//! `fence bench`: measure a store as a user would before choosing a TTL or a coordinator.
//!
//! Workers run in threads of this process, each with its own runtime and connection (the
//! coordinators are single-connection, single-thread objects). Timings use the monotonic
//! clock of this one process, so hand-off latency (one holder's release sent → the next
//! holder's grant received) needs no clock comparison. Nothing here is asserted in tests;
//! the tests check arguments and the JSON shape only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::cli::{BenchArgs, BenchMode};
use crate::cmd::{wait, Context};
use crate::config::StoreSpec;
use crate::coordinator::{self, LeaseRef};
use crate::error::Error;
use crate::fenced::postgres::{PgTarget, TxWrite};
use crate::output::{self, Output, Report};
use crate::signals::Interrupts;
use crate::sys::random_u64;

/// The fenced `SELECT 1` of a bench worker never takes anywhere near this long.
const BENCH_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
use crate::fenced::TargetSpec;

pub struct Benched {
    mode: BenchMode,
    workers: u32,
    resources: u32,
    prefilled: bool,
    /// PostgreSQL: `--held-waiters`, as the scratch schema was set to (`None`: not given).
    held_waiters: Option<i64>,
    elapsed: Duration,
    totals: Stats,
}

#[derive(Default)]
struct Stats {
    sections: u64,
    refused: u64,
    renewals: u64,
    stale: u64,
    acquire_us: Vec<u64>,
    handoff_us: Vec<u64>,
}

impl Stats {
    fn merge(&mut self, other: Stats) {
        self.sections += other.sections;
        self.refused += other.refused;
        self.renewals += other.renewals;
        self.stale += other.stale;
        self.acquire_us.extend(other.acquire_us);
        self.handoff_us.extend(other.handoff_us);
    }
}

/// Everything a worker thread needs (owned: it outlives no borrow).
#[derive(Clone)]
struct Plan {
    spec: StoreSpec,
    schema: String,
    target: Option<TargetSpec>,
    mode: BenchMode,
    resources: u32,
    ttl: Duration,
    hold: Duration,
    renew: bool,
    duration: Duration,
    /// Every worker connects first; timing starts when all are ready (or none, when one
    /// could not start).
    gate: Arc<Gate>,
    /// Set when the bench must end early (a worker failed, or fence was asked to stop).
    stop: Arc<AtomicBool>,
    /// When the last holder of the hot resource sent its release.
    last_release: Arc<Mutex<Option<Instant>>>,
}

/// A stop signal ended the bench (its scratch namespace is removed before this is reported).
fn interrupted(name: &str) -> Error {
    Error::unavailable(
        format!("interrupted by {name}; the bench stopped early"),
        "its scratch namespace was removed; run it again",
    )
}

pub async fn run(args: BenchArgs, ctx: &Context, out: &Output) -> Result<Benched, Error> {
    let base = ctx
        .store
        .clone()
        .ok_or_else(|| Error::internal("no store", "report this bug"))?;
    let target = args
        .write_target
        .as_deref()
        .map(TargetSpec::resolve)
        .transpose()?;
    if args.prefill && args.mode != BenchMode::Spread {
        return Err(Error::usage(
            "--prefill creates the resources of `--mode spread`; the other modes use one",
            "add --mode spread, or drop --prefill",
        ));
    }
    // Stop signals are caught before the scratch namespace exists: one that arrives at any
    // moment from here on ends the bench with the namespace removed (during set-up, once
    // set-up is done).
    let mut interrupts = Interrupts::install();
    let (spec, schema) = coordinator::scratch::scratch(&base)?;
    // Create the scratch schema once, so that workers do not all race to create it.
    let held_waiters = args.held_waiters;
    let created = match coordinator::open(&spec, &schema).await {
        Ok(store) => match store.init().await {
            Ok(_) => match held_waiters {
                Some(most) => store.set_held_waiters(most).await,
                None => Ok(()),
            },
            Err(err) => Err(err),
        },
        Err(err) => Err(err),
    };
    if let Err(err) = created {
        coordinator::scratch::remove(&spec, &schema, target_database(target.as_ref())).await?;
        return Err(err);
    }
    if args.prefill {
        let spinner = out.spinner();
        if let Some(spinner) = &spinner {
            spinner.set_message(format!("creating {} resources", args.resources));
        }
        let filled = coordinator::scratch::prefill(&spec, &schema, args.resources).await;
        if let Some(spinner) = spinner {
            spinner.finish_and_clear();
        }
        if let Err(err) = filled {
            coordinator::scratch::remove(&spec, &schema, target_database(target.as_ref())).await?;
            return Err(err);
        }
    }
    if let Some(name) = interrupts.as_mut().ok().and_then(Interrupts::pending) {
        coordinator::scratch::remove(&spec, &schema, target_database(target.as_ref())).await?;
        return Err(interrupted(name));
    }
    let plan = Plan {
        spec: spec.clone(),
        schema: schema.clone(),
        target: target.clone(),
        mode: args.mode,
        resources: if args.mode == BenchMode::Spread {
            args.resources
        } else {
            1
        },
        ttl: args.ttl,
        hold: if args.mode == BenchMode::Handoff {
            args.hold
        } else {
            Duration::ZERO
        },
        renew: args.renew,
        duration: args.duration,
        gate: Arc::new(Gate::default()),
        stop: Arc::new(AtomicBool::new(false)),
        last_release: Arc::new(Mutex::new(None)),
    };
    let spinner = out.spinner();
    if let Some(spinner) = &spinner {
        spinner.set_message(format!(
            "benchmarking {} for {}",
            spec.display,
            crate::time::duration(args.duration)
        ));
    }
    // Workers that cannot start (no threads, no file descriptors) fail the bench at once, and
    // a stop signal ends it early; either way the scratch namespace is removed below.
    let mut handles = Vec::new();
    let mut failure = None;
    for i in 0..args.workers {
        let plan = plan.clone();
        match std::thread::Builder::new().spawn(move || worker(i, plan)) {
            Ok(handle) => handles.push(handle),
            Err(err) => {
                failure = Some(Error::internal(
                    format!("cannot start bench worker {i}: {err}"),
                    "lower --workers (or raise the process's limits)",
                ));
                break;
            }
        }
    }
    let started = plan.gate.open_when(handles.len(), failure.is_none());
    if !started {
        plan.stop.store(true, Ordering::SeqCst);
    }
    let start = Instant::now();
    let stop = plan.stop.clone();
    let joined = tokio::task::spawn_blocking(move || {
        handles
            .into_iter()
            .map(|handle| handle.join())
            .collect::<Vec<_>>()
    });
    tokio::pin!(joined);
    let results = loop {
        let signal = async {
            match interrupts.as_mut() {
                Ok(interrupts) => Some(interrupts.next().await.1),
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            results = &mut joined => break results,
            Some(name) = signal => {
                stop.store(true, Ordering::SeqCst);
                failure.get_or_insert(interrupted(name));
            }
        }
    };
    let mut totals = Stats::default();
    for result in results.unwrap_or_default() {
        match result {
            Ok(Ok(stats)) => totals.merge(stats),
            Ok(Err(err)) => {
                failure.get_or_insert(err);
            }
            Err(_) => {
                failure.get_or_insert(Error::internal(
                    "a bench worker panicked",
                    "report this bug",
                ));
            }
        }
    }
    let elapsed = start.elapsed();
    if let Some(spinner) = spinner {
        spinner.finish_and_clear();
    }
    coordinator::scratch::remove(&spec, &schema, target_database(target.as_ref())).await?;
    if let Some(err) = failure {
        return Err(err);
    }
    Ok(Benched {
        mode: args.mode,
        workers: args.workers,
        resources: plan.resources,
        prefilled: args.prefill,
        held_waiters,
        elapsed,
        totals,
    })
}

fn worker(index: u32, plan: Plan) -> Result<Stats, Error> {
    let runtime = match crate::sys::build_runtime() {
        Ok(runtime) => runtime,
        Err(cause) => {
            plan.gate.arrive(false);
            return Err(Error::internal(
                format!("cannot start bench worker {index}: {cause}"),
                "lower --workers (or raise the open-file limit, `ulimit -n`)",
            ));
        }
    };
    runtime.block_on(async move {
        let connected = async {
            let coordinator = coordinator::open(&plan.spec, &plan.schema).await?;
            let target = match &plan.target {
                Some(spec) => Some((
                    PgTarget::connect(spec, &plan.schema).await?,
                    Interrupts::install()?,
                )),
                None => None,
            };
            Ok::<_, Error>((coordinator, target))
        }
        .await;
        let go = plan.gate.arrive(connected.is_ok());
        let (coordinator, mut target) = connected?;
        if !go {
            return Ok(Stats::default());
        }
        let end = Instant::now() + plan.duration;
        let owner = format!("bench-{}-{index}", std::process::id());
        let mut stats = Stats::default();
        let waiting = plan.mode != BenchMode::Spread;
        while Instant::now() < end && !plan.stop.load(Ordering::SeqCst) {
            let resource = format!("bench-{}", random_u64() % u64::from(plan.resources));
            let asked = Instant::now();
            // Contended modes block as `--wait` does (until the run ends); spread is refused.
            let wait = waiting.then(|| end.saturating_duration_since(asked));
            let grant = match wait::acquire_counting(
                coordinator.as_ref(),
                &resource,
                &owner,
                plan.ttl,
                wait,
                None,
                &mut stats.refused,
            )
            .await
            {
                Ok(grant) => grant,
                Err(Error::Busy { .. } | Error::WaitedOut { .. }) => continue,
                Err(err) => return Err(err),
            };
            let granted = Instant::now();
            stats
                .acquire_us
                .push(granted.duration_since(asked).as_micros() as u64);
            if waiting {
                if let Some(released) = plan.last_release.lock().map_err(poisoned)?.take() {
                    stats
                        .handoff_us
                        .push(granted.saturating_duration_since(released).as_micros() as u64);
                }
            }
            let lease = LeaseRef {
                resource: resource.clone(),
                owner: owner.clone(),
                token: grant.lease.token,
            };
            if let Some((target, interrupts)) = &mut target {
                let write = TxWrite {
                    resource: &resource,
                    token: lease.token,
                    owner: &owner,
                    write_id: None,
                    sql: "SELECT 1",
                    timeout: BENCH_WRITE_TIMEOUT,
                };
                target.write_transaction(&write, interrupts).await?;
            }
            if plan.renew {
                coordinator.renew(&lease, Some(plan.ttl)).await?;
                stats.renewals += 1;
            }
            if !plan.hold.is_zero() {
                tokio::time::sleep(plan.hold).await;
            }
            if waiting {
                *plan.last_release.lock().map_err(poisoned)? = Some(Instant::now());
            }
            match coordinator.release(&lease).await {
                Ok(_) => stats.sections += 1,
                Err(Error::Stale { .. }) => stats.stale += 1,
                Err(err) => return Err(err),
            }
        }
        Ok(stats)
    })
}

/// Where the workers wait for each other before timing starts: each arrives (saying whether it
/// is ready) and waits; the main thread opens the gate once every started worker arrived, and
/// tells them to go only if all were ready.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: std::sync::Condvar,
}

#[derive(Default)]
struct GateState {
    arrived: usize,
    all_ready: bool,
    failed: bool,
    open: bool,
}

impl Gate {
    /// A worker arrives; returns whether to run (false: another could not start).
    fn arrive(&self, ready: bool) -> bool {
        let Ok(mut state) = self.state.lock() else {
            return false;
        };
        state.arrived += 1;
        state.failed |= !ready;
        self.changed.notify_all();
        while !state.open {
            state = match self.changed.wait(state) {
                Ok(state) => state,
                Err(_) => return false,
            };
        }
        state.all_ready
    }

    /// Waits for `workers` arrivals, opens the gate; true when all were ready and `ok`.
    fn open_when(&self, workers: usize, ok: bool) -> bool {
        let Ok(mut state) = self.state.lock() else {
            return false;
        };
        while state.arrived < workers {
            state = match self.changed.wait(state) {
                Ok(state) => state,
                Err(_) => return false,
            };
        }
        state.all_ready = ok && !state.failed;
        state.open = true;
        self.changed.notify_all();
        state.all_ready
    }
}

fn poisoned<T>(_: T) -> Error {
    Error::internal("a bench worker panicked", "report this bug")
}

fn percentile(values: &mut [u64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let rank = ((p / 100.0) * (values.len() - 1) as f64).round() as usize;
    Some(values[rank] as f64 / 1000.0)
}

/// What a bench measured, in the order JSON and the table show it: counts, rates per second
/// and latencies in milliseconds (rounded to the microsecond; null without a sample).
#[derive(Serialize)]
struct Figures {
    critical_sections: u64,
    critical_sections_per_s: f64,
    refused: u64,
    refused_per_s: f64,
    acquire_p50_ms: Option<f64>,
    acquire_p99_ms: Option<f64>,
    handoff_p50_ms: Option<f64>,
    handoff_p99_ms: Option<f64>,
    renewals: u64,
    stale_rejections: u64,
}

impl Benched {
    fn figures(&self) -> Figures {
        let secs = self.elapsed.as_secs_f64().max(f64::EPSILON);
        let mut acquire = self.totals.acquire_us.clone();
        let mut handoff = self.totals.handoff_us.clone();
        let round = |v: f64| (v * 1000.0).round() / 1000.0;
        Figures {
            critical_sections: self.totals.sections,
            critical_sections_per_s: round(self.totals.sections as f64 / secs),
            refused: self.totals.refused,
            refused_per_s: round(self.totals.refused as f64 / secs),
            acquire_p50_ms: percentile(&mut acquire, 50.0).map(round),
            acquire_p99_ms: percentile(&mut acquire, 99.0).map(round),
            handoff_p50_ms: percentile(&mut handoff, 50.0).map(round),
            handoff_p99_ms: percentile(&mut handoff, 99.0).map(round),
            renewals: self.totals.renewals,
            stale_rejections: self.totals.stale,
        }
    }

    fn mode_name(&self) -> &'static str {
        match self.mode {
            BenchMode::Contend => "contend",
            BenchMode::Spread => "spread",
            BenchMode::Handoff => "handoff",
        }
    }
}

impl Report for Benched {
    fn json(&self) -> Map<String, Value> {
        #[derive(Serialize)]
        struct Json {
            mode: &'static str,
            workers: u32,
            resources: u32,
            prefilled: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            held_waiters: Option<i64>,
            duration_ms: u64,
            #[serde(flatten)]
            figures: Figures,
        }
        output::fields(&Json {
            mode: self.mode_name(),
            workers: self.workers,
            resources: self.resources,
            prefilled: self.prefilled,
            held_waiters: self.held_waiters,
            duration_ms: self.elapsed.as_millis() as u64,
            figures: self.figures(),
        })
    }

    fn human(&self) -> String {
        let mut table = output::table();
        table.set_header(["MEASURE", "VALUE"]);
        for (name, value) in output::fields(&self.figures()) {
            let shown = match value {
                Value::Null => "-".to_owned(),
                other => other.to_string(),
            };
            table.add_row([name.replace('_', " "), shown]);
        }
        format!(
            "{} mode, {} workers, {} resource(s){}{}, {:.1}s\n{table}\n",
            self.mode_name(),
            self.workers,
            self.resources,
            if self.prefilled { " (prefilled)" } else { "" },
            self.held_waiters
                .map(|most| format!(", up to {most} waiters keeping a connection"))
                .unwrap_or_default(),
            self.elapsed.as_secs_f64()
        )
    }
}

/// The PostgreSQL write target's URL and display form, whose scratch schema goes with the
/// store's.
fn target_database(target: Option<&TargetSpec>) -> Option<(&str, &str)> {
    target.map(|t| (t.url.as_str(), t.display.as_str()))
}
