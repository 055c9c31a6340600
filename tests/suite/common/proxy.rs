//! A loopback TCP proxy for fault injection between `fence` and a real server.
//!
//! [`Proxy::start`] listens on `127.0.0.1:0` and relays every accepted connection to an
//! upstream address, one thread per direction, misbehaving as its [`Mode`] says: pass bytes
//! through, hold every client→server chunk for a while (a slow or congested network), or cut
//! the connection right after the client sent a given byte pattern, so that the server gets the
//! request but the client never gets the answer (a connection lost mid-commit).
//!
//! std only (threads and blocking sockets with short timeouts). Every thread checks a stop flag,
//! and dropping the proxy shuts all its sockets and joins all its threads, so a test can never
//! hang on it. The proxy also records what it forwarded and which upstream ports it used, so a
//! test can check its own timing premises and find the server backends of its connections
//! (`pg_stat_activity.client_port`).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How often blocked threads look at the stop flag.
const TICK: Duration = Duration::from_millis(20);
/// A peer that does not take our bytes for this long is treated as gone.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How the proxy treats the connections it relays.
#[derive(Clone, Debug)]
pub enum Mode {
    /// Relay both directions unchanged.
    Pass,
    /// Hold every client→server chunk for this long before forwarding it (a delay line:
    /// chunks keep their order and each is delayed by the same amount, not cumulatively).
    /// Server→client traffic is not delayed.
    Delay(Duration),
    /// Relay normally until a client→server chunk contains this byte pattern (also when it
    /// straddles two chunks); forward that chunk to the server, then cut: the client's socket
    /// is shut down at once and never receives another byte, while the server sees the end of
    /// its input after the chunk (as if the client had gone away). The server's replies are
    /// read and discarded, so it is never reset mid-reply.
    CutWhenClientSends(Vec<u8>),
    /// Relay normally until a client→server chunk contains this byte pattern (also when it
    /// straddles two chunks); hold that chunk, and everything the client sends after it,
    /// until [`Proxy::open`]: a statement that reaches the server only once the test lets it,
    /// however fast or slow the machine. [`Proxy::held`] counts the connections waiting.
    HoldWhenClientSends(Vec<u8>),
    /// Relay normally until a client→server chunk contains this byte pattern (also when it
    /// straddles two chunks); from then on hold every server→client chunk for the duration
    /// before passing it on (a delay line, as [`Mode::Delay`], for answers: the server has
    /// applied a request long before its client hears of it).
    DelayAnswersOnceClientSends(Vec<u8>, Duration),
}

/// A client→server chunk as it was forwarded upstream.
#[derive(Clone, Debug)]
pub struct Forwarded {
    /// Just before the chunk was written to the upstream socket.
    pub at: Instant,
    pub bytes: Vec<u8>,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// Connections accepted while false are relayed unchanged ([`Proxy::start_disarmed`]).
    disarmed: AtomicBool,
    accepted: AtomicUsize,
    cuts: AtomicUsize,
    held: AtomicUsize,
    open: AtomicBool,
    forwarded: Mutex<Vec<Forwarded>>,
    /// Local ports of the proxy's upstream sockets, one per accepted connection.
    upstream_ports: Mutex<Vec<u16>>,
    /// Every socket, so that drop can shut them all (and wake their threads).
    sockets: Mutex<Vec<TcpStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn spawn(&self, name: String, f: impl FnOnce() + Send + 'static) {
        let handle = thread::Builder::new()
            .name(name)
            .spawn(f)
            .expect("spawn a proxy thread");
        self.threads.lock().unwrap().push(handle);
    }
}

