//! Discovery documents of `metrics.k8s.io`, and the one place every discovery and OpenAPI
//! document is built ([`Discovery::new`]) and looked up. [`super::negotiate`] picks which
//! document a request's `Accept` gets; [`super::openapi`] builds the OpenAPI ones; both are
//! served as the bytes of a [`Document`]. Discovery bodies are byte for byte what
//! metrics-server (k8s.io/apiserver 1.36) sends.
//!
//! This module is pure: no I/O and no clock. The HTTP layer passes in the request's `Accept`,
//! raw query, `User-Agent` and `If-None-Match`, and sends back a [`Document`] (body,
//! `Content-Type`, `ETag`, `Vary`, `Cache-Control`), a redirect, a 404 or a 406
//! ([`NotAcceptable::document`]). `pretty` arguments come from the request (`request::is_pretty_print`).
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
//! | `GET /apis/custom.metrics.k8s.io[/{v1beta2,v1beta1}]` | [`Discovery::custom_metrics`], when [`Options::custom_metrics`] ([`super::custom`]) |
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
//!
//! # Deliberate differences from metrics-server
//!
//! * Two versions, `v1` (preferred, listed first) and `v1beta1`. `v1` is upstream's GA
//!   version since Kubernetes 1.37 (KEP-5207, `k8s.io/metrics` v0.37: same schema and
//!   protobuf tags as v1beta1). metrics-server v0.8.0 serves v1beta1 only.
//! * Aggregated discovery is also served as `v2beta1` (what kubectl 1.27–1.29 and
//!   kube-aggregator 1.26–1.29 ask for). metrics-server ≤ 0.7 did the same; 0.8+ (apiserver
//!   1.33+, gate `AggregatedDiscoveryRemoveBetaType`) falls back to the `APIGroupList`.
//! * Watch is served but not advertised by default ([`Options::advertise_watch`]): verbs
//!   stay `["get","list"]` like metrics-server's, so generic "watch everything listable"
//!   tools and informer-based controllers don't open watch streams on data that changes on
//!   every scrape; clients that ask (`?watch=true`, `kubectl get -w`) never check discovery
//!   verbs. With the option on: `["get","list","watch"]`.
//! * Discovery is JSON only (client-go and kube-aggregator ask nothing else).
//! * Strings are escaped as JSON requires, not also `<`, `>`, `&` as Go's `encoding/json`
//!   does; no discovery document contains those characters.
//! * `Accept` is negotiated by the rules every path shares ([`super::negotiate`]: RFC 9110,
//!   `q=0` excluded, where goautoneg is looser).
//! * A 406 lists only `application/json`.

use serde::Serialize;

use super::custom::{self, CustomVersion};
use super::document::{
    sha512_hex, Document, EtagRule, NotAcceptable, Options, RESOURCES, VERSIONS,
};
use super::negotiate::{self, Version};
use super::openapi::{OpenApi, OpenApiV3};
use super::types::{MetricsVersion, GROUP};

/// Every discovery and OpenAPI document of the server, built once: the discovery ones
/// compact (index 0) and indented (index 1).
#[derive(Clone, Debug)]
pub struct Discovery {
    options: Options,
    api_group_list: [Document; 2],
    api_group: [Document; 2],
    /// By [`VERSIONS`] index.
    api_resource_lists: Vec<[Document; 2]>,
    /// v2, v2beta1.
    aggregated: [[Document; 2]; 2],
    openapi: OpenApi,
    /// `custom.metrics.k8s.io`'s `APIGroup` and, by [`custom::VERSIONS`] index, its
    /// `APIResourceList`s, when it is served.
    custom: Option<([Document; 2], Vec<[Document; 2]>)>,
}

