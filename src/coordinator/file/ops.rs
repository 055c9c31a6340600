//! Acquire, renew and release: each one read-decide-write under the resource's lock.

use std::time::Duration;

use async_trait::async_trait;

use super::log::EventLine;
use super::record::{Now, Record};
use super::{FileCoordinator, Paths, FORMAT_VERSION};
use crate::coordinator::{
    ttl_ms, Attempt, Grant, History, InitAction, InitReport, Inspection, Lease, LeaseRef, Leases,
    LogQuery, Logged, Released, ResourceView, RunEvent, Waiting,
};
use crate::coordinator::{Found, Refusal};
use crate::error::{Error, Holder};
use crate::timeline::EventKind;

/// How long an operation waits for a resource's lock before it gives up (exit 7).
const LOCK_WAIT: Duration = Duration::from_secs(30);

impl FileCoordinator {
    /// Runs `change` on a resource's record under its lock. The wait for the lock is the
    /// runtime's, so a timeout around the call can always fire.
    async fn with_lock<T>(
        &self,
        resource: &str,
        change: impl FnOnce(&Self, Option<Record>, &Paths) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.ensure()?;
        let paths = self.paths(resource);
        let _lock = self.lock(&paths.lock).await?;
        let record = self.read_record(&paths, resource)?;
        self.catch_up(&paths, record.as_ref());
        change(self, record, &paths)
    }

    /// The resource's lock. Holders keep it for a few milliseconds; one that keeps it for
    /// [`LOCK_WAIT`] is paused, or is not fence at all (any local user who can read the lock
    /// file can `flock` it): then nothing was done, and the caller is told who to look for.
    async fn lock(&self, path: &std::path::Path) -> Result<crate::sys::Locked, Error> {
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        crate::sys::lock_exclusive_by(path, deadline)
            .await
            .map_err(|(what, err)| self.io_error(what, path, &err))?
            .ok_or_else(|| {
                Error::unavailable(
                    format!(
                        "the lock file `{}` was still locked after {}: a fence process is paused in the middle of an operation on this resource, or another local process holds a lock on it; nothing was done",
                        path.display(),
                        crate::time::duration(LOCK_WAIT)
                    ),
                    format!(
                        "find the holder with `fuser -v {}` (or `lsof`); it is safe to retry",
                        crate::error::shell_word(&path.display().to_string())
                    ),
                )
            })
    }

    /// The next token for a new grant: above the record's, the high-water mark's and the
    /// log's, and above `above` when asked (`acquire --above`), with the detail its event
    /// gets when `above` raised it. Warns when the record is below the others (restored or
    /// rolled back).
    fn next_token(
        &self,
        resource: &str,
        paths: &Paths,
        previous: Option<&Record>,
        above: Option<i64>,
    ) -> Result<(i64, Option<String>), Error> {
        let issued = self.issued(paths)?;
        let recorded = previous.map_or(0, |r| r.token);
        if previous.is_some() && recorded < issued {
            crate::terminal::warn(&format!(
                "warning: the lease record `{}` holds token {recorded}, but token {issued} was issued before: it was restored from an older copy, rolled back, or a power loss took its last grant (or a grant failed after it had reserved its token: a full disk); the new token continues above {issued}",
                paths.lease.display()
            ));
        }
        let source = format!(
            "the lease record `{}`, the high-water mark `{}` or the event log `{}`",
            paths.lease.display(),
            paths.high.display(),
            paths.events.display()
        );
        let highest = recorded.max(issued);
        let token = crate::coordinator::next_token_above(resource, highest, above, &source)?;
        Ok((token, crate::coordinator::raised_detail(highest, above)))
    }

    fn event(now: &Now, kind: EventKind, owner: &str, token: i64) -> EventLine {
        EventLine {
            boot_ns: Some(now.boot_ns),
            owner: Some(owner.to_owned()),
            token: Some(token),
            ..EventLine::new(kind, now.wall_ms)
        }
    }

