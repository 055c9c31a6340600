//! fence's own SQLSTATEs (class `LF`), raised by its SQL (`src/coordinator/postgres/schema.sql`,
//! `src/fenced/guard.sql`): one table, one meaning per code. Errors are classified by these
//! codes (and PostgreSQL's own, through `tokio_postgres::error::SqlState`), never by the text
//! of a message.

use tokio_postgres::error::SqlState;

/// A condition fence's SQL reports with a code of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fence {
    /// No fencing token is bound to the transaction, or it is malformed.
    NoToken,
    /// The token is lower than the highest the target accepted.
    Stale,
    /// The resource has no guard row in the target yet.
    NoGuard,
    /// A delete of fence's own rows (leases, guards) was refused.
    DeleteRefused,
    /// A token would have gone down (a lease row or a guard row).
    TokenLowered,
    /// A row-form write named a column the table does not have.
    NoColumn,
    /// A row-form write named a table that does not exist.
    NoTable,
    /// The token is higher than any the coordinator in the same database issued.
    NeverIssued,
    /// The fenced transaction was ended inside the caller's SQL (a smuggled COMMIT/ROLLBACK).
    TransactionEnded,
    /// The fenced transaction ran past its `--timeout` by the server's clock.
    TimedOut,
    /// The write id was already applied (its ledger entry is in the DETAIL).
    AlreadyApplied,
    /// A write id outside the accepted length.
    BadWriteId,
    /// fence's transaction settings were changed by the caller's SQL.
    ForgedSettings,
    /// The schema was created by a newer fence.
    NewerSchema,
    /// The row form's update of a row that is there changed nothing, round after round (a
    /// trigger or policy drops or hides it).
    NoProgress,
    /// A partition added below a protected table could not be protected.
    PartitionUnprotected,
    /// A foreign table cannot be protected.
    ForeignTable,
    /// The target's schema is at another version than this fence writes for (the message
    /// ends with the version found).
    VersionMismatch,
}

/// Every code, once. `tests` checks that each `ERRCODE = 'LF…'` in the SQL files is here.
pub const TABLE: [(Fence, &str); 18] = [
    (Fence::NoToken, "LF001"),
    (Fence::Stale, "LF002"),
    (Fence::NoGuard, "LF003"),
    (Fence::DeleteRefused, "LF004"),
    (Fence::TokenLowered, "LF005"),
    (Fence::NoColumn, "LF006"),
    (Fence::NoTable, "LF007"),
    (Fence::NeverIssued, "LF008"),
    (Fence::TransactionEnded, "LF009"),
    (Fence::TimedOut, "LF010"),
    (Fence::AlreadyApplied, "LF011"),
    (Fence::BadWriteId, "LF012"),
    (Fence::ForgedSettings, "LF013"),
    (Fence::NewerSchema, "LF014"),
    (Fence::NoProgress, "LF015"),
    (Fence::PartitionUnprotected, "LF020"),
    (Fence::ForeignTable, "LF021"),
    (Fence::VersionMismatch, "LF030"),
];

impl Fence {
    /// The condition a SQLSTATE names, if it is one of fence's.
    pub fn of(state: &SqlState) -> Option<Fence> {
        TABLE
            .iter()
            .find(|(_, code)| *code == state.code())
            .map(|(fence, _)| *fence)
    }

    pub fn code(self) -> &'static str {
        TABLE
            .iter()
            .find(|(fence, _)| *fence == self)
            .map(|(_, code)| *code)
            .expect("every condition is in the table")
    }
}

/// The SQLSTATE's class (its first two characters): `22` data exception, `23` integrity
/// constraint violation, …
pub fn class(state: &SqlState) -> &str {
    state.code().get(..2).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_and_condition_appears_once() {
        for (i, (fence, code)) in TABLE.iter().enumerate() {
            assert_eq!(Fence::of(&SqlState::from_code(code)), Some(*fence));
            assert_eq!(fence.code(), *code);
            assert!(
                TABLE[i + 1..].iter().all(|(f, c)| f != fence && c != code),
                "{code} or {fence:?} appears twice"
            );
        }
        assert_eq!(Fence::of(&SqlState::UNIQUE_VIOLATION), None);
        assert_eq!(class(&SqlState::UNIQUE_VIOLATION), "23");
    }

    /// Every code fence's SQL raises is in the table (and none of the table is unused).
    #[test]
    fn the_table_covers_the_sql() {
        let sql = [
            include_str!("../coordinator/postgres/schema.sql"),
            include_str!("../fenced/guard.sql"),
        ]
        .concat();
        let mut raised: Vec<&str> = sql
            .split("ERRCODE = '")
            .skip(1)
            .filter_map(|rest| rest.get(..5))
            .collect();
        raised.sort_unstable();
        raised.dedup();
        let mut known: Vec<&str> = TABLE.iter().map(|(_, code)| *code).collect();
        known.sort_unstable();
        assert_eq!(raised, known);
    }
}
