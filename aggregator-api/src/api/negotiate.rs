//! Content negotiation for every path the server answers: one `Accept` parser ([`parse`])
//! and one set of rules ([`choose`]), used by the metrics resources, their error bodies,
//! discovery, aggregated discovery and OpenAPI alike.
//!
//! The rules:
//!
//! - **Syntax** (RFC 9110, 12.5.1): comma-separated ranges `type/subtype *( ; name=value )`;
//!   type, subtype and parameter names are case-insensitive, values are tokens or quoted
//!   strings and keep their case (`v=V2` is not `v=v2`, as in the apiserver); a lone `*`
//!   means `*/*`. A range with a malformed type, value or weight is dropped; a parameter
//!   without `=` is ignored; a repeated parameter keeps its last value.
//! - **Weights**: `q` is a number from 0 to 1; **`q=0` means "not acceptable"**: the range is
//!   never chosen, and, being more specific, it overrides the wildcards that would cover it
//!   (`application/json;q=0, */*;q=0.1` refuses JSON; RFC 9110's precedence). Ranges are
//!   tried by weight, then by specificity (`application/json` before `application/*` before
//!   `*/*`), then in the client's order. An absent or empty header means `*/*`.
//! - **Choice**: the first range that names a representation the path has, with parameters
//!   the path allows, decides; within a range the encodings are tried in the apiserver's
//!   order (JSON, YAML, protobuf), so `application/*` and `*/*` mean JSON. None: 406.
//! - **Parameters** (k8s.io/apiserver's `acceptMediaTypeOptions`): `pretty=1` indents JSON;
//!   `stream` may only be `watch`, and not with YAML; `sv` (server version) only `v1`, and
//!   only for the metrics resources; `as`/`g`/`v` ask for a conversion: a `meta.k8s.io`
//!   `Table` (not in protobuf) or `PartialObjectMetadata[List]` for the metrics resources,
//!   `apidiscovery.k8s.io` `APIGroupDiscoveryList` (`v2`, `v2beta1`) for `/apis`, nothing
//!   elsewhere.
//! - **`/apis`**: as the apiserver's aggregated-discovery wrapper, any acceptable range asking
//!   for aggregated discovery wins over plain JSON ranges, whatever their weights.
//!
//! Where the apiserver differs: it parses `Accept` with goautoneg, which keeps `q=0` ranges
//! (so `application/json;q=0` alone gets JSON there and 406 here), compares types
//! case-sensitively, reads `q` with Go's float syntax and breaks ties with an unstable
//! sort. No client of the metrics API sends such headers; RFC 9110 is what a client may
//! rely on (docs/design/aggregator.md, "One content negotiation").

use super::document::{NotAcceptable, CONTENT_TYPE_AGGREGATED_V2, CONTENT_TYPE_AGGREGATED_V2BETA1};
use super::table::TableVersion;

/// The media types the metrics API serves, in the apiserver's order.
pub const MEDIA_TYPES: [&str; 3] = [
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
];

/// The media types the handler writes objects in (no YAML), listed in its 406 answers.
pub const SERVED_MEDIA_TYPES: [&str; 2] = [MEDIA_TYPES[0], MEDIA_TYPES[2]];

/// A serialization the API writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// `application/json`.
    Json,
    /// `application/yaml` (the apiserver serves it: its JSON, converted to YAML).
    Yaml,
    /// `application/vnd.kubernetes.protobuf`.
    Protobuf,
}

impl Encoding {
    /// In the apiserver's order of preference.
    pub(crate) const ALL: [Self; 3] = [Self::Json, Self::Yaml, Self::Protobuf];

    /// The `Content-Type` the apiserver writes for it.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Json => MEDIA_TYPES[0],
            Self::Yaml => MEDIA_TYPES[1],
            Self::Protobuf => MEDIA_TYPES[2],
        }
    }

    /// The media subtype (`json`, `yaml`, `vnd.kubernetes.protobuf`).
    pub(crate) fn subtype(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Yaml => "yaml",
            Self::Protobuf => "vnd.kubernetes.protobuf",
        }
    }
}

