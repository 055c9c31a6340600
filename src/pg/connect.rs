//! Connecting: one attempt bounded as libpq bounds it, retries while the server refuses for
//! now (the [`Refusals`] met), the connection tasks, and their `Terminate` before exit.

use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::TlsStream;
use tokio_postgres::{AsyncMessage, Client, Connection, Socket};

use crate::error::Error;
use crate::pg::classify::error_chain;
use crate::pg::params::{ConnectParams, Ssl};
use crate::pg::{CONNECT_PATIENCE, DEFAULT_CONNECT_TIMEOUT};
use crate::sys::random_u64;

impl ConnectParams {
    /// Connects and spawns the connection task on the current runtime; the receiver gets the
    /// payload of every `NOTIFY` on a channel this connection `LISTEN`s to. A server that
    /// cannot take the connection now is retried for [`CONNECT_PATIENCE`].
    pub async fn connect(&self) -> Result<(Client, Notifications), Error> {
        self.connect_until(Instant::now() + CONNECT_PATIENCE, &Refusals::default())
            .await
    }

    /// [`Self::connect`], retrying with jittered exponential back-off (25 ms doubling to 1 s)
    /// while the server answers that it has no slot for this connection ("too many
    /// connections", SQLSTATE 53300, per server or per role) or is starting or stopping
    /// ("cannot connect now", 57P03), until `until`. Nothing has been sent then, so retrying
    /// is always safe; any other failure is final at once. Each refusal is kept in
    /// `refusals` until a connection succeeds, for a caller whose own deadline ends the wait
    /// before this gives up (the error it gives up with names the refusal too).
    pub async fn connect_until(
        &self,
        until: Instant,
        refusals: &Refusals,
    ) -> Result<(Client, Notifications), Error> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(25);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let refusal = match self.connect_once().await {
                Ok(connected) => {
                    refusals.set(None);
                    return Ok(connected);
                }
                Err(ConnectAttempt::Final(err)) => return Err(err),
                Err(ConnectAttempt::Refused(refusal)) => refusal,
            };
            refusals.set(Some(refusal.clone()));
            // Between half and all of the pause, so that refused clients spread out.
            let nap = pause / 2
                + Duration::from_micros(random_u64() % (pause.as_micros() as u64 / 2 + 1));
            if Instant::now() + nap > until {
                return Err(Error::unavailable(
                    format!(
                        "PostgreSQL at `{}` refused to take a connection: {refusal}; fence retried {} for {:.1}s and gave up",
                        self.display,
                        if attempts == 1 { "once".to_owned() } else { format!("{attempts} times") },
                        started.elapsed().as_secs_f64()
                    ),
                    "nothing was done, so it is safe to retry; if the server (or this role) is often out of connection slots, size max_connections and the roles' CONNECTION LIMIT for fence's processes (docs/run.md, Connection sizing and PgBouncer)",
                ));
            }
            tokio::time::sleep(nap).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// One connection attempt, bounded as libpq's connect_timeout bounds it.
    async fn connect_once(&self) -> Result<(Client, Notifications), ConnectAttempt> {
        // tokio-postgres bounds only the TCP connect; libpq's connect_timeout bounds the
        // whole connection (TLS, start-up, login), and so do we.
        let limit = self
            .config
            .get_connect_timeout()
            .copied()
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        tokio::time::timeout(limit, self.connect_unbounded())
            .await
            .map_err(|_| {
                ConnectAttempt::Final(Error::unavailable(
                    format!(
                        "PostgreSQL at `{}` did not complete the connection within {}",
                        self.display,
                        crate::time::duration(limit)
                    ),
                    "check that the address is a PostgreSQL server and that it is not overloaded; nothing was done, so it is safe to retry",
                ))
            })?
    }

