//! Refused attempts of a resource (`attempts/<name>.json`): busy acquisitions and
//! conflicting renewals and releases, coalesced per owner, kind and minute (a count, the first
//! and last time), so that "who else tried" has an answer and a busy loop cannot grow the
//! store. Rewritten under the resource's lock (not fsynced: it is history, not the counter);
//! the newest [`KEEP`] minutes stay, and the attempts of those dropped are added to
//! `attempts/<name>%totals.json` (per kind), so that `fence metrics`' counters never go down.

use std::collections::BTreeMap;
use std::io::{self, ErrorKind};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::coordinator::attempts::ATTEMPT_MINUTE_MS;
use crate::coordinator::{Attempt, Event, EventKind};
use crate::sys::replace;

/// Minutes kept per resource: a day of one owner retrying every minute, or many owners.
const KEEP: usize = 1_440;

/// The attempts of one owner and kind within one minute.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Minute {
    pub owner: String,
    pub kind: EventKind,
    /// The start of the minute (ms since the epoch); `window_ms` on disk, as stores written
    /// before the rename have it.
    #[serde(rename = "window_ms")]
    pub minute_ms: i64,
    pub count: i64,
    pub first_ms: i64,
    pub last_ms: i64,
    /// The last attempt's token (busy: the holder's) and why it was refused.
    pub token: i64,
    pub detail: String,
}

impl Minute {
    pub fn event(&self) -> Event {
        Event {
            owner: Some(self.owner.clone()),
            token: Some(self.token),
            detail: Some(self.detail.clone()),
            count: Some(self.count),
            last_at_ms: Some(self.last_ms),
            ..Event::new(self.kind.clone(), self.first_ms)
        }
    }
}

/// The minutes of a resource, oldest first (none when the file does not exist).
pub(super) fn read(path: &Path) -> io::Result<Vec<Minute>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|err| io::Error::new(ErrorKind::InvalidData, format!("damaged: {err}"))),
        Err(err) if err.kind() == ErrorKind::NotFound => Ok(Vec::new()),
        Err(err) => Err(err),
    }
}

/// The attempts of minutes no longer kept, per kind (none when the file does not exist).
pub(super) fn dropped(path: &Path) -> io::Result<BTreeMap<EventKind, i64>> {
    match std::fs::read(totals_path(path)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|err| io::Error::new(ErrorKind::InvalidData, format!("damaged: {err}"))),
        Err(err) if err.kind() == ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(err) => Err(err),
    }
}

/// Every refused attempt of a resource the file has ever counted, per kind: the minutes kept
/// and those dropped.
pub(super) fn totals(path: &Path) -> io::Result<BTreeMap<EventKind, i64>> {
    // A damaged file (moved aside at the next attempt) counts as what was dropped before it.
    let kept = match read(path) {
        Err(err) if err.kind() == ErrorKind::InvalidData => Vec::new(),
        kept => kept?,
    };
    let mut totals = match dropped(path) {
        Err(err) if err.kind() == ErrorKind::InvalidData => BTreeMap::new(),
        dropped => dropped?,
    };
    for minute in kept {
        *totals.entry(minute.kind).or_default() += minute.count;
    }
    Ok(totals)
}

/// `attempts/<name>%totals.json`: no resource's attempts file (`<name>.json`, whose `%` is
/// always followed by two hex digits) can have that name.
fn totals_path(path: &Path) -> std::path::PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("{stem}%totals.json"))
}

/// Adds `attempt` at `now_ms` to its minute (a new one at the start of a minute). A damaged
/// file is moved aside (`<name>.json.damaged-<ms>`, with a warning) and a new one started:
/// what it held is kept for a look, and the next attempts are recorded.
pub(super) fn note(path: &Path, attempt: &Attempt, now_ms: i64) -> io::Result<()> {
    let mut minutes = match read(path) {
        Ok(minutes) => minutes,
        Err(err) if err.kind() == ErrorKind::InvalidData => {
            let aside = path.with_extension(format!("json.damaged-{now_ms}"));
            std::fs::rename(path, &aside)?;
            crate::terminal::warn(&format!(
                "warning: the record of refused attempts `{}` was {err}; it was moved aside to `{}` and a new one started",
                path.display(),
                aside.display()
            ));
            Vec::new()
        }
        Err(err) => return Err(err),
    };
    let minute_ms = now_ms - now_ms.rem_euclid(ATTEMPT_MINUTE_MS);
    match minutes
        .iter_mut()
        .find(|w| w.minute_ms == minute_ms && w.owner == attempt.owner && w.kind == attempt.kind)
    {
        Some(w) => {
            w.count += 1;
            w.last_ms = now_ms;
            w.token = attempt.token;
            w.detail.clone_from(&attempt.detail);
        }
        None => minutes.push(Minute {
            owner: attempt.owner.clone(),
            kind: attempt.kind.clone(),
            minute_ms,
            count: 1,
            first_ms: now_ms,
            last_ms: now_ms,
            token: attempt.token,
            detail: attempt.detail.clone(),
        }),
    }
    if minutes.len() > KEEP {
        let mut totals = dropped(path).unwrap_or_default();
        for minute in minutes.drain(..minutes.len() - KEEP) {
            *totals.entry(minute.kind).or_default() += minute.count;
        }
        let body = serde_json::to_vec(&totals).map_err(io::Error::other)?;
        replace(&totals_path(path), &body, false)?;
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let body = serde_json::to_vec(&minutes).map_err(io::Error::other)?;
    replace(path, &body, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Minutes dropped past [`KEEP`] are counted in the totals file: the per-kind totals
    /// `fence metrics` reads never go down.
    #[test]
    fn dropped_minutes_stay_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.json");
        let full: Vec<Minute> = (0..KEEP as i64)
            .map(|i| Minute {
                owner: format!("o{i}"),
                kind: EventKind::Busy,
                minute_ms: i * ATTEMPT_MINUTE_MS,
                count: 2,
                first_ms: i * ATTEMPT_MINUTE_MS,
                last_ms: i * ATTEMPT_MINUTE_MS,
                token: 1,
                detail: String::new(),
            })
            .collect();
        std::fs::write(&path, serde_json::to_vec(&full).unwrap()).unwrap();
        let before = totals(&path).unwrap()[&EventKind::Busy];
        assert_eq!(before, 2 * KEEP as i64);
        let attempt = Attempt {
            resource: "job".into(),
            owner: "late".into(),
            kind: EventKind::Conflict,
            token: 1,
            detail: String::new(),
        };
        for minute in 0..3 {
            let at = (KEEP as i64 + minute) * ATTEMPT_MINUTE_MS;
            note(&path, &attempt, at).unwrap();
        }
        assert_eq!(read(&path).unwrap().len(), KEEP, "the newest minutes stay");
        let after = totals(&path).unwrap();
        assert_eq!(after[&EventKind::Busy], before, "{after:?}");
        assert_eq!(after[&EventKind::Conflict], 3, "{after:?}");
        assert_eq!(dropped(&path).unwrap()[&EventKind::Busy], 6);
    }
}
