//! Shared test harness: run the real `fence` binary against a real store, isolated per test.
//!
//! Each [`Store`] is its own temp directory or its own PostgreSQL schema, and every `fence`
//! process starts from an empty environment (no `FENCE_*`, no `PG*`, a throwaway `HOME`), so
//! tests cannot see each other or the developer's settings. PostgreSQL tests need the server
//! that `tests/run` starts; they fail (they do not skip) when it is missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;
use tempfile::TempDir;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// This test process's part of the names it makes on the servers one `tests/run` shares
/// (schemas, roles, bucket prefixes): its pid and a stamp of its start. The pid alone is not
/// unique: a suite starts tens of thousands of processes and pids wrap at 32,768, and a GCS
/// prefix left by an earlier test of the same pid was once copied along with a test's own.
pub fn process_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let stamp = (nanos as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        format!("{}x{stamp:06x}", std::process::id())
    })
}

/// Which coordinator a test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    File,
    Postgres,
    /// PostgreSQL database whose default is `synchronous_commit = off`.
    PostgresAsync,
    /// moto, through `s3://bucket/prefix`.
    S3,
    /// LocalStack's S3, through `s3://bucket/prefix`: a second S3 implementation.
    LocalStack,
    /// fake-gcs-server, through `gs://bucket/prefix`.
    Gcs,
}

pub fn env_or_panic(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the suite through `tests/run`, which starts PostgreSQL")
    })
}

/// One isolated store.
pub struct Store {
    pub backend: Backend,
    /// The `--store` URL.
    pub url: String,
    /// The `--schema` (PostgreSQL only).
    pub schema: Option<String>,
    /// Temp dir: the file store's directory, and HOME for the processes.
    pub home: TempDir,
    /// The object server and this store's prefix in its bucket (S3 and GCS only).
    pub objects: Option<(objects::Server, String)>,
}

impl Store {
    pub fn new(backend: Backend) -> Store {
        let home = tempfile::tempdir().expect("temp dir");
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let unique = format!("t{}_{n}", process_tag());
        let objects = match backend {
            Backend::S3 => Some((objects::Server::new(objects::Service::S3), unique.clone())),
            Backend::LocalStack => Some((objects::Server::localstack(), unique.clone())),
            Backend::Gcs => Some((objects::Server::new(objects::Service::Gcs), unique.clone())),
            _ => None,
        };
        let (url, schema) = match backend {
            Backend::File => {
                // The store's directory exists, as it does once a store is in use: fence
                // announces a store it has to create (a typo in --store would make a new one).
                std::fs::create_dir(home.path().join("store")).expect("the store directory");
                (format!("file://{}/store", home.path().display()), None)
            }
            Backend::Postgres => (env_or_panic("FENCE_TEST_PG_URL"), Some(unique)),
            Backend::PostgresAsync => (env_or_panic("FENCE_TEST_PG_ASYNC_URL"), Some(unique)),
            Backend::S3 | Backend::LocalStack | Backend::Gcs => {
                let (server, prefix) = objects.as_ref().unwrap();
                (server.url(prefix), None)
            }
        };
        Store {
            backend,
            url,
            schema,
            home,
            objects,
        }
    }

    /// A store under a prefix of its own on `server`, an object server of the test's own
    /// (`common::gcs_server`).
    pub fn on_server(server: objects::Server) -> Store {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("t{}_{n}", process_tag());
        Store {
            backend: match server.service {
                objects::Service::S3 => Backend::S3,
                objects::Service::Gcs => Backend::Gcs,
            },
            url: server.url(&prefix),
            schema: None,
            home: tempfile::tempdir().expect("temp dir"),
            objects: Some((server, prefix)),
        }
    }

    pub fn file() -> Store {
        Store::new(Backend::File)
    }

    pub fn postgres() -> Store {
        Store::new(Backend::Postgres)
    }

    /// A `fence` command with a clean environment, pointed at this store.
    pub fn fence(&self) -> Fence {
        self.fence_at(&self.url)
    }

