//! `metrics.k8s.io` objects and `metav1.Status` error bodies, serialized byte-for-byte the way
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
//!   `json.MarshalIndent(v, "", "  ")` (no trailing newline: [`encode_json_pretty`]). Both
//!   escape `<`, `>`, `&`, U+2028 and U+2029 as `\u003c`-style sequences, like Go.
//! * Versions: upstream metrics-server serves only `v1beta1` (`pkg/api/install.go`, `Build`;
//!   `k8s.io/metrics` defines no `v1`). [`MetricsVersion::V1`] has the same shapes with
//!   `apiVersion: metrics.k8s.io/v1`, for kpulse's own use.
//!
//! Serialization only: these types do not implement `Deserialize`.

use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use k8s_openapi::jiff;
use serde::ser::{SerializeMap, SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};

use crate::quantity::{self, Quantity};

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

/// A `ResourceList` as metrics-server fills it: CPU and memory, written as
/// `{"cpu":…,"memory":…}` (Go sorts map keys).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU usage (`DecimalSI`, nanocore scale).
    pub cpu: Quantity,
    /// Memory working set (`BinarySI`).
    pub memory: Quantity,
}

impl Usage {
    /// Usage from a CPU rate in nanocores and a working set in bytes.
    pub fn new(cpu_nanocores: u64, memory_bytes: u64) -> Self {
        Self {
            cpu: Quantity::from_cpu_nanocores(cpu_nanocores),
            memory: Quantity::from_memory_bytes(memory_bytes),
        }
    }

    /// `(resource name, quantity)` pairs in Go's map order (sorted by name).
    pub fn entries(&self) -> [(&'static str, Quantity); 2] {
        [("cpu", self.cpu), ("memory", self.memory)]
    }
}

impl Serialize for Usage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
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
        state.serialize_field("window", &quantity::go_duration(self.window))?;
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
        state.serialize_field("window", &quantity::go_duration(self.window))?;
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
// Go-order serializers for apimachinery metadata.

/// `metav1.Time`: RFC 3339 whole seconds, or `null` for Go's zero time.
struct GoTime(SystemTime);

impl Serialize for GoTime {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if quantity::is_go_zero_time(self.0) {
            serializer.serialize_none()
        } else {
            serializer.serialize_str(&quantity::rfc3339(self.0))
        }
    }
}

/// Floored `(seconds, nanoseconds)` of a jiff timestamp.
fn jiff_parts(timestamp: jiff::Timestamp) -> (i64, i32) {
    let (seconds, nanos) = (timestamp.as_second(), timestamp.subsec_nanosecond());
    if nanos < 0 {
        (seconds.saturating_sub(1), nanos + 1_000_000_000)
    } else {
        (seconds, nanos)
    }
}

fn is_go_zero_meta_time(time: &meta::Time) -> bool {
    jiff_parts(time.0) == (quantity::GO_ZERO_TIME_UNIX_SECONDS, 0)
}

/// `metav1.Time` from a `k8s_openapi` `Time`.
struct GoMetaTime<'a>(&'a meta::Time);

impl Serialize for GoMetaTime<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if is_go_zero_meta_time(self.0) {
            serializer.serialize_none()
        } else {
            serializer.serialize_str(&quantity::rfc3339_unix(jiff_parts(self.0 .0).0))
        }
    }
}

fn non_empty(value: &Option<String>) -> Option<&String> {
    value.as_ref().filter(|value| !value.is_empty())
}

fn non_empty_map(value: &Option<BTreeMap<String, String>>) -> Option<&BTreeMap<String, String>> {
    value.as_ref().filter(|value| !value.is_empty())
}

fn non_empty_vec<T>(value: &Option<Vec<T>>) -> Option<&Vec<T>> {
    value.as_ref().filter(|value| !value.is_empty())
}

/// `metav1.ObjectMeta` in Go's field order with Go's `omitempty`/`omitzero` rules.
///
/// `managedFields[].fieldsV1` is written as the stored JSON value; Go writes the raw bytes it
/// received, which may order keys differently (metrics-server never sets managed fields).
pub(crate) struct GoObjectMeta<'a>(pub(crate) &'a ObjectMeta);

