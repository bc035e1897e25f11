//! The request router: which path is answered by what. Today: health endpoints; the
//! metrics.k8s.io API is mounted here as it lands.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;

use crate::{
    health::{self, Check},
    serve::{text, Handler, Peer},
};

/// Health checks per endpoint.
#[derive(Clone, Default)]
pub struct HealthChecks {
    /// `/healthz`.
    pub healthz: Vec<Arc<dyn Check>>,
    /// `/livez`.
    pub livez: Vec<Arc<dyn Check>>,
    /// `/readyz`.
    pub readyz: Vec<Arc<dyn Check>>,
}

/// The server's handler.
pub struct App {
    /// Health checks.
    pub health: HealthChecks,
}

impl Handler for App {
    async fn handle(&self, req: Request<Bytes>, _peer: &Peer) -> Response<Full<Bytes>> {
        let path = req.uri().path();
        let query = req.uri().query().unwrap_or("");
        for (endpoint, checks) in [
            ("healthz", &self.health.healthz),
            ("livez", &self.health.livez),
            ("readyz", &self.health.readyz),
        ] {
            let prefix = format!("/{endpoint}");
            if path == prefix || path.starts_with(&format!("{prefix}/")) {
                if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
                    return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
                }
                let sub = path
                    .strip_prefix(&format!("{prefix}/"))
                    .filter(|s| !s.is_empty());
                let a = health::evaluate(endpoint, checks, sub, query);
                let status =
                    StatusCode::from_u16(a.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                return text(status, a.body);
            }
        }
        text(StatusCode::NOT_FOUND, "404 page not found\n")
    }
}
