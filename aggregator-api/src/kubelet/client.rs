//! One `GET /metrics/resource` from one kubelet: which address, port and path (as
//! metrics-server chooses them), TLS (rustls), the ServiceAccount's bearer token or a client
//! certificate, one timeout over the whole request, a bound on the body.

use std::{net::IpAddr, path::PathBuf, sync::Arc, time::Duration};

use bytes::Buf as _;
use http_body_util::{BodyExt as _, Empty, Limited};
use k8s_openapi::api::core::v1::Node;
use kpulse_wire::UnixNanos;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

/// The largest answer read: a node with 110 pods answers about 100 KiB.
pub const MAX_BODY: usize = 8 << 20;

/// The kubelet's path of the resource metrics.
pub const DEFAULT_PATH: &str = "/metrics/resource";
/// A Node annotation naming another path for its resource metrics, as metrics-server (0.7
/// and later) reads it: for endpoints that stand in for kubelets, such as kwok's
/// `/metrics/nodes/<node>/metrics/resource`.
pub const RESOURCE_METRICS_PATH: &str = "metrics.k8s.io/resource-metrics-path";
/// The longest path taken from that annotation.
const MAX_PATH: usize = 1024;

/// Where one node's resource metrics are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Address (IP or name) of the node's kubelet.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// The path: [`DEFAULT_PATH`] or the node's [`RESOURCE_METRICS_PATH`].
    pub path: String,
}

/// Why a scrape gave nothing.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The node has no address of a preferred type, or no kubelet port.
    #[error("no address of the types {0:?}")]
    NoAddress(Vec<String>),
    /// The node's [`RESOURCE_METRICS_PATH`] annotation is too long.
    #[error("annotation {RESOURCE_METRICS_PATH}: {0}")]
    BadPath(String),
    /// TCP connect, TLS or HTTP failed.
    #[error("{0}")]
    Transport(String),
    /// Nothing within `--kubelet-request-timeout`.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// An answer other than 200.
    #[error("HTTP {0}")]
    Status(u16),
    /// More than [`MAX_BODY`] bytes, or not UTF-8.
    #[error("{0}")]
    Body(&'static str),
    /// The text did not parse.
    #[error("unparsable answer: {0}")]
    Parse(#[from] super::parse::ParseError),
    /// The Kubernetes API did not give the Node or its pods.
    #[error("{0}")]
    Api(String),
    /// The store refused the batch.
    #[error("storing: {0}")]
    Store(String),
}

impl ScrapeError {
    /// The `result` label of `kpulse_aggregator_kubelet_scrapes_total`.
    pub fn label(&self) -> &'static str {
        match self {
            ScrapeError::NoAddress(_) => "no_address",
            ScrapeError::BadPath(_) => "bad_path",
            ScrapeError::Transport(_) => "transport",
            ScrapeError::Timeout(_) => "timeout",
            ScrapeError::Status(_) => "http_status",
            ScrapeError::Body(_) => "body",
            ScrapeError::Parse(_) => "parse",
            ScrapeError::Api(_) => "api",
            ScrapeError::Store(_) => "store",
        }
    }
}

/// Where the bearer token comes from.
#[derive(Clone, Debug)]
pub enum Token {
    /// No token (a client certificate authenticates, or nothing does).
    None,
    /// A fixed token (from a kubeconfig).
    Fixed(String),
    /// A file read at every scrape (the projected ServiceAccount token, which the kubelet
    /// rotates).
    File(PathBuf),
}

/// How to reach kubelets: metrics-server's `--kubelet-*` flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `--kubelet-preferred-address-types`, in order.
    pub address_types: Vec<String>,
    /// `--kubelet-port`.
    pub port: u16,
    /// `--kubelet-use-node-status-port`: the port the Node's status reports.
    pub use_node_status_port: bool,
    /// `--kubelet-request-timeout`.
    pub timeout: Duration,
}

/// A client for every kubelet: one TLS configuration, one token source.
#[derive(Clone, Debug)]
pub struct Client {
    tls: Arc<rustls::ClientConfig>,
    token: Token,
    settings: Settings,
}

