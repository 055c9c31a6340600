//! `fence grant`: exactly what a fenced writer (or a reader) needs in a target database, and
//! nothing that defeats `fence protect` (DESIGN §10). A writer may call the functions of the
//! write path, which are `SECURITY DEFINER` where they write fence's tables, and read the
//! guard rows and write events; it gets no write on fence's tables, no ownership and no
//! TRIGGER privilege. A role that could bypass the fence already (a superuser, a member of the
//! role owning fence's schema or its objects, or one that may write fence's tables) is refused.

use tokio_postgres::types::Type;

use crate::error::Error;
use crate::fenced::postgres::PgTarget;

/// Functions the write path calls (`fence write`, both forms). `end_write` is granted when
/// the schema has it.
const WRITER_FUNCTIONS: [&str; 6] = [
    "begin_write",
    "begin_write_once",
    "check_write",
    "end_write",
    "note_rejected",
    "write_row",
];

/// Read-only functions behind `fence inspect --table`.
const READER_FUNCTIONS: [&str; 3] = ["protect_tree", "protect_state", "protect_resource"];

/// fence's tables a reader may read.
const READER_TABLES: [&str; 4] = ["target_meta", "guards", "write_events", "write_ledger"];

/// The statements that give `role` its access.
#[derive(Debug)]
pub struct GrantPlan {
    pub role: String,
    pub reader: bool,
    pub statements: Vec<String>,
}

impl PgTarget {
    /// Works out the grants for `role`, refusing roles that could bypass the fence anyway.
    pub async fn grant_plan(&self, role: &str, reader: bool) -> Result<GrantPlan, Error> {
        self.require_schema().await?;
        let quoted_role = self.check_role(role, reader).await?;
        let schema = &self.session().schema;
        let mut names: Vec<&str> = READER_FUNCTIONS.to_vec();
        if !reader {
            names.extend(WRITER_FUNCTIONS);
        }
        let names: Vec<String> = names.into_iter().map(str::to_owned).collect();
        let rows = self
            .session()
            .call(
                "list fence's functions",
                false,
                "SELECT format('%I.%I(%s)', n.nspname, p.proname, oidvectortypes(p.proargtypes)) \
                 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
                 WHERE n.nspname = $1 AND p.proname = ANY($2) ORDER BY p.proname, 1",
                &[(schema, Type::TEXT), (&names, Type::TEXT_ARRAY)],
            )
            .await?;
        let functions: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        let tables: Vec<String> = READER_TABLES
            .iter()
            .map(|t| format!("{schema}.{t}"))
            .collect();
        let mut statements = vec![
            format!("GRANT USAGE ON SCHEMA {schema} TO {quoted_role}"),
            format!(
                "GRANT SELECT ON TABLE {} TO {quoted_role}",
                tables.join(", ")
            ),
        ];
        if !functions.is_empty() {
            statements.push(format!(
                "GRANT EXECUTE ON FUNCTION {} TO {quoted_role}",
                functions.join(", ")
            ));
        }
        Ok(GrantPlan {
            role: role.to_owned(),
            reader,
            statements,
        })
    }

    /// Applies a plan in one transaction.
    pub async fn apply_grant(&self, plan: &GrantPlan) -> Result<(), Error> {
        let body: String = plan.statements.iter().map(|s| format!("{s};\n")).collect();
        self.run_script(
            &format!("grant `{}` access to fence's schema", plan.role),
            &format!("BEGIN;\n{body}COMMIT;"),
        )
        .await
    }

