//! `fence doctor`: finds the set-ups that silently weaken fence's guarantees before they cost a
//! token — an asynchronous standby that can be promoted with the last grants missing, a role
//! that owns fence's schema (and so can bypass `protect`), a pooler between fence and the
//! server, a directory store or `file://` objects on a network filesystem, `file://` objects in
//! a directory every local user may write — and says what each means and how to fix it. It
//! changes nothing. Each finding is `ok`, `warn` or `fail`; any `fail` makes the exit
//! status 2 (a configuration problem).

use std::path::Path;

use comfy_table::{presets, Table};
use serde::Serialize;
use tokio_postgres::Client;

use crate::cli::{DoctorArgs, Format};
use crate::cmd::Context;
use crate::config::StoreKind;
use crate::error::Error;
use crate::exit::Exit;
use crate::fenced::TargetSpec;
use crate::output::Output;
use crate::pg;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
enum Severity {
    Ok,
    Warn,
    Fail,
}

impl Severity {
    fn as_str(self) -> &'static str {
        match self {
            Severity::Ok => "ok",
            Severity::Warn => "warn",
            Severity::Fail => "fail",
        }
    }
}

/// One finding, as JSON shows it (`findings[]`: these keys in this order, `severity` `ok`,
/// `warn` or `fail`).
#[derive(Serialize)]
struct Finding {
    /// Where: `store` or the target's URL (without password).
    subject: String,
    /// A stable name for the check, e.g. `postgres.replication`.
    check: &'static str,
    severity: Severity,
    message: String,
    /// What to do about it (empty when nothing needs doing).
    fix: String,
}

/// Collects findings for one subject.
struct Findings<'a> {
    subject: &'a str,
    all: &'a mut Vec<Finding>,
}

impl Findings<'_> {
    fn add(&mut self, check: &'static str, severity: Severity, message: String, fix: &str) {
        self.all.push(Finding {
            subject: self.subject.to_owned(),
            check,
            severity,
            message,
            fix: fix.to_owned(),
        });
    }
}

/// Which role a PostgreSQL database plays.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Coordinator,
    Target,
}

pub async fn run(args: DoctorArgs, ctx: &Context, out: &Output) -> Exit {
    let mut all = Vec::new();
    if let Err(err) = check_all(&args, ctx, &mut all).await {
        return out.error("doctor", ctx.store_display(), &err);
    }
    report(&all, ctx, out)
}

async fn check_all(args: &DoctorArgs, ctx: &Context, all: &mut Vec<Finding>) -> Result<(), Error> {
    containment(&mut Findings {
        subject: "host",
        all,
    });
    if let Some(store) = &ctx.store {
        let mut findings = Findings {
            subject: "store",
            all,
        };
        match &store.kind {
            StoreKind::Postgres(url) => {
                postgres(
                    url,
                    &store.display,
                    &ctx.schema,
                    Role::Coordinator,
                    &mut findings,
                )
                .await
            }
            StoreKind::File(dir) => directory(dir, &mut findings),
            StoreKind::Object(url) => {
                object_store(&store.display, &mut findings);
                preconditions(url, &url.key, &mut findings).await;
            }
        }
    }
    for target in &args.targets {
        let spec = TargetSpec::resolve(target)?;
        let mut findings = Findings {
            subject: &spec.display,
            all,
        };
        match &spec.object {
            None => {
                postgres(
                    &spec.url,
                    &spec.display,
                    &ctx.schema,
                    Role::Target,
                    &mut findings,
                )
                .await
            }
            Some(url) if url.service == crate::object::Service::File => {
                object_directory(Path::new(&url.bucket), &mut findings)
            }
            Some(url) => {
                object_store(&spec.display, &mut findings);
                let dir = url
                    .key
                    .rsplit_once('/')
                    .map_or("", |(dir, _)| dir)
                    .to_owned();
                preconditions(url, &dir, &mut findings).await;
            }
        }
    }
    Ok(())
}

fn report(all: &[Finding], ctx: &Context, out: &Output) -> Exit {
    let failed = all.iter().any(|f| f.severity == Severity::Fail);
    let count = |s: Severity| all.iter().filter(|f| f.severity == s).count();
    if out.format == Format::Json {
        #[derive(Serialize)]
        struct Json<'a> {
            findings: &'a [Finding],
            summary: Summary,
        }
        /// How many findings of each severity.
        #[derive(Serialize)]
        struct Summary {
            ok: usize,
            warn: usize,
            fail: usize,
        }
        let answer = Json {
            findings: all,
            summary: Summary {
                ok: count(Severity::Ok),
                warn: count(Severity::Warn),
                fail: count(Severity::Fail),
            },
        };
        out.json_answer(!failed, "doctor", ctx.store_display(), &answer);
    } else if !out.quiet || failed {
        let mut table = Table::new();
        table.load_preset(presets::UTF8_FULL_CONDENSED);
        table.set_header(["", "WHERE", "CHECK", "FINDING", "FIX"]);
        for f in all {
            table.add_row([
                f.severity.as_str(),
                f.subject.as_str(),
                f.check,
                f.message.as_str(),
                f.fix.as_str(),
            ]);
        }
        crate::output::print_line(&crate::terminal::terminal_safe(
            &format!(
                "{table}\n{} ok, {} warn, {} fail",
                count(Severity::Ok),
                count(Severity::Warn),
                count(Severity::Fail)
            ),
            true,
        ));
    }
    if failed {
        Exit::Usage
    } else {
        Exit::Success
    }
}

