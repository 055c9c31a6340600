//! Expected outcomes other than success, each carrying what an operator needs to act.
//!
//! Every variant maps to exactly one exit code in [`Error::exit`]; the message says what
//! happened and the hint what to do next. Messages never include secrets: URLs are shown
//! through [`crate::url::redact_url`] before they reach an error.

use serde_json::{json, Map, Value};

use crate::exit::Exit;
use crate::time;

/// The live holder of a lease, as reported on `busy`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub owner: String,
    pub token: i64,
    /// Expiry by the coordinator's clock, milliseconds since the Unix epoch.
    pub expires_at_ms: i64,
    /// Remaining lifetime by the coordinator's clock at the time of the answer.
    pub expires_in_ms: i64,
}

/// Why a lease can no longer be renewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// The lease ran out before the renewal reached the coordinator.
    Expired,
    /// The lease was released (by this owner, or by a release carrying this token).
    Released,
    /// Another owner holds a newer token (`run` found out while renewing).
    TakenOver { highest_token: i64 },
    /// The coordinator could not confirm a renewal before the lease ran out (`run`).
    Unreachable,
    /// `fence run`'s supervisor of the command was killed or stopped answering: the command
    /// and everything it started were stopped (`run`; the lease itself may still have been
    /// valid, and was then released).
    SupervisorLost,
    /// A process of the command did not die on SIGKILL (uninterruptible sleep: a hung NFS or
    /// FUSE mount, a stuck device) and was still there once the lease could no longer be
    /// proven: what it does when it wakes is not contained (`run`).
    Unkillable,
    /// The store no longer records the lease, though it issued the token: its lease record
    /// is missing or older than the lease (deleted, moved aside, restored from an older copy,
    /// or taken by a power loss before it was synced; directory store).
    RecordLost,
    /// The store's grant or renewal arrived after the lease had run out, counted from when the
    /// request was sent (`acquire`, `renew`, `run`'s grant): the store answered slower than
    /// the TTL, waiting on a lock or a slow network.
    ArrivedLate,
}

impl LostReason {
    /// The reason's name on the wire (the JSON error's `reason`, a `run_stopped` event's).
    pub fn name(self) -> &'static str {
        match self {
            LostReason::Expired => "expired",
            LostReason::Released => "released",
            LostReason::TakenOver { .. } => "taken_over",
            LostReason::Unreachable => "unreachable",
            LostReason::SupervisorLost => "supervisor_lost",
            LostReason::Unkillable => "unkillable",
            LostReason::RecordLost => "record_lost",
            LostReason::ArrivedLate => "arrived_late",
        }
    }
}

/// Why a request was refused for a reason other than the token's age.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConflictKind {
    /// No lease was ever granted for the resource.
    NoLease,
    /// The token is higher than any the coordinator has issued for the resource.
    NeverIssued { highest_token: i64 },
    /// The token is current but belongs to another owner.
    WrongOwner { holder: String },
    /// A row-form write found no row with the given key.
    RowMissing { table: String },
    /// An object write's own precondition (`--if-match`, `--if-generation-match`) failed;
    /// `actual` is `None` when the object does not exist.
    VersionMismatch {
        expected: String,
        actual: Option<String>,
    },
    /// Another writer replaced the object between fence's read and its conditional write,
    /// without a newer token (re-read once, then classified).
    ConcurrentWrite { version: Option<String> },
    /// The object is fenced by another resource's tokens.
    OtherResource { stored: String },
    /// The write id was applied already, to a different write (other SQL or other bytes):
    /// neither replayed nor applied.
    IdReused {
        write_id: String,
        applied_token: i64,
    },
    /// The run id was completed already by a different command (other arguments): neither
    /// skipped nor run.
    RunIdReused { run_id: String },
}

