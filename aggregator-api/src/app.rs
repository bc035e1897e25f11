//! The request router and the security gate. Health endpoints answer unauthenticated
//! probes; every other request is authenticated (the chain of `auth::chain`), authorized
//! ([`Authorization`]: a SubjectAccessReview, or always for local use), stripped of credentials, and only then handed to the API, or
//! to `/metrics` (the server's own metrics, [`crate::selfmetrics`]). Every request is
//! counted and timed in one place, [`App`]'s [`Handler::handle`].

use std::{sync::Arc, time::Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};

use crate::{
    api::request::{preflight, Rejection, RequestParts},
    auth::{
        chain::Chain,
        delegated::{internal_error_body, Attributes, Authorizer, Decision},
    },
    body::{full, text, Body},
    health::{self, Check},
    json::encode_json,
    selfmetrics::{RequestKind, SelfMetrics},
    serve::{Handler, Peer},
    status::Status,
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

/// Who may do what.
pub struct Security {
    /// Authentication.
    pub chain: Chain,
    /// Authorization.
    pub authorizer: Authorization,
}

/// How authenticated requests are authorized (`--authorization-mode`).
#[derive(Clone, Debug)]
pub enum Authorization {
    /// A SubjectAccessReview (`Webhook`).
    Webhook(Arc<Authorizer>),
    /// Every authenticated request is allowed (`AlwaysAllow`): local use only.
    AlwaysAllow,
}

impl Authorization {
    /// Whether the request described by `attrs` may proceed.
    pub async fn authorize(&self, attrs: &Attributes<'_>) -> Decision {
        match self {
            Authorization::Webhook(authorizer) => authorizer.authorize(attrs).await,
            Authorization::AlwaysAllow => Decision::Allow,
        }
    }
}

/// What answers authorized requests: `None` from the router means "not ours" (404).
pub trait Router: Send + Sync + 'static {
    /// Answers an authenticated, authorized request.
    fn route(&self, req: &Request<Bytes>) -> Option<Response<Body>>;
}

impl Router for crate::api::handler::ApiContext {
    fn route(&self, req: &Request<Bytes>) -> Option<Response<Body>> {
        crate::api::handler::handle(self, req)
    }
}

/// The server's handler.
pub struct App<R: Router> {
    /// Health checks (no authentication: kubelet probes carry no credentials).
    pub health: HealthChecks,
    /// Authentication and authorization for everything else.
    pub security: Security,
    /// The API.
    pub router: R,
    /// The server's own metrics: every request is recorded there, and `/metrics` serves
    /// them (after authentication and authorization). `None`: neither.
    pub metrics: Option<Arc<SelfMetrics>>,
}