/// What object the response holds (the `as=…;g=…;v=…` media type parameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// The metrics object or list itself.
    Object,
    /// A `meta.k8s.io` Table (never protobuf).
    Table(TableVersion),
    /// `PartialObjectMetadata` of that `meta.k8s.io` version (only valid for a get or a
    /// watch).
    PartialObjectMetadata(TableVersion),
    /// `PartialObjectMetadataList` of that `meta.k8s.io` version (only valid for a list).
    PartialObjectMetadataList(TableVersion),
}

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

/// One media range of an `Accept` header.
#[derive(Clone, Debug, PartialEq)]
pub struct MediaRange {
    kind: String,
    subtype: String,
    q: f32,
    params: Vec<(String, String)>,
}

impl MediaRange {
    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn is_any(&self) -> bool {
        self.kind == "*" && self.subtype == "*"
    }

    /// `application/<subtype>`, `application/*` or `*/*`.
    fn matches(&self, subtype: &str) -> bool {
        (self.kind == "application" && (self.subtype == subtype || self.subtype == "*"))
            || self.is_any()
    }

    fn specificity(&self) -> u8 {
        u8::from(self.kind != "*") + u8::from(self.subtype != "*")
    }
}

/// Parses `Accept` by the rules of this module: the acceptable ranges, best first.
pub fn parse(header: &str) -> Vec<MediaRange> {
    parse_with_refusals(header).0
}

/// The acceptable ranges, best first, and the refused ones (`q=0`).
fn parse_with_refusals(header: &str) -> (Vec<MediaRange>, Vec<MediaRange>) {
    let (mut ranges, mut refused) = (Vec::new(), Vec::new());
    for part in split_unquoted(header, ',') {
        let mut pieces = split_unquoted(part, ';').into_iter();
        let Some(media_type) = pieces.next().map(str::trim) else {
            continue;
        };
        let (kind, subtype) = match media_type.split_once('/') {
            Some((kind, subtype)) => (kind.trim(), subtype.trim()),
            None if media_type == "*" => ("*", "*"),
            None => continue,
        };
        if !is_token(kind) || !is_token(subtype) || (kind == "*" && subtype != "*") {
            continue;
        }
        let mut range = MediaRange {
            kind: kind.to_ascii_lowercase(),
            subtype: subtype.to_ascii_lowercase(),
            q: 1.0,
            params: Vec::new(),
        };
        let mut valid = true;
        for piece in pieces {
            let piece = piece.trim();
            // A parameter without a value cannot ask for anything: ignore it.
            let Some((name, value)) = piece.split_once('=') else {
                continue;
            };
            let name = name.trim().to_ascii_lowercase();
            let Some(value) = unquote(value.trim()) else {
                valid = false;
                break;
            };
            if name == "q" {
                match parse_weight(&value) {
                    Some(q) => range.q = q,
                    None => {
                        valid = false;
                        break;
                    }
                }
            } else if let Some(slot) = range.params.iter_mut().find(|(k, _)| *k == name) {
                slot.1 = value;
            } else {
                range.params.push((name, value));
            }
        }
        if valid && range.q > 0.0 {
            ranges.push(range);
        } else if valid {
            refused.push(range);
        }
    }
    // A stable sort keeps the client's order among equals, as clients intend.
    ranges.sort_by(|a, b| {
        b.q.total_cmp(&a.q)
            .then_with(|| b.specificity().cmp(&a.specificity()))
    });
    (ranges, refused)
}

/// RFC 9110's precedence: a more specific range overrides a less specific one, so
/// `application/json;q=0` refuses JSON even where `*/*` or `application/*` would take it.
/// Only a refusal without parameters overrides (`application/json;as=Table;q=0` refuses
/// the Table, not JSON).
fn overridden(range: &MediaRange, subtype: &str, refused: &[MediaRange]) -> bool {
    refused
        .iter()
        .any(|r| r.params.is_empty() && r.specificity() > range.specificity() && r.matches(subtype))
}

