//! The `metrics.k8s.io` types in Kubernetes' protobuf wire format, byte for byte as
//! metrics-server (through `k8s.io/apiserver`) writes them.
//!
//! `kubectl top` asks for `application/vnd.kubernetes.protobuf` first. The body Go sends is
//! the 4-byte magic `k8s\0` followed by a serialized `runtime.Unknown` whose `raw` field holds
//! the object ([`envelope`], [`encode_object`]; apimachinery
//! `pkg/runtime/serializer/protobuf/protobuf.go`, `pkg/runtime/types_proto.go`).
//!
//! The messages are written by hand from the `generated.proto` files (k8s.io/metrics
//! `pkg/apis/metrics/v1beta1`, apimachinery `pkg/apis/meta/v1`, `pkg/api/resource`,
//! `pkg/runtime`). The tags come from there; *which fields are written* comes from the
//! gogo-generated marshallers (`generated.pb.go`), which differ from plain proto2:
//!
//! - A Go value field (`string`, `int64`, a struct) is written on every encode, even when empty
//!   or zero. Those fields are prost `required` here: a plain Rust value, always encoded.
//! - A Go pointer field (`*int64`, `*Time`, `*bool`) is written only when set: prost
//!   `optional`, an `Option`.
//! - Maps are written in ascending key order with *both* the key and the value in every entry,
//!   even an empty label value. prost's own map encoder drops default keys and values, so the
//!   map-carrying messages ([`ObjectMeta`], [`NodeMetrics`], [`ContainerMetrics`]) implement
//!   [`prost::Message`] by hand over a [`BTreeMap`] (its order is Go's `sort.Strings` order:
//!   bytewise).
//! - [`Time`] carries whole seconds only: Go writes `seconds` and `nanos = 0` for a set time
//!   and nothing at all for the zero time, and drops `nanos` when reading
//!   (apimachinery `pkg/apis/meta/v1/time_proto.go`).
//!
//! Not here: conversion from the store's samples (that is `api/types.rs`), `Table` (which has
//! no protobuf form), and HTTP content negotiation.
//!
//! # Files
//!
//! This file holds the framing (the `runtime.Unknown` envelope, watch events) and the map
//! encoding the messages share; the messages are in two private files, re-exported here:
//!
//! - `metav1.rs`: apimachinery's messages ([`Quantity`], [`Time`], [`Duration`],
//!   [`ObjectMeta`], [`ListMeta`], [`Status`] and the messages they hold), and
//!   [`status_message`].
//! - `metrics.rs`: the `metrics.k8s.io` messages ([`NodeMetrics`], [`PodMetrics`], their lists,
//!   [`ContainerMetrics`]), and [`node_message`] and the other conversions from the API's
//!   objects.

use std::collections::BTreeMap;

use bytes::{Buf, BufMut};
use prost::{
    encoding::{
        btree_map, check_wire_type, encode_key, encode_varint, encoded_len_varint, key_len,
        message, string, DecodeContext, WireType,
    },
    DecodeError, Message,
};

mod metav1;
mod metrics;

pub use metav1::{
    status_message, Duration, FieldsV1, ListMeta, ManagedFieldsEntry, ObjectMeta, OwnerReference,
    Quantity, ShardInfo, Status, StatusCause, StatusDetails, Time,
};
pub use metrics::{
    node_list_message, node_message, pod_list_message, pod_message, ContainerMetrics, NodeMetrics,
    NodeMetricsList, PodMetrics, PodMetricsList,
};

/// The magic number that starts every Kubernetes protobuf body (`k8s` and a NUL byte).
pub const MAGIC: [u8; 4] = *b"k8s\0";

/// The media type of a Kubernetes protobuf body, as sent in `Content-Type`.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// Errors reading a Kubernetes protobuf body.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The body has no bytes at all.
    #[error("empty protobuf body")]
    Empty,
    /// The body does not begin with [`MAGIC`].
    #[error("body is not a Kubernetes protobuf message: expected prefix 6b 38 73 00 (k8s\\0), found {found:02x?}")]
    BadMagic {
        /// Up to the first four bytes of the body.
        found: Vec<u8>,
    },
    /// The body is only the magic prefix, with no `runtime.Unknown` after it.
    #[error("protobuf body holds the k8s\\0 prefix but no object")]
    NoObject,
    /// The bytes could not be decoded as the expected message.
    #[error("cannot decode {what} from protobuf")]
    Decode {
        /// The message being decoded.
        what: &'static str,
        /// The cause.
        #[source]
        source: DecodeError,
    },
    /// The envelope names another type than the caller expected.
    #[error(
        "expected {expected_api_version} {expected_kind}, the body holds {api_version} {kind}"
    )]
    UnexpectedKind {
        /// The API version the caller asked for.
        expected_api_version: String,
        /// The kind the caller asked for.
        expected_kind: String,
        /// The API version in the envelope.
        api_version: String,
        /// The kind in the envelope.
        kind: String,
    },
    /// A watch event too long for its 4-byte length prefix.
    #[error("a watch event of {len} bytes does not fit a 4-byte length")]
    TooLong {
        /// Its length.
        len: usize,
    },
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

// ---------------------------------------------------------------------------------------------
// runtime: TypeMeta, Unknown and the envelope

