//! Discovery and OpenAPI documents of `metrics.k8s.io`; [`super::negotiate`] picks which
//! one a request's `Accept` gets. Discovery bodies are byte for byte what metrics-server (k8s.io/apiserver 1.36)
//! sends; the OpenAPI documents follow k8s.io/kube-openapi's structure, field order, hashing
//! and escaping, with descriptions of our own.
//!
//! This module is pure: no I/O and no clock. The HTTP layer passes in the request's `Accept`,
//! raw query, `User-Agent` and `If-None-Match`, and sends back a [`Document`] (body,
//! `Content-Type`, `ETag`, `Vary`, `Cache-Control`), a redirect, a 404 or a 406
//! ([`NotAcceptable::document`]). `pretty` arguments come from [`is_pretty`].
//!
//! # Endpoints
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /apis` | [`Discovery::apis`]: aggregated discovery or `APIGroupList` by `Accept` |
//! | `GET /apis/metrics.k8s.io` | [`Discovery::group`] |
//! | `GET /apis/metrics.k8s.io/{v1,v1beta1}` | [`Discovery::resources`] |
//! | `GET /openapi/v2` | [`Discovery::openapi_v2`] if [`negotiate::openapi_accepts_json`] |
//! | `GET /openapi/v3` | [`Discovery::openapi_v3_index`] |
//! | `GET /openapi/v3/<path>?hash=` | [`Discovery::openapi_v3`] if [`negotiate::openapi_accepts_json`] |
//!
//! # Who asks
//!
//! kube-aggregator answers `/apis` and `/apis/metrics.k8s.io` for clients itself (from the
//! APIService objects, whose `versionPriority` decides the cluster's preferred version) and
//! proxies `/apis/metrics.k8s.io/<version>/...`. It reads our discovery by `GET /apis` with
//! `Accept: <v2>,<v2beta1>` (1.30+; only v2beta1 in 1.26–1.29) and `If-None-Match` = the last
//! `ETag`, and takes a 200 only if `Content-Type` names the aggregated kind; otherwise it
//! falls back to `GET /apis/<group>/<version>` with `Accept: application/json`. It fetches
//! `/openapi/v2` with `Accept: application/json` (merging only paths under
//! `/apis/<group>/<version>/`) and `/openapi/v3` without `Accept`, merging our index into its
//! own and proxying `/openapi/v3/<path>` for the paths listed there.
//!
//! # What k8s.io/apiserver does, and so what we do
//!
//! * `/apis` of an extension server (`discovery.NewRootAPIsHandler`) strips `apiVersion`
//!   (`{"kind":"APIGroupList","groups":[...]}`) and fills every group's
//!   `serverAddressByClientCIDRs` with `0.0.0.0/0` → the server's external address, which for
//!   metrics-server (no `--advertise-address`/`--external-hostname`) is `":" + secure port`.
//!   `/apis/<group>` and `/apis/<group>/<version>` keep `"apiVersion":"v1"` and have no CIDRs.
//! * Compact JSON bodies end with `\n` (Go `json.Encoder`); pretty ones (`?pretty=true`,
//!   `pretty=1` media parameter, or a `curl`/`Wget`/`Mozilla/5.0` user agent) are
//!   `json.MarshalIndent(obj, "", "  ")` without a trailing newline.
//! * Resources: `nodes` (`NodeMetrics`, cluster scope) and `pods` (`PodMetrics`, namespaced),
//!   sorted by name. metrics-server's storages return `""` from `GetSingularName`, implement
//!   neither `ShortNamesProvider`, `CategoriesProvider`, `StorageVersionProvider` nor
//!   `GroupVersionKindProvider`, and only `Getter` + `Lister` (+ `TableConvertor`). So:
//!   `singularName:""`, no `shortNames`/`categories`/`storageVersionHash`, verbs
//!   `["get","list"]`, and in aggregated discovery `responseKind` has empty group and version.
//! * Aggregated discovery (`application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList`)
//!   lists versions by priority (equal) then kube-aware version order, so `v1` before
//!   `v1beta1`, each with `freshness:"Current"`. `ETag` is the quoted upper-case hex SHA-512
//!   of the v2 list marshalled without type meta; `If-None-Match` must equal it exactly to get
//!   a 304; `Vary: Accept`, `Cache-Control: public`.
//! * OpenAPI: v2 is kube-openapi's builder over the go-restful routes (deduplicated shared
//!   parameters named `<name>-<base64url(fnv64(json))[..8]>`, defaults pruned), v3 is one
//!   document per web service root (refs with siblings wrapped in `allOf`, defaults kept) and
//!   an index `{"paths":{"<root>":{"serverRelativeURL":"/openapi/v3/<root>?hash=<SHA-512>"}}}`.
//!
//! # Deliberate differences from metrics-server
//!
//! * Two versions, `v1` (preferred, listed first) and `v1beta1`. `v1` is upstream's GA
//!   version since Kubernetes 1.37 (KEP-5207, `k8s.io/metrics` v0.37: same schema and
//!   protobuf tags as v1beta1); its OpenAPI definitions are named
//!   `io.k8s.metrics.pkg.apis.metrics.v1.*`, as that package's `zz_generated.model_name.go`
//!   names them. metrics-server v0.8.0 serves v1beta1 only.
//! * Aggregated discovery is also served as `v2beta1` (what kubectl 1.27–1.29 and
//!   kube-aggregator 1.26–1.29 ask for). metrics-server ≤ 0.7 did the same; 0.8+ (apiserver
//!   1.33+, gate `AggregatedDiscoveryRemoveBetaType`) falls back to the `APIGroupList`.
//! * Watch is served but not advertised by default ([`Options::advertise_watch`]): verbs
//!   stay `["get","list"]` like metrics-server's, so generic "watch everything listable"
//!   tools and informer-based controllers don't open watch streams on data that changes on
//!   every scrape; clients that ask (`?watch=true`, `kubectl get -w`) never check discovery
//!   verbs. The OpenAPI list operations document `watch` either way, as the apiserver does for
//!   every lister. With the option on: `["get","list","watch"]` and "list or watch objects of
//!   kind …"; the deprecated `/watch/...` paths are not described (not served).
//! * Discovery is JSON only (client-go and kube-aggregator ask nothing else). OpenAPI
//!   `produces`/`content` list JSON (plus `application/json;stream=watch` on lists), protobuf
//!   only with [`Options::protobuf`], never YAML. OpenAPI itself is not served as protobuf
//!   (kube-aggregator asks `/openapi/v2` with `Accept: application/json` and `/openapi/v3`
//!   with none; kubectl asks v3 documents as JSON).
//! * OpenAPI descriptions are our own wording, so shared-parameter names differ from
//!   kube-apiserver's; alpha fields (`ListOptions.shardSelector`, `ListMeta.shardInfo`) and
//!   the yaml/protobuf media types are left out. kube-aggregator renames definitions that
//!   differ from its own (`..._v2`), as it already does across Kubernetes versions.
//! * `Accept` is negotiated by the rules every path shares ([`super::negotiate`]: RFC 9110,
//!   `q=0` excluded, where goautoneg is looser).
//! * A 406 lists only `application/json`; unknown OpenAPI v3 paths get a 404 (handler3 sends an
//!   empty 200).

use std::collections::{BTreeMap, BTreeSet};

use super::negotiate;
use super::types::{MetricsVersion, GROUP};

/// The served versions of `metrics.k8s.io`, preferred first.
pub const VERSIONS: [MetricsVersion; 2] = [MetricsVersion::V1, MetricsVersion::V1beta1];
/// `Content-Type` of every JSON document except aggregated discovery.
pub const CONTENT_TYPE_JSON: &str = "application/json";
/// `Content-Type` of aggregated discovery v2.
pub const CONTENT_TYPE_AGGREGATED_V2: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
/// `Content-Type` of aggregated discovery v2beta1.
pub const CONTENT_TYPE_AGGREGATED_V2BETA1: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
/// `Content-Type` of protobuf objects, listed in OpenAPI when [`Options::protobuf`] is set.
pub const CONTENT_TYPE_PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// `Cache-Control` for an OpenAPI v3 document fetched with its current `hash`; also send
/// `Expires` one year ahead, as kube-openapi's handler3 does.
pub const CACHE_CONTROL_IMMUTABLE: &str = "public, immutable";

/// A version of the aggregated discovery format (`apidiscovery.k8s.io`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    /// `apidiscovery.k8s.io/v2` (Kubernetes 1.30+ clients).
    V2,
    /// `apidiscovery.k8s.io/v2beta1` (kubectl 1.27–1.29, kube-aggregator 1.26–1.29).
    V2Beta1,
}

impl Version {
    /// `v2` or `v2beta1`.
    pub fn version(self) -> &'static str {
        match self {
            Version::V2 => "v2",
            Version::V2Beta1 => "v2beta1",
        }
    }

    /// `apiVersion` of the list: `apidiscovery.k8s.io/v2` or `.../v2beta1`.
    pub fn api_version(self) -> &'static str {
        match self {
            Version::V2 => "apidiscovery.k8s.io/v2",
            Version::V2Beta1 => "apidiscovery.k8s.io/v2beta1",
        }
    }

    /// The response `Content-Type`, which clients check to tell aggregated from legacy.
    pub fn content_type(self) -> &'static str {
        match self {
            Version::V2 => CONTENT_TYPE_AGGREGATED_V2,
            Version::V2Beta1 => CONTENT_TYPE_AGGREGATED_V2BETA1,
        }
    }
}

/// What the documents depend on besides the API itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// `host:port` advertised for `0.0.0.0/0` in `/apis`. metrics-server sends its
    /// `--advertise-address`/`--external-hostname` or, by default, `":" + --secure-port`.
    pub external_address: String,
    /// Advertise the `watch` verb (see the module docs for why it is off by default).
    pub advertise_watch: bool,
    /// `/version` is served, so OpenAPI describes it (metrics-server serves it).
    pub version_endpoint: bool,
    /// The resource endpoints also produce protobuf (`api/proto.rs`), so OpenAPI lists
    /// `application/vnd.kubernetes.protobuf` (and its `;stream=watch` form on lists), after
    /// JSON, in the apiserver's order. Discovery itself is only ever JSON here.
    pub protobuf: bool,
    /// OpenAPI `info.title`; metrics-server: `Kubernetes metrics-server`.
    pub openapi_title: String,
    /// OpenAPI `info.version`; metrics-server: its version up to the first `-`, e.g. `v0.8.0`.
    pub openapi_version: String,
}

impl Options {
    /// Defaults for a server on `secure_port`: address `":<port>"` as metrics-server
    /// advertises without `--advertise-address`, watch not advertised, no `/version`, JSON
    /// only.
    pub fn for_secure_port(secure_port: u16) -> Options {
        Options {
            external_address: format!(":{secure_port}"),
            advertise_watch: false,
            version_endpoint: false,
            protobuf: false,
            openapi_title: "kpulse".to_string(),
            openapi_version: concat!("v", env!("CARGO_PKG_VERSION")).to_string(),
        }
    }
}

impl Default for Options {
    /// [`Options::for_secure_port`] with 10250, the default `--secure-port`.
    fn default() -> Options {
        Options::for_secure_port(10250)
    }
}

/// How `If-None-Match` is compared with a document's `ETag`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EtagRule {
    /// No `ETag`: never 304.
    None,
    /// The whole header must equal the quoted `ETag` (aggregated discovery).
    Exact,
    /// `http.ServeContent` rules: a list of weak-compared tags, or `*`.
    Weak,
}

/// A response body with the headers that belong to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Document {
    /// `Content-Type` to send.
    pub content_type: &'static str,
    /// The body, exactly.
    pub body: Vec<u8>,
    /// `ETag` header value, quoted, when the endpoint sends one.
    pub etag: Option<String>,
    /// Send `Vary: Accept`.
    pub vary_accept: bool,
    /// `Cache-Control` to send, if any.
    pub cache_control: Option<&'static str>,
    etag_rule: EtagRule,
}

impl Document {
    fn json(content_type: &'static str, body: String) -> Document {
        Document {
            content_type,
            body: body.into_bytes(),
            etag: None,
            vary_accept: false,
            cache_control: None,
            etag_rule: EtagRule::None,
        }
    }

    /// The body as text (always UTF-8).
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap_or_default()
    }

    /// Whether a request with this `If-None-Match` value (empty when absent) gets
    /// `304 Not Modified` (no body) instead of the document.
    pub fn not_modified(&self, if_none_match: &str) -> bool {
        let Some(etag) = &self.etag else {
            return false;
        };
        match self.etag_rule {
            EtagRule::None => false,
            EtagRule::Exact => if_none_match == etag,
            EtagRule::Weak => if_none_match_weak(if_none_match, etag),
        }
    }
}

/// The request's `Accept` allows nothing this endpoint produces: answer 406.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotAcceptable;

impl NotAcceptable {
    /// The HTTP status to send.
    pub const STATUS: u16 = 406;

    /// The body discovery endpoints send with the 406: an indented `Status` (as the
    /// apiserver's `WriteRawJSON`), `Content-Type: application/json`. The OpenAPI endpoints
    /// send a 406 with an empty body instead.
    pub fn document(&self) -> Document {
        let status = obj(vec![
            ("kind", s("Status")),
            ("apiVersion", s("v1")),
            ("metadata", obj(vec![])),
            ("status", s("Failure")),
            ("message", s(&self.to_string())),
            ("reason", s("NotAcceptable")),
            ("code", Json::Int(406)),
        ]);
        Document::json(CONTENT_TYPE_JSON, pretty(&status, Escaping::Html))
    }
}

impl std::fmt::Display for NotAcceptable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "only the following media types are accepted: {CONTENT_TYPE_JSON}"
        )
    }
}

impl std::error::Error for NotAcceptable {}

/// Answer to `GET /openapi/v3/<path>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenApiV3<'a> {
    /// 200 with the document. When `immutable`, the request carried the current hash: also
    /// send `Cache-Control:` [`CACHE_CONTROL_IMMUTABLE`] and `Expires` a year ahead.
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