/// A running proxy; stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts relaying connections made to [`Proxy::addr`] to `upstream`.
    pub fn start(upstream: SocketAddr, mode: Mode) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        let accept = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("proxy-accept-{addr}"))
                .spawn(move || accept_loop(listener, upstream, mode, shared))
                .expect("spawn the proxy's accept thread")
        };
        Proxy {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    /// Like [`Proxy::start`], but relaying every connection unchanged until [`Proxy::arm`]:
    /// object stores are proven through the endpoint a client uses, so a test proves the
    /// prefix through the proxy before its fault starts.
    pub fn start_disarmed(upstream: SocketAddr, mode: Mode) -> Proxy {
        let proxy = Proxy::start(upstream, mode);
        proxy.shared.disarmed.store(true, Ordering::SeqCst);
        proxy
    }

    /// From now on, new connections get the proxy's mode.
    pub fn arm(&self) {
        self.shared.disarmed.store(false, Ordering::SeqCst);
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// How many connections were cut ([`Mode::CutWhenClientSends`]).
    pub fn cuts(&self) -> usize {
        self.shared.cuts.load(Ordering::SeqCst)
    }

    /// How many connections are holding their pattern ([`Mode::HoldWhenClientSends`]).
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// Lets held chunks (and all later ones) through ([`Mode::HoldWhenClientSends`]).
    pub fn open(&self) {
        self.shared.open.store(true, Ordering::SeqCst);
    }

    /// The local ports of the proxy's upstream connections: a PostgreSQL server reports them
    /// as `pg_stat_activity.client_port`.
    pub fn upstream_ports(&self) -> Vec<u16> {
        self.shared.upstream_ports.lock().unwrap().clone()
    }

    /// Every client→server chunk forwarded so far, in order.
    pub fn forwarded(&self) -> Vec<Forwarded> {
        self.shared.forwarded.lock().unwrap().clone()
    }

    /// When the first forwarded client→server chunk containing `pattern` was handed to the
    /// upstream socket, if one was.
    pub fn client_sent_at(&self, pattern: &[u8]) -> Option<Instant> {
        self.shared
            .forwarded
            .lock()
            .unwrap()
            .iter()
            .find(|f| contains(&f.bytes, pattern))
            .map(|f| f.at)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        for socket in self.shared.sockets.lock().unwrap().iter() {
            let _ = socket.shutdown(Shutdown::Both);
        }
        let threads: Vec<_> = self.shared.threads.lock().unwrap().drain(..).collect();
        for thread in threads {
            let _ = thread.join();
        }
    }
}

pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

fn accept_loop(listener: TcpListener, upstream: SocketAddr, mode: Mode, shared: Arc<Shared>) {
    while !shared.stopped() {
        match listener.accept() {
            Ok((client, _)) => {
                let conn = shared.accepted.fetch_add(1, Ordering::SeqCst);
                if let Err(err) = relay(conn, client, upstream, &mode, &shared) {
                    eprintln!("proxy: connection {conn} to {upstream} failed: {err}");
                }
            }
            Err(err) if err.kind() == ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(5))
            }
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(err) => {
                eprintln!("proxy: accept failed: {err}");
                thread::sleep(TICK);
            }
        }
    }
}

/// Per connection: both sockets, and whether the connection has been cut.
struct Conn {
    client: TcpStream,
    upstream: TcpStream,
    /// Set (under the lock) when cut; the server→client thread holds the lock while it writes,
    /// so not one byte reaches the client after the cut.
    cut: Mutex<bool>,
    /// Server→client chunks are held this long from now on ([`Mode::DelayAnswersOnceClientSends`]).
    answers_delayed: Mutex<Option<Duration>>,
}

impl Conn {
    /// Forwards one client chunk upstream and records it (stamped just before the write, so
    /// the server cannot have had it earlier).
    fn to_upstream(&self, shared: &Shared, bytes: &[u8]) -> std::io::Result<()> {
        let at = Instant::now();
        (&self.upstream).write_all(bytes)?;
        shared.forwarded.lock().unwrap().push(Forwarded {
            at,
            bytes: bytes.to_vec(),
        });
        Ok(())
    }
}

