//! One replica: the reconnect loop ([`run_replica`]) and one stream's life (`Stream`).

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use bytes::Bytes;
use http::{header, HeaderValue, Request, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use kpulse_wire::{
    stream::{
        self, AgentMessage, Decoder, Previous, ServerMessage, Snapshot, Update, Version,
        CONTENT_TYPE, STREAM_PATH, VERSION, VERSION_HEADER,
    },
    UnixNanos,
};
use prometheus_client::metrics::gauge::Gauge;
use tokio::{
    net::TcpStream,
    sync::{broadcast, mpsc, watch},
};

use super::{
    split_host_port, stopped, Credentials, ErrorLabels, Published, ReplicaLabel, Retry, Shared,
    Target, TargetAddr, Timeouts,
};
use crate::attribute::{MetaChanges, PodSet};

/// Frames buffered between a stream's task and its HTTP/2 request body. Small: the queue
/// that matters, and drops the oldest, is the tick queue in front of it.
const BODY_FRAMES: usize = 4;

/// Largest token file read.
const MAX_TOKEN_BYTES: u64 = 64 << 10;

/// Largest refusal body read.
const MAX_REFUSAL_BYTES: usize = 64 << 10;

/// Why a stream failed or ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The token file could not be read.
    #[error("cannot read the token file {path}")]
    Token {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The token is empty, too large or not a valid header value.
    #[error(
        "the token in {path} is empty, over {MAX_TOKEN_BYTES} bytes, or not a valid header value"
    )]
    BadToken {
        /// The file (or `<static>`).
        path: PathBuf,
    },
    /// DNS failed.
    #[error("cannot resolve {target}")]
    Resolve {
        /// `host:port`.
        target: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// DNS gave no address.
    #[error("{target} resolves to no address")]
    NoAddress {
        /// `host:port`.
        target: String,
    },
    /// TCP connect failed.
    #[error("cannot connect to {addr}")]
    Connect {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A step took too long.
    #[error("timed out {what}")]
    Timeout {
        /// The step.
        what: &'static str,
    },
    /// The TLS handshake failed (certificate, name, ALPN, ...).
    #[error("TLS handshake failed")]
    Tls {
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// HTTP/2 failed (handshake, reset, GOAWAY, PING timeout).
    #[error("HTTP/2")]
    Http {
        /// The cause.
        #[source]
        source: hyper::Error,
    },
    /// 401/403: the server does not accept this agent's identity for this node.
    #[error("aggregator refused the agent's identity (HTTP {status}): {message}")]
    Identity {
        /// The status.
        status: StatusCode,
        /// The server's message.
        message: String,
    },
    /// The server speaks another major version.
    #[error("aggregator refused the wire protocol: the agent speaks {ours}, the server {theirs}: {message}")]
    Version {
        /// Our version.
        ours: Version,
        /// The server's version, or a phrase when it did not say.
        theirs: String,
        /// The server's message.
        message: String,
    },
    /// Another refusal.
    #[error("aggregator refused the stream (HTTP {status}): {message}")]
    Refused {
        /// The status.
        status: StatusCode,
        /// The server's message.
        message: String,
    },
    /// The server sent an `Error` frame.
    #[error("aggregator ended the stream: {message}")]
    Server {
        /// The server's message.
        message: String,
    },
    /// The response ended without an `Error` frame.
    #[error("aggregator ended the stream without saying why")]
    Ended,
    /// The request body was dropped (the stream was reset or the connection closed).
    #[error("the connection closed while sending")]
    Closed,
    /// A frame could not be handed to the connection in time (flow control stalled).
    #[error("stream stalled: a frame could not be sent for {waited:?}")]
    Stalled {
        /// How long it waited.
        waited: Duration,
    },
    /// The response stream is not frames of this protocol.
    #[error("malformed response stream")]
    Protocol {
        /// The cause.
        #[source]
        source: stream::Error,
    },
    /// The request could not be built (an authority that is not a URI authority).
    #[error("cannot build the request")]
    Request {
        /// The cause.
        #[source]
        source: http::Error,
    },
    /// A message does not fit a frame.
    #[error("cannot encode a frame")]
    Encode {
        /// The cause.
        #[source]
        source: stream::Error,
    },
}

impl StreamError {
    /// Every [`StreamError::reason`].
    pub const REASONS: [&'static str; 18] = [
        "token",
        "bad_token",
        "resolve",
        "no_address",
        "connect",
        "timeout",
        "tls",
        "http",
        "identity",
        "version",
        "refused",
        "server_error",
        "ended",
        "closed",
        "stalled",
        "protocol",
        "request",
        "encode",
    ];

    /// A short label for metrics (`reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            StreamError::Token { .. } => "token",
            StreamError::BadToken { .. } => "bad_token",
            StreamError::Resolve { .. } => "resolve",
            StreamError::NoAddress { .. } => "no_address",
            StreamError::Connect { .. } => "connect",
            StreamError::Timeout { .. } => "timeout",
            StreamError::Tls { .. } => "tls",
            StreamError::Http { .. } => "http",
            StreamError::Identity { .. } => "identity",
            StreamError::Version { .. } => "version",
            StreamError::Refused { .. } => "refused",
            StreamError::Server { .. } => "server_error",
            StreamError::Ended => "ended",
            StreamError::Closed => "closed",
            StreamError::Stalled { .. } => "stalled",
            StreamError::Protocol { .. } => "protocol",
            StreamError::Request { .. } => "request",
            StreamError::Encode { .. } => "encode",
        }
    }

    /// Whether the connection was refused: nothing listens on the replica's port (a replica
    /// restarting, or not yet listening). Such attempts back off only up to
    /// [`Backoff::refused_max`](super::Backoff::refused_max).
    pub fn is_connection_refused(&self) -> bool {
        matches!(self, StreamError::Connect { source, .. }
            if source.kind() == std::io::ErrorKind::ConnectionRefused)
    }

    /// Whether the server (or our configuration) said no, rather than the network failing:
    /// these are ERRORs, the others WARNs.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            StreamError::Token { .. }
                | StreamError::BadToken { .. }
                | StreamError::Identity { .. }
                | StreamError::Version { .. }
                | StreamError::Refused { .. }
                | StreamError::Server { .. }
                | StreamError::Request { .. }
                | StreamError::Encode { .. }
        )
    }
}

