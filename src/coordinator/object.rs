//! The object-store coordinator (`s3://bucket/prefix`, `gs://bucket/prefix`): the same lease
//! semantics as the directory and PostgreSQL stores, built only on conditional puts.
//!
//! Layout under the prefix (`<enc>` is the resource with every byte outside `[A-Za-z0-9-]`
//! written as `_XX`):
//! - `leases/<enc>`: JSON `{resource, owner, token, ttl_ms, state, nonce, seq, history, …}`.
//!   Created with
//!   a create-only put, then only ever replaced conditioned on the exact version (ETag or
//!   generation) just read, and never deleted, so the token counter survives release. Every
//!   body carries the token and a fresh nonce, so no two versions have the same bytes (S3 ETags
//!   are content hashes: this rules out ABA on lease objects). A lost precondition means
//!   another process decided first: the record is read again and the decision retried, as
//!   PostgreSQL's row lock would make a statement wait and re-check.
//!   The record keeps its latest changes (`history`), so a change and its event are one write:
//!   no grant is ever without its event, and a change costs no request of its own.
//! - `tokens/<enc>`: the highest token issued, raised (conditionally, never lowered) once a
//!   new token's record is written, and read before the record by every operation: a record
//!   below it is an older copy written back (no one's lease), since the lease object alone
//!   would be lowered by one.
//! - `events/<enc>/<seq>-<n>-<ms>-<nonce>`: one append-only object per refusal (`renew` or
//!   `release` of a token no longer current, which changes nothing in the record), named so
//!   that names sort in the order of the record's writes (`seq`); its time is the object's
//!   Last-Modified (the store's clock). Records written by fence before the history moved into
//!   them have their changes here too; `inspect` merges both.
//! - `.fence/verified`: the proof that the server enforces preconditions (`object::verify`).
//! - `waiters/<enc>/<id>`: one object per process in `--wait`, deleted when it stops waiting
//!   (a waiter killed with SIGKILL stays listed until its object is removed). Wake-ups are
//!   polled, not pushed.
//! - `clock/<enc>`: the resource's probe object, which a judging process writes to read the
//!   store's clock. One per resource, never shared: stores limit writes per object name
//!   (GCS: about one per second), and a shared probe would make healthy leases of unrelated
//!   resources throttle each other.
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

use crate::coordinator::{
    ttl_ms, Event, EventKind, Grant, History, InitAction, InitReport, Lease, LeaseRef, Leases,
    Released, ResourceView, RunEvent, State, Waiter, Waiting,
};
use crate::coordinator::{Found, Refusal};
use crate::error::{Error, Holder};
use crate::object::{self, encode_key, verify, Cond, Fetched, Meta, ObjectApi, ObjectUrl, Put};
use crate::sys::random_u64;

const FORMAT_VERSION: i32 = 1;
/// Who writes a clock probe (see `ObjectCoordinator::probe_key`).
#[derive(Clone, Copy)]
enum Prober {
    /// The holder, renewing.
    Holder,
    /// Anyone else: a contender, a waiter, a viewer.
    Other,
}

/// How far below the lease's expiry a waiter's estimate of the store's time must be for it to
/// answer "busy" without a probe.
const ESTIMATE_SLACK_MS: i64 = 1_000;

/// The least time between two probes of a waiter's own clock object.
const PROBE_EVERY: std::time::Duration = std::time::Duration::from_millis(1_050);

/// Attempts before a decision that keeps losing races gives up (exit 7, safe to retry).
const MAX_ATTEMPTS: usize = 200;

pub struct ObjectCoordinator {
    api: Box<dyn ObjectApi>,
    url: ObjectUrl,
    /// This process's waiter record name.
    waiter_id: String,
    /// Whether this process has seen the prefix verified (`None`: not looked yet).
    verified: std::cell::Cell<Option<bool>>,
    /// Set while this process waits (`--wait`): its clock probes are its own object, never
    /// the one the holder's renewals write (GCS allows about one write per second to one
    /// object), and a poll of a lease that is surely still live writes no probe at all.
    waiting: std::cell::Cell<bool>,
    /// The store's time at this process's last probe, and when (this machine's monotonic
    /// clock): a waiter's estimate of the store's time now, trusted only to say "still live"
    /// (a takeover is always decided on a fresh probe).
    last_probe: std::cell::Cell<Option<(i64, std::time::Instant)>>,
    /// The version a conditional write of the lease record was just refused on, until the
    /// record is read again; and how many reads since the last write that went through
    /// answered that very version again. Every version carries a fresh nonce, so a store that
    /// refuses "not V" and then serves V is serving stale reads (a caching proxy or gateway).
    refused: std::cell::RefCell<Option<String>>,
    stale_reads: std::cell::Cell<usize>,
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
    /// process that finds this record needs no proof of its own — when it talks to the store
    /// through the endpoint the proof was made through, [`Body::verified_for`].
    #[serde(default)]
    verified: bool,
    /// The endpoint and bucket the proof held for (`verify::identity`); a record read through
    /// another (a proxy, a copy of the prefix elsewhere) needs the proof record, or a proof.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    verified_for: Option<String>,
    /// The latest changes of this record (at most [`HISTORY_KEPT`]), oldest first; the last
    /// one is the change this version made.
    #[serde(default)]
    history: Vec<Change>,
}

/// How many changes a lease record keeps (`inspect --history` shows at most this many of
/// them, with the refusals stored beside the record).
const HISTORY_KEPT: usize = 8;
/// When the record holds this many changes, the oldest are archived (all but the newest
/// [`HISTORY_KEPT`]) into one event object before the record is written: one extra request
/// every eight changes, and the full history stays durable.
const HISTORY_ARCHIVE_AT: usize = 2 * HISTORY_KEPT;
/// Archiving that keeps failing (it is retried with every write) must not let the record
/// grow without bound: beyond this many changes the write fails instead.
const HISTORY_MAX: usize = 8 * HISTORY_KEPT;

/// The metadata entry holding a copy of the record where reading metadata is one request
/// and reading bytes two (GCS), so a decision needs one read. GCS allows 8 KiB of custom
/// metadata per object; a larger record (very long owner names) is read from its bytes.
const META_LEASE: &str = "fence-lease";
const METADATA_COPY_MAX: usize = 6 * 1024;
/// The same for the high-water object's token.
const META_HIGH: &str = "fence-high";