fn relay(
    id: usize,
    client: TcpStream,
    upstream: SocketAddr,
    mode: &Mode,
    shared: &Arc<Shared>,
) -> std::io::Result<()> {
    client.set_nonblocking(false)?;
    let server = TcpStream::connect_timeout(&upstream, CONNECT_TIMEOUT)?;
    for socket in [&client, &server] {
        socket.set_nodelay(true)?;
        socket.set_read_timeout(Some(TICK))?;
        socket.set_write_timeout(Some(WRITE_TIMEOUT))?;
    }
    shared
        .upstream_ports
        .lock()
        .unwrap()
        .push(server.local_addr()?.port());
    {
        let mut sockets = shared.sockets.lock().unwrap();
        sockets.push(client.try_clone()?);
        sockets.push(server.try_clone()?);
    }
    let conn = Arc::new(Conn {
        client,
        upstream: server,
        cut: Mutex::new(false),
        answers_delayed: Mutex::new(None),
    });

    // Server → client: never altered, only suppressed after a cut, or delayed.
    {
        let (conn, shared2) = (Arc::clone(&conn), Arc::clone(shared));
        shared.spawn(format!("proxy-{id}-s2c"), move || {
            server_to_client(&conn, &shared2)
        });
    }
    // Client → server.
    let (conn2, shared2) = (Arc::clone(&conn), Arc::clone(shared));
    let mode = if shared.disarmed.load(Ordering::SeqCst) {
        Mode::Pass
    } else {
        mode.clone()
    };
    match mode {
        Mode::Pass => shared.spawn(format!("proxy-{id}-c2s"), move || {
            client_to_server(&conn2, &shared2, None)
        }),
        Mode::CutWhenClientSends(pattern) => shared.spawn(format!("proxy-{id}-c2s"), move || {
            client_to_server(&conn2, &shared2, Some((&pattern, OnPattern::Cut)))
        }),
        Mode::HoldWhenClientSends(pattern) => shared.spawn(format!("proxy-{id}-c2s"), move || {
            client_to_server(&conn2, &shared2, Some((&pattern, OnPattern::Hold)))
        }),
        Mode::DelayAnswersOnceClientSends(pattern, delay) => {
            shared.spawn(format!("proxy-{id}-c2s"), move || {
                client_to_server(
                    &conn2,
                    &shared2,
                    Some((&pattern, OnPattern::DelayAnswers(delay))),
                )
            })
        }
        Mode::Delay(delay) => {
            let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
            let (conn3, shared3) = (Arc::clone(&conn), Arc::clone(shared));
            shared.spawn(format!("proxy-{id}-c2s-read"), move || {
                read_loop(&conn2.client, &shared2, |chunk| {
                    tx.send((Instant::now() + delay, chunk.to_vec())).is_ok()
                });
                // Dropping `tx` lets the delay line drain, then close upstream.
            });
            shared.spawn(format!("proxy-{id}-c2s-delay"), move || {
                delay_line(&conn3, &shared3, rx)
            });
        }
    }
    Ok(())
}

/// Reads chunks until EOF, an error or stop, handing each to `chunk` (false: stop reading).
fn read_loop(from: &TcpStream, shared: &Shared, mut chunk: impl FnMut(&[u8]) -> bool) {
    let mut buf = vec![0u8; 64 * 1024];
    while !shared.stopped() {
        match (&*from).read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if !chunk(&buf[..n]) {
                    return;
                }
            }
            Err(err)
                if matches!(
                    err.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => return,
        }
    }
}

fn server_to_client(conn: &Conn, shared: &Shared) {
    let send = |bytes: &[u8]| {
        let cut = conn.cut.lock().unwrap();
        // After a cut, keep draining (and discarding) until the server closes.
        *cut || (&conn.client).write_all(bytes).is_ok()
    };
    // Chunks wait here until due (at once unless answers are delayed), in order.
    let mut line: std::collections::VecDeque<(Instant, Vec<u8>)> = Default::default();
    let mut buf = vec![0u8; 64 * 1024];
    let mut open = true;
    while open && !shared.stopped() {
        while line.front().is_some_and(|(due, _)| *due <= Instant::now()) {
            let (_, bytes) = line.pop_front().expect("a chunk");
            if !send(&bytes) {
                return;
            }
        }
        let wait = line.front().map_or(TICK, |(due, _)| {
            due.saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), TICK)
        });
        if conn.upstream.set_read_timeout(Some(wait)).is_err() {
            return;
        }
        match (&conn.upstream).read(&mut buf) {
            Ok(0) => open = false,
            Ok(n) => {
                let delay = conn.answers_delayed.lock().unwrap().unwrap_or_default();
                line.push_back((Instant::now() + delay, buf[..n].to_vec()));
            }
            Err(err)
                if matches!(
                    err.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => open = false,
        }
    }
    // The server closed: what it sent still reaches the client, each chunk when due.
    for (due, bytes) in line {
        thread::sleep(due.saturating_duration_since(Instant::now()));
        if shared.stopped() || !send(&bytes) {
            return;
        }
    }
    let cut = conn.cut.lock().unwrap();
    if !*cut {
        let _ = conn.client.shutdown(Shutdown::Write);
    }
}