impl Serialize for GoObjectMeta<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let m = self.0;
        let mut state = serializer.serialize_struct("ObjectMeta", 15)?;
        if let Some(v) = non_empty(&m.name) {
            state.serialize_field("name", v)?;
        }
        if let Some(v) = non_empty(&m.generate_name) {
            state.serialize_field("generateName", v)?;
        }
        if let Some(v) = non_empty(&m.namespace) {
            state.serialize_field("namespace", v)?;
        }
        if let Some(v) = non_empty(&m.self_link) {
            state.serialize_field("selfLink", v)?;
        }
        if let Some(v) = non_empty(&m.uid) {
            state.serialize_field("uid", v)?;
        }
        if let Some(v) = non_empty(&m.resource_version) {
            state.serialize_field("resourceVersion", v)?;
        }
        if let Some(v) = m.generation.filter(|v| *v != 0) {
            state.serialize_field("generation", &v)?;
        }
        if let Some(v) = m
            .creation_timestamp
            .as_ref()
            .filter(|v| !is_go_zero_meta_time(v))
        {
            state.serialize_field("creationTimestamp", &GoMetaTime(v))?;
        }
        if let Some(v) = &m.deletion_timestamp {
            state.serialize_field("deletionTimestamp", &GoMetaTime(v))?;
        }
        if let Some(v) = m.deletion_grace_period_seconds {
            state.serialize_field("deletionGracePeriodSeconds", &v)?;
        }
        if let Some(v) = non_empty_map(&m.labels) {
            state.serialize_field("labels", v)?;
        }
        if let Some(v) = non_empty_map(&m.annotations) {
            state.serialize_field("annotations", v)?;
        }
        if let Some(v) = non_empty_vec(&m.owner_references) {
            state.serialize_field("ownerReferences", &GoSeq(v))?;
        }
        if let Some(v) = non_empty_vec(&m.finalizers) {
            state.serialize_field("finalizers", v)?;
        }
        if let Some(v) = non_empty_vec(&m.managed_fields) {
            state.serialize_field("managedFields", &GoSeq(v))?;
        }
        state.end()
    }
}

/// Wraps a reference for Go-order serialization.
struct Adapted<'a, T>(&'a T);

/// A sequence whose elements are serialized through [`Adapted`].
struct GoSeq<'a, T>(&'a [T]);

impl<T> Serialize for GoSeq<'_, T>
where
    for<'b> Adapted<'b, T>: Serialize,
{
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for item in self.0 {
            seq.serialize_element(&Adapted(item))?;
        }
        seq.end()
    }
}

impl Serialize for Adapted<'_, meta::OwnerReference> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let r = self.0;
        let mut state = serializer.serialize_struct("OwnerReference", 6)?;
        state.serialize_field("apiVersion", &r.api_version)?;
        state.serialize_field("kind", &r.kind)?;
        state.serialize_field("name", &r.name)?;
        state.serialize_field("uid", &r.uid)?;
        if let Some(v) = r.controller {
            state.serialize_field("controller", &v)?;
        }
        if let Some(v) = r.block_owner_deletion {
            state.serialize_field("blockOwnerDeletion", &v)?;
        }
        state.end()
    }
}

impl Serialize for Adapted<'_, meta::ManagedFieldsEntry> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let e = self.0;
        let mut state = serializer.serialize_struct("ManagedFieldsEntry", 7)?;
        if let Some(v) = non_empty(&e.manager) {
            state.serialize_field("manager", v)?;
        }
        if let Some(v) = non_empty(&e.operation) {
            state.serialize_field("operation", v)?;
        }
        if let Some(v) = non_empty(&e.api_version) {
            state.serialize_field("apiVersion", v)?;
        }
        if let Some(v) = &e.time {
            state.serialize_field("time", &GoMetaTime(v))?;
        }
        if let Some(v) = non_empty(&e.fields_type) {
            state.serialize_field("fieldsType", v)?;
        }
        if let Some(v) = &e.fields_v1 {
            state.serialize_field("fieldsV1", &v.0)?;
        }
        if let Some(v) = non_empty(&e.subresource) {
            state.serialize_field("subresource", v)?;
        }
        state.end()
    }
}

