//! `metrics.k8s.io` objects and the errors only this API sends, serialized byte-for-byte the way
//! metrics-server (through `k8s.io/apiserver` and Go's `encoding/json`) writes them.
//!
//! # What metrics-server puts on the wire
//!
//! * Objects (`k8s.io/metrics` `pkg/apis/metrics/v1beta1/types.go`): `kind`, `apiVersion`
//!   (inline `TypeMeta`, both `omitempty`), `metadata`, `timestamp`, `window`, then `usage`
//!   (nodes) or `containers` (pods); containers are `name`, `usage`. `usage` is a
//!   `ResourceList` map, which Go writes with sorted keys; metrics-server fills exactly `cpu`
//!   and `memory` (`pkg/storage/types.go`, `resourceUsage`).
//! * Metadata (`pkg/storage/node.go`, `pkg/storage/pod.go`, `GetMetrics`): `name`, `namespace`
//!   (pods only), the node's or pod's `labels`, and `creationTimestamp` = `time.Now()` at
//!   read time. Nothing else: no uid, no resourceVersion. Go writes `ObjectMeta` fields in
//!   declaration order (`name`, `namespace`, `creationTimestamp`, `labels`, …), not the
//!   alphabetical order `k8s_openapi` uses, so this module serializes metadata itself.
//! * Lists: `{"kind":…,"apiVersion":…,"metadata":{},"items":[…]}`; items carry no `kind` or
//!   `apiVersion`; an empty list has `"items":[]` (apiserver `transformResponseObject`).
//!   metrics-server sorts nodes by name and pods by namespace, then name (`pkg/api/node.go`,
//!   `pkg/api/pod.go`); containers come in Go map order, i.e. unspecified.
//! * Bodies are written by `json.Encoder.Encode` (compact, trailing `\n`: [`encode_json`]) or,
//!   for `?pretty=true`, a `pretty=1` media-type parameter, or a `curl`, `Wget` or
//!   `Mozilla/5.0` user agent (apiserver `negotiation.isPrettyPrint`), by
//!   `json.MarshalIndent(v, "", "  ")` (no trailing newline:
//!   [`crate::json::encode_json_pretty`]). Both escape `<`, `>`, `&`, U+2028 and U+2029 as
//!   `\u003c`-style sequences, like Go ([`crate::json`]).
//! * Versions: upstream metrics-server serves only `v1beta1` (`pkg/api/install.go`, `Build`;
//!   `k8s.io/metrics` defines no `v1`). [`MetricsVersion::V1`] has the same shapes with
//!   `apiVersion: metrics.k8s.io/v1`, for kpulse's own use.
//!
//! Serialization only: these types do not implement `Deserialize`.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use k8s_openapi::jiff;
use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Serialize, Serializer};

use crate::go;
use crate::json::{encode_json, GoListMeta, GoObjectMeta, GoTime};
use crate::quantity::{self, Quantity};
use crate::status::Status;

/// The API group metrics-server serves.
pub const GROUP: &str = "metrics.k8s.io";

/// A version of the `metrics.k8s.io` group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MetricsVersion {
    /// `metrics.k8s.io/v1beta1`: the only version upstream metrics-server serves.
    #[default]
    V1beta1,
    /// `metrics.k8s.io/v1`: same shapes, different `apiVersion`.
    V1,
}

impl MetricsVersion {
    /// The bare version, as in URLs: `"v1beta1"` or `"v1"`.
    pub fn version(self) -> &'static str {
        match self {
            Self::V1beta1 => "v1beta1",
            Self::V1 => "v1",
        }
    }

    /// The `apiVersion` field: `"metrics.k8s.io/v1beta1"` or `"metrics.k8s.io/v1"`.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::V1beta1 => "metrics.k8s.io/v1beta1",
            Self::V1 => "metrics.k8s.io/v1",
        }
    }

    /// Parses a bare version (`"v1beta1"`, `"v1"`).
    pub fn from_version(version: &str) -> Option<Self> {
        match version {
            "v1beta1" => Some(Self::V1beta1),
            "v1" => Some(Self::V1),
            _ => None,
        }
    }
}