/// What the client→server relay does at its pattern.
#[derive(Clone, Copy)]
enum OnPattern {
    Cut,
    Hold,
    DelayAnswers(Duration),
}

fn client_to_server(conn: &Conn, shared: &Shared, mut on: Option<(&[u8], OnPattern)>) {
    // The last bytes seen, to find a pattern that straddles two chunks.
    let mut tail: Vec<u8> = Vec::new();
    read_loop(&conn.client, shared, |chunk| {
        let Some((pattern, action)) = on else {
            return conn.to_upstream(shared, chunk).is_ok();
        };
        let mut window = std::mem::take(&mut tail);
        window.extend_from_slice(chunk);
        if !contains(&window, pattern) {
            let keep = pattern.len().saturating_sub(1).min(window.len());
            tail = window[window.len() - keep..].to_vec();
            return conn.to_upstream(shared, chunk).is_ok();
        }
        if let OnPattern::DelayAnswers(delay) = action {
            *conn.answers_delayed.lock().unwrap() = Some(delay);
            on = None;
            return conn.to_upstream(shared, chunk).is_ok();
        }
        if let OnPattern::Hold = action {
            // Not reading meanwhile: whatever the client sends next waits in the socket, in
            // order, behind this chunk.
            shared.held.fetch_add(1, Ordering::SeqCst);
            while !shared.open.load(Ordering::SeqCst) && !shared.stopped() {
                thread::sleep(Duration::from_millis(2));
            }
            shared.held.fetch_sub(1, Ordering::SeqCst);
            on = None;
            return conn.to_upstream(shared, chunk).is_ok();
        }
        // Cut: from now on the client hears nothing more; the server gets the chunk and the
        // end of its input; only then is the client's socket shut, so that whatever the
        // client does next, the cut is already counted and the chunk recorded.
        *conn.cut.lock().unwrap() = true;
        shared.cuts.fetch_add(1, Ordering::SeqCst);
        let _ = conn.to_upstream(shared, chunk);
        let _ = conn.upstream.shutdown(Shutdown::Write);
        let _ = conn.client.shutdown(Shutdown::Both);
        false
    });
    let cut = conn.cut.lock().unwrap();
    if !*cut {
        let _ = conn.upstream.shutdown(Shutdown::Write);
    }
}

fn delay_line(conn: &Conn, shared: &Shared, rx: mpsc::Receiver<(Instant, Vec<u8>)>) {
    loop {
        let (due, bytes) = match rx.recv_timeout(TICK) {
            Ok(item) => item,
            Err(RecvTimeoutError::Timeout) if !shared.stopped() => continue,
            Err(_) => break,
        };
        loop {
            if shared.stopped() {
                return;
            }
            let now = Instant::now();
            if now >= due {
                break;
            }
            thread::sleep((due - now).min(TICK));
        }
        if conn.to_upstream(shared, &bytes).is_err() {
            return;
        }
    }
    if !shared.stopped() {
        let _ = conn.upstream.shutdown(Shutdown::Write);
    }
}

