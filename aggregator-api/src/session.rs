//! Agent sessions: what one node's stream of [`AgentMessage`]s means for the store and
//! the metadata. No I/O: the network streams (`ingest`) and the feed file (`feed`) both
//! drive the same code, so a file line and a network frame are applied identically.
//!
//! # One session per node
//!
//! A [`Session`] is the state of one node's stream: the pods it announced (uid →
//! namespace/name and when it became Ready; their labels are the metadata's).
//! [`Session::apply`] takes the messages after the Hello:
//!
//! - **Snapshot** replaces the node's pods (in the session and in [`StreamMetadata`]);
//! - **Update** applies `upserts`, then `removed` (a removed pod is unserved at once: it
//!   leaves the metadata and the next batch);
//!
//! and both join their `counters` with the pods by uid into a [`NodeBatch`] — a full
//! snapshot of the node, which is what [`Store::ingest`] expects. Counters for a uid the
//! session does not know are dropped and counted (`IngestMetrics::unknown_uids`). An Update
//! before any Snapshot, or a second Hello, is a protocol error that ends the stream.
//!
//! # Leases: one writer per node
//!
//! [`Sessions`] is the table of nodes being streamed. [`Sessions::claim`] gives the
//! stream that said Hello for a node a [`Lease`] on it; a later claim for the same node
//! takes the lease over (the older stream's [`Replaced`] resolves and its next
//! [`Lease::apply`] is refused), so the store and the metadata have a single writer per
//! node, as the store requires. Applying holds the node's lease lock, so a replacement
//! never interleaves with a message being applied.
//!
//! # When a stream ends
//!
//! Nothing is removed: the node's metrics stay until the store expires them
//! (`--metric-expiry`), so an agent that reconnects within that time leaves no gap. Once
//! the store has dropped the node and no lease is held for it,
//! [`Sessions::forget_expired`] (the maintenance loop) drops its metadata too.

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
};

use kpulse_wire::{
    stream::{AgentMessage, Hello, PodCounters, Version},
    NodeBatch, NodeSample, PodSample, UnixNanos,
};
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::{
    metadata::{Announced, StreamMetadata},
    selfmetrics::IngestMetrics,
    store::{Clock, PodKey, Store, SystemClock},
};

/// Longest node name accepted (a DNS subdomain).
pub const MAX_NODE_NAME_BYTES: usize = 253;

/// Most pods one node may announce (kubelet's `--max-pods` is 110 by default; large nodes
/// run a few hundred): a stream announcing more is ended, so that a faulty agent cannot
/// grow the server's memory without bound.
pub const MAX_PODS_PER_NODE: usize = 10_000;

/// What sessions write to.
pub struct Sink<C: Clock = SystemClock> {
    /// The metrics.
    pub store: Arc<Store<C>>,
    /// Node and pod metadata the API serves.
    pub metadata: Arc<StreamMetadata>,
    /// Counters.
    pub metrics: IngestMetrics,
}

impl<C: Clock> std::fmt::Debug for Sink<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink").finish_non_exhaustive()
    }
}

/// Why a message could not be applied. Each ends the stream.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SessionError {
    /// A message out of the protocol's order.
    #[error("unexpected {got}: {expected}")]
    OutOfOrder {
        /// The message type received.
        got: &'static str,
        /// What the protocol expects.
        expected: &'static str,
    },
    /// A newer stream for the same node took over.
    #[error("replaced by a newer stream for node {node:?}")]
    Replaced {
        /// The node.
        node: String,
    },
    /// More than [`MAX_PODS_PER_NODE`] pods announced.
    #[error("more than {MAX_PODS_PER_NODE} pods announced for node {node:?}")]
    TooManyPods {
        /// The node.
        node: String,
    },
    /// The store refused the batch.
    #[error("the store refused the batch: {reason}")]
    Store {
        /// Why.
        reason: String,
    },
}

