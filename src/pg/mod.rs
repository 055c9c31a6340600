//! Connecting to PostgreSQL the way libpq users expect, and classifying its failures.
//!
//! tokio-postgres parses URLs but reads no environment and knows only `sslmode`
//! disable/prefer/require. This module adds what operators rely on: `PGHOST`, `PGPORT`,
//! `PGUSER`, `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`, `PGCONNECT_TIMEOUT`,
//! unix-socket hosts, and `sslmode=verify-ca|verify-full` with `sslrootcert`. Errors are mapped
//! to exit codes by what they mean for a retry: refused login or bad TLS settings are usage
//! errors (2), an unreachable server is unavailable (7), and a connection lost after a request
//! that changes state was sent is outcome unknown (8). A server that answers that it cannot
//! take a connection now (no free slot, 53300; starting or stopping, 57P03) is retried with
//! jittered back-off, for [`CONNECT_PATIENCE`] or as long as the caller's own bound.

use std::time::Duration;

mod classify;
mod connect;
mod libpq_files;
mod params;
pub mod range;
pub mod session;
pub mod sqlstate;
mod tls;

pub(crate) use classify::caused;
pub use classify::{lost, request_error, session_lost, Failure};
pub use connect::{close_all, Notifications, Refusals};
pub use params::ConnectParams;

/// How long to wait for a server to accept a connection, unless the URL or
/// `PGCONNECT_TIMEOUT` says otherwise.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection is retried while the server answers that it cannot take one now,
/// when the caller sets no longer bound (`--wait` does).
pub const CONNECT_PATIENCE: Duration = Duration::from_secs(2);

/// How long fence waits for the answer to one request before giving up on it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// `request`'s answer within [`REQUEST_TIMEOUT`], with a last look past it for a process
/// that was paused meanwhile ([`crate::time::answer_within`]).
pub async fn answer_within_timeout<F: std::future::Future>(
    request: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    crate::time::answer_within(REQUEST_TIMEOUT, request).await
}
