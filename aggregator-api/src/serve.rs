//! HTTPS serving: hyper 1 over rustls, HTTP/2 and HTTP/1.1 (ALPN), with every limit
//! explicit — connections (in all and per client IP), TLS handshake time, the time to the
//! first request and between requests, header sizes, concurrent streams, request bodies —
//! and a graceful drain on shutdown. Routing and answers live in [`Handler`]
//! implementations. What happened to connections is counted in [`ConnectionStats`], plain
//! counters that `selfmetrics` reads at each scrape; this module knows nothing of metrics.
//!
//! # What bounds a client
//!
//! | what | limit | when exceeded |
//! |---|---|---|
//! | connections | [`Limits::max_connections`] | new ones wait in the listen backlog |
//! | connections from one IP | [`Limits::max_connections_per_ip`] | new ones are closed at once (one WARN per IP reaching it) |
//! | TLS handshake | [`Limits::handshake_timeout`] | connection closed |
//! | first request's headers after the handshake (both protocols) | [`Limits::header_read_timeout`] | connection closed |
//! | each HTTP/1.1 request's headers, idle keep-alive included | [`Limits::header_read_timeout`] | connection closed (hyper) |
//! | no request in flight | [`Limits::idle_timeout`] | GOAWAY / close, then dropped after [`IDLE_CLOSE_GRACE`] |
//! | header size | [`Limits::max_header_bytes`], [`Limits::max_headers`] (HTTP/1.1) | 431 (HTTP/1.1: then closed; HTTP/2: for that stream only) |
//! | HTTP/2 streams | [`Limits::max_concurrent_streams`] | the client must wait (SETTINGS); extra streams are refused |
//! | HTTP/2 peer liveness | PING every [`Limits::keep_alive_interval`], [`Limits::keep_alive_timeout`] | connection closed |
//! | HTTP/2 resets | [`MAX_PENDING_ACCEPT_RESET_STREAMS`], [`MAX_LOCAL_ERROR_RESET_STREAMS`] | GOAWAY |
//! | request body ([`serve`] only) | [`Limits::max_body_bytes`], [`Limits::body_timeout`] | 413, 408 |

use std::{
    collections::HashMap,
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto::Builder,
};
use rustls::pki_types::CertificateDer;
use tokio::{
    net::TcpListener,
    sync::{watch, Notify, Semaphore},
    time::Instant,
};
use tokio_rustls::TlsAcceptor;

use crate::body::{text, Body};

/// Default [`Limits::max_connections_per_ip`] (`--max-connections-per-ip`): a quarter of
/// the API port's connections. A kube-apiserver needs a handful (one HTTP/2 connection
/// carries [`Limits::max_concurrent_streams`] requests).
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 1024;
/// Default [`Limits::max_concurrent_streams`] (`--http2-max-streams-per-connection`): Go's
/// HTTP/2 server default, which kube-apiserver and metrics-server use when the flag is 0.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 250;
/// HTTP/2 streams the client may reset before the server accepts them, before a GOAWAY
/// (the "rapid reset" bound; h2's default, set here so that it cannot change unseen).
pub const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;
/// HTTP/2 streams the server may reset for protocol errors, before a GOAWAY (hyper's
/// default, RUSTSEC-2024-0003).
pub const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;
/// How long an idle connection told to close (GOAWAY) may take before it is dropped.
pub const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Serving limits. Every one is explicit; the defaults suit an aggregated API server.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Concurrent connections; more wait in the listen backlog.
    pub max_connections: usize,
    /// Concurrent connections from one client IP address; more are closed as soon as they
    /// are accepted. 0: no limit.
    pub max_connections_per_ip: usize,
    /// Time allowed for a TLS handshake.
    pub handshake_timeout: Duration,
    /// Time allowed for a request's headers: for every HTTP/1.1 request (an idle
    /// keep-alive connection included), and for the first request of an HTTP/2
    /// connection, counted from the end of the TLS handshake. A connection that sends no
    /// complete request in this time is closed.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long (after its first request) is
    /// closed: GOAWAY on HTTP/2 (as k8s.io/apiserver's `http2.Server.IdleTimeout`, 90 s).
    pub idle_timeout: Duration,
    /// Largest request header block: HTTP/1.1 request line and headers, or an HTTP/2
    /// decoded header list (k8s.io/apiserver's `MaxHeaderBytes`, 1 MiB). Larger: 431.
    pub max_header_bytes: usize,
    /// Most header lines in an HTTP/1.1 request (the front proxy sends one
    /// `X-Remote-Group` line per group). More: 431.
    pub max_headers: usize,
    /// Concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// HTTP/2 PING interval on a connection that received nothing for that long; `None`
    /// disables.
    pub keep_alive_interval: Option<Duration>,
    /// Time allowed for a PING's acknowledgement before the connection is closed.
    pub keep_alive_timeout: Duration,
    /// Largest request body read (metrics.k8s.io takes none: larger ones get 413).
    pub max_body_bytes: usize,
    /// Time to read a request body.
    pub body_timeout: Duration,
    /// How long in-flight requests may take to finish after shutdown starts.
    pub drain_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 4096,
            max_connections_per_ip: DEFAULT_MAX_CONNECTIONS_PER_IP,
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(90),
            max_header_bytes: 1 << 20,
            max_headers: 512,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            keep_alive_interval: Some(Duration::from_secs(30)),
            keep_alive_timeout: Duration::from_secs(20),
            max_body_bytes: 64 << 10,
            body_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// Why the server ended a connection itself, before or instead of serving it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// Closed at accept: its IP address had [`Limits::max_connections_per_ip`] open.
    PerIpLimit,
    /// The TLS handshake failed (not TLS, no shared protocol version or cipher, a client
    /// certificate whose key the client does not hold, …).
    TlsFailed,
    /// The TLS handshake took longer than [`Limits::handshake_timeout`].
    TlsTimeout,
    /// No complete first request within [`Limits::header_read_timeout`] of the handshake.
    NoRequest,
    /// No request in flight for [`Limits::idle_timeout`] (GOAWAY or close).
    Idle,
}

