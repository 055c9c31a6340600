-- fence coordinator schema, version 5. `__SCHEMA__` is replaced by the validated --schema name.
-- Idempotent: run inside one transaction under an advisory lock by `fence init` or lazily; a
-- version-1 or version-2 schema is migrated by running it again (version 2 added a waiters'
-- queue on session advisory locks; version 3 replaced it with the durable queue below, which
-- holds no session state and so works behind a transaction-mode pooler; version 4 records each
-- grant's and renewal's TTL and expiry, and a takeover's previous expiry, in its event, for
-- `fence log`; version 5 keeps PL/pgSQL off the one-shot path and adds the tables of the
-- incident view: see its two blocks at the end).
CREATE SCHEMA IF NOT EXISTS __SCHEMA__;

CREATE TABLE IF NOT EXISTS __SCHEMA__.meta (
    key text PRIMARY KEY,
    value text NOT NULL
);

DO $gate$
BEGIN
    IF (SELECT value::int FROM __SCHEMA__.meta WHERE key = 'schema_version') > 5 THEN
        RAISE EXCEPTION 'schema __SCHEMA__ was created by a newer fence (version %)',
            (SELECT value FROM __SCHEMA__.meta WHERE key = 'schema_version')
            USING ERRCODE = 'LF014', HINT = 'upgrade fence, or use another --schema';
    END IF;
END
$gate$;

-- One row per resource, never deleted: the token counter must survive release and expiry.
-- A released lease keeps its token and last owner; expires_at IS NULL means free.
CREATE TABLE IF NOT EXISTS __SCHEMA__.leases (
    resource text PRIMARY KEY,
    owner text,
    token bigint NOT NULL CHECK (token > 0),
    acquired_at timestamptz,
    renewed_at timestamptz,
    expires_at timestamptz,
    ttl_ms bigint NOT NULL,
    last_event text NOT NULL
);

-- Append-only history: grants, renewals, releases, and rejected late renewals/releases.
CREATE TABLE IF NOT EXISTS __SCHEMA__.events (
    id bigserial PRIMARY KEY,
    resource text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind text NOT NULL,
    owner text,
    token bigint,
    detail text
);
CREATE INDEX IF NOT EXISTS events_resource_id ON __SCHEMA__.events (resource, id DESC);
-- Version 4: a grant's or renewal's TTL and the expiry it set, and for a takeover when the
-- lease it took over had expired (kept in the lease row by the takeover's UPDATE, which is
-- the only statement that sees the old expiry under the row lock). Nullable without a
-- default: adding them rewrites nothing; events of earlier versions have none.
ALTER TABLE __SCHEMA__.events ADD COLUMN IF NOT EXISTS ttl_ms bigint;
ALTER TABLE __SCHEMA__.events ADD COLUMN IF NOT EXISTS expires_at timestamptz;
ALTER TABLE __SCHEMA__.events ADD COLUMN IF NOT EXISTS previous_expires_at timestamptz;
ALTER TABLE __SCHEMA__.leases ADD COLUMN IF NOT EXISTS previous_expires_at timestamptz;
-- `fence log --since`: a resource's events in a time window are one index range, however
-- long its history.
CREATE INDEX IF NOT EXISTS events_resource_at ON __SCHEMA__.events (resource, at);
-- `inspect --limit/--after` pages resources in byte order: this index serves the page
-- without sorting the whole table.
CREATE INDEX IF NOT EXISTS leases_resource_bytes ON __SCHEMA__.leases (resource COLLATE "C");

