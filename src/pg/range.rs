//! The time window of a `fence log` read from PostgreSQL, shared by the two histories it reads
//! (a coordinator's `events`, a target's `write_events`).

use tokio_postgres::types::{ToSql, Type};

use crate::timeline::{LogQuery, Logged};

/// What the two PostgreSQL histories `fence log` reads share (the coordinator's `events`, a
/// target's `write_events`): the resources matched by name or by glob, the time window and
/// the limit, as one LATERAL range per resource over an `(resource, at)` index.
pub struct LogRange {
    /// The condition on the resource column (`$1`).
    pub filter: String,
    names: Option<Vec<String>>,
    since_ms: Option<i64>,
    until_ms: Option<i64>,
    limit: i64,
}

impl LogRange {
    /// Inside the per-resource range: the window (`$2`, `$3`), newest first, at most `$4`.
    pub const RANGE: &'static str =
        "AND ($2::int8 IS NULL OR ev.at >= to_timestamp($2::int8 / 1000.0)) \
         AND ($3::int8 IS NULL OR ev.at < to_timestamp($3::int8 / 1000.0)) \
         ORDER BY ev.at DESC LIMIT $4";
    /// After the ranges: the newest `$4` of them all.
    pub const LAST: &'static str = "ORDER BY e.at DESC, e.id DESC LIMIT $4";

    pub fn new(query: &LogQuery<'_>, column: &str) -> LogRange {
        let (filter, names) = match query.exact_names() {
            Some(names) => (format!("{column} = ANY($1)"), Some(names)),
            None if query.patterns.is_empty() => ("$1::text[] IS NULL".to_owned(), None),
            None => (
                format!("{column} COLLATE \"C\" LIKE ANY($1)"),
                Some(query.patterns.iter().map(|p| p.like()).collect()),
            ),
        };
        LogRange {
            filter,
            names,
            since_ms: query.since_ms,
            until_ms: query.until_ms,
            limit: i64::try_from(query.limit).unwrap_or(i64::MAX),
        }
    }

    pub fn params(&self) -> [(&(dyn ToSql + Sync), Type); 4] {
        [
            (&self.names, Type::TEXT_ARRAY),
            (&self.since_ms, Type::INT8),
            (&self.until_ms, Type::INT8),
            (&self.limit, Type::INT8),
        ]
    }

    /// Rows read newest first, with their event ids, as the timeline wants them: oldest first.
    pub fn oldest_first(mut logged: Vec<(i64, Logged)>) -> Vec<Logged> {
        logged.sort_by_key(|(id, l)| (l.at_us, *id));
        logged.into_iter().map(|(_, l)| l).collect()
    }
}