impl Closed {
    /// Every reason, in the order of [`Closed::as_str`]'s table.
    pub const ALL: [Closed; 5] = [
        Closed::PerIpLimit,
        Closed::TlsFailed,
        Closed::TlsTimeout,
        Closed::NoRequest,
        Closed::Idle,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Closed::PerIpLimit => "per_ip_limit",
            Closed::TlsFailed => "tls_failed",
            Closed::TlsTimeout => "tls_timeout",
            Closed::NoRequest => "no_request",
            Closed::Idle => "idle",
        }
    }
}

/// One port's connections: open now, and ended by the server for each [`Closed`] reason.
/// Shared (`Arc`) between [`serve_connections`], which counts, and whoever reports.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    open: AtomicU64,
    closed: [AtomicU64; Closed::ALL.len()],
}

impl ConnectionStats {
    /// Zeroed counts.
    pub fn new() -> Arc<ConnectionStats> {
        Arc::new(ConnectionStats::default())
    }

    /// Connections accepted and not yet ended (TLS handshakes in progress included).
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections the server ended for `why`, since it started.
    pub fn closed(&self, why: Closed) -> u64 {
        self.closed[why as usize].load(Ordering::Relaxed)
    }

    /// Counts one connection ended for `why`.
    pub(crate) fn count(&self, why: Closed) {
        self.closed[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one connection open until the guard is dropped.
    fn opened(self: &Arc<Self>) -> OpenConnection {
        self.open.fetch_add(1, Ordering::Relaxed);
        OpenConnection(self.clone())
    }
}

/// One open connection counted in [`ConnectionStats::open`].
struct OpenConnection(Arc<ConnectionStats>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Who is on the other end of a connection, as TLS established it.
#[derive(Clone, Debug)]
pub struct Peer {
    /// Remote address.
    pub addr: SocketAddr,
    /// The client's certificate chain, if it presented one. **Unverified**: the TLS
    /// layer only checked possession of the key (see `auth::tls`); authentication
    /// verifies it against the current CA bundles before believing anything in it.
    pub client_certs: Option<Arc<Vec<CertificateDer<'static>>>>,
}

/// Answers requests. The body has already been read (bounded).
pub trait Handler: Send + Sync + 'static {
    /// One request.
    fn handle(
        &self,
        req: Request<Bytes>,
        peer: &Peer,
    ) -> impl std::future::Future<Output = Response<Body>> + Send;
}

/// Accepts connections on `listener` until `shutdown` resolves, then drains. Request
/// bodies are read whole, within [`Limits::max_body_bytes`] and [`Limits::body_timeout`],
/// before `handler` sees them. Connections are counted in `stats`.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    handler: Arc<H>,
    limits: Limits,
    stats: Arc<ConnectionStats>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let body_limits = limits.clone();
    let handle = move |req: Request<Incoming>, peer: Peer| {
        let handler = handler.clone();
        let limits = body_limits.clone();
        async move {
            let (parts, body) = req.into_parts();
            let read = tokio::time::timeout(
                limits.body_timeout,
                Limited::new(body, limits.max_body_bytes).collect(),
            )
            .await;
            let body = match read {
                Ok(Ok(c)) => c.to_bytes(),
                Ok(Err(_)) => {
                    return text(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n")
                }
                Err(_) => return text(StatusCode::REQUEST_TIMEOUT, "request body timed out\n"),
            };
            handler
                .handle(Request::from_parts(parts, body), &peer)
                .await
        }
    };
    serve_connections(listener, tls, limits, stats, shutdown, handle).await;
}

/// Accepts connections on `listener` until `shutdown` resolves, then drains (for at most
/// [`Limits::drain_timeout`]). Each request goes to `handle` with its body unread, so
/// that a streaming endpoint (the agents' ingest port) reads it as it comes; `handle`
/// bounds what it reads. [`Limits::max_body_bytes`] and [`Limits::body_timeout`] are not
/// applied here; every other limit is (see the module docs). Connections are counted in
/// `stats`.
pub async fn serve_connections<F, Fut>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    limits: Limits,
    stats: Arc<ConnectionStats>,
    shutdown: impl std::future::Future<Output = ()>,
    handle: F,
) where
    F: Fn(Request<Incoming>, Peer) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    let acceptor = TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let per_ip = PerIp::new(limits.max_connections_per_ip);
    let (stop, stopped) = watch::channel(false);
    let builder = Arc::new(builder(&limits));
    let limits = Arc::new(limits);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (tcp, addr) = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(ip_slot) = per_ip.claim(addr.ip()) else {
            // Dropping the socket closes it: the client sees the connection end before
            // its TLS handshake.
            stats.count(Closed::PerIpLimit);
            continue;
        };
        let open = stats.opened();
        let stats = stats.clone();
        let acceptor = acceptor.clone();
        let handle = handle.clone();
        let builder = builder.clone();
        let limits = limits.clone();
        let stopped = stopped.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _ip_slot = ip_slot;
            let _open = open;
            let tls =
                match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%addr, error = %e, "TLS handshake failed");
                        stats.count(Closed::TlsFailed);
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%addr, "TLS handshake timed out");
                        stats.count(Closed::TlsTimeout);
                        return;
                    }
                };
            if *stopped.borrow() {
                return;
            }
            let certs =
                tls.get_ref().1.peer_certificates().map(|c| {
                    Arc::new(c.iter().map(|d| d.clone().into_owned()).collect::<Vec<_>>())
                });
            let peer = Peer {
                addr,
                client_certs: certs,
            };
            let activity = Arc::new(Activity::new());
            let requests = activity.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let in_flight = requests.begin();
                let response = handle(req, peer.clone());
                async move {
                    let response = response.await;
                    Ok::<_, Infallible>(response.map(|body| Tracked {
                        body,
                        _in_flight: in_flight,
                    }))
                }
            });
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            if let Some(why) = drive(conn, &activity, stopped, &limits, addr).await {
                stats.count(why);
            }
        });
    }
    drop(listener);
    stop.send_replace(true);
    // Every connection holds a slot until it ends: all slots back means all ended.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(limits.drain_timeout, slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?limits.drain_timeout, "connections still open after the drain timeout; closing");
    }
}