/// The error of a dependency (the PostgreSQL driver, the object store client, I/O, TLS) that
/// a fence error was made from, kept as its `source()`: for logs and debugging, never shown
/// in place of the message and never classified by its text.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{message}")]
    Usage {
        message: String,
        hint: String,
        /// The dependency's error this one was made from, if any (see [`Error::with_source`]).
        #[source]
        source: Option<Cause>,
    },

    #[error(
        "`{resource}` is held by `{}` with token {} ({})",
        holder.owner,
        holder.token,
        time::expires_in(holder.expires_in_ms)
    )]
    Busy { resource: String, holder: Holder },

    /// Still busy when `--wait` ran out: exit 3 as [`Error::Busy`], saying how long it waited.
    #[error(
        "`{resource}` is still held by `{}` with token {} ({}) after waiting {}",
        holder.owner,
        holder.token,
        time::expires_in(holder.expires_in_ms),
        time::span(*waited_ms)
    )]
    WaitedOut {
        resource: String,
        holder: Holder,
        waited_ms: i64,
    },

    #[error("token {token} for `{resource}` is stale: token {highest_token} is newer")]
    Stale {
        resource: String,
        token: i64,
        highest_token: i64,
        /// The fenced target that refused the write (`fence write`), or none: the store
        /// refused a renewal or release, so it issued the newer token itself.
        target: Option<String>,
    },

    #[error("{}", lost_message(resource, *token, *reason))]
    LeaseLost {
        resource: String,
        owner: String,
        token: i64,
        reason: LostReason,
    },

    #[error("{}", conflict_message(resource, *token, kind))]
    Conflict {
        resource: String,
        token: i64,
        kind: ConflictKind,
    },

    #[error("{message}")]
    Unavailable {
        message: String,
        hint: String,
        #[source]
        source: Option<Cause>,
    },

    #[error("{message}")]
    OutcomeUnknown {
        message: String,
        hint: String,
        #[source]
        source: Option<Cause>,
    },

    #[error("{message}")]
    Internal {
        message: String,
        hint: String,
        #[source]
        source: Option<Cause>,
    },

    /// The database refused a request for a reason the caller has no better name for. The
    /// server's error is kept: its SQLSTATE classifies it ([`Error::sqlstate`]), never its
    /// text. Exit 1, printed like [`Error::Internal`].
    #[error("{message}")]
    Database {
        message: String,
        hint: String,
        #[source]
        source: Box<tokio_postgres::error::DbError>,
    },

    /// The caller's own SQL failed inside a fenced transaction, which was rolled back.
    #[error("the SQL failed and the transaction was rolled back: {message} (SQLSTATE {sqlstate})")]
    SqlFailed {
        resource: String,
        token: i64,
        sqlstate: String,
        message: String,
    },
}

/// What became of a lease: the end of a sentence that begins with the lease.
pub(crate) fn lost_reason_words(reason: LostReason) -> String {
    match reason {
        LostReason::Expired => "expired before it was renewed".to_owned(),
        LostReason::Released => "was released".to_owned(),
        LostReason::TakenOver { highest_token } => {
            format!("was taken over: token {highest_token} is newer")
        }
        LostReason::Unreachable => "could not be renewed before it ran out".to_owned(),
        LostReason::SupervisorLost => "lost the command's supervisor".to_owned(),
        LostReason::Unkillable => {
            "ran out while a process of the command would not die on SIGKILL".to_owned()
        }
        LostReason::RecordLost => "is no longer recorded: its lease record is missing or older than the lease (deleted, moved aside, restored from an older copy, or lost in a power loss)".to_owned(),
        LostReason::ArrivedLate => {
            "had run out, or all but, by the time the store's answer arrived".to_owned()
        }
    }
}

/// The `op` whose hints [`Error::hint_in`] gives for a `fence run` that failed before its
/// command started: a lease lost then (its grant's answers came late) stopped nothing.
pub const RUN_UNSTARTED: &str = "run, not started";

/// What makes a store's answer come after the TTL, for the hints of `arrived_late`.
const LATE_CAUSE: &str = "on PostgreSQL, a transaction holding a lock on fence's `leases` table or a row of it: `SELECT DISTINCT a.pid, a.xact_start, a.state, a.query FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.relation::regclass::text LIKE '%leases' AND a.pid <> pg_backend_pid()`; on a directory store, a slow disk; else the network, a proxy or a pooler";

