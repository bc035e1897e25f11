//! The OpenAPI v2 and v3 documents of the server, built once per [`Options`] from the routes
//! (below) and the schema definitions in `openapi-definitions.json`, and served as bytes.
//!
//! # What a client reads here
//!
//! kube-aggregator fetches `/openapi/v2` with `Accept: application/json` and merges only the
//! paths under `/apis/<group>/<version>/` and the definitions they reference, renaming
//! definitions that differ from its own (`..._v2`), as it already does across Kubernetes
//! versions. It fetches `/openapi/v3` without `Accept`, merges our index into its own and
//! proxies `/openapi/v3/<path>` for the paths listed there; kubectl (`explain`, client-side
//! validation) reads those documents as JSON. What they depend on: the paths, operations,
//! parameters, responses, media types, `x-kubernetes-*` extensions and the schemas, and
//! that every `$ref` resolves. What they do not: field order, the wording of descriptions,
//! the names of shared v2 parameters.
//!
//! # The structure, as k8s.io/kube-openapi builds it
//!
//! * v2 is one document: every GET route, with parameters other than `name` shared under
//!   `parameters` and referenced; definitions without `default`s; `Quantity` as a string.
//! * v3 is one document per go-restful web service root (`apis`, `apis/metrics.k8s.io`,
//!   `apis/metrics.k8s.io/v1`, ...), parameters inline, a `$ref` with siblings wrapped in
//!   `allOf`, `default`s kept; and an index
//!   `{"paths":{"<root>":{"serverRelativeURL":"/openapi/v3/<root>?hash=<SHA-512>"}}}`. A
//!   request with the current `hash` is immutable; a stale one is redirected.
//! * `ETag` is the quoted upper-case hex SHA-512 of the body, compared weakly.
//!
//! # Deliberate differences from metrics-server
//!
//! * Descriptions are our own wording; definitions are named as upstream names them
//!   (`v1` as `k8s.io/metrics` v0.37's `zz_generated.model_name.go` does).
//! * Shared v2 parameters are named `<name>-<base64url(SHA-512(JSON))[..8]>`, not after
//!   Go's FNV-1 of Go's encoding: still one name per distinct parameter, the only property
//!   a reader of the document can use.
//! * Keys are written in sorted order and strings escaped only as JSON requires.
//! * `produces`/`content` list JSON (plus `application/json;stream=watch` on lists), protobuf
//!   only with [`Options::protobuf`], never YAML; OpenAPI itself is not served as protobuf.
//!   Alpha fields (`ListOptions.shardSelector`, `ListMeta.shardInfo`) are left out.
//! * The list operations document `watch` whether or not it is advertised, as the apiserver
//!   does for every lister; the deprecated `/watch/...` paths are not described (not served).
//! * Unknown v3 paths get a 404 (handler3 sends an empty 200).

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::document::{
    sha512_hex, Document, EtagRule, Options, CONTENT_TYPE_JSON, CONTENT_TYPE_PROTOBUF, RESOURCES,
    VERSIONS,
};
use super::types::{MetricsVersion, GROUP};

/// The schema definitions every document draws from: `definitions` by name, in OpenAPI
/// v2's reference syntax (`#/definitions/<name>`) and with `default`s; `v2` replaces a
/// definition in the v2 document only.
const DEFINITIONS: &str = include_str!("openapi-definitions.json");

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";
const VERSION_INFO: &str = "io.k8s.apimachinery.pkg.version.Info";
const V2_PREFIX: &str = "#/definitions/";
const V3_PREFIX: &str = "#/components/schemas/";

/// Answer to `GET /openapi/v3/<path>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenApiV3<'a> {
    /// 200 with the document. When `immutable`, the request carried the current hash: also
    /// send `Cache-Control:` [`super::document::CACHE_CONTROL_IMMUTABLE`] and `Expires` a
    /// year ahead.
    Document {
        /// The document.
        document: &'a Document,
        /// The request's `hash` matched.
        immutable: bool,
    },
    /// 301 Moved Permanently (the request's `hash` is stale), with the document's `ETag` and
    /// `Vary` but no body.
    Redirect {
        /// `Location`: the current `serverRelativeURL`.
        location: &'a str,
        /// The document whose headers to send.
        document: &'a Document,
    },
    /// 404: no such document.
    NotFound,
}

/// Every OpenAPI document, built once.
#[derive(Clone, Debug)]
pub struct OpenApi {
    v2: Document,
    v3: Vec<V3Entry>,
    v3_index: Document,
}

#[derive(Clone, Debug)]
struct V3Entry {
    path: String,
    hash: String,
    redirect: String,
    document: Document,
}

impl OpenApi {
    /// Builds the documents for `options`.
    pub fn new(options: &Options) -> Result<OpenApi, serde_json::Error> {
        let data: Definitions = serde_json::from_str(DEFINITIONS)?;
        let routes = routes(options);
        let v2 = v2_document(options, &routes, &data)?;
        let v3 = v3_documents(options, &routes, &data)?;
        let paths: Map<String, Value> = v3
            .iter()
            .map(|e| (e.path.clone(), json!({ "serverRelativeURL": e.redirect })))
            .collect();
        let body = serde_json::to_vec(&json!({ "paths": paths }))?;
        let hash = sha512_hex(&body);
        let v3_index = Document::bytes(body).with_etag(&hash, EtagRule::Weak);
        Ok(OpenApi { v2, v3, v3_index })
    }

    /// `GET /openapi/v2`.
    pub fn v2(&self) -> &Document {
        &self.v2
    }

    /// `GET /openapi/v3`.
    pub fn v3_index(&self) -> &Document {
        &self.v3_index
    }

    /// The v3 document paths, as in the index.
    pub fn v3_paths(&self) -> impl Iterator<Item = &str> {
        self.v3.iter().map(|e| e.path.as_str())
    }

    /// `GET /openapi/v3/<path>` with the request's `hash` (empty when absent).
    pub fn v3(&self, path: &str, hash: &str) -> OpenApiV3<'_> {
        let Some(entry) = self.v3.iter().find(|e| e.path == path) else {
            return OpenApiV3::NotFound;
        };
        if hash.is_empty() || hash == entry.hash {
            OpenApiV3::Document {
                document: &entry.document,
                immutable: !hash.is_empty(),
            }
        } else {
            OpenApiV3::Redirect {
                location: &entry.redirect,
                document: &entry.document,
            }
        }
    }
}

