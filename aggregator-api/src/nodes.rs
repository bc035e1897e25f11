//! The cluster's Nodes, from the Kubernetes API: which nodes exist and their labels, through
//! a metadata-only watch (`PartialObjectMetadata`, as metrics-server's node informer).
//!
//! [`ClusterNodes`] is what the watch has seen; [`follow`] keeps it current. Once the first
//! list is complete, [`crate::metadata::StreamMetadata`] takes node existence and labels
//! from here instead of from the agents, so that label selectors (`kubectl top node -l …`)
//! match the Node's real labels and a node without an agent exists (its metrics are "not
//! found", not the node). Until then, and in standalone mode without an API, the agents'
//! reports are all there is.
//!
//! Memory: a name and a label map per node. With the 20 labels of a typical cloud node
//! (about 1.3 KiB of keys and values) that is about 3 KiB per node with the maps' own
//! overhead, 15 MiB at 5,000 nodes (see `docs/design/aggregator.md`).

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::core::v1::Node;
use kube::{
    core::PartialObjectMeta,
    runtime::{watcher, WatchStreamExt},
};

use crate::{
    metadata::{ClusterNodeList, NodeMeta},
    watched::{follow_into, Mirror, Narration},
};

/// A node's labels, shared between the index and lookups.
pub type Labels = Arc<BTreeMap<String, String>>;

/// The nodes the API has, by name, with their labels.
pub type ClusterNodes = Mirror<Labels>;

impl ClusterNodeList for ClusterNodes {
    fn listed(&self) -> bool {
        Mirror::listed(self)
    }

    fn node(&self, name: &str) -> Option<NodeMeta> {
        self.get(name, |labels| NodeMeta {
            name: name.to_string(),
            labels: labels.clone(),
        })
    }

    fn nodes(&self) -> Vec<NodeMeta> {
        self.collect(|(name, labels)| NodeMeta {
            name: name.clone(),
            labels: labels.clone(),
        })
    }
}

/// Watches the Nodes' metadata (with [`crate::watched::backoff`]) and keeps `nodes`
/// current. Never returns. API errors (e.g. forbidden: RBAC) are logged at WARN and
/// retried; what was seen last stays in use.
pub async fn follow(client: kube::Client, nodes: Arc<ClusterNodes>) {
    // `PartialObjectMeta`: the requests ask for `PartialObjectMetadataList`, so only the
    // nodes' metadata crosses the wire and is decoded.
    let api = kube::Api::<PartialObjectMeta<Node>>::all(client);
    let stream = watcher(api, watcher::Config::default()).backoff(crate::watched::backoff());
    let say = Narration {
        what: "Nodes",
        failing: &|error| {
            tracing::warn!(
                %error,
                "cannot watch Nodes (needs get, list, watch on nodes); node labels and \
                 existence come from the agents until it works; retrying"
            );
        },
        listed: &|all| {
            tracing::info!(
                nodes = all.len(),
                "Nodes listed: node labels and existence now come from the API"
            );
        },
    };
    follow_into(stream, &nodes, kept, say).await;
}

/// What is kept of a Node: its name and labels.
fn kept(node: PartialObjectMeta<Node>) -> (String, Labels) {
    (
        node.metadata.name.unwrap_or_default(),
        Arc::new(node.metadata.labels.unwrap_or_default()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watched::{map_event, Change, Relist};

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    fn ev(e: watcher::Event<(&str, &[(&str, &str)])>) -> watcher::Event<(String, Labels)> {
        map_event(e, |(n, l)| (n.to_string(), Arc::new(labels(l))))
    }

    #[test]
    fn a_list_is_applied_whole_at_its_end() {
        let nodes = ClusterNodes::new();
        let mut relist = Relist::default();
        assert_eq!(relist.on(ev(watcher::Event::Init)), None);
        assert_eq!(
            relist.on(ev(watcher::Event::InitApply(("b", &[("zone", "b")])))),
            None
        );
        assert_eq!(
            relist.on(ev(watcher::Event::InitApply(("a", &[("zone", "a")])))),
            None
        );
        assert!(!nodes.listed());
        assert!(nodes.node("a").is_none(), "nothing before the list ends");
        let change = relist.on(ev(watcher::Event::InitDone)).expect("change");
        assert!(nodes.apply(change));
        assert!(nodes.listed());
        let names: Vec<String> = nodes.nodes().into_iter().map(|n| n.name).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            *nodes.node("a").expect("a").labels,
            labels(&[("zone", "a")])
        );
    }

    #[test]
    fn changes_after_the_list() {
        let nodes = ClusterNodes::new();
        let mut relist = Relist::default();
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(("a", &[("zone", "a")][..])),
            watcher::Event::InitDone,
        ] {
            if let Some(c) = relist.on(ev(e)) {
                nodes.apply(c);
            }
        }
        // A status update: same labels, nothing changes.
        let same = relist
            .on(ev(watcher::Event::Apply(("a", &[("zone", "a")]))))
            .expect("change");
        assert!(!nodes.apply(same));
        let relabelled = relist
            .on(ev(watcher::Event::Apply(("a", &[("zone", "b")]))))
            .expect("change");
        assert!(nodes.apply(relabelled));
        assert_eq!(nodes.node("a").expect("a").labels["zone"], "b");
        let added = relist
            .on(ev(watcher::Event::Apply(("c", &[]))))
            .expect("change");
        assert!(nodes.apply(added));
        let deleted = relist
            .on(ev(watcher::Event::Delete(("a", &[]))))
            .expect("change");
        assert!(nodes.apply(deleted));
        assert!(nodes.node("a").is_none());
        assert_eq!(nodes.len(), 1);
        // A re-list replaces everything: a node deleted while the watch was down goes.
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(("d", &[][..])),
        ] {
            assert_eq!(relist.on(ev(e)), None);
        }
        assert!(nodes.node("c").is_some(), "kept until the re-list ends");
        let replace = relist.on(ev(watcher::Event::InitDone)).expect("change");
        assert!(nodes.apply(replace));
        let names: Vec<String> = nodes.nodes().into_iter().map(|n| n.name).collect();
        assert_eq!(names, ["d"]);
    }

    #[test]
    fn an_empty_cluster_is_listed() {
        let nodes = ClusterNodes::new();
        let mut relist = Relist::default();
        assert_eq!(relist.on(ev(watcher::Event::Init)), None);
        let change = relist.on(ev(watcher::Event::InitDone)).expect("change");
        assert_eq!(change, Change::Replace(BTreeMap::new()));
        nodes.apply(change);
        assert!(nodes.listed() && nodes.is_empty());
    }
}
