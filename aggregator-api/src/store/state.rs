//! The stored state, immutable once published: one [`NodeState`] snapshot per node (the
//! node's series and all its pods), the [`NodeCell`] that points at the current one, and
//! [`next_state`], which builds a node's next snapshot from the current one and a batch.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use arc_swap::ArcSwap;
use kpulse_wire::{Fraction, NodeBatch, Signals, UnixNanos};

use super::key::{write_key, PodKey};
use super::series::{Limits, Point, Series};
use super::IngestSummary;

#[derive(Debug)]
pub(super) struct ContainerState {
    pub(super) name: Arc<str>,
    pub(super) series: Series,
}

#[derive(Debug)]
pub(super) struct PodState {
    pub(super) key: PodKey,
    pub(super) uid: Arc<str>,
    pub(super) containers: Box<[ContainerState]>,
    /// Pressure and throttling, when the agent sends them (`--custom-metrics`): boxed, so
    /// that a pod without them costs one pointer.
    pub(super) signals: Option<Box<PodSignals>>,
}

/// The pressure and throttling of a pod's latest sample, as the agent computed them.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct PodSignals {
    /// The sample's timestamp (the earliest of its containers').
    pub(super) timestamp: UnixNanos,
    /// The pod's own figures.
    pub(super) pod: Signals,
    /// Each container's, in the order of [`PodState::containers`].
    pub(super) containers: Box<[Signals]>,
}

/// The figures a peer could have sent; the others are dropped.
fn valid_signals(s: Option<Signals>) -> Signals {
    let keep = |f: Option<Fraction>| f.filter(Fraction::is_valid);
    let s = s.unwrap_or_default();
    Signals {
        cpu_pressure: keep(s.cpu_pressure),
        memory_pressure: keep(s.memory_pressure),
        cpu_throttled: keep(s.cpu_throttled),
    }
}

/// One node as of its latest batch.
#[derive(Debug, Default)]
pub(super) struct NodeState {
    /// The store's clock when the batch arrived; 0 for a cell that never got one.
    pub(super) received_at: UnixNanos,
    pub(super) node: Option<Series>,
    pub(super) pods: HashMap<PodKey, PodState>,
    /// Containers over all `pods`.
    pub(super) containers: usize,
}

#[derive(Debug)]
pub(super) struct NodeCell {
    pub(super) name: Arc<str>,
    pub(super) state: ArcSwap<NodeState>,
    /// Set once the cell left the node table; readers then ignore it.
    pub(super) removed: AtomicBool,
}

/// Builds the node's next state from its current one and a batch. Also returns the pods
/// that were not in the current state and those that are no longer in it.
pub(super) fn next_state(
    limits: &Limits,
    old: &NodeState,
    batch: NodeBatch,
    now: UnixNanos,
) -> (NodeState, IngestSummary, Vec<PodKey>, Vec<PodKey>) {
    let mut summary = IngestSummary::default();
    let (node, node_restarted) =
        limits.advance(old.node.as_ref(), Point::of_node(&batch.node), now, None);
    summary.restarts += usize::from(node_restarted);

    let mut pods: HashMap<PodKey, PodState> = HashMap::with_capacity(batch.pods.len());
    let mut added = Vec::new();
    let mut kept = 0;
    let mut key = String::new();
    for pod in batch.pods {
        if !write_key(&mut key, &pod.namespace, &pod.name)
            || pod.containers.is_empty()
            || pod.containers.iter().any(|c| c.name.is_empty())
        {
            summary.invalid += 1;
            continue;
        }
        let old_pod = old.pods.get(key.as_str());
        let pod_key = match old_pod {
            Some(p) => p.key.clone(),
            None => PodKey::from_key_str(&key),
        };
        let slot = match pods.entry(pod_key) {
            Entry::Occupied(_) => {
                summary.duplicates += 1;
                continue;
            }
            Entry::Vacant(slot) => slot,
        };
        // Points of an earlier pod with the same name are not this pod's.
        let same_pod = old_pod.filter(|p| *p.uid == *pod.uid);
        let mut containers: Vec<ContainerState> = Vec::with_capacity(pod.containers.len());
        let with_signals =
            pod.signals.is_some() || pod.containers.iter().any(|c| c.signals.is_some());
        // Sized once: boxed below without a reallocation.
        let mut container_signals: Vec<Signals> = Vec::with_capacity(if with_signals {
            pod.containers.len()
        } else {
            0
        });
        let timestamp = pod.containers.iter().map(|c| c.timestamp).min();
        let ready_since = pod.ready_since;
        for sample in pod.containers {
            if containers.iter().any(|c| *c.name == *sample.name) {
                summary.duplicates += 1;
                continue;
            }
            let old_container =
                same_pod.and_then(|p| p.containers.iter().find(|c| *c.name == *sample.name));
            let (series, restarted) = limits.advance(
                old_container.map(|c| &c.series),
                Point::of_container(&sample),
                now,
                ready_since,
            );
            summary.restarts += usize::from(restarted || (old_pod.is_some() && same_pod.is_none()));
            if with_signals {
                container_signals.push(valid_signals(sample.signals));
            }
            containers.push(ContainerState {
                name: old_container
                    .map(|c| Arc::clone(&c.name))
                    .unwrap_or_else(|| Arc::from(sample.name)),
                series,
            });
        }
        let uid = match same_pod {
            Some(p) => Arc::clone(&p.uid),
            None => Arc::from(pod.uid),
        };
        if old_pod.is_some() {
            kept += 1;
        } else {
            added.push(slot.key().clone());
        }
        summary.pods += 1;
        summary.containers += containers.len();
        let key = slot.key().clone();
        let signals = match timestamp {
            Some(timestamp) if with_signals => Some(Box::new(PodSignals {
                timestamp,
                pod: valid_signals(pod.signals),
                containers: container_signals.into_boxed_slice(),
            })),
            _ => None,
        };
        slot.insert(PodState {
            key,
            uid,
            containers: containers.into_boxed_slice(),
            signals,
        });
    }
    // Every pod of the old state that the batch did not list; none in steady state.
    let removed = if kept == old.pods.len() {
        Vec::new()
    } else {
        old.pods
            .keys()
            .filter(|k| !pods.contains_key(k.full.as_ref()))
            .cloned()
            .collect()
    };
    let state = NodeState {
        received_at: now,
        node: Some(node),
        pods,
        containers: summary.containers,
    };
    (state, summary, added, removed)
}