    /// A usage error when fence's schema is not in this database yet.
    async fn require_schema(&self) -> Result<(), Error> {
        let session = self.session();
        let rows = self
            .session()
            .call(
                "look for fence's schema",
                false,
                "SELECT to_regclass(format('%I.guards', $1::text)) IS NOT NULL",
                &[(&session.schema, Type::TEXT)],
            )
            .await?;
        if rows.first().is_some_and(|r| r.get::<_, bool>(0)) {
            return Ok(());
        }
        Err(Error::usage(
            format!(
                "fence's schema `{}` does not exist in `{}`",
                session.schema, session.display
            ),
            format!(
                "prepare it first, as the admin: fence init --target {} --schema {}",
                crate::error::shell_word(&session.display),
                session.schema
            ),
        ))
    }

    /// The role's quoted name, or a usage error when it is missing or could bypass the fence.
    async fn check_role(&self, role: &str, reader: bool) -> Result<String, Error> {
        let session = self.session();
        let rows = self
            .session()
            .call(
                "look up the role",
                false,
                "SELECT quote_ident(r.rolname), r.rolsuper, \
                   (SELECT (array_agg(o.what ORDER BY o.rank, o.what))[1] || CASE WHEN count(*) > 1 \
                             THEN format(' and %s more of its objects', count(*) - 1) ELSE '' END FROM ( \
                      SELECT 0 AS rank, format('schema %I', n.nspname) AS what, n.nspowner AS owner FROM pg_namespace n WHERE n.nspname = $2 \
                      UNION ALL SELECT 1, format('table %I.%I', $2, c.relname), c.relowner FROM pg_class c \
                        WHERE c.relnamespace = to_regnamespace($2) AND c.relkind = 'r' \
                      UNION ALL SELECT 2, format('function %I.%I', $2, p.proname), p.proowner FROM pg_proc p \
                        WHERE p.pronamespace = to_regnamespace($2)) o \
                    WHERE pg_has_role(r.oid, o.owner, 'MEMBER')), \
                   (SELECT string_agg(format('%I.%I', $2, c.relname), ', ') FROM pg_class c \
                    WHERE c.relnamespace = to_regnamespace($2) AND c.relkind = 'r' \
                      AND has_table_privilege(r.oid, c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE')), \
                   r.rolcreaterole AND current_setting('server_version_num')::int < 160000 \
                 FROM pg_roles r WHERE r.rolname = $1",
                &[(&role, Type::TEXT), (&session.schema, Type::TEXT)],
            )
            .await?;
        let Some(row) = rows.first() else {
            return Err(Error::usage(
                format!("there is no role `{role}` in `{}`", session.display),
                "create it first (CREATE ROLE … LOGIN), as docs/postgres-targets.md, \"Setting up roles\", shows; the name is matched exactly, case included",
            ));
        };
        let refuse = |why: String, fix: &str| Err(Error::usage(why, fix.to_owned()));
        if row.get::<_, bool>(1) {
            return refuse(
                format!("`{role}` is a superuser: no trigger or privilege can fence it"),
                "let applications connect as an ordinary role, and grant that role instead",
            );
        }
        if let Some(owned) = row.get::<_, Option<String>>(2) {
            return refuse(
                format!("`{role}` owns fence's {owned}, so it can write `bindings` and bypass `fence protect`"),
                "grant a role that owns none of fence's objects; if this is the application's role, make the admin their owner (ALTER … OWNER TO for the schema, its tables and functions) or prepare a fresh --schema with `fence init --target` as the admin",
            );
        }
        if let Some(tables) = row.get::<_, Option<String>>(3) {
            return refuse(
                format!("`{role}` may write fence's own tables ({tables}), which bypasses `fence protect`"),
                "revoke it first: REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON those tables FROM that role",
            );
        }
        if row.get::<_, bool>(4) {
            return refuse(
                format!("`{role}` has CREATEROLE, which before PostgreSQL 16 lets it grant itself pg_write_all_data (or membership in the schema's owner) and so bypass `fence protect`"),
                "grant a role without CREATEROLE (ALTER ROLE … NOCREATEROLE), or create roles with an admin role the application does not use",
            );
        }
        let quoted: String = row.get(0);
        let rows = self
            .session()
            .call(
                "look for ways around `fence protect`",
                false,
                BYPASSES,
                &[(&role, Type::TEXT), (&session.schema, Type::TEXT)],
            )
            .await?;
        // A reader is given nothing to write with: what it may do already is doctor's to say.
        let mut rows: Vec<(String, String, String)> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .filter(|(kind, _, _): &(String, String, String)| !reader && about_the_role(kind))
            .collect();
        rows.sort_by_key(|(kind, _, _)| rank(kind));
        let found: Vec<(String, String)> = rows
            .iter()
            .map(|(kind, what, via)| bypass(kind, what, via, role))
            .collect();
        if let Some((why, fix)) = found.first() {
            let more = match found.len() {
                1 => String::new(),
                n => format!(
                    " (and {} more way(s): `fence doctor --target` as it lists them all)",
                    n - 1
                ),
            };
            return refuse(format!("{why}{more}"), fix);
        }
        Ok(quoted)
    }
}