-- The waiters' queue (`--wait`). One row per waiting process; its id (a sequence) is its place
-- in arrival order. A waiter keeps its row alive by polling: every poll moves `deadline` (by
-- the server's clock) to as far ahead as the waiter promises to poll again, plus a grace. A
-- row past its deadline belongs to a waiter that is dead or paused: any poll of the resource
-- deletes it, and a waiter that comes back to find its row gone joins again at the back.
-- Waiter bookkeeping is not safety-relevant: it is written with synchronous_commit off, and
-- nothing here takes a lock or keeps state beyond one transaction.
DO $v3$
BEGIN
    -- Versions 1 and 2 kept (resource, owner, since, backend_pid): replaced, with the
    -- functions of the advisory-lock queue. Rows of waiters of that time are dropped; such
    -- waiters fail on their next call and can be restarted.
    IF EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = '__SCHEMA__'
               AND table_name = 'waiters' AND column_name = 'backend_pid') THEN
        DROP TABLE __SCHEMA__.waiters;
    END IF;
    DROP FUNCTION IF EXISTS __SCHEMA__.wait_begin(text, text);
    DROP FUNCTION IF EXISTS __SCHEMA__.wait_turn(text, bigint);
    DROP FUNCTION IF EXISTS __SCHEMA__.acquire_queued(text, text, bigint);
    DROP FUNCTION IF EXISTS __SCHEMA__.unwait(text);
    DROP FUNCTION IF EXISTS __SCHEMA__.leave_queue(text);
END
$v3$;

CREATE TABLE IF NOT EXISTS __SCHEMA__.waiters (
    id bigserial PRIMARY KEY,
    resource text NOT NULL,
    owner text NOT NULL,
    since timestamptz NOT NULL DEFAULT clock_timestamp(),
    deadline timestamptz NOT NULL
);
-- No index on deadline: every poll updates it, and with no index on it those updates are
-- HOT (no index entries, pruned in the page). The table holds only waiting processes, so the
-- purge of overdue rows in wait_enter reads it whole at little cost.
CREATE INDEX IF NOT EXISTS waiters_resource_id ON __SCHEMA__.waiters (resource, id);

-- What a waiter's poll answers besides the lease: its row and its place (1 = head).
CREATE OR REPLACE FUNCTION __SCHEMA__.wait_answer(p_resource text, p_waiter bigint,
    OUT status text, OUT token bigint, OUT owner text, OUT acquired_ms bigint,
    OUT renewed_ms bigint, OUT expires_ms bigint, OUT expires_in_ms bigint, OUT ttl_ms bigint,
    OUT waiter bigint, OUT place bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    r __SCHEMA__.leases;
BEGIN
    status := 'busy';
    waiter := p_waiter;
    SELECT count(*) INTO place FROM __SCHEMA__.waiters w
    WHERE w.resource = p_resource AND w.id <= p_waiter;
    SELECT * INTO r FROM __SCHEMA__.leases AS l WHERE l.resource = p_resource;
    IF FOUND THEN
        token := r.token; owner := r.owner;
        acquired_ms := __SCHEMA__.ms(r.acquired_at); renewed_ms := __SCHEMA__.ms(r.renewed_at);
        expires_ms := __SCHEMA__.ms(r.expires_at);
        expires_in_ms := __SCHEMA__.ms(r.expires_at) - __SCHEMA__.ms(clock_timestamp());
        ttl_ms := r.ttl_ms;
    END IF;
END
$fn$;

-- A `--wait` acquire's first call: deletes every waiter row past its deadline (any
-- resource); then, unless other waiters are queued for the resource (and the
-- caller does not hold it live already), tries the acquire; if that is busy or was not
-- tried, queues the caller at the back with a row that lives p_live_ms unless polled (and
-- LISTENs as wait_poll does), and tells it how fast the queue has been moving.
CREATE OR REPLACE FUNCTION __SCHEMA__.wait_enter(p_resource text, p_owner text, p_ttl_ms bigint,
    p_live_ms bigint, p_listen_within bigint,
    OUT status text, OUT token bigint, OUT owner text, OUT acquired_ms bigint,
    OUT renewed_ms bigint, OUT expires_ms bigint, OUT expires_in_ms bigint, OUT ttl_ms bigint,
    OUT waiter bigint, OUT place bigint, OUT pace_ms bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_id bigint;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    DELETE FROM __SCHEMA__.waiters w WHERE w.deadline < clock_timestamp();
    IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.waiters w WHERE w.resource = p_resource)
       OR EXISTS (SELECT 1 FROM __SCHEMA__.leases l WHERE l.resource = p_resource
                  AND l.owner = p_owner AND l.expires_at > clock_timestamp()) THEN
        -- acquire() makes its own transaction's commit synchronous again.
        SELECT * INTO status, token, owner, acquired_ms, renewed_ms, expires_ms, expires_in_ms, ttl_ms
        FROM __SCHEMA__.acquire(p_resource, p_owner, p_ttl_ms) a;
        IF status <> 'busy' THEN
            RETURN;
        END IF;
    END IF;
    INSERT INTO __SCHEMA__.waiters (resource, owner, deadline)
    VALUES (p_resource, p_owner, clock_timestamp() + p_live_ms * interval '1 millisecond')
    RETURNING waiters.id INTO v_id;
    SELECT * INTO status, token, owner, acquired_ms, renewed_ms, expires_ms, expires_in_ms, ttl_ms,
        waiter, place
    FROM __SCHEMA__.wait_answer(p_resource, v_id);
    IF place <= p_listen_within THEN
        LISTEN __CHANNEL__;
    END IF;
    -- The resource's recent pace, for the newcomer's first poll interval: the median gap
    -- between consecutive grants among its last 16 events (an index range of 16 rows), so
    -- that a few stalls (a lease left free while its next waiter slept) do not teach the
    -- newcomer to sleep longer; with fewer than two grants among them, the time they span
    -- per grant.
    WITH recent AS (
        SELECT ev.id, ev.at, ev.kind FROM __SCHEMA__.events ev WHERE ev.resource = p_resource
        ORDER BY ev.id DESC LIMIT 16),
    gaps AS (
        SELECT extract(epoch FROM r.at - lag(r.at) OVER (ORDER BY r.id)) * 1000 AS gap
        FROM recent r WHERE r.kind IN ('acquired', 'taken_over'))
    SELECT coalesce(
        (SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY g.gap) FROM gaps g
         WHERE g.gap IS NOT NULL)::bigint,
        (SELECT (__SCHEMA__.ms(clock_timestamp()) - __SCHEMA__.ms(min(r.at)))
                / greatest(count(*) FILTER (WHERE r.kind IN ('acquired', 'taken_over')), 1)
         FROM recent r))
    INTO pace_ms;
