//! From an HTTP request to a typed metrics.k8s.io request, with the answers metrics-server
//! (through `k8s.io/apiserver`) gives to everything it does not serve.
//!
//! # Stages, in the apiserver's order
//!
//! 1. [`preflight`], before authentication, as the handler chain does it
//!    (`server/config.go`, `DefaultBuildHandlerChain`):
//!    * the request target is parsed like Go's `url.ParseRequestURI`: a bad `%` escape in the
//!      path is Go's plain `400 Bad Request`; the path is percent-decoded before anything
//!      routes on it, so `%2F` becomes a separator and `%2e%2e` a `..` segment;
//!    * [`RequestInfo`] (`endpoints/request/requestinfo.go`): verb, group, version, namespace,
//!      resource, subresource, name, raw selectors — what authorization is asked about. A path
//!      like `/apis/g/v/watch` fails it with a plain-text 500 (`filters/requestinfo.go`);
//!    * `?timeout=` on every request but watches (`filters/request_deadline.go`): a bad Go
//!      duration is a 400 Status;
//!    * kpulse's own bound: a query over [`MAX_QUERY_BYTES`] is a 400 Status.
//! 2. Authentication and authorization: the caller's, with [`RequestInfo::attributes`].
//! 3. [`parse`]: routing like go-restful's `CurlyRouter` over the routes the installer
//!    registers for a getter+lister without watch (`endpoints/installer.go`):
//!    `GET {nodes, nodes/{name}, pods, namespaces/{ns}/pods, namespaces/{ns}/pods/{name}}` and
//!    the discovery document at the group version root. No route for the path: 404 Status
//!    `the server could not find the requested resource`; a route but not for the method
//!    (HEAD, OPTIONS, POST, PUT, PATCH, DELETE, …): 405 `the server does not allow this
//!    method on the requested resource`; an `Accept` naming none of the route's media types
//!    (parameters ignored, `*/*` matches; [`negotiate::route_accepts`]): go-restful's 406
//!    `406: Not Acceptable\n\nAvailable representations: …`. Paths outside `/apis/metrics.k8s.io/` are [`Rejection::NotApi`]
//!    (the apiserver's plain `404 page not found`, unless the caller serves them).
//! 4. Still in [`parse`], the handler (`handlers/get.go`): content negotiation by the rules
//!    every path shares ([`negotiate::choose`], RFC 9110's where goautoneg is looser): JSON,
//!    YAML, protobuf;
//!    `as=Table;g=meta.k8s.io;v=v1|v1beta1` for JSON and YAML only;
//!    `as=PartialObjectMetadata[List]` for any; none acceptable: 406 `only the following media
//!    types are accepted: application/json, application/yaml,
//!    application/vnd.kubernetes.protobuf`. Then query parameters ([`query`](super::query)):
//!    `ListOptions` decoding (integer errors, then label selector, then field selector:
//!    400), validation (422
//!    `ListOptions.meta.k8s.io "" is invalid: …`), field labels (400), `?watch=` (405
//!    `watch is not supported on resources of kind "nodes.metrics.k8s.io"`: metrics-server
//!    has no watch); for a get, `?export=true` (400).
//! 5. The store lookup: the caller's. A get of a name that can never exist (not a DNS-1123
//!    subdomain, or a namespace that is not a DNS-1123 label; `..`, `%2e%2e`, `a%2Fb` …)
//!    already answers here with exactly the 404 the lister would give (`node "…" not found`,
//!    `pods "…" not found`): metrics-server does not validate names, it looks them up.
//! 6. [`ApiRequest::transform`], after the lookup as in `transformResponseObject`: Table
//!    options (`?includeObject=`, 400) and PartialObjectMetadata on the wrong kind of object
//!    (406).
//!
//! Every error is a [`Rejection`]; Status bodies carry the encoding the apiserver would write
//! them in ([`ErrorEncoding`]): negotiated without conversions, or, when nothing in `Accept`
//! is acceptable, indented raw JSON (`responsewriters.WriteRawJSON`).
//!
//! metrics-server ignores `limit` and `continue` (its listers return everything, no continue
//! token), `resourceVersion`, `allowWatchBookmarks` and `shardSelector`; they are parsed (a
//! non-integer `limit` is still a 400) and kept in [`ListOptions`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;

use crate::api::negotiate::{self, Encoding, Endpoint, Target, MEDIA_TYPES};
use crate::api::query::{decode_list_options, invalid_list_options, validate_list_options};
use crate::api::selector::{is_dns1123_label, is_dns1123_subdomain};
use crate::api::table::{IncludeObject, TableOptions};
use crate::api::types::MetricsVersion;
use crate::go;
use crate::status::{RequestAttributes, Status};

pub use crate::api::query::ListOptions;
pub(crate) use crate::api::query::Query;

/// Longest raw query string accepted, in bytes (kpulse's bound; the apiserver has none).
pub const MAX_QUERY_BYTES: usize = 16 * 1024;

/// The media types a watch is served in (`MediaTypesForSerializer`'s stream types).
pub const STREAM_MEDIA_TYPES: [&str; 2] = [
    "application/json;stream=watch",
    "application/vnd.kubernetes.protobuf;stream=watch",
];

/// What this module reads from an HTTP request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestParts<'a> {
    /// The method, as sent (`GET`, `HEAD`, …).
    pub method: &'a str,
    /// The path as received, still percent-encoded (`http::Uri::path`).
    pub path: &'a str,
    /// The raw query, without `?`; `None` when the target has no `?`.
    pub query: Option<&'a str>,
    /// The first `Accept` header's value.
    pub accept: Option<&'a str>,
    /// The first `User-Agent` header's value.
    pub user_agent: Option<&'a str>,
}

impl<'a> RequestParts<'a> {
    /// The parts of an `http::Request`. Header values that are not visible ASCII are taken as
    /// absent.
    pub fn from_http<B>(request: &'a http::Request<B>) -> Self {
        let header = |name: http::header::HeaderName| {
            request.headers().get(name).and_then(|v| v.to_str().ok())
        };
        Self {
            method: request.method().as_str(),
            path: request.uri().path(),
            query: request.uri().query(),
            accept: header(http::header::ACCEPT),
            user_agent: header(http::header::USER_AGENT),
        }
    }

    /// The request target as Go's `req.RequestURI` holds it.
    fn request_uri(&self) -> String {
        match self.query {
            Some(q) => format!("{}?{q}", self.path),
            None => self.path.to_owned(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Typed request.

/// The two resources of the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    /// `nodes` (`NodeMetrics`), cluster-scoped.
    Nodes,
    /// `pods` (`PodMetrics`), namespaced.
    Pods,
}

impl Resource {
    /// The URL segment: `nodes` or `pods`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nodes => "nodes",
            Self::Pods => "pods",
        }
    }
}

/// What the request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    /// One object by name.
    Get,
    /// A collection.
    List,
    /// A watch on a collection (`?watch=true`): a stream of changes (`watch.rs`).
    /// metrics-server answers these with 405.
    Watch,
}

/// The negotiated response format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Format {
    /// The serialization.
    pub encoding: Encoding,
    /// The object to write.
    pub target: Target,
    /// Indented JSON (`?pretty=true`, `;pretty=1`, or a curl, Wget or `Mozilla/5.0` user
    /// agent); only ever set with [`Encoding::Json`].
    pub pretty: bool,
}

/// A request for the metrics API, routed, negotiated and with its parameters checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiRequest {
    /// The group version in the path.
    pub version: MetricsVersion,
    /// `nodes` or `pods`.
    pub resource: Resource,
    /// The namespace for pods; `None` for nodes and for pods across all namespaces (also
    /// `/namespaces//pods`, which the apiserver lists across all namespaces too).
    pub namespace: Option<String>,
    /// The object name, for a get.
    pub name: Option<String>,
    /// [`Verb::Get`] or [`Verb::List`].
    pub verb: Verb,
    /// Query parameters.
    pub options: ListOptions,
    /// The response format.
    pub format: Format,
    /// How to write an error for this request.
    pub error_encoding: ErrorEncoding,
    /// `?timeout=` in nanoseconds, when given (see [`Preflight::timeout_nanos`]).
    pub timeout_nanos: Option<i64>,
}

