//! From an authenticated, authorized HTTP request for the metrics API to the response:
//! discovery and OpenAPI documents, `get`/`list` of `nodes` and `pods`, and every error the
//! apiserver would write on the way ([`handle`]).
//!
//! The routing, negotiation and error wording live in [`request`]; the documents in
//! [`discovery`](super::discovery) (built by it and [`openapi`](super::openapi), served as a
//! [`Document`]); the objects in [`objects`] and [`types`](super::types); the encodings in
//! [`table`] and [`proto`]. This module only joins them, looks objects up, filters lists and
//! sets the response headers.
//!
//! # Encodings served
//!
//! * JSON (`application/json`; indented when the request asks for pretty output) for objects,
//!   lists, Tables (`Content-Type: application/json`, as the apiserver writes a Table) and
//!   a single-object `PartialObjectMetadata`.
//! * Protobuf (`application/vnd.kubernetes.protobuf`) for objects and lists (the conversion
//!   from the [`types`](super::types) objects is here), and for error Status bodies when
//!   protobuf was negotiated.
//! * Not yet: YAML, and protobuf or YAML `PartialObjectMetadata`, and
//!   `PartialObjectMetadataList`. Those requests get a 406 Status listing the media types
//!   served (`application/json, application/vnd.kubernetes.protobuf`) instead of the apiserver's
//!   answer. An error for a request that negotiated YAML is written as indented JSON, as the
//!   apiserver writes errors when nothing acceptable can encode them.
//!
//! # Not here
//!
//! Authentication, authorization and [`preflight`](super::request::preflight) (the caller's,
//! before [`handle`]); `404 page not found` for paths outside the API ([`handle`] returns
//! `None`); request timeouts.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use k8s_openapi::jiff;

use super::{
    custom::{self, CustomRejection},
    discovery::Discovery,
    document::{Document, NotAcceptable, CACHE_CONTROL_IMMUTABLE, CONTENT_TYPE_JSON},
    negotiate::{self, Encoding, Target},
    objects::{self, MetricsReader},
    openapi::OpenApiV3,
    proto,
    request::{self, ApiError, ApiRequest, ErrorEncoding, Rejection, RequestParts, Resource, Verb},
    table::{self, RowObject},
    types::{NodeMetrics, NodeMetricsList, PodMetrics, PodMetricsList},
};
use crate::{
    body::{full, Body},
    json::{encode_json, encode_json_pretty, EncodeError},
    metadata::MetadataSource,
    status::Status,
};

/// How long an OpenAPI v3 document fetched with its current hash may be cached (`Expires`),
/// as kube-openapi's handler3 sets it: one year.
const IMMUTABLE_FOR: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// What the handler reads from: the metrics, the objects that exist, the documents.
pub struct ApiContext {
    /// The metrics (the store).
    pub store: Arc<dyn MetricsReader>,
    /// Which nodes and pods exist, with their labels.
    pub metadata: Arc<dyn MetadataSource>,
    /// The discovery and OpenAPI documents.
    pub discovery: Arc<Discovery>,
    /// Open watches: their limits and the shutdown signal.
    pub watch: Arc<super::watch::Hub>,
}

/// The response to an (authenticated and authorized) request, or `None` when the path is not
/// one this handler serves: the caller answers those (`404 page not found`).
///
/// Served: `/apis`, `/openapi/v2`, `/openapi/v3` and `/openapi/v3/<path>` (for any method, as
/// the apiserver's non-REST handlers do), everything under `/apis/metrics.k8s.io`, and, when
/// the discovery documents were built with `custom_metrics`, under
/// `/apis/custom.metrics.k8s.io` ([`custom`]).
/// `creationTimestamp` of the objects is the current system time, as in metrics-server.
pub fn handle(ctx: &ApiContext, req: &http::Request<Bytes>) -> Option<Response<Body>> {
    handle_at(ctx, req, SystemTime::now())
}

/// [`handle`] with `now` as the objects' `creationTimestamp`.
pub fn handle_at<B>(
    ctx: &ApiContext,
    req: &http::Request<B>,
    now: SystemTime,
) -> Option<Response<Body>> {
    let parts = RequestParts::from_http(req);
    let accept = parts.accept.unwrap_or("");
    let raw_query = parts.query.unwrap_or("");
    // Only the documents read the query here; resource requests parse it in `request`.
    let query = || request::Query::parse(raw_query);
    let pretty = || request::is_pretty_print(&query(), &parts);
    let if_none_match = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");

    match parts.path {
        "/apis" => {
            return Some(discovery_response(
                ctx.discovery.apis(accept, pretty()),
                if_none_match,
            ))
        }
        "/openapi/v2" => {
            if !negotiate::openapi_accepts_json(accept) {
                return Some(empty(StatusCode::NOT_ACCEPTABLE));
            }
            return Some(document_response(ctx.discovery.openapi_v2(), if_none_match));
        }
        "/openapi/v3" => {
            return Some(document_response(
                ctx.discovery.openapi_v3_index(),
                if_none_match,
            ))
        }
        _ => {}
    }
    if let Some(path) = parts.path.strip_prefix("/openapi/v3/") {
        if !negotiate::openapi_accepts_json(accept) {
            return Some(empty(StatusCode::NOT_ACCEPTABLE));
        }
        let query = query();
        let hash = query.first("hash").unwrap_or_default();
        return Some(openapi_v3_response(
            ctx.discovery.openapi_v3(path, hash),
            if_none_match,
            now,
        ));
    }

    if ctx.discovery.serves_custom_metrics() {
        match custom::parse(&parts) {
            Err(CustomRejection::NotApi) => {}
            Err(CustomRejection::Discovery(version)) => {
                let document = ctx.discovery.custom_metrics(version, accept, pretty())?;
                return Some(discovery_response(document, if_none_match));
            }
            Err(CustomRejection::Error(e)) => return Some(error_response(&e)),
            Ok(req) => {
                let found = custom::find(ctx.store.as_ref(), ctx.metadata.as_ref(), &req)
                    .and_then(|values| custom::encode(&req, &values));
                return Some(match found {
                    Ok((content_type, body)) => respond(StatusCode::OK, content_type, body),
                    Err(e) => error_response(&e),
                });
            }
        }
    }

    let api = match request::parse(&parts) {
        Ok(api) => api,
        Err(Rejection::NotApi) => return None,
        Err(Rejection::Discovery(None)) => {
            return Some(discovery_response(
                ctx.discovery.group(accept, pretty()),
                if_none_match,
            ))
        }
        Err(Rejection::Discovery(Some(version))) => {
            return Some(discovery_response(
                ctx.discovery.resources(version, accept, pretty()),
                if_none_match,
            ))
        }
        Err(Rejection::Error(e)) => return Some(error_response(&e)),
        Err(Rejection::Plain { code, body }) => return Some(plain(code, body)),
    };
    Some(serve(ctx, &api, now).unwrap_or_else(|e| error_response(&e)))
}