END
$fn$;

-- A queued waiter's poll, one short statement: extends the caller's row for p_live_ms,
-- deletes the resource's rows past their deadline (dead or paused waiters are skipped, and
-- told when they come back), and, if the caller now heads the queue, tries the acquire. A
-- grant removes the row and notifies the resource's channel, so that the next waiter, if it
-- listens, takes the head at once. A waiter within p_listen_within of the head LISTENs (it
-- keeps its connection); a granted one stops. (Behind a transaction-mode pooler LISTEN is
-- lost with the server connection it ran on: the waiters near the head poll as well.)
-- `lapsed`: the caller's row was deleted as dead.
CREATE OR REPLACE FUNCTION __SCHEMA__.wait_poll(p_resource text, p_owner text, p_ttl_ms bigint,
    p_waiter bigint, p_live_ms bigint, p_listen_within bigint,
    OUT status text, OUT token bigint, OUT owner text, OUT acquired_ms bigint,
    OUT renewed_ms bigint, OUT expires_ms bigint, OUT expires_in_ms bigint, OUT ttl_ms bigint,
    OUT waiter bigint, OUT place bigint)
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE __SCHEMA__.waiters w
    SET deadline = clock_timestamp() + p_live_ms * interval '1 millisecond'
    WHERE w.id = p_waiter AND w.resource = p_resource;
    IF NOT FOUND THEN
        status := 'lapsed';
        RETURN;
    END IF;
    DELETE FROM __SCHEMA__.waiters w
    WHERE w.resource = p_resource AND w.id < p_waiter AND w.deadline < clock_timestamp();
    IF EXISTS (SELECT 1 FROM __SCHEMA__.waiters w WHERE w.resource = p_resource AND w.id < p_waiter) THEN
        SELECT * INTO status, token, owner, acquired_ms, renewed_ms, expires_ms, expires_in_ms, ttl_ms,
            waiter, place
        FROM __SCHEMA__.wait_answer(p_resource, p_waiter);
        IF place <= p_listen_within THEN
            LISTEN __CHANNEL__;
        END IF;
        RETURN;
    END IF;
    SELECT * INTO status, token, owner, acquired_ms, renewed_ms, expires_ms, expires_in_ms, ttl_ms
    FROM __SCHEMA__.acquire(p_resource, p_owner, p_ttl_ms) a;
    waiter := p_waiter;
    place := 1;
    IF status <> 'busy' THEN
        DELETE FROM __SCHEMA__.waiters w WHERE w.id = p_waiter;
        PERFORM pg_notify('__CHANNEL__', 'g' || p_waiter || ':' || p_resource);
        UNLISTEN __CHANNEL__;
    ELSE
        LISTEN __CHANNEL__;
    END IF;
