//! The agents' port: the server side of the agent → aggregator stream
//! ([`kpulse_wire::stream`]).
//!
//! A second HTTPS listener (`--ingest-port`, 8444), with the API port's serving
//! certificate and TLS settings, HTTP/2 or HTTP/1.1 (ALPN), client certificates requested
//! but optional. It serves one thing: `POST` [`STREAM_PATH`]. The request body is read as
//! it arrives (hyper frames into a [`Decoder`], never collected whole); the response is a
//! stream of [`ServerMessage`] frames: [`ServerMessage::Welcome`] once the stream is
//! accepted, and a [`ServerMessage::Error`] before the server ends a stream it cannot
//! continue (protocol error, replaced by a newer stream for the node, idle, shutdown).
//!
//! # Before the stream starts
//!
//! In this order, each refusal an HTTP error whose body is a [`ServerMessage::Error`] in
//! JSON, counted in `kpulse_aggregator_ingest_rejected_total{reason}` ([`RejectReason`]):
//!
//! 1. path and method (404, 405); a server shutting down (503);
//! 2. [`VERSION_HEADER`] present and of our major version (400 naming both versions);
//! 3. a stream slot: at most `--max-agent-streams` requests at once (429);
//! 4. credentials ([`Identity::authenticate`], 401; 503 when the Kubernetes API cannot
//!    tell) — before any body is read, so that an unknown client cannot make the server
//!    buffer anything;
//! 5. the Hello, within [`HELLO_TIMEOUT`] (408) and [`MAX_HELLO_BYTES`] (400): its version
//!    (400 naming both) and node name (400);
//! 6. the identity against the Hello's node ([`Identity::authorize`], 403).
//!
//! # Identity: an agent reports its own node only
//!
//! - **Bearer token** (cluster mode): verified here first ([`LocalVerifier`], unless
//!   `--agent-token-verification=review`): signed by the cluster's service account
//!   issuer, for `--agent-token-audience` (`kpulse`), bound to an agent pod this replica
//!   watches, whose node it is bound to. A token that does not pass goes to a TokenReview
//!   through [`TokenAuthenticator`] asking for the same audiences, cached for its TTL:
//!   projected tokens of a pod carry the node in the user's extra [`NODE_NAME_EXTRA`].
//!   Either way the user must be one of `--agent-service-accounts`, and the node the
//!   Hello's. An unreachable API fails closed (503).
//! - **Client certificate** (standalone mode): only with `--agent-client-ca-file`; the
//!   chain must verify against it ([`CaBundle`]) and its CN must be the Hello's node.
//!
//! Tokens are never logged; a refusal logs the user, the node and the reason.
//!
//! # The stream
//!
//! An accepted stream gets a [`Lease`] on its node ([`Sessions::claim`]; a second stream
//! for the node replaces the first) and applies every message through the session code
//! ([`crate::session`]). It ends when the agent closes it, on a protocol error, when it is
//! replaced, when no message arrived for [`Settings::idle_timeout`]
//! (`max(3 × --metric-expiry, 30 s)`; whole messages count, so a frame trickled byte by byte
//! does not keep a stream open), or on shutdown. The node's data outlives the stream
//! until `--metric-expiry` expires it.

use std::{
    convert::Infallible,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use kpulse_wire::stream::{
    self, AgentMessage, Decoder, Hello, ServerMessage, Version, CONTENT_TYPE, STREAM_PATH, VERSION,
    VERSION_HEADER,
};
use rustls::pki_types::CertificateDer;
use tokio::{
    net::TcpListener,
    sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore},
};

use crate::{
    auth::{
        delegated::{AuthnFailure, TokenAuthenticator},
        issuer::LocalVerifier,
        x509::{self, CaBundle},
    },
    body::{self, Body},
    selfmetrics::{IngestMetrics, OpenStream, RejectReason},
    serve::{self, Peer},
    session::{check_hello, HelloError, Lease, Replaced, SessionError, Sessions},
    store::{Clock, SystemClock},
};

/// Default `--ingest-port`.
pub const DEFAULT_PORT: u16 = 8444;
/// Default `--agent-token-audience`.
pub const DEFAULT_AUDIENCE: &str = "kpulse";
/// Default `--agent-service-accounts`.
pub const DEFAULT_AGENT_SERVICE_ACCOUNT: &str = "system:serviceaccount:kpulse-system:kpulse-agent";
/// Default `--max-agent-streams`: above the largest clusters run (130,000 nodes), since
/// every agent streams to every replica. A bound on what clients can make a replica hold
/// (about 61 KiB and a file descriptor a stream, `cargo xtask bench-fit`), not a capacity.
pub const DEFAULT_MAX_STREAMS: usize = 150_000;
/// The TokenReview user extra naming the node a pod-bound projected token belongs to.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// Time allowed for an agent's token review, the wait for a place among the reviews in
/// flight included: the agent gives the TLS and HTTP/2 handshakes and the response headers
/// 10 s together (`kpulse_agent::ship::Timeouts::handshake`), so a review that ends after 7 s
/// leaves the handshakes 3 s, and one past that would answer an agent that has left.
pub const AGENT_TOKEN_REVIEW_TIMEOUT: Duration = Duration::from_secs(7);
/// The longest a starting replica keeps its agents' port closed waiting until it can verify
/// their tokens itself ([`listen_when`]). A restarted replica's agents reconnect as soon as
/// it listens, and every token that comes before the replica's first list of the agent pods
/// goes to a TokenReview: at 5,000 nodes that list came 11.6 and 14.2 s after a restart, with
/// thousands of handshakes beside it, some 8,700 tokens were deferred and 2,239 and 3,576
/// reviews sent (docs/benchmarks.md). Past this the port opens whatever is missing, and
/// tokens are reviewed until it is there. The cost: an agent refused meanwhile backs off,
/// its cap doubling at each attempt (about 25 s after 10 s of refusals).
pub const PORT_WAIT: Duration = Duration::from_secs(10);
/// How often a closed agents' port looks whether it may open.
const PORT_POLL: Duration = Duration::from_millis(50);
/// The agents' port's queue of connections not yet accepted: as long as the kernel allows
/// (it caps the value at `net.core.somaxconn`, 4,096 by default, per network namespace).
/// A replica restarted under thousands of agents has them all knocking within the 2 s of
/// their refused backoff (`kpulse_agent::ship::Backoff::refused_max`), faster than it
/// accepts on a busy machine: with tokio's 1,024, in a restart at 5,000 nodes the queue
/// stayed full for about 3 s after the port opened and the kernel dropped 3,899 connection
/// attempts, each agent then waiting for a retransmission (1 s, then 3 s, …) instead of
/// its turn in the queue (docs/design/scale.md, fix 6).
const BACKLOG: u32 = 65_535;
/// Time allowed for the Hello to arrive.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest idle timeout ([`idle_timeout`]).
pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest Hello frame: a node's name and labels.
pub const MAX_HELLO_BYTES: usize = 64 << 10;
/// Time allowed for the final [`ServerMessage::Error`] to leave before the request body is
/// dropped.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// Response frames queued per stream: the Welcome and one Error.
const RESPONSE_FRAMES: usize = 2;
/// Connections beyond `--max-agent-streams`, so that refusals (429) can still be told.
const EXTRA_CONNECTIONS: usize = 64;
/// Open files kept for all but the agents' streams: the API port's connections (its
/// clients are kube-apiserver's proxies, a few connections each, and scrapers; 1,024 is
/// the default `--max-connections-per-ip`, one client's worth), the kubelet scrapes (at
/// most [`crate::kubelet::MAX_CONCURRENT`]) and the rest (the Kubernetes client's
/// connections, listeners, files): 256.
pub const RESERVED_FILES: u64 = 1024 + crate::kubelet::MAX_CONCURRENT as u64 + 256;

