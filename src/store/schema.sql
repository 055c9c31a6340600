-- fence coordinator schema, version 2. `__SCHEMA__` is replaced by the validated --schema name.
-- Idempotent: run inside one transaction under an advisory lock by `fence init` or lazily; a
-- version-1 schema is migrated by running it again (version 2 added the waiters' queue:
-- wait_turn, leave_queue, acquire_queued).
CREATE SCHEMA IF NOT EXISTS __SCHEMA__;

CREATE TABLE IF NOT EXISTS __SCHEMA__.meta (
    key text PRIMARY KEY,
    value text NOT NULL
);

DO $gate$
BEGIN
    IF (SELECT value::int FROM __SCHEMA__.meta WHERE key = 'schema_version') > 2 THEN
        RAISE EXCEPTION 'schema __SCHEMA__ was created by a newer fence (version %)',
            (SELECT value FROM __SCHEMA__.meta WHERE key = 'schema_version')
            USING ERRCODE = 'LF010', HINT = 'upgrade fence, or use another --schema';
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

-- Processes blocked in `--wait`, for `inspect`. A row whose backend is gone is stale.
CREATE TABLE IF NOT EXISTS __SCHEMA__.waiters (
    resource text NOT NULL,
    owner text NOT NULL,
    since timestamptz NOT NULL DEFAULT clock_timestamp(),
    backend_pid int NOT NULL DEFAULT pg_backend_pid()
);