/// `runtime.TypeMeta`: the type of the object inside an [`Unknown`].
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct TypeMeta {
    /// API group and version, `group/version` (`metrics.k8s.io/v1beta1`), or `v1` for core
    /// types such as `Status`.
    #[prost(string, required, tag = "1")]
    pub api_version: String,
    /// Kind, e.g. `NodeMetrics`.
    #[prost(string, required, tag = "2")]
    pub kind: String,
}

/// `runtime.Unknown`: the envelope after [`MAGIC`].
///
/// Go's serializer always writes all four fields, `raw` included even when empty, and leaves
/// both content fields empty for protobuf objects.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct Unknown {
    /// The type of `raw`.
    #[prost(message, required, tag = "1")]
    pub type_meta: TypeMeta,
    /// The object, serialized.
    #[prost(bytes = "vec", required, tag = "2")]
    pub raw: Vec<u8>,
    /// Encoding of `raw` (e.g. gzip); empty in everything the apiserver writes.
    #[prost(string, required, tag = "3")]
    pub content_encoding: String,
    /// Media type of `raw`; empty in everything the apiserver writes, meaning protobuf.
    #[prost(string, required, tag = "4")]
    pub content_type: String,
}

/// Wraps an already serialized object: `k8s\0` then `Unknown{typeMeta{api_version, kind},
/// raw: message_bytes, contentEncoding: "", contentType: ""}`, exactly as Go's protobuf
/// serializer writes it.
pub fn envelope(api_version: &str, kind: &str, message_bytes: &[u8]) -> Vec<u8> {
    write_envelope(api_version, kind, message_bytes.len(), |buf| {
        buf.put_slice(message_bytes)
    })
}

/// Serializes `object` straight into an envelope: the same bytes as
/// `envelope(api_version, kind, &object.encode_to_vec())`, without the intermediate copy.
pub fn encode_object<M: Message>(api_version: &str, kind: &str, object: &M) -> Vec<u8> {
    write_envelope(api_version, kind, object.encoded_len(), |buf| {
        object.encode_raw(buf)
    })
}

fn write_envelope(
    api_version: &str,
    kind: &str,
    raw_len: usize,
    write_raw: impl FnOnce(&mut Vec<u8>),
) -> Vec<u8> {
    let type_meta_len = str_field_len(1, api_version) + str_field_len(2, kind);
    // typeMeta, raw, then two empty strings: contentEncoding (0x1a 0x00), contentType (0x22 0x00).
    let unknown_len = key_len(1)
        + encoded_len_varint(type_meta_len as u64)
        + type_meta_len
        + key_len(2)
        + encoded_len_varint(raw_len as u64)
        + raw_len
        + 2 * 2;
    let mut buf = Vec::with_capacity(MAGIC.len() + unknown_len);
    buf.put_slice(&MAGIC);
    encode_key(1, WireType::LengthDelimited, &mut buf);
    encode_varint(type_meta_len as u64, &mut buf);
    encode_str(1, api_version, &mut buf);
    encode_str(2, kind, &mut buf);
    encode_key(2, WireType::LengthDelimited, &mut buf);
    encode_varint(raw_len as u64, &mut buf);
    let before = buf.len();
    write_raw(&mut buf);
    debug_assert_eq!(
        buf.len() - before,
        raw_len,
        "encoded_len disagrees with encode"
    );
    encode_str(3, "", &mut buf);
    encode_str(4, "", &mut buf);
    buf
}

/// Length of a string field (prost's helpers take `&String`; these take `&str`).
fn str_field_len(tag: u32, value: &str) -> usize {
    key_len(tag) + encoded_len_varint(value.len() as u64) + value.len()
}

/// Writes a string field.
fn encode_str(tag: u32, value: &str, buf: &mut impl BufMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(value.len() as u64, buf);
    buf.put_slice(value.as_bytes());
}

/// Reads the whole envelope: checks [`MAGIC`] and decodes the [`Unknown`] after it.
///
/// Like Go's serializer, an empty body, a missing prefix and a prefix with nothing after it
/// are three distinct errors.
pub fn decode_unknown(bytes: &[u8]) -> Result<Unknown> {
    let Some(rest) = bytes.strip_prefix(&MAGIC) else {
        if bytes.is_empty() {
            return Err(Error::Empty);
        }
        return Err(Error::BadMagic {
            found: bytes.iter().take(MAGIC.len()).copied().collect(),
        });
    };
    if rest.is_empty() {
        return Err(Error::NoObject);
    }
    Unknown::decode(rest).map_err(|source| Error::Decode {
        what: "runtime.Unknown",
        source,
    })
}

/// Reads an envelope and returns the object's type and its serialized bytes.
///
/// `contentEncoding` and `contentType` are not checked, as Go's serializer does not check
/// them when it decodes into a typed object; use [`decode_unknown`] to see them.
pub fn decode_envelope(bytes: &[u8]) -> Result<(TypeMeta, Vec<u8>)> {
    let unknown = decode_unknown(bytes)?;
    Ok((unknown.type_meta, unknown.raw))
}

/// Reads an envelope that must hold an `api_version` `kind` object and decodes the object.
pub fn decode_object<M: Message + Default>(
    bytes: &[u8],
    api_version: &str,
    kind: &str,
) -> Result<M> {
    let (type_meta, raw) = decode_envelope(bytes)?;
    if type_meta.api_version != api_version || type_meta.kind != kind {
        return Err(Error::UnexpectedKind {
            expected_api_version: api_version.to_owned(),
            expected_kind: kind.to_owned(),
            api_version: type_meta.api_version,
            kind: type_meta.kind,
        });
    }
    M::decode(raw.as_slice()).map_err(|source| Error::Decode {
        what: short_type_name::<M>(),
        source,
    })
}

