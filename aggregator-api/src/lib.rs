//! kpulse's aggregator-api: the `metrics.k8s.io` extension API server behind the
//! Kubernetes API aggregation layer.
//!
//! It does not collect anything itself: agents stream their node's counters and pod metadata
//! to its second port ([`ingest`]: the server side of `kpulse_wire::stream`, where each
//! agent may only report its own node), or a [`feed`] file of the same messages loads it
//! offline. The data flow, one module per arrow:
//! [`ingest`] / [`feed`] → [`session`] (one per node: metadata + counters joined into full
//! node batches) → [`store`] (+ [`metadata`], with [`nodes`] from the API) → [`api`]
//! (objects, selectors, encodings, watches) → [`app`] (authentication, authorization,
//! health) → [`serve`] (HTTPS).
//!
//! It is not a Kubernetes client beyond TokenReview, SubjectAccessReview, the
//! authentication ConfigMap and a metadata-only watch of Nodes ([`nodes`]: which nodes
//! exist, and their labels): which pods exist comes from the agents, not from a watch.

pub mod agents;
pub mod api;
pub mod app;
pub mod auth;
pub mod body;
pub mod config;
pub mod feed;
#[doc(hidden)]
pub mod fuzzing;
pub mod health;
pub mod ingest;
pub mod json;
pub mod metadata;
pub mod nodes;
pub mod quantity;
pub mod selfmetrics;
pub mod serve;
pub mod session;
pub mod status;
pub mod store;
pub mod tls;
