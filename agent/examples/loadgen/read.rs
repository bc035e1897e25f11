//! The reader: authenticated reads of the metrics API at a steady rate, every answer checked
//! against what the simulated agents send ([`Sim`]), for `cargo xtask soak`; and
//! [`wait_complete`], which polls until every node and pod is served again, for the
//! restart measurements.
//!
//! One HTTP/2 + TLS connection (client certificate from the agents' CA, as a user), opened
//! again when it breaks. Reads follow a fixed cycle ([`nth`]): per 50 reads, one list of
//! every PodMetrics (the heaviest: 17.7 MB of JSON at 1,000 nodes × 30 pods), 5 lists of
//! NodeMetrics, 16 label-selected PodMetrics lists in one namespace (`app=…`) and 28 gets of
//! one random pod; half of each asks for JSON, half for protobuf.
//!
//! An answer counts as correct when it is a 200, parses (JSON into typed objects; protobuf
//! through the server's own message definitions), lists exactly the objects that should be
//! there (every node and pod the simulation has, each once; only the selected ones for a
//! selector), every container is there with the CPU rate the simulation gives it (±1 %) and
//! its memory, and every object is fresh (its timestamp at most `--max-age-secs` old).

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use k8s_openapi::apimachinery::pkg::{
    api::resource::Quantity as JsonQuantity,
    apis::meta::v1::{ObjectMeta, Time as JsonTime},
};
use kpulse_aggregator_api::api::proto;
use rustls::pki_types::ServerName;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch, Mutex, Semaphore};

use super::sim::{self, Sim};

/// The API group version read.
const GROUP_VERSION: &str = "metrics.k8s.io/v1beta1";
const API: &str = "/apis/metrics.k8s.io/v1beta1";
/// Largest body read.
const MAX_BODY: usize = 256 << 20;
/// TCP connect, TLS and HTTP/2 handshakes, each.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// One read, from sending the request to the end of the body.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Reads in flight at most; beyond, the schedule waits (and the achieved rate shows it).
const MAX_IN_FLIGHT: usize = 32;
/// Error messages kept verbatim per class of error (the rest are only counted).
const FIRST_ERRORS: usize = 5;
/// Missing objects named in an error.
const MISSING_SHOWN: usize = 5;
/// Relative tolerance of a served CPU rate.
const CPU_TOLERANCE: f64 = 0.01;
/// Failed polls of [`wait_complete`] reported (milliseconds since it started, why).
const PROGRESS_KEPT: usize = 100;
/// Pause between two polls of [`wait_complete`].
const POLL_PAUSE: Duration = Duration::from_millis(20);

/// What is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Every PodMetrics, all namespaces.
    ListPods,
    /// Every NodeMetrics.
    ListNodes,
    /// One namespace's PodMetrics with `labelSelector=app=…`.
    SelectPods,
    /// One PodMetrics.
    GetPod,
}

/// The representation asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Json,
    Protobuf,
}

impl Format {
    fn accept(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Protobuf => proto::MEDIA_TYPE,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Protobuf => "protobuf",
        }
    }
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::ListPods => "list_pods",
            Kind::ListNodes => "list_nodes",
            Kind::SelectPods => "select_pods",
            Kind::GetPod => "get_pod",
        }
    }
}

/// Reads per cycle (one second at 50 reads/s).
const CYCLE: u64 = 50;

/// The `i`-th read (see the module docs): per cycle of [`CYCLE`], one list of every
/// PodMetrics, 5 NodeMetrics lists, 16 label-selected lists and 28 gets; formats alternate
/// read by read, and from one cycle to the next, so that each kind is read in both.
fn nth(i: u64) -> (Kind, Format) {
    let (cycle, slot) = (i / CYCLE, i % CYCLE);
    let kind = if slot == 0 {
        Kind::ListPods
    } else if slot % 10 == 5 {
        Kind::ListNodes
    } else if slot % 3 == 1 {
        Kind::SelectPods
    } else {
        Kind::GetPod
    };
    let format = if (slot + cycle) % 2 == 0 {
        Format::Json
    } else {
        Format::Protobuf
    };
    (kind, format)
}

/// Reader settings.
#[derive(Clone, Debug)]
pub struct Options {
    /// The API's `host:port`.
    pub api: String,
    /// Reads per second.
    pub reads_per_sec: f64,
    /// Oldest timestamp accepted.
    pub max_age: Duration,
}

