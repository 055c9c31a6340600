//! The PostgreSQL coordinator's one-shot statements: acquire, renew and release, each ONE
//! plain statement in autocommit (data-modifying CTEs), sent as an unnamed statement.
//!
//! Why not the schema's PL/pgSQL functions: a one-shot `fence acquire` runs on a new
//! connection, whose backend loads PL/pgSQL, compiles the function on its first call and
//! plans each of its statements apart (issue 22). A plain statement is parsed and planned
//! once, as any statement on a new connection is, and calls no PL/pgSQL (the `leases_guard`
//! trigger calls its function only for an update it refuses: see the version-5 block of
//! `schema.sql`). Measured as the new backend's CPU time (`perf stat -e task-clock`), a
//! reacquire costs 2.2 ms instead of 3.3, a busy answer 1.9 instead of 2.9; what remains is
//! what any statement pays on a new backend for the relations it touches (0.6 ms for a
//! `SELECT` of one lease row). Waiting (`--wait`) keeps its PL/pgSQL functions: a waiter
//! polls on one connection, where the compiled function is reused.
//!
//! Each statement keeps what the functions kept (DESIGN §7–§8):
//! - the new token is computed from the locked row (`token + 1` in the UPDATE's SET, which
//!   PostgreSQL evaluates again on the newest row version if the row changed under the lock;
//!   `greatest(token, N) + 1` for `acquire --above N`), never from a sequence, and a new
//!   resource starts at 1 (N + 1) through `INSERT … ON CONFLICT DO NOTHING`; rows are never
//!   deleted, so the counter survives release and expiry;
//! - the clock is `clock_timestamp()`, read per row, again after the lock when the row changed
//!   under it; a statement that waited on a lock whose holder left the row as it was (a
//!   `SELECT … FOR UPDATE`, a rolled-back insert) keeps what it read before the wait, which
//!   `Leases::grant_in_time` catches (a grant answered past half its TTL is renewed);
//! - the event row is written in the same statement, so in the same transaction;
//! - `synchronous_commit` is set `on` for the statement's transaction (`set_config(…, true)`
//!   runs before the commit that ends the statement), so a grant is reported only once it is
//!   durable, whatever the server's default;
//! - a refused acquire (busy) takes no row lock and writes nothing: the UPDATE matches no row
//!   of the snapshot, the INSERT runs only when the snapshot has no row, and the answer is a
//!   read;
//! - a late renew or release changes nothing of a newer lease: its UPDATE is conditional on
//!   owner and token.
//!
//! One difference from a function: all parts of a statement see one snapshot, where each
//! statement of a PL/pgSQL function took a new one. When the UPDATE matched nothing although
//! the snapshot's row would have matched, the row changed between the snapshot and the lock
//! (another process's grant, renewal or release): the statement answers `retry`, changes
//! nothing, and fence sends it again, as the functions looped or re-read. Every other answer
//! is true at the snapshot: a busy holder, a stale token, a released lease.
//!
//! Each statement has a short form for its common case ([`ACQUIRE_FAST`], [`RENEW_FAST`],
//! [`RELEASE_FAST`]), which fence sends first: it does what the full form does in that case,
//! and answers no row, having written nothing, in every other case, where fence sends the
//! full form (for an acquire without `--above`, [`ACQUIRE_NEW`]: a new resource). Planning, which an unnamed statement pays on every call, grows with a
//! statement's parts: a release took 0.8 ms on a warm connection in full and 0.3 ms short
//! (`pgbench -M extended`; docs/performance.md).
//!
//! Each statement starts with a comment naming it (`-- fence: acquire`), which the server
//! shows in `pg_stat_activity` and its logs, and the tests' fault proxy recognises.

/// The last column of every one-shot statement: true when the schema is at the version this
/// fence knows (`__VERSION__`, filled in by [`crate::pg::session::Session::call`]); any
/// other version fails the whole statement, so nothing of it is applied, with an error that
/// names the version found (`invalid input syntax for type integer: "fence schema version
/// 6"`): the session migrates an older schema and sends the statement again, and refuses a
/// newer one (`Session::call`). No version row reads as version 0 (migrated). A plain
/// statement cannot raise an error of its own; the failed cast is how it says so, and costs
/// one lookup of the `meta` row.
macro_rules! schema_is_current {
    () => {
        "(SELECT CASE WHEN v.value = '__VERSION__' THEN true
             ELSE ('fence schema version ' || coalesce(v.value, '0'))::int IS NULL END
        FROM (SELECT (SELECT m.value FROM __SCHEMA__.meta m WHERE m.key = 'schema_version')
              AS value) v) AS schema_current"
    };
}