END
$fn$;

-- Leaves the queue (the wait ran out, or failed). If the caller was the head, the next
-- waiter is told at once.
CREATE OR REPLACE FUNCTION __SCHEMA__.wait_leave(p_resource text, p_waiter bigint) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    DELETE FROM __SCHEMA__.waiters w WHERE w.id = p_waiter AND w.resource = p_resource;
    PERFORM pg_notify('__CHANNEL__', 'l' || p_waiter || ':' || p_resource);
    UNLISTEN __CHANNEL__;
END
$fn$;

-- Tokens never go down and lease rows are never removed, whoever writes (DESIGN §8): the
-- coordinator's role may write `leases` (the statements run with its rights), so only a
-- trigger stops a hand-written DELETE, TRUNCATE, lowered token or renamed resource (which
-- removes the record of the old name: its next grant would be token 1). Its triggers are
-- created in the version-5 block.
CREATE OR REPLACE FUNCTION __SCHEMA__.leases_guard() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'fence lease records are never deleted: the token counter must survive'
            USING ERRCODE = 'LF004', HINT = 'release leases with `fence release`; rows of free resources are harmless';
    END IF;
    IF NEW.resource IS DISTINCT FROM OLD.resource THEN
        RAISE EXCEPTION 'the fence lease record of % cannot be renamed: its token counter must survive', OLD.resource
            USING ERRCODE = 'LF004', HINT = 'a resource is known by its name: acquire the new name with `fence acquire` instead';
    END IF;
    IF NEW.token < OLD.token THEN
        RAISE EXCEPTION 'the fencing token of % cannot go down (% to %)', OLD.resource, OLD.token, NEW.token
            USING ERRCODE = 'LF005';
    END IF;
    RETURN NEW;
END
$fn$;

-- STABLE, as extract() on a timestamptz is: a function more volatile inside than declared is
-- never inlined, and a call that is not inlined re-plans its body in every transaction.
CREATE OR REPLACE FUNCTION __SCHEMA__.ms(t timestamptz) RETURNS bigint
LANGUAGE sql STABLE AS $fn$ SELECT floor(extract(epoch FROM t) * 1000)::bigint $fn$;