/// Why an answer was wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    /// No answer: connect, TLS, HTTP/2, timeout.
    Transport,
    /// Not a 200.
    Status,
    /// Not JSON/protobuf of the expected type.
    Parse,
    /// Objects missing, repeated or unexpected.
    Incomplete,
    /// An object older than the maximum age.
    Stale,
    /// A container missing, or a usage that is not the simulated one.
    Value,
}

impl Class {
    fn name(self) -> &'static str {
        match self {
            Class::Transport => "transport",
            Class::Status => "status",
            Class::Parse => "parse",
            Class::Incomplete => "incomplete",
            Class::Stale => "stale",
            Class::Value => "value",
        }
    }
}

#[derive(Debug)]
struct Failure {
    class: Class,
    message: String,
}

fn fail(class: Class, message: impl Into<String>) -> Failure {
    Failure {
        class,
        message: message.into(),
    }
}

// ---------------------------------------------------------------------------------------
// The connection.

/// One HTTP/2 connection to the API, opened again when it is gone.
pub struct Client {
    addr: String,
    tls: Arc<rustls::ClientConfig>,
    conn: Mutex<Option<SendRequest<Empty<Bytes>>>>,
}

/// A 200's body and content type, or what was wrong.
struct Answer {
    status: StatusCode,
    content_type: String,
    body: Bytes,
}

impl Client {
    /// A client of `addr` (`host:port`), presenting the identity in `tls`.
    pub fn new(addr: String, tls: Arc<rustls::ClientConfig>) -> Client {
        Client {
            addr,
            tls,
            conn: Mutex::new(None),
        }
    }

    async fn sender(&self) -> Result<SendRequest<Empty<Bytes>>> {
        let mut conn = self.conn.lock().await;
        if let Some(s) = conn.as_ref().filter(|s| !s.is_closed()) {
            return Ok(s.clone());
        }
        *conn = None;
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&self.addr))
            .await
            .context("connecting: timed out")?
            .with_context(|| format!("connecting to {}", self.addr))?;
        let _ = tcp.set_nodelay(true);
        let name = ServerName::try_from("localhost").context("server name")?;
        let tls = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio_rustls::TlsConnector::from(self.tls.clone()).connect(name, tcp),
        )
        .await
        .context("TLS handshake: timed out")?
        .context("TLS handshake")?;
        let (sender, connection) = tokio::time::timeout(
            CONNECT_TIMEOUT,
            hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .adaptive_window(true)
                .handshake(TokioIo::new(tls)),
        )
        .await
        .context("HTTP/2 handshake: timed out")?
        .context("HTTP/2 handshake")?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "API connection ended");
            }
        });
        *conn = Some(sender.clone());
        Ok(sender)
    }

    async fn get(&self, path: &str, format: Format) -> Result<Answer> {
        let read = async {
            let mut sender = self.sender().await?;
            let request = Request::get(format!("https://{}{path}", self.addr))
                .header(header::ACCEPT, format.accept())
                .body(Empty::new())
                .context("building the request")?;
            sender.ready().await.context("connection not ready")?;
            let response = sender
                .send_request(request)
                .await
                .context("sending the request")?;
            let status = response.status();
            let content_type = response
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let body = Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("reading the body: {e}"))?
                .to_bytes();
            Ok(Answer {
                status,
                content_type,
                body,
            })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, read)
            .await
            .with_context(|| format!("no answer within {REQUEST_TIMEOUT:?}"))?
    }
}

// ---------------------------------------------------------------------------------------
// Answers: parsed into one model, whatever the format.

struct PodObject {
    namespace: String,
    name: String,
    timestamp: Option<i64>,
    window_set: bool,
    containers: Vec<(String, BTreeMap<String, String>)>,
}