/// Why a Hello is refused.
#[derive(Debug, thiserror::Error)]
pub enum HelloError {
    /// Another major version.
    #[error(transparent)]
    Version(#[from] kpulse_wire::stream::Error),
    /// The node name cannot be a Kubernetes node's.
    #[error("node name {name:?} is not a Kubernetes node name (a DNS subdomain: lowercase letters, digits, '-' and '.', at most 253 characters)")]
    NodeName {
        /// The name (at most 64 characters of it).
        name: String,
    },
}

/// Checks a Hello's version (same major as ours) and node name.
///
/// # Errors
///
/// [`HelloError`], worded for the agent's log.
pub fn check_hello(hello: &Hello) -> Result<(), HelloError> {
    Version::check(hello.version)?;
    if !is_node_name(&hello.node_name) {
        return Err(HelloError::NodeName {
            name: hello.node_name.chars().take(64).collect(),
        });
    }
    Ok(())
}

/// A DNS subdomain (RFC 1123), as Kubernetes requires of node names.
fn is_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NODE_NAME_BYTES
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// What applying one message did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Pods in the batch handed to the store.
    pub pods: usize,
    /// Pod counters dropped because their uid is not known.
    pub unknown_uids: usize,
}

/// One node's stream state (see the module docs).
#[derive(Debug)]
pub struct Session {
    node: String,
    /// uid → what the pod's counters are joined with.
    pods: HashMap<Arc<str>, KnownPod>,
    snapshot_seen: bool,
}

/// What a session keeps of a pod it announced: what the store needs with its counters.
/// Its labels are kept once, in the metadata index (`StreamMetadata`), and its uid (the
/// session's map key) and key are the index's own allocations: `bench-fit` and heaptrack
/// found a pod's 2.7 KiB to be its metadata held three times.
#[derive(Debug)]
struct KnownPod {
    key: PodKey,
    ready_since: Option<UnixNanos>,
}

impl KnownPod {
    fn of(pod: Announced) -> (Arc<str>, KnownPod) {
        (
            pod.uid,
            KnownPod {
                key: pod.key,
                ready_since: pod.ready_since,
            },
        )
    }
}

impl Session {
    /// The session of `node`, before its Snapshot.
    pub fn new(node: &str) -> Session {
        Session {
            node: node.to_string(),
            pods: HashMap::new(),
            snapshot_seen: false,
        }
    }

    /// The node.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Pods announced and not removed.
    pub fn pods(&self) -> usize {
        self.pods.len()
    }

    /// Applies one message after the Hello.
    ///
    /// # Errors
    ///
    /// [`SessionError::OutOfOrder`] for a Hello, or an Update before any Snapshot;
    /// [`SessionError::Store`] if the store refuses the batch.
    pub fn apply<C: Clock>(
        &mut self,
        message: AgentMessage,
        sink: &Sink<C>,
    ) -> Result<Applied, SessionError> {
        match message {
            AgentMessage::Hello(_) => Err(SessionError::OutOfOrder {
                got: "Hello",
                expected: "a stream says Hello once, first",
            }),
            AgentMessage::Snapshot(s) => {
                let mut pods: Vec<Announced> =
                    s.pods.into_iter().filter_map(Announced::new).collect();
                if pods.len() > MAX_PODS_PER_NODE {
                    return Err(self.too_many_pods());
                }
                sink.metadata.replace_pods(&self.node, &mut pods);
                self.pods = pods.into_iter().map(KnownPod::of).collect();
                self.snapshot_seen = true;
                // The tick before, first: the store then holds two points per container and
                // serves rates at once (a restarted server is complete again immediately).
                if let Some(prev) = s.previous {
                    if prev.node.timestamp < s.node.timestamp {
                        self.ingest(s.sent_at, prev.node, prev.counters, sink, false)?;
                    }
                }
                self.ingest(s.sent_at, s.node, s.counters, sink, true)
            }
            AgentMessage::Update(u) => {
                if !self.snapshot_seen {
                    return Err(SessionError::OutOfOrder {
                        got: "Update",
                        expected: "the first message after the Hello is a Snapshot",
                    });
                }
                let mut upserts: Vec<Announced> =
                    u.upserts.into_iter().filter_map(Announced::new).collect();
                // The count once the Update is applied: new uids in, known uids out.
                let arriving: HashSet<&str> = upserts
                    .iter()
                    .map(|p| &*p.uid)
                    .filter(|uid| {
                        !self.pods.contains_key(*uid) && !u.removed.iter().any(|r| r == uid)
                    })
                    .collect();
                let leaving: HashSet<&str> = u
                    .removed
                    .iter()
                    .map(String::as_str)
                    .filter(|uid| self.pods.contains_key(*uid))
                    .collect();
                if self.pods.len() + arriving.len() - leaving.len() > MAX_PODS_PER_NODE {
                    return Err(self.too_many_pods());
                }
                sink.metadata
                    .update_pods(&self.node, &mut upserts, &u.removed);
                for p in upserts {
                    let (uid, pod) = KnownPod::of(p);
                    self.pods.insert(uid, pod);
                }
                for uid in &u.removed {
                    self.pods.remove(uid.as_str());
                }
                self.ingest(u.sent_at, u.node, u.counters, sink, true)
            }
        }
    }