/// `metav1.ListMeta` in Go's field order; an empty one is `{}`.
pub(crate) struct GoListMeta<'a>(pub(crate) &'a ListMeta);

impl Serialize for GoListMeta<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let m = self.0;
        let mut state = serializer.serialize_struct("ListMeta", 4)?;
        if let Some(v) = non_empty(&m.self_link) {
            state.serialize_field("selfLink", v)?;
        }
        if let Some(v) = non_empty(&m.resource_version) {
            state.serialize_field("resourceVersion", v)?;
        }
        if let Some(v) = non_empty(&m.continue_) {
            state.serialize_field("continue", v)?;
        }
        if let Some(v) = m.remaining_item_count {
            state.serialize_field("remainingItemCount", &v)?;
        }
        state.end()
    }
}

// ---------------------------------------------------------------------------------------------
// Go's encoding/json output.

/// Failure to encode a response body.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The serializer failed (only possible for values serde cannot represent as JSON).
    #[error("encoding a response body as JSON")]
    Json {
        /// What serde_json reported.
        #[source]
        source: serde_json::Error,
    },
}

/// `json.NewEncoder(w).Encode(v)`, as the apiserver writes a body: compact, HTML-escaped like
/// Go, with a trailing newline.
///
/// # Errors
///
/// Only if `value`'s `Serialize` implementation fails; this crate's types never do.
pub fn encode_json<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(256);
    let mut serializer = serde_json::Serializer::with_formatter(
        &mut out,
        GoFormatter(serde_json::ser::CompactFormatter),
    );
    value
        .serialize(&mut serializer)
        .map_err(|source| EncodeError::Json { source })?;
    out.push(b'\n');
    Ok(out)
}

/// `json.MarshalIndent(v, "", "  ")`, as the apiserver writes a body for `?pretty=true`
/// (and for curl, Wget and browser user agents): two-space indent, no trailing newline.
///
/// # Errors
///
/// Only if `value`'s `Serialize` implementation fails; this crate's types never do.
pub fn encode_json_pretty<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(512);
    let formatter = GoFormatter(serde_json::ser::PrettyFormatter::with_indent(b"  "));
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    value
        .serialize(&mut serializer)
        .map_err(|source| EncodeError::Json { source })?;
    Ok(out)
}

/// Go's string escaping on top of a serde_json layout: `<`, `>`, `&`, U+2028 and U+2029
/// become `\u003c`, `\u003e`, `\u0026`, `\u2028`, `\u2029`; control characters use `\b`,
/// `\f`, `\n`, `\r`, `\t` or lowercase `\u00xx`.
struct GoFormatter<F>(F);

impl<F: serde_json::ser::Formatter> serde_json::ser::Formatter for GoFormatter<F> {
    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_array(writer)
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_array(writer)
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_array_value(writer, first)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_array_value(writer)
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_object(writer)
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_object(writer)
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_object_key(writer, first)
    }

    fn end_object_key<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_object_key(writer)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_object_value(writer)
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_object_value(writer)
    }

    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut rest = fragment;
        while let Some(at) = rest.find(['<', '>', '&', '\u{2028}', '\u{2029}']) {
            let (plain, tail) = rest.split_at(at);
            writer.write_all(plain.as_bytes())?;
            let mut chars = tail.chars();
            let escaped = match chars.next() {
                Some('<') => "\\u003c",
                Some('>') => "\\u003e",
                Some('&') => "\\u0026",
                Some('\u{2028}') => "\\u2028",
                Some('\u{2029}') => "\\u2029",
                _ => "",
            };
            writer.write_all(escaped.as_bytes())?;
            rest = chars.as_str();
        }
        writer.write_all(rest.as_bytes())
    }

    fn write_char_escape<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        char_escape: serde_json::ser::CharEscape,
    ) -> io::Result<()> {
        use serde_json::ser::CharEscape;
        let short: &[u8] = match char_escape {
            CharEscape::Quote => b"\\\"",
            CharEscape::ReverseSolidus => b"\\\\",
            // Go never escapes '/'; serde_json does not ask to either.
            CharEscape::Solidus => b"/",
            CharEscape::Backspace => b"\\b",
            CharEscape::FormFeed => b"\\f",
            CharEscape::LineFeed => b"\\n",
            CharEscape::CarriageReturn => b"\\r",
            CharEscape::Tab => b"\\t",
            CharEscape::AsciiControl(byte) => {
                return write!(writer, "\\u{byte:04x}");
            }
        };
        writer.write_all(short)
    }
}