async fn postgres(url: &str, display: &str, schema: &str, role: Role, f: &mut Findings<'_>) {
    let (client, port) = match connect(url, display).await {
        Ok(connected) => connected,
        Err(err) => {
            f.add(
                "postgres.connect",
                Severity::Fail,
                err.to_string(),
                &err.hint(),
            );
            return;
        }
    };
    version(&client, f).await;
    f.add(
        "postgres.synchronous_commit",
        Severity::Ok,
        match role {
            Role::Coordinator => "fence sets synchronous_commit = on for each of its own transactions, whatever the server default",
            Role::Target => "fence sets synchronous_commit = on last in every fenced write, after the caller's SQL, whatever the database, the role or the SQL set",
        }
        .into(),
        "",
    );
    durability(&client, f).await;
    if role == Role::Coordinator {
        replication(&client, f).await;
        connections(&client, f).await;
    }
    pooler(&client, port, f).await;
    ownership(&client, schema, role, f).await;
    schema_version(&client, schema, role, f).await;
    if role == Role::Target {
        protection(&client, schema, f).await;
    }
    public_grants(&client, schema, f).await;
    clock(&client, f).await;
}

/// A connection, and the port the URL (or PGPORT) asked for.
async fn connect(url: &str, display: &str) -> Result<(Client, u16), Error> {
    let server = pg::ConnectParams::resolve(url, display)?;
    let port = server.port().unwrap_or(5432);
    Ok((server.connect().await?.0, port))
}

/// One value (as text) from a query, or why it could not be read.
async fn one(client: &Client, sql: &str) -> Result<Option<String>, String> {
    match client.simple_query(sql).await {
        Ok(messages) => Ok(messages.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })),
        Err(err) => Err(err
            .as_db_error()
            .map_or_else(|| err.to_string(), |db| db.message().to_owned())),
    }
}

async fn version(client: &Client, f: &mut Findings<'_>) {
    match one(client, "SHOW server_version_num").await {
        Ok(Some(v)) if v.parse::<u32>().unwrap_or(0) >= 140_000 => f.add(
            "postgres.version",
            Severity::Ok,
            format!("PostgreSQL {}", pretty_version(&v)),
            "",
        ),
        Ok(v) => f.add(
            "postgres.version",
            Severity::Warn,
            format!(
                "PostgreSQL {} is older than 14: the server cannot notice a vanished client while a fenced write runs, so a killed `fence write` can still commit up to its --timeout",
                pretty_version(v.as_deref().unwrap_or("?"))
            ),
            "upgrade to PostgreSQL 14 or later",
        ),
        Err(err) => f.add("postgres.version", Severity::Warn, err, ""),
    }
}

/// The server settings without which a commit it acknowledged can vanish in a crash: a
/// token granted twice (coordinator), a guard row gone back to an older token (target).
async fn durability(client: &Client, f: &mut Findings<'_>) {
    let mut off = Vec::new();
    for setting in ["fsync", "full_page_writes"] {
        if let Ok(Some(value)) = one(client, &format!("SHOW {setting}")).await {
            if value == "off" {
                off.push(setting);
            }
        }
    }
    if off.is_empty() {
        f.add(
            "postgres.durability",
            Severity::Ok,
            "fsync and full_page_writes are on: a commit the server acknowledged survives a crash"
                .into(),
            "",
        );
    } else {
        f.add(
            "postgres.durability",
            Severity::Fail,
            format!(
                "{} = off: a commit the server acknowledged can be lost in a crash, so a token could be granted twice or a guard row fall back to an older token",
                off.join(" and ")
            ),
            &format!(
                "set {} in postgresql.conf and reload (`SELECT pg_reload_conf()`); off is for throwaway data only",
                off.iter().map(|s| format!("{s} = on")).collect::<Vec<_>>().join(", ")
            ),
        );
    }
}

fn pretty_version(num: &str) -> String {
    match num.parse::<u32>() {
        Ok(n) => format!("{}.{}", n / 10_000, n % 10_000),
        Err(_) => num.to_owned(),
    }
}