impl ApiRequest {
    /// The checks the apiserver makes after the store lookup, before encoding
    /// (`transformResponseObject`): Table options, and PartialObjectMetadata versus the kind
    /// of response. Returns the Table options when the target is a Table.
    ///
    /// # Errors
    ///
    /// 400 for a bad `includeObject`; 406 for `PartialObjectMetadata` on a list or
    /// `PartialObjectMetadataList` on a single object.
    pub fn transform(&self) -> Result<Option<TableOptions>, ApiError> {
        let fail = |status| ApiError {
            status,
            encoding: self.error_encoding,
        };
        // A watch transforms each event's object, not a list.
        let internal = match (self.resource, self.verb) {
            (Resource::Nodes, Verb::Get | Verb::Watch) => "*metrics.NodeMetrics",
            (Resource::Nodes, Verb::List) => "*metrics.NodeMetricsList",
            (Resource::Pods, Verb::Get | Verb::Watch) => "*metrics.PodMetrics",
            (Resource::Pods, Verb::List) => "*metrics.PodMetricsList",
        };
        match self.format.target {
            Target::Object => Ok(None),
            Target::Table(version) => {
                let include_object = IncludeObject::from_query(self.options.include_object.as_deref())
                    .map_err(fail)?;
                Ok(Some(TableOptions {
                    version,
                    include_object,
                    metrics_version: self.version,
                }))
            }
            Target::PartialObjectMetadata(_) if self.verb == Verb::List => Err(fail(
                Status::not_acceptable(format!(
                    "you requested PartialObjectMetadata, but the requested object is a list ({internal})"
                )),
            )),
            Target::PartialObjectMetadataList(_) if self.verb != Verb::List => Err(fail(
                Status::not_acceptable(format!(
                    "you requested PartialObjectMetadataList, but the requested object is not a list ({internal})"
                )),
            )),
            Target::PartialObjectMetadata(_) | Target::PartialObjectMetadataList(_) => Ok(None),
        }
    }

    /// The 404 the apiserver sends when the named object is not in the store, as
    /// metrics-server's listers word it (`node "<name>" not found`, `pods "<name>" not
    /// found`). `None` for lists.
    pub fn not_found(&self) -> Option<ApiError> {
        let name = self.name.as_deref()?;
        let status = match self.resource {
            Resource::Nodes => Status::node_not_found(name),
            Resource::Pods => Status::pod_not_found(name),
        };
        Some(ApiError {
            status,
            encoding: self.error_encoding,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Errors.

/// How to write a Status error body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorEncoding {
    /// In the encoding negotiated from `Accept` without conversions (`ErrorNegotiated`):
    /// Status as JSON (indented when `pretty`), YAML or protobuf.
    Negotiated {
        /// The serialization.
        encoding: Encoding,
        /// Indented JSON.
        pretty: bool,
    },
    /// Nothing in `Accept` is acceptable for a Status: `json.MarshalIndent(status, "", "  ")`,
    /// `Content-Type: application/json` (`responsewriters.WriteRawJSON`).
    RawJson,
}

/// A Status error response.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// The body; its code is the HTTP status.
    pub status: Status,
    /// How to write it.
    pub encoding: ErrorEncoding,
}

/// Why a request is not an [`ApiRequest`].
#[derive(Clone, Debug, PartialEq)]
pub enum Rejection {
    /// Outside `/apis/metrics.k8s.io/` (or that prefix without a path boundary): not this
    /// API's. The apiserver answers `404 page not found` in plain text unless another
    /// handler serves the path.
    NotApi,
    /// `GET /apis/metrics.k8s.io` (`None`) or `GET /apis/metrics.k8s.io/<version>`: the
    /// discovery documents, the caller's to serve.
    Discovery(Option<MetricsVersion>),
    /// A Status error.
    Error(ApiError),
    /// A plain-text error Go's HTTP server or the apiserver writes without a Status:
    /// `400 Bad Request` for an unparseable target, a 500 when `RequestInfo` fails. Write
    /// `body` as `text/plain; charset=utf-8` (with `X-Content-Type-Options: nosniff` for the
    /// 500, which `http.Error` sets).
    Plain {
        /// The HTTP status code.
        code: u16,
        /// The body.
        body: String,
    },
}

impl From<ApiError> for Rejection {
    fn from(e: ApiError) -> Self {
        Self::Error(e)
    }
}

fn generic_status(code: u16, reason: &str, message: &str) -> Status {
    Status(Box::new(meta::Status {
        code: Some(i32::from(code)),
        details: Some(meta::StatusDetails::default()),
        message: Some(message.to_owned()),
        metadata: meta::ListMeta::default(),
        reason: Some(reason.to_owned()),
        status: Some("Failure".to_owned()),
    }))
}

/// go-restful's 404 as the apiserver rewrites it (`apierrors.NewGenericServerResponse`).
fn route_not_found() -> Status {
    generic_status(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

/// go-restful's 405 as the apiserver rewrites it.
fn method_not_allowed() -> Status {
    generic_status(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
    )
}

// ---------------------------------------------------------------------------------------------
// Stage 1: preflight.

/// The apiserver's `RequestInfo` for a request: what authorization is asked about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// `/api…` or `/apis/<group>/<version>/…` with at least a resource segment.
    pub is_resource_request: bool,
    /// The decoded path.
    pub path: String,
    /// The Kubernetes verb (`get`, `list`, `watch`, `create`, …) for resource requests; the
    /// lowercased HTTP method otherwise. Empty for methods the apiserver has no verb for.
    pub verb: String,
    /// `api` or `apis`.
    pub api_prefix: String,
    /// The API group (empty for `/api`).
    pub api_group: String,
    /// The API version.
    pub api_version: String,
    /// The namespace, or empty.
    pub namespace: String,
    /// The resource, e.g. `pods`.
    pub resource: String,
    /// The subresource, or empty.
    pub subresource: String,
    /// The name, or empty; for a list, the name a `metadata.name=` field selector pins.
    pub name: String,
    /// The path segments from the resource on.
    pub parts: Vec<String>,
    /// The raw `fieldSelector` of a list or watch (selector authorization).
    pub field_selector: String,
    /// The raw `labelSelector` of a list or watch.
    pub label_selector: String,
}

impl RequestInfo {
    /// The authorizer attributes for `user` (for a SubjectAccessReview, and for
    /// [`Status::forbidden`]).
    pub fn attributes<'a>(&'a self, user: &'a str) -> RequestAttributes<'a> {
        RequestAttributes {
            user,
            verb: &self.verb,
            resource_request: self.is_resource_request,
            path: &self.path,
            api_group: &self.api_group,
            resource: &self.resource,
            subresource: &self.subresource,
            namespace: &self.namespace,
            name: &self.name,
        }
    }

    /// Whether the apiserver treats the request as long-running (no deadline): metrics-server
    /// configures only the `watch` verb as such.
    pub fn is_long_running(&self) -> bool {
        self.verb == "watch"
    }
}

/// The outcome of [`preflight`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preflight {
    /// What authorization is asked about.
    pub info: RequestInfo,
    /// `?timeout=`, in nanoseconds (Go's `time.Duration`; may be zero or negative, which the
    /// apiserver treats as "no shorter than the server's maximum"). `None` when absent or
    /// for watches.
    pub timeout_nanos: Option<i64>,
}

/// Stage 1: what the apiserver checks before authentication, for any path.
///
/// # Errors
///
/// [`Rejection::Plain`] for an unparseable target or a failing `RequestInfo`;
/// [`Rejection::Error`] for a bad `?timeout=` or an over-long query.
pub fn preflight(parts: &RequestParts<'_>) -> Result<Preflight, Rejection> {
    preflight_decoded(parts).map(|(preflight, _)| preflight)
}

fn preflight_decoded(parts: &RequestParts<'_>) -> Result<(Preflight, Decoded), Rejection> {
    let decoded = Decoded::new(parts)?;
    let info = decoded.request_info(parts)?;
    let mut timeout_nanos = None;
    if !info.is_long_running() {
        if let Some(value) = decoded.query.first("timeout").filter(|v| !v.is_empty()) {
            match go::parse_duration(value) {
                Ok(nanos) => timeout_nanos = Some(nanos),
                Err(e) => {
                    return Err(Rejection::Error(ApiError {
                        status: Status::bad_request(format!(
                            "invalid timeout specified in the request URL - {e}"
                        )),
                        encoding: error_encoding(parts),
                    }))
                }
            }
        }
    }
    Ok((
        Preflight {
            info,
            timeout_nanos,
        },
        decoded,
    ))
}

/// The path and query, decoded once.
struct Decoded {
    /// The path as text (invalid UTF-8 as U+FFFD, as Go's JSON shows it).
    path: String,
    /// The path's bytes, for `EscapedPath`.
    path_bytes: Vec<u8>,
    query: Query,
}

impl Decoded {
    fn new(parts: &RequestParts<'_>) -> Result<Self, Rejection> {
        let Ok(path) = go::unescape(parts.path, go::Part::Path) else {
            return Err(Rejection::Plain {
                code: 400,
                body: "400 Bad Request".to_owned(),
            });
        };
        let raw_query = parts.query.unwrap_or("");
        if raw_query.len() > MAX_QUERY_BYTES {
            return Err(Rejection::Error(ApiError {
                status: Status::bad_request(format!(
                    "the query string is too long: {} bytes, at most {MAX_QUERY_BYTES} are accepted",
                    raw_query.len()
                )),
                encoding: error_encoding(parts),
            }));
        }
        Ok(Self {
            path: go::lossy(&path),
            path_bytes: path,
            query: Query::parse(raw_query),
        })
    }

    /// `RequestInfoFactory.NewRequestInfo` with prefixes `api`, `apis` (groupless `api`).
    fn request_info(&self, parts: &RequestParts<'_>) -> Result<RequestInfo, Rejection> {
        let mut info = RequestInfo {
            path: self.path.clone(),
            verb: parts.method.to_lowercase(),
            ..RequestInfo::default()
        };
        let segments = split_path(&self.path);
        if segments.len() < 3 {
            return Ok(info);
        }
        let mut current: &[&str] = &segments;
        let prefix = current[0];
        if prefix != "api" && prefix != "apis" {
            return Ok(info);
        }
        info.api_prefix = prefix.to_owned();
        current = &current[1..];
        if prefix != "api" {
            if current.len() < 3 {
                return Ok(info);
            }
            info.api_group = current[0].to_owned();
            current = &current[1..];
        }
        info.is_resource_request = true;
        info.api_version = current[0].to_owned();
        current = &current[1..];

        let mut verb_via_path = false;
        if matches!(current[0], "proxy" | "watch") {
            if current.len() < 2 {
                let url = format!(
                    "{}{}",
                    go::escaped_path(parts.path, &self.path_bytes),
                    parts.query.map(|q| format!("?{q}")).unwrap_or_default()
                );
                let message = format!(
                    "Internal Server Error: {}: failed to create RequestInfo: unable to determine kind and namespace from url, {url}",
                    go::quote(&parts.request_uri())
                );
                return Err(Rejection::Plain {
                    code: 500,
                    body: format!("{}\n", sanitize_html(&message)),
                });
            }
            info.verb = current[0].to_owned();
            current = &current[1..];
            verb_via_path = true;
        } else {
            info.verb = match parts.method {
                "POST" => "create",
                "GET" | "HEAD" => "get",
                "PUT" => "update",
                "PATCH" => "patch",
                "DELETE" => "delete",
                _ => "",
            }
            .to_owned();
        }

        if current[0] == "namespaces" && current.len() > 1 {
            info.namespace = current[1].to_owned();
            if current.len() > 2 && !matches!(current[2], "status" | "finalize") {
                current = &current[2..];
            }
        }
        info.parts = current.iter().map(|s| (*s).to_owned()).collect();
        if current.len() >= 3 && info.verb != "proxy" {
            info.subresource = current[2].to_owned();
        }
        if current.len() >= 2 {
            info.name = current[1].to_owned();
        }
        if !current.is_empty() {
            info.resource = current[0].to_owned();
        }

        if info.name.is_empty() && info.verb == "get" {
            let watch = match decode_list_options(&self.query) {
                Ok(opts) => {
                    if let Some(name) = opts.field_selector.requires_exact_match("metadata.name") {
                        if is_path_segment_name(name) {
                            info.name = name.to_owned();
                        }
                    }
                    opts.watch
                }
                Err(_) => self
                    .query
                    .first("watch")
                    .is_some_and(|v| !(v.eq_ignore_ascii_case("false") || v == "0")),
            };
            info.verb = if watch { "watch" } else { "list" }.to_owned();
        }
        if info.name.is_empty() && info.verb == "delete" {
            info.verb = "deletecollection".to_owned();
        }
        if !verb_via_path && matches!(info.verb.as_str(), "list" | "watch" | "deletecollection") {
            if let Some(v) = self.query.first("fieldSelector") {
                info.field_selector = v.to_owned();
            }
            if let Some(v) = self.query.first("labelSelector") {
                info.label_selector = v.to_owned();
            }
        }
        Ok(info)
    }
}

/// `splitPath`: trim slashes at both ends, split on `/`.
fn split_path(path: &str) -> Vec<&str> {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        Vec::new()
    } else {
        trimmed.split('/').collect()
    }
}

/// `content.IsPathSegmentName` passes.
fn is_path_segment_name(name: &str) -> bool {
    name != "." && name != ".." && !name.contains(['/', '%'])
}

/// `responsewriters` sanitizer: `&`, `<`, `>` as HTML entities.
fn sanitize_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

// ---------------------------------------------------------------------------------------------
// Stages 3-4: routing and the handler.

/// The routes the installer registers for one group version of metrics-server.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Route {
    Discovery,
    ListNodes,
    GetNode(String),
    ListPods(Option<String>),
    GetPod(String, String),
}

