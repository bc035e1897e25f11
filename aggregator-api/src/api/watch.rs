//! Watches (`?watch=true`) on NodeMetrics and PodMetrics: a stream of `ADDED`, `MODIFIED`
//! and `DELETED` events, which metrics-server does not serve at all.
//!
//! # How a watch works
//!
//! Metrics have no history and no `resourceVersion`: every object changes on every tick of
//! every agent. A watch is therefore a *poller on the server side*: each watcher looks at
//! its selection once per [`Settings::interval`] (the store's resolution, 1 s), exactly as a
//! list of the same request would (same selectors, same sort order, same freshness rules),
//! and compares it with what it sent before:
//!
//! * an object it has not sent is `ADDED`;
//! * an object whose timestamp, window, usage or labels changed is `MODIFIED`
//!   (`creationTimestamp` is the time of the look, as in a list, and does not count);
//! * an object that is gone — its pod or node is gone, or its metrics expired — is
//!   `DELETED`, carrying the last state sent.
//!
//! The first look sends every object as `ADDED` (the apiserver's "initial events", what a
//! watch without `resourceVersion`, or with `"0"`, gets); with `sendInitialEvents=false`
//! the first look is only remembered. A `resourceVersion` cannot be resumed from (there is
//! none), so any other value is treated like `sendInitialEvents=false`: changes from now on.
//! When the client asked for bookmarks and initial events (client-go's watch-list), the
//! initial events are followed by a `BOOKMARK` annotated `k8s.io/initial-events-end: "true"`,
//! except for Table watches (no client asks for that). No other bookmarks are sent.
//!
//! # Formats (as the apiserver's `WatchServer`)
//!
//! * JSON: one `{"type":…,"object":…}` per line, `Content-Type: application/json`;
//!   a Table watch (`kubectl get -w`) sends each object as a one-row Table whose column
//!   definitions are only in the first event; `PartialObjectMetadata` is also served.
//! * Protobuf: each `WatchEvent` message (no envelope) behind a 4-byte big-endian length,
//!   its object enveloped, `Content-Type: application/vnd.kubernetes.protobuf;stream=watch`.
//!
//! # Bounds
//!
//! * At most [`Settings::max_watchers`] watches at once; more get `429 TooManyRequests`.
//! * Each watcher queues at most [`Settings::buffer`] looks' worth of events, and at most
//!   [`Settings::max_queued_bytes`] bytes; all watchers together at most
//!   [`Settings::max_total_queued_bytes`]. A watcher whose next look would pass a limit
//!   while it has not taken the previous one yet is dropped (its stream ends; clients
//!   re-watch), so a stuck client never makes the server's memory grow, whatever the size
//!   of its selection. A watcher with an empty queue always gets its look (a reading
//!   client takes it at once), so a big selection alone is not a reason to drop anyone.
//! * A watch ends after `timeoutSeconds`, or, without it, after a random time between
//!   [`Settings::min_request_timeout`] and twice that (the apiserver's rule, which spreads
//!   re-watches out); it also ends when the server shuts down ([`Hub::shutdown`]).

use std::{
    collections::HashMap,
    hash::{BuildHasher, Hasher, RandomState},
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::mpsc;

use super::{
    negotiate::{Encoding, Target},
    objects::{list_nodes, list_pods, MetricsReader},
    proto,
    proto::{node_message, pod_message},
    request::{ApiError, ApiRequest, Resource},
    table::{self, RowObject, TableOptions, TableVersion},
    types::{MetricsVersion, NodeMetrics, PodMetrics},
};
use crate::{body::Body, json::encode_json, metadata::MetadataSource, status::Status};

/// The annotation that marks the end of the initial events (client-go's watch-list).
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Watch limits.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How often a watcher looks for changes.
    pub interval: Duration,
    /// Looks' worth of events queued per watcher before it is dropped as not reading.
    pub buffer: usize,
    /// Without `timeoutSeconds`, a watch lasts between this and twice this
    /// (metrics-server's and the apiserver's `--min-request-timeout`, 1800 s).
    pub min_request_timeout: Duration,
    /// Watches open at once.
    pub max_watchers: usize,
    /// Bytes one watcher may have queued (see the module docs).
    pub max_queued_bytes: usize,
    /// Bytes all watchers together may have queued (see the module docs).
    pub max_total_queued_bytes: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            interval: Duration::from_secs(1),
            buffer: 16,
            min_request_timeout: Duration::from_secs(1800),
            max_watchers: 1024,
            max_queued_bytes: 16 << 20,
            max_total_queued_bytes: 256 << 20,
        }
    }
}