// ---------------------------------------------------------------------------------------------
// metav1.Status error bodies.

/// A `metav1.Status` error body, serialized in Go's order:
/// `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":…,
/// "reason":…,"details":{"name":…,"group":…,"kind":…},"code":…}`.
///
/// `k8s_openapi`'s own `Status` serializes alphabetically (`apiVersion`, `kind`, `code`, …),
/// hence this wrapper. The constructors reproduce `k8s.io/apimachinery/pkg/api/errors` and
/// `k8s.io/apiserver` (`responsewriters.ErrorToAPIStatus`, which always sets
/// `kind: Status`, `apiVersion: v1` and a non-zero code).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Status(pub Box<meta::Status>);

/// The request attributes an authorization denial is worded from
/// (`k8s.io/apiserver` `authorizer.Attributes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestAttributes<'a> {
    /// The user's name.
    pub user: &'a str,
    /// The verb (`get`, `list`, `watch`, …).
    pub verb: &'a str,
    /// Whether this is a resource request (`/apis/<group>/<version>/…`) rather than a path.
    pub resource_request: bool,
    /// The request path, for non-resource requests.
    pub path: &'a str,
    /// The API group, e.g. `metrics.k8s.io`.
    pub api_group: &'a str,
    /// The resource as in the URL, e.g. `nodes`, `pods`.
    pub resource: &'a str,
    /// The subresource, or empty.
    pub subresource: &'a str,
    /// The namespace, or empty.
    pub namespace: &'a str,
    /// The object's name, or empty for collections.
    pub name: &'a str,
}

impl Status {
    fn failure(
        code: i32,
        reason: &str,
        message: String,
        details: Option<meta::StatusDetails>,
    ) -> Self {
        Self(Box::new(meta::Status {
            code: Some(code),
            details,
            message: Some(message),
            metadata: ListMeta::default(),
            reason: (!reason.is_empty()).then(|| reason.to_owned()),
            status: Some("Failure".to_owned()),
        }))
    }

    /// The HTTP status code to send with this body (500 when unset, as the apiserver does).
    pub fn code(&self) -> u16 {
        self.0
            .code
            .and_then(|code| u16::try_from(code).ok())
            .filter(|code| *code != 0)
            .unwrap_or(500)
    }