/// Stages 1, 3 and 4: routes, negotiates and checks a request (authentication and
/// authorization, stage 2, are the caller's and go between [`preflight`] and this).
///
/// # Errors
///
/// A [`Rejection`] with the apiserver's answer.
pub fn parse(parts: &RequestParts<'_>) -> Result<ApiRequest, Rejection> {
    let (preflight, decoded) = preflight_decoded(parts)?;
    let error_encoding = error_encoding(parts);
    let fail = |status: Status| {
        Rejection::Error(ApiError {
            status,
            encoding: error_encoding,
        })
    };

    // The director: only paths under a registered web service go to go-restful.
    let path = decoded.path.as_str();
    let group_root = "/apis/metrics.k8s.io";
    let Some(after_group) = path.strip_prefix(group_root) else {
        return Err(Rejection::NotApi);
    };
    if !(after_group.is_empty() || after_group.starts_with('/')) {
        return Err(Rejection::NotApi);
    }
    // go-restful tokenizes the path with slashes trimmed at both ends.
    let tokens: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = tokens.get(2..).unwrap_or_default();
    let Some((version_token, resource_tokens)) = rest.split_first() else {
        // `/apis/metrics.k8s.io`: the group's discovery document.
        return discovery_route(parts.method, None, &fail);
    };
    let Some(version) = MetricsVersion::from_version(version_token) else {
        return Err(fail(route_not_found()));
    };
    let route = match resource_tokens {
        [] => Route::Discovery,
        ["nodes"] => Route::ListNodes,
        ["nodes", name] => Route::GetNode((*name).to_owned()),
        ["pods"] => Route::ListPods(None),
        ["namespaces", ns, "pods"] => Route::ListPods(Some((*ns).to_owned())),
        ["namespaces", ns, "pods", name] => Route::GetPod((*ns).to_owned(), (*name).to_owned()),
        _ => return Err(fail(route_not_found())),
    };
    if route == Route::Discovery {
        return discovery_route(parts.method, Some(version), &fail);
    }
    if parts.method != "GET" {
        return Err(fail(method_not_allowed()));
    }
    let is_list = matches!(route, Route::ListNodes | Route::ListPods(_));
    if !negotiate::route_accepts(parts.accept) {
        let mut available: Vec<String> = MEDIA_TYPES.iter().map(|s| (*s).to_owned()).collect();
        if is_list {
            available.push(format!("{};stream=watch", MEDIA_TYPES[0]));
            available.push(format!("{};stream=watch", MEDIA_TYPES[2]));
        }
        return Err(fail(generic_status(
            406,
            "NotAcceptable",
            &format!(
                "406: Not Acceptable\n\nAvailable representations: {}",
                available.join(", ")
            ),
        )));
    }

    // The handler: negotiation first.
    let Some(negotiated) = negotiate::choose(parts.accept, Endpoint::Resource) else {
        return Err(fail(Status::not_acceptable(format!(
            "only the following media types are accepted: {}",
            MEDIA_TYPES.join(", ")
        ))));
    };
    let format = Format {
        encoding: negotiated.encoding,
        target: negotiated.target,
        pretty: negotiated.encoding == Encoding::Json
            && (negotiated.pretty || is_pretty_print(&decoded.query, parts)),
    };
    let include_object = decoded.query.first("includeObject").map(str::to_owned);

    let (resource, namespace, name) = match route {
        Route::ListNodes => (Resource::Nodes, None, None),
        Route::GetNode(name) => (Resource::Nodes, None, Some(name)),
        Route::ListPods(ns) => (Resource::Pods, ns.filter(|ns| !ns.is_empty()), None),
        Route::GetPod(ns, name) => (Resource::Pods, Some(ns), Some(name)),
        Route::Discovery => return Err(fail(route_not_found())),
    };
    let mut request = ApiRequest {
        version,
        resource,
        namespace,
        name,
        verb: if is_list { Verb::List } else { Verb::Get },
        options: ListOptions::default(),
        format,
        error_encoding,
        timeout_nanos: preflight.timeout_nanos,
    };

    if is_list {
        let mut options = decode_list_options(&decoded.query)
            .map_err(|message| fail(Status::bad_request(message)))?;
        let errors = validate_list_options(&options);
        if !errors.is_empty() {
            return Err(fail(invalid_list_options(&errors)));
        }
        options
            .field_selector
            .check_fields()
            .map_err(|e| fail(Status::bad_request(e.message)))?;
        if options.watch {
            // `NegotiateOutputMediaTypeStream`: YAML has no stream serializer.
            if request.format.encoding == Encoding::Yaml {
                return Err(fail(Status::not_acceptable(format!(
                    "only the following media types are accepted: {}",
                    STREAM_MEDIA_TYPES.join(", ")
                ))));
            }
            request.verb = Verb::Watch;
        }
        options.include_object = include_object;
        request.options = options;
    } else {
        if let Some(export) = decoded.query.first("export") {
            if go::convert_bool(export) {
                return Err(fail(Status::bad_request(
                    "the export parameter, deprecated since v1.14, is no longer supported",
                )));
            }
        }
        request.options = ListOptions {
            resource_version: decoded
                .query
                .first("resourceVersion")
                .unwrap_or("")
                .to_owned(),
            include_object,
            ..ListOptions::default()
        };
        // Names no object can have get the lister's own "not found" here.
        let impossible = match (&request.namespace, &request.name) {
            (Some(ns), Some(name)) => {
                !is_dns1123_label(ns) || ns.len() > 63 || !is_object_name(name)
            }
            (None, Some(name)) => !is_object_name(name),
            _ => false,
        };
        if impossible {
            if let Some(e) = request.not_found() {
                return Err(Rejection::Error(e));
            }
        }
    }
    Ok(request)
}

