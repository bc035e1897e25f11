//! The agent's own metrics, in the Prometheus text format (prometheus-client), served over
//! plain HTTP at `/metrics` on `--metrics-bind-address` (loopback by default: a node-local
//! scraper or `kubectl port-forward` reads it; it carries no pod data).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `kpulse_agent_unattributed_cgroups` | gauge, per tick | none |
//! | `kpulse_agent_incomplete_pods` | gauge, per tick | none |
//! | `kpulse_agent_collection_duration_seconds` | histogram (1 ms … 10 s) | none |
//! | `kpulse_agent_collection_errors_total` | counter | none |
//! | `kpulse_agent_dropped_ticks_total` | counter | `replica` |
//! | `kpulse_agent_reconnects_total` | counter | `replica` |
//! | `kpulse_agent_stream_errors_total` | counter | `replica`, `reason` |
//! | `kpulse_agent_streams_up` | gauge | none |

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prometheus_client::{
    encoding::prometheus_text,
    metrics::{counter::Counter, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

use crate::ship::ShipMetrics;

/// The `Content-Type` of `/metrics`.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Bucket bounds (seconds) of the collection duration.
pub const COLLECTION_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// Longest a metrics connection may stay open.
const CONNECTION_LIMIT: Duration = Duration::from_secs(10);

/// Most metrics connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 16;

/// The agent's metrics.
#[derive(Debug)]
pub struct AgentMetrics {
    /// Cgroups under kubepods not joined to a known pod, last tick.
    pub unattributed_cgroups: Gauge,
    /// Known pods left out of the last tick because not all their containers were measured.
    pub incomplete_pods: Gauge,
    /// Time one collection took (collector plus attribution).
    pub collection_duration: Histogram,
    /// Collections that failed.
    pub collection_errors: Counter,
    /// Steps of the wall clock seen (see `clock`).
    pub clock_steps: Counter,
    /// The shipper's metrics.
    pub ship: Arc<ShipMetrics>,
    registry: Registry,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        AgentMetrics::new()
    }
}

impl AgentMetrics {
    /// Everything registered under `kpulse_agent_`.
    pub fn new() -> AgentMetrics {
        let mut registry = Registry::default();
        let unattributed_cgroups = Gauge::default();
        let incomplete_pods = Gauge::default();
        let collection_duration = Histogram::new(COLLECTION_BUCKETS);
        let collection_errors = Counter::default();
        let clock_steps = Counter::default();
        let ship = Arc::new(ShipMetrics::default());
        {
            let r = registry.sub_registry_with_prefix("kpulse_agent");
            r.register(
                "unattributed_cgroups",
                "Cgroups under kubepods that the last tick could not join to a known pod",
                unattributed_cgroups.clone(),
            );
            r.register(
                "incomplete_pods",
                "Known pods left out of the last tick because not all their running containers were measured",
                incomplete_pods.clone(),
            );
            r.register_with_unit(
                "collection_duration",
                "Time one collection and attribution took",
                Unit::Seconds,
                collection_duration.clone(),
            );
            r.register(
                "collection_errors",
                "Collections that failed (the tick was skipped)",
                collection_errors.clone(),
            );
            r.register(
                "clock_steps",
                "Steps of the node's wall clock seen; each restarts every series once",
                clock_steps.clone(),
            );
            ship.register(r);
        }
        AgentMetrics {
            unattributed_cgroups,
            incomplete_pods,
            collection_duration,
            collection_errors,
            clock_steps,
            ship,
            registry,
        }
    }

    /// The text exposition.
    ///
    /// # Errors
    ///
    /// Formatting errors (none in practice: the sink is a `String`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Serves `GET /metrics` over HTTP/1 on `listener` until `stop` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<AgentMetrics>,
    stop: impl std::future::Future<Output = ()>,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut stop = std::pin::pin!(stop);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            () = &mut stop => return,
        };
        let (tcp, _) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!(error = %e, "metrics accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut stop => return,
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let metrics = metrics.clone();
                async move { Ok::<_, Infallible>(respond(&req, &metrics)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .serve_connection(TokioIo::new(tcp), service);
            let _ = tokio::time::timeout(CONNECTION_LIMIT, conn).await;
            drop(permit);
        });
    }
}

fn respond(req: &Request<Incoming>, metrics: &AgentMetrics) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, ct: &str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        if let Ok(v) = http::HeaderValue::from_str(ct) {
            r.headers_mut().insert(http::header::CONTENT_TYPE, v);
        }
        r
    };
    if req.uri().path() != "/metrics" {
        return reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into());
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    match metrics.encode() {
        Ok(text) => reply(StatusCode::OK, CONTENT_TYPE, text),
        Err(_) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            "encoding failed\n".into(),
        ),
    }
}

/// Binds `addr` for [`serve`].
///
/// # Errors
///
/// The bind error.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_types() {
        let m = AgentMetrics::new();
        m.unattributed_cgroups.set(3);
        m.collection_duration.observe(0.002);
        assert_eq!(m.ship.dropped("10.0.0.1:443"), 0);
        let text = m.encode().expect("encode");
        for want in [
            "# TYPE kpulse_agent_unattributed_cgroups gauge",
            "kpulse_agent_unattributed_cgroups 3",
            "# TYPE kpulse_agent_collection_duration_seconds histogram",
            "# TYPE kpulse_agent_dropped_ticks_total counter",
            "kpulse_agent_dropped_ticks_total{replica=\"10.0.0.1:443\"} 0",
            "kpulse_agent_streams_up 0",
            "kpulse_agent_collection_errors_total 0",
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
    }
}
