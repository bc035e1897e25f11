//! Kubernetes JSON as the apiserver writes it with Go's `encoding/json`: apimachinery
//! metadata (`ObjectMeta`, `ListMeta`, `Time`) in Go's field order with its `omitempty`
//! rules, bodies compact with a trailing newline ([`encode_json`]) or indented
//! ([`encode_json_pretty`]), strings escaped as Go escapes them.
//!
//! Below both the API ([`crate::api`]) and authentication ([`crate::auth`]), which write
//! `Status` bodies ([`crate::status`]) with it.

use std::collections::BTreeMap;
use std::io;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use k8s_openapi::jiff;
use serde::ser::{SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};

use crate::quantity;

/// `metav1.Time`: RFC 3339 whole seconds, or `null` for Go's zero time.
pub(crate) struct GoTime(pub(crate) SystemTime);

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
pub(crate) fn jiff_parts(timestamp: jiff::Timestamp) -> (i64, i32) {
    let (seconds, nanos) = (timestamp.as_second(), timestamp.subsec_nanosecond());
    if nanos < 0 {
        (seconds.saturating_sub(1), nanos + 1_000_000_000)
    } else {
        (seconds, nanos)
    }
}

pub(crate) fn is_go_zero_meta_time(time: &meta::Time) -> bool {
    jiff_parts(time.0) == (quantity::GO_ZERO_TIME_UNIX_SECONDS, 0)
}

/// `metav1.Time` from a `k8s_openapi` `Time`.
pub(crate) struct GoMetaTime<'a>(&'a meta::Time);

impl Serialize for GoMetaTime<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if is_go_zero_meta_time(self.0) {
            serializer.serialize_none()
        } else {
            serializer.serialize_str(&quantity::rfc3339_unix(jiff_parts(self.0 .0).0))
        }
    }
}

pub(crate) fn non_empty(value: &Option<String>) -> Option<&String> {
    value.as_ref().filter(|value| !value.is_empty())
}

pub(crate) fn non_empty_map(
    value: &Option<BTreeMap<String, String>>,
) -> Option<&BTreeMap<String, String>> {
    value.as_ref().filter(|value| !value.is_empty())
}

pub(crate) fn non_empty_vec<T>(value: &Option<Vec<T>>) -> Option<&Vec<T>> {
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
pub(crate) struct Adapted<'a, T>(pub(crate) &'a T);

/// A sequence whose elements are serialized through [`Adapted`].
pub(crate) struct GoSeq<'a, T>(pub(crate) &'a [T]);

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