/// A stream with no message for this long is closed: `max(3 × metric_expiry, 30 s)`.
pub fn idle_timeout(metric_expiry: Duration) -> Duration {
    metric_expiry.saturating_mul(3).max(MIN_IDLE_TIMEOUT)
}

/// A refusal before the stream starts: the HTTP status, the counted reason and the
/// sentence sent back (as a JSON [`ServerMessage::Error`]) and logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// HTTP status.
    pub status: StatusCode,
    /// The counted reason.
    pub reason: RejectReason,
    /// For the agent's log.
    pub message: String,
}

impl Refusal {
    fn new(status: StatusCode, reason: RejectReason, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            reason,
            message: message.into(),
        }
    }

    /// The HTTP response.
    pub fn response(&self) -> Response<Body> {
        let body = serde_json::to_vec(&ServerMessage::Error {
            message: self.message.clone(),
        })
        .unwrap_or_default();
        let mut r = Response::new(body::full(body));
        *r.status_mut() = self.status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        version_header(r.headers_mut());
        r
    }
}

fn version_header(headers: &mut HeaderMap) {
    if let Ok(v) = HeaderValue::from_str(&VERSION.to_string()) {
        headers.insert(VERSION_HEADER, v);
    }
}

/// Stream limits.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Requests on the ingest port at once, streams included (`--max-agent-streams`).
    pub max_streams: usize,
    /// Time allowed for the Hello.
    pub hello_timeout: Duration,
    /// A stream with no message for this long is closed.
    pub idle_timeout: Duration,
}

impl Settings {
    /// `max_streams` and the timeouts that follow from `metric_expiry`.
    pub fn new(max_streams: usize, metric_expiry: Duration) -> Settings {
        Settings {
            max_streams,
            hello_timeout: HELLO_TIMEOUT,
            idle_timeout: idle_timeout(metric_expiry),
        }
    }

    /// Lowers `max_streams` to what a soft open-file limit of `open_files` leaves room for
    /// (a stream is a connection is a file descriptor, besides [`RESERVED_FILES`]), so that
    /// the agents past it are refused with a 429 that says so rather than left in the listen
    /// backlog by `EMFILE`; returns the streams the flag asked for when it lowered them.
    pub fn fit_open_files(&mut self, open_files: u64) -> Option<usize> {
        let room = open_files.saturating_sub(RESERVED_FILES + EXTRA_CONNECTIONS as u64);
        let room = usize::try_from(room).unwrap_or(usize::MAX).max(1);
        (self.max_streams > room).then(|| std::mem::replace(&mut self.max_streams, room))
    }

    /// The serving limits of the ingest port: `base` (the flags'), with one connection per
    /// agent, plus a few.
    pub fn serve_limits(&self, base: serve::Limits) -> serve::Limits {
        serve::Limits {
            max_connections: self.max_streams.saturating_add(EXTRA_CONNECTIONS),
            ..base
        }
    }
}

/// What a request presents.
pub enum Credentials {
    /// `Authorization: Bearer <token>`.
    Token(String),
    /// An `Authorization` header that is not a bearer token.
    Malformed,
    /// A client certificate chain (unverified).
    Certificates(Arc<Vec<CertificateDer<'static>>>),
    /// Nothing.
    None,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.write_str(match self {
            Credentials::Token(_) => "Token(..)",
            Credentials::Malformed => "Malformed",
            Credentials::Certificates(_) => "Certificates(..)",
            Credentials::None => "None",
        })
    }
}

impl Credentials {
    /// A request's credentials: its bearer token if it has an `Authorization` header,
    /// else the client certificate of its connection.
    pub fn of<B>(req: &Request<B>, peer: &Peer) -> Credentials {
        if let Some(value) = req.headers().get(header::AUTHORIZATION) {
            let token = value
                .to_str()
                .ok()
                .and_then(|v| v.trim().split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, t)| t.trim())
                .filter(|t| !t.is_empty());
            return match token {
                Some(t) => Credentials::Token(t.to_string()),
                None => Credentials::Malformed,
            };
        }
        match &peer.client_certs {
            Some(chain) if !chain.is_empty() => Credentials::Certificates(chain.clone()),
            _ => Credentials::None,
        }
    }
}

/// How an agent authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// A service account token.
    Token,
    /// A client certificate.
    Certificate,
}

impl Via {
    fn as_str(self) -> &'static str {
        match self {
            Via::Token => "token",
            Via::Certificate => "certificate",
        }
    }
}

/// An authenticated client, before its Hello is known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Agent {
    /// User name (a service account's, or the certificate's CN).
    pub user: String,
    /// The node the credentials are bound to: the token's [`NODE_NAME_EXTRA`], or the
    /// certificate's CN.
    pub bound_node: Option<String>,
    /// How.
    pub via: Via,
}

/// Who may stream which node (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Identity {
    /// TokenReviews, configured with the agents' audiences; `None`: tokens are refused.
    pub tokens: Option<Arc<TokenAuthenticator>>,
    /// Tokens verified here first (`--agent-token-verification=local`); what it does not
    /// accept goes to `tokens`.
    pub local: Option<Arc<LocalVerifier>>,
    /// The audiences `tokens` asks for (for messages).
    pub audiences: Vec<String>,
    /// Users allowed to stream (`--agent-service-accounts`).
    pub service_accounts: Vec<String>,
    /// CA for agents' client certificates (`--agent-client-ca-file`); `None`: certificates
    /// are refused.
    pub client_ca: Option<CaBundle>,
}

