//! HTTPS serving: hyper 1 over rustls, HTTP/2 and HTTP/1.1 (ALPN), with every limit
//! explicit — connections, TLS handshake time, header read time, concurrent streams,
//! request bodies — and a graceful drain on shutdown. Routing and answers live in
//! [`Handler`] implementations; this module knows nothing of metrics.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, Limited};
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
    /// The client's certificate chain, if it presented one. **Unverified**: the TLS
    /// layer only checked possession of the key (see `auth::tls`); authentication
    /// verifies it against the current CA bundles before believing anything in it.
    pub client_certs: Option<Arc<Vec<CertificateDer<'static>>>>,
}

/// A response body: whole (most answers) or streamed (watches).
pub type Body = BoxBody<Bytes, std::convert::Infallible>;

/// A whole response body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// A body fed by a bounded channel: each message is one data frame, the body ends when
/// every sender is gone (watch streams; request bodies in tests).
#[derive(Debug)]
pub struct ChannelBody(pub tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(hyper::body::Frame::data(c))))
    }
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

/// A plain-text response.
pub fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(full(body));
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

/// Accepts connections on `listener` until `shutdown` resolves, then drains. Request
/// bodies are read whole, within [`Limits::max_body_bytes`] and [`Limits::body_timeout`],
/// before `handler` sees them.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    handler: Arc<H>,
    limits: Limits,
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
    serve_connections(listener, tls, limits, shutdown, handle).await;
}

/// Accepts connections on `listener` until `shutdown` resolves, then drains (for at most
/// [`Limits::drain_timeout`]). Each request goes to `handle` with its body unread, so
/// that a streaming endpoint (the agents' ingest port) reads it as it comes; `handle`
/// bounds what it reads. [`Limits::max_body_bytes`] and [`Limits::body_timeout`] are not
/// applied here.
pub async fn serve_connections<F, Fut>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
    handle: F,
) where
    F: Fn(Request<Incoming>, Peer) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
{
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
        let handle = handle.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let handshake_timeout = limits.handshake_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
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
                let response = handle(req, peer.clone());
                async move { Ok::<_, std::convert::Infallible>(response.await) }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::x509::testing::TestCa;

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
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
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
}
