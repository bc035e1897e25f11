//! kpulse's aggregator-api: the `metrics.k8s.io` extension API server behind the
//! Kubernetes API aggregation layer.
//!
//! It does not collect anything itself: agents push node batches to it (a later milestone);
//! until then the [`feed`] file loads the store. The data flow, one module per arrow:
//! [`feed`] → [`store`] (+ [`metadata`]) → [`api`] (objects, selectors, encodings, watches)
//! → [`app`] (authentication, authorization, health) → [`serve`] (HTTPS).

pub mod api;
pub mod app;
pub mod auth;
pub mod config;
pub mod feed;
pub mod health;
pub mod ingest;
pub mod metadata;
pub mod quantity;
pub mod selfmetrics;
pub mod serve;
pub mod session;
pub mod store;
pub mod tls;

/// `outer: cause: root cause`, for log fields.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