impl Proxy {
    /// Waits until the PostgreSQL server at `url` has ended every session this proxy opened
    /// to it, so that what a cut-off transaction did (commit or rollback) is settled before a
    /// test reads the tables. A proxy that opened no session fails the test.
    pub fn wait_backends_gone(&self, url: &str) {
        let ports: Vec<String> = self.upstream_ports().iter().map(u16::to_string).collect();
        assert!(!ports.is_empty(), "the proxy made no upstream connection");
        let sql = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE client_addr = '127.0.0.1' \
             AND client_port IN ({})",
            ports.join(", ")
        );
        super::wait_for(
            "the server to end the proxied sessions",
            Duration::from_secs(30),
            || super::pg_query(url, &sql)[0].get::<_, i64>(0) == 0,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// An HTTP-aware proxy: rewrites or answers requests (object-store servers that ignore or
// reject preconditions, answer 429/501, …), cuts chosen requests before or after the server
// got them (a TCP pattern cannot tell where an HTTP request ends), and counts them.
// ---------------------------------------------------------------------------------------------

/// A request head as [`HttpProxy`] received it; a rule may change it before it is forwarded.
#[derive(Clone, Debug)]
pub struct HttpRequest {
    pub method: String,
    /// Path and query, as on the request line.
    pub target: String,
    pub headers: Vec<(String, String)>,
    /// The body as received (chunked bodies still framed).
    pub body: Vec<u8>,
}

impl HttpRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Removes every header called `name`; whether there was one.
    pub fn remove_header(&mut self, name: &str) -> bool {
        let before = self.headers.len();
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        before != self.headers.len()
    }

    /// Removes the query parameter `name` from the target; whether there was one.
    pub fn remove_query(&mut self, name: &str) -> bool {
        let Some((path, query)) = self.target.split_once('?') else {
            return false;
        };
        let kept: Vec<&str> = query
            .split('&')
            .filter(|p| p.split('=').next() != Some(name))
            .collect();
        let removed = kept.len() != query.split('&').count();
        self.target = if kept.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{}", kept.join("&"))
        };
        removed
    }
}

/// What a rule does with a request: forward it (possibly changed) or answer it itself.
pub enum Verdict {
    Forward,
    Answer {
        status: u16,
        body: String,
    },
    /// Forward the request, let the server apply it, and answer `status` instead of the
    /// server's answer (an answer lost on the way back).
    ForwardThenAnswer {
        status: u16,
    },
    /// Answer `status` with a head that announces a body, then send none and hold the
    /// connection open until the proxy stops (a refusal whose body never comes).
    AnswerWithoutBody {
        status: u16,
    },
    /// Answer `status` with these headers and body, forwarding nothing (a gateway that sends
    /// clients elsewhere: a redirect and its `Location`).
    Reply {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// Close the client's connection once it has sent the whole request, forwarding nothing
    /// (a connection lost before the request reached the server): no answer, nothing applied.
    Cut,
    /// Forward the request, let the server apply it and answer, then close the client's
    /// connection without a byte of the answer (a connection lost after the request reached
    /// the server).
    ForwardThenCut,
    /// Forward the request, and set header `name` of the server's answer to `value` (a proxy
    /// that writes its own `Date`).
    ForwardSettingAnswerHeader {
        name: String,
        value: String,
    },
}

pub type Rule = Arc<dyn Fn(&mut HttpRequest) -> Verdict + Send + Sync>;

#[derive(Default)]
struct HttpShared {
    stop: AtomicBool,
    /// `METHOD target` of every request received, before any rule changed it.
    seen: Mutex<Vec<String>>,
    /// The sockets of each exchange still going on (shut when the proxy is dropped), by its
    /// number: an exchange's are removed when it ends, so a long test holds no closed ones.
    sockets: Mutex<std::collections::HashMap<u64, Vec<TcpStream>>>,
    exchanges: std::sync::atomic::AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl HttpShared {
    fn keep(&self, exchange: u64, socket: &TcpStream) {
        if let Ok(copy) = socket.try_clone() {
            self.sockets
                .lock()
                .unwrap()
                .entry(exchange)
                .or_default()
                .push(copy);
        }
    }
}

/// A running HTTP proxy (one request per client connection, `Connection: close` both ways);
/// stops when dropped.
pub struct HttpProxy {
    addr: SocketAddr,
    shared: Arc<HttpShared>,
    accept: Option<JoinHandle<()>>,
}

impl HttpProxy {
    /// A forward proxy (the kind `HTTP_PROXY` or `AWS_PROXY_URL` names: requests arrive in
    /// absolute form, `PUT http://host:port/key`) in front of `upstream`: each request's
    /// target made a path again, then `rule` applied.
    pub fn forward(
        upstream: SocketAddr,
        rule: impl Fn(&mut HttpRequest) -> Verdict + Send + Sync + 'static,
    ) -> HttpProxy {
        HttpProxy::start(
            upstream,
            Arc::new(move |request: &mut HttpRequest| {
                if let Some(rest) = request.target.strip_prefix("http://") {
                    request.target = rest
                        .find('/')
                        .map_or_else(|| "/".to_owned(), |slash| rest[slash..].to_owned());
                }
                rule(request)
            }),
        )
    }

