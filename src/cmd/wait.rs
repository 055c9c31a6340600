//! Acquire, waiting while busy (`--wait`): shared by `acquire` and `run`.
//!
//! A waiter sleeps until the holder's lease would expire, until the store pushes a release,
//! or until a short jittered poll (stores without pushed wake-ups), whichever comes first. A
//! refused attempt never touches the lease (no lock, no write), so many waiters cost the
//! holder nothing; a waiter is recorded as one attempt however often it polls (`fence log`).
//! The jitter keeps waiters from retrying in lockstep.
//!
//! On PostgreSQL waiters join a durable queue before their first attempt and are granted in
//! arrival order; the coordinator decides how long each sleeps and whether it keeps its
//! connection (only the two at the head do, and they listen for releases; see
//! `coordinator/postgres/queue.rs`). Elsewhere no order is promised: the first waiter to retry after a
//! release wins. Nowhere is a free resource reserved for the waiters: a plain `acquire`
//! (without `--wait`) asking at that moment can be granted first.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tokio::time::Instant;

use crate::coordinator::{Coordinator, Grant};
use crate::error::Error;
use crate::output::Output;
use crate::sys::random_u64;
use crate::time;

/// The fallback poll when wake-ups are pushed.
const PUSHED_FALLBACK: Duration = Duration::from_millis(1000);
/// The longest a queued waiter is left to sleep at once (its coordinator sleeps less).
const QUEUED_MAX_NAP: Duration = Duration::from_secs(3600);
/// The first and the longest poll interval on stores without pushed wake-ups.
const POLL_MIN: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(250);
/// The longest pause between attempts while the store answers "unavailable" (429, 503).
const UNAVAILABLE_MAX: Duration = Duration::from_secs(2);

pub async fn acquire(
    coordinator: &dyn Coordinator,
    resource: &str,
    owner: &str,
    ttl: Duration,
    wait: Option<Duration>,
    out: &Output,
) -> Result<Grant, Error> {
    acquire_sent(coordinator, resource, owner, ttl, wait, out)
        .await
        .map(|(grant, _)| grant)
}

/// [`acquire`], also telling when the attempt that was granted was sent: the coordinator
/// extended the lease at or after that instant, so a lease bound measured from there never
/// outlives the coordinator's own expiry (`run` measures from it), however long the wait.
pub async fn acquire_sent(
    coordinator: &dyn Coordinator,
    resource: &str,
    owner: &str,
    ttl: Duration,
    wait: Option<Duration>,
    out: &Output,
) -> Result<(Grant, Instant), Error> {
    let mut sent = Instant::now();
    let grant = waiting(
        coordinator,
        resource,
        owner,
        ttl,
        wait,
        Some(out),
        &mut 0,
        &mut sent,
    )
    .await?;
    // The coordinator knows more closely when the request that made the grant was sent, and
    // moves it earlier by any suspend of the machine meanwhile (`Leases::kept_in_time`): taken
    // as it is, never the later of the two.
    let sent = grant.sent.unwrap_or(sent);
    Ok((grant, sent))
}

/// [`acquire`], counting refused attempts in `refused`; a spinner only with `out`.
pub async fn acquire_counting(
    coordinator: &dyn Coordinator,
    resource: &str,
    owner: &str,
    ttl: Duration,
    wait: Option<Duration>,
    out: Option<&Output>,
    refused: &mut u64,
) -> Result<Grant, Error> {
    let mut sent = Instant::now();
    waiting(
        coordinator,
        resource,
        owner,
        ttl,
        wait,
        out,
        refused,
        &mut sent,
    )
    .await
}