/// The open watches: limits, counts and the shutdown signal they all follow.
#[derive(Debug)]
pub struct Hub {
    settings: Settings,
    shutdown: tokio::sync::watch::Sender<bool>,
    active: AtomicUsize,
    dropped_slow: AtomicU64,
    /// Bytes queued by all watchers, not yet taken by hyper.
    queued_bytes: AtomicUsize,
}

impl Hub {
    /// A hub with `settings`.
    pub fn new(settings: Settings) -> Arc<Hub> {
        let (shutdown, _) = tokio::sync::watch::channel(false);
        Arc::new(Hub {
            settings,
            shutdown,
            active: AtomicUsize::new(0),
            dropped_slow: AtomicU64::new(0),
            queued_bytes: AtomicUsize::new(0),
        })
    }

    /// Ends every watch, and refuses new ones (503), so that a draining server is not
    /// held open by streams that never end by themselves.
    pub fn shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Watches open now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Watches ended because their client stopped reading.
    pub fn dropped_slow(&self) -> u64 {
        self.dropped_slow.load(Ordering::Relaxed)
    }

    /// Bytes of events queued by all watchers, not yet taken by the connections.
    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes.load(Ordering::Relaxed)
    }

    fn acquire(self: &Arc<Hub>) -> Option<Slot> {
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.settings.max_watchers).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(self.clone()))
    }

    /// `timeoutSeconds`, or a random time in `[min, 2 × min)`.
    fn timeout(&self, timeout_seconds: Option<i64>) -> Duration {
        match timeout_seconds {
            Some(s) => Duration::from_secs(u64::try_from(s).unwrap_or(0)),
            None => {
                let min = self.settings.min_request_timeout;
                let random = RandomState::new().build_hasher().finish();
                // random / 2^64 in [0, 1), in thousandths.
                let permille = u32::try_from(random % 1000).unwrap_or(0);
                min + min * permille / 1000
            }
        }
    }
}

