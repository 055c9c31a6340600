//! A `fence log --follow --format ndjson` child, its lines read as it prints them, so that a
//! test waits for what it printed instead of giving it time.

use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::Value;

pub struct Follower {
    child: Child,
    /// Each line, as JSON, once printed.
    pub lines: Receiver<Value>,
}

impl Follower {
    /// Spawns `cmd` (a `fence log --follow --format ndjson …`), its stdout read line by line.
    pub fn start(mut cmd: Command) -> Follower {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start fence log --follow");
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let line = line.unwrap();
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                if send.send(value).is_err() {
                    return;
                }
            }
        });
        Follower { child, lines }
    }

    /// The lines printed from now up to the first one `wanted` holds for (the last of them);
    /// fails the test, naming `what`, if none comes within `within` (a bound for a hang).
    pub fn until(
        &self,
        what: &str,
        within: Duration,
        mut wanted: impl FnMut(&Value) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let done = wanted(&line);
                    seen.push(line);
                    if done {
                        return seen;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no {what} within {within:?}; printed meanwhile: {seen:?}")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("fence log --follow ended before printing {what}: {seen:?}")
                }
            }
        }
    }

    /// The next line of `kind` (other lines are skipped).
    pub fn next(&self, kind: &str, within: Duration) -> Value {
        self.until(&format!("`{kind}` event"), within, |line| {
            line["kind"] == kind
        })
        .pop()
        .unwrap()
    }

    /// Sends `signal` and waits for the exit (failing the test after `within`, a bound for a
    /// hang): its output, and the lines it printed that were not taken yet.
    pub fn stop(self, signal: i32, within: Duration) -> (Output, Vec<Value>) {
        super::process::kill(self.child.id(), signal);
        let out = super::wait_output("fence log --follow, signalled", self.child, within);
        // It has exited: its stdout is closed, and the reader ends at the last line.
        (out, self.lines.iter().collect())
    }

    /// SIGINT ends it, with status 0.
    pub fn interrupt(self) {
        let (out, _) = self.stop(libc::SIGINT, Duration::from_secs(10));
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
}