    /// A `fence` command like [`Store::fence`], but with `url` as the store (another path to
    /// the same database: a proxy, a pooler, a role of its own).
    pub fn fence_at(&self, url: &str) -> Fence {
        let mut fence = Fence::bare(self.home.path());
        fence.cmd.arg("--store").arg(url);
        if let Some(schema) = &self.schema {
            fence.cmd.arg("--schema").arg(schema);
        }
        if let Some((server, _)) = &self.objects {
            for (key, value) in server.env() {
                fence.cmd.env(key, value);
            }
        }
        fence
    }

    /// How much longer than its TTL a lease may stay live by this store's clock: S3 stamps
    /// versions to the whole second, and fence counts that second in the holder's favour on
    /// both ends (see `src/coordinator/object.rs`), so up to two seconds; GCS to the millisecond;
    /// none elsewhere.
    pub fn expiry_slack(&self) -> std::time::Duration {
        match self.backend {
            Backend::S3 | Backend::LocalStack => std::time::Duration::from_millis(2_000),
            Backend::Gcs => std::time::Duration::from_millis(2),
            _ => std::time::Duration::ZERO,
        }
    }

    /// The object server and this store's prefix (S3 and GCS stores only).
    pub fn server(&self) -> (&objects::Server, &str) {
        let (server, prefix) = self.objects.as_ref().expect("an object store");
        (server, prefix)
    }

    /// The lease record object's JSON body (S3 and GCS stores), or None.
    fn lease_object(&self, resource: &str) -> Option<Value> {
        self.lease_object_at(resource).map(|(body, _)| body)
    }

    /// The lease record object's JSON body and the Last-Modified of that version by the
    /// store's clock (ms), or None.
    fn lease_object_at(&self, resource: &str) -> Option<(Value, i64)> {
        let (server, prefix) = self.server();
        let key = format!("{prefix}/leases/{}", objects::encode_key(resource));
        // The body and the time of one version: read again if a write came between.
        for _ in 0..10 {
            let stored = server.get(&key)?;
            let (version, modified_ms) = server.stat(&key)?;
            if stored.version.as_deref() == Some(version.as_str()) {
                let body = serde_json::from_slice(&stored.body).expect("lease record is JSON");
                return Some((body, modified_ms));
            }
        }
        panic!("the lease record of `{resource}` kept changing while it was read");
    }

    /// Whether fence's `inspect` reports the resource held (for stores that judge expiry by
    /// a clock the test cannot read directly).
    fn inspect_held(&self, resource: &str) -> bool {
        let out = self
            .fence()
            .args(["inspect", resource, "--format", "json"])
            .run();
        out.json()["resources"][0]["state"] == "held"
    }

    /// The file store's directory.
    pub fn dir(&self) -> PathBuf {
        self.home.path().join("store")
    }

    /// The durable event history of a resource, oldest first: (kind, owner, token).
    pub fn events(&self, resource: &str) -> Vec<(String, Option<String>, Option<i64>)> {
        match self.backend {
            Backend::File => {
                let path = self.dir().join("events").join(format!("{resource}.jsonl"));
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                text.lines()
                    .map(|line| {
                        let v: Value = serde_json::from_str(line).expect("event line is JSON");
                        (
                            v["kind"].as_str().unwrap().to_owned(),
                            v["owner"].as_str().map(str::to_owned),
                            v["token"].as_i64(),
                        )
                    })
                    .collect()
            }
            Backend::S3 | Backend::LocalStack | Backend::Gcs => self
                .timed_events(resource)
                .into_iter()
                .map(|e| (e.kind, e.owner, e.token))
                .collect(),
            Backend::Postgres | Backend::PostgresAsync => {
                let sql = format!(
                    "SELECT kind, owner, token FROM {}.events WHERE resource = $1 ORDER BY id",
                    self.schema.as_ref().unwrap()
                );
                self.pg_rows(&sql, resource)
                    .iter()
                    .map(|row| (row.get(0), row.get(1), row.get(2)))
                    .collect()
            }
        }
    }