/// One open watch, counted until dropped.
struct Slot(Arc<Hub>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Starts the watch `api` asks for; the response streams its events.
///
/// # Errors
///
/// The apiserver's answers before a watch starts: a bad `includeObject` (400), a format no
/// watch is written in (406), too many watches (429), a server shutting down (503).
pub(super) fn start(
    hub: &Arc<Hub>,
    store: &Arc<dyn MetricsReader>,
    metadata: &Arc<dyn MetadataSource>,
    api: &ApiRequest,
) -> Result<Response<Body>, ApiError> {
    let fail = |status| ApiError {
        status,
        encoding: api.error_encoding,
    };
    let table_options = api.transform()?;
    let framing = match (api.format.target, api.format.encoding, table_options) {
        (Target::Object, Encoding::Json, _) => Framing::Json,
        (Target::Object, Encoding::Protobuf, _) => Framing::Protobuf,
        (Target::Table(_), Encoding::Json, Some(options)) => Framing::Table {
            options,
            headers_sent: false,
        },
        (Target::PartialObjectMetadata(version), Encoding::Json, _) => {
            Framing::PartialObjectMetadata(version)
        }
        _ => {
            return Err(fail(Status::not_acceptable(format!(
                "only the following media types are accepted: {}",
                super::negotiate::SERVED_MEDIA_TYPES.join(", ")
            ))))
        }
    };
    if *hub.shutdown.borrow() {
        return Err(fail(Status::service_unavailable(
            "the server is shutting down",
        )));
    }
    let tokio = tokio::runtime::Handle::try_current()
        .map_err(|e| fail(Status::internal_error(&e.to_string())))?;
    let Some(slot) = hub.acquire() else {
        return Err(fail(Status::too_many_requests(
            format!(
                "too many watches open (at most {}); retry later",
                hub.settings.max_watchers
            ),
            1,
        )));
    };
    let options = &api.options;
    let rv = options.resource_version.as_str();
    let initial = options
        .send_initial_events
        .unwrap_or(rv.is_empty() || rv == "0");
    let plan = Plan {
        initial,
        bookmark: initial && options.allow_watch_bookmarks,
        timeout: hub.timeout(options.timeout_seconds),
        encoder: Encoder {
            framing,
            version: api.version,
        },
    };
    let content_type = match plan.encoder.framing {
        Framing::Protobuf => "application/vnd.kubernetes.protobuf;stream=watch",
        _ => "application/json",
    };
    let (tx, rx) = mpsc::channel(hub.settings.buffer.max(1));
    let queue = Arc::new(Queue {
        hub: hub.clone(),
        bytes: parking_lot::Mutex::new(0),
    });
    let tx = Sender {
        tx,
        queue: queue.clone(),
    };
    let store = store.clone();
    let metadata = metadata.clone();
    let api = api.clone();
    let version = api.version;
    match api.resource {
        Resource::Nodes => tokio.spawn(run(slot, plan, tx, move |now| {
            list_nodes(store.as_ref(), metadata.as_ref(), &api, now)
                .into_iter()
                .map(|n| n.versioned(version))
                .collect()
        })),
        Resource::Pods => tokio.spawn(run(slot, plan, tx, move |now| {
            list_pods(store.as_ref(), metadata.as_ref(), &api, now)
                .into_iter()
                .map(|p| p.versioned(version))
                .collect()
        })),
    };
    let mut response = Response::new(WatchBody { rx, queue }.boxed());
    *response.status_mut() = StatusCode::OK;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(response)
}

/// What one watch sends and how.
struct Plan {
    initial: bool,
    bookmark: bool,
    timeout: Duration,
    encoder: Encoder,
}

/// The watcher: looks, compares, sends, until the client leaves, the timeout, a shutdown,
/// or a full queue.
async fn run<T: Watched>(
    slot: Slot,
    mut plan: Plan,
    tx: Sender,
    list: impl Fn(SystemTime) -> Vec<T> + Send + 'static,
) {
    let hub = slot.0.clone();
    let mut shutdown = hub.shutdown.subscribe();
    let deadline = tokio::time::sleep(plan.timeout);
    tokio::pin!(deadline);
    let mut ticks = tokio::time::interval(hub.settings.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent: Option<HashMap<String, T>> = None;
    loop {
        tokio::select! {
            _ = &mut deadline => break,
            _ = tx.tx.closed() => break,
            r = shutdown.wait_for(|stop| *stop) => {
                let _ = r;
                break;
            }
            _ = ticks.tick() => {}
        }
        let first = sent.is_none();
        let current = list(SystemTime::now());
        let mut chunk = Vec::new();
        let diff = diff(
            sent.take().unwrap_or_default(),
            current,
            !first || plan.initial,
        );
        let mut result = diff
            .events
            .iter()
            .try_for_each(|(kind, object)| plan.encoder.event(kind, object, &mut chunk));
        if first && plan.bookmark && result.is_ok() {
            result = plan.encoder.initial_events_end::<T>(&mut chunk);
        }
        sent = Some(diff.now);
        if let Err(e) = result {
            tracing::warn!(error = %e, "cannot encode a watch event; ending the watch");
            break;
        }
        if chunk.is_empty() {
            continue;
        }
        match tx.send(Bytes::from(chunk)) {
            Sent::Queued => {}
            Sent::Slow { looks, bytes } => {
                hub.dropped_slow.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    looks,
                    bytes,
                    "a watch client stopped reading; ending its watch"
                );
                break;
            }
            Sent::Closed => break,
        }
    }
    drop(slot);
}

/// Bytes one watcher has queued, counted in its hub's total too. The lock orders a
/// chunk's queueing before its taking, so that the counts never go below zero.
struct Queue {
    hub: Arc<Hub>,
    bytes: parking_lot::Mutex<usize>,
}

/// The watcher's end of its queue.
struct Sender {
    tx: mpsc::Sender<Bytes>,
    queue: Arc<Queue>,
}

/// What [`Sender::send`] did.
enum Sent {
    Queued,
    /// Not queued: the client is not reading (`looks` and `bytes` queued).
    Slow {
        looks: usize,
        bytes: usize,
    },
    /// The client is gone.
    Closed,
}

impl Sender {
    /// Queues `chunk` unless a limit says the client stopped reading (see the module docs).
    fn send(&self, chunk: Bytes) -> Sent {
        let hub = &self.queue.hub;
        let len = chunk.len();
        let mut bytes = self.queue.bytes.lock();
        let looks = self.tx.max_capacity() - self.tx.capacity();
        let over = bytes.saturating_add(len) > hub.settings.max_queued_bytes
            || hub.queued_bytes().saturating_add(len) > hub.settings.max_total_queued_bytes;
        if *bytes > 0 && over {
            return Sent::Slow {
                looks,
                bytes: *bytes,
            };
        }
        match self.tx.try_send(chunk) {
            Ok(()) => {
                *bytes += len;
                hub.queued_bytes.fetch_add(len, Ordering::Relaxed);
                Sent::Queued
            }
            Err(mpsc::error::TrySendError::Full(_)) => Sent::Slow {
                looks,
                bytes: *bytes,
            },
            Err(mpsc::error::TrySendError::Closed(_)) => Sent::Closed,
        }
    }
}

/// The response body: the queue's chunks, each uncounted as hyper takes it; what is left
/// when the body is dropped is uncounted then.
struct WatchBody {
    rx: mpsc::Receiver<Bytes>,
    queue: Arc<Queue>,
}

impl hyper::body::Body for WatchBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.rx.poll_recv(cx).map(|chunk| {
            chunk.map(|c| {
                self.queue.taken(c.len());
                Ok(hyper::body::Frame::data(c))
            })
        })
    }
}

