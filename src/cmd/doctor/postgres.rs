//! `fence doctor`'s checks of a PostgreSQL server, coordinator or target: the connection, the
//! server's version, its durability settings, replication, connection sizing, a pooler in
//! between, and its clock. The checks of fence's schema there, and of what the connecting role
//! may do to it, are in `schema.rs`.

use tokio_postgres::Client;

use super::schema::{ownership, protection, public_grants, schema_version};
use super::{Findings, Role, Severity};
use crate::error::Error;
use crate::pg;

pub(super) async fn postgres(
    url: &str,
    display: &str,
    schema: &str,
    role: Role,
    f: &mut Findings<'_>,
) {
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
        connections(&client, schema, f).await;
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
pub(super) async fn one(client: &Client, sql: &str) -> Result<Option<String>, String> {
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

/// What one busy resource can use at once: its holder, the `held` waiters at the head of
/// its queue that keep a connection, and one more for the short polls of the others and an
/// `inspect` (docs/run.md, Connection sizing).
fn per_busy_resource(held: i64) -> i64 {
    1 + held + 1
}

/// The store's `held_waiters` as waiters use it (`fence init --held-waiters`; the default
/// where none is set), and the stored text when waiters could not use it as it is (not a
/// number, or out of 2–1000: they fall back to the default, or to the nearest bound).
async fn held_waiters(client: &Client, schema: &str) -> (i64, Option<String>) {
    use crate::coordinator::{PG_HELD_WAITERS, PG_HELD_WAITERS_MOST};
    // A store not made yet has no `meta` table: the default. (`schema` is a checked name.)
    let exists = one(
        client,
        &format!("SELECT to_regclass('{schema}.meta') IS NOT NULL"),
    )
    .await;
    if !matches!(exists, Ok(Some(ref yes)) if yes == "t") {
        return (PG_HELD_WAITERS, None);
    }
    let sql = format!("SELECT value FROM {schema}.meta WHERE key = 'held_waiters'");
    match one(client, &sql).await {
        Ok(Some(value)) => match value.parse::<i64>() {
            Ok(most) if (2..=PG_HELD_WAITERS_MOST).contains(&most) => (most, None),
            Ok(most) => (most.clamp(2, PG_HELD_WAITERS_MOST), Some(value)),
            Err(_) => (PG_HELD_WAITERS, Some(value)),
        },
        _ => (PG_HELD_WAITERS, None),
    }
}

/// Connection sizing: the login role's (`session_user`'s) CONNECTION LIMIT against the slots the server
/// has for non-superusers, and against what one busy resource needs.
async fn connections(client: &Client, schema: &str, f: &mut Findings<'_>) {
    let check = "postgres.connections";
    let (held, unusable) = held_waiters(client, schema).await;
    if let Some(stored) = unusable {
        f.add(
            check,
            Severity::Warn,
            format!("the store's held_waiters is `{stored}`, not a number from 2 to 1000: waiters use {held}"),
            "set it with `fence init --held-waiters N` (2–1000; 8 is the default)",
        );
    }
    let per_resource = per_busy_resource(held);
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
    if per_resource >= slots {
        // No CONNECTION LIMIT below the server's slots fits one busy resource.
        let fits = (slots / 2 - 2).max(2);
        f.add(
            check,
            Severity::Warn,
            format!("the store lets {held} waiters of a resource keep their connection (held_waiters): one busy resource can use {per_resource} connections, not fewer than {server}"),
            &format!("lower it with `fence init --held-waiters {fits}` (two busy resources then fit), or raise max_connections"),
        );
        return;
    }
    let spare = (slots - (slots / 10).max(per_resource)).max(per_resource);
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
            format!("role `{role}` {what}: its waiters (up to {held} connections per busy resource, plus short polls) and holders may take every slot, and then no one, holders of other roles included, can connect to renew a lease until slots free up"),
            &bounded,
        );
    } else if limit < per_resource {
        f.add(
            check,
            Severity::Warn,
            format!("role `{role}` has CONNECTION LIMIT {limit}, below the {per_resource} connections one busy resource can use (its holder, up to {held} waiters at the head of its queue — the store's `held_waiters` —, one for the others' polls and `inspect`): waiters keep retrying 'too many connections' and hand-overs slow down"),
            &format!("`ALTER ROLE {role_sql} CONNECTION LIMIT {}` (at least {per_resource} per resource busy at once), keeping the limits of all roles below {slots}", per_resource.max(limit)),
        );
    } else {
        f.add(
            check,
            Severity::Ok,
            format!("role `{role}` may open {limit} of {server}: enough for {} busy resources at once; {in_use} in use now", limit / per_resource),
            "",
        );
    }
    if (0..per_resource).contains(&db_limit) {
        f.add(
            check,
            Severity::Warn,
            format!("the database has CONNECTION LIMIT {db_limit}, below the {per_resource} connections one busy resource can use"),
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