/// What every one-shot statement answers besides its row, and makes true of its transaction:
/// the server's clock (`now`), `synchronous_commit` on for this transaction (a grant or a
/// change is reported only once it is durable, whatever the server's default), and the
/// schema at this fence's version. Written once, so that no statement can leave one out.
macro_rules! answered {
    () => {
        concat!(
            "clock_timestamp() AS now,
       pg_catalog.set_config('synchronous_commit', 'on', true) AS synchronous_commit,
       ",
            schema_is_current!()
        )
    };
}

/// The other case of [`ACQUIRE_FAST`]: a resource without a lease row, created with token 1
/// and its `acquired` event, as [`ACQUIRE`] creates it. `$1` resource, `$2` owner, `$3` TTL in
/// ms. Answers `acquired`, or **no row** when another acquirer created the row first (nothing
/// written): then fence sends [`ACQUIRE_FAST`] again. Sent after [`ACQUIRE_FAST`] answered no
/// row, so that a new resource costs what [`ACQUIRE`] alone did (measured on new connections
/// with `pgbench -C`: 6.7–7.1 ms for both statements against 6.7–7.2 for [`ACQUIRE`] alone, and
/// 8.1–8.2 for [`ACQUIRE_FAST`] then [`ACQUIRE`]).
pub const ACQUIRE_NEW: &str = concat!(
    "\
-- fence: acquire
WITH created AS (
    INSERT INTO __SCHEMA__.leases AS l
        (resource, owner, token, acquired_at, renewed_at, expires_at, ttl_ms, last_event)
    SELECT $1, $2, 1, c.now, c.now, c.now + $3 * interval '1 millisecond', $3, 'acquired'
    FROM (SELECT clock_timestamp() AS now) c
    ON CONFLICT (resource) DO NOTHING
    RETURNING l.*),
logged AS (
    INSERT INTO __SCHEMA__.events (resource, at, kind, owner, token, ttl_ms, expires_at)
    SELECT g.resource, g.renewed_at, g.last_event, g.owner, g.token, g.ttl_ms, g.expires_at
    FROM created g)
SELECT g.last_event AS status, g.token, g.owner, g.acquired_at, g.renewed_at, g.expires_at,
       g.ttl_ms, ",
    answered!(),
    "
FROM created g"
);

/// The owner's live lease renewed, and its event: how [`RENEW_FAST`] and [`RENEW`] begin,
/// written once so that the two cannot differ in what they change.
macro_rules! renewed {
    () => {
        "WITH renewed AS (
    UPDATE __SCHEMA__.leases AS l
    SET (renewed_at, expires_at, ttl_ms, last_event) = (
        SELECT c.now, c.now + coalesce($4, l.ttl_ms) * interval '1 millisecond',
               coalesce($4, l.ttl_ms), 'renewed'
        FROM (SELECT clock_timestamp() AS now) c)
    WHERE l.resource = $1 AND l.token = $3 AND l.owner = $2
      AND l.expires_at > clock_timestamp()
    RETURNING l.*),
logged AS (
    INSERT INTO __SCHEMA__.events (resource, at, kind, owner, token, ttl_ms, expires_at)
    SELECT r.resource, r.renewed_at, 'renewed', r.owner, r.token, r.ttl_ms, r.expires_at
    FROM renewed r)"
    };
}

/// The owner's lease released (live, or expired and not taken), and its event: how
/// [`RELEASE_FAST`] and [`RELEASE`] begin.
macro_rules! released {
    () => {
        "WITH released AS (
    UPDATE __SCHEMA__.leases AS l SET expires_at = NULL, last_event = 'released'
    WHERE l.resource = $1 AND l.token = $3 AND l.owner = $2 AND l.expires_at IS NOT NULL
    RETURNING l.*),
logged AS (
    INSERT INTO __SCHEMA__.events (resource, kind, owner, token)
    SELECT r.resource, 'released', r.owner, r.token FROM released r)"
    };
}

