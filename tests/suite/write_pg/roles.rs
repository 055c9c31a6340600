//! The role model of issue 15 (items 3 and 4), against the real PostgreSQL: the README's
//! "Setting up roles" recipe is run as it stands, in a database of its own, by a superuser
//! admin; then a non-owner, non-superuser writer role is shown unable to change a protected
//! partitioned table through any partition (one attached after `protect` too) or an
//! inheritance child, unable to write without fence's grant, and unable to forge fence's
//! records. `protect` run by a non-superuser says what it cannot cover; views are refused.

use crate::common;

use std::path::Path;

use common::own_db::OwnDb;
use common::{pg_exec, pg_query, pg_try_exec, Out, Store};
use serde_json::Value;

/// A database of its own for one test (see `OwnDb`), with what these tests do in it.
struct Db(OwnDb);

/// Roles the README recipe creates: cluster-wide, so removed before and after.
const README_ROLES: [&str; 2] = ["app_writer", "app_reader"];

impl std::ops::Deref for Db {
    type Target = OwnDb;
    fn deref(&self) -> &OwnDb {
        &self.0
    }
}

impl Db {
    fn new(tag: &str) -> Db {
        Db(OwnDb::new("roles", tag))
    }

    /// `protect --table TABLE --resource nightly-report`, run by the admin.
    fn protect(&self, table: &str) -> Out {
        self.fence()
            .args(["protect", "--target", &self.admin_url(), "--table", table])
            .args(["--resource", "nightly-report", "--format", "json"])
            .run()
    }

    /// Every row of `table` as text, in a stable order (read by the admin).
    fn contents(&self, table: &str) -> Vec<String> {
        pg_query(
            &self.admin(),
            &format!("SELECT t::text FROM {table} t ORDER BY 1"),
        )
        .iter()
        .map(|r| r.get(0))
        .collect()
    }
}

/// Drops roles left by an earlier run (their databases are gone or about to go).
fn drop_roles(roles: &[&str]) {
    for role in roles {
        let _ = pg_try_exec(&OwnDb::server(), &format!("DROP ROLE IF EXISTS {role}"));
    }
}

fn readme_recipe() -> String {
    common::doc_sh_block("<!-- readme-roles-recipe -->")
}

