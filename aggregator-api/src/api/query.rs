//! The "decode query" step of the request path (route → negotiate → decode query → read →
//! encode): the raw query as Go's `url.ParseQuery` reads it (`Query`), then, for a list,
//! metav1 `ListOptions` decoded from it the way `ParameterCodec.DecodeParameters` does
//! (integer errors, then the label selector, then the field selector: 400) and validated as
//! `ValidateListOptions` does (422 `ListOptions.meta.k8s.io "" is invalid: …`).
//!
//! [`parse`](super::request::parse) calls these in the apiserver's order; the selectors
//! themselves are [`selector`](super::selector)'s.

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;

use crate::api::selector::{aggregate, FieldSelector, LabelSelector};
use crate::go;
use crate::json::encode_json;
use crate::status::Status;

/// `url.ParseQuery`: pairs split on `&`, pairs holding `;` or a bad escape dropped, `+` is a
/// space; values kept in order per key.
#[derive(Clone, Debug, Default)]
pub(crate) struct Query {
    pairs: Vec<(String, String)>,
    /// Each pair's value as decoded bytes (Go keeps them; an error quoting the value shows
    /// an invalid byte as `\xff`, not as U+FFFD).
    raw_values: Vec<Vec<u8>>,
}

impl Query {
    pub(crate) fn parse(raw: &str) -> Self {
        let mut pairs = Vec::new();
        let mut raw_values = Vec::new();
        for chunk in raw.split('&') {
            if chunk.is_empty() || chunk.contains(';') {
                continue;
            }
            let (key, value) = chunk.split_once('=').unwrap_or((chunk, ""));
            let (Ok(key), Ok(value)) = (
                go::unescape(key, go::Part::Query),
                go::unescape(value, go::Part::Query),
            ) else {
                continue;
            };
            pairs.push((go::lossy(&key), go::lossy(&value)));
            raw_values.push(value);
        }
        Self { pairs, raw_values }
    }

    fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// `url.Values.Get`: the first value.
    pub(crate) fn first(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// [`Query::first`] as the decoded bytes.
    pub(crate) fn first_bytes(&self, key: &str) -> Option<&[u8]> {
        let at = self.pairs.iter().position(|(k, _)| k == key)?;
        self.raw_values.get(at).map(Vec::as_slice)
    }
}

/// The query parameters of a list (metav1 `ListOptions`, as decoded for the internal
/// version). A get only reads `resourceVersion`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListOptions {
    /// `labelSelector`, parsed; empty matches everything.
    pub label_selector: LabelSelector,
    /// `fieldSelector`, parsed, its fields checked; empty matches everything.
    pub field_selector: FieldSelector,
    /// `watch` (any value but `0` and `false`, case-insensitively, is true).
    pub watch: bool,
    /// `allowWatchBookmarks`.
    pub allow_watch_bookmarks: bool,
    /// `resourceVersion` (ignored by metrics-server).
    pub resource_version: String,
    /// `resourceVersionMatch`.
    pub resource_version_match: String,
    /// `timeoutSeconds`.
    pub timeout_seconds: Option<i64>,
    /// `limit` (ignored by metrics-server: lists are never chunked).
    pub limit: i64,
    /// `continue` (ignored by metrics-server).
    pub continue_token: String,
    /// `sendInitialEvents`.
    pub send_initial_events: Option<bool>,
    /// `includeObject`, raw: validated by [`ApiRequest::transform`](super::request::ApiRequest::transform), and only for Tables.
    pub include_object: Option<String>,
}

/// `ParameterCodec.DecodeParameters` into the internal `ListOptions`: url values to
/// `v1.ListOptions` (integers may fail), then the selectors parsed (labels, then fields).
pub(super) fn decode_list_options(query: &Query) -> Result<ListOptions, String> {
    let mut options = ListOptions::default();
    if query.is_empty() {
        return Ok(options);
    }
    let string = |key: &str| query.first(key).unwrap_or("").to_owned();
    let int = |key: &str| -> Result<Option<i64>, String> {
        query
            .first_bytes(key)
            .map(|v| go::parse_int_bytes(v).map_err(|e| e.message_bytes(v)))
            .transpose()
    };
    let label_selector = string("labelSelector");
    let field_selector = string("fieldSelector");
    options.watch = query.first("watch").is_some_and(go::convert_bool);
    options.allow_watch_bookmarks = query
        .first("allowWatchBookmarks")
        .is_some_and(go::convert_bool);
    options.resource_version = string("resourceVersion");
    options.resource_version_match = string("resourceVersionMatch");
    options.timeout_seconds = int("timeoutSeconds")?;
    options.limit = int("limit")?.unwrap_or(0);
    options.continue_token = string("continue");
    options.send_initial_events = query.first("sendInitialEvents").map(go::convert_bool);
    options.label_selector = LabelSelector::parse(&label_selector).map_err(|e| e.message)?;
    options.field_selector = FieldSelector::parse(&field_selector).map_err(|e| e.message)?;
    Ok(options)
}

const EXACT: &str = "Exact";
const NOT_OLDER_THAN: &str = "NotOlderThan";