/// `$1` resource, `$2` owner, `$3` TTL in ms, `$4` the token a new grant must also be above
/// (`acquire --above`; NULL: none). Answers `acquired`, `taken_over`, `reacquired` (the
/// owner's live lease, same token), `busy` (with the holder), `held_not_above` (the owner's
/// live lease, whose token is not above `$4`: nothing changed), or `retry`.
///
/// `$4` lives in the statement, not in the schema, so no migration was needed for it and
/// the PL/pgSQL `acquire()` (waiters; `--above` never waits) does not take it. A grant whose
/// token `$4` raised above the snapshot's token records `token raised above N (--above)` as
/// its event's detail, the words of `coordinator::raised_detail`.
pub const ACQUIRE: &str = concat!(
    "\
-- fence: acquire
WITH taken AS (
    UPDATE __SCHEMA__.leases AS l
    SET (token, last_event, acquired_at, owner, renewed_at, expires_at, ttl_ms,
         previous_expires_at) = (
        SELECT CASE WHEN x.live_mine THEN l.token ELSE greatest(l.token, $4) + 1 END,
               CASE WHEN x.live_mine THEN 'reacquired'
                    WHEN l.expires_at IS NULL OR l.owner = $2 THEN 'acquired'
                    ELSE 'taken_over' END,
               CASE WHEN x.live_mine THEN l.acquired_at ELSE x.now END,
               $2, x.now, x.now + $3 * interval '1 millisecond', $3, l.expires_at
        FROM (SELECT c.now, coalesce(l.owner = $2 AND l.expires_at > c.now, false) AS live_mine
              FROM (SELECT clock_timestamp() AS now) c) x)
    WHERE l.resource = $1
      AND (l.expires_at IS NULL OR l.expires_at <= clock_timestamp() OR l.owner = $2)
      AND NOT coalesce(l.owner = $2 AND l.expires_at > clock_timestamp() AND l.token <= $4,
                       false)
    RETURNING l.*),
seen AS (
    SELECT * FROM __SCHEMA__.leases AS l WHERE l.resource = $1),
created AS (
    INSERT INTO __SCHEMA__.leases AS l
        (resource, owner, token, acquired_at, renewed_at, expires_at, ttl_ms, last_event)
    SELECT $1, $2, coalesce($4, 0) + 1, c.now, c.now, c.now + $3 * interval '1 millisecond',
           $3, 'acquired'
    FROM (SELECT clock_timestamp() AS now) c
    WHERE NOT EXISTS (SELECT FROM seen)
    ON CONFLICT (resource) DO NOTHING
    RETURNING l.*),
granted AS (
    SELECT * FROM taken UNION ALL SELECT * FROM created),
logged AS (
    INSERT INTO __SCHEMA__.events (resource, at, kind, owner, token, ttl_ms, expires_at,
                                   previous_expires_at, detail)
    SELECT g.resource, g.renewed_at, g.last_event, g.owner, g.token, g.ttl_ms, g.expires_at,
           CASE WHEN g.last_event = 'taken_over' THEN g.previous_expires_at END,
           CASE WHEN g.last_event <> 'reacquired' AND g.token = $4 + 1
                     AND coalesce((SELECT s.token FROM seen s), 0) < $4
                THEN 'token raised above ' || $4 || ' (--above)' END
    FROM granted g),
answer AS (
    SELECT g.last_event AS status, g.token, g.owner, g.acquired_at, g.renewed_at,
           g.expires_at, g.ttl_ms
    FROM granted g
    UNION ALL
    SELECT CASE WHEN s.expires_at > clock_timestamp() AND s.owner IS DISTINCT FROM $2
                THEN 'busy'
                WHEN s.expires_at > clock_timestamp() AND s.token <= $4
                THEN 'held_not_above' ELSE 'retry' END,
           s.token, s.owner, s.acquired_at, s.renewed_at, s.expires_at, s.ttl_ms
    FROM seen s WHERE NOT EXISTS (SELECT FROM granted))
SELECT coalesce(a.status, 'retry') AS status, a.token, a.owner, a.acquired_at, a.renewed_at,
       a.expires_at, a.ttl_ms, ",
    answered!(),
    "
FROM (SELECT) AS one LEFT JOIN answer a ON true"
);