/// Ways around `fence protect` in the target: rows of (kind, what, via). `$1` is the role
/// (NULL: the login role, `session_user`), `$2` fence's schema. Reads only the catalogs: a role
/// without fence's grant can run it.
///
/// The role's kinds count every role it is a member of (`pg_has_role … MEMBER`: inherited or
/// not, since it can `SET ROLE` to each), itself included; `via` names the role that holds
/// the power. A role may not: be or become a superuser; be a member of
/// `pg_execute_server_program` or `pg_write_server_files` (programs and files as the server's
/// OS user reach the database as a superuser); hold CREATEROLE through another role
/// (before PostgreSQL 16 it can then grant itself anything); own the database, a protected
/// table's schema, a protected table, or an object a protected table depends on (a column's
/// type or domain, a function of a default, generated column, check, trigger, row-level
/// security policy, rule or index expression, a parent table: dropping or altering them
/// changes the table's rows, or, for a trigger's function, writes what it likes inside the
/// current holder's fenced transaction: review 14. A function called only inside another
/// function's body has no dependency on record, and is not seen); hold TRIGGER on a protected table (it
/// can replace `fence_protect`); hold any write or TRIGGER privilege on fence's own tables,
/// a column's included (it can forge a binding, or run code as their owner); call one of
/// dblink's functions that open a connection (with USAGE on its schema), or use a foreign
/// server: either writes on a connection of its own, which commits outside the fenced
/// transaction, however the SQL spells the call (a rule on privileges, not on spelling).
///
/// The set-up's kinds, whoever connects: fence's two triggers not `ENABLE ALWAYS` on a
/// protected table (disabled, or switched off under `session_replication_role`), one of them
/// missing or calling another function, a table below a protected one without them, a
/// protected table below an unprotected one (writes through the parent pass), and the event
/// trigger that protects tables added later not `ENABLE ALWAYS`.
pub(crate) const BYPASSES: &str = "\
WITH RECURSIVE r AS (SELECT oid, rolname FROM pg_roles WHERE rolname = coalesce($1::text, session_user::text)), \
mine AS (SELECT m.oid, m.rolname, m.rolsuper, m.rolcreaterole FROM pg_roles m, r \
    WHERE pg_has_role(r.oid, m.oid, 'MEMBER')), \
check_fn AS (SELECT f.oid FROM pg_proc f JOIN pg_namespace fn ON fn.oid = f.pronamespace \
    WHERE fn.nspname = $2::text AND f.proname = 'protect_check'), \
protected AS (SELECT DISTINCT c.oid, c.relowner, c.relnamespace FROM pg_trigger t \
    JOIN pg_class c ON c.oid = t.tgrelid \
    WHERE t.tgname = 'fence_protect' AND t.tgfoid IN (SELECT oid FROM check_fn)), \
below AS (SELECT i.inhrelid AS oid FROM pg_inherits i JOIN protected p ON i.inhparent = p.oid \
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN below b ON i.inhparent = b.oid), \
above AS (SELECT p.oid AS rel, i.inhparent AS oid FROM protected p JOIN pg_inherits i ON i.inhrelid = p.oid \
    UNION SELECT a.rel, i.inhparent FROM above a JOIN pg_inherits i ON i.inhrelid = a.oid), \
deps AS (SELECT p.oid AS rel, d.refclassid, d.refobjid FROM protected p JOIN pg_depend d \
    ON (d.classid = 'pg_class'::regclass AND d.objid = p.oid) \
    OR (d.classid = 'pg_attrdef'::regclass AND d.objid IN (SELECT a.oid FROM pg_attrdef a WHERE a.adrelid = p.oid)) \
    OR (d.classid = 'pg_constraint'::regclass AND d.objid IN (SELECT k.oid FROM pg_constraint k WHERE k.conrelid = p.oid)) \
    OR (d.classid = 'pg_trigger'::regclass AND d.objid IN (SELECT g.oid FROM pg_trigger g WHERE g.tgrelid = p.oid)) \
    OR (d.classid = 'pg_policy'::regclass AND d.objid IN (SELECT y.oid FROM pg_policy y WHERE y.polrelid = p.oid)) \
    OR (d.classid = 'pg_rewrite'::regclass AND d.objid IN (SELECT w.oid FROM pg_rewrite w WHERE w.ev_class = p.oid)) \
    OR (d.classid = 'pg_class'::regclass AND d.objid IN (SELECT x.indexrelid FROM pg_index x WHERE x.indrelid = p.oid)) \
    WHERE d.deptype IN ('n', 'a', 'P', 'S')), \
dep_owners AS ( \
    SELECT d.rel, format('type %s', d.refobjid::regtype) AS what, t.typowner AS owner FROM deps d \
        JOIN pg_type t ON t.oid = d.refobjid WHERE d.refclassid = 'pg_type'::regclass \
    UNION ALL SELECT d.rel, format('function %s', d.refobjid::regprocedure), f.proowner FROM deps d \
        JOIN pg_proc f ON f.oid = d.refobjid WHERE d.refclassid = 'pg_proc'::regclass \
    UNION ALL SELECT d.rel, format('table %s', d.refobjid::regclass), c.relowner FROM deps d \
        JOIN pg_class c ON c.oid = d.refobjid WHERE d.refclassid = 'pg_class'::regclass \
          AND c.relkind IN ('r', 'p', 'f') AND c.oid <> d.rel) \
SELECT 'superuser_member', m.rolname::text, m.rolname::text FROM mine m, r \
    WHERE m.rolsuper AND m.oid <> r.oid \
UNION ALL SELECT 'server_access', m.rolname::text, m.rolname::text FROM mine m \
    WHERE m.rolname IN ('pg_execute_server_program', 'pg_write_server_files') \
UNION ALL SELECT 'createrole_member', m.rolname::text, m.rolname::text FROM mine m, r \
    WHERE m.rolcreaterole AND m.oid <> r.oid AND current_setting('server_version_num')::int < 160000 \
UNION ALL SELECT 'database_owner', d.datname::text, m.rolname::text FROM pg_database d, mine m \
    WHERE d.datname = current_database() AND d.datdba = m.oid \
UNION ALL SELECT DISTINCT 'schema_owner', quote_ident(n.nspname), m.rolname::text \
    FROM protected p JOIN pg_namespace n ON n.oid = p.relnamespace JOIN mine m ON m.oid = n.nspowner \
UNION ALL SELECT DISTINCT 'table_owner', p.oid::regclass::text, m.rolname::text \
    FROM protected p JOIN mine m ON m.oid = p.relowner \
UNION ALL SELECT DISTINCT 'dependency_owner', format('%s (of %s)', o.what, o.rel::regclass), m.rolname::text \
    FROM dep_owners o JOIN mine m ON m.oid = o.owner \
UNION ALL SELECT DISTINCT 'trigger_privilege', p.oid::regclass::text, m.rolname::text \
    FROM protected p, mine m WHERE p.relowner <> m.oid AND has_table_privilege(m.oid, p.oid, 'TRIGGER') \
UNION ALL SELECT DISTINCT 'fence_table_write', c.oid::regclass::text, m.rolname::text \
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, mine m \
    WHERE n.nspname = $2::text AND c.relkind = 'r' AND c.relowner <> m.oid \
      AND (has_table_privilege(m.oid, c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE, TRIGGER') \
           OR has_any_column_privilege(m.oid, c.oid, 'INSERT, UPDATE')) \
UNION ALL SELECT 'second_connection', \
    string_agg(f.oid::regprocedure::text, ', ' ORDER BY f.oid::regprocedure::text), m.rolname::text \
    FROM pg_extension e JOIN pg_depend d ON d.refclassid = 'pg_extension'::regclass AND d.refobjid = e.oid \
      AND d.classid = 'pg_proc'::regclass AND d.deptype = 'e' \
    JOIN pg_proc f ON f.oid = d.objid, mine m \
    WHERE e.extname = 'dblink' AND f.proname IN ('dblink', 'dblink_exec', 'dblink_connect', 'dblink_connect_u') \
      AND has_function_privilege(m.oid, f.oid, 'EXECUTE') AND has_schema_privilege(m.oid, f.pronamespace, 'USAGE') \
    GROUP BY m.rolname \
UNION ALL SELECT DISTINCT 'foreign_server', quote_ident(s.srvname), m.rolname::text \
    FROM pg_foreign_server s, mine m WHERE has_server_privilege(m.oid, s.oid, 'USAGE') \
UNION ALL SELECT 'trigger_not_always', format('%s on %s', t.tgname, t.tgrelid::regclass), '' \
    FROM pg_trigger t WHERE t.tgname IN ('fence_protect', 'fence_protect_truncate') \
      AND t.tgfoid IN (SELECT oid FROM check_fn) AND t.tgenabled <> 'A' \
UNION ALL SELECT 'trigger_replaced', format('%s on %s', t.tgname, t.tgrelid::regclass), '' \
    FROM pg_trigger t WHERE t.tgname IN ('fence_protect', 'fence_protect_truncate') \
      AND t.tgfoid NOT IN (SELECT oid FROM check_fn) \
UNION ALL SELECT 'trigger_missing', p.oid::regclass::text, '' FROM protected p \
    WHERE NOT EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid = p.oid \
      AND t.tgname = 'fence_protect_truncate' AND t.tgfoid IN (SELECT oid FROM check_fn)) \
UNION ALL SELECT DISTINCT 'unprotected_below', b.oid::regclass::text, '' FROM below b \
    WHERE b.oid NOT IN (SELECT oid FROM protected) \
UNION ALL SELECT DISTINCT 'unprotected_above', format('%s (above %s)', a.oid::regclass, a.rel::regclass), '' \
    FROM above a WHERE a.oid NOT IN (SELECT oid FROM protected) \
UNION ALL SELECT 'event_trigger_not_always', quote_ident(e.evtname), '' FROM pg_event_trigger e \
    WHERE e.evtfoid IN (SELECT f.oid FROM pg_proc f JOIN pg_namespace fn ON fn.oid = f.pronamespace \
                        WHERE fn.nspname = $2::text AND f.proname = 'protect_new_tables') \
      AND e.evtenabled <> 'A' \
ORDER BY 1, 2";