    fn too_many_pods(&self) -> SessionError {
        SessionError::TooManyPods {
            node: self.node.clone(),
        }
    }

    /// Joins `counters` with the pods into the node's full batch and stores it.
    fn ingest<C: Clock>(
        &self,
        sent_at: UnixNanos,
        node: NodeSample,
        counters: Vec<PodCounters>,
        sink: &Sink<C>,
        // False for a snapshot's previous tick: not counted as a message made visible.
        record: bool,
    ) -> Result<Applied, SessionError> {
        let mut seen = HashSet::with_capacity(counters.len());
        let mut unknown_uids = 0;
        let mut pods = Vec::with_capacity(counters.len());
        for c in counters {
            match self.pods.get(c.uid.as_str()) {
                Some(meta) => {
                    // A uid twice in one tick: the first one counts.
                    if seen.insert(c.uid.clone()) {
                        pods.push(PodSample {
                            uid: c.uid,
                            namespace: meta.key.namespace().to_string(),
                            name: meta.key.name().to_string(),
                            containers: c.containers,
                            signals: c.signals,
                            ready_since: meta.ready_since,
                        });
                    }
                }
                None => unknown_uids += 1,
            }
        }
        if record {
            sink.metrics.unknown_uids(unknown_uids);
        }
        let applied = Applied {
            pods: pods.len(),
            unknown_uids,
        };
        sink.store
            .ingest(NodeBatch {
                node_name: self.node.clone(),
                sent_at,
                node,
                pods,
            })
            .map_err(|e| SessionError::Store {
                reason: e.to_string(),
            })?;
        if record {
            sink.metrics.visible(sent_at);
        }
        Ok(applied)
    }
}

/// The nodes being streamed: one [`Lease`] per node (see the module docs).
pub struct Sessions<C: Clock = SystemClock> {
    sink: Sink<C>,
    table: Mutex<HashMap<String, Entry>>,
    next_id: AtomicU64,
}

impl<C: Clock> std::fmt::Debug for Sessions<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("nodes", &self.table.lock().len())
            .finish_non_exhaustive()
    }
}

/// A node's lease holder.
struct Entry {
    id: u64,
    /// The id of the lease allowed to write; shared with every lease of the node.
    owner: Arc<Mutex<u64>>,
    /// Tells the holder it was replaced.
    replaced: Option<oneshot::Sender<()>>,
}

impl<C: Clock> Sessions<C> {
    /// Sessions writing to `store` and `metadata`, counting in `metrics`.
    pub fn new(
        store: Arc<Store<C>>,
        metadata: Arc<StreamMetadata>,
        metrics: IngestMetrics,
    ) -> Arc<Sessions<C>> {
        Arc::new(Sessions {
            sink: Sink {
                store,
                metadata,
                metrics,
            },
            table: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        })
    }

    /// What the sessions write to.
    pub fn sink(&self) -> &Sink<C> {
        &self.sink
    }