/// Go's `metav1.TypeMeta`: `kind` then `apiVersion`, each left out when empty.
///
/// Top-level objects carry it; list items do not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TypeMeta {
    /// `kind`, e.g. `"NodeMetrics"`.
    pub kind: String,
    /// `apiVersion`, e.g. `"metrics.k8s.io/v1beta1"`.
    pub api_version: String,
}

impl TypeMeta {
    /// `kind` and `apiVersion` for a kind of the metrics group.
    pub fn metrics(kind: &str, version: MetricsVersion) -> Self {
        Self {
            kind: kind.to_owned(),
            api_version: version.api_version().to_owned(),
        }
    }

    fn serialize_into<S: SerializeStruct>(&self, state: &mut S) -> Result<(), S::Error> {
        if !self.kind.is_empty() {
            state.serialize_field("kind", &self.kind)?;
        }
        if !self.api_version.is_empty() {
            state.serialize_field("apiVersion", &self.api_version)?;
        }
        Ok(())
    }
}

/// A `ResourceList` as metrics-server fills it, CPU and memory, plus `swap` on nodes with
/// swap (kubelet's `/metrics/resource` figures, which `kubectl top --show-swap` reads):
/// written as `{"cpu":…,"memory":…[,"swap":…]}` (Go sorts map keys).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU usage (`DecimalSI`, nanocore scale).
    pub cpu: Quantity,
    /// Memory working set (`BinarySI`).
    pub memory: Quantity,
    /// Swap in use (`BinarySI`); `None` (no key) where the node has no swap.
    pub swap: Option<Quantity>,
}

impl Usage {
    /// Usage from a CPU rate in nanocores and a working set in bytes.
    pub fn new(cpu_nanocores: u64, memory_bytes: u64) -> Self {
        Self {
            cpu: Quantity::from_cpu_nanocores(cpu_nanocores),
            memory: Quantity::from_memory_bytes(memory_bytes),
            swap: None,
        }
    }

    /// The same usage with swap, in bytes (`None`: no `swap` key).
    pub fn with_swap(self, swap_bytes: Option<u64>) -> Self {
        Self {
            swap: swap_bytes.map(Quantity::from_memory_bytes),
            ..self
        }
    }

    /// `(resource name, quantity)` pairs in Go's map order (sorted by name).
    pub fn entries(&self) -> impl Iterator<Item = (&'static str, Quantity)> {
        [("cpu", self.cpu), ("memory", self.memory)]
            .into_iter()
            .chain(self.swap.map(|q| ("swap", q)))
    }
}

impl Serialize for Usage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2 + usize::from(self.swap.is_some())))?;
        for (name, value) in self.entries() {
            map.serialize_entry(name, &value)?;
        }
        map.end()
    }
}

/// `NodeMetrics`: one node's usage over `[timestamp - window, timestamp]`.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeMetrics {
    /// Set (see [`NodeMetrics::versioned`]) when the object is a response by itself; left
    /// empty inside a list.
    pub type_meta: TypeMeta,
    /// `name`, `labels`, `creationTimestamp`, in metrics-server's case.
    pub metadata: ObjectMeta,
    /// End of the measurement window (`metav1.Time`, whole seconds on the wire).
    pub timestamp: SystemTime,
    /// Length of the measurement window (`metav1.Duration`).
    pub window: Duration,
    /// CPU and memory usage.
    pub usage: Usage,
}

impl NodeMetrics {
    /// The object metrics-server builds for a node (`pkg/storage/node.go`). `created`
    /// becomes `creationTimestamp`; metrics-server uses the time of the request.
    pub fn new(
        name: impl Into<String>,
        labels: BTreeMap<String, String>,
        created: SystemTime,
        timestamp: SystemTime,
        window: Duration,
        cpu_nanocores: u64,
        memory_bytes: u64,
    ) -> Self {
        Self {
            type_meta: TypeMeta::default(),
            metadata: object_meta(name.into(), None, labels, created),
            timestamp,
            window,
            usage: Usage::new(cpu_nanocores, memory_bytes),
        }
    }