impl Client {
    /// A client with `tls` (trust and client certificate already set).
    pub fn new(tls: Arc<rustls::ClientConfig>, token: Token, settings: Settings) -> Client {
        Client {
            tls,
            token,
            settings,
        }
    }

    /// Where `node`'s kubelet answers, as metrics-server picks it: the first address of the
    /// first preferred type that has one, the status port or `--kubelet-port`, and the path
    /// of the node's [`RESOURCE_METRICS_PATH`] annotation (escaped as metrics-server escapes
    /// it; at most 1 KiB) or [`DEFAULT_PATH`].
    pub fn target(&self, node: &Node) -> Result<Target, ScrapeError> {
        let s = &self.settings;
        let status = node.status.as_ref();
        let addresses = status.and_then(|s| s.addresses.as_deref()).unwrap_or(&[]);
        let host = s
            .address_types
            .iter()
            .find_map(|t| {
                addresses
                    .iter()
                    .find(|a| &a.type_ == t && !a.address.is_empty())
            })
            .map(|a| a.address.clone())
            .ok_or_else(|| ScrapeError::NoAddress(s.address_types.clone()))?;
        let status_port = status
            .and_then(|s| s.daemon_endpoints.as_ref())
            .and_then(|d| d.kubelet_endpoint.as_ref())
            .map(|e| e.port)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0);
        let port = match status_port {
            Some(p) if s.use_node_status_port => p,
            _ => s.port,
        };
        let path = match node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RESOURCE_METRICS_PATH))
            .filter(|p| !p.is_empty())
        {
            None => DEFAULT_PATH.to_string(),
            Some(p) => checked_path(p)?,
        };
        Ok(Target { host, port, path })
    }

    /// The text of `https://host:port/path`, within the timeout, and when the request was
    /// sent (the time of its samples that have none, as metrics-server takes it).
    pub async fn get(&self, target: &Target) -> Result<(String, UnixNanos), ScrapeError> {
        let timeout = self.settings.timeout;
        tokio::time::timeout(timeout, self.get_unbounded(target))
            .await
            .map_err(|_| ScrapeError::Timeout(timeout))?
    }

    async fn get_unbounded(&self, target: &Target) -> Result<(String, UnixNanos), ScrapeError> {
        let Target { host, port, path } = target;
        let (host, port) = (host.as_str(), *port);
        let transport = |what: &str, e: &dyn std::fmt::Display| {
            ScrapeError::Transport(format!("{what} {host}:{port}: {e}"))
        };
        let name = match host.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(host.to_string())
                .map_err(|e| transport("a bad host name", &e))?,
        };
        let tcp = TcpStream::connect((host, port))
            .await
            .map_err(|e| transport("connecting to", &e))?;
        // Best effort: a scrape is one request.
        let _ = tcp.set_nodelay(true);
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| transport("TLS with", &e))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .map_err(|e| transport("HTTP with", &e))?;
        // Ends with the connection: when the answer is read, or this future is dropped.
        let driver = tokio::spawn(connection);
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        // No Accept header, as metrics-server's Go client sends none: the kubelet then
        // answers its text format, and so does kwok's stand-in, which refuses an
        // `Accept: text/plain` with 406 (found on the cluster's fleet).
        let mut request = http::Request::get(path.as_str()).header(http::header::HOST, authority);
        let token = match &self.token {
            Token::None => None,
            Token::Fixed(t) => Some(t.clone()),
            Token::File(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| transport(&format!("reading the token {}", path.display()), &e))?
                    .trim()
                    .to_string(),
            ),
        };
        if let Some(token) = token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(Empty::<bytes::Bytes>::new())
            .map_err(|e| transport("building a request for", &e))?;
        // After the handshakes, which metrics-server's kept-alive connections mostly skip.
        let sent = UnixNanos::from_system_time(std::time::SystemTime::now());
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| transport(&format!("GET {path} from"), &e))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|_| ScrapeError::Body("an answer larger than 8 MiB, or cut short"));
        driver.abort();
        if status != http::StatusCode::OK {
            return Err(ScrapeError::Status(status.as_u16()));
        }
        let mut buf = body?.aggregate();
        let bytes = buf.copy_to_bytes(buf.remaining());
        let text = String::from_utf8(bytes.to_vec())
            .map_err(|_| ScrapeError::Body("an answer not in UTF-8"))?;
        Ok((text, sent))
    }
}