    pub fn start(upstream: SocketAddr, rule: Rule) -> HttpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(HttpShared::default());
        let accept = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("http-proxy-{addr}"))
                .spawn(move || {
                    while !shared.stop.load(Ordering::SeqCst) {
                        match listener.accept() {
                            Ok((client, _)) => {
                                let (shared2, rule) = (Arc::clone(&shared), Arc::clone(&rule));
                                let exchange = shared.exchanges.fetch_add(1, Ordering::SeqCst);
                                shared.keep(exchange, &client);
                                let handle = thread::spawn(move || {
                                    if let Err(err) =
                                        http_exchange(client, upstream, &rule, &shared2, exchange)
                                    {
                                        if !shared2.stop.load(Ordering::SeqCst) {
                                            eprintln!("http proxy: {err}");
                                        }
                                    }
                                    shared2.sockets.lock().unwrap().remove(&exchange);
                                });
                                let mut threads = shared.threads.lock().unwrap();
                                threads.retain(|thread| !thread.is_finished());
                                threads.push(handle);
                            }
                            Err(err) if err.kind() == ErrorKind::WouldBlock => {
                                thread::sleep(Duration::from_millis(5))
                            }
                            Err(_) => thread::sleep(TICK),
                        }
                    }
                })
                .expect("spawn the proxy's accept thread")
        };
        HttpProxy {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    /// A gateway in front of `upstream` that sends every request on to another proxy of
    /// `upstream` (which counts what reaches it) with a `307 Temporary Redirect` to the same
    /// target there: (the gateway, the other proxy).
    pub fn redirecting(upstream: SocketAddr) -> (HttpProxy, HttpProxy) {
        let elsewhere = HttpProxy::start(upstream, Arc::new(|_| Verdict::Forward));
        let to = elsewhere.endpoint();
        let gateway = HttpProxy::start(
            upstream,
            Arc::new(move |request| Verdict::Reply {
                status: 307,
                headers: vec![("Location".into(), format!("{to}{}", request.target))],
                body: String::new(),
            }),
        );
        (gateway, elsewhere)
    }

    /// `http://127.0.0.1:PORT`
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `METHOD target` of every request received so far, in order.
    pub fn seen(&self) -> Vec<String> {
        self.shared.seen.lock().unwrap().clone()
    }
}

impl Drop for HttpProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        for socket in self.shared.sockets.lock().unwrap().values().flatten() {
            let _ = socket.shutdown(Shutdown::Both);
        }
        let threads: Vec<_> = self.shared.threads.lock().unwrap().drain(..).collect();
        for thread in threads {
            let _ = thread.join();
        }
    }
}

