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

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use k8s_openapi::api::core::v1::Node;
use kube::{
    core::PartialObjectMeta,
    runtime::{watcher, WatchStreamExt},
};
use parking_lot::RwLock;

use crate::metadata::{ClusterNodeList, NodeMeta};

/// A node's labels, shared between the index and lookups.
pub type Labels = Arc<BTreeMap<String, String>>;

/// A node's labels as the watch reports them.
pub type LabelMap = BTreeMap<String, String>;

/// One change a watch reports, about objects named `name` with what is kept of them (`V`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change<V = LabelMap> {
    /// An object was added, or changed (what is kept of it may be the same).
    Upsert {
        /// `metadata.name`.
        name: String,
        /// What is kept of it (a node's labels).
        value: V,
    },
    /// An object was deleted.
    Delete {
        /// `metadata.name`.
        name: String,
    },
    /// A complete list, replacing everything (the watch's first list, or a re-list).
    Replace(BTreeMap<String, V>),
}

/// The nodes the API has, sorted by name. Written by the watch (rarely: a node's labels
/// change, a node comes or goes), read by every request.
#[derive(Debug, Default)]
pub struct ClusterNodes {
    nodes: RwLock<BTreeMap<String, Labels>>,
    /// The first complete list has been applied.
    listed: AtomicBool,
    /// The API refused the list for good (see [`refused`]) and none has come since.
    refused: AtomicBool,
}

impl ClusterNodes {
    /// Empty, not listed.
    pub fn new() -> Arc<ClusterNodes> {
        Arc::new(ClusterNodes::default())
    }

    /// Whether a complete list has been seen: before that the set is not authoritative.
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// Whether the API refused the list for a reason retrying does not fix (RBAC, no such
    /// resource, not a Kubernetes API) and no list has succeeded since.
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::Acquire)
    }

    /// Records whether the last list attempt was [`refused`].
    pub fn set_refused(&self, refused: bool) {
        self.refused.store(refused, Ordering::Release);
    }

    /// Applies one change. True if the set or a node's labels changed.
    pub fn apply(&self, change: Change) -> bool {
        match change {
            Change::Upsert {
                name,
                value: labels,
            } => {
                let mut nodes = self.nodes.write();
                if nodes.get(&name).is_some_and(|l| **l == labels) {
                    return false;
                }
                nodes.insert(name, Arc::new(labels));
                true
            }
            Change::Delete { name } => self.nodes.write().remove(&name).is_some(),
            Change::Replace(all) => {
                let new: BTreeMap<String, Labels> =
                    all.into_iter().map(|(n, l)| (n, Arc::new(l))).collect();
                let mut nodes = self.nodes.write();
                let changed = *nodes != new;
                *nodes = new;
                drop(nodes);
                self.listed.store(true, Ordering::Release);
                changed
            }
        }
    }

    /// Whether the API has node `name` (as last seen).
    pub fn contains(&self, name: &str) -> bool {
        self.nodes.read().contains_key(name)
    }

    /// How many nodes the API has (as last seen).
    pub fn len(&self) -> usize {
        self.nodes.read().len()
    }

    /// Whether the API has no node (as last seen).
    pub fn is_empty(&self) -> bool {
        self.nodes.read().is_empty()
    }
}

impl ClusterNodeList for ClusterNodes {
    fn listed(&self) -> bool {
        ClusterNodes::listed(self)
    }

    fn node(&self, name: &str) -> Option<NodeMeta> {
        self.nodes.read().get(name).map(|labels| NodeMeta {
            name: name.to_string(),
            labels: labels.clone(),
        })
    }

    fn nodes(&self) -> Vec<NodeMeta> {
        self.nodes
            .read()
            .iter()
            .map(|(name, labels)| NodeMeta {
                name: name.clone(),
                labels: labels.clone(),
            })
            .collect()
    }
}

/// Turns a watch's events into [`Change`]s: the objects of a (re-)list are gathered until
/// its end and applied at once, so that readers never see half a list.
#[derive(Debug)]
pub struct Relist<V> {
    pending: Option<BTreeMap<String, V>>,
}