/// The order [`BYPASSES`] kinds are told in: the widest power first.
pub(crate) fn rank(kind: &str) -> usize {
    const ORDER: [&str; 11] = [
        "superuser_member",
        "server_access",
        "createrole_member",
        "database_owner",
        "schema_owner",
        "table_owner",
        "dependency_owner",
        "trigger_privilege",
        "fence_table_write",
        "second_connection",
        "foreign_server",
    ];
    ORDER.iter().position(|k| *k == kind).unwrap_or(ORDER.len())
}

/// Whether a [`BYPASSES`] kind is about the role (else about the set-up).
pub(crate) fn about_the_role(kind: &str) -> bool {
    !matches!(
        kind,
        "trigger_not_always"
            | "trigger_replaced"
            | "trigger_missing"
            | "unprotected_below"
            | "unprotected_above"
            | "event_trigger_not_always"
    )
}

/// What one row of [`BYPASSES`] means for `role`, and what to do: (message, fix).
pub(crate) fn bypass(kind: &str, what: &str, via: &str, role: &str) -> (String, String) {
    let through = if via == role || via.is_empty() {
        String::new()
    } else {
        format!(" (through its membership in `{via}`)")
    };
    let revoke = if via == role || via.is_empty() {
        String::new()
    } else {
        format!(", or REVOKE {via} FROM {role}")
    };
    match kind {
        "superuser_member" => (
            format!("`{role}` is a member of the superuser role `{what}`: after SET ROLE it can disable triggers, so `fence protect` does not hold against it"),
            format!("REVOKE {what} FROM {role}; let applications connect as a role that cannot become a superuser"),
        ),
        "server_access" => (
            format!("`{role}` is a member of `{what}`: it can run programs or write files as the server's operating-system user (COPY … TO PROGRAM / TO FILE), and so reach the database as a superuser and disable fence's triggers"),
            format!("as the admin: REVOKE {what} FROM {role}"),
        ),
        "createrole_member" => (
            format!("`{role}` is a member of `{what}`, which has CREATEROLE: before PostgreSQL 16 it can then grant itself membership in a table's owner, or pg_write_all_data, and so bypass `fence protect`"),
            format!("REVOKE {what} FROM {role} (or ALTER ROLE {what} NOCREATEROLE)"),
        ),
        "database_owner" => (
            format!("`{role}` owns the database `{what}`{through}: it can drop it with every protected table, and it owns each schema owned by pg_database_owner (in PostgreSQL 15 `public`), where it can drop a table and create another"),
            format!("as the admin: ALTER DATABASE {what} OWNER TO an admin role the application does not use{revoke}"),
        ),
        "schema_owner" => (
            format!("`{role}` owns the schema {what}{through}, where a protected table lives: it can drop the table and create another without triggers"),
            format!("as the admin: ALTER SCHEMA {what} OWNER TO an admin role the application does not use{revoke}"),
        ),
        "table_owner" => (
            format!("`{role}` owns the protected table {what}{through}: it can disable its triggers or drop it"),
            format!("as the admin: ALTER TABLE {what} OWNER TO an admin role the application does not use{revoke}"),
        ),
        "dependency_owner" => (
            format!("`{role}` owns the {what}{through}: dropping or altering it changes the protected table's rows (a renamed enum value, a dropped column, a parent that writes through to it)"),
            format!("as the admin: ALTER … OWNER TO an admin role the application does not use, for that object{revoke}"),
        ),
        "trigger_privilege" => (
            format!("`{role}` may create triggers on the protected table {what}{through} (TRIGGER privilege): it can replace fence_protect with a trigger that lets everything pass"),
            format!("as the admin: REVOKE TRIGGER ON {what} FROM {via}"),
        ),
        "fence_table_write" => (
            format!("`{role}` may write (or put triggers on) fence's table {what}{through}: it can forge the binding that proves a fenced write, or run code as the table's owner"),
            format!("as the admin: REVOKE ALL ON {what} FROM {via} (then GRANT SELECT again if it reads it), or run `fence init --target` again"),
        ),
        "second_connection" => (
            format!("`{role}` may call dblink's {what}{through}: each opens a connection of its own, whose writes commit outside the fenced transaction whatever fence then reports, and whatever the SQL is spelled like"),
            format!("as the admin: REVOKE EXECUTE ON FUNCTION {what} FROM PUBLIC, {via} (dblink's functions are PUBLIC's when the extension is created), or DROP EXTENSION dblink"),
        ),
        "foreign_server" => (
            format!("`{role}` may use the foreign server {what}{through}: through a foreign table on it, a write runs on a connection of its own and commits outside the fenced transaction"),
            format!("as the admin: REVOKE USAGE ON FOREIGN SERVER {what} FROM PUBLIC, {via}"),
        ),
        "trigger_not_always" => (
            format!("the trigger {what} is not ENABLE ALWAYS: it is disabled, or off in sessions with session_replication_role = replica (as after ALTER TABLE … DISABLE/ENABLE TRIGGER ALL)"),
            "as the admin: run `fence protect --table TABLE` again (it sets ENABLE ALWAYS)".to_owned(),
        ),
        "trigger_replaced" => (
            format!("the trigger {what} does not call fence's protect_check: it was replaced, and lets through what it likes"),
            "as the admin: run `fence protect --table TABLE` again, and find who could create triggers on it".to_owned(),
        ),
        "trigger_missing" => (
            format!("the protected table {what} lacks fence_protect_truncate: TRUNCATE passes unfenced"),
            format!("as the admin: fence protect --table {what}"),
        ),
        "unprotected_below" => (
            format!("{what} is below a protected table but has no fence triggers: its rows are written unfenced"),
            "as the admin: run `fence protect --table TOP` again for the top of its tree".to_owned(),
        ),
        "unprotected_above" => (
            format!("the parent {what} is not protected: writes through it reach the protected table unfenced"),
            "as the admin: protect the top of the tree (fence protect --table PARENT), not only a partition or child".to_owned(),
        ),
        _ => (
            format!("the event trigger {what}, which protects partitions and inheritance children added later, is not ENABLE ALWAYS"),
            format!("as a superuser: ALTER EVENT TRIGGER {what} ENABLE ALWAYS"),
        ),
    }
}

