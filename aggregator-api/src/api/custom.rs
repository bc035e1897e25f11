//! `custom.metrics.k8s.io` (opt-in, the server's `--custom-metrics`): each pod's and
//! container's pressure and throttling, from the same agent streams as `metrics.k8s.io`.
//!
//! # What is served
//!
//! | metric | what | from the agent's |
//! | --- | --- | --- |
//! | `cpu_pressure` | share of the window in which some task waited for a CPU (PSI `some`) | [`Signals::cpu_pressure`] |
//! | `memory_pressure` | the same, waiting for memory | [`Signals::memory_pressure`] |
//! | `cpu_throttled_ratio` | share of CFS periods in the window that ran out of quota | [`Signals::cpu_throttled`] |
//!
//! Values are shares, 0 to 1, as quantities exact to the part per million (`250m`,
//! `253412u`); `windowSeconds` is the span the agent took them over (its
//! `--custom-metrics-window`, at least), `timestamp` when it read them. The HPA reads
//! `MilliValue`, ignores both, and averages the items by pod.
//!
//! # Requests, as custom-metrics-apiserver routes them
//!
//! - `GET /apis/custom.metrics.k8s.io/{v1beta2,v1beta1}/namespaces/{ns}/pods/{name}/{metric}`:
//!   one pod (a list of one), or with name `*` every pod of the namespace that
//!   `labelSelector` selects and that has a value; a pod without one is left out, as the
//!   HPA expects (it counts it as missing).
//! - Series: each pod has one with no labels (the pod's own figure: its pod cgroup's
//!   pressure, the throttling summed over its cgroups with a quota), and one per container
//!   labelled `container=<name>`. An empty `metricLabelSelector` (what the HPA sends for a
//!   metric without `selector`) picks the pod's series; any other picks the containers whose
//!   label it matches, one item each, with the selector in `metric.selector`
//!   (`matchExpressions`, as `metav1.ParseToLabelSelector` writes it).
//! - Errors (`k8s.io/apiserver`'s Status): an unknown metric, another resource (nodes,
//!   namespaces, …) or a root-scoped path: 404 `the server could not find the metric
//!   <metric> for <resource>`; a named pod without a value: 404 `the server could not find
//!   the metric <metric> for pods <name>`; a bad selector: 400; a method other than GET: 405;
//!   an unknown path: 404 as go-restful words it.
//! - JSON and protobuf (`k8s.io/metrics` `custom_metrics` `generated.proto`; the HPA's client
//!   asks for protobuf). YAML gets a 406.
//!
//! Discovery documents are built with the others, in [`super::discovery`].
//!
//! Not served: OpenAPI for this group (kube-aggregator merges none for it; `kubectl explain`
//! does not know `MetricValueList`), metrics of other objects, `metrics` of namespaces.

use std::time::SystemTime;

use prost::Message;
use serde::Serialize;

use kpulse_wire::{Fraction, Signals};

use super::{
    negotiate::{self, Encoding, Endpoint},
    objects::MetricsReader,
    proto,
    request::{self, ApiError, ErrorEncoding, RequestParts},
    selector::{LabelSelector, Operator},
    types::to_jiff,
};
use crate::{go, metadata::MetadataSource, quantity::Quantity, status::Status};

/// The API group.
pub const GROUP: &str = "custom.metrics.k8s.io";

/// The served versions, preferred first (custom-metrics-apiserver's order).
pub const VERSIONS: [CustomVersion; 2] = [CustomVersion::V1beta2, CustomVersion::V1beta1];

/// The label that tells a container's series from its pod's.
pub const CONTAINER_LABEL: &str = "container";

/// A version of the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CustomVersion {
    /// `v1beta2`: `metric {name, selector}`, `windowSeconds`.
    V1beta2,
    /// `v1beta1`: `metricName`, `window`, a top-level `selector`.
    V1beta1,
}

impl CustomVersion {
    /// The version segment.
    pub fn version(self) -> &'static str {
        match self {
            CustomVersion::V1beta2 => "v1beta2",
            CustomVersion::V1beta1 => "v1beta1",
        }
    }

    /// `custom.metrics.k8s.io/<version>`.
    pub fn api_version(self) -> &'static str {
        match self {
            CustomVersion::V1beta2 => "custom.metrics.k8s.io/v1beta2",
            CustomVersion::V1beta1 => "custom.metrics.k8s.io/v1beta1",
        }
    }

    fn from_version(v: &str) -> Option<CustomVersion> {
        VERSIONS.into_iter().find(|c| c.version() == v)
    }
}