/// RFC 9110's `qvalue`: `0`, `1` or `0.ddd`, `1.000` (at most three decimals).
fn parse_weight(value: &str) -> Option<f32> {
    let (int, frac) = value.split_once('.').unwrap_or((value, ""));
    let ok = matches!(int, "0" | "1")
        && frac.len() <= 3
        && frac.bytes().all(|b| b.is_ascii_digit())
        && (int == "0" || frac.bytes().all(|b| b == b'0'));
    if !ok {
        return None;
    }
    value.parse().ok()
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Splits at `sep` outside double-quoted strings.
fn split_unquoted(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        } else if c == sep && !quoted {
            parts.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    parts.push(&s[start..]);
    parts
}

/// A token as is, or a quoted string without quotes and escapes; `None` if malformed.
fn unquote(value: &str) -> Option<String> {
    let Some(inner) = value.strip_prefix('"') else {
        return is_token(value).then(|| value.to_string());
    };
    let inner = inner.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '"' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

/// What a path can answer with (the apiserver's `EndpointRestrictions` and serializers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// NodeMetrics and PodMetrics (get, list, watch): JSON, YAML, protobuf; the `meta.k8s.io`
    /// conversions; `sv=v1`.
    Resource,
    /// An error body (`DefaultEndpointRestrictions`): JSON, YAML, protobuf; no conversion.
    Error,
    /// A discovery document (the group, a version's resources): JSON, no conversion.
    Discovery,
    /// `/apis`: aggregated discovery when some acceptable range asks for it, else as
    /// [`Endpoint::Discovery`].
    Apis,
}

/// The negotiated representation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The serialization.
    pub encoding: Encoding,
    /// The object to write ([`Target::Object`] for documents).
    pub target: Target,
    /// `Some` for aggregated discovery in that version (only from [`Endpoint::Apis`]).
    pub aggregated: Option<Version>,
    /// The chosen range carried `pretty=1`.
    pub pretty: bool,
}

impl Choice {
    const JSON: Choice = Choice {
        encoding: Encoding::Json,
        target: Target::Object,
        aggregated: None,
        pretty: false,
    };
}

/// Which parameters and encodings a pass of [`choose`] allows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Allows {
    Resource,
    Plain { all_encodings: bool },
    Aggregated,
}

/// Negotiates `accept` for `endpoint`; `None` means 406.
pub fn choose(accept: Option<&str>, endpoint: Endpoint) -> Option<Choice> {
    let header = accept.unwrap_or("").trim_matches([' ', '\t']);
    if header.is_empty() {
        return Some(Choice::JSON);
    }
    let (ranges, refused) = parse_with_refusals(header);
    let first = |allows: Allows| {
        ranges.iter().find_map(|range| {
            Encoding::ALL
                .into_iter()
                .filter(|e| *e == Encoding::Json || allows_all_encodings(allows))
                .filter(|e| range.matches(e.subtype()) && !overridden(range, e.subtype(), &refused))
                .find_map(|e| accepts(range, e, allows))
        })
    };
    match endpoint {
        Endpoint::Resource => first(Allows::Resource),
        Endpoint::Error => first(Allows::Plain {
            all_encodings: true,
        }),
        Endpoint::Discovery => first(Allows::Plain {
            all_encodings: false,
        }),
        Endpoint::Apis => first(Allows::Aggregated).or_else(|| {
            first(Allows::Plain {
                all_encodings: false,
            })
        }),
    }
}

fn allows_all_encodings(allows: Allows) -> bool {
    matches!(
        allows,
        Allows::Resource
            | Allows::Plain {
                all_encodings: true
            }
    )
}

