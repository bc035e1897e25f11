//! Building API objects: metadata decides *which* objects exist (as metrics-server lists
//! nodes and pods from its informers), the store supplies their numbers. An object the
//! store has no servable metrics for is left out of lists and is NotFound on `get`.
//! Every object built here is served, so its age is reported to the store's observer
//! ([`Store::record_served`]: the freshness histogram of `/metrics`). A list and each look
//! of a watch find their objects with the same functions ([`list_nodes`], [`list_pods`]).

use std::time::SystemTime;

use super::request::ApiRequest;
use super::selector::ObjectFields;
use super::types::{ContainerMetrics, NodeMetrics, PodMetrics};
use crate::{
    metadata::{MetadataSource, NodeMeta, PodMeta},
    store::{Clock, NodeMetricsPoint, PodMetricsPoint, PodSignalsPoint, Store},
};
use kpulse_wire::UnixNanos;

/// Where the API reads the numbers from; [`Store`] is one, for any clock. The API holds a
/// `dyn MetricsReader`, not the store's concrete type.
pub trait MetricsReader: Send + Sync {
    /// What is servable of these nodes, in the order given (`None`: nothing fresh).
    fn node_metrics(&self, names: &[&str]) -> Vec<Option<NodeMetricsPoint>>;
    /// What is servable of these `(namespace, name)` pods, in the order given.
    fn pod_metrics(&self, pods: &[(&str, &str)]) -> Vec<Option<PodMetricsPoint>>;
    /// Pressure and throttling of these `(namespace, name)` pods, in the order given.
    fn pod_signals(&self, pods: &[(&str, &str)]) -> Vec<Option<PodSignalsPoint>>;
    /// Points with these timestamps are about to be served (the freshness histogram).
    fn record_served(&self, timestamps: &mut dyn Iterator<Item = UnixNanos>);
}

impl<C: Clock> MetricsReader for Store<C> {
    fn node_metrics(&self, names: &[&str]) -> Vec<Option<NodeMetricsPoint>> {
        Store::node_metrics(self, names)
    }

    fn pod_metrics(&self, pods: &[(&str, &str)]) -> Vec<Option<PodMetricsPoint>> {
        Store::pod_metrics(self, pods)
    }

    fn pod_signals(&self, pods: &[(&str, &str)]) -> Vec<Option<PodSignalsPoint>> {
        Store::pod_signals(self, pods)
    }

    fn record_served(&self, timestamps: &mut dyn Iterator<Item = UnixNanos>) {
        Store::record_served(self, timestamps);
    }
}

/// NodeMetrics for `nodes`, in the order given, skipping nodes without metrics.
/// `now` becomes `creationTimestamp`, as metrics-server sets it.
pub fn node_metrics(
    store: &dyn MetricsReader,
    nodes: &[NodeMeta],
    now: SystemTime,
) -> Vec<NodeMetrics> {
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let points = store.node_metrics(&names);
    store.record_served(&mut points.iter().flatten().map(|p| p.timestamp));
    points
        .into_iter()
        .zip(nodes)
        .filter_map(|(point, meta)| {
            let p = point?;
            Some(
                NodeMetrics::new(
                    meta.name.clone(),
                    meta.labels.as_ref().clone(),
                    now,
                    p.timestamp.to_system_time(),
                    p.window,
                    p.cpu.0,
                    p.memory.0,
                )
                .with_swap(p.swap.map(|b| b.0)),
            )
        })
        .collect()
}

