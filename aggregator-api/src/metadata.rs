//! Node and pod metadata (names, labels) that API objects carry and selectors match on.
//! metrics-server takes it from informers; here it comes through [`MetadataSource`]:
//!
//! - [`StreamMetadata`], in the server: fed by the agents' sessions (`session`), each node's
//!   labels from its Hello and its pods from its Snapshot and Updates; with a Kubernetes
//!   API, nodes and their labels come from the Node watch instead ([`crate::nodes`]) once
//!   it has listed them;
//! - [`StaticMetadata`]: a fixed document replaced whole, for tests.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use arc_swap::ArcSwap;
use parking_lot::RwLock;
use serde::Deserialize;

/// A node's metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct NodeMeta {
    /// Node name.
    pub name: String,
    /// Labels, shared: a list of thousands of nodes does not copy them.
    #[serde(default)]
    pub labels: Arc<BTreeMap<String, String>>,
}

/// A pod's metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct PodMeta {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Where API handlers look up objects. Lists come back sorted as metrics-server sorts
/// them (nodes by name; pods by namespace, then name).
pub trait MetadataSource: Send + Sync {
    /// One node.
    fn node(&self, name: &str) -> Option<NodeMeta>;
    /// One pod.
    fn pod(&self, namespace: &str, name: &str) -> Option<PodMeta>;
    /// All nodes.
    fn nodes(&self) -> Vec<NodeMeta>;
    /// All pods, or those of one namespace.
    fn pods(&self, namespace: Option<&str>) -> Vec<PodMeta>;
}

/// The cluster's own list of nodes ([`crate::nodes::ClusterNodes`], from the Kubernetes
/// API), which decides which nodes exist and their labels once it is complete.
pub trait ClusterNodeList: std::fmt::Debug + Send + Sync {
    /// Whether a complete list has been seen: before that it is not authoritative.
    fn listed(&self) -> bool;
    /// One node, if the API has it.
    fn node(&self, name: &str) -> Option<NodeMeta>;
    /// Every node, sorted by name.
    fn nodes(&self) -> Vec<NodeMeta>;
}

/// The document [`StaticMetadata`] loads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataDocument {
    /// Nodes.
    #[serde(default)]
    pub nodes: Vec<NodeMeta>,
    /// Pods.
    #[serde(default)]
    pub pods: Vec<PodMeta>,
}

#[derive(Debug, Default)]
struct Snapshot {
    nodes: BTreeMap<String, NodeMeta>,
    pods: BTreeMap<(String, String), PodMeta>,
}

/// Metadata held in memory and replaced whole (readers never block): a test fixture.
#[derive(Debug, Default)]
pub struct StaticMetadata {
    current: ArcSwap<Snapshot>,
}

impl StaticMetadata {
    /// Empty.
    pub fn new() -> Arc<StaticMetadata> {
        Arc::new(StaticMetadata::default())
    }

    /// Replaces everything with `doc`. Duplicate names: the last one wins.
    pub fn replace(&self, doc: MetadataDocument) {
        let mut s = Snapshot::default();
        for n in doc.nodes {
            s.nodes.insert(n.name.clone(), n);
        }
        for p in doc.pods {
            s.pods.insert((p.namespace.clone(), p.name.clone()), p);
        }
        self.current.store(Arc::new(s));
    }
}

impl MetadataSource for StaticMetadata {
    fn node(&self, name: &str) -> Option<NodeMeta> {
        self.current.load().nodes.get(name).cloned()
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<PodMeta> {
        self.current
            .load()
            .pods
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    fn nodes(&self) -> Vec<NodeMeta> {
        self.current.load().nodes.values().cloned().collect()
    }

    fn pods(&self, namespace: Option<&str>) -> Vec<PodMeta> {
        let s = self.current.load();
        match namespace {
            None => s.pods.values().cloned().collect(),
            Some(ns) => namespace_range(&s.pods, ns)
                .map(|(_, p)| p.clone())
                .collect(),
        }
    }
}

/// Pods of one namespace, looked up from a sorted `(namespace, name)` map without scanning
/// other namespaces.
fn namespace_range<'a, V>(
    map: &'a BTreeMap<(String, String), V>,
    namespace: &'a str,
) -> impl Iterator<Item = (&'a (String, String), &'a V)> + 'a {
    map.range((namespace.to_string(), String::new())..)
        .take_while(move |((ns, _), _)| ns == namespace)
}