/// Every discovery and OpenAPI document of the server, built once.
#[derive(Clone, Debug)]
pub struct Discovery {
    options: Options,
    aggregated_etag: String,
    openapi_v2: Document,
    openapi_v3: Vec<OpenApiV3Entry>,
    openapi_v3_index: Document,
}

#[derive(Clone, Debug)]
struct OpenApiV3Entry {
    path: String,
    hash: String,
    redirect: String,
    document: Document,
}

/// A served resource.
struct Resource {
    name: &'static str,
    kind: &'static str,
    list_kind: &'static str,
    namespaced: bool,
}

const RESOURCES: [Resource; 2] = [
    Resource {
        name: "nodes",
        kind: "NodeMetrics",
        list_kind: "NodeMetricsList",
        namespaced: false,
    },
    Resource {
        name: "pods",
        kind: "PodMetrics",
        list_kind: "PodMetricsList",
        namespaced: true,
    },
];

impl Discovery {
    /// Builds every document for `options`.
    pub fn new(options: Options) -> Discovery {
        let aggregated_etag = quote(&sha512_hex(
            compact(&aggregated_items(&options, None), Escaping::Html).as_bytes(),
        ));
        let routes = routes(&options);
        let defs = definitions();
        let openapi_v2 = openapi_v2_document(&options, &routes, &defs);
        let openapi_v3 = openapi_v3_documents(&options, &routes, &defs);
        let openapi_v3_index = openapi_v3_index_document(&openapi_v3);
        Discovery {
            options,
            aggregated_etag,
            openapi_v2,
            openapi_v3,
            openapi_v3_index,
        }
    }

    /// The options the documents were built with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// `GET /apis` with this `Accept` (empty when absent); `pretty` from [`is_pretty`].
    pub fn apis(&self, accept: &str, pretty: bool) -> Result<Document, NotAcceptable> {
        let choice = negotiate::apis(accept)?;
        let pretty = pretty || choice.pretty;
        Ok(match choice.aggregated {
            Some(version) => self.aggregated(version, pretty),
            None => self.api_group_list(pretty),
        })
    }

    /// `GET /apis/metrics.k8s.io` with this `Accept`; `pretty` from [`is_pretty`].
    pub fn group(&self, accept: &str, pretty: bool) -> Result<Document, NotAcceptable> {
        let choice = negotiate::discovery(accept)?;
        Ok(self.api_group(pretty || choice.pretty))
    }

    /// `GET /apis/metrics.k8s.io/<version>` with this `Accept`; `pretty` from [`is_pretty`].
    pub fn resources(
        &self,
        version: MetricsVersion,
        accept: &str,
        pretty: bool,
    ) -> Result<Document, NotAcceptable> {
        let choice = negotiate::discovery(accept)?;
        Ok(self.api_resource_list(version, pretty || choice.pretty))
    }

    /// The `APIGroupList` of `/apis` (no `apiVersion`, group with `serverAddressByClientCIDRs`).
    pub fn api_group_list(&self, pretty: bool) -> Document {
        let list = obj(vec![
            ("kind", s("APIGroupList")),
            ("groups", Json::Arr(vec![self.group_json(true)])),
        ]);
        json_document(&list, pretty)
    }

    /// The `APIGroup` of `/apis/metrics.k8s.io`.
    pub fn api_group(&self, pretty: bool) -> Document {
        let mut group = vec![
            ("kind".to_string(), s("APIGroup")),
            ("apiVersion".to_string(), s("v1")),
        ];
        if let Json::Obj(fields) = self.group_json(false) {
            group.extend(fields);
        }
        json_document(&Json::Obj(group), pretty)
    }

    /// The `APIResourceList` of `/apis/metrics.k8s.io/<version>`.
    pub fn api_resource_list(&self, version: MetricsVersion, pretty: bool) -> Document {
        let resources = RESOURCES
            .iter()
            .map(|r| {
                obj(vec![
                    ("name", s(r.name)),
                    ("singularName", s("")),
                    ("namespaced", Json::Bool(r.namespaced)),
                    ("kind", s(r.kind)),
                    ("verbs", strings(&verbs(&self.options))),
                ])
            })
            .collect();
        let list = obj(vec![
            ("kind", s("APIResourceList")),
            ("apiVersion", s("v1")),
            ("groupVersion", s(version.api_version())),
            ("resources", Json::Arr(resources)),
        ]);
        json_document(&list, pretty)
    }

    /// The `APIGroupDiscoveryList` of `/apis` in aggregated form, with its `ETag`.
    pub fn aggregated(&self, version: Version, pretty: bool) -> Document {
        let list = aggregated_items(&self.options, Some(version));
        let mut document = json_document(&list, pretty);
        document.content_type = version.content_type();
        document.etag = Some(self.aggregated_etag.clone());
        document.vary_accept = true;
        document.cache_control = Some("public");
        document.etag_rule = EtagRule::Exact;
        document
    }

    /// `GET /openapi/v2` (JSON; check [`negotiate::openapi_accepts_json`] first).
    pub fn openapi_v2(&self) -> &Document {
        &self.openapi_v2
    }

    /// `GET /openapi/v3`: the index of the v3 documents.
    pub fn openapi_v3_index(&self) -> &Document {
        &self.openapi_v3_index
    }

    /// The v3 document paths, as in the index (`apis/metrics.k8s.io/v1`, ...).
    pub fn openapi_v3_paths(&self) -> impl Iterator<Item = &str> {
        self.openapi_v3.iter().map(|e| e.path.as_str())
    }

    /// `GET /openapi/v3/<path>`; `hash` is the decoded `hash` query parameter (see
    /// [`query_value`]), empty when absent.
    pub fn openapi_v3(&self, path: &str, hash: &str) -> OpenApiV3<'_> {
        let Some(entry) = self.openapi_v3.iter().find(|e| e.path == path) else {
            return OpenApiV3::NotFound;
        };
        if hash.is_empty() {
            OpenApiV3::Document {
                document: &entry.document,
                immutable: false,
            }
        } else if hash == entry.hash {
            OpenApiV3::Document {
                document: &entry.document,
                immutable: true,
            }
        } else {
            OpenApiV3::Redirect {
                location: &entry.redirect,
                document: &entry.document,
            }
        }
    }

    fn group_json(&self, with_addresses: bool) -> Json {
        let version = |gv: MetricsVersion| {
            obj(vec![
                ("groupVersion", s(gv.api_version())),
                ("version", s(gv.version())),
            ])
        };
        let mut fields = vec![
            ("name", s(GROUP)),
            (
                "versions",
                Json::Arr(VERSIONS.into_iter().map(version).collect()),
            ),
            ("preferredVersion", version(VERSIONS[0])),
        ];
        if with_addresses {
            fields.push((
                "serverAddressByClientCIDRs",
                Json::Arr(vec![obj(vec![
                    ("clientCIDR", s("0.0.0.0/0")),
                    ("serverAddress", s(&self.options.external_address)),
                ])]),
            ));
        }
        obj(fields)
    }
}

fn verbs(options: &Options) -> Vec<&'static str> {
    if options.advertise_watch {
        vec!["get", "list", "watch"]
    } else {
        vec!["get", "list"]
    }
}

/// Compact (`json.Encoder`, trailing newline) or indented (`json.MarshalIndent`) JSON.
fn json_document(value: &Json, pretty_output: bool) -> Document {
    let body = if pretty_output {
        pretty(value, Escaping::Html)
    } else {
        let mut body = compact(value, Escaping::Html);
        body.push('\n');
        body
    };
    Document::json(CONTENT_TYPE_JSON, body)
}

/// The aggregated list; without `version`, the form hashed for the `ETag` (no type meta).
fn aggregated_items(options: &Options, version: Option<Version>) -> Json {
    let resources: Vec<Json> = RESOURCES
        .iter()
        .map(|r| {
            obj(vec![
                ("resource", s(r.name)),
                (
                    "responseKind",
                    obj(vec![
                        ("group", s("")),
                        ("version", s("")),
                        ("kind", s(r.kind)),
                    ]),
                ),
                (
                    "scope",
                    s(if r.namespaced {
                        "Namespaced"
                    } else {
                        "Cluster"
                    }),
                ),
                ("singularResource", s("")),
                ("verbs", strings(&verbs(options))),
            ])
        })
        .collect();
    let versions = VERSIONS
        .into_iter()
        .map(|gv| {
            obj(vec![
                ("version", s(gv.version())),
                ("resources", Json::Arr(resources.clone())),
                ("freshness", s("Current")),
            ])
        })
        .collect();
    let group = obj(vec![
        ("metadata", obj(vec![("name", s(GROUP))])),
        ("versions", Json::Arr(versions)),
    ]);
    let mut list = Vec::new();
    if let Some(version) = version {
        list.push(("kind", s("APIGroupDiscoveryList")));
        list.push(("apiVersion", s(version.api_version())));
    }
    list.push(("metadata", obj(vec![])));
    list.push(("items", Json::Arr(vec![group])));
    obj(list)
}

/// Outcome of negotiating `GET /apis`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApisChoice {
    /// `Some` for aggregated discovery in that version, `None` for the `APIGroupList`.
    pub aggregated: Option<Version>,
    /// The chosen media range carried `pretty=1`.
    pub pretty: bool,
}

