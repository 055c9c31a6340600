//! `inspect` of the directory store: the resources, their history read from the end of each
//! log, and what is wrong with the store's own files (damaged records, records below the
//! high-water mark, unreadable log lines), so that damage is never shown as "nothing here".

use std::collections::BTreeSet;
use std::fs;
use std::io::ErrorKind;

use super::attempts;
use super::counter::{self, Mark};
use super::log;
use super::record::{Now, Record};
use super::{FileCoordinator, Paths};
use crate::coordinator::{
    EventKind, Inspection, IntegrityFinding, LogQuery, Logged, ResourceView, State,
};
use crate::error::Error;
use crate::sys::sweep_temporaries;
use crate::timeline::newest;
use crate::url::percent_decode;

impl FileCoordinator {
    /// Removes temporary files of killed processes (records, new high-water marks and pruned
    /// logs being written, and the old files a replace had exchanged out, see `sys::replace`).
    pub(super) fn sweep(&self) {
        for sub in ["leases", "events", "attempts", "tokens"] {
            sweep_temporaries(&self.dir.join(sub));
        }
    }

    /// Every resource with a record or a high-water file, by the names of its files. A
    /// shortened file name (`…~hash`) cannot be decoded: the record holds the name, and the
    /// high-water file of a resource with a record is the same resource.
    pub(super) fn known_names(&self) -> Result<Vec<String>, Error> {
        let mut names = BTreeSet::new();
        let mut recorded = BTreeSet::new();
        for (sub, suffix) in [("leases", ".json"), ("tokens", ".high")] {
            let dir = self.dir.join(sub);
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(err) if err.kind() == ErrorKind::NotFound => continue,
                Err(err) => return Err(self.io_error("list", &dir, &err)),
            };
            for entry in entries {
                let entry = entry.map_err(|err| self.io_error("list", &dir, &err))?;
                let file_name = entry.file_name();
                let Some(stem) = file_name
                    .to_str()
                    .filter(|n| !n.starts_with('.'))
                    .and_then(|n| n.strip_suffix(suffix))
                else {
                    continue;
                };
                if sub == "tokens" && recorded.contains(stem) {
                    continue;
                }
                if sub == "leases" {
                    recorded.insert(stem.to_owned());
                }
                let name = match fs::read(entry.path())
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
                {
                    Some(record) => record.resource,
                    None => percent_decode(stem).unwrap_or_else(|| stem.to_owned()),
                };
                names.insert(name);
            }
        }
        Ok(names.into_iter().collect())
    }

    /// Fails closed on a directory that does not exist: reading it would show "nothing here"
    /// for a typo in `--store`.
    pub(super) fn require_dir(&self) -> Result<(), Error> {
        if self.dir.is_dir() {
            return Ok(());
        }
        Err(Error::usage(
            format!("no store at `{}`", self.dir.display()),
            "check --store or FENCE_STORE (under cron, HOME and XDG_STATE_HOME may differ from your shell's); `fence init` or the first `fence acquire` creates a store",
        ))
    }

    pub(super) fn inspect_store(
        &self,
        resources: &[String],
        history: usize,
    ) -> Result<Inspection, Error> {
        self.require_dir()?;
        self.sweep();
        let now = Now::read()?;
        let names = if resources.is_empty() {
            self.known_names()?
        } else {
            resources.to_vec()
        };
        let mut inspection = Inspection::default();
        for name in &names {
            let paths = self.paths(name);
            let (view, findings) = self.view(name, &paths, &now, history)?;
            inspection.views.push(view);
            inspection.findings.extend(findings);
        }
        Ok(inspection)
    }

    /// `fence log`: each matching resource's log read back from its end to the start of the
    /// window (or `limit` events), then the newest `limit` of them all.
    pub(super) fn log_store(&self, query: &LogQuery<'_>) -> Result<Vec<Logged>, Error> {
        self.require_dir()?;
        let names = match query.exact_names() {
            Some(names) => names,
            None => self
                .known_names()?
                .into_iter()
                .filter(|n| query.matches(n))
                .collect(),
        };
        let mut logged = Vec::new();
        for name in names {
            let paths = self.paths(&name);
            let tail = log::tail_until(&paths.events, query.limit, |e| {
                query.since_ms.is_some_and(|since| e.at_ms < since)
            })
            .map_err(|err| self.io_error("read the event log", &paths.events, &err))?;
            // The log's order is the order the store decided in (appended under the
            // resource's lock); the wall-clock stamps are only each writer's clock, and one
            // writer's clock running fast must not reorder them (a false "token regressed").
            // So the sort key never goes down along the log, while each event keeps its time.
            let mut key = i64::MIN;
            logged.extend(
                tail.events
                    .into_iter()
                    .rev()
                    .filter(|e| query.in_range(e.at_ms))
                    .map(|e| {
                        key = key.max(e.at_ms.saturating_mul(1000));
                        Logged {
                            resource: name.clone(),
                            at_us: key,
                            event: e.into_event(),
                        }
                    }),
            );
            logged.extend(self.attempts_logged(&name, &paths, query)?);
        }
        newest(&mut logged, query.limit);
        Ok(logged)
    }

    /// The refused attempts of `name` in the window, as the timeline shows them.
    fn attempts_logged(
        &self,
        name: &str,
        paths: &Paths,
        query: &LogQuery<'_>,
    ) -> Result<Vec<Logged>, Error> {
        let minutes = match attempts::read(&paths.attempts) {
            Ok(minutes) => minutes,
            // Refused attempts are a convenience, not what a guarantee rests on: a damaged
            // record is left out of the timeline, said, and moved aside by the next refusal.
            Err(err) if err.kind() == std::io::ErrorKind::InvalidData => {
                crate::terminal::warn(&format!(
                    "warning: the record of refused attempts `{}` is {err}; its attempts are left out (the next refused attempt moves it aside)",
                    paths.attempts.display()
                ));
                Vec::new()
            }
            Err(err) => {
                return Err(self.io_error("read the refused attempts", &paths.attempts, &err))
            }
        };
        Ok(minutes
            .iter()
            .filter(|w| query.in_range(w.first_ms))
            .map(|w| Logged {
                resource: name.to_owned(),
                at_us: w.first_ms.saturating_mul(1000),
                event: w.event(),
            })
            .collect())
    }

    /// [`Self::log_store`], each event handed to `each` as it is read, oldest first, until
    /// it returns false: each matching resource's log is read forwards from the oldest event
    /// of the window ([`log::Forward`]), the resources merged by time, and the oldest events
    /// beyond `limit` passed over. Memory follows the number of resources (a buffer for each
    /// log longer than 64 KiB, the whole of a shorter one, their refused attempts), not
    /// their length.
    pub(super) fn log_each_store(
        &self,
        query: &LogQuery<'_>,
        each: &mut dyn FnMut(Logged) -> bool,
    ) -> Result<(), Error> {
        self.require_dir()?;
        let names = match query.exact_names() {
            Some(names) => names,
            None => self
                .known_names()?
                .into_iter()
                .filter(|n| query.matches(n))
                .collect(),
        };
        // Per resource, in name order: its log, then its refused attempts (as `log_store`
        // lists them before its stable sort by time).
        let mut sources: Vec<Source> = Vec::new();
        let mut total = 0usize;
        for name in names {
            let paths = self.paths(&name);
            let events = log::Forward::open(
                &paths.events,
                query.limit,
                |e| query.since_ms.is_some_and(|since| e.at_ms < since),
                |e| query.in_range(e.at_ms),
            )
            .map_err(|err| self.io_error("read the event log", &paths.events, &err))?;
            total += events.kept;
            let mut attempts = self.attempts_logged(&name, &paths, query)?;
            attempts.sort_by_key(|l| l.at_us);
            total += attempts.len();
            sources.push(Source::Log {
                name: name.clone(),
                path: paths.events.clone(),
                events,
                key: i64::MIN,
            });
            sources.push(Source::Listed(attempts.into_iter()));
        }
        let mut skip = total.saturating_sub(query.limit);
        let mut heads: std::collections::BinaryHeap<std::cmp::Reverse<(i64, usize)>> =
            Default::default();
        let mut pending: Vec<Option<Logged>> = Vec::with_capacity(sources.len());
        for (i, source) in sources.iter_mut().enumerate() {
            let head = source
                .next(query)
                .map_err(|(path, err)| self.io_error("read the event log", &path, &err))?;
            if let Some(l) = &head {
                heads.push(std::cmp::Reverse((l.at_us, i)));
            }
            pending.push(head);
        }
        while let Some(std::cmp::Reverse((_, i))) = heads.pop() {
            let Some(logged) = pending[i].take() else {
                continue;
            };
            let head = sources[i]
                .next(query)
                .map_err(|(path, err)| self.io_error("read the event log", &path, &err))?;
            if let Some(l) = &head {
                heads.push(std::cmp::Reverse((l.at_us, i)));
            }
            pending[i] = head;
            if skip > 0 {
                skip -= 1;
                continue;
            }
            if !each(logged) {
                break;
            }
        }
        Ok(())
    }

    /// `fence metrics`: each resource's events per kind, over its whole log and what its
    /// retention cut.
    pub(super) fn event_counts_store(&self) -> Result<Vec<(String, EventKind, i64)>, Error> {
        self.require_dir()?;
        let mut counts = Vec::new();
        for name in self.known_names()? {
            let paths = self.paths(&name);
            let totals = log::totals(&paths.events)
                .map_err(|err| self.io_error("read the event log", &paths.events, &err))?;
            counts.extend(totals.into_iter().map(|(kind, n)| (name.clone(), kind, n)));
        }
        Ok(counts)
    }

    fn view(
        &self,
        name: &str,
        paths: &Paths,
        now: &Now,
        history: usize,
    ) -> Result<(ResourceView, Vec<IntegrityFinding>), Error> {
        let mut findings = Vec::new();
        let mut finding = |kind: &'static str, message: String| {
            findings.push(IntegrityFinding {
                resource: name.to_owned(),
                kind,
                message,
            });
        };
        let tail = log::tail(&paths.events, history.max(256))
            .map_err(|err| self.io_error("read the event log", &paths.events, &err))?;
        if tail.skipped > 0 {
            finding(
                "skipped_log_lines",
                format!(
                    "{} line(s) of the event log `{}` are not events (damaged, or torn by a crash) and were skipped",
                    tail.skipped,
                    paths.events.display()
                ),
            );
        }
        let logged = tail
            .events
            .iter()
            .filter_map(|e| e.token)
            .max()
            .unwrap_or(0);
        let mark = match counter::read(&paths.high) {
            Ok(Mark::Token(token)) => token,
            Ok(Mark::Missing) => 0,
            Ok(Mark::Damaged(what)) => {
                finding(
                    "damaged",
                    format!(
                        "the high-water file `{}` is damaged: {what}",
                        paths.high.display()
                    ),
                );
                0
            }
            Err(err) => return Err(self.io_error("read", &paths.high, &err)),
        };
        let issued = mark.max(logged);
        let last_change = tail.events.first().and_then(|e| e.change);
        let mut pending = None;
        let mut view = match self.read_record(paths, name) {
            Err(Error::Internal { message, .. }) => {
                finding("damaged", message);
                let mut view = ResourceView::unknown(name);
                view.state = State::Damaged;
                view
            }
            Err(err) => return Err(err),
            Ok(None) => {
                if issued > 0 {
                    finding(
                        "record_missing",
                        format!(
                            "the lease record `{}` is missing or empty (moved aside or deleted, or taken by a power loss before it was synced); token {issued} was issued, and the next token continues above it",
                            paths.lease.display()
                        ),
                    );
                }
                ResourceView::unknown(name)
            }
            Ok(Some(record)) => {
                if record.token < issued {
                    finding(
                        "restored",
                        format!(
                            "the lease record `{}` holds token {}, but token {issued} was issued before: it was restored from an older copy, rolled back, or a power loss took its last grant (or a grant failed after it had reserved its token: a full disk); the next token continues above {issued}",
                            paths.lease.display(),
                            record.token
                        ),
                    );
                }
                // The record's last change, when a kill or a power loss kept it from the
                // log, is shown as the next change will record it (review 20: a run id
                // whose release was missing from the log lost its command's digest).
                pending = super::unlogged(&record, last_change, super::NOT_LOGGED_YET);
                self.record_view(name, &record, now)
            }
        };
        view.waiters = self.waiters(name);
        view.events = pending
            .into_iter()
            .chain(tail.events)
            .take(history)
            .map(log::EventLine::into_event)
            .collect();
        Ok((view, findings))
    }

    fn record_view(&self, name: &str, record: &Record, now: &Now) -> ResourceView {
        let state = if record.released {
            State::Free
        } else if record.is_live(now, &self.boot_id) {
            State::Held
        } else {
            State::Expired
        };
        let shown = state != State::Free;
        ResourceView {
            resource: name.to_owned(),
            state,
            owner: shown.then(|| record.owner.clone()),
            token: Some(record.token),
            acquired_at_ms: Some(record.acquired_at_ms),
            renewed_at_ms: Some(record.renewed_at_ms),
            expires_at_ms: shown.then_some(record.expires_at_ms),
            waiters: Vec::new(),
            expires_in_ms: shown.then(|| record.expires_in_ms(now, &self.boot_id)),
            events: Vec::new(),
        }
    }
}

/// One of the sorted sequences [`FileCoordinator::log_each_store`] merges.
enum Source {
    /// A resource's log, read forwards; `key` is the last sort key given (see `log_store`).
    Log {
        name: String,
        path: std::path::PathBuf,
        events: log::Forward,
        key: i64,
    },
    /// A resource's refused attempts in the window, by time.
    Listed(std::vec::IntoIter<Logged>),
}

impl Source {
    /// The next event in the window, with its sort key; the path of a log that fails.
    fn next(
        &mut self,
        query: &LogQuery<'_>,
    ) -> Result<Option<Logged>, (std::path::PathBuf, std::io::Error)> {
        match self {
            Source::Listed(list) => Ok(list.next()),
            Source::Log {
                name,
                path,
                events,
                key,
            } => {
                for event in events.by_ref() {
                    let event = event.map_err(|err| (path.clone(), err))?;
                    if !query.in_range(event.at_ms) {
                        continue;
                    }
                    *key = (*key).max(event.at_ms.saturating_mul(1000));
                    return Ok(Some(Logged {
                        resource: name.clone(),
                        at_us: *key,
                        event: event.into_event(),
                    }));
                }
                Ok(None)
            }
        }
    }
}