struct NodeObject {
    name: String,
    timestamp: Option<i64>,
    window_set: bool,
    usage: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct JsonList<T> {
    kind: String,
    #[serde(rename = "apiVersion")]
    api_version: String,
    items: Vec<T>,
}

#[derive(Deserialize)]
struct JsonPod {
    #[serde(default)]
    kind: Option<String>,
    metadata: ObjectMeta,
    timestamp: Option<JsonTime>,
    window: String,
    containers: Vec<JsonContainer>,
}

#[derive(Deserialize)]
struct JsonContainer {
    name: String,
    usage: BTreeMap<String, JsonQuantity>,
}

#[derive(Deserialize)]
struct JsonNode {
    metadata: ObjectMeta,
    timestamp: Option<JsonTime>,
    window: String,
    usage: BTreeMap<String, JsonQuantity>,
}

fn json_usage(u: BTreeMap<String, JsonQuantity>) -> BTreeMap<String, String> {
    u.into_iter().map(|(k, v)| (k, v.0)).collect()
}

fn proto_usage(u: BTreeMap<String, proto::Quantity>) -> BTreeMap<String, String> {
    u.into_iter().map(|(k, v)| (k, v.string)).collect()
}

impl From<JsonPod> for PodObject {
    fn from(p: JsonPod) -> PodObject {
        PodObject {
            namespace: p.metadata.namespace.unwrap_or_default(),
            name: p.metadata.name.unwrap_or_default(),
            timestamp: p.timestamp.map(|t| t.0.as_second()),
            window_set: !p.window.is_empty() && p.window != "0s",
            containers: p
                .containers
                .into_iter()
                .map(|c| (c.name, json_usage(c.usage)))
                .collect(),
        }
    }
}

impl From<proto::PodMetrics> for PodObject {
    fn from(p: proto::PodMetrics) -> PodObject {
        PodObject {
            namespace: p.metadata.namespace,
            name: p.metadata.name,
            timestamp: p.timestamp.unix_seconds(),
            window_set: p.window.duration > 0,
            containers: p
                .containers
                .into_iter()
                .map(|c| (c.name, proto_usage(c.usage)))
                .collect(),
        }
    }
}

impl From<JsonNode> for NodeObject {
    fn from(n: JsonNode) -> NodeObject {
        NodeObject {
            name: n.metadata.name.unwrap_or_default(),
            timestamp: n.timestamp.map(|t| t.0.as_second()),
            window_set: !n.window.is_empty() && n.window != "0s",
            usage: json_usage(n.usage),
        }
    }
}

impl From<proto::NodeMetrics> for NodeObject {
    fn from(n: proto::NodeMetrics) -> NodeObject {
        NodeObject {
            name: n.metadata.name,
            timestamp: n.timestamp.unix_seconds(),
            window_set: n.window.duration > 0,
            usage: proto_usage(n.usage),
        }
    }
}

fn parse_failure(e: impl std::fmt::Display) -> Failure {
    fail(Class::Parse, e.to_string())
}

fn check_media(a: &Answer, format: Format) -> Result<(), Failure> {
    let want = format.accept();
    if a.content_type.split(';').next().map(str::trim) != Some(want) {
        return Err(fail(
            Class::Parse,
            format!("Content-Type {:?}, asked for {want}", a.content_type),
        ));
    }
    Ok(())
}

fn check_json_kind(kind: &str, api_version: &str, want: &str) -> Result<(), Failure> {
    if kind != want || api_version != GROUP_VERSION {
        return Err(fail(
            Class::Parse,
            format!("{api_version} {kind}, expected {GROUP_VERSION} {want}"),
        ));
    }
    Ok(())
}

fn pod_list(a: &Answer, format: Format) -> Result<Vec<PodObject>, Failure> {
    check_media(a, format)?;
    match format {
        Format::Json => {
            let l: JsonList<JsonPod> = serde_json::from_slice(&a.body).map_err(parse_failure)?;
            check_json_kind(&l.kind, &l.api_version, "PodMetricsList")?;
            Ok(l.items.into_iter().map(PodObject::from).collect())
        }
        Format::Protobuf => {
            let l: proto::PodMetricsList =
                proto::decode_object(&a.body, GROUP_VERSION, "PodMetricsList")
                    .map_err(parse_failure)?;
            Ok(l.items.into_iter().map(PodObject::from).collect())
        }
    }
}

fn pod_one(a: &Answer, format: Format) -> Result<PodObject, Failure> {
    check_media(a, format)?;
    match format {
        Format::Json => {
            let p: JsonPod = serde_json::from_slice(&a.body).map_err(parse_failure)?;
            if p.kind.as_deref() != Some("PodMetrics") {
                return Err(fail(Class::Parse, format!("kind {:?}", p.kind)));
            }
            Ok(p.into())
        }
        Format::Protobuf => {
            let p: proto::PodMetrics = proto::decode_object(&a.body, GROUP_VERSION, "PodMetrics")
                .map_err(parse_failure)?;
            Ok(p.into())
        }
    }
}

fn node_list(a: &Answer, format: Format) -> Result<Vec<NodeObject>, Failure> {
    check_media(a, format)?;
    match format {
        Format::Json => {
            let l: JsonList<JsonNode> = serde_json::from_slice(&a.body).map_err(parse_failure)?;
            check_json_kind(&l.kind, &l.api_version, "NodeMetricsList")?;
            Ok(l.items.into_iter().map(NodeObject::from).collect())
        }
        Format::Protobuf => {
            let l: proto::NodeMetricsList =
                proto::decode_object(&a.body, GROUP_VERSION, "NodeMetricsList")
                    .map_err(parse_failure)?;
            Ok(l.items.into_iter().map(NodeObject::from).collect())
        }
    }
}

// ---------------------------------------------------------------------------------------
// Checks against the simulation.

/// A Kubernetes quantity (`250m`, `1`, `123456n`, `64Mi`, `1.5Gi`, `2e3`) in base units.
fn quantity(s: &str) -> Option<f64> {
    let suffixes: [(&str, f64); 14] = [
        ("Ki", 1024.0),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
    ];
    let (number, scale) = suffixes
        .iter()
        .find_map(|(suffix, scale)| s.strip_suffix(suffix).map(|n| (n, *scale)))
        .unwrap_or((s, 1.0));
    let v: f64 = number.parse().ok()?;
    v.is_finite().then_some(v * scale)
}

/// What a served timestamp is checked against: at most `max_age` older than the moment
/// the request was sent. Not the answer's arrival: a list of 50,000 pods takes seconds to
/// build, send and parse on a busy machine, and that time is the read's latency (measured
/// apart), not the age of what the server held when it was asked.
#[derive(Clone, Copy, Debug)]
struct Fresh {
    /// When the request was sent, in Unix seconds.
    asked_secs: i64,
    max_age: Duration,
}

impl Fresh {
    /// Asked at `unix_ns` ([`unix_nanos`]).
    fn asked_at(unix_ns: u128, max_age: Duration) -> Fresh {
        Fresh {
            asked_secs: i64::try_from(unix_ns / 1_000_000_000).unwrap_or(i64::MAX),
            max_age,
        }
    }

