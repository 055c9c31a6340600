//! Token monotonicity under churn (issue 2, point 2; DESIGN I1): 16 concurrent acquirers with
//! their own connections hammer one resource with 10 ms leases for several seconds, releasing
//! some leases and letting others expire. The coordinator's durable history must show every
//! grant with a token strictly greater than the grant before it, and exactly the grants the
//! clients were told about.
//!
//! The same with waiters (`--wait`): every worker blocks until granted, through PostgreSQL's
//! queue of waiters or the directory store's polling, while abandoned leases expire under it;
//! each worker must get its turns.
//!
//! The workers drive the library's coordinators in-process, because a 10 ms lease is below
//! the CLI's 100 ms minimum TTL and process start-up would dominate the timing. The workers
//! that acquire once call the coordinator's grant itself, the protocol under test: what
//! `fence acquire` adds on top (a grant whose answer came after half its TTL is renewed, one
//! that came after all of it is `arrived_late`; `regression/late_grants.rs`) would turn most
//! 10 ms grants on a loaded machine into renewals and errors. The waiting workers run what
//! `--wait` runs, that check included, with the CLI's shortest TTL where the profile's is
//! shorter.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{Backend, Store};
use fence::config::StoreSpec;
use fence::error::Error;

const WORKERS: usize = 16;
/// Run at least this long, and until at least MIN_GRANTS grants and the profile's minimum of
/// releases (a slow disk makes every synchronous commit slow; LocalStack under a loaded
/// suite made 15 grants and 2 releases in 28 s), but never longer than GIVE_UP.
const RUN_FOR: Duration = Duration::from_secs(4);
const MIN_GRANTS: usize = 100;
const GIVE_UP: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_millis(10);
/// The shortest `--ttl` the CLI takes.
const CLI_MIN_TTL: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Tally {
    /// Tokens of fresh grants (not reacquisitions), in the order this worker got them.
    granted: Vec<i64>,
    reacquired: usize,
    busy: usize,
    released: usize,
}

/// How hard a backend is churned. The PostgreSQL and directory stores decide in well under a
/// millisecond, so 10 ms leases expire between attempts. The object stores take several HTTP
/// round trips per decision (and lose races to each other), so their leases are longer:
/// on GCS 200 ms; on S3 500 ms, which others see live for up to 2.5 s, because S3 stamps
/// versions to the whole second and fence counts that second in the holder's favour (and
/// moto, a Python server, needs the slack: a release must land before the lease expires).
struct Profile {
    ttl: Duration,
    /// How long an abandoned lease stays away: past its expiry by the store's clock.
    abandon: Duration,
    run_for: Duration,
    /// The longest random pause between a worker's attempts (moto, a Python server, slows to
    /// a crawl when 16 workers poll it back to back).
    pause: Duration,
    min_grants: usize,
    min_paths: usize,
}

fn profile(backend: Backend) -> Profile {
    match backend {
        Backend::S3 | Backend::LocalStack => Profile {
            ttl: Duration::from_millis(500),
            abandon: Duration::from_millis(2_600),
            run_for: Duration::from_secs(6),
            pause: Duration::from_millis(500),
            min_grants: 15,
            min_paths: 3,
        },
        Backend::Gcs => Profile {
            ttl: Duration::from_millis(200),
            abandon: Duration::from_millis(400),
            run_for: RUN_FOR,
            pause: Duration::from_millis(3),
            min_grants: 40,
            min_paths: 5,
        },
        _ => Profile {
            ttl: TTL,
            abandon: TTL * 2,
            run_for: RUN_FOR,
            pause: Duration::from_millis(3),
            min_grants: MIN_GRANTS,
            min_paths: 10,
        },
    }
}

/// How long a waiting worker waits at most for one grant.
const WAIT: Duration = Duration::from_secs(10);

struct Run {
    spec: StoreSpec,
    schema: String,
    start: Instant,
    grants: Arc<AtomicUsize>,
    /// Releases by every worker: the run goes on until each path reached its minimum.
    released: Arc<AtomicUsize>,
    profile: Arc<Profile>,
    /// Acquire as `--wait` does, rather than once.
    waiting: bool,
}

