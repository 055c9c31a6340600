//! A private PostgreSQL cluster of a test's own, for tests that restart the server
//! (`pg_ctl restart -m immediate`): initdb into a temp dir, unix socket only, run as
//! `postgres` when the tests run as root (initdb refuses root).

use std::path::Path;
use std::process::Command;

pub struct Cluster {
    pub dir: tempfile::TempDir,
    as_root: bool,
}

fn pg_bin(tool: &str) -> String {
    format!("/usr/lib/postgresql/15/bin/{tool}")
}

impl Cluster {
    /// Runs a server tool as the server's user (`postgres` when we are root: initdb refuses root).
    pub fn command(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = if self.as_root {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--", args[0]]);
            cmd
        } else {
            Command::new(args[0])
        };
        cmd.args(&args[1..])
            .current_dir(self.dir.path())
            .output()
            .expect("run a PostgreSQL tool")
    }

    pub fn run(&self, args: &[&str]) {
        let out = self.command(args);
        assert!(
            out.status.success(),
            "{args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn start() -> Cluster {
        Cluster::start_with("")
    }

    /// A cluster with `conf` appended to its `postgresql.conf` (settings a test relies on).
    pub fn start_with(conf: &str) -> Cluster {
        let as_root = is_root();
        let dir = tempfile::tempdir().unwrap();
        if as_root {
            let out = Command::new("chown")
                .args(["-R", "postgres", &dir.path().display().to_string()])
                .output()
                .unwrap();
            assert!(out.status.success());
        }
        let cluster = Cluster { dir, as_root };
        let data = cluster.data();
        cluster.run(&[
            &pg_bin("initdb"),
            "-D",
            &data,
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
        ]);
        let conf = format!(
            "listen_addresses = ''\nunix_socket_directories = '{}'\nsynchronous_commit = off\nfsync = on\n{conf}",
            cluster.dir.path().display()
        );
        let conf_path = Path::new(&data).join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path).unwrap();
        text.push_str(&conf);
        std::fs::write(&conf_path, text).unwrap();
        cluster.pg_ctl("start");
        cluster
    }

    /// A streaming standby of this cluster (`pg_basebackup -R`), asynchronous as by default,
    /// named `name` in the primary's `pg_stat_replication`, started on a socket of its own.
    pub fn standby(&self, name: &str) -> Cluster {
        let as_root = self.as_root;
        let dir = tempfile::tempdir().unwrap();
        if as_root {
            let out = Command::new("chown")
                .args(["-R", "postgres", &dir.path().display().to_string()])
                .output()
                .unwrap();
            assert!(out.status.success());
        }
        let standby = Cluster { dir, as_root };
        let data = standby.data();
        let primary = self.dir.path().display().to_string();
        self.run(&[
            &pg_bin("pg_basebackup"),
            "-D",
            &data,
            "-R",
            "-h",
            &primary,
            "-U",
            "postgres",
            "-X",
            "stream",
        ]);
        let conf = format!(
            "unix_socket_directories = '{}'\ncluster_name = '{name}'\n",
            standby.dir.path().display()
        );
        let conf_path = Path::new(&data).join("postgresql.auto.conf");
        let mut text = std::fs::read_to_string(&conf_path).unwrap_or_default();
        text.push_str(&conf);
        std::fs::write(&conf_path, text).unwrap();
        standby.pg_ctl("start");
        standby
    }

    pub fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    pub fn pg_ctl(&self, action: &str) {
        let log = self.dir.path().join("log").display().to_string();
        let data = self.data();
        let mut args = vec![
            pg_bin("pg_ctl"),
            "-D".into(),
            data,
            "-w".into(),
            "-l".into(),
            log,
        ];
        if action == "restart" {
            args.extend(["-m".into(), "immediate".into()]);
        }
        args.push(action.into());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run(&args);
    }

    pub fn url(&self) -> String {
        format!(
            "postgres:///postgres?host={}&user=postgres",
            self.dir.path().display()
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.data();
        self.command(&[&pg_bin("pg_ctl"), "-D", &data, "-m", "immediate", "stop"]);
    }
}

fn is_root() -> bool {
    let out = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}
