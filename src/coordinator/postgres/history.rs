//! What the PostgreSQL coordinator remembers: `inspect`, `log`, `metrics`' counts, refused
//! attempts and `prune`.

use std::time::Duration;

use async_trait::async_trait;
use tokio_postgres::types::Type;

use super::PgCoordinator;
use crate::coordinator::{
    Attempt, Event, EventKind, History, InspectQuery, Inspection, LogQuery, Logged, PruneQuery,
    Pruned, ResourceView, RunEvent, State, Waiter,
};
use crate::error::Error;
use crate::pg::range::LogRange;
use crate::timeline::newest;

/// Resources per `fence prune` statement: each is one short transaction.
const PRUNE_PAGE: usize = 1_000;
/// How long recording a refused attempt waits for a lock on `attempts` before it gives up
/// (with a warning): the refusal is answered at once all the same.
const ATTEMPT_LOCK_WAIT: Duration = Duration::from_millis(250);

#[async_trait(?Send)]
impl History for PgCoordinator {
    async fn inspect(
        &self,
        resources: &[String],
        history: usize,
    ) -> Result<Vec<ResourceView>, Error> {
        Ok(self
            .inspect_query(&InspectQuery {
                resources,
                history,
                ..InspectQuery::default()
            })
            .await?
            .views)
    }