/// Whether `range`, in `encoding`, asks for something the pass allows.
fn accepts(range: &MediaRange, encoding: Encoding, allows: Allows) -> Option<Choice> {
    if let Some(stream) = range.param("stream").filter(|s| !s.is_empty()) {
        // The only stream schema is "watch"; YAML has no stream serializer.
        if stream != "watch" || encoding == Encoding::Yaml {
            return None;
        }
    }
    if let Some(sv) = range.param("sv").filter(|s| !s.is_empty()) {
        // The server version is meta.k8s.io/v1's, for the metrics resources only.
        if allows != Allows::Resource || sv != "v1" {
            return None;
        }
    }
    let pretty = range.param("pretty") == Some("1");
    let (kind, group, version) = (range.param("as"), range.param("g"), range.param("v"));
    let converts = kind.is_some() || group.is_some() || version.is_some();
    let mut choice = Choice {
        encoding,
        pretty,
        ..Choice::JSON
    };
    match allows {
        Allows::Plain { .. } => (!converts).then_some(choice),
        Allows::Aggregated => {
            if group != Some("apidiscovery.k8s.io") || kind != Some("APIGroupDiscoveryList") {
                return None;
            }
            choice.aggregated = Some(match version {
                Some("v2") => Version::V2,
                Some("v2beta1") => Version::V2Beta1,
                _ => return None,
            });
            Some(choice)
        }
        Allows::Resource if !converts => Some(choice),
        Allows::Resource => {
            if group != Some("meta.k8s.io") {
                return None;
            }
            let meta = match version {
                Some("v1") => TableVersion::V1,
                Some("v1beta1") => TableVersion::V1beta1,
                _ => return None,
            };
            choice.target = match kind {
                Some("Table") if encoding != Encoding::Protobuf => Target::Table(meta),
                Some("PartialObjectMetadata") => Target::PartialObjectMetadata(meta),
                Some("PartialObjectMetadataList") => Target::PartialObjectMetadataList(meta),
                _ => return None,
            };
            Some(choice)
        }
    }
}

/// go-restful's route check before the handler's negotiation: some acceptable range is
/// `*/*` or exactly one of [`MEDIA_TYPES`] (`application/*` is not enough there).
pub fn route_accepts(accept: Option<&str>) -> bool {
    let header = accept.unwrap_or("").trim_matches([' ', '\t']);
    header.is_empty()
        || parse(header).iter().any(|r| {
            r.is_any()
                || MEDIA_TYPES
                    .iter()
                    .any(|m| m.split_once('/') == Some((r.kind.as_str(), r.subtype.as_str())))
        })
}

/// Negotiates `GET /apis`. An empty header means JSON.
pub fn apis(accept: &str) -> Result<ApisChoice, NotAcceptable> {
    choose(Some(accept), Endpoint::Apis)
        .map(|c| ApisChoice {
            aggregated: c.aggregated,
            pretty: c.pretty,
        })
        .ok_or(NotAcceptable)
}

/// Negotiates `/apis/metrics.k8s.io` and `/apis/metrics.k8s.io/<version>`.
pub fn discovery(accept: &str) -> Result<JsonChoice, NotAcceptable> {
    choose(Some(accept), Endpoint::Discovery)
        .map(|c| JsonChoice { pretty: c.pretty })
        .ok_or(NotAcceptable)
}

/// The aggregated discovery version `GET /apis` with this `Accept` gets, or `None` for the
/// plain `APIGroupList` (or a 406).
pub fn wants_aggregated_discovery(accept: &str) -> Option<Version> {
    apis(accept).ok().and_then(|c| c.aggregated)
}