fn status_response(s: &Status) -> Response<Body> {
    let code = StatusCode::from_u16(s.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match encode_json(s) {
        Ok(body) => {
            let mut r = Response::new(full(body));
            *r.status_mut() = code;
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(_) => text(
            code,
            format!("{}\n", code.canonical_reason().unwrap_or("error")),
        ),
    }
}

fn health_answer(
    checks: &HealthChecks,
    method: &http::Method,
    path: &str,
    query: &str,
) -> Option<Response<Body>> {
    for (endpoint, list) in [
        ("healthz", &checks.healthz),
        ("livez", &checks.livez),
        ("readyz", &checks.readyz),
    ] {
        // `/<endpoint>` or `/<endpoint>/<check>`.
        let Some(rest) = path
            .strip_prefix('/')
            .and_then(|p| p.strip_prefix(endpoint))
        else {
            continue;
        };
        let sub = match rest.strip_prefix('/') {
            Some(sub) => Some(sub).filter(|s| !s.is_empty()),
            None if rest.is_empty() => None,
            None => continue,
        };
        if method != http::Method::GET && method != http::Method::HEAD {
            return Some(text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"));
        }
        let a = health::evaluate(endpoint, list, sub, query);
        let status = StatusCode::from_u16(a.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return Some(text(status, a.body));
    }
    None
}

/// `/metrics` in the Prometheus text format, for GET and HEAD.
fn metrics_answer(metrics: &SelfMetrics, method: &http::Method) -> Response<Body> {
    if method != http::Method::GET && method != http::Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        r.headers_mut().insert(
            http::header::ALLOW,
            http::HeaderValue::from_static("GET, HEAD"),
        );
        return r;
    }
    match metrics.encode() {
        Ok(body) => {
            let mut r = text(StatusCode::OK, body);
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(crate::selfmetrics::CONTENT_TYPE),
            );
            r
        }
        Err(e) => {
            tracing::warn!(error = %kpulse_process::error_chain(&e), "cannot serve /metrics");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot encode the metrics\n",
            )
        }
    }
}

impl<R: Router> Handler for App<R> {
    async fn handle(&self, req: Request<Bytes>, peer: &Peer) -> Response<Body> {
        let started = Instant::now();
        let mut kind = RequestKind::new(req.method(), req.uri().path());
        let response = self.answer(req, peer, &mut kind).await;
        if let Some(m) = &self.metrics {
            m.record(&kind, response.status(), started.elapsed());
        }
        response
    }
}

impl<R: Router> App<R> {
    /// Answers one request; `kind` learns what preflight found, for [`Handler::handle`] to
    /// record.
    async fn answer(
        &self,
        mut req: Request<Bytes>,
        peer: &Peer,
        kind: &mut RequestKind,
    ) -> Response<Body> {
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or("").to_string();
        if let Some(r) = health_answer(&self.health, req.method(), &path, &query) {
            return r;
        }
        // What the apiserver checks before authentication (`?timeout=`, the request info).
        let info = {
            let parts = RequestParts::from_http(&req);
            match preflight(&parts) {
                Ok(p) => {
                    kind.refine(&p.info);
                    p.info
                }
                Err(Rejection::Error(e)) => return status_response(&e.status),
                Err(Rejection::Plain { code, body }) => {
                    return text(
                        StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST),
                        body,
                    )
                }
                Err(_) => return text(StatusCode::NOT_FOUND, "404 page not found\n"),
            }
        };
        let certs = peer.client_certs.as_ref().map(|c| c.as_slice());
        let user = match self
            .security
            .chain
            .authenticate(certs, req.headers(), &path)
            .await
        {
            Ok(a) => a.user,
            Err(u) => {
                // The outage itself is one WARN of the review cache (a state change); each
                // request it fails is a DEBUG line. `u` names methods and causes, never
                // credentials.
                tracing::debug!(%path, error = %u, "request not authenticated");
                return status_response(&u.status());
            }
        };
        self.security.chain.strip_credentials(req.headers_mut());
        let attrs = Attributes::new(&user, info.attributes(&user.name), &info.api_version);
        match self.security.authorizer.authorize(&attrs).await {
            Decision::Allow => {}
            Decision::Deny(reason) => {
                return status_response(&Status::forbidden(attrs.request(), &reason));
            }
            Decision::Error(message) => {
                // The outage is one WARN of the review cache; each request it fails, DEBUG.
                tracing::debug!(%path, user = %user.name, error = %message, "authorization failed closed");
                // Go's `RequestURI`: the request target, which over HTTP/2 is `:path` (the
                // URI hyper gives has the scheme and authority too).
                let uri = req
                    .uri()
                    .path_and_query()
                    .map_or_else(|| path.clone(), ToString::to_string);
                return text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    internal_error_body(&uri, &message),
                );
            }
        }
        if let Some(m) = self.metrics.as_deref().filter(|_| path == "/metrics") {
            return metrics_answer(m, req.method());
        }
        self.router
            .route(&req)
            .unwrap_or_else(|| text(StatusCode::NOT_FOUND, "404 page not found\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{api::request::RequestParts, auth::UserInfo};

    #[tokio::test]
    async fn always_allow_allows_any_authenticated_request() {
        let user = UserInfo {
            name: "demo-admin".into(),
            ..Default::default()
        };
        let req = Request::get("/apis/metrics.k8s.io/v1beta1/pods")
            .body(Bytes::new())
            .expect("request");
        let parts = RequestParts::from_http(&req);
        let Ok(p) = preflight(&parts) else {
            panic!("preflight")
        };
        let attrs = Attributes::new(&user, p.info.attributes(&user.name), &p.info.api_version);
        assert!(Authorization::AlwaysAllow
            .authorize(&attrs)
            .await
            .is_allowed());
    }
}