    /// One page of leases, filtered in the server, then the last events of each resource of
    /// the page through its index (`events (resource, id DESC)`, one LATERAL range each) and
    /// its live waiters; merged in one pass. The cost follows the page, not the store.
    async fn inspect_query(&self, query: &InspectQuery<'_>) -> Result<Inspection, Error> {
        let names: Option<Vec<String>> =
            (!query.resources.is_empty()).then(|| query.resources.to_vec());
        let state = query.state.map(State::as_str);
        let after = query.after;
        let limit = query.limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX));
        let leases_sql =
            "SELECT resource, owner, token, __SCHEMA__.ms(acquired_at) AS acquired_ms, \
             __SCHEMA__.ms(renewed_at) AS renewed_ms, __SCHEMA__.ms(expires_at) AS expires_ms, \
             __SCHEMA__.ms(expires_at) - __SCHEMA__.ms(clock_timestamp()) AS expires_in_ms \
             FROM __SCHEMA__.leases \
             WHERE ($1::text[] IS NULL OR resource = ANY($1)) \
             AND ($2::text IS NULL OR resource COLLATE \"C\" > $2) \
             AND CASE $3::text WHEN 'held' THEN expires_at > clock_timestamp() \
                 WHEN 'expired' THEN expires_at <= clock_timestamp() \
                 WHEN 'free' THEN expires_at IS NULL ELSE true END \
             ORDER BY resource COLLATE \"C\" LIMIT $4";
        let what = "inspect leases";
        let rows = self
            .call(
                what,
                false,
                leases_sql,
                &[
                    (&names, Type::TEXT_ARRAY),
                    (&after, Type::TEXT),
                    (&state, Type::TEXT),
                    (&limit, Type::INT8),
                ],
            )
            .await?;
        let mut views: Vec<ResourceView> = rows
            .iter()
            .map(|row| {
                let expires_ms: Option<i64> = row.get("expires_ms");
                let expires_in_ms: Option<i64> = row.get("expires_in_ms");
                let state = match expires_in_ms {
                    None => State::Free,
                    Some(ms) if ms > 0 => State::Held,
                    Some(_) => State::Expired,
                };
                ResourceView {
                    resource: row.get("resource"),
                    state,
                    owner: if state == State::Free {
                        None
                    } else {
                        row.get("owner")
                    },
                    token: Some(row.get("token")),
                    acquired_at_ms: row.get("acquired_ms"),
                    renewed_at_ms: row.get("renewed_ms"),
                    expires_at_ms: expires_ms,
                    expires_in_ms,
                    events: Vec::new(),
                    waiters: Vec::new(),
                }
            })
            .collect();
        // Named resources never acquired are shown as such (when the filters let them).
        for name in query.resources {
            if !views.iter().any(|v| &v.resource == name) {
                views.push(ResourceView::unknown(name));
            }
        }
        if !query.resources.is_empty() {
            views = query.apply(views);
        }
        let page: Vec<String> = views.iter().map(|v| v.resource.clone()).collect();
        let index: std::collections::HashMap<String, usize> = page
            .iter()
            .enumerate()
            .map(|(i, name)| (name.clone(), i))
            .collect();
        let history = i64::try_from(query.history).unwrap_or(i64::MAX);
        if history > 0 && !page.is_empty() {
            let events_sql = "SELECT p.resource, __SCHEMA__.ms(e.at) AS at_ms, e.kind, e.owner, e.token, e.detail \
                 FROM unnest($1::text[]) AS p(resource) CROSS JOIN LATERAL ( \
                   SELECT * FROM __SCHEMA__.events e WHERE e.resource = p.resource \
                   ORDER BY e.id DESC LIMIT $2) e";
            let event_rows = self
                .call(
                    what,
                    false,
                    events_sql,
                    &[(&page, Type::TEXT_ARRAY), (&history, Type::INT8)],
                )
                .await?;
            for row in &event_rows {
                let resource: String = row.get("resource");
                if let Some(&i) = index.get(&resource) {
                    views[i].events.push(Event {
                        owner: row.get("owner"),
                        token: row.get("token"),
                        detail: row.get("detail"),
                        ..Event::new(EventKind::parse(row.get("kind")), row.get("at_ms"))
                    });
                }
            }
        }
        if !page.is_empty() {
            // Rows past their deadline belong to dead or paused waiters (the next poll deletes
            // them).
            let waiters_sql =
                "SELECT w.resource, w.owner, __SCHEMA__.ms(w.since) FROM __SCHEMA__.waiters w \
                 WHERE w.resource = ANY($1) AND w.deadline >= clock_timestamp() ORDER BY w.id";
            let waiter_rows = self
                .call(what, false, waiters_sql, &[(&page, Type::TEXT_ARRAY)])
                .await?;
            for row in &waiter_rows {
                let resource: String = row.get(0);
                if let Some(&i) = index.get(&resource) {
                    views[i].waiters.push(Waiter {
                        owner: row.get(1),
                        since_ms: row.get(2),
                    });
                }
            }
        }
        if !query.resources.is_empty() {
            views.sort_by_key(|v| query.resources.iter().position(|r| r == &v.resource));
        }
        Ok(Inspection {
            views,
            findings: Vec::new(),
        })
    }

    fn pages_at_source(&self) -> bool {
        true
    }

    /// The resource's events through `events (resource, id DESC)`, newest `history` first,
    /// streamed (see [`crate::pg::session::Session::call_each`]); oldest first, the server
    /// sorts those it picked.
    async fn history_each(
        &self,
        resource: &str,
        history: usize,
        oldest_first: bool,
        each: &mut dyn FnMut(Event) -> bool,
    ) -> Result<(), Error> {
        let history = i64::try_from(history).unwrap_or(i64::MAX);
        let sql = format!(
            "SELECT * FROM (SELECT e.id, __SCHEMA__.ms(e.at) AS at_ms, e.kind, e.owner, e.token, e.detail \
             FROM __SCHEMA__.events e WHERE e.resource = $1 ORDER BY e.id DESC LIMIT $2) e \
             ORDER BY e.id {}",
            if oldest_first { "ASC" } else { "DESC" }
        );
        let resource = resource.to_owned();
        self.session()
            .await?
            .call_each(
                "read the events",
                &sql,
                &[(&resource, Type::TEXT), (&history, Type::INT8)],
                &mut |row| {
                    each(Event {
                        owner: row.get("owner"),
                        token: row.get("token"),
                        detail: row.get("detail"),
                        ..Event::new(EventKind::parse(row.get("kind")), row.get("at_ms"))
                    })
                },
            )
            .await
    }

    /// One upsert into `attempts`. The refused statement before it has already checked the
    /// schema's version (and migrated an older one); a schema without the table (dropped by
    /// hand) records nothing.
    async fn record_attempt(&self, attempt: &Attempt) -> Result<(), Error> {
        use crate::fenced::quote_literal;
        let what = format!("record the refused attempt on `{}`", attempt.resource);
        // A transaction of its own with a short lock wait: the record is history, and a lock
        // on `attempts` (a long transaction, a hand-run LOCK) must not hold up the answer to
        // the refused caller, nor a waiter's next poll. Literals, not parameters, since the
        // SET LOCAL goes in the same message (one round trip, as before).
        let sql = format!(
            "BEGIN; SET LOCAL lock_timeout = {ms}; \
             INSERT INTO {schema}.attempts AS a \
             (resource, minute, owner, kind, count, first_at, last_at, token, detail) \
             SELECT {resource}, date_trunc('minute', c.now), {owner}, {kind}, 1, c.now, c.now, {token}, {detail} \
             FROM (SELECT clock_timestamp() AS now) c \
             ON CONFLICT (resource, minute, owner, kind) DO UPDATE \
             SET count = a.count + 1, last_at = EXCLUDED.last_at, token = EXCLUDED.token, \
               detail = EXCLUDED.detail; COMMIT",
            ms = ATTEMPT_LOCK_WAIT.as_millis(),
            schema = self.schema,
            resource = quote_literal(&attempt.resource),
            owner = quote_literal(&attempt.owner),
            kind = quote_literal(attempt.kind.as_str()),
            token = attempt.token,
            detail = quote_literal(&attempt.detail),
        );
        let session = self.session().await?;
        let sent = crate::pg::answer_within_timeout(session.client.batch_execute(&sql)).await;
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => {
                // The failed statement left the transaction open and aborted.
                session.rollback().await;
                if crate::pg::session::is_missing_schema(&err) {
                    Ok(())
                } else {
                    Err(session.request_error(&err, &what, true))
                }
            }
            Err(_) => Err(crate::pg::lost(
                &self.display,
                &what,
                &format!("no answer within {}s", crate::pg::REQUEST_TIMEOUT.as_secs()),
                true,
            )),
        }
    }

    /// One INSERT in a transaction of its own with a short lock wait, as a refused attempt:
    /// history, which must not hold up the run.
    async fn record_run(&self, run: &RunEvent<'_>) -> Result<(), Error> {
        use crate::fenced::quote_literal;
        let what = format!(
            "record the run's `{}` event for `{}`",
            run.kind, run.resource
        );
        let sql = format!(
            "BEGIN; SET LOCAL lock_timeout = {ms}; \
             INSERT INTO {schema}.events (resource, kind, owner, token, detail) \
             VALUES ({resource}, {kind}, {owner}, {token}, {detail}); COMMIT",
            ms = ATTEMPT_LOCK_WAIT.as_millis(),
            schema = self.schema,
            resource = quote_literal(run.resource),
            kind = quote_literal(run.kind.as_str()),
            owner = quote_literal(run.owner),
            token = run.token,
            detail = quote_literal(&run.note.detail()),
        );
        let session = self.session().await?;
        let sent = crate::pg::answer_within_timeout(session.client.batch_execute(&sql)).await;
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => {
                session.rollback().await;
                Err(session.request_error(&err, &what, true))
            }
            Err(_) => Err(crate::pg::lost(
                &self.display,
                &what,
                &format!("no answer within {}s", crate::pg::REQUEST_TIMEOUT.as_secs()),
                true,
            )),
        }
    }

    /// See [`PgCoordinator::prune_all`].
    async fn prune(&self, query: &PruneQuery<'_>) -> Result<Pruned, Error> {
        self.prune_all(query).await.map_err(|err| match err {
            // The only usage error here: a privilege the role lacks.
            Error::Usage { message, source, .. } => Error::Usage {
                message,
                source,
                hint: "`fence prune` needs SELECT on fence's `leases`, DELETE on its `events`, `waiters` and `attempts`, and INSERT and UPDATE on its `event_totals`: run it as the role that owns the schema (the one that ran `fence init`), or grant those".into(),
            },
            // Some batches may have been deleted, and repeating deletes only what is left.
            Error::OutcomeUnknown { message, source, .. } => Error::OutcomeUnknown {
                message,
                source,
                hint: "some of the old events may have been deleted already; run the same `fence prune` again (it is safe to repeat)".into(),
            },
            other => other,
        })
    }

    /// Each matching resource's events in the window through the `events (resource, at)`
    /// index (one LATERAL range per resource, newest first, at most `limit` each), then the
    /// newest `limit` of them all. The version-4 columns are read through `to_jsonb`, so that a
    /// schema not yet migrated answers with its events, without TTLs.
    async fn log(&self, query: &LogQuery<'_>) -> Result<Vec<Logged>, Error> {
        let window = LogRange::new(query, "l.resource");
        let rows = self
            .call(
                "read the events",
                false,
                &events_sql(&window.filter),
                &window.params(),
            )
            .await?;
        let logged = rows
            .iter()
            .map(|row| (row.get("id"), event_logged(row)))
            .collect();
        let mut logged = LogRange::oldest_first(logged);
        logged.extend(self.attempts_in(query).await?);
        newest(&mut logged, query.limit);
        Ok(logged)
    }

    /// [`Self::log`] streamed: the window's events oldest first as the server sends them,
    /// merged with its refused attempts (one line per owner and minute, read whole), the
    /// oldest beyond `limit` passed over (counted by the server first, when there are
    /// attempts), as [`Self::log`] picks them.
    async fn log_each(
        &self,
        query: &LogQuery<'_>,
        each: &mut dyn FnMut(Logged) -> bool,
    ) -> Result<(), Error> {
        let window = LogRange::new(query, "l.resource");
        let what = "read the events";
        let mut attempts = self.attempts_in(query).await?;
        // Stable: attempts of the same instant keep the order `log` gives them.
        attempts.sort_by_key(|l| l.at_us);
        // The events are `limit` at most: only with attempts can there be more to pass over.
        let mut skip = 0;
        if !attempts.is_empty() {
            let counted = self
                .call(
                    what,
                    false,
                    &format!("SELECT count(*) FROM ({}) c", events_sql(&window.filter)),
                    &window.params(),
                )
                .await?;
            let events = counted
                .first()
                .map_or(0, |row| usize::try_from(row.get::<_, i64>(0)).unwrap_or(0));
            skip = (events + attempts.len()).saturating_sub(query.limit);
        }
        let mut attempts = attempts.into_iter().peekable();
        let mut going = true;
        let mut hand = |logged: Logged, going: &mut bool| {
            if skip > 0 {
                skip -= 1;
            } else if *going {
                *going = each(logged);
            }
        };
        self.session()
            .await?
            .call_each(
                what,
                &format!(
                    "SELECT * FROM ({}) x ORDER BY x.at_us, x.id",
                    events_sql(&window.filter)
                ),
                &window.params(),
                &mut |row| {
                    let logged = event_logged(row);
                    while let Some(attempt) = attempts.next_if(|a| a.at_us < logged.at_us) {
                        hand(attempt, &mut going);
                    }
                    hand(logged, &mut going);
                    going
                },
            )
            .await?;
        for attempt in attempts {
            hand(attempt, &mut going);
        }
        Ok(())
    }

    /// The attempts kept, plus those `fence prune` deleted (in `event_totals` under the kind
    /// `attempts:KIND`, which no event has).
    async fn attempt_counts(&self) -> Result<Option<Vec<(String, EventKind, i64)>>, Error> {
        let rows = self
            .call(
                "count the refused attempts",
                false,
                "SELECT a.resource, a.kind, sum(a.count)::bigint FROM __SCHEMA__.attempts a GROUP BY 1, 2 \
                 UNION ALL \
                 SELECT t.resource, substr(t.kind, 10), t.n FROM __SCHEMA__.event_totals t \
                 WHERE t.kind LIKE 'attempts:%'",
                &[],
            )
            .await?;
        let mut counts: std::collections::BTreeMap<(String, EventKind), i64> = Default::default();
        for row in &rows {
            let kind = EventKind::parse(row.get(1));
            *counts.entry((row.get(0), kind)).or_default() += row.get::<_, i64>(2);
        }
        Ok(Some(
            counts.into_iter().map(|((r, k), n)| (r, k, n)).collect(),
        ))
    }

    /// One pass over the events table (no index serves a count of everything), plus what
    /// `fence prune` deleted (`event_totals`; none on a schema older than version 5, which
    /// reads as no rows).
    async fn event_counts(&self) -> Result<Vec<(String, EventKind, i64)>, Error> {
        let what = "count the events";
        let kept = self
            .call(
                what,
                false,
                "SELECT resource, kind, count(*) FROM __SCHEMA__.events GROUP BY 1, 2",
                &[],
            )
            .await?;
        let pruned = self
            .call(
                what,
                false,
                "SELECT resource, kind, n FROM __SCHEMA__.event_totals",
                &[],
            )
            .await?;
        let mut counts: std::collections::BTreeMap<(String, EventKind), i64> = Default::default();
        for row in kept.iter().chain(&pruned) {
            let kind = EventKind::parse(row.get(1));
            *counts.entry((row.get(0), kind)).or_default() += row.get::<_, i64>(2);
        }
        Ok(counts.into_iter().map(|((r, k), n)| (r, k, n)).collect())
    }
}