impl Identity {
    /// Who the credentials belong to.
    ///
    /// # Errors
    ///
    /// 401 for missing or invalid credentials (and for certificates without a CA), 503
    /// when the Kubernetes API cannot review a token.
    pub async fn authenticate(
        &self,
        credentials: &Credentials,
        metrics: &IngestMetrics,
    ) -> Result<Agent, Refusal> {
        let unauthorized =
            |reason, message: String| Refusal::new(StatusCode::UNAUTHORIZED, reason, message);
        match credentials {
            Credentials::None => Err(unauthorized(
                RejectReason::NoCredentials,
                "no credentials: agents authenticate with a service account token \
                 (Authorization: Bearer) or a client certificate"
                    .into(),
            )),
            Credentials::Malformed => Err(unauthorized(
                RejectReason::InvalidCredentials,
                "the Authorization header is not \"Bearer <token>\"".into(),
            )),
            Credentials::Token(token) => {
                if let Some(local) = &self.local {
                    match local.verify(token) {
                        Ok(verified) => {
                            metrics.local_token_check(None);
                            return Ok(Agent {
                                user: verified.user,
                                bound_node: Some(verified.node),
                                via: Via::Token,
                            });
                        }
                        Err(deferral) => metrics.local_token_check(Some(deferral)),
                    }
                }
                let Some(tokens) = &self.tokens else {
                    return Err(unauthorized(
                        RejectReason::InvalidCredentials,
                        "bearer tokens are not accepted: the server has no Kubernetes API to \
                         review them"
                            .into(),
                    ));
                };
                match tokens.authenticate(token).await {
                    Ok(Some(user)) => Ok(Agent {
                        bound_node: user
                            .extra
                            .get(NODE_NAME_EXTRA)
                            .and_then(|v| v.first())
                            .cloned(),
                        user: user.name,
                        via: Via::Token,
                    }),
                    Ok(None) => Err(unauthorized(
                        RejectReason::InvalidCredentials,
                        format!(
                            "the token is not valid (for audience {})",
                            self.audiences.join(", ")
                        ),
                    )),
                    Err(e @ AuthnFailure::Rejected { .. }) => Err(unauthorized(
                        RejectReason::InvalidCredentials,
                        e.to_string(),
                    )),
                    Err(e @ AuthnFailure::Busy { .. }) => Err(Refusal::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        RejectReason::AuthBusy,
                        format!("too many agents connecting at once ({e})"),
                    )),
                    Err(e) => Err(Refusal::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        RejectReason::AuthUnavailable,
                        format!(
                            "cannot verify the token now ({e}); the Kubernetes API must answer \
                             TokenReviews; retry later"
                        ),
                    )),
                }
            }
            Credentials::Certificates(chain) => {
                let Some(ca) = &self.client_ca else {
                    return Err(unauthorized(
                        RejectReason::InvalidCredentials,
                        "client certificates are not accepted for agent streams (the server \
                         has no --agent-client-ca-file); use a service account token"
                            .into(),
                    ));
                };
                if !ca.verifies(chain) {
                    return Err(unauthorized(
                        RejectReason::InvalidCredentials,
                        "the client certificate does not verify against --agent-client-ca-file"
                            .into(),
                    ));
                }
                let user = chain
                    .first()
                    .ok_or(crate::auth::AuthnError::NoCommonName)
                    .and_then(x509::identity)
                    .map_err(|e| unauthorized(RejectReason::InvalidCredentials, e.to_string()))?;
                Ok(Agent {
                    bound_node: Some(user.name.clone()),
                    user: user.name,
                    via: Via::Certificate,
                })
            }
        }
    }

    /// Whether `agent` may stream `node`.
    ///
    /// # Errors
    ///
    /// 403: not an agent's service account, a token not bound to a node, or bound (or a
    /// certificate issued) to another node.
    pub fn authorize(&self, agent: &Agent, node: &str) -> Result<(), Refusal> {
        let forbidden =
            |reason, message: String| Refusal::new(StatusCode::FORBIDDEN, reason, message);
        if agent.via == Via::Token && !self.service_accounts.contains(&agent.user) {
            return Err(forbidden(
                RejectReason::ForbiddenIdentity,
                format!(
                    "user {:?} may not stream node metrics (agents are {})",
                    agent.user,
                    self.service_accounts.join(", ")
                ),
            ));
        }
        match (&agent.bound_node, agent.via) {
            (Some(bound), _) if bound == node => Ok(()),
            (Some(bound), Via::Token) => Err(forbidden(
                RejectReason::WrongNode,
                format!("token is bound to node {bound:?}, not {node:?}"),
            )),
            (Some(bound), Via::Certificate) => Err(forbidden(
                RejectReason::WrongNode,
                format!("client certificate is for {bound:?}, not node {node:?}"),
            )),
            (None, _) => Err(forbidden(
                RejectReason::WrongNode,
                format!(
                    "the token of {:?} is not bound to a node: agents use their pod's projected \
                     service account token, whose claims name the node",
                    agent.user
                ),
            )),
        }
    }
}

/// The ingest endpoint: limits, identity, sessions and the shutdown signal.
pub struct Ingest<C: Clock = SystemClock> {
    sessions: Arc<Sessions<C>>,
    identity: Identity,
    settings: Settings,
    slots: Arc<Semaphore>,
    shutdown: watch::Sender<bool>,
}

impl<C: Clock> std::fmt::Debug for Ingest<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingest")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<C: Clock + 'static> Ingest<C> {
    /// An endpoint feeding `sessions`.
    pub fn new(sessions: Arc<Sessions<C>>, identity: Identity, settings: Settings) -> Arc<Self> {
        let (shutdown, _) = watch::channel(false);
        Arc::new(Ingest {
            slots: Arc::new(Semaphore::new(settings.max_streams)),
            sessions,
            identity,
            settings,
            shutdown,
        })
    }

    /// The sessions streams feed.
    pub fn sessions(&self) -> &Arc<Sessions<C>> {
        &self.sessions
    }

    /// Ends every stream (with an Error saying so) and refuses new ones (503).
    pub fn shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    fn metrics(&self) -> &IngestMetrics {
        &self.sessions.sink().metrics
    }

    /// Answers one request: a refusal, or a stream that goes on after the response
    /// headers (its task reads `req`'s body).
    pub async fn handle<B>(self: &Arc<Self>, req: Request<B>, peer: &Peer) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: std::fmt::Display,
    {
        match self.start(req, peer).await {
            Ok(response) => response,
            Err(refusal) => {
                self.metrics().rejected(refusal.reason);
                match refusal.reason {
                    RejectReason::BadRequest
                    | RejectReason::TooManyStreams
                    | RejectReason::ShuttingDown
                    | RejectReason::HelloTimeout => tracing::debug!(
                        peer = %peer.addr,
                        reason = refusal.reason.as_str(),
                        detail = %refusal.message,
                        "agent stream refused"
                    ),
                    _ => tracing::warn!(
                        peer = %peer.addr,
                        reason = refusal.reason.as_str(),
                        detail = %refusal.message,
                        "agent stream refused"
                    ),
                }
                refusal.response()
            }
        }
    }

    async fn start<B>(
        self: &Arc<Self>,
        req: Request<B>,
        peer: &Peer,
    ) -> Result<Response<Body>, Refusal>
    where
        B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: std::fmt::Display,
    {
        if req.uri().path() != STREAM_PATH {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                RejectReason::BadRequest,
                format!("not found: this port serves agent streams at POST {STREAM_PATH}"),
            ));
        }
        if req.method() != Method::POST {
            return Err(Refusal::new(
                StatusCode::METHOD_NOT_ALLOWED,
                RejectReason::BadRequest,
                format!("{STREAM_PATH} takes POST only"),
            ));
        }
        self.check_running()?;
        check_version_header(req.headers())?;
        let permit = self.slots.clone().try_acquire_owned().map_err(|_| {
            Refusal::new(
                StatusCode::TOO_MANY_REQUESTS,
                RejectReason::TooManyStreams,
                format!(
                    "too many agent streams (at most {}: --max-agent-streams, or what the \
                     server's open-file limit leaves room for); retry later",
                    self.settings.max_streams
                ),
            )
        })?;
        let agent = {
            let credentials = Credentials::of(&req, peer);
            self.identity
                .authenticate(&credentials, self.metrics())
                .await?
        };
        let mut body = req.into_body();
        let mut decoder = Decoder::new();
        let hello = tokio::time::timeout(
            self.settings.hello_timeout,
            read_hello(&mut body, &mut decoder, self.metrics()),
        )
        .await
        .map_err(|_| {
            Refusal::new(
                StatusCode::REQUEST_TIMEOUT,
                RejectReason::HelloTimeout,
                format!(
                    "no Hello within {:?} of the request",
                    self.settings.hello_timeout
                ),
            )
        })??;
        check_hello(&hello).map_err(|e| {
            let reason = match e {
                HelloError::Version(_) => RejectReason::BadVersion,
                HelloError::NodeName { .. } => RejectReason::BadHello,
            };
            Refusal::new(StatusCode::BAD_REQUEST, reason, e.to_string())
        })?;
        if let Err(mut refusal) = self.identity.authorize(&agent, &hello.node_name) {
            refusal.message = format!("{} (user {:?})", refusal.message, agent.user);
            return Err(refusal);
        }
        self.check_running()?;

        let (lease, replaced) = self.sessions.claim(&hello);
        tracing::info!(
            node = %hello.node_name,
            user = %agent.user,
            via = agent.via.as_str(),
            agent = %hello.agent,
            version = %hello.version,
            peer = %peer.addr,
            "agent stream accepted"
        );
        let (tx, rx) = mpsc::channel(RESPONSE_FRAMES);
        if let Ok(frame) = stream::encode(&ServerMessage::Welcome { version: VERSION }) {
            let _ = tx.try_send(Outgoing {
                frame: frame.into(),
                last: false,
            });
        }
        let open = self.metrics().stream_opened();
        tokio::spawn(self.clone().run(
            Stream {
                lease,
                replaced,
                decoder,
                tx,
                _permit: permit,
                _open: open,
                peer: peer.addr,
            },
            body,
        ));
        let mut response = Response::new(ServerBody { rx, done: false }.boxed());
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        version_header(response.headers_mut());
        Ok(response)
    }

    fn check_running(&self) -> Result<(), Refusal> {
        if *self.shutdown.borrow() {
            Err(Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                RejectReason::ShuttingDown,
                "the server is shutting down; reconnect to another replica or retry",
            ))
        } else {
            Ok(())
        }
    }

    /// One accepted stream, until it ends.
    async fn run<B>(self: Arc<Self>, mut s: Stream<C>, mut body: B)
    where
        B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: std::fmt::Display,
    {
        let metrics = self.metrics().clone();
        let node = s.lease.node().to_string();
        let idle_for = self.settings.idle_timeout;
        let mut shutdown = self.shutdown.subscribe();
        let idle = tokio::time::sleep(idle_for);
        tokio::pin!(idle);
        // When the chunk that completed the buffered frames arrived.
        let mut received = std::time::Instant::now();
        let end: Option<String> = 'stream: loop {
            // Every message buffered (after the Hello, or from the last chunk).
            loop {
                match s.decoder.next_message::<AgentMessage>() {
                    Ok(None) => break,
                    Ok(Some(message)) => {
                        metrics.message(&message);
                        idle.as_mut().reset(tokio::time::Instant::now() + idle_for);
                        let counts = !matches!(message, AgentMessage::Hello(_));
                        if let Err(e) = s.lease.apply(message) {
                            break 'stream Some(e.to_string());
                        }
                        if counts {
                            metrics.received_to_visible(received.elapsed());
                        }
                    }
                    Err(e) => break 'stream Some(e.to_string()),
                }
            }
            tokio::select! {
                () = &mut s.replaced => {
                    break Some(SessionError::Replaced { node: node.clone() }.to_string());
                }
                _ = shutdown.wait_for(|stop| *stop) => {
                    break Some("the server is shutting down; reconnect".into());
                }
                () = &mut idle => {
                    break Some(format!("no message for {idle_for:?}; closing the stream"));
                }
                () = s.tx.closed() => break None,
                frame = body.frame() => match frame {
                    None => {
                        if let Err(e) = s.decoder.finish() {
                            tracing::debug!(%node, error = %e, "agent stream ended inside a frame");
                        }
                        break None;
                    }
                    Some(Err(e)) => {
                        tracing::debug!(%node, error = %e, "agent stream broken");
                        break None;
                    }
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            metrics.received_bytes(data.len());
                            s.decoder.push(&data);
                            received = std::time::Instant::now();
                        }
                    }
                },
            }
        };
        match end {
            None => tracing::info!(%node, peer = %s.peer, "agent stream ended"),
            Some(message) => {
                tracing::info!(%node, peer = %s.peer, reason = %message, "ending agent stream");
                if let Ok(frame) = stream::encode(&ServerMessage::Error { message }) {
                    let sent = s.tx.try_send(Outgoing {
                        frame: frame.into(),
                        last: true,
                    });
                    if sent.is_ok() {
                        // Keep the request open until the Error has left: dropping it first
                        // could reset the stream before the agent reads why.
                        let _ = tokio::time::timeout(FLUSH_TIMEOUT, s.tx.closed()).await;
                    }
                }
            }
        }
        drop(body);
    }
}