/// A served metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Metric {
    /// PSI `some`, CPU.
    CpuPressure,
    /// PSI `some`, memory.
    MemoryPressure,
    /// CFS periods throttled.
    CpuThrottledRatio,
}

/// Every metric, sorted by name (the order discovery lists them in).
pub const METRICS: [Metric; 3] = [
    Metric::CpuPressure,
    Metric::CpuThrottledRatio,
    Metric::MemoryPressure,
];

impl Metric {
    /// The metric's name in paths and objects.
    pub fn name(self) -> &'static str {
        match self {
            Metric::CpuPressure => "cpu_pressure",
            Metric::MemoryPressure => "memory_pressure",
            Metric::CpuThrottledRatio => "cpu_throttled_ratio",
        }
    }

    /// The resource discovery lists it as: a subresource of pods.
    pub fn resource(self) -> &'static str {
        match self {
            Metric::CpuPressure => "pods/cpu_pressure",
            Metric::MemoryPressure => "pods/memory_pressure",
            Metric::CpuThrottledRatio => "pods/cpu_throttled_ratio",
        }
    }

    fn from_name(name: &str) -> Option<Metric> {
        METRICS.into_iter().find(|m| m.name() == name)
    }

    /// This metric's figure among a cgroup's signals.
    pub fn of(self, s: &Signals) -> Option<Fraction> {
        match self {
            Metric::CpuPressure => s.cpu_pressure,
            Metric::MemoryPressure => s.memory_pressure,
            Metric::CpuThrottledRatio => s.cpu_throttled,
        }
    }
}

/// A routed, checked request for a metric of pods.
#[derive(Clone, Debug)]
pub struct CustomRequest {
    /// The version in the path.
    pub version: CustomVersion,
    /// The namespace.
    pub namespace: String,
    /// One pod, or `None` for `*`.
    pub name: Option<String>,
    /// The metric.
    pub metric: Metric,
    /// `labelSelector` (pods).
    pub label_selector: LabelSelector,
    /// `metricLabelSelector` (series).
    pub metric_selector: LabelSelector,
    /// JSON or protobuf.
    pub encoding: Encoding,
    /// Indented JSON.
    pub pretty: bool,
    /// How to write an error.
    pub error_encoding: ErrorEncoding,
}

/// Why a request is not a [`CustomRequest`].
#[derive(Clone, Debug, PartialEq)]
pub enum CustomRejection {
    /// Not under `/apis/custom.metrics.k8s.io`.
    NotApi,
    /// `GET /apis/custom.metrics.k8s.io` (`None`) or `…/<version>`: discovery.
    Discovery(Option<CustomVersion>),
    /// A Status error.
    Error(ApiError),
}