/// Runs the recipe with bash (stopping at the first failure), `fence` on the PATH.
fn run_recipe(db: &Db, recipe: &str) -> Out {
    let bin = Path::new(env!("CARGO_BIN_EXE_fence")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = common::clean_command("bash", db.home.path())
        .args(["-euo", "pipefail", "-c", recipe])
        .env("PATH", path)
        .env(
            "FENCE_STORE",
            format!("file://{}/store", db.home.path().display()),
        )
        .env("ADMIN_URL", db.admin_url())
        .env("WRITER_URL", db.url("app_writer"))
        .env("READER_URL", db.url("app_reader"))
        .output()
        .unwrap();
    Out::from(output)
}

/// A token for `resource` from the test's file coordinator.
fn acquire(db: &Db, resource: &str) -> i64 {
    let lease = db.fence().acquire(resource, &[]);
    db.fence().release(&lease);
    lease.token
}

fn write(db: &Db, role: &str, token: i64, sql: &str) -> Out {
    db.fence()
        .args(["write", "nightly-report", "--token", &token.to_string()])
        .args(["--target", &db.url(role), "--sql", sql, "--format", "json"])
        .run()
}

#[test]
fn the_readme_role_recipe_fences_a_writer_on_every_partition_and_child() {
    drop_roles(&README_ROLES);
    let db = Db::new("readme");
    let out = run_recipe(&db, &readme_recipe());
    assert_eq!(out.code, 0, "the README's recipe failed: {out:?}");
    // (e) The writer's fenced write landed; the reader saw the guard and the tree.
    assert_eq!(db.contents("ledger"), ["(2026-12-04,42)"]);
    assert!(out.stdout.contains("created schema `fence` in"), "{out:?}");
    assert!(out.stdout.contains("committed with token 1"), "{out:?}");
    assert!(out.stdout.contains("public.ledger_2026"), "{out:?}");

    partitions_and_children_are_fenced(&db);
    no_write_without_the_grant(&db);
    no_forged_records(&db);
    views_are_refused(&db);
    drop(db);
    drop_roles(&README_ROLES);
    drop_roles(&["app_late"]);
}

/// (a) Partitions (one created and one attached after `protect`) and inheritance children
/// (one present at protect time, one added later) refuse every raw write by the writer,
/// which holds every table privilege on them: only the triggers stand in the way.
fn partitions_and_children_are_fenced(db: &Db) {
    pg_exec(
        &db.admin(),
        "CREATE TABLE ledger_2027 (LIKE ledger);
         ALTER TABLE ledger ATTACH PARTITION ledger_2027 FOR VALUES FROM ('2027-01-01') TO ('2028-01-01');
         CREATE TABLE ledger_2028 PARTITION OF ledger FOR VALUES FROM ('2028-01-01') TO ('2029-01-01');
         CREATE TABLE audit (note text);
         CREATE TABLE audit_old () INHERITS (audit);",
    );
    let out = db.protect("audit").expect(0);
    assert_eq!(
        out.json()["covered"],
        serde_json::json!(["public.audit", "public.audit_old"])
    );
    assert_eq!(out.json()["covers_later_partitions"], true);
    assert_eq!(out.json()["warnings"], serde_json::json!([]));
    pg_exec(
        &db.admin(),
        "CREATE TABLE audit_new () INHERITS (audit);
         GRANT ALL ON ledger, ledger_2026, ledger_2027, ledger_2028, audit, audit_old, audit_new TO app_writer;",
    );
    let token = acquire(db, "nightly-report");
    write(
        db,
        "app_writer",
        token,
        "INSERT INTO ledger VALUES ('2027-06-01', 1), ('2028-06-01', 2);
         INSERT INTO audit_old VALUES ('old'); INSERT INTO audit_new VALUES ('new')",
    )
    .expect(0);

    let tables = [
        "ledger",
        "ledger_2026",
        "ledger_2027",
        "ledger_2028",
        "audit",
        "audit_old",
        "audit_new",
    ];
    let before: Vec<Vec<String>> = tables.iter().map(|t| db.contents(t)).collect();
    let writer = db.raw("app_writer");
    for table in tables {
        let row = if table.starts_with("ledger") {
            "('2027-07-01', 9)"
        } else {
            "('raw')"
        };
        let set = if table.starts_with("ledger") {
            "amount = 0"
        } else {
            "note = 'raw'"
        };
        for sql in [
            format!("INSERT INTO {table} VALUES {row}"),
            format!("UPDATE {table} SET {set}"),
            format!("DELETE FROM {table}"),
            format!("TRUNCATE {table}"),
        ] {
            let err = pg_try_exec(&writer, &sql).expect_err(&sql);
            assert!(
                err.starts_with("LF001") && err.contains("nightly-report"),
                "{sql}: {err}"
            );
        }
    }
    let after: Vec<Vec<String>> = tables.iter().map(|t| db.contents(t)).collect();
    assert_eq!(after, before, "a refused raw write changed a table");
    assert_eq!(
        db.contents("ledger"),
        ["(2026-12-04,42)", "(2027-06-01,1)", "(2028-06-01,2)"]
    );

    // inspect --table, as the reader: every table protected, triggers enabled always.
    for (root, expected) in [("ledger", 4), ("audit", 3)] {
        let out = db
            .fence()
            .args([
                "inspect",
                "--target",
                &db.url("app_reader"),
                "--table",
                root,
            ])
            .args(["--format", "json"])
            .run()
            .expect(0);
        let v = out.json();
        let rows = v["tables"].as_array().unwrap();
        assert_eq!(rows.len(), expected, "{v}");
        for row in rows {
            assert_eq!(row["protected"], true, "{row}");
            assert_eq!(row["resource"], "nightly-report", "{row}");
            assert_eq!(row["enabled"], "always", "{row}");
        }
        assert_eq!(v["covers_later_partitions"], true);
    }
}

/// (b) A role with every privilege on the table but without fence's grant cannot bind a
/// token: `fence write` fails, clearly, and changes nothing; after `fence grant` it writes.
fn no_write_without_the_grant(db: &Db) {
    drop_roles(&["app_late"]);
    pg_exec(
        &db.admin(),
        "CREATE ROLE app_late LOGIN; GRANT SELECT, INSERT, UPDATE, DELETE ON ledger TO app_late;",
    );
    let before = db.contents("ledger");
    let token = acquire(db, "nightly-report");
    let sql = "INSERT INTO ledger VALUES ('2026-06-01', 7)";
    let out = write(db, "app_late", token, sql).expect(2);
    let v = out.json();
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("permission denied for schema fence"),
        "{v}"
    );
    assert!(v["hint"].as_str().unwrap().contains("fence grant"), "{v}");
    assert_eq!(db.contents("ledger"), before);
    // Calling begin_write by hand is refused as well.
    let err = pg_try_exec(
        &db.raw("app_late"),
        &format!("BEGIN; SELECT fence.begin_write('nightly-report', {token}, 'x'); {sql}; COMMIT;"),
    )
    .unwrap_err();
    assert!(err.starts_with("42501"), "{err}");

    // --print changes nothing; the SQL it prints, run by the admin, is the grant.
    let printed = db
        .fence()
        .args([
            "grant",
            "--target",
            &db.admin_url(),
            "--role",
            "app_late",
            "--print",
        ])
        .run()
        .expect(0)
        .stdout;
    assert!(
        printed.contains("GRANT USAGE ON SCHEMA fence TO app_late;"),
        "{printed}"
    );
    write(db, "app_late", token, sql).expect(2);
    pg_exec(&db.admin(), &printed);
    write(db, "app_late", token, sql).expect(0);
    assert!(db.contents("ledger").contains(&"(2026-06-01,7)".to_owned()));
    pg_exec(&db.admin(), "DROP OWNED BY app_late; DROP ROLE app_late;");
}