/// The reconnect loop of one replica; returns when `stop` turns true.
pub(super) async fn run_replica(
    shared: Arc<Shared>,
    target: Target,
    mut stop: watch::Receiver<bool>,
) {
    let metrics = &shared.config.metrics;
    let backoff = shared.config.backoff;
    let label = ReplicaLabel {
        replica: target.label.clone(),
    };
    let mut rng = fastrand::Rng::new();
    let mut retry = Retry::default();
    let mut report = Report {
        replica: &target.label,
        last: None,
        ever_up: false,
    };
    loop {
        let mut s = Stream {
            shared: &shared,
            target: &target,
            welcomed_at: None,
            sent_pods: Arc::new(PodSet::default()),
            last_seq: 0,
        };
        let refused = match s.run(&mut stop, &mut report).await {
            Ok(()) => return,
            Err(e) => {
                metrics
                    .errors
                    .get_or_create(&ErrorLabels {
                        replica: target.label.clone(),
                        reason: e.reason(),
                    })
                    .inc();
                report.failed(&e);
                e.is_connection_refused()
            }
        };
        if *stop.borrow() {
            return;
        }
        if s.welcomed_at
            .is_some_and(|t| t.elapsed() >= backoff.reset_after)
        {
            retry.reset();
        }
        let delay = retry.after(refused, &backoff, &mut rng);
        tracing::debug!(replica = %target.label, ?delay, "reconnecting after");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stopped(&mut stop) => return,
        }
        metrics.reconnects.get_or_create(&label).inc();
    }
}

/// Logs state changes of one replica, not every attempt.
struct Report<'a> {
    replica: &'a str,
    last: Option<String>,
    ever_up: bool,
}