/// Node and pod names are DNS-1123 subdomains of at most 253 bytes.
fn is_object_name(name: &str) -> bool {
    name.len() <= 253 && is_dns1123_subdomain(name)
}

fn discovery_route(
    method: &str,
    version: Option<MetricsVersion>,
    fail: &impl Fn(Status) -> Rejection,
) -> Result<ApiRequest, Rejection> {
    if method == "GET" {
        Err(Rejection::Discovery(version))
    } else {
        Err(fail(method_not_allowed()))
    }
}

/// Go's header reading trims spaces and tabs around a value.
fn trim_ows(value: &str) -> &str {
    value.trim_matches([' ', '\t'])
}

/// `negotiation.isPrettyPrint`: `?pretty=` parsed by `strconv.ParseBool` when non-empty
/// (and the raw query contains `pretty`), else a `curl`, `Wget` or `Mozilla/5.0` user agent.
pub(crate) fn is_pretty_print(query: &Query, parts: &RequestParts<'_>) -> bool {
    // Go only looks at the parameter when the raw query mentions it.
    if parts.query.is_some_and(|q| q.contains("pretty")) {
        if let Some(value) = query.first("pretty").filter(|v| !v.is_empty()) {
            return matches!(value, "1" | "t" | "T" | "TRUE" | "true" | "True");
        }
    }
    let agent = parts.user_agent.map(trim_ows).unwrap_or("");
    agent.starts_with("curl") || agent.starts_with("Wget") || agent.starts_with("Mozilla/5.0")
}

