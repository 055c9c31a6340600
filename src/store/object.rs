//! The object-store coordinator (`s3://bucket/prefix`, `gs://bucket/prefix`): the same lease
//! semantics as the directory and PostgreSQL stores, built only on conditional puts.
//!
//! Layout under the prefix (`<enc>` is the resource with every byte outside `[A-Za-z0-9-]`
//! written as `_XX`):
//! - `leases/<enc>`: JSON `{resource, owner, token, ttl_ms, state, nonce, seq, …}`. Created with
//!   a create-only put, then only ever replaced conditioned on the exact version (ETag or
//!   generation) just read, and never deleted, so the token counter survives release. Every
//!   body carries the token and a fresh nonce, so no two versions have the same bytes (S3 ETags
//!   are content hashes: this rules out ABA on lease objects). A lost precondition means
//!   another process decided first: the record is read again and the decision retried, as
//!   PostgreSQL's row lock would make a statement wait and re-check.
//! - `events/<enc>/<seq>-<n>-<ms>-<nonce>`: one append-only object per event, named so that
//!   names sort in the order the lease record was changed (`seq` counts the record's writes);
//!   the event's time is the object's own Last-Modified (the store's clock). An event is
//!   written after the lease record and before the caller is told, so every reported grant is
//!   in the history (a crash in between leaves a grant nobody was told about, without event).
//! - `waiters/<enc>/<id>`: one object per process in `--wait`, deleted when it stops waiting
//!   (a waiter killed with SIGKILL stays listed until its object is removed). Wake-ups are
//!   polled, not pushed.
//! - `clock/<n>`: probe objects (16 of them, picked at random) that a judging process writes
//!   to read the store's clock.
//!
//! Expiry (DESIGN I7, §9): no machine's wall clock is compared with another's. A lease is live
//! while `now < LM(lease) + ttl + resolution`, where `LM(lease)` is the Last-Modified of the
//! lease object's current version and `now` is the Last-Modified of a probe object this
//! process writes *before* it puts its decision — both by the store's clock. The resolution is
//! 1 s on S3 (whole-second timestamps, rounded down: the lease gets the extra second) and 1 ms
//! on GCS. A holder's own deadline runs from before its request on its monotonic clock, so it
//! always stops before anyone else may take over. The probe happens only when a decision needs
//! it (the lease exists and is held).

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::{ConflictKind, Error, Holder, LostReason};
use crate::object::{self, encode_key, verify, Cond, Meta, ObjectApi, ObjectUrl, Put};
use crate::store::{
    random_u64, ttl_ms, Coordinator, Event, Grant, InitReport, Lease, LeaseRef, Released,
    ResourceView, State, Waiter,
};

const FORMAT_VERSION: i32 = 1;
/// Attempts before a decision that keeps losing races gives up (exit 7, safe to retry).
const MAX_ATTEMPTS: usize = 200;

pub struct ObjectCoordinator {
    api: Box<dyn ObjectApi>,
    url: ObjectUrl,
    /// This process's waiter record name.
    waiter_id: String,
    /// Whether this process has seen the prefix verified (`None`: not looked yet).
    verified: std::cell::Cell<Option<bool>>,
}

/// The lease object's body.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Body {
    resource: String,
    owner: String,
    token: i64,
    ttl_ms: i64,
    /// `held` or `released`.
    state: String,
    /// Fresh for every write, so no two versions are byte-identical.
    nonce: String,
    /// How many times the record was written: orders the event objects.
    seq: u64,
    /// When this token was granted, by the store's clock; filled in by the first later write
    /// (the grant itself cannot know its own Last-Modified before it is stored).
    #[serde(default)]
    acquired_at_ms: Option<i64>,
    /// Written after the store was proven to enforce preconditions (`object::verify`), so a
    /// process that finds this record needs no proof of its own.
    #[serde(default)]
    verified: bool,
}