-- Acquire in one call, for the waiters' functions (and fence of version 4): a one-shot
-- acquire sends `ACQUIRE` (src/coordinator/pg_one_shot.rs), the same steps as one statement;
-- tests/contract.rs `postgres_the_two_forms_of_the_token_rule_agree_on_every_branch` runs both
-- from the same states, on every branch, and fails when they differ. The refused (busy) path takes no row lock and writes nothing: the
-- UPDATE only locks a row it can take, the INSERT only runs when no row exists, and the busy
-- answer is a plain read. The new token is computed from the locked row (token + 1) and the
-- clock is read per row (clock_timestamp in the per-row SET subquery), again after the lock
-- when the row changed under it (not when its holder left it as it was: see
-- `Leases::grant_in_time`).
CREATE OR REPLACE FUNCTION __SCHEMA__.acquire(p_resource text, p_owner text, p_ttl_ms bigint,
    OUT status text, OUT token bigint, OUT owner text, OUT acquired_ms bigint,
    OUT renewed_ms bigint, OUT expires_ms bigint, OUT expires_in_ms bigint, OUT ttl_ms bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    r __SCHEMA__.leases;
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);
    LOOP
        UPDATE __SCHEMA__.leases AS l
        SET (token, last_event, acquired_at, owner, renewed_at, expires_at, ttl_ms,
             previous_expires_at) = (
            SELECT CASE WHEN x.live_mine THEN l.token ELSE l.token + 1 END,
                   CASE WHEN x.live_mine THEN 'reacquired'
                        WHEN l.expires_at IS NULL OR l.owner = p_owner THEN 'acquired'
                        ELSE 'taken_over' END,
                   CASE WHEN x.live_mine THEN l.acquired_at ELSE x.now END,
                   p_owner, x.now, x.now + p_ttl_ms * interval '1 millisecond', p_ttl_ms,
                   l.expires_at
            FROM (SELECT c.now, coalesce(l.owner = p_owner AND l.expires_at > c.now, false) AS live_mine
                  FROM (SELECT clock_timestamp() AS now) c) x)
        WHERE l.resource = p_resource
          AND (l.expires_at IS NULL OR l.expires_at <= clock_timestamp() OR l.owner = p_owner)
        RETURNING l.* INTO r;
        IF NOT FOUND THEN
            SELECT * INTO r FROM __SCHEMA__.leases AS l WHERE l.resource = p_resource;
            IF FOUND THEN
                IF r.expires_at > clock_timestamp() AND r.owner IS DISTINCT FROM p_owner THEN
                    status := 'busy';
                    token := r.token; owner := r.owner;
                    acquired_ms := __SCHEMA__.ms(r.acquired_at); renewed_ms := __SCHEMA__.ms(r.renewed_at);
                    expires_ms := __SCHEMA__.ms(r.expires_at);
                    expires_in_ms := __SCHEMA__.ms(r.expires_at) - __SCHEMA__.ms(clock_timestamp());
                    ttl_ms := r.ttl_ms;
                    RETURN;
                END IF;
                CONTINUE; -- it changed under us: try again
            END IF;
            INSERT INTO __SCHEMA__.leases AS l
                (resource, owner, token, acquired_at, renewed_at, expires_at, ttl_ms, last_event)
            SELECT p_resource, p_owner, 1, c.now, c.now, c.now + p_ttl_ms * interval '1 millisecond',
                   p_ttl_ms, 'acquired'
            FROM (SELECT clock_timestamp() AS now) c
            ON CONFLICT (resource) DO NOTHING
            RETURNING l.* INTO r;
            IF NOT FOUND THEN
                CONTINUE; -- another acquirer created it first
            END IF;
        END IF;
        INSERT INTO __SCHEMA__.events (resource, at, kind, owner, token, ttl_ms, expires_at,
                                       previous_expires_at)
        VALUES (p_resource, r.renewed_at, r.last_event, p_owner, r.token, r.ttl_ms, r.expires_at,
                CASE WHEN r.last_event = 'taken_over' THEN r.previous_expires_at END);
        status := r.last_event;
        token := r.token; owner := r.owner;
        acquired_ms := __SCHEMA__.ms(r.acquired_at); renewed_ms := __SCHEMA__.ms(r.renewed_at);
        expires_ms := __SCHEMA__.ms(r.expires_at);
        expires_in_ms := __SCHEMA__.ms(r.expires_at) - __SCHEMA__.ms(clock_timestamp());
        ttl_ms := r.ttl_ms;
        RETURN;
    END LOOP;
END
$fn$;