/// How the apiserver writes an error for this request (`ErrorNegotiated`).
pub fn error_encoding(parts: &RequestParts<'_>) -> ErrorEncoding {
    match negotiate::choose(parts.accept, Endpoint::Error) {
        Some(n) => {
            let query = Query::parse(parts.query.unwrap_or(""));
            ErrorEncoding::Negotiated {
                encoding: n.encoding,
                pretty: n.encoding == Encoding::Json
                    && (n.pretty || is_pretty_print(&query, parts)),
            }
        }
        None => ErrorEncoding::RawJson,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::table::TableVersion;
    use crate::json::encode_json;

    type RouteCase<'a> = (
        &'a str,
        Resource,
        Option<&'a str>,
        Option<&'a str>,
        Verb,
        MetricsVersion,
    );
    type AcceptCase<'a> = (Option<&'a str>, Option<&'a str>, Encoding, Target, bool);

    const V1B1: &str = "/apis/metrics.k8s.io/v1beta1";
    const KUBECTL_TOP: &str = "application/vnd.kubernetes.protobuf, */*";
    const KUBECTL_GET: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    const KUBECTL_RAW: &str = "application/json, */*";
    const BROWSER: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7";
    const MEDIA: &str = "application/json, application/yaml, application/vnd.kubernetes.protobuf";

    fn parts<'a>(method: &'a str, target: &'a str, accept: Option<&'a str>) -> RequestParts<'a> {
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (target, None),
        };
        RequestParts {
            method,
            path,
            query,
            accept,
            user_agent: None,
        }
    }

    fn get(target: &str) -> Result<ApiRequest, Rejection> {
        parse(&parts("GET", target, None))
    }

    fn ok(target: &str) -> ApiRequest {
        match get(target) {
            Ok(r) => r,
            Err(e) => panic!("{target}: {e:?}"),
        }
    }

    /// (code, reason, message) of a Status rejection.
    fn status(result: Result<ApiRequest, Rejection>) -> (u16, String, String) {
        match result {
            Err(Rejection::Error(e)) => (
                e.status.code(),
                e.status.0.reason.clone().unwrap_or_default(),
                e.status.0.message.clone().unwrap_or_default(),
            ),
            other => panic!("not a Status: {other:?}"),
        }
    }

    fn json(status: &Status) -> String {
        String::from_utf8(encode_json(status).unwrap_or_default()).unwrap_or_default()
    }

    #[test]
    fn routes() {
        // (path, resource, namespace, name, verb, version)
        let cases: [RouteCase<'_>; 12] = [
            (
                "/nodes",
                Resource::Nodes,
                None,
                None,
                Verb::List,
                MetricsVersion::V1beta1,
            ),
            (
                "/nodes/",
                Resource::Nodes,
                None,
                None,
                Verb::List,
                MetricsVersion::V1beta1,
            ),
            (
                "/nodes//",
                Resource::Nodes,
                None,
                None,
                Verb::List,
                MetricsVersion::V1beta1,
            ),
            // %2F decodes to a separator before routing: a trailing slash, trimmed.
            (
                "/nodes/%2F",
                Resource::Nodes,
                None,
                None,
                Verb::List,
                MetricsVersion::V1beta1,
            ),
            (
                "/nodes/node-1",
                Resource::Nodes,
                None,
                Some("node-1"),
                Verb::Get,
                MetricsVersion::V1beta1,
            ),
            (
                "/nodes/node-1/",
                Resource::Nodes,
                None,
                Some("node-1"),
                Verb::Get,
                MetricsVersion::V1beta1,
            ),
            (
                "/pods",
                Resource::Pods,
                None,
                None,
                Verb::List,
                MetricsVersion::V1beta1,
            ),
            (
                "/namespaces/default/pods",
                Resource::Pods,
                Some("default"),
                None,
                Verb::List,
                MetricsVersion::V1beta1,
            ),
            // An empty namespace lists across namespaces, as metrics-server's lister does.
            (
                "/namespaces//pods",
                Resource::Pods,
                None,
                None,
                Verb::List,
                MetricsVersion::V1beta1,
            ),
            // Namespaces that cannot exist just list nothing (the store's answer).
            (
                "/namespaces/No_Such/pods",
                Resource::Pods,
                Some("No_Such"),
                None,
                Verb::List,
                MetricsVersion::V1beta1,
            ),
            (
                "/namespaces/kube-system/pods/coredns-5d78c9869d-abcde",
                Resource::Pods,
                Some("kube-system"),
                Some("coredns-5d78c9869d-abcde"),
                Verb::Get,
                MetricsVersion::V1beta1,
            ),
            (
                "/namespaces/%64efault/pods/web-0",
                Resource::Pods,
                Some("default"),
                Some("web-0"),
                Verb::Get,
                MetricsVersion::V1beta1,
            ),
        ];
        for (path, resource, namespace, name, verb, version) in cases {
            let r = ok(&format!("{V1B1}{path}"));
            assert_eq!(r.resource, resource, "{path}");
            assert_eq!(r.namespace.as_deref(), namespace, "{path}");
            assert_eq!(r.name.as_deref(), name, "{path}");
            assert_eq!(r.verb, verb, "{path}");
            assert_eq!(r.version, version, "{path}");
            assert_eq!(r.format.encoding, Encoding::Json, "{path}");
            assert_eq!(r.format.target, Target::Object, "{path}");
        }
        let r = ok("/apis/metrics.k8s.io/v1/namespaces/a/pods/b");
        assert_eq!(r.version, MetricsVersion::V1);
    }

    #[test]
    fn unknown_paths() {
        let not_found = json(&route_not_found());
        assert_eq!(
            not_found,
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"the server could not find the requested resource\",\"reason\":\"NotFound\",\"details\":{},\"code\":404}\n"
        );
        for path in [
            "/apis/metrics.k8s.io/v1beta1/pods/web-0",
            "/apis/metrics.k8s.io/v1beta1/nodes/n1/status",
            "/apis/metrics.k8s.io/v1beta1/nodes/a%2Fb",
            "/apis/metrics.k8s.io/v1beta1/namespaces/a%2Fb/pods",
            "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/a%2Fb",
            "/apis/metrics.k8s.io/v1beta1/watch/nodes",
            "/apis/metrics.k8s.io/v1beta1/watch/namespaces/default/pods",
            "/apis/metrics.k8s.io/v1beta1/proxy/nodes/n1",
            "/apis/metrics.k8s.io/v1beta1/namespaces/default",
            "/apis/metrics.k8s.io/v1beta1/namespaces",
            "/apis/metrics.k8s.io/v1beta1/nodemetrics",
            "/apis/metrics.k8s.io/v1beta1/NODES",
            "/apis/metrics.k8s.io/v1beta1//nodes",
            "/apis/metrics.k8s.io/v1beta1/nodes//n1",
            "/apis/metrics.k8s.io/v2/nodes",
            "/apis/metrics.k8s.io/v2",
            "/apis/metrics.k8s.io/../metrics.k8s.io/v1beta1/nodes",
            "/apis/metrics.k8s.io/v1beta1/../v1beta1/nodes",
        ] {
            match get(path) {
                Err(Rejection::Error(e)) => assert_eq!(json(&e.status), not_found, "{path}"),
                other => panic!("{path}: {other:?}"),
            }
        }
        for path in [
            "/",
            "/apis",
            "/apis/",
            "/api/v1/nodes",
            "/healthz",
            "/metrics",
            "/apis/metrics.k8s.iox/v1beta1/nodes",
            "/apis/custom.metrics.k8s.io/v1beta1",
            "//apis/metrics.k8s.io/v1beta1/nodes",
            "/apis//metrics.k8s.io/v1beta1/nodes",
            "*",
        ] {
            assert_eq!(get(path), Err(Rejection::NotApi), "{path}");
        }
        assert_eq!(get("/apis/metrics.k8s.io"), Err(Rejection::Discovery(None)));
        assert_eq!(
            get("/apis/metrics.k8s.io//"),
            Err(Rejection::Discovery(None))
        );
        assert_eq!(
            get("/apis/metrics.k8s.io/v1beta1/"),
            Err(Rejection::Discovery(Some(MetricsVersion::V1beta1)))
        );
        assert_eq!(
            get("/apis/metrics.k8s.io/v1"),
            Err(Rejection::Discovery(Some(MetricsVersion::V1)))
        );
    }

    #[test]
    fn traversal_and_odd_names() {
        let node = |name: &str| json(&Status::node_not_found(name));
        let pod = |name: &str| json(&Status::pod_not_found(name));
        // (path, the 404 body metrics-server's lister gives for that name)
        let cases = [
            ("/nodes/..", node("..")),
            ("/nodes/.", node(".")),
            ("/nodes/%2e%2e", node("..")),
            ("/nodes/%2E%2E", node("..")),
            ("/nodes/Node-1", node("Node-1")),
            ("/nodes/-n", node("-n")),
            ("/nodes/a%20b", node("a b")),
            ("/nodes/a%25b", node("a%b")),
            ("/nodes/%3Cscript%3E", node("<script>")),
            ("/nodes/%ff", node("\u{fffd}")),
            ("/nodes/a+b", node("a+b")),
            ("/nodes/a;b", node("a;b")),
            ("/nodes/a:b", node("a:b")),
            ("/namespaces/default/pods/..", pod("..")),
            ("/namespaces/default/pods/%2e", pod(".")),
            ("/namespaces/../pods/web-0", pod("web-0")),
            ("/namespaces//pods/web-0", pod("web-0")),
            ("/namespaces/Default/pods/web-0", pod("web-0")),
            ("/namespaces/a.b/pods/web-0", pod("web-0")),
        ];
        for (path, want) in cases {
            match get(&format!("{V1B1}{path}")) {
                Err(Rejection::Error(e)) => assert_eq!(json(&e.status), want, "{path}"),
                other => panic!("{path}: {other:?}"),
            }
        }
        let long = format!("{V1B1}/nodes/{}", "a".repeat(254));
        assert_eq!(status(get(&long)).0, 404);
        let max = format!(
            "{V1B1}/nodes/{}",
            [
                "a".repeat(63),
                "b".repeat(63),
                "c".repeat(63),
                "d".repeat(61)
            ]
            .join(".")
        );
        assert_eq!(ok(&max).name.map(|n| n.len()), Some(253));
        for bad in [
            "/nodes/%zz",
            "/nodes/%2",
            "/nodes/%",
            "/namespaces/%g0/pods",
        ] {
            assert_eq!(
                get(&format!("{V1B1}{bad}")),
                Err(Rejection::Plain {
                    code: 400,
                    body: "400 Bad Request".into()
                }),
                "{bad}"
            );
        }
    }

    #[test]
    fn methods_other_than_get() {
        let want = "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"the server does not allow this method on the requested resource\",\"reason\":\"MethodNotAllowed\",\"details\":{},\"code\":405}\n";
        for method in [
            "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE", "TRACE", "CONNECT", "PROPFIND",
            "get",
        ] {
            for path in [
                "/nodes",
                "/nodes/n1",
                "/pods",
                "/namespaces/a/pods",
                "/namespaces/a/pods/b",
                "",
            ] {
                let target = format!("{V1B1}{path}");
                match parse(&parts(method, &target, None)) {
                    Err(Rejection::Error(e)) => {
                        assert_eq!(json(&e.status), want, "{method} {path}")
                    }
                    other => panic!("{method} {path}: {other:?}"),
                }
            }
            // Path matching comes first: unknown paths stay 404.
            let unknown = format!("{V1B1}/nothing");
            assert_eq!(status(parse(&parts(method, &unknown, None))).0, 404);
        }
        assert_eq!(
            status(parse(&parts("POST", "/apis/metrics.k8s.io", None))).0,
            405
        );
    }

    #[test]
    fn kubectl_and_common_accept_headers() {
        // (Accept, user agent, encoding, target, pretty)
        let cases: [AcceptCase<'_>; 16] = [
            (None, None, Encoding::Json, Target::Object, false),
            (Some(""), None, Encoding::Json, Target::Object, false),
            (Some("*/*"), Some("curl/8.5.0"), Encoding::Json, Target::Object, true),
            (Some(KUBECTL_TOP), Some("kubectl/v1.33.1 (linux/amd64) kubernetes/8adc0f0"), Encoding::Protobuf, Target::Object, false),
            (Some(KUBECTL_GET), Some("kubectl/v1.27.16 (linux/amd64) kubernetes/cbb86e0"), Encoding::Json, Target::Table(TableVersion::V1), false),
            (Some(KUBECTL_RAW), None, Encoding::Json, Target::Object, false),
            (Some("application/json"), None, Encoding::Json, Target::Object, false),
            (Some(BROWSER), Some("Mozilla/5.0 (X11; Linux x86_64)"), Encoding::Json, Target::Object, true),
            (Some("application/yaml"), Some("curl/8.5.0"), Encoding::Yaml, Target::Object, false),
            (Some("application/json;as=Table;v=v1beta1;g=meta.k8s.io"), None, Encoding::Json, Target::Table(TableVersion::V1beta1), false),
            (Some("application/yaml;as=Table;v=v1;g=meta.k8s.io"), None, Encoding::Yaml, Target::Table(TableVersion::V1), false),
            (Some("application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io, application/json"), None, Encoding::Json, Target::Object, false),
            (Some("application/json;q=0, */*;q=0.1"), None, Encoding::Yaml, Target::Object, false),
            (Some("application/json;q=0.5, application/yaml"), None, Encoding::Yaml, Target::Object, false),
            (Some("*/*;q=0.1, application/vnd.kubernetes.protobuf"), None, Encoding::Protobuf, Target::Object, false),
            (Some("application/json;pretty=1;stream=watch"), Some("Go-http-client/2.0"), Encoding::Json, Target::Object, true),
        ];
        for (accept, agent, encoding, target, pretty) in cases {
            let mut p = parts("GET", "/apis/metrics.k8s.io/v1beta1/nodes", accept);
            p.user_agent = agent;
            let r = match parse(&p) {
                Ok(r) => r,
                Err(e) => panic!("{accept:?}: {e:?}"),
            };
            assert_eq!(
                r.format,
                Format {
                    encoding,
                    target,
                    pretty
                },
                "{accept:?}"
            );
        }
        // ?pretty= wins over the user agent when the raw query mentions it.
        let mut p = parts(
            "GET",
            "/apis/metrics.k8s.io/v1beta1/nodes?pretty=false",
            None,
        );
        p.user_agent = Some("curl/8.5.0");
        assert!(!parse(&p).map(|r| r.format.pretty).unwrap_or(true));
        let p = parts(
            "GET",
            "/apis/metrics.k8s.io/v1beta1/nodes?pretty=1",
            Some("application/yaml"),
        );
        assert!(!parse(&p).map(|r| r.format.pretty).unwrap_or(true));
        let p = parts("GET", "/apis/metrics.k8s.io/v1beta1/nodes?pretty=t", None);
        assert!(parse(&p).map(|r| r.format.pretty).unwrap_or(false));
    }

    #[test]
    fn not_acceptable() {
        let restful_list = "406: Not Acceptable\n\nAvailable representations: application/json, application/yaml, application/vnd.kubernetes.protobuf, application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch";
        let restful_get = "406: Not Acceptable\n\nAvailable representations: application/json, application/yaml, application/vnd.kubernetes.protobuf";
        let handler = format!("only the following media types are accepted: {MEDIA}");
        // (Accept, path, message, how the error is written)
        let cases: [(&str, &str, &str, ErrorEncoding); 9] = [
            ("text/html", "/nodes", restful_list, ErrorEncoding::RawJson),
            (
                "text/html",
                "/nodes/n1",
                restful_get,
                ErrorEncoding::RawJson,
            ),
            // go-restful wants an exact media type or */*; application/* is not enough.
            (
                "application/*",
                "/pods",
                restful_list,
                ErrorEncoding::Negotiated {
                    encoding: Encoding::Json,
                    pretty: false,
                },
            ),
            (
                "application/xml, text/plain",
                "/namespaces/a/pods/b",
                restful_get,
                ErrorEncoding::RawJson,
            ),
            (
                "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io",
                "/nodes",
                &handler,
                ErrorEncoding::RawJson,
            ),
            (
                "application/json;as=Table;v=v2;g=meta.k8s.io",
                "/nodes",
                &handler,
                ErrorEncoding::RawJson,
            ),
            (
                "application/json;as=Table;v=v1;g=meta.k9s.io",
                "/nodes",
                &handler,
                ErrorEncoding::RawJson,
            ),
            (
                "application/yaml;stream=watch",
                "/nodes",
                &handler,
                ErrorEncoding::RawJson,
            ),
            (
                "application/json;sv=v2",
                "/nodes/n1",
                &handler,
                ErrorEncoding::RawJson,
            ),
        ];
        for (accept, path, message, encoding) in cases {
            let target = format!("{V1B1}{path}");
            match parse(&parts("GET", &target, Some(accept))) {
                Err(Rejection::Error(e)) => {
                    assert_eq!(e.status.code(), 406, "{accept}");
                    assert_eq!(
                        e.status.0.reason.as_deref(),
                        Some("NotAcceptable"),
                        "{accept}"
                    );
                    assert_eq!(e.status.0.message.as_deref(), Some(message), "{accept}");
                    assert_eq!(e.encoding, encoding, "{accept}");
                }
                other => panic!("{accept}: {other:?}"),
            }
        }
        let raw = match parse(&parts(
            "GET",
            "/apis/metrics.k8s.io/v1beta1/nodes",
            Some("text/html"),
        )) {
            Err(Rejection::Error(e)) => json(&e.status),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            raw,
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"406: Not Acceptable\\n\\nAvailable representations: application/json, application/yaml, application/vnd.kubernetes.protobuf, application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch\",\"reason\":\"NotAcceptable\",\"details\":{},\"code\":406}\n"
        );
    }

    #[test]
    fn error_encodings() {
        let enc = |accept: Option<&str>, agent: Option<&str>, target: &str| {
            let mut p = parts("GET", target, accept);
            p.user_agent = agent;
            error_encoding(&p)
        };
        let json = |pretty| ErrorEncoding::Negotiated {
            encoding: Encoding::Json,
            pretty,
        };
        assert_eq!(enc(None, None, "/x"), json(false));
        assert_eq!(enc(Some(KUBECTL_GET), None, "/x"), json(false));
        assert_eq!(enc(Some(KUBECTL_RAW), Some("curl/7"), "/x"), json(true));
        assert_eq!(
            enc(Some(KUBECTL_RAW), Some("curl/7"), "/x?pretty=0"),
            json(false)
        );
        assert_eq!(
            enc(Some(KUBECTL_TOP), None, "/x"),
            ErrorEncoding::Negotiated {
                encoding: Encoding::Protobuf,
                pretty: false
            }
        );
        assert_eq!(
            enc(Some("application/yaml"), Some("Wget/1.21"), "/x"),
            ErrorEncoding::Negotiated {
                encoding: Encoding::Yaml,
                pretty: false
            }
        );
        assert_eq!(enc(Some("text/html"), None, "/x"), ErrorEncoding::RawJson);
        assert_eq!(
            enc(
                Some("application/json;as=Table;v=v1;g=meta.k8s.io"),
                None,
                "/x"
            ),
            ErrorEncoding::RawJson
        );
        assert_eq!(
            enc(Some("application/json;sv=v1"), None, "/x"),
            ErrorEncoding::RawJson
        );
    }

    #[test]
    fn list_parameters() {
        let r = ok("/apis/metrics.k8s.io/v1beta1/namespaces/default/pods?labelSelector=app%3Dweb%2Ctier%21%3Ddb&fieldSelector=metadata.name%3Dx&limit=500&timeoutSeconds=5&resourceVersion=0&continue=c&includeObject=None");
        assert_eq!(r.options.label_selector.to_string(), "app=web,tier!=db");
        assert_eq!(r.options.field_selector.to_string(), "metadata.name=x");
        assert_eq!(r.options.limit, 500);
        assert_eq!(r.options.timeout_seconds, Some(5));
        assert_eq!(r.options.resource_version, "0");
        assert_eq!(r.options.continue_token, "c");
        assert_eq!(r.options.include_object.as_deref(), Some("None"));
        assert!(!r.options.watch);
        // '+' is a space; pairs with ';' or bad escapes are dropped; the first value wins.
        let r = ok("/apis/metrics.k8s.io/v1beta1/nodes?labelSelector=a+in+(x,+y)&labelSelector=b&x;y=1&limit=%zz&limit=3");
        assert_eq!(r.options.label_selector.to_string(), "a in (x,y)");
        assert_eq!(r.options.limit, 3);
        for (query, watch) in [
            ("watch=false", false),
            ("watch=0", false),
            ("watch=FALSE", false),
            ("watch=fal%C5%BFe", false),
            ("watch", true),
            ("watch=", true),
            ("watch=1", true),
            ("watch=no", true),
        ] {
            let target = format!("{V1B1}/nodes?{query}");
            let got = match get(&target) {
                Ok(r) => r.options.watch,
                Err(Rejection::Error(e)) if e.status.code() == 405 => true,
                Err(e) => panic!("{query}: {e:?}"),
            };
            assert_eq!(got, watch, "{query}");
        }
        // A get reads no list parameters, not even a bad selector.
        let r = ok("/apis/metrics.k8s.io/v1beta1/nodes/n1?labelSelector=-&watch=true&limit=x&export=false&resourceVersion=7");
        assert_eq!(r.verb, Verb::Get);
        assert!(r.options.label_selector.is_empty());
        assert_eq!(r.options.resource_version, "7");
    }

    #[test]
    fn parameter_errors_in_apiserver_order() {
        let value_re = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
        // (query on /nodes, code, reason, message)
        let cases: Vec<(&str, u16, &str, String)> = vec![
            ("timeoutSeconds=x&labelSelector=-", 400, "BadRequest", "strconv.ParseInt: parsing \"x\": invalid syntax".into()),
            ("limit=abc", 400, "BadRequest", "strconv.ParseInt: parsing \"abc\": invalid syntax".into()),
            // Go keeps the decoded byte, and strconv.Quote shows it as \xff.
            ("limit=%ff", 400, "BadRequest", "strconv.ParseInt: parsing \"\\xff\": invalid syntax".into()),
            ("limit=", 400, "BadRequest", "strconv.ParseInt: parsing \"\": invalid syntax".into()),
            ("limit=99999999999999999999", 400, "BadRequest", "strconv.ParseInt: parsing \"99999999999999999999\": value out of range".into()),
            ("labelSelector=a%3D-b&fieldSelector=x", 400, "BadRequest", format!("unable to parse requirement: values[0][a]: Invalid value: \"-b\": {value_re}")),
            ("fieldSelector=x", 400, "BadRequest", "invalid selector: 'x'; can't understand 'x'".into()),
            ("fieldSelector=spec.nodeName%3Dn1", 400, "BadRequest", "\"spec.nodeName\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\"".into()),
            ("watch=true&fieldSelector=spec.nodeName%3Dn1", 400, "BadRequest", "\"spec.nodeName\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\"".into()),
            ("resourceVersionMatch=Exact&fieldSelector=spec.x%3D1", 422, "Invalid", "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided".into()),
            ("resourceVersionMatch=Exact&resourceVersion=0", 422, "Invalid", "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"".into()),
            ("resourceVersionMatch=%3Cx%3E&continue=c", 422, "Invalid", "ListOptions.meta.k8s.io \"\" is invalid: [resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided, resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided, resourceVersionMatch: Unsupported value: \"\\u003cx\\u003e\": supported values: \"Exact\", \"NotOlderThan\", \"\"]".into()),
            ("sendInitialEvents=true", 422, "Invalid", "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list".into()),
            ("watch=true&sendInitialEvents=false", 422, "Invalid", "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan".into()),
            ("watch=true&resourceVersion=5&resourceVersionMatch=Exact", 422, "Invalid", "ListOptions.meta.k8s.io \"\" is invalid: [resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided, resourceVersionMatch: Unsupported value: \"Exact\": supported values: \"NotOlderThan\"]".into()),
        ];
        for (query, code, reason, message) in cases {
            let (c, r, m) = status(get(&format!("{V1B1}/nodes?{query}")));
            assert_eq!(
                (c, r.as_str(), m.as_str()),
                (code, reason, message.as_str()),
                "{query}"
            );
        }
        for target in [
            format!("{V1B1}/namespaces/a/pods?watch=1"),
            format!("{V1B1}/nodes?watch=true&labelSelector=a%3Db"),
            format!("{V1B1}/nodes?watch=true&resourceVersion=5"),
        ] {
            assert_eq!(ok(&target).verb, Verb::Watch, "{target}");
        }
        let target = format!("{V1B1}/nodes?watch=1");
        let (c, r, m) = status(parse(&parts("GET", &target, Some("application/yaml"))));
        assert_eq!(
            (c, r.as_str(), m.as_str()),
            (
                406,
                "NotAcceptable",
                "only the following media types are accepted: application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch"
            )
        );
        let (c, _, m) = status(get(&format!("{V1B1}/nodes/n1?export=true")));
        assert_eq!(
            (c, m.as_str()),
            (
                400,
                "the export parameter, deprecated since v1.14, is no longer supported"
            )
        );
        // Negotiation comes before parameters.
        let (c, _, _) = status(parse(&parts(
            "GET",
            &format!("{V1B1}/nodes?limit=x"),
            Some("application/json;as=Foo;g=meta.k8s.io;v=v1"),
        )));
        assert_eq!(c, 406);
        // The 422 body has causes, like apierrors.NewInvalid.
        let invalid = match get(&format!("{V1B1}/nodes?sendInitialEvents=1")) {
            Err(Rejection::Error(e)) => json(&e.status),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            invalid,
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"ListOptions.meta.k8s.io \\\"\\\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list\",\"reason\":\"Invalid\",\"details\":{\"group\":\"meta.k8s.io\",\"kind\":\"ListOptions\",\"causes\":[{\"reason\":\"FieldValueForbidden\",\"message\":\"Forbidden: sendInitialEvents is forbidden for list\",\"field\":\"sendInitialEvents\"}]},\"code\":422}\n"
        );
    }

    #[test]
    fn preflight_timeouts_and_limits() {
        let pf = |target: &str| preflight(&parts("GET", target, None));
        assert_eq!(
            pf("/apis/metrics.k8s.io/v1beta1/nodes?timeout=32s").map(|p| p.timeout_nanos),
            Ok(Some(32_000_000_000))
        );
        assert_eq!(
            pf("/healthz?timeout=1m30s").map(|p| p.timeout_nanos),
            Ok(Some(90_000_000_000))
        );
        assert_eq!(
            pf("/apis/metrics.k8s.io/v1beta1/nodes?timeout=").map(|p| p.timeout_nanos),
            Ok(None)
        );
        assert_eq!(
            pf("/apis/metrics.k8s.io/v1beta1/nodes?timeout=-1s").map(|p| p.timeout_nanos),
            Ok(Some(-1_000_000_000))
        );
        // Watches are long-running: their timeout is not parsed.
        assert_eq!(
            pf("/apis/metrics.k8s.io/v1beta1/nodes?watch=1&timeout=x").map(|p| p.timeout_nanos),
            Ok(None)
        );
        for (value, message) in [
            ("x", "invalid timeout specified in the request URL - time: invalid duration \"x\""),
            ("1", "invalid timeout specified in the request URL - time: missing unit in duration \"1\""),
            ("1d", "invalid timeout specified in the request URL - time: unknown unit \"d\" in duration \"1d\""),
        ] {
            let (c, r, m) = status(get(&format!("{V1B1}/nodes/n1?timeout={value}")));
            assert_eq!((c, r.as_str(), m.as_str()), (400, "BadRequest", message));
        }
        let r = ok(&format!("{V1B1}/nodes?timeout=2s&limit=500"));
        assert_eq!(r.timeout_nanos, Some(2_000_000_000));
        let long = format!("{V1B1}/nodes?labelSelector={}", "a".repeat(MAX_QUERY_BYTES));
        let (c, r, m) = status(get(&long));
        assert_eq!((c, r.as_str()), (400, "BadRequest"));
        assert_eq!(
            m,
            format!(
                "the query string is too long: {} bytes, at most 16384 are accepted",
                MAX_QUERY_BYTES + 14
            )
        );
        let at_limit = format!(
            "{V1B1}/nodes?labelSelector={}",
            "a".repeat(MAX_QUERY_BYTES - 14)
        );
        assert_eq!(
            status(get(&at_limit)).0,
            400,
            "a 16 KiB label key is still invalid"
        );
        let at_limit = format!("{V1B1}/nodes?continue={}", "a".repeat(MAX_QUERY_BYTES - 9));
        assert!(get(&at_limit).is_ok());
    }

    #[test]
    fn request_info_like_the_apiserver() {
        // (method, target, verb, namespace, resource, subresource, name)
        let cases = [
            (
                "GET",
                "/apis/metrics.k8s.io/v1beta1/nodes",
                "list",
                "",
                "nodes",
                "",
                "",
            ),
            (
                "GET",
                "/apis/metrics.k8s.io/v1beta1/nodes?watch=true",
                "watch",
                "",
                "nodes",
                "",
                "",
            ),
            (
                "GET",
                "/apis/metrics.k8s.io/v1beta1/nodes?watch=true&limit=x",
                "watch",
                "",
                "nodes",
                "",
                "",
            ),
            (
                "GET",
                "/apis/metrics.k8s.io/v1beta1/nodes?fieldSelector=metadata.name%3Dn1",
                "list",
                "",
                "nodes",
                "",
                "n1",
            ),
            (
                "GET",
                "/apis/metrics.k8s.io/v1beta1/nodes?fieldSelector=metadata.name%3D..",
                "list",
                "",
                "nodes",
                "",
                "",
            ),
            (
                "HEAD",
                "/apis/metrics.k8s.io/v1beta1/nodes/n1",
                "get",
                "",
                "nodes",
                "",
                "n1",
            ),
            (
                "GET",
                "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods",
                "list",
                "default",
                "pods",
                "",
                "",
            ),
            (
                "GET",
                "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web-0",
                "get",
                "default",
                "pods",
                "",
                "web-0",
            ),
            (
                "GET",
                "/apis/metrics.k8s.io/v1beta1/nodes/a%2Fb",
                "get",
                "",
                "nodes",
                "b",
                "a",
            ),
            (
                "GET",
                "/apis/metrics.k8s.io/v1beta1/watch/namespaces/x/pods",
                "watch",
                "x",
                "pods",
                "",
                "",
            ),
            (
                "POST",
                "/apis/metrics.k8s.io/v1beta1/nodes",
                "create",
                "",
                "nodes",
                "",
                "",
            ),
            (
                "PUT",
                "/apis/metrics.k8s.io/v1beta1/nodes/n1",
                "update",
                "",
                "nodes",
                "",
                "n1",
            ),
            (
                "PATCH",
                "/apis/metrics.k8s.io/v1beta1/nodes/n1",
                "patch",
                "",
                "nodes",
                "",
                "n1",
            ),
            (
                "DELETE",
                "/apis/metrics.k8s.io/v1beta1/nodes",
                "deletecollection",
                "",
                "nodes",
                "",
                "",
            ),
            (
                "OPTIONS",
                "/apis/metrics.k8s.io/v1beta1/nodes",
                "",
                "",
                "nodes",
                "",
                "",
            ),
            (
                "GET",
                "/api/v1/namespaces/default/status",
                "get",
                "default",
                "namespaces",
                "status",
                "default",
            ),
        ];
        for (method, target, verb, namespace, resource, subresource, name) in cases {
            let p = parts(method, target, None);
            let info = match preflight(&p) {
                Ok(p) => p.info,
                Err(e) => panic!("{target}: {e:?}"),
            };
            assert!(info.is_resource_request, "{target}");
            assert_eq!(
                (
                    info.verb.as_str(),
                    info.namespace.as_str(),
                    info.resource.as_str(),
                    info.subresource.as_str(),
                    info.name.as_str()
                ),
                (verb, namespace, resource, subresource, name),
                "{method} {target}"
            );
        }
        let Ok(p) = preflight(&parts("GET", "/apis/metrics.k8s.io/v1beta1/pods?labelSelector=app%3Dweb&fieldSelector=metadata.namespace%3Da", None)) else {
            panic!("preflight")
        };
        assert_eq!(p.info.label_selector, "app=web");
        assert_eq!(p.info.field_selector, "metadata.namespace=a");
        let a = p.info.attributes("bob");
        assert_eq!(
            (a.verb, a.api_group, a.resource, a.resource_request),
            ("list", "metrics.k8s.io", "pods", true)
        );
        assert_eq!(
            Status::forbidden(&a, "").0.message.as_deref(),
            Some("pods.metrics.k8s.io is forbidden: User \"bob\" cannot list resource \"pods\" in API group \"metrics.k8s.io\" at the cluster scope")
        );
        let Ok(p) = preflight(&parts("DELETE", "/healthz", None)) else {
            panic!("preflight")
        };
        assert!(!p.info.is_resource_request);
        assert_eq!(p.info.verb, "delete");
        // A special verb with nothing after it fails RequestInfo: plain-text 500.
        assert_eq!(
            preflight(&parts("GET", "/apis/metrics.k8s.io/v1beta1/watch", Some("x"))),
            Err(Rejection::Plain {
                code: 500,
                body: "Internal Server Error: \"/apis/metrics.k8s.io/v1beta1/watch\": failed to create RequestInfo: unable to determine kind and namespace from url, /apis/metrics.k8s.io/v1beta1/watch\n".into()
            })
        );
        assert_eq!(
            get("/apis/metrics.k8s.io/v1/proxy?a=<b>"),
            Err(Rejection::Plain {
                code: 500,
                body: "Internal Server Error: \"/apis/metrics.k8s.io/v1/proxy?a=&lt;b&gt;\": failed to create RequestInfo: unable to determine kind and namespace from url, /apis/metrics.k8s.io/v1/proxy?a=&lt;b&gt;\n".into()
            })
        );
    }

    #[test]
    fn transform_checks_after_lookup() {
        let table = |target: &str| parse(&parts("GET", target, Some(KUBECTL_GET)));
        let r = table(&format!("{V1B1}/nodes?includeObject=Object"))
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            r.transform(),
            Ok(Some(TableOptions {
                version: TableVersion::V1,
                include_object: IncludeObject::Object,
                metrics_version: MetricsVersion::V1beta1
            }))
        );
        // A bad includeObject is only an error for Tables, and only after the lookup.
        let r = table(&format!("{V1B1}/nodes/n1?includeObject=All"))
            .unwrap_or_else(|e| panic!("{e:?}"));
        let e = r
            .transform()
            .err()
            .map(|e| e.status.0.message.unwrap_or_default());
        assert_eq!(
            e.as_deref(),
            Some("Unable to convert to Table as requested: includeObject: Invalid value: \"All\": must be 'Metadata', 'Object', 'None', or empty")
        );
        assert_eq!(
            ok(&format!("{V1B1}/nodes?includeObject=All")).transform(),
            Ok(None)
        );
        let partial = |target: &str, kind: &str| {
            let accept = format!("application/json;as={kind};g=meta.k8s.io;v=v1");
            let r = parse(&parts("GET", target, Some(&accept))).unwrap_or_else(|e| panic!("{e:?}"));
            r.transform()
                .map_err(|e| (e.status.code(), e.status.0.message.unwrap_or_default()))
        };
        assert_eq!(
            partial(&format!("{V1B1}/nodes"), "PartialObjectMetadataList"),
            Ok(None)
        );
        assert_eq!(
            partial(&format!("{V1B1}/nodes/n1"), "PartialObjectMetadata"),
            Ok(None)
        );
        assert_eq!(
            partial(&format!("{V1B1}/pods"), "PartialObjectMetadata"),
            Err((406, "you requested PartialObjectMetadata, but the requested object is a list (*metrics.PodMetricsList)".into()))
        );
        assert_eq!(
            partial(&format!("{V1B1}/nodes/n1"), "PartialObjectMetadataList"),
            Err((406, "you requested PartialObjectMetadataList, but the requested object is not a list (*metrics.NodeMetrics)".into()))
        );
        let r = ok(&format!("{V1B1}/namespaces/a/pods/web-0"));
        assert_eq!(
            r.not_found().map(|e| json(&e.status)),
            Some(json(&Status::pod_not_found("web-0")))
        );
        assert!(ok(&format!("{V1B1}/pods")).not_found().is_none());
    }

    #[test]
    fn from_http_request() {
        let Ok(req) = http::Request::builder()
            .method("GET")
            .uri("https://example/apis/metrics.k8s.io/v1beta1/nodes?limit=1")
            .header("Accept", KUBECTL_TOP)
            .header("User-Agent", "kubectl/v1.33.1")
            .body(())
        else {
            panic!("request")
        };
        let p = RequestParts::from_http(&req);
        assert_eq!(p.path, "/apis/metrics.k8s.io/v1beta1/nodes");
        assert_eq!(p.query, Some("limit=1"));
        assert_eq!(p.accept, Some(KUBECTL_TOP));
        assert_eq!(parse(&p).map(|r| r.format.encoding), Ok(Encoding::Protobuf));
    }

    #[test]
    fn garbage_never_panics() {
        let alphabet = [
            "/",
            "apis",
            "metrics.k8s.io",
            "v1beta1",
            "v1",
            "nodes",
            "pods",
            "namespaces",
            "watch",
            "proxy",
            "x",
            "..",
            ".",
            "%2F",
            "%2e",
            "%",
            "%zz",
            "?",
            "&",
            "=",
            ";",
            "+",
            "labelSelector",
            "fieldSelector",
            "watch",
            "timeout",
            "limit",
            "in",
            "(",
            ")",
            ",",
            "!",
            "\u{e9}",
            "%ff",
            "1s",
            "metadata.name",
        ];
        let accepts = [
            None,
            Some(KUBECTL_TOP),
            Some(KUBECTL_GET),
            Some(BROWSER),
            Some("text/html"),
            Some(";;,,//**"),
            Some("application/json;as=Table;g=meta.k8s.io;v=v1;q=x"),
            Some("*/*;q=nan, */*;q=inf"),
        ];
        let methods = ["GET", "HEAD", "POST", "", "get"];
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let len = next() % 16;
            let mut target = String::new();
            for _ in 0..len {
                target.push_str(alphabet[(next() % alphabet.len() as u64) as usize]);
            }
            if next() % 2 == 0 {
                target.insert_str(0, V1B1);
            }
            let accept = accepts[(next() % accepts.len() as u64) as usize];
            let method = methods[(next() % methods.len() as u64) as usize];
            let p = parts(method, &target, accept);
            let _ = preflight(&p);
            if let Ok(r) = parse(&p) {
                let _ = r.transform();
                let _ = r.not_found();
            }
            let _ = error_encoding(&p);
        }
        // Random Accept headers of many clauses.
        let clauses = [
            "application/json",
            "*/*;q=0.5",
            "application/yaml;q=0.5",
            "text/html",
            "application/*;q=0.1",
            "application/vnd.kubernetes.protobuf;q=0.9",
            "a/b;q=x",
        ];
        for _ in 0..2_000 {
            let n = 1 + next() % 40;
            let header: Vec<&str> = (0..n)
                .map(|_| clauses[(next() % clauses.len() as u64) as usize])
                .collect();
            let header = header.join(",");
            let _ = negotiate::choose(Some(&header), Endpoint::Resource);
        }
    }

    /// `isPrettyPrint`, as the discovery and OpenAPI endpoints use it too.
    #[test]
    fn pretty_detection() {
        let cases = [
            ("pretty=true", "", true),
            ("pretty=1", "kubectl/v1.33.0", true),
            ("a=b&pretty=True", "", true),
            ("pretty=false", "curl/8.5.0", false),
            ("pretty=yes", "curl/8.5.0", false),
            ("pretty=", "curl/8.5.0", true),
            ("pretty", "curl/8.5.0", true),
            ("pretty", "kubectl/v1.30.0", false),
            ("pretty=%74rue", "", true),
            ("x;y&pretty=0", "curl/8.5.0", false),
            ("pretty=1;x", "kubectl", false),
            ("", "curl/7.88.1", true),
            ("", "Wget/1.21.3", true),
            ("", "Mozilla/5.0 (X11; Linux x86_64)", true),
            ("", "wget/1.21.3", false),
            ("", "kubectl/v1.33.0 (linux/amd64) kubernetes/abcdef", false),
            ("", "", false),
        ];
        for (query, agent, want) in cases {
            let parts = RequestParts {
                method: "GET",
                path: "/apis",
                query: Some(query),
                accept: None,
                user_agent: Some(agent),
            };
            let pretty = is_pretty_print(&Query::parse(query), &parts);
            assert_eq!(pretty, want, "{query:?} {agent:?}");
        }
    }
}