/// What an accepted stream holds until it ends.
struct Stream<C: Clock> {
    lease: Lease<C>,
    replaced: Replaced,
    decoder: Decoder,
    tx: mpsc::Sender<Outgoing>,
    _permit: OwnedSemaphorePermit,
    _open: OpenStream,
    peer: SocketAddr,
}

/// [`VERSION_HEADER`] is there and names our major version.
fn check_version_header(headers: &HeaderMap) -> Result<(), Refusal> {
    let bad =
        |message: String| Refusal::new(StatusCode::BAD_REQUEST, RejectReason::BadVersion, message);
    let value = headers.get(VERSION_HEADER).ok_or_else(|| {
        bad(format!(
            "no {VERSION_HEADER} header: the agent must say which wire protocol it speaks \
             (this server speaks {VERSION})"
        ))
    })?;
    let theirs: Version = value
        .to_str()
        .map_err(|_| stream::Error::BadVersion {
            text: String::from_utf8_lossy(value.as_bytes())
                .chars()
                .take(32)
                .collect(),
        })
        .and_then(str::parse)
        .map_err(|e| {
            bad(format!(
                "{VERSION_HEADER}: {e} (this server speaks {VERSION})"
            ))
        })?;
    Version::check(theirs).map_err(|e| bad(e.to_string()))
}

/// Reads up to the Hello, leaving what follows it in `decoder`.
async fn read_hello<B>(
    body: &mut B,
    decoder: &mut Decoder,
    metrics: &IngestMetrics,
) -> Result<Hello, Refusal>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let bad =
        |message: String| Refusal::new(StatusCode::BAD_REQUEST, RejectReason::BadHello, message);
    loop {
        match decoder.next_message::<AgentMessage>() {
            Ok(Some(AgentMessage::Hello(hello))) => {
                metrics.message(&AgentMessage::Hello(hello.clone()));
                // A Hello that arrived whole is bounded by the frame limit only: its
                // content (kept for the node's lifetime) must fit the Hello's own.
                if hello_bytes(&hello) > MAX_HELLO_BYTES {
                    return Err(bad(format!("the Hello is over {MAX_HELLO_BYTES} bytes")));
                }
                return Ok(hello);
            }
            Ok(Some(other)) => {
                metrics.message(&other);
                let kind = match other {
                    AgentMessage::Hello(_) => "Hello",
                    AgentMessage::Snapshot(_) => "Snapshot",
                    AgentMessage::Update(_) => "Update",
                };
                return Err(bad(format!(
                    "the first message must be a Hello, not a {kind}"
                )));
            }
            Err(e) => return Err(bad(format!("cannot read the Hello: {e}"))),
            Ok(None) if decoder.pending() > MAX_HELLO_BYTES => {
                return Err(bad(format!("the Hello is over {MAX_HELLO_BYTES} bytes")))
            }
            Ok(None) => {}
        }
        match body.frame().await {
            None => return Err(bad("the stream ended before its Hello".into())),
            Some(Err(e)) => return Err(bad(format!("reading the request body: {e}"))),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    metrics.received_bytes(data.len());
                    decoder.push(&data);
                }
            }
        }
    }
}

/// The bytes of text a Hello carries (its node's name, labels and agent).
fn hello_bytes(hello: &Hello) -> usize {
    hello
        .node_labels
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum::<usize>()
        .saturating_add(hello.node_name.len())
        .saturating_add(hello.agent.len())
}

/// One response frame; the last one ends the body.
struct Outgoing {
    frame: Bytes,
    last: bool,
}

/// The response body: the Welcome, then an Error when the server ends the stream.
struct ServerBody {
    rx: mpsc::Receiver<Outgoing>,
    done: bool,
}