/// `openapi-definitions.json`.
#[derive(serde::Deserialize)]
struct Definitions {
    definitions: BTreeMap<String, Value>,
    v2: BTreeMap<String, Value>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dialect {
    V2,
    V3,
}

impl Dialect {
    fn reference(self, name: &str) -> String {
        match self {
            Dialect::V2 => format!("{V2_PREFIX}{name}"),
            Dialect::V3 => format!("{V3_PREFIX}{name}"),
        }
    }

    /// A definition from the data file in this dialect: v2 drops `default`s; v3 points
    /// `$ref`s at `components/schemas` and wraps a `$ref` that has siblings in `allOf`.
    fn schema(self, schema: &Value) -> Value {
        let Value::Object(fields) = schema else {
            return schema.clone();
        };
        let mut out = Map::new();
        for (key, value) in fields {
            let value = match key.as_str() {
                "default" if self == Dialect::V2 => continue,
                "items" | "additionalProperties" => self.schema(value),
                "oneOf" | "allOf" => match value {
                    Value::Array(items) => items.iter().map(|s| self.schema(s)).collect(),
                    other => other.clone(),
                },
                "properties" => match value {
                    Value::Object(props) => Value::Object(
                        props
                            .iter()
                            .map(|(name, s)| (name.clone(), self.schema(s)))
                            .collect(),
                    ),
                    other => other.clone(),
                },
                "$ref" if self == Dialect::V3 => match value.as_str() {
                    Some(r) => Value::from(r.replacen(V2_PREFIX, V3_PREFIX, 1)),
                    None => value.clone(),
                },
                _ => value.clone(),
            };
            out.insert(key.clone(), value);
        }
        if self == Dialect::V3 && out.len() > 1 {
            if let Some(reference) = out.remove("$ref") {
                out.insert("allOf".into(), json!([{ "$ref": reference }]));
            }
        }
        Value::Object(out)
    }
}

/// Definitions reachable from `roots`, in `dialect`, by name.
fn reachable(data: &Definitions, roots: &[&str], dialect: Dialect) -> Map<String, Value> {
    fn references(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(fields) => {
                for (key, value) in fields {
                    match (key.as_str(), value.as_str()) {
                        ("$ref", Some(r)) => {
                            out.extend(r.strip_prefix(V2_PREFIX).map(str::to_string))
                        }
                        _ => references(value, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|x| references(x, out)),
            _ => {}
        }
    }
    let mut seen = BTreeSet::new();
    let mut todo: Vec<String> = roots.iter().map(|r| r.to_string()).collect();
    while let Some(name) = todo.pop() {
        if seen.insert(name.clone()) {
            if let Some(schema) = data.definitions.get(&name) {
                references(schema, &mut todo);
            }
        }
    }
    seen.into_iter()
        .filter_map(|name| {
            let schema = match dialect {
                Dialect::V2 => data.v2.get(&name).or(data.definitions.get(&name)),
                Dialect::V3 => data.definitions.get(&name),
            }?;
            Some((name, dialect.schema(schema)))
        })
        .collect()
}

/// A query or path parameter of a route.
#[derive(Clone, Debug)]
struct Param {
    name: &'static str,
    location: &'static str,
    kind: &'static str,
    description: String,
}

impl Param {
    fn query(name: &'static str, kind: &'static str, description: &str) -> Param {
        Param {
            name,
            location: "query",
            kind,
            description: description.to_string(),
        }
    }

    fn path(name: &'static str, description: &str) -> Param {
        Param {
            name,
            location: "path",
            kind: "string",
            description: description.to_string(),
        }
    }

    fn render(&self, dialect: Dialect) -> Value {
        let mut p = json!({
            "name": self.name,
            "in": self.location,
            "description": self.description,
        });
        match dialect {
            Dialect::V2 => {
                p["type"] = json!(self.kind);
                p["uniqueItems"] = json!(true);
            }
            Dialect::V3 => p["schema"] = json!({ "type": self.kind, "uniqueItems": true }),
        }
        if self.location == "path" {
            p["required"] = json!(true);
        }
        p
    }
}

/// One GET route (every path here has exactly one, so all its parameters are path-level).
#[derive(Clone, Debug)]
struct Route {
    /// The go-restful web service root, which is the OpenAPI v3 document path.
    root: String,
    path: String,
    description: String,
    operation_id: String,
    tag: String,
    consumes: &'static [&'static str],
    produces: &'static [&'static str],
    /// The definition of the 200 response.
    response: String,
    params: Vec<Param>,
    /// `x-kubernetes-action` and the kind's version and kind.
    resource: Option<(&'static str, MetricsVersion, &'static str)>,
}

impl Route {
    /// The `get` operation, without what differs between the dialects.
    fn operation(&self) -> Value {
        let mut op = json!({
            "description": self.description,
            "operationId": self.operation_id,
            "tags": [self.tag],
        });
        if let Some((action, version, kind)) = self.resource {
            op["x-kubernetes-action"] = json!(action);
            op["x-kubernetes-group-version-kind"] =
                json!({ "group": GROUP, "version": version.version(), "kind": kind });
        }
        op
    }
}

const JSON_ONLY: &[&str] = &[CONTENT_TYPE_JSON];
const ANY: &[&str] = &["*/*"];
const LIST_MEDIA: &[&str] = &[CONTENT_TYPE_JSON, "application/json;stream=watch"];
const JSON_PROTOBUF: &[&str] = &[CONTENT_TYPE_JSON, CONTENT_TYPE_PROTOBUF];
const LIST_MEDIA_PROTOBUF: &[&str] = &[
    CONTENT_TYPE_JSON,
    CONTENT_TYPE_PROTOBUF,
    "application/json;stream=watch",
    "application/vnd.kubernetes.protobuf;stream=watch",
];

fn meta(kind: &str) -> String {
    format!("{META}.{kind}")
}

fn metrics_def(version: MetricsVersion, kind: &str) -> String {
    format!(
        "io.k8s.metrics.pkg.apis.metrics.{}.{kind}",
        version.version()
    )
}

fn list_params() -> Vec<Param> {
    vec![
        Param::query(
            "labelSelector",
            "string",
            "Only return objects whose labels match this selector. Defaults to everything.",
        ),
        Param::query(
            "fieldSelector",
            "string",
            "Only return objects whose fields (metadata.name, metadata.namespace) match this \
             selector. Defaults to everything.",
        ),
        Param::query(
            "watch",
            "boolean",
            "Instead of a list, stream changes to the matching objects as watch events.",
        ),
        Param::query(
            "allowWatchBookmarks",
            "boolean",
            "Let a watch carry BOOKMARK events; servers may send none. Ignored unless watching.",
        ),
        Param::query(
            "resourceVersion",
            "string",
            "Constrains which versions of the data may serve the request, as in the Kubernetes \
             API's resource version semantics. Defaults to unset.",
        ),
        Param::query(
            "resourceVersionMatch",
            "string",
            "How resourceVersion applies to a list: Exact or NotOlderThan. Defaults to unset.",
        ),
        Param::query(
            "timeoutSeconds",
            "integer",
            "Upper bound, in seconds, on the duration of the list or watch call.",
        ),
        Param::query(
            "limit",
            "integer",
            "Maximum number of items to return; when more remain, the list metadata carries a \
             continue token for the next chunk. Not supported with watch.",
        ),
        Param::query(
            "continue",
            "string",
            "Token from a previous chunked list, to get its next chunk; other parameters must \
             not change. Not supported with watch.",
        ),
        Param::query(
            "sendInitialEvents",
            "boolean",
            "With watch, first send synthetic events for the current objects, then a BOOKMARK \
             marking their end.",
        ),
    ]
}

fn pretty_param() -> Param {
    Param::query(
        "pretty",
        "string",
        "If 'true', the output is indented. Defaults to 'false' unless the client looks like a \
         browser or a command-line HTTP tool (curl, wget).",
    )
}

/// First letter upper-cased, as the apiserver's `ToValidOperationID` does for operation IDs
/// (`listMetricsV1beta1NodeMetrics`: verb, group without `.k8s.io`, version, kind).
fn capitalized(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The GET routes metrics-server's apiserver registers (root and group discovery, one web
/// service per version, `/version`), as kube-openapi's builders see them.
fn routes(options: &Options) -> Vec<Route> {
    let discovery =
        |root: &str, path: String, description: &str, id: String, tag: &str, response: &str| {
            Route {
                root: root.to_string(),
                path,
                description: description.to_string(),
                operation_id: id,
                tag: tag.to_string(),
                consumes: JSON_ONLY,
                produces: JSON_ONLY,
                response: response.to_string(),
                params: Vec::new(),
                resource: None,
            }
        };
    let group_id = capitalized(GROUP.trim_end_matches(".k8s.io"));
    let group_tag = GROUP.trim_end_matches(".k8s.io");
    let mut routes = vec![
        discovery(
            "apis",
            "/apis/".to_string(),
            "get available API versions",
            "getAPIVersions".to_string(),
            "apis",
            &meta("APIGroupList"),
        ),
        discovery(
            &format!("apis/{GROUP}"),
            format!("/apis/{GROUP}/"),
            "get information of a group",
            format!("get{group_id}APIGroup"),
            group_tag,
            &meta("APIGroup"),
        ),
    ];
    for gv in VERSIONS {
        let root = format!("apis/{}", gv.api_version());
        let base = format!("/{root}");
        let id = format!("{group_id}{}", capitalized(gv.version()));
        let tag = format!("{group_tag}_{}", gv.version());
        routes.push(discovery(
            &root,
            format!("{base}/"),
            "get available resources",
            format!("get{id}APIResources"),
            &tag,
            &meta("APIResourceList"),
        ));
        for r in &RESOURCES {
            let list_description = if options.advertise_watch {
                format!("list or watch objects of kind {}", r.kind)
            } else {
                format!("list objects of kind {}", r.kind)
            };
            let namespace = Param::path(
                "namespace",
                "namespace of the objects, which is also their scope for authorization",
            );
            let name = Param::path("name", &format!("name of the {}", r.kind));
            let mut list = list_params();
            list.push(pretty_param());
            let (collection, item, scoped) = if r.namespaced {
                (
                    format!("{base}/namespaces/{{namespace}}/{}", r.name),
                    format!("{base}/namespaces/{{namespace}}/{}/{{name}}", r.name),
                    "Namespaced",
                )
            } else {
                (
                    format!("{base}/{}", r.name),
                    format!("{base}/{}/{{name}}", r.name),
                    "",
                )
            };
            let mut scoped_list = list.clone();
            let mut item_params = vec![name, pretty_param()];
            if r.namespaced {
                scoped_list.push(namespace.clone());
                item_params.push(namespace);
            }
            let route = |path: String,
                         description: String,
                         id: String,
                         response: String,
                         params: Vec<Param>,
                         action: &'static str| Route {
                root: root.clone(),
                path,
                description,
                operation_id: id,
                tag: tag.clone(),
                consumes: ANY,
                produces: match (action, options.protobuf) {
                    ("list", false) => LIST_MEDIA,
                    ("list", true) => LIST_MEDIA_PROTOBUF,
                    (_, false) => JSON_ONLY,
                    (_, true) => JSON_PROTOBUF,
                },
                response,
                params,
                resource: Some((action, gv, r.kind)),
            };
            routes.push(route(
                collection,
                list_description.clone(),
                format!("list{id}{scoped}{}", r.kind),
                metrics_def(gv, r.list_kind),
                scoped_list,
                "list",
            ));
            routes.push(route(
                item,
                format!("read the specified {}", r.kind),
                format!("read{id}{scoped}{}", r.kind),
                metrics_def(gv, r.kind),
                item_params,
                "get",
            ));
            if r.namespaced {
                routes.push(route(
                    format!("{base}/{}", r.name),
                    list_description,
                    format!("list{id}{}ForAllNamespaces", r.kind),
                    metrics_def(gv, r.list_kind),
                    list,
                    "list",
                ));
            }
        }
    }
    if options.version_endpoint {
        routes.push(discovery(
            "version",
            "/version/".to_string(),
            "get the version information for this server",
            "getCodeVersion".to_string(),
            "version",
            VERSION_INFO,
        ));
    }
    for route in &mut routes {
        route
            .params
            .sort_by(|a, b| (a.name, a.location).cmp(&(b.name, b.location)));
    }
    routes
}

fn info(options: &Options) -> Value {
    json!({ "title": options.openapi_title, "version": options.openapi_version })
}

/// `/openapi/v2`: one document, parameters other than `name` shared.
fn v2_document(
    options: &Options,
    routes: &[Route],
    data: &Definitions,
) -> Result<Document, serde_json::Error> {
    let mut shared = Map::new();
    let mut paths = Map::new();
    for route in routes {
        let mut op = route.operation();
        op["consumes"] = json!(route.consumes);
        op["produces"] = json!(route.produces);
        op["schemes"] = json!(["https"]);
        op["responses"] = json!({ "200": {
            "description": "OK",
            "schema": { "$ref": Dialect::V2.reference(&route.response) },
        }});
        let mut item = json!({ "get": op });
        let mut params = Vec::new();
        for p in &route.params {
            let rendered = p.render(Dialect::V2);
            if p.name == "name" {
                params.push(rendered);
                continue;
            }
            let digest =
                ring::digest::digest(&ring::digest::SHA512, &serde_json::to_vec(&rendered)?);
            let suffix = base64::engine::general_purpose::URL_SAFE.encode(&digest.as_ref()[..6]);
            let name = format!("{}-{suffix}", p.name);
            params.push(json!({ "$ref": format!("#/parameters/{name}") }));
            shared.insert(name, rendered);
        }
        if !params.is_empty() {
            item["parameters"] = Value::Array(params);
        }
        paths.insert(route.path.clone(), item);
    }
    let responses: Vec<&str> = routes.iter().map(|r| r.response.as_str()).collect();
    let mut doc = json!({
        "swagger": "2.0",
        "info": info(options),
        "paths": paths,
        "definitions": reachable(data, &responses, Dialect::V2),
    });
    if !shared.is_empty() {
        doc["parameters"] = Value::Object(shared);
    }
    // kube-openapi's handler writes no trailing newline.
    let body = serde_json::to_vec(&doc)?;
    let hash = sha512_hex(&body);
    let mut document = Document::bytes(body).with_etag(&hash, EtagRule::Weak);
    document.vary_accept = true;
    Ok(document)
}

/// `/openapi/v3/<root>`: one document per web service root, with its hash.
fn v3_documents(
    options: &Options,
    routes: &[Route],
    data: &Definitions,
) -> Result<Vec<V3Entry>, serde_json::Error> {
    let roots: BTreeSet<&str> = routes.iter().map(|r| r.root.as_str()).collect();
    roots
        .into_iter()
        .map(|root| {
            let group: Vec<&Route> = routes.iter().filter(|r| r.root == root).collect();
            let mut paths = Map::new();
            for route in &group {
                let schema = json!({ "$ref": Dialect::V3.reference(&route.response) });
                let content: Map<String, Value> = route
                    .produces
                    .iter()
                    .map(|m| (m.to_string(), json!({ "schema": schema })))
                    .collect();
                let mut op = route.operation();
                op["responses"] = json!({ "200": { "description": "OK", "content": content } });
                let mut item = json!({ "get": op });
                if !route.params.is_empty() {
                    item["parameters"] =
                        route.params.iter().map(|p| p.render(Dialect::V3)).collect();
                }
                paths.insert(route.path.clone(), item);
            }
            let responses: Vec<&str> = group.iter().map(|r| r.response.as_str()).collect();
            let doc = json!({
                "openapi": "3.0.0",
                "info": info(options),
                "paths": paths,
                "components": { "schemas": reachable(data, &responses, Dialect::V3) },
            });
            let body = serde_json::to_vec(&doc)?;
            let hash = sha512_hex(&body);
            let mut document = Document::bytes(body).with_etag(&hash, EtagRule::Weak);
            document.vary_accept = true;
            Ok(V3Entry {
                path: root.to_string(),
                redirect: format!("/openapi/v3/{root}?hash={hash}"),
                hash,
                document,
            })
        })
        .collect()
}
#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";