/// Outcome of negotiating a plain discovery endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JsonChoice {
    /// The chosen media range carried `pretty=1`.
    pub pretty: bool,
}

/// The apiserver's `isPrettyPrint`: `pretty` in the raw query decides when present and
/// non-empty (`1`, `t`, `T`, `TRUE`, `true`, `True` are true; anything else false); else a
/// `User-Agent` starting with `curl`, `Wget` or `Mozilla/5.0` gets indented output.
pub fn is_pretty(raw_query: &str, user_agent: &str) -> bool {
    if raw_query.contains("pretty") {
        if let Some(value) = query_value(raw_query, "pretty").filter(|v| !v.is_empty()) {
            return matches!(value.as_str(), "1" | "t" | "T" | "TRUE" | "true" | "True");
        }
    }
    ["curl", "Wget", "Mozilla/5.0"]
        .iter()
        .any(|p| user_agent.starts_with(p))
}

/// Go's `url.Values.Get` on the parsed raw query: the first value of `name`, decoded (`+`
/// is a space, `%XX` a byte). Pairs containing `;` or with bad escapes are skipped, as Go
/// does. Use it for the OpenAPI v3 `hash` parameter.
pub fn query_value(raw_query: &str, name: &str) -> Option<String> {
    raw_query
        .split('&')
        .filter(|pair| !pair.contains(';'))
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Some((query_unescape(k)?, query_unescape(v)?))
        })
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

/// Go's `url.QueryUnescape`: `+` is a space, `%XX` a byte; `None` on a bad escape.
fn query_unescape(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// `http.ServeContent`'s `If-None-Match` check: `*` or any listed tag equal to `etag`
/// once `W/` prefixes are ignored.
fn if_none_match_weak(header: &str, etag: &str) -> bool {
    let opaque = |t: &str| t.strip_prefix("W/").unwrap_or(t).to_string();
    let mut rest = header;
    loop {
        rest = rest.trim_start_matches([' ', '\t']);
        if rest.is_empty() {
            return false;
        }
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
            continue;
        }
        if rest.starts_with('*') {
            return true;
        }
        let Some((tag, remain)) = scan_etag(rest) else {
            return false;
        };
        if opaque(tag) == opaque(etag) {
            return true;
        }
        rest = remain;
    }
}