    fn check(self, what: &str, timestamp: Option<i64>) -> Result<(), Failure> {
        let Some(t) = timestamp else {
            return Err(fail(Class::Value, format!("{what}: no timestamp")));
        };
        // The served timestamp has whole seconds: one more second of slack. A value that
        // arrived while the answer was being built may be newer than the question, by at
        // most the request's timeout (and 2 s of the clocks' disagreement).
        let age = self.asked_secs.saturating_sub(t);
        let max = i64::try_from(self.max_age.as_secs()).unwrap_or(i64::MAX);
        let newest =
            (-2_i64).saturating_sub(i64::try_from(REQUEST_TIMEOUT.as_secs()).unwrap_or(i64::MAX));
        if age > max.saturating_add(1) {
            return Err(fail(
                Class::Stale,
                format!("{what}: timestamp {age} s before the request (at most {max} s)"),
            ));
        }
        if age < newest {
            return Err(fail(
                Class::Stale,
                format!(
                    "{what}: timestamp {} s after the request, later than its answer could be",
                    age.saturating_neg()
                ),
            ));
        }
        Ok(())
    }
}

fn check_usage(
    what: &str,
    usage: &BTreeMap<String, String>,
    cpu: u64,
    mem: u64,
) -> Result<(), Failure> {
    let served = |name: &str| {
        usage
            .get(name)
            .ok_or_else(|| fail(Class::Value, format!("{what}: no {name} usage")))
            .and_then(|q| {
                quantity(q).ok_or_else(|| fail(Class::Parse, format!("{what}: {name} {q:?}")))
            })
    };
    let (c, m) = (served("cpu")?, served("memory")?);
    let want = cpu as f64 / 1e9;
    if (c - want).abs() > CPU_TOLERANCE * want {
        return Err(fail(
            Class::Value,
            format!("{what}: cpu {c} cores, simulated {want}"),
        ));
    }
    if (m - mem as f64).abs() > 0.5 {
        return Err(fail(
            Class::Value,
            format!("{what}: memory {m} bytes, simulated {mem}"),
        ));
    }
    Ok(())
}

/// Checks one pod; its `(node, pod)` indices.
fn check_pod(sim: &Sim, p: &PodObject, fresh: Fresh) -> Result<(usize, usize), Failure> {
    let what = format!("pod {}/{}", p.namespace, p.name);
    let Some((node, pod)) = sim.parse_pod(&p.name) else {
        return Err(fail(Class::Incomplete, format!("{what}: not simulated")));
    };
    if p.namespace != Sim::namespace(pod) {
        return Err(fail(Class::Incomplete, format!("{what}: wrong namespace")));
    }
    fresh.check(&what, p.timestamp)?;
    if !p.window_set {
        return Err(fail(Class::Value, format!("{what}: no window")));
    }
    if p.containers.len() != sim.containers {
        return Err(fail(
            Class::Value,
            format!(
                "{what}: {} containers, simulated {}",
                p.containers.len(),
                sim.containers
            ),
        ));
    }
    for (c, (name, usage)) in p.containers.iter().enumerate() {
        let Some(index) = name
            .strip_prefix('c')
            .and_then(|i| i.parse::<usize>().ok())
            .filter(|i| *i < sim.containers && Sim::container(*i) == *name)
        else {
            return Err(fail(
                Class::Value,
                format!("{what}: container {name} (#{c}) not simulated"),
            ));
        };
        check_usage(
            &format!("{what} container {name}"),
            usage,
            Sim::rate(pod, index),
            sim::CONTAINER_MEMORY,
        )?;
    }
    let names: HashSet<&str> = p.containers.iter().map(|(n, _)| n.as_str()).collect();
    if names.len() != p.containers.len() {
        return Err(fail(Class::Value, format!("{what}: a container twice")));
    }
    Ok((node, pod))
}

/// Checks a pod list: every pod valid, each once, exactly `expected` of them, all passing
/// `selected`.
fn check_pods(
    sim: &Sim,
    pods: &[PodObject],
    expected: usize,
    selected: impl Fn(usize) -> bool,
    fresh: Fresh,
) -> Result<(), Failure> {
    let mut seen = HashSet::with_capacity(pods.len());
    for p in pods {
        let (node, pod) = check_pod(sim, p, fresh)?;
        if !selected(pod) {
            return Err(fail(
                Class::Incomplete,
                format!("pod {}/{} listed but not selected", p.namespace, p.name),
            ));
        }
        if !seen.insert((node, pod)) {
            return Err(fail(
                Class::Incomplete,
                format!("pod {}/{} listed twice", p.namespace, p.name),
            ));
        }
    }
    if seen.len() != expected {
        let missing: Vec<String> = (0..sim.nodes)
            .flat_map(|n| (0..sim.pods).map(move |p| (n, p)))
            .filter(|(n, p)| selected(*p) && !seen.contains(&(*n, *p)))
            .take(MISSING_SHOWN)
            .map(|(n, p)| Sim::pod_name(&sim.node(n), p))
            .collect();
        return Err(fail(
            Class::Incomplete,
            format!(
                "{} pods listed, {expected} expected; missing {}",
                seen.len(),
                missing.join(", ")
            ),
        ));
    }
    Ok(())
}

fn check_nodes(sim: &Sim, nodes: &[NodeObject], fresh: Fresh) -> Result<(), Failure> {
    let mut seen = HashSet::with_capacity(nodes.len());
    for n in nodes {
        let what = format!("node {}", n.name);
        let Some(i) = sim.parse_node(&n.name) else {
            return Err(fail(Class::Incomplete, format!("{what}: not simulated")));
        };
        if !seen.insert(i) {
            return Err(fail(Class::Incomplete, format!("{what}: listed twice")));
        }
        fresh.check(&what, n.timestamp)?;
        if !n.window_set {
            return Err(fail(Class::Value, format!("{what}: no window")));
        }
        check_usage(&what, &n.usage, sim::NODE_NANOCORES, sim::NODE_MEMORY)?;
    }
    if seen.len() != sim.nodes {
        let missing: Vec<String> = (0..sim.nodes)
            .filter(|i| !seen.contains(i))
            .take(MISSING_SHOWN)
            .map(|i| sim.node(i))
            .collect();
        return Err(fail(
            Class::Incomplete,
            format!(
                "{} nodes listed, {} expected; missing {}",
                seen.len(),
                sim.nodes,
                missing.join(", ")
            ),
        ));
    }
    Ok(())
}

/// A read to make: its path and how to check the answer.
struct Read {
    kind: Kind,
    format: Format,
    path: String,
    /// For [`Kind::SelectPods`]: the namespace and app indices.
    selector: (usize, usize),
}

impl Read {
    fn new(sim: &Sim, kind: Kind, format: Format, rng: &mut fastrand::Rng) -> Read {
        let (node, pod) = (
            rng.usize(0..sim.nodes.max(1)),
            rng.usize(0..sim.pods.max(1)),
        );
        let (ns, app) = (pod % sim::NAMESPACES, pod % sim::APPS);
        let path = match kind {
            Kind::ListPods => format!("{API}/pods"),
            Kind::ListNodes => format!("{API}/nodes"),
            Kind::SelectPods => format!(
                "{API}/namespaces/{}/pods?labelSelector=app%3D{}",
                Sim::namespace(pod),
                Sim::app(pod)
            ),
            Kind::GetPod => format!(
                "{API}/namespaces/{}/pods/{}",
                Sim::namespace(pod),
                Sim::pod_name(&sim.node(node), pod)
            ),
        };
        Read {
            kind,
            format,
            path,
            selector: (ns, app),
        }
    }