impl Report<'_> {
    fn failed(&mut self, e: &StreamError) {
        let msg = kpulse_process::error_chain(e);
        if self.last.as_deref() == Some(msg.as_str()) {
            tracing::debug!(replica = %self.replica, error = %msg, "stream failed again");
            return;
        }
        if e.is_refusal() {
            tracing::error!(replica = %self.replica, "{msg}");
        } else {
            tracing::warn!(replica = %self.replica, error = %msg, "stream to the aggregator failed; reconnecting with backoff");
        }
        self.last = Some(msg);
    }

    fn welcomed(&mut self, version: Version) {
        if self.last.take().is_some() || !self.ever_up {
            tracing::info!(replica = %self.replica, server_version = %version, "streaming to the aggregator");
        }
        self.ever_up = true;
    }
}

/// Decrements a gauge when dropped.
struct Up<'a>(&'a Gauge);

impl Drop for Up<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The request body: frames from a bounded channel; it ends when the sender is dropped.
type ChannelBody = BoxBody<Bytes, std::convert::Infallible>;

/// A [`ChannelBody`] fed by `rx`, one data frame per message.
fn channel_body(mut rx: mpsc::Receiver<Bytes>) -> ChannelBody {
    let frames = futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx)
            .map(|b| b.map(|b| Ok::<_, std::convert::Infallible>(Frame::data(b))))
    });
    StreamBody::new(frames).boxed()
}

struct Stream<'a> {
    shared: &'a Shared,
    target: &'a Target,
    /// When the server's `Welcome` arrived.
    welcomed_at: Option<Instant>,
    /// The pod set this stream's server holds (as of the last frame sent).
    sent_pods: Arc<PodSet>,
    /// The last tick sent.
    last_seq: u64,
}

fn now() -> UnixNanos {
    UnixNanos::from_system_time(SystemTime::now())
}

fn frame(m: &AgentMessage) -> Result<Bytes, StreamError> {
    stream::encode(m)
        .map(Bytes::from)
        .map_err(|source| StreamError::Encode { source })
}

async fn timeout<T>(
    limit: Duration,
    what: &'static str,
    f: impl std::future::Future<Output = T>,
) -> Result<T, StreamError> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| StreamError::Timeout { what })
}

