//! The exit-code table: the public contract scripts branch on.
//!
//! Every code fence can return is named here, once. Errors map to a code in exactly one
//! `match` (`Error::exit`), and the man page's EXIT STATUS section is generated from
//! [`Exit::ALL`], so the documentation cannot drift from the behaviour.

/// A process exit status with a stable meaning (DESIGN §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Success.
    Success,
    /// Unexpected failure: a bug, or local I/O.
    Internal,
    /// Bad arguments or configuration.
    Usage,
    /// Held by another live owner; not acquired, nothing changed.
    Busy,
    /// A newer token exists; rejected, nothing changed.
    StaleFencingToken,
    /// The lease expired or was taken before renewal, or ran out before the store's answer came.
    LeaseLost,
    /// A precondition other than the token failed.
    Conflict,
    /// Store or target unreachable before anything was applied; safe to retry.
    Unavailable,
    /// The request may or may not have applied; inspect before retrying.
    OutcomeUnknown,
    /// `fence run` passes on the status of the command it ran (128+N for signal N).
    Command(u8),
}

impl Exit {
    /// Every exit status, in numeric order (used for the man page and `--help`).
    pub const ALL: [Exit; 9] = [
        Exit::Success,
        Exit::Internal,
        Exit::Usage,
        Exit::Busy,
        Exit::StaleFencingToken,
        Exit::LeaseLost,
        Exit::Conflict,
        Exit::Unavailable,
        Exit::OutcomeUnknown,
    ];

    /// The numeric status the process exits with.
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Internal => 1,
            Exit::Usage => 2,
            Exit::Busy => 3,
            Exit::StaleFencingToken => 4,
            Exit::LeaseLost => 5,
            Exit::Conflict => 6,
            Exit::Unavailable => 7,
            Exit::OutcomeUnknown => 8,
            Exit::Command(status) => status,
        }
    }

    /// The snake_case `error` field of the JSON output (`None` for success).
    pub fn name(self) -> Option<&'static str> {
        match self {
            Exit::Success | Exit::Command(_) => None,
            Exit::Internal => Some("internal"),
            Exit::Usage => Some("usage"),
            Exit::Busy => Some("busy"),
            Exit::StaleFencingToken => Some("stale_fencing_token"),
            Exit::LeaseLost => Some("lease_lost"),
            Exit::Conflict => Some("conflict"),
            Exit::Unavailable => Some("unavailable"),
            Exit::OutcomeUnknown => Some("outcome_unknown"),
        }
    }

    /// Every `error` name a failure with this status can carry (`-` for success): `internal`
    /// and `sql_failed` share 1.
    pub fn names(self) -> Vec<&'static str> {
        match self {
            Exit::Internal => vec!["internal", "sql_failed"],
            other => vec![other.name().unwrap_or("-")],
        }
    }

    /// One line for the EXIT STATUS section of the man page, `--help` and the README.
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Success => "success",
            Exit::Internal => {
                "unexpected failure (a bug, or local I/O); or, as `sql_failed`, your own SQL failed in `fence write` and was rolled back"
            }
            Exit::Usage => "bad arguments or configuration; nothing was attempted",
            Exit::Busy => "held by another live owner; not acquired, nothing changed",
            Exit::StaleFencingToken => "a newer token exists; rejected, nothing changed",
            Exit::LeaseLost => {
                "the lease expired, was released or was taken before renewal, or ran out before the store's answer came (`arrived_late`); `run` stopped (or never started) its command"
            }
            Exit::Conflict => {
                "another precondition failed (wrong owner, token never issued, no lease, version changed, row missing)"
            }
            Exit::Unavailable => {
                "nothing was applied (store or target unreachable, or a write timed out or was cancelled in time); safe to retry"
            }
            Exit::OutcomeUnknown => {
                "the request may or may not have applied; inspect before retrying"
            }
            Exit::Command(_) => "the status of the command `fence run` ran",
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        std::process::ExitCode::from(exit.code())
    }
}