    /// A grant's or renewal's event, with the TTL and expiry `record` now has.
    fn lease_event(now: &Now, kind: EventKind, record: &Record) -> EventLine {
        EventLine {
            ttl_ms: Some(record.ttl_ms),
            expires_at_ms: Some(record.expires_at_ms),
            ..Self::event(now, kind, &record.owner, record.token)
        }
    }

    /// Records the attempt `err` refused, under the resource's lock, once per process and
    /// kind; a failure is a warning (the refusal stands).
    fn note_refusal(&self, paths: &Paths, op: &str, owner: &str, err: &Error) {
        let Some(attempt) = Attempt::of(op, owner, err) else {
            return;
        };
        if !self.attempted.first(&attempt) {
            return;
        }
        let now_ms = Now::read().map_or(0, |now| now.wall_ms);
        if let Err(io) = super::attempts::note(&paths.attempts, &attempt, now_ms) {
            crate::coordinator::unrecorded(
                &attempt,
                &format!("`{}`: {io}", paths.attempts.display()),
            );
        }
    }

    /// Classifies a renew or release whose owner/token/expiry did not match.
    fn refuse(
        &self,
        op: &str,
        lease: &LeaseRef,
        record: Option<&Record>,
        now: &Now,
        paths: &Paths,
    ) -> Error {
        // A record below the high-water mark is an older copy: the lease of its token (or
        // an older one) is stale, a newer token having been issued.
        let marked = self.marked(paths);
        let refusal = Refusal::classify(
            lease,
            record.map(|r| Found {
                token: if r.token < marked && lease.token <= r.token {
                    marked
                } else {
                    r.token
                },
                owner: &r.owner,
                released: r.released,
            }),
        );
        if let (Refusal::NeverIssued { highest_token }, Some(_)) = (&refusal, record) {
            let issued = self.issued(paths).unwrap_or(0);
            if lease.token <= issued {
                // The token was issued, but the record no longer shows it: not "never issued".
                crate::terminal::warn(&format!(
                    "warning: the lease record `{}` holds token {highest_token}, older than token {} of this lease: it was restored from an older copy, rolled back, or a power loss took its last grant (the next token continues above {issued})",
                    paths.lease.display(),
                    lease.token
                ));
                return record_lost(lease);
            }
        }
        if let (Refusal::NoLease, None) = (&refusal, record) {
            let issued = self.issued(paths).unwrap_or(0);
            if (1..=issued).contains(&lease.token) {
                // The token was issued (the mark or the log say so), but there is no record
                // at all: not "no lease has ever been granted".
                crate::terminal::warn(&format!(
                    "warning: the lease record `{}` is missing (or empty), though token {issued} of `{}` was issued (its high-water mark and event log say so): it was moved aside or deleted, or a power loss took it before it was synced (the next token continues above {issued})",
                    paths.lease.display(),
                    lease.resource
                ));
                return record_lost(lease);
            }
        }
        let Some(detail) = refusal.event_detail() else {
            return refusal.into_error(lease);
        };
        let rejected = EventKind::rejected(op);
        if let Err(err) = super::log::append(
            &paths.events,
            &EventLine {
                boot_ns: Some(now.boot_ns),
                owner: Some(lease.owner.clone()),
                token: Some(lease.token),
                detail: Some(detail),
                change: record.map(|r| r.change),
                ..EventLine::new(rejected, now.wall_ms)
            },
        ) {
            // The refusal is the true answer; only its history entry is missing.
            crate::terminal::warn(&format!(
                "warning: cannot record the refused {op} in `{}`: {err}",
                paths.events.display()
            ));
        }
        refusal.into_error(lease)
    }
}