fn lost_message(resource: &str, token: i64, reason: LostReason) -> String {
    let lease = format!("the lease on `{resource}` with token {token}");
    let words = lost_reason_words(reason);
    match reason {
        LostReason::Unreachable => format!(
            "{lease} {words} (the store was unreachable, or this process was paused)"
        ),
        LostReason::SupervisorLost => format!(
            "the command under {lease} lost its supervisor (`fence __reaper` was killed, or stopped and did not answer), so fence stopped the command and everything it started"
        ),
        LostReason::Unkillable => format!(
            "{lease} {words} (uninterruptible sleep), so its pending I/O may have landed after the lease was gone"
        ),
        LostReason::ArrivedLate => format!(
            "{lease} {words}: the store took longer than the TTL to answer"
        ),
        _ => format!("{lease} {words}"),
    }
}

fn conflict_message(resource: &str, token: i64, kind: &ConflictKind) -> String {
    match kind {
        ConflictKind::NoLease => format!("no lease has ever been granted on `{resource}`"),
        ConflictKind::NeverIssued { highest_token: 0 } => {
            format!("token {token} was never issued for `{resource}` (no token has been)")
        }
        ConflictKind::NeverIssued { highest_token } => format!(
            "token {token} was never issued for `{resource}` (the highest is {highest_token})"
        ),
        ConflictKind::WrongOwner { holder } => {
            format!("token {token} for `{resource}` belongs to `{holder}`, not to this owner")
        }
        ConflictKind::RowMissing { table } => {
            format!("no row of {table} has that key, so nothing was written for `{resource}`")
        }
        ConflictKind::VersionMismatch { expected, actual } => match actual {
            Some(actual) => format!(
                "the object is at version {actual}, not {expected} as required, so nothing was written for `{resource}`"
            ),
            None => format!(
                "the object does not exist (version {expected} was required), so nothing was written for `{resource}`"
            ),
        },
        ConflictKind::ConcurrentWrite { .. } => format!(
            "another writer replaced the object while token {token} for `{resource}` was writing it; nothing was written"
        ),
        ConflictKind::OtherResource { stored } => format!(
            "the object is fenced by resource `{stored}`, not `{resource}`; nothing was written"
        ),
        ConflictKind::IdReused {
            write_id,
            applied_token,
        } => format!(
            "write id `{write_id}` of `{resource}` was used already, with token {applied_token}, for a different write (its SQL or bytes differ); this one was not applied"
        ),
        ConflictKind::RunIdReused { run_id } => format!(
            "run id `{run_id}` of `{resource}` was completed already by a different command (its arguments differ); this one was not started"
        ),
    }
}

impl Error {
    pub fn usage(message: impl Into<String>, hint: impl Into<String>) -> Error {
        Error::Usage {
            message: message.into(),
            hint: hint.into(),
            source: None,
        }
    }

    pub fn unavailable(message: impl Into<String>, hint: impl Into<String>) -> Error {
        Error::Unavailable {
            message: message.into(),
            hint: hint.into(),
            source: None,
        }
    }

    pub fn internal(message: impl Into<String>, hint: impl Into<String>) -> Error {
        Error::Internal {
            message: message.into(),
            hint: hint.into(),
            source: None,
        }
    }

    /// An error whose outcome is unknown (exit 8): the request may or may not have applied.
    pub fn outcome_unknown(message: impl Into<String>, hint: impl Into<String>) -> Error {
        Error::OutcomeUnknown {
            message: message.into(),
            hint: hint.into(),
            source: None,
        }
    }

    /// Keeps `cause`, the dependency's error this one was made from, as its
    /// [`std::error::Error::source`]; the message, hint, exit code and JSON fields stay as they
    /// are. Only usage, unavailable, outcome-unknown and internal errors take one: the others
    /// are fence's own findings (or, for [`Error::Database`], keep the server's error already).
    pub fn with_source(mut self, cause: impl Into<Cause>) -> Error {
        match &mut self {
            Error::Usage { source, .. }
            | Error::Unavailable { source, .. }
            | Error::OutcomeUnknown { source, .. }
            | Error::Internal { source, .. } => *source = Some(cause.into()),
            _ => {}
        }
        self
    }

    /// The SQLSTATE of a database error fence did not classify further.
    pub fn sqlstate(&self) -> Option<&tokio_postgres::error::SqlState> {
        match self {
            Error::Database { source, .. } => Some(source.code()),
            _ => None,
        }
    }

