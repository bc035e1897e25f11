//! The server's own metrics, served at `/metrics` in the Prometheus text format (0.0.4)
//! with the `prometheus-client` crate: what was asked and answered, how fast, what the
//! store holds and how fresh the served data was.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `kpulse_aggregator_requests_total` | counter | `verb`, `group`, `version`, `resource`, `endpoint`, `code` |
//! | `kpulse_aggregator_request_duration_seconds` | histogram (0.5 ms … 10 s) | `verb`, `group`, `version`, `resource`, `endpoint` |
//! | `kpulse_aggregator_metric_freshness_seconds` | histogram (0.1 s … 60 s) | none |
//! | `kpulse_aggregator_store_nodes`, `_pods`, `_containers` | gauge, read at scrape | none |
//! | `kpulse_aggregator_store_newest_batch_age_seconds`, `_oldest_batch_age_seconds` | gauge, read at scrape; absent without nodes | none |
//! | `kpulse_aggregator_ingest_streams` | gauge | none |
//! | `kpulse_aggregator_ingest_messages_total` | counter | `type` (`hello`, `snapshot`, `update`) |
//! | `kpulse_aggregator_ingest_received_bytes_total` | counter | none |
//! | `kpulse_aggregator_ingest_rejected_total` | counter | `reason` ([`RejectReason`]) |
//! | `kpulse_aggregator_ingest_local_token_checks_total` | counter | `outcome`: `accepted`, or why a TokenReview was needed ([`crate::auth::issuer::Deferral`]) |
//! | `kpulse_aggregator_ingest_unknown_uid_counters_dropped_total` | counter | none |
//! | `kpulse_aggregator_ingest_sessions_replaced_total` | counter | none |
//! | `kpulse_aggregator_connections` | gauge, read at scrape | `port` (`api`, `agents`) |
//! | `kpulse_aggregator_connections_closed_total` | counter, read at scrape | `port`, `reason` ([`Closed`]) |
//!
//! # Requests
//!
//! Every request is counted once, whatever answered it: health probes, rejections before
//! authentication (a bad `?timeout=`), 401, 403, 404, the API, `/metrics` itself. The
//! latency is from the handler's start to the built response (TokenReview and
//! SubjectAccessReview round trips included; writing the body is not).
//!
//! Labels take values from fixed sets only, so no request can add series beyond a known
//! bound ([`RequestKind`]); raw paths, names and namespaces never become labels:
//!
//! - `verb`: the Kubernetes verb of a resource request (`get`, `list`, `watch`, …), the
//!   lowercased method otherwise, `other` for anything else (extension methods).
//! - `group` / `version` / `resource`: for resource requests, `metrics.k8s.io`, `v1` or
//!   `v1beta1`, `nodes` or `pods`; `other` for anything else (a request for another group
//!   has `other` in all three). Empty for non-resource requests.
//! - `endpoint`: `api` (resource requests), `discovery` (`/apis`, the group and version
//!   documents), `openapi`, `metrics`, `health` (`/healthz`, `/livez`, `/readyz` and their
//!   per-check paths), `other`.
//! - `code`: the HTTP status; this server writes a small fixed set.
//!
//! Health probes are counted (`endpoint="health"`): a probe rate that stops, or 500s there,
//! is worth seeing, and their label values are as fixed as any other.
//!
//! # Store and freshness
//!
//! The store gauges come from [`Store::stats`] at every scrape (a [`Collector`]), so they
//! are never stale: nodes, pods and containers in memory, and the seconds since the newest
//! and the oldest of the nodes' latest batches arrived (the oldest grows past the metric
//! expiry when an agent stops, until housekeeping drops its node).
//! `kpulse_aggregator_metric_freshness_seconds` is metrics-server's
//! `metrics_server_api_metric_freshness_seconds`: `now − timestamp` of every NodeMetrics and
//! PodMetrics object served, observed through [`Store::observe_served`].
//!
//! # Agent streams
//!
//! [`IngestMetrics`] counts what the ingest port (`ingest.rs`) receives: streams open now,
//! messages and bytes received over the network (the feed file is not counted), streams
//! refused before they started, by a reason from a fixed set ([`RejectReason`], every one
//! present from the start at 0), pod counters dropped because their uid was never
//! announced, and sessions ended because a newer stream for the same node replaced them.
//!
//! # The kubelet fallback
//!
//! Read from [`crate::kubelet::Stats`] at each scrape: `kpulse_aggregator_node_source`
//! (1 per node, label `source`: `agent` or `kubelet`: where that node's data is served
//! from), `kpulse_aggregator_kubelet_nodes` (nodes served from their kubelets),
//! `kpulse_aggregator_kubelet_scrapes_total` by `result` (`ok`, or why it failed),
//! `kpulse_aggregator_kubelet_scrape_seconds_total` (time in scrapes) and
//! `kpulse_aggregator_kubelet_pods_skipped_total` by `reason` (a container without both
//! figures: `incomplete`; no such pod in the API: `no_pod_object`).
//!
//! # Access
//!
//! As metrics-server's, `/metrics` is not open: it is served after authentication and a
//! SubjectAccessReview for the non-resource `get /metrics` (`app.rs`), unless the operator
//! lists it in `--authorization-always-allow-paths` (authentication is still needed then).
//!
//! # Connections
//!
//! For each port, the connections open now (TLS handshakes in progress included) and those
//! the server ended itself, by reason: refused by `--max-connections-per-ip`, a failed or
//! timed-out TLS handshake, no first request in time, idle. Read from the ports'
//! [`ConnectionStats`] at each scrape; every reason is present from the start at 0. A
//! growing `per_ip_limit` count means one address (a proxy, a NAT, a misbehaving client)
//! holds as many connections as the flag allows; `tls_failed` after a certificate rotation
//! means clients that do not trust the new serving certificate.
//!
//! Liveness (`/livez`, `metric-collection-timely`) is in [`crate::health::Heartbeat`].

