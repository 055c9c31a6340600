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
const WRITER_FUNCTIONS: [&str; 5] = [
    "begin_write",
    "begin_write_once",
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
        let quoted_role = self.check_role(role).await?;
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
    async fn check_role(&self, role: &str) -> Result<String, Error> {
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
                "create it first (CREATE ROLE … LOGIN), as the README's \"Setting up roles\" shows; the name is matched exactly, case included",
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
        let found: Vec<(String, String)> = rows
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            .filter(|(kind, _)| about_the_role(kind))
            .map(|(kind, what)| bypass(&kind, &what, role))
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

/// Ways around `fence protect` in the target: rows of (kind, what, role). `$1` is the role
/// (NULL: the login role, `session_user`), `$2` fence's schema. Reads only the catalogs: a role
/// without fence's grant can run it. The role's kinds: it is a
/// member of a superuser role, owns the database (and so, through `pg_database_owner`, its
/// `public` schema), owns the schema of a protected table (it can drop the table and create
/// another without triggers), or owns a protected table (it can disable its triggers or drop
/// it); membership counts as ownership. The set-up's kinds, whoever connects: `fence_protect`
/// disabled on a protected table (`D`, or `R`: fires only under replication), and the event
/// trigger that protects later partitions and children disabled.
pub(crate) const BYPASSES: &str = "\
WITH r AS (SELECT oid, rolname FROM pg_roles WHERE rolname = coalesce($1::text, session_user::text)), \
protected AS ( \
    SELECT c.oid, c.relowner, c.relnamespace, t.tgenabled FROM pg_trigger t \
    JOIN pg_class c ON c.oid = t.tgrelid \
    WHERE t.tgname = 'fence_protect' \
      AND t.tgfoid IN (SELECT f.oid FROM pg_proc f JOIN pg_namespace fn ON fn.oid = f.pronamespace \
                       WHERE fn.nspname = $2::text AND f.proname = 'protect_check')) \
SELECT 'superuser_member', s.rolname::text, r.rolname::text FROM pg_roles s, r \
    WHERE s.rolsuper AND s.oid <> r.oid AND pg_has_role(r.oid, s.oid, 'MEMBER') \
UNION ALL SELECT 'database_owner', d.datname::text, r.rolname::text FROM pg_database d, r \
    WHERE d.datname = current_database() AND pg_has_role(r.oid, d.datdba, 'MEMBER') \
UNION ALL SELECT DISTINCT 'schema_owner', quote_ident(n.nspname), r.rolname::text \
    FROM protected p JOIN pg_namespace n ON n.oid = p.relnamespace, r \
    WHERE pg_has_role(r.oid, n.nspowner, 'MEMBER') \
UNION ALL SELECT 'table_owner', p.oid::regclass::text, r.rolname::text FROM protected p, r \
    WHERE pg_has_role(r.oid, p.relowner, 'MEMBER') \
UNION ALL SELECT 'trigger_disabled', p.oid::regclass::text, '' FROM protected p \
    WHERE p.tgenabled IN ('D', 'R') \
UNION ALL SELECT 'event_trigger_disabled', quote_ident(e.evtname), '' FROM pg_event_trigger e \
    WHERE e.evtfoid IN (SELECT f.oid FROM pg_proc f JOIN pg_namespace fn ON fn.oid = f.pronamespace \
                        WHERE fn.nspname = $2::text AND f.proname = 'protect_new_tables') \
      AND e.evtenabled IN ('D', 'R') \
ORDER BY 1, 2";

/// Whether a [`BYPASSES`] kind is about the role (else about the set-up).
pub(crate) fn about_the_role(kind: &str) -> bool {
    !kind.ends_with("_disabled")
}

/// What one row of [`BYPASSES`] means, and what to do: (message, fix).
pub(crate) fn bypass(kind: &str, what: &str, role: &str) -> (String, String) {
    match kind {
        "superuser_member" => (
            format!("`{role}` is a member of the superuser role `{what}`: after SET ROLE it can disable triggers, so `fence protect` does not hold against it"),
            format!("REVOKE {what} FROM {role}; let applications connect as a role that cannot become a superuser"),
        ),
        "database_owner" => (
            format!("`{role}` owns the database `{what}` (and so, in PostgreSQL 15, its `public` schema): it can drop a protected table there and create another without triggers"),
            format!("as the admin: ALTER DATABASE {what} OWNER TO an admin role the application does not use"),
        ),
        "schema_owner" => (
            format!("`{role}` owns the schema {what} (or is a member of its owner), where a protected table lives: it can drop the table and create another without triggers"),
            format!("as the admin: ALTER SCHEMA {what} OWNER TO an admin role the application does not use"),
        ),
        "table_owner" => (
            format!("`{role}` owns the protected table {what} (or is a member of its owner): it can disable its triggers or drop it"),
            format!("as the admin: ALTER TABLE {what} OWNER TO an admin role the application does not use"),
        ),
        "trigger_disabled" => (
            format!("the trigger fence_protect on {what} is disabled: every write to the table passes unfenced"),
            format!("as the admin: ALTER TABLE {what} ENABLE ALWAYS TRIGGER fence_protect (or run `fence protect --table {what}` again)"),
        ),
        _ => (
            format!("the event trigger {what}, which protects partitions and inheritance children added later, is disabled"),
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
    /// must be added to WRITER_FUNCTIONS, or writers granted by the README lose access.
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