/// (c) The writer cannot forge fence's records; nothing of fence's is PUBLIC's; a granted
/// role's privileges on fence's schema include no write, no ownership, no TRIGGER.
fn no_forged_records(db: &Db) {
    let writer = db.raw("app_writer");
    let events = || db.contents("fence.write_events").len();
    let (events_before, guards_before) = (events(), db.contents("fence.guards"));
    for sql in [
        "INSERT INTO fence.write_events (resource, kind, token) VALUES ('nightly-report', 'write_accepted', 99)",
        "INSERT INTO fence.bindings VALUES (txid_current(), 'nightly-report', 99)",
        "INSERT INTO fence.guards VALUES ('other', 1, now())",
        "UPDATE fence.guards SET highest_token = 99",
        "DELETE FROM fence.write_events",
        "TRUNCATE fence.guards",
    ] {
        let err = pg_try_exec(&writer, sql).expect_err(sql);
        assert!(err.starts_with("42501"), "{sql}: {err}");
    }
    // The reader cannot even call note_rejected.
    let err = pg_try_exec(
        &db.raw("app_reader"),
        "SELECT fence.note_rejected('nightly-report', 1, 'x', 'forged')",
    )
    .unwrap_err();
    assert!(err.starts_with("42501"), "{err}");
    // The writer may call it, but it records only a token below the highest accepted.
    let highest: i64 = pg_query(
        &db.admin(),
        "SELECT highest_token FROM fence.guards WHERE resource = 'nightly-report'",
    )[0]
    .get(0);
    pg_exec(
        &writer,
        &format!("SELECT fence.note_rejected('nightly-report', {highest}, 'x', 'forged')"),
    );
    assert_eq!(
        events(),
        events_before,
        "a current token was recorded as rejected"
    );
    assert_eq!(db.contents("fence.guards"), guards_before);

    let public: Vec<String> = pg_query(
        &db.admin(),
        "SELECT p.proname::text FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a \
         WHERE p.pronamespace = 'fence'::regnamespace AND a.grantee = 0 \
         UNION ALL SELECT c.relname::text FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a \
         WHERE c.relnamespace = 'fence'::regnamespace AND a.grantee = 0",
    )
    .iter()
    .map(|r| r.get(0))
    .collect();
    assert!(public.is_empty(), "granted to PUBLIC: {public:?}");
    for role in README_ROLES {
        let rows = pg_query(
            &db.admin(),
            &format!(
                "SELECT c.relname::text FROM pg_class c WHERE c.relnamespace = 'fence'::regnamespace AND c.relkind = 'r' \
                 AND (has_table_privilege('{role}', c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE, TRIGGER, REFERENCES') \
                      OR pg_has_role('{role}', c.relowner, 'MEMBER')) \
                 UNION ALL SELECT 'schema' FROM pg_namespace n WHERE n.nspname = 'fence' \
                 AND (has_schema_privilege('{role}', n.oid, 'CREATE') OR pg_has_role('{role}', n.nspowner, 'MEMBER'))"
            ),
        );
        let found: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        assert!(
            found.is_empty(),
            "{role} may defeat protect through {found:?}"
        );
    }
}