/// An event object's body; its time is the object's Last-Modified.
#[derive(Debug, Serialize, Deserialize)]
struct EventBody {
    kind: String,
    owner: Option<String>,
    token: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

/// The lease record as read, with the version and time of that read.
struct Current {
    body: Body,
    meta: Meta,
}

impl Current {
    fn held(&self) -> bool {
        self.body.state == "held"
    }

    fn expires_at_ms(&self) -> i64 {
        self.meta.last_modified_ms.saturating_add(self.body.ttl_ms)
    }

    fn lease(&self, now_ms: i64) -> Lease {
        Lease {
            resource: self.body.resource.clone(),
            owner: self.body.owner.clone(),
            token: self.body.token,
            acquired_at_ms: self
                .body
                .acquired_at_ms
                .unwrap_or(self.meta.last_modified_ms),
            renewed_at_ms: self.meta.last_modified_ms,
            expires_at_ms: self.expires_at_ms(),
            expires_in_ms: self.expires_at_ms() - now_ms,
            ttl_ms: self.body.ttl_ms,
        }
    }
}

/// Before another attempt at a decision that lost a race: a random pause that grows with the
/// attempts (up to 64 ms), so that many contenders do not keep invalidating each other's
/// reads (PostgreSQL queues them on the row lock instead).
async fn backoff(attempt: usize) {
    if attempt > 0 {
        let cap = 1u64 << attempt.min(6);
        tokio::time::sleep(Duration::from_millis(random_u64() % cap + 1)).await;
    }
}

fn nonce() -> String {
    format!("{:016x}", random_u64())
}

impl ObjectCoordinator {
    pub fn open(url: &ObjectUrl) -> Result<ObjectCoordinator, Error> {
        Ok(ObjectCoordinator {
            api: object::open(url)?,
            url: url.clone(),
            waiter_id: format!("{}-{}", std::process::id(), nonce()),
            verified: std::cell::Cell::new(None),
        })
    }

    fn lease_key(&self, resource: &str) -> String {
        self.url.join(&format!("leases/{}", encode_key(resource)))
    }

    fn events_prefix(&self, resource: &str) -> String {
        self.url.join(&format!("events/{}", encode_key(resource)))
    }

    fn waiters_prefix(&self, resource: &str) -> String {
        self.url.join(&format!("waiters/{}", encode_key(resource)))
    }

    fn damaged(&self, key: &str, why: impl std::fmt::Display) -> Error {
        Error::internal(
            format!("the lease object `{key}` at `{}` is damaged: {why}", self.url.display),
            "restore it from the bucket's version history; never delete it (that would reset the token counter)",
        )
    }

    async fn read(&self, resource: &str) -> Result<Option<Current>, Error> {
        let key = self.lease_key(resource);
        let Some(fetched) = self.api.get(&key).await? else {
            return Ok(None);
        };
        let body: Body =
            serde_json::from_slice(&fetched.body).map_err(|err| self.damaged(&key, err))?;
        if body.resource != resource {
            return Err(self.damaged(&key, format!("it names `{}`", body.resource)));
        }
        Ok(Some(Current {
            body,
            meta: fetched.meta,
        }))
    }

    /// Whether the prefix was proven to enforce preconditions, proving it now if it never was
    /// (exit 2 when the server ignores them). `false` only when the proof was skipped on the
    /// caller's explicit request.
    async fn verified(&self, current: Option<&Current>) -> Result<bool, Error> {
        if current.is_some_and(|c| c.body.verified) {
            return Ok(true);
        }
        if let Some(known) = self.verified.get() {
            return Ok(known);
        }
        let known = verify::ensure(self.api.as_ref(), &self.url, &self.url.key, false).await?;
        self.verified.set(Some(known));
        Ok(known)
    }

    /// The store's clock now: the Last-Modified of a probe object written for the purpose.
    async fn now(&self) -> Result<i64, Error> {
        let key = self.url.join(&format!("clock/{}", random_u64() % 16));
        match self
            .api
            .put(&key, nonce().into_bytes(), &Cond::None, &BTreeMap::new())
            .await?
        {
            Put::Done(meta) => Ok(meta.last_modified_ms),
            Put::Lost => Err(Error::internal(
                "an unconditional write of the clock probe was refused",
                "report this bug",
            )),
        }
    }

