//! Fenced object writes (`s3://bucket/key`, `gs://bucket/key`, `file:///dir/name`): the object
//! itself carries the highest token written to it, in its metadata (`fence-token`,
//! `fence-resource`, `fence-owner`), and every write is conditioned on exactly the version
//! read, so a stale token can never replace a newer one's bytes (DESIGN I2, I6).
//!
//! One write: read the current version and its metadata; a newer stored token → exit 4; the
//! caller's own `--if-match` / `--if-generation-match` not met → exit 6; then put conditioned on
//! that version (create-only when absent). A lost precondition is re-read once and classified
//! (newer token → 4, otherwise 6), never retried blindly: the other writer's bytes may be what
//! the caller should look at first.
//!
//! Write ids (`--id`): the id of the write that made the current version is kept beside its
//! token (`fence-id`, with the digest of its bytes in `fence-id-digest`), and the ids of the
//! versions before it, newest first, in `fence-ids` (`id,token,written_at_ms,version,digest`
//! entries joined by `;`; entries of fence before digests have no digest): [`LEDGER_IDS`] ids
//! in all. A write
//! carries the ledger over (with or without an id of its own), so it lives in the same
//! metadata as the token and changes only by the same conditional put as the bytes: the id and
//! the effect land together or not at all. An id found there with the same digest (or none)
//! is a replay, with another digest a conflict (the id was given to different bytes); both are
//! checked before the token (a retry after exit 8 gets its answer even once a newer owner
//! wrote). Older entries
//! keep no owner: S3 allows 2 KB of metadata per object, and an owner takes up to 200 bytes.
//!
//! S3 caveat (ABA): an ETag is a hash of the bytes, so if a newer writer stores bytes identical
//! to those fence read, between fence's read and its put, `If-Match` still passes and the newer
//! writer's metadata is replaced. fence keeps that window to one round trip (no work happens
//! between the read and the put) and cannot detect it afterwards without bucket versioning;
//! GCS and `file://` generations never repeat and have no such window.

use std::collections::BTreeMap;

use indicatif::ProgressBar;

use crate::error::{ConflictKind, Error};
use crate::fenced::target::{
    wrong_form, Applied, Body, FencedTarget, Outcome, TargetView, WriteRequest,
};
use crate::object::{
    self, verify, Cond, Meta, ObjectUrl, Put, META_ID, META_IDS, META_ID_DIGEST, META_OWNER,
    META_PROVEN, META_RESOURCE, META_TOKEN,
};
use crate::timeline::{LogQuery, Logged};

/// How many write ids an object remembers: the current version's and those of the versions
/// before it. Bounded by S3's 2 KB of user metadata per object: 7 older entries of at most
/// 160 bytes (a 64-byte id, a token, a time, an ETag, a digest), beside the token, the
/// resource and the owner (up to 200 bytes each) and the current id and its digest, stay
/// under 1.7 KB.
pub const LEDGER_IDS: usize = 8;

/// The caller's own expectation of the current version.
#[derive(Clone, Debug, Default)]
pub struct Expect {
    pub if_match: Option<String>,
    pub if_generation_match: Option<u64>,
}

/// What an object write did.
#[derive(Debug)]
pub enum ObjectOutcome {
    Written(ObjectWritten),
    /// The write id is in the object's ledger: nothing was sent now.
    Replayed(IdEntry),
}

/// A write id in an object's ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdEntry {
    pub id: String,
    pub token: i64,
    /// When the version it made was written, by the store's clock.
    pub applied_at_ms: i64,
    /// Kept for the current version's id only (see the module's header).
    pub owner: Option<String>,
    /// The version the write made (ETag or generation).
    pub version: String,
    /// The digest of the bytes the write sent (`None` in entries of fence before digests).
    pub digest: Option<String>,
}

/// A written object.
#[derive(Debug)]
pub struct ObjectWritten {
    /// The new version (ETag or generation).
    pub version: String,
    /// The version replaced; `None` when the object was created.
    pub previous: Option<String>,
    pub bytes: usize,
}

