//! `fence doctor`'s checks of fence's schema on a PostgreSQL database, and of what the
//! connecting (login) role may do there: who owns or may write the schema, its version, the
//! ways around `protect` on a target, and write privileges granted to PUBLIC.

use tokio_postgres::Client;

use super::postgres::one;
use super::{Findings, Role, Severity};

/// Whether the connecting role can bypass `protect` on the target. The login role
/// (`session_user`) decides, not `current_user`: a role whose default `SET ROLE` (or the
/// URL's `options=-c role=…`) names another role still logs in as itself and can `RESET ROLE`.
pub(super) async fn ownership(client: &Client, schema: &str, role: Role, f: &mut Findings<'_>) {
    // A JSON array: role names may hold any separator.
    let sql = format!(
        "SELECT json_build_array(n.nspowner::regrole::text, session_user, \
         pg_has_role(session_user, n.nspowner, 'MEMBER')::text, \
         (SELECT rolsuper FROM pg_roles WHERE rolname = session_user)::text, \
         coalesce((SELECT string_agg(format('%I.%I', n.nspname, c.relname), ', ' ORDER BY c.relname) \
                   FROM pg_class c WHERE c.relnamespace = n.oid AND c.relkind = 'r' \
                     AND has_table_privilege(session_user, c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE')), ''), \
         ((SELECT rolcreaterole FROM pg_roles WHERE rolname = session_user) \
           AND current_setting('server_version_num')::int < 160000)::text)::text \
         FROM pg_namespace n WHERE n.nspname = '{schema}'"
    );
    match one(client, &sql).await {
        Ok(None) => f.add(
            "postgres.schema",
            Severity::Warn,
            format!("fence's schema `{schema}` does not exist yet"),
            if role == Role::Target {
                "run `fence init --target URL` as the admin, then `fence grant`"
            } else {
                "run `fence init` (or let the first command create it)"
            },
        ),
        Ok(Some(row)) => {
            let parts: Vec<String> = serde_json::from_str(&row).unwrap_or_default();
            let [owner, user, member, superuser, writable, createrole] = parts.as_slice() else {
                return;
            };
            if role == Role::Target && !writable.is_empty() {
                f.add(
                    "postgres.schema_owner",
                    Severity::Fail,
                    format!("the connecting role `{user}` may write fence's own tables ({writable}), directly or through a role such as pg_write_all_data: it can forge `bindings`, so `protect` does not hold against it"),
                    "connect as a role granted with `fence grant`, and revoke the write privileges (or the pg_write_all_data membership) from this one",
                );
            } else if role == Role::Target && *createrole == "true" {
                f.add(
                    "postgres.schema_owner",
                    Severity::Fail,
                    format!("the connecting role `{user}` has CREATEROLE, which before PostgreSQL 16 lets it join pg_write_all_data (or the schema's owner) at will and so bypass `protect`"),
                    "connect as a role without CREATEROLE (ALTER ROLE … NOCREATEROLE), granted with `fence grant`",
                );
            } else if role == Role::Target && (*member == "true" || *superuser == "true") {
                f.add(
                    "postgres.schema_owner",
                    Severity::Fail,
                    format!("the connecting role `{user}` owns (or is a member of the owner `{owner}` of) fence's schema `{schema}`, or is a superuser: it can write `bindings` and disable triggers, so `protect` does not hold against it"),
                    "let applications connect as a role granted with `fence grant`, never as the schema's owner",
                );
            } else {
                f.add(
                    "postgres.schema_owner",
                    Severity::Ok,
                    format!("fence's schema `{schema}` is owned by `{owner}`"),
                    "",
                );
            }
        }
        Err(err) => f.add("postgres.schema", Severity::Warn, err, ""),
    }
}