/// Whether `/openapi/v2` or `/openapi/v3...` may answer this `Accept` with JSON (empty
/// means `*/*`): some acceptable range is `application/json`, `application/*` or `*/*`.
/// Otherwise 406 with an empty body (kube-openapi would also serve protobuf; we do not).
pub fn openapi_accepts_json(accept: &str) -> bool {
    if accept.trim().is_empty() {
        return true;
    }
    let (ranges, refused) = parse_with_refusals(accept);
    ranges
        .iter()
        .any(|r| r.matches("json") && !overridden(r, "json", &refused))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    // client-go discovery constants (discovery/discovery_client.go).
    const ACCEPT_V1: &str = "application/json";
    const ACCEPT_V2BETA1: &str =
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
    pub(crate) const ACCEPT_V2: &str =
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
    const ACCEPT_V2_NOPEER: &str =
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer";

    fn ranges(header: &str) -> Vec<String> {
        parse(header)
            .iter()
            .map(|r| format!("{}/{};q={}", r.kind, r.subtype, r.q))
            .collect()
    }

    #[test]
    fn weights_wildcards_and_order() {
        assert_eq!(
            ranges("text/*;q=0.5, application/json;q=0.5, */*;q=0.5, application/*;q=0.5"),
            [
                "application/json;q=0.5",
                "text/*;q=0.5",
                "application/*;q=0.5",
                "*/*;q=0.5"
            ]
        );
        // q=0 drops a range; so does a weight outside RFC 9110's grammar.
        assert_eq!(
            ranges("a/b;q=0, c/d;q=0.000, e/f;q=1.0, g/h;q=1.5, i/j;q=0.1234, k/l;q=.5, m/n;q=0x1p-1, o/p;q=0.001"),
            ["e/f;q=1", "o/p;q=0.001"]
        );
        // A lone * is */*; half a wildcard is not a range.
        assert_eq!(ranges("*, */json, json"), ["*/*;q=1"]);
    }

    #[test]
    fn one_rule_for_q_zero_on_every_path() {
        let q0 = Some("application/json;q=0");
        for endpoint in [
            Endpoint::Resource,
            Endpoint::Error,
            Endpoint::Discovery,
            Endpoint::Apis,
        ] {
            assert_eq!(choose(q0, endpoint), None, "{endpoint:?}");
            // The refusal overrides the wildcard: the next encoding the path has, or 406.
            let json_refused = Some("application/json;q=0, */*;q=0.1");
            let next = matches!(endpoint, Endpoint::Resource | Endpoint::Error).then_some(Choice {
                encoding: Encoding::Yaml,
                ..Choice::JSON
            });
            assert_eq!(choose(json_refused, endpoint), next, "{endpoint:?}");
            let everything_refused = Some("application/*;q=0, */*");
            assert_eq!(choose(everything_refused, endpoint), None, "{endpoint:?}");
            // A refusal is not a preference: a wildcard covers what it does not name, and
            // a refusal with parameters refuses only that conversion.
            for other in [
                "application/yaml;q=0, */*",
                "application/json;as=Table;g=meta.k8s.io;v=v1;q=0, */*",
                "*/*;q=0, application/json",
            ] {
                assert_eq!(choose(Some(other), endpoint), Some(Choice::JSON), "{other}");
            }
        }
        assert!(!route_accepts(q0));
        assert!(!openapi_accepts_json("application/json;q=0"));
        assert!(!openapi_accepts_json("application/json;q=0, */*"));
        assert!(openapi_accepts_json("text/html;q=0, */*"));
    }

    #[test]
    fn resources_encodings_and_conversions() {
        let table = |encoding, v| Choice {
            encoding,
            target: Target::Table(v),
            ..Choice::JSON
        };
        let cases: [(&str, Option<Choice>); 12] = [
            ("*/*", Some(Choice::JSON)),
            ("application/*", Some(Choice::JSON)),
            (
                "application/yaml",
                Some(Choice {
                    encoding: Encoding::Yaml,
                    ..Choice::JSON
                }),
            ),
            (
                "application/vnd.kubernetes.protobuf;q=0.9, application/json;q=0.8",
                Some(Choice {
                    encoding: Encoding::Protobuf,
                    ..Choice::JSON
                }),
            ),
            (
                "application/json;as=Table;v=v1;g=meta.k8s.io, application/json",
                Some(table(Encoding::Json, TableVersion::V1)),
            ),
            (
                "application/yaml;as=Table;v=v1beta1;g=meta.k8s.io",
                Some(table(Encoding::Yaml, TableVersion::V1beta1)),
            ),
            // No Table in protobuf: the next range decides.
            (
                "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io, application/json",
                Some(Choice::JSON),
            ),
            (
                "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io",
                Some(Choice {
                    target: Target::PartialObjectMetadataList(TableVersion::V1),
                    ..Choice::JSON
                }),
            ),
            ("application/json;as=Table;v=v2;g=meta.k8s.io", None),
            (
                "application/json;as=APIGroupDiscoveryList;v=v2;g=apidiscovery.k8s.io",
                None,
            ),
            ("application/yaml;stream=watch", None),
            (
                "application/json;sv=v1;stream=watch;pretty=1",
                Some(Choice {
                    pretty: true,
                    ..Choice::JSON
                }),
            ),
        ];
        for (accept, want) in cases {
            assert_eq!(choose(Some(accept), Endpoint::Resource), want, "{accept}");
        }
        // Error bodies: the same encodings, no conversion, no server version.
        assert_eq!(
            choose(
                Some("application/json;as=Table;v=v1;g=meta.k8s.io, application/vnd.kubernetes.protobuf"),
                Endpoint::Error
            ),
            Some(Choice {
                encoding: Encoding::Protobuf,
                ..Choice::JSON
            })
        );
        assert_eq!(
            choose(Some("application/json;sv=v1"), Endpoint::Error),
            None
        );
    }

    #[test]
    fn route_check_wants_an_exact_type_or_any() {
        for yes in [
            "",
            "*/*",
            "*",
            "text/html, Application/JSON",
            "application/vnd.kubernetes.protobuf;q=0.5",
        ] {
            assert!(route_accepts(Some(yes)), "{yes}");
        }
        assert!(route_accepts(None));
        for no in ["application/*", "text/html", "application/json;q=0"] {
            assert!(!route_accepts(Some(no)), "{no}");
        }
    }

    /// The `Accept` headers of the real discovery clients (client-go's and kube-aggregator's
    /// constants), with the aggregated discovery version each must get (`None`: the plain
    /// `APIGroupList`). Also used by discovery's tests of the documents served.
    pub(crate) fn discovery_client_accepts() -> Vec<(&'static str, String, Option<Version>)> {
        let v2_v2beta1_v1 = format!("{ACCEPT_V2},{ACCEPT_V2BETA1},{ACCEPT_V1}");
        vec![
            // client-go 0.27–0.29: acceptDiscoveryFormats = AcceptV2Beta1 + "," + AcceptV1.
            (
                "kubectl 1.27–1.29",
                format!("{ACCEPT_V2BETA1},{ACCEPT_V1}"),
                Some(Version::V2Beta1),
            ),
            // client-go 0.30+: AcceptV2 + "," + AcceptV2Beta1 + "," + AcceptV1.
            ("kubectl 1.30+", v2_v2beta1_v1.clone(), Some(Version::V2)),
            // client-go 0.35+ with NoPeerDiscovery.
            (
                "client-go nopeer",
                format!("{ACCEPT_V2_NOPEER},{v2_v2beta1_v1}"),
                Some(Version::V2),
            ),
            // UseLegacyDiscovery, and kube-aggregator's per-version fallback.
            ("legacy", ACCEPT_V1.to_string(), None),
            // kube-aggregator 1.26–1.29 (handler_discovery.go).
            (
                "aggregator 1.26–1.29",
                ACCEPT_V2BETA1.to_string(),
                Some(Version::V2Beta1),
            ),
            // kube-aggregator 1.30+: AcceptV2 + "," + AcceptV2Beta1, no plain fallback.
            (
                "aggregator 1.30+",
                format!("{ACCEPT_V2},{ACCEPT_V2BETA1}"),
                Some(Version::V2),
            ),
        ]
    }

    #[test]
    fn kubectl_and_aggregator_accept_headers() {
        let cases = discovery_client_accepts();
        for (who, accept, want) in cases {
            assert_eq!(wants_aggregated_discovery(&accept), want, "{who}: {accept}");
        }
    }

    #[test]
    fn apis_negotiation() {
        let agg = |v: &str, extra: &str| {
            format!("application/json;g=apidiscovery.k8s.io;v={v};as=APIGroupDiscoveryList{extra}")
        };
        let ok = |a: Option<Version>, pretty: bool| {
            Ok(ApisChoice {
                aggregated: a,
                pretty,
            })
        };
        let cases: Vec<(String, Result<ApisChoice, NotAcceptable>)> = vec![
            (String::new(), ok(None, false)),
            ("*/*".into(), ok(None, false)),
            ("application/*".into(), ok(None, false)),
            ("text/html, application/xhtml+xml, */*;q=0.8".into(), ok(None, false)),
            // q orders aggregated ranges among themselves.
            (format!("{};q=0.5, {}", agg("v2beta1", ""), agg("v2", ";q=0.9")), ok(Some(Version::V2), false)),
            (format!("{}, {};q=0.9", agg("v2beta1", ""), agg("v2", "")), ok(Some(Version::V2Beta1), false)),
            // Any acceptable aggregated range wins over plain ones, as in the apiserver.
            (format!("application/json, {}", agg("v2", "")), ok(Some(Version::V2), false)),
            (format!("application/json;q=1, {}", agg("v2", ";q=0.1")), ok(Some(Version::V2), false)),
            // q=0 means "not acceptable".
            (format!("{}, application/json", agg("v2", ";q=0")), ok(None, false)),
            (agg("v2", ";q=0"), Err(NotAcceptable)),
            // An unparsable q drops the range.
            (format!("{}, application/json", agg("v2", ";q=high")), ok(None, false)),
            // Wildcards and parameters.
            ("application/*;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList".into(), ok(Some(Version::V2), false)),
            ("*/*;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList".into(), ok(Some(Version::V2), false)),
            (agg("v2", ";pretty=1"), ok(Some(Version::V2), true)),
            ("application/json;pretty=1".into(), ok(None, true)),
            ("application/json;charset=utf-8".into(), ok(None, false)),
            (agg("v2", ";profile=nopeer;charset=utf-8"), ok(Some(Version::V2), false)),
            // RFC 9110: case-insensitive names, optional whitespace, quoted values.
            ("Application/JSON;G=apidiscovery.k8s.io;V=v2;AS=APIGroupDiscoveryList".into(), ok(Some(Version::V2), false)),
            ("application/json ; g=apidiscovery.k8s.io ; v=v2 ; as=APIGroupDiscoveryList".into(), ok(Some(Version::V2), false)),
            (r#"application/json;g="apidiscovery.k8s.io";v="v2";as="APIGroupDiscoveryList""#.into(), ok(Some(Version::V2), false)),
            (r#"application/json;x="a,b;c", application/yaml"#.into(), ok(None, false)),
            // Values stay case-sensitive, as in the apiserver.
            ("application/json;g=apidiscovery.k8s.io;v=V2;as=APIGroupDiscoveryList".into(), Err(NotAcceptable)),
            // Conversions other than aggregated discovery are refused here.
            ("application/json;as=Table;v=v1;g=meta.k8s.io".into(), Err(NotAcceptable)),
            ("application/json;as=Table;v=v1;g=meta.k8s.io, application/json".into(), ok(None, false)),
            (agg("v3", ""), Err(NotAcceptable)),
            ("application/json;g=apidiscovery.k8s.io;v=v2".into(), Err(NotAcceptable)),
            // Streams: only watch; server versions: none.
            ("application/json;stream=watch".into(), ok(None, false)),
            ("application/json;stream=other".into(), Err(NotAcceptable)),
            ("application/json;sv=v1".into(), Err(NotAcceptable)),
            // Not produced here: YAML, protobuf (the apiserver would serve these).
            ("application/yaml".into(), Err(NotAcceptable)),
            ("application/vnd.kubernetes.protobuf".into(), Err(NotAcceptable)),
            (
                "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList, application/json".into(),
                ok(None, false),
            ),
            (
                format!("application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,{}", agg("v2beta1", "")),
                ok(Some(Version::V2Beta1), false),
            ),
            // Malformed ranges are skipped.
            ("json, application, */json".into(), Err(NotAcceptable)),
            (",,application/json,".into(), ok(None, false)),
            ("application/json;novalue".into(), ok(None, false)),
            ("application/json;as=Table x".into(), Err(NotAcceptable)),
        ];
        for (accept, want) in cases {
            assert_eq!(apis(&accept), want, "Accept: {accept}");
        }
    }

    #[test]
    fn plain_discovery_negotiation() {
        assert_eq!(discovery(""), Ok(JsonChoice { pretty: false }));
        assert_eq!(
            discovery("application/json, */*"),
            Ok(JsonChoice { pretty: false })
        );
        assert_eq!(
            discovery("application/vnd.kubernetes.protobuf, application/json;pretty=1"),
            Ok(JsonChoice { pretty: true })
        );
        assert_eq!(discovery(ACCEPT_V2), Err(NotAcceptable));
        assert_eq!(
            discovery(&format!("{ACCEPT_V2},{ACCEPT_V1}")),
            Ok(JsonChoice { pretty: false })
        );
    }

    #[test]
    fn openapi_accept() {
        for yes in [
            "",
            "application/json",
            "*/*",
            "application/*",
            "application/com.github.proto-openapi.spec.v2@v1.0+protobuf, application/json;q=0.5",
        ] {
            assert!(openapi_accepts_json(yes), "{yes}");
        }
        for no in [
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
            "text/html",
            "application/json;q=0",
            "*/json",
        ] {
            assert!(!openapi_accepts_json(no), "{no}");
        }
    }
}