    /// `errors.NewNotFound(schema.GroupResource{group, resource}, name)`:
    /// 404, `<resource>[.<group>] "<name>" not found`, details `name`, `group`, `kind`.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        let message = format!(
            "{} {} not found",
            group_resource(group, resource),
            go_quote(name)
        );
        Self::failure(
            404,
            "NotFound",
            message,
            Some(meta::StatusDetails {
                name: Some(name.to_owned()),
                group: Some(group.to_owned()),
                kind: Some(resource.to_owned()),
                ..meta::StatusDetails::default()
            }),
        )
    }

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

    /// `errors.NewBadRequest(message)`: 400, reason `BadRequest`, no details.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::failure(400, "BadRequest", message.into(), None)
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
            .unwrap_or_else(|| go_quote(value));
        Self::bad_request(format!(
            "Unable to convert to Table as requested: includeObject: Invalid value: {value}: \
             must be 'Metadata', 'Object', 'None', or empty"
        ))
    }

    /// What the apiserver sends for an error that is not a `StatusError` (e.g.
    /// metrics-server's `failed reading nodes metrics: …`): 500, no reason, the error text as
    /// the message (`responsewriters.ErrorToAPIStatus`).
    pub fn plain_error(message: impl Into<String>) -> Self {
        Self::failure(500, "", message.into(), None)
    }

    /// `errors.NewInternalError(err)`: 500, reason `InternalError`,
    /// `Internal error occurred: <err>`, the error text also as the one cause.
    pub fn internal_error(error: &str) -> Self {
        Self::failure(
            500,
            "InternalError",
            format!("Internal error occurred: {error}"),
            Some(meta::StatusDetails {
                causes: Some(vec![meta::StatusCause {
                    message: Some(error.to_owned()),
                    ..meta::StatusCause::default()
                }]),
                ..meta::StatusDetails::default()
            }),
        )
    }

    /// `errors.NewServiceUnavailable(message)`: 503, reason `ServiceUnavailable`.
    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Self::failure(503, "ServiceUnavailable", message.into(), None)
    }

    /// `errors.NewUnauthorized(reason)`: 401; the authentication filter uses
    /// `"Unauthorized"`, an empty reason becomes `"not authorized"`.
    pub fn unauthorized(reason: &str) -> Self {
        let message = if reason.is_empty() {
            "not authorized"
        } else {
            reason
        };
        Self::failure(401, "Unauthorized", message.to_owned(), None)
    }

    /// An authorization denial as `responsewriters.ForbiddenStatusError` words it, e.g.
    /// `nodes.metrics.k8s.io is forbidden: User "bob" cannot list resource "nodes" in API
    /// group "metrics.k8s.io" at the cluster scope`; `reason` (the authorizer's, possibly
    /// empty) is appended after `": "`.
    pub fn forbidden(attributes: &RequestAttributes<'_>, reason: &str) -> Self {
        let mut error = sanitize_html(&forbidden_message(attributes));
        if !reason.is_empty() {
            error.push_str(": ");
            error.push_str(reason);
        }
        let (group, resource, name) = (attributes.api_group, attributes.resource, attributes.name);
        let message = if group.is_empty() && resource.is_empty() {
            format!("forbidden: {error}")
        } else if name.is_empty() {
            format!("{} is forbidden: {error}", group_resource(group, resource))
        } else {
            format!(
                "{} {} is forbidden: {error}",
                group_resource(group, resource),
                go_quote(name)
            )
        };
        Self::failure(
            403,
            "Forbidden",
            message,
            Some(meta::StatusDetails {
                name: Some(name.to_owned()),
                group: Some(group.to_owned()),
                kind: Some(resource.to_owned()),
                ..meta::StatusDetails::default()
            }),
        )
    }

    /// `errors.NewMethodNotSupported(gr, action)`: 405, reason `MethodNotAllowed`,
    /// `<action> is not supported on resources of kind "<resource>[.<group>]"`.
    pub fn method_not_supported(group: &str, resource: &str, action: &str) -> Self {
        Self::failure(
            405,
            "MethodNotAllowed",
            format!(
                "{action} is not supported on resources of kind {}",
                go_quote(&group_resource(group, resource))
            ),
            Some(meta::StatusDetails {
                group: Some(group.to_owned()),
                kind: Some(resource.to_owned()),
                ..meta::StatusDetails::default()
            }),
        )
    }

    /// `errors.NewTooManyRequests(message, retryAfterSeconds)`: 429, reason
    /// `TooManyRequests`, the retry delay in the details.
    pub fn too_many_requests(message: impl Into<String>, retry_after_seconds: i32) -> Self {
        Self::failure(
            429,
            "TooManyRequests",
            message.into(),
            Some(meta::StatusDetails {
                retry_after_seconds: Some(retry_after_seconds),
                ..meta::StatusDetails::default()
            }),
        )
    }

    /// The apiserver's `errNotAcceptable` (e.g. a Table asked for in another group version):
    /// 406, reason `NotAcceptable`.
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::failure(406, "NotAcceptable", message.into(), None)
    }
}