use std::{fmt, sync::Arc, time::Duration};

use prometheus_client::{
    collector::Collector,
    encoding::{prometheus_text, DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        counter::Counter,
        family::{Family, MetricConstructor},
        gauge::{ConstGauge, Gauge},
        histogram::Histogram,
    },
    registry::{Registry, Unit},
};

use crate::{
    api::request::RequestInfo,
    serve::{Closed, ConnectionStats},
    store::{Clock, Store},
};

/// Why a stream was refused before it started: the fixed label set of
/// `kpulse_aggregator_ingest_rejected_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// Another path or method.
    BadRequest,
    /// [`VERSION_HEADER`](kpulse_wire::stream::VERSION_HEADER) or the Hello's version missing, unreadable or of another major.
    BadVersion,
    /// The first message is not a readable Hello, or names no valid node.
    BadHello,
    /// No Hello within [`HELLO_TIMEOUT`](crate::ingest::HELLO_TIMEOUT).
    HelloTimeout,
    /// Neither a bearer token nor a client certificate.
    NoCredentials,
    /// A token or certificate that does not authenticate.
    InvalidCredentials,
    /// Authenticated, but not as an agent (`--agent-service-accounts`).
    ForbiddenIdentity,
    /// An agent's identity bound to another node than the Hello's, or to none.
    WrongNode,
    /// The Kubernetes API could not review the token.
    AuthUnavailable,
    /// Too many token reviews under way here: turned away at once, before any was sent
    /// ([`TokenConfig::queue_wait`](crate::auth::delegated::TokenConfig::queue_wait)).
    AuthBusy,
    /// `--max-agent-streams` reached.
    TooManyStreams,
    /// The server is shutting down.
    ShuttingDown,
}

impl RejectReason {
    /// Every reason.
    pub const ALL: [RejectReason; 12] = [
        RejectReason::BadRequest,
        RejectReason::BadVersion,
        RejectReason::BadHello,
        RejectReason::HelloTimeout,
        RejectReason::NoCredentials,
        RejectReason::InvalidCredentials,
        RejectReason::ForbiddenIdentity,
        RejectReason::WrongNode,
        RejectReason::AuthUnavailable,
        RejectReason::AuthBusy,
        RejectReason::TooManyStreams,
        RejectReason::ShuttingDown,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::BadRequest => "bad_request",
            RejectReason::BadVersion => "bad_version",
            RejectReason::BadHello => "bad_hello",
            RejectReason::HelloTimeout => "hello_timeout",
            RejectReason::NoCredentials => "no_credentials",
            RejectReason::InvalidCredentials => "invalid_credentials",
            RejectReason::ForbiddenIdentity => "forbidden_identity",
            RejectReason::WrongNode => "wrong_node",
            RejectReason::AuthUnavailable => "auth_unavailable",
            RejectReason::AuthBusy => "auth_busy",
            RejectReason::TooManyStreams => "too_many_streams",
            RejectReason::ShuttingDown => "shutting_down",
        }
    }
}

/// The `Content-Type` of what [`SelfMetrics::encode`] writes (Prometheus text, 0.0.4).
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Upper bounds (seconds) of `kpulse_aggregator_request_duration_seconds`: an in-memory API
/// answers in well under a millisecond; a TokenReview or SubjectAccessReview round trip
/// takes milliseconds to seconds.
pub const REQUEST_DURATION_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds (seconds) of `kpulse_aggregator_metric_freshness_seconds`: agents push every
/// second by default and data older than `--metric-expiry` (10 s by default) is never served.
pub const FRESHNESS_BUCKETS: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0];

/// The group this server serves; any other is `other`.
const GROUP: &str = "metrics.k8s.io";
/// The value of a label outside its fixed set.
const OTHER: &str = "other";
/// Verbs kept as they are (resource verbs, then lowercased HTTP methods).
const VERBS: [&str; 15] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "proxy",
    "head",
    "post",
    "put",
    "options",
    "connect",
    "trace",
];
/// Paths of the discovery documents this server writes.
const DISCOVERY_PATHS: [&str; 4] = [
    "/apis",
    "/apis/metrics.k8s.io",
    "/apis/metrics.k8s.io/v1",
    "/apis/metrics.k8s.io/v1beta1",
];

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The text encoder failed (it writes to a `String`: only a metric's own encoding can).
    #[error("cannot encode the metrics")]
    Encode(#[source] fmt::Error),
}

/// What a request was, in labels whose values come from fixed sets (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RequestKind {
    /// The verb, or `other`.
    pub verb: &'static str,
    /// `metrics.k8s.io`, `other`, or empty for non-resource requests.
    pub group: &'static str,
    /// `v1`, `v1beta1`, `other`, or empty for non-resource requests.
    pub version: &'static str,
    /// `nodes`, `pods`, `other`, or empty for non-resource requests.
    pub resource: &'static str,
    /// `api`, `discovery`, `openapi`, `metrics`, `health` or `other`.
    pub endpoint: &'static str,
}

impl RequestKind {
    /// A request known only by its method and (raw) path: before, or without,
    /// [`preflight`](crate::api::request::preflight).
    pub fn new(method: &http::Method, path: &str) -> RequestKind {
        RequestKind {
            verb: bounded_verb(method.as_str()),
            group: "",
            version: "",
            resource: "",
            endpoint: endpoint_of(path),
        }
    }