fn worker(index: usize, run: Run) -> Tally {
    let Run {
        spec,
        schema,
        start,
        grants,
        released,
        profile,
        waiting,
    } = run;
    common::block_on(async move {
        let coordinator = fence::coordinator::open(&spec, &schema)
            .await
            .expect("open the store");
        let owner = format!("worker-{index}");
        // `--wait` with the shortest TTL the CLI takes (see the module's documentation).
        let (ttl, abandon) = if waiting {
            let ttl = profile.ttl.max(CLI_MIN_TTL);
            (ttl, profile.abandon.max(ttl * 2))
        } else {
            (profile.ttl, profile.abandon)
        };
        let mut rng =
            0x9e37_79b9_7f4a_7c15_u64 ^ (index as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut tally = Tally::default();
        let more = || {
            let elapsed = start.elapsed();
            elapsed < GIVE_UP
                && (elapsed < profile.run_for
                    || grants.load(Ordering::Relaxed) < profile.min_grants
                    || released.load(Ordering::Relaxed) < profile.min_paths)
        };
        while more() {
            let mut refused = 0;
            let acquired = if waiting {
                fence::cmd::wait::acquire_counting(
                    coordinator.as_ref(),
                    "hot",
                    &owner,
                    ttl,
                    Some(WAIT),
                    None,
                    &mut refused,
                )
                .await
            } else {
                coordinator.grant("hot", &owner, ttl, None).await
            };
            tally.busy += refused as usize;
            match acquired {
                Ok(grant) if grant.reacquired => tally.reacquired += 1,
                Ok(grant) => {
                    grants.fetch_add(1, Ordering::Relaxed);
                    tally.granted.push(grant.lease.token);
                    if next() % 2 == 1 {
                        // Abandon the lease (as a crashed or paused owner would): stay away
                        // until it has expired, so another worker takes it over.
                        tokio::time::sleep(abandon).await;
                    } else {
                        let lease = fence::coordinator::LeaseRef {
                            resource: "hot".into(),
                            owner: owner.clone(),
                            token: grant.lease.token,
                        };
                        match coordinator.release(&lease).await {
                            Ok(_) => {
                                tally.released += 1;
                                released.fetch_add(1, Ordering::Relaxed);
                            }
                            // Our 10 ms lease may already have been taken over.
                            Err(Error::Stale { .. }) => {}
                            Err(err) => panic!("release failed: {err}"),
                        }
                    }
                }
                // Granted while waiting, but the answer came after the lease had run out by
                // fence's reckoning (a loaded machine), and the renewal sent then found it
                // expired or taken over: the client was told the token, in the error (a second
                // time when it was the owner's own lease, reacquired). The
                // store may count it live a little longer, so the worker stays away until it
                // has expired, as after abandoning one: asking at once would reacquire it.
                Err(Error::LeaseLost { token, .. }) if waiting => {
                    if tally.granted.last() != Some(&token) {
                        tally.granted.push(token);
                    }
                    tokio::time::sleep(abandon).await;
                }
                Err(Error::Busy { .. } | Error::WaitedOut { .. }) if waiting => {
                    panic!("no turn within {WAIT:?}")
                }
                Err(Error::Busy { .. }) => tally.busy += 1,
                Err(err) => panic!("acquire failed: {err} ({:?})", err.exit()),
            }
            let pause = profile.pause.as_micros() as u64;
            tokio::time::sleep(Duration::from_micros(next() % pause)).await;
        }
        tally
    })
}

fn churn(store: &Store, waiting: bool) {
    // The workers run in this process: give it the store's credentials and endpoint (nextest
    // runs every test in a process of its own).
    if let Some((server, _)) = &store.objects {
        for (key, value) in server.env() {
            std::env::set_var(key, value);
        }
    }
    let spec = StoreSpec::resolve(Some(&store.url)).unwrap();
    let schema = store.schema.clone().unwrap_or_else(|| "fence".into());
    let start = Instant::now();
    let grants = Arc::new(AtomicUsize::new(0));
    let released = Arc::new(AtomicUsize::new(0));
    let tallies: Vec<Tally> = (0..WORKERS)
        .map(|i| {
            let run = Run {
                spec: spec.clone(),
                schema: schema.clone(),
                start,
                grants: grants.clone(),
                released: released.clone(),
                profile: Arc::new(profile(store.backend)),
                waiting,
            };
            thread::spawn(move || worker(i, run))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("worker panicked"))
        .collect();

    // The durable record, in the coordinator's serialisation order.
    let events = store.events("hot");
    let durable: Vec<i64> = events
        .iter()
        .filter(|(kind, _, _)| kind == "acquired" || kind == "taken_over")
        .map(|(_, _, token)| token.unwrap())
        .collect();
    for pair in durable.windows(2) {
        assert!(
            pair[1] > pair[0],
            "token went from {} to {} in the durable history",
            pair[0],
            pair[1]
        );
    }
    let mut seen: Vec<i64> = tallies
        .iter()
        .flat_map(|t| t.granted.iter().copied())
        .collect();
    seen.sort_unstable();
    assert_eq!(
        seen, durable,
        "the clients were told exactly the durable grants"
    );
    for tally in &tallies {
        assert!(
            tally.granted.windows(2).all(|p| p[1] > p[0]),
            "a worker saw its tokens go down"
        );
        assert!(
            !waiting || !tally.granted.is_empty(),
            "a waiting worker never got a turn"
        );
    }

    let takeovers = events
        .iter()
        .filter(|(kind, _, _)| kind == "taken_over")
        .count();
    let busy: usize = tallies.iter().map(|t| t.busy).sum();
    let released: usize = tallies.iter().map(|t| t.released).sum();
    let reacquired: usize = tallies.iter().map(|t| t.reacquired).sum();
    eprintln!(
        "{:?}{}: {} grants, {takeovers} after expiry, {released} released, {reacquired} reacquired, {busy} busy in {:?}",
        store.backend,
        if waiting { " (waiting)" } else { "" },
        durable.len(),
        start.elapsed()
    );
    let profile = profile(store.backend);
    assert!(
        durable.len() >= profile.min_grants,
        "too little churn in {GIVE_UP:?}: {}",
        durable.len()
    );
    assert!(
        takeovers >= profile.min_paths && busy >= 10 && released >= profile.min_paths,
        "every path must be exercised"
    );
    let (_, token, _) = store.lease("hot").unwrap();
    assert_eq!(Some(&token), durable.last());
}

#[test]
fn churn_on_the_file_store() {
    churn(&Store::new(Backend::File), false);
}

#[test]
fn churn_on_postgres() {
    churn(&Store::new(Backend::Postgres), false);
}

#[test]
fn churn_on_postgres_with_synchronous_commit_off_by_default() {
    churn(&Store::new(Backend::PostgresAsync), false);
}

#[test]
fn churn_on_s3() {
    churn(&Store::new(Backend::S3), false);
}

#[test]
fn churn_on_localstack() {
    churn(&Store::new(Backend::LocalStack), false);
}

#[test]
fn churn_on_gcs() {
    churn(&Store::new(Backend::Gcs), false);
}

#[test]
fn waiters_churn_on_the_file_store() {
    churn(&Store::new(Backend::File), true);
}

#[test]
fn waiters_churn_on_postgres() {
    churn(&Store::new(Backend::Postgres), true);
}