    fn check(&self, sim: &Sim, a: &Answer, fresh: Fresh) -> Result<(), Failure> {
        if a.status != StatusCode::OK {
            let body = String::from_utf8_lossy(&a.body[..a.body.len().min(300)]).into_owned();
            return Err(fail(Class::Status, format!("HTTP {}: {body}", a.status)));
        }
        match self.kind {
            Kind::ListPods => check_pods(
                sim,
                &pod_list(a, self.format)?,
                sim.all_pods(),
                |_| true,
                fresh,
            ),
            Kind::ListNodes => check_nodes(sim, &node_list(a, self.format)?, fresh),
            Kind::SelectPods => {
                let (ns, app) = self.selector;
                check_pods(
                    sim,
                    &pod_list(a, self.format)?,
                    sim.selected(ns, app),
                    |p| p % sim::NAMESPACES == ns && p % sim::APPS == app,
                    fresh,
                )
            }
            Kind::GetPod => check_pod(sim, &pod_one(a, self.format)?, fresh).map(|_| ()),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Statistics.

/// Latencies in log buckets 2 % wide from 1 µs: bounded memory, 2 % resolution.
struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    max_us: u64,
}

const HISTOGRAM_BUCKETS: usize = 1200;
const BUCKET_GROWTH: f64 = 1.02;

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            buckets: vec![0; HISTOGRAM_BUCKETS],
            count: 0,
            max_us: 0,
        }
    }