impl Discovery {
    /// Builds every document for `options`. Fails only if a document cannot be encoded,
    /// which would be a bug (the OpenAPI definitions are a file in the source tree).
    pub fn new(options: Options) -> Result<Discovery, serde_json::Error> {
        let mut groups = vec![group(&options, true)];
        if options.custom_metrics {
            groups.push(custom_group(&options, true));
        }
        let api_group_list = pair(&ApiGroupList {
            kind: "APIGroupList",
            groups,
        })?;
        let api_group = pair(&ApiGroup {
            kind: Some("APIGroup"),
            api_version: Some("v1"),
            ..group(&options, false)
        })?;
        let api_resource_lists = VERSIONS
            .into_iter()
            .map(|version| pair(&api_resource_list(&options, version)))
            .collect::<Result<_, _>>()?;
        let etag = sha512_hex(&serde_json::to_vec(&aggregated(&options, None))?);
        let aggregated_pair = |version: Version| -> Result<[Document; 2], serde_json::Error> {
            let [compact, indented] = pair(&aggregated(&options, Some(version)))?;
            Ok([compact, indented].map(|d| {
                let mut d = d.with_etag(&etag, EtagRule::Exact);
                d.content_type = version.content_type();
                d.vary_accept = true;
                d.cache_control = Some("public");
                d
            }))
        };
        let aggregated = [
            aggregated_pair(Version::V2)?,
            aggregated_pair(Version::V2Beta1)?,
        ];
        let openapi = OpenApi::new(&options)?;
        let custom = if options.custom_metrics {
            let group = pair(&ApiGroup {
                kind: Some("APIGroup"),
                api_version: Some("v1"),
                ..custom_group(&options, false)
            })?;
            let lists = custom::VERSIONS
                .into_iter()
                .map(|v| pair(&custom_resource_list(v)))
                .collect::<Result<_, _>>()?;
            Some((group, lists))
        } else {
            None
        };
        Ok(Discovery {
            options,
            api_group_list,
            api_group,
            api_resource_lists,
            aggregated,
            openapi,
            custom,
        })
    }

    /// The options the documents were built with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Whether `custom.metrics.k8s.io` is served ([`Options::custom_metrics`]).
    pub fn serves_custom_metrics(&self) -> bool {
        self.custom.is_some()
    }

    /// `GET /apis/custom.metrics.k8s.io` (`version` `None`) or `…/<version>` with this
    /// `Accept`; `None` when the group is not served.
    pub fn custom_metrics(
        &self,
        version: Option<CustomVersion>,
        accept: &str,
        pretty: bool,
    ) -> Option<Result<&Document, NotAcceptable>> {
        let (group, lists) = self.custom.as_ref()?;
        Some(negotiate::discovery(accept).map(|choice| {
            let pretty = usize::from(pretty || choice.pretty);
            match version {
                None => &group[pretty],
                Some(v) => {
                    let i = custom::VERSIONS.iter().position(|c| *c == v).unwrap_or(0);
                    &lists[i][pretty]
                }
            }
        }))
    }

    /// `GET /apis` with this `Accept` (empty when absent); `pretty` as `request::is_pretty_print` decides.
    pub fn apis(&self, accept: &str, pretty: bool) -> Result<&Document, NotAcceptable> {
        let choice = negotiate::apis(accept)?;
        let pretty = pretty || choice.pretty;
        Ok(match choice.aggregated {
            Some(version) => self.aggregated(version, pretty),
            None => self.api_group_list(pretty),
        })
    }

    /// `GET /apis/metrics.k8s.io` with this `Accept`; `pretty` as `request::is_pretty_print` decides.
    pub fn group(&self, accept: &str, pretty: bool) -> Result<&Document, NotAcceptable> {
        let choice = negotiate::discovery(accept)?;
        Ok(self.api_group(pretty || choice.pretty))
    }

