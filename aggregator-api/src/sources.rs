//! What the API serves from: the agents' data, and where it is missing, the kubelet
//! fallback's ([`crate::kubelet`]). [`Sources`] is the API's [`MetricsReader`] and
//! [`MetadataSource`]: a node or pod is served from its agent's data whenever that has a
//! servable point, and from the kubelet's otherwise; the lists are the union of both,
//! each object once. Nodes come from the cluster's Node list (through the agents'
//! metadata), so a node without an agent exists either way.

use std::sync::Arc;

use kpulse_wire::UnixNanos;

use crate::{
    api::objects::MetricsReader,
    metadata::{MetadataSource, NodeMeta, PodMeta},
    store::{NodeMetricsPoint, PodMetricsPoint, PodSignalsPoint},
};

/// The agents' reader and metadata, and the fallback's.
pub struct Sources {
    agents: (Arc<dyn MetricsReader>, Arc<dyn MetadataSource>),
    kubelets: Option<(Arc<dyn MetricsReader>, Arc<dyn MetadataSource>)>,
}

impl Sources {
    /// The agents' data, and the kubelets' where it has nothing (`None`: no fallback).
    pub fn new(
        agents: (Arc<dyn MetricsReader>, Arc<dyn MetadataSource>),
        kubelets: Option<(Arc<dyn MetricsReader>, Arc<dyn MetadataSource>)>,
    ) -> Arc<Sources> {
        Arc::new(Sources { agents, kubelets })
    }
}

/// `first`'s answers, with each `None` asked of `second`.
fn fill<K: Copy, T>(
    keys: &[K],
    mut first: Vec<Option<T>>,
    second: impl FnOnce(&[K]) -> Vec<Option<T>>,
) -> Vec<Option<T>> {
    let missing: Vec<usize> = (0..first.len()).filter(|&i| first[i].is_none()).collect();
    if missing.is_empty() {
        return first;
    }
    let asked: Vec<K> = missing.iter().map(|&i| keys[i]).collect();
    for (i, answer) in missing.into_iter().zip(second(&asked)) {
        first[i] = answer;
    }
    first
}

impl MetricsReader for Sources {
    fn node_metrics(&self, names: &[&str]) -> Vec<Option<NodeMetricsPoint>> {
        let first = self.agents.0.node_metrics(names);
        match &self.kubelets {
            Some((k, _)) => fill(names, first, |rest| k.node_metrics(rest)),
            None => first,
        }
    }

    fn pod_metrics(&self, pods: &[(&str, &str)]) -> Vec<Option<PodMetricsPoint>> {
        let first = self.agents.0.pod_metrics(pods);
        match &self.kubelets {
            Some((k, _)) => fill(pods, first, |rest| k.pod_metrics(rest)),
            None => first,
        }
    }

    /// Pressure and throttling come from agents only: kubelets do not report them.
    fn pod_signals(&self, pods: &[(&str, &str)]) -> Vec<Option<PodSignalsPoint>> {
        self.agents.0.pod_signals(pods)
    }

    fn record_served(&self, timestamps: &mut dyn Iterator<Item = UnixNanos>) {
        // The agents' store holds the freshness histogram's observer.
        self.agents.0.record_served(timestamps);
    }
}