/// Go's `scanETag`: an optionally weak quoted tag at the start of `s`, and the rest.
fn scan_etag(s: &str) -> Option<(&str, &str)> {
    let start = if s.starts_with("W/") { 2 } else { 0 };
    let bytes = s.as_bytes();
    if bytes.get(start) != Some(&b'"') {
        return None;
    }
    for (i, &c) in bytes.iter().enumerate().skip(start + 1) {
        match c {
            b'"' => return Some((&s[..=i], &s[i + 1..])),
            0x21 | 0x23..=0x7e | 0x80..=0xff => {}
            _ => return None,
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// OpenAPI
// ---------------------------------------------------------------------------------------

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";
const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";
const VERSION_INFO: &str = "io.k8s.apimachinery.pkg.version.Info";

fn meta(kind: &str) -> String {
    format!("{META}.{kind}")
}

fn metrics_def(version: MetricsVersion, kind: &str) -> String {
    format!(
        "io.k8s.metrics.pkg.apis.metrics.{}.{kind}",
        version.version()
    )
}

/// The subset of an OpenAPI schema the documents use.
#[derive(Clone, Debug, Default)]
struct Schema {
    description: Option<String>,
    kind: Option<&'static str>,
    format: Option<&'static str>,
    default: Option<Json>,
    required: Vec<&'static str>,
    items: Option<Box<Schema>>,
    one_of: Vec<Schema>,
    properties: BTreeMap<&'static str, Schema>,
    additional_properties: Option<Box<Schema>>,
    reference: Option<String>,
    extensions: BTreeMap<&'static str, Json>,
    /// A different schema for OpenAPI v2 (kube-openapi's embedded v2 schema).
    v2: Option<Box<Schema>>,
}

impl Schema {
    fn object(description: &str) -> Schema {
        Schema {
            description: Some(description.to_string()),
            kind: Some("object"),
            ..Schema::default()
        }
    }

    fn scalar(kind: &'static str, description: &str) -> Schema {
        Schema {
            description: (!description.is_empty()).then(|| description.to_string()),
            kind: Some(kind),
            ..Schema::default()
        }
    }

    fn string(description: &str) -> Schema {
        Schema::scalar("string", description)
    }

    /// A string the Go type always has (openapi-gen's `default: ""`).
    fn string_default(description: &str) -> Schema {
        Schema {
            default: Some(s("")),
            ..Schema::string(description)
        }
    }

    fn int64(description: &str) -> Schema {
        Schema {
            format: Some("int64"),
            ..Schema::scalar("integer", description)
        }
    }

    fn reference(name: &str) -> Schema {
        Schema {
            reference: Some(name.to_string()),
            ..Schema::default()
        }
    }

    fn described_reference(description: &str, name: &str) -> Schema {
        Schema {
            description: Some(description.to_string()),
            ..Schema::reference(name)
        }
    }

    /// A struct-typed field (openapi-gen's `default: {}`).
    fn embedded(description: &str, name: &str) -> Schema {
        Schema {
            default: Some(obj(vec![])),
            ..Schema::described_reference(description, name)
        }
    }

    fn array(description: &str, items: Schema) -> Schema {
        Schema {
            items: Some(Box::new(items)),
            ..Schema::scalar("array", description)
        }
    }

    fn map(description: &str, values: Schema) -> Schema {
        Schema {
            additional_properties: Some(Box::new(values)),
            ..Schema::object(description)
        }
    }

    fn prop(mut self, name: &'static str, schema: Schema) -> Schema {
        self.properties.insert(name, schema);
        self
    }

    fn require(mut self, names: &[&'static str]) -> Schema {
        self.required = names.to_vec();
        self
    }

    fn ext(mut self, name: &'static str, value: Json) -> Schema {
        self.extensions.insert(name, value);
        self
    }

    fn atomic(self) -> Schema {
        self.ext("x-kubernetes-list-type", s("atomic"))
    }

    /// `kind` and `apiVersion` of a top-level type.
    fn type_meta(self) -> Schema {
        self.prop(
            "apiVersion",
            Schema::string(
                "The versioned schema of this representation of the object. Servers convert \
                 recognized schemas to their latest internal value and may reject others.",
            ),
        )
        .prop(
            "kind",
            Schema::string(
                "The REST resource this object represents, in CamelCase. Servers may infer it \
                 from the endpoint the request was sent to. Cannot be updated.",
            ),
        )
    }

    /// `x-kubernetes-group-version-kind`, as the apiserver's definition namer adds it.
    fn gvk(self, group: &str, version: &str, kind: &str) -> Schema {
        self.ext(
            "x-kubernetes-group-version-kind",
            Json::Arr(vec![obj(vec![
                ("group", s(group)),
                ("kind", s(kind)),
                ("version", s(version)),
            ])]),
        )
    }

    fn references(&self, out: &mut BTreeSet<String>) {
        if let Some(r) = &self.reference {
            out.insert(r.clone());
        }
        let nested = self
            .items
            .iter()
            .chain(&self.additional_properties)
            .map(|b| b.as_ref())
            .chain(self.one_of.iter())
            .chain(self.properties.values());
        for schema in nested {
            schema.references(out);
        }
    }

    /// Anything besides `$ref`, which OpenAPI v3 must then wrap in `allOf`.
    fn has_siblings(&self) -> bool {
        self.description.is_some()
            || self.kind.is_some()
            || self.format.is_some()
            || self.default.is_some()
            || !self.required.is_empty()
            || self.items.is_some()
            || !self.one_of.is_empty()
            || !self.properties.is_empty()
            || self.additional_properties.is_some()
            || !self.extensions.is_empty()
    }

    /// Renders in kube-openapi's field order; v2 prunes defaults, v3 wraps refs.
    fn render(&self, dialect: Dialect) -> Json {
        if dialect == Dialect::V2 {
            if let Some(v2) = &self.v2 {
                return v2.render(dialect);
            }
        }
        let wrap = dialect == Dialect::V3 && self.reference.is_some() && self.has_siblings();
        let mut o: Vec<(String, Json)> = Vec::new();
        let mut put = |k: &str, v: Json| o.push((k.to_string(), v));
        if let Some(d) = &self.description {
            put("description", s(d));
        }
        if let Some(t) = self.kind {
            put("type", s(t));
        }
        if let Some(f) = self.format {
            put("format", s(f));
        }
        if let (Some(d), Dialect::V3) = (&self.default, dialect) {
            put("default", d.clone());
        }
        if !self.required.is_empty() {
            put("required", strings(&self.required));
        }
        if let Some(items) = &self.items {
            put("items", items.render(dialect));
        }
        if let (true, Some(r)) = (wrap, &self.reference) {
            put(
                "allOf",
                Json::Arr(vec![obj(vec![("$ref", s(&dialect.reference(r)))])]),
            );
        }
        if !self.one_of.is_empty() {
            put(
                "oneOf",
                Json::Arr(self.one_of.iter().map(|x| x.render(dialect)).collect()),
            );
        }
        if !self.properties.is_empty() {
            let props = self
                .properties
                .iter()
                .map(|(k, v)| (k.to_string(), v.render(dialect)))
                .collect();
            put("properties", Json::Obj(props));
        }
        if let Some(a) = &self.additional_properties {
            put("additionalProperties", a.render(dialect));
        }
        if let (false, Some(r)) = (wrap, &self.reference) {
            put("$ref", s(&dialect.reference(r)));
        }
        for (k, v) in &self.extensions {
            put(k, v.clone());
        }
        Json::Obj(o)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dialect {
    V2,
    V3,
}

impl Dialect {
    fn reference(self, name: &str) -> String {
        match self {
            Dialect::V2 => format!("#/definitions/{name}"),
            Dialect::V3 => format!("#/components/schemas/{name}"),
        }
    }
}

/// Every definition the documents may reference, by name.
fn definitions() -> BTreeMap<String, Schema> {
    let mut d = BTreeMap::new();
    let gvfd = meta("GroupVersionForDiscovery");
    let sabcc = meta("ServerAddressByClientCIDR");
    d.insert(
        meta("APIGroupList"),
        Schema::object("The API groups a server serves, as returned by GET /apis.")
            .type_meta()
            .prop(
                "groups",
                Schema::array("The groups.", Schema::reference(&meta("APIGroup"))).atomic(),
            )
            .require(&["groups"])
            .gvk("", "v1", "APIGroupList"),
    );
    d.insert(
        meta("APIGroup"),
        Schema::object("Name, served versions and preferred version of an API group.")
            .type_meta()
            .prop("name", Schema::string_default("Name of the group."))
            .prop(
                "versions",
                Schema::array("Versions the group serves.", Schema::reference(&gvfd)).atomic(),
            )
            .prop(
                "preferredVersion",
                Schema::embedded("The version the server prefers clients to use.", &gvfd),
            )
            .prop(
                "serverAddressByClientCIDRs",
                Schema::array(
                    "Addresses this group is served at, by client CIDR, so that clients can \
                     pick the nearest; a client uses the longest CIDR it matches.",
                    Schema::reference(&sabcc),
                )
                .atomic(),
            )
            .require(&["name", "versions"])
            .gvk("", "v1", "APIGroup"),
    );
    d.insert(
        gvfd.clone(),
        Schema::object("One version of a group, as \"group/version\" and as \"version\".")
            .prop(
                "groupVersion",
                Schema::string_default("Group and version, as \"group/version\"."),
            )
            .prop("version", Schema::string_default("The version alone."))
            .require(&["groupVersion", "version"]),
    );
    d.insert(
        sabcc,
        Schema::object("The address of the server for clients in a CIDR.")
            .prop(
                "clientCIDR",
                Schema::string_default("Clients whose IP is in this CIDR use serverAddress."),
            )
            .prop(
                "serverAddress",
                Schema::string_default("Host name or IP, with an optional port."),
            )
            .require(&["clientCIDR", "serverAddress"]),
    );
    d.insert(
        meta("APIResourceList"),
        Schema::object("The resources served in one group version.")
            .type_meta()
            .prop(
                "groupVersion",
                Schema::string_default("The group version, as \"group/version\"."),
            )
            .prop(
                "resources",
                Schema::array(
                    "The resources: names, scope, kind and verbs.",
                    Schema::reference(&meta("APIResource")),
                )
                .atomic(),
            )
            .require(&["groupVersion", "resources"])
            .gvk("", "v1", "APIResourceList"),
    );
    let string_list = |description: &str| Schema::array(description, Schema::string(""));
    d.insert(
        meta("APIResource"),
        Schema::object("A resource: its names, scope, kind and verbs.")
            .prop(
                "name",
                Schema::string_default("Plural name of the resource."),
            )
            .prop(
                "singularName",
                Schema::string_default(
                    "Singular name of the resource; when empty, clients derive it from the kind.",
                ),
            )
            .prop(
                "namespaced",
                Schema {
                    default: Some(Json::Bool(false)),
                    ..Schema::scalar(
                        "boolean",
                        "Whether objects of the resource live in namespaces.",
                    )
                },
            )
            .prop(
                "group",
                Schema::string("Group of the resource when it differs from the list's."),
            )
            .prop(
                "version",
                Schema::string("Version of the resource when it differs from the list's."),
            )
            .prop(
                "kind",
                Schema::string_default("Kind of the resource's objects."),
            )
            .prop(
                "verbs",
                string_list("Kubernetes verbs the resource supports: get, list, watch, ..."),
            )
            .prop(
                "shortNames",
                string_list("Short names clients may accept for the resource.").atomic(),
            )
            .prop(
                "categories",
                string_list("Groupings the resource belongs to, such as all.").atomic(),
            )
            .prop(
                "storageVersionHash",
                Schema::string(
                    "Opaque hash of the version the resource is stored as; only equality \
                     comparisons are meaningful.",
                ),
            )
            .require(&["name", "singularName", "namespaced", "kind", "verbs"]),
    );
    let time = meta("Time");
    d.insert(
        meta("ObjectMeta"),
        Schema::object("Metadata that every persisted object has.")
            .prop(
                "name",
                Schema::string(
                    "Name of the object, unique in its namespace (or in the cluster when not \
                     namespaced).",
                ),
            )
            .prop(
                "generateName",
                Schema::string("Prefix of a unique name the server generates when name is empty."),
            )
            .prop(
                "namespace",
                Schema::string("Namespace of the object; empty when not namespaced."),
            )
            .prop("selfLink", Schema::string("Deprecated; not set."))
            .prop(
                "uid",
                Schema::string(
                    "Identifier of the object, unique in time and space; set by the server.",
                ),
            )
            .prop(
                "resourceVersion",
                Schema::string(
                    "Opaque version of the object, for concurrency control and watches.",
                ),
            )
            .prop(
                "generation",
                Schema::int64("Sequence number of the desired state; set by the server."),
            )
            .prop(
                "creationTimestamp",
                Schema::described_reference(
                    "When the object was created; set by the server.",
                    &time,
                ),
            )
            .prop(
                "deletionTimestamp",
                Schema::described_reference(
                    "When the object will be removed, once its deletion was requested.",
                    &time,
                ),
            )
            .prop(
                "deletionGracePeriodSeconds",
                Schema::int64("Seconds the object has to terminate before it is removed."),
            )
            .prop(
                "labels",
                Schema::map(
                    "String keys and values that organize and select objects.",
                    Schema::string(""),
                ),
            )
            .prop(
                "annotations",
                Schema::map(
                    "String keys and values for tools; not used to select objects.",
                    Schema::string(""),
                ),
            )
            .prop(
                "ownerReferences",
                Schema::array(
                    "Objects this one depends on; it is garbage-collected once all are gone.",
                    Schema::reference(&meta("OwnerReference")),
                )
                .ext("x-kubernetes-list-map-keys", strings(&["uid"]))
                .ext("x-kubernetes-list-type", s("map"))
                .ext("x-kubernetes-patch-merge-key", s("uid"))
                .ext("x-kubernetes-patch-strategy", s("merge")),
            )
            .prop(
                "finalizers",
                string_list("Conditions to meet before the object is removed from storage.")
                    .ext("x-kubernetes-list-type", s("set"))
                    .ext("x-kubernetes-patch-strategy", s("merge")),
            )
            .prop(
                "managedFields",
                Schema::array(
                    "Which manager set which fields, for server-side apply.",
                    Schema::reference(&meta("ManagedFieldsEntry")),
                )
                .atomic(),
            ),
    );
    d.insert(
        meta("ListMeta"),
        Schema::object("Metadata of lists and other synthetic objects.")
            .prop("selfLink", Schema::string("Deprecated; not set."))
            .prop(
                "resourceVersion",
                Schema::string("Version of the list, from which a watch can start."),
            )
            .prop(
                "continue",
                Schema::string("Token for the next chunk of a chunked list; empty after the last."),
            )
            .prop(
                "remainingItemCount",
                Schema::int64("Estimated number of items after this chunk, when known."),
            ),
    );
    d.insert(
        meta("ManagedFieldsEntry"),
        Schema::object("A manager and the fields it manages.")
            .prop("manager", Schema::string("Name of the manager."))
            .prop(
                "operation",
                Schema::string("Kind of change: Apply or Update."),
            )
            .prop(
                "apiVersion",
                Schema::string("Version of the resource the fields are expressed in."),
            )
            .prop(
                "time",
                Schema::described_reference("When the fields last changed.", &time),
            )
            .prop(
                "fieldsType",
                Schema::string("Format of fieldsV1; only FieldsV1."),
            )
            .prop(
                "fieldsV1",
                Schema::described_reference("The fields, as a trie.", &meta("FieldsV1")),
            )
            .prop(
                "subresource",
                Schema::string("Subresource the change was made through, if any."),
            ),
    );
    d.insert(
        meta("FieldsV1"),
        Schema::object(
            "A set of fields as a JSON trie, in the format of sigs.k8s.io/structured-merge-diff.",
        ),
    );
    d.insert(
        meta("OwnerReference"),
        Schema::object("Refers to an owning object, in the same namespace or not namespaced.")
            .prop(
                "apiVersion",
                Schema::string_default("API version of the owner."),
            )
            .prop("kind", Schema::string_default("Kind of the owner."))
            .prop("name", Schema::string_default("Name of the owner."))
            .prop("uid", Schema::string_default("UID of the owner."))
            .prop(
                "controller",
                Schema::scalar("boolean", "Whether the owner is the managing controller."),
            )
            .prop(
                "blockOwnerDeletion",
                Schema::scalar(
                    "boolean",
                    "Whether foreground deletion of the owner waits until this reference is gone.",
                ),
            )
            .require(&["apiVersion", "kind", "name", "uid"])
            .ext("x-kubernetes-map-type", s("atomic")),
    );
    d.insert(
        time.clone(),
        Schema {
            format: Some("date-time"),
            ..Schema::string("A point in time, written in RFC 3339 form.")
        },
    );
    d.insert(
        meta("Duration"),
        Schema::string("A duration in Go syntax, such as 1m30s."),
    );
    let quantity = "A fixed-point number with an optional suffix: binary SI (Ki, Mi, Gi, Ti, Pi, \
                    Ei), decimal SI (m, k, M, G, T, P, E) or a decimal exponent (e3). Written in \
                    canonical form, such as 1500m or 1536Mi, never as a floating-point value.";
    d.insert(
        QUANTITY.to_string(),
        Schema {
            description: Some(quantity.to_string()),
            one_of: vec![Schema::string(""), Schema::scalar("number", "")],
            v2: Some(Box::new(Schema::string(quantity))),
            ..Schema::default()
        },
    );
    d.insert(
        VERSION_INFO.to_string(),
        Schema::object("Version of the server.")
            .prop(
                "major",
                Schema::string_default("Major version of the binary."),
            )
            .prop(
                "minor",
                Schema::string_default("Minor version of the binary."),
            )
            .prop("emulationMajor", Schema::string("Major version emulated."))
            .prop("emulationMinor", Schema::string("Minor version emulated."))
            .prop(
                "minCompatibilityMajor",
                Schema::string("Major version of the oldest compatible version."),
            )
            .prop(
                "minCompatibilityMinor",
                Schema::string("Minor version of the oldest compatible version."),
            )
            .prop("gitVersion", Schema::string_default(""))
            .prop("gitCommit", Schema::string_default(""))
            .prop("gitTreeState", Schema::string_default(""))
            .prop("buildDate", Schema::string_default(""))
            .prop("goVersion", Schema::string_default(""))
            .prop("compiler", Schema::string_default(""))
            .prop("platform", Schema::string_default(""))
            .require(&[
                "major",
                "minor",
                "gitVersion",
                "gitCommit",
                "gitTreeState",
                "buildDate",
                "goVersion",
                "compiler",
                "platform",
            ]),
    );
    let usage = || {
        Schema::map(
            "Usage by resource name: cpu in cores, memory as the working set in bytes.",
            Schema::reference(QUANTITY),
        )
    };
    for gv in VERSIONS {
        let v = gv.version();
        let timestamp =
            || Schema::described_reference("End of the window the usage was measured over.", &time);
        d.insert(
            metrics_def(gv, "ContainerMetrics"),
            Schema::object("Resource usage of one container.")
                .prop(
                    "name",
                    Schema::string_default("Name of the container, as in the pod's spec."),
                )
                .prop("usage", usage())
                .require(&["name", "usage"]),
        );
        d.insert(
            metrics_def(gv, "NodeMetrics"),
            Schema::object("Resource usage of a node.")
                .type_meta()
                .prop(
                    "metadata",
                    Schema::embedded(
                        "Standard object metadata; the name is the node's.",
                        &meta("ObjectMeta"),
                    ),
                )
                .prop("timestamp", timestamp())
                .prop("window", Schema::reference(&meta("Duration")))
                .prop("usage", usage())
                .require(&["timestamp", "window", "usage"])
                .gvk(GROUP, v, "NodeMetrics"),
        );
        d.insert(
            metrics_def(gv, "PodMetrics"),
            Schema::object("Resource usage of a pod, by container.")
                .type_meta()
                .prop(
                    "metadata",
                    Schema::embedded(
                        "Standard object metadata; name and namespace are the pod's.",
                        &meta("ObjectMeta"),
                    ),
                )
                .prop("timestamp", timestamp())
                .prop("window", Schema::reference(&meta("Duration")))
                .prop(
                    "containers",
                    Schema::array(
                        "Usage of every container, all over the same window.",
                        Schema::reference(&metrics_def(gv, "ContainerMetrics")),
                    )
                    .atomic(),
                )
                .require(&["timestamp", "window", "containers"])
                .gvk(GROUP, v, "PodMetrics"),
        );
        for (kind, what) in [("NodeMetrics", "node"), ("PodMetrics", "pod")] {
            let list_kind: &'static str = if kind == "NodeMetrics" {
                "NodeMetricsList"
            } else {
                "PodMetricsList"
            };
            d.insert(
                metrics_def(gv, list_kind),
                Schema::object(&format!("A list of {kind}."))
                    .type_meta()
                    .prop(
                        "metadata",
                        Schema::embedded("Standard list metadata.", &meta("ListMeta")),
                    )
                    .prop(
                        "items",
                        Schema::array(
                            &format!("The {what} metrics."),
                            Schema::reference(&metrics_def(gv, kind)),
                        ),
                    )
                    .require(&["items"])
                    .gvk(GROUP, v, list_kind),
            );
        }
    }
    d
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

    fn required(&self) -> bool {
        self.location == "path"
    }

    /// kube-openapi v2 parameter: validations, simple schema, then parameter props.
    fn render_v2(&self) -> Json {
        let mut o = vec![
            ("uniqueItems", Json::Bool(true)),
            ("type", s(self.kind)),
            ("description", s(&self.description)),
            ("name", s(self.name)),
            ("in", s(self.location)),
        ];
        if self.required() {
            o.push(("required", Json::Bool(true)));
        }
        obj(o)
    }

    fn render_v3(&self) -> Json {
        let mut o = vec![
            ("name", s(self.name)),
            ("in", s(self.location)),
            ("description", s(&self.description)),
        ];
        if self.required() {
            o.push(("required", Json::Bool(true)));
        }
        o.push((
            "schema",
            obj(vec![
                ("type", s(self.kind)),
                ("uniqueItems", Json::Bool(true)),
            ]),
        ));
        obj(o)
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
    response: String,
    params: Vec<Param>,
    /// `x-kubernetes-action` and the kind's version and kind.
    resource: Option<(&'static str, MetricsVersion, &'static str)>,
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

fn operation_extensions(route: &Route) -> Vec<(&'static str, Json)> {
    match route.resource {
        Some((action, gv, kind)) => vec![
            ("x-kubernetes-action", s(action)),
            (
                "x-kubernetes-group-version-kind",
                obj(vec![
                    ("group", s(GROUP)),
                    ("version", s(gv.version())),
                    ("kind", s(kind)),
                ]),
            ),
        ],
        None => Vec::new(),
    }
}

/// Definitions reachable from `roots`, rendered, by name.
fn reachable(defs: &BTreeMap<String, Schema>, roots: &[&str], dialect: Dialect) -> Json {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<String> = roots.iter().map(|r| r.to_string()).collect();
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        if let Some(schema) = defs.get(&name) {
            let mut refs = BTreeSet::new();
            schema.references(&mut refs);
            todo.extend(refs);
        }
    }
    Json::Obj(
        seen.iter()
            .filter_map(|n| defs.get(n).map(|d| (n.clone(), d.render(dialect))))
            .collect(),
    )
}

fn info(options: &Options) -> Json {
    obj(vec![
        ("title", s(&options.openapi_title)),
        ("version", s(&options.openapi_version)),
    ])
}

/// `/openapi/v2`: kube-openapi's builder output, marshalled as its handler does.
fn openapi_v2_document(
    options: &Options,
    routes: &[Route],
    defs: &BTreeMap<String, Schema>,
) -> Document {
    let mut shared: BTreeMap<String, Json> = BTreeMap::new();
    let mut paths = Vec::new();
    for route in routes {
        let mut op = vec![
            ("description", s(&route.description)),
            ("consumes", strings(route.consumes)),
            ("produces", strings(route.produces)),
            ("schemes", strings(&["https"])),
            ("tags", strings(&[route.tag.as_str()])),
            ("operationId", s(&route.operation_id)),
            (
                "responses",
                obj(vec![(
                    "200",
                    obj(vec![
                        ("description", s("OK")),
                        (
                            "schema",
                            obj(vec![("$ref", s(&Dialect::V2.reference(&route.response)))]),
                        ),
                    ]),
                )]),
            ),
        ];
        op.extend(operation_extensions(route));
        let mut item = vec![("get", obj(op))];
        let params: Vec<Json> = route
            .params
            .iter()
            .map(|p| {
                let rendered = p.render_v2();
                if p.name == "name" {
                    return rendered;
                }
                // Shared parameter: named after a hash of its encoding/json form.
                let key = compact(&rendered, Escaping::Html);
                let name = format!("{}-{}", p.name, base64_url(&fnv1_64(key.as_bytes())[..6]));
                shared.insert(name.clone(), rendered);
                obj(vec![("$ref", s(&format!("#/parameters/{name}")))])
            })
            .collect();
        if !params.is_empty() {
            item.push(("parameters", Json::Arr(params)));
        }
        paths.push((route.path.clone(), obj(item)));
    }
    paths.sort_by(|a, b| a.0.cmp(&b.0));
    let responses: Vec<&str> = routes.iter().map(|r| r.response.as_str()).collect();
    let mut doc = vec![
        ("swagger", s("2.0")),
        ("info", info(options)),
        ("paths", Json::Obj(paths)),
        ("definitions", reachable(defs, &responses, Dialect::V2)),
    ];
    if !shared.is_empty() {
        doc.push(("parameters", Json::Obj(shared.into_iter().collect())));
    }
    // The handler marshals with jsonv2 directly: no HTML escaping, no newline.
    let body = compact(&obj(doc), Escaping::Minimal);
    let mut document = Document::json(CONTENT_TYPE_JSON, body);
    document.etag = Some(quote(&sha512_hex(&document.body)));
    document.vary_accept = true;
    document.etag_rule = EtagRule::Weak;
    document
}

/// One v3 document per web service root, with its hash.
fn openapi_v3_documents(
    options: &Options,
    routes: &[Route],
    defs: &BTreeMap<String, Schema>,
) -> Vec<OpenApiV3Entry> {
    let mut roots: Vec<&str> = routes.iter().map(|r| r.root.as_str()).collect();
    roots.sort_unstable();
    roots.dedup();
    roots
        .into_iter()
        .map(|root| {
            let group: Vec<&Route> = routes.iter().filter(|r| r.root == root).collect();
            let mut paths = Vec::new();
            for route in &group {
                let schema = obj(vec![("$ref", s(&Dialect::V3.reference(&route.response)))]);
                let content = route
                    .produces
                    .iter()
                    .map(|m| (m.to_string(), obj(vec![("schema", schema.clone())])))
                    .collect();
                let mut op = vec![
                    ("tags", strings(&[route.tag.as_str()])),
                    ("description", s(&route.description)),
                    ("operationId", s(&route.operation_id)),
                    (
                        "responses",
                        obj(vec![(
                            "200",
                            obj(vec![
                                ("description", s("OK")),
                                ("content", Json::Obj(content)),
                            ]),
                        )]),
                    ),
                ];
                op.extend(operation_extensions(route));
                let mut item = vec![("get", obj(op))];
                if !route.params.is_empty() {
                    item.push((
                        "parameters",
                        Json::Arr(route.params.iter().map(Param::render_v3).collect()),
                    ));
                }
                paths.push((route.path.clone(), obj(item)));
            }
            paths.sort_by(|a, b| a.0.cmp(&b.0));
            let responses: Vec<&str> = group.iter().map(|r| r.response.as_str()).collect();
            let doc = obj(vec![
                ("openapi", s("3.0.0")),
                ("info", info(options)),
                ("paths", Json::Obj(paths)),
                (
                    "components",
                    obj(vec![("schemas", reachable(defs, &responses, Dialect::V3))]),
                ),
            ]);
            // handler3 passes the jsonv2 output through encoding/json: HTML-escaped.
            let mut document = Document::json(CONTENT_TYPE_JSON, compact(&doc, Escaping::Html));
            let hash = sha512_hex(&document.body);
            document.etag = Some(quote(&hash));
            document.vary_accept = true;
            document.etag_rule = EtagRule::Weak;
            OpenApiV3Entry {
                path: root.to_string(),
                redirect: server_relative_url(root, &hash),
                hash,
                document,
            }
        })
        .collect()
}

fn server_relative_url(root: &str, hash: &str) -> String {
    format!("/openapi/v3/{root}?hash={hash}")
}

fn openapi_v3_index_document(entries: &[OpenApiV3Entry]) -> Document {
    let paths = entries
        .iter()
        .map(|e| {
            (
                e.path.clone(),
                obj(vec![("serverRelativeURL", s(&e.redirect))]),
            )
        })
        .collect();
    let index = obj(vec![("paths", Json::Obj(paths))]);
    let mut document = Document::json(CONTENT_TYPE_JSON, compact(&index, Escaping::Html));
    document.etag = Some(quote(&sha512_hex(&document.body)));
    document.etag_rule = EtagRule::Weak;
    document
}

// ---------------------------------------------------------------------------------------
// JSON, written the way Go writes it
// ---------------------------------------------------------------------------------------

/// A JSON value whose objects keep their field order.
#[derive(Clone, Debug, PartialEq)]
enum Json {
    Bool(bool),
    Int(i64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

fn s(value: &str) -> Json {
    Json::Str(value.to_string())
}

fn obj(fields: Vec<(&str, Json)>) -> Json {
    Json::Obj(
        fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

fn strings<S: AsRef<str>>(values: &[S]) -> Json {
    Json::Arr(values.iter().map(|v| s(v.as_ref())).collect())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Escaping {
    /// Go's `encoding/json`: also `<`, `>`, `&`, U+2028 and U+2029.
    Html,
    /// kube-openapi's jsonv2: only what JSON requires.
    Minimal,
}

fn compact(value: &Json, escaping: Escaping) -> String {
    let mut out = String::new();
    write_compact(value, escaping, &mut out);
    out
}

fn write_compact(value: &Json, escaping: Escaping, out: &mut String) {
    match value {
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Int(i) => out.push_str(&i.to_string()),
        Json::Str(v) => write_string(v, escaping, out),
        Json::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_compact(item, escaping, out);
            }
            out.push(']');
        }
        Json::Obj(fields) => {
            out.push('{');
            for (i, (k, v)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, escaping, out);
                out.push(':');
                write_compact(v, escaping, out);
            }
            out.push('}');
        }
    }
}

/// `json.MarshalIndent(v, "", "  ")`.
fn pretty(value: &Json, escaping: Escaping) -> String {
    let mut out = String::new();
    write_pretty(value, escaping, 0, &mut out);
    out
}

fn write_pretty(value: &Json, escaping: Escaping, depth: usize, out: &mut String) {
    let indent = |out: &mut String, depth: usize| {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    };
    match value {
        Json::Arr(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                indent(out, depth + 1);
                write_pretty(item, escaping, depth + 1, out);
            }
            indent(out, depth);
            out.push(']');
        }
        Json::Obj(fields) if !fields.is_empty() => {
            out.push('{');
            for (i, (k, v)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                indent(out, depth + 1);
                write_string(k, escaping, out);
                out.push_str(": ");
                write_pretty(v, escaping, depth + 1, out);
            }
            indent(out, depth);
            out.push('}');
        }
        other => write_compact(other, escaping, out),
    }
}

fn write_string(value: &str, escaping: Escaping, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                out.push_str("\\u00");
                out.push(char::from(HEX[(c as usize) >> 4]));
                out.push(char::from(HEX[(c as usize) & 0xf]));
            }
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' if escaping == Escaping::Html => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

// ---------------------------------------------------------------------------------------
// Hashes
// ---------------------------------------------------------------------------------------

fn quote(tag: &str) -> String {
    format!("\"{tag}\"")
}

/// Upper-case hex SHA-512, Go's `fmt.Sprintf("%X", sha512.Sum512(data))`.
fn sha512_hex(data: &[u8]) -> String {
    sha512(data).iter().map(|b| format!("{b:02X}")).collect()
}

/// Go's `hash/fnv` `New64` (FNV-1, not FNV-1a), big-endian sum.
fn fnv1_64(data: &[u8]) -> [u8; 8] {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        hash ^= u64::from(b);
    }
    hash.to_be_bytes()
}

/// Go's `base64.URLEncoding` (padded; no padding arises for 6 bytes).
fn base64_url(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[rustfmt::skip]
const SHA512_K: [u64; 80] = [
    0x428a2f98d728ae22, 0x7137449123ef65cd, 0xb5c0fbcfec4d3b2f, 0xe9b5dba58189dbbc,
    0x3956c25bf348b538, 0x59f111f1b605d019, 0x923f82a4af194f9b, 0xab1c5ed5da6d8118,
    0xd807aa98a3030242, 0x12835b0145706fbe, 0x243185be4ee4b28c, 0x550c7dc3d5ffb4e2,
    0x72be5d74f27b896f, 0x80deb1fe3b1696b1, 0x9bdc06a725c71235, 0xc19bf174cf692694,
    0xe49b69c19ef14ad2, 0xefbe4786384f25e3, 0x0fc19dc68b8cd5b5, 0x240ca1cc77ac9c65,
    0x2de92c6f592b0275, 0x4a7484aa6ea6e483, 0x5cb0a9dcbd41fbd4, 0x76f988da831153b5,
    0x983e5152ee66dfab, 0xa831c66d2db43210, 0xb00327c898fb213f, 0xbf597fc7beef0ee4,
    0xc6e00bf33da88fc2, 0xd5a79147930aa725, 0x06ca6351e003826f, 0x142929670a0e6e70,
    0x27b70a8546d22ffc, 0x2e1b21385c26c926, 0x4d2c6dfc5ac42aed, 0x53380d139d95b3df,
    0x650a73548baf63de, 0x766a0abb3c77b2a8, 0x81c2c92e47edaee6, 0x92722c851482353b,
    0xa2bfe8a14cf10364, 0xa81a664bbc423001, 0xc24b8b70d0f89791, 0xc76c51a30654be30,
    0xd192e819d6ef5218, 0xd69906245565a910, 0xf40e35855771202a, 0x106aa07032bbd1b8,
    0x19a4c116b8d2d0c8, 0x1e376c085141ab53, 0x2748774cdf8eeb99, 0x34b0bcb5e19b48a8,
    0x391c0cb3c5c95a63, 0x4ed8aa4ae3418acb, 0x5b9cca4f7763e373, 0x682e6ff3d6b2b8a3,
    0x748f82ee5defb2fc, 0x78a5636f43172f60, 0x84c87814a1f0ab72, 0x8cc702081a6439ec,
    0x90befffa23631e28, 0xa4506cebde82bde9, 0xbef9a3f7b2c67915, 0xc67178f2e372532b,
    0xca273eceea26619c, 0xd186b8c721c0c207, 0xeada7dd6cde0eb1e, 0xf57d4f7fee6ed178,
    0x06f067aa72176fba, 0x0a637dc5a2c898a6, 0x113f9804bef90dae, 0x1b710b35131c471b,
    0x28db77f523047d84, 0x32caab7b40c72493, 0x3c9ebe0a15c9bebc, 0x431d67c49c100d4c,
    0x4cc5d4becb3e42b6, 0x597f299cfc657e2a, 0x5fcb6fab3ad6faec, 0x6c44198c4a475817,
];

/// SHA-512 (FIPS 180-4), for the ETags and OpenAPI v3 hashes.
fn sha512(data: &[u8]) -> [u8; 64] {
    let mut h: [u64; 8] = [
        0x6a09e667f3bcc908,
        0xbb67ae8584caa73b,
        0x3c6ef372fe94f82b,
        0xa54ff53a5f1d36f1,
        0x510e527fade682d1,
        0x9b05688c2b3e6c1f,
        0x1f83d9abfb41bd6b,
        0x5be0cd19137e2179,
    ];
    let mut message = data.to_vec();
    message.push(0x80);
    while message.len() % 128 != 112 {
        message.push(0);
    }
    message.extend_from_slice(&((data.len() as u128) * 8).to_be_bytes());
    for block in message.chunks_exact(128) {
        let mut w = [0u64; 80];
        for (i, word) in block.chunks_exact(8).enumerate() {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(word);
            w[i] = u64::from_be_bytes(bytes);
        }
        for i in 16..80 {
            let s0 = w[i - 15].rotate_right(1) ^ w[i - 15].rotate_right(8) ^ (w[i - 15] >> 7);
            let s1 = w[i - 2].rotate_right(19) ^ w[i - 2].rotate_right(61) ^ (w[i - 2] >> 6);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..80 {
            let s1 = e.rotate_right(14) ^ e.rotate_right(18) ^ e.rotate_right(41);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(SHA512_K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(28) ^ a.rotate_right(34) ^ a.rotate_right(39);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 64];
    for (chunk, word) in out.chunks_exact_mut(8).zip(h) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
    use serde::Deserialize;
    use serde_json::Value;

    // client-go's discovery constants and the real clients' headers.
    use crate::api::negotiate::tests::{discovery_client_accepts, ACCEPT_V2};

    fn discovery() -> Discovery {
        Discovery::new(Options::default())
    }

    fn with_watch() -> Discovery {
        Discovery::new(Options {
            advertise_watch: true,
            ..Options::default()
        })
    }

    fn value(doc: &Document) -> Value {
        serde_json::from_slice(&doc.body).expect("valid JSON")
    }

    const GROUP_VERSIONS: &str = concat!(
        r#""versions":[{"groupVersion":"metrics.k8s.io/v1","version":"v1"},"#,
        r#"{"groupVersion":"metrics.k8s.io/v1beta1","version":"v1beta1"}],"#,
        r#""preferredVersion":{"groupVersion":"metrics.k8s.io/v1","version":"v1"}"#
    );

    #[test]
    fn apis_group_list_golden() {
        let doc = discovery().api_group_list(false);
        let want = format!(
            "{}{}{}\n",
            r#"{"kind":"APIGroupList","groups":[{"name":"metrics.k8s.io","#,
            GROUP_VERSIONS,
            r#","serverAddressByClientCIDRs":[{"clientCIDR":"0.0.0.0/0","serverAddress":":10250"}]}]}"#
        );
        assert_eq!(doc.text(), want);
        assert_eq!(doc.content_type, "application/json");
        assert_eq!(doc.etag, None);
        assert!(!doc.vary_accept);
        assert!(!doc.not_modified("*"));
    }

    #[test]
    fn apis_group_list_pretty_golden() {
        let doc = Discovery::new(Options {
            external_address: "10.0.0.1:4443".into(),
            ..Options::default()
        })
        .api_group_list(true);
        let want = r#"{
  "kind": "APIGroupList",
  "groups": [
    {
      "name": "metrics.k8s.io",
      "versions": [
        {
          "groupVersion": "metrics.k8s.io/v1",
          "version": "v1"
        },
        {
          "groupVersion": "metrics.k8s.io/v1beta1",
          "version": "v1beta1"
        }
      ],
      "preferredVersion": {
        "groupVersion": "metrics.k8s.io/v1",
        "version": "v1"
      },
      "serverAddressByClientCIDRs": [
        {
          "clientCIDR": "0.0.0.0/0",
          "serverAddress": "10.0.0.1:4443"
        }
      ]
    }
  ]
}"#;
        assert_eq!(doc.text(), want);
    }

    #[test]
    fn api_group_golden() {
        let want = format!(
            "{}{}}}\n",
            r#"{"kind":"APIGroup","apiVersion":"v1","name":"metrics.k8s.io","#, GROUP_VERSIONS
        );
        assert_eq!(discovery().api_group(false).text(), want);
    }

    fn resource_list(version: &str, verbs: &str) -> String {
        format!(
            concat!(
                r#"{{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"metrics.k8s.io/{}","#,
                r#""resources":[{{"name":"nodes","singularName":"","namespaced":false,"kind":"NodeMetrics","verbs":{}}},"#,
                r#"{{"name":"pods","singularName":"","namespaced":true,"kind":"PodMetrics","verbs":{}}}]}}"#,
                "\n"
            ),
            version, verbs, verbs
        )
    }

    #[test]
    fn api_resource_list_golden() {
        let d = discovery();
        let plain = r#"["get","list"]"#;
        assert_eq!(
            d.api_resource_list(MetricsVersion::V1beta1, false).text(),
            resource_list("v1beta1", plain)
        );
        assert_eq!(
            d.api_resource_list(MetricsVersion::V1, false).text(),
            resource_list("v1", plain)
        );
        assert_eq!(
            with_watch()
                .api_resource_list(MetricsVersion::V1, false)
                .text(),
            resource_list("v1", r#"["get","list","watch"]"#)
        );
    }

    fn aggregated_resources(verbs: &str) -> String {
        format!(
            concat!(
                r#""resources":[{{"resource":"nodes","responseKind":{{"group":"","version":"","kind":"NodeMetrics"}},"#,
                r#""scope":"Cluster","singularResource":"","verbs":{}}},"#,
                r#"{{"resource":"pods","responseKind":{{"group":"","version":"","kind":"PodMetrics"}},"#,
                r#""scope":"Namespaced","singularResource":"","verbs":{}}}]"#
            ),
            verbs, verbs
        )
    }

    fn aggregated_items_golden(verbs: &str) -> String {
        let r = aggregated_resources(verbs);
        format!(
            concat!(
                r#""metadata":{{}},"items":[{{"metadata":{{"name":"metrics.k8s.io"}},"versions":["#,
                r#"{{"version":"v1",{},"freshness":"Current"}},"#,
                r#"{{"version":"v1beta1",{},"freshness":"Current"}}]}}]"#
            ),
            r, r
        )
    }

    #[test]
    fn aggregated_golden_and_etag() {
        let d = discovery();
        let items = aggregated_items_golden(r#"["get","list"]"#);
        for (version, api_version, content_type) in [
            (
                Version::V2,
                "apidiscovery.k8s.io/v2",
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            ),
            (
                Version::V2Beta1,
                "apidiscovery.k8s.io/v2beta1",
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
            ),
        ] {
            let doc = d.aggregated(version, false);
            let want = format!(
                r#"{{"kind":"APIGroupDiscoveryList","apiVersion":"{api_version}",{items}}}"#
            ) + "\n";
            assert_eq!(doc.text(), want);
            assert_eq!(doc.content_type, content_type);
            assert!(doc.vary_accept);
            assert_eq!(doc.cache_control, Some("public"));
            // The ETag hashes json.Marshal of the v2 list without type meta, whatever the
            // requested version.
            let etag = format!("\"{}\"", sha512_hex(format!("{{{items}}}").as_bytes()));
            assert_eq!(doc.etag.as_deref(), Some(etag.as_str()));
            assert_eq!(
                etag,
                "\"E2A0C2FDF79E6BB41C38754AE9AB5F74EE19250E21C943DE2BD4B550AB8ABFAE040FCA044AA76ED612001A9476AF65A7640A09451550354016C0449A81F7E066\""
            );
            // 304 only on an exact match (apiserver compares the whole header).
            assert!(doc.not_modified(&etag));
            assert!(!doc.not_modified(&format!("W/{etag}")));
            assert!(!doc.not_modified(&format!("{etag}, \"x\"")));
            assert!(!doc.not_modified("*"));
            assert!(!doc.not_modified(""));
        }
        let watch = with_watch().aggregated(Version::V2, false);
        assert!(watch
            .text()
            .contains(&aggregated_items_golden(r#"["get","list","watch"]"#)));
        assert_ne!(watch.etag, d.aggregated(Version::V2, false).etag);
    }

    #[test]
    fn aggregated_pretty_golden() {
        let doc = discovery().aggregated(Version::V2, true);
        let resource = |name: &str, kind: &str, scope: &str| {
            format!(
                r#"            {{
              "resource": "{name}",
              "responseKind": {{
                "group": "",
                "version": "",
                "kind": "{kind}"
              }},
              "scope": "{scope}",
              "singularResource": "",
              "verbs": [
                "get",
                "list"
              ]
            }}"#
            )
        };
        let version = |v: &str| {
            format!(
                "        {{\n          \"version\": \"{v}\",\n          \"resources\": [\n{},\n{}\n          ],\n          \"freshness\": \"Current\"\n        }}",
                resource("nodes", "NodeMetrics", "Cluster"),
                resource("pods", "PodMetrics", "Namespaced")
            )
        };
        let want = format!(
            "{{\n  \"kind\": \"APIGroupDiscoveryList\",\n  \"apiVersion\": \"apidiscovery.k8s.io/v2\",\n  \"metadata\": {{}},\n  \"items\": [\n    {{\n      \"metadata\": {{\n        \"name\": \"metrics.k8s.io\"\n      }},\n      \"versions\": [\n{},\n{}\n      ]\n    }}\n  ]\n}}",
            version("v1"),
            version("v1beta1")
        );
        assert_eq!(doc.text(), want);
    }

    #[test]
    fn not_acceptable_golden() {
        let doc = NotAcceptable.document();
        let want = r#"{
  "kind": "Status",
  "apiVersion": "v1",
  "metadata": {},
  "status": "Failure",
  "message": "only the following media types are accepted: application/json",
  "reason": "NotAcceptable",
  "code": 406
}"#;
        assert_eq!(doc.text(), want);
        assert_eq!(doc.content_type, "application/json");
        assert_eq!(NotAcceptable::STATUS, 406);
    }

    #[test]
    fn round_trip_through_k8s_openapi() {
        let d = discovery();

        let body = d.api_group_list(false).body;
        let list: metav1::APIGroupList = serde_json::from_slice(&body).expect("APIGroupList");
        assert_eq!(list.groups.len(), 1);
        let group = &list.groups[0];
        assert_eq!(group.name, "metrics.k8s.io");
        let versions: Vec<&str> = group.versions.iter().map(|v| v.version.as_str()).collect();
        assert_eq!(versions, ["v1", "v1beta1"]);
        assert_eq!(
            group
                .preferred_version
                .as_ref()
                .map(|p| p.group_version.as_str()),
            Some("metrics.k8s.io/v1")
        );
        let cidrs = group
            .server_address_by_client_cidrs
            .as_ref()
            .expect("addresses");
        assert_eq!(cidrs[0].client_cidr, "0.0.0.0/0");
        assert_eq!(cidrs[0].server_address, ":10250");
        // k8s-openapi writes the same fields back, plus type meta it always sets.
        let mut back = serde_json::to_value(&list).expect("serialize");
        let mut orig: Value = serde_json::from_slice(&body).expect("json");
        orig["apiVersion"] = Value::from("v1");
        for g in back["groups"].as_array_mut().expect("groups") {
            if let Some(g) = g.as_object_mut() {
                g.remove("apiVersion");
                g.remove("kind");
            }
        }
        assert_eq!(back, orig);

        let body = d.api_group(false).body;
        let group: metav1::APIGroup = serde_json::from_slice(&body).expect("APIGroup");
        assert_eq!(group.name, "metrics.k8s.io");
        assert!(group.server_address_by_client_cidrs.is_none());
        let orig: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(serde_json::to_value(&group).expect("serialize"), orig);

        for gv in VERSIONS {
            let body = d.api_resource_list(gv, false).body;
            let list: metav1::APIResourceList =
                serde_json::from_slice(&body).expect("APIResourceList");
            assert_eq!(list.group_version, gv.api_version());
            let names: Vec<(&str, bool, &str)> = list
                .resources
                .iter()
                .map(|r| (r.name.as_str(), r.namespaced, r.kind.as_str()))
                .collect();
            assert_eq!(
                names,
                [
                    ("nodes", false, "NodeMetrics"),
                    ("pods", true, "PodMetrics")
                ]
            );
            for r in &list.resources {
                assert_eq!(r.singular_name, "");
                assert_eq!(r.verbs, ["get", "list"]);
                assert!(r.short_names.is_none() && r.categories.is_none());
                assert!(r.storage_version_hash.is_none() && r.group.is_none());
            }
            let orig: Value = serde_json::from_slice(&body).expect("json");
            assert_eq!(serde_json::to_value(&list).expect("serialize"), orig);
        }
    }

    // apidiscovery.k8s.io/v2 as in k8s.io/api (k8s-openapi has no such types): unknown
    // fields are errors, so the body must have exactly this shape.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct GroupDiscoveryList {
        kind: String,
        api_version: String,
        #[allow(dead_code)]
        metadata: serde_json::Map<String, Value>,
        items: Vec<GroupDiscovery>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct GroupDiscovery {
        metadata: ObjectName,
        versions: Vec<VersionDiscovery>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ObjectName {
        name: String,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct VersionDiscovery {
        version: String,
        resources: Vec<ResourceDiscovery>,
        freshness: String,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct ResourceDiscovery {
        resource: String,
        response_kind: Gvk,
        scope: String,
        singular_resource: String,
        verbs: Vec<String>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Gvk {
        group: String,
        version: String,
        kind: String,
    }

    #[test]
    fn aggregated_has_the_apidiscovery_shape() {
        let doc = discovery().aggregated(Version::V2Beta1, true);
        let list: GroupDiscoveryList = serde_json::from_slice(&doc.body).expect("shape");
        assert_eq!(list.kind, "APIGroupDiscoveryList");
        assert_eq!(list.api_version, "apidiscovery.k8s.io/v2beta1");
        assert_eq!(list.items.len(), 1);
        assert_eq!(list.items[0].metadata.name, "metrics.k8s.io");
        let versions = &list.items[0].versions;
        assert_eq!(versions[0].version, "v1");
        assert_eq!(versions[1].version, "v1beta1");
        for v in versions {
            assert_eq!(v.freshness, "Current");
            let got: Vec<_> = v
                .resources
                .iter()
                .map(|r| {
                    let k = &r.response_kind;
                    (
                        r.resource.as_str(),
                        k.group.as_str(),
                        k.version.as_str(),
                        k.kind.as_str(),
                        r.scope.as_str(),
                        r.singular_resource.as_str(),
                        r.verbs.join(","),
                    )
                })
                .collect();
            assert_eq!(
                got,
                [
                    (
                        "nodes",
                        "",
                        "",
                        "NodeMetrics",
                        "Cluster",
                        "",
                        "get,list".to_string()
                    ),
                    (
                        "pods",
                        "",
                        "",
                        "PodMetrics",
                        "Namespaced",
                        "",
                        "get,list".to_string()
                    ),
                ]
            );
        }
    }

    #[test]
    fn kubectl_and_aggregator_accept_headers() {
        let cases = discovery_client_accepts();
        let d = discovery();
        for (who, accept, want) in cases {
            let doc = d.apis(&accept, false).expect(who);
            match want {
                Some(v) => assert_eq!(doc.content_type, v.content_type(), "{who}"),
                None => {
                    assert_eq!(doc.content_type, "application/json", "{who}");
                    assert!(
                        doc.text().starts_with(r#"{"kind":"APIGroupList","#),
                        "{who}"
                    );
                }
            }
        }
    }

    #[test]
    fn plain_discovery_documents() {
        let d = discovery();
        assert_eq!(d.group("application/yaml", false), Err(NotAcceptable));
        assert_eq!(
            d.resources(MetricsVersion::V1beta1, "application/json", true)
                .expect("json")
                .text(),
            d.api_resource_list(MetricsVersion::V1beta1, true).text()
        );
        assert!(d.group("", false).expect("json").text().ends_with("}\n"));
    }

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
            assert_eq!(is_pretty(query, agent), want, "{query:?} {agent:?}");
        }
        let d = discovery();
        assert!(d
            .apis("", true)
            .expect("ok")
            .text()
            .starts_with("{\n  \"kind\""));
        assert!(d
            .apis(ACCEPT_V2, true)
            .expect("ok")
            .text()
            .starts_with("{\n  \"kind\""));
    }

    #[test]
    fn query_values() {
        assert_eq!(
            query_value("hash=AB%43&hash=x", "hash").as_deref(),
            Some("ABC")
        );
        assert_eq!(query_value("a=1&b", "b").as_deref(), Some(""));
        assert_eq!(query_value("a=%zz&a=2", "a").as_deref(), Some("2"));
        assert_eq!(query_value("a=1;b=2", "a"), None);
        assert_eq!(query_value("", "a"), None);
    }

    #[test]
    fn weak_if_none_match() {
        let etag = "\"ABC\"";
        for yes in [
            "\"ABC\"",
            "W/\"ABC\"",
            "\"x\", \"ABC\"",
            " ,\t\"x\",W/\"ABC\"",
            "*",
        ] {
            assert!(if_none_match_weak(yes, etag), "{yes}");
        }
        for no in ["", "\"abc\"", "ABC", "\"x\", ABC", "\"AB"] {
            assert!(!if_none_match_weak(no, etag), "{no}");
        }
        let d = discovery();
        let v2 = d.openapi_v2();
        let tag = v2.etag.clone().expect("etag");
        assert!(v2.not_modified(&tag));
        assert!(v2.not_modified(&format!("W/{tag}")));
        assert!(!v2.not_modified(""));
    }

    #[test]
    fn hashes() {
        let cases: [(&[u8], &str); 3] = [
            (b"", "CF83E1357EEFB8BDF1542850D66D8007D620E4050B5715DC83F4A921D36CE9CE47D0D13C5D85F2B0FF8318D2877EEC2F63B931BD47417A81A538327AF927DA3E"),
            (b"abc", "DDAF35A193617ABACC417349AE20413112E6FA4E89A97EA20A9EEEE64B55D39A2192992A274FC1A836BA3C23A3FEEBBD454D4423643CE80E2A9AC94FA54CA49F"),
            (b"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu", "8E959B75DAE313DA8CF4F72814FC143F8F7779C6EB9F7FA17299AEADB6889018501D289E4900F7E4331B99DEC4B5433AC7D329EEB6DD26545E96E55B874BE909"),
        ];
        for (data, want) in cases {
            assert_eq!(sha512_hex(data), want);
        }
        assert_eq!(
            sha512_hex(&[b'a'; 1000]),
            "67BA5535A46E3F86DBFBED8CBBAF0125C76ED549FF8B0B9E03E0C88CF90FA634FA7B12B47D77B694DE488ACE8D9A65967DC96DF599727D3292A8D9D447709C97"
        );
        assert_eq!(u64::from_be_bytes(fnv1_64(b"")), 0xcbf29ce484222325);
        assert_eq!(u64::from_be_bytes(fnv1_64(b"a")), 0xaf63bd4c8601b7be);
        assert_eq!(u64::from_be_bytes(fnv1_64(b"foobar")), 0x340d8765a4dda9c2);
        assert_eq!(base64_url(&[0xfb, 0xff, 0xbf, 0, 1, 2]), "-_-_AAEC");
        assert_eq!(base64_url(b"ab"), "YWI=");
    }

    #[test]
    fn go_string_escaping() {
        let text = "a\"b\\c\n\r\t\u{8}\u{c}\u{1}<>&\u{2028}é";
        let mut html = String::new();
        write_string(text, Escaping::Html, &mut html);
        assert_eq!(
            html,
            r#""a\"b\\c\n\r\t\b\f\u0001\u003c\u003e\u0026\u2028é""#
        );
        let mut minimal = String::new();
        write_string(text, Escaping::Minimal, &mut minimal);
        assert_eq!(minimal, "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001<>&\u{2028}é\"");
        assert_eq!(
            pretty(
                &obj(vec![("a", Json::Arr(vec![])), ("b", obj(vec![]))]),
                Escaping::Html
            ),
            "{\n  \"a\": [],\n  \"b\": {}\n}"
        );
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
        r##"{"$ref":"#/parameters/pretty-etVLvpAj"}]}"##
    );

    const PODS_LIST_V2: &str = concat!(
        r##""/apis/metrics.k8s.io/v1/pods":{"get":{"description":"list objects of kind PodMetrics","consumes":["*/*"],"##,
        r##""produces":["application/json","application/json;stream=watch"],"schemes":["https"],"tags":["metrics_v1"],"##,
        r##""operationId":"listMetricsV1PodMetricsForAllNamespaces","responses":{"200":{"description":"OK","schema":"##,
        r##"{"$ref":"#/definitions/io.k8s.metrics.pkg.apis.metrics.v1.PodMetricsList"}}},"x-kubernetes-action":"list","##,
        r##""x-kubernetes-group-version-kind":{"group":"metrics.k8s.io","version":"v1","kind":"PodMetrics"}},"##,
        r##""parameters":[{"$ref":"#/parameters/allowWatchBookmarks-xkcCtzOj"},{"$ref":"#/parameters/continue-5VISLVgK"},"##,
        r##"{"$ref":"#/parameters/fieldSelector-6eKYIrqf"},{"$ref":"#/parameters/labelSelector-8GrR-S_W"},"##,
        r##"{"$ref":"#/parameters/limit-c0h1GcZz"},{"$ref":"#/parameters/pretty-etVLvpAj"},"##,
        r##"{"$ref":"#/parameters/resourceVersion-5LUlNPCR"},{"$ref":"#/parameters/resourceVersionMatch-1NE63MhF"},"##,
        r##"{"$ref":"#/parameters/sendInitialEvents-5RzmOZs4"},{"$ref":"#/parameters/timeoutSeconds-b5tPE93z"},"##,
        r##"{"$ref":"#/parameters/watch-Q-DpQmhL"}]}"##
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

    #[test]
    fn openapi_v2() {
        let d = Discovery::new(Options {
            openapi_version: "v0.1.0".into(),
            ..Options::default()
        });
        let doc = d.openapi_v2();
        let text = doc.text();
        assert!(text.starts_with(r#"{"swagger":"2.0","info":{"title":"kpulse","version":"v"#));
        for fragment in [NODES_ITEM_V2, PODS_LIST_V2, NODE_METRICS_V2] {
            assert!(text.contains(fragment), "missing {fragment}");
        }
        assert!(text.contains(concat!(
            r#""pretty-etVLvpAj":{"uniqueItems":true,"type":"string","description":"If 'true', the output is "#,
            r#"indented. Defaults to 'false' unless the client looks like a browser or a command-line HTTP tool "#,
            r#"(curl, wget).","name":"pretty","in":"query"}"#
        )));
        assert!(text.contains(
            r#""io.k8s.apimachinery.pkg.api.resource.Quantity":{"description":"A fixed-point number"#
        ));
        assert!(!text.ends_with('\n'));
        assert_eq!(doc.content_type, "application/json");
        assert!(doc.vary_accept);
        let v = value(doc);
        refs_resolve(&v, "#/definitions/", &v["definitions"]);
        refs_resolve(&v, "#/parameters/", &v["parameters"]);
        // Defaults are pruned in v2; Quantity is the v2 string form.
        assert!(!text.contains("\"default\""));
        assert_eq!(v["definitions"][QUANTITY]["type"], "string");
        // Shared parameter names are the hash of their encoding/json form.
        for (name, param) in v["parameters"].as_object().expect("parameters") {
            let json = serde_json::to_string(param).expect("json");
            let reordered = json_in_go_order(param);
            assert_eq!(json.len(), reordered.len());
            let hash = base64_url(&fnv1_64(reordered.as_bytes())[..6]);
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

    /// A v2 parameter re-serialized in kube-openapi's field order.
    fn json_in_go_order(param: &Value) -> String {
        let mut fields = vec![];
        for k in [
            "uniqueItems",
            "type",
            "description",
            "name",
            "in",
            "required",
        ] {
            if let Some(x) = param.get(k) {
                fields.push((
                    k,
                    match x {
                        Value::Bool(b) => Json::Bool(*b),
                        Value::String(t) => s(t),
                        _ => Json::Bool(false),
                    },
                ));
            }
        }
        compact(&obj(fields), Escaping::Html)
    }

    const V2_SHA512: &str = "DAC9E722BFA1914241F2198C669B500A2D03FDEB6985A512536F3DE4C063ABEFE0054E73D6FB3CF166C25120DA2A3391578341BC209A859D73B279503A95CB05";

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

    fn v3(d: &Discovery, path: &str) -> Document {
        match d.openapi_v3(path, "") {
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
        let d = Discovery::new(Options {
            openapi_version: "v0.1.0".into(),
            ..Options::default()
        });
        let paths: Vec<&str> = d.openapi_v3_paths().collect();
        assert_eq!(
            paths,
            [
                "apis",
                "apis/metrics.k8s.io",
                "apis/metrics.k8s.io/v1",
                "apis/metrics.k8s.io/v1beta1"
            ]
        );
        assert_eq!(v3(&d, "apis/metrics.k8s.io").text(), V3_GROUP);
        let apis = v3(&d, "apis");
        assert!(apis.text().contains(concat!(
            r##""paths":{"/apis/":{"get":{"tags":["apis"],"description":"get available API versions","##,
            r##""operationId":"getAPIVersions","responses":{"200":{"description":"OK","content":{"application/json":"##,
            r##"{"schema":{"$ref":"#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.APIGroupList"}}}}}}}}"##
        )));
        let v1beta1 = v3(&d, "apis/metrics.k8s.io/v1beta1");
        let v1 = v3(&d, "apis/metrics.k8s.io/v1");
        assert!(v1beta1.text().contains(NODES_LIST_V3), "nodes list");
        assert!(v1.text().contains(POD_ITEM_V3), "pod item");
        assert!(v1.text().contains(POD_METRICS_V3), "PodMetrics");
        assert!(v1.text().contains(QUANTITY_V3), "Quantity");
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

    const V3_APIS_SHA512: &str = "4D10EF20F75FBC005F3A9917F0638530560966490A17E3959DB26777BFD0437E63555754412841A1B237F758618E87B6B4E93E09A8C4A104D3D912B801F5D899";
    const V3_V1_SHA512: &str = "C96CEB64EC46FDAB1E73BDFE8484CAFE19814BDD655305E92FE4A8F294D13D14B064B8B77583F80476EEF5FEBAE20A9505C3ECED6A66BA79E1E81C2094739E76";
    const V3_V1BETA1_SHA512: &str = "5FF2ACEBE317EE92458E3BE24E9FB2F3136B2EB423998AB0D994DD872B1C8C555433982E620C958E998CDB54F6056AC8573B17FBBF3B7CBB0E73430F625A9CB8";

    #[test]
    fn openapi_v3_index_and_hashes() {
        let d = Discovery::new(Options {
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
        let index = d.openapi_v3_index();
        assert_eq!(index.text(), want);
        assert_eq!(index.content_type, "application/json");
        assert!(!index.vary_accept);
        let etag = format!("\"{}\"", sha512_hex(want.as_bytes()));
        assert_eq!(index.etag.as_deref(), Some(etag.as_str()));
        assert!(index.not_modified(&etag));

        let h = hash("apis/metrics.k8s.io/v1beta1");
        match d.openapi_v3("apis/metrics.k8s.io/v1beta1", &h) {
            OpenApiV3::Document {
                immutable,
                document,
            } => {
                assert!(immutable);
                assert_eq!(document.etag.as_deref(), Some(format!("\"{h}\"").as_str()));
            }
            other => panic!("{other:?}"),
        }
        match d.openapi_v3("apis/metrics.k8s.io/v1beta1", "0123") {
            OpenApiV3::Redirect { location, .. } => assert_eq!(
                location,
                format!("/openapi/v3/apis/metrics.k8s.io/v1beta1?hash={h}")
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            d.openapi_v3("apis/metrics.k8s.io/v2", ""),
            OpenApiV3::NotFound
        );
        assert_eq!(d.openapi_v3("version", ""), OpenApiV3::NotFound);
    }

    #[test]
    fn version_endpoint_option() {
        let d = Discovery::new(Options {
            version_endpoint: true,
            openapi_title: "Kubernetes metrics-server".into(),
            openapi_version: "v0.8.0".into(),
            ..Options::default()
        });
        assert!(d.openapi_v3_paths().any(|p| p == "version"));
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
        assert_eq!(v3(&d, "version").text(), want);
        let v2 = d.openapi_v2().text();
        assert!(v2.contains(r##""/version/":{"get":{"description":"get the version information for this server","consumes":["application/json"],"produces":["application/json"],"schemes":["https"],"tags":["version"],"operationId":"getCodeVersion","responses":{"200":{"description":"OK","schema":{"$ref":"#/definitions/io.k8s.apimachinery.pkg.version.Info"}}}}}"##));
    }

    #[test]
    fn watch_option_changes_descriptions_only_where_advertised() {
        let d = with_watch();
        let v2 = d.openapi_v2().text();
        assert!(v2.contains(r#""description":"list or watch objects of kind NodeMetrics""#));
        assert!(!v2.contains(r#""list objects of kind"#));
        assert!(!v2.contains("/watch/"));
        let plain = discovery();
        assert!(plain
            .openapi_v2()
            .text()
            .contains(r#""name":"watch","in":"query""#));
    }

    #[test]
    fn protobuf_option_lists_protobuf_for_resources_only() {
        let d = Discovery::new(Options {
            protobuf: true,
            ..Options::default()
        });
        let v2 = d.openapi_v2().text();
        assert!(v2.contains(concat!(
            r#""produces":["application/json","application/vnd.kubernetes.protobuf","#,
            r#""application/json;stream=watch","application/vnd.kubernetes.protobuf;stream=watch"],"#,
            r#""schemes":["https"],"tags":["metrics_v1"],"operationId":"listMetricsV1NodeMetrics""#
        )));
        assert!(v2.contains(concat!(
            r#""produces":["application/json","application/vnd.kubernetes.protobuf"],"#,
            r#""schemes":["https"],"tags":["metrics_v1"],"operationId":"readMetricsV1NodeMetrics""#
        )));
        assert!(v2.contains(concat!(
            r#""produces":["application/json"],"schemes":["https"],"tags":["metrics_v1"],"#,
            r#""operationId":"getMetricsV1APIResources""#
        )));
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
        let d = Discovery::new(Options {
            version_endpoint: true,
            advertise_watch: true,
            ..Options::default()
        });
        let mut docs = vec![
            d.api_group_list(false),
            d.api_group_list(true),
            d.api_group(true),
            d.aggregated(Version::V2, true),
            d.openapi_v2().clone(),
            d.openapi_v3_index().clone(),
            NotAcceptable.document(),
        ];
        for gv in VERSIONS {
            docs.push(d.api_resource_list(gv, true));
        }
        for p in d.openapi_v3_paths() {
            docs.push(v3(&d, p));
        }
        for doc in docs {
            let _: Value = value(&doc);
        }
    }
}