impl Queue {
    fn taken(&self, len: usize) {
        let mut bytes = self.bytes.lock();
        let len = len.min(*bytes);
        *bytes -= len;
        self.hub.queued_bytes.fetch_sub(len, Ordering::Relaxed);
    }
}

impl Drop for WatchBody {
    fn drop(&mut self) {
        // No more chunks can be queued (the receiver is gone); those still queued go now.
        self.rx.close();
        let mut bytes = self.queue.bytes.lock();
        self.queue
            .hub
            .queued_bytes
            .fetch_sub(*bytes, Ordering::Relaxed);
        *bytes = 0;
    }
}

/// What changed between two looks.
struct Diff<T> {
    events: Vec<(EventType, T)>,
    now: HashMap<String, T>,
}

/// Events from `before` to `current` (in `current`'s order, then deletions by key).
/// `emit` false only remembers `current`.
fn diff<T: Watched>(mut before: HashMap<String, T>, current: Vec<T>, emit: bool) -> Diff<T> {
    let mut events = Vec::new();
    let mut now = HashMap::with_capacity(current.len());
    for object in current {
        let key = object.key();
        match before.remove(&key) {
            None if emit => events.push((EventType::Added, object.clone())),
            Some(old) if emit && !old.same_state(&object) => {
                events.push((EventType::Modified, object.clone()))
            }
            _ => {}
        }
        now.insert(key, object);
    }
    if emit {
        let mut gone: Vec<(String, T)> = before.into_iter().collect();
        gone.sort_by(|a, b| a.0.cmp(&b.0));
        events.extend(gone.into_iter().map(|(_, o)| (EventType::Deleted, o)));
    }
    Diff { events, now }
}

/// A watch event's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventType {
    Added,
    Modified,
    Deleted,
    Bookmark,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
            EventType::Bookmark => "BOOKMARK",
        }
    }
}

/// What the watch writes for each event's object.
#[derive(Clone, Copy, Debug)]
enum Framing {
    Json,
    Protobuf,
    Table {
        options: TableOptions,
        headers_sent: bool,
    },
    PartialObjectMetadata(TableVersion),
}

struct Encoder {
    framing: Framing,
    version: MetricsVersion,
}

impl Encoder {
    fn event<T: Watched>(
        &mut self,
        kind: &EventType,
        object: &T,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        match &mut self.framing {
            Framing::Json => json_event(*kind, object, out),
            Framing::Protobuf => {
                let frame = proto::watch_frame(kind.as_str(), object.protobuf(self.version))
                    .map_err(|e| e.to_string())?;
                out.extend_from_slice(&frame);
                Ok(())
            }
            Framing::Table {
                options,
                headers_sent,
            } => {
                let mut table = object.table(options);
                // As the apiserver: column definitions only in the first event.
                if *headers_sent {
                    table.column_definitions = None;
                }
                *headers_sent = true;
                json_event(*kind, &table, out)
            }
            Framing::PartialObjectMetadata(version) => {
                let partial = RowObject::PartialObjectMetadata {
                    version: *version,
                    metadata: Box::new(object.metadata().clone()),
                };
                json_event(*kind, &partial, out)
            }
        }
    }

    /// The `BOOKMARK` that ends the initial events: an empty object of the watched kind
    /// carrying only the annotation, as the apiserver sends it (no `resourceVersion`:
    /// metrics have none).
    fn initial_events_end<T: Watched>(&mut self, out: &mut Vec<u8>) -> Result<(), String> {
        match self.framing {
            Framing::Json => {
                let body = format!(
                    r#"{{"type":"BOOKMARK","object":{{"kind":"{}","apiVersion":"{}","metadata":{{"creationTimestamp":null,"annotations":{{"{INITIAL_EVENTS_END}":"true"}}}},"timestamp":null,"window":"0s",{}}}}}"#,
                    T::KIND,
                    self.version.api_version(),
                    T::EMPTY_JSON_USAGE,
                );
                out.extend_from_slice(body.as_bytes());
                out.push(b'\n');
                Ok(())
            }
            Framing::Protobuf => {
                let object = T::protobuf_bookmark(self.version);
                let frame = proto::watch_frame(EventType::Bookmark.as_str(), object)
                    .map_err(|e| e.to_string())?;
                out.extend_from_slice(&frame);
                Ok(())
            }
            Framing::PartialObjectMetadata(version) => {
                let metadata = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    annotations: Some([(INITIAL_EVENTS_END.to_owned(), "true".to_owned())].into()),
                    ..Default::default()
                };
                let partial = RowObject::PartialObjectMetadata {
                    version,
                    metadata: Box::new(metadata),
                };
                json_event(EventType::Bookmark, &partial, out)
            }
            Framing::Table { .. } => Ok(()),
        }
    }
}