/// The common case of [`ACQUIRE`], planned in a fraction of its time (the planner's work
/// grows with a statement's parts, and an unnamed statement is planned on every call: 1.1 ms
/// of the whole one's ~1.4 ms on a warm connection, measured with `pgbench -M extended`
/// against `-M prepared`). `$1` resource, `$2` owner, `$3` TTL in ms; no `--above`. Answers
/// as [`ACQUIRE`] does (`acquired`, `taken_over`, `reacquired`, `busy`, `retry`) when the
/// resource has a lease row, with the same row, event and answer; and **no row at all** when
/// it has none: then fence sends [`ACQUIRE_NEW`], which creates it. Nothing is written unless
/// a row is granted, so what follows starts from the state this statement saw or a newer one.
/// [`ACQUIRE`], which does both and `--above`, is sent only for `--above`.
/// `tests/suite/stores/contract.rs` runs both (and the PL/pgSQL `acquire()`) from the same
/// states, on every branch.
///
/// Its answer is the granted row, or the row as the statement's snapshot saw it (not
/// granted: `busy`, or changed since the snapshot: `retry`), joined rather than a `UNION
/// ALL` of the two: 0.15–0.2 ms less of the server's time on a new connection, where the
/// whole statement takes 2.7–3.8 ms, and 0.2–0.5 ms less per `fence acquire`
/// (docs/performance.md). The snapshot's row `s` is there whenever the granted `g` is (the
/// UPDATE found its row in that snapshot, and lease rows are never deleted), and `coalesce`
/// cannot mix the two: a grant sets every column the answer reads (`acquired_at` kept on a
/// reacquire is the same row's). `postgres_acquire_fast_answers_whole_rows_under_lock_waits`
/// checks every column under lock waits.
pub const ACQUIRE_FAST: &str = concat!(
    "\
-- fence: acquire
WITH taken AS (
    UPDATE __SCHEMA__.leases AS l
    SET (token, last_event, acquired_at, owner, renewed_at, expires_at, ttl_ms,
         previous_expires_at) = (
        SELECT CASE WHEN x.live_mine THEN l.token ELSE l.token + 1 END,
               CASE WHEN x.live_mine THEN 'reacquired'
                    WHEN l.expires_at IS NULL OR l.owner = $2 THEN 'acquired'
                    ELSE 'taken_over' END,
               CASE WHEN x.live_mine THEN l.acquired_at ELSE x.now END,
               $2, x.now, x.now + $3 * interval '1 millisecond', $3, l.expires_at
        FROM (SELECT c.now, coalesce(l.owner = $2 AND l.expires_at > c.now, false) AS live_mine
              FROM (SELECT clock_timestamp() AS now) c) x)
    WHERE l.resource = $1
      AND (l.expires_at IS NULL OR l.expires_at <= clock_timestamp() OR l.owner = $2)
    RETURNING l.*),
logged AS (
    INSERT INTO __SCHEMA__.events (resource, at, kind, owner, token, ttl_ms, expires_at,
                                   previous_expires_at)
    SELECT g.resource, g.renewed_at, g.last_event, g.owner, g.token, g.ttl_ms, g.expires_at,
           CASE WHEN g.last_event = 'taken_over' THEN g.previous_expires_at END
    FROM taken g)
SELECT coalesce(g.last_event,
                CASE WHEN s.expires_at > clock_timestamp() AND s.owner IS DISTINCT FROM $2
                     THEN 'busy' ELSE 'retry' END) AS status,
       coalesce(g.token, s.token) AS token, coalesce(g.owner, s.owner) AS owner,
       coalesce(g.acquired_at, s.acquired_at) AS acquired_at,
       coalesce(g.renewed_at, s.renewed_at) AS renewed_at,
       coalesce(g.expires_at, s.expires_at) AS expires_at,
       coalesce(g.ttl_ms, s.ttl_ms) AS ttl_ms,
       ",
    answered!(),
    "
FROM __SCHEMA__.leases AS s LEFT JOIN taken g ON true
WHERE s.resource = $1"
);

/// The common case of [`RENEW`]: the owner's live lease renewed, with the same row, event
/// and answer (`renewed`); **no row** otherwise, and nothing written: then fence sends
/// [`RENEW`], which says why (see [`ACQUIRE_FAST`] for what this saves). Same parameters.
pub const RENEW_FAST: &str = concat!(
    "-- fence: renew\n",
    renewed!(),
    "
SELECT 'renewed' AS status, r.token, r.owner, r.acquired_at, r.renewed_at, r.expires_at,
       r.ttl_ms, ",
    answered!(),
    "
FROM renewed r"
);