    /// Starts the session of `hello.node_name` (whose identity the caller checked),
    /// replacing the node's current session if there is one: that one's [`Replaced`]
    /// resolves and its next [`Lease::apply`] fails. The node's labels are recorded.
    pub fn claim(self: &Arc<Self>, hello: &Hello) -> (Lease<C>, Replaced) {
        let node = hello.node_name.clone();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut table = self.table.lock();
        let owner = match table.get_mut(&node) {
            Some(entry) => {
                if let Some(old) = entry.replaced.take() {
                    let _ = old.send(());
                }
                self.sink.metrics.replaced();
                tracing::info!(node = %node, "a newer stream replaces the node's session");
                entry.id = id;
                entry.replaced = Some(tx);
                entry.owner.clone()
            }
            None => {
                let owner = Arc::new(Mutex::new(id));
                table.insert(
                    node.clone(),
                    Entry {
                        id,
                        owner: owner.clone(),
                        replaced: Some(tx),
                    },
                );
                owner
            }
        };
        {
            // Waits for the replaced session's message in flight, if any.
            let mut current = owner.lock();
            *current = id;
            self.sink.metadata.set_node(&node, &hello.node_labels);
        }
        drop(table);
        (
            Lease {
                sessions: self.clone(),
                id,
                owner,
                session: Session::new(&node),
            },
            Replaced(rx),
        )
    }

    /// Whether a session holds `node` now.
    pub fn is_live(&self, node: &str) -> bool {
        self.table.lock().contains_key(node)
    }

    /// Nodes with a session now.
    pub fn live(&self) -> usize {
        self.table.lock().len()
    }

    /// Drops the metadata of every node that no session holds and the store no longer
    /// has (its data expired); returns their names. Call after [`Store::housekeep`].
    pub fn forget_expired(&self) -> Vec<String> {
        // Held throughout, so that no claim slips in between the check and the removal.
        let table = self.table.lock();
        let mut gone = Vec::new();
        for node in self.sink.metadata.node_names() {
            if !table.contains_key(&node) && !self.sink.store.contains_node(&node) {
                self.sink.metadata.remove_node(&node);
                gone.push(node);
            }
        }
        gone
    }

    fn release(&self, node: &str, id: u64) {
        let mut table = self.table.lock();
        if table.get(node).is_some_and(|e| e.id == id) {
            table.remove(node);
        }
    }
}

/// A session's right to write its node; released when dropped (the node's data stays
/// until it expires).
pub struct Lease<C: Clock = SystemClock> {
    sessions: Arc<Sessions<C>>,
    id: u64,
    owner: Arc<Mutex<u64>>,
    session: Session,
}

impl<C: Clock> std::fmt::Debug for Lease<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("node", &self.session.node)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> Lease<C> {
    /// The node.
    pub fn node(&self) -> &str {
        self.session.node()
    }

    /// Whether this lease still holds its node.
    pub fn is_current(&self) -> bool {
        *self.owner.lock() == self.id
    }

    /// Applies one message (see [`Session::apply`]) unless a newer session took the
    /// node over.
    ///
    /// # Errors
    ///
    /// [`SessionError::Replaced`], or what [`Session::apply`] returns.
    pub fn apply(&mut self, message: AgentMessage) -> Result<Applied, SessionError> {
        let owner = self.owner.lock();
        if *owner != self.id {
            return Err(SessionError::Replaced {
                node: self.session.node.clone(),
            });
        }
        self.session.apply(message, &self.sessions.sink)
    }

    /// Records new node labels (a Hello repeated in the feed file).
    pub fn set_node_labels(&self, labels: &std::collections::BTreeMap<String, String>) {
        let owner = self.owner.lock();
        if *owner == self.id {
            self.sessions
                .sink
                .metadata
                .set_node(&self.session.node, labels);
        }
    }
}

impl<C: Clock> Drop for Lease<C> {
    fn drop(&mut self) {
        self.sessions.release(&self.session.node, self.id);
    }
}

/// Resolves when a newer session replaced the lease it came with.
#[derive(Debug)]
pub struct Replaced(oneshot::Receiver<()>);

