//! HTTPS serving: hyper 1 over rustls, HTTP/2 and HTTP/1.1 (ALPN), with every limit
//! explicit — connections, TLS handshake time, header read time, concurrent streams,
//! request bodies — and a graceful drain on shutdown. Routing and answers live in
//! [`Handler`] implementations; this module knows nothing of metrics.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{conn::auto::Builder, graceful::GracefulShutdown},
};
use rustls::pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// Serving limits. Every one is explicit; the defaults suit an aggregated API server.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Concurrent connections; more wait in the listen backlog.
    pub max_connections: usize,
    /// Time allowed for a TLS handshake.
    pub handshake_timeout: Duration,
    /// Time allowed for a request's headers (HTTP/1.1).
    pub header_read_timeout: Duration,
    /// Concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
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
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            max_concurrent_streams: 250,
            max_body_bytes: 64 << 10,
            body_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// Who is on the other end of a connection, as TLS established it.
#[derive(Clone, Debug)]
pub struct Peer {
    /// Remote address.
    pub addr: SocketAddr,
    /// The client's certificate chain, if it presented one (verified by the TLS layer
    /// against the configured client CAs; authentication decides what it proves).
    pub client_certs: Option<Arc<Vec<CertificateDer<'static>>>>,
}

/// Answers requests. The body has already been read (bounded).
pub trait Handler: Send + Sync + 'static {
    /// One request.
    fn handle(
        &self,
        req: Request<Bytes>,
        peer: &Peer,
    ) -> impl std::future::Future<Output = Response<Full<Bytes>>> + Send;
}

/// A plain-text response.
pub fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut().insert(
        "x-content-type-options",
        http::HeaderValue::from_static("nosniff"),
    );
    r
}

/// Accepts connections on `listener` until `shutdown` resolves, then drains.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    handler: Arc<H>,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(tls);
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams);
    let builder = Arc::new(builder);
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
        let acceptor = acceptor.clone();
        let handler = handler.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let limits = limits.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let tls =
                match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%addr, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%addr, "TLS handshake timed out");
                        return;
                    }
                };
            let certs =
                tls.get_ref().1.peer_certificates().map(|c| {
                    Arc::new(c.iter().map(|d| d.clone().into_owned()).collect::<Vec<_>>())
                });
            let peer = Peer {
                addr,
                client_certs: certs,
            };
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let handler = handler.clone();
                let peer = peer.clone();
                let limits = limits.clone();
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
                            return Ok::<_, std::convert::Infallible>(text(
                                StatusCode::PAYLOAD_TOO_LARGE,
                                "request body too large\n",
                            ))
                        }
                        Err(_) => {
                            return Ok(text(
                                StatusCode::REQUEST_TIMEOUT,
                                "request body timed out\n",
                            ))
                        }
                    };
                    Ok(handler
                        .handle(Request::from_parts(parts, body), &peer)
                        .await)
                }
            });
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%addr, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?limits.drain_timeout, "connections still open after the drain timeout; closing");
    }
}