    async fn connect_unbounded(&self) -> Result<(Client, Notifications), ConnectAttempt> {
        let mut config = self.config.clone();
        let Some(tls) = self.tls().map_err(ConnectAttempt::Final)? else {
            let (client, connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(|err| self.connect_error(err))?;
            return Ok((client, drive(connection)));
        };
        config.ssl_mode(if self.ssl == Ssl::Prefer {
            SslMode::Prefer
        } else {
            SslMode::Require
        });
        let (client, connection) = config
            .connect(tls)
            .await
            .map_err(|err| self.connect_error(err))?;
        Ok((client, drive(connection)))
    }

    /// Asks the server to cancel whatever `cancel` names is running (a new connection that
    /// carries only the cancel request, as libpq's PQcancel). The answer to the cancelled
    /// request, not this call, says whether it was cancelled in time.
    ///
    /// Like libpq, fence waits for the server to close the cancel connection: tokio-postgres
    /// closes it as soon as the request is written, and PgBouncer 1.18 then dropped the
    /// request, so that a write fence gave up on committed later, or crashed ("bad client
    /// state"), dropping every client (review 16). Done so for one host without TLS; else
    /// the driver's own cancel.
    pub async fn cancel(&self, cancel: &tokio_postgres::CancelToken) -> Result<(), Error> {
        let sent = match self.tls()? {
            None => match self.cancel_target() {
                Some(CancelTarget::Tcp(host, port)) => {
                    match tokio::net::TcpStream::connect((host.as_str(), port)).await {
                        Ok(stream) => cancel_and_wait(cancel, stream).await,
                        Err(_) => cancel.cancel_query(tokio_postgres::NoTls).await,
                    }
                }
                Some(CancelTarget::Unix(path)) => {
                    match tokio::net::UnixStream::connect(&path).await {
                        Ok(stream) => cancel_and_wait(cancel, stream).await,
                        Err(_) => cancel.cancel_query(tokio_postgres::NoTls).await,
                    }
                }
                None => cancel.cancel_query(tokio_postgres::NoTls).await,
            },
            Some(tls) => cancel.cancel_query(tls).await,
        };
        sent.map_err(|err| {
            Error::unavailable(
                format!(
                    "cannot reach PostgreSQL at `{}` to cancel: {}",
                    self.display,
                    error_chain(&err)
                ),
                "check that the server is reachable",
            )
            .with_source(err)
        })
    }

    /// Where a cancel request goes when the connection has one place to go: a single host,
    /// no `hostaddr`.
    fn cancel_target(&self) -> Option<CancelTarget> {
        let [host] = self.config.get_hosts() else {
            return None;
        };
        if !self.config.get_hostaddrs().is_empty() {
            return None;
        }
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        Some(match host {
            tokio_postgres::config::Host::Tcp(name) => CancelTarget::Tcp(name.clone(), port),
            tokio_postgres::config::Host::Unix(dir) => {
                CancelTarget::Unix(dir.join(format!(".s.PGSQL.{port}")))
            }
        })
    }

    fn connect_error(&self, err: tokio_postgres::Error) -> ConnectAttempt {
        if let Some(db) = err.as_db_error() {
            let code = db.code();
            if *code == SqlState::TOO_MANY_CONNECTIONS || *code == SqlState::CANNOT_CONNECT_NOW {
                return ConnectAttempt::Refused(format!(
                    "{} (SQLSTATE {})",
                    db.message(),
                    code.code()
                ));
            }
        }
        let failure = self.connect_failure(&err);
        ConnectAttempt::Final(failure.with_source(err))
    }
}

/// Why one connection attempt failed.
enum ConnectAttempt {
    /// The server could not take the connection now (no free slot, starting, stopping): its
    /// message and SQLSTATE, to retry.
    Refused(String),
    Final(Error),
}

/// Payloads of notifications received on a connection.
pub type Notifications = tokio::sync::mpsc::UnboundedReceiver<String>;

/// Drives a connection on the current runtime, forwarding its notifications.
fn drive<T>(mut connection: Connection<Socket, T>) -> Notifications
where
    T: TlsStream + Unpin + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(std::future::poll_fn(move |cx| loop {
        match connection.poll_message(cx) {
            std::task::Poll::Ready(Some(Ok(AsyncMessage::Notification(n)))) => {
                let _ = tx.send(n.payload().to_owned());
            }
            std::task::Poll::Ready(Some(Ok(_))) => {}
            std::task::Poll::Ready(Some(Err(_)) | None) => return std::task::Poll::Ready(()),
            std::task::Poll::Pending => return std::task::Poll::Pending,
        }
    }));
    CONNECTIONS.with(|open| {
        let mut open = open.borrow_mut();
        // A waiter reconnects for every poll: forget the connections that have ended.
        open.retain(|task| !task.is_finished());
        open.push(task);
    });
    rx
}

thread_local! {
    /// The connection tasks of this thread, so that they can end cleanly before exit.
    static CONNECTIONS: std::cell::RefCell<Vec<tokio::task::JoinHandle<()>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The server's answer to the last connection attempt it refused (no free slot, starting,
/// stopping: its message and SQLSTATE), until a connection succeeds. Whoever connects owns
/// one and hands it to [`ConnectParams::connect_until`], which fills it as it retries: what
/// the owner reports when its own deadline cut the retrying short, so that no error value
/// reached it.
#[derive(Debug, Default)]
pub struct Refusals(std::sync::Mutex<Option<String>>);

impl Refusals {
    /// The last refusal since the last connection that succeeded, if any.
    pub fn last(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, refusal: Option<String>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = refusal;
    }
}

/// Lets every connection whose client has been dropped say goodbye (`Terminate`) before the
/// process exits; otherwise the server logs each exit as a connection reset.
pub async fn close_all() {
    let tasks = CONNECTIONS.with(|open| std::mem::take(&mut *open.borrow_mut()));
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_millis(200), task).await;
    }
}