/// `NodeMetrics` for `kpulse_aggregator_api::api::proto::metrics::NodeMetrics`.
fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

// ---------------------------------------------------------------------------------------------
// Watch events: the stream's framing

/// `metav1.WatchEvent`: one event of a watch stream, written without an envelope (the
/// stream serializer is the raw one), each behind a 4-byte big-endian length.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct WatchEvent {
    /// `type = 1`: `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK` or `ERROR`.
    #[prost(string, required, tag = "1")]
    pub type_: String,
    /// `object = 2`: the object, enveloped.
    #[prost(message, required, tag = "2")]
    pub object: RawExtension,
}

/// `runtime.RawExtension`: already serialized bytes.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct RawExtension {
    /// `raw = 1`.
    #[prost(bytes = "vec", required, tag = "1")]
    pub raw: Vec<u8>,
}

/// A watch event framed as the protobuf stream writes it: length (4 bytes, big-endian),
/// then the [`WatchEvent`] message.
///
/// # Errors
///
/// When the event is longer than a 4-byte length can say.
pub fn watch_frame(event_type: &str, enveloped_object: Vec<u8>) -> Result<Vec<u8>> {
    let event = WatchEvent {
        type_: event_type.to_owned(),
        object: RawExtension {
            raw: enveloped_object,
        },
    };
    let len = event.encoded_len();
    let prefix = u32::try_from(len).map_err(|_| Error::TooLong { len })?;
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&prefix.to_be_bytes());
    event.encode_raw(&mut out);
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Maps as gogo writes them

/// A map value written as field 2 of its entry, always, even when empty.
trait EntryValue {
    fn entry_field_len(&self) -> usize;
    fn encode_entry_field(&self, buf: &mut impl BufMut);
}

impl EntryValue for String {
    fn entry_field_len(&self) -> usize {
        string::encoded_len(2, self)
    }
    fn encode_entry_field(&self, buf: &mut impl BufMut) {
        string::encode(2, self, buf);
    }
}

impl EntryValue for Quantity {
    fn entry_field_len(&self) -> usize {
        message::encoded_len(2, self)
    }
    fn encode_entry_field(&self, buf: &mut impl BufMut) {
        message::encode(2, self, buf);
    }
}

fn entry_len<V: EntryValue>(key: &String, value: &V) -> usize {
    string::encoded_len(1, key) + value.entry_field_len()
}

/// One length-delimited entry per key, ascending: `{1: key, 2: value}`, both always present.
fn encode_sorted_map<V: EntryValue>(tag: u32, map: &BTreeMap<String, V>, buf: &mut impl BufMut) {
    for (key, value) in map {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(entry_len(key, value) as u64, buf);
        string::encode(1, key, buf);
        value.encode_entry_field(buf);
    }
}

fn sorted_map_encoded_len<V: EntryValue>(tag: u32, map: &BTreeMap<String, V>) -> usize {
    map.iter()
        .map(|(key, value)| {
            let len = entry_len(key, value);
            key_len(tag) + encoded_len_varint(len as u64) + len
        })
        .sum()
}

fn merge_string_map(
    wire_type: WireType,
    map: &mut BTreeMap<String, String>,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    check_wire_type(WireType::LengthDelimited, wire_type)?;
    btree_map::merge(string::merge, string::merge, map, buf, ctx)
}