/// Changes archived out of the record, in one event object
/// (`events/<enc>/<first seq>-0-archive`), oldest first.
#[derive(Debug, Serialize, Deserialize)]
struct Archive {
    changes: Vec<Change>,
}

/// One change of the lease record, kept in the record itself, so a change costs no request of
/// its own. Its time is the Last-Modified of the version that made it: unknown while that
/// version is being written, so filled in by the next write (and read from the current
/// version's own Last-Modified meanwhile).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Change {
    seq: u64,
    kind: EventKind,
    owner: String,
    token: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at_ms: Option<i64>,
    /// A grant's or renewal's TTL: the lease it set runs out `ttl_ms` after `at_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ttl_ms: Option<i64>,
    /// A grant whose token `--above` raised says so (`coordinator::raised_detail`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
    /// A release's write's nonce, by which a release whose answer was lost knows its own
    /// change in a later record (another release of the same lease makes one with the same
    /// seq, owner and token: review 19).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nonce: Option<String>,
}

impl Change {
    /// The change as an event; `written_ms` dates it when it has no time of its own yet.
    fn event(&self, written_ms: i64) -> Event {
        let at_ms = self.at_ms.unwrap_or(written_ms);
        Event {
            owner: Some(self.owner.clone()),
            token: Some(self.token),
            ttl_ms: self.ttl_ms,
            expires_at_ms: self.ttl_ms.map(|ttl| at_ms.saturating_add(ttl)),
            detail: self.detail.clone(),
            ..Event::new(self.kind.clone(), at_ms)
        }
    }
}