/// (d) A view cannot be protected: exit 2, nothing installed. Nor can a foreign table below a
/// protected one: `protect` refuses it (exit 2), and adding one later fails.
fn views_are_refused(db: &Db) {
    pg_exec(
        &db.admin(),
        &format!(
            "CREATE EXTENSION postgres_fdw;
             CREATE SERVER loopback FOREIGN DATA WRAPPER postgres_fdw OPTIONS (dbname '{}');
             CREATE TABLE remote_2030 (LIKE ledger);
             CREATE TABLE other (day date, amount numeric) PARTITION BY RANGE (day);
             CREATE FOREIGN TABLE other_2030 PARTITION OF other FOR VALUES FROM ('2030-01-01') TO ('2031-01-01')
               SERVER loopback OPTIONS (table_name 'remote_2030');",
            db.name
        ),
    );
    let out = db.protect("other").expect(2);
    assert!(
        out.json()["message"]
            .as_str()
            .unwrap()
            .contains("other_2030 is a foreign table"),
        "{out:?}"
    );
    let err = pg_try_exec(
        &db.admin(),
        "CREATE TABLE remote_audit (note text);
         CREATE FOREIGN TABLE audit_remote () INHERITS (audit) SERVER loopback OPTIONS (table_name 'remote_audit')",
    )
    .unwrap_err();
    assert!(err.starts_with("LF021"), "{err}");
    assert!(
        pg_query(&db.admin(), "SELECT to_regclass('audit_remote')::text")[0]
            .get::<_, Option<String>>(0)
            .is_none()
    );

    pg_exec(
        &db.admin(),
        "CREATE VIEW ledger_view AS SELECT * FROM ledger",
    );
    let out = db.protect("ledger_view").expect(2);
    assert!(
        out.json()["message"]
            .as_str()
            .unwrap()
            .contains("is a view"),
        "{out:?}"
    );
    let triggers = pg_query(
        &db.admin(),
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'ledger_view'::regclass",
    );
    assert_eq!(triggers[0].get::<_, i64>(0), 0);
}

