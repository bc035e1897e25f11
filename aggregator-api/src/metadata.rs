//! Node and pod metadata (names, labels) that API objects carry and selectors match on.
//! metrics-server takes it from informers; here it comes through [`MetadataSource`],
//! filled today by [`StaticMetadata`] (from the `feed` file or a test) and later from the
//! agents' stream and a Kubernetes watch.

use std::{collections::BTreeMap, sync::Arc};

use arc_swap::ArcSwap;
use serde::Deserialize;

/// A node's metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct NodeMeta {
    /// Node name.
    pub name: String,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
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

/// Metadata held in memory and replaced whole (readers never block).
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
            Some(ns) => s
                .pods
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, p)| p.clone())
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
}