    fn observe(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
        let i = ((us as f64).ln() / BUCKET_GROWTH.ln()).ceil() as usize;
        if let Some(b) = self.buckets.get_mut(i.min(HISTOGRAM_BUCKETS - 1)) {
            *b += 1;
        }
        self.count += 1;
        self.max_us = self.max_us.max(us);
    }

    /// The q-quantile in milliseconds (the upper bound of its bucket, at most the maximum).
    fn quantile_ms(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let target = (q * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= target {
                let upper = BUCKET_GROWTH.powi(i32::try_from(i).unwrap_or(i32::MAX));
                return Some(upper.min(self.max_us as f64) / 1e3);
            }
        }
        Some(self.max_us as f64 / 1e3)
    }

    fn json(&self, errors: u64) -> Value {
        json!({
            "count": self.count,
            "errors": errors,
            "p50_ms": self.quantile_ms(0.50),
            "p99_ms": self.quantile_ms(0.99),
            "max_ms": self.max_us as f64 / 1e3,
        })
    }
}

struct Done {
    kind: Kind,
    format: Format,
    latency: Duration,
    result: Result<(), Failure>,
}

struct Stats {
    all: Histogram,
    by_kind: BTreeMap<String, (Histogram, u64)>,
    classes: BTreeMap<&'static str, u64>,
    errors: u64,
    first_errors: BTreeMap<&'static str, Vec<String>>,
}

impl Stats {
    fn new() -> Stats {
        Stats {
            all: Histogram::new(),
            by_kind: BTreeMap::new(),
            classes: BTreeMap::new(),
            errors: 0,
            first_errors: BTreeMap::new(),
        }
    }