    /// Refines the kind with what preflight found: the Kubernetes verb and, for resource
    /// requests, the group, version and resource.
    pub fn refine(&mut self, info: &RequestInfo) {
        self.verb = bounded_verb(&info.verb);
        if !info.is_resource_request {
            return;
        }
        self.endpoint = "api";
        if info.api_group != GROUP {
            (self.group, self.version, self.resource) = (OTHER, OTHER, OTHER);
            return;
        }
        self.group = GROUP;
        self.version = match info.api_version.as_str() {
            "v1" => "v1",
            "v1beta1" => "v1beta1",
            _ => OTHER,
        };
        self.resource = match info.resource.as_str() {
            "nodes" => "nodes",
            "pods" => "pods",
            _ => OTHER,
        };
    }
}

/// A verb from [`VERBS`] (matched without regard to case), else `other`.
fn bounded_verb(verb: &str) -> &'static str {
    VERBS
        .iter()
        .find(|v| v.eq_ignore_ascii_case(verb))
        .copied()
        .unwrap_or(OTHER)
}

/// The `endpoint` label of a raw request path.
fn endpoint_of(path: &str) -> &'static str {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    if path == "/metrics" {
        "metrics"
    } else if under("/healthz") || under("/livez") || under("/readyz") {
        "health"
    } else if DISCOVERY_PATHS.contains(&path.strip_suffix('/').unwrap_or(path)) {
        "discovery"
    } else if under("/openapi/v2") || under("/openapi/v3") {
        "openapi"
    } else if under("/apis/metrics.k8s.io") {
        "api"
    } else {
        OTHER
    }
}

/// The label set of `kpulse_aggregator_requests_total`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    #[prometheus(flatten)]
    kind: RequestKind,
    code: u16,
}

/// Builds request-duration histograms.
#[derive(Clone, Copy, Debug)]
struct DurationHistogram;

impl MetricConstructor<Histogram> for DurationHistogram {
    fn new_metric(&self) -> Histogram {
        Histogram::new(REQUEST_DURATION_BUCKETS)
    }
}

/// The registry and the metrics the server updates. Share it (`Arc`).
pub struct SelfMetrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: Family<RequestKind, Histogram, DurationHistogram>,
    freshness: Histogram,
}

impl fmt::Debug for SelfMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SelfMetrics").finish_non_exhaustive()
    }
}

impl Default for SelfMetrics {
    fn default() -> Self {
        SelfMetrics::new()
    }
}

impl SelfMetrics {
    /// The request and freshness metrics, without store gauges.
    pub fn new() -> SelfMetrics {
        let requests = Family::<RequestLabels, Counter>::default();
        let durations = Family::new_with_constructor(DurationHistogram);
        let freshness = Histogram::new(FRESHNESS_BUCKETS);
        let mut registry = Registry::default();
        registry.register(
            "kpulse_aggregator_requests",
            "Requests by verb, API group, version, resource, endpoint and HTTP status code",
            requests.clone(),
        );
        registry.register_with_unit(
            "kpulse_aggregator_request_duration",
            "Time from a request's arrival to its response, by verb, API group, version, \
             resource and endpoint",
            Unit::Seconds,
            durations.clone(),
        );
        registry.register_with_unit(
            "kpulse_aggregator_metric_freshness",
            "Age of the NodeMetrics and PodMetrics objects served (now minus their timestamp)",
            Unit::Seconds,
            freshness.clone(),
        );
        SelfMetrics {
            registry,
            requests,
            durations,
            freshness,
        }
    }

    /// [`SelfMetrics::new`] plus the store's gauges, read at every scrape, and the freshness
    /// of what the API serves from `store` (this installs the store's served-points observer,
    /// which only one `SelfMetrics` per store can be).
    pub fn with_store<C: Clock + 'static>(store: &Arc<Store<C>>) -> SelfMetrics {
        let mut m = SelfMetrics::new();
        m.registry.register_collector(Box::new(StoreCollector {
            store: Arc::clone(store),
        }));
        let freshness = m.freshness.clone();
        if !store.observe_served(move |age| freshness.observe(age.as_secs_f64())) {
            tracing::warn!(
                "the store already reports served points elsewhere: \
                 kpulse_aggregator_metric_freshness_seconds stays empty"
            );
        }
        m
    }

    /// Adds the watch gauges, read from `hub` at every scrape: watches open, and watches
    /// ended because their client stopped reading.
    pub fn with_watches(mut self, hub: Arc<crate::api::watch::Hub>) -> SelfMetrics {
        self.registry
            .register_collector(Box::new(WatchCollector { hub }));
        self
    }

    /// Adds the connection counts of each `(port label, stats)`, read at every scrape.
    pub fn with_connections(
        mut self,
        ports: Vec<(&'static str, Arc<ConnectionStats>)>,
    ) -> SelfMetrics {
        self.registry
            .register_collector(Box::new(ConnectionCollector { ports }));
        self
    }

    /// Adds the kubelet fallback's metrics, read from `stats` at every scrape (nothing
    /// without a fallback).
    pub fn with_fallback(mut self, stats: Option<Arc<crate::kubelet::Stats>>) -> SelfMetrics {
        if let Some(stats) = stats {
            self.registry
                .register_collector(Box::new(FallbackCollector { stats }));
        }
        self
    }

    /// Adds the agent-stream metrics `ingest` updates.
    pub fn with_ingest(mut self, ingest: &IngestMetrics) -> SelfMetrics {
        ingest.register(&mut self.registry);
        self
    }

    /// Counts one answered request and observes its latency.
    pub fn record(&self, kind: &RequestKind, code: http::StatusCode, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                kind: *kind,
                code: code.as_u16(),
            })
            .inc();
        self.durations
            .get_or_create(kind)
            .observe(elapsed.as_secs_f64());
    }

    /// Observes the age of one served object (also fed by the store, see
    /// [`SelfMetrics::with_store`]).
    pub fn observe_freshness(&self, age: Duration) {
        self.freshness.observe(age.as_secs_f64());
    }

    /// Every metric in the Prometheus text format; see [`CONTENT_TYPE`].
    pub fn encode(&self) -> Result<String, Error> {
        let mut out = String::new();
        prometheus_text::encode(&mut out, &self.registry).map_err(Error::Encode)?;
        Ok(out)
    }
}