/// `{"type":"…","object":…}` and a newline, as Go's JSON stream encoder writes an event.
fn json_event<T: serde::Serialize + ?Sized>(
    kind: EventType,
    object: &T,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let mut body = encode_json(object).map_err(|e| e.to_string())?;
    if body.last() == Some(&b'\n') {
        body.pop();
    }
    out.extend_from_slice(br#"{"type":""#);
    out.extend_from_slice(kind.as_str().as_bytes());
    out.extend_from_slice(br#"","object":"#);
    out.extend_from_slice(&body);
    out.extend_from_slice(b"}\n");
    Ok(())
}

/// A kind that can be watched.
trait Watched: Clone + Send + serde::Serialize + 'static {
    /// `NodeMetrics` or `PodMetrics`.
    const KIND: &'static str;
    /// The usage field of an empty object in JSON (Go's nil map or slice).
    const EMPTY_JSON_USAGE: &'static str;
    /// Name, or `namespace/name`.
    fn key(&self) -> String;
    /// Same numbers and labels (the creation timestamp does not count).
    fn same_state(&self, other: &Self) -> bool;
    fn metadata(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    fn table(&self, options: &TableOptions) -> table::Table;
    fn protobuf(&self, version: MetricsVersion) -> Vec<u8>;
    fn protobuf_bookmark(version: MetricsVersion) -> Vec<u8>;
}

fn bookmark_meta() -> proto::ObjectMeta {
    proto::ObjectMeta {
        annotations: [(INITIAL_EVENTS_END.to_owned(), "true".to_owned())].into(),
        ..proto::ObjectMeta::default()
    }
}

impl Watched for NodeMetrics {
    const KIND: &'static str = "NodeMetrics";
    const EMPTY_JSON_USAGE: &'static str = r#""usage":null"#;

    fn key(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }

    fn same_state(&self, other: &Self) -> bool {
        self.timestamp == other.timestamp
            && self.window == other.window
            && self.usage == other.usage
            && self.metadata.labels == other.metadata.labels
    }

    fn metadata(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &self.metadata
    }

    fn table(&self, options: &TableOptions) -> table::Table {
        table::node_metrics_table(self, options)
    }

    fn protobuf(&self, version: MetricsVersion) -> Vec<u8> {
        proto::encode_object(version.api_version(), Self::KIND, &node_message(self))
    }

    fn protobuf_bookmark(version: MetricsVersion) -> Vec<u8> {
        let empty = proto::NodeMetrics {
            metadata: bookmark_meta(),
            timestamp: proto::Time::ZERO,
            window: proto::Duration::from_nanos(0),
            usage: Default::default(),
        };
        proto::encode_object(version.api_version(), Self::KIND, &empty)
    }
}

impl Watched for PodMetrics {
    const KIND: &'static str = "PodMetrics";
    const EMPTY_JSON_USAGE: &'static str = r#""containers":null"#;

    fn key(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default()
        )
    }

    fn same_state(&self, other: &Self) -> bool {
        self.timestamp == other.timestamp
            && self.window == other.window
            && self.containers == other.containers
            && self.metadata.labels == other.metadata.labels
    }

    fn metadata(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &self.metadata
    }

    fn table(&self, options: &TableOptions) -> table::Table {
        table::pod_metrics_table(self, options)
    }

    fn protobuf(&self, version: MetricsVersion) -> Vec<u8> {
        proto::encode_object(version.api_version(), Self::KIND, &pod_message(self))
    }

    fn protobuf_bookmark(version: MetricsVersion) -> Vec<u8> {
        let empty = proto::PodMetrics {
            metadata: bookmark_meta(),
            timestamp: proto::Time::ZERO,
            window: proto::Duration::from_nanos(0),
            containers: Vec::new(),
        };
        proto::encode_object(version.api_version(), Self::KIND, &empty)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kpulse_wire::{
        Bytes as WireBytes, ContainerSample, CpuNanos, NodeBatch, NodeSample, PodSample, UnixNanos,
    };
    use serde_json::Value;

    use super::*;
    use crate::{
        api::discovery::Discovery,
        api::handler::{handle_at, ApiContext},
        metadata::{MetadataDocument, NodeMeta, PodMeta, StaticMetadata},
        store::{ManualClock, Store, StoreConfig},
    };

    const T0: u64 = 1_700_000_000_000_000_000;
    const SECOND: u64 = 1_000_000_000;

    fn batch(t: u64, pods: &[(&str, u64)]) -> NodeBatch {
        NodeBatch {
            node_name: "n1".into(),
            sent_at: UnixNanos(t),
            node: NodeSample {
                timestamp: UnixNanos(t),
                started_at: None,
                cpu: CpuNanos(t - T0),
                memory_working_set: WireBytes(1 << 30),
                swap: None,
            },
            pods: pods
                .iter()
                .map(|(name, cpu)| PodSample {
                    uid: format!("u-{name}"),
                    namespace: "ns".into(),
                    name: (*name).into(),
                    containers: vec![ContainerSample {
                        name: "app".into(),
                        timestamp: UnixNanos(t),
                        cgroup_id: None,
                        started_at: None,
                        cpu: CpuNanos(*cpu),
                        memory_working_set: WireBytes(100 << 20),
                        swap: None,
                        signals: None,
                    }],
                    signals: None,
                    ready_since: None,
                })
                .collect(),
        }
    }

    struct Fixture {
        ctx: ApiContext,
        store: Arc<Store<Arc<ManualClock>>>,
        clock: Arc<ManualClock>,
    }

    fn fixture(settings: Settings) -> Fixture {
        let clock = Arc::new(ManualClock::new(UnixNanos(T0)));
        let store = Store::with_clock(StoreConfig::new(Duration::from_secs(10)), clock.clone())
            .expect("store");
        store
            .ingest(batch(T0, &[("a", 0), ("b", 0)]))
            .expect("ingest");
        store
            .ingest(batch(T0 + SECOND, &[("a", SECOND / 2), ("b", SECOND / 4)]))
            .expect("ingest");
        clock.set(UnixNanos(T0 + SECOND));
        let metadata = StaticMetadata::new();
        let pod = |name: &str| PodMeta {
            namespace: "ns".into(),
            name: name.into(),
            labels: BTreeMap::from([("app".into(), name.into())]),
        };
        metadata.replace(MetadataDocument {
            nodes: vec![NodeMeta {
                name: "n1".into(),
                labels: Default::default(),
            }],
            pods: vec![pod("a"), pod("b"), pod("c")],
        });
        let store = Arc::new(store);
        Fixture {
            store: store.clone(),
            ctx: ApiContext {
                store,
                metadata,
                discovery: Arc::new(
                    Discovery::new(crate::api::document::Options::default()).expect("documents"),
                ),
                watch: Hub::new(settings),
            },
            clock,
        }
    }

    fn fast() -> Settings {
        Settings {
            interval: Duration::from_millis(20),
            ..Settings::default()
        }
    }

    fn request(target: &str, accept: Option<&str>) -> http::Request<Bytes> {
        let mut b = http::Request::builder().method("GET").uri(target);
        if let Some(a) = accept {
            b = b.header("Accept", a);
        }
        b.body(Bytes::new()).expect("request")
    }

    fn open(f: &Fixture, target: &str, accept: Option<&str>) -> Response<Body> {
        handle_at(&f.ctx, &request(target, accept), SystemTime::now()).expect("served")
    }

    /// The next chunk of the stream, or `None` at its end.
    async fn chunk(body: &mut Body) -> Option<Bytes> {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("a chunk within 5 s")?;
        Some(frame.expect("infallible").into_data().expect("data frame"))
    }

    fn events(chunk: &[u8]) -> Vec<Value> {
        std::str::from_utf8(chunk)
            .expect("utf8")
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON event per line"))
            .collect()
    }

    fn summary(events: &[Value]) -> Vec<(String, String)> {
        events
            .iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap_or("?").to_owned(),
                    e["object"]["metadata"]["name"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned(),
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn json_pod_watch_adds_modifies_deletes() {
        let f = fixture(fast());
        let r = open(
            &f,
            "/apis/metrics.k8s.io/v1beta1/namespaces/ns/pods?watch=true",
            None,
        );
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(f.ctx.watch.active(), 1);
        let mut body = r.into_body();
        let first = chunk(&mut body).await.expect("initial events");
        let text = std::str::from_utf8(&first).expect("utf8");
        assert!(
            text.starts_with(r#"{"type":"ADDED","object":{"kind":"PodMetrics","apiVersion":"metrics.k8s.io/v1beta1","metadata":{"name":"a","namespace":"ns","#),
            "{text}"
        );
        assert!(text.ends_with("}\n"), "{text}");
        let e = events(&first);
        assert_eq!(
            summary(&e),
            [("ADDED".into(), "a".into()), ("ADDED".into(), "b".into())],
            "c has no metrics; sorted as a list"
        );
        assert_eq!(e[0]["object"]["containers"][0]["usage"]["cpu"], "500m");

        // a changes, b goes away, nothing about c.
        f.store
            .ingest(batch(T0 + 2 * SECOND, &[("a", SECOND)]))
            .expect("ingest");
        f.clock.set(UnixNanos(T0 + 2 * SECOND));
        let e = events(&chunk(&mut body).await.expect("changes"));
        assert_eq!(
            summary(&e),
            [
                ("MODIFIED".into(), "a".into()),
                ("DELETED".into(), "b".into())
            ]
        );
        assert_eq!(
            e[1]["object"]["containers"][0]["usage"]["cpu"], "250m",
            "last state"
        );

        // Expiry deletes too.
        f.clock.set(UnixNanos(T0 + 30 * SECOND));
        let e = events(&chunk(&mut body).await.expect("expiry"));
        assert_eq!(summary(&e), [("DELETED".into(), "a".into())]);

        drop(body);
        for _ in 0..100 {
            if f.ctx.watch.active() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(f.ctx.watch.active(), 0, "a closed stream ends its watcher");
    }

    #[tokio::test]
    async fn no_initial_events_when_asked_and_bookmark_for_watch_list() {
        let f = fixture(fast());
        let r = open(
            &f,
            "/apis/metrics.k8s.io/v1/nodes?watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=0",
            None,
        );
        let mut body = r.into_body();
        // Let the first look happen (it sends nothing) before the change.
        tokio::time::sleep(Duration::from_millis(100)).await;
        f.store.ingest(batch(T0 + 2 * SECOND, &[])).expect("ingest");
        let e = events(&chunk(&mut body).await.expect("a change"));
        assert_eq!(summary(&e), [("MODIFIED".into(), "n1".into())]);

        let r = open(
            &f,
            "/apis/metrics.k8s.io/v1/nodes?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
            None,
        );
        let e = events(&chunk(&mut r.into_body()).await.expect("initial"));
        assert_eq!(
            summary(&e),
            [
                ("ADDED".into(), "n1".into()),
                ("BOOKMARK".into(), "".into())
            ]
        );
        assert_eq!(
            e[1]["object"]["metadata"]["annotations"][INITIAL_EVENTS_END],
            "true"
        );
        assert_eq!(e[1]["object"]["kind"], "NodeMetrics");
        assert_eq!(e[1]["object"]["apiVersion"], "metrics.k8s.io/v1");
    }

    #[tokio::test]
    async fn table_watch_sends_columns_once() {
        let f = fixture(fast());
        let r = open(
            &f,
            "/apis/metrics.k8s.io/v1beta1/namespaces/ns/pods?watch=true",
            Some("application/json;as=Table;v=v1;g=meta.k8s.io,application/json"),
        );
        let e = events(&chunk(&mut r.into_body()).await.expect("initial"));
        assert_eq!(e.len(), 2);
        assert_eq!(e[0]["object"]["kind"], "Table");
        assert_eq!(e[0]["object"]["columnDefinitions"][0]["name"], "Name");
        assert_eq!(e[0]["object"]["rows"][0]["cells"][0], "a");
        assert!(e[1]["object"]["columnDefinitions"].is_null());
        assert_eq!(e[1]["object"]["rows"][0]["cells"][0], "b");
        assert_eq!(
            e[1]["object"]["rows"][0]["object"]["kind"],
            "PartialObjectMetadata"
        );
    }

    #[tokio::test]
    async fn protobuf_watch_frames() {
        let f = fixture(fast());
        let r = open(
            &f,
            "/apis/metrics.k8s.io/v1beta1/nodes?watch=true",
            Some("application/vnd.kubernetes.protobuf;stream=watch"),
        );
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "application/vnd.kubernetes.protobuf;stream=watch"
        );
        let data = chunk(&mut r.into_body()).await.expect("initial");
        let len = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
        assert_eq!(data.len(), 4 + len, "one event");
        let event = <proto::WatchEvent as prost::Message>::decode(&data[4..]).expect("WatchEvent");
        assert_eq!(event.type_, "ADDED");
        let node: proto::NodeMetrics =
            proto::decode_object(&event.object.raw, "metrics.k8s.io/v1beta1", "NodeMetrics")
                .expect("enveloped NodeMetrics");
        assert_eq!(node.metadata.name, "n1");
        assert_eq!(node.usage["cpu"], proto::Quantity::new("1"));
    }

    #[tokio::test]
    async fn refusals() {
        let mut settings = fast();
        settings.max_watchers = 1;
        let f = fixture(settings);
        let target = "/apis/metrics.k8s.io/v1beta1/nodes?watch=true";
        let first = open(&f, target, None);
        let second = open(&f, target, None);
        assert_eq!(second.status(), 429);
        drop(first);

        let f = fixture(fast());
        let bad = open(
            &f,
            "/apis/metrics.k8s.io/v1beta1/nodes?watch=true&includeObject=All",
            Some("application/json;as=Table;v=v1;g=meta.k8s.io"),
        );
        assert_eq!(bad.status(), 400);
        let list_meta = open(
            &f,
            target,
            Some("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"),
        );
        assert_eq!(list_meta.status(), 406);
        f.ctx.watch.shutdown();
        assert_eq!(open(&f, target, None).status(), 503);
    }

    #[tokio::test]
    async fn ends_on_timeout_shutdown_and_slow_clients() {
        let f = fixture(fast());
        let r = open(
            &f,
            "/apis/metrics.k8s.io/v1beta1/nodes?watch=true&timeoutSeconds=0",
            None,
        );
        let mut body = r.into_body();
        while chunk(&mut body).await.is_some() {}

        let r = open(&f, "/apis/metrics.k8s.io/v1beta1/nodes?watch=true", None);
        let mut body = r.into_body();
        chunk(&mut body).await.expect("initial");
        f.ctx.watch.shutdown();
        assert!(chunk(&mut body).await.is_none(), "shutdown ends the stream");

        let mut settings = fast();
        settings.buffer = 2;
        let f = fixture(settings);
        let _unread = open(&f, "/apis/metrics.k8s.io/v1beta1/nodes?watch=true", None);
        for i in 2..20 {
            f.store.ingest(batch(T0 + i * SECOND, &[])).expect("ingest");
            f.clock.set(UnixNanos(T0 + i * SECOND));
            tokio::time::sleep(Duration::from_millis(30)).await;
            if f.ctx.watch.dropped_slow() > 0 {
                break;
            }
        }
        assert_eq!(f.ctx.watch.dropped_slow(), 1);
        assert_eq!(f.ctx.watch.active(), 0);
    }

    #[tokio::test]
    async fn queued_bytes_are_bounded_per_watcher_and_in_all() {
        let target = "/apis/metrics.k8s.io/v1beta1/nodes?watch=true";
        // Advances the data until `f`'s hub dropped a watcher or `looks` passed.
        async fn advance(f: &Fixture, looks: u64, mut read: Option<&mut Body>) {
            for i in 2..2 + looks {
                f.store.ingest(batch(T0 + i * SECOND, &[])).expect("ingest");
                f.clock.set(UnixNanos(T0 + i * SECOND));
                if let Some(body) = read.as_mut() {
                    chunk(body).await.expect("a look");
                } else {
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
                if f.ctx.watch.dropped_slow() > 0 {
                    return;
                }
            }
        }
        for settings in [
            // One byte per watcher: one look queued at most.
            Settings {
                max_queued_bytes: 1,
                ..fast()
            },
            // One byte in all: likewise, for a single watcher.
            Settings {
                max_total_queued_bytes: 1,
                ..fast()
            },
        ] {
            // A client that reads is never dropped, however large its looks.
            let f = fixture(settings.clone());
            let mut body = open(&f, target, None).into_body();
            chunk(&mut body).await.expect("initial");
            advance(&f, 10, Some(&mut body)).await;
            assert_eq!(f.ctx.watch.dropped_slow(), 0, "{settings:?}");
            drop(body);

            // One that does not read is dropped at its second look, long before 16.
            let f = fixture(settings.clone());
            let unread = open(&f, target, None);
            advance(&f, 10, None).await;
            assert_eq!(f.ctx.watch.dropped_slow(), 1, "{settings:?}");
            assert!(f.ctx.watch.queued_bytes() > 0, "its look is still queued");
            drop(unread);
            assert_eq!(f.ctx.watch.queued_bytes(), 0, "uncounted with its body");
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while f.ctx.watch.active() > 0 {
                assert!(tokio::time::Instant::now() < deadline, "watch still active");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    #[test]
    fn default_timeout_is_between_min_and_twice_min() {
        let hub = Hub::new(Settings::default());
        for _ in 0..100 {
            let t = hub.timeout(None);
            assert!(
                t >= Duration::from_secs(1800) && t < Duration::from_secs(3600),
                "{t:?}"
            );
        }
        assert_eq!(hub.timeout(Some(5)), Duration::from_secs(5));
        assert_eq!(hub.timeout(Some(-1)), Duration::ZERO);
    }
}