/// [`acquire_counting`], setting `sent` to when the last attempt was sent.
#[allow(clippy::too_many_arguments)]
async fn waiting(
    coordinator: &dyn Coordinator,
    resource: &str,
    owner: &str,
    ttl: Duration,
    wait: Option<Duration>,
    out: Option<&Output>,
    refused: &mut u64,
    sent: &mut Instant,
) -> Result<Grant, Error> {
    let started = Instant::now();
    let deadline = wait.and_then(|wait| started.checked_add(wait));
    let queued = wait.is_some() && coordinator.queue_up(resource, owner, deadline);
    *sent = Instant::now();
    let first = coordinator.acquire(resource, owner, ttl).await;
    let Some(wait) = wait else {
        return first;
    };
    let mut holder = match first {
        Err(Error::Busy { holder, .. }) => holder,
        other => {
            if queued && other.is_err() {
                // Best effort: an unpolled row is deleted once its deadline passes anyway.
                let _ = coordinator.unwait(resource).await;
            }
            return other;
        }
    };
    *refused += 1;
    if wait.is_zero() {
        let _ = coordinator.unwait(resource).await;
        return Err(Error::Busy {
            resource: resource.to_owned(),
            holder,
        });
    }
    if !queued {
        coordinator.wait_begin(resource, owner).await?;
    }
    let spinner = out.and_then(Output::spinner);
    // Without handlers (no descriptors left), a signal ends fence as by default.
    let mut interrupts = crate::signals::Interrupts::install().ok();
    let mut poll = POLL_MIN;
    let mut warned_unavailable = false;
    // Grows while the store answers "unavailable", back to nothing on any other answer.
    let mut backoff = Duration::ZERO;
    let result = loop {
        if let Some(spinner) = &spinner {
            spinner.set_message(format!(
                "waiting for `{resource}`: held by `{}` with token {} ({}); waited {}",
                holder.owner,
                holder.token,
                time::expires_in(holder.expires_in_ms),
                time::span(started.elapsed().as_millis() as i64)
            ));
        }
        let mut nap = if queued {
            // The queue's coordinator paces its waiters itself.
            QUEUED_MAX_NAP
        } else {
            let until_expiry = Duration::from_millis(holder.expires_in_ms.max(0) as u64);
            let fallback = if coordinator.pushes_wakeups() {
                PUSHED_FALLBACK
            } else {
                poll = (poll * 2).min(POLL_MAX);
                poll
            };
            let jitter = Duration::from_micros(random_u64() % 5_000);
            until_expiry.min(fallback).max(backoff) + jitter
        };
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(Error::WaitedOut {
                    resource: resource.to_owned(),
                    holder,
                    waited_ms: started.elapsed().as_millis() as i64,
                });
            }
            nap = nap.min(left);
        }
        // A stop signal ends the wait with a failure (`--format env` then prints one that
        // `eval` fails on) instead of killing fence silently; nothing was acquired.
        let interrupted = match interrupts.as_mut() {
            Some(interrupts) => tokio::select! {
                waited = coordinator.wait_for_release(resource, nap) => { waited?; None }
                (_, name) = interrupts.next() => Some(name),
            },
            None => {
                coordinator.wait_for_release(resource, nap).await?;
                None
            }
        };
        if let Some(name) = interrupted {
            break Err(Error::unavailable(
                format!("interrupted by {name} while waiting for `{resource}`; not acquired"),
                "nothing was acquired or changed; run the command again to wait again",
            ));
        }
        *sent = Instant::now();
        match coordinator.acquire(resource, owner, ttl).await {
            Err(Error::Busy { holder: next, .. }) => {
                *refused += 1;
                holder = next;
                backoff = Duration::ZERO;
            }
            // A store that is throttling or briefly unavailable (429, 503, a lost
            // connection: nothing was acquired) is waited out like a busy lease, until the
            // deadline; the holder's lease is unchanged, so its expiry still bounds the nap.
            Err(err @ Error::Unavailable { .. }) if deadline.is_none_or(|d| Instant::now() < d) => {
                if !warned_unavailable {
                    warned_unavailable = true;
                    crate::terminal::warn(&format!(
                        "warning: still waiting for `{resource}` though the store answered: {err}"
                    ));
                }
                backoff = (backoff * 2).clamp(POLL_MAX, UNAVAILABLE_MAX);
            }
            other => break other,
        }
    };
    if let Some(spinner) = spinner {
        spinner.finish_and_clear();
    }
    // Best effort: a stale waiter record is ignored by `inspect` once this process is gone.
    let leaving = crate::coordinator::Mark::now();
    let _ = coordinator.unwait(resource).await;
    // Leaving the queue can take long (an object store's deletes, retried): the grant is
    // judged again from when it was asked for, as the last thing before it is reported.
    match result {
        Ok(grant) => coordinator.still_in_time(grant, owner, leaving).await,
        err => err,
    }
}

impl Output {
    /// A spinner on stderr, only when stderr is a terminal and output is for people.
    pub fn spinner(&self) -> Option<ProgressBar> {
        if !self.shows_progress() {
            return None;
        }
        let spinner = ProgressBar::new_spinner();
        spinner.set_style(ProgressStyle::with_template("{spinner} {msg}").ok()?);
        spinner.enable_steady_tick(Duration::from_millis(100));
        Some(spinner)
    }
}
