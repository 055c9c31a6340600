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
pub use classify::{lost, request_error, Failure};
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

/// How long a request whose [`REQUEST_TIMEOUT`] passed is still looked at (see
/// [`answer_within_timeout`]).
const LAST_LOOK: Duration = Duration::from_millis(100);

/// `request`'s answer within [`REQUEST_TIMEOUT`], or `Err` once it passed. A process paused
/// (SIGSTOP, a frozen VM, swap) past the timeout wakes with its timer fired and the answer,
/// if the server sent it meanwhile, still unread in the connection, whose task has not run
/// yet: the request gets [`LAST_LOOK`] more before it counts as lost, so that it is not
/// reported as "no answer" (exit 8 for a write) when the answer is there.
pub async fn answer_within_timeout<F: std::future::Future>(
    request: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let mut request = std::pin::pin!(request);
    match tokio::time::timeout(REQUEST_TIMEOUT, &mut request).await {
        Ok(answer) => Ok(answer),
        Err(_) => tokio::time::timeout(LAST_LOOK, request).await,
    }
}
