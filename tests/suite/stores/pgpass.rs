//! Passwords kept out of crontabs and URLs (issue 16, item 6), against the password-protected
//! test PostgreSQL: `~/.pgpass` (used only when nobody else can read it, as libpq),
//! `PGPASSFILE`, `PGSERVICE` with a service file; and `--format env` with a password in the URL
//! exports a FENCE_STORE that later commands use to reach the same PostgreSQL lease, or fail
//! there loudly, never on another store.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{env_or_panic, Store};

/// The test database's URL without a password.
fn bare_url() -> String {
    format!(
        "postgres://{}@{}:{}/{}?sslmode=disable",
        env_or_panic("FENCE_TEST_PG_USER"),
        env_or_panic("FENCE_TEST_PG_HOST"),
        env_or_panic("FENCE_TEST_PG_PORT"),
        env_or_panic("FENCE_TEST_PG_DB")
    )
}

fn pgpass_line() -> String {
    format!(
        "# host:port:db:user:password\n{}:{}:*:{}:{}\n",
        env_or_panic("FENCE_TEST_PG_HOST"),
        env_or_panic("FENCE_TEST_PG_PORT"),
        env_or_panic("FENCE_TEST_PG_USER"),
        env_or_panic("FENCE_TEST_PG_PASSWORD")
    )
}

fn write_file(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_private_pgpass_file_gives_the_password_and_a_readable_one_is_ignored() {
    let store = Store::postgres();
    let pgpass = store.home.path().join(".pgpass");
    write_file(&pgpass, &pgpass_line(), 0o600);
    store
        .fence_at(&bare_url())
        .args(["acquire", "job", "--owner", "cron"])
        .run()
        .expect(0);
    assert_eq!(store.lease("job").map(|l| l.0), Some("cron".to_owned()));

    std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = store
        .fence_at(&bare_url())
        .args(["release", "job", "--owner", "cron", "--token", "1"])
        .run()
        .expect(2);
    assert_eq!(
        out.stderr.matches("group or world access").count(),
        1,
        "said once, however many connections looked it up: {out:?}"
    );
    assert!(out.stderr.contains("asks for a password"), "{out:?}");
    assert!(
        store.lease("job").unwrap().2,
        "still held: nothing was done"
    );
}

#[test]
fn pgpassfile_names_the_password_file() {
    let store = Store::postgres();
    let elsewhere = store.home.path().join("secrets");
    write_file(&elsewhere, &pgpass_line(), 0o600);
    store
        .fence_at(&bare_url())
        .env("PGPASSFILE", &elsewhere)
        .args(["acquire", "job", "--owner", "cron"])
        .run()
        .expect(0);
    assert_eq!(store.lease("job").map(|l| l.1), Some(1));
}

#[test]
fn pgservice_fills_in_the_whole_connection() {
    let store = Store::postgres();
    let file = store.home.path().join("services.conf");
    write_file(
        &file,
        &format!(
            "[other]\nhost=nowhere.invalid\n\n[ops]\nhost={}\nport={}\ndbname={}\nuser={}\npassword={}\nsslmode=disable\n",
            env_or_panic("FENCE_TEST_PG_HOST"),
            env_or_panic("FENCE_TEST_PG_PORT"),
            env_or_panic("FENCE_TEST_PG_DB"),
            env_or_panic("FENCE_TEST_PG_USER"),
            env_or_panic("FENCE_TEST_PG_PASSWORD")
        ),
        0o600,
    );
    store
        .fence_at("postgres://")
        .env("PGSERVICEFILE", &file)
        .env("PGSERVICE", "ops")
        .args(["acquire", "job", "--owner", "cron"])
        .run()
        .expect(0);
    store
        .fence_at("postgres://?service=ops")
        .env("PGSERVICEFILE", &file)
        .args(["release", "job", "--owner", "cron", "--token", "1"])
        .run()
        .expect(0);
    assert_eq!(store.lease("job").map(|l| l.2), Some(false));
    let out = store
        .fence_at("postgres://?service=nosuch")
        .env("PGSERVICEFILE", &file)
        .args(["inspect"])
        .run()
        .expect(2);
    assert!(
        out.stderr.contains("no PostgreSQL service `nosuch`"),
        "{out:?}"
    );
}

/// `eval "$(fence acquire … --format env)"` with the password in `--store`: the exported
/// FENCE_STORE has no password, says so, and the next commands act on the PostgreSQL lease
/// (password from .pgpass) or fail loudly for want of one — never on the default file store.
#[test]
fn format_env_with_a_password_in_the_url_keeps_later_commands_on_that_store() {
    let store = Store::postgres();
    let fence = common::fence_bin();
    let fence = fence.to_string_lossy();
    let script = format!(
        "set -e\neval \"$('{fence}' --store \"$URL\" --schema {schema} acquire job --ttl 1m --format env)\"\n\
         '{fence}' renew\n'{fence}' release\n",
        schema = store.schema.as_deref().unwrap()
    );
    let run = |with_pgpass: bool| {
        let pgpass = store.home.path().join(".pgpass");
        let _ = std::fs::remove_file(&pgpass);
        if with_pgpass {
            write_file(&pgpass, &pgpass_line(), 0o600);
        }
        Command::new("sh")
            .args(["-c", &script])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap())
            .env("HOME", store.home.path())
            .env("URL", format!("{}?sslmode=disable", store.url))
            .output()
            .unwrap()
    };
    let out = run(true);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("without its password"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&env_or_panic("FENCE_TEST_PG_PASSWORD")));
    assert_eq!(store.lease("job").map(|l| (l.1, l.2)), Some((1, false)));
    assert!(!store.home.path().join(".local/state/fence").exists());

    // Without a password file the renew fails on PostgreSQL, loudly; the lease stays held.
    let out = run(false);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("asks for a password"));
    assert_eq!(store.lease("job").map(|l| (l.1, l.2)), Some((2, true)));
    assert!(!store.home.path().join(".local/state/fence").exists());
}