// ---------------------------------------------------------------------------------------------
// Objects.

/// What a request found, before encoding.
enum Found {
    Node(Box<NodeMetrics>),
    Nodes(NodeMetricsList),
    Pod(Box<PodMetrics>),
    Pods(PodMetricsList),
}

fn serve(ctx: &ApiContext, api: &ApiRequest, now: SystemTime) -> Result<Response<Body>, ApiError> {
    let fail = |status| ApiError {
        status,
        encoding: api.error_encoding,
    };
    let lister_not_found = || api.not_found().unwrap_or_else(|| fail(Status::default()));
    let found = match (api.resource, api.name.as_deref()) {
        (Resource::Nodes, Some(name)) => {
            let node = ctx.metadata.node(name).ok_or_else(lister_not_found)?;
            let item = objects::node_metrics(ctx.store.as_ref(), std::slice::from_ref(&node), now)
                .into_iter()
                .next()
                .ok_or_else(|| fail(Status::node_metrics_not_found(name)))?;
            Found::Node(Box::new(item.versioned(api.version)))
        }
        (Resource::Pods, Some(name)) => {
            let namespace = api.namespace.as_deref().unwrap_or("");
            let pod = ctx
                .metadata
                .pod(namespace, name)
                .ok_or_else(lister_not_found)?;
            let item = objects::pod_metrics(ctx.store.as_ref(), std::slice::from_ref(&pod), now)
                .into_iter()
                .next()
                .ok_or_else(|| fail(Status::pod_metrics_not_found(namespace, name)))?;
            Found::Pod(Box::new(item.versioned(api.version)))
        }
        (_, None) if api.verb == Verb::Watch => {
            return super::watch::start(&ctx.watch, &ctx.store, &ctx.metadata, api)
        }
        (Resource::Nodes, None) => Found::Nodes(NodeMetricsList::new(
            api.version,
            objects::list_nodes(ctx.store.as_ref(), ctx.metadata.as_ref(), api, now),
        )),
        (Resource::Pods, None) => Found::Pods(PodMetricsList::new(
            api.version,
            objects::list_pods(ctx.store.as_ref(), ctx.metadata.as_ref(), api, now),
        )),
    };
    encode(api, &found)
}

/// The 406 for a format this handler does not write yet.
fn not_served(api: &ApiRequest) -> ApiError {
    ApiError {
        status: Status::not_acceptable(format!(
            "only the following media types are accepted: {}",
            negotiate::SERVED_MEDIA_TYPES.join(", ")
        )),
        encoding: api.error_encoding,
    }
}

fn encode(api: &ApiRequest, found: &Found) -> Result<Response<Body>, ApiError> {
    let table_options = api.transform()?;
    let encoding = api.format.encoding;
    let pretty = api.format.pretty;
    let internal = |e: EncodeError| ApiError {
        status: Status::internal_error(&e.to_string()),
        encoding: api.error_encoding,
    };
    match (api.format.target, encoding) {
        (Target::Object, Encoding::Json) => {
            let body = match found {
                Found::Node(n) => json(n.as_ref(), pretty),
                Found::Nodes(l) => json(l, pretty),
                Found::Pod(p) => json(p.as_ref(), pretty),
                Found::Pods(l) => json(l, pretty),
            }
            .map_err(internal)?;
            Ok(respond(StatusCode::OK, "application/json", body))
        }
        (Target::Object, Encoding::Protobuf) => {
            let version = api.version.api_version();
            let body = match found {
                Found::Node(n) => {
                    proto::encode_object(version, "NodeMetrics", &proto::node_message(n))
                }
                Found::Nodes(l) => {
                    proto::encode_object(version, "NodeMetricsList", &proto::node_list_message(l))
                }
                Found::Pod(p) => {
                    proto::encode_object(version, "PodMetrics", &proto::pod_message(p))
                }
                Found::Pods(l) => {
                    proto::encode_object(version, "PodMetricsList", &proto::pod_list_message(l))
                }
            };
            Ok(respond(StatusCode::OK, proto::MEDIA_TYPE, body))
        }
        (Target::Table(_), Encoding::Json) => {
            let Some(options) = table_options else {
                return Err(not_served(api));
            };
            let table = match found {
                Found::Node(n) => table::node_metrics_table(n, &options),
                Found::Nodes(l) => table::node_metrics_list_table(l, &options),
                Found::Pod(p) => table::pod_metrics_table(p, &options),
                Found::Pods(l) => table::pod_metrics_list_table(l, &options),
            };
            let body = json(&table, pretty).map_err(internal)?;
            Ok(respond(StatusCode::OK, "application/json", body))
        }
        (Target::PartialObjectMetadata(version), Encoding::Json) => {
            let metadata = match found {
                Found::Node(n) => n.metadata.clone(),
                Found::Pod(p) => p.metadata.clone(),
                Found::Nodes(_) | Found::Pods(_) => return Err(not_served(api)),
            };
            let partial = RowObject::PartialObjectMetadata {
                version,
                metadata: Box::new(metadata),
            };
            let body = json(&partial, pretty).map_err(internal)?;
            Ok(respond(StatusCode::OK, "application/json", body))
        }
        _ => Err(not_served(api)),
    }
}