/// Routes and checks a request under `/apis/custom.metrics.k8s.io` (after [`request::preflight`]
/// and authorization, like [`request::parse`]).
///
/// # Errors
///
/// A [`CustomRejection`] with the answer.
pub fn parse(parts: &RequestParts<'_>) -> Result<CustomRequest, CustomRejection> {
    let error_encoding = request::error_encoding(parts);
    let fail = |status: Status| {
        CustomRejection::Error(ApiError {
            status,
            encoding: error_encoding,
        })
    };
    let Ok(path) = go::unescape(parts.path, go::Part::Path) else {
        return Err(fail(Status::bad_request("the request path is not valid")));
    };
    let path = go::lossy(&path);
    let Some(after) = path.strip_prefix("/apis/custom.metrics.k8s.io") else {
        return Err(CustomRejection::NotApi);
    };
    if !(after.is_empty() || after.starts_with('/')) {
        return Err(CustomRejection::NotApi);
    }
    let tokens: Vec<&str> = after.trim_matches('/').split('/').collect();
    let discovery = |version| {
        if parts.method == "GET" {
            Err(CustomRejection::Discovery(version))
        } else {
            Err(fail(method_not_allowed()))
        }
    };
    let (version, rest) = match tokens.as_slice() {
        [""] => return discovery(None),
        [version, rest @ ..] => match CustomVersion::from_version(version) {
            Some(v) => (v, rest),
            None => return Err(fail(route_not_found())),
        },
        [] => return discovery(None),
    };
    // custom-metrics-apiserver's routes: namespaced objects, root-scoped objects, and
    // metrics of namespaces.
    let (namespace, resource, name, metric) = match rest {
        [] => return discovery(Some(version)),
        ["namespaces", ns, "metrics", metric] => (Some(*ns), "namespaces", *ns, *metric),
        ["namespaces", ns, resource, name, metric] => (Some(*ns), *resource, *name, *metric),
        [resource, name, metric] => (None, *resource, *name, *metric),
        _ => return Err(fail(route_not_found())),
    };
    if parts.method != "GET" {
        return Err(fail(method_not_allowed()));
    }
    let Some(choice) =
        negotiate::choose(parts.accept, Endpoint::Error).filter(|c| c.encoding != Encoding::Yaml)
    else {
        return Err(fail(Status::not_acceptable(format!(
            "only the following media types are accepted: application/json, {}",
            proto::MEDIA_TYPE
        ))));
    };
    let query = request::Query::parse(parts.query.unwrap_or(""));
    let selector = |key: &str| {
        LabelSelector::parse(query.first(key).unwrap_or("")).map_err(|e| {
            fail(Status::bad_request(format!(
                "unable to parse requested {key}: {}",
                e.message
            )))
        })
    };
    let label_selector = selector("labelSelector")?;
    let metric_selector = selector("metricLabelSelector")?;
    let (Some(metric), Some(namespace), "pods") = (Metric::from_name(metric), namespace, resource)
    else {
        return Err(fail(metric_not_found(metric, resource)));
    };
    Ok(CustomRequest {
        version,
        namespace: namespace.to_owned(),
        name: (name != "*").then(|| name.to_owned()),
        metric,
        label_selector,
        metric_selector,
        encoding: choice.encoding,
        pretty: choice.encoding == Encoding::Json
            && (choice.pretty || request::is_pretty_print(&query, parts)),
        error_encoding,
    })
}

/// One value: a pod's own series, or one of its containers'.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    /// The pod.
    pub pod: String,
    /// When the agent read it.
    pub timestamp: SystemTime,
    /// The share.
    pub fraction: Fraction,
}

/// The values a request finds, in namespace order by pod name (containers in the agent's
/// order).
///
/// # Errors
///
/// 404 for a named pod without a value.
pub fn find(
    store: &dyn MetricsReader,
    metadata: &dyn MetadataSource,
    req: &CustomRequest,
) -> Result<Vec<Value>, ApiError> {
    let mut pods = match &req.name {
        Some(name) => metadata.pod(&req.namespace, name).into_iter().collect(),
        None => metadata.pods(Some(&req.namespace)),
    };
    pods.retain(|p| req.label_selector.matches(&p.labels));
    let keys: Vec<(&str, &str)> = pods
        .iter()
        .map(|p| (p.namespace.as_str(), p.name.as_str()))
        .collect();
    let points = store.pod_signals(&keys);
    store.record_served(&mut points.iter().flatten().map(|p| p.timestamp));
    let mut values = Vec::new();
    let mut label = std::collections::BTreeMap::new();
    for (point, meta) in points.into_iter().zip(&pods) {
        let Some(p) = point else { continue };
        let timestamp = p.timestamp.to_system_time();
        if req.metric_selector.is_empty() {
            if let Some(fraction) = req.metric.of(&p.pod) {
                values.push(Value {
                    pod: meta.name.clone(),
                    timestamp,
                    fraction,
                });
            }
            continue;
        }
        for (container, signals) in &p.containers {
            label.insert(CONTAINER_LABEL.to_owned(), container.to_string());
            if !req.metric_selector.matches(&label) {
                continue;
            }
            if let Some(fraction) = req.metric.of(signals) {
                values.push(Value {
                    pod: meta.name.clone(),
                    timestamp,
                    fraction,
                });
            }
        }
    }
    if let (Some(name), true) = (&req.name, values.is_empty()) {
        return Err(ApiError {
            status: metric_not_found_for(req.metric.name(), name),
            encoding: req.error_encoding,
        });
    }
    Ok(values)
}