/// `$1` resource, `$2` owner, `$3` token, `$4` new TTL in ms or NULL (keep the lease's).
/// Answers `renewed`, a refusal (`stale`, `expired`, `released` — each recorded as a
/// `renew_rejected` event — or `never_issued`, `wrong_owner`, `no_lease`), or `retry`. A
/// lease of this owner and token that was live at the snapshot but not renewed changed since:
/// `retry`.
pub const RENEW: &str = concat!(
    "-- fence: renew\n",
    renewed!(),
    ",
refused AS (
    SELECT l.*,
           CASE WHEN l.token > $3 THEN 'stale'
                WHEN l.token < $3 THEN 'never_issued'
                WHEN l.owner IS DISTINCT FROM $2 THEN 'wrong_owner'
                WHEN l.expires_at IS NULL THEN 'released'
                WHEN l.expires_at <= clock_timestamp() THEN 'expired'
                ELSE 'retry' END AS status
    FROM __SCHEMA__.leases AS l
    WHERE l.resource = $1 AND NOT EXISTS (SELECT FROM renewed)),
rejected AS (
    INSERT INTO __SCHEMA__.events (resource, kind, owner, token, detail)
    SELECT f.resource, 'renew_rejected', $2, $3,
           CASE f.status WHEN 'stale' THEN 'token ' || f.token || ' issued since'
                ELSE f.status END
    FROM refused f WHERE f.status IN ('stale', 'released', 'expired')),
answer AS (
    SELECT 'renewed' AS status, r.token, r.owner, r.acquired_at, r.renewed_at, r.expires_at,
           r.ttl_ms
    FROM renewed r
    UNION ALL
    SELECT f.status, f.token, f.owner, f.acquired_at, f.renewed_at, f.expires_at, f.ttl_ms
    FROM refused f)
SELECT coalesce(a.status, 'no_lease') AS status, a.token, a.owner, a.acquired_at,
       a.renewed_at, a.expires_at, a.ttl_ms, ",
    answered!(),
    "
FROM (SELECT) AS one LEFT JOIN answer a ON true"
);

/// The common case of [`RELEASE`]: the owner's lease released (live or expired, untaken),
/// with the same row, event, notification and answer (`released`); **no row** otherwise, and
/// nothing written: then fence sends [`RELEASE`], which says why (see [`ACQUIRE_FAST`] for
/// what this saves: here 0.8 ms of planning on every release, which a waiting head of the
/// queue waits through). Same parameters.
pub const RELEASE_FAST: &str = concat!(
    "-- fence: release\n",
    released!(),
    "
SELECT 'released' AS status, r.token, r.owner, r.acquired_at, r.renewed_at, r.expires_at,
       r.ttl_ms, pg_notify('__CHANNEL__', 'r:' || r.resource) IS NULL AS woken,
       ",
    answered!(),
    "
FROM released r"
);

/// `$1` resource, `$2` owner, `$3` token. Answers `released`, `already_released` (success:
/// releasing twice is not an event), a refusal (`stale`, recorded as a `release_rejected`
/// event, or `never_issued`, `wrong_owner`, `no_lease`), or `retry`. Durable too: a release
/// lost in a crash would be safe, but the resource would look held until the lease's TTL (up
/// to hours) ran out. A release notifies the resource's channel (payload `r:<resource>`; see
/// `wait_poll` in `schema.sql`), sent at commit, to wake the head of its queue.
pub const RELEASE: &str = concat!(
    "-- fence: release\n",
    released!(),
    ",
refused AS (
    SELECT l.*,
           CASE WHEN l.token > $3 THEN 'stale'
                WHEN l.token < $3 THEN 'never_issued'
                WHEN l.owner IS DISTINCT FROM $2 THEN 'wrong_owner'
                WHEN l.expires_at IS NULL THEN 'already_released'
                ELSE 'retry' END AS status
    FROM __SCHEMA__.leases AS l
    WHERE l.resource = $1 AND NOT EXISTS (SELECT FROM released)),
rejected AS (
    INSERT INTO __SCHEMA__.events (resource, kind, owner, token, detail)
    SELECT f.resource, 'release_rejected', $2, $3, 'token ' || f.token || ' issued since'
    FROM refused f WHERE f.status = 'stale'),
answer AS (
    SELECT 'released' AS status, r.token, r.owner, r.acquired_at, r.renewed_at, r.expires_at,
           r.ttl_ms
    FROM released r
    UNION ALL
    SELECT f.status, f.token, f.owner, f.acquired_at, f.renewed_at, f.expires_at, f.ttl_ms
    FROM refused f)
SELECT coalesce(a.status, 'no_lease') AS status, a.token, a.owner, a.acquired_at,
       a.renewed_at, a.expires_at, a.ttl_ms, (SELECT count(pg_notify('__CHANNEL__', 'r:' || r.resource)) FROM released r) AS woken,
       ",
    answered!(),
    "
FROM (SELECT) AS one LEFT JOIN answer a ON true"
);