/// An event object's body (refusals, which change nothing, and records written by fence
/// before changes were kept in the record); its time is the object's Last-Modified.
#[derive(Debug, Serialize, Deserialize)]
struct EventBody {
    kind: EventKind,
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

/// The history a new version of the record carries: the read version's, its last change
/// dated by its Last-Modified, and `kind` (by `owner` with `token`) as this write's change.
fn history(
    read: Option<&Current>,
    seq: u64,
    kind: EventKind,
    owner: &str,
    token: i64,
    ttl_ms: Option<i64>,
) -> Vec<Change> {
    let mut history = read.map_or_else(Vec::new, |c| c.body.history.clone());
    if let (Some(last), Some(c)) = (history.last_mut(), read) {
        last.at_ms.get_or_insert(c.meta.last_modified_ms);
    }
    history.push(Change {
        seq,
        kind,
        owner: owner.to_owned(),
        token,
        at_ms: None,
        ttl_ms,
        detail: None,
        nonce: None,
    });
    history
}

/// The token a high-water object's bytes hold; `None` when they are not one (damaged).
fn high_token(body: &[u8]) -> Option<i64> {
    match std::str::from_utf8(body).ok()?.trim().parse::<i64>() {
        Ok(token) if token > 0 => Some(token),
        _ => None,
    }
}

/// What `fence doctor` finds of the high-water objects (`tokens/<enc>`), resource by resource.
#[derive(Default)]
pub struct HighWaterReport {
    /// Resources with a lease record.
    pub resources: usize,
    /// How many of them were looked at.
    pub checked: usize,
    /// Without a high-water object: granted only by a fence from before it (and neither
    /// granted nor renewed since), or every raise failed.
    pub missing: Vec<String>,
    /// With one that holds no token.
    pub damaged: Vec<String>,
    /// (resource, the record's token, the high-water token) with the high-water object below
    /// the record: the last raise failed.
    pub behind: Vec<(String, i64, i64)>,
    /// The same with the record below it: an older copy written back, no one's lease.
    pub written_back: Vec<(String, i64, i64)>,
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
            waiting: std::cell::Cell::new(false),
            last_probe: std::cell::Cell::new(None),
            refused: std::cell::RefCell::new(None),
            stale_reads: std::cell::Cell::new(0),
        })
    }

    fn lease_key(&self, resource: &str) -> String {
        self.url.join(&format!("leases/{}", encode_key(resource)))
    }

    /// The resource's high-water object: the highest token issued, raised (conditionally on
    /// the version read, never lowered) once a new token's record is written. The lease object holds the
    /// token too, but an older copy of it written back (an old body uploaded, an object
    /// version restored) would lower that counter; this one is never written back by fence.
    fn high_key(&self, resource: &str) -> String {
        self.high_key_encoded(&encode_key(resource))
    }

    /// [`Self::high_key`] of a resource's encoded name (as `leases/` lists it).
    fn high_key_encoded(&self, name: &str) -> String {
        self.url.join(&format!("tokens/{name}"))
    }

    /// The high-water object as stored: its token (`None`: damaged, not a token) and version;
    /// `None` when there is none yet (a resource from before it, or never granted). Where
    /// metadata is one request and bytes two (GCS), the token is read from its metadata copy.
    async fn fetch_high(&self, resource: &str) -> Result<Option<(Option<i64>, Meta)>, Error> {
        self.fetch_high_at(&self.high_key(resource)).await
    }

    /// [`Self::fetch_high`] by the object's key.
    async fn fetch_high_at(&self, key: &str) -> Result<Option<(Option<i64>, Meta)>, Error> {
        Ok(self
            .fetch_copied(key, META_HIGH)
            .await?
            .map(|fetched| (high_token(&fetched.body), fetched.meta)))
    }

    /// An object fence keeps a copy of in its metadata entry `copy` where metadata is one
    /// request and bytes two (GCS): the copy as its body; else, or without the copy (too
    /// large, written by hand or by an earlier fence), its bytes.
    async fn fetch_copied(&self, key: &str, copy: &str) -> Result<Option<Fetched>, Error> {
        if self.api.body_fits_metadata() {
            let Some(mut meta) = self.api.head(key).await? else {
                return Ok(None);
            };
            if let Some(copy) = meta.metadata.remove(copy) {
                return Ok(Some(Fetched {
                    meta,
                    body: copy.into_bytes(),
                }));
            }
        }
        self.api.get(key).await
    }

    /// The high-water object's token and version (`None`: none yet, a resource from before
    /// it or never granted).
    async fn high(&self, resource: &str) -> Result<Option<(i64, Meta)>, Error> {
        let Some((token, meta)) = self.fetch_high(resource).await? else {
            return Ok(None);
        };
        match token {
            Some(token) => Ok(Some((token, meta))),
            // Damaged: it guards nothing then (the record still holds the token), and the
            // next raise replaces it (conditioned on this version); never an error that would
            // stop a holder's renewal.
            None => {
                crate::terminal::warn(&format!(
                    "warning: the high-water object `{}` at `{}` is damaged (it holds no token); it is ignored until fence raises it again (an older copy of the lease object written back meanwhile would go unnoticed)",
                    self.high_key(resource),
                    self.url.display,
                ));
                Ok(Some((0, meta)))
            }
        }
    }

    /// Raises the high-water object to `token` (a token whose record was just written),
    /// each put conditioned on the version read, never lowering it. Best effort: the record
    /// holds the token already, and this copy only guards against an older record written
    /// back later; a failure is a warning.
    async fn raise_high(&self, resource: &str, mut read: Option<(i64, Meta)>, token: i64) {
        for _ in 0..MAX_ATTEMPTS {
            if read.as_ref().is_some_and(|(highest, _)| *highest >= token) {
                return;
            }
            let cond = match &read {
                Some((_, meta)) => Cond::Match(meta.version.clone()),
                None => Cond::Create,
            };
            let mut metadata = BTreeMap::new();
            if self.api.body_fits_metadata() {
                metadata.insert(META_HIGH.to_owned(), token.to_string());
            }
            let put = self
                .api
                .put(
                    &self.high_key(resource),
                    format!("{token}\n").into_bytes(),
                    &cond,
                    &metadata,
                )
                .await;
            let reread = match put {
                Ok(Put::Done(_)) => return,
                Ok(Put::Lost) => self.high(resource).await,
                Err(err) => Err(err),
            };
            match reread {
                Ok(high) => read = high,
                Err(err) => {
                    crate::terminal::warn(&format!(
                        "warning: token {token} of `{resource}` is granted, but its high-water object could not be raised ({err}); only an older copy of the lease object written back would go unnoticed"
                    ));
                    return;
                }
            }
        }
    }

    /// What `fence doctor` finds of the high-water objects of the first `limit` resources
    /// with a lease record (in the listing's order). Reads only; a damaged lease record is an
    /// error, as it is to every operation.
    pub async fn high_water_report(&self, limit: usize) -> Result<HighWaterReport, Error> {
        let prefix = self.url.join("leases");
        let names = self.api.list(&prefix).await?;
        let mut report = HighWaterReport {
            resources: names.len(),
            ..HighWaterReport::default()
        };
        for name in names.iter().take(limit) {
            // The high-water object first, as every operation reads them: a grant in between
            // then shows a record above it, never one below (a review saw a false
            // "written back" with the other order).
            let high_key = self.high_key_encoded(name);
            let high = self.fetch_high_at(&high_key).await?;
            let key = format!("{prefix}/{name}");
            let Some(fetched) = self.api.get(&key).await? else {
                continue;
            };
            let body: Body =
                serde_json::from_slice(&fetched.body).map_err(|err| self.damaged(&key, err))?;
            report.checked += 1;
            let Some((high, _)) = high else {
                // Or the resource's first grant, between its record and its raise.
                if self.fetch_high_at(&high_key).await?.is_none() {
                    report.missing.push(body.resource);
                }
                continue;
            };
            match high {
                None => report.damaged.push(body.resource),
                Some(high) if high < body.token => {
                    // Or a grant between the two reads, or raising it now: read it again.
                    match self.fetch_high_at(&high_key).await? {
                        Some((Some(again), _)) if again >= body.token => {}
                        _ => report.behind.push((body.resource, body.token, high)),
                    }
                }
                Some(high) if high > body.token => {
                    report.written_back.push((body.resource, body.token, high))
                }
                Some(_) => {}
            }
        }
        Ok(report)
    }

    /// Writes a scratch object under `tokens/` (a name no resource's key can have: encoded
    /// keys hold no `.`) as a raise does — created, then replaced conditioned on its version
    /// —, reads it back and deletes it: whether this process may keep the high-water
    /// objects. `Err` says which step failed.
    pub async fn probe_high_water_writes(&self) -> Result<(), Error> {
        let key = self.url.join(&format!("tokens/.doctor-{}", nonce()));
        let failed = |what: &str| {
            Error::unavailable(
                format!("the scratch object `{key}` {what}"),
                "check the bucket's policy and retention rules for `tokens/`",
            )
        };
        let mut metadata = BTreeMap::new();
        if self.api.body_fits_metadata() {
            metadata.insert(META_HIGH.to_owned(), "1".to_owned());
        }
        let result = async {
            let Put::Done(meta) = self
                .api
                .put(&key, b"1\n".to_vec(), &Cond::Create, &metadata)
                .await?
            else {
                return Err(failed("already existed"));
            };
            if self.api.body_fits_metadata() {
                metadata.insert(META_HIGH.to_owned(), "2".to_owned());
            }
            if let Put::Lost = self
                .api
                .put(&key, b"2\n".to_vec(), &Cond::Match(meta.version), &metadata)
                .await?
            {
                return Err(failed(
                    "was not replaced: the put conditioned on its own version was refused",
                ));
            }
            match self.fetch_high_at(&key).await? {
                Some((Some(2), _)) => Ok(()),
                Some(_) => Err(failed("read back other bytes than were written")),
                None => Err(failed("could not be read back")),
            }
        }
        .await;
        // A store that lets fence write but not delete keeps the scratch object: harmless
        // (no resource is called that), and not what this check is about.
        let _ = self.api.delete(&key).await;
        result
    }

    /// A lease record whose token is below the high-water mark is an older copy written
    /// back: no one's lease. Says so once per process.
    fn restored(&self, current: &Current, high: Option<&(i64, Meta)>) -> bool {
        let Some((highest, _)) = high else {
            return false;
        };
        if current.body.token >= *highest {
            return false;
        }
        crate::terminal::warn(&format!(
            "warning: the lease object of `{}` holds token {}, but token {highest} was issued since (its high-water object says so): an older copy of it was written back (uploaded again, or restored from a version); it is no one's lease, and the next token continues above {highest}",
            current.body.resource, current.body.token
        ));
        true
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
            "write back its latest readable version from the bucket's version history, never an older one, and never delete it (the object is the token counter: either would make tokens repeat); with no readable version left, see docs/object-stores.md (`fence acquire --above`)",
        )
    }

    async fn read(&self, resource: &str) -> Result<Option<Current>, Error> {
        let key = self.lease_key(resource);
        let refused = self.refused.take();
        let Some(fetched) = self.fetch_copied(&key, META_LEASE).await? else {
            return Ok(None);
        };
        if refused.as_ref() == Some(&fetched.meta.version) {
            self.stale_reads.set(self.stale_reads.get() + 1);
        }
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
        let me = verify::identity(&self.url);
        if current.is_some_and(|c| c.body.verified && c.body.verified_for.as_ref() == Some(&me)) {
            return Ok(true);
        }
        if let Some(known) = self.verified.get() {
            return Ok(known);
        }
        let known = verify::ensure(self.api.as_ref(), &self.url, &self.url.key, false).await?;
        self.verified.set(Some(known));
        Ok(known)
    }

    /// The clock probe of `resource` for `who`: the holder's renewals have one of their own,
    /// which nothing else writes (GCS allows about one write per second to one object, and a
    /// renewal refused by the rate limit could cost a healthy holder its lease); a waiter has
    /// its own (deleted when it stops waiting); every other caller (a one-shot `acquire`,
    /// `inspect`) shares a third.
    fn probe_key(&self, resource: &str, who: Prober) -> String {
        let name = encode_key(resource);
        let key = match (who, self.waiting.get()) {
            (Prober::Holder, _) => format!("clock/{name}"),
            (Prober::Other, true) => format!("clock/{name}.w-{}", self.waiter_id),
            (Prober::Other, false) => format!("clock/{name}.c"),
        };
        self.url.join(&key)
    }

    /// The store's time to judge whether `current` (held) is live, for an acquire. A waiter
    /// that probed before estimates it from that probe and its own monotonic clock since,
    /// and writes no probe when the estimate, less a second, still says live (busy is never
    /// unsafe); any other answer is a fresh probe.
    async fn now_for(&self, resource: &str, current: &Current) -> Result<i64, Error> {
        if let (true, Some((at_ms, at))) = (self.waiting.get(), self.last_probe.get()) {
            let estimate = at_ms + i64::try_from(at.elapsed().as_millis()).unwrap_or(i64::MAX);
            let expiry = self.taken_over_at_ms(current);
            if estimate + ESTIMATE_SLACK_MS < expiry {
                return Ok(estimate);
            }
            if let Some(wait) = PROBE_EVERY.checked_sub(at.elapsed()) {
                // Its own probe was written less than a second ago (GCS allows one write per
                // second to an object): still busy, until the next probe may be written (busy
                // is never unsafe; a takeover waits for that probe).
                let wait = i64::try_from(wait.as_millis()).unwrap_or(1).max(1);
                return Ok(expiry - wait);
            }
        }
        self.now(resource, Prober::Other).await
    }

    /// The store's clock now: the Last-Modified of a probe object written for the purpose.
    async fn now(&self, resource: &str, who: Prober) -> Result<i64, Error> {
        let key = self.probe_key(resource, who);
        let asked = std::time::Instant::now();
        match self
            .api
            .put(&key, nonce().into_bytes(), &Cond::None, &BTreeMap::new())
            .await?
        {
            Put::Done(meta) => {
                self.last_probe.set(Some((meta.last_modified_ms, asked)));
                Ok(meta.last_modified_ms)
            }
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
        let text = serde_json::to_string(body)
            .map_err(|err| Error::internal(err.to_string(), "report this bug"))?;
        let mut metadata = BTreeMap::new();
        if self.api.body_fits_metadata() && text.len() <= METADATA_COPY_MAX {
            metadata.insert(META_LEASE.to_owned(), text.clone());
        }
        match self
            .api
            .put(
                &self.lease_key(&body.resource),
                text.into_bytes(),
                &cond,
                &metadata,
            )
            .await?
        {
            Put::Done(meta) => {
                self.stale_reads.set(0);
                Ok(Some(meta))
            }
            Put::Lost => {
                if let Cond::Match(version) = cond {
                    *self.refused.borrow_mut() = Some(version);
                }
                Ok(None)
            }
        }
    }

    /// Moves the oldest changes of `body` into an archive object once there are
    /// [`HISTORY_ARCHIVE_AT`] of them (all dated: only the newest is not). The archive's name
    /// is fixed by its first change, so a writer that archives and then loses its race leaves
    /// exactly the object the winner writes again (same name, same changes). A failed
    /// archive keeps the changes in the record, for the next write to archive.
    async fn archive(&self, body: &mut Body) -> Result<(), Error> {
        if body.history.len() < HISTORY_ARCHIVE_AT {
            return Ok(());
        }
        let cut = body.history.len() - HISTORY_KEPT;
        let archive = Archive {
            changes: body.history[..cut].to_vec(),
        };
        let key = format!(
            "{}/{:020}-0-archive",
            self.events_prefix(&body.resource),
            archive.changes[0].seq
        );
        let bytes = serde_json::to_vec(&archive)
            .map_err(|err| Error::internal(err.to_string(), "report this bug"))?;
        // Created once: an archive of that name holds either the same changes (a writer that
        // lost its race after archiving them) or others under the same write numbers (the
        // record was written back from a copy at the newest token, which is not caught, and
        // its numbers continued from there). Those are kept, and these go beside them: no
        // archived change is ever replaced (a review lost archived renewals so).
        let stored = match self
            .api
            .put(&key, bytes.clone(), &Cond::Create, &BTreeMap::new())
            .await
        {
            Ok(Put::Done(_)) => Ok(()),
            Ok(Put::Lost) => match self.api.get(&key).await {
                Ok(Some(existing)) if existing.body == bytes => Ok(()),
                Ok(_) => {
                    self.api
                        .put_blind(&format!("{key}-{}", nonce()), bytes)
                        .await
                }
                Err(err) => Err(err),
            },
            Err(err) => Err(err),
        };
        match stored {
            Ok(()) => {
                body.history.drain(..cut);
                Ok(())
            }
            Err(err) if body.history.len() >= HISTORY_MAX => Err(err),
            Err(_) => Ok(()),
        }
    }

    /// The highest write number in `resource`'s event objects (their names, and the last
    /// change of the newest archive, which is named by its first): what a record written
    /// back from an older copy is behind. One listing and one read.
    async fn archived_seq(&self, resource: &str) -> Result<u64, Error> {
        let prefix = self.events_prefix(resource);
        let mut names = self.api.list(&prefix).await?;
        names.sort();
        let listed = names
            .iter()
            .filter_map(|name| name.split('-').next()?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        // The archives named by the highest first number (one, or more beside it:
        // `<n>-0-archive-<nonce>`, `<n>-0-copy`): their last changes.
        let is_archive = |name: &&String| name.contains("-0-archive") || name.ends_with("-0-copy");
        let first = |name: &String| name.split('-').next().and_then(|n| n.parse::<u64>().ok());
        let newest = names.iter().filter(is_archive).filter_map(first).max();
        let mut archived = 0;
        for name in names
            .iter()
            .filter(is_archive)
            .filter(|name| newest.is_some() && first(name) == newest)
        {
            if let Some(fetched) = self.api.get(&format!("{prefix}/{name}")).await? {
                let last = serde_json::from_slice::<Archive>(&fetched.body)
                    .ok()
                    .and_then(|archive| archive.changes.iter().map(|c| c.seq).max());
                archived = archived.max(last.unwrap_or(0));
            }
        }
        Ok(listed.max(archived))
    }

    /// The write number for a grant over `copy`, an older copy of the record written back:
    /// its own number is behind the history archived since under the same numbers, and
    /// continuing from it would overwrite those archives (a review lost archived grants so).
    /// So the grant continues above every event object's number, and the copy's changes
    /// not archived already are kept in an object of their own (`<n>-0-copy`, created once,
    /// a name no record archive takes: a review saw a losing grant's copy archive replace
    /// the winner's record archive); the grant's record starts a fresh history.
    async fn continue_after_copy(&self, copy: &Current) -> Result<u64, Error> {
        let archived = self.archived_seq(&copy.body.resource).await?;
        let base = archived.max(copy.body.seq) + 1;
        // Changes at or below the archived number are there already, dated (the copy's
        // last change has no date of its own: it would be shown at this grant's time).
        let changes: Vec<Change> = copy
            .body
            .history
            .iter()
            .filter(|change| change.seq > archived)
            .cloned()
            .collect();
        if !changes.is_empty() {
            let bytes = serde_json::to_vec(&Archive { changes })
                .map_err(|err| Error::internal(err.to_string(), "report this bug"))?;
            let key = format!(
                "{}/{base:020}-0-copy",
                self.events_prefix(&copy.body.resource)
            );
            self.api
                .put(&key, bytes, &Cond::Create, &BTreeMap::new())
                .await?;
        }
        Ok(base + 1)
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
        crate::terminal::warn(&format!(
            "warning: the outcome for `{resource}` at `{}` stands (the lease record is as reported), but its event is missing from the history: {err}",
            self.url.display
        ));
    }

    /// Refuses a resource whose object names would exceed S3's and GCS's 1024 bytes (every
    /// byte outside `[A-Za-z0-9-]` takes three in a name) before anything is sent.
    fn check_resource(&self, resource: &str) -> Result<(), Error> {
        // The longest name: `<prefix>/events/<enc>/<seq:020>-<n>-<ms:013>-<nonce:016>`.
        let longest = self.events_prefix(resource).len() + 1 + 20 + 3 + 13 + 1 + 16;
        if longest > 1024 {
            return Err(Error::usage(
                format!(
                    "the resource name is too long for `{}`: its object names would take {longest} bytes, and S3 and GCS allow 1024",
                    self.url.display
                ),
                "use a shorter resource name (letters, digits and `-` take one byte each, any other byte three)",
            ));
        }
        Ok(())
    }

    /// Refuses a TTL shorter than the store sustains.
    fn check_ttl(&self, ttl_ms: i64) -> Result<(), Error> {
        match self.api.min_ttl() {
            Some((min, why)) if ttl_ms < min => Err(Error::usage(
                format!(
                    "a TTL of {ttl_ms} ms is too short for `{}`: {why}",
                    self.url.display
                ),
                format!("use --ttl {}s or more", min / 1000),
            )),
            _ => Ok(()),
        }
    }

    fn contended(&self, resource: &str) -> Error {
        let stale = self.stale_reads.replace(0);
        if stale * 2 >= MAX_ATTEMPTS {
            // The true cause is not other writers (a reviewer saw a caching gateway reported
            // as "changed under every attempt").
            return Error::unavailable(
                format!(
                    "`{resource}` at `{}`: the store refused every write conditioned on the version of the lease record it had just answered, and answered that same version again {stale} times: its reads are stale (a caching proxy, CDN or gateway between fence and the store?)",
                    self.url.display
                ),
                "nothing was changed by this request; fence's reads must reach the store itself: exempt this bucket from caching (or name its host in NO_PROXY), then retry",
            );
        }
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
    /// (`high`: the high-water object, read before `current`. A record below it is an
    /// older copy written back, and the newest token is the object's: the caller's token
    /// below it is stale, above it never issued, and equal to it a lease whose record was
    /// overwritten — lost.)
    async fn refuse(
        &self,
        op: &str,
        lease: &LeaseRef,
        current: Option<&Current>,
        high: Option<&(i64, Meta)>,
    ) -> Result<Error, Error> {
        let highest = high.map_or(0, |(token, _)| *token);
        let refusal = match current {
            Some(c) if c.body.token < highest => match lease.token.cmp(&highest) {
                std::cmp::Ordering::Less => Refusal::Stale {
                    highest_token: highest,
                },
                std::cmp::Ordering::Greater => Refusal::NeverIssued {
                    highest_token: highest,
                },
                std::cmp::Ordering::Equal => Refusal::Lost(crate::error::LostReason::RecordLost),
            },
            // No record, but tokens were issued (the record deleted): as for an older copy,
            // the holder of the highest token lost its lease's record (exit 5, as on the
            // directory store; it was "no lease was ever granted", exit 6: review 17).
            None if highest > 0 => match lease.token.cmp(&highest) {
                std::cmp::Ordering::Less => Refusal::Stale {
                    highest_token: highest,
                },
                std::cmp::Ordering::Greater => Refusal::NeverIssued {
                    highest_token: highest,
                },
                std::cmp::Ordering::Equal => Refusal::Lost(crate::error::LostReason::RecordLost),
            },
            _ => Refusal::classify(
                lease,
                current.map(|c| Found {
                    token: c.body.token,
                    owner: &c.body.owner,
                    released: !c.held(),
                }),
            ),
        };
        if current.is_none() {
            // No record: a missing bucket reads as no record too (GCS answers a read in a
            // missing bucket 404 like a missing object): a listing names it (exit 2).
            self.api.list(&self.url.join("leases")).await?;
        }
        let (Some(current), Some(detail)) = (current, refusal.event_detail()) else {
            return Ok(refusal.into_error(lease));
        };
        // Against a copy written back, numbered after every event object, not after the
        // copy's old write number (it would be listed among changes long before it).
        let seq = if current.body.token < highest {
            self.archived_seq(&lease.resource)
                .await?
                .max(current.body.seq)
        } else {
            current.body.seq
        };
        self.event(
            &lease.resource,
            seq,
            1,
            &EventBody {
                kind: EventKind::rejected(op),
                owner: Some(lease.owner.clone()),
                token: Some(lease.token),
                detail: Some(detail),
            },
        )
        .await
        .unwrap_or_else(|err| self.unrecorded(&lease.resource, &err));
        Ok(refusal.into_error(lease))
    }

    /// The newest `history` events of a resource, newest first: the changes the record keeps,
    /// and the event objects beside it (refusals, and changes made by earlier versions of
    /// fence), in the order of the record's writes.
    async fn events(
        &self,
        resource: &str,
        current: Option<&Current>,
        history: usize,
    ) -> Result<Vec<Event>, Error> {
        let mut events: Vec<((u64, u8), Event)> = Vec::new();
        if let Some(c) = current {
            for change in &c.body.history {
                events.push(((change.seq, 0), change.event(c.meta.last_modified_ms)));
            }
        }
        let prefix = self.events_prefix(resource);
        let mut names = self.api.list(&prefix).await?;
        names.sort();
        for name in names.iter().rev().take(history) {
            let Some(fetched) = self.api.get(&format!("{prefix}/{name}")).await? else {
                continue;
            };
            if let Ok(archive) = serde_json::from_slice::<Archive>(&fetched.body) {
                for change in archive.changes {
                    events.push(((change.seq, 0), change.event(fetched.meta.last_modified_ms)));
                }
                continue;
            }
            // `<seq>-<n>-<ms>-<nonce>`
            let mut parts = name.split('-');
            let seq = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
            let n = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
            if let Ok(e) = serde_json::from_slice::<EventBody>(&fetched.body) {
                events.push((
                    (seq, n),
                    Event {
                        owner: e.owner,
                        token: e.token,
                        detail: e.detail,
                        ..Event::new(e.kind, fetched.meta.last_modified_ms)
                    },
                ));
            }
        }
        // Newest first; of the changes of one write number, the earliest first (so that
        // copies of one change are next to each other, the one with its own date before one
        // dated by a later write: a copy written back dates its last change at the
        // write-back). Events after a write (refusals, runs) keep their objects' order.
        events.sort_by(|a, b| {
            b.0.cmp(&a.0).then_with(|| {
                if a.0 .1 == 0 {
                    a.1.at_ms.cmp(&b.1.at_ms)
                } else {
                    std::cmp::Ordering::Equal
                }
            })
        });
        // A change archived by a writer that then lost its race may still be in the record
        // too (when the winner's own archive failed): a change is listed once. Other changes
        // under the same number (two writers numbered theirs alike after a copy at the
        // newest token was written back) are all listed (a review saw them hidden).
        events.dedup_by(|a, b| {
            a.0 == b.0
                && a.0 .1 == 0
                && (&a.1.kind, &a.1.owner, a.1.token) == (&b.1.kind, &b.1.owner, b.1.token)
        });
        Ok(events
            .into_iter()
            .take(history)
            .map(|(_, event)| event)
            .collect())
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
impl Leases for ObjectCoordinator {
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
                Put::Done(_) => InitAction::Created,
                Put::Lost => InitAction::UpToDate,
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
            held_waiters: None,
        })
    }

    /// A grant, a reacquire or a refusal, decided on the record as read and put conditioned
    /// on its version; a new token is above `above` too, when asked.
    async fn grant(
        &self,
        resource: &str,
        owner: &str,
        ttl: Duration,
        above: Option<i64>,
    ) -> Result<Grant, Error> {
        let ttl = ttl_ms(ttl);
        self.check_ttl(ttl)?;
        self.check_resource(resource)?;
        // The nonce and kind of this call's last write that may have applied unseen (its
        // answer lost, its retry refused by its own version).
        let mut tried: Option<(String, EventKind, tokio::time::Instant)> = None;
        // One read more than writes: the last looks only for the last write, which may have
        // applied unseen (review 17: it was reported as "nothing was changed", exit 7).
        for attempt in 0..=MAX_ATTEMPTS {
            backoff(attempt).await;
            // The high-water object first, then the record: a record written (and the
            // object raised) in between then shows its token, never one below the object's.
            let high = self.high(resource).await?;
            let current = self.read(resource).await?;
            if let (Some(c), Some((nonce, kind, sent))) = (&current, &tried) {
                if c.body.nonce == *nonce {
                    // Our own write is the current version: granted by it, as it said (and
                    // its token goes on the high-water object, as after any written grant).
                    self.raise_high(resource, high, c.body.token).await;
                    let now = c.meta.last_modified_ms;
                    return Ok(Grant {
                        lease: c.lease(now),
                        reacquired: *kind == EventKind::Reacquired,
                        sent: Some(*sent),
                    });
                }
            }
            if attempt == MAX_ATTEMPTS {
                break;
            }
            let verified = self.verified(current.as_ref()).await?;
            let restored = current
                .as_ref()
                .is_some_and(|c| self.restored(c, high.as_ref()));
            let now = match &current {
                Some(c) if c.held() && !restored => Some(self.now_for(resource, c).await?),
                _ => None,
            };
            let (body, kind, raised) = match (&current, now) {
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
                    if let Some(above) = above.filter(|&above| c.body.token <= above) {
                        return Err(crate::coordinator::held_not_above(
                            resource,
                            owner,
                            c.body.token,
                            above,
                        ));
                    }
                    let mut body = c.body.clone();
                    body.acquired_at_ms = Some(c.lease(now).acquired_at_ms);
                    body.ttl_ms = ttl;
                    (body, EventKind::Reacquired, None)
                }
                (previous, _) => {
                    let kind = match previous {
                        // A copy written back is no one's lease: nothing taken over.
                        Some(c) if c.held() && c.body.owner != owner && !restored => {
                            EventKind::TakenOver
                        }
                        _ => EventKind::Acquired,
                    };
                    let highest = previous
                        .as_ref()
                        .map_or(0, |c| c.body.token)
                        .max(high.as_ref().map_or(0, |(token, _)| *token));
                    let body = Body {
                        resource: resource.to_owned(),
                        owner: owner.to_owned(),
                        token: crate::coordinator::next_token_above(
                            resource,
                            highest,
                            above,
                            "the lease record object",
                        )?,
                        ttl_ms: ttl,
                        state: "held".into(),
                        nonce: String::new(),
                        seq: 0,
                        acquired_at_ms: None,
                        verified,
                        verified_for: None,
                        history: Vec::new(),
                    };
                    (
                        body,
                        kind,
                        crate::coordinator::raised_detail(highest, above),
                    )
                }
            };
            let (prior, seq) = match &current {
                Some(c) if restored => (None, self.continue_after_copy(c).await?),
                _ => (
                    current.as_ref(),
                    current.as_ref().map_or(0, |c| c.body.seq) + 1,
                ),
            };
            let mut body = Body {
                nonce: nonce(),
                seq,
                verified,
                verified_for: verified.then(|| verify::identity(&self.url)),
                history: history(
                    prior,
                    seq,
                    kind.clone(),
                    owner,
                    body.token,
                    Some(body.ttl_ms),
                ),
                ..body
            };
            if let Some(change) = body.history.last_mut() {
                change.detail = raised;
            }
            self.archive(&mut body).await?;
            let sent = tokio::time::Instant::now();
            tried = Some((body.nonce.clone(), kind.clone(), sent));
            let Some(meta) = self.write(current.as_ref(), &body).await? else {
                continue;
            };
            // The attempt that got through, if the client says (retries after 429 included):
            // read before any other request is sent.
            let sent = self.api.last_sent().map_or(sent, |last| last.max(sent));
            // Only a token whose record was written is put on the high-water object (so a
            // record below it was written back from an older copy, never a grant that lost
            // its race after raising it). A reacquired token too: the grant that wrote it may
            // have lost its answer, or been killed, before its own raise (a review showed the
            // token issued again after a write-back). No request when it is there already.
            self.raise_high(resource, high, body.token).await;
            if self.waiting.get() && self.last_probe.get().is_some() {
                // Granted: a waiter's own clock probe is never read again (best effort).
                let probe = self.probe_key(resource, Prober::Other);
                let _ = self.api.delete(&probe).await;
            }
            let now = meta.last_modified_ms;
            return Ok(Grant {
                lease: Current { body, meta }.lease(now),
                reacquired: kind == EventKind::Reacquired,
                sent: Some(sent),
            });
        }
        Err(self.contended(resource))
    }

    async fn renew(&self, lease: &LeaseRef, ttl: Option<Duration>) -> Result<Lease, Error> {
        if let Some(ttl) = ttl {
            self.check_ttl(ttl_ms(ttl))?;
        }
        self.check_resource(&lease.resource)?;
        // The nonce of this call's last write, which may have applied unseen; one read more
        // than writes looks for it (review 17).
        let mut tried: Option<String> = None;
        for attempt in 0..=MAX_ATTEMPTS {
            backoff(attempt).await;
            let high = self.high(&lease.resource).await?;
            let current = self.read(&lease.resource).await?;
            if let Some(c) = current
                .as_ref()
                .filter(|c| tried.as_ref() == Some(&c.body.nonce))
            {
                return Ok(c.lease(c.meta.last_modified_ms));
            }
            if attempt == MAX_ATTEMPTS {
                break;
            }
            let mine = current.as_ref().filter(|c| {
                c.body.token == lease.token
                    && c.body.owner == lease.owner
                    && c.held()
                    && !self.restored(c, high.as_ref())
            });
            let Some(c) = mine else {
                return Err(self
                    .refuse("renew", lease, current.as_ref(), high.as_ref())
                    .await?);
            };
            let verified = self.verified(Some(c)).await?;
            let now = self.now(&lease.resource, Prober::Holder).await?;
            if !self.live(c, now) {
                return Err(self
                    .refuse("renew", lease, current.as_ref(), high.as_ref())
                    .await?);
            }
            let renewed_ttl = ttl.map_or(c.body.ttl_ms, ttl_ms);
            let mut body = Body {
                verified,
                verified_for: verified.then(|| verify::identity(&self.url)),
                ttl_ms: renewed_ttl,
                nonce: nonce(),
                seq: c.body.seq + 1,
                acquired_at_ms: Some(c.lease(now).acquired_at_ms),
                history: history(
                    Some(c),
                    c.body.seq + 1,
                    EventKind::Renewed,
                    &lease.owner,
                    lease.token,
                    Some(renewed_ttl),
                ),
                ..c.body.clone()
            };
            self.archive(&mut body).await?;
            tried = Some(body.nonce.clone());
            let Some(meta) = self.write(Some(c), &body).await? else {
                continue;
            };
            // A high-water object left behind (a grant whose raise failed, or from before
            // it existed) catches up with the live token.
            self.raise_high(&lease.resource, high, lease.token).await;
            let now = meta.last_modified_ms;
            return Ok(Current { body, meta }.lease(now));
        }
        Err(self.contended(&lease.resource))
    }

    async fn release(&self, lease: &LeaseRef) -> Result<Released, Error> {
        // The nonce of this call's last write, which may have applied unseen.
        let mut tried: Option<(String, u64)> = None;
        // One read more than writes: the last looks only for the last write (review 17).
        for attempt in 0..=MAX_ATTEMPTS {
            backoff(attempt).await;
            let high = self.high(&lease.resource).await?;
            let current = self.read(&lease.resource).await?;
            if let (Some(c), Some((nonce, seq))) = (&current, &tried) {
                // Our own release is the current version (its answer was lost), or a later
                // one keeps it in its history: a waiter granted the lease while this call
                // paused to retry (review 17: that was refused as stale, exit 4, and a
                // refusal recorded that never happened). Its token goes on the high-water
                // object as below.
                let ours = c.body.nonce == *nonce
                    || c.body.history.iter().any(|change| {
                        change.seq == *seq
                            && change.kind == EventKind::Released
                            && change.nonce.as_ref() == Some(nonce)
                    });
                if ours {
                    self.raise_high(&lease.resource, high, lease.token).await;
                    return Ok(Released::Now);
                }
            }
            if attempt == MAX_ATTEMPTS {
                break;
            }
            // A record below the high-water object (an older copy written back, released or
            // not) is no one's: its token is refused, never "already released".
            let mine = current.as_ref().filter(|c| {
                c.body.token == lease.token
                    && c.body.owner == lease.owner
                    && !self.restored(c, high.as_ref())
            });
            let Some(c) = mine else {
                return Err(self
                    .refuse("release", lease, current.as_ref(), high.as_ref())
                    .await?);
            };
            if !c.held() {
                return Ok(Released::Already);
            }
            let verified = self.verified(Some(c)).await?;
            let mut body = Body {
                verified,
                verified_for: verified.then(|| verify::identity(&self.url)),
                state: "released".into(),
                nonce: nonce(),
                seq: c.body.seq + 1,
                acquired_at_ms: Some(c.lease(0).acquired_at_ms),
                history: history(
                    Some(c),
                    c.body.seq + 1,
                    EventKind::Released,
                    &lease.owner,
                    lease.token,
                    None,
                ),
                ..c.body.clone()
            };
            if let Some(change) = body.history.last_mut() {
                change.nonce = Some(body.nonce.clone());
            }
            self.archive(&mut body).await?;
            tried = Some((body.nonce.clone(), body.seq));
            if self.write(Some(c), &body).await?.is_none() {
                continue;
            }
            // A high-water object left behind the token (its grant lost its answer or was
            // killed before raising it) catches up, as a renewal's does: else the next
            // grant after an older copy written back would repeat this token.
            self.raise_high(&lease.resource, high, lease.token).await;
            return Ok(Released::Now);
        }
        Err(self.contended(&lease.resource))
    }
}