/// Metadata reported by the agents' sessions, per node: the node's labels (from its Hello)
/// and the pods it runs (uid, namespace, name, labels; from its Snapshot and Updates).
///
/// Lists come back sorted (nodes by name, pods by namespace then name) from `BTreeMap`s;
/// one namespace's pods are a range of the `(namespace, name)` index, not a scan. Writes
/// happen only when metadata changes (a Hello, a Snapshot, an Update with upserts or
/// removals), so a `parking_lot::RwLock` is enough: readers share it and never wait for
/// each other, and a writer holds it for the few entries it changes.
///
/// # Ownership
///
/// Each entry of the pod index is *claimed* by a `(node, uid)`. When two nodes report
/// the same `namespace/name` (a pod deleted on one node and recreated on another before the
/// first noticed), the most recent report wins and the older claim waits behind it; a
/// removal takes away only the claim of its own node and uid, so a late removal from the
/// old node never hides the pod the new node runs (and when the winner goes, the older
/// claim still standing is served again).
#[derive(Debug, Default)]
pub struct StreamMetadata {
    index: RwLock<Index>,
    /// The API's nodes: once listed, which nodes exist and their labels.
    cluster: Option<Arc<dyn ClusterNodeList>>,
}

#[derive(Debug, Default)]
struct Index {
    nodes: BTreeMap<String, NodeEntry>,
    /// `(namespace, name)` → claims, oldest first; the last one is served.
    pods: BTreeMap<(String, String), Vec<Claim>>,
}

#[derive(Debug, Default)]
struct NodeEntry {
    labels: Arc<BTreeMap<String, String>>,
    /// uid → the pod's key in [`Index::pods`].
    pods: HashMap<String, (String, String)>,
}

#[derive(Debug)]
struct Claim {
    node: String,
    uid: String,
    labels: BTreeMap<String, String>,
}

impl Index {
    /// Takes back the claim of `node`'s pod `uid`, if it has one.
    fn unclaim(&mut self, node: &str, uid: &str) {
        let Some(key) = self.nodes.get_mut(node).and_then(|n| n.pods.remove(uid)) else {
            return;
        };
        if let Some(claims) = self.pods.get_mut(&key) {
            claims.retain(|c| !(c.node == node && c.uid == uid));
            if claims.is_empty() {
                self.pods.remove(&key);
            }
        }
    }

    /// Records `node`'s report of `pod`: the most recent claim of its key.
    fn claim(&mut self, node: &str, pod: &kpulse_wire::stream::PodMeta) {
        let key = (pod.namespace.clone(), pod.name.clone());
        let entry = self.nodes.entry(node.to_string()).or_default();
        if entry.pods.get(&pod.uid) != Some(&key) {
            // A new pod, or (never in Kubernetes) a uid under another name.
            self.unclaim(node, &pod.uid);
        }
        self.nodes
            .entry(node.to_string())
            .or_default()
            .pods
            .insert(pod.uid.clone(), key.clone());
        let claims = self.pods.entry(key).or_default();
        claims.retain(|c| !(c.node == node && c.uid == pod.uid));
        claims.push(Claim {
            node: node.to_string(),
            uid: pod.uid.clone(),
            labels: pod.labels.clone(),
        });
    }

    fn pod_meta(key: &(String, String), claims: &[Claim]) -> Option<PodMeta> {
        claims.last().map(|c| PodMeta {
            namespace: key.0.clone(),
            name: key.1.clone(),
            labels: c.labels.clone(),
        })
    }
}

impl StreamMetadata {
    /// Empty; nodes from the agents only.
    pub fn new() -> Arc<StreamMetadata> {
        Arc::new(StreamMetadata::default())
    }

    /// Empty; nodes (existence and labels) from `cluster` once it has listed them, as
    /// metrics-server takes them from its Node informer; from the agents until then.
    pub fn with_cluster_nodes(cluster: Arc<dyn ClusterNodeList>) -> Arc<StreamMetadata> {
        Arc::new(StreamMetadata {
            index: RwLock::default(),
            cluster: Some(cluster),
        })
    }