    /// The durable event history of a resource on an object store (S3, GCS), oldest first,
    /// with the store's own times: each change of the lease record is dated by the
    /// Last-Modified of the version that made it (kept in the record by the next write, read
    /// from the current version for the last change) and carries the TTL it set. Refusals,
    /// which change no lease, are undated here.
    pub fn timed_events(&self, resource: &str) -> Vec<StoreEvent> {
        // The record keeps its latest changes; older ones are archived in event objects
        // (`{"changes": [...]}`), beside one object per refusal. All are ordered by the
        // record's write number (`seq`), a refusal after the change it refused to follow.
        let (server, prefix) = self.server();
        let dir = format!("{prefix}/events/{}", objects::encode_key(resource));
        let change = |c: &Value, written_ms: Option<i64>| {
            (
                (c["seq"].as_u64().unwrap(), 0),
                StoreEvent {
                    kind: c["kind"].as_str().unwrap().to_owned(),
                    owner: c["owner"].as_str().map(str::to_owned),
                    token: c["token"].as_i64(),
                    at_ms: c["at_ms"].as_i64().or(written_ms),
                    ttl_ms: c["ttl_ms"].as_i64(),
                },
            )
        };
        let mut events = Vec::new();
        for key in server.list(&dir) {
            let stored = server.get(&key).expect("listed event object");
            let v: Value = serde_json::from_slice(&stored.body).expect("event body is JSON");
            if let Some(changes) = v["changes"].as_array() {
                events.extend(changes.iter().map(|c| change(c, None)));
                continue;
            }
            let name = key.rsplit('/').next().unwrap();
            let mut parts = name.split('-');
            let seq: u64 = parts.next().unwrap().parse().unwrap();
            let n: u64 = parts.next().unwrap().parse().unwrap();
            events.push((
                (seq, n),
                StoreEvent {
                    kind: v["kind"].as_str().unwrap().to_owned(),
                    owner: v["owner"].as_str().map(str::to_owned),
                    token: v["token"].as_i64(),
                    at_ms: None,
                    ttl_ms: None,
                },
            ));
        }
        if let Some((record, modified_ms)) = self.lease_object_at(resource) {
            if let Some(history) = record["history"].as_array() {
                events.extend(history.iter().map(|c| change(c, Some(modified_ms))));
            }
        }
        events.sort_by_key(|(order, _)| *order);
        // A change may be both archived and still in the record.
        events.dedup_by(|a, b| a.0 == b.0 && a.0 .1 == 0);
        events.into_iter().map(|(_, event)| event).collect()
    }

    /// The durable lease record: (owner, token, live by the store's clock), or None.
    pub fn lease(&self, resource: &str) -> Option<(String, i64, bool)> {
        match self.backend {
            Backend::File => {
                let path = self.dir().join("leases").join(format!("{resource}.json"));
                let text = std::fs::read_to_string(path).ok()?;
                let v: Value = serde_json::from_str(&text).unwrap();
                Some((
                    v["owner"].as_str().unwrap().to_owned(),
                    v["token"].as_i64().unwrap(),
                    self.inspect_held(resource) && !v["released"].as_bool().unwrap(),
                ))
            }
            Backend::S3 | Backend::LocalStack | Backend::Gcs => {
                let v = self.lease_object(resource)?;
                Some((
                    v["owner"].as_str().unwrap().to_owned(),
                    v["token"].as_i64().unwrap(),
                    self.inspect_held(resource) && v["state"] == "held",
                ))
            }
            Backend::Postgres | Backend::PostgresAsync => {
                let sql = format!(
                    "SELECT owner, token, coalesce(expires_at > clock_timestamp(), false) FROM {}.leases WHERE resource = $1",
                    self.schema.as_ref().unwrap()
                );
                let rows = self.pg_rows(&sql, resource);
                rows.first().map(|row| (row.get(0), row.get(1), row.get(2)))
            }
        }
    }

    /// Waits until `fence inspect` shows `resource` expired (its holder paused past it).
    pub fn wait_expired(&self, resource: &str) {
        wait_for(
            "the store to show the lease expired",
            std::time::Duration::from_secs(60),
            || {
                self.fence()
                    .args(["inspect", resource, "--format", "json"])
                    .run()
                    .json()["resources"][0]["state"]
                    == "expired"
            },
        );
    }

