//! Issue 34: errors are classified by what they are, never by the words a dependency or the
//! server happens to use. Here: the schema version another fence installed is read from the
//! schema, not from the server's message, which PostgreSQL translates under another
//! `lc_messages`.

use crate::common;

use common::{env_or_panic, pg_exec, pg_try_exec, Store};

/// A database of its own (dropped at the end), owned by the suite's login role, whose casts
/// of text to integer fail with the message a server under `lc_messages = 'de_DE.UTF-8'`
/// sends: `ungültige Eingabesyntax für Typ integer: »…«`, with German quotes. The test
/// cluster is made with `initdb --no-locale` on machines that mostly have no other locale
/// than C, so `SET lc_messages` cannot get the translation itself: a cast of our own raises
/// it (same SQLSTATE, 22P02), in this database only.
struct GermanDatabase {
    name: String,
    /// A superuser's connection string for this database.
    superuser: String,
    /// A URL of the suite's login role for this database.
    url: String,
}

impl GermanDatabase {
    fn new(tag: &str) -> GermanDatabase {
        let name = format!("{tag}_{}", crate::common::process_tag());
        let base = env_or_panic("FENCE_TEST_PG_URL");
        let (head, _db) = base.rsplit_once('/').expect("a database in the URL");
        let owner = head
            .strip_prefix("postgres://")
            .and_then(|rest| rest.split(['@', ':']).next())
            .expect("a user in the URL");
        let server = |db: &str| {
            format!(
                "host={} port={} user={} dbname={db}",
                env_or_panic("FENCE_TEST_PG_SOCKET_DIR"),
                env_or_panic("FENCE_TEST_PG_PORT"),
                env_or_panic("FENCE_TEST_PG_SUPER_USER"),
            )
        };
        let admin = server(&env_or_panic("FENCE_TEST_PG_DB"));
        pg_exec(
            &admin,
            &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        );
        pg_exec(&admin, &format!("CREATE DATABASE {name} OWNER {owner}"));
        let german = GermanDatabase {
            superuser: server(&name),
            url: format!("{head}/{name}"),
            name,
        };
        pg_exec(
            &german.superuser,
            "CREATE FUNCTION public.german_int(t text) RETURNS integer
                 LANGUAGE plpgsql IMMUTABLE STRICT AS $f$
             BEGIN
                 RETURN int4in(textout(t));
             EXCEPTION WHEN invalid_text_representation THEN
                 RAISE EXCEPTION USING ERRCODE = 'invalid_text_representation',
                     MESSAGE = format('ungültige Eingabesyntax für Typ integer: »%s«', t);
             END $f$;
             CREATE CAST (text AS integer) WITH FUNCTION public.german_int(text);",
        );
        german
    }
}

impl Drop for GermanDatabase {
    fn drop(&mut self) {
        let _ = pg_try_exec(
            &self.superuser.replace(
                &format!("dbname={}", self.name),
                &format!("dbname={}", env_or_panic("FENCE_TEST_PG_DB")),
            ),
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

/// A coordinator schema at another version than this fence's, on a server whose messages are
/// German: a newer one is refused (exit 2, naming its version) with nothing written, an older
/// one migrated and used — as on an English server. The old classification read the version
/// out of the message's `"fence schema version N"` and, finding no such text, failed every
/// command with exit 1 (an unclassified database error) instead.
#[test]
fn a_coordinator_at_another_version_is_told_by_its_version_not_the_servers_words() {
    let german = GermanDatabase::new("fence_german");
    // The cast of fence's version check (`schema_is_current!`), of text as it is there.
    let err = pg_try_exec(
        &german.url,
        "SELECT ('fence schema version ' || coalesce('99'::text, '0'))::int",
    )
    .expect_err("the cast fails");
    assert_eq!(
        err, "22P02 ungültige Eingabesyntax für Typ integer: »fence schema version 99«",
        "the server does not answer as a German one would"
    );

    let mut store = Store::postgres();
    store.url = german.url.clone();
    common::fenced::coordinator_schema_versions_are_checked(&store);
}
