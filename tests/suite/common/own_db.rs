//! A database of one test's own on the test server, its superuser (the admin) on the unix
//! socket and a directory coordinator in the test's home: event triggers, foreign servers
//! and dblink are per database, so nothing another test leaves changes what `grant`,
//! `protect` or `doctor` decide there. Dropped with the test (kept when it failed).

use super::{env_or_panic, pg_exec, pg_try_exec, Fence};

pub struct OwnDb {
    pub name: String,
    pub home: tempfile::TempDir,
}

impl OwnDb {
    /// `<prefix>_<tag>_<process tag>`, created afresh.
    pub fn new(prefix: &str, tag: &str) -> OwnDb {
        let name = format!("{prefix}_{tag}_{}", super::process_tag());
        pg_exec(
            &OwnDb::server(),
            &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        );
        pg_exec(&OwnDb::server(), &format!("CREATE DATABASE {name}"));
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join("store")).unwrap();
        OwnDb { name, home }
    }

    fn conninfo(db: &str, user: &str) -> String {
        format!(
            "host={} port={} user={user} dbname={db}",
            env_or_panic("FENCE_TEST_PG_SOCKET_DIR"),
            env_or_panic("FENCE_TEST_PG_PORT")
        )
    }

    /// The superuser on the `postgres` database, for creating and dropping databases and roles.
    pub fn server() -> String {
        OwnDb::conninfo("postgres", &env_or_panic("FENCE_TEST_PG_SUPER_USER"))
    }

    /// A raw client's connection string for `role`.
    pub fn raw(&self, role: &str) -> String {
        OwnDb::conninfo(&self.name, role)
    }

    pub fn admin(&self) -> String {
        self.raw(&env_or_panic("FENCE_TEST_PG_SUPER_USER"))
    }

    /// The URL fence is given for `role` (unix socket, trust).
    pub fn url(&self, role: &str) -> String {
        format!(
            "postgres:///{}?host={}&port={}&user={role}",
            self.name,
            env_or_panic("FENCE_TEST_PG_SOCKET_DIR"),
            env_or_panic("FENCE_TEST_PG_PORT")
        )
    }

    pub fn admin_url(&self) -> String {
        self.url(&env_or_panic("FENCE_TEST_PG_SUPER_USER"))
    }

    /// `fence` with the directory coordinator in this test's home.
    pub fn fence(&self) -> Fence {
        let store = format!("file://{}/store", self.home.path().display());
        Fence::bare(self.home.path()).env("FENCE_STORE", store)
    }
}

impl Drop for OwnDb {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = pg_try_exec(
                &OwnDb::server(),
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            );
        }
    }
}