    fn openapi(options: Options) -> OpenApi {
        OpenApi::new(&options).expect("documents")
    }

    fn value(doc: &Document) -> Value {
        serde_json::from_slice(&doc.body).expect("valid JSON")
    }

    /// Every `$ref` of `doc` with this prefix names an entry of `section`, and every entry
    /// is referenced.
    fn refs_resolve(doc: &Value, prefix: &str, section: &Value) {
        fn walk(v: &Value, out: &mut BTreeSet<String>) {
            match v {
                Value::Object(m) => {
                    for (k, x) in m {
                        match (k.as_str(), x) {
                            ("$ref", Value::String(r)) => {
                                out.insert(r.clone());
                            }
                            _ => walk(x, out),
                        }
                    }
                }
                Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
                _ => {}
            }
        }
        let mut refs = BTreeSet::new();
        walk(doc, &mut refs);
        let names: BTreeSet<String> = section
            .as_object()
            .expect("section")
            .keys()
            .map(|k| format!("{prefix}{k}"))
            .collect();
        let used: BTreeSet<String> = refs.into_iter().filter(|r| r.starts_with(prefix)).collect();
        assert_eq!(used, names, "{prefix}");
    }

    const NODES_ITEM_V2: &str = concat!(
        r##""/apis/metrics.k8s.io/v1beta1/nodes/{name}":{"get":{"description":"read the specified NodeMetrics","##,
        r##""consumes":["*/*"],"produces":["application/json"],"schemes":["https"],"tags":["metrics_v1beta1"],"##,
        r##""operationId":"readMetricsV1beta1NodeMetrics","responses":{"200":{"description":"OK","schema":"##,
        r##"{"$ref":"#/definitions/io.k8s.metrics.pkg.apis.metrics.v1beta1.NodeMetrics"}}},"##,
        r##""x-kubernetes-action":"get","x-kubernetes-group-version-kind":{"group":"metrics.k8s.io","version":"v1beta1","kind":"NodeMetrics"}},"##,
        r##""parameters":[{"uniqueItems":true,"type":"string","description":"name of the NodeMetrics","name":"name","in":"path","required":true},"##,
        r##"{"$ref":"#/parameters/pretty-sHUkf6BZ"}]}"##
    );