#[async_trait(?Send)]
impl Waiting for ObjectCoordinator {
    /// No queue here; but from its first attempt on, a waiter probes the store's clock on an
    /// object of its own (see `probe_key`).
    fn queue_up(
        &self,
        _resource: &str,
        _owner: &str,
        _until: Option<tokio::time::Instant>,
    ) -> bool {
        self.waiting.set(true);
        false
    }

    async fn wait_begin(&self, resource: &str, owner: &str) -> Result<(), Error> {
        let body = serde_json::json!({ "owner": owner }).to_string();
        let key = format!("{}/{}", self.waiters_prefix(resource), self.waiter_id);
        self.waiting.set(true);
        self.api.put_blind(&key, body.into_bytes()).await
    }

    async fn unwait(&self, resource: &str) -> Result<(), Error> {
        let key = format!("{}/{}", self.waiters_prefix(resource), self.waiter_id);
        if self.waiting.get() && self.last_probe.get().is_some() {
            // This waiter's own clock probe goes with it (best effort: a probe left by a
            // killed waiter is never read again).
            let probe = self.probe_key(resource, Prober::Other);
            let _ = self.api.delete(&probe).await;
        }
        self.waiting.set(false);
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

#[async_trait(?Send)]
impl History for ObjectCoordinator {
    /// An event object after the record's current write (`<seq>-1-…`, as a refusal): one
    /// read of the record for its write number, one put.
    async fn record_run(&self, run: &RunEvent<'_>) -> Result<(), Error> {
        let seq = self.read(run.resource).await?.map_or(0, |c| c.body.seq);
        self.event(
            run.resource,
            seq,
            1,
            &EventBody {
                kind: run.kind.clone(),
                owner: Some(run.owner.to_owned()),
                token: Some(run.token),
                detail: Some(run.note.detail()),
            },
        )
        .await
    }

    async fn highest_token(&self, resource: &str) -> Result<Option<i64>, Error> {
        let recorded = self.read(resource).await?.map(|c| c.body.token);
        let high = self.high(resource).await?.map(|(token, _)| token);
        Ok(recorded.max(high))
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
        // One probe, that of the first resource with a record. A reader who may not write
        // (read-only credentials) still sees the records: liveness is then judged by this
        // machine's clock, and says so (a view only: no decision is taken on it).
        let now = match currents.iter().find(|(_, c)| c.is_some()) {
            Some((name, _)) => match self.now(name, Prober::Other).await {
                Ok(now) => now,
                Err(err) => {
                    crate::terminal::warn(&format!(
                        "warning: cannot write the clock probe of `{}` ({err}); whether a lease is live is judged by this machine's clock instead of the store's",
                        self.url.display
                    ));
                    crate::time::now_ms()
                }
            },
            None => 0,
        };
        let mut views = Vec::with_capacity(currents.len());
        for (name, mut current) in currents {
            // A held record below the high-water mark is an older copy written back: no
            // one's lease (said on stderr). The record was read before the high-water object,
            // so it is read again, and the view is of that second read: a grant in between
            // shows its own record, at or above the object (a review saw the first read's
            // copy shown held when a grant landed between the two reads).
            let mut restored = false;
            if let Some(first) = current.as_ref().filter(|c| c.held()) {
                let high = self.high(&name).await?;
                let below = |c: &Current| {
                    high.as_ref()
                        .is_some_and(|(highest, _)| c.body.token < *highest)
                };
                if below(first) {
                    current = self.read(&name).await?;
                    restored = current
                        .as_ref()
                        .is_some_and(|again| below(again) && self.restored(again, high.as_ref()));
                }
            }
            let mut view = match &current {
                None => ResourceView::unknown(&name),
                Some(c) => {
                    let state = if !c.held() || restored {
                        State::Free
                    } else if self.live(c, now) {
                        State::Held
                    } else {
                        State::Expired
                    };
                    let lease = c.lease(now);
                    let shown = state != State::Free;
                    // An observer is told when others may take over (see `taken_over_at_ms`).
                    let expires_at_ms = self.taken_over_at_ms(c);
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
                view.events = self.events(&name, current.as_ref(), history).await?;
            }
            views.push(view);
        }
        Ok(views)
    }
}

/// Removes every object of a coordinator namespace (`fence bench`'s scratch prefix): the lease
/// records, their events, waiters, the clock probes and the marker. Only for namespaces fence
/// made.
pub async fn remove_namespace(url: &ObjectUrl) -> Result<(), Error> {
    let api = object::open(url)?;
    let mut dirs = vec![
        url.join("leases"),
        url.join("tokens"),
        url.join("clock"),
        url.join(".fence"),
    ];
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