/// The events of `fence log`'s window (see [`PgCoordinator::log`]), `filter` the window's
/// condition on `l.resource`; parameters from [`LogRange::params`].
fn events_sql(filter: &str) -> String {
    format!(
        "SELECT l.resource, e.id, floor(extract(epoch FROM e.at) * 1000000)::int8 AS at_us, \
         __SCHEMA__.ms(e.at) AS at_ms, e.kind, e.owner, e.token, e.detail, \
         (e.j->>'ttl_ms')::int8 AS ttl_ms, \
         __SCHEMA__.ms((e.j->>'expires_at')::timestamptz) AS expires_ms, \
         __SCHEMA__.ms((e.j->>'previous_expires_at')::timestamptz) AS previous_expires_ms \
         FROM __SCHEMA__.leases l CROSS JOIN LATERAL ( \
           SELECT ev.id, ev.at, ev.kind, ev.owner, ev.token, ev.detail, to_jsonb(ev) AS j \
           FROM __SCHEMA__.events ev WHERE ev.resource = l.resource {range}) e \
         WHERE {filter} {last}",
        range = LogRange::RANGE,
        last = LogRange::LAST,
    )
}

/// A row of [`events_sql`] as an event of the timeline.
fn event_logged(row: &tokio_postgres::Row) -> Logged {
    Logged {
        resource: row.get("resource"),
        at_us: row.get("at_us"),
        event: Event {
            owner: row.get("owner"),
            token: row.get("token"),
            detail: row.get("detail"),
            ttl_ms: row.get("ttl_ms"),
            expires_at_ms: row.get("expires_ms"),
            previous_expires_at_ms: row.get("previous_expires_ms"),
            ..Event::new(EventKind::parse(row.get("kind")), row.get("at_ms"))
        },
    }
}