async fn replication(client: &Client, f: &mut Findings<'_>) {
    let sql = "SELECT coalesce(string_agg(coalesce(application_name, '?') || '=' || coalesce(sync_state, 'unknown'), ',' ORDER BY application_name), '') FROM pg_stat_replication";
    let standbys = match one(client, sql).await {
        Ok(list) => list.unwrap_or_default(),
        Err(err) => {
            f.add(
                "postgres.replication",
                Severity::Warn,
                format!("cannot read pg_stat_replication: {err}"),
                "grant this role pg_monitor to let doctor check replication",
            );
            return;
        }
    };
    let standbys: Vec<(&str, &str)> = standbys
        .split(',')
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.split_once('='))
        .collect();
    let unsafe_ones: Vec<&str> = standbys
        .iter()
        .filter(|(_, state)| !matches!(*state, "sync" | "quorum"))
        .map(|(name, state)| if *state == "unknown" { "?" } else { name })
        .collect();
    if standbys.is_empty() {
        f.add(
            "postgres.replication",
            Severity::Ok,
            "no streaming standby".into(),
            "",
        );
    } else if unsafe_ones.is_empty() {
        f.add(
            "postgres.replication",
            Severity::Ok,
            format!("{} synchronous standby(s)", standbys.len()),
            "",
        );
    } else {
        f.add(
            "postgres.replication",
            Severity::Warn,
            format!(
                "standby {} replicates asynchronously: promoted after a failover, it can lack the last granted tokens and grant them again",
                unsafe_ones.join(", ")
            ),
            "name it in synchronous_standby_names (synchronous replication), or never promote it while leases are in use",
        );
    }
}

/// What one busy resource can use at once: its holder, the waiters at the head of its
/// queue that keep a connection, and one more for the short polls of the others and an
/// `inspect` (docs/run.md, Connection sizing).
const PER_BUSY_RESOURCE: i64 = 1 + crate::coordinator::PG_WAITER_CONNECTIONS + 1;

/// Connection sizing: the login role's (`session_user`'s) CONNECTION LIMIT against the slots the server
/// has for non-superusers, and against what one busy resource needs.
async fn connections(client: &Client, f: &mut Findings<'_>) {
    let check = "postgres.connections";
    // `reserved_connections` (PostgreSQL 16) is read as 0 where it does not exist. The role
    // comes last: its name may hold the separator.
    let sql = "SELECT concat_ws('|', r.rolsuper, r.rolconnlimit, \
                 current_setting('max_connections'), current_setting('superuser_reserved_connections'), \
                 coalesce(current_setting('reserved_connections', true), '0'), \
                 (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'), \
                 (SELECT datconnlimit FROM pg_database WHERE datname = current_database()), session_user) \
               FROM pg_roles r WHERE r.rolname = session_user";
    let row = match one(client, sql).await {
        Ok(Some(row)) => row,
        Ok(None) => return,
        Err(err) => {
            f.add(
                check,
                Severity::Warn,
                format!("cannot read the connection settings: {err}"),
                "",
            );
            return;
        }
    };
    let parts: Vec<&str> = row.splitn(8, '|').collect();
    let [superuser, limit, max, reserved, reserved_more, in_use, db_limit, role] = parts.as_slice()
    else {
        return;
    };
    let number = |text: &str| text.parse::<i64>().unwrap_or(0);
    let (limit, max, in_use, db_limit) =
        (number(limit), number(max), number(in_use), number(db_limit));
    let reserved = number(reserved) + number(reserved_more);
    let slots = max - reserved;
    let server = format!(
        "the server's {slots} slots for ordinary roles (max_connections {max} less {reserved} reserved)"
    );
    let role_sql = sql_identifier(role);
    let spare = (slots - (slots / 10).max(PER_BUSY_RESOURCE)).max(PER_BUSY_RESOURCE);
    let bounded = format!(
        "give the role a CONNECTION LIMIT below the server's slots (e.g. `ALTER ROLE {role_sql} CONNECTION LIMIT {spare}`), or let waiting jobs log in as a role of their own with a limit (`CONNECTION LIMIT 20` lets 200 waiters through one by one), or put them behind a session-mode pool; see docs/run.md, Connection sizing and PgBouncer"
    );
    if *superuser == "t" {
        f.add(
            check,
            Severity::Warn,
            format!("fence connects as superuser `{role}`: no CONNECTION LIMIT applies to it and it may take the reserved slots too, so a crowd of waiters can fill {server} and the superuser's own"),
            &format!("let fence connect as an ordinary role with a CONNECTION LIMIT below the server's slots (e.g. `CREATE ROLE fence_jobs LOGIN CONNECTION LIMIT {spare}`), or through a session-mode pool; see docs/run.md, Connection sizing and PgBouncer"),
        );
    } else if limit < 0 || limit >= slots {
        let what = if limit < 0 {
            "has no CONNECTION LIMIT".to_owned()
        } else {
            format!("has CONNECTION LIMIT {limit}, not below {server}")
        };
        f.add(
            check,
            Severity::Warn,
            format!("role `{role}` {what}: its waiters (up to {} connections per busy resource, plus short polls) and holders may take every slot, and then no one, holders of other roles included, can connect to renew a lease until slots free up", crate::coordinator::PG_WAITER_CONNECTIONS),
            &bounded,
        );
    } else if limit < PER_BUSY_RESOURCE {
        f.add(
            check,
            Severity::Warn,
            format!("role `{role}` has CONNECTION LIMIT {limit}, below the {PER_BUSY_RESOURCE} connections one busy resource can use (its holder, up to {} waiters at the head of its queue, one for the others' polls and `inspect`): waiters keep retrying 'too many connections' and hand-overs slow down", crate::coordinator::PG_WAITER_CONNECTIONS),
            &format!("`ALTER ROLE {role_sql} CONNECTION LIMIT {}` (at least {PER_BUSY_RESOURCE} per resource busy at once), keeping the limits of all roles below {slots}", PER_BUSY_RESOURCE.max(limit)),
        );
    } else {
        f.add(
            check,
            Severity::Ok,
            format!("role `{role}` may open {limit} of {server}: enough for {} busy resources at once; {in_use} in use now", limit / PER_BUSY_RESOURCE),
            "",
        );
    }
    if (0..PER_BUSY_RESOURCE).contains(&db_limit) {
        f.add(
            check,
            Severity::Warn,
            format!("the database has CONNECTION LIMIT {db_limit}, below the {PER_BUSY_RESOURCE} connections one busy resource can use"),
            "raise it with ALTER DATABASE … CONNECTION LIMIT",
        );
    }
    if in_use * 10 >= slots * 9 {
        f.add(
            check,
            Severity::Warn,
            format!("{in_use} of {server} are in use: new connections will soon be refused (waiters retry; holders retry until their lease ends)"),
            "raise max_connections, or lower the CONNECTION LIMIT of the roles that use most",
        );
    }
}