impl Stream<'_> {
    /// One stream, until it fails (`Err`) or `stop` turns true (`Ok`).
    async fn run(
        &mut self,
        stop: &mut watch::Receiver<bool>,
        report: &mut Report<'_>,
    ) -> Result<(), StreamError> {
        let t = self.shared.config.timeouts;
        // Nothing to say before the first tick.
        let mut latest = self.shared.latest.subscribe();
        tokio::select! {
            r = latest.wait_for(|v| v.is_some()) => { if r.is_err() { return Ok(()) } }
            () = stopped(stop) => return Ok(()),
        }
        let auth = authorization(&self.shared.config.credentials).await?;
        let tcp = connect(&self.target.addr, &t).await?;
        let connector = tokio_rustls::TlsConnector::from(self.shared.config.tls.clone());
        let tls = timeout(
            t.handshake,
            "in the TLS handshake",
            connector.connect(self.target.server_name.clone(), tcp),
        )
        .await?
        .map_err(|source| StreamError::Tls { source })?;
        let (mut sender, conn) = timeout(
            t.handshake,
            "in the HTTP/2 handshake",
            hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .keep_alive_interval(t.keepalive_interval)
                .keep_alive_timeout(t.keepalive_timeout)
                .keep_alive_while_idle(true)
                .handshake::<_, ChannelBody>(TokioIo::new(tls)),
        )
        .await?
        .map_err(|source| StreamError::Http { source })?;
        let _conn = AbortOnDrop(tokio::spawn(conn));

        // Subscribe before taking the snapshot: no tick between the two is missed.
        let mut ticks = self.shared.ticks.subscribe();
        let first = latest.borrow().clone();
        let Some(first) = first else { return Ok(()) };
        let (body_tx, rx) = mpsc::channel(BODY_FRAMES);
        let hello = frame(&AgentMessage::Hello(self.shared.hello.clone()))?;
        let snapshot = frame(&AgentMessage::Snapshot(Snapshot {
            sent_at: now(),
            node: first.tick.node,
            pods: first.tick.pods.to_vec(),
            counters: first.tick.counters.clone(),
            previous: previous_of(&first),
        }))?;
        for f in [hello, snapshot] {
            body_tx.try_send(f).map_err(|_| StreamError::Closed)?;
        }
        self.sent_pods = first.tick.pods.clone();
        self.last_seq = first.seq;
        self.count_sent();

        let mut request = Request::post(format!("https://{}{STREAM_PATH}", self.target.authority))
            .header(VERSION_HEADER, VERSION.to_string())
            .header(header::CONTENT_TYPE, CONTENT_TYPE);
        if let Some(auth) = auth {
            request = request.header(header::AUTHORIZATION, auth);
        }
        let request = request
            .body(channel_body(rx))
            .map_err(|source| StreamError::Request { source })?;
        let response = sender.send_request(request);
        let mut response = std::pin::pin!(response);
        let deadline = tokio::time::sleep(t.handshake);
        let mut deadline = std::pin::pin!(deadline);
        let response = loop {
            tokio::select! {
                r = &mut response => break r.map_err(|source| StreamError::Http { source })?,
                r = ticks.recv() => self.on_tick(r, &body_tx).await?,
                () = &mut deadline => return Err(StreamError::Timeout { what: "waiting for the response" }),
                () = stopped(stop) => return Ok(()),
            }
        };
        let status = response.status();
        let theirs = response
            .headers()
            .get(VERSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<Version>().ok());
        if status != StatusCode::OK {
            let message = refusal_message(response.into_body(), t.close, status).await;
            return Err(refusal(status, theirs, message));
        }
        if let Some(v) = theirs {
            check_version(v, "response header")?;
        }
        let mut body = response.into_body();
        let mut decoder = Decoder::new();
        let mut _up = None;
        loop {
            tokio::select! {
                f = body.frame() => {
                    let Some(f) = f else {
                        decoder.finish().map_err(|source| StreamError::Protocol { source })?;
                        return Err(StreamError::Ended);
                    };
                    let f = f.map_err(|source| StreamError::Http { source })?;
                    let Ok(data) = f.into_data() else { continue };
                    decoder.push(&data);
                    while let Some(m) = decoder
                        .next_message::<ServerMessage>()
                        .map_err(|source| StreamError::Protocol { source })?
                    {
                        match m {
                            ServerMessage::Welcome { version } => {
                                check_version(version, "Welcome")?;
                                if self.welcomed_at.is_none() {
                                    self.welcomed_at = Some(Instant::now());
                                    let gauge = &self.shared.config.metrics.streams_up;
                                    gauge.inc();
                                    _up = Some(Up(gauge));
                                    report.welcomed(version);
                                }
                            }
                            ServerMessage::Error { message } => {
                                return Err(StreamError::Server { message: sanitize(&message) });
                            }
                        }
                    }
                }
                r = ticks.recv() => self.on_tick(r, &body_tx).await?,
                () = stopped(stop) => {
                    // End the request body, and give the server a moment to end its side.
                    drop(body_tx);
                    let _ = tokio::time::timeout(t.close, async {
                        while let Some(Ok(_)) = body.frame().await {}
                    })
                    .await;
                    return Ok(());
                }
            }
        }
    }

    /// Sends one tick as an Update, with the metadata changes since the last frame sent.
    async fn on_tick(
        &mut self,
        r: Result<Published, broadcast::error::RecvError>,
        body: &mpsc::Sender<Bytes>,
    ) -> Result<(), StreamError> {
        let p = match r {
            Ok(p) => p,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                self.shared
                    .config
                    .metrics
                    .dropped
                    .get_or_create(&ReplicaLabel {
                        replica: self.target.label.clone(),
                    })
                    .inc_by(n);
                return Ok(());
            }
            // The shipper outlives its tasks; nothing to send.
            Err(broadcast::error::RecvError::Closed) => return Ok(()),
        };
        if p.seq <= self.last_seq {
            return Ok(());
        }
        let update = |changes: MetaChanges| {
            AgentMessage::Update(Update {
                sent_at: p.sent_at,
                node: p.tick.node,
                upserts: changes.upserts,
                removed: changes.removed,
                counters: p.tick.counters.clone(),
            })
        };
        let f = if Arc::ptr_eq(&p.tick.pods, &self.sent_pods) {
            // The usual case: the same bytes for every replica, encoded once.
            let shared = p
                .unchanged
                .get_or_init(|| frame(&update(MetaChanges::default())).ok());
            match shared {
                Some(f) => f.clone(),
                None => frame(&update(MetaChanges::default()))?,
            }
        } else {
            frame(&update(p.tick.pods.changes_since(&self.sent_pods)))?
        };
        let stall = self.shared.config.timeouts.stall;
        match tokio::time::timeout(stall, body.send(f)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(StreamError::Closed),
            Err(_) => return Err(StreamError::Stalled { waited: stall }),
        }
        self.sent_pods = p.tick.pods.clone();
        self.last_seq = p.seq;
        self.count_sent();
        Ok(())
    }

    /// One more tick handed to this stream's body.
    fn count_sent(&self) {
        self.shared
            .config
            .metrics
            .sent
            .get_or_create(&ReplicaLabel {
                replica: self.target.label.clone(),
            })
            .inc();
    }
}