/// fence's schema at the version this fence knows: an older one is migrated by the next
/// write (of a role that may) or by `fence init`; a newer one is refused by every command.
pub(super) async fn schema_version(
    client: &Client,
    schema: &str,
    role: Role,
    f: &mut Findings<'_>,
) {
    let check = "postgres.schema_version";
    let (spec, init) = match role {
        Role::Coordinator => (
            &crate::coordinator::COORDINATOR_SCHEMA,
            "fence init".to_owned(),
        ),
        Role::Target => (
            &crate::fenced::postgres::TARGET_SCHEMA,
            "fence init --target URL (as the admin)".to_owned(),
        ),
    };
    let sql = format!(
        "SELECT value FROM {schema}.{} WHERE key = 'schema_version'",
        spec.meta_table
    );
    // A missing schema is `postgres.schema`'s to report.
    let Ok(Some(found)) = one(client, &sql).await else {
        return;
    };
    let known = spec.version;
    match found.parse::<i32>() {
        Ok(v) if v == known => f.add(
            check,
            Severity::Ok,
            format!("fence's schema `{schema}` is at version {v}, the one this fence knows"),
            "",
        ),
        Ok(v) if v < known => f.add(
            check,
            Severity::Warn,
            format!("fence's schema `{schema}` is at version {v}; this fence knows {known}: it migrates the schema before its next write there, or refuses to write if the role may not"),
            &format!("migrate it now: {init}"),
        ),
        Ok(_) => f.add(
            check,
            Severity::Fail,
            format!("fence's schema `{schema}` is at version {found}, made by a newer fence (this one knows up to {known}): this fence refuses to write there"),
            "upgrade fence on every host that uses this schema",
        ),
        Err(_) => f.add(
            check,
            Severity::Fail,
            format!("fence's schema `{schema}` is at version `{found}`, which this fence cannot read (it knows up to {known}): it refuses to write there"),
            &format!("upgrade fence, or, if the version was changed by hand, set it back in {schema}.{} (key schema_version)", spec.meta_table),
        ),
    }
}

/// Ways around `fence protect` for the connecting (login) role, and protection switched off
/// on the target (see [`crate::fenced::privileges::BYPASSES`]): each one fails.
pub(super) async fn protection(client: &Client, schema: &str, f: &mut Findings<'_>) {
    let check = "postgres.protection";
    let rows = match client
        .query(
            crate::fenced::privileges::BYPASSES,
            &[&None::<String>, &schema.to_owned()],
        )
        .await
    {
        Ok(rows) => rows,
        Err(err) => {
            let why = err
                .as_db_error()
                .map_or_else(|| err.to_string(), |db| db.message().to_owned());
            f.add(check, Severity::Warn, format!("cannot look: {why}"), "");
            return;
        }
    };
    let user = one(client, "SELECT session_user")
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    let mut found: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    found.sort_by_key(|(kind, _, _)| crate::fenced::privileges::rank(kind));
    for (kind, what, via) in &found {
        let (message, fix) = crate::fenced::privileges::bypass(kind, what, via, &user);
        f.add(check, Severity::Fail, message, &fix);
    }
    if rows.is_empty() {
        f.add(
            check,
            Severity::Ok,
            "the connecting role (and every role it can become) owns neither the database nor a protected table, its schema or what it depends on, cannot become a superuser, may not create triggers on protected tables nor write fence's tables; every protected tree has fence's triggers, ENABLE ALWAYS".into(),
            "",
        );
    }
}

pub(super) async fn public_grants(client: &Client, schema: &str, f: &mut Findings<'_>) {
    let sql = format!(
        "SELECT count(*) FROM pg_class c, aclexplode(c.relacl) a \
         WHERE c.relnamespace = to_regnamespace('{schema}') AND a.grantee = 0 \
         AND a.privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE')"
    );
    match one(client, &sql).await {
        Ok(Some(n)) if n != "0" => f.add(
            "postgres.public_grants",
            Severity::Warn,
            format!("{n} write privilege(s) on fence's tables in `{schema}` are granted to PUBLIC"),
            "run `fence init` (and `fence init --target`) again as the admin: it revokes them",
        ),
        Ok(_) => f.add(
            "postgres.public_grants",
            Severity::Ok,
            "nothing of fence's is writable by PUBLIC".into(),
            "",
        ),
        Err(err) => f.add("postgres.public_grants", Severity::Warn, err, ""),
    }
}