    /// Runs a query with one text parameter against this store's database, in a transaction
    /// of its own: behind PgBouncer in transaction mode, the statement's prepare and its
    /// execution must reach the same server connection ("prepared statement s0 does not
    /// exist" otherwise, when another client took the connection in between).
    pub fn pg_rows(&self, sql: &str, param: &str) -> Vec<tokio_postgres::Row> {
        let url = self.url.clone();
        let sql = sql.to_owned();
        let param = param.to_owned();
        block_on(async move {
            let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect to the test server");
            tokio::spawn(conn);
            let tx = client.transaction().await.expect("begin");
            let rows = tx.query(&sql, &[&param]).await.expect("query");
            tx.commit().await.expect("commit");
            rows
        })
    }
}

/// An event of an object store's record, with the store's own time (see
/// [`Store::timed_events`]).
#[derive(Clone, Debug)]
pub struct StoreEvent {
    pub kind: String,
    pub owner: Option<String>,
    pub token: Option<i64>,
    /// The Last-Modified of the record's version that made the change (ms; None: a refusal).
    pub at_ms: Option<i64>,
    /// The TTL a grant or renewal set.
    pub ttl_ms: Option<i64>,
}

impl Drop for Store {
    fn drop(&mut self) {
        if let (Some(schema), false) = (&self.schema, std::thread::panicking()) {
            let url = self.url.clone();
            let sql = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
            block_on(async move {
                if let Ok((client, conn)) =
                    tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                {
                    tokio::spawn(conn);
                    let _ = client.batch_execute(&sql).await;
                }
            });
        }
    }
}

/// The test PostgreSQL server's TCP address, bypassing any proxy.
pub fn pg_upstream() -> std::net::SocketAddr {
    format!(
        "{}:{}",
        env_or_panic("FENCE_TEST_PG_HOST"),
        env_or_panic("FENCE_TEST_PG_PORT")
    )
    .parse()
    .expect("FENCE_TEST_PG_HOST:PORT is a socket address")
}

/// The test database through a proxy at `addr` (plain TCP, so the proxy sees the protocol).
pub fn pg_url_via(addr: std::net::SocketAddr) -> String {
    format!(
        "postgres://{}:{}@{}/{}?sslmode=disable",
        env_or_panic("FENCE_TEST_PG_USER"),
        env_or_panic("FENCE_TEST_PG_PASSWORD"),
        addr,
        env_or_panic("FENCE_TEST_PG_DB")
    )
}

/// A plain client of the test server (its connection driven on the current runtime).
async fn pg_connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test server");
    tokio::spawn(conn);
    client
}

/// Runs a script as a raw client would; Err(SQLSTATE and message) when the server refused.
///
/// A script that changes a shared catalog row (GRANT or REVOKE on the test database, a role)
/// can fail with "tuple concurrently updated" when another test changes the same row at the
/// same moment (seen with six tests at a time); the script ran as one implicit transaction and
/// was rolled back, so it is run again, a few times.
pub fn pg_try_exec(url: &str, script: &str) -> Result<(), String> {
    let (url, script) = (url.to_owned(), script.to_owned());
    block_on(async move {
        let client = pg_connect(&url).await;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let result = client.batch_execute(&script).await.map_err(|e| {
                e.as_db_error()
                    .map(|d| format!("{} {}", d.code().code(), d.message()))
                    .unwrap_or_else(|| e.to_string())
            });
            match result {
                Err(err) if err.ends_with("tuple concurrently updated") && attempts < 20 => {
                    tokio::time::sleep(std::time::Duration::from_millis(20 * attempts)).await;
                }
                other => return other,
            }
        }
    })
}

/// Runs a script on a PostgreSQL database directly (not through fence); panics on failure.
pub fn pg_exec(url: &str, script: &str) {
    if let Err(err) = pg_try_exec(url, script) {
        panic!("{script}: {err}");
    }
}