    /// The same object with the node's swap, in bytes (`None`: no `swap` key).
    pub fn with_swap(mut self, swap_bytes: Option<u64>) -> Self {
        self.usage = self.usage.with_swap(swap_bytes);
        self
    }

    /// Sets `kind: NodeMetrics` and the `apiVersion`, as for a single-object `GET`.
    pub fn versioned(mut self, version: MetricsVersion) -> Self {
        self.type_meta = TypeMeta::metrics("NodeMetrics", version);
        self
    }
}

impl Serialize for NodeMetrics {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut state = serializer.serialize_struct("NodeMetrics", 6)?;
        self.type_meta.serialize_into(&mut state)?;
        state.serialize_field("metadata", &GoObjectMeta(&self.metadata))?;
        state.serialize_field("timestamp", &GoTime(self.timestamp))?;
        state.serialize_field("window", &go::format_duration(go::nanos(self.window)))?;
        state.serialize_field("usage", &self.usage)?;
        state.end()
    }
}

/// `NodeMetricsList`.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeMetricsList {
    /// `kind: NodeMetricsList` and the `apiVersion`.
    pub type_meta: TypeMeta,
    /// List metadata; metrics-server leaves it empty (`"metadata":{}`).
    pub metadata: ListMeta,
    /// The nodes, sorted by name in metrics-server.
    pub items: Vec<NodeMetrics>,
}

impl NodeMetricsList {
    /// A list response. Clears the items' [`TypeMeta`], as Go lists carry none per item.
    pub fn new(version: MetricsVersion, mut items: Vec<NodeMetrics>) -> Self {
        for item in &mut items {
            item.type_meta = TypeMeta::default();
        }
        Self {
            type_meta: TypeMeta::metrics("NodeMetricsList", version),
            metadata: ListMeta::default(),
            items,
        }
    }
}

impl Serialize for NodeMetricsList {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut state = serializer.serialize_struct("NodeMetricsList", 4)?;
        self.type_meta.serialize_into(&mut state)?;
        state.serialize_field("metadata", &GoListMeta(&self.metadata))?;
        state.serialize_field("items", &self.items)?;
        state.end()
    }
}

/// `ContainerMetrics`: one container's usage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ContainerMetrics {
    /// The container's name in the pod spec.
    pub name: String,
    /// CPU and memory usage.
    pub usage: Usage,
}

impl ContainerMetrics {
    /// A container's usage from a CPU rate in nanocores and a working set in bytes.
    pub fn new(name: impl Into<String>, cpu_nanocores: u64, memory_bytes: u64) -> Self {
        Self {
            name: name.into(),
            usage: Usage::new(cpu_nanocores, memory_bytes),
        }
    }

    /// The same container with its swap, in bytes (`None`: no `swap` key).
    pub fn with_swap(mut self, swap_bytes: Option<u64>) -> Self {
        self.usage = self.usage.with_swap(swap_bytes);
        self
    }
}

/// `PodMetrics`: one pod's per-container usage over `[timestamp - window, timestamp]`.
#[derive(Clone, Debug, PartialEq)]
pub struct PodMetrics {
    /// Set (see [`PodMetrics::versioned`]) when the object is a response by itself; left
    /// empty inside a list.
    pub type_meta: TypeMeta,
    /// `name`, `namespace`, `labels`, `creationTimestamp`, in metrics-server's case.
    pub metadata: ObjectMeta,
    /// End of the window (metrics-server: the earliest of the containers' timestamps).
    pub timestamp: SystemTime,
    /// Length of the window (metrics-server: that same container's window).
    pub window: Duration,
    /// Per-container usage; `[]` when empty, never `null`.
    pub containers: Vec<ContainerMetrics>,
}

impl PodMetrics {
    /// The object metrics-server builds for a pod (`pkg/storage/pod.go`). `created`
    /// becomes `creationTimestamp`; metrics-server uses the time of the request.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        labels: BTreeMap<String, String>,
        created: SystemTime,
        timestamp: SystemTime,
        window: Duration,
        containers: Vec<ContainerMetrics>,
    ) -> Self {
        Self {
            type_meta: TypeMeta::default(),
            metadata: object_meta(name.into(), Some(namespace.into()), labels, created),
            timestamp,
            window,
            containers,
        }
    }

    /// Sets `kind: PodMetrics` and the `apiVersion`, as for a single-object `GET`.
    pub fn versioned(mut self, version: MetricsVersion) -> Self {
        self.type_meta = TypeMeta::metrics("PodMetrics", version);
        self
    }
}