impl Serialize for Status {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let s = &self.0;
        let mut state = serializer.serialize_struct("Status", 8)?;
        state.serialize_field("kind", "Status")?;
        state.serialize_field("apiVersion", "v1")?;
        state.serialize_field("metadata", &GoListMeta(&s.metadata))?;
        if let Some(v) = non_empty(&s.status) {
            state.serialize_field("status", v)?;
        }
        if let Some(v) = non_empty(&s.message) {
            state.serialize_field("message", v)?;
        }
        if let Some(v) = non_empty(&s.reason) {
            state.serialize_field("reason", v)?;
        }
        if let Some(v) = &s.details {
            state.serialize_field("details", &Adapted(v))?;
        }
        if let Some(v) = s.code.filter(|code| *code != 0) {
            state.serialize_field("code", &v)?;
        }
        state.end()
    }
}

impl Serialize for Adapted<'_, meta::StatusDetails> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let d = self.0;
        let mut state = serializer.serialize_struct("StatusDetails", 6)?;
        if let Some(v) = non_empty(&d.name) {
            state.serialize_field("name", v)?;
        }
        if let Some(v) = non_empty(&d.group) {
            state.serialize_field("group", v)?;
        }
        if let Some(v) = non_empty(&d.kind) {
            state.serialize_field("kind", v)?;
        }
        if let Some(v) = non_empty(&d.uid) {
            state.serialize_field("uid", v)?;
        }
        if let Some(v) = non_empty_vec(&d.causes) {
            state.serialize_field("causes", &GoSeq(v))?;
        }
        if let Some(v) = d.retry_after_seconds.filter(|v| *v != 0) {
            state.serialize_field("retryAfterSeconds", &v)?;
        }
        state.end()
    }
}

impl Serialize for Adapted<'_, meta::StatusCause> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let c = self.0;
        let mut state = serializer.serialize_struct("StatusCause", 3)?;
        if let Some(v) = non_empty(&c.reason) {
            state.serialize_field("reason", v)?;
        }
        if let Some(v) = non_empty(&c.message) {
            state.serialize_field("message", v)?;
        }
        if let Some(v) = non_empty(&c.field) {
            state.serialize_field("field", v)?;
        }
        state.end()
    }
}

/// `schema.GroupResource.String()`: `resource` or `resource.group`.
fn group_resource(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

/// `responsewriters.forbiddenMessage`.
fn forbidden_message(a: &RequestAttributes<'_>) -> String {
    let user = go_quote(a.user);
    if !a.resource_request {
        return format!("User {user} cannot {} path {}", a.verb, go_quote(a.path));
    }
    let resource = if a.subresource.is_empty() {
        a.resource.to_owned()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let (resource, group) = (go_quote(&resource), go_quote(a.api_group));
    if a.namespace.is_empty() {
        format!(
            "User {user} cannot {} resource {resource} in API group {group} at the cluster scope",
            a.verb
        )
    } else {
        format!(
            "User {user} cannot {} resource {resource} in API group {group} in the namespace {}",
            a.verb,
            go_quote(a.namespace)
        )
    }
}

/// The apiserver's HTML sanitizer for denial messages: `&`, `<`, `>` become entities.
fn sanitize_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Go's `%q` / `strconv.Quote`: double quotes, Go escapes for `"`, `\` and
/// `\a \b \f \n \r \t \v`, `\xNN` for other ASCII controls and DEL, and `\uNNNN` /
/// `\UNNNNNNNN` for non-printable non-ASCII characters.
///
/// Go's `unicode.IsPrint` needs Unicode tables; this approximates it by treating as
/// non-printable the C1 controls, every space separator but U+0020, the line and paragraph
/// separators, the common format characters, private-use code points and noncharacters.
/// Unassigned code points (which Go escapes) pass through. Kubernetes names are ASCII, so this
/// only matters for nonsense names echoed back in errors.
pub fn go_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{07}' => out.push_str("\\a"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{0b}' => out.push_str("\\v"),
            ' '..='~' => out.push(ch),
            '\u{00}'..='\u{1f}' | '\u{7f}' => push_hex(&mut out, "\\x", 2, ch),
            _ if go_is_print(ch) => out.push(ch),
            _ if u32::from(ch) < 0x1_0000 => push_hex(&mut out, "\\u", 4, ch),
            _ => push_hex(&mut out, "\\U", 8, ch),
        }
    }
    out.push('"');
    out
}