/// The response body for `values`: `(Content-Type, body)`.
///
/// # Errors
///
/// 400 when the metric selector has an operator `ParseToLabelSelector` refuses (`>`/`<`);
/// 500 when JSON encoding fails (a bug).
pub fn encode(req: &CustomRequest, values: &[Value]) -> Result<(&'static str, Vec<u8>), ApiError> {
    let fail = |status| ApiError {
        status,
        encoding: req.error_encoding,
    };
    let selector =
        selector_object(&req.metric_selector).map_err(|e| fail(Status::bad_request(e)))?;
    match req.encoding {
        Encoding::Protobuf => Ok((
            proto::MEDIA_TYPE,
            proto_body(req, values, selector.as_ref()),
        )),
        _ => {
            let list = json_list(req, values, selector.as_ref());
            let body = if req.pretty {
                serde_json::to_vec_pretty(&list)
            } else {
                serde_json::to_vec(&list).map(|mut b| {
                    b.push(b'\n');
                    b
                })
            }
            .map_err(|e| fail(Status::internal_error(&e.to_string())))?;
            Ok(("application/json", body))
        }
    }
}

/// A share as a quantity exact to the part per million (`Fraction::WHOLE` is `1`).
pub fn quantity(f: Fraction) -> String {
    Quantity::from_cpu_nanocores(u64::from(f.ppm) * 1_000).canonical()
}

fn window_seconds(f: Fraction) -> i64 {
    i64::from(f.window_ms / 1_000)
}

// ---------------------------------------------------------------------------------------------
// Errors, as the library and go-restful word them.

/// custom-metrics-apiserver's `NewMetricNotFoundError`.
pub fn metric_not_found(metric: &str, resource: &str) -> Status {
    Status::failure(
        404,
        "NotFound",
        format!("the server could not find the metric {metric} for {resource}"),
        None,
    )
}

/// custom-metrics-apiserver's `NewMetricNotFoundForError`, for pods.
pub fn metric_not_found_for(metric: &str, pod: &str) -> Status {
    Status::failure(
        404,
        "NotFound",
        format!("the server could not find the metric {metric} for pods {pod}"),
        None,
    )
}

fn route_not_found() -> Status {
    Status::failure(
        404,
        "NotFound",
        "the server could not find the requested resource".to_owned(),
        Some(Default::default()),
    )
}

fn method_not_allowed() -> Status {
    Status::failure(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource".to_owned(),
        Some(Default::default()),
    )
}

// ---------------------------------------------------------------------------------------------
// The objects (JSON).

/// `metav1.LabelSelectorRequirement`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
struct Requirement {
    key: String,
    operator: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    values: Vec<String>,
}

/// `metav1.LabelSelector` as `ParseToLabelSelector` builds it: every requirement in
/// `matchExpressions`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
struct SelectorObject {
    match_expressions: Vec<Requirement>,
}

fn selector_object(s: &LabelSelector) -> Result<Option<SelectorObject>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    let mut match_expressions = Vec::new();
    for r in s.requirements() {
        let operator = match r.operator() {
            Operator::Equals | Operator::DoubleEquals | Operator::In => "In",
            Operator::NotEquals | Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
            other => {
                return Err(format!(
                    "{other:?} isn't a valid operator for metricLabelSelector"
                ))
            }
        };
        match_expressions.push(Requirement {
            key: r.key().to_owned(),
            operator,
            values: r.values().to_vec(),
        });
    }
    Ok(Some(SelectorObject { match_expressions }))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ObjectReference<'a> {
    kind: &'static str,
    namespace: &'a str,
    name: &'a str,
    api_version: &'static str,
}