impl hyper::body::Body for ServerBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(out)) => {
                self.done = out.last;
                Poll::Ready(Some(Ok(Frame::data(out.frame))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// The agents' port, bound but not listening: a port another socket listens on is an error
/// at the start (one bound by another process that does not listen yet is found by
/// [`listen_when`]'s `listen`), and agents that connect before [`listen_when`] are refused
/// at once by the kernel (and retry with their backoff) rather than queued.
///
/// # Errors
///
/// The socket cannot be made or bound.
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpSocket> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

/// Listens on `socket` once `ready()` holds — for a replica that verifies agents' tokens
/// itself, once it can ([`LocalVerifier::can_check`]) — or [`PORT_WAIT`] after `since`,
/// whichever comes first; logs which.
///
/// # Errors
///
/// `listen` fails.
pub async fn listen_when(
    socket: tokio::net::TcpSocket,
    ready: impl Fn() -> bool,
    since: std::time::Instant,
) -> std::io::Result<TcpListener> {
    while !ready() && since.elapsed() < PORT_WAIT {
        tokio::time::sleep(PORT_POLL).await;
    }
    let addr = socket.local_addr()?;
    let listener = socket.listen(BACKLOG)?;
    let waited = since.elapsed();
    if ready() {
        tracing::info!(%addr, ?waited, "serving agents' streams");
    } else {
        tracing::warn!(
            %addr,
            ?waited,
            "serving agents' streams before this replica can verify their tokens itself (the \
             service account issuer's keys, or the agent pods' first list, are missing): \
             their tokens go to TokenReviews until it can"
        );
    }
    Ok(listener)
}

/// Serves the ingest port until `shutdown` resolves; then ends every stream and drains.
/// `limits` are the flags' serving limits ([`Settings::serve_limits`] applies); connections
/// are counted in `stats`.
pub async fn serve<C: Clock + 'static>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    ingest: Arc<Ingest<C>>,
    limits: serve::Limits,
    stats: Arc<serve::ConnectionStats>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let limits = ingest.settings.serve_limits(limits);
    let stopping = ingest.clone();
    let handle = move |req: Request<Incoming>, peer: Peer| {
        let ingest = ingest.clone();
        async move { ingest.handle(req, &peer).await }
    };
    serve::serve_connections(
        listener,
        tls,
        limits,
        stats,
        async move {
            shutdown.await;
            // Streams never end by themselves: end them so that the drain can finish.
            stopping.shutdown();
        },
        handle,
    )
    .await;
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_agents_port_opens_once_tokens_can_be_checked() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let socket = bind(([127, 0, 0, 1], 0).into()).expect("bound");
        let addr = socket.local_addr().expect("address");
        let ready = Arc::new(AtomicBool::new(false));
        let flag = ready.clone();
        let listening = tokio::spawn(listen_when(
            socket,
            move || flag.load(Ordering::SeqCst),
            std::time::Instant::now(),
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| e.kind())
                .err(),
            Some(std::io::ErrorKind::ConnectionRefused),
            "refused while it cannot check"
        );
        ready.store(true, Ordering::SeqCst);
        let listener = listening.await.expect("task").expect("listening");
        let (client, accepted) =
            tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        assert!(client.is_ok() && accepted.is_ok());
    }

    #[tokio::test]
    async fn the_agents_port_opens_after_its_longest_wait_whatever_is_missing() {
        let socket = bind(([127, 0, 0, 1], 0).into()).expect("bound");
        let addr = socket.local_addr().expect("address");
        // 300 ms of the wait left.
        let since = std::time::Instant::now()
            .checked_sub(PORT_WAIT - Duration::from_millis(300))
            .expect("a monotonic clock past PORT_WAIT");
        let listening = tokio::spawn(listen_when(socket, || false, since));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "refused while it waits"
        );
        let listener = listening.await.expect("task").expect("listening");
        assert!(tokio::net::TcpStream::connect(addr).await.is_ok());
        drop(listener);
        // A port another socket listens on is an error at the start; one only bound by
        // another, when listening.
        let taken = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listener");
        assert!(bind(taken.local_addr().expect("address")).is_err());
        let first = bind(([127, 0, 0, 1], 0).into()).expect("bound");
        let shared = first.local_addr().expect("address");
        let second = bind(shared).expect("bound beside a socket not listening");
        let _first = first.listen(8).expect("listening");
        assert!(listen_when(second, || true, std::time::Instant::now())
            .await
            .is_err());
    }

    /// More agents than tokio's default backlog (1,024) connect to a replica that does not
    /// accept yet: every one is queued (its TCP handshake completes), none dropped.
    #[tokio::test]
    async fn the_agents_port_queues_a_burst_of_connections() {
        kpulse_process::limits::raise_open_files().expect("the open-file limit");
        let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .expect("net.core.somaxconn")
            .trim()
            .parse()
            .expect("a number");
        let burst = somaxconn.min(2_000);
        assert!(
            burst > 1_100,
            "this test needs net.core.somaxconn above 1,100 (it is {somaxconn})"
        );
        let socket = bind(([127, 0, 0, 1], 0).into()).expect("bound");
        let listener = listen_when(socket, || true, std::time::Instant::now())
            .await
            .expect("listening");
        let addr = listener.local_addr().expect("address");
        let mut connects = tokio::task::JoinSet::new();
        for _ in 0..burst {
            connects.spawn(tokio::time::timeout(
                Duration::from_secs(3),
                tokio::net::TcpStream::connect(addr),
            ));
        }
        // Held until all are counted: each one queued holds its place.
        let mut queued = Vec::with_capacity(burst);
        while let Some(done) = connects.join_next().await {
            if let Ok(Ok(Ok(stream))) = done {
                queued.push(stream);
            }
        }
        assert_eq!(
            queued.len(),
            burst,
            "connections queued of {burst} (none accepted)"
        );
        drop(listener);
    }

    #[test]
    fn streams_fit_the_open_file_limit() {
        let mut s = Settings::new(10_000, Duration::from_secs(60));
        assert_eq!(s.fit_open_files(1_048_576), None);
        assert_eq!(s.max_streams, 10_000);
        // This machine's hard limit.
        assert_eq!(s.fit_open_files(20_000), None);
        assert_eq!(s.fit_open_files(8192), Some(10_000));
        assert_eq!(s.max_streams, 8192 - 1408 - 64);
        let conns = s.serve_limits(serve::Limits::default()).max_connections;
        assert!(conns as u64 + RESERVED_FILES <= 8192);
        // containerd 2's soft limit, had the server not raised it: never none at all.
        assert_eq!(s.fit_open_files(1024), Some(8192 - 1408 - 64));
        assert_eq!(s.max_streams, 1);
    }

    use std::collections::BTreeMap;

    use kpulse_wire::{
        stream::{PodCounters, PodMeta, Snapshot, Update},
        Bytes as WireBytes, ContainerSample, CpuNanos, NodeSample, UnixNanos,
    };
    use serde_json::json;

    use super::*;
    use crate::{
        auth::{
            delegated::{testing::FakeApi, TokenConfig},
            x509::testing::TestCa,
        },
        metadata::{MetadataSource, StreamMetadata},
        store::{Store, StoreConfig},
    };

    /// Tokens: `node-a-token` is the agent's, bound to node-a; `unbound-token` the agent's
    /// without a node; `default-token` another service account's, bound to node-a.
    /// Authenticated only when the review asks for audience `kpulse`.
    async fn token_api() -> FakeApi {
        FakeApi::start(|_, spec| {
            let kpulse = spec["audiences"] == json!(["kpulse"]);
            let status = match spec["token"].as_str().unwrap_or("") {
                "node-a-token" if kpulse => json!({"authenticated": true, "user": {
                    "username": DEFAULT_AGENT_SERVICE_ACCOUNT,
                    "extra": {NODE_NAME_EXTRA: ["node-a"]}}}),
                "unbound-token" if kpulse => json!({"authenticated": true, "user": {
                    "username": DEFAULT_AGENT_SERVICE_ACCOUNT}}),
                "default-token" if kpulse => json!({"authenticated": true, "user": {
                    "username": "system:serviceaccount:default:default",
                    "extra": {NODE_NAME_EXTRA: ["node-a"]}}}),
                _ => json!({"authenticated": false}),
            };
            (201, status)
        })
        .await
    }