    /// The exit status: the one place errors become codes (DESIGN §5).
    pub fn exit(&self) -> Exit {
        match self {
            Error::Usage { .. } => Exit::Usage,
            Error::Busy { .. } | Error::WaitedOut { .. } => Exit::Busy,
            Error::Stale { .. } => Exit::StaleFencingToken,
            Error::LeaseLost { .. } => Exit::LeaseLost,
            Error::Conflict { .. } => Exit::Conflict,
            Error::Unavailable { .. } => Exit::Unavailable,
            Error::OutcomeUnknown { .. } => Exit::OutcomeUnknown,
            Error::Internal { .. } | Error::Database { .. } | Error::SqlFailed { .. } => {
                Exit::Internal
            }
        }
    }

    /// The `error` field of the JSON output: the exit code's name, except for SQL the caller
    /// sent, which failed on its own (`sql_failed`, exit 1; DESIGN §9).
    pub fn name(&self) -> &'static str {
        match self {
            Error::SqlFailed { .. } => "sql_failed",
            other => other.exit().name().unwrap_or("internal"),
        }
    }

    /// What to do next after `fence OP` failed ([`RUN_UNSTARTED`] for a `fence run` that never
    /// started its command): [`Self::hint`], except for a `fence run`
    /// whose lease was lost, where the command was stopped, not left running: nothing is to be
    /// acquired by hand (a cron job runs again at its next turn), and the store's history says
    /// what happened.
    pub fn hint_in(&self, op: &str) -> String {
        if op == RUN_UNSTARTED {
            return match self {
                Error::LeaseLost { reason, .. }
                    if !matches!(
                        reason,
                        LostReason::ArrivedLate
                            | LostReason::SupervisorLost
                            | LostReason::Unkillable
                    ) =>
                {
                    format!(
                        "the command was not started: the lease {} before it could be (the grant's answers came late). Run it again, with a longer --ttl if this recurs, and find what slows the store ({LATE_CAUSE})",
                        lost_reason_words(*reason)
                    )
                }
                _ => self.hint_in("run"),
            };
        }
        match self {
            Error::LeaseLost {
                reason: LostReason::ArrivedLate,
                ..
            } if op == "run" => format!("the command was not started. Run it again, with a longer --ttl if this recurs, and find what slows the store ({LATE_CAUSE})"),
            Error::LeaseLost {
                resource,
                reason:
                    LostReason::Expired
                    | LostReason::Released
                    | LostReason::TakenOver { .. }
                    | LostReason::Unreachable
                    | LostReason::RecordLost,
                ..
            } if op == "run" => format!(
                "the command was stopped before it finished, and nothing of it runs on: nothing is to be done by hand (a scheduled job runs again at its next turn); `fence log {}` shows the run's record (its stop, with signal and reason, where the store could take it) and who holds the lease now",
                resource_word(resource)
            ),
            _ => self.hint(),
        }
    }

    /// What to do next, printed on its own line.
    pub fn hint(&self) -> String {
        match self {
            Error::Usage { hint, .. }
            | Error::Unavailable { hint, .. }
            | Error::OutcomeUnknown { hint, .. }
            | Error::Internal { hint, .. }
            | Error::Database { hint, .. } => hint.clone(),
            Error::Busy { resource, .. } => format!(
                "try again once it is released or expires; `fence inspect {}` shows the holder",
                resource_word(resource)
            ),
            Error::WaitedOut { resource, .. } => format!(
                "wait longer (--wait DURATION, or --wait alone for no limit); `fence inspect {}` shows the holder",
                resource_word(resource)
            ),
            Error::Stale {
                resource,
                highest_token,
                target: None,
                ..
            } => format!(
                "`{resource}` was granted again since (token {highest_token}; `fence inspect {}` shows by whom): stop working under this token, and acquire again if the work must go on",
                resource_word(resource)
            ),
            Error::Stale {
                resource,
                highest_token,
                target: Some(target),
                ..
            } => format!(
                "the target has accepted token {highest_token} for `{resource}`: a newer owner has written there, or someone wrote with a token the store never issued. Stop working under this token; `{}` shows which (it warns on a token above any the store issued; recovery: docs/postgres-targets.md, \"A token the store never issued\")",
                command_for("fence inspect", resource, &format!(" --target {}", shell_word(target)))
            ),
            Error::LeaseLost {
                reason: LostReason::SupervisorLost,
                ..
            } => "the command's own exit status is unknown and its work may be cut short: find what killed or stopped `fence __reaper` (the OOM killer: `journalctl -k | grep -i oom`; the command itself), then run it again".to_owned(),
            Error::LeaseLost {
                reason: LostReason::Unkillable,
                ..
            } => "check what the command's process was blocked on (a hung NFS or FUSE mount, a failing disk: `cat /proc/PID/stack` as root, `dmesg`), and whether a write of it landed after the next owner's; fence's fenced writes reject it, other writes are the command's to check".to_owned(),
            Error::LeaseLost {
                reason: LostReason::ArrivedLate,
                ..
            } => format!("stop working under this token: its lease ran out before the answer arrived. Acquire again, with a longer --ttl if this recurs, and find what slows the store ({LATE_CAUSE})"),
            Error::LeaseLost { resource, .. } => format!(
                "acquire it again with `fence acquire {}` before going on, and renew well within the TTL",
                resource_word(resource)
            ),
            Error::SqlFailed { .. } => {
                "fix the SQL and run it again; nothing was changed, the token is still good".into()
            }
            Error::Conflict { resource, kind, .. } => match kind {
                ConflictKind::WrongOwner { .. } => {
                    "pass the --owner that acquired this token (or set FENCE_OWNER)".into()
                }
                ConflictKind::RowMissing { .. } => {
                    "check --key, or pass --upsert to create the row".into()
                }
                ConflictKind::VersionMismatch { .. } | ConflictKind::ConcurrentWrite { .. } => {
                    "read the object again (`fence inspect RESOURCE --target URL` shows its version and token) and decide whether to write".into()
                }
                ConflictKind::OtherResource { .. } => {
                    "write the object with the resource that guards it".into()
                }
                ConflictKind::IdReused { .. } => {
                    "give each write its own --id (e.g. \"$FENCE_RUN_ID-load\"); a retry must send the same SQL or bytes as the write that first used the id".into()
                }
                ConflictKind::RunIdReused { .. } => {
                    "give each job its own run id, with what varies between jobs in it (e.g. --id nightly-$(date -u -I)); a retry must run the same command with the same arguments".into()
                }
                _ => format!(
                    "check RESOURCE and --token (or FENCE_RESOURCE / FENCE_TOKEN); `fence inspect {}` shows the current lease",
                    resource_word(resource)
                ),
            },
        }
    }

    /// The machine-readable fields of the JSON error object beyond `error`, `message`, `hint`.
    pub fn json_fields(&self) -> Map<String, Value> {
        let mut map = Map::new();
        match self {
            Error::Busy { resource, holder }
            | Error::WaitedOut {
                resource, holder, ..
            } => {
                if let Error::WaitedOut { waited_ms, .. } = self {
                    map.insert("waited_ms".into(), json!(waited_ms));
                }
                map.insert("resource".into(), json!(resource));
                map.insert(
                    "holder".into(),
                    json!({
                        "owner": holder.owner,
                        "token": holder.token,
                        "expires_at": time::rfc3339(holder.expires_at_ms),
                        "expires_in_ms": holder.expires_in_ms,
                    }),
                );
            }
            Error::Stale {
                resource,
                token,
                highest_token,
                target,
            } => {
                map.insert("resource".into(), json!(resource));
                map.insert("token".into(), json!(token));
                map.insert("highest_token".into(), json!(highest_token));
                if let Some(target) = target {
                    map.insert("target".into(), json!(target));
                }
            }
            Error::LeaseLost {
                resource,
                owner,
                token,
                reason,
            } => {
                map.insert("resource".into(), json!(resource));
                map.insert("owner".into(), json!(owner));
                map.insert("token".into(), json!(token));
                if let LostReason::TakenOver { highest_token } = reason {
                    map.insert("highest_token".into(), json!(highest_token));
                }
                map.insert("reason".into(), json!(reason.name()));
            }
            Error::Conflict {
                resource,
                token,
                kind,
            } => {
                map.insert("resource".into(), json!(resource));
                map.insert("token".into(), json!(token));
                let reason = match kind {
                    ConflictKind::NoLease => "no_lease",
                    ConflictKind::NeverIssued { highest_token } => {
                        map.insert("highest_token".into(), json!(highest_token));
                        "never_issued"
                    }
                    ConflictKind::WrongOwner { holder } => {
                        map.insert("holder_owner".into(), json!(holder));
                        "wrong_owner"
                    }
                    ConflictKind::RowMissing { table } => {
                        map.insert("table".into(), json!(table));
                        "row_missing"
                    }
                    ConflictKind::VersionMismatch { expected, actual } => {
                        map.insert("expected_version".into(), json!(expected));
                        map.insert("version".into(), json!(actual));
                        "version_mismatch"
                    }
                    ConflictKind::ConcurrentWrite { version } => {
                        map.insert("version".into(), json!(version));
                        "concurrent_write"
                    }
                    ConflictKind::OtherResource { stored } => {
                        map.insert("stored_resource".into(), json!(stored));
                        "other_resource"
                    }
                    ConflictKind::IdReused {
                        write_id,
                        applied_token,
                    } => {
                        map.insert("write_id".into(), json!(write_id));
                        map.insert("applied_token".into(), json!(applied_token));
                        "id_reused"
                    }
                    ConflictKind::RunIdReused { run_id } => {
                        map.insert("run_id".into(), json!(run_id));
                        "id_reused"
                    }
                };
                map.insert("reason".into(), json!(reason));
            }
            Error::SqlFailed {
                resource,
                token,
                sqlstate,
                ..
            } => {
                map.insert("resource".into(), json!(resource));
                map.insert("token".into(), json!(token));
                map.insert("sqlstate".into(), json!(sqlstate));
            }
            Error::Usage { .. }
            | Error::Unavailable { .. }
            | Error::OutcomeUnknown { .. }
            | Error::Internal { .. }
            | Error::Database { .. } => {}
        }
        map
    }
}