/// The label of `kpulse_aggregator_ingest_rejected_total`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// The label of `kpulse_aggregator_ingest_local_token_checks_total`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// The label of `kpulse_aggregator_ingest_messages_total`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TypeLabel {
    r#type: &'static str,
}

/// The agent-stream metrics (see the module docs). Cheap to clone: clones share the
/// counters.
#[derive(Clone, Debug)]
pub struct IngestMetrics {
    streams: Gauge,
    messages: Family<TypeLabel, Counter>,
    bytes: Counter,
    rejected: Family<ReasonLabel, Counter>,
    local_tokens: Family<OutcomeLabel, Counter>,
    unknown_uids: Counter,
    replaced: Counter,
    visible: Histogram,
    received_visible: Histogram,
}

/// The outcome of a local token check that needed no review.
pub const ACCEPTED: &str = "accepted";

/// Buckets of `kpulse_aggregator_ingest_to_visible_seconds`: fine below 100 ms, the target.
const VISIBLE_BUCKETS: [f64; 20] = [
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.5, 1.0, 2.0, 5.0,
];

impl Default for IngestMetrics {
    fn default() -> Self {
        IngestMetrics {
            streams: Gauge::default(),
            messages: Family::default(),
            bytes: Counter::default(),
            rejected: Family::default(),
            local_tokens: Family::default(),
            unknown_uids: Counter::default(),
            replaced: Counter::default(),
            visible: Histogram::new(VISIBLE_BUCKETS),
            received_visible: Histogram::new(VISIBLE_BUCKETS),
        }
    }
}

impl IngestMetrics {
    /// Zeroed counters; every rejection reason and message type is present at 0.
    pub fn new() -> IngestMetrics {
        let m = IngestMetrics::default();
        for reason in RejectReason::ALL {
            // Present at 0 from the start.
            let _ = m.rejected.get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            });
        }
        for t in ["hello", "snapshot", "update"] {
            let _ = m.messages.get_or_create(&TypeLabel { r#type: t });
        }
        for outcome in
            std::iter::once(ACCEPTED).chain(crate::auth::issuer::Deferral::ALL.map(|d| d.as_str()))
        {
            let _ = m.local_tokens.get_or_create(&OutcomeLabel { outcome });
        }
        m
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "kpulse_aggregator_ingest_streams",
            "Agent streams open",
            self.streams.clone(),
        );
        registry.register(
            "kpulse_aggregator_ingest_messages",
            "Messages received on agent streams, by type",
            self.messages.clone(),
        );
        registry.register_with_unit(
            "kpulse_aggregator_ingest_received",
            "Bytes of agent stream bodies received",
            Unit::Bytes,
            self.bytes.clone(),
        );
        registry.register(
            "kpulse_aggregator_ingest_rejected",
            "Agent streams refused before they started, by reason",
            self.rejected.clone(),
        );
        registry.register(
            "kpulse_aggregator_ingest_local_token_checks",
            "Agents' tokens checked against the service account issuer's keys and the agent \
             pods, by outcome; all but accepted went on to a TokenReview",
            self.local_tokens.clone(),
        );
        registry.register(
            "kpulse_aggregator_ingest_unknown_uid_counters_dropped",
            "Pod counters dropped because their pod uid was not announced on the stream",
            self.unknown_uids.clone(),
        );
        registry.register_with_unit(
            "kpulse_aggregator_ingest_to_visible",
            "Time from an agent sending a snapshot or update (its sent_at, the agent's clock) \
             to the store serving it",
            Unit::Seconds,
            self.visible.clone(),
        );
        registry.register_with_unit(
            "kpulse_aggregator_ingest_received_to_visible",
            "Time from the server receiving the last bytes of a snapshot or update to the store \
             serving it (decoding, joining, storing; the server's clock only)",
            Unit::Seconds,
            self.received_visible.clone(),
        );
        registry.register(
            "kpulse_aggregator_ingest_sessions_replaced",
            "Agent sessions ended because a newer stream for the same node replaced them",
            self.replaced.clone(),
        );
    }

    /// A stream was accepted; it counts as open until the guard is dropped.
    pub fn stream_opened(&self) -> OpenStream {
        self.streams.inc();
        OpenStream(self.streams.clone())
    }

    /// Streams open now.
    pub fn streams_open(&self) -> i64 {
        self.streams.get()
    }

    /// One message received over the network.
    pub fn message(&self, message: &kpulse_wire::stream::AgentMessage) {
        use kpulse_wire::stream::AgentMessage;
        let t = match message {
            AgentMessage::Hello(_) => "hello",
            AgentMessage::Snapshot(_) => "snapshot",
            AgentMessage::Update(_) => "update",
        };
        self.messages.get_or_create(&TypeLabel { r#type: t }).inc();
    }

    /// A message sent at `sent_at` became visible now (a clock ahead of ours counts 0).
    pub fn visible(&self, sent_at: kpulse_wire::UnixNanos) {
        let now = kpulse_wire::UnixNanos::from_system_time(std::time::SystemTime::now());
        let nanos = now.0.saturating_sub(sent_at.0);
        self.visible.observe(nanos as f64 / 1e9);
    }

    /// A message whose last bytes arrived `elapsed` ago is now served.
    pub fn received_to_visible(&self, elapsed: std::time::Duration) {
        self.received_visible.observe(elapsed.as_secs_f64());
    }

    /// Body bytes received.
    pub fn received_bytes(&self, n: usize) {
        self.bytes.inc_by(u64::try_from(n).unwrap_or(u64::MAX));
    }

    /// A stream refused before it started.
    pub fn rejected(&self, reason: RejectReason) {
        self.rejected
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Refusals so far for `reason`.
    pub fn rejected_count(&self, reason: RejectReason) -> u64 {
        self.rejected
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .get()
    }

    /// An agent's token checked locally: accepted (`None`) or left to a review.
    pub fn local_token_check(&self, deferral: Option<crate::auth::issuer::Deferral>) {
        let outcome = deferral.map_or(ACCEPTED, |d| d.as_str());
        self.local_tokens
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// Local token checks so far with `outcome` (`accepted` or a deferral's label).
    pub fn local_token_checks(&self, outcome: &'static str) -> u64 {
        self.local_tokens
            .get_or_create(&OutcomeLabel { outcome })
            .get()
    }

    /// Pod counters dropped for an unknown uid.
    pub fn unknown_uids(&self, n: usize) {
        if n > 0 {
            self.unknown_uids
                .inc_by(u64::try_from(n).unwrap_or(u64::MAX));
        }
    }

    /// Pod counters dropped so far for an unknown uid.
    pub fn unknown_uid_count(&self) -> u64 {
        self.unknown_uids.get()
    }

    /// A session replaced by a newer stream for its node.
    pub fn replaced(&self) {
        self.replaced.inc();
    }

    /// Sessions replaced so far.
    pub fn replaced_count(&self) -> u64 {
        self.replaced.get()
    }
}

/// One open stream in `kpulse_aggregator_ingest_streams`, until dropped.
#[derive(Debug)]
pub struct OpenStream(Gauge);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The watch hub's numbers at each scrape.
#[derive(Debug)]
struct WatchCollector {
    hub: Arc<crate::api::watch::Hub>,
}

impl Collector for WatchCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        gauge(
            &mut encoder,
            "kpulse_aggregator_watches",
            "Watches open",
            None,
            self.hub.active() as i64,
        )?;
        let dropped =
            prometheus_client::metrics::counter::ConstCounter::new(self.hub.dropped_slow());
        let metric = encoder.encode_descriptor(
            "kpulse_aggregator_watches_dropped_slow",
            "Watches ended because their client stopped reading",
            None,
            dropped.metric_type(),
        )?;
        dropped.encode(metric)
    }
}

/// The labels of `kpulse_aggregator_node_source`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SourceLabels {
    node: String,
    source: &'static str,
}