impl Serialize for PodMetrics {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut state = serializer.serialize_struct("PodMetrics", 6)?;
        self.type_meta.serialize_into(&mut state)?;
        state.serialize_field("metadata", &GoObjectMeta(&self.metadata))?;
        state.serialize_field("timestamp", &GoTime(self.timestamp))?;
        state.serialize_field("window", &go::format_duration(go::nanos(self.window)))?;
        state.serialize_field("containers", &self.containers)?;
        state.end()
    }
}

/// `PodMetricsList`.
#[derive(Clone, Debug, PartialEq)]
pub struct PodMetricsList {
    /// `kind: PodMetricsList` and the `apiVersion`.
    pub type_meta: TypeMeta,
    /// List metadata; metrics-server leaves it empty (`"metadata":{}`).
    pub metadata: ListMeta,
    /// The pods, sorted by namespace then name in metrics-server.
    pub items: Vec<PodMetrics>,
}

impl PodMetricsList {
    /// A list response. Clears the items' [`TypeMeta`], as Go lists carry none per item.
    pub fn new(version: MetricsVersion, mut items: Vec<PodMetrics>) -> Self {
        for item in &mut items {
            item.type_meta = TypeMeta::default();
        }
        Self {
            type_meta: TypeMeta::metrics("PodMetricsList", version),
            metadata: ListMeta::default(),
            items,
        }
    }
}

impl Serialize for PodMetricsList {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut state = serializer.serialize_struct("PodMetricsList", 4)?;
        self.type_meta.serialize_into(&mut state)?;
        state.serialize_field("metadata", &GoListMeta(&self.metadata))?;
        state.serialize_field("items", &self.items)?;
        state.end()
    }
}

fn object_meta(
    name: String,
    namespace: Option<String>,
    labels: BTreeMap<String, String>,
    created: SystemTime,
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace,
        labels: (!labels.is_empty()).then_some(labels),
        creation_timestamp: Some(meta::Time(to_jiff(created))),
        ..ObjectMeta::default()
    }
}

/// `SystemTime` → `jiff::Timestamp`, clamped to jiff's range (years -9999 to 9999).
pub fn to_jiff(time: SystemTime) -> jiff::Timestamp {
    let (seconds, nanos) = quantity::unix_parts(time);
    let nanos = i32::try_from(nanos).unwrap_or(0);
    match jiff::Timestamp::new(seconds, nanos) {
        Ok(timestamp) => timestamp,
        Err(_) if seconds < 0 => jiff::Timestamp::MIN,
        Err(_) => jiff::Timestamp::MAX,
    }
}

// ---------------------------------------------------------------------------------------------
// The errors only the metrics API sends.

impl Status {
    /// metrics-server's answer when a node exists but has no metrics (`pkg/api/node.go`):
    /// `nodemetrics.metrics.k8s.io "<name>" not found`.
    pub fn node_metrics_not_found(name: &str) -> Self {
        Self::not_found(GROUP, "nodemetrics", name)
    }

    /// metrics-server's answer when a pod exists but has no metrics (`pkg/api/pod.go`):
    /// `podmetrics.metrics.k8s.io "<namespace>/<name>" not found`.
    pub fn pod_metrics_not_found(namespace: &str, name: &str) -> Self {
        Self::not_found(GROUP, "podmetrics", &format!("{namespace}/{name}"))
    }

    /// metrics-server's answer when the node is not in its informer cache: the client-go
    /// node lister's error, passed through (`node "<name>" not found`, kind `node`).
    pub fn node_not_found(name: &str) -> Self {
        Self::not_found("", "node", name)
    }

    /// metrics-server's answer when the pod is not in its (running-pods) metadata cache: the
    /// client-go metadata lister's error, passed through (`pods "<name>" not found`, kind
    /// `pods`; the namespace is not mentioned).
    pub fn pod_not_found(name: &str) -> Self {
        Self::not_found("", "pods", name)
    }