/// The fence state of an object, for `inspect --target`.
#[derive(Debug)]
pub struct ObjectView {
    pub version: Option<String>,
    pub token: Option<i64>,
    pub resource: Option<String>,
    pub owner: Option<String>,
    pub updated_at_ms: Option<i64>,
}

/// The token an object was last written with, for showing it (0: none, or one that does not
/// read as a token; a write goes by [`token_guarding`]).
fn stored_token(meta: &Meta) -> i64 {
    meta.metadata
        .get(META_TOKEN)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

/// The token that guards the object `display` (0: none, never written by fence). A
/// `fence-token` that is not a token fence issues (1 up to the largest 64-bit integer: one
/// above it, a negative number, words) was written by hand or by another tool, and is not
/// taken for "no token": any token, the oldest included, would replace it (review 15).
fn token_guarding(meta: &Meta, display: &str) -> Result<i64, Error> {
    let Some(stored) = meta.metadata.get(META_TOKEN) else {
        return Ok(0);
    };
    match stored.parse::<i64>() {
        Ok(token) if token >= 1 => Ok(token),
        _ => Err(Error::internal(
            format!(
                "the object `{display}` carries {META_TOKEN} `{stored}`, which is not a token fence issues (1 to {}): it was written by hand or by another tool, so fence cannot tell whether {META_TOKEN} is newer than this write's; nothing was written",
                i64::MAX
            ),
            format!(
                "find out who wrote it (`fence inspect --target {}`); if the object is not fenced after all, remove its {META_TOKEN} metadata (or the object), then write again",
                crate::error::shell_word(display)
            ),
        )),
    }
}

/// The ids an object's metadata records, newest first: the current version's, then the older
/// ones. Entries that do not parse (written by hand) are skipped.
pub fn ledger(meta: &Meta) -> Vec<IdEntry> {
    let mut entries = Vec::new();
    if let Some(id) = meta.metadata.get(META_ID) {
        entries.push(IdEntry {
            id: id.clone(),
            token: stored_token(meta),
            applied_at_ms: meta.last_modified_ms,
            owner: meta
                .metadata
                .get(META_OWNER)
                .filter(|owner| !owner.is_empty())
                .cloned(),
            version: meta.version.clone(),
            digest: meta.metadata.get(META_ID_DIGEST).cloned(),
        });
    }
    let older = meta.metadata.get(META_IDS).map_or("", String::as_str);
    entries.extend(older.split(';').filter_map(|entry| {
        // Fields after the digest (a later fence's) are ignored, not read into it.
        let mut fields = entry.split(',');
        Some(IdEntry {
            id: fields.next().filter(|id| !id.is_empty())?.to_owned(),
            token: fields.next()?.parse().ok()?,
            applied_at_ms: fields.next()?.parse().ok()?,
            owner: None,
            version: fields.next()?.to_owned(),
            digest: fields.next().filter(|d| !d.is_empty()).map(str::to_owned),
        })
    }));
    entries
}

/// `fence-ids` for the next version: the current version's id (if any) before the older
/// ones, [`LEDGER_IDS`] - 1 at most (the next version's own id is the other one).
fn older_ids(current: Option<&Meta>) -> Option<String> {
    let entries = current.map(ledger).unwrap_or_default();
    let kept: Vec<String> = entries
        .iter()
        .take(LEDGER_IDS - 1)
        .map(|e| {
            let mut entry = format!(
                "{},{},{},{}",
                e.id,
                e.token,
                e.applied_at_ms,
                e.version.replace([',', ';'], "")
            );
            if let Some(digest) = &e.digest {
                entry.push(',');
                entry.push_str(&digest.replace([',', ';'], ""));
            }
            entry
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join(";"))
}

fn find(meta: Option<&Meta>, id: Option<&str>) -> Option<IdEntry> {
    let id = id?;
    ledger(meta?).into_iter().find(|e| e.id == id)
}

fn same_etag(a: &str, b: &str) -> bool {
    a.trim_matches('"') == b.trim_matches('"')
}

/// Refuses flags the object's store cannot honour (before any network traffic).
pub fn check_flags(url: &ObjectUrl, expect: &Expect) -> Result<(), Error> {
    let kinds = object::open(url)?.version_kinds();
    if expect.if_match.is_some() && !kinds.etag {
        return Err(Error::usage(
            format!(
                "`{}` has generations, not ETags: --if-match cannot be honoured",
                url.display
            ),
            "use --if-generation-match N (0: only if the object does not exist)",
        ));
    }
    if matches!(expect.if_generation_match, Some(n) if n != 0) && !kinds.generation {
        return Err(Error::usage(
            format!(
                "`{}` has ETags, not generations: --if-generation-match N cannot be honoured",
                url.display
            ),
            "use --if-match ETAG (`--if-generation-match 0` still means: only if absent)",
        ));
    }
    Ok(())
}

/// S3 carries user metadata in HTTP headers, which are ASCII: a name outside it may be
/// stored (an S3-compatible server kept the raw bytes) but no read of the object's state
/// parses back, so every later write of it would fail. Refused before anything is sent.
fn ascii_metadata(url: &ObjectUrl, what: &str, value: &str) -> Result<(), Error> {
    if value.is_ascii() {
        return Ok(());
    }
    Err(Error::usage(
        format!(
            "`{}`: the {what} `{value}` is not ASCII, and S3 keeps it in the object's metadata (`fence-{what}`), which is ASCII only",
            url.display
        ),
        format!("give S3 object targets an ASCII {what} (GCS and `file://` objects take any)"),
    ))
}

/// One fenced object write: who writes what, with which token and write id.
pub struct ObjectWrite<'a> {
    pub resource: &'a str,
    pub token: i64,
    pub owner: &'a str,
    /// `--id`: applied at most once to this object, whoever writes it.
    pub write_id: Option<&'a str>,
    pub expect: &'a Expect,
    /// `--timeout`: the longest a `file://` object's lock is waited for.
    pub timeout: std::time::Duration,
    /// The coordinator that issued the token: asked for the highest token right before the
    /// put where a version is an ETag (S3), whose bytes alone make it, so that a newer
    /// token's identical bytes do not let a paused writer's stale put through (ABA).
    pub sequencer: Sequencer<'a>,
}

/// Whom an S3 write asks, right before its put, whether its token is still the newest.
#[derive(Clone, Copy)]
pub enum Sequencer<'a> {
    /// No one: the target's versions never repeat (GCS generations, `file://`).
    NotNeeded,
    /// The store that issued the token (`--store`, `FENCE_STORE`, or the embedded default).
    Store(&'a dyn crate::coordinator::Coordinator),
    /// No store could be asked, for this reason (said in the warning).
    Unreachable(&'a str),
}

/// Writes `body` to the object, counting the bytes sent on `bar`.
pub async fn write(
    url: &ObjectUrl,
    write: &ObjectWrite<'_>,
    body: Vec<u8>,
    bar: &ProgressBar,
) -> Result<ObjectOutcome, Error> {
    let ObjectWrite {
        resource,
        token,
        owner,
        write_id,
        expect,
        timeout,
        sequencer,
    } = *write;
    if url.service == object::Service::S3 {
        ascii_metadata(url, "resource", resource)?;
        ascii_metadata(url, "owner", owner)?;
    }
    // Kept and compared only with a write id: a write without one does not hash its bytes.
    let digest = write_id
        .map(|_| crate::fenced::write_digest(&body))
        .unwrap_or_default();
    let api = object::open_reporting(url, bar.clone(), timeout)?;
    let current = api.head(&url.key).await?;
    // An object fence wrote before through this endpoint was written after its prefix was
    // verified through it; any other write (the first fenced one here, or one through another
    // endpoint: a proxy, a copy of the object on another server) needs the proof first.
    let proven = crate::fenced::write_digest(verify::identity(url).as_bytes());
    if !current.as_ref().is_some_and(|m| {
        m.metadata.contains_key(META_TOKEN) && m.metadata.get(META_PROVEN) == Some(&proven)
    }) {
        let dir = url.key.rsplit_once('/').map_or("", |(dir, _)| dir);
        verify::ensure(api.as_ref(), url, dir, false).await?;
    }
    let stale = |highest_token| Error::Stale {
        resource: resource.to_owned(),
        token,
        highest_token,
        target: None,
    };
    let conflict = |kind| Error::Conflict {
        resource: resource.to_owned(),
        token,
        kind,
    };
    if let Some(meta) = &current {
        // Tokens of different resources are not comparable: first make sure the object is
        // this resource's.
        match meta.metadata.get(META_RESOURCE) {
            Some(stored) if stored != resource => {
                return Err(conflict(ConflictKind::OtherResource {
                    stored: stored.clone(),
                }))
            }
            _ => {}
        }
        if let Some(entry) = find(Some(meta), write_id) {
            return replay(entry, &digest, write);
        }
        let stored = token_guarding(meta, &url.display)?;
        if stored > token {
            return Err(stale(stored));
        }
    }
    let version = current.as_ref().map(|m| m.version.clone());
    let mismatch = |expected: String| {
        conflict(ConflictKind::VersionMismatch {
            expected,
            actual: version.clone(),
        })
    };
    if let Some(expected) = expect.if_generation_match {
        let holds = match &version {
            None => expected == 0,
            Some(v) => expected != 0 && *v == expected.to_string(),
        };
        if !holds {
            return Err(mismatch(expected.to_string()));
        }
    }
    if let Some(expected) = &expect.if_match {
        if !version.as_deref().is_some_and(|v| same_etag(v, expected)) {
            return Err(mismatch(expected.clone()));
        }
    }
    let mut metadata = BTreeMap::from([
        (META_TOKEN.to_owned(), token.to_string()),
        (META_RESOURCE.to_owned(), resource.to_owned()),
        (META_PROVEN.to_owned(), proven),
    ]);
    if !owner.is_empty() {
        metadata.insert(META_OWNER.to_owned(), owner.to_owned());
    }
    if let Some(id) = write_id {
        metadata.insert(META_ID.to_owned(), id.to_owned());
        metadata.insert(META_ID_DIGEST.to_owned(), digest.clone());
    }
    if let Some(older) = older_ids(current.as_ref()) {
        metadata.insert(META_IDS.to_owned(), older);
    }
    let cond = match &version {
        Some(v) => Cond::Match(v.clone()),
        None => Cond::Create,
    };
    // Where a version is made by the bytes alone (an S3 ETag), a newer token that wrote the
    // same bytes leaves the version this write read, and its put would pass: the coordinator
    // says, right before the put, whether a newer token exists (the window left is this
    // round trip).
    // Its answer also says whether the token was ever issued: a token above every one issued
    // (a typo) would otherwise be stored, and refuse the lease's real holder (review 15).
    let unconfirmed = |why: &dyn std::fmt::Display| {
        crate::terminal::warn(&format!(
            "warning: the coordinator could not confirm that token {token} is still the newest for `{resource}` ({why}); an S3 object's version does not change with the token alone, so a newer token's identical bytes would not stop this write"
        ));
    };
    if url.service == object::Service::S3 {
        match sequencer {
            Sequencer::Store(store) => match store.highest_token(resource).await {
                Ok(Some(highest)) if highest > token => return Err(stale(highest)),
                Ok(Some(highest)) if highest < token => {
                    return Err(conflict(ConflictKind::NeverIssued {
                        highest_token: highest,
                    }))
                }
                Ok(Some(_)) => {}
                Ok(None) => return Err(conflict(ConflictKind::NeverIssued { highest_token: 0 })),
                Err(err) => unconfirmed(&err),
            },
            Sequencer::Unreachable(why) => unconfirmed(&why),
            Sequencer::NotNeeded => {}
        }
    }
    let bytes = body.len();
    match api.put(&url.key, body, &cond, &metadata).await? {
        Put::Done(meta) => Ok(ObjectOutcome::Written(ObjectWritten {
            version: meta.version,
            previous: version,
            bytes,
        })),
        Put::Lost => {
            let again = api.head(&url.key).await?;
            // A concurrent write with the same id won: the effect is there once.
            if let Some(entry) = find(again.as_ref(), write_id) {
                return replay(entry, &digest, write);
            }
            let stored = match &again {
                Some(meta) => token_guarding(meta, &url.display)?,
                None => 0,
            };
            match again {
                Some(_) if stored > token => Err(stale(stored)),
                // This token and owner stored a version after the one this write was
                // conditioned on: this write, whose first answer was lost and whose retry met
                // its own version (or another write under the same lease). Never "nothing was
                // written": the outcome is unknown to fence.
                Some(meta)
                    if stored == token
                        && Some(meta.version.as_str()) != version.as_deref()
                        && meta.metadata.get(META_OWNER).map_or("", String::as_str) == owner =>
                {
                    Err(Error::OutcomeUnknown {
                        message: format!(
                            "the write to `{}` may have been applied: the object now holds version {} with token {token} of this owner, written after version {} that this write was conditioned on (an answer lost on the way, then a retry that met it)",
                            url.display,
                            meta.version,
                            version.as_deref().unwrap_or("(none: created)"),
                        ),
                        hint: format!(
                            "compare the object with what was to be written (`fence inspect --target {}`) before writing again; a write with --id KEY is replayed instead",
                            crate::error::shell_word(&url.display)
                        ),
                        source: None,
                    })
                }
                other => Err(conflict(ConflictKind::ConcurrentWrite {
                    version: other.map(|m| m.version),
                })),
            }
        }
    }
}

/// The answer to a write whose id is in the ledger already: a replay when the entry was
/// made by the same bytes (or before digests were kept), a conflict when by other bytes.
fn replay(entry: IdEntry, digest: &str, write: &ObjectWrite<'_>) -> Result<ObjectOutcome, Error> {
    crate::fenced::check_reused_id(
        entry.digest.as_deref(),
        digest,
        write.resource,
        write.token,
        &entry.id,
        entry.token,
    )?;
    Ok(ObjectOutcome::Replayed(entry))
}

/// The entry of write id `id` in the object's ledger, with the resource the object belongs to
/// (`None` when the object is absent or the id is not there).
pub async fn lookup(url: &ObjectUrl, id: &str) -> Result<(Option<String>, Option<IdEntry>), Error> {
    let api = object::open(url)?;
    let meta = api.head(&url.key).await?;
    if meta.is_none() && url.service != object::Service::File {
        // A missing bucket is not "never applied": a listing names it (as in `view`).
        api.list(url.key.rsplit_once('/').map_or("", |(dir, _)| dir))
            .await?;
    }
    Ok((
        meta.as_ref()
            .and_then(|m| m.metadata.get(META_RESOURCE).cloned()),
        find(meta.as_ref(), Some(id)),
    ))
}

/// The fence state of an object.
pub async fn view(url: &ObjectUrl) -> Result<ObjectView, Error> {
    let api = object::open(url)?;
    let meta = api.head(&url.key).await?;
    if meta.is_none() && url.service != object::Service::File {
        // A missing object, or a missing bucket (a HEAD's 404 does not say which): a listing
        // fails with the bucket named when the bucket is missing.
        api.list(url.key.rsplit_once('/').map_or("", |(dir, _)| dir))
            .await?;
    }
    Ok(ObjectView {
        version: meta.as_ref().map(|m| m.version.clone()),
        token: meta.as_ref().map(stored_token).filter(|t| *t > 0),
        resource: meta
            .as_ref()
            .and_then(|m| m.metadata.get(META_RESOURCE).cloned()),
        owner: meta
            .as_ref()
            .and_then(|m| m.metadata.get(META_OWNER).cloned())
            .filter(|owner| !owner.is_empty()),
        updated_at_ms: meta.map(|m| m.last_modified_ms),
    })
}

/// `fence log --target OBJECT_URL`: the writes the object shows it accepted, oldest first —
/// the current version (token, owner, resource, its Last-Modified) and the versions before
/// it whose write had an id (`fence-ids`: token, time, version; no owner). An object keeps no
/// refusals: a refused write changes nothing in it (see `fence write`, which records the
/// refusal in the coordinator's history when it can).
pub async fn log(url: &ObjectUrl) -> Result<Vec<crate::timeline::Logged>, Error> {
    let api = object::open(url)?;
    let Some(meta) = api.head(&url.key).await? else {
        return Ok(Vec::new());
    };
    let Some(resource) = meta.metadata.get(META_RESOURCE).cloned() else {
        // Never written by fence: no accepted write to show.
        return Ok(Vec::new());
    };
    let mut entries = ledger(&meta);
    if !meta.metadata.contains_key(META_ID) {
        entries.insert(
            0,
            IdEntry {
                id: String::new(),
                token: stored_token(&meta),
                applied_at_ms: meta.last_modified_ms,
                owner: meta
                    .metadata
                    .get(META_OWNER)
                    .filter(|owner| !owner.is_empty())
                    .cloned(),
                version: meta.version.clone(),
                digest: None,
            },
        );
    }
    let mut logged: Vec<crate::timeline::Logged> = entries
        .into_iter()
        .map(|entry| {
            let mut detail = format!("version {}", entry.version);
            if !entry.id.is_empty() {
                detail.push_str(&format!(", id {}", entry.id));
            }
            crate::timeline::Logged {
                resource: resource.clone(),
                at_us: entry.applied_at_ms.saturating_mul(1000),
                event: crate::timeline::Event {
                    owner: entry.owner,
                    token: Some(entry.token),
                    detail: Some(detail),
                    ..crate::timeline::Event::new(
                        crate::timeline::EventKind::WriteAccepted,
                        entry.applied_at_ms,
                    )
                },
            }
        })
        .collect();
    logged.reverse();
    Ok(logged)
}

/// An object target (`s3://`, `gs://`, `file://`): the object holds its own fencing state
/// (token, resource, the ids of its last writes) in its metadata.
pub struct ObjectTarget {
    url: ObjectUrl,
    display: String,
}

impl ObjectTarget {
    pub fn new(url: ObjectUrl, display: &str) -> ObjectTarget {
        ObjectTarget {
            url,
            display: display.to_owned(),
        }
    }
}

#[async_trait::async_trait(?Send)]
impl FencedTarget for ObjectTarget {
    fn display(&self) -> &str {
        &self.display
    }

    /// S3's ETags do not tell two versions with the same bytes apart (see
    /// [`ObjectWrite::sequencer`]).
    fn needs_sequencer(&self) -> bool {
        self.url.service == object::Service::S3
    }

    /// Only an accepted write changes an object: it cannot keep its refusals.
    fn records_refusals(&self) -> bool {
        false
    }

    fn remembers_ids(&self) -> Option<usize> {
        Some(LEDGER_IDS)
    }

    async fn write(&self, request: WriteRequest<'_>) -> Result<Outcome, Error> {
        let Body::Bytes {
            bytes,
            expect,
            sequencer,
            bar,
        } = request.body
        else {
            return Err(wrong_form(&self.display, true));
        };
        let object_write = ObjectWrite {
            sequencer,
            resource: request.resource,
            token: request.token,
            owner: request.owner,
            write_id: request.write_id,
            expect,
            timeout: request.timeout,
        };
        Ok(Outcome::Object(
            write(&self.url, &object_write, bytes, bar).await?,
        ))
    }

    async fn view(&self, _resources: &[String]) -> Result<TargetView, Error> {
        Ok(TargetView::Object(view(&self.url).await?))
    }

    /// Refuses a resource other than the one whose tokens fence the object: its ledger is
    /// that resource's.
    async fn applied(&self, resource: &str, id: &str) -> Result<Option<Applied>, Error> {
        let (stored_resource, entry) = lookup(&self.url, id).await?;
        if let Some(stored) = stored_resource.filter(|stored| *stored != resource) {
            return Err(Error::usage(
                format!(
                    "`{}` is fenced by resource `{stored}`, not `{resource}`",
                    self.display
                ),
                format!(
                    "look the id up with the resource that guards the object: `{}`",
                    crate::error::command_for(
                        "fence inspect",
                        &stored,
                        &format!(" --target … --id {id}")
                    )
                ),
            ));
        }
        Ok(entry.map(|e| Applied {
            at_ms: e.applied_at_ms,
            token: e.token,
            owner: e.owner,
            version: Some(e.version),
        }))
    }

    /// An object holds only what it accepted, a few versions' worth: read whole, then
    /// narrowed to the query.
    async fn log(&self, query: &LogQuery<'_>) -> Result<Vec<Logged>, Error> {
        let mut events: Vec<Logged> = log(&self.url)
            .await?
            .into_iter()
            .filter(|l| query.matches(&l.resource) && query.in_range(l.event.at_ms))
            .collect();
        let older = events.len().saturating_sub(query.limit);
        events.drain(..older);
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(version: &str, pairs: &[(&str, &str)]) -> Meta {
        Meta {
            version: version.into(),
            last_modified_ms: 1_000,
            metadata: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn the_ledger_keeps_the_last_ids() {
        let mut current: Option<Meta> = None;
        for n in 0..20 {
            let mut pairs = vec![
                (META_TOKEN.to_owned(), n.to_string()),
                (META_OWNER.to_owned(), format!("owner-{n}")),
                (META_ID.to_owned(), format!("id-{n}")),
            ];
            if let Some(older) = older_ids(current.as_ref()) {
                pairs.push((META_IDS.to_owned(), older));
            }
            let pairs: Vec<(&str, &str)> = pairs
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            current = Some(meta(&format!("\"etag-{n}\""), &pairs));
        }
        let entries = ledger(current.as_ref().unwrap());
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(
            ids,
            ["id-19", "id-18", "id-17", "id-16", "id-15", "id-14", "id-13", "id-12"]
        );
        assert_eq!(entries[0].owner.as_deref(), Some("owner-19"));
        assert_eq!(entries[1].owner, None);
        assert_eq!(
            (entries[1].token, entries[1].version.as_str()),
            (18, "\"etag-18\"")
        );
        // The worst case fits S3's 2 KB of user metadata.
        let long = "x".repeat(crate::config::MAX_WRITE_ID_BYTES);
        let digest = crate::fenced::write_digest(b"bytes");
        let entry = format!(
            "{long},{},{},\"{}-10000\",{digest}",
            i64::MAX,
            1_000_000_000_000_000i64,
            "f".repeat(32)
        );
        let worst = [
            (META_TOKEN, i64::MAX.to_string()),
            (META_RESOURCE, "r".repeat(200)),
            (META_OWNER, "o".repeat(200)),
            (META_ID, long.clone()),
            (META_ID_DIGEST, digest.clone()),
            (META_IDS, vec![entry; LEDGER_IDS - 1].join(";")),
        ];
        let size: usize = worst.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(size < 2048, "{size}");
    }

    #[test]
    fn a_hand_written_ledger_does_not_break_reading() {
        let m = meta("7", &[(META_IDS, "a,1,2,3;garbage;;b,x,1,2;c,4,5,6")]);
        let ids: Vec<String> = ledger(&m).into_iter().map(|e| e.id).collect();
        assert_eq!(ids, ["a", "c"]);
    }
}