/// The label of `kpulse_aggregator_kubelet_scrapes_total`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// The kubelet fallback's numbers at each scrape.
#[derive(Debug)]
struct FallbackCollector {
    stats: Arc<crate::kubelet::Stats>,
}

impl Collector for FallbackCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let sources = self.stats.sources();
        let mut family = encoder.encode_descriptor(
            "kpulse_aggregator_node_source",
            "1 for each node, labelled with where its data is served from: its agent, or its \
             kubelet (the fallback)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (node, source) in &sources {
            let labels = SourceLabels {
                node: node.clone(),
                source: source.label(),
            };
            ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
        }
        gauge(
            &mut encoder,
            "kpulse_aggregator_kubelet_nodes",
            "Nodes served from their kubelets",
            None,
            sources
                .iter()
                .filter(|(_, s)| *s == crate::kubelet::Source::Kubelet)
                .count() as i64,
        )?;
        let mut scrapes = encoder.encode_descriptor(
            "kpulse_aggregator_kubelet_scrapes",
            "Scrapes of kubelets' /metrics/resource, by result",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (result, n) in self.stats.scrapes() {
            prometheus_client::metrics::counter::ConstCounter::new(n)
                .encode(scrapes.encode_family(&ResultLabel { result })?)?;
        }
        let seconds =
            prometheus_client::metrics::counter::ConstCounter::new(self.stats.scrape_seconds());
        let metric = encoder.encode_descriptor(
            "kpulse_aggregator_kubelet_scrape_seconds",
            "Time spent scraping kubelets",
            None,
            seconds.metric_type(),
        )?;
        seconds.encode(metric)?;
        let mut skipped = encoder.encode_descriptor(
            "kpulse_aggregator_kubelet_pods_skipped",
            "Pods a kubelet reported that were not served, by reason",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (reason, n) in self.stats.pods_skipped() {
            prometheus_client::metrics::counter::ConstCounter::new(n)
                .encode(skipped.encode_family(&ReasonLabel { reason })?)?;
        }
        Ok(())
    }
}

/// The label of `kpulse_aggregator_connections`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PortLabel {
    port: &'static str,
}

/// The labels of `kpulse_aggregator_connections_closed_total`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ClosedLabels {
    port: &'static str,
    reason: &'static str,
}