    /// `GET /apis/metrics.k8s.io/<version>` with this `Accept`; `pretty` as `request::is_pretty_print` decides.
    pub fn resources(
        &self,
        version: MetricsVersion,
        accept: &str,
        pretty: bool,
    ) -> Result<&Document, NotAcceptable> {
        let choice = negotiate::discovery(accept)?;
        Ok(self.api_resource_list(version, pretty || choice.pretty))
    }

    /// The `APIGroupList` of `/apis` (no `apiVersion`, group with `serverAddressByClientCIDRs`).
    pub fn api_group_list(&self, pretty: bool) -> &Document {
        &self.api_group_list[usize::from(pretty)]
    }

    /// The `APIGroup` of `/apis/metrics.k8s.io`.
    pub fn api_group(&self, pretty: bool) -> &Document {
        &self.api_group[usize::from(pretty)]
    }

    /// The `APIResourceList` of `/apis/metrics.k8s.io/<version>`.
    pub fn api_resource_list(&self, version: MetricsVersion, pretty: bool) -> &Document {
        let index = VERSIONS.iter().position(|v| *v == version).unwrap_or(0);
        &self.api_resource_lists[index][usize::from(pretty)]
    }

    /// The `APIGroupDiscoveryList` of `/apis` in aggregated form, with its `ETag`.
    pub fn aggregated(&self, version: Version, pretty: bool) -> &Document {
        let index = match version {
            Version::V2 => 0,
            Version::V2Beta1 => 1,
        };
        &self.aggregated[index][usize::from(pretty)]
    }

    /// `GET /openapi/v2` (JSON; check [`negotiate::openapi_accepts_json`] first).
    pub fn openapi_v2(&self) -> &Document {
        self.openapi.v2()
    }

    /// `GET /openapi/v3`: the index of the v3 documents.
    pub fn openapi_v3_index(&self) -> &Document {
        self.openapi.v3_index()
    }

    /// The v3 document paths, as in the index (`apis/metrics.k8s.io/v1`, ...).
    pub fn openapi_v3_paths(&self) -> impl Iterator<Item = &str> {
        self.openapi.v3_paths()
    }

    /// `GET /openapi/v3/<path>`; `hash` is the decoded `hash` query parameter, empty when
    /// absent.
    pub fn openapi_v3(&self, path: &str, hash: &str) -> OpenApiV3<'_> {
        self.openapi.v3(path, hash)
    }
}

/// A document compact (index 0) and indented (index 1).
fn pair(value: &impl Serialize) -> Result<[Document; 2], serde_json::Error> {
    Ok([Document::json(value, false)?, Document::json(value, true)?])
}

// The documents' shapes, with fields in the apiserver's order.