fn json<T: serde::Serialize + ?Sized>(value: &T, pretty: bool) -> Result<Vec<u8>, EncodeError> {
    if pretty {
        encode_json_pretty(value)
    } else {
        encode_json(value)
    }
}

// ---------------------------------------------------------------------------------------------
// Responses.

fn respond(code: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn empty(code: StatusCode) -> Response<Body> {
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = code;
    r
}

/// A Status error in the request's error encoding (YAML falls back to indented JSON).
fn error_response(e: &ApiError) -> Response<Body> {
    let code = StatusCode::from_u16(e.status.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = match e.encoding {
        ErrorEncoding::Negotiated {
            encoding: Encoding::Protobuf,
            ..
        } => {
            let body = proto::encode_object("v1", "Status", &proto::status_message(&e.status));
            return respond(code, proto::MEDIA_TYPE, body);
        }
        ErrorEncoding::Negotiated {
            encoding: Encoding::Json,
            pretty,
        } => json(&e.status, pretty),
        ErrorEncoding::Negotiated {
            encoding: Encoding::Yaml,
            ..
        }
        | ErrorEncoding::RawJson => encode_json_pretty(&e.status),
    };
    match body {
        Ok(body) => respond(code, "application/json", body),
        Err(err) => plain(500, format!("Internal Server Error: {err}\n")),
    }
}

/// Plain text as Go's `http.Error` writes it; `X-Content-Type-Options: nosniff` only on the
/// 500s `http.Error` sends (Go's own 400 for an unparseable target has none).
fn plain(code: u16, body: String) -> Response<Body> {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = crate::body::text(status, body);
    if code != 500 {
        r.headers_mut().remove("x-content-type-options");
    }
    r
}

fn discovery_response(
    document: Result<&Document, NotAcceptable>,
    if_none_match: &str,
) -> Response<Body> {
    match document {
        Ok(d) => document_response(d, if_none_match),
        Err(e) => respond(
            StatusCode::NOT_ACCEPTABLE,
            CONTENT_TYPE_JSON,
            e.document().body,
        ),
    }
}

/// The caching headers of a document (`ETag`, `Vary`, `Cache-Control`).
fn document_headers(d: &Document, r: &mut Response<Body>) {
    let h = r.headers_mut();
    if let Some(etag) = d
        .etag
        .as_deref()
        .and_then(|e| HeaderValue::from_str(e).ok())
    {
        h.insert(header::ETAG, etag);
    }
    if d.vary_accept {
        h.insert(header::VARY, HeaderValue::from_static("Accept"));
    }
    if let Some(cc) = d.cache_control {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cc));
    }
}

/// 200 with the document, or 304 without a body when `If-None-Match` matches its `ETag`.
fn document_response(d: &Document, if_none_match: &str) -> Response<Body> {
    let mut r = if d.not_modified(if_none_match) {
        empty(StatusCode::NOT_MODIFIED)
    } else {
        respond(StatusCode::OK, d.content_type, d.body.clone())
    };
    document_headers(d, &mut r);
    r
}