impl PgTarget {
    /// The write path's guard call refused for want of fence's grant: the role may not use
    /// fence's schema or call `begin_write`. Nothing ran (the transaction was aborted).
    pub(crate) fn missing_grant(&self, err: &tokio_postgres::Error) -> Option<Error> {
        let db = err.as_db_error()?;
        (*db.code() == tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE).then(|| {
            let session = self.session();
            Error::usage(
                format!(
                    "PostgreSQL at `{}` refused the fenced write before it began: {}; nothing was changed",
                    session.display,
                    db.message()
                ),
                format!(
                    "this role has not been granted fence's write path: have the admin run `fence grant --target URL --role ROLE --schema {}` for it",
                    session.schema
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names of fence's functions that `source` calls as `<schema>.name(`, however the
    /// schema is spelled (`__SCHEMA__`, `{}` or `{schema}` in a format string).
    fn called_functions(source: &str) -> Vec<String> {
        let mut names = Vec::new();
        for prefix in ["__SCHEMA__.", "{}.", "{schema}."] {
            for (at, _) in source.match_indices(prefix) {
                let rest = &source[at + prefix.len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && rest[name.len()..].starts_with('(') {
                    names.push(name);
                }
            }
        }
        names
    }

    /// Every function the write path calls is one `fence grant` gives a writer: a new one
    /// must be added to WRITER_FUNCTIONS, or writers granted as docs/postgres-targets.md shows lose access.
    #[test]
    fn the_writer_grant_covers_every_function_the_write_path_calls() {
        let called = called_functions(include_str!("postgres.rs"));
        assert!(called.iter().any(|n| n == "begin_write"), "{called:?}");
        for name in &called {
            assert!(
                WRITER_FUNCTIONS.contains(&name.as_str()),
                "the write path calls {name}, which `fence grant` does not give writers"
            );
        }
    }
}