/// hyper's connection builder with `limits`.
fn builder(limits: &Limits) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // The read buffer bounds the request head (hyper-util's builder has no
        // `max_header_size`): a head that does not fit gets 431.
        .max_buf_size(limits.max_header_bytes.max(MIN_BUF_SIZE))
        .max_headers(limits.max_headers)
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(limits.keep_alive_interval)
        .keep_alive_timeout(limits.keep_alive_timeout)
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESET_STREAMS);
    builder
}

/// hyper's smallest HTTP/1.1 buffer.
const MIN_BUF_SIZE: usize = 8192;

/// How a connection is being closed.
#[derive(Clone, Copy)]
enum Closing {
    /// It is not.
    No,
    /// Idle too long: told to close (GOAWAY), dropped at `until` if idle then.
    Idle { until: Instant },
    /// Shutdown: told to close, dropped at `idle_until` if no request is in flight, and at
    /// `drain_until` whatever it does.
    Shutdown {
        idle_until: Instant,
        drain_until: Instant,
    },
}

/// Drives one connection until it ends, closing it when it sends no first request in
/// time, when it stays idle, and on shutdown. Returns why the server closed it, if it did
/// so for a [`Closed`] reason.
async fn drive<C>(
    conn: C,
    activity: &Activity,
    mut stopped: watch::Receiver<bool>,
    limits: &Limits,
    addr: SocketAddr,
) -> Option<Closed>
where
    C: std::future::Future<Output = Result<(), Box<dyn std::error::Error + Send + Sync>>>
        + GracefulConnection,
{
    tokio::pin!(conn);
    let mut closing = Closing::No;
    loop {
        let idle = activity.idle_deadline(limits).is_some();
        let wake = match closing {
            Closing::No => activity.idle_deadline(limits).map(|(at, _)| at),
            Closing::Idle { until } => idle.then_some(until),
            Closing::Shutdown {
                idle_until,
                drain_until,
            } => Some(if idle {
                idle_until.min(drain_until)
            } else {
                drain_until
            }),
        };
        let shutting_down = matches!(closing, Closing::Shutdown { .. });
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%addr, error = %e, "connection ended with an error");
                }
                return matches!(closing, Closing::Idle { .. }).then_some(Closed::Idle);
            }
            _ = stopped.wait_for(|s| *s), if !shutting_down => {
                conn.as_mut().close_gracefully();
                let now = Instant::now();
                closing = Closing::Shutdown {
                    idle_until: now + IDLE_CLOSE_GRACE,
                    drain_until: now + limits.drain_timeout,
                };
            }
            () = activity.changed() => {}
            () = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                let now = Instant::now();
                let idle = activity.idle_deadline(limits).is_some();
                match closing {
                    Closing::No => match activity.idle_deadline(limits) {
                        Some((at, Idle::FirstRequest)) if at <= now => {
                            tracing::debug!(
                                %addr,
                                timeout = ?limits.header_read_timeout,
                                "no request on a new connection in time; closing it"
                            );
                            return Some(Closed::NoRequest);
                        }
                        Some((at, Idle::BetweenRequests)) if at <= now => {
                            tracing::debug!(%addr, timeout = ?limits.idle_timeout, "closing an idle connection");
                            conn.as_mut().close_gracefully();
                            closing = Closing::Idle { until: now + IDLE_CLOSE_GRACE };
                        }
                        _ => {}
                    },
                    Closing::Idle { until } => {
                        if idle && until <= now {
                            return Some(Closed::Idle);
                        }
                    }
                    Closing::Shutdown { idle_until, drain_until } => {
                        if drain_until <= now {
                            tracing::debug!(%addr, "connection still open after the drain timeout; dropping it");
                            return None;
                        }
                        if idle && idle_until <= now {
                            return None;
                        }
                    }
                }
            }
        }
    }
}