fn merge_quantity_map(
    wire_type: WireType,
    map: &mut BTreeMap<String, Quantity>,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    check_wire_type(WireType::LengthDelimited, wire_type)?;
    btree_map::merge(string::merge, message::merge, map, buf, ctx)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests panic, not Result
mod tests {
    //! Golden vectors below are derived by hand from the protobuf wire rules: a field key is
    //! the varint `tag << 3 | wire_type` (0 = varint, 2 = length-delimited), so tag 1 LEN is
    //! `0a`, 2 LEN `12`, 3 LEN `1a`, 4 LEN `22`, 5 LEN `2a`, 6 LEN `32`, 7 VARINT `38`,
    //! 8 LEN `42`, 11 LEN `5a`, 12 LEN `62`, tag 1 VARINT `08`, 2 VARINT `10`, 5 VARINT `28`,
    //! 6 VARINT `30`. A varint is 7-bit groups, least significant first, bit 7 set on every
    //! group but the last. Which fields appear follows the gogo marshallers cited above.

    use std::time::SystemTime;

    use prost::encoding::skip_field;

    use super::metav1::GO_ZERO_TIME_UNIX;
    use super::*;

    fn cat(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn usage(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Quantity::new(*v)))
            .collect()
    }

    /// Top-level fields of a message: (tag, whole record, payload of a LEN field).
    fn records(bytes: &[u8]) -> Vec<(u32, &[u8], &[u8])> {
        let mut out = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            let start = bytes.len() - rest.len();
            let (tag, wire_type) = prost::encoding::decode_key(&mut rest).unwrap();
            let payload: &[u8] = match wire_type {
                WireType::LengthDelimited => {
                    let len = prost::encoding::decode_varint(&mut rest).unwrap() as usize;
                    let (payload, tail) = rest.split_at(len);
                    rest = tail;
                    payload
                }
                WireType::Varint => {
                    prost::encoding::decode_varint(&mut rest).unwrap();
                    &[]
                }
                other => panic!("unexpected wire type {other:?}"),
            };
            let end = bytes.len() - rest.len();
            out.push((tag, &bytes[start..end], payload));
        }
        out
    }

    fn golden_node() -> NodeMetrics {
        NodeMetrics {
            metadata: ObjectMeta {
                name: "n1".into(),
                // Inserted out of order; "role" has an empty value, as control-plane labels do.
                labels: labels(&[("role", ""), ("os", "linux")]),
                creation_timestamp: Time::from_unix_seconds(1_700_000_000),
                ..Default::default()
            },
            timestamp: Time::from_unix_seconds(1_699_999_990),
            window: Duration::from_std(std::time::Duration::from_secs(10)),
            usage: usage(&[("memory", "1Ki"), ("cpu", "5m")]),
        }
    }

    /// The NodeMetrics golden vector, field by field.
    fn golden_node_bytes() -> Vec<u8> {
        let metadata = cat(&[
            b"\x0a\x02n1", // name = 1: "n1"
            b"\x12\x00",   // generateName = 2: "" (Go value field, written even empty)
            b"\x1a\x00",   // namespace = 3: ""
            b"\x22\x00",   // selfLink = 4: ""
            b"\x2a\x00",   // uid = 5: ""
            b"\x32\x00",   // resourceVersion = 6: ""
            b"\x38\x00",   // generation = 7: varint 0
            // creationTimestamp = 8, 8 bytes: seconds = 1 (08) 1700000000 = 0x6553F100,
            // groups 00 62 4F 2A 06 -> 80 e2 cf aa 06; nanos = 2 (10) 0.
            b"\x42\x08\x08\x80\xe2\xcf\xaa\x06\x10\x00",
            // labels = 11, sorted: "os" < "role". Entry {1: "os", 2: "linux"} is 4 + 7 = 11.
            b"\x5a\x0b\x0a\x02os\x12\x05linux",
            // Entry {1: "role", 2: ""}: the empty value is still written (12 00); 6 + 2 = 8.
            b"\x5a\x08\x0a\x04role\x12\x00",
            // No deletionTimestamp (9) / deletionGracePeriodSeconds (10): nil pointers.
            // No annotations, ownerReferences, finalizers, managedFields: empty.
        ]);
        assert_eq!(metadata.len(), 0x31);
        cat(&[
            b"\x0a\x31", // metadata = 1, 49 bytes
            &metadata,
            // timestamp = 2: 1699999990 = 0x6553F0F6, groups 76 43 4F 2A 06 -> f6 e1 cf aa 06.
            b"\x12\x08\x08\xf6\xe1\xcf\xaa\x06\x10\x00",
            // window = 3: duration = 1, 10 s = 10_000_000_000 ns = 0x2_540B_E400,
            // groups 00 48 2F 20 25 -> 80 c8 af a0 25.
            b"\x1a\x06\x08\x80\xc8\xaf\xa0\x25",
            // usage = 4 (22), sorted: "cpu" < "memory". Quantity{1: "5m"} is 0a 02 35 6d,
            // so the entry is {1: "cpu"} (5) + {2: quantity} (2 + 4) = 11.
            b"\x22\x0b\x0a\x03cpu\x12\x04\x0a\x025m",
            // {1: "memory"} (8) + {2: Quantity{1: "1Ki"}} (2 + 5) = 15.
            b"\x22\x0f\x0a\x06memory\x12\x05\x0a\x031Ki",
        ])
    }

    /// `usage.swap` travels in the protobuf map like any resource, after `memory` (bytewise
    /// order); without swap the map is what it always was.
    #[test]
    fn swap_is_one_more_usage_entry() {
        use crate::api::types::{ContainerMetrics, NodeMetrics as ApiNodeMetrics};
        let t = SystemTime::UNIX_EPOCH;
        let zero = std::time::Duration::ZERO;
        let node = ApiNodeMetrics::new("n1", BTreeMap::new(), t, t, zero, 5, 1024);
        let keys = |m: &NodeMetrics| m.usage.keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&metrics::node_message(&node)), ["cpu", "memory"]);
        let with = metrics::node_message(&node.with_swap(Some(3 << 20)));
        assert_eq!(keys(&with), ["cpu", "memory", "swap"]);
        assert_eq!(with.usage["swap"], Quantity::new(String::from("3Mi")));
        let bytes = with.encode_to_vec();
        assert_eq!(NodeMetrics::decode(bytes.as_slice()).unwrap(), with);
        let c = ContainerMetrics::new("c", 1, 2).with_swap(Some(0));
        assert_eq!(
            c.usage.entries().map(|(k, _)| k).collect::<Vec<_>>(),
            ["cpu", "memory", "swap"]
        );
    }

    #[test]
    fn node_metrics_golden() {
        let node = golden_node();
        let expected = golden_node_bytes();
        assert_eq!(node.encode_to_vec(), expected);
        assert_eq!(node.encoded_len(), expected.len());
        assert_eq!(NodeMetrics::decode(expected.as_slice()).unwrap(), node);
    }

    #[test]
    fn node_metrics_envelope_golden() {
        let raw = golden_node_bytes();
        assert_eq!(raw.len(), 0x63);
        let expected = cat(&[
            b"k8s\x00", // magic 6b 38 73 00
            // typeMeta = 1: {1: "metrics.k8s.io/v1beta1" (2 + 22), 2: "NodeMetrics" (2 + 11)}.
            b"\x0a\x25\x0a\x16metrics.k8s.io/v1beta1\x12\x0bNodeMetrics",
            b"\x12\x63", // raw = 2, 99 bytes
            &raw,
            b"\x1a\x00", // contentEncoding = 3: "" (always written)
            b"\x22\x00", // contentType = 4: "" (always written)
        ]);
        assert_eq!(
            envelope("metrics.k8s.io/v1beta1", "NodeMetrics", &raw),
            expected
        );
        assert_eq!(
            encode_object("metrics.k8s.io/v1beta1", "NodeMetrics", &golden_node()),
            expected
        );
        let (type_meta, decoded_raw) = decode_envelope(&expected).unwrap();
        assert_eq!(type_meta.api_version, "metrics.k8s.io/v1beta1");
        assert_eq!(type_meta.kind, "NodeMetrics");
        assert_eq!(decoded_raw, raw);
        let node: NodeMetrics =
            decode_object(&expected, "metrics.k8s.io/v1beta1", "NodeMetrics").unwrap();
        assert_eq!(node, golden_node());
    }

    fn golden_pod() -> PodMetrics {
        PodMetrics {
            metadata: ObjectMeta {
                name: "p".into(),
                namespace: "ns".into(),
                // creation_timestamp left zero: written as an empty message.
                ..Default::default()
            },
            timestamp: Time::from_unix_seconds(1_730_000_000),
            window: Duration::from_nanos(15_000_000_000),
            containers: vec![
                ContainerMetrics {
                    name: "app".into(),
                    usage: usage(&[("cpu", "12n")]),
                },
                ContainerMetrics {
                    name: "idle".into(),
                    usage: BTreeMap::new(),
                },
            ],
        }
    }

    fn golden_pod_bytes() -> Vec<u8> {
        cat(&[
            // metadata = 1, 19 bytes: name "p" (3), generateName "" (2), namespace "ns" (4),
            // selfLink, uid, resourceVersion "" (2 each), generation 0 (2), and the zero
            // creationTimestamp as an empty message (42 00).
            b"\x0a\x13",
            b"\x0a\x01p\x12\x00\x1a\x02ns\x22\x00\x2a\x00\x32\x00\x38\x00\x42\x00",
            // timestamp = 2: 1730000000 = 0x671D_B480, groups 00 69 76 38 06
            // -> 80 e9 f6 b8 06; nanos 0.
            b"\x12\x08\x08\x80\xe9\xf6\xb8\x06\x10\x00",
            // window = 3: 15 s = 0x3_7E11_D600 ns, groups 00 2C 47 70 37 -> 80 ac c7 f0 37.
            b"\x1a\x06\x08\x80\xac\xc7\xf0\x37",
            // containers = 4 (22), in list order. First: {1: "app"} (5) + usage entry
            // {1: "cpu"} (5) + {2: Quantity{1: "12n"}} (2 + 5), entry 12 bytes -> 5 + 14 = 19.
            b"\x22\x13\x0a\x03app\x12\x0c\x0a\x03cpu\x12\x05\x0a\x0312n",
            // Second: {1: "idle"} only; an empty map writes nothing.
            b"\x22\x06\x0a\x04idle",
        ])
    }

    #[test]
    fn pod_metrics_golden() {
        let pod = golden_pod();
        let expected = golden_pod_bytes();
        assert_eq!(pod.encode_to_vec(), expected);
        assert_eq!(pod.encoded_len(), expected.len());
        assert_eq!(PodMetrics::decode(expected.as_slice()).unwrap(), pod);
    }

    #[test]
    fn pod_metrics_list_golden() {
        let list = PodMetricsList {
            metadata: ListMeta::default(),
            items: vec![golden_pod()],
        };
        let pod = golden_pod_bytes();
        assert_eq!(pod.len(), 0x44);
        let expected = cat(&[
            // metadata = 1: ListMeta with selfLink, resourceVersion, continue all "" (Go
            // value fields); remainingItemCount and shardInfo are nil pointers.
            b"\x0a\x06\x0a\x00\x12\x00\x1a\x00",
            b"\x12\x44", // items = 2, 68 bytes: 2 + 19 + 10 + 8 + 21 + 8
            &pod,
        ]);
        assert_eq!(list.encode_to_vec(), expected);
        assert_eq!(PodMetricsList::decode(expected.as_slice()).unwrap(), list);
        // An empty list still carries its metadata.
        assert_eq!(
            NodeMetricsList::default().encode_to_vec(),
            b"\x0a\x06\x0a\x00\x12\x00\x1a\x00"
        );
    }

    #[test]
    fn status_not_found_golden() {
        let status = Status {
            metadata: ListMeta::default(),
            status: "Failure".into(),
            message: "nodes.metrics.k8s.io \"n1\" not found".into(),
            reason: "NotFound".into(),
            details: Some(StatusDetails {
                name: "n1".into(),
                group: "metrics.k8s.io".into(),
                kind: "nodes".into(),
                ..Default::default()
            }),
            code: 404,
        };
        let expected = cat(&[
            b"\x0a\x06\x0a\x00\x12\x00\x1a\x00", // metadata = 1: empty ListMeta
            b"\x12\x07Failure",                  // status = 2
            b"\x1a\x23nodes.metrics.k8s.io \"n1\" not found", // message = 3, 35 bytes
            b"\x22\x08NotFound",                 // reason = 4
            // details = 5, 31 bytes, in tag order: name (4), group (16), kind (7), no causes,
            // retryAfterSeconds = 5 varint 0 (28 00), uid = 6 "" (32 00).
            b"\x2a\x1f\x0a\x02n1\x12\x0emetrics.k8s.io\x1a\x05nodes\x28\x00\x32\x00",
            b"\x30\x94\x03", // code = 6: 404 = 0x194, groups 14 03 -> 94 03
        ]);
        assert_eq!(status.encode_to_vec(), expected);
        assert_eq!(Status::decode(expected.as_slice()).unwrap(), status);
        let body = encode_object("v1", "Status", &status);
        assert_eq!(&body[..18], b"k8s\x00\x0a\x0c\x0a\x02v1\x12\x06Status");
    }

    #[test]
    fn empty_map_values_are_written_unlike_prost_maps() {
        let map = labels(&[("node-role.kubernetes.io/control-plane", "")]);
        let mut ours = Vec::new();
        encode_sorted_map(11, &map, &mut ours);
        assert_eq!(ours.len(), sorted_map_encoded_len(11, &map));
        assert!(ours.ends_with(b"control-plane\x12\x00"), "{ours:02x?}");
        // prost's own map encoder drops the empty value; Go does not, hence the hand-written
        // impls.
        let mut prosts = Vec::new();
        btree_map::encode(
            string::encode,
            string::encoded_len,
            string::encode,
            string::encoded_len,
            11,
            &map,
            &mut prosts,
        );
        assert_eq!(prosts.len() + 2, ours.len());
        // Both decode to the same map.
        let meta = ObjectMeta {
            labels: map.clone(),
            ..Default::default()
        };
        assert_eq!(
            ObjectMeta::decode(meta.encode_to_vec().as_slice())
                .unwrap()
                .labels,
            map
        );
    }

    #[test]
    fn maps_are_sorted_bytewise_and_deterministic() {
        let keys = ["memory", "cpu", "B", "a", "ephemeral-storage", "Z9", "cpu2"];
        let forward: BTreeMap<_, _> = keys
            .iter()
            .map(|k| ((*k).to_owned(), Quantity::new("1")))
            .collect();
        let backward: BTreeMap<_, _> = keys
            .iter()
            .rev()
            .map(|k| ((*k).to_owned(), Quantity::new("1")))
            .collect();
        let a = NodeMetrics {
            usage: forward,
            ..Default::default()
        };
        let b = NodeMetrics {
            usage: backward,
            ..Default::default()
        };
        let bytes = a.encode_to_vec();
        assert_eq!(bytes, b.encode_to_vec());
        // Entry keys in wire order: Go's sort.Strings order (bytewise, uppercase first).
        let wire_keys: Vec<String> = records(&bytes)
            .into_iter()
            .filter(|(tag, _, _)| *tag == 4)
            .map(|(_, _, entry)| {
                let (key_tag, _, key) = records(entry)[0];
                assert_eq!(key_tag, 1);
                String::from_utf8(key.to_vec()).unwrap()
            })
            .collect();
        assert_eq!(
            wire_keys,
            ["B", "Z9", "a", "cpu", "cpu2", "ephemeral-storage", "memory"]
        );
    }

    fn full_object_meta() -> ObjectMeta {
        ObjectMeta {
            name: "name".into(),
            generate_name: "gen-".into(),
            namespace: "ns".into(),
            self_link: "/self".into(),
            uid: "6a1e5f0c-0000-4000-8000-000000000001".into(),
            resource_version: "42".into(),
            generation: -3,
            creation_timestamp: Time::from_unix_seconds(1_199_149_261),
            deletion_timestamp: Some(Time::ZERO),
            deletion_grace_period_seconds: Some(30),
            labels: labels(&[("app", "web"), ("tier", "")]),
            annotations: labels(&[("note", "x".repeat(300).as_str())]),
            owner_references: vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "web-1".into(),
                uid: "u".into(),
                controller: Some(true),
                block_owner_deletion: Some(false),
            }],
            finalizers: vec!["a".into(), "b".into()],
            managed_fields: vec![ManagedFieldsEntry {
                manager: "kubectl".into(),
                operation: "Update".into(),
                api_version: "v1".into(),
                time: Some(Time::from_unix_seconds(-1)),
                fields_type: "FieldsV1".into(),
                fields_v1: Some(FieldsV1 {
                    raw: b"{}".to_vec(),
                }),
                subresource: String::new(),
            }],
        }
    }

    #[test]
    fn round_trips_and_lengths_agree() {
        let node_list = NodeMetricsList {
            metadata: ListMeta {
                resource_version: "7".into(),
                remaining_item_count: Some(0),
                shard_info: Some(ShardInfo {
                    selector: "s".into(),
                }),
                ..Default::default()
            },
            items: vec![
                golden_node(),
                NodeMetrics {
                    metadata: full_object_meta(),
                    ..Default::default()
                },
            ],
        };
        let bytes = node_list.encode_to_vec();
        assert_eq!(node_list.encoded_len(), bytes.len());
        assert_eq!(
            NodeMetricsList::decode(bytes.as_slice()).unwrap(),
            node_list
        );

        let pod_list = PodMetricsList {
            metadata: ListMeta {
                r#continue: "token".into(),
                ..Default::default()
            },
            items: vec![golden_pod(), PodMetrics::default()],
        };
        let body = encode_object("metrics.k8s.io/v1beta1", "PodMetricsList", &pod_list);
        assert_eq!(
            body,
            envelope(
                "metrics.k8s.io/v1beta1",
                "PodMetricsList",
                &pod_list.encode_to_vec()
            )
        );
        let decoded: PodMetricsList =
            decode_object(&body, "metrics.k8s.io/v1beta1", "PodMetricsList").unwrap();
        assert_eq!(decoded, pod_list);

        let meta = full_object_meta();
        let bytes = meta.encode_to_vec();
        assert_eq!(meta.encoded_len(), bytes.len());
        let decoded = ObjectMeta::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded, meta);
        assert_eq!(decoded.encode_to_vec(), bytes);
        // Tags appear in ascending order, as gogo writes them.
        let tags: Vec<u32> = records(&bytes).iter().map(|r| r.0).collect();
        assert!(tags.windows(2).all(|w| w[0] <= w[1]), "{tags:?}");
        // A set pointer to the zero time is written as an empty message (4a 00).
        assert!(bytes.windows(2).any(|w| w == b"\x4a\x00"));
    }

    #[test]
    fn owner_reference_field_order_is_by_tag() {
        let owner = OwnerReference {
            api_version: "v".into(),
            kind: "k".into(),
            name: "n".into(),
            uid: "u".into(),
            controller: None,
            block_owner_deletion: Some(true),
        };
        assert_eq!(
            owner.encode_to_vec(),
            b"\x0a\x01k\x1a\x01n\x22\x01u\x2a\x01v\x38\x01"
        );
    }

    #[test]
    fn time_matches_go() {
        // Zero time: empty message; a set time: seconds then nanos = 0.
        assert_eq!(Time::ZERO.encode_to_vec(), b"");
        assert_eq!(Time::default(), Time::ZERO);
        assert_eq!(
            Time::from_unix_seconds(0).encode_to_vec(),
            b"\x08\x00\x10\x00"
        );
        // Negative seconds are 10-byte two's-complement varints, as Go's uint64 cast.
        assert_eq!(
            Time::from_unix_seconds(-1).encode_to_vec(),
            b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x10\x00"
        );
        // Go's zero instant is the zero time however it is reached.
        assert!(Time::from_unix_seconds(GO_ZERO_TIME_UNIX).is_zero());
        assert_eq!(
            Time::from_unix_seconds(GO_ZERO_TIME_UNIX).encode_to_vec(),
            b""
        );
        // Decoding: empty -> zero; nanos dropped; nanos alone -> the epoch.
        assert_eq!(Time::decode(&b""[..]).unwrap(), Time::ZERO);
        let t = Time::decode(&b"\x08\x05\x10\x07"[..]).unwrap();
        assert_eq!(t.unix_seconds(), Some(5));
        assert_eq!(t.encode_to_vec(), b"\x08\x05\x10\x00");
        assert_eq!(
            Time::decode(&b"\x10\x07"[..]).unwrap().unix_seconds(),
            Some(0)
        );
        // SystemTime: floors, as Go's Time.Unix.
        let epoch = SystemTime::UNIX_EPOCH;
        let after = epoch + std::time::Duration::from_millis(1_500);
        let before = epoch - std::time::Duration::from_millis(1_500);
        assert_eq!(Time::from_system_time(after).unix_seconds(), Some(1));
        assert_eq!(Time::from_system_time(before).unix_seconds(), Some(-2));
        assert_eq!(
            Time::from_system_time(epoch - std::time::Duration::from_secs(3)).unix_seconds(),
            Some(-3)
        );
    }

    #[test]
    fn duration_always_written() {
        assert_eq!(Duration::default().encode_to_vec(), b"\x08\x00");
        assert_eq!(
            Duration::from_std(std::time::Duration::MAX).duration,
            i64::MAX
        );
    }

    #[test]
    fn decode_errors_are_distinct() {
        assert!(matches!(decode_envelope(b""), Err(Error::Empty)));
        match decode_envelope(br#"{"kind":"Status"}"#) {
            Err(Error::BadMagic { found }) => assert_eq!(found, b"{\"ki"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decode_envelope(b"k8"),
            Err(Error::BadMagic { .. })
        ));
        assert!(matches!(decode_envelope(b"k8s\x00"), Err(Error::NoObject)));
        // Truncated: the raw field claims 99 bytes.
        let body = envelope("v1", "Status", &[0; 99]);
        assert!(matches!(
            decode_envelope(&body[..body.len() - 10]),
            Err(Error::Decode { .. })
        ));
        let body = encode_object("metrics.k8s.io/v1beta1", "PodMetrics", &golden_pod());
        match decode_object::<NodeMetrics>(&body, "metrics.k8s.io/v1beta1", "NodeMetrics") {
            Err(Error::UnexpectedKind { kind, .. }) => assert_eq!(kind, "PodMetrics"),
            other => panic!("{other:?}"),
        }
        // The error names what failed.
        let err = decode_envelope(b"nope").unwrap_err();
        assert!(err.to_string().contains("6b 38 73 00"), "{err}");
    }

    #[test]
    fn empty_raw_is_still_written() {
        // Go's NestedMarshalTo always writes raw, even for a zero-length object.
        assert_eq!(
            envelope("v1", "X", b""),
            b"k8s\x00\x0a\x07\x0a\x02v1\x12\x01X\x12\x00\x1a\x00\x22\x00"
        );
    }

    // ----- Fixtures from kubernetes/api testdata (not vendored) ---------------------------
    //
    // k8s.io/api keeps, per type, the bytes Go's protobuf serializer writes for a fuzzed
    // object (`testdata/HEAD/<group>.<version>.<Kind>.pb`). Point KPULSE_K8S_API_TESTDATA at
    // that directory of a kubernetes/api checkout and run `cargo test -- --ignored`.

    fn fixture(name: &str) -> Vec<u8> {
        let dir = std::env::var_os("KPULSE_K8S_API_TESTDATA")
            .expect("set KPULSE_K8S_API_TESTDATA to <kubernetes/api>/testdata/HEAD");
        let path = std::path::Path::new(&dir).join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    #[ignore = "needs KPULSE_K8S_API_TESTDATA=<kubernetes/api>/testdata/HEAD"]
    fn fixture_status_is_byte_identical() {
        let file = fixture("core.v1.Status.pb");
        let status: Status = decode_object(&file, "v1", "Status").unwrap();
        assert_eq!(status.status, "statusValue");
        assert_eq!(status.code, 6);
        assert_eq!(status.metadata.remaining_item_count, Some(4));
        let details = status.details.as_ref().unwrap();
        assert_eq!(details.retry_after_seconds, 5);
        assert_eq!(details.uid, "uidValue");
        assert_eq!(details.causes[0].reason, "reasonValue");
        assert_eq!(encode_object("v1", "Status", &status), file);
        let (_, raw) = decode_envelope(&file).unwrap();
        assert_eq!(envelope("v1", "Status", &raw), file);
    }

    /// NodeStatus' `capacity = 1` and `allocatable = 2`: both map<string, Quantity>.
    #[derive(Debug, Default)]
    struct NodeResources {
        capacity: BTreeMap<String, Quantity>,
        allocatable: BTreeMap<String, Quantity>,
    }

    impl Message for NodeResources {
        fn encode_raw(&self, buf: &mut impl BufMut) {
            encode_sorted_map(1, &self.capacity, buf);
            encode_sorted_map(2, &self.allocatable, buf);
        }
        fn merge_field(
            &mut self,
            tag: u32,
            wire_type: WireType,
            buf: &mut impl Buf,
            ctx: DecodeContext,
        ) -> Result<(), DecodeError> {
            match tag {
                1 => merge_quantity_map(wire_type, &mut self.capacity, buf, ctx),
                2 => merge_quantity_map(wire_type, &mut self.allocatable, buf, ctx),
                _ => skip_field(wire_type, tag, buf, ctx),
            }
        }
        fn encoded_len(&self) -> usize {
            sorted_map_encoded_len(1, &self.capacity) + sorted_map_encoded_len(2, &self.allocatable)
        }
        fn clear(&mut self) {
            *self = Self::default();
        }
    }

    #[test]
    #[ignore = "needs KPULSE_K8S_API_TESTDATA=<kubernetes/api>/testdata/HEAD"]
    fn fixture_node_object_meta_and_quantity_maps_are_byte_identical() {
        let file = fixture("core.v1.Node.pb");
        let (type_meta, raw) = decode_envelope(&file).unwrap();
        assert_eq!(
            (type_meta.api_version.as_str(), type_meta.kind.as_str()),
            ("v1", "Node")
        );
        let node = records(&raw);

        // Node.metadata = 1: every ObjectMeta field is set in the fixture.
        let (_, _, meta_bytes) = node.iter().find(|r| r.0 == 1).copied().unwrap();
        let meta = ObjectMeta::decode(meta_bytes).unwrap();
        assert_eq!(meta.encode_to_vec(), meta_bytes);
        assert_eq!(meta.name, "nameValue");
        assert_eq!(meta.generation, 7);
        // 2008-01-01T01:01:01Z, 2009-01-01T01:01:01Z, 2004-01-01T01:01:01Z.
        assert_eq!(meta.creation_timestamp.unix_seconds(), Some(1_199_149_261));
        assert_eq!(
            meta.deletion_timestamp.unwrap().unix_seconds(),
            Some(1_230_771_661)
        );
        assert_eq!(meta.deletion_grace_period_seconds, Some(10));
        assert_eq!(meta.labels, labels(&[("labelsKey", "labelsValue")]));
        assert_eq!(
            meta.annotations,
            labels(&[("annotationsKey", "annotationsValue")])
        );
        assert_eq!(meta.owner_references[0].controller, Some(true));
        assert_eq!(meta.owner_references[0].block_owner_deletion, Some(true));
        assert_eq!(meta.finalizers, ["finalizersValue"]);
        let managed = &meta.managed_fields[0];
        assert_eq!(managed.time.unwrap().unix_seconds(), Some(1_072_918_861));
        assert_eq!(managed.fields_v1.as_ref().unwrap().raw, b"{}");
        assert_eq!(managed.subresource, "subresourceValue");

        // Node.status = 3: capacity and allocatable as our map encoder writes them.
        let (_, _, status) = node.iter().find(|r| r.0 == 3).copied().unwrap();
        let maps: Vec<u8> = records(status)
            .into_iter()
            .filter(|r| r.0 == 1 || r.0 == 2)
            .flat_map(|r| r.1.to_vec())
            .collect();
        let resources = NodeResources::decode(maps.as_slice()).unwrap();
        assert_eq!(resources.capacity, usage(&[("capacityKey", "0")]));
        assert_eq!(resources.allocatable, usage(&[("allocatableKey", "0")]));
        assert_eq!(resources.encode_to_vec(), maps);
    }
}
