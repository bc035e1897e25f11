//! Node and pod metadata (names, labels) that API objects carry and selectors match on.
//! metrics-server takes it from informers; here it comes through [`MetadataSource`]:
//!
//! - [`StreamMetadata`], in the server: fed by the agents' sessions (`session`), each node's
//!   labels from its Hello and its pods from its Snapshot and Updates; with a Kubernetes
//!   API, nodes and their labels come from the Node watch instead ([`crate::nodes`]) once
//!   it has listed them;
//! - [`StaticMetadata`]: a fixed document replaced whole, for tests.

mod labels;

use std::{
    cmp::Ordering,
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

use arc_swap::ArcSwap;
use kpulse_wire::UnixNanos;
use parking_lot::RwLock;
use serde::Deserialize;

use crate::store::PodKey;
use labels::{LabelSets, Labels};

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

/// A pod a node announced (a Snapshot's or an Update's `PodMeta`), as [`StreamMetadata`]
/// takes it: its uid and `namespace/name` are allocated once here, and the index and the
/// node's session (`session`) then share those allocations.
#[derive(Clone, Debug)]
pub struct Announced {
    /// `metadata.uid`.
    pub uid: Arc<str>,
    /// `namespace/name`.
    pub key: PodKey,
    /// Labels, as they came; the index keeps each distinct set once.
    pub labels: BTreeMap<String, String>,
    /// When the pod last became Ready, while it is (the session's, not the index's).
    pub ready_since: Option<UnixNanos>,
}

impl Announced {
    /// `pod`, or `None` for a pod the store could never serve (no uid, namespace or name).
    pub fn new(pod: kpulse_wire::stream::PodMeta) -> Option<Announced> {
        if pod.uid.is_empty() {
            return None;
        }
        Some(Announced {
            key: PodKey::new(&pod.namespace, &pod.name)?,
            uid: Arc::from(pod.uid),
            labels: pod.labels,
            ready_since: pod.ready_since,
        })
    }
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
///
/// # Memory
///
/// A pod's strings are allocated once: its uid and `namespace/name` ([`Announced`]) are
/// shared by its claim, its node's uid map and the node's session; a node's name by all
/// of its claims; equal labels by every pod that carries them ([`LabelSets`]).
#[derive(Debug, Default)]
pub struct StreamMetadata {
    index: RwLock<Index>,
    /// The API's nodes: once listed, which nodes exist and their labels.
    cluster: Option<Arc<dyn ClusterNodeList>>,
}

#[derive(Debug, Default)]
struct Index {
    nodes: BTreeMap<Arc<str>, NodeEntry>,
    /// `(namespace, name)` → claims, oldest first; the last one is served.
    pods: BTreeMap<ByName, Vec<Claim>>,
    /// The claims' labels, each distinct set once.
    labels: LabelSets,
}

#[derive(Debug, Default)]
struct NodeEntry {
    labels: Arc<BTreeMap<String, String>>,
    /// uid → the pod's key in [`Index::pods`].
    pods: HashMap<Arc<str>, PodKey>,
}

#[derive(Debug)]
struct Claim {
    node: Arc<str>,
    uid: Arc<str>,
    labels: Labels,
}

impl Claim {
    fn is(&self, node: &str, uid: &str) -> bool {
        *self.node == *node && *self.uid == *uid
    }
}

/// A [`PodKey`] ordered by namespace, then name, as lists are sorted (`namespace/name` as
/// one string sorts `ns-1/a` before `ns/a`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct ByName(PodKey);

impl Ord for ByName {
    fn cmp(&self, other: &ByName) -> Ordering {
        (self.0.namespace(), self.0.name()).cmp(&(other.0.namespace(), other.0.name()))
    }
}

impl PartialOrd for ByName {
    fn partial_cmp(&self, other: &ByName) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Index {
    /// `node`'s entry (created if needed) and the name its claims share.
    fn node_entry(&mut self, node: &str) -> (Arc<str>, &mut NodeEntry) {
        let name = match self.nodes.get_key_value(node) {
            Some((name, _)) => name.clone(),
            None => Arc::from(node),
        };
        let entry = self.nodes.entry(name.clone()).or_default();
        (name, entry)
    }

    /// Takes back the claim of `node`'s pod `uid`, if it has one.
    fn unclaim(&mut self, node: &str, uid: &str) {
        let Some(key) = self.nodes.get_mut(node).and_then(|n| n.pods.remove(uid)) else {
            return;
        };
        let key = ByName(key);
        if let Some(claims) = self.pods.get_mut(&key) {
            claims.retain(|c| !c.is(node, uid));
            if claims.is_empty() {
                self.pods.remove(&key);
            }
        }
    }

    /// Whether `node` claims `pod` already as it is (same uid, name and labels). If so,
    /// `pod` takes the index's copies of its uid and key.
    fn adopt_unchanged(&self, node: &str, pod: &mut Announced) -> bool {
        let Some((uid, key)) = self
            .nodes
            .get(node)
            .and_then(|n| n.pods.get_key_value(&*pod.uid))
        else {
            return false;
        };
        if *key != pod.key {
            return false;
        }
        let key = ByName(key.clone());
        let unchanged = self.pods.get(&key).is_some_and(|claims| {
            claims
                .iter()
                .any(|c| c.is(node, uid) && c.labels.matches(&pod.labels))
        });
        if unchanged {
            pod.uid = uid.clone();
            pod.key = key.0;
        }
        unchanged
    }

    /// Records `node`'s report of `pod`: the most recent claim of its key. `pod` takes the
    /// index's copies of its uid and key where the index has them.
    fn claim(&mut self, node: &str, pod: &mut Announced) {
        let (node_name, entry) = self.node_entry(node);
        match entry.pods.get_key_value(&*pod.uid) {
            Some((uid, key)) if *key == pod.key => {
                pod.uid = uid.clone();
                pod.key = key.clone();
            }
            // A uid under another name (never in Kubernetes).
            Some(_) => self.unclaim(node, &pod.uid),
            None => {}
        }
        let key = ByName(pod.key.clone());
        // Another node's claim of the same name: share its key.
        if let Some((shared, _)) = self.pods.get_key_value(&key) {
            pod.key = shared.0.clone();
        }
        self.node_entry(node)
            .1
            .pods
            .insert(pod.uid.clone(), pod.key.clone());
        let claims = self.pods.entry(key).or_default();
        let previous = claims
            .iter()
            .position(|c| c.is(node, &pod.uid))
            .map(|i| claims.remove(i));
        let labels = match previous {
            Some(c) if c.labels.matches(&pod.labels) => c.labels,
            _ => self.labels.get(&pod.labels),
        };
        // Nearly every name has a single claim: room for exactly one.
        claims.reserve_exact(1);
        claims.push(Claim {
            node: node_name,
            uid: pod.uid.clone(),
            labels,
        });
    }

    fn pod_meta(key: &ByName, claims: &[Claim]) -> Option<PodMeta> {
        claims.last().map(|c| PodMeta {
            namespace: key.0.namespace().to_string(),
            name: key.0.name().to_string(),
            labels: c.labels.to_map(),
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
        let (_, entry) = index.node_entry(node);
        if *entry.labels != *labels {
            entry.labels = Arc::new(labels.clone());
        }
    }

    /// Replaces the pods `node` runs (its Snapshot). A pod listed as before (same uid,
    /// name and labels) keeps its place among claims of its name; the others are new
    /// reports. Creates the node if needed. Each pod takes the index's copies of its uid
    /// and key, for the session to share.
    pub fn replace_pods(&self, node: &str, pods: &mut [Announced]) {
        let mut index = self.index.write();
        let keep: HashSet<&str> = pods.iter().map(|p| &*p.uid).collect();
        let gone: Vec<Arc<str>> = index
            .nodes
            .get(node)
            .map(|n| {
                n.pods
                    .keys()
                    .filter(|uid| !keep.contains(&***uid))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for uid in gone {
            index.unclaim(node, &uid);
        }
        index.node_entry(node);
        for pod in pods {
            if !index.adopt_unchanged(node, pod) {
                index.claim(node, pod);
            }
        }
    }

    /// Applies `node`'s changes (an Update): `upserts` are reports (new pods, or new
    /// labels), then `removed` (uids) takes back this node's claims of those pods. Each
    /// upsert takes the index's copies of its uid and key, for the session to share.
    pub fn update_pods(&self, node: &str, upserts: &mut [Announced], removed: &[String]) {
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
        let uids: Vec<Arc<str>> = match index.nodes.get(node) {
            Some(n) => n.pods.keys().cloned().collect(),
            None => return false,
        };
        for uid in uids {
            index.unclaim(node, &uid);
        }
        index.nodes.remove(node);
        true
    }

    /// The keys of the pods `node` reports, sorted by namespace, then name.
    pub fn pods_of(&self, node: &str) -> Vec<PodKey> {
        let index = self.index.read();
        let mut keys: Vec<ByName> = index
            .nodes
            .get(node)
            .map(|n| n.pods.values().cloned().map(ByName).collect())
            .unwrap_or_default();
        keys.sort();
        keys.into_iter().map(|k| k.0).collect()
    }

    /// The names of the nodes known, sorted.
    pub fn node_names(&self) -> Vec<String> {
        self.index
            .read()
            .nodes
            .keys()
            .map(|n| n.to_string())
            .collect()
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
        // No pod is indexed under a key that is not valid.
        let key = ByName(PodKey::new(namespace, name)?);
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
                name: name.to_string(),
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
            Some(ns) => {
                // The least key of the namespace: every name sorts at or after "\0" (none
                // is empty). No pod is indexed under a namespace that is not valid.
                let Some(first) = PodKey::new(ns, "\0") else {
                    return Vec::new();
                };
                index
                    .pods
                    .range(ByName(first)..)
                    .take_while(|(k, _)| k.0.namespace() == ns)
                    .filter_map(|(k, c)| Index::pod_meta(k, c))
                    .collect()
            }
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

    fn announced(uid: &str, ns: &str, name: &str, labels: &[(&str, &str)]) -> Announced {
        Announced::new(kpulse_wire::stream::PodMeta {
            uid: uid.into(),
            namespace: ns.into(),
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ready_since: None,
        })
        .expect("valid")
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
            &mut [
                announced("u1", "ns2", "p", &[]),
                announced("u2", "ns1", "z", &[]),
                announced("u3", "ns1", "a", &[("app", "web")]),
            ],
        );
        m.replace_pods("b", &mut [announced("u4", "ns10", "q", &[])]);
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
        m.replace_pods("a", &mut [announced("u3", "ns1", "a", &[("app", "api")])]);
        m.set_node("a", &BTreeMap::new());
        assert_eq!(keys(m.pods(None)), [key("ns1", "a"), key("ns10", "q")]);
        assert_eq!(m.pod("ns1", "a").expect("pod").labels["app"], "api");
        assert!(m.node("a").expect("a").labels.is_empty());

        // Updates: upserts, then removals.
        m.update_pods("a", &mut [announced("u5", "ns1", "b", &[])], &["u3".into()]);
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
        m.replace_pods("a", &mut [announced("u1", "ns", "web", &[("on", "a")])]);
        m.replace_pods("b", &mut [announced("u2", "ns", "web", &[("on", "b")])]);
        assert_eq!(owner(&m).as_deref(), Some("b"));
        assert_eq!(m.pods(None).len(), 1, "one name, listed once");
        // a notices late: its removal does not hide b's pod.
        m.update_pods("a", &mut [], &["u1".into()]);
        assert_eq!(owner(&m).as_deref(), Some("b"));
        // An upsert is a report too.
        m.update_pods(
            "a",
            &mut [announced("u1", "ns", "web", &[("on", "a")])],
            &[],
        );
        assert_eq!(owner(&m).as_deref(), Some("a"));
        // A Snapshot re-listing an unchanged pod is not a newer report.
        m.replace_pods("b", &mut [announced("u2", "ns", "web", &[("on", "b")])]);
        assert_eq!(owner(&m).as_deref(), Some("a"));
        // When the winner goes, the claim still standing is served again.
        m.update_pods("a", &mut [], &["u1".into()]);
        assert_eq!(owner(&m).as_deref(), Some("b"));
        m.update_pods(
            "a",
            &mut [announced("u1", "ns", "web", &[("on", "a")])],
            &[],
        );
        assert!(m.remove_node("a"));
        assert_eq!(owner(&m).as_deref(), Some("b"));
        // A removal of a uid the node does not have does nothing.
        m.update_pods("b", &mut [], &["u1".into()]);
        assert_eq!(owner(&m).as_deref(), Some("b"));
        m.update_pods("b", &mut [], &["u2".into()]);
        assert_eq!(owner(&m), None);
        assert!(m.pods(None).is_empty());
    }

    #[test]
    fn announced_pods_need_a_uid_a_namespace_and_a_name() {
        let wire = |uid: &str, ns: &str, name: &str| kpulse_wire::stream::PodMeta {
            uid: uid.into(),
            namespace: ns.into(),
            name: name.into(),
            labels: BTreeMap::new(),
            ready_since: Some(UnixNanos(7)),
        };
        let a = Announced::new(wire("u", "ns", "p")).expect("valid");
        assert_eq!((&*a.uid, a.key.namespace(), a.key.name()), ("u", "ns", "p"));
        assert_eq!(a.ready_since, Some(UnixNanos(7)));
        for (uid, ns, name) in [
            ("", "ns", "p"),
            ("u", "", "p"),
            ("u", "ns", ""),
            ("u", "a/b", "p"),
        ] {
            assert!(
                Announced::new(wire(uid, ns, name)).is_none(),
                "{uid:?} {ns:?} {name:?}"
            );
        }
    }

    #[test]
    fn pods_sort_by_namespace_then_name_not_by_namespace_slash_name() {
        let m = StreamMetadata::new();
        m.replace_pods(
            "a",
            &mut [
                announced("u1", "ns-1", "a", &[]),
                announced("u2", "ns", "b", &[]),
                announced("u3", "ns", "a-b", &[]),
                announced("u4", "ns", "a", &[]),
            ],
        );
        let sorted = [
            key("ns", "a"),
            key("ns", "a-b"),
            key("ns", "b"),
            key("ns-1", "a"),
        ];
        assert_eq!(keys(m.pods(None)), sorted);
        let of: Vec<(String, String)> = m
            .pods_of("a")
            .iter()
            .map(|k| key(k.namespace(), k.name()))
            .collect();
        assert_eq!(of, sorted);
        assert_eq!(keys(m.pods(Some("ns"))), sorted[..3]);
        assert_eq!(keys(m.pods(Some("ns-1"))), sorted[3..]);
        assert!(m.pods(Some("")).is_empty());
        assert!(m.pods(Some("ns/a")).is_empty());
        assert!(m.pod("", "a").is_none());
        assert!(m.pod("ns", "").is_none());
        assert!(m.pod("ns", "a-b").is_some());
        assert!(m.pods_of("b").is_empty());
    }

    /// Whether two keys are one allocation.
    fn same_key(a: &PodKey, b: &PodKey) -> bool {
        std::ptr::eq(a.namespace().as_ptr(), b.namespace().as_ptr())
    }

    #[test]
    fn a_pods_strings_are_held_once() {
        let m = StreamMetadata::new();
        let mut first = [
            announced("u1", "ns", "web-1", &[("app", "web")]),
            announced("u2", "ns", "web-2", &[("app", "web")]),
        ];
        m.replace_pods("a", &mut first);
        {
            let index = m.index.read();
            let claims: Vec<&Claim> = index.pods.values().flatten().collect();
            assert_eq!(claims.len(), 2);
            assert!(claims[0].labels.is_shared_with(&claims[1].labels));
            assert!(
                Arc::ptr_eq(&claims[0].node, &claims[1].node),
                "one node name"
            );
            assert!(Arc::ptr_eq(&claims[0].uid, &first[0].uid));
        }
        // The same pods again (a reconnecting agent's Snapshot, an Update relabelling one):
        // the announcer gets the index's uid and key, not a second copy.
        let mut again = [
            announced("u1", "ns", "web-1", &[("app", "web")]),
            announced("u2", "ns", "web-2", &[("app", "web")]),
        ];
        m.replace_pods("a", &mut again);
        let mut relabelled = [announced("u2", "ns", "web-2", &[("app", "api")])];
        m.update_pods("a", &mut relabelled, &[]);
        for (a, b) in first.iter().zip(again.iter()) {
            assert!(Arc::ptr_eq(&a.uid, &b.uid));
            assert!(same_key(&a.key, &b.key));
        }
        assert!(Arc::ptr_eq(&first[1].uid, &relabelled[0].uid));
        assert!(same_key(&first[1].key, &relabelled[0].key));
        assert_eq!(m.pod("ns", "web-1").expect("web-1").labels["app"], "web");
        assert_eq!(m.pod("ns", "web-2").expect("web-2").labels["app"], "api");
        // Another node's claim of the same name shares the key too.
        let mut moved = [announced("u9", "ns", "web-1", &[])];
        m.replace_pods("b", &mut moved);
        assert!(same_key(&first[0].key, &moved[0].key));
        assert!(m.pod("ns", "web-1").expect("web-1").labels.is_empty());
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