    fn identity(api: &FakeApi, ca: Option<&TestCa>) -> Identity {
        let tokens = TokenAuthenticator::new(
            api.client(),
            TokenConfig {
                audiences: vec![DEFAULT_AUDIENCE.into()],
                timeout: Duration::from_secs(2),
                ..TokenConfig::default()
            },
        )
        .expect("authenticator");
        Identity {
            tokens: Some(Arc::new(tokens)),
            local: None,
            audiences: vec![DEFAULT_AUDIENCE.into()],
            service_accounts: vec![DEFAULT_AGENT_SERVICE_ACCOUNT.into()],
            client_ca: ca.map(|ca| CaBundle::from_pem(&ca.pem, "test").expect("ca")),
        }
    }

    #[tokio::test]
    async fn tokens_verified_locally_need_no_review() {
        use crate::auth::issuer::testing::{claims, verifier, Signer};
        let api = token_api().await;
        let signer = Signer::new("k1");
        let id = Identity {
            local: Some(verifier(&signer)),
            ..identity(&api, None)
        };
        let metrics = IngestMetrics::new();
        let signed = signer.token(&claims());
        let agent = id
            .authenticate(&Credentials::Token(signed), &metrics)
            .await
            .expect("verified");
        assert_eq!(agent.bound_node.as_deref(), Some("n1"));
        assert!(id.authorize(&agent, "n1").is_ok());
        assert!(id.authorize(&agent, "n2").is_err(), "its own node only");
        assert_eq!(api.token_reviews(), 0);
        assert_eq!(metrics.local_token_checks("accepted"), 1);
        // What does not verify here goes to a review, which decides.
        let agent = id
            .authenticate(&token("node-a-token"), &metrics)
            .await
            .expect("reviewed");
        assert_eq!(agent.bound_node.as_deref(), Some("node-a"));
        assert_eq!(api.token_reviews(), 1);
        assert_eq!(metrics.local_token_checks("invalid"), 1);
        let other = Signer::new("k2");
        let e = id
            .authenticate(&Credentials::Token(other.token(&claims())), &metrics)
            .await
            .expect_err("unknown to the API too");
        assert_eq!(e.status, StatusCode::UNAUTHORIZED);
        assert_eq!(api.token_reviews(), 2);
        assert_eq!(metrics.local_token_checks("unknown_key"), 1);
    }

    fn token(t: &str) -> Credentials {
        Credentials::Token(t.into())
    }

    #[tokio::test]
    async fn identity_decisions() {
        let mut api = token_api().await;
        let ca = TestCa::new("agents");
        let id = identity(&api, Some(&ca));

        let agent = id
            .authenticate(&token("node-a-token"), &IngestMetrics::new())
            .await
            .expect("agent");
        assert_eq!(agent.bound_node.as_deref(), Some("node-a"));
        id.authorize(&agent, "node-a").expect("its own node");
        let e = id.authorize(&agent, "node-b").expect_err("another node");
        assert_eq!(
            (e.status, e.reason, e.message.as_str()),
            (
                StatusCode::FORBIDDEN,
                RejectReason::WrongNode,
                r#"token is bound to node "node-a", not "node-b""#
            )
        );
        // The review asked for the agents' audience.
        let specs = api.specs().await;
        assert_eq!(specs[0].1["audiences"], json!(["kpulse"]));

        let other = id
            .authenticate(&token("default-token"), &IngestMetrics::new())
            .await
            .expect("user");
        let e = id.authorize(&other, "node-a").expect_err("not an agent");
        assert_eq!(
            (e.status, e.reason),
            (StatusCode::FORBIDDEN, RejectReason::ForbiddenIdentity)
        );
        assert!(
            e.message.contains("system:serviceaccount:default:default"),
            "{}",
            e.message
        );
        let unbound = id
            .authenticate(&token("unbound-token"), &IngestMetrics::new())
            .await
            .expect("user");
        let e = id.authorize(&unbound, "node-a").expect_err("no node");
        assert_eq!(e.reason, RejectReason::WrongNode);
        assert!(e.message.contains("not bound to a node"), "{}", e.message);

        for (credentials, reason) in [
            (token("wrong"), RejectReason::InvalidCredentials),
            (Credentials::Malformed, RejectReason::InvalidCredentials),
            (Credentials::None, RejectReason::NoCredentials),
        ] {
            let e = id
                .authenticate(&credentials, &IngestMetrics::new())
                .await
                .expect_err("refused");
            assert_eq!((e.status, e.reason), (StatusCode::UNAUTHORIZED, reason));
        }

        // Certificates: CN = node, from the agents' CA only.
        let chain = |c: rustls::pki_types::CertificateDer<'static>| {
            Credentials::Certificates(Arc::new(vec![c]))
        };
        let agent = id
            .authenticate(&chain(ca.client("node-a", &[])), &IngestMetrics::new())
            .await
            .expect("certificate");
        assert_eq!(agent.via, Via::Certificate);
        id.authorize(&agent, "node-a").expect("its own node");
        let e = id.authorize(&agent, "node-b").expect_err("CN mismatch");
        assert_eq!(
            (e.status, e.reason, e.message.as_str()),
            (
                StatusCode::FORBIDDEN,
                RejectReason::WrongNode,
                r#"client certificate is for "node-a", not node "node-b""#
            )
        );
        let stranger = TestCa::new("stranger");
        let e = id
            .authenticate(
                &chain(stranger.client("node-a", &[])),
                &IngestMetrics::new(),
            )
            .await
            .expect_err("other CA");
        assert_eq!(e.status, StatusCode::UNAUTHORIZED);
        let no_ca = identity(&api, None);
        let e = no_ca
            .authenticate(&chain(ca.client("node-a", &[])), &IngestMetrics::new())
            .await
            .expect_err("certificates not accepted");
        assert_eq!(e.status, StatusCode::UNAUTHORIZED);
        assert!(
            e.message.contains("--agent-client-ca-file"),
            "{}",
            e.message
        );