    fn add(&mut self, d: Done) {
        let key = format!("{}_{}", d.kind.name(), d.format.name());
        let (h, errors) = self
            .by_kind
            .entry(key.clone())
            .or_insert_with(|| (Histogram::new(), 0));
        h.observe(d.latency);
        self.all.observe(d.latency);
        if let Err(f) = d.result {
            *errors += 1;
            self.errors += 1;
            let n = self.classes.entry(f.class.name()).or_default();
            *n += 1;
            if *n <= FIRST_ERRORS as u64 {
                tracing::warn!(read = %key, class = f.class.name(), "{}", f.message);
                self.first_errors
                    .entry(f.class.name())
                    .or_default()
                    .push(format!("{key}: {}", f.message));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The two modes.

/// Reads at `opts.reads_per_sec` until `stop` turns true; the summary (JSON).
pub async fn run(
    opts: Options,
    sim: Sim,
    client: Arc<Client>,
    mut stop: watch::Receiver<bool>,
) -> Result<Value> {
    anyhow::ensure!(
        opts.reads_per_sec > 0.0 && opts.reads_per_sec.is_finite(),
        "--reads-per-sec must be positive"
    );
    let sim = Arc::new(sim);
    let (tx, mut rx) = mpsc::channel::<Done>(1024);
    let collector = tokio::spawn(async move {
        let mut stats = Stats::new();
        while let Some(d) = rx.recv().await {
            stats.add(d);
        }
        stats
    });
    let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / opts.reads_per_sec));
    // A read late because this process waited for the CPU is made at once: the rate holds
    // on average.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut rng = fastrand::Rng::new();
    let started = Instant::now();
    let mut issued = 0u64;
    let mut last_report = Instant::now();
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.context("semaphore closed")?,
            _ = stop.wait_for(|s| *s) => break,
        };
        let (kind, format) = nth(issued);
        issued += 1;
        let read = Read::new(&sim, kind, format, &mut rng);
        let (client, sim, tx, max_age) = (client.clone(), sim.clone(), tx.clone(), opts.max_age);
        tokio::spawn(async move {
            let t0 = Instant::now();
            let fresh = Fresh::asked_at(unix_nanos(), max_age);
            let answer = client.get(&read.path, read.format).await;
            let latency = t0.elapsed();
            let result = match answer {
                Err(e) => Err(fail(Class::Transport, format!("{}: {e:#}", read.path))),
                // Parsing 10 MB lists is CPU work: off the runtime's threads.
                Ok(a) => tokio::task::spawn_blocking(move || {
                    read.check(&sim, &a, fresh)
                        .map_err(|f| fail(f.class, format!("{}: {}", read.path, f.message)))
                })
                .await
                .unwrap_or_else(|e| Err(fail(Class::Parse, format!("check panicked: {e}")))),
            };
            let _ = tx
                .send(Done {
                    kind,
                    format,
                    latency,
                    result,
                })
                .await;
            drop(permit);
        });
        if last_report.elapsed() >= Duration::from_secs(10) {
            last_report = Instant::now();
            eprintln!(
                "reader: {issued} reads issued, {:.1}/s",
                issued as f64 / started.elapsed().as_secs_f64()
            );
        }
    }
    let elapsed = started.elapsed();
    // Let the reads in flight finish (each is bounded by its timeout).
    let _ = tokio::time::timeout(
        REQUEST_TIMEOUT + Duration::from_secs(5),
        permits.acquire_many(u32::try_from(MAX_IN_FLIGHT).unwrap_or(u32::MAX)),
    )
    .await;
    drop(tx);
    let stats = collector.await.context("the statistics task")?;
    let by_kind: serde_json::Map<String, Value> = stats
        .by_kind
        .iter()
        .map(|(k, (h, e))| (k.clone(), h.json(*e)))
        .collect();
    Ok(json!({
        "reads": stats.all.count,
        "issued": issued,
        "errors": stats.errors,
        "target_rps": opts.reads_per_sec,
        "achieved_rps": stats.all.count as f64 / elapsed.as_secs_f64().max(1e-9),
        "seconds": elapsed.as_secs_f64(),
        "p50_ms": stats.all.quantile_ms(0.50),
        "p99_ms": stats.all.quantile_ms(0.99),
        "max_ms": stats.all.max_us as f64 / 1e3,
        "by_kind": by_kind,
        "error_classes": stats.classes,
        "first_errors": stats.first_errors,
    }))
}