/// Where [`ConnectParams::cancel`] sends its request itself.
enum CancelTarget {
    Tcp(String, u16),
    Unix(std::path::PathBuf),
}

/// Writes the cancel request on `stream` without closing its side, then waits for the
/// server to close the connection, as libpq does (see [`ConnectParams::cancel`]).
async fn cancel_and_wait<S>(
    cancel: &tokio_postgres::CancelToken,
    mut stream: S,
) -> Result<(), tokio_postgres::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt;
    cancel
        .cancel_query_raw(KeepOpen(&mut stream), tokio_postgres::NoTls)
        .await?;
    let mut buf = [0u8; 64];
    // The server answers nothing; it closes the connection once it has the request.
    while let Ok(1..) = stream.read(&mut buf).await {}
    Ok(())
}

/// A stream whose shutdown leaves it open (the driver shuts its side down after the request).
struct KeepOpen<'a, S>(&'a mut S);

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for KeepOpen<'_, S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for KeepOpen<'_, S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server that answers every start-up with PostgreSQL's "too many connections" (FATAL,
    /// SQLSTATE 53300), as a full server does.
    async fn full_server() -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut length = [0u8; 4];
                if socket.read_exact(&mut length).await.is_err() {
                    continue;
                }
                let mut startup = vec![0u8; u32::from_be_bytes(length) as usize - 4];
                if socket.read_exact(&mut startup).await.is_err() {
                    continue;
                }
                let fields = b"SFATAL\0VFATAL\0C53300\0Msorry, too many clients already\0\0";
                let mut answer = vec![b'E'];
                answer.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
                answer.extend_from_slice(fields);
                let _ = socket.write_all(&answer).await;
            }
        });
        port
    }

    /// The refusals a retrying connection meets are kept where its caller can read them when
    /// its own deadline cuts the connecting short (no error reaches it then), and named in
    /// the error when the connecting gives up itself.
    #[tokio::test(flavor = "current_thread")]
    async fn refusals_are_the_callers_to_read() {
        let port = full_server().await;
        let url = format!("postgres://fence@127.0.0.1:{port}/db?sslmode=disable");
        let params = ConnectParams::resolve(&url, "db").unwrap();
        let refusal = "sorry, too many clients already (SQLSTATE 53300)";
        let refusals = Refusals::default();
        let cut = tokio::time::timeout(
            Duration::from_millis(300),
            params.connect_until(Instant::now() + Duration::from_secs(60), &refusals),
        )
        .await;
        assert!(
            cut.is_err(),
            "the connecting ended before its caller's deadline"
        );
        assert_eq!(refusals.last().as_deref(), Some(refusal));
        let Err(err) = params
            .connect_until(Instant::now() + Duration::from_millis(100), &refusals)
            .await
        else {
            panic!("a full server took the connection");
        };
        assert_eq!(err.exit(), crate::exit::Exit::Unavailable, "{err}");
        assert!(err.to_string().contains(refusal), "{err}");
    }

    /// The error fence makes of a driver error keeps it as its source (and a failure that is
    /// no refusal leaves none behind).
    #[tokio::test(flavor = "current_thread")]
    async fn connection_failures_keep_the_driver_error() {
        let params =
            ConnectParams::resolve("postgres://fence@127.0.0.1:1/db?sslmode=disable", "db")
                .unwrap();
        let refusals = Refusals::default();
        let Err(err) = params.connect_until(Instant::now(), &refusals).await else {
            panic!("nothing listens on port 1");
        };
        assert_eq!(err.exit(), crate::exit::Exit::Unavailable, "{err}");
        let source = std::error::Error::source(&err).expect("a source");
        assert!(source.is::<tokio_postgres::Error>(), "{source:?}");
        assert_eq!(refusals.last(), None);
        let err = match ConnectParams::resolve("postgres://h/db?connect_timeout=x", "db") {
            Err(err) => err,
            Ok(_) => panic!("a bad connect_timeout was accepted"),
        };
        assert!(
            std::error::Error::source(&err).is_some_and(|s| s.is::<tokio_postgres::Error>()),
            "{err:?}"
        );
    }
}