fn check_version(theirs: Version, context: &str) -> Result<(), StreamError> {
    Version::check(theirs).map_err(|e| StreamError::Version {
        ours: VERSION,
        theirs: theirs.to_string(),
        message: format!("{e} (from the server's {context})"),
    })
}

/// The kind of refusal a non-200 response is.
fn refusal(status: StatusCode, theirs: Option<Version>, message: String) -> StreamError {
    let other_major = theirs.filter(|v| v.major != VERSION.major);
    if let Some(v) = other_major {
        return StreamError::Version {
            ours: VERSION,
            theirs: v.to_string(),
            message,
        };
    }
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            StreamError::Identity { status, message }
        }
        StatusCode::UPGRADE_REQUIRED | StatusCode::HTTP_VERSION_NOT_SUPPORTED => {
            StreamError::Version {
                ours: VERSION,
                theirs: theirs.map_or_else(|| "another version".into(), |v| v.to_string()),
                message,
            }
        }
        _ => StreamError::Refused { status, message },
    }
}

/// The refusal's message: the `ServerMessage::Error` JSON body, or its text, or the status.
async fn refusal_message(body: Incoming, limit: Duration, status: StatusCode) -> String {
    let bytes = tokio::time::timeout(
        limit,
        http_body_util::Limited::new(body, MAX_REFUSAL_BYTES).collect(),
    )
    .await;
    let Ok(Ok(collected)) = bytes else {
        return status.canonical_reason().unwrap_or("no message").into();
    };
    let bytes = collected.to_bytes();
    match serde_json::from_slice::<ServerMessage>(&bytes) {
        Ok(ServerMessage::Error { message }) => sanitize(&message),
        _ if bytes.is_empty() => status.canonical_reason().unwrap_or("no message").into(),
        _ => sanitize(&String::from_utf8_lossy(&bytes)),
    }
}

/// A server's text made safe for one log line: control characters replaced, at most 512
/// characters.
fn sanitize(s: &str) -> String {
    let mut out: String = s
        .trim()
        .chars()
        .take(512)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if s.trim().chars().count() > 512 {
        out.push('…');
    }
    out
}

async fn authorization(c: &Credentials) -> Result<Option<HeaderValue>, StreamError> {
    let (token, path) = match c {
        Credentials::None => return Ok(None),
        Credentials::Token(t) => (t.to_string(), PathBuf::from("<static>")),
        Credentials::TokenFile(path) => {
            let err = |source| StreamError::Token {
                path: path.clone(),
                source,
            };
            let len = tokio::fs::metadata(path).await.map_err(err)?.len();
            if len > MAX_TOKEN_BYTES {
                return Err(StreamError::BadToken { path: path.clone() });
            }
            (
                tokio::fs::read_to_string(path).await.map_err(err)?,
                path.clone(),
            )
        }
    };
    let token = token.trim();
    if token.is_empty() {
        return Err(StreamError::BadToken { path });
    }
    let mut v = HeaderValue::try_from(format!("Bearer {token}"))
        .map_err(|_| StreamError::BadToken { path })?;
    v.set_sensitive(true);
    Ok(Some(v))
}