/// The ports' [`ConnectionStats`] at each scrape.
#[derive(Debug)]
struct ConnectionCollector {
    ports: Vec<(&'static str, Arc<ConnectionStats>)>,
}

impl Collector for ConnectionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let mut open = encoder.encode_descriptor(
            "kpulse_aggregator_connections",
            "Connections open, TLS handshakes in progress included, by port",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (port, stats) in &self.ports {
            let labels = PortLabel { port };
            let value = i64::try_from(stats.open()).unwrap_or(i64::MAX);
            ConstGauge::new(value).encode(open.encode_family(&labels)?)?;
        }
        let mut closed = encoder.encode_descriptor(
            "kpulse_aggregator_connections_closed",
            "Connections the server ended itself, by port and reason (per-IP limit, TLS \
             handshake failed or timed out, no first request in time, idle)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (port, stats) in &self.ports {
            for why in Closed::ALL {
                let labels = ClosedLabels {
                    port,
                    reason: why.as_str(),
                };
                prometheus_client::metrics::counter::ConstCounter::new(stats.closed(why))
                    .encode(closed.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The store's gauges, computed from [`Store::stats`] at each scrape.
struct StoreCollector<C> {
    store: Arc<Store<C>>,
}

impl<C> fmt::Debug for StoreCollector<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreCollector").finish_non_exhaustive()
    }
}

/// Writes one unlabelled gauge.
fn gauge<N: prometheus_client::encoding::EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: N,
) -> Result<(), fmt::Error> {
    let g = ConstGauge::new(value);
    let metric = encoder.encode_descriptor(name, help, unit, g.metric_type())?;
    g.encode(metric)
}

impl<C: Clock + 'static> Collector for StoreCollector<C> {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let s = self.store.stats();
        for (name, help, value) in [
            (
                "kpulse_aggregator_store_nodes",
                "Nodes in the store (an expired node counts until housekeeping drops it)",
                s.nodes,
            ),
            (
                "kpulse_aggregator_store_pods",
                "Pods in the store, summed over nodes",
                s.pods,
            ),
            (
                "kpulse_aggregator_store_containers",
                "Containers in the store, summed over pods",
                s.containers,
            ),
        ] {
            gauge(&mut encoder, name, help, None, value)?;
        }
        // Without nodes there is no data age: absent rather than a misleading 0.
        for (name, help, age) in [
            (
                "kpulse_aggregator_store_newest_batch_age",
                "Time since the store received its newest node batch",
                s.newest_age(),
            ),
            (
                "kpulse_aggregator_store_oldest_batch_age",
                "Time since the store received the oldest of the nodes' latest batches",
                s.oldest_age(),
            ),
        ] {
            if let Some(age) = age {
                gauge(
                    &mut encoder,
                    name,
                    help,
                    Some(&Unit::Seconds),
                    age.as_secs_f64(),
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use http::{Method, StatusCode};
    use kpulse_wire::{
        Bytes, ContainerSample, CpuNanos, NodeBatch, NodeSample, PodSample, UnixNanos,
    };

    use super::*;
    use crate::{
        api::request::{preflight, RequestParts},
        store::{ManualClock, StoreConfig},
    };

    const S: u64 = 1_000_000_000;
    const T0: u64 = 1_700_000_000 * S;

    /// The kind app.rs records for `method target`.
    fn kind(method: &str, target: &str) -> RequestKind {
        let req = http::Request::builder()
            .method(method)
            .uri(target)
            .body(())
            .expect("request");
        let mut k = RequestKind::new(req.method(), req.uri().path());
        if let Ok(p) = preflight(&RequestParts::from_http(&req)) {
            k.refine(&p.info);
        }
        k
    }

    fn labels(k: &RequestKind) -> [&'static str; 5] {
        [k.verb, k.group, k.version, k.resource, k.endpoint]
    }

    #[test]
    fn labels_come_from_fixed_sets() {
        let cases = [
            (
                "GET",
                "/apis/metrics.k8s.io/v1beta1/nodes",
                ["list", GROUP, "v1beta1", "nodes", "api"],
            ),
            (
                "GET",
                "/apis/metrics.k8s.io/v1/namespaces/x/pods/y",
                ["get", GROUP, "v1", "pods", "api"],
            ),
            (
                "GET",
                "/apis/metrics.k8s.io/v1beta1/pods?watch=1",
                ["watch", GROUP, "v1beta1", "pods", "api"],
            ),
            (
                "DELETE",
                "/apis/metrics.k8s.io/v1beta1/nodes/n1",
                ["delete", GROUP, "v1beta1", "nodes", "api"],
            ),
            // Whatever a client invents stays in the fixed sets.
            (
                "GET",
                "/apis/metrics.k8s.io/v9/secrets-of-mine",
                ["list", GROUP, "other", "other", "api"],
            ),
            (
                "GET",
                "/apis/evil.example/v1/things",
                ["list", "other", "other", "other", "api"],
            ),
            (
                "GET",
                "/api/v1/pods",
                ["list", "other", "other", "other", "api"],
            ),
            (
                "BREW",
                "/apis/metrics.k8s.io/v1beta1/nodes",
                ["other", GROUP, "v1beta1", "nodes", "api"],
            ),
            ("BREW", "/random/user/path", ["other", "", "", "", "other"]),
            ("GET", "/random/user/path", ["get", "", "", "", "other"]),
            ("GET", "/metricsfoo", ["get", "", "", "", "other"]),
            ("GET", "/metrics", ["get", "", "", "", "metrics"]),
            ("HEAD", "/metrics", ["head", "", "", "", "metrics"]),
            ("GET", "/apis", ["get", "", "", "", "discovery"]),
            (
                "GET",
                "/apis/metrics.k8s.io/",
                ["get", "", "", "", "discovery"],
            ),
            (
                "GET",
                "/apis/metrics.k8s.io/v1beta1",
                ["get", "", "", "", "discovery"],
            ),
            ("GET", "/openapi/v2", ["get", "", "", "", "openapi"]),
            (
                "GET",
                "/openapi/v3/apis/metrics.k8s.io/v1beta1?hash=x",
                ["get", "", "", "", "openapi"],
            ),
            (
                "GET",
                "/livez/anything-at-all",
                ["get", "", "", "", "health"],
            ),
            ("GET", "/readyz?verbose", ["get", "", "", "", "health"]),
            ("GET", "/healthzz", ["get", "", "", "", "other"]),
        ];
        for (method, target, want) in cases {
            assert_eq!(labels(&kind(method, target)), want, "{method} {target}");
        }
        // A preflight failure keeps what the method and path say.
        assert_eq!(
            labels(&kind(
                "GET",
                "/apis/metrics.k8s.io/v1beta1/nodes?timeout=bogus"
            )),
            ["get", "", "", "", "api"]
        );
    }

    #[test]
    fn no_request_adds_series_beyond_the_fixed_sets() {
        let m = SelfMetrics::new();
        for i in 0..500 {
            let target = format!("/apis/g{i}.example/v{i}/r{i}?watch={}", i % 2);
            m.record(
                &kind("GET", &target),
                StatusCode::UNAUTHORIZED,
                Duration::ZERO,
            );
            let target = format!("/p{i}/x");
            m.record(
                &kind(&format!("M{i}"), &target),
                StatusCode::NOT_FOUND,
                Duration::ZERO,
            );
        }
        let text = m.encode().expect("encode");
        let series = text
            .lines()
            .filter(|l| l.starts_with("kpulse_aggregator_requests_total{"))
            .count();
        assert_eq!(series, 3, "{text}");
        assert!(!text.contains("example") && !text.contains("/p1"), "{text}");
    }

    /// `name{labels}` → value, for every sample line; panics on a malformed line.
    fn samples(text: &str) -> std::collections::BTreeMap<String, f64> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let (series, value) = l.rsplit_once(' ').expect("`series value`");
                let value = match value {
                    "+Inf" => f64::INFINITY,
                    v => v.parse().expect("a number"),
                };
                (series.to_string(), value)
            })
            .collect()
    }

    fn batch(node: &str, t: u64) -> NodeBatch {
        NodeBatch {
            node_name: node.into(),
            sent_at: UnixNanos(t),
            node: NodeSample {
                timestamp: UnixNanos(t),
                started_at: None,
                cpu: CpuNanos(t - T0),
                memory_working_set: Bytes(1 << 30),
                swap: None,
            },
            pods: vec![PodSample {
                uid: "u1".into(),
                namespace: "ns".into(),
                name: "web".into(),
                containers: ["app", "sidecar"]
                    .into_iter()
                    .map(|name| ContainerSample {
                        name: name.into(),
                        timestamp: UnixNanos(t),
                        cgroup_id: None,
                        started_at: None,
                        cpu: CpuNanos(t - T0),
                        memory_working_set: Bytes(1 << 20),
                        swap: None,
                        signals: None,
                    })
                    .collect(),
                signals: None,
                ready_since: None,
            }],
        }
    }

    #[test]
    fn text_output_has_every_metric() {
        let clock = Arc::new(ManualClock::new(UnixNanos(T0)));
        let store = Arc::new(
            Store::with_clock(
                StoreConfig::new(Duration::from_secs(10)),
                Arc::clone(&clock),
            )
            .expect("store"),
        );
        let m = SelfMetrics::with_store(&store);
        let text = m.encode().expect("encode");
        assert!(text.contains("kpulse_aggregator_store_nodes 0\n"), "{text}");
        assert!(
            !text.contains("batch_age"),
            "no data age without data: {text}"
        );

        store.ingest(batch("n1", T0)).expect("ingest");
        clock.set(UnixNanos(T0 + 2 * S));
        store.ingest(batch("n2", T0 + 2 * S)).expect("ingest");
        clock.set(UnixNanos(T0 + 3 * S));
        m.record(
            &kind("GET", "/apis/metrics.k8s.io/v1beta1/nodes"),
            StatusCode::OK,
            Duration::from_micros(300),
        );
        m.record(
            &kind("GET", "/apis/metrics.k8s.io/v1beta1/nodes"),
            StatusCode::UNAUTHORIZED,
            Duration::from_millis(30),
        );
        store.record_served([UnixNanos(T0 + 2 * S)]);
        m.observe_freshness(Duration::from_millis(200));

        let text = m.encode().expect("encode");
        for header in [
            "# TYPE kpulse_aggregator_requests_total counter\n",
            "# TYPE kpulse_aggregator_request_duration_seconds histogram\n",
            "# TYPE kpulse_aggregator_metric_freshness_seconds histogram\n",
            "# TYPE kpulse_aggregator_store_nodes gauge\n",
            "# TYPE kpulse_aggregator_store_oldest_batch_age_seconds gauge\n",
        ] {
            assert!(text.contains(header), "{header} missing from {text}");
        }
        let s = samples(&text);
        let nodes = r#"verb="list",group="metrics.k8s.io",version="v1beta1",resource="nodes",endpoint="api""#;
        let expect = [
            (
                format!("kpulse_aggregator_requests_total{{{nodes},code=\"200\"}}"),
                1.0,
            ),
            (
                format!("kpulse_aggregator_requests_total{{{nodes},code=\"401\"}}"),
                1.0,
            ),
            (
                format!(
                    "kpulse_aggregator_request_duration_seconds_bucket{{{nodes},le=\"0.0005\"}}"
                ),
                1.0,
            ),
            (
                format!("kpulse_aggregator_request_duration_seconds_bucket{{{nodes},le=\"0.05\"}}"),
                2.0,
            ),
            (
                format!("kpulse_aggregator_request_duration_seconds_bucket{{{nodes},le=\"+Inf\"}}"),
                2.0,
            ),
            (
                format!("kpulse_aggregator_request_duration_seconds_count{{{nodes}}}"),
                2.0,
            ),
            (
                "kpulse_aggregator_metric_freshness_seconds_bucket{le=\"0.25\"}".into(),
                1.0,
            ),
            (
                "kpulse_aggregator_metric_freshness_seconds_bucket{le=\"1\"}".into(),
                2.0,
            ),
            (
                "kpulse_aggregator_metric_freshness_seconds_count".into(),
                2.0,
            ),
            ("kpulse_aggregator_metric_freshness_seconds_sum".into(), 1.2),
            ("kpulse_aggregator_store_nodes".into(), 2.0),
            ("kpulse_aggregator_store_pods".into(), 2.0),
            ("kpulse_aggregator_store_containers".into(), 4.0),
            (
                "kpulse_aggregator_store_newest_batch_age_seconds".into(),
                1.0,
            ),
            (
                "kpulse_aggregator_store_oldest_batch_age_seconds".into(),
                3.0,
            ),
        ];
        for (series, value) in expect {
            assert_eq!(s.get(&series), Some(&value), "{series} in {text}");
        }
    }

    #[test]
    fn a_second_observer_is_refused_without_breaking_anything() {
        let store = Arc::new(Store::new(StoreConfig::new(Duration::from_secs(10))).expect("store"));
        let _first = SelfMetrics::with_store(&store);
        let second = SelfMetrics::with_store(&store);
        second.encode().expect("still encodes");
    }

    #[test]
    fn request_methods_are_matched_without_case() {
        assert_eq!(RequestKind::new(&Method::GET, "/x").verb, "get");
        assert_eq!(bounded_verb("DeleteCollection"), "deletecollection");
        assert_eq!(bounded_verb(""), OTHER);
    }

    #[test]
    fn watch_numbers_are_read_at_scrape() {
        let hub = crate::api::watch::Hub::new(crate::api::watch::Settings::default());
        let text = SelfMetrics::new()
            .with_watches(hub)
            .encode()
            .expect("encode");
        assert!(text.contains("\nkpulse_aggregator_watches 0\n"), "{text}");
        assert!(
            text.contains("\nkpulse_aggregator_watches_dropped_slow_total 0\n"),
            "{text}"
        );
    }

    #[test]
    fn connection_numbers_are_read_at_scrape_per_port() {
        let api = ConnectionStats::new();
        let agents = ConnectionStats::new();
        let m = SelfMetrics::new()
            .with_connections(vec![("api", api.clone()), ("agents", agents.clone())]);
        let text = m.encode().expect("encode");
        for port in ["api", "agents"] {
            assert!(
                text.contains(&format!(
                    "\nkpulse_aggregator_connections{{port=\"{port}\"}} 0\n"
                )),
                "{text}"
            );
            for why in Closed::ALL {
                let line = format!(
                    "\nkpulse_aggregator_connections_closed_total{{port=\"{port}\",reason=\"{}\"}} 0\n",
                    why.as_str()
                );
                assert!(text.contains(&line), "{line} missing from\n{text}");
            }
        }
        // One descriptor per metric, whatever the number of ports.
        assert_eq!(
            text.matches("# TYPE kpulse_aggregator_connections_closed_total counter")
                .count(),
            1,
            "{text}"
        );
        api.count(Closed::PerIpLimit);
        api.count(Closed::PerIpLimit);
        agents.count(Closed::TlsFailed);
        let text = m.encode().expect("encode");
        assert!(text.contains(
            "\nkpulse_aggregator_connections_closed_total{port=\"api\",reason=\"per_ip_limit\"} 2\n"
        ));
        assert!(text.contains(
            "\nkpulse_aggregator_connections_closed_total{port=\"agents\",reason=\"tls_failed\"} 1\n"
        ));
        assert!(text.contains(
            "\nkpulse_aggregator_connections_closed_total{port=\"agents\",reason=\"per_ip_limit\"} 0\n"
        ));
    }

    #[test]
    fn ingest_numbers_are_served() {
        let ingest = IngestMetrics::new();
        let m = SelfMetrics::new().with_ingest(&ingest);
        let text = m.encode().expect("encode");
        for reason in RejectReason::ALL {
            let series = format!(
                "kpulse_aggregator_ingest_rejected_total{{reason=\"{}\"}} 0\n",
                reason.as_str()
            );
            assert!(text.contains(&series), "{series} missing from {text}");
        }
        ingest.rejected(RejectReason::WrongNode);
        let open = ingest.stream_opened();
        let _other = ingest.stream_opened();
        drop(open);
        ingest.received_bytes(1000);
        ingest.unknown_uids(0);
        ingest.unknown_uids(3);
        ingest.replaced();
        ingest.message(&kpulse_wire::stream::AgentMessage::Hello(
            kpulse_wire::stream::Hello {
                version: kpulse_wire::stream::VERSION,
                node_name: "n".into(),
                node_labels: Default::default(),
                agent: String::new(),
            },
        ));
        let s = samples(&m.encode().expect("encode"));
        for (series, value) in [
            ("kpulse_aggregator_ingest_streams", 1.0),
            (
                "kpulse_aggregator_ingest_rejected_total{reason=\"wrong_node\"}",
                1.0,
            ),
            ("kpulse_aggregator_ingest_received_bytes_total", 1000.0),
            (
                "kpulse_aggregator_ingest_unknown_uid_counters_dropped_total",
                3.0,
            ),
            ("kpulse_aggregator_ingest_sessions_replaced_total", 1.0),
            (
                "kpulse_aggregator_ingest_messages_total{type=\"hello\"}",
                1.0,
            ),
            (
                "kpulse_aggregator_ingest_messages_total{type=\"update\"}",
                0.0,
            ),
        ] {
            assert_eq!(s.get(series), Some(&value), "{series} in {s:?}");
        }
    }
}