#[derive(Serialize)]
struct MetricIdentifier<'a> {
    name: &'static str,
    selector: Option<&'a SelectorObject>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ValueV1beta2<'a> {
    described_object: ObjectReference<'a>,
    metric: MetricIdentifier<'a>,
    timestamp: String,
    window_seconds: i64,
    value: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ValueV1beta1<'a> {
    described_object: ObjectReference<'a>,
    metric_name: &'static str,
    timestamp: String,
    window: i64,
    value: String,
    selector: Option<&'a SelectorObject>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ListJson<T> {
    kind: &'static str,
    api_version: &'static str,
    metadata: Empty,
    items: Vec<T>,
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
#[serde(untagged)]
enum AnyList<'a> {
    V1beta2(ListJson<ValueV1beta2<'a>>),
    V1beta1(ListJson<ValueV1beta1<'a>>),
}

fn json_list<'a>(
    req: &'a CustomRequest,
    values: &'a [Value],
    selector: Option<&'a SelectorObject>,
) -> AnyList<'a> {
    let object = |v: &'a Value| ObjectReference {
        kind: "Pod",
        namespace: &req.namespace,
        name: &v.pod,
        api_version: "v1",
    };
    let time = |v: &Value| to_jiff(v.timestamp).to_string();
    fn list<T>(version: CustomVersion, items: Vec<T>) -> ListJson<T> {
        ListJson {
            kind: "MetricValueList",
            api_version: version.api_version(),
            metadata: Empty {},
            items,
        }
    }
    match req.version {
        CustomVersion::V1beta2 => AnyList::V1beta2(list(
            req.version,
            values
                .iter()
                .map(|v| ValueV1beta2 {
                    described_object: object(v),
                    metric: MetricIdentifier {
                        name: req.metric.name(),
                        selector,
                    },
                    timestamp: time(v),
                    window_seconds: window_seconds(v.fraction),
                    value: quantity(v.fraction),
                })
                .collect(),
        )),
        CustomVersion::V1beta1 => AnyList::V1beta1(list(
            req.version,
            values
                .iter()
                .map(|v| ValueV1beta1 {
                    described_object: object(v),
                    metric_name: req.metric.name(),
                    timestamp: time(v),
                    window: window_seconds(v.fraction),
                    value: quantity(v.fraction),
                    selector,
                })
                .collect(),
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// The objects (protobuf): `k8s.io/metrics` `pkg/apis/custom_metrics/v1beta{1,2}/generated.proto`,
// `k8s.io/api` `core/v1` `ObjectReference`, apimachinery `LabelSelector`. Go value fields
// are always written (prost `required`), pointers only when set.

/// `core/v1.ObjectReference`.
#[derive(Clone, PartialEq, Message)]
pub struct ObjectReferenceProto {
    /// `kind`.
    #[prost(string, required, tag = "1")]
    pub kind: String,
    /// `namespace`.
    #[prost(string, required, tag = "2")]
    pub namespace: String,
    /// `name`.
    #[prost(string, required, tag = "3")]
    pub name: String,
    /// `uid`.
    #[prost(string, required, tag = "4")]
    pub uid: String,
    /// `apiVersion`.
    #[prost(string, required, tag = "5")]
    pub api_version: String,
    /// `resourceVersion`.
    #[prost(string, required, tag = "6")]
    pub resource_version: String,
    /// `fieldPath`.
    #[prost(string, required, tag = "7")]
    pub field_path: String,
}

/// `metav1.LabelSelectorRequirement`.
#[derive(Clone, PartialEq, Message)]
pub struct RequirementProto {
    /// `key`.
    #[prost(string, required, tag = "1")]
    pub key: String,
    /// `operator`.
    #[prost(string, required, tag = "2")]
    pub operator: String,
    /// `values`.
    #[prost(string, repeated, tag = "3")]
    pub values: Vec<String>,
}

/// `metav1.LabelSelector` with `matchExpressions` only (an empty `matchLabels` map writes
/// nothing).
#[derive(Clone, PartialEq, Message)]
pub struct SelectorProto {
    /// `matchExpressions`.
    #[prost(message, repeated, tag = "2")]
    pub match_expressions: Vec<RequirementProto>,
}

/// v1beta2 `MetricIdentifier`.
#[derive(Clone, PartialEq, Message)]
pub struct MetricIdentifierProto {
    /// `name`.
    #[prost(string, required, tag = "1")]
    pub name: String,
    /// `selector`.
    #[prost(message, optional, tag = "2")]
    pub selector: Option<SelectorProto>,
}

/// v1beta2 `MetricValue`.
#[derive(Clone, PartialEq, Message)]
pub struct MetricValueV1beta2 {
    /// `describedObject`.
    #[prost(message, required, tag = "1")]
    pub described_object: ObjectReferenceProto,
    /// `metric`.
    #[prost(message, required, tag = "2")]
    pub metric: MetricIdentifierProto,
    /// `timestamp`.
    #[prost(message, required, tag = "3")]
    pub timestamp: proto::Time,
    /// `windowSeconds`.
    #[prost(int64, optional, tag = "4")]
    pub window_seconds: Option<i64>,
    /// `value`.
    #[prost(message, required, tag = "5")]
    pub value: proto::Quantity,
}

/// v1beta1 `MetricValue`.
#[derive(Clone, PartialEq, Message)]
pub struct MetricValueV1beta1 {
    /// `describedObject`.
    #[prost(message, required, tag = "1")]
    pub described_object: ObjectReferenceProto,
    /// `metricName`.
    #[prost(string, required, tag = "2")]
    pub metric_name: String,
    /// `timestamp`.
    #[prost(message, required, tag = "3")]
    pub timestamp: proto::Time,
    /// `window`.
    #[prost(int64, optional, tag = "4")]
    pub window: Option<i64>,
    /// `value`.
    #[prost(message, required, tag = "5")]
    pub value: proto::Quantity,
    /// `selector`.
    #[prost(message, optional, tag = "6")]
    pub selector: Option<SelectorProto>,
}

/// v1beta2 `MetricValueList`.
#[derive(Clone, PartialEq, Message)]
pub struct MetricValueListV1beta2 {
    /// `metadata`.
    #[prost(message, required, tag = "1")]
    pub metadata: proto::ListMeta,
    /// `items`.
    #[prost(message, repeated, tag = "2")]
    pub items: Vec<MetricValueV1beta2>,
}

/// v1beta1 `MetricValueList`.
#[derive(Clone, PartialEq, Message)]
pub struct MetricValueListV1beta1 {
    /// `metadata`.
    #[prost(message, required, tag = "1")]
    pub metadata: proto::ListMeta,
    /// `items`.
    #[prost(message, repeated, tag = "2")]
    pub items: Vec<MetricValueV1beta1>,
}

/// The protobuf body (the enveloped list) for `values`.
fn proto_body(req: &CustomRequest, values: &[Value], selector: Option<&SelectorObject>) -> Vec<u8> {
    let selector = selector.map(|s| SelectorProto {
        match_expressions: s
            .match_expressions
            .iter()
            .map(|r| RequirementProto {
                key: r.key.clone(),
                operator: r.operator.to_owned(),
                values: r.values.clone(),
            })
            .collect(),
    });
    let object = |v: &Value| ObjectReferenceProto {
        kind: "Pod".to_owned(),
        namespace: req.namespace.clone(),
        name: v.pod.clone(),
        api_version: "v1".to_owned(),
        ..ObjectReferenceProto::default()
    };
    let timestamp = |v: &Value| proto::Time::from_system_time(v.timestamp);
    let value = |v: &Value| proto::Quantity::new(quantity(v.fraction));
    let api_version = req.version.api_version();
    match req.version {
        CustomVersion::V1beta2 => proto::encode_object(
            api_version,
            "MetricValueList",
            &MetricValueListV1beta2 {
                metadata: proto::ListMeta::default(),
                items: values
                    .iter()
                    .map(|v| MetricValueV1beta2 {
                        described_object: object(v),
                        metric: MetricIdentifierProto {
                            name: req.metric.name().to_owned(),
                            selector: selector.clone(),
                        },
                        timestamp: timestamp(v),
                        window_seconds: Some(window_seconds(v.fraction)),
                        value: value(v),
                    })
                    .collect(),
            },
        ),
        CustomVersion::V1beta1 => proto::encode_object(
            api_version,
            "MetricValueList",
            &MetricValueListV1beta1 {
                metadata: proto::ListMeta::default(),
                items: values
                    .iter()
                    .map(|v| MetricValueV1beta1 {
                        described_object: object(v),
                        metric_name: req.metric.name().to_owned(),
                        timestamp: timestamp(v),
                        window: Some(window_seconds(v.fraction)),
                        value: value(v),
                        selector: selector.clone(),
                    })
                    .collect(),
            },
        ),
    }
}