        // Too many reviews under way: 503 at once, counted apart from an API outage.
        let busy = Identity {
            tokens: Some(Arc::new(
                TokenAuthenticator::new(
                    api.client(),
                    TokenConfig {
                        audiences: vec![DEFAULT_AUDIENCE.into()],
                        max_in_flight: 1,
                        queue_wait: Duration::from_millis(50),
                        ..TokenConfig::default()
                    },
                )
                .expect("authenticator"),
            )),
            ..identity(&api, None)
        };
        api.set_delay(Duration::from_millis(400));
        let (first, second) = (token("node-a-token"), token("unbound-token"));
        let metrics = IngestMetrics::new();
        let (slow, turned_away) = tokio::join!(busy.authenticate(&first, &metrics), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            busy.authenticate(&second, &metrics).await
        });
        assert_eq!(
            slow.expect("reviewed").bound_node.as_deref(),
            Some("node-a")
        );
        let e = turned_away.expect_err("busy");
        assert_eq!(
            (e.status, e.reason),
            (StatusCode::SERVICE_UNAVAILABLE, RejectReason::AuthBusy)
        );
        api.set_delay(Duration::ZERO);

        // The Kubernetes API gone: fail closed, and say so.
        api.stop().await;
        let e = id
            .authenticate(&token("fresh-token"), &IngestMetrics::new())
            .await
            .expect_err("no API");
        assert_eq!(
            (e.status, e.reason),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                RejectReason::AuthUnavailable
            )
        );
    }

    use kpulse_testkit::ChannelBody;

    struct Fixture {
        api: FakeApi,
        ingest: Arc<Ingest>,
        metadata: Arc<StreamMetadata>,
    }

    async fn fixture(settings: Settings) -> Fixture {
        let api = token_api().await;
        let metadata = StreamMetadata::new();
        let store = Arc::new(Store::new(StoreConfig::new(Duration::from_secs(10))).expect("store"));
        let sessions = Sessions::new(store, metadata.clone(), IngestMetrics::new());
        let ingest = Ingest::new(sessions, identity(&api, None), settings);
        Fixture {
            api,
            ingest,
            metadata,
        }
    }

    fn peer() -> Peer {
        Peer {
            addr: SocketAddr::from(([127, 0, 0, 1], 1)),
            client_certs: None,
        }
    }

    fn hello(node: &str) -> AgentMessage {
        AgentMessage::Hello(Hello {
            version: VERSION,
            node_name: node.into(),
            node_labels: BTreeMap::from([("zone".into(), "z1".into())]),
            agent: "test".into(),
        })
    }

    fn frame(m: &AgentMessage) -> Bytes {
        stream::encode(m).expect("encode").into()
    }

    fn now() -> u64 {
        UnixNanos::from_system_time(std::time::SystemTime::now()).0
    }

    fn node_sample(t: u64) -> NodeSample {
        NodeSample {
            timestamp: UnixNanos(t),
            started_at: None,
            cpu: CpuNanos(t / 1000),
            memory_working_set: WireBytes(1 << 30),
            swap: None,
        }
    }

    fn counters(uid: &str, t: u64) -> PodCounters {
        PodCounters {
            uid: uid.into(),
            containers: vec![ContainerSample {
                name: "app".into(),
                timestamp: UnixNanos(t),
                cgroup_id: None,
                started_at: None,
                cpu: CpuNanos(t / 1000),
                memory_working_set: WireBytes(1 << 20),
                swap: None,
                signals: None,
            }],
            signals: None,
        }
    }

    fn pod(uid: &str, name: &str) -> PodMeta {
        PodMeta {
            uid: uid.into(),
            namespace: "demo".into(),
            name: name.into(),
            labels: BTreeMap::new(),
            ready_since: None,
        }
    }

    /// Starts a request; the sender feeds its body.
    async fn open(
        f: &Fixture,
        path: &str,
        version: Option<&str>,
        token: Option<&str>,
        first: &[AgentMessage],
    ) -> (Response<Body>, mpsc::Sender<Bytes>) {
        let (tx, rx) = mpsc::channel(16);
        for m in first {
            tx.send(frame(m)).await.expect("queue");
        }
        let mut req = Request::post(path);
        if let Some(v) = version {
            req = req.header(VERSION_HEADER, v);
        }
        if let Some(t) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req.body(ChannelBody(rx)).expect("request");
        (f.ingest.handle(req, &peer()).await, tx)
    }

    async fn error_of(response: Response<Body>) -> (StatusCode, String) {
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        match serde_json::from_slice(&body).expect("a ServerMessage") {
            ServerMessage::Error { message } => (status, message),
            other => panic!("not an error: {other:?}"),
        }
    }

    /// The next ServerMessage of a stream, or `None` at its end.
    async fn next(body: &mut Body, decoder: &mut Decoder) -> Option<ServerMessage> {
        loop {
            if let Some(m) = decoder.next_message().expect("decode") {
                return Some(m);
            }
            let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
                .await
                .expect("a frame in time")?
                .expect("frame");
            if let Ok(data) = frame.into_data() {
                decoder.push(&data);
            }
        }
    }

    #[tokio::test]
    async fn refusals_before_the_stream() {
        let f = fixture(Settings {
            hello_timeout: Duration::from_millis(200),
            ..Settings::new(10, Duration::from_secs(10))
        })
        .await;
        let v = Some("1.0");
        let t = Some("node-a-token");
        let (r, _) = open(&f, STREAM_PATH, None, t, &[hello("node-a")]).await;
        let (code, message) = error_of(r).await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        assert!(
            message.contains("kpulse-wire-version") && message.contains(&VERSION.to_string()),
            "{message}"
        );
        let (r, _) = open(&f, STREAM_PATH, Some("2.0"), t, &[hello("node-a")]).await;
        let (code, message) = error_of(r).await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        assert!(
            message.contains("2.0") && message.contains(&VERSION.to_string()),
            "{message}"
        );
        // The Hello's own version is checked too.
        let mut h = hello("node-a");
        if let AgentMessage::Hello(h) = &mut h {
            h.version = Version { major: 3, minor: 1 };
        }
        let (r, _) = open(&f, STREAM_PATH, v, t, &[h]).await;
        let (code, message) = error_of(r).await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        assert!(
            message.contains("3.1") && message.contains(&VERSION.to_string()),
            "{message}"
        );
        // A Snapshot first, a bad node name.
        let snapshot = AgentMessage::Snapshot(Snapshot {
            sent_at: UnixNanos(1),
            node: node_sample(1),
            pods: vec![],
            counters: vec![],
            previous: None,
        });
        let (r, _) = open(&f, STREAM_PATH, v, t, &[snapshot]).await;
        assert_eq!(error_of(r).await.0, StatusCode::BAD_REQUEST);
        let (r, _) = open(&f, STREAM_PATH, v, t, &[hello("Node_A")]).await;
        assert_eq!(error_of(r).await.0, StatusCode::BAD_REQUEST);
        // Identity.
        let (r, _) = open(&f, STREAM_PATH, v, None, &[hello("node-a")]).await;
        assert_eq!(error_of(r).await.0, StatusCode::UNAUTHORIZED);
        let (r, _) = open(&f, STREAM_PATH, v, t, &[hello("node-b")]).await;
        let (code, message) = error_of(r).await;
        assert_eq!(code, StatusCode::FORBIDDEN);
        assert!(
            message.contains(r#"token is bound to node "node-a", not "node-b""#),
            "{message}"
        );
        // A Hello over its limit, whole in one chunk or still incomplete.
        let mut big = hello("node-a");
        if let AgentMessage::Hello(h) = &mut big {
            h.node_labels
                .insert("big".into(), "x".repeat(MAX_HELLO_BYTES));
        }
        let (r, _) = open(&f, STREAM_PATH, v, t, &[big.clone()]).await;
        let (code, message) = error_of(r).await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        assert_eq!(
            message,
            format!("the Hello is over {MAX_HELLO_BYTES} bytes")
        );
        let (tx, rx) = mpsc::channel(1);
        tx.send(frame(&big).slice(..MAX_HELLO_BYTES + 10))
            .await
            .expect("queue");
        let req = Request::post(STREAM_PATH)
            .header(VERSION_HEADER, "1.0")
            .header(header::AUTHORIZATION, "Bearer node-a-token")
            .body(ChannelBody(rx))
            .expect("request");
        let (code, message) = error_of(f.ingest.handle(req, &peer()).await).await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        assert_eq!(
            message,
            format!("the Hello is over {MAX_HELLO_BYTES} bytes")
        );
        drop(tx);
        // No Hello in time.
        let (r, _keep_open) = open(&f, STREAM_PATH, v, t, &[]).await;
        assert_eq!(error_of(r).await.0, StatusCode::REQUEST_TIMEOUT);
        // Another path or method.
        let (r, _) = open(&f, "/other", v, t, &[]).await;
        assert_eq!(error_of(r).await.0, StatusCode::NOT_FOUND);
        let m = &f.ingest.sessions().sink().metrics;
        for (reason, n) in [
            (RejectReason::BadVersion, 3),
            (RejectReason::BadHello, 4),
            (RejectReason::NoCredentials, 1),
            (RejectReason::WrongNode, 1),
            (RejectReason::HelloTimeout, 1),
            (RejectReason::BadRequest, 1),
        ] {
            assert_eq!(m.rejected_count(reason), n, "{reason:?}");
        }
        assert!(f.metadata.nodes().is_empty(), "nothing was claimed");
        assert_eq!(f.api.token_reviews(), 1, "reviews are cached");
    }

    /// Feeds `bytes` to `tx` one byte every 100 ms.
    fn trickle(tx: mpsc::Sender<Bytes>, bytes: Bytes) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            for i in 0..bytes.len() {
                if tx.send(bytes.slice(i..=i)).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // Then keep the body open.
            tx.closed().await;
        })
    }

    #[tokio::test]
    async fn trickled_frames_do_not_keep_a_stream_open() {
        let limit = Duration::from_secs(1);
        let f = fixture(Settings {
            hello_timeout: limit,
            idle_timeout: limit,
            ..Settings::new(10, Duration::from_secs(10))
        })
        .await;
        let v = Some("1.0");
        let t = Some("node-a-token");
        let bounded = |took: Duration, what: &str| {
            eprintln!("{what}: ended after {took:?} (limit {limit:?})");
            assert!(
                took >= limit.mul_f32(0.9) && took < limit + Duration::from_secs(4),
                "{what}: ended after {took:?}, the limit is {limit:?}"
            );
        };

        // A Hello trickled byte by byte (about 10 s of it): 408 when the Hello's time is up.
        let started = std::time::Instant::now();
        let (tx, rx) = mpsc::channel(16);
        let feeding = trickle(tx, frame(&hello("node-a")));
        let req = Request::post(STREAM_PATH)
            .header(VERSION_HEADER, "1.0")
            .header(header::AUTHORIZATION, "Bearer node-a-token")
            .body(ChannelBody(rx))
            .expect("request");
        let (code, message) = error_of(f.ingest.handle(req, &peer()).await).await;
        assert_eq!(code, StatusCode::REQUEST_TIMEOUT, "{message}");
        bounded(started.elapsed(), "a trickled Hello");
        feeding.abort();

        // After the Hello, an Update trickled byte by byte: the idle timeout counts whole
        // messages, not bytes, so the stream ends on time, saying why.
        let (r, tx) = open(&f, STREAM_PATH, v, t, &[hello("node-a")]).await;
        let started = std::time::Instant::now();
        assert_eq!(r.status(), StatusCode::OK);
        let t1 = now();
        let update = frame(&AgentMessage::Update(Update {
            sent_at: UnixNanos(t1),
            node: node_sample(t1),
            upserts: vec![],
            removed: vec![],
            counters: vec![counters("u-web", t1)],
        }));
        assert!(update.len() > 50, "long enough to outlast the timeout");
        let feeding = trickle(tx, update);
        let mut body = r.into_body();
        let mut decoder = Decoder::new();
        assert_eq!(
            next(&mut body, &mut decoder).await,
            Some(ServerMessage::Welcome { version: VERSION })
        );
        assert_eq!(
            next(&mut body, &mut decoder).await,
            Some(ServerMessage::Error {
                message: format!("no message for {limit:?}; closing the stream")
            })
        );
        bounded(started.elapsed(), "an Update trickled after the Hello");
        feeding.abort();
    }

    #[tokio::test]
    async fn streams_feed_sessions_and_end_with_a_reason() {
        let f = fixture(Settings::new(2, Duration::from_secs(10))).await;
        let v = Some("1.0");
        let t = Some("node-a-token");
        let t0 = now();
        let snapshot = AgentMessage::Snapshot(Snapshot {
            sent_at: UnixNanos(t0),
            node: node_sample(t0),
            pods: vec![pod("u-web", "web"), pod("u-cache", "cache")],
            counters: vec![counters("u-web", t0), counters("u-cache", t0)],
            previous: None,
        });
        let (r, body) = open(&f, STREAM_PATH, v, t, &[hello("node-a"), snapshot]).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[VERSION_HEADER], VERSION.to_string().as_str());
        assert_eq!(r.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        let mut first = r.into_body();
        let mut decoder = Decoder::new();
        assert_eq!(
            next(&mut first, &mut decoder).await,
            Some(ServerMessage::Welcome { version: VERSION })
        );
        let m = f.ingest.sessions().sink().metrics.clone();
        assert_eq!(m.streams_open(), 1);
        let listed = || -> Vec<String> {
            f.metadata
                .pods(Some("demo"))
                .into_iter()
                .map(|p| p.name)
                .collect()
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while listed() != ["cache", "web"] {
            assert!(tokio::time::Instant::now() < deadline, "{:?}", listed());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            f.metadata.node("node-a").expect("node").labels["zone"],
            "z1"
        );

        // A removal, in pieces: the frame split across two chunks.
        let t1 = now();
        let update = frame(&AgentMessage::Update(Update {
            sent_at: UnixNanos(t1),
            node: node_sample(t1),
            upserts: vec![],
            removed: vec!["u-cache".into()],
            counters: vec![counters("u-web", t1), counters("u-gone", t1)],
        }));
        body.send(update.slice(..7)).await.expect("send");
        body.send(update.slice(7..)).await.expect("send");
        while listed() != ["web"] {
            assert!(tokio::time::Instant::now() < deadline, "{:?}", listed());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(m.unknown_uid_count(), 1);

        // A second stream for node-a replaces the first, which is told why.
        let (r, _second_body) = open(&f, STREAM_PATH, v, t, &[hello("node-a")]).await;
        assert_eq!(r.status(), StatusCode::OK);
        let mut second = r.into_body();
        assert_eq!(
            next(&mut first, &mut decoder).await,
            Some(ServerMessage::Error {
                message: r#"replaced by a newer stream for node "node-a""#.into()
            })
        );
        assert_eq!(next(&mut first, &mut decoder).await, None, "then it ends");
        assert_eq!(m.replaced_count(), 1);
        drop(first);
        drop(body);
        // The data outlives the replaced stream.
        assert_eq!(listed(), ["web"]);

        // Two requests at most: the second stream holds one slot, a request waiting for
        // its Hello the other; a fourth is refused.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while m.streams_open() != 1 || f.ingest.slots.available_permits() != 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the first stream's slot"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (waiting_tx, waiting_rx) = mpsc::channel(1);
        let req = Request::post(STREAM_PATH)
            .header(VERSION_HEADER, "1.0")
            .header(header::AUTHORIZATION, "Bearer node-a-token")
            .body(ChannelBody(waiting_rx))
            .expect("request");
        let ingest = f.ingest.clone();
        let waiting = tokio::spawn(async move { ingest.handle(req, &peer()).await });
        while f.ingest.slots.available_permits() != 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the waiting request's slot"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (r, _) = open(&f, STREAM_PATH, v, t, &[hello("node-a")]).await;
        assert_eq!(error_of(r).await.0, StatusCode::TOO_MANY_REQUESTS);
        drop(waiting_tx);
        let r = waiting.await.expect("task");
        assert_eq!(error_of(r).await.0, StatusCode::BAD_REQUEST, "no Hello");

        // Shutdown ends the stream with a reason and refuses new ones.
        f.ingest.shutdown();
        let mut decoder = Decoder::new();
        assert_eq!(
            next(&mut second, &mut decoder).await,
            Some(ServerMessage::Welcome { version: VERSION })
        );
        assert!(matches!(
            next(&mut second, &mut decoder).await,
            Some(ServerMessage::Error { message }) if message.contains("shutting down")
        ));
        let (r, _) = open(&f, STREAM_PATH, v, t, &[hello("node-a")]).await;
        assert_eq!(error_of(r).await.0, StatusCode::SERVICE_UNAVAILABLE);
    }
}