/// PodMetrics for `pods`, in the order given, skipping pods without metrics.
pub fn pod_metrics(
    store: &dyn MetricsReader,
    pods: &[PodMeta],
    now: SystemTime,
) -> Vec<PodMetrics> {
    let keys: Vec<(&str, &str)> = pods
        .iter()
        .map(|p| (p.namespace.as_str(), p.name.as_str()))
        .collect();
    let points = store.pod_metrics(&keys);
    store.record_served(&mut points.iter().flatten().map(|p| p.timestamp));
    points
        .into_iter()
        .zip(pods)
        .filter_map(|(point, meta)| {
            let p = point?;
            let containers = p
                .containers
                .iter()
                .map(|c| {
                    ContainerMetrics::new(c.name.to_string(), c.cpu.0, c.memory.0)
                        .with_swap(c.swap.map(|b| b.0))
                })
                .collect();
            Some(PodMetrics::new(
                meta.namespace.clone(),
                meta.name.clone(),
                meta.labels.clone(),
                now,
                p.timestamp.to_system_time(),
                p.window,
                containers,
            ))
        })
        .collect()
}

/// The NodeMetrics a list (or a watch, on each look) of `api` finds, sorted by name.
pub fn list_nodes(
    store: &dyn MetricsReader,
    metadata: &dyn MetadataSource,
    api: &ApiRequest,
    now: SystemTime,
) -> Vec<NodeMetrics> {
    let mut nodes = metadata.nodes();
    nodes.retain(|n| {
        api.options.label_selector.matches(&n.labels)
            && api.options.field_selector.matches(&ObjectFields {
                name: &n.name,
                namespace: None,
            })
    });
    node_metrics(store, &nodes, now)
}

