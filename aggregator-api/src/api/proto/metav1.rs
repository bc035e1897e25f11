//! apimachinery's messages: `resource.Quantity`, and from meta/v1 `Time`, `Duration`,
//! [`ObjectMeta`] and the messages it holds, [`ListMeta`] and [`Status`] (the body of an
//! error response), with [`status_message`] and the `ObjectMeta` of the API's objects.

use std::{
    collections::BTreeMap,
    hash::{Hash, Hasher},
    time::SystemTime,
};

use bytes::{Buf, BufMut};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use prost::{
    encoding::{int32, int64, message, skip_field, string, DecodeContext, WireType},
    DecodeError, Message,
};

use super::{encode_sorted_map, merge_string_map, sorted_map_encoded_len};
use crate::status::Status as ApiStatus;

// ---------------------------------------------------------------------------------------------
// resource.Quantity, meta/v1 Time and Duration

/// `resource.Quantity`: one string field, always written (Go's custom marshaller,
/// apimachinery `pkg/api/resource/quantity_proto.go`).
///
/// The string must already be Go's canonical form (`5m`, `1Ki`, `123456n`); Go writes
/// `Quantity.String()`, which is `0` for a zero quantity, never an empty string.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Message)]
pub struct Quantity {
    /// The quantity in canonical string form.
    #[prost(string, required, tag = "1")]
    pub string: String,
}

impl Quantity {
    /// A quantity from its canonical string form.
    pub fn new(canonical: impl Into<String>) -> Self {
        Self {
            string: canonical.into(),
        }
    }
}

/// Unix seconds of Go's zero `time.Time` (0001-01-01T00:00:00Z), which `Time.IsZero` reports.
pub(super) const GO_ZERO_TIME_UNIX: i64 = -62_135_596_800;

/// `metav1.Time`: a point in time with whole-second precision.
///
/// On the wire it is `Timestamp{seconds = 1, nanos = 2}`. Go writes both fields (nanos always
/// 0) for a set time, and an empty message for the zero time; when reading, it keeps only
/// `seconds`, and any non-empty message is a set time (apimachinery
/// `pkg/apis/meta/v1/time_proto.go`, `ProtoTime`, `Unmarshal`). [`Time::default`] is the zero
/// time.
#[derive(Clone, Copy, Debug, Default)]
pub struct Time {
    /// `None`: the zero time. Some(Go's zero instant) is also the zero time; see
    /// [`Time::unix_seconds`].
    seconds: Option<i64>,
}

impl Time {
    /// Go's zero time: written as an empty message.
    pub const ZERO: Time = Time { seconds: None };

    /// The time `seconds` after the Unix epoch.
    pub const fn from_unix_seconds(seconds: i64) -> Self {
        Time {
            seconds: Some(seconds),
        }
    }

    /// The whole second containing `t` (rounded towards the past, as Go's `Time.Unix`).
    /// Saturates far outside ±292 billion years.
    pub fn from_system_time(t: SystemTime) -> Self {
        let seconds = match t.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
            Err(before) => {
                let before = before.duration();
                let whole = i64::try_from(before.as_secs()).unwrap_or(i64::MAX);
                let partial = i64::from(before.subsec_nanos() > 0);
                whole.saturating_neg().saturating_sub(partial)
            }
        };
        Self::from_unix_seconds(seconds)
    }

    /// Seconds since the Unix epoch, or `None` for the zero time. Go's zero instant
    /// (0001-01-01T00:00:00Z) counts as the zero time, as `time.Time.IsZero` says.
    pub const fn unix_seconds(&self) -> Option<i64> {
        match self.seconds {
            Some(GO_ZERO_TIME_UNIX) | None => None,
            some => some,
        }
    }

    /// True for the zero time, which Go writes as an empty message.
    pub const fn is_zero(&self) -> bool {
        self.unix_seconds().is_none()
    }
}

impl PartialEq for Time {
    fn eq(&self, other: &Self) -> bool {
        self.unix_seconds() == other.unix_seconds()
    }
}

impl Eq for Time {}

impl Hash for Time {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.unix_seconds().hash(state);
    }
}

