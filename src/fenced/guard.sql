-- fence target schema (version in target_meta, see TARGET_SCHEMA in postgres.rs), in the database fence writes to. `__SCHEMA__` is replaced by
-- the validated --schema name. Idempotent; run under an advisory lock in one transaction.
CREATE SCHEMA IF NOT EXISTS __SCHEMA__;

CREATE TABLE IF NOT EXISTS __SCHEMA__.target_meta (
    key text PRIMARY KEY,
    value text NOT NULL
);

-- The highest token this database has accepted per resource (DESIGN I2). Never deleted,
-- never lowered.
CREATE TABLE IF NOT EXISTS __SCHEMA__.guards (
    resource text PRIMARY KEY,
    highest_token bigint NOT NULL CHECK (highest_token > 0),
    updated_at timestamptz NOT NULL,
    updated_by text,
    accepted_writes bigint NOT NULL DEFAULT 0
);

-- Accepted writes (in the write's own transaction) and rejected ones (recorded after the
-- rollback), for `fence inspect --target`.
CREATE TABLE IF NOT EXISTS __SCHEMA__.write_events (
    id bigserial PRIMARY KEY,
    resource text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind text NOT NULL,
    owner text,
    token bigint,
    detail text
);
CREATE INDEX IF NOT EXISTS write_events_resource_id ON __SCHEMA__.write_events (resource, id DESC);
-- Version 3: the rows an accepted write changed (inserted, updated and deleted, in every table
-- outside this schema, as the transaction's own statistics count them), set by end_write;
-- and an index for `fence log --since`, so that a window is one range however long the
-- history. Nullable without a default: adding the column rewrites nothing.
ALTER TABLE __SCHEMA__.write_events ADD COLUMN IF NOT EXISTS rows_affected bigint;
CREATE INDEX IF NOT EXISTS write_events_resource_at ON __SCHEMA__.write_events (resource, at);

-- Which transaction begin_write bound to which token, written only by begin_write (SECURITY
-- DEFINER): the `fence.*` settings alone prove nothing, since any session can set them.
-- Rows of finished transactions are removed by later begin_write calls.
CREATE TABLE IF NOT EXISTS __SCHEMA__.bindings (
    txid bigint NOT NULL,
    resource text NOT NULL,
    token bigint NOT NULL,
    PRIMARY KEY (txid, resource)
);
-- Version 3: the transaction's `write_accepted` event, which end_write completes.
ALTER TABLE __SCHEMA__.bindings ADD COLUMN IF NOT EXISTS event_id bigint;
REVOKE ALL ON __SCHEMA__.bindings FROM PUBLIC;

-- Write ids (`fence write --id KEY`): one row per resource and id, written in the same
-- transaction as the effect, so "was it applied?" has a durable answer after a lost COMMIT,
-- and a second write with the same id — by anyone, with any token — does nothing. Rows are
-- kept until an admin deletes them (see docs/postgres-targets.md: Write ids).
CREATE TABLE IF NOT EXISTS __SCHEMA__.write_ledger (
    resource text NOT NULL,
    write_id text NOT NULL,
    token bigint NOT NULL,
    owner text,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (resource, write_id)
);
-- Version 4: what the write did (a digest of its SQL, from the `fence.write_digest` setting
-- fence sets before begin_write_once), so that the same id given to a different write is a
-- conflict, not a replay. NULL for rows written before, or by fence of version 3.
ALTER TABLE __SCHEMA__.write_ledger ADD COLUMN IF NOT EXISTS digest text;

CREATE OR REPLACE FUNCTION __SCHEMA__.guards_keep() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'fence guard rows are never deleted: they hold the highest accepted token'
            USING ERRCODE = 'LF004';
    END IF;
    IF NEW.highest_token < OLD.highest_token THEN
        RAISE EXCEPTION 'the highest accepted token of % cannot go down (% to %)',
            OLD.resource, OLD.highest_token, NEW.highest_token USING ERRCODE = 'LF005';
    END IF;
    RETURN NEW;
END
$fn$;
CREATE OR REPLACE TRIGGER guards_keep BEFORE UPDATE OR DELETE ON __SCHEMA__.guards
    FOR EACH ROW EXECUTE FUNCTION __SCHEMA__.guards_keep();
CREATE OR REPLACE TRIGGER guards_no_truncate BEFORE TRUNCATE ON __SCHEMA__.guards
    FOR EACH STATEMENT EXECUTE FUNCTION __SCHEMA__.guards_keep();

-- Where this schema holds fence's coordinator (its `leases` table), a token above the
-- highest it issued for the resource, or any token of a resource it never leased, was never
-- issued here: LF008 (DETAIL: the highest issued, 0 for none). Called by check_write and
-- begin_write, which run as the schema's owner; nobody else needs it.
CREATE OR REPLACE FUNCTION __SCHEMA__.check_issued(p_resource text, p_token bigint)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_issued bigint;
BEGIN
    IF to_regclass('__SCHEMA__.leases') IS NOT NULL THEN
        SELECT l.token INTO v_issued FROM __SCHEMA__.leases l WHERE l.resource = p_resource;
        IF v_issued IS NULL OR p_token > v_issued THEN
            RAISE EXCEPTION 'fencing token % for % was never issued: the coordinator in this database has issued up to %',
                p_token, p_resource, coalesce(v_issued, 0)
                USING ERRCODE = 'LF008', DETAIL = coalesce(v_issued, 0)::text,
                      HINT = 'write with the token `fence acquire` printed for this resource';
        END IF;
    END IF;
END
$fn$;

-- The row form's checks (`fence write --table … --key`), in the statement that writes: the
-- schema is the version that fence writes for (LF030 names the version found: an older one is
-- migrated first, a newer one refused), and, when this schema holds fence's coordinator, the
-- token was issued by it (LF008, as in begin_write). Returns the token, which the statement
-- hands on to write_row, so that nothing is written before these checks pass.
CREATE OR REPLACE FUNCTION __SCHEMA__.check_write(p_resource text, p_token bigint, p_version integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_found text := (SELECT value FROM __SCHEMA__.target_meta WHERE key = 'schema_version');
BEGIN
    IF v_found IS DISTINCT FROM p_version::text THEN
        RAISE EXCEPTION USING ERRCODE = 'LF030', MESSAGE = 'fence target schema version ' || coalesce(v_found, 'none');
    END IF;
    PERFORM __SCHEMA__.check_issued(p_resource, p_token);
    RETURN p_token;
END
$fn$;

-- The fenced path. Call it first in a READ COMMITTED transaction: it advances the guard row
-- to p_token iff p_token >= the highest accepted (holding the row lock to commit, so a
-- concurrent lower token waits and then fails), binds the token to this transaction, and
-- raises LF002 when the token is stale. When this database is also fence's coordinator (its
-- `leases` table lives in this schema), a token above the highest it issued for the resource
-- is refused (LF008), and so is every token of a resource it never issued one for: a forged
-- or mistyped token could otherwise lock every real holder out. A schema that holds a
-- coordinator guards that coordinator's resources only. Admins
-- writing by hand run, in one transaction:
--   BEGIN; SELECT __SCHEMA__.begin_write('resource', <current token>, 'who'); <writes>; COMMIT;
CREATE OR REPLACE FUNCTION __SCHEMA__.begin_write(p_resource text, p_token bigint, p_owner text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_highest bigint;
    v_event bigint;
BEGIN
    IF p_token IS NULL OR p_token < 1 THEN
        RAISE EXCEPTION 'a fencing token is a positive integer, not %', p_token USING ERRCODE = 'LF001';
    END IF;
    PERFORM __SCHEMA__.check_issued(p_resource, p_token);
    INSERT INTO __SCHEMA__.guards AS g (resource, highest_token, updated_at, updated_by, accepted_writes)
    VALUES (p_resource, p_token, clock_timestamp(), nullif(p_owner, ''), 1)
    ON CONFLICT (resource) DO UPDATE
        SET highest_token = EXCLUDED.highest_token, updated_at = EXCLUDED.updated_at,
            updated_by = EXCLUDED.updated_by, accepted_writes = g.accepted_writes + 1
        WHERE g.highest_token <= EXCLUDED.highest_token
    RETURNING g.highest_token INTO v_highest;
    IF NOT FOUND THEN
        SELECT highest_token INTO v_highest FROM __SCHEMA__.guards WHERE resource = p_resource;
        RAISE EXCEPTION 'fencing token % for % is stale: this database has accepted token %',
            p_token, p_resource, v_highest
            USING ERRCODE = 'LF002', DETAIL = v_highest::text,
                  HINT = 'a newer owner has written; acquire the lease again before writing';
    END IF;
    INSERT INTO __SCHEMA__.write_events (resource, kind, owner, token)
    VALUES (p_resource, 'write_accepted', nullif(p_owner, ''), p_token)
    RETURNING id INTO v_event;
    -- Every transaction below the snapshot's xmin has ended: its bindings are void.
    DELETE FROM __SCHEMA__.bindings WHERE txid < txid_snapshot_xmin(txid_current_snapshot());
    INSERT INTO __SCHEMA__.bindings (txid, resource, token, event_id)
    VALUES (txid_current(), p_resource, p_token, v_event)
    ON CONFLICT (txid, resource) DO UPDATE SET token = EXCLUDED.token, event_id = EXCLUDED.event_id;
    PERFORM set_config('fence.resource', p_resource, true),
            set_config('fence.token', p_token::text, true),
            set_config('fence.txid', txid_current()::text, true);
    -- A client that vanished (killed, partitioned) must not leave this transaction running
    -- to its COMMIT: the server checks the socket while statements run (PostgreSQL 14+).
    IF current_setting('server_version_num')::int >= 140000 THEN
        PERFORM set_config('client_connection_check_interval', '1000', true);
    END IF;
    RETURN v_highest;
END
$fn$;

-- The last statement `fence write` sends before COMMIT. It fails (so the implicit transaction
-- it runs in rolls back) when the transaction begin_write bound has already ended — SQL that
-- slipped a COMMIT or ROLLBACK past fence's checks leaves nothing of its own behind — and when
-- the transaction has run longer than p_timeout_ms by the server's clock, so a transaction
-- whose client gave up (or died) can never commit after the client's deadline.
CREATE OR REPLACE FUNCTION __SCHEMA__.end_write(p_resource text, p_token bigint, p_timeout_ms bigint)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.bindings
                    WHERE txid = txid_current_if_assigned() AND resource = p_resource AND token = p_token) THEN
        RAISE EXCEPTION 'the fenced transaction of % ended inside the SQL (COMMIT, ROLLBACK or similar)', p_resource
            USING ERRCODE = 'LF009',
                  HINT = 'remove transaction control from the SQL: fence runs it in one transaction of its own';
    END IF;
    IF current_setting('fence.txid', true) IS DISTINCT FROM txid_current()::text
       OR current_setting('fence.resource', true) IS DISTINCT FROM p_resource
       OR current_setting('fence.token', true) IS DISTINCT FROM p_token::text THEN
        RAISE EXCEPTION 'the SQL changed fence''s settings (fence.txid, fence.resource, fence.token) of the fenced transaction of %', p_resource
            USING ERRCODE = 'LF013',
                  HINT = 'leave the fence.* settings alone: nothing was applied';
    END IF;
    -- The server's watch on the client's socket, which begin_write set: SQL that turned it
    -- off ran unwatched, and would have committed after its client was killed. Refused.
    IF current_setting('server_version_num')::int >= 140000
       AND current_setting('client_connection_check_interval') IS DISTINCT FROM '1s' THEN
        RAISE EXCEPTION 'the SQL changed client_connection_check_interval (to %) in the fenced transaction of %',
            current_setting('client_connection_check_interval'), p_resource
            USING ERRCODE = 'LF013',
                  HINT = 'leave client_connection_check_interval alone (fence sets it so that a killed writer cannot commit): nothing was applied';
    END IF;
    -- What the caller's SQL may have turned off, on again for the COMMIT: deferred constraint
    -- triggers run now (inside the deadline below, not after it in COMMIT).
    SET CONSTRAINTS ALL IMMEDIATE;
    IF clock_timestamp() > now() + p_timeout_ms * interval '1 millisecond' THEN
        RAISE EXCEPTION 'the fenced transaction of % ran longer than its %ms timeout', p_resource, p_timeout_ms
            USING ERRCODE = 'LF010',
                  HINT = 'nothing was applied; raise --timeout if the SQL needs longer';
    END IF;
    -- The rows the write changed, for `fence log`: the server's counts of rows inserted,
    -- updated and deleted in the tables this transaction took for writing (RowExclusiveLock;
    -- rows its triggers changed included, TRUNCATE counts none), fence's own tables left out.
    -- Read from the lock table, not by scanning pg_class: the cost follows the tables written,
    -- not the database's size (a pg_class scan halved write throughput at 2,000 tables). The
    -- counts are the session's not yet sent to the statistics collector, which include earlier
    -- transactions of the same session: exact for `fence write`, whose connection does nothing
    -- else, and, since the session is asked to send them when it next goes idle (PostgreSQL
    -- 15+), for consecutive fenced writes on one pooled connection; a pooled connection that
    -- ran other writes to the same tables within the last second counts their rows too.
    IF current_setting('server_version_num')::int >= 150000 THEN
        PERFORM pg_stat_force_next_flush();
    END IF;
    UPDATE __SCHEMA__.write_events e
    SET rows_affected = (SELECT coalesce(sum(pg_stat_get_xact_tuples_inserted(l.relation)
                                             + pg_stat_get_xact_tuples_updated(l.relation)
                                             + pg_stat_get_xact_tuples_deleted(l.relation)), 0)
                           FROM pg_locks l
                          WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation'
                            AND l.mode = 'RowExclusiveLock' AND l.granted
                            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                            AND l.relation NOT IN ('__SCHEMA__.target_meta'::regclass, '__SCHEMA__.guards'::regclass,
                                                   '__SCHEMA__.write_events'::regclass, '__SCHEMA__.bindings'::regclass,
                                                   '__SCHEMA__.write_ledger'::regclass))
    FROM __SCHEMA__.bindings b
    WHERE b.txid = txid_current_if_assigned() AND b.resource = p_resource AND b.token = p_token
      AND e.id = b.event_id;
END
$fn$;

-- begin_write for a write with an id: an id already applied raises LF011 (with when, which
-- token and whose, in DETAIL) before the token is even looked at, so a retry after a lost
-- COMMIT gets a definite answer even once a newer owner holds the resource; otherwise the
-- token is checked (begin_write) and the id recorded in this transaction, with the digest of
-- the write that fence set in `fence.write_digest` (DETAIL returns the recorded one, and fence
-- compares: a different digest is another write under a reused id). Two writers with one id:
-- the second waits for the first's commit on the ledger row, then raises LF011.
CREATE OR REPLACE FUNCTION __SCHEMA__.begin_write_once(p_resource text, p_token bigint, p_owner text, p_write_id text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_highest bigint;
    v_seen __SCHEMA__.write_ledger;
BEGIN
    IF p_write_id IS NULL OR p_write_id = '' OR length(p_write_id) > 200 THEN
        RAISE EXCEPTION 'a write id is 1 to 200 characters' USING ERRCODE = 'LF012';
    END IF;
    SELECT * INTO v_seen FROM __SCHEMA__.write_ledger WHERE resource = p_resource AND write_id = p_write_id;
    IF NOT FOUND THEN
        v_highest := __SCHEMA__.begin_write(p_resource, p_token, p_owner);
        INSERT INTO __SCHEMA__.write_ledger (resource, write_id, token, owner, digest)
        VALUES (p_resource, p_write_id, p_token, nullif(p_owner, ''),
                nullif(current_setting('fence.write_digest', true), ''))
        ON CONFLICT (resource, write_id) DO NOTHING;
        IF FOUND THEN
            RETURN v_highest;
        END IF;
        SELECT * INTO v_seen FROM __SCHEMA__.write_ledger WHERE resource = p_resource AND write_id = p_write_id;
    END IF;
    RAISE EXCEPTION 'write % of % was already applied', p_write_id, p_resource
        USING ERRCODE = 'LF011',
              DETAIL = json_build_object('applied_at', floor(extract(epoch FROM v_seen.applied_at) * 1000)::bigint,
                                         'token', v_seen.token, 'owner', v_seen.owner,
                                         'digest', v_seen.digest)::text;
END
$fn$;

-- Records a write that was rejected (called after the rollback, in its own transaction). It
-- records only what it can verify: a token below the highest this database has accepted, with
-- its own detail (p_detail is ignored), so a caller cannot forge a rejection of a current token.
-- Only roles given it by `fence grant` may call it.
CREATE OR REPLACE FUNCTION __SCHEMA__.note_rejected(p_resource text, p_token bigint, p_owner text, p_detail text)
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    INSERT INTO __SCHEMA__.write_events (resource, kind, owner, token, detail)
    SELECT p_resource, 'write_rejected', nullif(p_owner, ''), p_token,
           format('token %s accepted before', g.highest_token)
      FROM __SCHEMA__.guards g
     WHERE g.resource = p_resource AND g.highest_token > p_token;
$fn$;

-- The statement-level guard that `fence protect` installs. The resource comes from the
-- trigger's argument, never from a caller-controlled setting; the token must have been bound
-- to THIS transaction by begin_write (recorded in `bindings`, which only begin_write writes),
-- so neither a session-level `SET fence.token` nor settings forged with set_config carry
-- authority. Roles that own this schema can write `bindings` themselves, and table owners can
-- disable triggers: the protection holds against every other role.
CREATE OR REPLACE FUNCTION __SCHEMA__.protect_check() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_resource text := TG_ARGV[0];
    v_token_text text := current_setting('fence.token', true);
    v_token bigint;
    v_highest bigint;
BEGIN
    -- The same range begin_write takes: 1 to 2^63-1 (19 digits at most, compared as text so a
    -- longer number is refused here rather than overflowing).
    IF coalesce(v_token_text, '') !~ '^[0-9]{1,19}$'
       OR (length(v_token_text) = 19 AND v_token_text COLLATE "C" > '9223372036854775807')
       OR current_setting('fence.resource', true) IS DISTINCT FROM v_resource
       OR current_setting('fence.txid', true) IS DISTINCT FROM txid_current()::text THEN
        RAISE EXCEPTION '%.% is protected by fence resource %: this transaction carries no fencing token for it',
            TG_TABLE_SCHEMA, TG_TABLE_NAME, v_resource
            USING ERRCODE = 'LF001',
                  HINT = format('write with `fence write %s --target … --sql …`, or begin the transaction with SELECT %s.begin_write(%L, <current token>, <who>)',
                                v_resource, '__SCHEMA__', v_resource);
    END IF;
    v_token := v_token_text::bigint;
    SELECT highest_token INTO v_highest FROM __SCHEMA__.guards WHERE resource = v_resource FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fence resource % has no guard row in this database', v_resource
            USING ERRCODE = 'LF003', HINT = 'write once through `fence write` to create it';
    END IF;
    -- The settings must be begin_write's own, recorded where only it can write.
    PERFORM 1 FROM __SCHEMA__.bindings
     WHERE txid = txid_current() AND resource = v_resource AND token = v_token;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fencing token % for % was not registered with begin_write in this transaction', v_token, v_resource
            USING ERRCODE = 'LF001', HINT = 'begin the transaction with begin_write, as `fence write` does';
    END IF;
    IF v_token < v_highest THEN
        RAISE EXCEPTION 'fencing token % for % is stale: this database has accepted token %',
            v_token, v_resource, v_highest
            USING ERRCODE = 'LF002', DETAIL = v_highest::text,
                  HINT = 'a newer owner has written; acquire the lease again before writing';
    END IF;
    IF v_token > v_highest THEN
        RAISE EXCEPTION 'fencing token % for % was not registered with begin_write', v_token, v_resource
            USING ERRCODE = 'LF001', HINT = 'begin the transaction with begin_write, as `fence write` does';
    END IF;
    RETURN NULL;
END
$fn$;

-- `fence protect` covers where the rows live: the table and every partition and inheritance
-- child below it, recursively, since statement-level triggers are not cloned to partitions.

-- The resource named by a table's fence_protect trigger when it calls this schema's
-- protect_check; NULL otherwise.
CREATE OR REPLACE FUNCTION __SCHEMA__.protect_resource(p_rel regclass) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT convert_from(substring(t.tgargs FROM 1 FOR position(decode('00', 'hex') IN t.tgargs) - 1),
                        current_setting('server_encoding'))
      FROM pg_trigger t
     WHERE t.tgrelid = p_rel AND t.tgname = 'fence_protect'
       AND t.tgfoid = '__SCHEMA__.protect_check()'::regprocedure
$fn$;

-- How one table is protected: the resource, and the weakest state of fence's two triggers
-- ('always', 'origin', 'replica', 'disabled'; NULL when one of them is missing).
CREATE OR REPLACE FUNCTION __SCHEMA__.protect_state(p_rel regclass, OUT resource text, OUT enabled text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT __SCHEMA__.protect_resource(p_rel),
           CASE WHEN count(*) < 2 THEN NULL
                WHEN bool_and(t.tgenabled = 'A') THEN 'always'
                WHEN bool_or(t.tgenabled = 'D') THEN 'disabled'
                WHEN bool_or(t.tgenabled = 'R') THEN 'replica'
                ELSE 'origin' END
      FROM pg_trigger t
     WHERE t.tgrelid = p_rel AND t.tgname IN ('fence_protect', 'fence_protect_truncate')
       AND t.tgfoid = '__SCHEMA__.protect_check()'::regprocedure
$fn$;

-- The table and every partition and inheritance child below it, parents first.
CREATE OR REPLACE FUNCTION __SCHEMA__.protect_tree(p_rel regclass)
RETURNS TABLE (rel regclass, parent regclass, kind "char", depth int)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    WITH RECURSIVE tree AS (
        SELECT p_rel::oid AS rel, NULL::oid AS parent, 0 AS depth
        UNION ALL
        SELECT i.inhrelid, i.inhparent, tree.depth + 1
          FROM pg_inherits i JOIN tree ON i.inhparent = tree.rel
    )
    SELECT rel, parent, kind, depth FROM (
        SELECT DISTINCT ON (tree.rel) tree.rel::regclass AS rel, tree.parent::regclass AS parent,
               c.relkind AS kind, tree.depth
          FROM tree JOIN pg_class c ON c.oid = tree.rel
         ORDER BY tree.rel, tree.depth
    ) AS t
    ORDER BY depth, rel::text
$fn$;

-- The resource of the nearest protected table at or above p_rel.
CREATE OR REPLACE FUNCTION __SCHEMA__.protect_inherited(p_rel regclass) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    WITH RECURSIVE up AS (
        SELECT p_rel::oid AS rel, 0 AS depth
        UNION ALL
        SELECT i.inhparent, up.depth + 1 FROM pg_inherits i JOIN up ON i.inhrelid = up.rel
    )
    SELECT r FROM (SELECT __SCHEMA__.protect_resource(up.rel::regclass) AS r, up.depth FROM up) AS x
     WHERE r IS NOT NULL ORDER BY depth LIMIT 1
$fn$;

-- fence's two statement-level triggers on one table, for p_resource, ENABLE ALWAYS (so that
-- session_replication_role = replica does not switch them off).
CREATE OR REPLACE FUNCTION __SCHEMA__.protect_install(p_rel regclass, p_resource text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    -- A foreign table cannot have a TRUNCATE trigger, and its rows are written on another
    -- server anyway: refuse rather than protect it in part.
    IF (SELECT relkind FROM pg_class WHERE oid = p_rel) = 'f' THEN
        RAISE EXCEPTION '% is a foreign table: its rows live on another server, where fence cannot protect them', p_rel
            USING ERRCODE = 'LF021',
                  HINT = 'detach it from the protected table, or protect the remote table in its own database';
    END IF;
    EXECUTE format('CREATE OR REPLACE TRIGGER fence_protect BEFORE INSERT OR UPDATE OR DELETE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION __SCHEMA__.protect_check(%L)', p_rel, p_resource);
    EXECUTE format('CREATE OR REPLACE TRIGGER fence_protect_truncate BEFORE TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION __SCHEMA__.protect_check(%L)', p_rel, p_resource);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER fence_protect', p_rel);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER fence_protect_truncate', p_rel);
END
$fn$;

-- `fence protect`: p_rel and everything below it, all for p_resource. One row per table, with
-- the resource that protected it before (NULL: none).
CREATE OR REPLACE FUNCTION __SCHEMA__.protect_table(p_rel regclass, p_resource text)
RETURNS TABLE (table_name text, table_kind "char", had_resource text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT * FROM __SCHEMA__.protect_tree(p_rel) LOOP
        table_name := r.rel::text;
        table_kind := r.kind;
        had_resource := __SCHEMA__.protect_resource(r.rel);
        PERFORM __SCHEMA__.protect_install(r.rel, p_resource);
        RETURN NEXT;
    END LOOP;
END
$fn$;

-- `fence protect --remove`: fence's triggers off p_rel and everything below it.
CREATE OR REPLACE FUNCTION __SCHEMA__.unprotect_table(p_rel regclass)
RETURNS TABLE (table_name text, table_kind "char", had_resource text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT * FROM __SCHEMA__.protect_tree(p_rel) LOOP
        table_name := r.rel::text;
        table_kind := r.kind;
        had_resource := __SCHEMA__.protect_resource(r.rel);
        EXECUTE format('DROP TRIGGER IF EXISTS fence_protect ON %s', r.rel);
        EXECUTE format('DROP TRIGGER IF EXISTS fence_protect_truncate ON %s', r.rel);
        RETURN NEXT;
    END LOOP;
END
$fn$;

-- Tables added below a protected one (CREATE TABLE … PARTITION OF / INHERITS, ALTER TABLE …
-- ATTACH PARTITION / INHERIT) get its triggers, for the resource of their nearest protected
-- ancestor. Tables that have fence's triggers are left as they are, even disabled: that is
-- an admin's visible choice (`fence inspect --table`), not an accident.
CREATE OR REPLACE FUNCTION __SCHEMA__.protect_cover(p_rel regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    r record;
    v_resource text;
BEGIN
    FOR r IN SELECT * FROM __SCHEMA__.protect_tree(p_rel) LOOP
        CONTINUE WHEN (SELECT count(*) FROM pg_trigger t WHERE t.tgrelid = r.rel
                        AND t.tgname IN ('fence_protect', 'fence_protect_truncate')) = 2;
        v_resource := __SCHEMA__.protect_inherited(r.rel);
        CONTINUE WHEN v_resource IS NULL;
        BEGIN
            PERFORM __SCHEMA__.protect_install(r.rel, v_resource);
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'fence could not protect %, added below a table protected by fence resource %: %',
                r.rel, v_resource, SQLERRM
                USING ERRCODE = 'LF020',
                      HINT = 'fence''s functions must be owned by a superuser for new partitions to be protected as they are added; otherwise add the table, then run `fence protect` again as its owner';
        END;
    END LOOP;
END
$fn$;

-- The event trigger `fence protect` installs when run by a superuser. SECURITY DEFINER: it
-- creates triggers on tables whose creator may not use fence's functions.
CREATE OR REPLACE FUNCTION __SCHEMA__.protect_new_tables() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT DISTINCT c.objid FROM pg_event_trigger_ddl_commands() AS c
              WHERE c.classid = 'pg_class'::regclass AND c.object_type IN ('table', 'foreign table') LOOP
        PERFORM __SCHEMA__.protect_cover(r.objid::regclass);
    END LOOP;
END
$fn$;

-- Row form: one conditional write guarded by the row's own token column (`<=`, the holder
-- writes many times with one token; NULL counts as 0, the floor for rows written before
-- fence). Classifies applied / inserted / stale / missing in one call, re-reading after a lost
-- race instead of trusting one snapshot (DESIGN §8).
CREATE OR REPLACE FUNCTION __SCHEMA__.write_row(p_table_name text, p_key jsonb, p_set jsonb,
    p_token_column text, p_token bigint, p_upsert boolean,
    OUT status text, OUT stored_token bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    p_table regclass := to_regclass(p_table_name);
    v_cols text[];
    v_keys text[];
    v_missing text;
    v_set_list text;
    v_key_list text;
    v_rows bigint;
    v_rounds integer := 0;
BEGIN
    IF p_table IS NULL THEN
        RAISE EXCEPTION 'there is no table %', p_table_name USING ERRCODE = 'LF007';
    END IF;
    SELECT array_agg(k ORDER BY k) INTO v_keys FROM jsonb_object_keys(p_key) AS k;
    SELECT array_agg(k ORDER BY k) INTO v_cols FROM jsonb_object_keys(p_set) AS k;
    SELECT c INTO v_missing FROM unnest(v_keys || v_cols || ARRAY[p_token_column]) AS c
    WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = p_table AND a.attname = c
                      AND a.attnum > 0 AND NOT a.attisdropped)
    LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'table % has no column %', p_table, quote_ident(v_missing) USING ERRCODE = 'LF006';
    END IF;
    IF (SELECT a.atttypid FROM pg_attribute a WHERE a.attrelid = p_table AND a.attname = p_token_column)
       NOT IN ('int8'::regtype, 'int4'::regtype, 'int2'::regtype, 'numeric'::regtype) THEN
        RAISE EXCEPTION 'column % of % holds %, not fencing tokens', quote_ident(p_token_column), p_table,
            (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
              WHERE a.attrelid = p_table AND a.attname = p_token_column)
            USING ERRCODE = 'LF006';
    END IF;
    v_set_list := (SELECT string_agg(format('%I = r.%I', c, c), ', ') FROM unnest(v_cols) AS c);
    v_key_list := (SELECT string_agg(format('t.%I IS NOT DISTINCT FROM r.%I', c, c), ' AND ') FROM unnest(v_keys) AS c);
    LOOP
        -- Each round follows a concurrent writer's change of the row. A round that finds the
        -- row at or below our token and still updates nothing (a trigger that drops the
        -- update, a row-level security policy that hides the row from UPDATE only) would
        -- come back for ever: the statement would run until it timed out (review 9).
        v_rounds := v_rounds + 1;
        IF v_rounds > 1000 THEN
            RAISE EXCEPTION 'fence''s update of the row of % with key % changed nothing, 1000 times over, though the row is there with a token at or below % (%)',
                p_table, p_key, p_token,
                (SELECT coalesce('enabled triggers: ' || string_agg(format('%I', tgname), ', '), 'no enabled trigger')
                   FROM pg_trigger WHERE tgrelid = p_table AND NOT tgisinternal AND tgenabled <> 'D')
                || CASE WHEN (SELECT relrowsecurity FROM pg_class WHERE oid = p_table)
                        THEN '; row-level security on' ELSE '' END
                USING ERRCODE = 'LF015';
        END IF;
        EXECUTE format(
            'UPDATE %s AS t SET %s%s%I = $3 FROM jsonb_populate_record(NULL::%s, $1 || $2) AS r '
            'WHERE %s AND coalesce(t.%I, 0) <= $3',
            p_table, coalesce(v_set_list, ''), CASE WHEN v_set_list IS NULL THEN '' ELSE ', ' END,
            p_token_column, p_table, v_key_list, p_token_column)
        USING p_key, p_set, p_token;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows > 0 THEN
            status := 'applied';
            stored_token := p_token;
            RETURN;
        END IF;
        IF p_upsert THEN
            EXECUTE format(
                'INSERT INTO %s AS t (%s) SELECT %s FROM jsonb_populate_record(NULL::%s, $1 || $2 || jsonb_build_object(%L, $3)) AS r '
                'ON CONFLICT (%s) DO NOTHING',
                p_table,
                (SELECT string_agg(format('%I', c), ', ') FROM unnest(v_keys || v_cols || ARRAY[p_token_column]) AS c),
                (SELECT string_agg(format('r.%I', c), ', ') FROM unnest(v_keys || v_cols || ARRAY[p_token_column]) AS c),
                p_table, p_token_column,
                -- Only a conflict on the key is the row being there: one on another unique
                -- index of the table is the caller's (raised, nothing written), never a
                -- reason to look for the row again (it looped for ever: review 9).
                (SELECT string_agg(format('%I', c), ', ') FROM unnest(v_keys) AS c))
            USING p_key, p_set, p_token;
            GET DIAGNOSTICS v_rows = ROW_COUNT;
            IF v_rows > 0 THEN
                status := 'inserted';
                stored_token := p_token;
                RETURN;
            END IF;
        END IF;
        EXECUTE format('SELECT t.%I FROM %s AS t, jsonb_populate_record(NULL::%s, $1) AS r WHERE %s',
                       p_token_column, p_table, p_table, v_key_list)
        INTO stored_token USING p_key;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows = 0 THEN
            IF p_upsert THEN
                CONTINUE; -- the conflicting row vanished again: retry
            END IF;
            status := 'missing';
            RETURN;
        END IF;
        IF coalesce(stored_token, 0) > p_token THEN
            status := 'stale';
            RETURN;
        END IF;
        -- The row changed between our statements (a concurrent writer): try again.
    END LOOP;
END
$fn$;

INSERT INTO __SCHEMA__.target_meta (key, value) VALUES ('schema_version', '6')
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;

-- Least privilege (DESIGN §10): nothing of fence's is PUBLIC's. PostgreSQL grants EXECUTE on
-- new functions to PUBLIC; `fence grant` gives a writer or a reader exactly what it needs.
-- Keep this last, so that it covers every function above.
REVOKE ALL ON SCHEMA __SCHEMA__ FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA __SCHEMA__ FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA __SCHEMA__ FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA __SCHEMA__ FROM PUBLIC;

-- A role granted the write path (`fence grant`) before a function joined it, in an upgrade,
-- gets that function too, so that its writes keep working. The names are WRITER_FUNCTIONS in
-- src/fenced/grant.rs.
DO $grant$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT DISTINCT a.grantee::regrole AS grantee, p.oid::regprocedure AS fn
               FROM pg_proc b, aclexplode(b.proacl) a, pg_proc p
              WHERE b.pronamespace = '__SCHEMA__'::regnamespace AND b.proname = 'begin_write'
                AND a.privilege_type = 'EXECUTE' AND a.grantee NOT IN (0, b.proowner)
                AND p.pronamespace = '__SCHEMA__'::regnamespace
                AND p.proname IN ('begin_write', 'begin_write_once', 'check_write', 'end_write', 'note_rejected', 'write_row') LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', r.fn, r.grantee);
    END LOOP;
END
$grant$;
