//! A private fake-gcs-server of a test's own, for tests that crash and restart the server a
//! GCS coordinator's record is on (the analogue of `common::cluster` for PostgreSQL). Its
//! objects are kept on disk (`-backend filesystem`), so they survive a restart as Google's
//! storage keeps every acknowledged write; the shared server `tests/run` starts keeps them in
//! memory and serves every other test, so it is never restarted.
//!
//! The filesystem backend checks a multipart upload's `ifGenerationMatch` under its lock, as
//! the shared one does (fence's proof of preconditions runs on it like anywhere else). It
//! writes an object's bytes (a temporary file renamed into place) and then its metadata
//! (generation, user metadata): a SIGKILL between the two leaves the new bytes under the old
//! version's metadata. fence reads a GCS lease record from its metadata copy (`fence-lease`)
//! and conditions its next write on that generation, so to fence such a write never happened
//! (as a put that never arrived), and the next write replaces both.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::objects::{Server, Service};
use super::{env_or_panic, wait_for};

/// How long a fresh fake-gcs-server may take to listen (it starts in about 50 ms here; a
/// loaded two-core machine was seen at a second).
const START_BOUND: Duration = Duration::from_secs(20);

pub struct GcsServer {
    root: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    /// The server and its bucket, for fence (`FENCE_GCS_ENDPOINT`) and for direct reads.
    pub server: Server,
}

impl GcsServer {
    /// Starts a server on a free loopback port, with one bucket (the shared server's name).
    pub fn start() -> GcsServer {
        let port = {
            let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
            listener.local_addr().unwrap().port()
        };
        let bucket = env_or_panic("FENCE_TEST_GCS_BUCKET");
        let mut gcs = GcsServer {
            root: tempfile::tempdir().unwrap(),
            port,
            child: None,
            server: Server::at(Service::Gcs, format!("http://127.0.0.1:{port}"), bucket),
        };
        gcs.spawn();
        let out = Command::new("curl")
            .args(["-sf", "-o", "/dev/null", "-X", "POST", "-H"])
            .arg("Content-Type: application/json")
            .arg("-d")
            .arg(format!("{{\"name\": \"{}\"}}", gcs.server.bucket))
            .arg(format!("{}/storage/v1/b?project=test", gcs.server.endpoint))
            .output()
            .expect("run curl");
        assert!(out.status.success(), "create the bucket: {out:?}");
        gcs
    }

    fn spawn(&mut self) {
        let endpoint = format!("127.0.0.1:{}", self.port);
        let child = Command::new(env_or_panic("FENCE_TEST_GCS_BIN"))
            .args(["-scheme", "http", "-host", "127.0.0.1", "-port"])
            .arg(self.port.to_string())
            .args(["-backend", "filesystem", "-filesystem-root"])
            .arg(self.root.path().join("objects"))
            .args(["-public-host", &endpoint, "-external-url"])
            .arg(format!("http://{endpoint}"))
            .args(["-log-level", "warn"])
            .current_dir(self.root.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start fake-gcs-server");
        self.child = Some(child);
        let addr: SocketAddr = endpoint.parse().unwrap();
        let started = Instant::now();
        wait_for("fake-gcs-server to listen", START_BOUND, || {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "fake-gcs-server on port {} exited with {status} after {:?}",
                    self.port,
                    started.elapsed()
                );
            }
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        });
    }

    /// Kills the server (SIGKILL: requests in flight get no answer, or a reset) and starts it
    /// again on the same port and the same objects; returns once it listens.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for GcsServer {
    fn drop(&mut self) {
        self.kill();
    }
}