    /// Live by the store's clock, with the timestamp resolution added in the lease's favour.
    fn live(&self, current: &Current, now_ms: i64) -> bool {
        current.held() && now_ms < self.taken_over_at_ms(current)
    }

    /// When others may take the lease over, by the store's clock: its expiry plus the
    /// timestamp resolution. Others are told this time, never an earlier one.
    fn taken_over_at_ms(&self, current: &Current) -> i64 {
        current.expires_at_ms() + self.api.clock_resolution_ms()
    }

    /// Replaces (or creates) the record, conditioned on the version read.
    async fn write(&self, read: Option<&Current>, body: &Body) -> Result<Option<Meta>, Error> {
        let cond = match read {
            Some(current) => Cond::Match(current.meta.version.clone()),
            None => Cond::Create,
        };
        let bytes = serde_json::to_vec(body)
            .map_err(|err| Error::internal(err.to_string(), "report this bug"))?;
        match self
            .api
            .put(
                &self.lease_key(&body.resource),
                bytes,
                &cond,
                &BTreeMap::new(),
            )
            .await?
        {
            Put::Done(meta) => Ok(Some(meta)),
            Put::Lost => Ok(None),
        }
    }

    /// Appends an event after the record's write number `seq` (`n` 0: the write itself,
    /// 1: a refusal that changed nothing).
    async fn event(&self, resource: &str, seq: u64, n: u8, event: &EventBody) -> Result<(), Error> {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let key = format!(
            "{}/{seq:020}-{n}-{wall:013}-{}",
            self.events_prefix(resource),
            nonce()
        );
        let bytes = serde_json::to_vec(event)
            .map_err(|err| Error::internal(err.to_string(), "report this bug"))?;
        self.api.put_blind(&key, bytes).await
    }

    /// An event that could not be stored after the lease record was already changed (or a
    /// refusal decided): the change stands and the caller is told so, with a warning that the
    /// history misses it. Reporting "nothing applied" here would leave a lease held by an owner
    /// nobody knows of.
    fn unrecorded(&self, resource: &str, err: &Error) {
        crate::output::warn(&format!(
            "warning: the outcome for `{resource}` at `{}` stands (the lease record is as reported), but its event is missing from the history: {err}",
            self.url.display
        ));
    }

    fn contended(&self, resource: &str) -> Error {
        Error::unavailable(
            format!(
                "`{resource}` at `{}` changed under every one of {MAX_ATTEMPTS} attempts",
                self.url.display
            ),
            "nothing was changed by this request; retry",
        )
    }

    /// Classifies a renew or release whose owner/token/expiry did not match, recording the
    /// refusal when the token was once valid.
    async fn refuse(
        &self,
        op: &str,
        lease: &LeaseRef,
        current: Option<&Current>,
    ) -> Result<Error, Error> {
        let Some(current) = current else {
            return Ok(Error::Conflict {
                resource: lease.resource.clone(),
                token: lease.token,
                kind: ConflictKind::NoLease,
            });
        };
        let body = &current.body;
        let (error, detail) = if body.token > lease.token {
            (
                Error::Stale {
                    resource: lease.resource.clone(),
                    token: lease.token,
                    highest_token: body.token,
                },
                format!("token {} issued since", body.token),
            )
        } else if body.token < lease.token {
            return Ok(Error::Conflict {
                resource: lease.resource.clone(),
                token: lease.token,
                kind: ConflictKind::NeverIssued {
                    highest_token: body.token,
                },
            });
        } else if body.owner != lease.owner {
            return Ok(Error::Conflict {
                resource: lease.resource.clone(),
                token: lease.token,
                kind: ConflictKind::WrongOwner {
                    holder: body.owner.clone(),
                },
            });
        } else {
            let released = !current.held();
            (
                Error::LeaseLost {
                    resource: lease.resource.clone(),
                    owner: lease.owner.clone(),
                    token: lease.token,
                    reason: if released {
                        LostReason::Released
                    } else {
                        LostReason::Expired
                    },
                },
                if released { "released" } else { "expired" }.to_owned(),
            )
        };
        self.event(
            &lease.resource,
            body.seq,
            1,
            &EventBody {
                kind: format!("{op}_rejected"),
                owner: Some(lease.owner.clone()),
                token: Some(lease.token),
                detail: Some(detail),
            },
        )
        .await
        .unwrap_or_else(|err| self.unrecorded(&lease.resource, &err));
        Ok(error)
    }