#[derive(Serialize)]
struct ApiGroupList<'a> {
    kind: &'static str,
    groups: Vec<ApiGroup<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ApiGroup<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_version: Option<&'static str>,
    name: &'static str,
    versions: Vec<GroupVersion>,
    preferred_version: GroupVersion,
    #[serde(
        rename = "serverAddressByClientCIDRs",
        skip_serializing_if = "Option::is_none"
    )]
    server_address_by_client_cidrs: Option<[ServerAddress<'a>; 1]>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GroupVersion {
    group_version: &'static str,
    version: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ServerAddress<'a> {
    #[serde(rename = "clientCIDR")]
    client_cidr: &'static str,
    server_address: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ApiResourceList {
    kind: &'static str,
    api_version: &'static str,
    group_version: &'static str,
    resources: Vec<ApiResource>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ApiResource {
    name: &'static str,
    singular_name: &'static str,
    namespaced: bool,
    kind: &'static str,
    verbs: &'static [&'static str],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AggregatedList {
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_version: Option<&'static str>,
    metadata: Empty,
    items: Vec<AggregatedGroup>,
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
struct AggregatedGroup {
    metadata: Name,
    versions: Vec<AggregatedVersion>,
}

#[derive(Serialize)]
struct Name {
    name: &'static str,
}

#[derive(Serialize)]
struct AggregatedVersion {
    version: &'static str,
    resources: Vec<AggregatedResource>,
    freshness: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AggregatedResource {
    resource: &'static str,
    response_kind: ResponseKind,
    scope: &'static str,
    singular_resource: &'static str,
    /// `None`: Go's nil (a parent made up for subresources), written as `null`.
    verbs: Option<&'static [&'static str]>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    subresources: Vec<AggregatedSubresource>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AggregatedSubresource {
    subresource: &'static str,
    response_kind: ResponseKind,
    verbs: &'static [&'static str],
}

#[derive(Serialize)]
struct ResponseKind {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
}

fn group_version(version: MetricsVersion) -> GroupVersion {
    GroupVersion {
        group_version: version.api_version(),
        version: version.version(),
    }
}

/// The group, with the `0.0.0.0/0` address when it is listed in `/apis`.
fn group(options: &Options, with_addresses: bool) -> ApiGroup<'_> {
    ApiGroup {
        kind: None,
        api_version: None,
        name: GROUP,
        versions: VERSIONS.into_iter().map(group_version).collect(),
        preferred_version: group_version(VERSIONS[0]),
        server_address_by_client_cidrs: with_addresses.then_some([ServerAddress {
            client_cidr: "0.0.0.0/0",
            server_address: &options.external_address,
        }]),
    }
}

fn api_resource_list(options: &Options, version: MetricsVersion) -> ApiResourceList {
    ApiResourceList {
        kind: "APIResourceList",
        api_version: "v1",
        group_version: version.api_version(),
        resources: RESOURCES
            .iter()
            .map(|r| ApiResource {
                name: r.name,
                singular_name: "",
                namespaced: r.namespaced,
                kind: r.kind,
                verbs: options.verbs(),
            })
            .collect(),
    }
}

/// The aggregated list; without `version`, the form hashed for the `ETag` (no type meta).
fn aggregated(options: &Options, version: Option<Version>) -> AggregatedList {
    let resources = || {
        RESOURCES
            .iter()
            .map(|r| AggregatedResource {
                resource: r.name,
                response_kind: ResponseKind {
                    group: "",
                    version: "",
                    kind: r.kind,
                },
                scope: if r.namespaced {
                    "Namespaced"
                } else {
                    "Cluster"
                },
                singular_resource: "",
                verbs: Some(options.verbs()),
                subresources: Vec::new(),
            })
            .collect()
    };
    AggregatedList {
        kind: version.map(|_| "APIGroupDiscoveryList"),
        api_version: version.map(Version::api_version),
        metadata: Empty {},
        items: std::iter::once(AggregatedGroup {
            metadata: Name { name: GROUP },
            versions: VERSIONS
                .into_iter()
                .map(|v| AggregatedVersion {
                    version: v.version(),
                    resources: resources(),
                    freshness: "Current",
                })
                .collect(),
        })
        .chain(options.custom_metrics.then(custom_aggregated))
        .collect(),
    }
}

/// `custom.metrics.k8s.io`'s group, preferring `v1beta2` as custom-metrics-apiserver; with
/// the `0.0.0.0/0` address when it is listed in `/apis`.
fn custom_group(options: &Options, with_addresses: bool) -> ApiGroup<'_> {
    let gv = |v: CustomVersion| GroupVersion {
        group_version: v.api_version(),
        version: v.version(),
    };
    ApiGroup {
        name: custom::GROUP,
        versions: custom::VERSIONS.into_iter().map(gv).collect(),
        preferred_version: gv(custom::VERSIONS[0]),
        ..group(options, with_addresses)
    }
}

/// A version's resources as custom-metrics-apiserver lists its metrics: `pods/<metric>`,
/// namespaced, kind `MetricValueList`, verbs `["get"]`.
fn custom_resource_list(version: CustomVersion) -> ApiResourceList {
    ApiResourceList {
        kind: "APIResourceList",
        api_version: "v1",
        group_version: version.api_version(),
        resources: custom::METRICS
            .iter()
            .map(|m| ApiResource {
                name: m.resource(),
                singular_name: "",
                namespaced: true,
                kind: "MetricValueList",
                verbs: &["get"],
            })
            .collect(),
    }
}

/// `custom.metrics.k8s.io` as the apiserver converts an `APIResourceList` of subresources
/// only (`ConvertGroupVersionIntoToDiscovery`): a made-up parent `pods` with an empty kind
/// and no verbs, holding one subresource per metric.
fn custom_aggregated() -> AggregatedGroup {
    let empty = || ResponseKind {
        group: "",
        version: "",
        kind: "",
    };
    AggregatedGroup {
        metadata: Name {
            name: custom::GROUP,
        },
        versions: custom::VERSIONS
            .into_iter()
            .map(|v| AggregatedVersion {
                version: v.version(),
                resources: vec![AggregatedResource {
                    resource: "pods",
                    response_kind: empty(),
                    scope: "Namespaced",
                    singular_resource: "",
                    verbs: None,
                    subresources: custom::METRICS
                        .iter()
                        .map(|m| AggregatedSubresource {
                            subresource: m.name(),
                            response_kind: ResponseKind {
                                kind: "MetricValueList",
                                ..empty()
                            },
                            verbs: &["get"],
                        })
                        .collect(),
                }],
                freshness: "Current",
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
    use serde::Deserialize;
    use serde_json::Value;

    // client-go's discovery constants and the real clients' headers.
    use crate::api::negotiate::tests::discovery_client_accepts;

    fn discovery() -> Discovery {
        Discovery::new(Options::default()).expect("documents")
    }

    fn with_watch() -> Discovery {
        Discovery::new(Options {
            advertise_watch: true,
            ..Options::default()
        })
        .expect("documents")
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
        let doc = discovery().api_group_list(false).clone();
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
        .expect("documents")
        .api_group_list(true)
        .clone();
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
        let watch = with_watch().aggregated(Version::V2, false).clone();
        assert!(watch
            .text()
            .contains(&aggregated_items_golden(r#"["get","list","watch"]"#)));
        assert_ne!(watch.etag, d.aggregated(Version::V2, false).etag);
    }

    #[test]
    fn aggregated_pretty_golden() {
        let doc = discovery().aggregated(Version::V2, true).clone();
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

        let body = d.api_group_list(false).body.clone();
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

        let body = d.api_group(false).body.clone();
        let group: metav1::APIGroup = serde_json::from_slice(&body).expect("APIGroup");
        assert_eq!(group.name, "metrics.k8s.io");
        assert!(group.server_address_by_client_cidrs.is_none());
        let orig: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(serde_json::to_value(&group).expect("serialize"), orig);

        for gv in VERSIONS {
            let body = d.api_resource_list(gv, false).body.clone();
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
        let doc = discovery().aggregated(Version::V2Beta1, true).clone();
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
    fn every_document_is_valid_json() {
        let d = Discovery::new(Options {
            version_endpoint: true,
            advertise_watch: true,
            ..Options::default()
        })
        .expect("documents");
        let not_acceptable = NotAcceptable.document();
        let mut docs = vec![&not_acceptable, d.openapi_v2(), d.openapi_v3_index()];
        for pretty in [false, true] {
            docs.extend([d.api_group_list(pretty), d.api_group(pretty)]);
            docs.extend([Version::V2, Version::V2Beta1].map(|v| d.aggregated(v, pretty)));
            docs.extend(VERSIONS.map(|gv| d.api_resource_list(gv, pretty)));
        }
        for p in d.openapi_v3_paths() {
            match d.openapi_v3(p, "") {
                OpenApiV3::Document { document, .. } => docs.push(document),
                other => panic!("{p}: {other:?}"),
            }
        }
        for doc in docs {
            let _: Value = value(doc);
        }
    }
}