/// One query without parameters on a PostgreSQL database, directly, in a transaction of its
/// own (see [`Store::pg_rows`]: also behind PgBouncer); panics on failure.
pub fn pg_query(url: &str, sql: &str) -> Vec<tokio_postgres::Row> {
    let (url, sql) = (url.to_owned(), sql.to_owned());
    block_on(async move {
        let mut client = pg_connect(&url).await;
        let tx = client.transaction().await.expect("begin");
        let rows = tx
            .query(&sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        tx.commit().await.expect("commit");
        rows
    })
}

/// Milliseconds since the epoch of a `YYYY-MM-DDTHH:MM:SS.mmmZ` timestamp as fence prints it.
pub fn timestamp_ms(text: &str) -> i64 {
    let bad = || panic!("not a fence timestamp: {text:?}");
    let num = |range: std::ops::Range<usize>| -> i64 {
        text.get(range)
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(bad)
    };
    if text.len() != 24 || !text.ends_with('Z') {
        bad();
    }
    let (y, m, d) = (num(0..4), num(5..7), num(8..10));
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    ((days * 24 + num(11..13)) * 60 + num(14..16)) * 60_000 + num(17..19) * 1000 + num(20..23)
}

/// The digest fence keeps beside a write id (`fence-id-digest`, the ledger's `digest`): the
/// first 64 bits of the SHA-256 of the SQL or bytes, in hex. Written out here rather than
/// taken from fence, so a change of the format on either side fails a test.
pub fn write_digest(effect: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(effect)
        .iter()
        .take(8)
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The documents users read, as (path from the repository's root, text): `README.md`, then
/// every `docs/*.md` by name.
pub fn documents() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    paths.sort();
    paths.insert(0, "README.md".to_owned());
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(root.join(&path)).unwrap();
            (path, text)
        })
        .collect()
}

/// Every `sh` block marked `marker` (`<!-- name -->` on a line of its own, the block's fence
/// the next line that is not blank) in the README and `docs/*.md`, as (document, block), in
/// the documents' order. A block is exactly as written, less its fence's indentation (a block
/// in a list item is indented).
pub fn doc_sh_blocks(marker: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    for (path, text) in documents() {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim() != marker {
                continue;
            }
            let (fence_at, fence) = lines[i + 1..]
                .iter()
                .enumerate()
                .find(|(_, l)| !l.trim().is_empty())
                .map(|(j, l)| (i + 1 + j, *l))
                .unwrap_or_else(|| panic!("{path}: `{marker}` marks no block"));
            assert_eq!(
                fence.trim(),
                "```sh",
                "{path}, line {}: `{marker}` is not followed by a sh block",
                i + 1
            );
            let indent = &fence[..fence.len() - fence.trim_start().len()];
            let block: Vec<&str> = lines[fence_at + 1..]
                .iter()
                .take_while(|l| !l.trim_start().starts_with("```"))
                .map(|l| l.strip_prefix(indent).unwrap_or(l.trim_start()))
                .collect();
            blocks.push((path.clone(), block.join("\n")));
        }
    }
    blocks
}

/// The one `sh` block marked `marker` in the README or `docs/*.md`, exactly as written; a
/// marker in no document, or marking two blocks, panics.
pub fn doc_sh_block(marker: &str) -> String {
    let mut blocks = doc_sh_blocks(marker);
    let found: Vec<&str> = blocks.iter().map(|(path, _)| path.as_str()).collect();
    assert_eq!(
        found.len(),
        1,
        "`{marker}` must mark exactly one sh block in README.md and docs/*.md; found in {found:?}"
    );
    blocks.pop().unwrap().1
}

pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

/// A `fence` invocation being built.
pub struct Fence {
    pub cmd: Command,
}

/// `program` with an empty environment except PATH, HOME (`home`, a temp dir) and a C locale:
/// what every process a test starts gets, so that nothing of the developer's (`FENCE_*`,
/// `PG*`, credentials) reaches it.
pub fn clean_command(program: impl AsRef<std::ffi::OsStr>, home: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("LANG", "C.UTF-8");
    cmd
}

/// The `fence` binary the tests run: `FENCE_TEST_BIN` when set (a mutant, see
/// `tests/mutants/run`), else the one cargo built.
pub fn fence_bin() -> std::ffi::OsString {
    std::env::var_os("FENCE_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_fence").into())
}