/// `name` as an SQL identifier: bare when PostgreSQL would read it back unchanged.
fn sql_identifier(name: &str) -> String {
    let bare = name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if bare {
        name.to_owned()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// A pooler or proxy shows as a server port other than the one in the URL.
async fn pooler(client: &Client, asked: u16, f: &mut Findings<'_>) {
    let Ok(Some(server_port)) = one(client, "SELECT coalesce(inet_server_port(), 0)").await else {
        return;
    };
    if server_port == "0" || server_port == asked.to_string() {
        f.add(
            "postgres.pooler",
            Severity::Ok,
            "connected to the server directly".into(),
            "",
        );
    } else {
        f.add(
            "postgres.pooler",
            Severity::Warn,
            format!("port {asked} is not the server's ({server_port}): a pooler or proxy is in between; in transaction pooling (PgBouncer's default for many set-ups) LISTEN is dropped, so `--wait` wakes up by polling, not at once"),
            "nothing is unsafe; point waiters at a session-mode pool or the server directly for prompt wake-ups",
        );
    }
}

/// Whether the connecting role can bypass `protect` on the target. The login role
/// (`session_user`) decides, not `current_user`: a role whose default `SET ROLE` (or the
/// URL's `options=-c role=…`) names another role still logs in as itself and can `RESET ROLE`.
async fn ownership(client: &Client, schema: &str, role: Role, f: &mut Findings<'_>) {
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
async fn schema_version(client: &Client, schema: &str, role: Role, f: &mut Findings<'_>) {
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
async fn protection(client: &Client, schema: &str, f: &mut Findings<'_>) {
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

async fn public_grants(client: &Client, schema: &str, f: &mut Findings<'_>) {
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

/// Informational: fence never compares this host's clock with the server's.
async fn clock(client: &Client, f: &mut Findings<'_>) {
    let sent = std::time::SystemTime::now();
    let Ok(Some(server)) = one(
        client,
        "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
    )
    .await
    else {
        return;
    };
    let here = sent
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let offset = server.parse::<i64>().unwrap_or(here) - here;
    f.add(
        "postgres.clock",
        Severity::Ok,
        format!(
            "the server's clock is {} {} this host's (informational: expiry is judged by the server's clock alone)",
            crate::time::span(offset),
            if offset >= 0 { "ahead of" } else { "behind" }
        ),
        "",
    );
}

/// The `directory.filesystem` finding for `dir`, judged on `existing` (itself, or the
/// nearest parent that exists): a network filesystem cannot serialise `who` on several
/// machines (`remote_hint` says what to do instead).
/// How much of what `fence run`'s command starts this host lets fence find and stop (see
/// `fence run --help`): fence and its supervisor are subreapers, so every process the command
/// forks stays their descendant, found by its parent links in /proc, whatever process group or
/// session it moves to; the bounds are kept on CLOCK_BOOTTIME, which counts a suspend.
fn containment(f: &mut Findings<'_>) {
    let check = "host.run_containment";
    // SAFETY: prctl on this process only; set, read back, and cleared again.
    let subreaper = unsafe {
        let set = libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) == 0;
        let mut on: libc::c_int = 0;
        let read = libc::prctl(libc::PR_GET_CHILD_SUBREAPER, &mut on as *mut libc::c_int) == 0;
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 0);
        set && read && on == 1
    };
    let proc_ok = std::fs::read_to_string("/proc/self/stat").is_ok();
    let boottime = crate::sys::boottime_ns().is_some();
    let limits = "not contained: processes started through another service (systemd-run, at, ssh, a container runtime), and a command that stops both `fence run` and its supervisor (`kill -STOP -1`)";
    match (subreaper, proc_ok, boottime) {
        (true, true, true) => f.add(
            check,
            Severity::Ok,
            format!("fence run contains every descendant: each process the command forks, also after setsid or a double fork, is stopped before the lease can pass to another owner; {limits}"),
            "",
        ),
        (true, true, false) => f.add(
            check,
            Severity::Warn,
            format!("fence run contains every descendant, but CLOCK_BOOTTIME cannot be read: a machine suspended while a command runs is not counted against its lease; {limits}"),
            "use a kernel of Linux 2.6.39 or later",
        ),
        (_, false, _) => f.add(
            check,
            Severity::Fail,
            "/proc cannot be read: fence run cannot find the command's processes (nor start its supervisor, /proc/self/exe)".to_owned(),
            "mount /proc (`mount -t proc proc /proc`) where fence runs",
        ),
        (false, true, _) => f.add(
            check,
            Severity::Warn,
            format!("process group only: this kernel refuses PR_SET_CHILD_SUBREAPER, so a process of the command that leaves its group (setsid, a double fork) may outlive the lease; {limits}"),
            "use Linux 3.4 or later (or a seccomp policy that allows prctl)",
        ),
    }
}

fn filesystem_finding(
    existing: &Path,
    dir: &Path,
    who: &str,
    remote_hint: &str,
    f: &mut Findings<'_>,
) {
    match filesystem(existing) {
        Some((kind, Severity::Fail)) => f.add(
            "directory.filesystem",
            Severity::Fail,
            format!("`{}` is on {kind}: its file locks do not serialise {who} on different machines the way fence needs", dir.display()),
            remote_hint,
        ),
        Some((kind, Severity::Warn)) => f.add(
            "directory.filesystem",
            Severity::Warn,
            format!("`{}` is on {kind}: whether flock and rename are atomic depends on the filesystem behind it", dir.display()),
            "prefer a local filesystem (ext4, xfs, btrfs)",
        ),
        Some((kind, _)) => f.add(
            "directory.filesystem",
            Severity::Ok,
            format!("`{}` is on a local filesystem ({kind})", dir.display()),
            "",
        ),
        None => f.add(
            "directory.filesystem",
            Severity::Warn,
            format!("cannot tell the filesystem of `{}`", dir.display()),
            "",
        ),
    }
}

fn directory(dir: &Path, f: &mut Findings<'_>) {
    // What the store itself refuses (kernel pseudo file systems, NUL bytes) fails here too.
    if let Err(err) = crate::coordinator::file::FileCoordinator::open(dir) {
        f.add(
            "directory.path",
            Severity::Fail,
            err.to_string(),
            &err.hint(),
        );
        return;
    }
    // The store may not exist yet; judge the nearest existing ancestor, which must be a
    // directory this user can write (the first acquire creates the rest).
    let existing = dir.ancestors().find(|p| p.exists()).unwrap_or(dir);
    if !existing.is_dir() {
        f.add(
            "directory.path",
            Severity::Fail,
            format!(
                "`{}` is not a directory, so no store can live at `{}`",
                existing.display(),
                dir.display()
            ),
            "point --store at a directory (file:///path/to/dir)",
        );
        return;
    }
    if access_denied(existing) {
        f.add(
            "directory.permissions",
            Severity::Fail,
            format!("this user cannot write `{}`", existing.display()),
            "fix the directory's owner or mode, or choose another --store",
        );
        return;
    }
    filesystem_finding(
        existing,
        dir,
        "processes",
        "put the store on a local filesystem, or use a PostgreSQL, S3 or GCS store for several machines",
        f,
    );
    // The store and every directory in it, symlinks followed (fence follows them too).
    let mut dirs = vec![existing.to_path_buf()];
    if dir.exists() {
        if let Ok(entries) = std::fs::read_dir(dir) {
            dirs.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
    }
    let volatile: Vec<String> = dirs
        .iter()
        .filter_map(|d| {
            let (kind, _) = filesystem(d)?;
            matches!(kind, "tmpfs" | "ramfs").then(|| format!("`{}` ({kind})", d.display()))
        })
        .collect();
    if !volatile.is_empty() {
        f.add(
            "directory.durability",
            Severity::Fail,
            format!(
                "the store `{}` keeps its files on a filesystem a reboot empties: {}; fence's tokens would start again at 1, below every token a protected resource has accepted (each new holder refused as stale), and a token number would stand for two leases",
                dir.display(),
                volatile.join(", ")
            ),
            "put the store, every directory in it included, on a disk-backed filesystem (for example file:///var/lib/fence)",
        );
    }
    store_permissions(dir, existing, &dirs, f);
    if !dir.exists() {
        if crate::coordinator::file::refused_parent(dir).is_some() {
            f.add(
                "directory.exists",
                Severity::Fail,
                format!(
                    "`{}` does not exist, nor does its parent: fence refuses to create it (a typo in --store?)",
                    dir.display()
                ),
                "check the path in --store (FENCE_STORE); if it is right, create its parent first (mkdir -p)",
            );
        } else {
            f.add(
                "directory.exists",
                Severity::Ok,
                format!(
                    "`{}` does not exist yet; the first acquire creates it",
                    dir.display()
                ),
                "",
            );
        }
        return;
    }
    match free_bytes(dir) {
        Some(free) if free < 64 << 20 => f.add(
            "directory.space",
            Severity::Warn,
            format!("only {} MiB free under `{}`", free >> 20, dir.display()),
            "free some space: a full disk fails acquisitions",
        ),
        Some(free) => f.add(
            "directory.space",
            Severity::Ok,
            format!("{} MiB free", free >> 20),
            "",
        ),
        None => {}
    }
}

/// A store directory, and each directory in it (`dirs`, symlinks followed), must not be
/// writable by every local user, sticky bit or not: one could plant or replace a lease record
/// (a forged holder, a token that goes down) or the lock files. Nor may a directory above it
/// (from `existing` up) be writable by every user without the sticky bit: one could move the
/// whole store aside and put an empty one in its place (tokens from 1 again).
fn store_permissions(
    dir: &Path,
    existing: &Path,
    dirs: &[std::path::PathBuf],
    f: &mut Findings<'_>,
) {
    use std::os::unix::fs::PermissionsExt;
    let mode_of = |d: &Path| std::fs::metadata(d).ok().map(|m| m.permissions().mode());
    let described = |d: &Path, mode: u32| format!("`{}` (mode {:o})", d.display(), mode & 0o7777);
    let inside: Vec<String> = dirs
        .iter()
        .filter(|d| d.starts_with(dir))
        .filter_map(|d| {
            let mode = mode_of(d)?;
            (mode & 0o002 != 0).then(|| described(d, mode))
        })
        .collect();
    // Above the store and above each directory in it, by their paths as written and as
    // resolved (a symlink's target can sit in a directory anyone may rename it out of).
    let mut tops: Vec<std::path::PathBuf> = vec![existing.to_path_buf()];
    tops.extend(dirs.iter().filter_map(|d| d.canonicalize().ok()));
    tops.extend(existing.canonicalize().ok());
    let mut above: Vec<String> = Vec::new();
    for top in &tops {
        for d in top.ancestors().filter(|d| *d != dir && *d != top.as_path()) {
            let Some(mode) = mode_of(d) else { continue };
            let line = described(d, mode);
            if mode & 0o002 != 0 && mode & 0o1000 == 0 && !above.contains(&line) {
                above.push(line);
            }
        }
    }
    if inside.is_empty() && above.is_empty() {
        f.add(
            "directory.permissions",
            Severity::Ok,
            format!("other users may not write `{}` or move it", dir.display()),
            "",
        );
        return;
    }
    if !inside.is_empty() {
        f.add(
            "directory.permissions",
            Severity::Fail,
            format!(
                "any local user may write {}: one can plant or replace a lease record (a forged holder, a token that goes back) or a lock file",
                inside.join(", ")
            ),
            "remove write access for others (`chmod -R o-w DIR`), or share the store through a group (`chmod 2770 DIR` and its subdirectories)",
        );
    }
    if !above.is_empty() {
        f.add(
            "directory.permissions",
            Severity::Fail,
            format!(
                "any local user may write {}, above the store, without the sticky bit: one can move `{}` aside and put an empty store in its place (tokens from 1 again)",
                above.join(", "),
                dir.display()
            ),
            "remove write access for others there (`chmod o-w DIR`), set the sticky bit (`chmod +t DIR`), or move the store",
        );
    }
}

/// The directory of a `file://` object target: it must exist (a write never creates it), be
/// writable by this user, be on a local filesystem (its `flock` serialises the writers), and
/// not be open to every local user (who could replace the sidecar, and so the token).
fn object_directory(dir: &Path, f: &mut Findings<'_>) {
    use std::os::unix::fs::PermissionsExt;
    let mode = match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => meta.permissions().mode(),
        Ok(_) => {
            f.add(
                "directory.path",
                Severity::Fail,
                format!("`{}` is not a directory", dir.display()),
                "fix the path in --target: `file:///dir/name` names the file `name` in the directory `dir`",
            );
            return;
        }
        Err(err) => {
            f.add(
                "directory.exists",
                Severity::Fail,
                format!("cannot use the directory `{}`: {err}", dir.display()),
                "fix the path in --target, or create the directory (a write does not create it)",
            );
            return;
        }
    };
    if access_denied(dir) {
        f.add(
            "directory.permissions",
            Severity::Fail,
            format!("this user cannot write `{}`", dir.display()),
            "fix the directory's owner or mode, or write the object elsewhere",
        );
    } else if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        f.add(
            "directory.permissions",
            Severity::Fail,
            format!(
                "any local user may write `{}` (mode {:o}, no sticky bit): anyone can replace an object's sidecar `.<name>.fence.json`, and with it the highest token and the write ids",
                dir.display(),
                mode & 0o7777
            ),
            "remove write access for others (`chmod o-w DIR`), or share the directory through a group (`chmod 2770 DIR`)",
        );
    } else if mode & 0o002 != 0 {
        f.add(
            "directory.permissions",
            Severity::Warn,
            format!(
                "any local user may create files in `{}` (mode {:o}): one can plant fence's files beside an object before fence creates them",
                dir.display(),
                mode & 0o7777
            ),
            "remove write access for others (`chmod o-w DIR`), or share the directory through a group (`chmod 2770 DIR`)",
        );
    } else {
        f.add(
            "directory.permissions",
            Severity::Ok,
            format!(
                "this user may write `{}`, other users may not",
                dir.display()
            ),
            "",
        );
    }
    filesystem_finding(
        dir,
        dir,
        "writers",
        "keep `file://` objects on a local filesystem, or use S3 or GCS objects for writers on several machines",
        f,
    );
    if let Some(free) = free_bytes(dir).filter(|free| *free < 64 << 20) {
        f.add(
            "directory.space",
            Severity::Warn,
            format!("only {} MiB free under `{}`", free >> 20, dir.display()),
            "free some space: a full disk fails writes",
        );
    }
}

fn access_denied(dir: &Path) -> bool {
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return true;
    };
    // SAFETY: access(2) reads a NUL-terminated path we own.
    unsafe { libc::access(path.as_ptr(), libc::W_OK | libc::X_OK) != 0 }
}

/// The filesystem's kind and how much to trust it, from statfs(2)'s magic number.
fn filesystem(path: &Path) -> Option<(&'static str, Severity)> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statfs fills the zeroed struct we pass for a NUL-terminated path we own.
    let fs = unsafe {
        let mut fs: libc::statfs = std::mem::zeroed();
        if libc::statfs(c.as_ptr(), &mut fs) != 0 {
            return None;
        }
        fs
    };
    #[allow(clippy::unnecessary_cast)]
    let magic = fs.f_type as i64;
    Some(match magic {
        0x6969 => ("NFS", Severity::Fail),
        0x517b => ("SMB", Severity::Fail),
        0xff53_4d42 | 0xfe53_4d42 => ("CIFS/SMB2", Severity::Fail),
        0x0027_e0eb => ("cgroup", Severity::Warn),
        0x6573_5546 => ("FUSE", Severity::Warn),
        0xef53 => ("ext2/3/4", Severity::Ok),
        0x5846_5342 => ("xfs", Severity::Ok),
        0x9123_683e => ("btrfs", Severity::Ok),
        0x0102_1994 => ("tmpfs", Severity::Ok),
        0x8584_58f6 => ("ramfs", Severity::Ok),
        0x794c_7630 => ("overlayfs", Severity::Ok),
        0x2fc1_2fc1 => ("zfs", Severity::Ok),
        _ => ("an unrecognised filesystem", Severity::Warn),
    })
}

fn free_bytes(path: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs fills the zeroed struct we pass for a NUL-terminated path we own.
    unsafe {
        let mut vfs: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut vfs) != 0 {
            return None;
        }
        Some(vfs.f_bavail as u64 * vfs.f_frsize as u64)
    }
}

/// Whether the server enforces the conditional writes fence relies on: the verification
/// record under `dir` when there is one, else the proof itself (which writes scratch objects
/// under `<dir>/.fence/` and, when the server passes, the record).
async fn preconditions(url: &crate::object::ObjectUrl, dir: &str, f: &mut Findings<'_>) {
    let api = match crate::object::open(url) {
        Ok(api) => api,
        Err(err) => {
            f.add(
                "object.preconditions",
                Severity::Fail,
                err.to_string(),
                &err.hint(),
            );
            return;
        }
    };
    match crate::object::verify::ensure(api.as_ref(), url, dir, false).await {
        Ok(true) => f.add(
            "object.preconditions",
            Severity::Ok,
            "the server enforces create-only and version-conditioned writes (verified)".into(),
            "",
        ),
        Ok(false) => f.add(
            "object.preconditions",
            Severity::Fail,
            "not verified: the check was skipped on purpose, so one lease may be granted to several owners".into(),
            "use a server that enforces conditional writes, and unset the variable that skips the check",
        ),
        Err(err) => f.add(
            "object.preconditions",
            Severity::Fail,
            err.to_string(),
            &err.hint(),
        ),
    }
    object_clock(api.as_ref(), dir, f).await;
}

/// Whether the time a write's answer carries is the store's own (issue 32, 4). Expiry is
/// judged by the time of fence's own writes as their answers give it: on S3 the HTTP `Date`
/// header (its answer to a put has no other), which a proxy in front of the store may write
/// itself (nginx does by default), from its own clock; on GCS the object's `updated`, the
/// store's own. So a scratch object is written, and the time its answer gave is compared
/// with the object's own timestamp (S3 `Last-Modified`, GCS `updated`) read back.
async fn object_clock(api: &dyn crate::object::ObjectApi, dir: &str, f: &mut Findings<'_>) {
    use crate::object::{Cond, Put};
    let check = "object.clock";
    let probe = if dir.is_empty() {
        format!(".fence/clock-{:016x}", crate::sys::random_u64())
    } else {
        format!("{dir}/.fence/clock-{:016x}", crate::sys::random_u64())
    };
    let none = std::collections::BTreeMap::new();
    let answered = match api.put(&probe, b"clock".to_vec(), &Cond::None, &none).await {
        Ok(Put::Done(meta)) => meta.last_modified_ms,
        Ok(Put::Lost) | Err(_) => return,
    };
    let stored = api.head(&probe).await;
    let _ = api.delete(&probe).await;
    let Ok(Some(stored)) = stored else {
        return;
    };
    // Both are floored to the store's resolution (S3: whole seconds), and the answer comes a
    // moment after the write: a second of resolution and two of latency are honest.
    let off = answered - stored.last_modified_ms;
    let slack = api.clock_resolution_ms() + 2_000;
    if off.abs() <= slack {
        f.add(
            check,
            Severity::Ok,
            format!("the time of a write's answer is the store's own ({off:+} ms from the object's timestamp)"),
            "",
        );
    } else {
        f.add(
            check,
            Severity::Fail,
            format!(
                "the time of a write's answer (the HTTP Date header) is {:.1} s {} the object's own timestamp: something in between (a proxy, a gateway) writes its own Date from another clock, and fence judges expiry by it, so a lease could be taken over while its holder still runs",
                off.abs() as f64 / 1000.0,
                if off > 0 { "ahead of" } else { "behind" }
            ),
            "let the proxy pass the store's Date header through (nginx: `proxy_pass_header Date;`), or reach the store directly",
        );
    }
}

/// What doctor can say about an S3 or GCS object store without writing to it.
fn object_store(display: &str, f: &mut Findings<'_>) {
    let s3 = display.starts_with("s3://");
    let (endpoint, credentials) = if s3 {
        (
            std::env::var("AWS_ENDPOINT_URL").unwrap_or_else(|_| "AWS S3".into()),
            if std::env::var_os("AWS_ACCESS_KEY_ID").is_some() {
                "AWS_ACCESS_KEY_ID"
            } else {
                "none found (AWS_ACCESS_KEY_ID is unset)"
            },
        )
    } else {
        (
            std::env::var("FENCE_GCS_ENDPOINT")
                .or_else(|_| std::env::var("STORAGE_EMULATOR_HOST"))
                .unwrap_or_else(|_| "Google Cloud Storage".into()),
            if std::env::var_os("GOOGLE_OAUTH_ACCESS_TOKEN").is_some() {
                "GOOGLE_OAUTH_ACCESS_TOKEN"
            } else if std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS").is_some() {
                "GOOGLE_APPLICATION_CREDENTIALS"
            } else {
                "none found"
            },
        )
    };
    f.add(
        "object.endpoint",
        Severity::Ok,
        format!("endpoint: {endpoint}; credentials: {credentials}"),
        "",
    );
    if s3 {
        f.add(
            "object.etag_aba",
            Severity::Warn,
            "S3 ETags are hashes of the bytes: a fenced object write can miss a newer writer that stored identical bytes between fence's read and its put".into(),
            "prefer GCS or file:// objects, or write bytes that differ per writer (see docs/object-stores.md)",
        );
    }
}