impl PgCoordinator {
    /// The refused attempts in `query`'s window (none on a schema older than version 5), by
    /// the first attempt of each minute, newest first, at most `limit`; the primary key
    /// `(resource, minute, …)` serves a resource's range.
    async fn attempts_in(&self, query: &LogQuery<'_>) -> Result<Vec<Logged>, Error> {
        let window = LogRange::new(query, "a.resource");
        let sql = format!(
            "SELECT a.resource, floor(extract(epoch FROM a.first_at) * 1000000)::int8 AS at_us, \
             __SCHEMA__.ms(a.first_at) AS at_ms, __SCHEMA__.ms(a.last_at) AS last_ms, a.kind, \
             a.owner, a.token, a.detail, a.count \
             FROM __SCHEMA__.attempts a WHERE {filter} \
             AND ($2::int8 IS NULL OR a.minute >= to_timestamp($2::int8 / 1000.0) - interval '1 minute') \
             AND ($2::int8 IS NULL OR a.first_at >= to_timestamp($2::int8 / 1000.0)) \
             AND ($3::int8 IS NULL OR a.minute < to_timestamp($3::int8 / 1000.0)) \
             AND ($3::int8 IS NULL OR a.first_at < to_timestamp($3::int8 / 1000.0)) \
             ORDER BY a.first_at DESC LIMIT $4",
            filter = window.filter,
        );
        let rows = self
            .call("read the refused attempts", false, &sql, &window.params())
            .await?;
        Ok(rows
            .iter()
            .map(|row| Logged {
                resource: row.get("resource"),
                at_us: row.get("at_us"),
                event: Event {
                    owner: row.get("owner"),
                    token: row.get("token"),
                    detail: row.get("detail"),
                    count: row.get("count"),
                    last_at_ms: row.get("last_ms"),
                    ..Event::new(EventKind::parse(row.get("kind")), row.get("at_ms"))
                },
            })
            .collect())
    }