#[async_trait(?Send)]
impl Leases for FileCoordinator {
    async fn init(&self) -> Result<InitReport, Error> {
        let meta = self.dir.join("fence-store.json");
        let existed = meta.exists();
        self.create()?;
        if !existed {
            let body = serde_json::json!({ "format_version": FORMAT_VERSION }).to_string();
            std::fs::write(&meta, body).map_err(|err| self.io_error("write", &meta, &err))?;
        }
        self.sweep();
        Ok(InitReport {
            action: if existed {
                InitAction::UpToDate
            } else {
                InitAction::Created
            },
            schema_version: FORMAT_VERSION,
            location: format!("directory `{}`", self.dir.display()),
            held_waiters: None,
        })
    }

    /// A grant, a reacquire or a refusal, decided under the resource's lock; a new token is
    /// above `above` too, when asked.
    async fn grant(
        &self,
        resource: &str,
        owner: &str,
        ttl: Duration,
        above: Option<i64>,
    ) -> Result<Grant, Error> {
        let ttl = ttl_ms(ttl);
        self.with_lock(resource, |store, previous, paths| {
            // The grant counts from here, not from before a wait for the lock file.
            let sent = Some(tokio::time::Instant::now());
            let now = Now::read()?;
            // A live record below the high-water mark is an older copy (restored, rolled
            // back): a newer token was issued since, so it is no one's lease, and a grant is
            // a new token (`next_token` warns), never a reacquire of the old one.
            if let Some(record) = previous
                .as_ref()
                .filter(|r| r.is_live(&now, &store.boot_id) && r.token >= store.marked(paths))
            {
                if record.owner != owner {
                    let busy = Error::Busy {
                        resource: resource.to_owned(),
                        holder: Holder {
                            owner: record.owner.clone(),
                            token: record.token,
                            expires_at_ms: record.expires_at_ms,
                            expires_in_ms: record.expires_in_ms(&now, &store.boot_id),
                        },
                    };
                    store.note_refusal(paths, "acquire", owner, &busy);
                    return Err(busy);
                }
                if let Some(above) = above.filter(|&above| record.token <= above) {
                    return Err(crate::coordinator::held_not_above(
                        resource,
                        owner,
                        record.token,
                        above,
                    ));
                }
                let mut extended = record.clone();
                extended.extend(&now, &store.boot_id, ttl);
                let event = Self::lease_event(&now, EventKind::Reacquired, &extended);
                store.commit(
                    paths,
                    &extended,
                    record,
                    &event,
                    record.change,
                    "reacquired",
                )?;
                return Ok(Grant {
                    lease: extended.lease(&Now::read()?, &store.boot_id),
                    reacquired: true,
                    sent,
                });
            }
            let kind = match &previous {
                Some(r) if !r.released && r.owner != owner => EventKind::TakenOver,
                _ => EventKind::Acquired,
            };
            let (token, raised) = store.next_token(resource, paths, previous.as_ref(), above)?;
            // The mark is durable before the token exists anywhere else: whatever happens
            // next, this token is never issued again.
            super::counter::write(&paths.high, token)
                .map_err(|err| store.io_error("record the high-water mark", &paths.high, &err))?;
            let record = Record::grant(resource, owner, token, ttl, &now, &store.boot_id);
            // Undone, the record keeps the token used up, and the previous record's change and
            // event: one still to be recorded late stays so.
            let mut undo = record.clone();
            undo.released = true;
            undo.change = previous.as_ref().map_or(0, |r| r.change);
            undo.event = previous.as_ref().and_then(|r| r.event.clone());
            let event = EventLine {
                previous_expires_at_ms: previous
                    .as_ref()
                    .filter(|_| kind == EventKind::TakenOver)
                    .map(|r| r.expires_at_ms),
                detail: raised,
                ..Self::lease_event(&now, kind, &record)
            };
            let change = previous.as_ref().map_or(0, |r| r.change);
            store.commit(paths, &record, &undo, &event, change, "acquired")?;
            if let Some(learnt) = paths.learnt.take() {
                super::log::remember_seen(&paths.seen, &learnt);
            }
            Ok(Grant {
                lease: record.lease(&Now::read()?, &store.boot_id),
                reacquired: false,
                sent,
            })
        })
        .await
    }

