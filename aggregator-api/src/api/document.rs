//! A served document: the body, exactly, and the headers that belong to it (`Content-Type`,
//! `ETag`, `Vary`, `Cache-Control`), plus what every document is built from ([`Options`],
//! [`VERSIONS`], [`RESOURCES`]).
//!
//! Discovery ([`super::discovery`]) and OpenAPI ([`super::openapi`]) documents are built
//! once per [`Options`] and served as these bytes. ETags are SHA-512 (upper-case hex, as
//! k8s.io/apiserver and kube-openapi write them) from `ring`, the crypto rustls uses here.
//! Clients compare an ETag only with one this server sent, so only its stability matters.

use serde::Serialize;

use super::types::MetricsVersion;

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

/// A served resource of `metrics.k8s.io`.
pub struct Resource {
    /// Plural name, the path segment.
    pub name: &'static str,
    /// Kind of one object.
    pub kind: &'static str,
    /// Kind of the list.
    pub list_kind: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
}

/// The served resources, sorted by name.
pub const RESOURCES: [Resource; 2] = [
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

/// What the documents depend on besides the API itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// `host:port` advertised for `0.0.0.0/0` in `/apis`. metrics-server sends its
    /// `--advertise-address`/`--external-hostname` or, by default, `":" + --secure-port`.
    pub external_address: String,
    /// Advertise the `watch` verb (see [`super::discovery`] for why it is off by default).
    pub advertise_watch: bool,
    /// `/version` is served, so OpenAPI describes it (metrics-server serves it).
    pub version_endpoint: bool,
    /// The resource endpoints also produce protobuf (`api/proto/`), so OpenAPI lists
    /// `application/vnd.kubernetes.protobuf` (and its `;stream=watch` form on lists), after
    /// JSON, in the apiserver's order. Discovery itself is only ever JSON here.
    pub protobuf: bool,
    /// OpenAPI `info.title`; metrics-server: `Kubernetes metrics-server`.
    pub openapi_title: String,
    /// OpenAPI `info.version`; metrics-server: its version up to the first `-`, e.g. `v0.8.0`.
    pub openapi_version: String,
    /// `custom.metrics.k8s.io` is served too (`--custom-metrics`, [`super::custom`]): `/apis`
    /// lists it, and its own discovery documents are built.
    pub custom_metrics: bool,
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
            custom_metrics: false,
        }
    }

    /// The verbs every resource advertises.
    pub fn verbs(&self) -> &'static [&'static str] {
        if self.advertise_watch {
            &["get", "list", "watch"]
        } else {
            &["get", "list"]
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
pub enum EtagRule {
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
    /// `value` as JSON: compact with a trailing newline, as Go's `json.Encoder` writes, or
    /// indented by two spaces without one, as `json.MarshalIndent(v, "", "  ")`.
    pub fn json(value: &impl Serialize, pretty: bool) -> Result<Document, serde_json::Error> {
        let body = if pretty {
            serde_json::to_vec_pretty(value)?
        } else {
            let mut body = serde_json::to_vec(value)?;
            body.push(b'\n');
            body
        };
        Ok(Document::bytes(body))
    }

    /// A JSON body as it is, with no headers but its `Content-Type`.
    pub fn bytes(body: Vec<u8>) -> Document {
        Document {
            content_type: CONTENT_TYPE_JSON,
            body,
            etag: None,
            vary_accept: false,
            cache_control: None,
            etag_rule: EtagRule::None,
        }
    }

    /// With `ETag` `etag` (unquoted), compared by `rule`.
    pub fn with_etag(mut self, etag: &str, rule: EtagRule) -> Document {
        self.etag = Some(format!("\"{etag}\""));
        self.etag_rule = rule;
        self
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

/// Upper-case hex SHA-512 of `data`, as Go's `fmt.Sprintf("%X", sha512.Sum512(data))`.
pub fn sha512_hex(data: &[u8]) -> String {
    use std::fmt::Write;
    let digest = ring::digest::digest(&ring::digest::SHA512, data);
    digest
        .as_ref()
        .iter()
        .fold(String::with_capacity(128), |mut hex, b| {
            let _ = write!(hex, "{b:02X}");
            hex
        })
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
        Document::bytes(NOT_ACCEPTABLE_BODY.as_bytes().to_vec())
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

/// The 406 `Status` of the discovery endpoints; its message is [`NotAcceptable`]'s.
const NOT_ACCEPTABLE_BODY: &str = r#"{
  "kind": "Status",
  "apiVersion": "v1",
  "metadata": {},
  "status": "Failure",
  "message": "only the following media types are accepted: application/json",
  "reason": "NotAcceptable",
  "code": 406
}"#;

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

#[cfg(test)]
mod tests {
    use super::*;

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
        let doc = Document::bytes(b"{}".to_vec()).with_etag("ABC", EtagRule::Weak);
        assert!(doc.not_modified("\"ABC\""));
        assert!(doc.not_modified("W/\"ABC\""));
        assert!(!doc.not_modified(""));
        let exact = Document::bytes(b"{}".to_vec()).with_etag("ABC", EtagRule::Exact);
        assert!(exact.not_modified("\"ABC\""));
        assert!(!exact.not_modified("W/\"ABC\""));
        assert!(!Document::bytes(b"{}".to_vec()).not_modified("*"));
    }

    /// FIPS 180-4 test vectors, written as Go's `%X` writes them.
    #[test]
    fn sha512_as_upper_case_hex() {
        let cases: [(&[u8], &str); 3] = [
            (b"", "CF83E1357EEFB8BDF1542850D66D8007D620E4050B5715DC83F4A921D36CE9CE47D0D13C5D85F2B0FF8318D2877EEC2F63B931BD47417A81A538327AF927DA3E"),
            (b"abc", "DDAF35A193617ABACC417349AE20413112E6FA4E89A97EA20A9EEEE64B55D39A2192992A274FC1A836BA3C23A3FEEBBD454D4423643CE80E2A9AC94FA54CA49F"),
            (b"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu", "8E959B75DAE313DA8CF4F72814FC143F8F7779C6EB9F7FA17299AEADB6889018501D289E4900F7E4331B99DEC4B5433AC7D329EEB6DD26545E96E55B874BE909"),
        ];
        for (data, want) in cases {
            assert_eq!(sha512_hex(data), want);
        }
    }

    /// The 406 body is the apiserver's indented `Status`, and its message is the error's.
    #[test]
    fn not_acceptable_body() {
        let body: serde_json::Value =
            serde_json::from_slice(&NotAcceptable.document().body).expect("JSON");
        assert_eq!(body["message"], NotAcceptable.to_string());
        assert_eq!(body["code"], NotAcceptable::STATUS);
    }
}