/// What Go's `url.URL` escapes in a path, and so metrics-server's request: every byte but
/// the unreserved ones (`A-Z a-z 0-9 - . _ ~`) and `$ & + , / : ; = @`.
const PATH_ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'$')
    .remove(b'&')
    .remove(b'+')
    .remove(b',')
    .remove(b'/')
    .remove(b':')
    .remove(b';')
    .remove(b'=')
    .remove(b'@');

/// The request path for an annotation's `path`, as metrics-server sends it: a `/` in front
/// of a relative one, and percent-encoded as Go encodes a URL's path (a `?` or `%` is part
/// of the path, not a query or an escape). Longer than 1 KiB is refused (a bound of ours).
fn checked_path(path: &str) -> Result<String, ScrapeError> {
    if path.len() > MAX_PATH {
        let start: String = path.chars().take(64).collect();
        return Err(ScrapeError::BadPath(format!(
            "longer than 1 KiB: {start:?}..."
        )));
    }
    let slash = if path.starts_with('/') { "" } else { "/" };
    Ok(format!(
        "{slash}{}",
        percent_encoding::utf8_percent_encode(path, PATH_ESCAPED)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(addresses: &[(&str, &str)], port: Option<i32>) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "status": {
                "addresses": addresses
                    .iter()
                    .map(|(t, a)| serde_json::json!({"type": t, "address": a}))
                    .collect::<Vec<_>>(),
                "daemonEndpoints": {"kubeletEndpoint": {"Port": port.unwrap_or(0)}},
            }
        }))
        .expect("a node")
    }

    fn client(types: &[&str], use_status_port: bool) -> Client {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        Client::new(
            Arc::new(config),
            Token::None,
            Settings {
                address_types: types.iter().map(|t| t.to_string()).collect(),
                port: 10250,
                use_node_status_port: use_status_port,
                timeout: Duration::from_secs(1),
            },
        )
    }

    #[test]
    fn addresses_by_preference_and_the_status_port() {
        let n = node(
            &[
                ("Hostname", "node-1"),
                ("InternalIP", "10.0.0.7"),
                ("InternalIP", "10.0.0.8"),
            ],
            Some(10255),
        );
        let at = |host: &str, port| Target {
            host: host.into(),
            port,
            path: DEFAULT_PATH.into(),
        };
        let c = client(&["InternalIP", "ExternalIP", "Hostname"], true);
        assert_eq!(c.target(&n).expect("target"), at("10.0.0.7", 10255));
        let c = client(&["ExternalIP", "Hostname"], false);
        assert_eq!(c.target(&n).expect("target"), at("node-1", 10250));
        // No status port: --kubelet-port.
        let bare = node(&[("InternalIP", "10.0.0.7")], None);
        let c = client(&["InternalIP"], true);
        assert_eq!(c.target(&bare).expect("target"), at("10.0.0.7", 10250));
        let c = client(&["ExternalIP"], true);
        assert!(matches!(c.target(&bare), Err(ScrapeError::NoAddress(_))));
    }

    /// metrics-server's node annotation for another path (kwok serves every fake node's
    /// metrics from one server, each under its own path), escaped as Go's `url.URL` escapes
    /// metrics-server's; past 1 KiB it fails that node's scrapes, with its own `result`
    /// label.
    #[test]
    fn the_path_comes_from_the_nodes_annotation() {
        let c = client(&["InternalIP"], true);
        let mut n = node(&[("InternalIP", "127.0.0.1")], Some(10247));
        let annotate = |n: &mut Node, path: &str| {
            n.metadata.annotations = Some(
                [(RESOURCE_METRICS_PATH.to_string(), path.to_string())]
                    .into_iter()
                    .collect(),
            );
        };
        annotate(&mut n, "/metrics/nodes/kwok-node-0/metrics/resource");
        assert_eq!(
            c.target(&n).expect("target").path,
            "/metrics/nodes/kwok-node-0/metrics/resource"
        );
        annotate(&mut n, "");
        assert_eq!(c.target(&n).expect("target").path, DEFAULT_PATH);
        // What Go's (url.URL{Path: p}).String() gives metrics-server.
        for (annotation, sent) in [
            ("metrics/resource", "/metrics/resource"),
            ("/m?x=1#f", "/m%3Fx=1%23f"),
            ("/a b/%2F", "/a%20b/%252F"),
            ("/\u{e9}!*'()", "/%C3%A9%21%2A%27%28%29"),
            ("/$&+,:;=@-._~", "/$&+,:;=@-._~"),
        ] {
            annotate(&mut n, annotation);
            assert_eq!(c.target(&n).expect("target").path, sent, "{annotation:?}");
        }
        let long = format!("/{}", "a".repeat(MAX_PATH));
        annotate(&mut n, &long);
        let err = c.target(&n).expect_err("too long");
        assert!(matches!(err, ScrapeError::BadPath(_)), "{err}");
        assert_eq!(err.label(), "bad_path");
        assert!(err.to_string().len() < 200, "{err}");
    }

    /// End to end over TLS, as kwok stands in for a kubelet: the request goes to the
    /// annotated path, and its unstamped samples read with the time the request was sent.
    #[tokio::test]
    async fn a_stand_in_for_the_kubelet_is_read_at_its_path() {
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])
            .expect("a certificate");
        let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der())
            .expect("a key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .expect("a server configuration");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.cert.der().clone()).expect("a root");
        let trusting = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let asked = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
        let seen = asked.clone();
        let served = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.expect("accept");
            let tls = acceptor.accept(tcp).await.expect("TLS");
            let service = hyper::service::service_fn(move |req: http::Request<_>| {
                seen.lock().push(req.uri().path().to_string());
                // As kwok's endpoint: a request naming a format it does not offer is refused.
                let refused = req
                    .headers()
                    .get(http::header::ACCEPT)
                    .is_some_and(|a| a.as_bytes() != b"*/*");
                async move {
                    if refused {
                        let mut r =
                            http::Response::new(http_body_util::Full::new(bytes::Bytes::new()));
                        *r.status_mut() = http::StatusCode::NOT_ACCEPTABLE;
                        return Ok::<_, std::convert::Infallible>(r);
                    }
                    Ok::<_, std::convert::Infallible>(http::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from_static(
                            b"node_cpu_usage_seconds_total 3\nnode_memory_working_set_bytes 1024\n",
                        )),
                    ))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
        });
        let c = Client::new(
            Arc::new(trusting),
            Token::Fixed("t".into()),
            client(&["InternalIP"], true).settings,
        );
        let mut n = node(&[("InternalIP", "127.0.0.1")], Some(i32::from(port)));
        n.metadata.annotations = Some(
            [(
                RESOURCE_METRICS_PATH.to_string(),
                "/metrics/nodes/fake-1/metrics/resource".to_string(),
            )]
            .into_iter()
            .collect(),
        );
        let target = c.target(&n).expect("a target");
        let before = UnixNanos::from_system_time(std::time::SystemTime::now());
        let (text, sent) = c.get(&target).await.expect("an answer");
        let after = UnixNanos::from_system_time(std::time::SystemTime::now());
        assert!(
            before <= sent && sent <= after,
            "{before:?} {sent:?} {after:?}"
        );
        let node = super::super::parse::parse(&text, sent)
            .expect("parses")
            .node
            .expect("the node");
        assert_eq!(node.timestamp.0, sent.0 / 1_000_000 * 1_000_000);
        assert_eq!(node.memory_working_set, kpulse_wire::Bytes(1024));
        assert_eq!(
            asked.lock().as_slice(),
            ["/metrics/nodes/fake-1/metrics/resource"]
        );
        served.abort();
    }

    /// A kubelet that does not answer within the timeout is a timeout, not a hang.
    #[tokio::test]
    async fn a_silent_kubelet_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // Accepts and never answers the TLS handshake.
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                open.push(s);
            }
        });
        let c = client(&["InternalIP"], false);
        let target = Target {
            host: "127.0.0.1".into(),
            port,
            path: DEFAULT_PATH.into(),
        };
        let err = c.get(&target).await.expect_err("times out");
        assert!(matches!(err, ScrapeError::Timeout(_)), "{err}");
        held.abort();
    }
}