/// A lease a test was granted (by [`Fence::acquire`]).
#[derive(Clone, Debug)]
pub struct Lease {
    pub resource: String,
    pub owner: String,
    pub token: i64,
}

impl Fence {
    /// `fence` with a clean environment (see [`clean_command`]).
    pub fn bare(home: &Path) -> Fence {
        Fence {
            cmd: clean_command(fence_bin(), home),
        }
    }

    /// `acquire RESOURCE` with `args` (`--owner`, `--ttl`, …), which must be granted (the test
    /// fails on any other outcome): `store.fence().acquire("job", &["--owner", "a"]).token`.
    #[track_caller]
    pub fn acquire(self, resource: &str, args: &[&str]) -> Lease {
        let json = self
            .args(["acquire", resource])
            .args(args)
            .args(["--format", "json"])
            .run()
            .expect(0)
            .json();
        Lease {
            resource: resource.to_owned(),
            owner: json["owner"]
                .as_str()
                .expect("the grant names its owner")
                .to_owned(),
            token: json["token"].as_i64().expect("the grant carries a token"),
        }
    }

    /// `release` of `lease` (its resource, owner and token), which must succeed.
    #[track_caller]
    pub fn release(self, lease: &Lease) {
        self.args(["release", &lease.resource, "--owner", &lease.owner])
            .args(["--token", &lease.token.to_string()])
            .run()
            .expect(0);
    }

    pub fn args<I, S>(mut self, args: I) -> Fence
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.cmd.args(args);
        self
    }

    pub fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Fence {
        self.cmd.env(key, value);
        self
    }

    pub fn env_remove(mut self, key: &str) -> Fence {
        self.cmd.env_remove(key);
        self
    }

    /// Started in the background, stdin empty, stdout and stderr piped (for
    /// [`wait_output`]).
    pub fn spawn(mut self) -> std::process::Child {
        self.cmd
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start fence")
    }

    pub fn run(mut self) -> Out {
        let output = self.cmd.output().expect("run fence");
        Out::from(output)
    }
}