    async fn events(&self, resource: &str, history: usize) -> Result<Vec<Event>, Error> {
        let prefix = self.events_prefix(resource);
        let mut names = self.api.list(&prefix).await?;
        names.sort();
        let mut events = Vec::new();
        for name in names.iter().rev().take(history) {
            let Some(fetched) = self.api.get(&format!("{prefix}/{name}")).await? else {
                continue;
            };
            if let Ok(e) = serde_json::from_slice::<EventBody>(&fetched.body) {
                events.push(Event {
                    at_ms: fetched.meta.last_modified_ms,
                    kind: e.kind,
                    owner: e.owner,
                    token: e.token,
                    detail: e.detail,
                });
            }
        }
        Ok(events)
    }

    async fn waiters(&self, resource: &str) -> Result<Vec<Waiter>, Error> {
        let prefix = self.waiters_prefix(resource);
        let mut waiters = Vec::new();
        for name in self.api.list(&prefix).await? {
            let Some(fetched) = self.api.get(&format!("{prefix}/{name}")).await? else {
                continue;
            };
            let owner = serde_json::from_slice::<serde_json::Value>(&fetched.body)
                .ok()
                .and_then(|v| v["owner"].as_str().map(str::to_owned));
            if let Some(owner) = owner {
                waiters.push(Waiter {
                    owner,
                    since_ms: fetched.meta.last_modified_ms,
                });
            }
        }
        waiters.sort_by_key(|w| w.since_ms);
        Ok(waiters)
    }
}

#[async_trait(?Send)]
impl Coordinator for ObjectCoordinator {
    async fn init(&self) -> Result<InitReport, Error> {
        let verified = verify::ensure(self.api.as_ref(), &self.url, &self.url.key, true).await?;
        let body = serde_json::json!({ "format_version": FORMAT_VERSION }).to_string();
        let put = self
            .api
            .put(
                &self.url.join("fence-store.json"),
                body.into_bytes(),
                &Cond::Create,
                &BTreeMap::new(),
            )
            .await?;
        Ok(InitReport {
            action: match put {
                Put::Done(_) => "created",
                Put::Lost => "up_to_date",
            },
            schema_version: FORMAT_VERSION,
            location: format!(
                "objects under `{}` ({})",
                self.url.display,
                if verified {
                    "conditional writes verified, recorded in `.fence/verified`"
                } else {
                    "conditional writes NOT verified"
                }
            ),
        })
    }