impl MetadataSource for Sources {
    fn node(&self, name: &str) -> Option<NodeMeta> {
        self.agents.1.node(name)
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<PodMeta> {
        self.agents.1.pod(namespace, name).or_else(|| {
            self.kubelets
                .as_ref()
                .and_then(|(_, m)| m.pod(namespace, name))
        })
    }

    fn nodes(&self) -> Vec<NodeMeta> {
        self.agents.1.nodes()
    }

    /// Both lists merged in their order (namespace, then name); a pod in both is the
    /// agents'.
    fn pods(&self, namespace: Option<&str>) -> Vec<PodMeta> {
        let agents = self.agents.1.pods(namespace);
        let Some((_, kubelets)) = &self.kubelets else {
            return agents;
        };
        let others = kubelets.pods(namespace);
        if others.is_empty() {
            return agents;
        }
        let mut out = Vec::with_capacity(agents.len() + others.len());
        let (mut a, mut b) = (agents.into_iter().peekable(), others.into_iter().peekable());
        loop {
            let order = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) => (&x.namespace, &x.name).cmp(&(&y.namespace, &y.name)),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => break,
            };
            match order {
                std::cmp::Ordering::Less => out.extend(a.next()),
                std::cmp::Ordering::Greater => out.extend(b.next()),
                std::cmp::Ordering::Equal => {
                    out.extend(a.next());
                    b.next();
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        metadata::{MetadataDocument, StaticMetadata},
        store::{Store, StoreConfig},
    };
    use kpulse_wire::{Bytes, ContainerSample, CpuNanos, NodeBatch, NodeSample, PodSample};
    use std::time::{Duration, SystemTime};

    fn now() -> u64 {
        UnixNanos::from_system_time(SystemTime::now()).0
    }

    /// A node batch with one single-container pod per `(namespace, name, cpu)`.
    fn batch(node: &str, t: u64, pods: &[(&str, &str, u64)], cpu: u64) -> NodeBatch {
        NodeBatch {
            node_name: node.into(),
            sent_at: UnixNanos(t),
            node: NodeSample {
                timestamp: UnixNanos(t),
                started_at: None,
                cpu: CpuNanos(cpu),
                memory_working_set: Bytes(1),
                swap: None,
            },
            pods: pods
                .iter()
                .map(|(ns, name, c)| PodSample {
                    uid: format!("{ns}/{name}"),
                    namespace: ns.to_string(),
                    name: name.to_string(),
                    containers: vec![ContainerSample {
                        name: "c".into(),
                        timestamp: UnixNanos(t),
                        cgroup_id: None,
                        started_at: None,
                        cpu: CpuNanos(*c),
                        memory_working_set: Bytes(1),
                        swap: None,
                        signals: None,
                    }],
                    signals: None,
                    ready_since: None,
                })
                .collect(),
        }
    }

    fn store(node: &str, pods: &[(&str, &str, u64)], per_second: u64) -> Arc<Store> {
        let s = Store::new(StoreConfig::new(Duration::from_secs(60))).expect("store");
        let t = now();
        let at = |k: u64| {
            pods.iter()
                .map(|(a, b, c)| (*a, *b, c * k))
                .collect::<Vec<_>>()
        };
        s.ingest(batch(node, t - 2_000_000_000, &at(0), 0))
            .expect("ingest");
        s.ingest(batch(node, t - 1_000_000_000, &at(1), per_second))
            .expect("ingest");
        Arc::new(s)
    }

    fn metadata(nodes: &[&str], pods: &[(&str, &str)]) -> Arc<StaticMetadata> {
        let m = StaticMetadata::new();
        let doc: MetadataDocument = serde_json::from_value(serde_json::json!({
            "nodes": nodes.iter().map(|n| serde_json::json!({"name": n})).collect::<Vec<_>>(),
            "pods": pods.iter().map(|(ns, n)| serde_json::json!({"namespace": ns, "name": n})).collect::<Vec<_>>(),
        }))
        .expect("doc");
        m.replace(doc);
        m
    }

    /// Each object from the agents where they have it, from the kubelets otherwise; lists
    /// hold every pod once, in order.
    #[test]
    fn agents_first_kubelets_where_agents_have_nothing() {
        let agents = store(
            "a",
            &[("ns", "both", 1_000_000), ("ns", "z-agent", 2_000_000)],
            7_000_000,
        );
        let kubelets = store(
            "b",
            &[("ns", "both", 9_000_000), ("a-ns", "k", 3_000_000)],
            5_000_000,
        );
        let s = Sources::new(
            (
                agents,
                metadata(&["a", "b"], &[("ns", "both"), ("ns", "z-agent")]),
            ),
            Some((kubelets, metadata(&[], &[("ns", "both"), ("a-ns", "k")]))),
        );
        let nodes = s.node_metrics(&["a", "b", "c"]);
        assert_eq!(nodes[0].as_ref().expect("a").cpu.0, 7_000_000);
        assert_eq!(nodes[1].as_ref().expect("b").cpu.0, 5_000_000);
        assert!(nodes[2].is_none());
        let pods = s.pod_metrics(&[("ns", "both"), ("a-ns", "k"), ("x", "y")]);
        assert_eq!(
            pods[0].as_ref().expect("both").containers[0].cpu.0,
            1_000_000
        );
        assert_eq!(pods[1].as_ref().expect("k").containers[0].cpu.0, 3_000_000);
        assert!(pods[2].is_none());
        let listed: Vec<(String, String)> = s
            .pods(None)
            .into_iter()
            .map(|p| (p.namespace, p.name))
            .collect();
        assert_eq!(
            listed,
            [("a-ns", "k"), ("ns", "both"), ("ns", "z-agent")]
                .map(|(a, b)| (a.to_string(), b.to_string()))
        );
        assert!(s.pod("a-ns", "k").is_some());
        assert_eq!(s.pods(Some("a-ns")).len(), 1);
        assert_eq!(s.nodes().len(), 2);
    }
}