impl Message for Time {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if let Some(seconds) = self.unix_seconds() {
            int64::encode(1, &seconds, buf);
            int32::encode(2, &0, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        // Any field at all makes this a set time (Go: non-empty data), epoch if only nanos.
        let seconds = self.seconds.get_or_insert(0);
        match tag {
            1 => int64::merge(wire_type, seconds, buf, ctx),
            // Read and dropped, as Go does.
            2 => int32::merge(wire_type, &mut 0, buf, ctx),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        self.unix_seconds().map_or(0, |seconds| {
            int64::encoded_len(1, &seconds) + int32::encoded_len(2, &0)
        })
    }

    fn clear(&mut self) {
        *self = Self::ZERO;
    }
}

/// `metav1.Duration`: a Go `time.Duration`, in nanoseconds; always written.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Message)]
pub struct Duration {
    /// Nanoseconds.
    #[prost(int64, required, tag = "1")]
    pub duration: i64,
}

impl Duration {
    /// A duration of `nanos` nanoseconds.
    pub const fn from_nanos(nanos: i64) -> Self {
        Duration { duration: nanos }
    }

    /// A std duration, saturating at Go's maximum (about 292 years).
    pub fn from_std(d: std::time::Duration) -> Self {
        Self::from_nanos(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }
}

// ---------------------------------------------------------------------------------------------
// meta/v1: ObjectMeta and the messages it holds, ListMeta, Status

/// `metav1.ObjectMeta`, every field of apimachinery's `generated.proto` (tags 1–14 and 17).
///
/// metrics-server fills `name`, `namespace` (pods), `labels` and `creation_timestamp`; the
/// rest are here so a decoded object re-encodes to the same bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectMeta {
    /// `name = 1`, always written.
    pub name: String,
    /// `generateName = 2`, always written.
    pub generate_name: String,
    /// `namespace = 3`, always written.
    pub namespace: String,
    /// `selfLink = 4`, always written.
    pub self_link: String,
    /// `uid = 5`, always written.
    pub uid: String,
    /// `resourceVersion = 6`, always written.
    pub resource_version: String,
    /// `generation = 7`, always written.
    pub generation: i64,
    /// `creationTimestamp = 8`, always written (empty for the zero time).
    pub creation_timestamp: Time,
    /// `deletionTimestamp = 9`, written when set.
    pub deletion_timestamp: Option<Time>,
    /// `deletionGracePeriodSeconds = 10`, written when set.
    pub deletion_grace_period_seconds: Option<i64>,
    /// `labels = 11`, sorted by key.
    pub labels: BTreeMap<String, String>,
    /// `annotations = 12`, sorted by key.
    pub annotations: BTreeMap<String, String>,
    /// `ownerReferences = 13`.
    pub owner_references: Vec<OwnerReference>,
    /// `finalizers = 14`.
    pub finalizers: Vec<String>,
    /// `managedFields = 17`.
    pub managed_fields: Vec<ManagedFieldsEntry>,
}

impl Message for ObjectMeta {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        string::encode(1, &self.name, buf);
        string::encode(2, &self.generate_name, buf);
        string::encode(3, &self.namespace, buf);
        string::encode(4, &self.self_link, buf);
        string::encode(5, &self.uid, buf);
        string::encode(6, &self.resource_version, buf);
        int64::encode(7, &self.generation, buf);
        message::encode(8, &self.creation_timestamp, buf);
        if let Some(t) = &self.deletion_timestamp {
            message::encode(9, t, buf);
        }
        if let Some(s) = &self.deletion_grace_period_seconds {
            int64::encode(10, s, buf);
        }
        encode_sorted_map(11, &self.labels, buf);
        encode_sorted_map(12, &self.annotations, buf);
        message::encode_repeated(13, &self.owner_references, buf);
        string::encode_repeated(14, &self.finalizers, buf);
        message::encode_repeated(17, &self.managed_fields, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => string::merge(wire_type, &mut self.name, buf, ctx),
            2 => string::merge(wire_type, &mut self.generate_name, buf, ctx),
            3 => string::merge(wire_type, &mut self.namespace, buf, ctx),
            4 => string::merge(wire_type, &mut self.self_link, buf, ctx),
            5 => string::merge(wire_type, &mut self.uid, buf, ctx),
            6 => string::merge(wire_type, &mut self.resource_version, buf, ctx),
            7 => int64::merge(wire_type, &mut self.generation, buf, ctx),
            8 => message::merge(wire_type, &mut self.creation_timestamp, buf, ctx),
            9 => message::merge(
                wire_type,
                self.deletion_timestamp.get_or_insert_with(Time::default),
                buf,
                ctx,
            ),
            10 => int64::merge(
                wire_type,
                self.deletion_grace_period_seconds.get_or_insert(0),
                buf,
                ctx,
            ),
            11 => merge_string_map(wire_type, &mut self.labels, buf, ctx),
            12 => merge_string_map(wire_type, &mut self.annotations, buf, ctx),
            13 => message::merge_repeated(wire_type, &mut self.owner_references, buf, ctx),
            14 => string::merge_repeated(wire_type, &mut self.finalizers, buf, ctx),
            17 => message::merge_repeated(wire_type, &mut self.managed_fields, buf, ctx),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        string::encoded_len(1, &self.name)
            + string::encoded_len(2, &self.generate_name)
            + string::encoded_len(3, &self.namespace)
            + string::encoded_len(4, &self.self_link)
            + string::encoded_len(5, &self.uid)
            + string::encoded_len(6, &self.resource_version)
            + int64::encoded_len(7, &self.generation)
            + message::encoded_len(8, &self.creation_timestamp)
            + self
                .deletion_timestamp
                .as_ref()
                .map_or(0, |t| message::encoded_len(9, t))
            + self
                .deletion_grace_period_seconds
                .as_ref()
                .map_or(0, |s| int64::encoded_len(10, s))
            + sorted_map_encoded_len(11, &self.labels)
            + sorted_map_encoded_len(12, &self.annotations)
            + message::encoded_len_repeated(13, &self.owner_references)
            + string::encoded_len_repeated(14, &self.finalizers)
            + message::encoded_len_repeated(17, &self.managed_fields)
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

/// `metav1.OwnerReference`. Go writes the fields in tag order: kind, name, uid, apiVersion.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct OwnerReference {
    /// `apiVersion = 5`.
    #[prost(string, required, tag = "5")]
    pub api_version: String,
    /// `kind = 1`.
    #[prost(string, required, tag = "1")]
    pub kind: String,
    /// `name = 3`.
    #[prost(string, required, tag = "3")]
    pub name: String,
    /// `uid = 4`.
    #[prost(string, required, tag = "4")]
    pub uid: String,
    /// `controller = 6`, written when set.
    #[prost(bool, optional, tag = "6")]
    pub controller: Option<bool>,
    /// `blockOwnerDeletion = 7`, written when set.
    #[prost(bool, optional, tag = "7")]
    pub block_owner_deletion: Option<bool>,
}

/// `metav1.ManagedFieldsEntry` (tag 5 is retired).
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct ManagedFieldsEntry {
    /// `manager = 1`.
    #[prost(string, required, tag = "1")]
    pub manager: String,
    /// `operation = 2`.
    #[prost(string, required, tag = "2")]
    pub operation: String,
    /// `apiVersion = 3`.
    #[prost(string, required, tag = "3")]
    pub api_version: String,
    /// `time = 4`, written when set.
    #[prost(message, optional, tag = "4")]
    pub time: Option<Time>,
    /// `fieldsType = 6`.
    #[prost(string, required, tag = "6")]
    pub fields_type: String,
    /// `fieldsV1 = 7`, written when set.
    #[prost(message, optional, tag = "7")]
    pub fields_v1: Option<FieldsV1>,
    /// `subresource = 8`.
    #[prost(string, required, tag = "8")]
    pub subresource: String,
}

/// `metav1.FieldsV1`: `Raw = 1`, written only when non-empty (apimachinery
/// `pkg/apis/meta/v1/fieldsv1.go`).
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct FieldsV1 {
    /// JSON field set.
    #[prost(bytes = "vec", tag = "1")]
    pub raw: Vec<u8>,
}

/// `metav1.ListMeta`.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct ListMeta {
    /// `selfLink = 1`, always written.
    #[prost(string, required, tag = "1")]
    pub self_link: String,
    /// `resourceVersion = 2`, always written.
    #[prost(string, required, tag = "2")]
    pub resource_version: String,
    /// `continue = 3`, always written.
    #[prost(string, required, tag = "3")]
    pub r#continue: String,
    /// `remainingItemCount = 4`, written when set.
    #[prost(int64, optional, tag = "4")]
    pub remaining_item_count: Option<i64>,
    /// `shardInfo = 5`, written when set.
    #[prost(message, optional, tag = "5")]
    pub shard_info: Option<ShardInfo>,
}

/// `metav1.ShardInfo`.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct ShardInfo {
    /// `selector = 1`, always written.
    #[prost(string, required, tag = "1")]
    pub selector: String,
}

/// `metav1.Status`, the body of an error response (envelope type `v1` `Status`).
///
/// The apiserver encodes errors with the negotiated serializer (k8s.io/apiserver
/// `pkg/endpoints/handlers/responsewriters/writers.go`, `ErrorNegotiated`), so a client that
/// asked for protobuf gets its errors in protobuf too.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct Status {
    /// `metadata = 1`, always written.
    #[prost(message, required, tag = "1")]
    pub metadata: ListMeta,
    /// `status = 2`: `Success` or `Failure`.
    #[prost(string, required, tag = "2")]
    pub status: String,
    /// `message = 3`: for humans.
    #[prost(string, required, tag = "3")]
    pub message: String,
    /// `reason = 4`: machine-readable, e.g. `NotFound`.
    #[prost(string, required, tag = "4")]
    pub reason: String,
    /// `details = 5`, written when set.
    #[prost(message, optional, tag = "5")]
    pub details: Option<StatusDetails>,
    /// `code = 6`: the HTTP status code.
    #[prost(int32, required, tag = "6")]
    pub code: i32,
}