async fn connect(addr: &TargetAddr, t: &Timeouts) -> Result<TcpStream, StreamError> {
    let addrs = match addr {
        TargetAddr::Fixed(a) => vec![*a],
        TargetAddr::Name(entry) => {
            let (host, port) = split_host_port(entry).ok_or_else(|| StreamError::NoAddress {
                target: entry.clone(),
            })?;
            super::resolve(&host, port, t.resolve).await?
        }
    };
    // A refusal is the error only when every address refused: it backs off less.
    let (mut refused, mut other) = (None, None);
    for a in addrs {
        match tokio::time::timeout(t.connect, TcpStream::connect(a)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(source)) => {
                let e = StreamError::Connect { addr: a, source };
                if e.is_connection_refused() {
                    refused = Some(e);
                } else {
                    other = Some(e);
                }
            }
            Err(_) => other = Some(StreamError::Timeout { what: "connecting" }),
        }
    }
    Err(other.or(refused).unwrap_or_else(|| StreamError::NoAddress {
        target: match addr {
            TargetAddr::Fixed(a) => a.to_string(),
            TargetAddr::Name(n) => n.clone(),
        },
    }))
}

/// The tick before `p`, for the pods `p` lists, if it is older (a reconnecting stream's
/// Snapshot then gives the server two points per container).
fn previous_of(p: &Published) -> Option<Previous> {
    let prev = p.previous.as_ref()?;
    if prev.node.timestamp >= p.tick.node.timestamp {
        return None;
    }
    Some(Previous {
        node: prev.node,
        counters: prev
            .counters
            .iter()
            .filter(|c| p.tick.pods.get(&c.uid).is_some())
            .cloned()
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_told_apart() {
        let e = refusal(StatusCode::FORBIDDEN, None, "node n1: not yours".into());
        assert_eq!(e.reason(), "identity");
        assert!(e.is_refusal());
        assert_eq!(
            e.to_string(),
            "aggregator refused the agent's identity (HTTP 403 Forbidden): node n1: not yours"
        );
        let e = refusal(
            StatusCode::BAD_REQUEST,
            Some(Version { major: 2, minor: 1 }),
            "wire protocol 1.0 is not supported".into(),
        );
        assert_eq!(
            e.to_string(),
            format!(
                "aggregator refused the wire protocol: the agent speaks {}, the server 2.1: wire protocol 1.0 is not supported",
                kpulse_wire::stream::VERSION
            )
        );
        let e = refusal(StatusCode::UPGRADE_REQUIRED, None, "x".into());
        assert_eq!(e.reason(), "version");
        assert!(e.to_string().contains("the server another version"));
        let e = refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            Some(VERSION),
            "busy".into(),
        );
        assert_eq!(e.reason(), "refused");
        let e = check_version(Version { major: 3, minor: 0 }, "Welcome").expect_err("major");
        assert!(
            e.to_string()
                .contains(&format!("speaks {VERSION}, the server 3.0")),
            "{e}"
        );
        check_version(Version { major: 1, minor: 9 }, "Welcome").expect("minor is fine");
    }

    #[test]
    fn every_reason_is_listed() {
        let samples = [
            StreamError::Ended,
            StreamError::Closed,
            StreamError::Timeout { what: "x" },
            StreamError::Stalled {
                waited: Duration::from_secs(1),
            },
        ];
        for s in samples {
            assert!(StreamError::REASONS.contains(&s.reason()));
        }
    }

    #[test]
    fn server_text_is_one_bounded_line() {
        assert_eq!(sanitize(" a\nb\u{1b}[31m "), "a b [31m");
        let long = "x".repeat(600);
        assert_eq!(sanitize(&long).chars().count(), 513);
    }

    #[tokio::test]
    async fn a_port_nobody_listens_on_is_a_refused_connection() {
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr")
        };
        let t = Timeouts::default();
        let e = connect(&TargetAddr::Fixed(addr), &t)
            .await
            .expect_err("nothing listens");
        assert!(e.is_connection_refused(), "{e:?}");
        assert_eq!(e.reason(), "connect");
        let e = connect(&TargetAddr::Name(format!("localhost:{}", addr.port())), &t)
            .await
            .expect_err("nothing listens");
        assert!(e.is_connection_refused(), "every address refused: {e:?}");
        assert!(!StreamError::Timeout { what: "connecting" }.is_connection_refused());
        let unreachable = StreamError::Connect {
            addr,
            source: std::io::Error::from(std::io::ErrorKind::HostUnreachable),
        };
        assert!(!unreachable.is_connection_refused());
        // Listening again: connected.
        let l = tokio::net::TcpListener::bind(addr).await.expect("rebind");
        connect(&TargetAddr::Fixed(addr), &t)
            .await
            .expect("connects");
        drop(l);
    }

    #[tokio::test]
    async fn tokens_are_read_fresh_and_sensitive() {
        let path = std::env::temp_dir().join(format!("kpulse-token-{}", std::process::id()));
        std::fs::write(&path, "abc\n").expect("write");
        let c = Credentials::TokenFile(path.clone());
        let v = authorization(&c).await.expect("token").expect("header");
        assert_eq!(v.to_str().expect("ascii"), "Bearer abc");
        assert!(v.is_sensitive());
        std::fs::write(&path, "rotated").expect("write");
        let v = authorization(&c).await.expect("token").expect("header");
        assert_eq!(v.to_str().expect("ascii"), "Bearer rotated");
        std::fs::write(&path, "  \n").expect("write");
        let e = authorization(&c).await.expect_err("empty");
        assert_eq!(e.reason(), "bad_token");
        assert!(!e.to_string().contains("rotated"));
        std::fs::remove_file(&path).expect("remove");
        let e = authorization(&c).await.expect_err("gone");
        assert_eq!(e.reason(), "token");
        assert!(authorization(&Credentials::None)
            .await
            .expect("none")
            .is_none());
    }
}