impl Future for Replaced {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // A dropped sender (the entry is gone) means the lease no longer holds either.
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, time::Duration};

    use kpulse_wire::{
        stream::{PodMeta, Previous, Snapshot, Update, VERSION},
        Bytes, ContainerSample, CpuNanos,
    };

    use super::*;
    use crate::{
        metadata::MetadataSource,
        store::{ManualClock, StoreConfig},
    };

    const S: u64 = 1_000_000_000;
    const T0: u64 = 1_700_000_000 * S;

    struct Fixture {
        clock: Arc<ManualClock>,
        sessions: Arc<Sessions<Arc<ManualClock>>>,
    }

    fn fixture() -> Fixture {
        let clock = Arc::new(ManualClock::new(UnixNanos(T0)));
        let store = Arc::new(
            Store::with_clock(StoreConfig::new(Duration::from_secs(10)), clock.clone())
                .expect("store"),
        );
        Fixture {
            clock,
            sessions: Sessions::new(store, StreamMetadata::new(), IngestMetrics::new()),
        }
    }

    fn hello(node: &str) -> Hello {
        Hello {
            version: VERSION,
            node_name: node.into(),
            node_labels: BTreeMap::from([("zone".into(), "z1".into())]),
            agent: "test".into(),
        }
    }

    fn pod(uid: &str, name: &str) -> PodMeta {
        PodMeta {
            uid: uid.into(),
            namespace: "ns".into(),
            name: name.into(),
            labels: BTreeMap::from([("app".into(), name.into())]),
            ready_since: None,
        }
    }

    fn node(t: u64) -> NodeSample {
        NodeSample {
            timestamp: UnixNanos(t),
            started_at: None,
            cpu: CpuNanos(t - T0),
            memory_working_set: Bytes(1 << 30),
            swap: None,
        }
    }

    fn counters(uid: &str, t: u64) -> PodCounters {
        PodCounters {
            uid: uid.into(),
            containers: vec![ContainerSample {
                name: "app".into(),
                timestamp: UnixNanos(t),
                cgroup_id: None,
                started_at: None,
                cpu: CpuNanos((t - T0) / 2),
                memory_working_set: Bytes(1 << 20),
                swap: None,
                signals: None,
            }],
            signals: None,
        }
    }

    fn snapshot(t: u64, pods: Vec<PodMeta>, uids: &[&str]) -> AgentMessage {
        AgentMessage::Snapshot(Snapshot {
            sent_at: UnixNanos(t),
            node: node(t),
            pods,
            counters: uids.iter().map(|u| counters(u, t)).collect(),
            previous: None,
        })
    }

    fn update(t: u64, upserts: Vec<PodMeta>, removed: &[&str], uids: &[&str]) -> AgentMessage {
        AgentMessage::Update(Update {
            sent_at: UnixNanos(t),
            node: node(t),
            upserts,
            removed: removed.iter().map(|s| s.to_string()).collect(),
            counters: uids.iter().map(|u| counters(u, t)).collect(),
        })
    }

    fn served(f: &Fixture, names: &[&str]) -> Vec<bool> {
        let keys: Vec<(&str, &str)> = names.iter().map(|n| ("ns", *n)).collect();
        f.sessions
            .sink()
            .store
            .pod_metrics(&keys)
            .into_iter()
            .map(|p| p.is_some())
            .collect()
    }

    fn listed(f: &Fixture) -> Vec<String> {
        f.sessions
            .sink()
            .metadata
            .pods(Some("ns"))
            .into_iter()
            .map(|p| p.name)
            .collect()
    }

    #[test]
    fn a_snapshot_with_its_previous_tick_is_served_at_once() {
        let f = fixture();
        let (mut lease, _replaced) = f.sessions.claim(&hello("n1"));
        f.clock.set(UnixNanos(T0 + 2 * S));
        let AgentMessage::Snapshot(mut s) = snapshot(T0 + 2 * S, vec![pod("u1", "web")], &["u1"])
        else {
            unreachable!("snapshot() builds a Snapshot")
        };
        s.previous = Some(Previous {
            node: node(T0 + S),
            counters: vec![counters("u1", T0 + S)],
        });
        lease.apply(AgentMessage::Snapshot(s)).expect("snapshot");
        assert_eq!(served(&f, &["web"]), [true], "two points from one message");
        let p = f.sessions.sink().store.pod_metrics(&[("ns", "web")]);
        let p = p[0].as_ref().expect("served");
        assert_eq!(p.window, Duration::from_secs(1));
        assert_eq!(p.containers[0].cpu.0, 500_000_000, "half a core, exactly");

        // A previous tick that is not older is ignored (no rate from it).
        let f = fixture();
        let (mut lease, _replaced) = f.sessions.claim(&hello("n1"));
        let AgentMessage::Snapshot(mut s) = snapshot(T0 + S, vec![pod("u1", "web")], &["u1"])
        else {
            unreachable!("snapshot() builds a Snapshot")
        };
        s.previous = Some(Previous {
            node: node(T0 + S),
            counters: vec![counters("u1", T0 + S)],
        });
        lease.apply(AgentMessage::Snapshot(s)).expect("snapshot");
        assert_eq!(served(&f, &["web"]), [false]);
    }

    #[test]
    fn snapshot_updates_removals_and_unknown_uids() {
        let f = fixture();
        let (mut lease, _replaced) = f.sessions.claim(&hello("n1"));
        let meta = &f.sessions.sink().metadata;
        assert_eq!(meta.node("n1").expect("node").labels["zone"], "z1");

        // An Update before the Snapshot is out of order.
        let e = lease
            .apply(update(T0, vec![], &[], &[]))
            .expect_err("update first");
        assert!(matches!(e, SessionError::OutOfOrder { got: "Update", .. }));

        // Snapshot: two pods, counters for one of them and for a stranger.
        let a = lease
            .apply(snapshot(
                T0,
                vec![pod("u1", "web"), pod("u2", "db")],
                &["u1", "u9"],
            ))
            .expect("snapshot");
        assert_eq!(
            a,
            Applied {
                pods: 1,
                unknown_uids: 1
            }
        );
        assert_eq!(listed(&f), ["db", "web"]);
        assert_eq!(f.sessions.sink().metrics.unknown_uid_count(), 1);

        // Updates: both pods measured, then rates are served.
        f.clock.set(UnixNanos(T0 + S));
        lease
            .apply(update(T0 + S, vec![], &[], &["u1", "u2"]))
            .expect("update");
        f.clock.set(UnixNanos(T0 + 2 * S));
        lease
            .apply(update(T0 + 2 * S, vec![], &[], &["u1", "u2"]))
            .expect("update");
        assert_eq!(served(&f, &["web", "db"]), [true, true]);

        // An upsert relabels; a new pod arrives with its counters in the same Update.
        let mut relabelled = pod("u1", "web");
        relabelled.labels.insert("tier".into(), "front".into());
        lease
            .apply(update(
                T0 + 3 * S,
                vec![relabelled, pod("u3", "cache")],
                &[],
                &["u1", "u2", "u3"],
            ))
            .expect("update");
        assert_eq!(meta.pod("ns", "web").expect("web").labels["tier"], "front");
        assert_eq!(listed(&f), ["cache", "db", "web"]);

        // A removal: gone from the metadata and the store at once, even if the agent
        // still sends its counters (they are then unknown).
        let a = lease
            .apply(update(T0 + 4 * S, vec![], &["u2"], &["u1", "u2", "u3"]))
            .expect("update");
        assert_eq!(a.unknown_uids, 1);
        assert_eq!(listed(&f), ["cache", "web"]);
        assert_eq!(served(&f, &["web", "db"]), [true, false]);
        assert!(meta.pod("ns", "db").is_none());

        // A pod left out of a tick is not served, but stays announced.
        lease
            .apply(update(T0 + 5 * S, vec![], &[], &["u3"]))
            .expect("update");
        assert_eq!(served(&f, &["web"]), [false]);
        assert_eq!(listed(&f), ["cache", "web"]);

        // A second Snapshot replaces everything.
        lease
            .apply(snapshot(T0 + 6 * S, vec![pod("u4", "api")], &["u4"]))
            .expect("snapshot");
        assert_eq!(listed(&f), ["api"]);

        // A second Hello ends the stream.
        let e = lease
            .apply(AgentMessage::Hello(hello("n1")))
            .expect_err("hello twice");
        assert!(matches!(e, SessionError::OutOfOrder { got: "Hello", .. }));
    }

    #[tokio::test]
    async fn a_newer_stream_replaces_the_older_and_data_outlives_both() {
        let f = fixture();
        let (mut old, replaced) = f.sessions.claim(&hello("n1"));
        old.apply(snapshot(T0, vec![pod("u1", "web")], &["u1"]))
            .expect("snapshot");
        let mut other_labels = hello("n1");
        other_labels.node_labels = BTreeMap::from([("zone".into(), "z2".into())]);
        let (mut new, _) = f.sessions.claim(&other_labels);
        tokio::time::timeout(Duration::from_secs(1), replaced)
            .await
            .expect("the old stream is told");
        assert!(!old.is_current() && new.is_current());
        assert_eq!(
            old.apply(update(T0 + S, vec![], &["u1"], &[])),
            Err(SessionError::Replaced { node: "n1".into() })
        );
        assert_eq!(f.sessions.sink().metrics.replaced_count(), 1);
        let meta = &f.sessions.sink().metadata;
        assert_eq!(meta.node("n1").expect("node").labels["zone"], "z2");
        // The old session's refused removal did nothing: web is still announced.
        assert_eq!(listed(&f), ["web"]);
        // The new session starts over with its own Snapshot.
        new.apply(snapshot(T0 + S, vec![pod("u1", "web")], &["u1"]))
            .expect("snapshot");

        // Dropping the old lease does not release the node: the new one holds it.
        drop(old);
        assert!(f.sessions.is_live("n1"));
        // Nothing is forgotten while a session holds the node or the store has it.
        drop(new);
        assert!(!f.sessions.is_live("n1"));
        assert!(f.sessions.forget_expired().is_empty());
        assert_eq!(listed(&f), ["web"]);
        // Once the store expired the node, its metadata goes too.
        f.clock.set(UnixNanos(T0 + 30 * S));
        assert_eq!(f.sessions.sink().store.housekeep(), 1);
        assert_eq!(f.sessions.forget_expired(), ["n1"]);
        assert!(meta.node("n1").is_none());
        assert!(listed(&f).is_empty());
    }

    #[test]
    fn hellos_are_checked() {
        check_hello(&hello("node-a.example")).expect("valid");
        let mut h = hello("node-a");
        h.version = Version { major: 2, minor: 0 };
        let e = check_hello(&h).expect_err("other major").to_string();
        assert!(e.contains("2.0") && e.contains(&VERSION.to_string()), "{e}");
        for bad in ["", "Node-A", "a..b", "-a", "a/b", &"x".repeat(254)] {
            assert!(
                matches!(check_hello(&hello(bad)), Err(HelloError::NodeName { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn pods_per_node_are_bounded() {
        let f = fixture();
        let (mut lease, _) = f.sessions.claim(&hello("n1"));
        let many = |from: usize, n: usize| -> Vec<PodMeta> {
            (from..from + n)
                .map(|i| pod(&format!("u{i}"), &format!("p{i}")))
                .collect()
        };
        let e = lease
            .apply(snapshot(T0, many(0, MAX_PODS_PER_NODE + 1), &[]))
            .expect_err("too many");
        assert!(matches!(e, SessionError::TooManyPods { .. }));
        lease
            .apply(snapshot(T0, many(0, MAX_PODS_PER_NODE), &[]))
            .expect("at the limit");
        // Relabelling known pods, or replacing one by another, stays within it.
        lease
            .apply(update(T0 + S, many(0, 10), &[], &[]))
            .expect("relabel");
        lease
            .apply(update(T0 + S, many(MAX_PODS_PER_NODE, 1), &["u0"], &[]))
            .expect("one out, one in");
        let e = lease
            .apply(update(T0 + S, many(MAX_PODS_PER_NODE + 1, 1), &[], &[]))
            .expect_err("one more");
        assert!(matches!(e, SessionError::TooManyPods { .. }));
    }

    #[test]
    fn invalid_pods_are_not_announced() {
        let f = fixture();
        let (mut lease, _) = f.sessions.claim(&hello("n1"));
        let mut no_ns = pod("u2", "x");
        no_ns.namespace.clear();
        lease
            .apply(snapshot(T0, vec![pod("u1", "web"), no_ns], &["u1", "u2"]))
            .map(|a| a.unknown_uids)
            .expect("snapshot");
        assert_eq!(listed(&f), ["web"]);
    }
}