/// Polls until every node and pod is served and fresh, or `limit` passes: first the
/// NodeMetrics list alone (small: a fine-grained time), then every PodMetrics (protobuf).
///
/// The JSON says when, in Unix nanoseconds: `first_answer_unix_ns`, the first HTTP answer;
/// `nodes_complete_unix_ns`, the arrival of the first complete NodeMetrics list;
/// `complete_unix_ns`, the arrival of the first complete PodMetrics list (after that: an
/// upper bound, as building and sending 30,000 pods takes a while);
/// `complete_request_unix_ns`, when that list was asked for. Or why not (`last`); and why
/// each poll before failed (`progress`).
pub async fn wait_complete(opts: &Options, sim: &Sim, client: &Client, limit: Duration) -> Value {
    let started = Instant::now();
    let mut polls = 0u64;
    let mut first_answer: Option<u128> = None;
    let mut nodes_complete: Option<u128> = None;
    let mut last = String::from("no answer yet");
    let mut progress = Vec::new();
    while started.elapsed() < limit {
        polls += 1;
        let (kind, format, path) = if nodes_complete.is_none() {
            (Kind::ListNodes, Format::Json, format!("{API}/nodes"))
        } else {
            (Kind::ListPods, Format::Protobuf, format!("{API}/pods"))
        };
        let asked = unix_nanos();
        let fresh = Fresh::asked_at(asked, opts.max_age);
        let result = match client.get(&path, format).await {
            Err(e) => Err(fail(Class::Transport, format!("{e:#}"))),
            Ok(a) => {
                first_answer.get_or_insert_with(unix_nanos);
                let read = Read {
                    kind,
                    format,
                    path,
                    selector: (0, 0),
                };
                read.check(sim, &a, fresh)
            }
        };
        match (result, kind) {
            (Ok(()), Kind::ListNodes) => {
                nodes_complete = Some(unix_nanos());
                continue;
            }
            (Ok(()), _) => {
                let text = |t: Option<u128>| t.map(|t| t.to_string());
                return json!({
                    "complete": true,
                    "complete_unix_ns": unix_nanos().to_string(),
                    "complete_request_unix_ns": asked.to_string(),
                    "nodes_complete_unix_ns": text(nodes_complete),
                    "first_answer_unix_ns": text(first_answer),
                    "polls": polls,
                    "waited_ms": started.elapsed().as_secs_f64() * 1e3,
                    "progress": progress,
                });
            }
            (Err(f), _) => {
                last = format!("{}: {}", f.class.name(), f.message);
                if progress.len() < PROGRESS_KEPT {
                    progress.push(json!([
                        started.elapsed().as_millis(),
                        last.chars().take(160).collect::<String>()
                    ]));
                }
            }
        }
        tokio::time::sleep(POLL_PAUSE).await;
    }
    json!({"complete": false, "polls": polls, "last": last, "progress": progress})
}

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_is_counted_from_the_request() {
        let fresh = Fresh {
            asked_secs: 1_000,
            max_age: Duration::from_secs(5),
        };
        // 6 s before the request: the whole-second slack; 7 s: stale, however long the
        // answer then took.
        assert!(fresh.check("pod", Some(994)).is_ok());
        let stale = fresh
            .check("pod", Some(993))
            .expect_err("7 s before the request");
        assert_eq!(stale.class.name(), "stale");
        assert!(
            stale.message.contains("7 s before the request"),
            "{}",
            stale.message
        );
        // Newer than the request: sampled while the answer was built, up to its timeout.
        assert!(fresh.check("pod", Some(1_000 + 12)).is_ok());
        let future = fresh
            .check("pod", Some(1_000 + 13))
            .expect_err("13 s after");
        assert!(
            future.message.contains("13 s after the request"),
            "{}",
            future.message
        );
        assert_eq!(
            fresh
                .check("pod", None)
                .expect_err("no timestamp")
                .class
                .name(),
            "value"
        );
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity("250m"), Some(0.25));
        assert_eq!(quantity("64Mi"), Some(67_108_864.0));
        assert_eq!(quantity("8Gi"), Some(8.0 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(quantity("1"), Some(1.0));
        let n = quantity("123456789n").expect("nanocores");
        assert!((n - 0.123_456_789).abs() < 1e-15, "{n}");
        assert_eq!(quantity("x"), None);
    }

    #[test]
    fn the_mix_has_every_kind_in_both_formats() {
        let mut counts = BTreeMap::new();
        for i in 0..2 * CYCLE {
            let (k, f) = nth(i);
            *counts.entry((k.name(), f.name())).or_insert(0) += 1;
        }
        assert_eq!(counts[&("list_pods", "json")], 1);
        assert_eq!(counts[&("list_pods", "protobuf")], 1);
        assert_eq!(
            counts[&("list_nodes", "json")] + counts[&("list_nodes", "protobuf")],
            10
        );
        assert_eq!(
            counts[&("select_pods", "json")],
            counts[&("select_pods", "protobuf")]
        );
        assert_eq!(
            counts[&("get_pod", "json")],
            counts[&("get_pod", "protobuf")]
        );
        assert_eq!(counts.values().sum::<i32>(), 100);
    }

    #[test]
    fn histogram_quantiles() {
        let mut h = Histogram::new();
        for ms in 1..=100u64 {
            h.observe(Duration::from_millis(ms));
        }
        let p50 = h.quantile_ms(0.5).expect("p50");
        assert!((49.0..=51.5).contains(&p50), "{p50}");
        assert_eq!(h.quantile_ms(1.0), Some(100.0));
    }
}
