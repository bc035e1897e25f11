//! One `GET /metrics/resource` from one kubelet: which address and port (as
//! metrics-server chooses them), TLS (rustls), the ServiceAccount's bearer token or a client
//! certificate, one timeout over the whole request, a bound on the body.

use std::{net::IpAddr, path::PathBuf, sync::Arc, time::Duration};

use bytes::Buf as _;
use http_body_util::{BodyExt as _, Empty, Limited};
use k8s_openapi::api::core::v1::Node;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

/// The largest answer read: a node with 110 pods answers about 100 KiB.
pub const MAX_BODY: usize = 8 << 20;

/// Why a scrape gave nothing.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The node has no address of a preferred type, or no kubelet port.
    #[error("no address of the types {0:?}")]
    NoAddress(Vec<String>),
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

    /// The `host:port` of `node`'s kubelet, as metrics-server picks it: the first address
    /// of the first preferred type that has one, and the status port or `--kubelet-port`.
    pub fn target(&self, node: &Node) -> Result<(String, u16), ScrapeError> {
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
        Ok((host, port))
    }

    /// The text of `https://host:port/metrics/resource`, within the timeout.
    pub async fn get(&self, host: &str, port: u16) -> Result<String, ScrapeError> {
        let timeout = self.settings.timeout;
        tokio::time::timeout(timeout, self.get_unbounded(host, port))
            .await
            .map_err(|_| ScrapeError::Timeout(timeout))?
    }

    async fn get_unbounded(&self, host: &str, port: u16) -> Result<String, ScrapeError> {
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
        let mut request = http::Request::get("/metrics/resource")
            .header(http::header::HOST, authority)
            .header(http::header::ACCEPT, "text/plain");
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
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| transport("GET /metrics/resource from", &e))?;
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
        String::from_utf8(bytes.to_vec()).map_err(|_| ScrapeError::Body("an answer not in UTF-8"))
    }
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
        let c = client(&["InternalIP", "ExternalIP", "Hostname"], true);
        assert_eq!(c.target(&n).expect("target"), ("10.0.0.7".into(), 10255));
        let c = client(&["ExternalIP", "Hostname"], false);
        assert_eq!(c.target(&n).expect("target"), ("node-1".into(), 10250));
        // No status port: --kubelet-port.
        let bare = node(&[("InternalIP", "10.0.0.7")], None);
        let c = client(&["InternalIP"], true);
        assert_eq!(c.target(&bare).expect("target"), ("10.0.0.7".into(), 10250));
        let c = client(&["ExternalIP"], true);
        assert!(matches!(c.target(&bare), Err(ScrapeError::NoAddress(_))));
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
        let err = c.get("127.0.0.1", port).await.expect_err("times out");
        assert!(matches!(err, ScrapeError::Timeout(_)), "{err}");
        held.abort();
    }
}
