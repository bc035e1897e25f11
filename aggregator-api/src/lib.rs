//! kpulse's aggregator-api: the `metrics.k8s.io` extension API server.
//!
//! Placeholder: the server, its store and the aggregation layer's security model
//! arrive with their own issue. Nothing here serves requests yet.