    const PODS_LIST_V2: &str = concat!(
        r##""/apis/metrics.k8s.io/v1/pods":{"get":{"description":"list objects of kind PodMetrics","consumes":["*/*"],"##,
        r##""produces":["application/json","application/json;stream=watch"],"schemes":["https"],"tags":["metrics_v1"],"##,
        r##""operationId":"listMetricsV1PodMetricsForAllNamespaces","responses":{"200":{"description":"OK","schema":"##,
        r##"{"$ref":"#/definitions/io.k8s.metrics.pkg.apis.metrics.v1.PodMetricsList"}}},"x-kubernetes-action":"list","##,
        r##""x-kubernetes-group-version-kind":{"group":"metrics.k8s.io","version":"v1","kind":"PodMetrics"}},"##,
        r##""parameters":[{"$ref":"#/parameters/allowWatchBookmarks-H7DpIhN3"},{"$ref":"#/parameters/continue-PC8nYOcH"},"##,
        r##"{"$ref":"#/parameters/fieldSelector-0PxEPNyS"},{"$ref":"#/parameters/labelSelector-UMzdb07r"},"##,
        r##"{"$ref":"#/parameters/limit-y0v-9w-s"},{"$ref":"#/parameters/pretty-sHUkf6BZ"},"##,
        r##"{"$ref":"#/parameters/resourceVersion-P3S4qeel"},{"$ref":"#/parameters/resourceVersionMatch-pVnTBXrg"},"##,
        r##"{"$ref":"#/parameters/sendInitialEvents-aCP-My5S"},{"$ref":"#/parameters/timeoutSeconds-4OQnGFJH"},"##,
        r##"{"$ref":"#/parameters/watch-EiaW2aeb"}]}"##
    );