/// RESOURCE as the last argument of a command a hint suggests: shell-quoted, and after `--`
/// when it starts with `-`, which would be read as an option (review 18: `fence inspect -x`
/// was refused as an unexpected argument).
pub fn resource_word(resource: &str) -> String {
    command_for("", resource, "").trim_start().to_owned()
}

/// `head RESOURCE tail`, a command a hint suggests (`tail` its options after the resource,
/// starting with a space): as written, or `head tail -- RESOURCE` for a resource that starts
/// with `-` (see [`resource_word`]).
pub fn command_for(head: &str, resource: &str, tail: &str) -> String {
    if resource.starts_with('-') {
        format!("{head}{tail} -- {}", shell_word(resource))
    } else {
        format!("{head} {}{tail}", shell_word(resource))
    }
}

/// Quotes a word for a shell command shown in a hint, only when it needs it.
pub fn shell_word(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c))
    {
        word.to_owned()
    } else {
        shell_quote(word)
    }
}

/// Single-quotes a value for POSIX shells: `it's` → `'it'\''s'`.
pub fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept cause is the error's `source()` and changes nothing of the public contract: the
    /// message, the hint, the exit code and the JSON fields are those of the error without it.
    #[test]
    fn a_source_changes_nothing_the_user_sees() {
        let errors = || {
            [
                Error::usage("bad URL", "fix it"),
                Error::unavailable("server down", "retry"),
                Error::outcome_unknown("lost the answer", "inspect"),
                Error::internal("bug", "report it"),
            ]
        };
        for (plain, sourced) in errors().into_iter().zip(errors()) {
            let sourced = sourced.with_source(std::io::Error::other("connection reset"));
            assert!(std::error::Error::source(&plain).is_none(), "{plain:?}");
            let source = std::error::Error::source(&sourced).expect("kept");
            assert!(source.is::<std::io::Error>(), "{source:?}");
            assert_eq!(sourced.to_string(), plain.to_string());
            assert_eq!(sourced.hint(), plain.hint());
            assert_eq!(sourced.exit(), plain.exit());
            assert_eq!(sourced.name(), plain.name());
            assert_eq!(sourced.json_fields(), plain.json_fields());
        }
    }
}
