//! The `metrics.k8s.io` messages ([`NodeMetrics`], [`PodMetrics`], their lists and
//! [`ContainerMetrics`]), and the functions that build them from the API's objects.

use std::collections::BTreeMap;

use bytes::{Buf, BufMut};
use prost::{
    encoding::{message, skip_field, string, DecodeContext, WireType},
    DecodeError, Message,
};

use super::metav1::{object_meta, Duration, ListMeta, ObjectMeta, Quantity, Time};
use super::{encode_sorted_map, merge_quantity_map, sorted_map_encoded_len};
use crate::api::types::{
    NodeMetrics as ApiNodeMetrics, NodeMetricsList as ApiNodeMetricsList,
    PodMetrics as ApiPodMetrics, PodMetricsList as ApiPodMetricsList, Usage,
};

// ---------------------------------------------------------------------------------------------
// metrics.k8s.io/v1beta1 (v1alpha1 and v1, GA in k8s.io/metrics v0.37, have the same tags)

/// `NodeMetrics`: one node's usage over `[timestamp - window, timestamp]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeMetrics {
    /// `metadata = 1`, always written.
    pub metadata: ObjectMeta,
    /// `timestamp = 2`, always written.
    pub timestamp: Time,
    /// `window = 3`, always written.
    pub window: Duration,
    /// `usage = 4`: resource name (`cpu`, `memory`) to quantity, sorted by name.
    pub usage: BTreeMap<String, Quantity>,
}

impl Message for NodeMetrics {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        message::encode(1, &self.metadata, buf);
        message::encode(2, &self.timestamp, buf);
        message::encode(3, &self.window, buf);
        encode_sorted_map(4, &self.usage, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => message::merge(wire_type, &mut self.metadata, buf, ctx),
            2 => message::merge(wire_type, &mut self.timestamp, buf, ctx),
            3 => message::merge(wire_type, &mut self.window, buf, ctx),
            4 => merge_quantity_map(wire_type, &mut self.usage, buf, ctx),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        message::encoded_len(1, &self.metadata)
            + message::encoded_len(2, &self.timestamp)
            + message::encoded_len(3, &self.window)
            + sorted_map_encoded_len(4, &self.usage)
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}
/// `NodeMetricsList`.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct NodeMetricsList {
    /// `metadata = 1`, always written.
    #[prost(message, required, tag = "1")]
    pub metadata: ListMeta,
    /// `items = 2`.
    #[prost(message, repeated, tag = "2")]
    pub items: Vec<NodeMetrics>,
}

/// `PodMetrics`: one pod's containers over `[timestamp - window, timestamp]`.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct PodMetrics {
    /// `metadata = 1`, always written.
    #[prost(message, required, tag = "1")]
    pub metadata: ObjectMeta,
    /// `timestamp = 2`, always written.
    #[prost(message, required, tag = "2")]
    pub timestamp: Time,
    /// `window = 3`, always written.
    #[prost(message, required, tag = "3")]
    pub window: Duration,
    /// `containers = 4`.
    #[prost(message, repeated, tag = "4")]
    pub containers: Vec<ContainerMetrics>,
}

/// `PodMetricsList`.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct PodMetricsList {
    /// `metadata = 1`, always written.
    #[prost(message, required, tag = "1")]
    pub metadata: ListMeta,
    /// `items = 2`.
    #[prost(message, repeated, tag = "2")]
    pub items: Vec<PodMetrics>,
}

/// `ContainerMetrics`: one container's usage.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerMetrics {
    /// `name = 1`, always written.
    pub name: String,
    /// `usage = 2`: resource name to quantity, sorted by name.
    pub usage: BTreeMap<String, Quantity>,
}

impl Message for ContainerMetrics {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        string::encode(1, &self.name, buf);
        encode_sorted_map(2, &self.usage, buf);
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
            2 => merge_quantity_map(wire_type, &mut self.usage, buf, ctx),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        string::encoded_len(1, &self.name) + sorted_map_encoded_len(2, &self.usage)
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}
// ---------------------------------------------------------------------------------------------
// From the API's objects.

fn usage(usage: &Usage) -> BTreeMap<String, Quantity> {
    usage
        .entries()
        .map(|(name, q)| (name.to_owned(), Quantity::new(q.canonical())))
        .collect()
}

/// A [`NodeMetrics`](ApiNodeMetrics) as its protobuf message.
pub fn node_message(n: &ApiNodeMetrics) -> NodeMetrics {
    NodeMetrics {
        metadata: object_meta(&n.metadata),
        timestamp: Time::from_system_time(n.timestamp),
        window: Duration::from_std(n.window),
        usage: usage(&n.usage),
    }
}

/// A [`PodMetrics`](ApiPodMetrics) as its protobuf message.
pub fn pod_message(p: &ApiPodMetrics) -> PodMetrics {
    PodMetrics {
        metadata: object_meta(&p.metadata),
        timestamp: Time::from_system_time(p.timestamp),
        window: Duration::from_std(p.window),
        containers: p
            .containers
            .iter()
            .map(|c| ContainerMetrics {
                name: c.name.clone(),
                usage: usage(&c.usage),
            })
            .collect(),
    }
}

/// A [`NodeMetricsList`](ApiNodeMetricsList) as its protobuf message (list metadata empty, as metrics-server's).
pub fn node_list_message(l: &ApiNodeMetricsList) -> NodeMetricsList {
    NodeMetricsList {
        metadata: ListMeta::default(),
        items: l.items.iter().map(node_message).collect(),
    }
}

/// A [`PodMetricsList`](ApiPodMetricsList) as its protobuf message (list metadata empty, as metrics-server's).
pub fn pod_list_message(l: &ApiPodMetricsList) -> PodMetricsList {
    PodMetricsList {
        metadata: ListMeta::default(),
        items: l.items.iter().map(pod_message).collect(),
    }
}