    const NODE_METRICS_V2: &str = concat!(
        r##""io.k8s.metrics.pkg.apis.metrics.v1beta1.NodeMetrics":{"description":"Resource usage of a node.","type":"object","##,
        r##""required":["timestamp","window","usage"],"properties":{"apiVersion":{"description":"The versioned schema of this "##,
        r##"representation of the object. Servers convert recognized schemas to their latest internal value and may reject "##,
        r##"others.","type":"string"},"kind":{"description":"The REST resource this object represents, in CamelCase. Servers "##,
        r##"may infer it from the endpoint the request was sent to. Cannot be updated.","type":"string"},"metadata":"##,
        r##"{"description":"Standard object metadata; the name is the node's.","$ref":"#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},"##,
        r##""timestamp":{"description":"End of the window the usage was measured over.","$ref":"#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.Time"},"##,
        r##""usage":{"description":"Usage by resource name: cpu in cores, memory as the working set in bytes.","type":"object","##,
        r##""additionalProperties":{"$ref":"#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"}},"##,
        r##""window":{"$ref":"#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.Duration"}},"##,
        r##""x-kubernetes-group-version-kind":[{"group":"metrics.k8s.io","kind":"NodeMetrics","version":"v1beta1"}]}"##
    );

    /// `{fragment}` parsed: each of its keys is found somewhere in `doc` with this value.
    fn has(doc: &Value, fragment: &str) {
        fn find<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
            match v {
                Value::Object(m) => m.get(key).or_else(|| m.values().find_map(|x| find(x, key))),
                Value::Array(a) => a.iter().find_map(|x| find(x, key)),
                _ => None,
            }
        }
        let want: Value = serde_json::from_str(&format!("{{{fragment}}}")).expect("fragment");
        for (key, value) in want.as_object().expect("object") {
            assert_eq!(find(doc, key), Some(value), "{key}");
        }
    }

    #[test]
    fn openapi_v2() {
        let d = openapi(Options {
            openapi_version: "v0.1.0".into(),
            ..Options::default()
        });
        let doc = d.v2();
        let text = doc.text();
        let v = value(doc);
        has(
            &v,
            r#""swagger":"2.0","info":{"title":"kpulse","version":"v0.1.0"}"#,
        );
        for fragment in [NODES_ITEM_V2, PODS_LIST_V2, NODE_METRICS_V2] {
            has(&v, fragment);
        }
        has(
            &v["parameters"],
            concat!(
                r#""pretty-sHUkf6BZ":{"uniqueItems":true,"type":"string","description":"If 'true', the output is "#,
                r#"indented. Defaults to 'false' unless the client looks like a browser or a command-line HTTP tool "#,
                r#"(curl, wget).","name":"pretty","in":"query"}"#
            ),
        );
        assert!(v["definitions"][QUANTITY]["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("A fixed-point number")));
        assert!(!text.ends_with('\n'));
        assert_eq!(doc.content_type, "application/json");
        assert!(doc.vary_accept);
        refs_resolve(&v, "#/definitions/", &v["definitions"]);
        refs_resolve(&v, "#/parameters/", &v["parameters"]);
        // Defaults are pruned in v2; Quantity is the v2 string form.
        assert!(!text.contains("\"default\""));
        assert_eq!(v["definitions"][QUANTITY]["type"], "string");
        // Shared parameter names are the hash of their JSON.
        for (name, param) in v["parameters"].as_object().expect("parameters") {
            let json = serde_json::to_vec(param).expect("json");
            let digest = ring::digest::digest(&ring::digest::SHA512, &json);
            let hash = base64::engine::general_purpose::URL_SAFE.encode(&digest.as_ref()[..6]);
            assert_eq!(
                name,
                &format!("{}-{hash}", param["name"].as_str().expect("name"))
            );
        }
        let paths: Vec<&String> = v["paths"].as_object().expect("paths").keys().collect();
        assert_eq!(
            paths,
            [
                "/apis/",
                "/apis/metrics.k8s.io/",
                "/apis/metrics.k8s.io/v1/",
                "/apis/metrics.k8s.io/v1/namespaces/{namespace}/pods",
                "/apis/metrics.k8s.io/v1/namespaces/{namespace}/pods/{name}",
                "/apis/metrics.k8s.io/v1/nodes",
                "/apis/metrics.k8s.io/v1/nodes/{name}",
                "/apis/metrics.k8s.io/v1/pods",
                "/apis/metrics.k8s.io/v1beta1/",
                "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods",
                "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/{name}",
                "/apis/metrics.k8s.io/v1beta1/nodes",
                "/apis/metrics.k8s.io/v1beta1/nodes/{name}",
                "/apis/metrics.k8s.io/v1beta1/pods",
            ]
        );
        assert_eq!(
            doc.etag.as_deref(),
            Some(format!("\"{}\"", sha512_hex(&doc.body)).as_str())
        );
        assert_eq!(sha512_hex(&doc.body), V2_SHA512);
    }

    const V2_SHA512: &str = "4ED0BB72313A0347D3CCB6BFA85C46CF32F9C84DE28D2C7572347F7714C6AA0227A0DA4576419562565B8D963EBF2ABCB3B3474737A500B5EF77CEED8F33F8BA";

    const NODES_LIST_V3: &str = concat!(
        r##""/apis/metrics.k8s.io/v1beta1/nodes":{"get":{"tags":["metrics_v1beta1"],"description":"list objects of kind NodeMetrics","##,
        r##""operationId":"listMetricsV1beta1NodeMetrics","responses":{"200":{"description":"OK","content":{"application/json":"##,
        r##"{"schema":{"$ref":"#/components/schemas/io.k8s.metrics.pkg.apis.metrics.v1beta1.NodeMetricsList"}},"##,
        r##""application/json;stream=watch":{"schema":{"$ref":"#/components/schemas/io.k8s.metrics.pkg.apis.metrics.v1beta1.NodeMetricsList"}}}}},"##,
        r##""x-kubernetes-action":"list","x-kubernetes-group-version-kind":{"group":"metrics.k8s.io","version":"v1beta1","kind":"NodeMetrics"}},"##,
        r##""parameters":[{"name":"allowWatchBookmarks","in":"query","description":"Let a watch carry BOOKMARK events; servers may "##,
        r##"send none. Ignored unless watching.","schema":{"type":"boolean","uniqueItems":true}},"##,
        r##"{"name":"continue","in":"query","description":"Token from a previous chunked list, to get its next chunk; other "##,
        r##"parameters must not change. Not supported with watch.","schema":{"type":"string","uniqueItems":true}},"##,
        r##"{"name":"fieldSelector","in":"query","description":"Only return objects whose fields (metadata.name, "##,
        r##"metadata.namespace) match this selector. Defaults to everything.","schema":{"type":"string","uniqueItems":true}},"##,
        r##"{"name":"labelSelector","in":"query","description":"Only return objects whose labels match this selector. Defaults "##,
        r##"to everything.","schema":{"type":"string","uniqueItems":true}},"##,
        r##"{"name":"limit","in":"query","description":"Maximum number of items to return; when more remain, the list metadata "##,
        r##"carries a continue token for the next chunk. Not supported with watch.","schema":{"type":"integer","uniqueItems":true}},"##,
        r##"{"name":"pretty","in":"query","description":"If 'true', the output is indented. Defaults to 'false' unless the client "##,
        r##"looks like a browser or a command-line HTTP tool (curl, wget).","schema":{"type":"string","uniqueItems":true}},"##,
        r##"{"name":"resourceVersion","in":"query","description":"Constrains which versions of the data may serve the request, "##,
        r##"as in the Kubernetes API's resource version semantics. Defaults to unset.","schema":{"type":"string","uniqueItems":true}},"##,
        r##"{"name":"resourceVersionMatch","in":"query","description":"How resourceVersion applies to a list: Exact or "##,
        r##"NotOlderThan. Defaults to unset.","schema":{"type":"string","uniqueItems":true}},"##,
        r##"{"name":"sendInitialEvents","in":"query","description":"With watch, first send synthetic events for the current "##,
        r##"objects, then a BOOKMARK marking their end.","schema":{"type":"boolean","uniqueItems":true}},"##,
        r##"{"name":"timeoutSeconds","in":"query","description":"Upper bound, in seconds, on the duration of the list or watch "##,
        r##"call.","schema":{"type":"integer","uniqueItems":true}},"##,
        r##"{"name":"watch","in":"query","description":"Instead of a list, stream changes to the matching objects as watch "##,
        r##"events.","schema":{"type":"boolean","uniqueItems":true}}]}"##
    );

    const POD_ITEM_V3: &str = concat!(
        r##""/apis/metrics.k8s.io/v1/namespaces/{namespace}/pods/{name}":{"get":{"tags":["metrics_v1"],"##,
        r##""description":"read the specified PodMetrics","operationId":"readMetricsV1NamespacedPodMetrics","##,
        r##""responses":{"200":{"description":"OK","content":{"application/json":{"schema":"##,
        r##"{"$ref":"#/components/schemas/io.k8s.metrics.pkg.apis.metrics.v1.PodMetrics"}}}}},"x-kubernetes-action":"get","##,
        r##""x-kubernetes-group-version-kind":{"group":"metrics.k8s.io","version":"v1","kind":"PodMetrics"}},"##,
        r##""parameters":[{"name":"name","in":"path","description":"name of the PodMetrics","required":true,"##,
        r##""schema":{"type":"string","uniqueItems":true}},{"name":"namespace","in":"path","description":"namespace of the "##,
        r##"objects, which is also their scope for authorization","required":true,"schema":{"type":"string","uniqueItems":true}},"##,
        r##"{"name":"pretty","in":"query","description":"If 'true', the output is indented. Defaults to 'false' unless the client "##,
        r##"looks like a browser or a command-line HTTP tool (curl, wget).","schema":{"type":"string","uniqueItems":true}}]}"##
    );

    const POD_METRICS_V3: &str = concat!(
        r##""io.k8s.metrics.pkg.apis.metrics.v1.PodMetrics":{"description":"Resource usage of a pod, by container.","##,
        r##""type":"object","required":["timestamp","window","containers"],"properties":{"apiVersion":{"description":"The "##,
        r##"versioned schema of this representation of the object. Servers convert recognized schemas to their latest "##,
        r##"internal value and may reject others.","type":"string"},"containers":{"description":"Usage of every container, "##,
        r##"all over the same window.","type":"array","items":{"$ref":"#/components/schemas/io.k8s.metrics.pkg.apis.metrics.v1.ContainerMetrics"},"##,
        r##""x-kubernetes-list-type":"atomic"},"kind":{"description":"The REST resource this object represents, in CamelCase. "##,
        r##"Servers may infer it from the endpoint the request was sent to. Cannot be updated.","type":"string"},"##,
        r##""metadata":{"description":"Standard object metadata; name and namespace are the pod's.","default":{},"##,
        r##""allOf":[{"$ref":"#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]},"##,
        r##""timestamp":{"description":"End of the window the usage was measured over.","##,
        r##""allOf":[{"$ref":"#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.Time"}]},"##,
        r##""window":{"$ref":"#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.Duration"}},"##,
        r##""x-kubernetes-group-version-kind":[{"group":"metrics.k8s.io","kind":"PodMetrics","version":"v1"}]}"##
    );

    const QUANTITY_V3: &str = concat!(
        r##""io.k8s.apimachinery.pkg.api.resource.Quantity":{"description":"A fixed-point number with an optional suffix: "##,
        r##"binary SI (Ki, Mi, Gi, Ti, Pi, Ei), decimal SI (m, k, M, G, T, P, E) or a decimal exponent (e3). Written in "##,
        r##"canonical form, such as 1500m or 1536Mi, never as a floating-point value.","oneOf":[{"type":"string"},{"type":"number"}]}"##
    );

    const V3_GROUP: &str = concat!(
        r##"{"openapi":"3.0.0","info":{"title":"kpulse","version":"v0.1.0"},"paths":{"/apis/metrics.k8s.io/":{"get":"##,
        r##"{"tags":["metrics"],"description":"get information of a group","operationId":"getMetricsAPIGroup","##,
        r##""responses":{"200":{"description":"OK","content":{"application/json":{"schema":"##,
        r##"{"$ref":"#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.APIGroup"}}}}}}}},"components":{"schemas":{"##,
        r##""io.k8s.apimachinery.pkg.apis.meta.v1.APIGroup":{"description":"Name, served versions and preferred version of an "##,
        r##"API group.","type":"object","required":["name","versions"],"properties":{"apiVersion":{"description":"The versioned "##,
        r##"schema of this representation of the object. Servers convert recognized schemas to their latest internal value "##,
        r##"and may reject others.","type":"string"},"kind":{"description":"The REST resource this object represents, in "##,
        r##"CamelCase. Servers may infer it from the endpoint the request was sent to. Cannot be updated.","type":"string"},"##,
        r##""name":{"description":"Name of the group.","type":"string","default":""},"preferredVersion":{"description":"The "##,
        r##"version the server prefers clients to use.","default":{},"allOf":[{"$ref":"#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.GroupVersionForDiscovery"}]},"##,
        r##""serverAddressByClientCIDRs":{"description":"Addresses this group is served at, by client CIDR, so that clients "##,
        r##"can pick the nearest; a client uses the longest CIDR it matches.","type":"array","items":"##,
        r##"{"$ref":"#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ServerAddressByClientCIDR"},"##,
        r##""x-kubernetes-list-type":"atomic"},"versions":{"description":"Versions the group serves.","type":"array","items":"##,
        r##"{"$ref":"#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.GroupVersionForDiscovery"},"##,
        r##""x-kubernetes-list-type":"atomic"}},"x-kubernetes-group-version-kind":[{"group":"","kind":"APIGroup","version":"v1"}]},"##,
        r##""io.k8s.apimachinery.pkg.apis.meta.v1.GroupVersionForDiscovery":{"description":"One version of a group, as "##,
        r##"\"group/version\" and as \"version\".","type":"object","required":["groupVersion","version"],"properties":"##,
        r##"{"groupVersion":{"description":"Group and version, as \"group/version\".","type":"string","default":""},"##,
        r##""version":{"description":"The version alone.","type":"string","default":""}}},"##,
        r##""io.k8s.apimachinery.pkg.apis.meta.v1.ServerAddressByClientCIDR":{"description":"The address of the server for "##,
        r##"clients in a CIDR.","type":"object","required":["clientCIDR","serverAddress"],"properties":{"clientCIDR":"##,
        r##"{"description":"Clients whose IP is in this CIDR use serverAddress.","type":"string","default":""},"##,
        r##""serverAddress":{"description":"Host name or IP, with an optional port.","type":"string","default":""}}}}}}"##
    );

    fn v3(d: &OpenApi, path: &str) -> Document {
        match d.v3(path, "") {
            OpenApiV3::Document {
                document,
                immutable,
            } => {
                assert!(!immutable);
                document.clone()
            }
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn openapi_v3_documents() {
        let d = openapi(Options {
            openapi_version: "v0.1.0".into(),
            ..Options::default()
        });
        let paths: Vec<&str> = d.v3_paths().collect();
        assert_eq!(
            paths,
            [
                "apis",
                "apis/metrics.k8s.io",
                "apis/metrics.k8s.io/v1",
                "apis/metrics.k8s.io/v1beta1"
            ]
        );
        let group: Value = serde_json::from_str(V3_GROUP).expect("V3_GROUP");
        assert_eq!(value(&v3(&d, "apis/metrics.k8s.io")), group);
        let apis = v3(&d, "apis");
        has(
            &value(&apis),
            concat!(
                r##""paths":{"/apis/":{"get":{"tags":["apis"],"description":"get available API versions","##,
                r##""operationId":"getAPIVersions","responses":{"200":{"description":"OK","content":{"application/json":"##,
                r##"{"schema":{"$ref":"#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.APIGroupList"}}}}}}}}"##
            ),
        );
        let v1beta1 = v3(&d, "apis/metrics.k8s.io/v1beta1");
        let v1 = v3(&d, "apis/metrics.k8s.io/v1");
        has(&value(&v1beta1)["paths"], NODES_LIST_V3);
        has(&value(&v1)["paths"], POD_ITEM_V3);
        has(&value(&v1)["components"], POD_METRICS_V3);
        has(&value(&v1)["components"], QUANTITY_V3);
        assert!(!v1.text().contains("v1beta1"));
        for (path, sha) in [
            ("apis", V3_APIS_SHA512),
            ("apis/metrics.k8s.io/v1", V3_V1_SHA512),
            ("apis/metrics.k8s.io/v1beta1", V3_V1BETA1_SHA512),
        ] {
            let doc = v3(&d, path);
            assert_eq!(sha512_hex(&doc.body), sha, "{path}");
            let v = value(&doc);
            refs_resolve(&v, "#/components/schemas/", &v["components"]["schemas"]);
        }
        for doc in [&v1, &v1beta1, &apis] {
            assert!(doc.vary_accept && doc.etag.is_some());
        }
    }

    const V3_APIS_SHA512: &str = "1387ACE486D55F648FFF2D58A7C1A8476BE3FCEA251397209DD2184FC9A7CB8AD0464C7C9801EE808FAD9AB5613E7430655315EBA87A4B1981474BFA239E80E0";
    const V3_V1_SHA512: &str = "2FC5F063DB4F585E2F17DF12639186FBB258A3C2F9CDB92BA94FFA45D2F00217942ED6680A3A1C7AA0601B17BF20F1A1009BA59A67E0F85356BB0C711521D167";
    const V3_V1BETA1_SHA512: &str = "C90726C8DCBD3FB30D3862E48EB4D1F4C25978D54735D69AFFB4242BD29AA3E15048AD9559D23D5CA988884377C440342A4E3B8D8649AA71B631CB7E38766456";

    #[test]
    fn openapi_v3_index_and_hashes() {
        let d = openapi(Options {
            openapi_version: "v0.1.0".into(),
            ..Options::default()
        });
        let hash = |p: &str| sha512_hex(&v3(&d, p).body);
        let want = format!(
            concat!(
                r#"{{"paths":{{"apis":{{"serverRelativeURL":"/openapi/v3/apis?hash={}"}},"#,
                r#""apis/metrics.k8s.io":{{"serverRelativeURL":"/openapi/v3/apis/metrics.k8s.io?hash={}"}},"#,
                r#""apis/metrics.k8s.io/v1":{{"serverRelativeURL":"/openapi/v3/apis/metrics.k8s.io/v1?hash={}"}},"#,
                r#""apis/metrics.k8s.io/v1beta1":{{"serverRelativeURL":"/openapi/v3/apis/metrics.k8s.io/v1beta1?hash={}"}}}}}}"#
            ),
            hash("apis"),
            hash("apis/metrics.k8s.io"),
            hash("apis/metrics.k8s.io/v1"),
            hash("apis/metrics.k8s.io/v1beta1")
        );
        let index = d.v3_index();
        assert_eq!(index.text(), want);
        assert_eq!(index.content_type, "application/json");
        assert!(!index.vary_accept);
        let etag = format!("\"{}\"", sha512_hex(want.as_bytes()));
        assert_eq!(index.etag.as_deref(), Some(etag.as_str()));
        assert!(index.not_modified(&etag));

        let h = hash("apis/metrics.k8s.io/v1beta1");
        match d.v3("apis/metrics.k8s.io/v1beta1", &h) {
            OpenApiV3::Document {
                immutable,
                document,
            } => {
                assert!(immutable);
                assert_eq!(document.etag.as_deref(), Some(format!("\"{h}\"").as_str()));
            }
            other => panic!("{other:?}"),
        }
        match d.v3("apis/metrics.k8s.io/v1beta1", "0123") {
            OpenApiV3::Redirect { location, .. } => assert_eq!(
                location,
                format!("/openapi/v3/apis/metrics.k8s.io/v1beta1?hash={h}")
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(d.v3("apis/metrics.k8s.io/v2", ""), OpenApiV3::NotFound);
        assert_eq!(d.v3("version", ""), OpenApiV3::NotFound);
    }

    #[test]
    fn version_endpoint_option() {
        let d = openapi(Options {
            version_endpoint: true,
            openapi_title: "Kubernetes metrics-server".into(),
            openapi_version: "v0.8.0".into(),
            ..Options::default()
        });
        assert!(d.v3_paths().any(|p| p == "version"));
        let want = concat!(
            r##"{"openapi":"3.0.0","info":{"title":"Kubernetes metrics-server","version":"v0.8.0"},"paths":{"/version/":"##,
            r##"{"get":{"tags":["version"],"description":"get the version information for this server","operationId":"getCodeVersion","##,
            r##""responses":{"200":{"description":"OK","content":{"application/json":{"schema":"##,
            r##"{"$ref":"#/components/schemas/io.k8s.apimachinery.pkg.version.Info"}}}}}}}},"components":{"schemas":"##,
            r##"{"io.k8s.apimachinery.pkg.version.Info":{"description":"Version of the server.","type":"object","##,
            r##""required":["major","minor","gitVersion","gitCommit","gitTreeState","buildDate","goVersion","compiler","platform"],"##,
            r##""properties":{"buildDate":{"type":"string","default":""},"compiler":{"type":"string","default":""},"##,
            r##""emulationMajor":{"description":"Major version emulated.","type":"string"},"##,
            r##""emulationMinor":{"description":"Minor version emulated.","type":"string"},"##,
            r##""gitCommit":{"type":"string","default":""},"gitTreeState":{"type":"string","default":""},"##,
            r##""gitVersion":{"type":"string","default":""},"goVersion":{"type":"string","default":""},"##,
            r##""major":{"description":"Major version of the binary.","type":"string","default":""},"##,
            r##""minCompatibilityMajor":{"description":"Major version of the oldest compatible version.","type":"string"},"##,
            r##""minCompatibilityMinor":{"description":"Minor version of the oldest compatible version.","type":"string"},"##,
            r##""minor":{"description":"Minor version of the binary.","type":"string","default":""},"##,
            r##""platform":{"type":"string","default":""}}}}}}"##
        );
        let want: Value = serde_json::from_str(want).expect("want");
        assert_eq!(value(&v3(&d, "version")), want);
        has(
            &value(d.v2()),
            r##""/version/":{"get":{"description":"get the version information for this server","consumes":["application/json"],"produces":["application/json"],"schemes":["https"],"tags":["version"],"operationId":"getCodeVersion","responses":{"200":{"description":"OK","schema":{"$ref":"#/definitions/io.k8s.apimachinery.pkg.version.Info"}}}}}"##,
        );
    }

    #[test]
    fn watch_option_changes_descriptions_only_where_advertised() {
        let d = openapi(Options {
            advertise_watch: true,
            ..Options::default()
        });
        let v2 = d.v2().text();
        assert!(v2.contains(r#""description":"list or watch objects of kind NodeMetrics""#));
        assert!(!v2.contains(r#""list objects of kind"#));
        assert!(!v2.contains("/watch/"));
        let plain = value(openapi(Options::default()).v2());
        let watch = plain["parameters"]
            .as_object()
            .expect("parameters")
            .values()
            .find(|p| p["name"] == "watch")
            .expect("watch parameter");
        assert_eq!(watch["in"], "query");
    }

    #[test]
    fn protobuf_option_lists_protobuf_for_resources_only() {
        let d = openapi(Options {
            protobuf: true,
            ..Options::default()
        });
        let v2 = value(d.v2());
        let produces = |path: &str| v2["paths"][path]["get"]["produces"].clone();
        assert_eq!(
            produces("/apis/metrics.k8s.io/v1/nodes"),
            serde_json::json!([
                "application/json",
                "application/vnd.kubernetes.protobuf",
                "application/json;stream=watch",
                "application/vnd.kubernetes.protobuf;stream=watch"
            ])
        );
        assert_eq!(
            produces("/apis/metrics.k8s.io/v1/nodes/{name}"),
            serde_json::json!(["application/json", "application/vnd.kubernetes.protobuf"])
        );
        assert_eq!(
            produces("/apis/metrics.k8s.io/v1/"),
            serde_json::json!(["application/json"])
        );
        let v3 = v3(&d, "apis/metrics.k8s.io/v1beta1");
        let v = value(&v3);
        let content =
            &v["paths"]["/apis/metrics.k8s.io/v1beta1/pods"]["get"]["responses"]["200"]["content"];
        let types: Vec<&String> = content.as_object().expect("content").keys().collect();
        assert_eq!(
            types,
            [
                "application/json",
                "application/json;stream=watch",
                "application/vnd.kubernetes.protobuf",
                "application/vnd.kubernetes.protobuf;stream=watch"
            ]
        );
    }

    #[test]
    fn every_document_is_valid_json() {
        let d = openapi(Options {
            version_endpoint: true,
            advertise_watch: true,
            protobuf: true,
            ..Options::default()
        });
        let _ = value(d.v2());
        let _ = value(d.v3_index());
        for p in d.v3_paths() {
            let _ = value(&v3(&d, p));
        }
    }
}