/// Appends `prefix` and `ch` as `width` lowercase hex digits.
fn push_hex(out: &mut String, prefix: &str, width: usize, ch: char) {
    use std::fmt::Write as _;
    // Writing to a String cannot fail.
    let _ = write!(out, "{prefix}{:0width$x}", u32::from(ch));
}

/// An approximation of Go's `unicode.IsPrint` for non-ASCII characters (see [`go_quote`]).
fn go_is_print(ch: char) -> bool {
    let code = u32::from(ch);
    if code >= 0x3_0000 {
        // Planes 3 to 16: CJK extensions G and H and the variation selectors supplement are
        // printable; the rest is unassigned, tags, private use or noncharacters.
        return matches!(code, 0x3_0000..=0x3_23af | 0xe_0100..=0xe_01ef);
    }
    let not_print = matches!(
        code,
        // C1 controls, no-break space, soft hyphen.
        0x80..=0xa0
            | 0xad
            // Arabic and Syriac format characters.
            | 0x600..=0x605
            | 0x61c
            | 0x6dd
            | 0x70f
            | 0x890..=0x891
            | 0x8e2
            // Ogham space, Mongolian vowel separator.
            | 0x1680
            | 0x180e
            // General punctuation spaces, joiners, marks, separators, invisible operators.
            | 0x2000..=0x200f
            | 0x2028..=0x202f
            | 0x205f..=0x206f
            | 0x3000
            // Surrogates (not chars) and the BMP private use area.
            | 0xd800..=0xf8ff
            | 0xfdd0..=0xfdef
            | 0xfeff
            | 0xfff9..=0xfffb
            // Supplementary format characters.
            | 0x110bd
            | 0x110cd
            | 0x13430..=0x1343f
            | 0x1bca0..=0x1bca3
            | 0x1d173..=0x1d17a
    ) || code & 0xfffe == 0xfffe;
    !not_print
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

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
    fn status_bad_request_and_plain_errors() {
        assert_eq!(
            json(&Status::bad_request("unable to parse requirement: bad")),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"unable to parse requirement: bad","reason":"BadRequest","code":400}"#,
                "\n"
            )
        );
        let plain = Status::plain_error("failed reading nodes metrics: boom");
        assert_eq!(plain.code(), 500);
        assert_eq!(
            json(&plain),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"failed reading nodes metrics: boom","code":500}"#,
                "\n"
            )
        );
        assert_eq!(
            json(&Status::internal_error("boom")),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"Internal error occurred: boom","reason":"InternalError","#,
                r#""details":{"causes":[{"message":"boom"}]},"code":500}"#,
                "\n"
            )
        );
        assert_eq!(
            json(&Status::service_unavailable("not ready")),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"not ready","reason":"ServiceUnavailable","code":503}"#,
                "\n"
            )
        );
        assert_eq!(
            json(&Status::unauthorized("Unauthorized")),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"Unauthorized","reason":"Unauthorized","code":401}"#,
                "\n"
            )
        );
        assert_eq!(
            Status::unauthorized("").0.message.as_deref(),
            Some("not authorized")
        );
        assert_eq!(
            json(&Status::not_acceptable(
                "no Table exists in group version metrics.k8s.io/v1beta1"
            )),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"no Table exists in group version metrics.k8s.io/v1beta1","#,
                r#""reason":"NotAcceptable","code":406}"#,
                "\n"
            )
        );
        assert_eq!(
            json(&Status::method_not_supported(GROUP, "nodes", "create")),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"create is not supported on resources of kind \"nodes.metrics.k8s.io\"","#,
                r#""reason":"MethodNotAllowed","#,
                r#""details":{"group":"metrics.k8s.io","kind":"nodes"},"code":405}"#,
                "\n"
            )
        );
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
    fn status_forbidden() {
        let list_nodes = RequestAttributes {
            user: "system:serviceaccount:default:viewer",
            verb: "list",
            resource_request: true,
            api_group: GROUP,
            resource: "nodes",
            ..RequestAttributes::default()
        };
        assert_eq!(
            json(&Status::forbidden(&list_nodes, "")),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"nodes.metrics.k8s.io is forbidden: User \"system:serviceaccount:default:viewer\" "#,
                r#"cannot list resource \"nodes\" in API group \"metrics.k8s.io\" at the cluster scope","#,
                r#""reason":"Forbidden","details":{"group":"metrics.k8s.io","kind":"nodes"},"code":403}"#,
                "\n"
            )
        );
        let get_pod = RequestAttributes {
            user: "bob",
            verb: "get",
            resource_request: true,
            api_group: GROUP,
            resource: "pods",
            namespace: "team-a",
            name: "web-0",
            ..RequestAttributes::default()
        };
        assert_eq!(
            Status::forbidden(&get_pod, "no RBAC policy matched")
                .0
                .message
                .as_deref(),
            Some(
                "pods.metrics.k8s.io \"web-0\" is forbidden: User \"bob\" cannot get resource \
                 \"pods\" in API group \"metrics.k8s.io\" in the namespace \"team-a\": no RBAC \
                 policy matched"
            )
        );
        let path = RequestAttributes {
            user: "<eve>",
            verb: "get",
            path: "/metrics",
            ..RequestAttributes::default()
        };
        let status = Status::forbidden(&path, "");
        assert_eq!(
            status.0.message.as_deref(),
            Some("forbidden: User \"&lt;eve&gt;\" cannot get path \"/metrics\"")
        );
        assert_eq!(
            json(&status),
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
                r#""message":"forbidden: User \"\u0026lt;eve\u0026gt;\" cannot get path \"/metrics\"","#,
                r#""reason":"Forbidden","details":{},"code":403}"#,
                "\n"
            )
        );
    }

    #[test]
    fn status_code_defaults_to_500() {
        assert_eq!(Status::default().code(), 500);
        assert_eq!(
            json(&Status::default()),
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{}}\n"
        );
    }

    #[test]
    fn go_quote_matches_strconv_quote() {
        let cases = [
            ("", r#""""#),
            ("plain", r#""plain""#),
            ("ns/name", r#""ns/name""#),
            ("q\"b\\", r#""q\"b\\""#),
            ("\u{07}\u{08}\u{0c}\n\r\t\u{0b}", r#""\a\b\f\n\r\t\v""#),
            ("\u{00}\u{1b}\u{7f}", r#""\x00\x1b\x7f""#),
            ("µs héllo 世界", "\"µs héllo 世界\""),
            (
                "\u{a0}\u{ad}\u{2028}\u{feff}",
                r#""\u00a0\u00ad\u2028\ufeff""#,
            ),
            ("\u{85}", r#""\u0085""#),
            ("\u{e000}", r#""\ue000""#),
            (
                "\u{1d173}\u{e0001}\u{e0100}",
                "\"\\U0001d173\\U000e0001\u{e0100}\"",
            ),
            ("\u{f0000}\u{1fffe}", r#""\U000f0000\U0001fffe""#),
            ("😀", "\"😀\""),
        ];
        for (input, want) in cases {
            assert_eq!(go_quote(input), want, "{input:?}");
        }
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
        let names: Vec<_> = usage.entries().iter().map(|(name, _)| *name).collect();
        assert_eq!(names, ["cpu", "memory"]);
    }
}