    /// The API's nodes, once they are authoritative.
    fn listed_cluster(&self) -> Option<&dyn ClusterNodeList> {
        self.cluster.as_deref().filter(|c| c.listed())
    }

    /// Records a node (its Hello): creates it, or replaces its labels and keeps its pods.
    pub fn set_node(&self, node: &str, labels: &BTreeMap<String, String>) {
        let mut index = self.index.write();
        let entry = index.nodes.entry(node.to_string()).or_default();
        if *entry.labels != *labels {
            entry.labels = Arc::new(labels.clone());
        }
    }

    /// Replaces the pods `node` runs (its Snapshot). A pod listed as before (same uid,
    /// name and labels) keeps its place among claims of its name; the others are new
    /// reports. Creates the node if needed.
    pub fn replace_pods(&self, node: &str, pods: &[kpulse_wire::stream::PodMeta]) {
        let mut index = self.index.write();
        let keep: HashMap<&str, &kpulse_wire::stream::PodMeta> =
            pods.iter().map(|p| (p.uid.as_str(), p)).collect();
        let gone: Vec<String> = index
            .nodes
            .get(node)
            .map(|n| {
                n.pods
                    .keys()
                    .filter(|uid| !keep.contains_key(uid.as_str()))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for uid in gone {
            index.unclaim(node, &uid);
        }
        index.nodes.entry(node.to_string()).or_default();
        for pod in pods {
            let key = (pod.namespace.clone(), pod.name.clone());
            let unchanged = index
                .nodes
                .get(node)
                .is_some_and(|n| n.pods.get(&pod.uid) == Some(&key))
                && index.pods.get(&key).is_some_and(|claims| {
                    claims
                        .iter()
                        .any(|c| c.node == node && c.uid == pod.uid && c.labels == pod.labels)
                });
            if !unchanged {
                index.claim(node, pod);
            }
        }
    }

    /// Applies `node`'s changes (an Update): `upserts` are reports (new pods, or new
    /// labels), then `removed` (uids) takes back this node's claims of those pods.
    pub fn update_pods(
        &self,
        node: &str,
        upserts: &[kpulse_wire::stream::PodMeta],
        removed: &[String],
    ) {
        if upserts.is_empty() && removed.is_empty() {
            return;
        }
        let mut index = self.index.write();
        for pod in upserts {
            index.claim(node, pod);
        }
        for uid in removed {
            index.unclaim(node, uid);
        }
    }

    /// Forgets a node and every claim it holds. True if it was known.
    pub fn remove_node(&self, node: &str) -> bool {
        let mut index = self.index.write();
        let uids: Vec<String> = match index.nodes.get(node) {
            Some(n) => n.pods.keys().cloned().collect(),
            None => return false,
        };
        for uid in uids {
            index.unclaim(node, &uid);
        }
        index.nodes.remove(node);
        true
    }

    /// The `(namespace, name)` of the pods `node` reports, sorted.
    pub fn pods_of(&self, node: &str) -> Vec<(String, String)> {
        let index = self.index.read();
        let mut keys: Vec<(String, String)> = index
            .nodes
            .get(node)
            .map(|n| n.pods.values().cloned().collect())
            .unwrap_or_default();
        keys.sort();
        keys
    }

    /// The names of the nodes known, sorted.
    pub fn node_names(&self) -> Vec<String> {
        self.index.read().nodes.keys().cloned().collect()
    }
}

impl MetadataSource for StreamMetadata {
    fn node(&self, name: &str) -> Option<NodeMeta> {
        if let Some(cluster) = self.listed_cluster() {
            return cluster.node(name);
        }
        self.index.read().nodes.get(name).map(|n| NodeMeta {
            name: name.to_string(),
            labels: n.labels.clone(),
        })
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<PodMeta> {
        let key = (namespace.to_string(), name.to_string());
        let index = self.index.read();
        index
            .pods
            .get(&key)
            .and_then(|claims| Index::pod_meta(&key, claims))
    }

    fn nodes(&self) -> Vec<NodeMeta> {
        if let Some(cluster) = self.listed_cluster() {
            return cluster.nodes();
        }
        self.index
            .read()
            .nodes
            .iter()
            .map(|(name, n)| NodeMeta {
                name: name.clone(),
                labels: n.labels.clone(),
            })
            .collect()
    }

    fn pods(&self, namespace: Option<&str>) -> Vec<PodMeta> {
        let index = self.index.read();
        match namespace {
            None => index
                .pods
                .iter()
                .filter_map(|(k, c)| Index::pod_meta(k, c))
                .collect(),
            Some(ns) => namespace_range(&index.pods, ns)
                .filter_map(|(k, c)| Index::pod_meta(k, c))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> MetadataDocument {
        serde_json::from_str(
            r#"{"nodes":[{"name":"b"},{"name":"a","labels":{"zone":"x"}}],
                "pods":[{"namespace":"ns2","name":"p"},{"namespace":"ns1","name":"z"},
                        {"namespace":"ns1","name":"a","labels":{"app":"web"}},{"namespace":"ns10","name":"q"}]}"#,
        )
        .expect("doc")
    }

    #[test]
    fn lookups_and_sorted_lists() {
        let m = StaticMetadata::new();
        m.replace(doc());
        assert_eq!(m.node("a").expect("a").labels["zone"], "x");
        assert!(m.node("c").is_none());
        let names: Vec<String> = m.nodes().into_iter().map(|n| n.name).collect();
        assert_eq!(names, ["a", "b"]);
        let pods: Vec<(String, String)> = m
            .pods(None)
            .into_iter()
            .map(|p| (p.namespace, p.name))
            .collect();
        assert_eq!(
            pods,
            [
                ("ns1".into(), "a".into()),
                ("ns1".into(), "z".into()),
                ("ns10".into(), "q".into()),
                ("ns2".into(), "p".into())
            ]
        );
        let ns1: Vec<String> = m.pods(Some("ns1")).into_iter().map(|p| p.name).collect();
        assert_eq!(ns1, ["a", "z"], "ns10 is another namespace");
        assert_eq!(m.pod("ns1", "a").expect("pod").labels["app"], "web");
    }

    fn wire_pod(
        uid: &str,
        ns: &str,
        name: &str,
        labels: &[(&str, &str)],
    ) -> kpulse_wire::stream::PodMeta {
        kpulse_wire::stream::PodMeta {
            uid: uid.into(),
            namespace: ns.into(),
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ready_since: None,
        }
    }

    fn keys(pods: Vec<PodMeta>) -> Vec<(String, String)> {
        pods.into_iter().map(|p| (p.namespace, p.name)).collect()
    }

    fn key(ns: &str, name: &str) -> (String, String) {
        (ns.into(), name.into())
    }

    #[test]
    fn stream_metadata_lists_sorted_and_by_namespace() {
        let m = StreamMetadata::new();
        m.set_node("b", &BTreeMap::new());
        m.set_node("a", &BTreeMap::from([("zone".into(), "x".into())]));
        m.replace_pods(
            "a",
            &[
                wire_pod("u1", "ns2", "p", &[]),
                wire_pod("u2", "ns1", "z", &[]),
                wire_pod("u3", "ns1", "a", &[("app", "web")]),
            ],
        );
        m.replace_pods("b", &[wire_pod("u4", "ns10", "q", &[])]);
        let names: Vec<String> = m.nodes().into_iter().map(|n| n.name).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(m.node("a").expect("a").labels["zone"], "x");
        assert_eq!(
            keys(m.pods(None)),
            [
                key("ns1", "a"),
                key("ns1", "z"),
                key("ns10", "q"),
                key("ns2", "p")
            ]
        );
        assert_eq!(
            keys(m.pods(Some("ns1"))),
            [key("ns1", "a"), key("ns1", "z")],
            "ns10 is another namespace"
        );
        assert!(m.pods(Some("ns")).is_empty());
        assert_eq!(m.pod("ns1", "a").expect("pod").labels["app"], "web");

        // A Snapshot replaces the node's pods; a Hello keeps them.
        m.replace_pods("a", &[wire_pod("u3", "ns1", "a", &[("app", "api")])]);
        m.set_node("a", &BTreeMap::new());
        assert_eq!(keys(m.pods(None)), [key("ns1", "a"), key("ns10", "q")]);
        assert_eq!(m.pod("ns1", "a").expect("pod").labels["app"], "api");
        assert!(m.node("a").expect("a").labels.is_empty());

        // Updates: upserts, then removals.
        m.update_pods("a", &[wire_pod("u5", "ns1", "b", &[])], &["u3".into()]);
        assert_eq!(keys(m.pods(Some("ns1"))), [key("ns1", "b")]);
        assert!(m.remove_node("b"));
        assert!(!m.remove_node("b"));
        assert_eq!(m.node_names(), ["a"]);
        assert_eq!(keys(m.pods(None)), [key("ns1", "b")]);
    }

    #[test]
    fn the_most_recent_report_wins_and_removals_take_only_their_own_claim() {
        let m = StreamMetadata::new();
        let owner = |m: &StreamMetadata| m.pod("ns", "web").map(|p| p.labels["on"].clone());
        // The pod moved from a to b: b reported it last.
        m.replace_pods("a", &[wire_pod("u1", "ns", "web", &[("on", "a")])]);
        m.replace_pods("b", &[wire_pod("u2", "ns", "web", &[("on", "b")])]);
        assert_eq!(owner(&m).as_deref(), Some("b"));
        assert_eq!(m.pods(None).len(), 1, "one name, listed once");
        // a notices late: its removal does not hide b's pod.
        m.update_pods("a", &[], &["u1".into()]);
        assert_eq!(owner(&m).as_deref(), Some("b"));
        // An upsert is a report too.
        m.update_pods("a", &[wire_pod("u1", "ns", "web", &[("on", "a")])], &[]);
        assert_eq!(owner(&m).as_deref(), Some("a"));
        // A Snapshot re-listing an unchanged pod is not a newer report.
        m.replace_pods("b", &[wire_pod("u2", "ns", "web", &[("on", "b")])]);
        assert_eq!(owner(&m).as_deref(), Some("a"));
        // When the winner goes, the claim still standing is served again.
        m.update_pods("a", &[], &["u1".into()]);
        assert_eq!(owner(&m).as_deref(), Some("b"));
        m.update_pods("a", &[wire_pod("u1", "ns", "web", &[("on", "a")])], &[]);
        assert!(m.remove_node("a"));
        assert_eq!(owner(&m).as_deref(), Some("b"));
        // A removal of a uid the node does not have does nothing.
        m.update_pods("b", &[], &["u1".into()]);
        assert_eq!(owner(&m).as_deref(), Some("b"));
        m.update_pods("b", &[], &["u2".into()]);
        assert_eq!(owner(&m), None);
        assert!(m.pods(None).is_empty());
    }

    #[test]
    fn nodes_come_from_the_api_once_it_has_listed_them() {
        use crate::nodes::ClusterNodes;
        use crate::watched::Change;
        use std::sync::Arc;
        let cluster = ClusterNodes::new();
        let m = StreamMetadata::with_cluster_nodes(cluster.clone());
        // An agent's node, with the labels it sent (none, in cluster mode).
        m.set_node("a", &BTreeMap::new());
        // Before the list: the agents' view.
        cluster.apply(Change::Upsert {
            name: "a".into(),
            value: Arc::new(BTreeMap::from([("zone".into(), "x".into())])),
        });
        assert!(m.node("a").expect("a").labels.is_empty());
        assert!(m.node("b").is_none());
        cluster.apply(Change::Replace(BTreeMap::from([
            (
                "a".to_string(),
                Arc::new(BTreeMap::from([("zone".to_string(), "x".to_string())])),
            ),
            ("b".to_string(), Arc::new(BTreeMap::new())),
        ])));
        // After it: the API's labels, and a node without an agent exists.
        assert_eq!(m.node("a").expect("a").labels["zone"], "x");
        assert!(m.node("b").is_some(), "a node without an agent exists");
        let names: Vec<String> = m.nodes().into_iter().map(|n| n.name).collect();
        assert_eq!(names, ["a", "b"]);
        // A name only an agent reports is not a node of the cluster.
        m.set_node("ghost", &BTreeMap::new());
        assert!(m.node("ghost").is_none());
        cluster.apply(Change::Delete { name: "a".into() });
        assert!(m.node("a").is_none());
    }
}