/// Run by a role that is not a superuser, `protect` covers what exists, says that later
/// partitions are not covered, and covers them when run again; `inspect --table` shows the
/// gap in between. `--remove` clears the whole tree.
#[test]
fn protect_without_a_superuser_warns_and_covers_partitions_when_run_again() {
    let store = Store::postgres();
    let s = store.schema.clone().unwrap();
    let t = format!("{s}.pt");
    pg_exec(
        &store.url,
        &format!(
            "CREATE SCHEMA {s}; CREATE TABLE {t} (id int, v text) PARTITION BY RANGE (id);
             CREATE TABLE {s}.pt_1 PARTITION OF {t} FOR VALUES FROM (0) TO (10) PARTITION BY RANGE (id);
             CREATE TABLE {s}.pt_1a PARTITION OF {s}.pt_1 FOR VALUES FROM (0) TO (5);"
        ),
    );
    let protect_table = |table: &str, extra: &[&str]| {
        store
            .fence()
            .args(["protect", "--target", &store.url, "--table", table])
            .args(["--format", "json"])
            .args(extra)
            .run()
    };
    let protect = |extra: &[&str]| protect_table(&t, extra).expect(0).json();
    let v = protect(&["--resource", "r"]);
    let names = |v: &Value| -> Vec<String> {
        v["covered"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names(&v),
        [t.clone(), format!("{s}.pt_1"), format!("{s}.pt_1a")]
    );
    assert_eq!(v["covers_later_partitions"], false);
    assert!(
        v["warnings"][0].as_str().unwrap().contains("added to"),
        "{v}"
    );
    pg_exec(
        &store.url,
        &format!("CREATE TABLE {s}.pt_2 PARTITION OF {t} FOR VALUES FROM (10) TO (20)"),
    );
    let inspect = || {
        store
            .fence()
            .args([
                "inspect", "--target", &store.url, "--table", &t, "--format", "json",
            ])
            .run()
            .expect(0)
            .json()
    };
    let v = inspect();
    let late = v["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["table"] == format!("{s}.pt_2"))
        .unwrap()
        .clone();
    assert_eq!(late["protected"], false, "{v}");
    assert_eq!(late["parent"], t.as_str());
    // Unprotected for now: a raw write lands, as inspect said.
    pg_exec(
        &store.url,
        &format!("INSERT INTO {s}.pt_2 VALUES (11, 'open')"),
    );

    let v = protect(&["--resource", "r"]);
    assert!(names(&v).contains(&format!("{s}.pt_2")), "{v}");
    let err = pg_try_exec(&store.url, &format!("DELETE FROM {s}.pt_2")).unwrap_err();
    assert!(err.starts_with("LF001"), "{err}");
    assert!(inspect()["tables"]
        .as_array()
        .unwrap()
        .iter()
        .all(|row| row["protected"] == true));

    // Not from a partition alone: that would open a hole in the tree's protection.
    let out = protect_table(&format!("{s}.pt_1"), &["--remove"]).expect(2);
    assert!(out.json()["hint"].as_str().unwrap().contains(&t), "{out:?}");
    let v = protect(&["--remove"]);
    assert_eq!(names(&v).len(), 4);
    pg_exec(&store.url, &format!("DELETE FROM {s}.pt_2"));
    assert!(inspect()["tables"]
        .as_array()
        .unwrap()
        .iter()
        .all(|row| row["protected"] == false && row["resource"].is_null()));
}

/// A writer whose target has no fence schema, and who may not create one, is told to have
/// the admin run `fence init --target` — never to be granted writes on fence's tables.
#[test]
fn a_writer_without_the_schema_is_sent_to_the_admin() {
    drop_roles(&["roles_nocreate"]);
    let db = Db::new("noschema");
    pg_exec(
        &db.admin(),
        "CREATE ROLE roles_nocreate LOGIN; CREATE TABLE t (v int); GRANT ALL ON t TO roles_nocreate;",
    );
    let out = write(&db, "roles_nocreate", 1, "INSERT INTO t VALUES (1)").expect(2);
    let v = out.json();
    let hint = v["hint"].as_str().unwrap();
    assert!(hint.contains("fence init --target"), "{v}");
    assert!(!hint.to_lowercase().contains("insert"), "{v}");
    assert!(db.contents("t").is_empty());
    let schema = pg_query(
        &db.admin(),
        "SELECT count(*) FROM pg_namespace WHERE nspname = 'fence'",
    );
    assert_eq!(schema[0].get::<_, i64>(0), 0);
    drop(db);
    drop_roles(&["roles_nocreate"]);
}

/// An application role that created fence's schema on its first write owns it: `protect`
/// warns about it, and `grant` refuses to treat that role as a fenced writer.
#[test]
fn an_application_role_owning_the_schema_is_flagged_and_refused() {
    drop_roles(&["roles_owner"]);
    let db = Db::new("owner");
    pg_exec(
        &db.admin(),
        &format!(
            "CREATE ROLE roles_owner LOGIN; GRANT CREATE ON DATABASE {} TO roles_owner;
             CREATE TABLE t (v int); GRANT ALL ON t TO roles_owner;",
            db.name
        ),
    );
    write(&db, "roles_owner", 1, "INSERT INTO t VALUES (1)").expect(0);
    let out = db.protect("t").expect(0);
    let warnings = out.json()["warnings"].to_string();
    assert!(
        warnings.contains("owned by roles_owner") && warnings.contains("bypass"),
        "{out:?}"
    );
    let out = db
        .fence()
        .args([
            "grant",
            "--target",
            &db.admin_url(),
            "--role",
            "roles_owner",
        ])
        .args(["--format", "json"])
        .run()
        .expect(2);
    assert!(
        out.json()["message"]
            .as_str()
            .unwrap()
            .contains("owns fence's schema fence"),
        "{out:?}"
    );
    // Nothing was granted: the role still owns the schema, and no statement ran.
    assert_eq!(out.json()["error"], "usage");
    drop(db);
    pg_exec(&OwnDb::server(), "DROP ROLE roles_owner");
}

/// Issue 33, 2 and 7, and what a reviewer found next: a writer that can write around
/// `protect` is refused by `grant` (exit 2, naming the way and the fix) and failed by `doctor
/// --target` connecting as it (`postgres.protection`, exit 2). The rule counts every role the
/// writer can become (inherited or not): owner of the database, of a protected table's schema,
/// of the table, or of what the table depends on (a column's type, a parent table); a member
/// of a superuser role or of a CREATEROLE role; TRIGGER on a protected table (it can replace
/// fence_protect); any write or TRIGGER privilege on fence's tables, a column's or through
/// pg_write_all_data. And whoever connects, the set-up fails when fence's triggers are not
/// ENABLE ALWAYS (a DISABLE/ENABLE TRIGGER ALL leaves them off under replication), when one is
/// disabled, replaced or missing, when a table below a protected one has none, or when a
/// protected table sits below an unprotected parent. An ordinary writer is granted (exit 0)
/// and doctor, connecting as it, finds nothing (exit 0).
#[test]
fn writers_that_can_write_around_protect_are_refused_and_failed() {
    let db = Db::new("bypass");
    let pid = crate::common::process_tag();
    let role = |what: &str| format!("bp_{what}_{pid}");
    let names = [
        "writer",
        "schema",
        "table",
        "db",
        "dba",
        "sneaky",
        "trig",
        "ftrig",
        "colins",
        "noinh",
        "rolemgr",
        "crmember",
        "typeowner",
        "parentowner",
        "dblinker",
        "fdwuser",
    ];
    let roles: Vec<String> = names.iter().map(|n| role(n)).collect();
    let r = |n: &str| role(n);
    let server = OwnDb::server();
    for name in &roles {
        pg_exec(&server, &format!("DROP ROLE IF EXISTS {name}"));
    }
    pg_exec(
        &server,
        &format!(
            "CREATE ROLE {writer} LOGIN; CREATE ROLE {schema} LOGIN; CREATE ROLE {table} LOGIN; \
             CREATE ROLE {db_owner} LOGIN; CREATE ROLE {dba} SUPERUSER NOLOGIN; \
             CREATE ROLE {sneaky} LOGIN NOINHERIT IN ROLE {dba}; CREATE ROLE {trig} LOGIN; \
             CREATE ROLE {ftrig} LOGIN; CREATE ROLE {colins} LOGIN; \
             CREATE ROLE {noinh} LOGIN NOINHERIT IN ROLE pg_write_all_data; \
             CREATE ROLE {rolemgr} NOLOGIN CREATEROLE; CREATE ROLE {crmember} LOGIN IN ROLE {rolemgr}; \
             CREATE ROLE {typeowner} LOGIN; CREATE ROLE {parentowner} LOGIN; \
             CREATE ROLE {dblinker} LOGIN; CREATE ROLE {fdwuser} LOGIN",
            writer = r("writer"),
            schema = r("schema"),
            table = r("table"),
            db_owner = r("db"),
            dba = r("dba"),
            sneaky = r("sneaky"),
            trig = r("trig"),
            ftrig = r("ftrig"),
            colins = r("colins"),
            noinh = r("noinh"),
            rolemgr = r("rolemgr"),
            crmember = r("crmember"),
            typeowner = r("typeowner"),
            parentowner = r("parentowner"),
            dblinker = r("dblinker"),
            fdwuser = r("fdwuser"),
        ),
    );
    db.fence()
        .args(["init", "--target", &db.admin_url()])
        .run()
        .expect(0);
    pg_exec(
        &db.admin(),
        "CREATE SCHEMA app; CREATE TABLE app.ledger (v text); \
         CREATE TABLE app.parts (y int, v text) PARTITION BY LIST (y); \
         CREATE TABLE app.parts_1 PARTITION OF app.parts FOR VALUES IN (1)",
    );
    db.protect("app.ledger").expect(0);
    db.protect("app.parts").expect(0);

    let grant = |role: &str| {
        db.fence()
            .args(["grant", "--target", &db.admin_url(), "--role", role])
            .args(["--format", "json"])
            .run()
    };
    let doctor = |role: &str| {
        let out = db
            .fence()
            .args(["doctor", "--target", &db.url(role), "--format", "json"])
            .run();
        let json = out.json();
        let found = common::doctor_findings(&json, "postgres.protection");
        (out.code, found, json)
    };
    let writer = r("writer");
    let fails = |role: &str, says: &str, fix: &str| {
        let (code, found, json) = doctor(role);
        assert_eq!(code, 2, "{role}: {json}");
        assert!(
            found
                .iter()
                .any(|(severity, message, hint)| severity == "fail"
                    && message.contains(says)
                    && hint.contains(fix)),
            "{role}: wanted a failure saying {says:?} with a fix saying {fix:?}: {found:?}"
        );
    };

    // Safe: the ordinary writer.
    grant(&writer).expect(0);
    let (code, found, json) = doctor(&writer);
    assert_eq!(code, 0, "{json}");
    assert_eq!(found.len(), 1, "{json}");
    assert_eq!(found[0].0, "ok", "{json}");

    // Roles with a way around.
    pg_exec(
        &db.admin(),
        &format!(
            "ALTER DATABASE {name} OWNER TO {db_owner}; \
             ALTER SCHEMA app OWNER TO {schema}; \
             CREATE SCHEMA app2; CREATE TABLE app2.owned (v text); \
             ALTER TABLE app2.owned OWNER TO {table}; \
             GRANT TRIGGER ON app2.owned, app.ledger TO {trig}; \
             GRANT TRIGGER ON fence.write_events TO {ftrig}; \
             GRANT INSERT (txid, resource, token) ON fence.bindings TO {colins}; \
             CREATE SCHEMA wtypes AUTHORIZATION {typeowner}; \
             SET ROLE {typeowner}; CREATE TYPE wtypes.status AS ENUM ('open', 'paid'); RESET ROLE; \
             CREATE TABLE app2.typed (id int, s wtypes.status); \
             CREATE TABLE app2.base (v text); ALTER TABLE app2.base OWNER TO {parentowner}; \
             CREATE TABLE app2.child () INHERITS (app2.base); \
             CREATE SCHEMA dbl; CREATE EXTENSION dblink SCHEMA dbl; GRANT USAGE ON SCHEMA dbl TO {dblinker}; \
             CREATE EXTENSION postgres_fdw; CREATE SERVER elsewhere FOREIGN DATA WRAPPER postgres_fdw; \
             GRANT USAGE ON FOREIGN SERVER elsewhere TO {fdwuser}",
            name = db.name,
            dblinker = r("dblinker"),
            fdwuser = r("fdwuser"),
            db_owner = r("db"),
            schema = r("schema"),
            table = r("table"),
            trig = r("trig"),
            ftrig = r("ftrig"),
            colins = r("colins"),
            typeowner = r("typeowner"),
            parentowner = r("parentowner"),
        ),
    );
    db.protect("app2.owned").expect(0);
    db.protect("app2.typed").expect(0);
    db.protect("app2.child").expect(0);
    for (who, says, fix) in [
        (
            "schema",
            "owns the schema app,".to_owned(),
            "ALTER SCHEMA app OWNER TO",
        ),
        (
            "table",
            "owns the protected table app2.owned".to_owned(),
            "ALTER TABLE app2.owned OWNER TO",
        ),
        (
            "db",
            format!("owns the database `{}`", db.name),
            "ALTER DATABASE",
        ),
        (
            "sneaky",
            format!("member of the superuser role `{}`", r("dba")),
            "REVOKE",
        ),
        (
            "trig",
            "may create triggers on the protected table app.ledger".to_owned(),
            "REVOKE TRIGGER ON app.ledger",
        ),
        (
            "ftrig",
            "fence's table fence.write_events".to_owned(),
            "REVOKE ALL ON fence.write_events",
        ),
        (
            "colins",
            "fence's table fence.bindings".to_owned(),
            "REVOKE ALL ON fence.bindings",
        ),
        (
            "noinh",
            "through its membership in `pg_write_all_data`".to_owned(),
            "REVOKE",
        ),
        (
            "crmember",
            format!("member of `{}`, which has CREATEROLE", r("rolemgr")),
            "REVOKE",
        ),
        (
            "typeowner",
            "type wtypes.status (of app2.typed)".to_owned(),
            "OWNER TO",
        ),
        (
            "parentowner",
            "table app2.base (of app2.child)".to_owned(),
            "OWNER TO",
        ),
        // dblink (its schema usable: the ordinary writer, without USAGE on it, stays fine)
        // and a foreign server: connections of their own, whatever the SQL's spelling.
        (
            "dblinker",
            "dbl.dblink_exec(text,text)".to_owned(),
            "REVOKE EXECUTE ON FUNCTION dbl.dblink",
        ),
        (
            "fdwuser",
            "may use the foreign server elsewhere".to_owned(),
            "REVOKE USAGE ON FOREIGN SERVER elsewhere",
        ),
    ] {
        let bypasser = r(who);
        let out = grant(&bypasser).expect(2);
        let json = out.json();
        let message = json["message"].as_str().unwrap().to_owned();
        let hint = json["hint"].as_str().unwrap().to_owned();
        assert!(
            message.contains(&says) && hint.contains(fix),
            "{bypasser}: {message} / {hint}"
        );
        // Nothing was granted.
        let usage: bool = pg_query(
            &db.admin(),
            &format!("SELECT has_schema_privilege('{bypasser}', 'fence', 'USAGE')"),
        )[0]
        .get(0);
        assert!(!usage, "{bypasser} was granted");
        fails(&bypasser, &says, fix);
    }
    // A reader gets nothing to write with: granted whatever it owns.
    db.fence()
        .args([
            "grant",
            "--target",
            &db.admin_url(),
            "--role",
            &r("table"),
            "--reader",
        ])
        .run()
        .expect(0);
    // A protected child below an unprotected parent fails for everyone.
    fails(
        &writer,
        "the parent app2.base (above app2.child) is not protected",
        "fence protect --table PARENT",
    );
    pg_exec(&db.admin(), "DROP TABLE app2.base CASCADE");

    // The set-up switched off, one way at a time; each fails for the ordinary writer, and
    // `fence protect` again mends it.
    let event_trigger: String = pg_query(
        &db.admin(),
        "SELECT quote_ident(evtname) FROM pg_event_trigger WHERE evtname LIKE 'fence%'",
    )[0]
    .get(0);
    for (breaks, says, table) in [
        (
            "ALTER TABLE app.ledger DISABLE TRIGGER ALL; ALTER TABLE app.ledger ENABLE TRIGGER ALL"
                .to_owned(),
            "fence_protect on app.ledger is not ENABLE ALWAYS".to_owned(),
            "app.ledger",
        ),
        (
            "ALTER TABLE app.ledger DISABLE TRIGGER fence_protect_truncate".to_owned(),
            "fence_protect_truncate on app.ledger is not ENABLE ALWAYS".to_owned(),
            "app.ledger",
        ),
        (
            "CREATE OR REPLACE TRIGGER fence_protect BEFORE UPDATE ON app.ledger FOR EACH ROW \
             EXECUTE FUNCTION suppress_redundant_updates_trigger()"
                .to_owned(),
            "fence_protect on app.ledger does not call fence's protect_check".to_owned(),
            "app.ledger",
        ),
        (
            format!(
                "ALTER EVENT TRIGGER {event_trigger} DISABLE; \
                 CREATE TABLE app.parts_2 PARTITION OF app.parts FOR VALUES IN (2); \
                 ALTER EVENT TRIGGER {event_trigger} ENABLE ALWAYS"
            ),
            "app.parts_2 is below a protected table but has no fence triggers".to_owned(),
            "app.parts",
        ),
        (
            format!("ALTER EVENT TRIGGER {event_trigger} ENABLE"),
            format!("the event trigger {event_trigger}"),
            "app.parts",
        ),
    ] {
        pg_exec(&db.admin(), &breaks);
        fails(&writer, &says, "");
        db.protect(table).expect(0);
        if says.starts_with("the event trigger") {
            pg_exec(
                &db.admin(),
                &format!("ALTER EVENT TRIGGER {event_trigger} ENABLE ALWAYS"),
            );
        }
        let (code, found, json) = doctor(&writer);
        assert!(
            found
                .iter()
                .all(|(severity, message, _)| severity != "fail" || !message.contains(&says)),
            "`fence protect --table {table}` did not mend it: {json}"
        );
        let _ = code;
    }
    drop(db);
    for name in &roles {
        let _ = pg_try_exec(&server, &format!("DROP ROLE IF EXISTS {name}"));
    }
}

/// Issue 33, 4: the write path's version check is a call of `check_write` (granted with the
/// write path), not a `DO` block: in a database that revoked USAGE on plpgsql from PUBLIC, a
/// granted writer still writes, in both forms (before, every write failed with exit 2 and a
/// hint that wrongly named `fence grant`).
#[test]
fn a_writer_without_plpgsql_usage_still_writes() {
    let db = Db::new("noplpgsql");
    let role = format!("np_writer_{}", crate::common::process_tag());
    let server = OwnDb::server();
    pg_exec(&server, &format!("DROP ROLE IF EXISTS {role}"));
    pg_exec(&server, &format!("CREATE ROLE {role} LOGIN"));
    db.fence()
        .args(["init", "--target", &db.admin_url()])
        .run()
        .expect(0);
    pg_exec(
        &db.admin(),
        &format!(
            "REVOKE USAGE ON LANGUAGE plpgsql FROM PUBLIC; \
             CREATE TABLE ledger (v text); \
             CREATE TABLE accounts (id int PRIMARY KEY, v text, last_fencing_token bigint); \
             INSERT INTO accounts VALUES (1, 'start', 0); \
             GRANT SELECT, INSERT, UPDATE ON ledger, accounts TO {role}"
        ),
    );
    db.protect("ledger").expect(0);
    db.fence()
        .args(["grant", "--target", &db.admin_url(), "--role", &role])
        .run()
        .expect(0);
    // The premise: the writer cannot run a DO block here.
    let err = pg_try_exec(&db.raw(&role), "DO $$ BEGIN END $$").unwrap_err();
    assert!(err.starts_with("42501"), "{err}");
    write(&db, &role, 1, "INSERT INTO ledger VALUES ('fenced')").expect(0);
    db.fence()
        .args(["write", "nightly-report", "--token", "1"])
        .args(["--target", &db.url(&role), "--format", "json"])
        .args(["--table", "accounts", "--key", "id=1", "--set", "v=row"])
        .run()
        .expect(0);
    assert_eq!(db.contents("ledger"), ["(fenced)"]);
    assert_eq!(db.contents("accounts"), ["(1,row,1)"]);
    drop(db);
    pg_exec(&server, &format!("DROP ROLE IF EXISTS {role}"));
}
