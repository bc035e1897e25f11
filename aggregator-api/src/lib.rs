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
//! # One request, from the socket to the response
//!
//! Open these files in this order to follow a `GET /apis/metrics.k8s.io/v1beta1/pods`:
//!
//! 1. `serve.rs`: the accept loop, TLS (`tls.rs`, `auth/tls.rs`), HTTP/1.1 or HTTP/2, the
//!    body read whole within its bounds, then the [`serve::Handler`].
//! 2. `app.rs`: health endpoints; otherwise `api/request.rs`'s `preflight` (the request's
//!    attributes), authentication (`auth/chain.rs`: front-proxy headers, client
//!    certificates, tokens through `auth/delegated.rs`), authorization (a
//!    SubjectAccessReview, `auth/delegated.rs`), then the router. Every request is counted
//!    here (`selfmetrics.rs`).
//! 3. `api/handler.rs`: discovery and OpenAPI documents (`api/discovery.rs`,
//!    `api/openapi.rs`, served as an `api/document.rs` `Document`), or a resource request.
//! 4. `api/request.rs`: the route, the query (`api/query.rs`: list options, decoded and
//!    validated; selectors in `api/selector/mod.rs`, parsed by `api/selector/labels.rs` and
//!    `api/selector/fields.rs`, with the validation texts of `api/selector/validation.rs`)
//!    and the representation (`api/negotiate.rs`), or the error the apiserver would send
//!    (`status.rs`).
//! 5. `api/objects.rs`: which objects exist (`metadata.rs`, with `nodes.rs`) and their
//!    numbers (`store/mod.rs`, the rates from `store/series.rs`); a watch (`api/watch.rs`)
//!    looks through the same functions every second.
//! 6. Back in `api/handler.rs`: the encoding, as JSON (`api/types.rs`, `json.rs`), a Table
//!    (`api/table.rs`) or protobuf (`api/proto/mod.rs`, the messages in
//!    `api/proto/metrics.rs` and `api/proto/metav1.rs`), in a response body (`body.rs`).
//!
//! Wherever an answer depends on Go's library behaviour (how `strconv.Quote` quotes a name in
//! a message, how `?timeout=` or `?limit=` parse, how a duration prints, how the path is
//! unescaped), the code calls [`go`], which reproduces it and is tested against output
//! captured from Go.
//!
//! The data arrives the other way: `ingest.rs` (the agents' port) → `session.rs` →
//! `store/mod.rs` (each batch becomes the node's next snapshot in `store/state.rs`) and
//! `metadata.rs`.
//!
//! It is not a Kubernetes client beyond TokenReview, SubjectAccessReview, the
//! authentication ConfigMap, a metadata-only watch of Nodes ([`nodes`]: which nodes
//! exist, and their labels) and of the agent pods ([`agents`]): which pods exist comes from
//! the agents, not from a watch. Where no agent streams a node's data, [`kubelet`] scrapes
//! that node's kubelet as metrics-server does (with the Node's addresses and a
//! metadata-only list of its pods) and [`sources`] serves it from there.

pub mod agents;
pub mod api;
pub mod app;
pub mod auth;
pub mod body;
pub mod config;
pub mod feed;
#[doc(hidden)]
pub mod fuzzing;
pub mod go;
pub mod health;
pub mod ingest;
pub mod json;
pub mod kubelet;
pub mod metadata;
pub mod nodes;
pub mod quantity;
pub mod selfmetrics;
pub mod serve;
pub mod session;
pub mod sources;
pub mod status;
pub mod store;
pub mod tls;
pub mod watched;