/// What one `fence` process did.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<std::process::Output> for Out {
    fn from(output: std::process::Output) -> Out {
        Out {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Out {
    /// The single JSON object on stdout.
    pub fn json(&self) -> Value {
        let text = self.stdout.trim();
        assert_eq!(
            text.lines().count(),
            1,
            "exactly one JSON line expected: {self:?}"
        );
        serde_json::from_str(text).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    #[track_caller]
    pub fn expect(self, code: i32) -> Out {
        assert_eq!(self.code, code, "unexpected exit status: {self:?}");
        self
    }
}

/// Generates one test per backend for each named function taking `&Store`.
#[macro_export]
macro_rules! per_backend {
    ($($name:ident),* $(,)?) => {
        mod file_store {
            $( #[test] fn $name() { super::$name(&$crate::common::Store::new($crate::common::Backend::File)) } )*
        }
        mod postgres {
            $( #[test] fn $name() { super::$name(&$crate::common::Store::new($crate::common::Backend::Postgres)) } )*
        }
    };
}

/// Like [`per_backend!`], and on the S3 (moto and LocalStack) and GCS coordinators too.
#[macro_export]
macro_rules! per_coordinator {
    ($($name:ident),* $(,)?) => {
        $crate::per_backend!($($name),*);
        mod s3 {
            $( #[test] fn $name() { super::$name(&$crate::common::Store::new($crate::common::Backend::S3)) } )*
        }
        mod localstack {
            $( #[test] fn $name() { super::$name(&$crate::common::Store::new($crate::common::Backend::LocalStack)) } )*
        }
        mod gcs {
            $( #[test] fn $name() { super::$name(&$crate::common::Store::new($crate::common::Backend::Gcs)) } )*
        }
    };
}
/// Generates one test per object service (S3 through moto, GCS through fake-gcs-server) for
/// each named function taking the [`Backend`] of its store.
#[macro_export]
macro_rules! per_service {
    ($($name:ident),* $(,)?) => {
        mod s3 {
            $( #[test] fn $name() { super::$name($crate::common::Backend::S3) } )*
        }
        mod gcs {
            $( #[test] fn $name() { super::$name($crate::common::Backend::Gcs) } )*
        }
    };
}
pub mod checker;
pub mod cluster;
pub mod fenced;
pub mod follow;
pub mod gcs_server;
pub mod hung_fuse;
pub mod objects;
pub mod own_db;
pub mod process;
pub mod prometheus;
pub mod proxy;

/// Acquires `resource` for `owner` (a 1 min TTL; exit 0 expected) and returns its token.
pub fn acquire(store: &Store, resource: &str, owner: &str) -> i64 {
    acquire_for(store, resource, owner, "1m")
}

/// Acquires `resource` for `owner` with `ttl` (`"10m"`, `"3s"`; exit 0 expected) and returns
/// its token.
pub fn acquire_for(store: &Store, resource: &str, owner: &str, ttl: &str) -> i64 {
    store
        .fence()
        .args(["acquire", resource, "--owner", owner, "--ttl", ttl])
        .args(["--format", "json"])
        .run()
        .expect(0)
        .json()["token"]
        .as_i64()
        .unwrap()
}

/// Releases `owner`'s lease on `resource` with `token` (exit 0 expected).
pub fn release(store: &Store, resource: &str, owner: &str, token: i64) {
    store
        .fence()
        .args(["release", resource, "--owner", owner])
        .args(["--token", &token.to_string()])
        .run()
        .expect(0);
}

/// The findings of `fence doctor --format json` for `check`, as (severity, message, fix).
pub fn doctor_findings(json: &Value, check: &str) -> Vec<(String, String, String)> {
    json["findings"]
        .as_array()
        .expect("doctor's findings")
        .iter()
        .filter(|f| f["check"] == check)
        .map(|f| {
            let text = |k: &str| f[k].as_str().unwrap_or_default().to_owned();
            (text("severity"), text("message"), text("fix"))
        })
        .collect()
}

/// Waits until `done` holds, polling every 10 ms; fails the test, naming `what`, after
/// `timeout` (a bound for a hang, never a timing the test relies on).
pub fn wait_for(what: &str, timeout: std::time::Duration, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// How many sessions of the database at `url` wait for a lock in a statement naming the
/// test's own `schema` and containing `pattern` (`pg_stat_activity`): a condition to wait on
/// instead of a sleep. The server is shared by tests running at once: a pattern alone
/// ("fence: release") also counts another test's statements.
pub fn lock_waiters(url: &str, schema: &str, pattern: &str) -> i64 {
    pg_query(
        url,
        &format!(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND position({} in query) > 0 AND position({} in query) > 0",
            quote_literal(&format!("{schema}.")),
            quote_literal(pattern)
        ),
    )[0]
    .get(0)
}

fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A gate: the rows of a table locked `FOR UPDATE` by a `psql` session the test holds open in
/// a transaction, so that a statement needing them waits until [`RowLock::release`]. Dropping
/// it without releasing kills the session (the server then rolls it back).
pub struct RowLock {
    psql: std::process::Child,
}

impl RowLock {
    /// Locks `table`'s rows; returns once the lock is held.
    pub fn hold(url: &str, table: &str) -> RowLock {
        RowLock::hold_by(url, &format!("SELECT * FROM {table} FOR UPDATE"))
    }

    /// Runs `statement` in the open transaction (an `INSERT` whose row others then wait on,
    /// a `SELECT … FOR UPDATE`); returns once it ran.
    pub fn hold_by(url: &str, statement: &str) -> RowLock {
        use std::io::Write;
        let name = format!(
            "fence-test-gate-{}-{}",
            process_tag(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let mut psql = Command::new("psql")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", url])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("PGAPPNAME", &name)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start psql");
        writeln!(psql.stdin.as_mut().unwrap(), "BEGIN; {statement};").unwrap();
        let sql = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = {} \
             AND state = 'idle in transaction'",
            quote_literal(&name)
        );
        wait_for(
            "the gate's lock",
            std::time::Duration::from_secs(30),
            || pg_query(url, &sql)[0].get::<_, i64>(0) == 1,
        );
        RowLock { psql }
    }

    /// Commits the locking transaction: the waiting statements go on.
    pub fn release(self) {
        self.end("COMMIT")
    }

    /// Rolls the locking transaction back: what it wrote is gone, and the waiting statements
    /// go on.
    pub fn roll_back(self) {
        self.end("ROLLBACK")
    }

    fn end(mut self, how: &str) {
        use std::io::Write;
        let mut stdin = self.psql.stdin.take().unwrap();
        writeln!(stdin, "{how};").unwrap();
        drop(stdin);
        let status = self.psql.wait().unwrap();
        assert!(status.success(), "the gate's psql failed: {status:?}");
    }
}

impl Drop for RowLock {
    fn drop(&mut self) {
        if self.psql.stdin.is_some() {
            let _ = self.psql.kill();
            let _ = self.psql.wait();
        }
    }
}

/// Waits up to `timeout` for `child` to exit: its exit code (`None` when a signal ended it),
/// or `None` after killing it if it was still running then (a bound for a hang, not a timing).
pub fn wait_exit(child: &mut std::process::Child, timeout: std::time::Duration) -> Option<i32> {
    if exits_within(child, timeout) {
        return child.try_wait().unwrap().and_then(|status| status.code());
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Whether `child` exits within `timeout` (polled every 10 ms; it is reaped if it did).
fn exits_within(child: &mut std::process::Child, timeout: std::time::Duration) -> bool {
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    true
}

/// Waits for `child` to exit and collects its output; kills it and fails the test, naming
/// `what`, if it is still running after `timeout` (a bound for a hang, not a timing).
pub fn wait_output(
    what: &str,
    mut child: std::process::Child,
    timeout: std::time::Duration,
) -> std::process::Output {
    if !exits_within(&mut child, timeout) {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!("{what} was still running after {timeout:?}: {out:?}");
    }
    child.wait_with_output().unwrap()
}

/// A superuser connection string for the test server (over its private unix socket).
pub fn pg_superuser() -> String {
    format!(
        "host={} port={} user={} dbname={}",
        env_or_panic("FENCE_TEST_PG_SOCKET_DIR"),
        env_or_panic("FENCE_TEST_PG_PORT"),
        env_or_panic("FENCE_TEST_PG_SUPER_USER"),
        env_or_panic("FENCE_TEST_PG_DB")
    )
}

/// A new login role of the test database with `CONNECTION LIMIT limit` that may create
/// schemas there; returns its name and a URL that logs in as it (TCP, like fence's users).
pub fn pg_limited_role(limit: u32) -> (String, String) {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let role = format!("limited_{}_{n}", process_tag());
    let db = env_or_panic("FENCE_TEST_PG_DB");
    // Two GRANTs on one database at once can fail ("tuple concurrently updated"): tests in
    // other processes take their turn under a transaction-level advisory lock.
    pg_exec(
        &pg_superuser(),
        &format!(
            "BEGIN;
             SELECT pg_advisory_xact_lock(hashtext('fence-test-database-grants'));
             CREATE ROLE {role} LOGIN PASSWORD 'limited-secret' CONNECTION LIMIT {limit};
             GRANT CREATE, CONNECT ON DATABASE {db} TO {role};
             COMMIT;"
        ),
    );
    let url = format!(
        "postgres://{role}:limited-secret@{}:{}/{db}?sslmode=disable",
        env_or_panic("FENCE_TEST_PG_HOST"),
        env_or_panic("FENCE_TEST_PG_PORT"),
    );
    (role, url)
}

/// A URL that logs in as `role` over the test server's unix socket (trust authentication:
/// no SCRAM exchange, which costs tens of milliseconds of CPU in a debug build of fence).
pub fn pg_socket_url(role: &str) -> String {
    let dir: String = env_or_panic("FENCE_TEST_PG_SOCKET_DIR")
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!(
        "postgres:///{}?host={dir}&port={}&user={role}",
        env_or_panic("FENCE_TEST_PG_DB"),
        env_or_panic("FENCE_TEST_PG_PORT"),
    )
}