    async fn renew(&self, lease: &LeaseRef, ttl: Option<Duration>) -> Result<Lease, Error> {
        self.with_lock(&lease.resource, |store, record, paths| {
            let now = Now::read()?;
            match record {
                Some(record)
                    if record.token == lease.token
                        && record.owner == lease.owner
                        && record.is_live(&now, &store.boot_id)
                        && record.token >= store.marked(paths) =>
                {
                    let ttl = ttl.map_or(record.ttl_ms, ttl_ms);
                    let mut renewed = record.clone();
                    renewed.extend(&now, &store.boot_id, ttl);
                    let event = Self::lease_event(&now, EventKind::Renewed, &renewed);
                    store.commit(paths, &renewed, &record, &event, record.change, "renewed")?;
                    Ok(renewed.lease(&Now::read()?, &store.boot_id))
                }
                other => {
                    let err = store.refuse("renew", lease, other.as_ref(), &now, paths);
                    store.note_refusal(paths, "renew", &lease.owner, &err);
                    Err(err)
                }
            }
        })
        .await
    }

    async fn release(&self, lease: &LeaseRef) -> Result<Released, Error> {
        self.with_lock(&lease.resource, |store, record, paths| {
            let now = Now::read()?;
            match record {
                Some(record)
                    if record.token == lease.token
                        && record.owner == lease.owner
                        && record.released =>
                {
                    Ok(Released::Already)
                }
                Some(record)
                    if record.token == lease.token
                        && record.owner == lease.owner
                        && record.token >= store.marked(paths) =>
                {
                    let mut released = record.clone();
                    released.released = true;
                    let event = EventLine {
                        live: Some(record.is_live(&now, &store.boot_id)),
                        ..Self::event(&now, EventKind::Released, &lease.owner, lease.token)
                    };
                    store.commit(paths, &released, &record, &event, record.change, "released")?;
                    Ok(Released::Now)
                }
                other => {
                    let err = store.refuse("release", lease, other.as_ref(), &now, paths);
                    store.note_refusal(paths, "release", &lease.owner, &err);
                    Err(err)
                }
            }
        })
        .await
    }

    async fn require_existing(&self) -> Result<(), Error> {
        self.require_dir()
    }
}

#[async_trait(?Send)]
impl Waiting for FileCoordinator {
    async fn wait_begin(&self, resource: &str, owner: &str) -> Result<(), Error> {
        let dir = self.waiters_dir(resource);
        std::fs::create_dir_all(&dir).map_err(|err| self.io_error("create", &dir, &err))?;
        for (path, waiter) in self.read_waiters(&dir) {
            if waiter.is_none() {
                let _ = std::fs::remove_file(path);
            }
        }
        let since_ms = Now::read()?.wall_ms;
        let body = serde_json::json!({ "owner": owner, "since_ms": since_ms }).to_string();
        let path = dir.join(format!("{}.json", std::process::id()));
        std::fs::write(&path, body).map_err(|err| self.io_error("write", &path, &err))
    }

    async fn unwait(&self, resource: &str) -> Result<(), Error> {
        let path = self
            .waiters_dir(resource)
            .join(format!("{}.json", std::process::id()));
        match std::fs::remove_file(&path) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                Err(self.io_error("remove", &path, &err))
            }
            _ => Ok(()),
        }
    }

    async fn wait_for_release(&self, _resource: &str, max: Duration) -> Result<(), Error> {
        tokio::time::sleep(max).await;
        Ok(())
    }

    fn pushes_wakeups(&self) -> bool {
        false
    }
}

#[async_trait(?Send)]
impl History for FileCoordinator {
    async fn inspect(
        &self,
        resources: &[String],
        history: usize,
    ) -> Result<Vec<ResourceView>, Error> {
        Ok(self.inspect_store(resources, history)?.views)
    }