fn openapi_v3_response(
    answer: OpenApiV3<'_>,
    if_none_match: &str,
    now: SystemTime,
) -> Response<Body> {
    match answer {
        OpenApiV3::NotFound => plain(404, "404 page not found\n".to_owned()),
        OpenApiV3::Redirect { location, document } => {
            let mut r = empty(StatusCode::MOVED_PERMANENTLY);
            document_headers(document, &mut r);
            if let Ok(location) = HeaderValue::from_str(location) {
                r.headers_mut().insert(header::LOCATION, location);
            }
            r
        }
        OpenApiV3::Document {
            document,
            immutable,
        } => {
            let mut r = document_response(document, if_none_match);
            if immutable {
                let h = r.headers_mut();
                h.insert(
                    header::CACHE_CONTROL,
                    HeaderValue::from_static(CACHE_CONTROL_IMMUTABLE),
                );
                let expires = super::types::to_jiff(now + IMMUTABLE_FOR);
                if let Some(v) = jiff::fmt::rfc2822::DateTimePrinter::new()
                    .timestamp_to_rfc9110_string(&expires)
                    .ok()
                    .and_then(|s| HeaderValue::from_str(&s).ok())
                {
                    h.insert(header::EXPIRES, v);
                }
            }
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, future::Future};

    use http_body_util::BodyExt;
    use kpulse_wire::{
        Bytes as WireBytes, ContainerSample, CpuNanos, NodeBatch, NodeSample, PodSample, UnixNanos,
    };

    use super::*;
    use crate::{
        metadata::{MetadataDocument, NodeMeta, PodMeta, StaticMetadata},
        store::{ManualClock, Store, StoreConfig},
    };

    const T0: u64 = 1_700_000_000_000_000_000;
    const V1B1: &str = "/apis/metrics.k8s.io/v1beta1";

    fn batch(t: u64, cpu: u64) -> NodeBatch {
        let pod = |name: &str, container: &str, mem: u64| PodSample {
            uid: format!("u-{name}"),
            namespace: "ns".into(),
            name: name.into(),
            containers: vec![ContainerSample {
                name: container.into(),
                timestamp: UnixNanos(t),
                cgroup_id: None,
                started_at: None,
                cpu: CpuNanos(cpu / 4),
                memory_working_set: WireBytes(mem),
                swap: None,
                signals: None,
            }],
            signals: None,
            ready_since: None,
        };
        NodeBatch {
            node_name: "n1".into(),
            sent_at: UnixNanos(t),
            node: NodeSample {
                timestamp: UnixNanos(t),
                started_at: None,
                cpu: CpuNanos(cpu),
                memory_working_set: WireBytes(1 << 30),
                swap: None,
            },
            pods: vec![pod("web", "app", 200 << 20), pod("db", "pg", 1 << 30)],
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn ctx() -> ApiContext {
        let clock = Arc::new(ManualClock::new(UnixNanos(T0)));
        let store =
            Store::with_clock(StoreConfig::new(Duration::from_secs(10)), clock).expect("store");
        store.ingest(batch(T0, 0)).expect("ingest");
        store
            .ingest(batch(T0 + 1_000_000_000, 2_000_000_000))
            .expect("ingest");
        let metadata = StaticMetadata::new();
        metadata.replace(MetadataDocument {
            nodes: vec![
                NodeMeta {
                    name: "n1".into(),
                    labels: labels(&[("zone", "a")]).into(),
                },
                NodeMeta {
                    name: "n2".into(),
                    labels: labels(&[("zone", "b")]).into(),
                },
            ],
            pods: vec![
                PodMeta {
                    namespace: "ns".into(),
                    name: "web".into(),
                    labels: labels(&[("app", "web")]),
                },
                PodMeta {
                    namespace: "ns".into(),
                    name: "db".into(),
                    labels: labels(&[("app", "db")]),
                },
                PodMeta {
                    namespace: "ns".into(),
                    name: "idle".into(),
                    labels: BTreeMap::new(),
                },
            ],
        });
        ApiContext {
            store: Arc::new(store),
            metadata,
            discovery: Arc::new(
                Discovery::new(crate::api::document::Options::default()).expect("documents"),
            ),
            watch: super::super::watch::Hub::new(super::super::watch::Settings::default()),
        }
    }

    fn now() -> SystemTime {
        UnixNanos(T0 + 2_000_000_000).to_system_time()
    }

    struct Answer {
        status: u16,
        headers: http::HeaderMap,
        body: Vec<u8>,
    }

    impl Answer {
        fn text(&self) -> String {
            String::from_utf8(self.body.clone()).expect("utf8")
        }

        fn header(&self, name: &str) -> Option<&str> {
            self.headers.get(name).and_then(|v| v.to_str().ok())
        }
    }

    fn call(ctx: &ApiContext, req: http::Request<Bytes>) -> Option<Answer> {
        let r = handle_at(ctx, &req, now())?;
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let body = futures_body(r.into_body());
        Some(Answer {
            status,
            headers,
            body,
        })
    }

    fn futures_body(body: crate::body::Body) -> Vec<u8> {
        // A whole body is ready at once: one poll with a no-op waker collects it.
        let mut fut = std::pin::pin!(body.collect());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Ok(c)) => c.to_bytes().to_vec(),
            other => panic!("body not ready: {:?}", other.is_ready()),
        }
    }

    fn req(method: &str, target: &str, accept: Option<&str>) -> http::Request<Bytes> {
        let mut b = http::Request::builder().method(method).uri(target);
        if let Some(a) = accept {
            b = b.header("Accept", a);
        }
        b.body(Bytes::new()).expect("request")
    }

    fn get(ctx: &ApiContext, target: &str) -> Answer {
        call(ctx, req("GET", target, None)).expect("served")
    }

    #[test]
    fn list_pods_json_exact() {
        let c = ctx();
        let a = get(
            &c,
            &format!("{V1B1}/namespaces/ns/pods?labelSelector=app%3Dweb"),
        );
        assert_eq!(a.status, 200);
        assert_eq!(a.header("content-type"), Some("application/json"));
        assert_eq!(
            a.text(),
            concat!(
                r#"{"kind":"PodMetricsList","apiVersion":"metrics.k8s.io/v1beta1","metadata":{},"items":["#,
                r#"{"metadata":{"name":"web","namespace":"ns","creationTimestamp":"2023-11-14T22:13:22Z","labels":{"app":"web"}},"#,
                r#""timestamp":"2023-11-14T22:13:21Z","window":"1s","containers":[{"name":"app","usage":{"cpu":"500m","memory":"200Mi"}}]}]}"#,
                "\n"
            )
        );
        // All namespaces, sorted by namespace then name; the pod without metrics is left out.
        let a = get(&c, &format!("{V1B1}/pods"));
        let v: serde_json::Value = serde_json::from_slice(&a.body).expect("json");
        let names: Vec<&str> = v["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|i| i["metadata"]["name"].as_str())
            .collect();
        assert_eq!(names, ["db", "web"]);
        // Other namespaces are empty lists.
        let a = get(&c, &format!("{V1B1}/namespaces/other/pods"));
        assert!(a.text().contains(r#""items":[]"#), "{}", a.text());
    }

    #[test]
    fn get_node_json_and_pretty() {
        let c = ctx();
        let a = get(&c, &format!("{V1B1}/nodes/n1"));
        assert_eq!(a.status, 200);
        assert_eq!(
            a.text(),
            concat!(
                r#"{"kind":"NodeMetrics","apiVersion":"metrics.k8s.io/v1beta1","#,
                r#""metadata":{"name":"n1","creationTimestamp":"2023-11-14T22:13:22Z","labels":{"zone":"a"}},"#,
                r#""timestamp":"2023-11-14T22:13:21Z","window":"1s","usage":{"cpu":"2","memory":"1Gi"}}"#,
                "\n"
            )
        );
        let a = get(&c, "/apis/metrics.k8s.io/v1/nodes/n1?pretty=true");
        assert!(
            a.text().starts_with(
                "{\n  \"kind\": \"NodeMetrics\",\n  \"apiVersion\": \"metrics.k8s.io/v1\""
            ),
            "{}",
            a.text()
        );
        assert!(!a.text().ends_with('\n'));
    }

    #[test]
    fn not_found_bodies() {
        let c = ctx();
        let a = get(&c, &format!("{V1B1}/namespaces/ns/pods/nope"));
        assert_eq!(a.status, 404);
        assert_eq!(
            a.body,
            encode_json(&Status::pod_not_found("nope")).expect("json")
        );
        assert!(a.text().contains(r#""message":"pods \"nope\" not found""#));
        let a = get(&c, &format!("{V1B1}/namespaces/ns/pods/idle"));
        assert_eq!(a.status, 404);
        assert!(
            a.text()
                .contains(r#""message":"podmetrics.metrics.k8s.io \"ns/idle\" not found""#),
            "{}",
            a.text()
        );
        let a = get(&c, &format!("{V1B1}/nodes/n2"));
        assert_eq!(a.status, 404);
        assert_eq!(
            a.body,
            encode_json(&Status::node_metrics_not_found("n2")).expect("json")
        );
        let a = get(&c, &format!("{V1B1}/nodes/n9"));
        assert_eq!(
            a.body,
            encode_json(&Status::node_not_found("n9")).expect("json")
        );
        // Protobuf clients get a protobuf Status.
        let a = call(
            &c,
            req("GET", &format!("{V1B1}/nodes/n9"), Some(proto::MEDIA_TYPE)),
        )
        .expect("served");
        assert_eq!(a.status, 404);
        assert_eq!(a.header("content-type"), Some(proto::MEDIA_TYPE));
        let s: proto::Status = proto::decode_object(&a.body, "v1", "Status").expect("status");
        assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"));
        assert_eq!(s.message, "node \"n9\" not found");
    }

    #[test]
    fn selectors() {
        let c = ctx();
        let names = |a: &Answer| -> Vec<String> {
            let v: serde_json::Value = serde_json::from_slice(&a.body).expect("json");
            v["items"]
                .as_array()
                .expect("items")
                .iter()
                .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_owned))
                .collect()
        };
        let a = get(&c, &format!("{V1B1}/pods?labelSelector=app%21%3Dweb"));
        assert_eq!(names(&a), ["db"]);
        let a = get(
            &c,
            &format!("{V1B1}/pods?fieldSelector=metadata.name%3Dweb"),
        );
        assert_eq!(names(&a), ["web"]);
        let a = get(
            &c,
            &format!("{V1B1}/pods?fieldSelector=metadata.namespace%3Dother"),
        );
        assert!(names(&a).is_empty());
        let a = get(&c, &format!("{V1B1}/nodes?labelSelector=zone%3Da"));
        assert_eq!(names(&a), ["n1"]);
        let a = get(
            &c,
            &format!("{V1B1}/nodes?fieldSelector=metadata.name%3Dn2"),
        );
        assert!(names(&a).is_empty(), "n2 has no metrics");
        let a = get(&c, &format!("{V1B1}/pods?labelSelector=a%3D%3D%3Db"));
        assert_eq!(a.status, 400);
        assert!(
            a.text().contains(r#""reason":"BadRequest""#),
            "{}",
            a.text()
        );
        let a = get(&c, &format!("{V1B1}/pods?fieldSelector=spec.nodeName%3Dx"));
        assert_eq!(a.status, 400, "{}", a.text());
    }

    #[test]
    fn table() {
        let c = ctx();
        let accept = "application/json;as=Table;v=v1;g=meta.k8s.io";
        let a = call(&c, req("GET", &format!("{V1B1}/nodes"), Some(accept))).expect("served");
        assert_eq!(a.status, 200);
        assert_eq!(a.header("content-type"), Some("application/json"));
        let v: serde_json::Value = serde_json::from_slice(&a.body).expect("json");
        assert_eq!(v["kind"], "Table");
        let columns: Vec<&str> = v["columnDefinitions"]
            .as_array()
            .expect("columns")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(columns, ["Name", "cpu", "memory", "Window"]);
        assert_eq!(
            v["rows"][0]["cells"],
            serde_json::json!(["n1", "2", "1Gi", "1s"])
        );
        assert_eq!(v["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        let a = call(
            &c,
            req(
                "GET",
                &format!("{V1B1}/namespaces/ns/pods/web?includeObject=None"),
                Some(accept),
            ),
        )
        .expect("served");
        let v: serde_json::Value = serde_json::from_slice(&a.body).expect("json");
        assert_eq!(v["rows"][0]["object"], serde_json::Value::Null);
        assert_eq!(v["rows"][0]["cells"][0], "web");
        let a = call(
            &c,
            req(
                "GET",
                &format!("{V1B1}/nodes?includeObject=All"),
                Some(accept),
            ),
        )
        .expect("served");
        assert_eq!(a.status, 400);
    }

    #[test]
    fn protobuf_list() {
        let c = ctx();
        let a = call(
            &c,
            req("GET", &format!("{V1B1}/nodes"), Some(proto::MEDIA_TYPE)),
        )
        .expect("served");
        assert_eq!(a.status, 200);
        assert_eq!(a.header("content-type"), Some(proto::MEDIA_TYPE));
        assert!(a.body.starts_with(b"k8s\0"));
        let l: proto::NodeMetricsList =
            proto::decode_object(&a.body, "metrics.k8s.io/v1beta1", "NodeMetricsList")
                .expect("decode");
        assert_eq!(l.items.len(), 1);
        let n = &l.items[0];
        assert_eq!(n.metadata.name, "n1");
        assert_eq!(n.metadata.labels, labels(&[("zone", "a")]));
        assert_eq!(
            n.metadata.creation_timestamp.unix_seconds(),
            Some(1_700_000_002)
        );
        assert_eq!(n.timestamp.unix_seconds(), Some(1_700_000_001));
        assert_eq!(n.window.duration, 1_000_000_000);
        assert_eq!(n.usage["cpu"].string, "2");
        assert_eq!(n.usage["memory"].string, "1Gi");
        let a = call(
            &c,
            req(
                "GET",
                &format!("{V1B1}/namespaces/ns/pods/web"),
                Some(proto::MEDIA_TYPE),
            ),
        )
        .expect("served");
        let p: proto::PodMetrics =
            proto::decode_object(&a.body, "metrics.k8s.io/v1beta1", "PodMetrics").expect("decode");
        assert_eq!(p.metadata.namespace, "ns");
        assert_eq!(p.containers[0].name, "app");
        assert_eq!(p.containers[0].usage["cpu"].string, "500m");
        assert_eq!(p.containers[0].usage["memory"].string, "200Mi");
    }

    #[test]
    fn unsupported_formats_are_406() {
        let c = ctx();
        let a = call(
            &c,
            req("GET", &format!("{V1B1}/nodes"), Some("application/yaml")),
        )
        .expect("served");
        assert_eq!(a.status, 406);
        assert_eq!(a.header("content-type"), Some("application/json"));
        assert!(a.text().contains(
            "only the following media types are accepted: application/json, application/vnd.kubernetes.protobuf"
        ), "{}", a.text());
        let partial = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
        let a = call(&c, req("GET", &format!("{V1B1}/nodes/n1"), Some(partial))).expect("served");
        assert_eq!(a.status, 200);
        assert!(a.text().starts_with(
            r#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"n1""#
        ), "{}", a.text());
        let list = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
        let a = call(&c, req("GET", &format!("{V1B1}/nodes"), Some(list))).expect("served");
        assert_eq!(a.status, 406);
    }

    #[test]
    fn discovery_documents() {
        let c = ctx();
        let a = get(&c, "/apis");
        assert_eq!(a.status, 200);
        assert_eq!(a.header("content-type"), Some("application/json"));
        assert!(
            a.text().starts_with(r#"{"kind":"APIGroupList""#),
            "{}",
            a.text()
        );
        let a = call(
            &c,
            req(
                "GET",
                "/apis",
                Some(crate::api::document::CONTENT_TYPE_AGGREGATED_V2),
            ),
        )
        .expect("served");
        assert_eq!(a.status, 200);
        assert_eq!(
            a.header("content-type"),
            Some(crate::api::document::CONTENT_TYPE_AGGREGATED_V2)
        );
        assert_eq!(a.header("vary"), Some("Accept"));
        assert_eq!(a.header("cache-control"), Some("public"));
        let etag = a.header("etag").expect("etag").to_owned();
        let mut r = req(
            "GET",
            "/apis",
            Some(crate::api::document::CONTENT_TYPE_AGGREGATED_V2),
        );
        r.headers_mut().insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_str(&etag).expect("etag"),
        );
        let a = call(&c, r).expect("served");
        assert_eq!(a.status, 304);
        assert!(a.body.is_empty());
        let a = get(&c, "/apis/metrics.k8s.io");
        assert!(
            a.text().starts_with(r#"{"kind":"APIGroup""#),
            "{}",
            a.text()
        );
        let a = get(&c, V1B1);
        assert!(a
            .text()
            .contains(r#""groupVersion":"metrics.k8s.io/v1beta1""#));
        let a = call(&c, req("GET", V1B1, Some("text/html"))).expect("served");
        assert_eq!(a.status, 406);
        let a = get(&c, "/openapi/v2");
        assert_eq!(a.status, 200);
        let a = get(&c, "/openapi/v3");
        assert!(a.text().contains("apis/metrics.k8s.io/v1beta1"));
        let a = get(&c, "/openapi/v3/apis/metrics.k8s.io/v1beta1");
        assert_eq!(a.status, 200);
        let a = get(&c, "/openapi/v3/apis/metrics.k8s.io/v1beta1?hash=stale");
        assert_eq!(a.status, 301);
        assert!(a.header("location").is_some());
        assert_eq!(get(&c, "/openapi/v3/nope").status, 404);
    }

    #[test]
    fn methods_watch_and_other_paths() {
        let c = ctx();
        // Watches are served (see `watch.rs`); outside a runtime one cannot start, which
        // is a 500 Status, not a panic.
        let a = get(&c, &format!("{V1B1}/nodes?watch=true"));
        assert_eq!(a.status, 500);
        assert!(a.text().contains("Internal error occurred"), "{}", a.text());
        let a = call(&c, req("POST", &format!("{V1B1}/nodes"), None)).expect("served");
        assert_eq!(a.status, 405);
        assert!(call(&c, req("GET", "/healthz", None)).is_none());
        assert!(call(&c, req("GET", "/api/v1/nodes", None)).is_none());
        assert_eq!(get(&c, &format!("{V1B1}/things")).status, 404);
        let a = get(&c, &format!("{V1B1}/nodes?timeout=x"));
        assert_eq!(a.status, 400);
        let a = get(&c, &format!("{V1B1}/watch"));
        assert_eq!(a.status, 500);
        assert_eq!(a.header("content-type"), Some("text/plain; charset=utf-8"));
        // handle() itself uses the system clock.
        let r = handle(&c, &req("GET", &format!("{V1B1}/nodes/n1"), None)).expect("served");
        assert_eq!(r.status(), 200);
    }

    #[test]
    fn every_path_negotiates_by_the_same_rules() {
        let c = ctx();
        let paths = [
            "/apis".to_string(),
            "/apis/metrics.k8s.io".to_string(),
            V1B1.to_string(),
            format!("{V1B1}/nodes"),
            format!("{V1B1}/nodes/n1"),
            format!("{V1B1}/namespaces/ns/pods/web"),
            "/openapi/v2".to_string(),
        ];
        // (Accept, the media type of the answer, 406 if none): the same rules everywhere.
        let cases = [
            ("application/json;q=0", None),
            ("text/html", None),
            ("application/*;q=0, */*", None),
            ("Application/JSON", Some("application/json")),
            (
                "text/html, application/json;q=0.5",
                Some("application/json"),
            ),
            ("*/*", Some("application/json")),
            ("application/yaml;q=0, */*", Some("application/json")),
        ];
        for (accept, media_type) in cases {
            for path in &paths {
                let a = call(&c, req("GET", path, Some(accept))).expect("served");
                let Some(media_type) = media_type else {
                    assert_eq!(a.status, 406, "{path} with {accept}");
                    continue;
                };
                assert_eq!(a.status, 200, "{path} with {accept}");
                assert!(
                    a.header("content-type")
                        .is_some_and(|t| t.starts_with(media_type)),
                    "{path} with {accept}"
                );
            }
        }
        // Where the path has another encoding, refusing JSON (and YAML, which is negotiated
        // but not written) gets it; where not, 406.
        let accept = "application/json;q=0, application/yaml;q=0, */*;q=0.1";
        for path in &paths {
            let a = call(&c, req("GET", path, Some(accept))).expect("served");
            if path.contains("/nodes") || path.contains("/pods") {
                assert_eq!(a.status, 200, "{path}");
                assert_eq!(a.header("content-type"), Some(proto::MEDIA_TYPE), "{path}");
            } else {
                assert_eq!(a.status, 406, "{path}");
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // custom.metrics.k8s.io

    const CM2: &str = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ns/pods";

    /// `web` (container `app`) and `db` (container `pg`) with signals; `idle` without.
    fn custom_ctx(enabled: bool) -> ApiContext {
        use kpulse_wire::{Fraction, Signals};
        let share = |ppm, window_ms| Some(Fraction { ppm, window_ms });
        let mut b = batch(T0 + 1_000_000_000, 2_000_000_000);
        for (i, pod) in b.pods.iter_mut().enumerate() {
            let i = u32::try_from(i).expect("few pods");
            pod.signals = Some(Signals {
                cpu_pressure: share(250_000 + i, 30_000),
                memory_pressure: None,
                cpu_throttled: share(500_000 + i, 31_900),
            });
            pod.containers[0].signals = Some(Signals {
                cpu_pressure: share(100_000 + i, 30_000),
                memory_pressure: share(0, 30_000),
                // A figure no agent could send is dropped at ingest.
                cpu_throttled: share(2_000_000, 30_000),
            });
        }
        let c = ctx();
        let clock = Arc::new(ManualClock::new(UnixNanos(T0)));
        let store =
            Store::with_clock(StoreConfig::new(Duration::from_secs(10)), clock).expect("store");
        store.ingest(b).expect("ingest");
        ApiContext {
            store: Arc::new(store),
            discovery: Arc::new(
                Discovery::new(crate::api::document::Options {
                    custom_metrics: enabled,
                    ..crate::api::document::Options::default()
                })
                .expect("documents"),
            ),
            ..c
        }
    }

    #[test]
    fn custom_metrics_are_served_only_when_enabled() {
        let off = custom_ctx(false);
        assert!(call(&off, req("GET", &format!("{CM2}/*/cpu_pressure"), None)).is_none());
        assert!(!get(&off, "/apis").text().contains("custom.metrics"));
        let on = custom_ctx(true);
        assert_eq!(get(&on, &format!("{CM2}/*/cpu_pressure")).status, 200);
        // The metrics.k8s.io API is the same either way.
        assert_eq!(
            get(&on, &format!("{V1B1}/namespaces/ns/pods")).body,
            get(&off, &format!("{V1B1}/namespaces/ns/pods")).body
        );
    }

    #[test]
    fn custom_metrics_discovery() {
        let c = custom_ctx(true);
        let a = get(&c, "/apis/custom.metrics.k8s.io/v1beta2");
        assert_eq!(a.status, 200);
        assert_eq!(
            a.text(),
            concat!(
                r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"custom.metrics.k8s.io/v1beta2","resources":["#,
                r#"{"name":"pods/cpu_pressure","singularName":"","namespaced":true,"kind":"MetricValueList","verbs":["get"]},"#,
                r#"{"name":"pods/cpu_throttled_ratio","singularName":"","namespaced":true,"kind":"MetricValueList","verbs":["get"]},"#,
                r#"{"name":"pods/memory_pressure","singularName":"","namespaced":true,"kind":"MetricValueList","verbs":["get"]}]}"#,
                "\n"
            )
        );
        let group: serde_json::Value =
            serde_json::from_slice(&get(&c, "/apis/custom.metrics.k8s.io").body).expect("json");
        assert_eq!(group["kind"], "APIGroup");
        assert_eq!(group["preferredVersion"]["version"], "v1beta2");
        let apis: serde_json::Value = serde_json::from_slice(&get(&c, "/apis").body).expect("json");
        let names: Vec<&str> = apis["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .filter_map(|g| g["name"].as_str())
            .collect();
        assert_eq!(names, ["metrics.k8s.io", "custom.metrics.k8s.io"]);
        assert_eq!(
            apis["groups"][1]["serverAddressByClientCIDRs"][0]["clientCIDR"],
            "0.0.0.0/0"
        );
        // Aggregated discovery: a parent `pods` without kind or verbs, one subresource per
        // metric, as the apiserver converts such a resource list.
        let agg = call(
            &c,
            req(
                "GET",
                "/apis",
                Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
            ),
        )
        .expect("served");
        let agg: serde_json::Value = serde_json::from_slice(&agg.body).expect("json");
        let custom = &agg["items"][1];
        assert_eq!(custom["metadata"]["name"], "custom.metrics.k8s.io");
        let pods = &custom["versions"][0]["resources"][0];
        assert_eq!(pods["resource"], "pods");
        assert!(pods["verbs"].is_null());
        assert_eq!(
            pods["subresources"][1]["subresource"],
            "cpu_throttled_ratio"
        );
        assert_eq!(
            pods["subresources"][1]["responseKind"]["kind"],
            "MetricValueList"
        );
    }

    #[test]
    fn custom_metric_values_json_exact() {
        let c = custom_ctx(true);
        // The pods `labelSelector` selects, each pod's own series; `idle` has none.
        let a = get(
            &c,
            &format!("{CM2}/*/cpu_pressure?labelSelector=app%20in%20(web,idle)"),
        );
        assert_eq!(a.status, 200);
        assert_eq!(a.header("content-type"), Some("application/json"));
        assert_eq!(
            a.text(),
            concat!(
                r#"{"kind":"MetricValueList","apiVersion":"custom.metrics.k8s.io/v1beta2","metadata":{},"items":["#,
                r#"{"describedObject":{"kind":"Pod","namespace":"ns","name":"web","apiVersion":"v1"},"#,
                r#""metric":{"name":"cpu_pressure","selector":null},"timestamp":"2023-11-14T22:13:21Z","#,
                r#""windowSeconds":30,"value":"250m"}]}"#,
                "\n"
            )
        );
        // v1beta1: `metricName`, `window`, `selector` at the top; pods sorted by name.
        let a = get(
            &c,
            "/apis/custom.metrics.k8s.io/v1beta1/namespaces/ns/pods/*/cpu_throttled_ratio",
        );
        let v: serde_json::Value = serde_json::from_slice(&a.body).expect("json");
        let items = v["items"].as_array().expect("items");
        assert_eq!(items.len(), 2);
        assert_eq!(items[0]["describedObject"]["name"], "db");
        assert_eq!(items[0]["metricName"], "cpu_throttled_ratio");
        assert_eq!(items[0]["value"], "500001u");
        assert_eq!(items[0]["window"], 31);
        assert!(items[0]["selector"].is_null());
        assert_eq!(items[1]["value"], "500m");
    }

    #[test]
    fn custom_metric_container_series() {
        let c = custom_ctx(true);
        let a = get(
            &c,
            &format!("{CM2}/web/cpu_pressure?metricLabelSelector=container%3Dapp"),
        );
        let v: serde_json::Value = serde_json::from_slice(&a.body).expect("json");
        assert_eq!(v["items"].as_array().map(Vec::len), Some(1));
        assert_eq!(v["items"][0]["value"], "100m");
        assert_eq!(
            v["items"][0]["metric"]["selector"],
            serde_json::json!({"matchExpressions":[{"key":"container","operator":"In","values":["app"]}]})
        );
        // A selector matching no container of the named pod: NotFound, as the library words it.
        let a = get(
            &c,
            &format!("{CM2}/web/cpu_pressure?metricLabelSelector=container%3Dnone"),
        );
        assert_eq!(a.status, 404);
        let v: serde_json::Value = serde_json::from_slice(&a.body).expect("json");
        assert_eq!(
            v["message"],
            "the server could not find the metric cpu_pressure for pods web"
        );
        // The invalid throttling figure of the container was dropped at ingest.
        let a = get(
            &c,
            &format!("{CM2}/*/cpu_throttled_ratio?metricLabelSelector=container"),
        );
        let v: serde_json::Value = serde_json::from_slice(&a.body).expect("json");
        assert_eq!(v["items"], serde_json::json!([]));
    }

    #[test]
    fn custom_metric_errors() {
        let c = custom_ctx(true);
        let message = |target: &str, method: &str| {
            let a = call(&c, req(method, target, None)).expect("served");
            let v: serde_json::Value = serde_json::from_slice(&a.body).expect("json");
            (
                a.status,
                v["message"].as_str().unwrap_or_default().to_owned(),
            )
        };
        assert_eq!(
            message(&format!("{CM2}/*/no_such_metric"), "GET"),
            (
                404,
                "the server could not find the metric no_such_metric for pods".into()
            )
        );
        assert_eq!(
            message(
                "/apis/custom.metrics.k8s.io/v1beta2/nodes/n1/cpu_pressure",
                "GET"
            ),
            (
                404,
                "the server could not find the metric cpu_pressure for nodes".into()
            )
        );
        assert_eq!(
            message(
                "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ns/metrics/cpu_pressure",
                "GET"
            ),
            (
                404,
                "the server could not find the metric cpu_pressure for namespaces".into()
            )
        );
        assert_eq!(
            message(&format!("{CM2}/idle/cpu_pressure"), "GET"),
            (
                404,
                "the server could not find the metric cpu_pressure for pods idle".into()
            )
        );
        assert_eq!(message(&format!("{CM2}/gone/cpu_pressure"), "GET").0, 404);
        assert_eq!(message(&format!("{CM2}/*/cpu_pressure"), "POST").0, 405);
        assert_eq!(message("/apis/custom.metrics.k8s.io/v9/x", "GET").0, 404);
        let (code, text) = message(&format!("{CM2}/*/cpu_pressure?labelSelector=a%20in"), "GET");
        assert_eq!(code, 400, "{text}");
        // A selector `metav1.LabelSelector` cannot hold.
        let (code, text) = message(
            &format!("{CM2}/*/cpu_pressure?metricLabelSelector=n%3E1"),
            "GET",
        );
        assert_eq!(code, 400, "{text}");
        let yaml = call(
            &c,
            req(
                "GET",
                &format!("{CM2}/*/cpu_pressure"),
                Some("application/yaml"),
            ),
        )
        .expect("served");
        assert_eq!(yaml.status, 406);
    }

    #[test]
    fn custom_metric_values_protobuf() {
        use crate::api::custom::{MetricValueListV1beta1, MetricValueListV1beta2};
        let c = custom_ctx(true);
        let pb = Some("application/vnd.kubernetes.protobuf");
        let a = call(&c, req("GET", &format!("{CM2}/*/cpu_pressure"), pb)).expect("served");
        assert_eq!(a.header("content-type"), Some(proto::MEDIA_TYPE));
        let list: MetricValueListV1beta2 =
            proto::decode_object(&a.body, "custom.metrics.k8s.io/v1beta2", "MetricValueList")
                .expect("decode");
        let got: Vec<(&str, &str, Option<i64>)> = list
            .items
            .iter()
            .map(|i| {
                (
                    i.described_object.name.as_str(),
                    i.value.string.as_str(),
                    i.window_seconds,
                )
            })
            .collect();
        assert_eq!(
            got,
            [("db", "250001u", Some(30)), ("web", "250m", Some(30))]
        );
        assert_eq!(list.items[0].metric.name, "cpu_pressure");
        assert_eq!(list.items[0].described_object.kind, "Pod");
        let a = call(
            &c,
            req(
                "GET",
                "/apis/custom.metrics.k8s.io/v1beta1/namespaces/ns/pods/web/memory_pressure?metricLabelSelector=container%3Dapp",
                pb,
            ),
        )
        .expect("served");
        let list: MetricValueListV1beta1 =
            proto::decode_object(&a.body, "custom.metrics.k8s.io/v1beta1", "MetricValueList")
                .expect("decode");
        assert_eq!(list.items.len(), 1);
        assert_eq!(list.items[0].metric_name, "memory_pressure");
        assert_eq!(list.items[0].value.string, "0");
        let selector = list.items[0].selector.as_ref().expect("selector");
        assert_eq!(selector.match_expressions[0].key, "container");
        // Errors in protobuf too, when asked for.
        let a = call(&c, req("GET", &format!("{CM2}/*/nope"), pb)).expect("served");
        assert_eq!(a.status, 404);
        assert_eq!(a.header("content-type"), Some(proto::MEDIA_TYPE));
    }
}