/// A connection that can be asked to finish its requests and close.
trait GracefulConnection {
    /// hyper's `graceful_shutdown`: HTTP/2 GOAWAY, HTTP/1.1 close after the response in
    /// flight, a connection still sniffing its protocol is cancelled.
    fn close_gracefully(self: Pin<&mut Self>);
}

impl<I, S, E, B> GracefulConnection for hyper_util::server::conn::auto::Connection<'_, I, S, E>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper_util::server::conn::auto::HttpServerConnExec<S::Future, B>,
{
    fn close_gracefully(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// Which idle limit applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Idle {
    /// No request yet: [`Limits::header_read_timeout`].
    FirstRequest,
    /// Between requests: [`Limits::idle_timeout`].
    BetweenRequests,
}

/// Requests in flight on one connection, and since when it is idle.
struct Activity {
    state: parking_lot::Mutex<ActivityState>,
    changed: Notify,
}

struct ActivityState {
    in_flight: usize,
    served: bool,
    idle_since: Instant,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            state: parking_lot::Mutex::new(ActivityState {
                in_flight: 0,
                served: false,
                idle_since: Instant::now(),
            }),
            changed: Notify::new(),
        }
    }

    /// A request started; it ends when the guard is dropped (with its response body).
    fn begin(self: &Arc<Self>) -> InFlight {
        let first = {
            let mut s = self.state.lock();
            s.in_flight += 1;
            s.served = true;
            s.in_flight == 1
        };
        if first {
            self.changed.notify_one();
        }
        InFlight(self.clone())
    }

    /// When the connection will have been idle too long, and by which limit; `None` while
    /// a request is in flight.
    fn idle_deadline(&self, limits: &Limits) -> Option<(Instant, Idle)> {
        let s = self.state.lock();
        if s.in_flight > 0 {
            None
        } else if s.served {
            Some((s.idle_since + limits.idle_timeout, Idle::BetweenRequests))
        } else {
            Some((
                s.idle_since + limits.header_read_timeout,
                Idle::FirstRequest,
            ))
        }
    }

    /// Resolves when the connection became busy or idle since the last call.
    async fn changed(&self) {
        self.changed.notified().await;
    }
}

/// One request in flight.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let idle = {
            let mut s = self.0.state.lock();
            s.in_flight = s.in_flight.saturating_sub(1);
            if s.in_flight == 0 {
                s.idle_since = Instant::now();
            }
            s.in_flight == 0
        };
        if idle {
            self.0.changed.notify_one();
        }
    }
}

/// A response body that keeps its request counted as in flight until hyper is done with
/// it (sent, or the stream reset).
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Open connections per client IP ([`Limits::max_connections_per_ip`]).
struct PerIp {
    max: usize,
    open: parking_lot::Mutex<HashMap<IpAddr, IpCount>>,
}

#[derive(Default)]
struct IpCount {
    open: usize,
    /// Whether reaching the limit was logged (once, until every connection from the
    /// address ended).
    warned: bool,
}

impl PerIp {
    fn new(max: usize) -> Arc<PerIp> {
        Arc::new(PerIp {
            max,
            open: parking_lot::Mutex::new(HashMap::new()),
        })
    }

    /// A slot for one more connection from `ip`, or `None` when it has its maximum.
    fn claim(self: &Arc<Self>, ip: IpAddr) -> Option<IpSlot> {
        if self.max == 0 {
            return Some(IpSlot(None));
        }
        let ip = ip.to_canonical();
        let mut open = self.open.lock();
        let count = open.entry(ip).or_default();
        if count.open >= self.max {
            if !count.warned {
                count.warned = true;
                tracing::warn!(
                    %ip,
                    max = self.max,
                    "connections from this address reached --max-connections-per-ip; \
                     closing new ones until some end"
                );
            } else {
                tracing::debug!(%ip, max = self.max, "connection refused: too many from this address");
            }
            return None;
        }
        count.open += 1;
        Some(IpSlot(Some((self.clone(), ip))))
    }
}

/// One connection counted against its IP.
struct IpSlot(Option<(Arc<PerIp>, IpAddr)>);