#[cfg(test)]
mod drop_tests {
    use std::collections::BTreeMap;

    use kpulse_wire::{stream::PodMeta, Bytes as Mem, CpuNanos, NodeSample};

    use super::*;
    use crate::ship::{hello, tls, Replicas, ShipConfig, Tick};

    fn meta(uid: &str, v: &str) -> PodMeta {
        PodMeta {
            uid: uid.into(),
            namespace: "ns".into(),
            name: uid.into(),
            labels: BTreeMap::from([("v".into(), v.into())]),
            ready_since: None,
        }
    }

    fn published(seq: u64, pods: &Arc<PodSet>) -> Published {
        Published {
            seq,
            tick: Arc::new(Tick {
                node: NodeSample {
                    timestamp: UnixNanos(seq),
                    started_at: None,
                    cpu: CpuNanos(seq),
                    memory_working_set: Mem(0),
                    swap: None,
                },
                pods: pods.clone(),
                counters: vec![],
            }),
            previous: None,
            sent_at: UnixNanos(seq),
            unchanged: Arc::default(),
        }
    }

    fn decode(b: Bytes) -> Update {
        let mut d = Decoder::new();
        d.push(&b);
        match d.next_message::<AgentMessage>() {
            Ok(Some(AgentMessage::Update(u))) => u,
            other => panic!("not an update: {other:?}"),
        }
    }

    /// A shipper's shared state with no replicas (streams are driven by hand).
    fn shared() -> Shared {
        let tls = tls::client_config(&tls::TlsOptions {
            insecure_skip_verify: true,
            ..Default::default()
        })
        .expect("tls");
        let (ticks, _) = broadcast::channel(8);
        let (latest, _) = watch::channel(None);
        Shared {
            config: ShipConfig::new(Replicas::Static(vec![]), tls),
            hello: hello("n", "t"),
            ticks,
            latest,
        }
    }