    /// One bound for the whole run, by the server's clock; then pages of [`PRUNE_PAGE`]
    /// resources (in name order, through `leases_resource_bytes`), each one statement: the
    /// id of each resource's last kept event through `events_resource_id`, the older
    /// events below it deleted in the same range (never those of a run id's completion
    /// record, `R#done:ID`: its events hold the digest of the command that completed it, which
    /// tells a retry from another command reusing the id), and their number per kind added to
    /// `event_totals`, so that the counters of `fence metrics` do not go down. `leases` is only read (its guard trigger
    /// refuses deletes anyway), so no token counter can change.
    async fn prune_all(&self, query: &PruneQuery<'_>) -> Result<Pruned, Error> {
        let what = "prune old events";
        let older = i64::try_from(query.older_than.as_millis()).unwrap_or(i64::MAX);
        // A schema that does not exist yet (a read of it returns no rows) has nothing to prune.
        let rows = self
            .call(
                what,
                false,
                "SELECT greatest(c.now - $1, 0) FROM (SELECT __SCHEMA__.ms(clock_timestamp()) AS now) c",
                &[(&older, Type::INT8)],
            )
            .await?;
        let Some(before) = rows.first().map(|row| row.get::<_, i64>(0)) else {
            return Ok(Pruned::default());
        };
        let keep = i64::from(query.keep);
        let page_size = i64::try_from(PRUNE_PAGE).unwrap_or(i64::MAX);
        let mut pruned = Pruned {
            before_ms: Some(before),
            ..Pruned::default()
        };
        let mut after: Option<String> = None;
        loop {
            let page: Vec<String> = if query.resources.is_empty() {
                // Once a batch is deleted, a failure is no longer "nothing changed".
                self.call(
                    what,
                    pruned.resources > 0,
                    "SELECT resource FROM __SCHEMA__.leases \
                     WHERE $1::text IS NULL OR resource COLLATE \"C\" > $1 \
                     ORDER BY resource COLLATE \"C\" LIMIT $2",
                    &[(&after, Type::TEXT), (&page_size, Type::INT8)],
                )
                .await?
                .iter()
                .map(|row| row.get(0))
                .collect()
            } else if after.is_none() {
                query.resources.to_vec()
            } else {
                Vec::new()
            };
            let Some(last) = page.last().cloned() else {
                break;
            };
            let rows = self
                .call(
                    what,
                    true,
                    "WITH cut AS ( \
                       SELECT p.resource, (SELECT k.id FROM __SCHEMA__.events k \
                         WHERE k.resource = p.resource ORDER BY k.id DESC OFFSET $2 LIMIT 1) AS last_id \
                       FROM unnest($1::text[]) AS p(resource) \
                       WHERE strpos(p.resource, $4) = 0), \
                     gone AS ( \
                       DELETE FROM __SCHEMA__.events e USING cut c \
                       WHERE e.resource = c.resource AND e.id <= c.last_id \
                         AND e.at < to_timestamp($3::bigint / 1000.0) \
                       RETURNING e.resource, e.kind), \
                     folded AS ( \
                       INSERT INTO __SCHEMA__.event_totals AS t (resource, kind, n) \
                       SELECT g.resource, g.kind, count(*) FROM gone g GROUP BY 1, 2 \
                       ON CONFLICT (resource, kind) DO UPDATE SET n = t.n + EXCLUDED.n) \
                     SELECT count(*) FROM gone",
                    &[
                        (&page, Type::TEXT_ARRAY),
                        (&keep, Type::INT8),
                        (&before, Type::INT8),
                        (&crate::config::DONE_MARK, Type::TEXT),
                    ],
                )
                .await?;
            pruned.events += rows
                .first()
                .map_or(0, |row| row.get::<_, i64>(0).unsigned_abs());
            pruned.resources += page.len() as u64;
            if query.resources.is_empty() && page.len() < PRUNE_PAGE {
                break;
            }
            after = Some(last);
        }
        // Past its deadline a waiter's row is dead (see `GRACE`): the queue itself deletes
        // such rows when the resource is polled; these are of resources no one waits for now.
        let names: Option<Vec<String>> =
            (!query.resources.is_empty()).then(|| query.resources.to_vec());
        let rows = self
            .call(
                what,
                true,
                "WITH gone AS (DELETE FROM __SCHEMA__.waiters w \
                   WHERE w.deadline < clock_timestamp() AND ($1::text[] IS NULL OR w.resource = ANY($1)) \
                   RETURNING 1) \
                 SELECT count(*) FROM gone",
                &[(&names, Type::TEXT_ARRAY)],
            )
            .await?;
        pruned.waiters = rows
            .first()
            .map_or(0, |row| row.get::<_, i64>(0).unsigned_abs());
        // Refused attempts whose last one is older than the bound, their counts kept in
        // `event_totals` (see `attempt_counts`).
        self.call(
            what,
            true,
            "WITH gone AS (DELETE FROM __SCHEMA__.attempts a \
               WHERE a.last_at < to_timestamp($2::bigint / 1000.0) \
               AND ($1::text[] IS NULL OR a.resource = ANY($1)) \
               RETURNING a.resource, a.kind, a.count) \
             INSERT INTO __SCHEMA__.event_totals AS t (resource, kind, n) \
             SELECT g.resource, 'attempts:' || g.kind, sum(g.count) FROM gone g GROUP BY 1, 2 \
             ON CONFLICT (resource, kind) DO UPDATE SET n = t.n + EXCLUDED.n",
            &[(&names, Type::TEXT_ARRAY), (&before, Type::INT8)],
        )
        .await?;
        Ok(pruned)
    }
}