    /// The body for a `?includeObject=` value Table conversion rejects
    /// (`apiserver` `optionsForTransform`, `ValidateTableOptions`).
    pub fn invalid_include_object(value: &str) -> Self {
        // Go formats the value with json.Marshal (the policy type is not a plain string).
        let value = encode_json(value)
            .ok()
            .and_then(|mut bytes| {
                bytes.pop();
                String::from_utf8(bytes).ok()
            })
            .unwrap_or_else(|| go::quote(value));
        Self::bad_request(format!(
            "Unable to convert to Table as requested: includeObject: Invalid value: {value}: \
             must be 'Metadata', 'Object', 'None', or empty"
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;
    use crate::json::{encode_json_pretty, jiff_parts};

    const MI: u64 = 1 << 20;

    /// 2023-11-14T22:13:20Z plus some nanoseconds (which the wire drops).
    fn ts() -> SystemTime {
        UNIX_EPOCH + Duration::new(1_700_000_000, 987_654_321)
    }

    fn created() -> SystemTime {
        UNIX_EPOCH + Duration::new(1_700_000_042, 5)
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn json<T: Serialize + ?Sized>(value: &T) -> String {
        match encode_json(value) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => text,
                Err(err) => panic!("not UTF-8: {err}"),
            },
            Err(err) => panic!("encode failed: {err}"),
        }
    }

    fn pretty<T: Serialize + ?Sized>(value: &T) -> String {
        match encode_json_pretty(value) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => text,
                Err(err) => panic!("not UTF-8: {err}"),
            },
            Err(err) => panic!("encode failed: {err}"),
        }
    }

    fn node1() -> NodeMetrics {
        NodeMetrics::new(
            "node1",
            labels(&[
                ("kubernetes.io/os", "linux"),
                ("beta.kubernetes.io/arch", "amd64"),
                ("kubernetes.io/hostname", "node1"),
            ]),
            created(),
            ts(),
            Duration::from_millis(20_051),
            123_456_789,
            1_536 * MI,
        )
    }

    fn pod1() -> PodMetrics {
        PodMetrics::new(
            "kube-system",
            "coredns-5d78c9869d-abcde",
            labels(&[("k8s-app", "kube-dns"), ("pod-template-hash", "5d78c9869d")]),
            created(),
            ts(),
            Duration::from_secs(15),
            vec![
                ContainerMetrics::new("coredns", 1_500_000, 12_345_678),
                ContainerMetrics::new("sidecar", 0, 1_000),
            ],
        )
    }

    #[test]
    fn node_metrics_get_v1beta1() {
        let want = concat!(
            r#"{"kind":"NodeMetrics","apiVersion":"metrics.k8s.io/v1beta1","#,
            r#""metadata":{"name":"node1","creationTimestamp":"2023-11-14T22:14:02Z","#,
            r#""labels":{"beta.kubernetes.io/arch":"amd64","kubernetes.io/hostname":"node1","#,
            r#""kubernetes.io/os":"linux"}},"#,
            r#""timestamp":"2023-11-14T22:13:20Z","window":"20.051s","#,
            r#""usage":{"cpu":"123456789n","memory":"1536Mi"}}"#,
            "\n"
        );
        assert_eq!(json(&node1().versioned(MetricsVersion::V1beta1)), want);
    }