    async fn acquire(&self, resource: &str, owner: &str, ttl: Duration) -> Result<Grant, Error> {
        let ttl = ttl_ms(ttl);
        for attempt in 0..MAX_ATTEMPTS {
            backoff(attempt).await;
            let current = self.read(resource).await?;
            let verified = self.verified(current.as_ref()).await?;
            let now = match &current {
                Some(c) if c.held() => Some(self.now().await?),
                _ => None,
            };
            let (body, kind) = match (&current, now) {
                (Some(c), Some(now)) if self.live(c, now) => {
                    if c.body.owner != owner {
                        return Err(Error::Busy {
                            resource: resource.to_owned(),
                            holder: Holder {
                                owner: c.body.owner.clone(),
                                token: c.body.token,
                                expires_at_ms: self.taken_over_at_ms(c),
                                expires_in_ms: self.taken_over_at_ms(c) - now,
                            },
                        });
                    }
                    let mut body = c.body.clone();
                    body.acquired_at_ms = Some(c.lease(now).acquired_at_ms);
                    body.ttl_ms = ttl;
                    (body, "reacquired")
                }
                (previous, _) => {
                    let kind = match previous {
                        Some(c) if c.held() && c.body.owner != owner => "taken_over",
                        _ => "acquired",
                    };
                    let body = Body {
                        resource: resource.to_owned(),
                        owner: owner.to_owned(),
                        token: previous.as_ref().map_or(0, |c| c.body.token) + 1,
                        ttl_ms: ttl,
                        state: "held".into(),
                        nonce: String::new(),
                        seq: 0,
                        acquired_at_ms: None,
                        verified,
                    };
                    (body, kind)
                }
            };
            let body = Body {
                nonce: nonce(),
                seq: current.as_ref().map_or(0, |c| c.body.seq) + 1,
                verified,
                ..body
            };
            let Some(meta) = self.write(current.as_ref(), &body).await? else {
                continue;
            };
            self.event(
                resource,
                body.seq,
                0,
                &EventBody {
                    kind: kind.to_owned(),
                    owner: Some(owner.to_owned()),
                    token: Some(body.token),
                    detail: None,
                },
            )
            .await
            .unwrap_or_else(|err| self.unrecorded(&body.resource, &err));
            let now = meta.last_modified_ms;
            return Ok(Grant {
                lease: Current { body, meta }.lease(now),
                reacquired: kind == "reacquired",
            });
        }
        Err(self.contended(resource))
    }

    async fn renew(&self, lease: &LeaseRef, ttl: Option<Duration>) -> Result<Lease, Error> {
        for attempt in 0..MAX_ATTEMPTS {
            backoff(attempt).await;
            let current = self.read(&lease.resource).await?;
            let mine = current
                .as_ref()
                .filter(|c| c.body.token == lease.token && c.body.owner == lease.owner && c.held());
            let Some(c) = mine else {
                return Err(self.refuse("renew", lease, current.as_ref()).await?);
            };
            let now = self.now().await?;
            if !self.live(c, now) {
                return Err(self.refuse("renew", lease, current.as_ref()).await?);
            }
            let body = Body {
                ttl_ms: ttl.map_or(c.body.ttl_ms, ttl_ms),
                nonce: nonce(),
                seq: c.body.seq + 1,
                acquired_at_ms: Some(c.lease(now).acquired_at_ms),
                ..c.body.clone()
            };
            let Some(meta) = self.write(Some(c), &body).await? else {
                continue;
            };
            self.event(
                &lease.resource,
                body.seq,
                0,
                &EventBody {
                    kind: "renewed".into(),
                    owner: Some(lease.owner.clone()),
                    token: Some(lease.token),
                    detail: None,
                },
            )
            .await
            .unwrap_or_else(|err| self.unrecorded(&body.resource, &err));
            let now = meta.last_modified_ms;
            return Ok(Current { body, meta }.lease(now));
        }
        Err(self.contended(&lease.resource))
    }

    async fn release(&self, lease: &LeaseRef) -> Result<Released, Error> {
        for attempt in 0..MAX_ATTEMPTS {
            backoff(attempt).await;
            let current = self.read(&lease.resource).await?;
            let mine = current
                .as_ref()
                .filter(|c| c.body.token == lease.token && c.body.owner == lease.owner);
            let Some(c) = mine else {
                return Err(self.refuse("release", lease, current.as_ref()).await?);
            };
            if !c.held() {
                return Ok(Released::Already);
            }
            let body = Body {
                state: "released".into(),
                nonce: nonce(),
                seq: c.body.seq + 1,
                acquired_at_ms: Some(c.lease(0).acquired_at_ms),
                ..c.body.clone()
            };
            if self.write(Some(c), &body).await?.is_none() {
                continue;
            }
            self.event(
                &lease.resource,
                body.seq,
                0,
                &EventBody {
                    kind: "released".into(),
                    owner: Some(lease.owner.clone()),
                    token: Some(lease.token),
                    detail: None,
                },
            )
            .await
            .unwrap_or_else(|err| self.unrecorded(&lease.resource, &err));
            return Ok(Released::Now);
        }
        Err(self.contended(&lease.resource))
    }