-- `classify`, `renew` and `release` are kept for fence binaries of version 4 during an
-- upgrade; this fence sends `RENEW` and `RELEASE` (src/coordinator/pg_one_shot.rs) instead.
-- Shared classification of a renew/release that did not match its lease. Writes a
-- `<op>_rejected` event for a stale, expired or released lease so `inspect` shows it.
CREATE OR REPLACE FUNCTION __SCHEMA__.classify(p_op text, p_resource text, p_owner text, p_token bigint,
    OUT status text, OUT token bigint, OUT owner text, OUT acquired_ms bigint,
    OUT renewed_ms bigint, OUT expires_ms bigint, OUT expires_in_ms bigint, OUT ttl_ms bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    r __SCHEMA__.leases;
BEGIN
    SELECT * INTO r FROM __SCHEMA__.leases AS l WHERE l.resource = p_resource;
    IF NOT FOUND THEN
        status := 'no_lease';
        RETURN;
    END IF;
    token := r.token; owner := r.owner;
    acquired_ms := __SCHEMA__.ms(r.acquired_at); renewed_ms := __SCHEMA__.ms(r.renewed_at);
    expires_ms := __SCHEMA__.ms(r.expires_at);
    expires_in_ms := __SCHEMA__.ms(r.expires_at) - __SCHEMA__.ms(clock_timestamp());
    ttl_ms := r.ttl_ms;
    IF r.token > p_token THEN
        status := 'stale';
    ELSIF r.token < p_token THEN
        status := 'never_issued';
        RETURN;
    ELSIF r.owner IS DISTINCT FROM p_owner THEN
        status := 'wrong_owner';
        RETURN;
    ELSIF r.expires_at IS NULL THEN
        IF p_op = 'release' THEN
            status := 'already_released'; -- releasing twice is success, not an event
            RETURN;
        END IF;
        status := 'released';
    ELSE
        status := 'expired';
    END IF;
    INSERT INTO __SCHEMA__.events (resource, kind, owner, token, detail)
    VALUES (p_resource, p_op || '_rejected', p_owner, p_token,
            CASE status WHEN 'stale' THEN 'token ' || r.token || ' issued since' ELSE status END);
END
$fn$;

CREATE OR REPLACE FUNCTION __SCHEMA__.renew(p_resource text, p_owner text, p_token bigint, p_ttl_ms bigint,
    OUT status text, OUT token bigint, OUT owner text, OUT acquired_ms bigint,
    OUT renewed_ms bigint, OUT expires_ms bigint, OUT expires_in_ms bigint, OUT ttl_ms bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    r __SCHEMA__.leases;
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);
    UPDATE __SCHEMA__.leases AS l
    SET (renewed_at, expires_at, ttl_ms, last_event) = (
        SELECT c.now, c.now + coalesce(p_ttl_ms, l.ttl_ms) * interval '1 millisecond',
               coalesce(p_ttl_ms, l.ttl_ms), 'renewed'
        FROM (SELECT clock_timestamp() AS now) c)
    WHERE l.resource = p_resource AND l.token = p_token AND l.owner = p_owner
      AND l.expires_at > clock_timestamp()
    RETURNING l.* INTO r;
    IF NOT FOUND THEN
        SELECT * INTO status, token, owner, acquired_ms, renewed_ms, expires_ms, expires_in_ms, ttl_ms
        FROM __SCHEMA__.classify('renew', p_resource, p_owner, p_token);
        RETURN;
    END IF;
    INSERT INTO __SCHEMA__.events (resource, at, kind, owner, token, ttl_ms, expires_at)
    VALUES (p_resource, r.renewed_at, 'renewed', p_owner, r.token, r.ttl_ms, r.expires_at);
    status := 'renewed';
    token := r.token; owner := r.owner;
    acquired_ms := __SCHEMA__.ms(r.acquired_at); renewed_ms := __SCHEMA__.ms(r.renewed_at);
    expires_ms := __SCHEMA__.ms(r.expires_at);
    expires_in_ms := __SCHEMA__.ms(r.expires_at) - __SCHEMA__.ms(clock_timestamp());
    ttl_ms := r.ttl_ms;
END
$fn$;

CREATE OR REPLACE FUNCTION __SCHEMA__.release(p_resource text, p_owner text, p_token bigint,
    OUT status text, OUT token bigint, OUT owner text, OUT acquired_ms bigint,
    OUT renewed_ms bigint, OUT expires_ms bigint, OUT expires_in_ms bigint, OUT ttl_ms bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    r __SCHEMA__.leases;
BEGIN
    -- Durable too: a release lost in a crash would be safe, but the resource would look held
    -- until the lease's TTL (up to hours) ran out.
    PERFORM set_config('synchronous_commit', 'on', true);
    UPDATE __SCHEMA__.leases AS l SET expires_at = NULL, last_event = 'released'
    WHERE l.resource = p_resource AND l.token = p_token AND l.owner = p_owner
      AND l.expires_at IS NOT NULL
    RETURNING l.* INTO r;
    IF NOT FOUND THEN
        SELECT * INTO status, token, owner, acquired_ms, renewed_ms, expires_ms, expires_in_ms, ttl_ms
        FROM __SCHEMA__.classify('release', p_resource, p_owner, p_token);
        RETURN;
    END IF;
    INSERT INTO __SCHEMA__.events (resource, kind, owner, token)
    VALUES (p_resource, 'released', p_owner, r.token);
    -- Wake the head of the resource's queue (payload `r:<resource>`; the waiters' grants
    -- and departures are `g<id>:` and `l<id>:`, so that the listening waiters behind the head
    -- follow their place without polling). Sent at commit; not durable, and dropped behind a
    -- transaction-mode pooler, so the listening waiters also poll.
    PERFORM pg_notify('__CHANNEL__', 'r:' || p_resource);
    status := 'released';
    token := r.token; owner := r.owner;
    ttl_ms := r.ttl_ms;
END
$fn$;

-- Version 5, the incident view: new tables only, written from Rust.
--
-- The events `fence prune` deleted, counted per resource and kind in the same statement that
-- deletes them, so that `fence metrics` counters (events kept + events pruned) never go down
-- (Prometheus reads a counter that goes down as a reset).
CREATE TABLE IF NOT EXISTS __SCHEMA__.event_totals (
    resource text NOT NULL,
    kind text NOT NULL,
    n bigint NOT NULL,
    PRIMARY KEY (resource, kind)
);
-- Refused attempts: busy acquisitions and conflicting renewals/releases (wrong owner, a token
-- never issued, no lease), one row per resource, minute, owner and kind with a count and the
-- first and last time, so that "who else tried" has an answer and a busy loop cannot grow the
-- table. Upserted by fence from Rust on the refused path only, in a statement of its own
-- (the lease functions above are unchanged); `fence prune` deletes old rows.
CREATE TABLE IF NOT EXISTS __SCHEMA__.attempts (
    resource text NOT NULL,
    minute timestamptz NOT NULL,
    owner text NOT NULL,
    kind text NOT NULL,
    count bigint NOT NULL,
    first_at timestamptz NOT NULL,
    last_at timestamptz NOT NULL,
    -- busy: the holder's token; conflict: the token presented.
    token bigint,
    detail text,
    PRIMARY KEY (resource, minute, owner, kind)
);
-- ==========================================================================================

-- ---------------------------------------------------------------------------------------
-- Version 5, continued: no PL/pgSQL on the one-shot path.
-- A new connection compiles each PL/pgSQL function on its first call and plans its
-- statements (about 3 ms of a one-shot `fence acquire`). Acquire, renew and release are now
-- plain statements sent by fence (`ACQUIRE`, `RENEW`, `RELEASE` in src/coordinator/pg_one_shot.rs),
-- with the same semantics as the functions above; those stay, for the waiters (`wait_enter`
-- and `wait_poll` call `acquire`: waiting is not one-shot) and for fence binaries of
-- version 4 still running during an upgrade. The guard's UPDATE trigger calls its function
-- only for an update it refuses (the WHEN clause is an expression the executor evaluates,
-- no function call), so granting, renewing and releasing call no PL/pgSQL at all; DELETE and
-- TRUNCATE are refused as before, by triggers of their own.
CREATE OR REPLACE TRIGGER leases_guard BEFORE UPDATE ON __SCHEMA__.leases
    FOR EACH ROW WHEN (NEW.token < OLD.token OR NEW.resource <> OLD.resource)
    EXECUTE FUNCTION __SCHEMA__.leases_guard();
CREATE OR REPLACE TRIGGER leases_no_delete BEFORE DELETE ON __SCHEMA__.leases
    FOR EACH ROW EXECUTE FUNCTION __SCHEMA__.leases_guard();
CREATE OR REPLACE TRIGGER leases_no_truncate BEFORE TRUNCATE ON __SCHEMA__.leases
    FOR EACH STATEMENT EXECUTE FUNCTION __SCHEMA__.leases_guard();
-- End of version 5.
-- ---------------------------------------------------------------------------------------

INSERT INTO __SCHEMA__.meta (key, value) VALUES ('schema_version', '5')
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;
