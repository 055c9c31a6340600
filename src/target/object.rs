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
//! S3 caveat (ABA): an ETag is a hash of the bytes, so if a newer writer stores bytes identical
//! to those fence read, between fence's read and its put, `If-Match` still passes and the newer
//! writer's metadata is replaced. fence keeps that window to one round trip (no work happens
//! between the read and the put) and cannot detect it afterwards without bucket versioning;
//! GCS and `file://` generations never repeat and have no such window.

use std::collections::BTreeMap;

use indicatif::ProgressBar;

use crate::error::{ConflictKind, Error};
use crate::object::{
    self, verify, Cond, Meta, ObjectUrl, Put, META_OWNER, META_RESOURCE, META_TOKEN,
};

/// The caller's own expectation of the current version.
#[derive(Clone, Debug, Default)]
pub struct Expect {
    pub if_match: Option<String>,
    pub if_generation_match: Option<u64>,
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

fn stored_token(meta: &Meta) -> i64 {
    meta.metadata
        .get(META_TOKEN)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
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

/// Writes `body` to the object with `token` for `resource`, counting the bytes sent on `bar`.
pub async fn write(
    url: &ObjectUrl,
    resource: &str,
    token: i64,
    owner: &str,
    body: Vec<u8>,
    expect: &Expect,
    bar: &ProgressBar,
) -> Result<ObjectWritten, Error> {
    let api = object::open_reporting(url, bar.clone())?;
    let current = api.head(&url.key).await?;
    // An object fence wrote before was written after its prefix was verified; any other
    // write is the first fenced one here and needs the proof first.
    if !current
        .as_ref()
        .is_some_and(|m| m.metadata.contains_key(META_TOKEN))
    {
        let dir = url.key.rsplit_once('/').map_or("", |(dir, _)| dir);
        verify::ensure(api.as_ref(), url, dir, false).await?;
    }
    let stale = |highest_token| Error::Stale {
        resource: resource.to_owned(),
        token,
        highest_token,
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
        if stored_token(meta) > token {
            return Err(stale(stored_token(meta)));
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
    ]);
    if !owner.is_empty() {
        metadata.insert(META_OWNER.to_owned(), owner.to_owned());
    }
    let cond = match &version {
        Some(v) => Cond::Match(v.clone()),
        None => Cond::Create,
    };
    let bytes = body.len();
    match api.put(&url.key, body, &cond, &metadata).await? {
        Put::Done(meta) => Ok(ObjectWritten {
            version: meta.version,
            previous: version,
            bytes,
        }),
        Put::Lost => {
            let again = api.head(&url.key).await?;
            match again {
                Some(meta) if stored_token(&meta) > token => Err(stale(stored_token(&meta))),
                other => Err(conflict(ConflictKind::ConcurrentWrite {
                    version: other.map(|m| m.version),
                })),
            }
        }
    }
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