    async fn inspect(
        &self,
        resources: &[String],
        history: usize,
    ) -> Result<Vec<ResourceView>, Error> {
        let mut currents = Vec::new();
        if resources.is_empty() {
            let prefix = self.url.join("leases");
            for name in self.api.list(&prefix).await? {
                let key = format!("{prefix}/{name}");
                if let Some(fetched) = self.api.get(&key).await? {
                    let body: Body = serde_json::from_slice(&fetched.body)
                        .map_err(|err| self.damaged(&key, err))?;
                    currents.push((
                        body.resource.clone(),
                        Some(Current {
                            body,
                            meta: fetched.meta,
                        }),
                    ));
                }
            }
            currents.sort_by(|a, b| a.0.cmp(&b.0));
        } else {
            for name in resources {
                currents.push((name.clone(), self.read(name).await?));
            }
        }
        let now = if currents.iter().any(|(_, c)| c.is_some()) {
            self.now().await?
        } else {
            0
        };
        let mut views = Vec::with_capacity(currents.len());
        for (name, current) in currents {
            let mut view = match current {
                None => ResourceView::unknown(&name),
                Some(c) => {
                    let state = if !c.held() {
                        State::Free
                    } else if self.live(&c, now) {
                        State::Held
                    } else {
                        State::Expired
                    };
                    let lease = c.lease(now);
                    let shown = state != State::Free;
                    // An observer is told when others may take over (see `taken_over_at_ms`).
                    let expires_at_ms = self.taken_over_at_ms(&c);
                    ResourceView {
                        resource: name.clone(),
                        state,
                        owner: shown.then(|| lease.owner.clone()),
                        token: Some(lease.token),
                        acquired_at_ms: Some(lease.acquired_at_ms),
                        renewed_at_ms: Some(lease.renewed_at_ms),
                        expires_at_ms: shown.then_some(expires_at_ms),
                        expires_in_ms: shown.then_some(expires_at_ms - now),
                        events: Vec::new(),
                        waiters: Vec::new(),
                    }
                }
            };
            view.waiters = self.waiters(&name).await?;
            if history > 0 {
                view.events = self.events(&name, history).await?;
            }
            views.push(view);
        }
        Ok(views)
    }

    async fn wait_begin(&self, resource: &str, owner: &str) -> Result<(), Error> {
        let body = serde_json::json!({ "owner": owner }).to_string();
        let key = format!("{}/{}", self.waiters_prefix(resource), self.waiter_id);
        self.api.put_blind(&key, body.into_bytes()).await
    }

    async fn unwait(&self, resource: &str) -> Result<(), Error> {
        let key = format!("{}/{}", self.waiters_prefix(resource), self.waiter_id);
        self.api.delete(&key).await
    }

    async fn wait_for_release(&self, _resource: &str, max: Duration) -> Result<(), Error> {
        tokio::time::sleep(max).await;
        Ok(())
    }

    fn pushes_wakeups(&self) -> bool {
        false
    }
}

/// Removes every object of a coordinator namespace (`fence bench`'s scratch prefix): the lease
/// records, their events, waiters, the clock probes and the marker. Only for namespaces fence
/// made.
pub async fn remove_namespace(url: &ObjectUrl) -> Result<(), Error> {
    let api = object::open(url)?;
    let mut dirs = vec![url.join("leases"), url.join("clock")];
    // Every resource with events or waiters has a lease record, named the same way.
    for name in api.list(&url.join("leases")).await? {
        dirs.push(url.join(&format!("events/{name}")));
        dirs.push(url.join(&format!("waiters/{name}")));
    }
    for dir in dirs {
        for name in api.list(&dir).await? {
            api.delete(&format!("{dir}/{name}")).await?;
        }
    }
    // The namespace's marker (written by `init`).
    api.delete(&url.join("fence-store.json")).await
}