    /// The highest token issued: the high-water mark and the log (what the next grant
    /// continues above) or the record's token, whichever is higher. The record alone (the
    /// default, through `inspect`) said "never leased" of a record a power loss emptied, and
    /// 1 of a record restored from an older copy after 2 had been issued: an S3 write with
    /// token 2 was refused as never issued (review 16). A damaged mark or record is an
    /// error (the write then warns that it could not confirm its token).
    async fn highest_token(&self, resource: &str) -> Result<Option<i64>, Error> {
        let paths = self.paths(resource);
        let issued = self.issued(&paths)?;
        let recorded = self.read_record(&paths, resource)?.map_or(0, |r| r.token);
        Ok(Some(issued.max(recorded)).filter(|&token| token > 0))
    }

    async fn inspect_checked(
        &self,
        resources: &[String],
        history: usize,
    ) -> Result<Inspection, Error> {
        self.inspect_store(resources, history)
    }

    async fn log(&self, query: &LogQuery<'_>) -> Result<Vec<Logged>, Error> {
        self.log_store(query)
    }

    async fn log_each(
        &self,
        query: &LogQuery<'_>,
        each: &mut dyn FnMut(Logged) -> bool,
    ) -> Result<(), Error> {
        self.log_each_store(query, each)
    }

    /// The resource's log read a chunk at a time (see [`super::log::each_newest`]).
    async fn history_each(
        &self,
        resource: &str,
        history: usize,
        oldest_first: bool,
        each: &mut dyn FnMut(crate::coordinator::Event) -> bool,
    ) -> Result<(), Error> {
        self.require_dir()?;
        let paths = self.paths(resource);
        super::log::each_newest(&paths.events, history, oldest_first, |line| {
            each(line.into_event())
        })
        .map_err(|err| self.io_error("read the event log", &paths.events, &err))
    }

    /// Under the resource's lock, as its refusals are.
    async fn record_attempt(&self, attempt: &Attempt) -> Result<(), Error> {
        self.with_lock(&attempt.resource, |store, _, paths| {
            let now_ms = Now::read()?.wall_ms;
            super::attempts::note(&paths.attempts, attempt, now_ms)
                .map_err(|err| store.io_error("record the refused attempt", &paths.attempts, &err))
        })
        .await
    }

    /// Appended to the resource's log under its lock, as every event is (not fsynced: it is
    /// history, not the counter).
    async fn record_run(&self, run: &RunEvent<'_>) -> Result<(), Error> {
        self.with_lock(run.resource, |store, record, paths| {
            let now = Now::read()?;
            let event = EventLine {
                detail: Some(run.note.detail()),
                change: record.map(|r| r.change),
                ..Self::event(&now, run.kind.clone(), run.owner, run.token)
            };
            super::log::append(&paths.events, &event)
                .map_err(|err| store.io_error("record the run's event", &paths.events, &err))
        })
        .await
    }

    async fn attempt_counts(&self) -> Result<Option<Vec<(String, EventKind, i64)>>, Error> {
        self.require_dir()?;
        let mut counts = Vec::new();
        for name in self.known_names()? {
            let paths = self.paths(&name);
            let totals = super::attempts::totals(&paths.attempts)
                .map_err(|err| self.io_error("read the refused attempts", &paths.attempts, &err))?;
            counts.extend(totals.into_iter().map(|(kind, n)| (name.clone(), kind, n)));
        }
        Ok(Some(counts))
    }

    async fn event_counts(&self) -> Result<Vec<(String, EventKind, i64)>, Error> {
        self.event_counts_store()
    }
}

/// The lease the store no longer records (see [`FileCoordinator::refuse`]): lost, exit 5.
fn record_lost(lease: &LeaseRef) -> Error {
    Error::LeaseLost {
        resource: lease.resource.clone(),
        owner: lease.owner.clone(),
        token: lease.token,
        reason: crate::error::LostReason::RecordLost,
    }
}