/// Reads from `from` until `done(buffer)` holds or EOF, giving up after 30 s or on stop.
fn read_until(
    from: &TcpStream,
    buf: &mut Vec<u8>,
    stop: &AtomicBool,
    mut done: impl FnMut(&[u8]) -> bool,
) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut chunk = vec![0u8; 64 * 1024];
    while !done(buf) {
        if stop.load(Ordering::SeqCst) || Instant::now() > deadline {
            return Err(std::io::Error::new(ErrorKind::TimedOut, "gave up reading"));
        }
        match (&*from).read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(err)
                if matches!(
                    err.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

fn http_exchange(
    client: TcpStream,
    upstream: SocketAddr,
    rule: &Rule,
    shared: &HttpShared,
    exchange: u64,
) -> std::io::Result<()> {
    client.set_nonblocking(false)?;
    client.set_read_timeout(Some(TICK))?;
    let mut buf = Vec::new();
    read_until(&client, &mut buf, &shared.stop, |b| head_end(b).is_some())?;
    let Some(end) = head_end(&buf) else {
        return Ok(());
    };
    let head = String::from_utf8_lossy(&buf[..end - 4]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap_or_default().split(' ');
    let mut request = HttpRequest {
        method: request_line.next().unwrap_or_default().to_owned(),
        target: request_line.next().unwrap_or_default().to_owned(),
        headers: lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
            .collect(),
        body: Vec::new(),
    };
    shared
        .seen
        .lock()
        .unwrap()
        .push(format!("{} {}", request.method, request.target));
    let length: Option<usize> = request
        .header("content-length")
        .and_then(|v| v.parse().ok());
    let chunked = request
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    read_until(&client, &mut buf, &shared.stop, |b| {
        match (length, chunked) {
            (Some(n), _) => b.len() >= end + n,
            (None, true) => b.ends_with(b"0\r\n\r\n"),
            _ => true,
        }
    })?;
    request.body = buf[end..].to_vec();
    let reply = |status: u16, text: &str, headers: &str| {
        format!(
            "HTTP/1.1 {status} Proxy\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n{text}",
            text.len()
        )
    };
    match rule(&mut request) {
        Verdict::Answer { status, body } => {
            (&client)
                .write_all(reply(status, &body, "Content-Type: application/xml\r\n").as_bytes())?;
        }
        Verdict::AnswerWithoutBody { status } => {
            (&client).write_all(
                format!("HTTP/1.1 {status} Proxy\r\nContent-Length: 300\r\nContent-Type: application/xml\r\n\r\n")
                    .as_bytes(),
            )?;
            while !shared.stop.load(Ordering::SeqCst) {
                thread::sleep(TICK);
            }
        }
        Verdict::Reply {
            status,
            headers,
            body,
        } => {
            let headers: String = headers
                .iter()
                .map(|(name, value)| format!("{name}: {value}\r\n"))
                .collect();
            (&client).write_all(reply(status, &body, &headers).as_bytes())?;
        }
        Verdict::Cut => {}
        verdict @ (Verdict::Forward
        | Verdict::ForwardThenAnswer { .. }
        | Verdict::ForwardThenCut
        | Verdict::ForwardSettingAnswerHeader { .. }) => {
            let server = TcpStream::connect_timeout(&upstream, CONNECT_TIMEOUT)?;
            server.set_read_timeout(Some(TICK))?;
            shared.keep(exchange, &server);
            request.remove_header("connection");
            let mut out = format!("{} {} HTTP/1.1\r\n", request.method, request.target);
            for (name, value) in &request.headers {
                out.push_str(&format!("{name}: {value}\r\n"));
            }
            out.push_str("Connection: close\r\n\r\n");
            let mut bytes = out.into_bytes();
            bytes.extend_from_slice(&request.body);
            (&server).write_all(&bytes)?;
            let mut response = Vec::new();
            read_until(&server, &mut response, &shared.stop, |_| false)?;
            if let Verdict::ForwardThenCut = verdict {
                let _ = client.shutdown(Shutdown::Both);
                return Ok(());
            }
            if let Verdict::ForwardThenAnswer { status } = verdict {
                let body = format!("<Error><Code>Proxy{status}</Code><Message>the server's answer was lost by the test proxy</Message></Error>");
                (&client).write_all(
                    reply(status, &body, "Content-Type: application/xml\r\n").as_bytes(),
                )?;
                let _ = client.shutdown(Shutdown::Both);
                return Ok(());
            }
            // Our own Connection header, so the client never reuses this connection.
            let split = head_end(&response).unwrap_or(response.len());
            let head = String::from_utf8_lossy(&response[..split]).into_owned();
            let mut fixed: String = head
                .trim_end_matches("\r\n")
                .split("\r\n")
                .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
                .filter(|l| match &verdict {
                    Verdict::ForwardSettingAnswerHeader { name, .. } => !l
                        .to_ascii_lowercase()
                        .starts_with(&format!("{}:", name.to_ascii_lowercase())),
                    _ => true,
                })
                .map(|l| format!("{l}\r\n"))
                .collect();
            if let Verdict::ForwardSettingAnswerHeader { name, value } = &verdict {
                fixed.push_str(&format!("{name}: {value}\r\n"));
            }
            fixed.push_str("Connection: close\r\n\r\n");
            (&client).write_all(fixed.as_bytes())?;
            (&client).write_all(&response[split..])?;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    Ok(())
}

/// `at` as an HTTP date (`Sat, 05 Dec 2026 06:30:00 GMT`).
pub fn http_date(at: std::time::SystemTime) -> String {
    let secs = at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{weekday}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        months[(month - 1) as usize],
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}