-- Waiters queue per resource on a session advisory lock and only the head of the queue
-- LISTENs, so that a release wakes one backend and one client instead of every waiter (every
-- listening backend of a database is signalled by each NOTIFY, whatever its channel). The
-- queue is FIFO (PostgreSQL's lock queue); a waiter whose turn does not come within its
-- poll interval leaves the lock queue, retries the acquire and queues again, so a paused
-- head delays the others by one poll interval at most.
--
-- Waiter bookkeeping is not safety-relevant: no need to wait for the disk.
CREATE OR REPLACE FUNCTION __SCHEMA__.wait_begin(p_resource text, p_owner text) RETURNS int
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Rows of waiters that are gone (killed, or a reused backend pid) are only removed here.
    -- (pg_stat_get_activity, not the pg_stat_activity view: its joins cost more to plan
    -- and run than the rest of this function.)
    DELETE FROM __SCHEMA__.waiters w
    WHERE w.resource = p_resource
      AND (w.backend_pid = pg_backend_pid()
           OR w.backend_pid <> ALL (SELECT a.pid FROM pg_stat_get_activity(NULL) a
                                    WHERE a.pid IS NOT NULL));
    INSERT INTO __SCHEMA__.waiters (resource, owner) VALUES (p_resource, p_owner);
    RETURN pg_backend_pid();
END
$fn$;

-- Blocks until this session heads the resource's queue (true: it now LISTENs) or until
-- p_timeout_ms passes (false). A statement_timeout shorter than that (set for the role, say)
-- ends the wait early, which is a false too: the caller retries and queues again. The lock
-- key is a hash of the resource's name: two resources that hash alike share one queue, and a
-- waiter behind the other's head then waits up to its poll interval (about a second).
CREATE OR REPLACE FUNCTION __SCHEMA__.wait_turn(p_resource text, p_timeout_ms bigint) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM set_config('lock_timeout', greatest(p_timeout_ms, 1) || 'ms', true);
    PERFORM pg_advisory_lock(hashtext('fence queue __SCHEMA__'), hashtext(p_resource));
    LISTEN fence___SCHEMA__;
    RETURN true;
EXCEPTION WHEN lock_not_available OR query_canceled THEN
    RETURN false;
END
$fn$;

-- Leaves the queue: no waiter row, no place in the lock queue, no LISTEN. Only this queue's
-- lock is released (a waiter that never headed the queue holds none: unlocking then only
-- warns, and the warning is not sent).
CREATE OR REPLACE FUNCTION __SCHEMA__.leave_queue(p_resource text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM __SCHEMA__.waiters WHERE backend_pid = pg_backend_pid() AND resource = p_resource;
    PERFORM set_config('client_min_messages', 'error', true);
    PERFORM pg_advisory_unlock(hashtext('fence queue __SCHEMA__'), hashtext(p_resource));
    UNLISTEN fence___SCHEMA__;
END
$fn$;

CREATE OR REPLACE FUNCTION __SCHEMA__.unwait(p_resource text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM __SCHEMA__.leave_queue(p_resource);
END
$fn$;

-- Tokens never go down and lease rows are never removed, whoever writes (DESIGN §8).
CREATE OR REPLACE FUNCTION __SCHEMA__.leases_guard() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'fence lease records are never deleted: the token counter must survive'
            USING ERRCODE = 'LF004', HINT = 'release leases with `fence release`; rows of free resources are harmless';
    END IF;
    IF NEW.token < OLD.token THEN
        RAISE EXCEPTION 'the fencing token of % cannot go down (% to %)', OLD.resource, OLD.token, NEW.token
            USING ERRCODE = 'LF005';
    END IF;
    RETURN NEW;
END
$fn$;
CREATE OR REPLACE TRIGGER leases_guard BEFORE UPDATE OR DELETE ON __SCHEMA__.leases
    FOR EACH ROW EXECUTE FUNCTION __SCHEMA__.leases_guard();
CREATE OR REPLACE TRIGGER leases_no_truncate BEFORE TRUNCATE ON __SCHEMA__.leases
    FOR EACH STATEMENT EXECUTE FUNCTION __SCHEMA__.leases_guard();

-- STABLE, as extract() on a timestamptz is: a function more volatile inside than declared is
-- never inlined, and a call that is not inlined re-plans its body in every transaction.
CREATE OR REPLACE FUNCTION __SCHEMA__.ms(t timestamptz) RETURNS bigint
LANGUAGE sql STABLE AS $fn$ SELECT floor(extract(epoch FROM t) * 1000)::bigint $fn$;

-- Acquire in one call. The refused (busy) path takes no row lock and writes nothing: the
-- UPDATE only locks a row it can take, the INSERT only runs when no row exists, and the busy
-- answer is a plain read. The new token is computed from the locked row (token + 1) and the
-- clock is read after the lock (clock_timestamp in the per-row SET subquery).
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
        SET (token, last_event, acquired_at, owner, renewed_at, expires_at, ttl_ms) = (
            SELECT CASE WHEN x.live_mine THEN l.token ELSE l.token + 1 END,
                   CASE WHEN x.live_mine THEN 'reacquired'
                        WHEN l.expires_at IS NULL OR l.owner = p_owner THEN 'acquired'
                        ELSE 'taken_over' END,
                   CASE WHEN x.live_mine THEN l.acquired_at ELSE x.now END,
                   p_owner, x.now, x.now + p_ttl_ms * interval '1 millisecond', p_ttl_ms
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
        INSERT INTO __SCHEMA__.events (resource, at, kind, owner, token)
        VALUES (p_resource, r.renewed_at, r.last_event, p_owner, r.token);
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

-- The acquire of a waiter: a grant also leaves the queue, in the same round trip and the
-- same (durable) transaction.
CREATE OR REPLACE FUNCTION __SCHEMA__.acquire_queued(p_resource text, p_owner text, p_ttl_ms bigint,
    OUT status text, OUT token bigint, OUT owner text, OUT acquired_ms bigint,
    OUT renewed_ms bigint, OUT expires_ms bigint, OUT expires_in_ms bigint, OUT ttl_ms bigint)
LANGUAGE plpgsql AS $fn$
BEGIN
    SELECT * INTO status, token, owner, acquired_ms, renewed_ms, expires_ms, expires_in_ms, ttl_ms
    FROM __SCHEMA__.acquire(p_resource, p_owner, p_ttl_ms) a;
    IF status <> 'busy' THEN
        PERFORM __SCHEMA__.leave_queue(p_resource);
    END IF;
END
$fn$;

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
    INSERT INTO __SCHEMA__.events (resource, at, kind, owner, token)
    VALUES (p_resource, r.renewed_at, 'renewed', p_owner, r.token);
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
    -- Wake the head of the resource's queue, the only waiter listening (payload
    -- `:<resource>`; before the colon, older versions named one waiter's backend pid). Sent
    -- at commit; not durable, so waiters also poll slowly.
    PERFORM pg_notify('fence___SCHEMA__', ':' || p_resource);
    status := 'released';
    token := r.token; owner := r.owner;
    ttl_ms := r.ttl_ms;
END
$fn$;

INSERT INTO __SCHEMA__.meta (key, value) VALUES ('schema_version', '2')
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;