impl Drop for IpSlot {
    fn drop(&mut self) {
        let Some((per_ip, ip)) = self.0.take() else {
            return;
        };
        let mut open = per_ip.open.lock();
        if let Some(count) = open.get_mut(&ip) {
            count.open = count.open.saturating_sub(1);
            if count.open == 0 {
                open.remove(&ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::x509::testing::TestCa;
    use crate::body::full;

    /// Answers with the CN of the client certificate the connection presented.
    struct EchoCn;

    impl Handler for EchoCn {
        async fn handle(&self, _req: Request<Bytes>, peer: &Peer) -> Response<Body> {
            let cn = peer
                .client_certs
                .as_ref()
                .and_then(|c| c.first())
                .and_then(|c| crate::auth::x509::identity(c).ok())
                .map_or("none".to_string(), |u| u.name);
            text(StatusCode::OK, cn)
        }
    }

    fn server_config() -> Arc<rustls::ServerConfig> {
        server_config_with(&[b"http/1.1"])
    }

    fn server_config_with(alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
        let g = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(g.signing_key.serialize_der()).expect("key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut c = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_client_cert_verifier(crate::auth::tls::RequestClientCert::new(&provider))
            .with_single_cert(vec![g.cert.der().clone()], key)
            .expect("config");
        c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(c)
    }

    #[derive(Debug)]
    struct NoServerCheck(Arc<rustls::crypto::CryptoProvider>);

    impl rustls::client::danger::ServerCertVerifier for NoServerCheck {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    /// One HTTP/1.1 GET over TLS, optionally with a client certificate.
    async fn get(
        port: u16,
        client: Option<(
            CertificateDer<'static>,
            rustls::pki_types::PrivateKeyDer<'static>,
        )>,
    ) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let b = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoServerCheck(provider)));
        let cfg = match client {
            Some((c, k)) => b.with_client_auth_cert(vec![c], k).expect("client cert"),
            None => b.with_no_client_auth(),
        };
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(name, tcp)
            .await
            .expect("handshake");
        tls.write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut out = String::new();
        tls.read_to_string(&mut out).await.expect("read");
        out.rsplit("\r\n\r\n").next().unwrap_or("").to_string()
    }

    #[tokio::test]
    async fn client_certificates_reach_the_handler_unjudged() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            server_config(),
            Arc::new(EchoCn),
            Limits::default(),
            ConnectionStats::new(),
            async {
                let _ = stop_rx.await;
            },
        ));
        // No certificate: fine, and nothing to report.
        assert_eq!(get(port, None).await, "none");
        // A certificate from any CA is passed on for authentication to judge.
        let ca = TestCa::new("some-ca");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = ca.client_with_key("front-proxy-client", &key);
        let der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key der");
        assert_eq!(get(port, Some((cert, der))).await, "front-proxy-client");
        let _ = stop_tx.send(());
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("drained in time")
            .expect("server task");
    }

    // ---------------------------------------------------------------------------------
    // Limits, over real TCP and TLS on loopback, with short timeouts.

    /// `/` answers `len=<body length>`; `/hold` waits for a permit of `gate` first.
    struct Gate(Arc<Semaphore>);

    impl Handler for Gate {
        async fn handle(&self, req: Request<Bytes>, _peer: &Peer) -> Response<Body> {
            if req.uri().path() == "/hold" {
                if let Ok(p) = self.0.acquire().await {
                    p.forget();
                }
            }
            text(StatusCode::OK, format!("len={}", req.body().len()))
        }
    }

    struct TestServer {
        port: u16,
        gate: Arc<Semaphore>,
        stats: Arc<ConnectionStats>,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl TestServer {
        async fn start(limits: Limits) -> TestServer {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let port = listener.local_addr().expect("addr").port();
            let gate = Arc::new(Semaphore::new(0));
            let stats = ConnectionStats::new();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(serve(
                listener,
                server_config_with(&[b"h2", b"http/1.1"]),
                Arc::new(Gate(gate.clone())),
                limits,
                stats.clone(),
                async {
                    let _ = stopped.await;
                },
            ));
            TestServer {
                port,
                gate,
                stats,
                stop: Some(stop),
                task,
            }
        }

        /// Waits (at most 5 s) until no connection is open: a connection's task, which
        /// counts why it ended, may finish a moment after the client saw the close.
        async fn settled(&self) {
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.stats.open() > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }

        async fn stop(mut self) {
            if let Some(s) = self.stop.take() {
                let _ = s.send(());
            }
            tokio::time::timeout(Duration::from_secs(10), &mut self.task)
                .await
                .expect("drained in time")
                .expect("server task");
        }
    }

    type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