/// `metav1.StatusDetails`. Go writes the fields in tag order: name, group, kind, causes,
/// retryAfterSeconds, uid.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct StatusDetails {
    /// `name = 1`.
    #[prost(string, required, tag = "1")]
    pub name: String,
    /// `group = 2`.
    #[prost(string, required, tag = "2")]
    pub group: String,
    /// `kind = 3`.
    #[prost(string, required, tag = "3")]
    pub kind: String,
    /// `uid = 6`.
    #[prost(string, required, tag = "6")]
    pub uid: String,
    /// `causes = 4`.
    #[prost(message, repeated, tag = "4")]
    pub causes: Vec<StatusCause>,
    /// `retryAfterSeconds = 5`, always written.
    #[prost(int32, required, tag = "5")]
    pub retry_after_seconds: i32,
}

/// `metav1.StatusCause`.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct StatusCause {
    /// `reason = 1` (Go's `Type` field).
    #[prost(string, required, tag = "1")]
    pub reason: String,
    /// `message = 2`.
    #[prost(string, required, tag = "2")]
    pub message: String,
    /// `field = 3`.
    #[prost(string, required, tag = "3")]
    pub field: String,
}
// ---------------------------------------------------------------------------------------------
// From the API's objects.

/// The protobuf `ObjectMeta` of an API object: the fields metrics-server fills (name,
/// namespace, creation time, labels).
pub(super) fn object_meta(m: &meta::ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: m.name.clone().unwrap_or_default(),
        namespace: m.namespace.clone().unwrap_or_default(),
        creation_timestamp: m
            .creation_timestamp
            .as_ref()
            .map(|t| Time::from_unix_seconds(t.0.as_second()))
            .unwrap_or(Time::ZERO),
        labels: m.labels.clone().unwrap_or_default(),
        ..ObjectMeta::default()
    }
}
/// A [`Status`](ApiStatus) as its protobuf message (envelope `v1` `Status`).
pub fn status_message(status: &ApiStatus) -> Status {
    let s = &status.0;
    Status {
        metadata: ListMeta::default(),
        status: s.status.clone().unwrap_or_default(),
        message: s.message.clone().unwrap_or_default(),
        reason: s.reason.clone().unwrap_or_default(),
        details: s.details.as_ref().map(|d| StatusDetails {
            name: d.name.clone().unwrap_or_default(),
            group: d.group.clone().unwrap_or_default(),
            kind: d.kind.clone().unwrap_or_default(),
            uid: d.uid.clone().unwrap_or_default(),
            causes: d
                .causes
                .iter()
                .flatten()
                .map(|c| StatusCause {
                    reason: c.reason.clone().unwrap_or_default(),
                    message: c.message.clone().unwrap_or_default(),
                    field: c.field.clone().unwrap_or_default(),
                })
                .collect(),
            retry_after_seconds: d.retry_after_seconds.unwrap_or(0),
        }),
        code: i32::from(status.code()),
    }
}