/// The PodMetrics a list (or a watch, on each look) of `api` finds, sorted by namespace
/// and name.
pub fn list_pods(
    store: &dyn MetricsReader,
    metadata: &dyn MetadataSource,
    api: &ApiRequest,
    now: SystemTime,
) -> Vec<PodMetrics> {
    let mut pods = metadata.pods(api.namespace.as_deref());
    pods.retain(|p| {
        api.options.label_selector.matches(&p.labels)
            && api.options.field_selector.matches(&ObjectFields {
                name: &p.name,
                namespace: Some(&p.namespace),
            })
    });
    pod_metrics(store, &pods, now)
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, time::Duration};

    use kpulse_wire::{
        Bytes, ContainerSample, CpuNanos, NodeBatch, NodeSample, PodSample, UnixNanos,
    };

    use super::*;
    use crate::{
        api::types::{MetricsVersion, PodMetricsList},
        json::encode_json,
        store::{ManualClock, StoreConfig},
    };

    const T0: u64 = 1_700_000_000_000_000_000;

    fn batch(t: u64, node_cpu: u64, pod_cpu: u64) -> NodeBatch {
        batch_with_swap(t, node_cpu, pod_cpu, None, None)
    }

    fn batch_with_swap(
        t: u64,
        node_cpu: u64,
        pod_cpu: u64,
        node_swap: Option<u64>,
        container_swap: Option<u64>,
    ) -> NodeBatch {
        NodeBatch {
            node_name: "n1".into(),
            sent_at: UnixNanos(t),
            node: NodeSample {
                timestamp: UnixNanos(t),
                started_at: None,
                cpu: CpuNanos(node_cpu),
                memory_working_set: Bytes(1 << 30),
                swap: node_swap.map(Bytes),
            },
            pods: vec![PodSample {
                uid: "u1".into(),
                namespace: "ns".into(),
                name: "web".into(),
                containers: vec![ContainerSample {
                    name: "app".into(),
                    timestamp: UnixNanos(t),
                    cgroup_id: None,
                    started_at: None,
                    cpu: CpuNanos(pod_cpu),
                    memory_working_set: Bytes(200 << 20),
                    swap: container_swap.map(Bytes),
                    signals: None,
                }],
                signals: None,
                ready_since: None,
            }],
        }
    }

    #[test]
    fn objects_from_metadata_and_store() {
        let clock = ManualClock::new(UnixNanos(T0));
        let store =
            Store::with_clock(StoreConfig::new(Duration::from_secs(10)), clock).expect("store");
        store.ingest(batch(T0, 0, 0)).expect("ingest");
        store
            .ingest(batch(T0 + 1_000_000_000, 2_000_000_000, 500_000_000))
            .expect("ingest");
        let nodes = vec![
            NodeMeta {
                name: "n1".into(),
                labels: std::sync::Arc::new(BTreeMap::from([("zone".into(), "a".into())])),
            },
            NodeMeta {
                name: "gone".into(),
                labels: Default::default(),
            },
        ];
        let (tx, rx) = std::sync::mpsc::channel();
        store.observe_served(move |age| tx.send(age).expect("receiver alive"));
        let now = UnixNanos(T0 + 2_000_000_000).to_system_time();
        let n = node_metrics(&store, &nodes, now);
        assert_eq!(n.len(), 1, "a node without metrics is left out");
        assert_eq!(n[0].usage.cpu.canonical(), "2");
        assert_eq!(n[0].window, Duration::from_secs(1));
        let pods = vec![PodMeta {
            namespace: "ns".into(),
            name: "web".into(),
            labels: BTreeMap::new(),
        }];
        let p = pod_metrics(&store, &pods, now);
        let json = String::from_utf8(
            encode_json(&PodMetricsList::new(MetricsVersion::V1beta1, p)).expect("json"),
        )
        .expect("utf8");
        assert!(
            json.contains(
                r#""containers":[{"name":"app","usage":{"cpu":"500m","memory":"200Mi"}}]"#
            ),
            "{json}"
        );
        assert!(json.contains(r#""window":"1s""#), "{json}");
        // One age per object served (the store's clock is still at T0, behind the points).
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), [Duration::ZERO; 2]);
    }

    /// Swap is served as kubelet's `usage.swap` where the agent sent it (a node with swap),
    /// and there is no `swap` key at all where it did not.
    #[test]
    fn swap_is_served_only_where_the_agent_sent_it() {
        let meta_nodes = vec![NodeMeta {
            name: "n1".into(),
            labels: Default::default(),
        }];
        let meta_pods = vec![PodMeta {
            namespace: "ns".into(),
            name: "web".into(),
            labels: BTreeMap::new(),
        }];
        let now = UnixNanos(T0 + 2_000_000_000).to_system_time();
        for (swap, node_json, pod_json) in [
            (
                Some((3u64 << 30, 64u64 << 20)),
                r#""usage":{"cpu":"2","memory":"1Gi","swap":"3Gi"}"#,
                r#""usage":{"cpu":"500m","memory":"200Mi","swap":"64Mi"}"#,
            ),
            (
                Some((0, 0)),
                r#""usage":{"cpu":"2","memory":"1Gi","swap":"0"}"#,
                r#""usage":{"cpu":"500m","memory":"200Mi","swap":"0"}"#,
            ),
            (
                None,
                r#""usage":{"cpu":"2","memory":"1Gi"}"#,
                r#""usage":{"cpu":"500m","memory":"200Mi"}"#,
            ),
        ] {
            let clock = ManualClock::new(UnixNanos(T0));
            let store =
                Store::with_clock(StoreConfig::new(Duration::from_secs(10)), clock).expect("store");
            let (ns, cs) = (swap.map(|s| s.0), swap.map(|s| s.1));
            store
                .ingest(batch_with_swap(T0, 0, 0, ns, cs))
                .expect("ingest");
            store
                .ingest(batch_with_swap(
                    T0 + 1_000_000_000,
                    2_000_000_000,
                    500_000_000,
                    ns,
                    cs,
                ))
                .expect("ingest");
            let n = node_metrics(&store, &meta_nodes, now);
            let json = String::from_utf8(encode_json(&n[0]).expect("json")).expect("utf8");
            assert!(json.contains(node_json), "{json}");
            let p = pod_metrics(&store, &meta_pods, now);
            let json = String::from_utf8(encode_json(&p[0]).expect("json")).expect("utf8");
            assert!(json.contains(pod_json), "{json}");
        }
    }
}