    /// A TLS connection from `from` (a loopback address) offering `alpn`.
    async fn connect(port: u16, from: [u8; 4], alpn: &[u8]) -> std::io::Result<Tls> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoServerCheck(provider)))
            .with_no_client_auth();
        cfg.alpn_protocols = vec![alpn.to_vec()];
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::from((from, 0)))?;
        let tcp = socket
            .connect(SocketAddr::from(([127, 0, 0, 1], port)))
            .await?;
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(name, tcp)
            .await
    }

    /// Reads (and discards) until the server closes `tls`, writing `trickle` one byte
    /// every 100 ms meanwhile; how long that took.
    async fn time_to_close(tls: Tls, trickle: Vec<u8>) -> Duration {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let started = Instant::now();
        let (mut rd, mut wr) = tokio::io::split(tls);
        let writer = tokio::spawn(async move {
            for b in trickle {
                if wr.write_all(&[b]).await.is_err() || wr.flush().await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // Then silence, with the connection left open.
            std::future::pending::<()>().await;
        });
        let mut buf = [0u8; 4096];
        let read = tokio::time::timeout(Duration::from_secs(20), async {
            while let Ok(n) = rd.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
        writer.abort();
        assert!(read.is_ok(), "the server kept the connection open for 20 s");
        started.elapsed()
    }

    /// An HTTP/2 frame.
    fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).expect("len").to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn short_header_timeout() -> Limits {
        Limits {
            header_read_timeout: Duration::from_secs(1),
            ..Limits::default()
        }
    }

    fn assert_closed_after(took: Duration, limit: Duration, what: &str) {
        eprintln!("{what}: closed after {took:?} (limit {limit:?})");
        assert!(
            took >= limit.mul_f32(0.9) && took < limit + Duration::from_secs(5),
            "{what}: closed after {took:?}, the limit is {limit:?}"
        );
    }

    #[tokio::test]
    async fn slow_or_silent_clients_are_closed_after_the_header_timeout() {
        let limits = short_header_timeout();
        let limit = limits.header_read_timeout;
        let server = TestServer::start(limits).await;
        // HTTP/1.1: a request line, then a header trickled byte by byte (30 bytes: 3 s).
        let h1 = connect(server.port, [127, 0, 0, 1], b"http/1.1")
            .await
            .expect("connect");
        let mut trickle = b"GET / HTTP/1.1\r\n".to_vec();
        trickle.extend(std::iter::repeat_n(b'x', 30));
        let took = time_to_close(h1, trickle).await;
        assert_closed_after(took, limit, "HTTP/1.1 trickling its headers");

        // HTTP/2 saying nothing at all after the handshake.
        let h2 = connect(server.port, [127, 0, 0, 1], b"h2")
            .await
            .expect("connect");
        let took = time_to_close(h2, Vec::new()).await;
        assert_closed_after(took, limit, "silent HTTP/2");
        assert!(
            server.stats.closed(Closed::NoRequest) >= 1,
            "the silent connection is counted"
        );

        // HTTP/2: preface, SETTINGS, a HEADERS frame without END_HEADERS, then one
        // CONTINUATION frame after another (a literal header each), never ending.
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(h2_frame(0x4, 0, 0, &[]));
        bytes.extend(h2_frame(0x1, 0x0, 1, &[0x82]));
        for _ in 0..30 {
            bytes.extend(h2_frame(0x9, 0x0, 1, &[0x00, 0x01, b'x', 0x01, b'y']));
        }
        let h2 = connect(server.port, [127, 0, 0, 1], b"h2")
            .await
            .expect("connect");
        let started = Instant::now();
        // The preface and SETTINGS at once, then 10 bytes every 100 ms.
        let (mut rd, mut wr) = tokio::io::split(h2);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let preface_and_settings = 24 + 9;
            if wr.write_all(&bytes[..preface_and_settings]).await.is_err() {
                return;
            }
            for frame in bytes[preface_and_settings..].chunks(10) {
                if wr.write_all(frame).await.is_err() || wr.flush().await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            std::future::pending::<()>().await;
        });
        let closed = tokio::time::timeout(Duration::from_secs(20), async {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 4096];
            while let Ok(n) = rd.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
        writer.abort();
        assert!(
            closed.is_ok(),
            "trickled HTTP/2 headers kept the connection"
        );
        assert_closed_after(
            started.elapsed(),
            limit,
            "HTTP/2 trickling CONTINUATION frames",
        );
        server.stop().await;
    }

    /// An HTTP/2 client connection: the request sender and the connection's task (which
    /// ends when the server closes the connection).
    async fn h2_client(
        port: u16,
    ) -> (
        hyper::client::conn::http2::SendRequest<Body>,
        tokio::task::JoinHandle<()>,
    ) {
        let tls = connect(port, [127, 0, 0, 1], b"h2").await.expect("connect");
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .expect("h2 handshake");
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        (send, task)
    }

    fn request(path: &str) -> Request<Body> {
        Request::get(format!("https://localhost{path}"))
            .body(full(Bytes::new()))
            .expect("request")
    }

    async fn body_text(r: Response<Incoming>) -> (StatusCode, String) {
        let status = r.status();
        let body = r.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn idle_connections_are_closed_busy_ones_are_not() {
        let limits = Limits {
            idle_timeout: Duration::from_secs(1),
            ..Limits::default()
        };
        let limit = limits.idle_timeout;
        let server = TestServer::start(limits).await;
        let (mut send, conn) = h2_client(server.port).await;
        // A request that takes longer than the idle timeout is not cut.
        let held = send.send_request(request("/hold"));
        let release = {
            let gate = server.gate.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                gate.add_permits(1);
            }
        };
        let (r, ()) = tokio::join!(held, release);
        let (status, _) = body_text(r.expect("held request answered")).await;
        assert_eq!(status, StatusCode::OK);
        // Then idle: GOAWAY and the connection ends.
        let idle_from = Instant::now();
        tokio::time::timeout(Duration::from_secs(20), conn)
            .await
            .expect("idle connection closed")
            .expect("task");
        assert_closed_after(idle_from.elapsed(), limit, "idle HTTP/2 connection");
        server.settled().await;
        assert_eq!(server.stats.closed(Closed::Idle), 1);
        assert_eq!(server.stats.closed(Closed::NoRequest), 0);
        server.stop().await;
    }

    #[tokio::test]
    async fn connections_per_address_are_limited() {
        let server = TestServer::start(Limits {
            max_connections_per_ip: 2,
            ..Limits::default()
        })
        .await;
        let mut held = Vec::new();
        for _ in 0..2 {
            let (mut send, conn) = h2_client(server.port).await;
            let (status, _) =
                body_text(send.send_request(request("/")).await.expect("answer")).await;
            assert_eq!(status, StatusCode::OK);
            held.push((send, conn));
        }
        // A third from the same address is closed before its handshake completes (or,
        // at the latest, before it gets an answer).
        let third = async {
            let tls = connect(server.port, [127, 0, 0, 1], b"h2").await?;
            let (mut send, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                    .await
                    .map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            send.send_request(request("/"))
                .await
                .map_err(std::io::Error::other)
        };
        let refused = tokio::time::timeout(Duration::from_secs(10), third)
            .await
            .expect("refused in time");
        assert!(
            refused.is_err(),
            "a third connection from 127.0.0.1 was served"
        );
        assert_eq!(server.stats.closed(Closed::PerIpLimit), 1);
        assert_eq!(server.stats.open(), 2);
        // Another address is not affected.
        let other = connect(server.port, [127, 0, 0, 2], b"h2")
            .await
            .expect("127.0.0.2 connects");
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(other))
                .await
                .expect("handshake");
        tokio::spawn(conn);
        let (status, _) = body_text(send.send_request(request("/")).await.expect("answer")).await;
        assert_eq!(status, StatusCode::OK);
        // When one ends, 127.0.0.1 may connect again.
        let (send, conn) = held.pop().expect("held");
        drop(send);
        conn.abort();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let again = async {
                let tls = connect(server.port, [127, 0, 0, 1], b"h2").await?;
                let (mut send, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                        .await
                        .map_err(std::io::Error::other)?;
                tokio::spawn(conn);
                send.send_request(request("/"))
                    .await
                    .map_err(std::io::Error::other)
            };
            if again.await.is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the freed slot was not given back"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(held);
        server.stop().await;
    }

    #[tokio::test]
    async fn http2_streams_per_connection_are_limited() {
        let server = TestServer::start(Limits {
            max_concurrent_streams: 2,
            ..Limits::default()
        })
        .await;
        let (send, _conn) = h2_client(server.port).await;
        let mut first = send.clone();
        let mut second = send.clone();
        let mut third = send.clone();
        let a = tokio::spawn(async move { first.send_request(request("/hold")).await });
        let b = tokio::spawn(async move { second.send_request(request("/hold")).await });
        // Both held requests are in the handler before the third is sent.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let c = tokio::spawn(async move { third.send_request(request("/")).await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !c.is_finished(),
            "a third stream was served while two were open"
        );
        server.gate.add_permits(1);
        let (status, _) = body_text(
            tokio::time::timeout(Duration::from_secs(10), c)
                .await
                .expect("third answered once a stream closed")
                .expect("task")
                .expect("answer"),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        server.gate.add_permits(1);
        for held in [a, b] {
            let r = held.await.expect("task").expect("answer");
            assert_eq!(r.status(), StatusCode::OK);
        }
        server.stop().await;
    }

    /// One HTTP/1.1 request written raw; the status code (0: no answer).
    async fn h1_status(port: u16, head: &[u8], body: &[u8]) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(mut tls) = connect(port, [127, 0, 0, 1], b"http/1.1").await else {
            return 0;
        };
        if tls.write_all(head).await.is_err() || tls.write_all(body).await.is_err() {
            // The server may answer and close before reading everything.
        }
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out);
        text.strip_prefix("HTTP/1.1 ")
            .and_then(|r| r.get(..3))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0)
    }

    fn head_with(headers: &[(String, String)]) -> Vec<u8> {
        let mut h = b"GET / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n".to_vec();
        for (k, v) in headers {
            h.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
        }
        h.extend_from_slice(b"\r\n");
        h
    }

    #[tokio::test]
    async fn header_sizes_are_limited() {
        let limits = Limits {
            max_header_bytes: 16 << 10,
            max_headers: 20,
            ..Limits::default()
        };
        let server = TestServer::start(limits).await;
        let big = |n: usize| vec![("x-big".to_string(), "a".repeat(n))];
        // HTTP/1.1: the head fits, or 431.
        assert_eq!(
            h1_status(server.port, &head_with(&big(8 << 10)), b"").await,
            200
        );
        assert_eq!(
            h1_status(server.port, &head_with(&big(16 << 10)), b"").await,
            431
        );
        let many = |n: usize| -> Vec<(String, String)> {
            (0..n)
                .map(|i| ("x-remote-group".to_string(), format!("g{i}")))
                .collect()
        };
        assert_eq!(
            h1_status(server.port, &head_with(&many(10)), b"").await,
            200
        );
        assert_eq!(
            h1_status(server.port, &head_with(&many(30)), b"").await,
            431
        );
        // HTTP/2: 431 for that stream, the connection goes on.
        let (mut send, _conn) = h2_client(server.port).await;
        let mut req = request("/");
        req.headers_mut().insert(
            "x-big",
            http::HeaderValue::from_str(&"a".repeat(20 << 10)).expect("value"),
        );
        match send.send_request(req).await {
            Ok(r) => assert_eq!(r.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
            Err(e) => panic!("expected a 431, got {e}"),
        }
        let (status, _) = body_text(send.send_request(request("/")).await.expect("answer")).await;
        assert_eq!(status, StatusCode::OK, "the connection survives");
        server.stop().await;
    }

    #[tokio::test]
    async fn bodies_are_limited_in_size_and_time() {
        let limits = Limits {
            max_body_bytes: 1024,
            body_timeout: Duration::from_secs(1),
            ..Limits::default()
        };
        let limit = limits.body_timeout;
        let server = TestServer::start(limits).await;
        let post = |n: usize| {
            format!("POST / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-length: {n}\r\n\r\n")
                .into_bytes()
        };
        assert_eq!(
            h1_status(server.port, &post(1024), &[b'a'; 1024]).await,
            200
        );
        assert_eq!(
            h1_status(server.port, &post(1025), &[b'a'; 1025]).await,
            413
        );
        // A body trickled a byte every 100 ms: 408 once the body timeout is over.
        let tls = connect(server.port, [127, 0, 0, 1], b"http/1.1")
            .await
            .expect("connect");
        let mut trickle = post(100);
        let head = trickle.len();
        trickle.extend([b'a'; 100]);
        let started = Instant::now();
        let (mut rd, mut wr) = tokio::io::split(tls);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = wr.write_all(&trickle[..head]).await;
            for b in &trickle[head..] {
                if wr.write_all(&[*b]).await.is_err() || wr.flush().await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(20), {
            use tokio::io::AsyncReadExt;
            rd.read_to_end(&mut out)
        })
        .await;
        writer.abort();
        let took = started.elapsed();
        assert!(
            String::from_utf8_lossy(&out).starts_with("HTTP/1.1 408"),
            "{}",
            String::from_utf8_lossy(&out)
        );
        assert_closed_after(took, limit, "a trickled body");
        server.stop().await;
    }

    #[tokio::test]
    async fn failed_and_slow_tls_handshakes_are_closed_and_counted() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let limit = Duration::from_secs(1);
        let server = TestServer::start(Limits {
            handshake_timeout: limit,
            ..Limits::default()
        })
        .await;
        // Plain HTTP on the TLS port: the handshake fails at once.
        let mut plain = tokio::net::TcpStream::connect(("127.0.0.1", server.port))
            .await
            .expect("connect");
        plain
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut buf))
            .await
            .expect("closed in time")
            .ok();
        // A client that connects and says nothing: closed at the handshake timeout.
        let silent = tokio::net::TcpStream::connect(("127.0.0.1", server.port))
            .await
            .expect("connect");
        let from = Instant::now();
        let (mut rd, _wr) = silent.into_split();
        tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut buf))
            .await
            .expect("closed in time")
            .ok();
        assert_closed_after(from.elapsed(), limit, "silent TCP connection");
        server.settled().await;
        assert_eq!(server.stats.closed(Closed::TlsFailed), 1);
        assert_eq!(server.stats.closed(Closed::TlsTimeout), 1);
        assert_eq!(server.stats.open(), 0);
        server.stop().await;
    }

    #[tokio::test]
    async fn shutdown_does_not_wait_for_idle_or_silent_connections() {
        // Only shutdown may close these connections within the test.
        let server = TestServer::start(Limits {
            header_read_timeout: Duration::from_secs(120),
            ..Limits::default()
        })
        .await;
        // Open at shutdown: a silent connection, an idle HTTP/2 one, and one in the middle
        // of a header block that will never acknowledge the GOAWAY's PING.
        let _silent = connect(server.port, [127, 0, 0, 1], b"h2")
            .await
            .expect("connect");
        let (mut send, _conn) = h2_client(server.port).await;
        let (status, _) = body_text(send.send_request(request("/")).await.expect("answer")).await;
        assert_eq!(status, StatusCode::OK);
        let mut partial = connect(server.port, [127, 0, 0, 1], b"h2")
            .await
            .expect("connect");
        {
            use tokio::io::AsyncWriteExt;
            let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
            bytes.extend(h2_frame(0x4, 0, 0, &[]));
            bytes.extend(h2_frame(0x1, 0x0, 1, &[0x82]));
            partial.write_all(&bytes).await.expect("write");
            partial.flush().await.expect("flush");
        }
        let started = Instant::now();
        server.stop().await;
        eprintln!("drained in {:?}", started.elapsed());
        assert!(
            started.elapsed() < IDLE_CLOSE_GRACE + Duration::from_secs(3),
            "drained in {:?}",
            started.elapsed()
        );
    }
}