/// `SetListOptionsDefaults` (WatchList enabled, its default since 1.34) then
/// `ValidateListOptions`.
pub(super) fn validate_list_options(options: &ListOptions) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut send_initial_events = options.send_initial_events;
    let mut rv_match = options.resource_version_match.as_str();
    if options.watch
        && send_initial_events.is_none()
        && rv_match.is_empty()
        && (options.resource_version.is_empty() || options.resource_version == "0")
    {
        send_initial_events = Some(true);
        rv_match = NOT_OLDER_THAN;
    }
    if options.watch {
        if send_initial_events.is_some() && rv_match != NOT_OLDER_THAN {
            errors.push(FieldError::forbidden(
                "resourceVersionMatch",
                format!(
                    "sendInitialEvents requires setting resourceVersionMatch to {NOT_OLDER_THAN}"
                ),
            ));
        }
        if !rv_match.is_empty() {
            if send_initial_events.is_none() {
                errors.push(FieldError::forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            if rv_match != NOT_OLDER_THAN {
                errors.push(FieldError::not_supported(
                    "resourceVersionMatch",
                    rv_match,
                    &[NOT_OLDER_THAN],
                ));
            }
            if !options.continue_token.is_empty() {
                errors.push(FieldError::forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
        }
        return errors;
    }
    if !rv_match.is_empty() {
        if options.resource_version.is_empty() {
            errors.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if !options.continue_token.is_empty() {
            errors.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
        if rv_match != EXACT && rv_match != NOT_OLDER_THAN {
            errors.push(FieldError::not_supported(
                "resourceVersionMatch",
                rv_match,
                &[EXACT, NOT_OLDER_THAN, ""],
            ));
        }
        if rv_match == EXACT && options.resource_version == "0" {
            errors.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
    }
    if send_initial_events.is_some() {
        errors.push(FieldError::forbidden(
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list",
        ));
    }
    errors
}

/// A 422 `ListOptions.meta.k8s.io "" is invalid: …` (`apierrors.NewInvalid`).
pub(super) fn invalid_list_options(errors: &[FieldError]) -> Status {
    let messages: Vec<String> = errors.iter().map(FieldError::to_string).collect();
    let causes = errors
        .iter()
        .map(|e| meta::StatusCause {
            field: Some(e.field.to_owned()),
            message: Some(e.body()),
            reason: Some(e.kind.reason().to_owned()),
        })
        .collect();
    Status(Box::new(meta::Status {
        code: Some(422),
        details: Some(meta::StatusDetails {
            causes: Some(causes),
            group: Some("meta.k8s.io".to_owned()),
            kind: Some("ListOptions".to_owned()),
            ..meta::StatusDetails::default()
        }),
        message: Some(format!(
            "ListOptions.meta.k8s.io \"\" is invalid: {}",
            aggregate(messages)
        )),
        metadata: meta::ListMeta::default(),
        reason: Some("Invalid".to_owned()),
        status: Some("Failure".to_owned()),
    }))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FieldErrorKind {
    Forbidden,
    NotSupported,
}

impl FieldErrorKind {
    fn reason(self) -> &'static str {
        match self {
            Self::Forbidden => "FieldValueForbidden",
            Self::NotSupported => "FieldValueNotSupported",
        }
    }
}

/// A `field.Error` of ListOptions validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct FieldError {
    kind: FieldErrorKind,
    field: &'static str,
    /// Forbidden: the detail. NotSupported: the bad value.
    text: String,
    /// NotSupported: the supported values.
    supported: &'static [&'static str],
}

impl FieldError {
    fn forbidden(field: &'static str, detail: impl Into<String>) -> Self {
        Self {
            kind: FieldErrorKind::Forbidden,
            field,
            text: detail.into(),
            supported: &[],
        }
    }

    fn not_supported(field: &'static str, value: &str, supported: &'static [&'static str]) -> Self {
        Self {
            kind: FieldErrorKind::NotSupported,
            field,
            text: value.to_owned(),
            supported,
        }
    }

    /// `field.Error.ErrorBody()`.
    fn body(&self) -> String {
        match self.kind {
            FieldErrorKind::Forbidden => format!("Forbidden: {}", self.text),
            FieldErrorKind::NotSupported => {
                // The value is a named string type, so Go renders it with json.Marshal.
                let value = encode_json(self.text.as_str())
                    .ok()
                    .and_then(|mut b| {
                        b.pop();
                        String::from_utf8(b).ok()
                    })
                    .unwrap_or_else(|| go::quote(&self.text));
                let supported: Vec<String> = self.supported.iter().map(|s| go::quote(s)).collect();
                format!(
                    "Unsupported value: {value}: supported values: {}",
                    supported.join(", ")
                )
            }
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `url.Values.Get`, which the OpenAPI v3 `hash` parameter is read with.
    #[test]
    fn query_first_values() {
        let first = |raw: &str, key: &str| Query::parse(raw).first(key).map(str::to_string);
        assert_eq!(first("hash=AB%43&hash=x", "hash").as_deref(), Some("ABC"));
        assert_eq!(first("a=1&b", "b").as_deref(), Some(""));
        assert_eq!(first("a=%zz&a=2", "a").as_deref(), Some("2"));
        assert_eq!(first("a=1;b=2", "a"), None);
        assert_eq!(first("", "a"), None);
    }
}