    #[test]
    fn node_metrics_get_v1_differs_only_in_api_version() {
        let v1 = json(&node1().versioned(MetricsVersion::V1));
        let v1beta1 = json(&node1().versioned(MetricsVersion::V1beta1));
        assert!(v1.starts_with(r#"{"kind":"NodeMetrics","apiVersion":"metrics.k8s.io/v1","#));
        assert_eq!(
            v1.replace("metrics.k8s.io/v1\"", "metrics.k8s.io/v1beta1\""),
            v1beta1
        );
    }

    #[test]
    fn node_metrics_without_labels_omits_them() {
        let node = NodeMetrics::new(
            "n",
            BTreeMap::new(),
            created(),
            ts(),
            Duration::from_secs(10),
            0,
            0,
        );
        assert_eq!(
            json(&node),
            concat!(
                r#"{"metadata":{"name":"n","creationTimestamp":"2023-11-14T22:14:02Z"},"#,
                r#""timestamp":"2023-11-14T22:13:20Z","window":"10s","#,
                r#""usage":{"cpu":"0","memory":"0"}}"#,
                "\n"
            )
        );
    }

    #[test]
    fn node_metrics_list_v1beta1() {
        let second = NodeMetrics::new(
            "node2",
            labels(&[("role", "worker")]),
            created(),
            ts(),
            Duration::from_millis(60_500),
            2_000_000_000,
            1_000,
        )
        .versioned(MetricsVersion::V1beta1);
        let list = NodeMetricsList::new(MetricsVersion::V1beta1, vec![node1(), second]);
        let want = concat!(
            r#"{"kind":"NodeMetricsList","apiVersion":"metrics.k8s.io/v1beta1","metadata":{},"#,
            r#""items":["#,
            r#"{"metadata":{"name":"node1","creationTimestamp":"2023-11-14T22:14:02Z","#,
            r#""labels":{"beta.kubernetes.io/arch":"amd64","kubernetes.io/hostname":"node1","#,
            r#""kubernetes.io/os":"linux"}},"#,
            r#""timestamp":"2023-11-14T22:13:20Z","window":"20.051s","#,
            r#""usage":{"cpu":"123456789n","memory":"1536Mi"}},"#,
            r#"{"metadata":{"name":"node2","creationTimestamp":"2023-11-14T22:14:02Z","#,
            r#""labels":{"role":"worker"}},"#,
            r#""timestamp":"2023-11-14T22:13:20Z","window":"1m0.5s","#,
            r#""usage":{"cpu":"2","memory":"1k"}}"#,
            r#"]}"#,
            "\n"
        );
        assert_eq!(json(&list), want);
    }

    #[test]
    fn empty_lists_have_empty_items() {
        assert_eq!(
            json(&NodeMetricsList::new(MetricsVersion::V1beta1, Vec::new())),
            "{\"kind\":\"NodeMetricsList\",\"apiVersion\":\"metrics.k8s.io/v1beta1\",\"metadata\":{},\"items\":[]}\n"
        );
        assert_eq!(
            json(&PodMetricsList::new(MetricsVersion::V1, Vec::new())),
            "{\"kind\":\"PodMetricsList\",\"apiVersion\":\"metrics.k8s.io/v1\",\"metadata\":{},\"items\":[]}\n"
        );
    }

    #[test]
    fn pod_metrics_get_v1beta1() {
        let want = concat!(
            r#"{"kind":"PodMetrics","apiVersion":"metrics.k8s.io/v1beta1","#,
            r#""metadata":{"name":"coredns-5d78c9869d-abcde","namespace":"kube-system","#,
            r#""creationTimestamp":"2023-11-14T22:14:02Z","#,
            r#""labels":{"k8s-app":"kube-dns","pod-template-hash":"5d78c9869d"}},"#,
            r#""timestamp":"2023-11-14T22:13:20Z","window":"15s","#,
            r#""containers":["#,
            r#"{"name":"coredns","usage":{"cpu":"1500u","memory":"12345678"}},"#,
            r#"{"name":"sidecar","usage":{"cpu":"0","memory":"1k"}}"#,
            r#"]}"#,
            "\n"
        );
        assert_eq!(json(&pod1().versioned(MetricsVersion::V1beta1)), want);
    }

    #[test]
    fn pod_metrics_list_v1_with_no_containers() {
        let empty = PodMetrics::new(
            "default",
            "idle",
            BTreeMap::new(),
            created(),
            ts(),
            Duration::ZERO,
            Vec::new(),
        );
        let list = PodMetricsList::new(MetricsVersion::V1, vec![empty]);
        assert_eq!(
            json(&list),
            concat!(
                r#"{"kind":"PodMetricsList","apiVersion":"metrics.k8s.io/v1","metadata":{},"#,
                r#""items":[{"metadata":{"name":"idle","namespace":"default","#,
                r#""creationTimestamp":"2023-11-14T22:14:02Z"},"#,
                r#""timestamp":"2023-11-14T22:13:20Z","window":"0s","containers":[]}]}"#,
                "\n"
            )
        );
    }

    #[test]
    fn pretty_matches_go_marshal_indent() {
        let want = r#"{
  "kind": "PodMetrics",
  "apiVersion": "metrics.k8s.io/v1beta1",
  "metadata": {
    "name": "coredns-5d78c9869d-abcde",
    "namespace": "kube-system",
    "creationTimestamp": "2023-11-14T22:14:02Z",
    "labels": {
      "k8s-app": "kube-dns",
      "pod-template-hash": "5d78c9869d"
    }
  },
  "timestamp": "2023-11-14T22:13:20Z",
  "window": "15s",
  "containers": [
    {
      "name": "coredns",
      "usage": {
        "cpu": "1500u",
        "memory": "12345678"
      }
    },
    {
      "name": "sidecar",
      "usage": {
        "cpu": "0",
        "memory": "1k"
      }
    }
  ]
}"#;
        assert_eq!(pretty(&pod1().versioned(MetricsVersion::V1beta1)), want);
        let list = pretty(&NodeMetricsList::new(MetricsVersion::V1beta1, Vec::new()));
        assert_eq!(
            list,
            "{\n  \"kind\": \"NodeMetricsList\",\n  \"apiVersion\": \"metrics.k8s.io/v1beta1\",\n  \"metadata\": {},\n  \"items\": []\n}"
        );
    }

    #[test]
    fn go_zero_timestamp_is_null() {
        let zero = UNIX_EPOCH - Duration::from_secs(62_135_596_800);
        let mut node = NodeMetrics::new("n", BTreeMap::new(), zero, zero, Duration::ZERO, 1, 1);
        node.metadata.creation_timestamp = Some(meta::Time(to_jiff(zero)));
        // creationTimestamp is omitzero; timestamp is not.
        assert_eq!(
            json(&node),
            "{\"metadata\":{\"name\":\"n\"},\"timestamp\":null,\"window\":\"0s\",\"usage\":{\"cpu\":\"1n\",\"memory\":\"1\"}}\n"
        );
    }

    #[test]
    fn object_meta_uses_go_field_order_and_omitempty() {
        let mut m = ObjectMeta {
            name: Some("x".into()),
            generate_name: Some(String::new()),
            namespace: Some("ns".into()),
            uid: Some("u-1".into()),
            resource_version: Some("42".into()),
            generation: Some(0),
            creation_timestamp: Some(meta::Time(to_jiff(ts()))),
            deletion_timestamp: Some(meta::Time(to_jiff(created()))),
            deletion_grace_period_seconds: Some(0),
            labels: Some(BTreeMap::new()),
            annotations: Some(labels(&[("a", "<b>&")])),
            owner_references: Some(vec![meta::OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "rs".into(),
                uid: "u-2".into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            finalizers: Some(vec!["f".into()]),
            ..ObjectMeta::default()
        };
        assert_eq!(
            json(&GoObjectMeta(&m)),
            concat!(
                r#"{"name":"x","namespace":"ns","uid":"u-1","resourceVersion":"42","#,
                r#""creationTimestamp":"2023-11-14T22:13:20Z","#,
                r#""deletionTimestamp":"2023-11-14T22:14:02Z","deletionGracePeriodSeconds":0,"#,
                r#""annotations":{"a":"\u003cb\u003e\u0026"},"#,
                r#""ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"rs","#,
                r#""uid":"u-2","controller":true}],"finalizers":["f"]}"#,
                "\n"
            )
        );
        m = ObjectMeta::default();
        assert_eq!(json(&GoObjectMeta(&m)), "{}\n");
    }

    #[test]
    fn jiff_clamps_and_floors() {
        let before = UNIX_EPOCH - Duration::new(1, 500_000_000);
        assert_eq!(jiff_parts(to_jiff(before)), (-2, 500_000_000));
        let far = UNIX_EPOCH + Duration::from_secs(400_000_000_000);
        assert_eq!(to_jiff(far), jiff::Timestamp::MAX);
    }

    #[test]
    fn go_string_escaping() {
        let text = "a<b>&c\u{2028}\u{2029}\"\\/\u{08}\u{0c}\n\r\t\u{01}\u{1f}\u{7f}µ";
        assert_eq!(
            json(text),
            "\"a\\u003cb\\u003e\\u0026c\\u2028\\u2029\\\"\\\\/\\b\\f\\n\\r\\t\\u0001\\u001f\u{7f}µ\"\n"
        );
        let mut keyed = BTreeMap::new();
        keyed.insert("<k>", 1);
        assert_eq!(json(&keyed), "{\"\\u003ck\\u003e\":1}\n");
    }

    #[test]
    fn status_not_found_for_pod_metrics() {
        let status = Status::pod_metrics_not_found("default", "web-0");
        assert_eq!(status.code(), 404);
        assert_eq!(
            json(&status),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"podmetrics.metrics.k8s.io \"default/web-0\" not found","#,
                r#""reason":"NotFound","#,
                r#""details":{"name":"default/web-0","group":"metrics.k8s.io","kind":"podmetrics"},"#,
                r#""code":404}"#,
                "\n"
            )
        );
    }

    #[test]
    fn status_not_found_for_node_metrics_and_listers() {
        assert_eq!(
            json(&Status::node_metrics_not_found("node1")),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"nodemetrics.metrics.k8s.io \"node1\" not found","#,
                r#""reason":"NotFound","#,
                r#""details":{"name":"node1","group":"metrics.k8s.io","kind":"nodemetrics"},"#,
                r#""code":404}"#,
                "\n"
            )
        );
        assert_eq!(
            json(&Status::node_not_found("ghost")),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"node \"ghost\" not found","reason":"NotFound","#,
                r#""details":{"name":"ghost","kind":"node"},"code":404}"#,
                "\n"
            )
        );
        assert_eq!(
            json(&Status::pod_not_found("web-9")),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"pods \"web-9\" not found","reason":"NotFound","#,
                r#""details":{"name":"web-9","kind":"pods"},"code":404}"#,
                "\n"
            )
        );
        // Odd names are %q-quoted, then JSON-escaped the Go way.
        assert_eq!(
            Status::node_not_found("a\"b<c\u{1}").0.message.as_deref(),
            Some("node \"a\\\"b<c\\x01\" not found")
        );
        assert!(json(&Status::node_not_found("a<b")).contains(r#"node \"a\u003cb\" not found"#));
    }

    #[test]
    fn status_invalid_include_object() {
        assert_eq!(
            Status::invalid_include_object("Everything")
                .0
                .message
                .as_deref(),
            Some(
                "Unable to convert to Table as requested: includeObject: Invalid value: \
                 \"Everything\": must be 'Metadata', 'Object', 'None', or empty"
            )
        );
        // The bad value is JSON-encoded (Go's json.Marshal), HTML escapes included.
        assert_eq!(
            Status::invalid_include_object("<x>").0.message.as_deref(),
            Some(
                "Unable to convert to Table as requested: includeObject: Invalid value: \
                 \"\\u003cx\\u003e\": must be 'Metadata', 'Object', 'None', or empty"
            )
        );
    }

    #[test]
    fn metrics_version_strings() {
        assert_eq!(
            MetricsVersion::from_version("v1beta1"),
            Some(MetricsVersion::V1beta1)
        );
        assert_eq!(MetricsVersion::from_version("v1"), Some(MetricsVersion::V1));
        assert_eq!(MetricsVersion::from_version("v2"), None);
        assert_eq!(MetricsVersion::V1.version(), "v1");
        assert_eq!(
            MetricsVersion::V1beta1.api_version(),
            "metrics.k8s.io/v1beta1"
        );
        assert_eq!(MetricsVersion::default(), MetricsVersion::V1beta1);
    }

    #[test]
    fn usage_entries_are_sorted() {
        let usage = Usage::new(1, 2);
        let names: Vec<_> = usage.entries().map(|(name, _)| name).collect();
        assert_eq!(names, ["cpu", "memory"]);
        let names: Vec<_> = usage
            .with_swap(Some(0))
            .entries()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(names, ["cpu", "memory", "swap"]);
    }
}