impl<V> Default for Relist<V> {
    fn default() -> Self {
        Relist { pending: None }
    }
}

impl<V> Relist<V> {
    /// The change one event (about `(name, value)`) makes, if any (`None` while a list is
    /// being gathered).
    pub fn on(&mut self, event: watcher::Event<(String, V)>) -> Option<Change<V>> {
        match event {
            watcher::Event::Init => {
                self.pending = Some(BTreeMap::new());
                None
            }
            watcher::Event::InitApply((name, value)) => {
                self.pending
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name, value);
                None
            }
            watcher::Event::InitDone => {
                Some(Change::Replace(self.pending.take().unwrap_or_default()))
            }
            watcher::Event::Apply((name, value)) => Some(Change::Upsert { name, value }),
            watcher::Event::Delete((name, _)) => Some(Change::Delete { name }),
        }
    }
}

/// Watches the Nodes' metadata (with the watcher's default backoff) and keeps `nodes`
/// current. Never returns. API errors (e.g. forbidden: RBAC) are logged at WARN and
/// retried; what was seen last stays in use.
pub async fn follow(client: kube::Client, nodes: Arc<ClusterNodes>) {
    // `PartialObjectMeta`: the requests ask for `PartialObjectMetadataList`, so only the
    // nodes' metadata crosses the wire and is decoded.
    let api = kube::Api::<PartialObjectMeta<Node>>::all(client);
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut relist = Relist::default();
    let mut failing = false;
    while let Some(event) = next(stream.as_mut()).await {
        let event = match event {
            Ok(e) => e,
            Err(error) => {
                if !failing {
                    tracing::warn!(
                        %error,
                        "cannot watch Nodes (needs get, list, watch on nodes); node labels and \
                         existence come from the agents until it works; retrying"
                    );
                }
                if !nodes.listed() {
                    nodes.set_refused(refused(&error));
                }
                failing = true;
                continue;
            }
        };
        if failing {
            tracing::info!("watching Nodes again");
            failing = false;
        }
        nodes.set_refused(false);
        let event = map_event(event, |n| {
            (
                n.metadata.name.unwrap_or_default(),
                n.metadata.labels.unwrap_or_default(),
            )
        });
        let Some(change) = relist.on(event) else {
            continue;
        };
        let first = !nodes.listed();
        if let Change::Replace(all) = &change {
            if first {
                tracing::info!(
                    nodes = all.len(),
                    "Nodes listed: node labels and existence now come from the API"
                );
            }
        }
        nodes.apply(change);
    }
}

/// Whether a watch error is one retrying does not fix: the API forbids the list (RBAC), has
/// no such resource, or does not answer like a Kubernetes API. Readiness stops waiting for
/// a list that is refused so ([`crate::health::Completeness`]).
pub fn refused(error: &watcher::Error) -> bool {
    let e = match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => e,
        watcher::Error::WatchError(status) => return matches!(status.code, 403 | 404),
        watcher::Error::NoResourceVersion => return true,
    };
    match e {
        kube::Error::Api(status) => matches!(status.code, 403 | 404),
        kube::Error::SerdeError(_) => true,
        _ => false,
    }
}

/// The same event about `f(object)`.
pub(crate) fn map_event<A, B>(e: watcher::Event<A>, f: impl FnOnce(A) -> B) -> watcher::Event<B> {
    match e {
        watcher::Event::Apply(o) => watcher::Event::Apply(f(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(f(o)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(f(o)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// The next item of a stream (this crate has no `futures` dependency).
pub(crate) async fn next<S: WatchStreamExt + ?Sized>(
    mut stream: std::pin::Pin<&mut S>,
) -> Option<S::Item> {
    std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    fn ev(e: watcher::Event<(&str, &[(&str, &str)])>) -> watcher::Event<(String, LabelMap)> {
        map_event(e, |(n, l)| (n.to_string(), labels(l)))
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