    fn target(label: &str) -> Target {
        Target {
            label: label.into(),
            addr: TargetAddr::Name("x:1".into()),
            authority: "x:1".into(),
            server_name: rustls::pki_types::ServerName::try_from("x").expect("name"),
        }
    }

    #[tokio::test]
    async fn dropped_ticks_lose_no_metadata() {
        let shared = shared();
        let target = target("r1");
        let a = Arc::new(PodSet::new([meta("a", "1"), meta("b", "1")]));
        let mut s = Stream {
            shared: &shared,
            target: &target,
            welcomed_at: None,
            sent_pods: a.clone(),
            last_seq: 1,
        };
        let (tx, mut rx) = mpsc::channel(4);
        // Unchanged pods: no changes, and an older tick is skipped.
        s.on_tick(Ok(published(2, &a)), &tx).await.expect("tick");
        let u = decode(rx.recv().await.expect("frame"));
        assert!(u.upserts.is_empty() && u.removed.is_empty());
        s.on_tick(Ok(published(2, &a)), &tx).await.expect("tick");
        assert!(rx.try_recv().is_err(), "a tick is sent once");
        // Tick 3 adds c and is dropped; tick 4 relabels a and removes b.
        let _b = Arc::new(PodSet::new([
            meta("a", "1"),
            meta("b", "1"),
            meta("c", "1"),
        ]));
        let c = Arc::new(PodSet::new([meta("a", "2"), meta("c", "1")]));
        s.on_tick(Err(broadcast::error::RecvError::Lagged(1)), &tx)
            .await
            .expect("lag");
        assert_eq!(shared.config.metrics.dropped("r1"), 1);
        s.on_tick(Ok(published(4, &c)), &tx).await.expect("tick");
        let u = decode(rx.recv().await.expect("frame"));
        let up: Vec<&str> = u.upserts.iter().map(|p| p.uid.as_str()).collect();
        assert_eq!(up, ["a", "c"], "c's addition survived the dropped tick");
        assert_eq!(u.removed, ["b"]);
        assert_eq!(u.node.cpu, CpuNanos(4));
        // Ticks 2 and 4 were written; the repeated 2 and the dropped 3 were not.
        assert_eq!(shared.config.metrics.sent("r1"), 2);
    }

    #[tokio::test]
    async fn streams_holding_the_same_pods_share_one_encoded_update() {
        let shared = shared();
        let (t1, t2, t3) = (target("r1"), target("r2"), target("r3"));
        let old = Arc::new(PodSet::new([meta("a", "1")]));
        let new = Arc::new(PodSet::new([meta("a", "1"), meta("b", "1")]));
        let stream = |target, sent_pods: &Arc<PodSet>| Stream {
            shared: &shared,
            target,
            welcomed_at: None,
            sent_pods: sent_pods.clone(),
            last_seq: 1,
        };
        // r1 and r2 already hold the tick's pods; r3 still holds the older set.
        let (mut s1, mut s2, mut s3) = (stream(&t1, &new), stream(&t2, &new), stream(&t3, &old));
        let p = published(2, &new);
        let mut frames = Vec::new();
        for s in [&mut s1, &mut s2, &mut s3] {
            let (tx, mut rx) = mpsc::channel(1);
            s.on_tick(Ok(p.clone()), &tx).await.expect("tick");
            frames.push(rx.recv().await.expect("frame"));
        }
        // The same buffer, not just equal bytes: encoded once.
        assert_eq!(frames[0].as_ptr(), frames[1].as_ptr());
        assert_eq!(frames[0], frames[1]);
        let (u1, u3) = (decode(frames[0].clone()), decode(frames[2].clone()));
        assert!(u1.upserts.is_empty() && u1.removed.is_empty());
        let up: Vec<&str> = u3.upserts.iter().map(|p| p.uid.as_str()).collect();
        assert_eq!(up, ["b"], "the stream behind gets its own Update");
        assert_eq!((u1.sent_at, u3.sent_at), (p.sent_at, p.sent_at));
        assert_eq!(u1.node, u3.node);
    }
}
