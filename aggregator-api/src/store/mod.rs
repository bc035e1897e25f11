//! The in-memory metrics store: the last two cumulative points per node and per container,
//! rates derived at read time, readiness, expiry. Pure data structures: no HTTP, no
//! Kubernetes client, no async; the ingest layer hands it [`NodeBatch`]es and the API layer
//! asks it for [`NodeMetricsPoint`]s and [`PodMetricsPoint`]s.
//!
//! # Model (as metrics-server's `pkg/storage`)
//!
//! - **Two points, rates at read.** For the node and for every container the store keeps the
//!   last point (timestamp, cumulative CPU, working set, instance identity) and the CPU and
//!   timestamp of the point before it (of an earlier point with a served window longer
//!   than one interval, see "Served window"). A read computes
//!   `cpu = Δcpu_ns × 10⁹ / Δt_ns` nanocores in integers (`u128`, saturating to `u64`), with
//!   `window = Δt` and `timestamp = last.timestamp`; memory is the last working set. There
//!   is no float anywhere.
//! - **Full snapshot per node.** A batch replaces the node's whole pod set: a pod that is
//!   not in the batch is forgotten, and a container that is not in its pod's sample is too.
//! - **Restarts.** A new point whose cumulative CPU is lower than the last one's, or whose
//!   instance identity changed (`cgroup_id` or `started_at`, when both points carry it), or
//!   a pod whose uid changed, starts a *new instance*: the old points are never subtracted
//!   from the new ones. metrics-server detects a restart when the new start time is after
//!   the last point's timestamp; for the agents' data we compare for equality instead,
//!   because our agent reports exact, per-instance-constant values (see
//!   `kpulse_wire::ContainerSample`), and the cgroup id catches a restart whatever the
//!   clocks say. The kubelet fallback's store uses metrics-server's rule
//!   ([`RestartRule::StartedAfterLastPoint`]): the start times it reads are not ours.
//! - **Out-of-order points** (the agent's clock stepped back): the new point always becomes
//!   the last one, as in metrics-server; it keeps the previous point only if that one is
//!   strictly older, so there is no rate for the regressed point and rates resume with the
//!   next tick instead of waiting for the clock to catch up.
//! - **Pods are all or nothing**: a pod is served only when every container in its latest
//!   sample has a rate, as metrics-server's `podStorage.GetMetrics` (a container without a
//!   previous point hides the pod). Its timestamp and window are those of the container
//!   with the earliest timestamp (`api.TimeInfo`).
//!
//! # First-interval visibility (a deliberate difference)
//!
//! Without help a new container needs two points, so it stays invisible for one whole
//! interval after its first sample. When the first point of an instance carries
//! `started_at` — the instant its counters were zero, i.e. the cgroup's creation — the store
//! uses `(started_at, cpu = 0)` as the previous point, so the container (or node, with its
//! boot time) is served right after its first sample, with `window = timestamp − started_at`.
//! This only happens when
//!
//! - there is no usable previous point of the same instance (a real one always wins: it is
//!   more recent than the start), and
//! - [`MIN_FIRST_WINDOW`] `≤ timestamp − started_at ≤` [`StoreConfig::first_point_max_age`].
//!
//! The upper bound keeps old containers out: after an aggregator restart every container
//! is "first seen", and `cpu / lifetime` of a week-old container is a lifetime average, not
//! current usage. Such containers wait for a second point. The default (15 s) is
//! metrics-server's default resolution, so a first window is never longer than the windows
//! metrics-server serves in steady state. metrics-server has the same mechanism
//! (`freshContainerMinMetricsResolution`) but applies it only to containers aged between
//! 10 s and one resolution, because kubelet's start time is the runtime's start, not the
//! counter's zero, and its stats may lag; ours is the counter's zero and our timestamp is the
//! read time, so a short window is exact, and the served window says how short it is.
//!
//! # Served window
//!
//! [`StoreConfig::window`] (`--metric-window`) sets how long a span CPU rates are
//! served over. With a window `W`, a series keeps, besides its last point, the point its
//! rate starts from and up to `WINDOW_STEPS` younger points spaced at least
//! `W / WINDOW_STEPS` apart (a fixed array, no allocation). The rate is taken from the
//! newest kept point that is at least `W − W/16` older than the last point (the 1/16
//! absorbs the agents' tick jitter, so a 1 s window over 1 s ticks is one interval, not
//! two), so the window is between `15/16 W` and `W + W/4` plus one agent interval, is
//! stated exactly in `window`, and is still refreshed with every point. A series younger
//! than `W` is served over all of its life so far (from its start time when known, else
//! from its first point), a shorter window that says so. `W = 0` is the previous point, as
//! metrics-server. Gaps, restarts and points back in time drop kept points exactly as
//! they drop the previous point above. No value is interpolated: every rate is the
//! difference of two counter readings.
//!
//! With [`WindowMode::Adaptive`] (`--metric-window-mode=adaptive`), `W` is the longest
//! window. Each series also keeps the mean and spread of its intervals' rates since its
//! CPU level last changed; when two intervals in a row both lie far outside that spread
//! on the same side (`series::Level`), the kept points older than the newest interval
//! are dropped, so the window restarts at one interval and grows back to `W`. A steady or
//! noisy series is served over `W`; a step, over the time since it, about two intervals
//! after it. The window also restarts once when a point lies a second past the pod's Ready
//! transition ([`kpulse_wire::PodSample::ready_since`], sent by agents that watch their
//! pods) while the window reaches back before it: the HPA ignores a pod's CPU in its first
//! minutes while `timestamp < readyTransition + window`, so a new pod would otherwise count
//! only a whole window after it became Ready. The window stated is, as always, exactly the
//! span of the rate.
//!
//! # Expiry
//!
//! Data is *fresh* while both its own timestamp and the time the store received it are at
//! most [`StoreConfig::metric_expiry`] before the store's [`Clock`]. The timestamp catches
//! an agent sending old data (a backlog); the receive time catches a dead agent whose clock
//! runs ahead. Reads never serve data that is not fresh. Ingest never uses an expired point
//! as a previous point (a node that comes back after a gap starts over instead of reporting
//! one rate over the whole gap). Nodes whose last batch expired are removed by
//! [`Store::housekeep`], which ingest also runs by itself once per `metric_expiry`, so
//! expired data stays in memory for at most two expiry periods.
//!
//! # What the server's own metrics read
//!
//! [`Store::stats`] counts what is in memory (nodes, pods, containers, fresh or waiting for
//! housekeeping) and when the newest and oldest node batches arrived, for scrape-time gauges.
//! [`Store::record_served`] tells an observer installed with [`Store::observe_served`] how
//! old each served point is by the store's clock (the API layer calls it for the objects it
//! builds). Neither knows anything of Prometheus.
//!
//! # Readiness
//!
//! As metrics-server's `storage.Ready`: ready when some node has a servable node rate *and*
//! some container has a servable rate. Changes are logged when [`Store::ready`] sees them.
//!
//! # Concurrency
//!
//! Readers never take a lock and never wait for a writer: everything is reached through
//! `arc_swap::ArcSwap` pointers to immutable values.
//!
//! - Each node has a cell holding an `ArcSwap<NodeState>`: an immutable snapshot of the node
//!   and all its pods. Ingest builds the next snapshot next to the current one and swaps the
//!   pointer, so a reader sees a whole batch or the previous one, never a mix. Ingesting a
//!   batch costs the size of that batch only: no other node is copied. Ingest must be
//!   single-writer per node (one agent stream per node); two concurrent batches for the
//!   same node do not corrupt anything, but one of them is lost.
//! - Finding cells: nodes by name in 64 shards, pods by `namespace/name` in 16,384 shards,
//!   each shard an `ArcSwap<HashMap>` replaced copy-on-write. Only node arrival/removal and
//!   pod arrival/removal write there, and each write copies one small shard (about 80 nodes
//!   or about 34 pods at 5,000 nodes × 110 pods), never the whole map; a batch's arrivals and
//!   departures are grouped so that each touched shard is copied once. The pod index points
//!   at the node's cell, so a pod read is two hash lookups. A pod listed by two nodes at once
//!   (a deleted pod's name reused elsewhere before the old node noticed) is served from the
//!   node that reported it most recently; [`Store::pods`] lists both.
//! - Removing a node marks its cell removed before unlinking it, so a reader that still
//!   holds the cell serves nothing from it, and an ingest that raced with the removal takes
//!   back the index entries it added.
//!
//! No concurrent-map crate is needed: `dashmap` would put reader-writer locks on the read
//! path, and lock-free maps (`papaya`, `scc`) would buy little, since the maps only change
//! when pods or nodes come and go; `arc-swap` is already a workspace dependency. Nothing
//! here blocks, so the store can be called from async tasks directly.
//!
//! # Files
//!
//! This file holds the [`Store`] and its public types; the rest is private:
//!
//! - `series.rs`: one series (the node's or a container's) and the rules above: restarts,
//!   points back in time, first-interval visibility, the served window, the rate.
//! - `state.rs`: the immutable per-node snapshot, its cell, and how a batch builds the next
//!   snapshot from the current one.
//! - `key.rs`: [`PodKey`], `namespace/name`.
//! - `sharded.rs`: the copy-on-write sharded maps of the node table and the pod index.
//! - `clock.rs`: [`Clock`], [`SystemClock`], [`ManualClock`].

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use kpulse_wire::{Bytes, NodeBatch, Signals, UnixNanos};

mod clock;
mod key;
mod series;
mod sharded;
mod state;

pub use clock::{Clock, ManualClock, SystemClock};
pub use key::PodKey;

use key::write_key;
use series::Limits;
use sharded::ShardedMap;
use state::{next_state, NodeCell, NodeState, PodState};

/// The shortest first window served from `started_at` (250 ms). Agents know a
/// container's start to 10 ms (the kernel's process start time in clock ticks); over a
/// shorter window that uncertainty would be more than 4 % of the rate, so such a container
/// waits for its second point instead.
pub const MIN_FIRST_WINDOW: Duration = Duration::from_millis(250);

/// Default for [`StoreConfig::first_point_max_age`]: metrics-server's default resolution.
pub const DEFAULT_FIRST_POINT_MAX_AGE: Duration = Duration::from_secs(15);

/// Shards of the node-name table (node arrival copies one shard).
const NODE_SHARDS: usize = 64;
/// Shards of the pod index (pod arrival copies one shard; ~34 pods each at 550,000 pods).
const POD_SHARDS: usize = 16384;

/// A CPU usage rate in nanocores: 10⁹ is one core fully busy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NanoCores(pub u64);

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value that cannot work.
    #[error("invalid store configuration: {field} {reason}")]
    InvalidConfig {
        /// The [`StoreConfig`] field.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A batch without a node name: it cannot be attributed to any node.
    #[error("batch has an empty node name")]
    EmptyNodeName,
}

/// This module's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How long data lives and when a start time may stand in for a previous point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// Data older than this (by its timestamp or by when it was received) is not served,
    /// not used as a previous point, and removed by housekeeping. Must be positive.
    pub metric_expiry: Duration,
    /// The oldest an instance may be at its first point for its start time to serve as the
    /// previous point (see the module docs). Zero disables first-interval visibility.
    pub first_point_max_age: Duration,
    /// The served window: CPU is the rate from the newest kept point at least this old
    /// (less 1/16 of it, for the agents' tick jitter) to the last point, refreshed with
    /// every point (see "Served window" in the module docs). Zero: from the point before
    /// the last, i.e. one agent interval.
    pub window: Duration,
    /// Whether `window` is always served or is the longest served (see "Served window").
    pub window_mode: WindowMode,
    /// What `started_at` says about restarts (see "Restarts").
    pub restarts: RestartRule,
}

/// When a point's `started_at` makes it a new instance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RestartRule {
    /// Whenever it differs from the last point's: the agent reports exact values that are
    /// constant for one instance.
    #[default]
    Changed,
    /// When it is not before the last point's timestamp, as metrics-server decides it: the
    /// kubelet's start times are the runtime's, and endpoints that stand in for the kubelet
    /// may report ones that move between scrapes (kwok's is the pod's age, in seconds since
    /// the epoch), which would otherwise make every point a restart and no rate ever served.
    StartedAfterLastPoint,
}

/// How the served window follows the CPU level (`--metric-window-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum WindowMode {
    /// Every rate over `--metric-window`.
    #[default]
    Fixed,
    /// `--metric-window` at most: while the CPU level holds, the whole window; after a
    /// change of level, the time since it, growing back to the whole window (module docs,
    /// "Served window"; docs/design/aggregator.md, "The adaptive window").
    Adaptive,
}

impl StoreConfig {
    /// A configuration with the given expiry and [`DEFAULT_FIRST_POINT_MAX_AGE`].
    pub fn new(metric_expiry: Duration) -> StoreConfig {
        StoreConfig {
            metric_expiry,
            first_point_max_age: DEFAULT_FIRST_POINT_MAX_AGE,
            window: Duration::ZERO,
            window_mode: WindowMode::Fixed,
            restarts: RestartRule::Changed,
        }
    }
}

/// A node's usage, ready to become a `NodeMetrics` object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeMetricsPoint {
    /// The node's name.
    pub name: Arc<str>,
    /// When the last point was read (the agent's clock).
    pub timestamp: UnixNanos,
    /// The time between the two points the CPU rate comes from.
    pub window: Duration,
    /// Average CPU usage over `window`.
    pub cpu: NanoCores,
    /// Working set at `timestamp`.
    pub memory: Bytes,
    /// Swap in use at `timestamp`; `None` when the node has no swap.
    pub swap: Option<Bytes>,
}

/// A pod's usage, ready to become a `PodMetrics` object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodMetricsPoint {
    /// Namespace and name.
    pub key: PodKey,
    /// `metadata.uid` as the agent reported it; lets the API layer check that these metrics
    /// are of the pod object it holds and not of an earlier pod with the same name.
    pub uid: Arc<str>,
    /// The node the pod's metrics came from.
    pub node: Arc<str>,
    /// The earliest last-point timestamp among the containers.
    pub timestamp: UnixNanos,
    /// The window of the container with that earliest timestamp.
    pub window: Duration,
    /// Every container of the pod's latest sample, in the agent's order.
    pub containers: Vec<ContainerMetricsPoint>,
}

/// One container's usage within a [`PodMetricsPoint`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerMetricsPoint {
    /// The container's name.
    pub name: Arc<str>,
    /// Average CPU usage over the container's window.
    pub cpu: NanoCores,
    /// Working set at the container's last point.
    pub memory: Bytes,
    /// Swap at the container's last point; `None` when its node has no swap.
    pub swap: Option<Bytes>,
}

/// A pod's pressure and throttling over the agent's window (`--custom-metrics`), ready to
/// become `custom.metrics.k8s.io` values. The store keeps them as the agent computed them:
/// shares of a window, not counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSignalsPoint {
    /// Namespace and name.
    pub key: PodKey,
    /// `metadata.uid` as the agent reported it.
    pub uid: Arc<str>,
    /// When the agent read them (its sample's timestamp).
    pub timestamp: UnixNanos,
    /// The pod's own figures (pressure of its pod cgroup, throttling over its cgroups).
    pub pod: Signals,
    /// Each container's, in the agent's order.
    pub containers: Vec<(Arc<str>, Signals)>,
}

/// What one [`Store::ingest`] did, for the ingest layer's metrics and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IngestSummary {
    /// Pods stored.
    pub pods: usize,
    /// Containers stored.
    pub containers: usize,
    /// Containers (and the node) whose new point started a new instance: a restart, a
    /// reboot, or a pod recreated under the same name.
    pub restarts: usize,
    /// Pods left out because the batch had the same `namespace/name` earlier, and
    /// containers left out because their pod had the same name earlier (first one wins).
    pub duplicates: usize,
    /// Pods left out because of an invalid namespace or name, an empty container name,
    /// or no containers at all.
    pub invalid: usize,
}

/// What the store holds, from [`Store::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// The store's clock when the numbers were taken.
    pub taken_at: UnixNanos,
    /// Nodes in memory (including any whose data expired and awaits housekeeping).
    pub nodes: usize,
    /// Pods in memory, summed over nodes (a pod two nodes list counts twice).
    pub pods: usize,
    /// Containers in memory, summed over those pods.
    pub containers: usize,
    /// When the oldest of the nodes' latest batches was received; `None` without nodes.
    pub oldest_received: Option<UnixNanos>,
    /// When the newest batch was received; `None` without nodes.
    pub newest_received: Option<UnixNanos>,
}

impl StoreStats {
    /// Time from the oldest node's latest batch to `taken_at` (zero if it is ahead).
    pub fn oldest_age(&self) -> Option<Duration> {
        self.oldest_received.map(|t| age(t, self.taken_at))
    }

    /// Time from the newest batch to `taken_at` (zero if it is ahead).
    pub fn newest_age(&self) -> Option<Duration> {
        self.newest_received.map(|t| age(t, self.taken_at))
    }
}

/// `now − t`, zero when `t` is not before `now`.
fn age(t: UnixNanos, now: UnixNanos) -> Duration {
    Duration::from_nanos(now.0.saturating_sub(t.0))
}

/// Told the age of each served point by [`Store::record_served`].
type ServedObserver = Box<dyn Fn(Duration) + Send + Sync>;

// ---------------------------------------------------------------------------------------
// The store.

/// The metrics store. Share it (`Arc<Store>`) between the ingest layer and the API layer.
pub struct Store<C = SystemClock> {
    limits: Limits,
    clock: C,
    /// Node name → cell.
    nodes: ShardedMap<Arc<str>, Arc<NodeCell>>,
    /// `namespace/name` → the cell of the node that reported the pod most recently.
    pods: ShardedMap<PodKey, Arc<NodeCell>>,
    /// When housekeeping last ran (store clock).
    last_sweep: AtomicU64,
    /// Readiness as last seen by [`Store::ready`]: bit 0 nodes, bit 1 pods.
    readiness: AtomicU8,
    /// See [`Store::observe_served`].
    served: OnceLock<ServedObserver>,
}

impl<C> fmt::Debug for Store<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Store<SystemClock> {
    /// A store on the system clock.
    pub fn new(config: StoreConfig) -> Result<Store<SystemClock>> {
        Store::with_clock(config, SystemClock)
    }
}

impl<C: Clock> Store<C> {
    /// A store reading time from `clock`.
    pub fn with_clock(config: StoreConfig, clock: C) -> Result<Store<C>> {
        if config.metric_expiry.is_zero() {
            return Err(Error::InvalidConfig {
                field: "metric_expiry",
                reason: "must be positive",
            });
        }
        if config.window_mode == WindowMode::Adaptive && config.window.is_zero() {
            return Err(Error::InvalidConfig {
                field: "window",
                reason: "must be positive for an adaptive window (it is the longest served)",
            });
        }
        let now = clock.now();
        Ok(Store {
            limits: Limits::new(&config),
            clock,
            nodes: ShardedMap::new(NODE_SHARDS),
            pods: ShardedMap::new(POD_SHARDS),
            last_sweep: AtomicU64::new(now.0),
            readiness: AtomicU8::new(0),
            served: OnceLock::new(),
        })
    }

    /// Stores one node's batch, replacing everything known about that node's pods.
    ///
    /// Single writer per node: batches of one node must not be ingested concurrently
    /// (different nodes may). Never panics; malformed pods are skipped and counted.
    pub fn ingest(&self, batch: NodeBatch) -> Result<IngestSummary> {
        if batch.node_name.is_empty() {
            return Err(Error::EmptyNodeName);
        }
        let now = self.clock.now();
        let cell = self.cell_for(&batch.node_name);
        let old = cell.state.load_full();
        let (state, summary, added, removed) = next_state(&self.limits, &old, batch, now);
        let state = Arc::new(state);
        cell.state.store(Arc::clone(&state));

        self.index_pods(&cell, &added, &removed);
        if cell.removed.load(Ordering::SeqCst) {
            // Housekeeping or `remove_node` detached the cell while we wrote to it: take
            // back the index entries we may have added after its cleanup.
            self.unindex_pods(&cell, state.pods.keys());
        }
        self.maybe_sweep(now);
        Ok(summary)
    }

    /// Usage of the named nodes, in the same order; `None` where there is nothing fresh to
    /// serve (unknown node, a single point, expired data).
    pub fn node_metrics(&self, names: &[&str]) -> Vec<Option<NodeMetricsPoint>> {
        let now = self.clock.now();
        names
            .iter()
            .map(|name| {
                let shard = self.nodes.shard(name).load();
                let cell = shard.get(*name)?;
                self.serve_node(cell, &cell.state.load(), now)
            })
            .collect()
    }

    /// Usage of the given `(namespace, name)` pods, in the same order; `None` where there is
    /// nothing fresh to serve or some container of the pod has no rate yet.
    pub fn pod_metrics(&self, pods: &[(&str, &str)]) -> Vec<Option<PodMetricsPoint>> {
        let now = self.clock.now();
        self.each_pod(pods, |cell, state, pod| {
            self.serve_pod(cell, state, pod, now)
        })
    }

    /// Pressure and throttling of the given `(namespace, name)` pods, in the same order;
    /// `None` where the agent sent none or they are not fresh.
    pub fn pod_signals(&self, pods: &[(&str, &str)]) -> Vec<Option<PodSignalsPoint>> {
        let now = self.clock.now();
        self.each_pod(pods, |_, state, pod| {
            let signals = pod.signals.as_deref()?;
            if !self.limits.fresh(state.received_at, now)
                || !self.limits.fresh(signals.timestamp, now)
            {
                return None;
            }
            Some(PodSignalsPoint {
                key: pod.key.clone(),
                uid: Arc::clone(&pod.uid),
                timestamp: signals.timestamp,
                pod: signals.pod,
                containers: pod
                    .containers
                    .iter()
                    .zip(signals.containers.iter())
                    .map(|(c, s)| (Arc::clone(&c.name), *s))
                    .collect(),
            })
        })
    }

    /// For each `(namespace, name)`, in order, what `serve` makes of the pod as its node's
    /// latest state holds it; `None` for a pod the store does not hold.
    fn each_pod<T>(
        &self,
        pods: &[(&str, &str)],
        mut serve: impl FnMut(&NodeCell, &NodeState, &PodState) -> Option<T>,
    ) -> Vec<Option<T>> {
        let mut key = String::new();
        pods.iter()
            .map(|(namespace, name)| {
                if !write_key(&mut key, namespace, name) {
                    return None;
                }
                let shard = self.pods.shard(&key).load();
                let cell = shard.get(key.as_str())?;
                if cell.removed.load(Ordering::Acquire) {
                    return None;
                }
                let state = cell.state.load();
                let pod = state.pods.get(key.as_str())?;
                serve(cell, &state, pod)
            })
            .collect()
    }

    /// Usage of every node that has fresh metrics, in no particular order.
    pub fn nodes(&self) -> Vec<NodeMetricsPoint> {
        let now = self.clock.now();
        let mut out = Vec::new();
        for shard in self.nodes.shards.iter() {
            for cell in shard.load().values() {
                out.extend(self.serve_node(cell, &cell.state.load(), now));
            }
        }
        out
    }

    /// Usage of every pod that can be served, in no particular order. Unlike
    /// [`Store::pod_metrics`], a name that two nodes list at once appears twice.
    pub fn pods(&self) -> Vec<PodMetricsPoint> {
        let now = self.clock.now();
        let mut out = Vec::new();
        for shard in self.nodes.shards.iter() {
            for cell in shard.load().values() {
                let state = cell.state.load();
                if !self.limits.fresh(state.received_at, now) {
                    continue;
                }
                out.extend(
                    state
                        .pods
                        .values()
                        .filter_map(|pod| self.serve_pod(cell, &state, pod, now)),
                );
            }
        }
        out
    }

    /// True once node metrics and pod metrics can both be served, as metrics-server's
    /// `Ready`: some node has a fresh rate and some container has a fresh rate. Logs when
    /// the answer changes.
    pub fn ready(&self) -> bool {
        let (nodes, pods) = (self.node_ready(), self.pod_ready());
        let seen = u8::from(nodes) | (u8::from(pods) << 1);
        if self.readiness.swap(seen, Ordering::Relaxed) != seen {
            if nodes && pods {
                tracing::info!(
                    node_metrics = nodes,
                    pod_metrics = pods,
                    "metric store is ready"
                );
            } else {
                tracing::info!(
                    node_metrics = nodes,
                    pod_metrics = pods,
                    "metric store is not ready"
                );
            }
        }
        nodes && pods
    }

    /// True when some node has a fresh node rate.
    pub fn node_ready(&self) -> bool {
        let now = self.clock.now();
        self.any_node(|cell, state| self.serve_node(cell, state, now).is_some())
    }

    /// True when some container of some pod has a fresh rate.
    pub fn pod_ready(&self) -> bool {
        let now = self.clock.now();
        self.any_node(|_, state| {
            self.limits.fresh(state.received_at, now)
                && state.pods.values().any(|pod| {
                    pod.containers
                        .iter()
                        .any(|c| self.limits.rate(&c.series, now).is_some())
                })
        })
    }

    /// Forgets a node and its pods (for example when the node object is deleted). True if
    /// the node was known.
    pub fn remove_node(&self, name: &str) -> bool {
        let cell = self.nodes.shard(name).load().get(name).cloned();
        match cell {
            Some(cell) => self.detach(&cell),
            None => false,
        }
    }

    /// Whether the store holds anything for a node, fresh or waiting for housekeeping (the
    /// ingest layer forgets a node's metadata once this is false and no agent streams it).
    pub fn contains_node(&self, name: &str) -> bool {
        self.nodes.shard(name).load().contains_key(name)
    }

    /// Removes every node whose last batch was received more than `metric_expiry` ago, with
    /// its pods; returns how many. Ingest runs this by itself once per `metric_expiry`; call
    /// it on a timer too if batches may stop arriving altogether.
    pub fn housekeep(&self) -> usize {
        let now = self.clock.now();
        self.last_sweep.store(now.0, Ordering::Relaxed);
        self.sweep(now)
    }

    /// Counts of what is in memory and the receive times of the newest and oldest node
    /// batches. Walks the node table (not the pods): cheap enough for every scrape.
    pub fn stats(&self) -> StoreStats {
        let mut stats = StoreStats {
            taken_at: self.clock.now(),
            ..StoreStats::default()
        };
        for shard in self.nodes.shards.iter() {
            for cell in shard.load().values() {
                if cell.removed.load(Ordering::Acquire) {
                    continue;
                }
                let state = cell.state.load();
                if state.node.is_none() {
                    // Its first batch is being stored right now.
                    continue;
                }
                stats.nodes += 1;
                stats.pods += state.pods.len();
                stats.containers += state.containers;
                let t = state.received_at;
                stats.oldest_received = Some(stats.oldest_received.map_or(t, |o| o.min(t)));
                stats.newest_received = Some(stats.newest_received.map_or(t, |n| n.max(t)));
            }
        }
        stats
    }

    /// Installs `observer`, which [`Store::record_served`] tells the age of each served point.
    /// Only the first observer is kept: false (and `observer` dropped) if one was installed.
    pub fn observe_served(&self, observer: impl Fn(Duration) + Send + Sync + 'static) -> bool {
        self.served.set(Box::new(observer)).is_ok()
    }

    /// Reports points about to be served, by their timestamps: the observer (if any) is told
    /// `now − timestamp` for each, by the store's clock (zero for timestamps ahead of it).
    pub fn record_served(&self, timestamps: impl IntoIterator<Item = UnixNanos>) {
        let Some(observer) = self.served.get() else {
            return;
        };
        let now = self.clock.now();
        for t in timestamps {
            observer(age(t, now));
        }
    }

    // -- ingest helpers ------------------------------------------------------------------

    fn cell_for(&self, name: &str) -> Arc<NodeCell> {
        if let Some(cell) = self.nodes.shard(name).load().get(name) {
            return Arc::clone(cell);
        }
        let fresh = Arc::new(NodeCell {
            name: Arc::from(name),
            state: ArcSwap::default(),
            removed: AtomicBool::new(false),
        });
        let mut cell = Arc::clone(&fresh);
        self.nodes.edit(self.nodes.index(name), |map| {
            // Re-run on conflict: keep whichever cell is in the map by then.
            cell = Arc::clone(
                map.entry(Arc::clone(&fresh.name))
                    .or_insert_with(|| Arc::clone(&fresh)),
            );
        });
        cell
    }

    /// Points `added` at `cell` (the newest report of a pod wins) and unlinks `removed` if
    /// they still point at `cell`. One copy per touched shard.
    fn index_pods(&self, cell: &Arc<NodeCell>, added: &[PodKey], removed: &[PodKey]) {
        if added.is_empty() && removed.is_empty() {
            return;
        }
        let mut ops: Vec<(usize, &PodKey, bool)> = added
            .iter()
            .map(|k| (self.pods.index(&k.full), k, true))
            .chain(removed.iter().map(|k| (self.pods.index(&k.full), k, false)))
            .collect();
        ops.sort_unstable_by_key(|(shard, _, _)| *shard);
        for group in ops.chunk_by(|a, b| a.0 == b.0) {
            let Some(&(shard, _, _)) = group.first() else {
                continue;
            };
            self.pods.edit(shard, |map| {
                for &(_, key, add) in group {
                    if add {
                        map.insert(key.clone(), Arc::clone(cell));
                    } else if map.get(key).is_some_and(|c| Arc::ptr_eq(c, cell)) {
                        map.remove(key);
                    }
                }
            });
        }
    }

    fn unindex_pods<'a>(&self, cell: &Arc<NodeCell>, keys: impl Iterator<Item = &'a PodKey>) {
        let keys: Vec<PodKey> = keys.cloned().collect();
        self.index_pods(cell, &[], &keys);
    }

    /// Takes a cell out of the node table and its pods out of the index. False if another
    /// caller already did.
    fn detach(&self, cell: &Arc<NodeCell>) -> bool {
        if cell.removed.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.nodes.edit(self.nodes.index(&cell.name), |map| {
            if map.get(&cell.name).is_some_and(|c| Arc::ptr_eq(c, cell)) {
                map.remove(&cell.name);
            }
        });
        let state = cell.state.load_full();
        self.unindex_pods(cell, state.pods.keys());
        true
    }

    fn maybe_sweep(&self, now: UnixNanos) {
        let last = self.last_sweep.load(Ordering::Relaxed);
        if now.0.saturating_sub(last) <= self.limits.expiry {
            return;
        }
        // One ingest does it; the others go on.
        if self
            .last_sweep
            .compare_exchange(last, now.0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.sweep(now);
        }
    }

    fn sweep(&self, now: UnixNanos) -> usize {
        let mut expired = Vec::new();
        for shard in self.nodes.shards.iter() {
            expired.extend(
                shard
                    .load()
                    .values()
                    .filter(|cell| !self.limits.fresh(cell.state.load().received_at, now))
                    .cloned(),
            );
        }
        expired
            .iter()
            .filter(|cell| {
                let detached = self.detach(cell);
                if detached {
                    tracing::info!(node = %cell.name, "dropped a node whose metrics expired");
                }
                detached
            })
            .count()
    }

    // -- read helpers --------------------------------------------------------------------

    fn any_node(&self, mut pred: impl FnMut(&NodeCell, &NodeState) -> bool) -> bool {
        self.nodes.shards.iter().any(|shard| {
            shard
                .load()
                .values()
                .any(|cell| pred(cell, &cell.state.load()))
        })
    }

    fn serve_node(
        &self,
        cell: &NodeCell,
        state: &NodeState,
        now: UnixNanos,
    ) -> Option<NodeMetricsPoint> {
        if !self.limits.fresh(state.received_at, now) {
            return None;
        }
        let rate = self.limits.rate(state.node.as_ref()?, now)?;
        Some(NodeMetricsPoint {
            name: Arc::clone(&cell.name),
            timestamp: rate.timestamp,
            window: rate.window,
            cpu: rate.cpu,
            memory: rate.memory,
            swap: rate.swap,
        })
    }

    fn serve_pod(
        &self,
        cell: &NodeCell,
        state: &NodeState,
        pod: &PodState,
        now: UnixNanos,
    ) -> Option<PodMetricsPoint> {
        if !self.limits.fresh(state.received_at, now) {
            return None;
        }
        let mut containers = Vec::with_capacity(pod.containers.len());
        let mut earliest: Option<(UnixNanos, Duration)> = None;
        for c in pod.containers.iter() {
            let rate = self.limits.rate(&c.series, now)?;
            containers.push(ContainerMetricsPoint {
                name: Arc::clone(&c.name),
                cpu: rate.cpu,
                memory: rate.memory,
                swap: rate.swap,
            });
            if earliest.is_none_or(|(t, _)| rate.timestamp < t) {
                earliest = Some((rate.timestamp, rate.window));
            }
        }
        let (timestamp, window) = earliest?;
        Some(PodMetricsPoint {
            key: pod.key.clone(),
            uid: Arc::clone(&pod.uid),
            node: Arc::clone(&cell.name),
            timestamp,
            window,
            containers,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use kpulse_wire::{CgroupId, ContainerSample, CpuNanos, NodeSample, PodSample};

    use super::series::{cpu_rate, Base, Point, WINDOW_STEPS};
    use super::*;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;
    /// 2023-11-14T22:13:20Z.
    const T0: u64 = 1_700_000_000 * S;

    type TestStore = Store<Arc<ManualClock>>;

    fn store_with(config: StoreConfig) -> (TestStore, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(UnixNanos(T0)));
        let store = Store::with_clock(config, Arc::clone(&clock)).expect("valid config");
        (store, clock)
    }

    /// Expiry 10 s, default first-point age.
    fn store() -> (TestStore, Arc<ManualClock>) {
        store_with(StoreConfig::new(Duration::from_secs(10)))
    }

    fn named(name: &str, t: u64, cpu: u64, mem: u64) -> ContainerSample {
        ContainerSample {
            name: name.into(),
            timestamp: UnixNanos(t),
            cgroup_id: None,
            started_at: None,
            cpu: CpuNanos(cpu),
            memory_working_set: Bytes(mem),
            swap: None,
            signals: None,
        }
    }

    /// Container "c" with 1 byte of memory.
    fn c(t: u64, cpu: u64) -> ContainerSample {
        named("c", t, cpu, 1)
    }

    fn started(mut c: ContainerSample, at: u64) -> ContainerSample {
        c.started_at = Some(UnixNanos(at));
        c
    }

    fn cgroup(mut c: ContainerSample, id: u64) -> ContainerSample {
        c.cgroup_id = Some(CgroupId(id));
        c
    }

    fn pod_in(ns: &str, name: &str, containers: Vec<ContainerSample>) -> PodSample {
        PodSample {
            uid: format!("uid-{ns}-{name}"),
            namespace: ns.into(),
            name: name.into(),
            containers,
            signals: None,
            ready_since: None,
        }
    }

    /// A pod in namespace "ns".
    fn pod(name: &str, containers: Vec<ContainerSample>) -> PodSample {
        pod_in("ns", name, containers)
    }

    /// A batch read at `t` on a node using one core since T0.
    fn batch(node: &str, t: u64, pods: Vec<PodSample>) -> NodeBatch {
        NodeBatch {
            node_name: node.into(),
            sent_at: UnixNanos(t),
            node: NodeSample {
                timestamp: UnixNanos(t),
                started_at: None,
                cpu: CpuNanos(t.saturating_sub(T0)),
                memory_working_set: Bytes(1 << 30),
                swap: None,
            },
            pods,
        }
    }

    /// Ingests with the store's clock at `now`.
    fn ingest_at(s: &TestStore, clock: &ManualClock, now: u64, b: NodeBatch) -> IngestSummary {
        clock.set(UnixNanos(now));
        s.ingest(b).expect("ingest")
    }

    /// Ingests a batch read at `t`, received at `t`.
    fn feed(
        s: &TestStore,
        clock: &ManualClock,
        node: &str,
        t: u64,
        pods: Vec<PodSample>,
    ) -> IngestSummary {
        ingest_at(s, clock, t, batch(node, t, pods))
    }

    fn get(s: &TestStore, name: &str) -> Option<PodMetricsPoint> {
        s.pod_metrics(&[("ns", name)]).pop().flatten()
    }

    fn node(s: &TestStore, name: &str) -> Option<NodeMetricsPoint> {
        s.node_metrics(&[name]).pop().flatten()
    }

    fn cpu_of(p: &PodMetricsPoint, container: &str) -> NanoCores {
        let found = p.containers.iter().find(|c| &*c.name == container);
        found.map(|c| c.cpu).expect("container present")
    }

    #[test]
    fn rates_from_two_points() {
        let (s, clock) = store();
        let (t1, t2) = (T0, T0 + 2 * S);
        feed(
            &s,
            &clock,
            "n1",
            t1,
            vec![pod("p", vec![named("c", t1, S, 100)])],
        );
        assert_eq!(get(&s, "p"), None, "one point gives no rate");
        assert_eq!(node(&s, "n1"), None);

        feed(
            &s,
            &clock,
            "n1",
            t2,
            vec![pod("p", vec![named("c", t2, S + S / 2, 200)])],
        );
        let p = get(&s, "p").expect("two points give a rate");
        assert_eq!((p.key.namespace(), p.key.name()), ("ns", "p"));
        assert_eq!((&*p.uid, &*p.node), ("uid-ns-p", "n1"));
        assert_eq!(p.timestamp, UnixNanos(t2));
        assert_eq!(p.window, Duration::from_secs(2));
        let expected = ContainerMetricsPoint {
            name: Arc::from("c"),
            cpu: NanoCores(250_000_000), // 0.5 s of CPU over 2 s
            memory: Bytes(200),
            swap: None,
        };
        assert_eq!(p.containers, vec![expected]);

        let n = node(&s, "n1").expect("node rate");
        assert_eq!(&*n.name, "n1");
        assert_eq!(n.cpu, NanoCores(S)); // 2 s of CPU over 2 s: one core
        assert_eq!(n.window, Duration::from_secs(2));
        assert_eq!(n.timestamp, UnixNanos(t2));
        assert_eq!(n.memory, Bytes(1 << 30));
    }

    #[test]
    fn third_point_uses_second_as_previous() {
        let (s, clock) = store();
        for (secs, cpu) in [(0, 0), (1, S), (3, S + S / 2)] {
            let t = T0 + secs * S;
            feed(&s, &clock, "n1", t, vec![pod("p", vec![c(t, cpu)])]);
        }
        let p = get(&s, "p").expect("rate");
        assert_eq!(p.window, Duration::from_secs(2));
        assert_eq!(cpu_of(&p, "c"), NanoCores(250_000_000));
    }

    #[test]
    fn restart_detected_by_cpu_decrease() {
        let (s, clock) = store();
        for (secs, cpu) in [(0, 5 * S), (1, 6 * S)] {
            let t = T0 + secs * S;
            feed(&s, &clock, "n1", t, vec![pod("p", vec![c(t, cpu)])]);
        }
        assert!(get(&s, "p").is_some());

        let t = T0 + 2 * S;
        let sum = feed(&s, &clock, "n1", t, vec![pod("p", vec![c(t, S / 10)])]);
        assert_eq!(sum.restarts, 1);
        assert_eq!(get(&s, "p"), None, "no rate across a counter reset");

        let t = T0 + 3 * S;
        feed(
            &s,
            &clock,
            "n1",
            t,
            vec![pod("p", vec![c(t, S / 10 + S / 2)])],
        );
        let p = get(&s, "p").expect("second point of the new instance");
        assert_eq!(cpu_of(&p, "c"), NanoCores(500_000_000));
        assert_eq!(p.window, Duration::from_secs(1));
    }

    #[test]
    fn restart_detected_by_start_time_change() {
        let (s, clock) = store();
        let long_ago = T0 - 3600 * S;
        for (secs, cpu) in [(0, 5 * S), (1, 6 * S)] {
            let t = T0 + secs * S;
            feed(
                &s,
                &clock,
                "n1",
                t,
                vec![pod("p", vec![started(c(t, cpu), long_ago)])],
            );
        }
        assert!(get(&s, "p").is_some());

        // The counter grew, but this is another instance (started half an hour later, too
        // long ago for its start to stand in): no rate from mixing the two.
        let t = T0 + 2 * S;
        let restarted = started(c(t, 9 * S), long_ago + 1800 * S);
        let sum = feed(&s, &clock, "n1", t, vec![pod("p", vec![restarted])]);
        assert_eq!(sum.restarts, 1);
        assert_eq!(get(&s, "p"), None);

        // A restart seen soon after it happened is served from the new start at once
        // (metrics-server: "window from start time").
        let t = T0 + 3 * S;
        let sum = feed(
            &s,
            &clock,
            "n1",
            t,
            vec![pod("p", vec![started(c(t, S / 2), t - S)])],
        );
        assert_eq!(sum.restarts, 1);
        let p = get(&s, "p").expect("rate from the new start");
        assert_eq!(p.window, Duration::from_secs(1));
        assert_eq!(cpu_of(&p, "c"), NanoCores(500_000_000));
    }

    /// The kubelet fallback's rule (metrics-server's): a start time that moves but stays
    /// before the last point is the same instance (kwok reports the pod's age as its start
    /// time, so it moves with every scrape); one not before the last point is a restart.
    #[test]
    fn restart_after_the_last_point_under_the_kubelets_rule() {
        let config = |restarts| StoreConfig {
            first_point_max_age: Duration::ZERO,
            restarts,
            ..StoreConfig::new(Duration::from_secs(10))
        };
        let (changed, changed_clock) = store_with(config(RestartRule::Changed));
        let (kubelet, kubelet_clock) = store_with(config(RestartRule::StartedAfterLastPoint));
        // kwok's: seconds since the epoch, growing by the scrape interval.
        for (secs, cpu, start) in [(0, 5 * S, 78 * S), (1, 6 * S, 79 * S), (2, 7 * S, 80 * S)] {
            let t = T0 + secs * S;
            let p = || vec![pod("p", vec![started(c(t, cpu), start)])];
            feed(&changed, &changed_clock, "n1", t, p());
            feed(&kubelet, &kubelet_clock, "n1", t, p());
        }
        assert_eq!(get(&changed, "p"), None, "every point a new instance");
        let p = get(&kubelet, "p").expect("one instance under the kubelet's rule");
        assert_eq!(cpu_of(&p, "c"), NanoCores(S));
        assert_eq!(p.window, Duration::from_secs(1));

        // Started after the last point (T0 + 2 s): a restart, though the counter grew.
        let t = T0 + 3 * S;
        let restarted = started(c(t, 8 * S), T0 + 2 * S + MS);
        let sum = feed(
            &kubelet,
            &kubelet_clock,
            "n1",
            t,
            vec![pod("p", vec![restarted])],
        );
        assert_eq!(sum.restarts, 1);
        assert_eq!(get(&kubelet, "p"), None, "no rate across the restart");
        // Started before the last point (T0 + 3 s): the same instance, a rate.
        let t = T0 + 4 * S;
        let same = started(c(t, 9 * S), T0 + 3 * S - MS);
        let sum = feed(
            &kubelet,
            &kubelet_clock,
            "n1",
            t,
            vec![pod("p", vec![same])],
        );
        assert_eq!(sum.restarts, 0);
        assert_eq!(
            cpu_of(&get(&kubelet, "p").expect("rate"), "c"),
            NanoCores(S)
        );
        // Started exactly at the last point's time: not before it, a restart (metrics-server
        // keeps the last point only for a start before it).
        let t = T0 + 5 * S;
        let at_last = started(c(t, 10 * S), T0 + 4 * S);
        let sum = feed(
            &kubelet,
            &kubelet_clock,
            "n1",
            t,
            vec![pod("p", vec![at_last])],
        );
        assert_eq!(sum.restarts, 1);
    }

    #[test]
    fn restart_detected_by_cgroup_id_change() {
        let (s, clock) = store();
        for secs in 0..2 {
            let t = T0 + secs * S;
            feed(
                &s,
                &clock,
                "n1",
                t,
                vec![pod("p", vec![cgroup(c(t, secs * S), 7)])],
            );
        }
        assert!(get(&s, "p").is_some());
        let t = T0 + 2 * S;
        let sum = feed(
            &s,
            &clock,
            "n1",
            t,
            vec![pod("p", vec![cgroup(c(t, 3 * S), 8)])],
        );
        assert_eq!(sum.restarts, 1);
        assert_eq!(get(&s, "p"), None);
    }

    #[test]
    fn pod_recreated_with_same_name_starts_over() {
        let (s, clock) = store();
        for secs in 0..2 {
            let t = T0 + secs * S;
            feed(&s, &clock, "n1", t, vec![pod("p", vec![c(t, secs * S)])]);
        }
        let t = T0 + 2 * S;
        let mut recreated = pod("p", vec![c(t, 3 * S)]);
        recreated.uid = "another".into();
        let sum = feed(&s, &clock, "n1", t, vec![recreated]);
        assert_eq!(sum.restarts, 1);
        assert_eq!(get(&s, "p"), None);
    }

    #[test]
    fn new_container_is_visible_after_its_first_interval() {
        let (s, clock) = store();
        // Created 800 ms before its first sample, with 200 ms of CPU: a quarter core.
        let (t1, born) = (T0, T0 - 800 * MS);
        feed(
            &s,
            &clock,
            "n1",
            t1,
            vec![pod("p", vec![started(c(t1, 200 * MS), born)])],
        );
        let p = get(&s, "p").expect("served after the first sample");
        assert_eq!(p.timestamp, UnixNanos(t1));
        assert_eq!(p.window, Duration::from_millis(800));
        assert_eq!(cpu_of(&p, "c"), NanoCores(250_000_000));

        // The second sample is measured from the first, not from the start.
        let t2 = t1 + S;
        feed(
            &s,
            &clock,
            "n1",
            t2,
            vec![pod("p", vec![started(c(t2, 1200 * MS), born)])],
        );
        let p = get(&s, "p").expect("rate");
        assert_eq!(p.window, Duration::from_secs(1));
        assert_eq!(cpu_of(&p, "c"), NanoCores(S));
    }

    #[test]
    fn first_windows_shorter_than_the_minimum_wait_for_a_second_point() {
        let (s, clock) = store();
        let t = T0;
        feed(
            &s,
            &clock,
            "n1",
            t,
            vec![
                pod("young", vec![started(c(t, 10 * MS), t - 100 * MS)]),
                pod("enough", vec![started(c(t, 100 * MS), t - 250 * MS)]),
            ],
        );
        assert!(
            get(&s, "young").is_none(),
            "100 ms: a 10 ms start error is 10 %"
        );
        let p = get(&s, "enough").expect("250 ms is enough");
        assert_eq!(p.window, MIN_FIRST_WINDOW);
        assert_eq!(cpu_of(&p, "c"), NanoCores(400_000_000));
        let t2 = t + S;
        feed(
            &s,
            &clock,
            "n1",
            t2,
            vec![pod("young", vec![started(c(t2, 510 * MS), t - 100 * MS)])],
        );
        let p = get(&s, "young").expect("second point");
        assert_eq!(cpu_of(&p, "c"), NanoCores(500_000_000));
    }

    #[test]
    fn start_time_is_not_used_when_it_cannot_be_trusted() {
        let (s, clock) = store();
        let t = T0;
        let pods = vec![
            // Long-running container first seen (e.g. after an aggregator restart).
            pod("old", vec![started(c(t, S), t - 3600 * S)]),
            // Just past the bound.
            pod("edge", vec![started(c(t, S), t - 15 * S - 1)]),
            // Start at or after the timestamp: no window.
            pod("same", vec![started(c(t, S), t)]),
            pod("future", vec![started(c(t, S), t + S)]),
            pod("unknown", vec![c(t, S)]),
            // Exactly at the bound: used.
            pod("bound", vec![started(c(t, 15 * S), t - 15 * S)]),
        ];
        feed(&s, &clock, "n1", t, pods);
        for name in ["old", "edge", "same", "future", "unknown"] {
            assert_eq!(get(&s, name), None, "{name}");
        }
        assert_eq!(
            get(&s, "bound").map(|p| cpu_of(&p, "c")),
            Some(NanoCores(S))
        );

        // Zero disables the rule.
        let (s, clock) = store_with(StoreConfig {
            metric_expiry: Duration::from_secs(10),
            first_point_max_age: Duration::ZERO,
            ..StoreConfig::new(Duration::from_secs(10))
        });
        feed(
            &s,
            &clock,
            "n1",
            t,
            vec![pod("p", vec![started(c(t, S), t - S)])],
        );
        assert_eq!(get(&s, "p"), None);
    }

    #[test]
    fn freshly_booted_node_is_visible_after_its_first_batch() {
        let (s, clock) = store();
        let mut b = batch("n1", T0, vec![]);
        b.node.cpu = CpuNanos(3 * S);
        b.node.started_at = Some(UnixNanos(T0 - 2 * S));
        ingest_at(&s, &clock, T0, b);
        let n = node(&s, "n1").expect("rate since boot");
        assert_eq!(n.cpu, NanoCores(1_500_000_000));
        assert_eq!(n.window, Duration::from_secs(2));

        // Another boot time is a reboot: a restart of the node's series.
        let t = T0 + S;
        let mut b = batch("n1", t, vec![]);
        b.node.cpu = CpuNanos(4 * S);
        b.node.started_at = Some(UnixNanos(T0 - 3600 * S));
        assert_eq!(ingest_at(&s, &clock, t, b).restarts, 1);
        assert_eq!(node(&s, "n1"), None);
    }

    #[test]
    fn pod_is_served_only_when_every_container_has_a_rate() {
        let (s, clock) = store();
        let t = T0;
        feed(
            &s,
            &clock,
            "n1",
            t,
            vec![pod("p", vec![named("a", t, S, 1)])],
        );
        let t = T0 + S;
        let two = vec![named("a", t, 2 * S, 1), named("b", t, S, 1)];
        feed(&s, &clock, "n1", t, vec![pod("p", two)]);
        assert_eq!(get(&s, "p"), None, "b has a single point");
        assert!(s.pod_ready(), "a has a rate, which is enough for readiness");

        let t = T0 + 2 * S;
        let two = vec![named("a", t, 3 * S, 1), named("b", t, 2 * S, 1)];
        feed(&s, &clock, "n1", t, vec![pod("p", two)]);
        let p = get(&s, "p").expect("both have rates");
        let names: Vec<&str> = p.containers.iter().map(|c| &*c.name).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn pod_timestamp_and_window_are_the_earliest_containers() {
        let (s, clock) = store();
        let t = T0;
        feed(
            &s,
            &clock,
            "n1",
            t,
            vec![pod("p", vec![named("a", t, 0, 1), named("b", t, 0, 1)])],
        );
        let (ta, tb) = (T0 + 2 * S, T0 + 3 * S);
        let two = vec![named("a", ta, S, 1), named("b", tb, S, 1)];
        feed(&s, &clock, "n1", tb, vec![pod("p", two)]);
        let p = get(&s, "p").expect("rate");
        assert_eq!(
            (p.timestamp, p.window),
            (UnixNanos(ta), Duration::from_secs(2))
        );
        assert_eq!(cpu_of(&p, "a"), NanoCores(500_000_000));
        assert_eq!(cpu_of(&p, "b"), NanoCores(333_333_333));
    }

    #[test]
    fn expired_data_is_not_served() {
        let (s, clock) = store();
        for secs in 0..2 {
            let t = T0 + secs * S;
            feed(&s, &clock, "n1", t, vec![pod("p", vec![c(t, secs * S)])]);
        }
        let last = T0 + S;
        clock.set(UnixNanos(last + 10 * S));
        assert!(get(&s, "p").is_some(), "exactly metric_expiry old");
        assert!(node(&s, "n1").is_some());
        assert!(s.ready());

        clock.set(UnixNanos(last + 10 * S + 1));
        assert_eq!(get(&s, "p"), None);
        assert_eq!(node(&s, "n1"), None);
        assert!(s.nodes().is_empty() && s.pods().is_empty());
        assert!(!s.ready());

        assert_eq!(s.housekeep(), 1);
        assert!(!s.remove_node("n1"), "housekeeping dropped it");
        assert_eq!(s.housekeep(), 0);
    }

    #[test]
    fn stats_count_what_is_in_memory_until_housekeeping() {
        let (s, clock) = store();
        assert_eq!(
            s.stats(),
            StoreStats {
                taken_at: UnixNanos(T0),
                ..StoreStats::default()
            }
        );
        assert_eq!(s.stats().newest_age(), None);
        feed(
            &s,
            &clock,
            "n1",
            T0,
            vec![
                pod("a", vec![c(T0, 0), named("d", T0, 0, 1)]),
                pod("b", vec![c(T0, 0)]),
            ],
        );
        // One point each: nothing servable yet, but all of it is stored.
        feed(&s, &clock, "n2", T0 + 3 * S, vec![pod("a", vec![c(T0, 0)])]);
        clock.set(UnixNanos(T0 + 4 * S));
        let st = s.stats();
        assert_eq!(
            (st.nodes, st.pods, st.containers),
            (2, 3, 4),
            "a pod two nodes list counts twice"
        );
        assert_eq!(st.oldest_received, Some(UnixNanos(T0)));
        assert_eq!(st.newest_received, Some(UnixNanos(T0 + 3 * S)));
        assert_eq!(st.oldest_age(), Some(Duration::from_secs(4)));
        assert_eq!(st.newest_age(), Some(Duration::from_secs(1)));

        // n1's batch expires; it stays counted (and ages) until housekeeping removes it.
        clock.set(UnixNanos(T0 + 11 * S));
        assert_eq!(s.stats().oldest_age(), Some(Duration::from_secs(11)));
        assert_eq!(s.housekeep(), 1);
        let st = s.stats();
        assert_eq!((st.nodes, st.pods, st.containers), (1, 1, 1));
        assert_eq!(st.oldest_received, Some(UnixNanos(T0 + 3 * S)));
        assert!(s.remove_node("n2"));
        assert_eq!(s.stats().nodes, 0);
        assert_eq!(s.stats().oldest_received, None);
    }

    #[test]
    fn served_points_are_reported_with_their_age() {
        let (s, clock) = store();
        // Nothing installed: a no-op.
        s.record_served([UnixNanos(T0)]);
        let (tx, rx) = std::sync::mpsc::channel();
        assert!(s.observe_served(move |age| tx.send(age).expect("receiver alive")));
        assert!(!s.observe_served(|_| {}), "the first observer stays");
        clock.set(UnixNanos(T0 + 2 * S));
        s.record_served([
            UnixNanos(T0),
            UnixNanos(T0 + 2 * S - 250 * MS),
            UnixNanos(T0 + 3 * S),
        ]);
        assert_eq!(
            rx.try_iter().collect::<Vec<_>>(),
            vec![
                Duration::from_secs(2),
                Duration::from_millis(250),
                Duration::ZERO
            ]
        );
    }

    #[test]
    fn old_data_received_now_is_not_served() {
        // A backlog: points older than the expiry arrive now.
        let (s, clock) = store();
        for secs in 0..2 {
            let t = T0 + secs * S;
            ingest_at(
                &s,
                &clock,
                T0 + 60 * S,
                batch("n1", t, vec![pod("p", vec![c(t, secs * S)])]),
            );
        }
        assert_eq!(get(&s, "p"), None);
        assert_eq!(node(&s, "n1"), None);
    }

    #[test]
    fn agent_clock_ahead_still_expires_by_receive_time() {
        let (s, clock) = store();
        for secs in 0..2 {
            let t = T0 + 3600 * S + secs * S;
            ingest_at(
                &s,
                &clock,
                T0 + secs * S,
                batch("n1", t, vec![pod("p", vec![c(t, secs * S)])]),
            );
        }
        assert!(
            get(&s, "p").is_some(),
            "timestamps ahead of the store clock are fresh"
        );
        clock.set(UnixNanos(T0 + S + 10 * S + 1));
        assert_eq!(
            get(&s, "p"),
            None,
            "until the agent has been quiet for the expiry"
        );
        assert_eq!(node(&s, "n1"), None);
    }

    #[test]
    fn expired_previous_point_is_not_used() {
        let (s, clock) = store();
        feed(&s, &clock, "n1", T0, vec![pod("p", vec![c(T0, 0)])]);
        // Back after a gap longer than the expiry: no 30 s "rate".
        let t = T0 + 30 * S;
        feed(&s, &clock, "n1", t, vec![pod("p", vec![c(t, 30 * S)])]);
        assert_eq!(get(&s, "p"), None);
        assert_eq!(node(&s, "n1"), None);
        let t = T0 + 31 * S;
        feed(&s, &clock, "n1", t, vec![pod("p", vec![c(t, 31 * S)])]);
        assert_eq!(get(&s, "p").map(|p| p.window), Some(Duration::from_secs(1)));
    }

    #[test]
    fn ingest_drops_expired_nodes_by_itself() {
        let (s, clock) = store();
        feed(&s, &clock, "gone", T0, vec![pod("g", vec![c(T0, 0)])]);
        for secs in 1..=12 {
            feed(&s, &clock, "alive", T0 + secs * S, vec![]);
        }
        assert!(
            !s.remove_node("gone"),
            "an ingest after one expiry period swept it"
        );
        assert!(s.remove_node("alive"));
    }

    #[test]
    fn removed_node_and_its_pods_are_gone() {
        let (s, clock) = store();
        for secs in 0..2 {
            let t = T0 + secs * S;
            feed(&s, &clock, "n1", t, vec![pod("p", vec![c(t, secs * S)])]);
        }
        assert!(get(&s, "p").is_some());
        assert!(s.remove_node("n1"));
        assert!(!s.remove_node("n1"));
        assert_eq!(node(&s, "n1"), None);
        assert_eq!(get(&s, "p"), None);
        assert!(s.nodes().is_empty() && s.pods().is_empty());
        assert!(!s.ready());

        // It comes back: two points again.
        for secs in 2..4 {
            let t = T0 + secs * S;
            feed(&s, &clock, "n1", t, vec![pod("p", vec![c(t, secs * S)])]);
            assert_eq!(get(&s, "p").is_some(), secs == 3);
            assert_eq!(node(&s, "n1").is_some(), secs == 3);
        }
    }

    #[test]
    fn pod_missing_from_a_full_snapshot_is_removed() {
        let (s, clock) = store();
        let both = |t: u64, cpu: u64| vec![pod("a", vec![c(t, cpu)]), pod("b", vec![c(t, cpu)])];
        for secs in 0..2 {
            let t = T0 + secs * S;
            feed(&s, &clock, "n1", t, both(t, secs * S));
        }
        assert_eq!(s.pods().len(), 2);

        let t = T0 + 2 * S;
        feed(&s, &clock, "n1", t, vec![pod("a", vec![c(t, 2 * S)])]);
        assert!(get(&s, "a").is_some());
        assert_eq!(get(&s, "b"), None);
        assert_eq!(s.pods().len(), 1);

        // Back in the next batch: new again.
        let t = T0 + 3 * S;
        feed(&s, &clock, "n1", t, both(t, 3 * S));
        assert_eq!(get(&s, "b"), None);

        // A container missing from its pod's sample is forgotten as well.
        let t = T0 + 4 * S;
        feed(
            &s,
            &clock,
            "n1",
            t,
            vec![pod("a", vec![c(t, 4 * S), named("d", t, 0, 1)])],
        );
        let t = T0 + 5 * S;
        feed(&s, &clock, "n1", t, vec![pod("a", vec![c(t, 5 * S)])]);
        assert_eq!(get(&s, "a").map(|p| p.containers.len()), Some(1));
    }

    #[test]
    fn pod_moving_to_another_node_is_found_there() {
        let (s, clock) = store();
        let node_of = |s: &TestStore| get(s, "p").map(|p| p.node.to_string());
        for secs in 0..2 {
            let t = T0 + secs * S;
            feed(&s, &clock, "a", t, vec![pod("p", vec![c(t, secs * S)])]);
        }
        assert_eq!(node_of(&s).as_deref(), Some("a"));
        for secs in 2..4 {
            let t = T0 + secs * S;
            feed(&s, &clock, "a", t, vec![]);
            feed(&s, &clock, "b", t, vec![pod("p", vec![c(t, secs * S)])]);
        }
        assert_eq!(node_of(&s).as_deref(), Some("b"));

        // While two nodes list the name, the newest report wins, and the older node dropping
        // it does not unlink the newer one.
        let t = T0 + 4 * S;
        feed(&s, &clock, "c", t, vec![pod("p", vec![c(t, 0)])]);
        feed(&s, &clock, "b", t, vec![]);
        let t = T0 + 5 * S;
        feed(&s, &clock, "c", t, vec![pod("p", vec![c(t, S)])]);
        assert_eq!(node_of(&s).as_deref(), Some("c"));
    }

    #[test]
    fn time_going_backwards_gives_no_rate_for_that_point() {
        let (s, clock) = store();
        let at = |secs: u64| T0 + secs * S;
        let feed_at = |secs: u64| {
            feed(
                &s,
                &clock,
                "n1",
                at(secs),
                vec![pod("p", vec![c(at(secs), secs * S)])],
            );
        };
        let window = |s: &TestStore| get(s, "p").map(|p| (p.timestamp, p.window));
        feed_at(10);
        feed_at(12);
        // A repeated point keeps the previous one.
        feed_at(12);
        assert_eq!(
            window(&s),
            Some((UnixNanos(at(12)), Duration::from_secs(2)))
        );
        // prev < new < last: rate from prev, as metrics-server.
        feed_at(11);
        assert_eq!(
            window(&s),
            Some((UnixNanos(at(11)), Duration::from_secs(1)))
        );
        // Older than prev: no rate, never a negative one.
        feed_at(5);
        assert_eq!(get(&s, "p"), None);
        assert_eq!(node(&s, "n1"), None);
        // Rates resume with the next point after it.
        feed_at(6);
        let p = get(&s, "p").expect("resumed");
        assert_eq!(
            (cpu_of(&p, "c"), p.window),
            (NanoCores(S), Duration::from_secs(1))
        );
        // The store's own clock going backwards expires nothing and breaks nothing.
        clock.set(UnixNanos(0));
        assert!(get(&s, "p").is_some());
        assert_eq!(s.housekeep(), 0);
    }

    /// A store serving `window`, expiry 10 s.
    fn windowed(window: Duration) -> (TestStore, Arc<ManualClock>) {
        store_with(StoreConfig {
            window,
            ..StoreConfig::new(Duration::from_secs(10))
        })
    }

    #[test]
    fn a_window_is_the_rate_from_the_newest_point_old_enough() {
        // 4 s window, points every second; the container's usage changes every second
        // (i × 0.1 core in second i), so a wrong base gives a wrong number.
        let (s, clock) = windowed(Duration::from_secs(4));
        let used = |i: u64| (1..=i).map(|k| k * S / 10).sum::<u64>();
        let at = |i: u64| T0 + i * S;
        for i in 0..=20u64 {
            feed(
                &s,
                &clock,
                "n1",
                at(i),
                vec![pod("p", vec![c(at(i), used(i))])],
            );
            let p = get(&s, "p");
            if i == 0 {
                assert_eq!(p, None, "one point gives no rate");
                continue;
            }
            let p = p.expect("a rate from the second point on");
            // Young: the whole series so far; then exactly 4 s.
            let w = i.min(4);
            assert_eq!(p.window, Duration::from_secs(w), "point {i}");
            assert_eq!(p.timestamp, UnixNanos(at(i)));
            assert_eq!(
                cpu_of(&p, "c"),
                NanoCores((used(i) - used(i - w)) / w),
                "point {i}"
            );
        }
        // The node's rate is windowed the same way (one core throughout).
        let n = node(&s, "n1").expect("node");
        assert_eq!((n.window, n.cpu), (Duration::from_secs(4), NanoCores(S)));
    }

    #[test]
    fn tick_jitter_does_not_lengthen_the_window() {
        // 1 s window, points 0.98–1.02 s apart: always the previous point, as with no
        // window at all (a point counts as old enough from 15/16 of the window).
        let (s, clock) = windowed(Duration::from_secs(1));
        let mut t = T0;
        let mut prev = None;
        for i in 0..40u64 {
            t += if i % 2 == 0 { 980 * MS } else { 1020 * MS };
            feed(&s, &clock, "n1", t, vec![pod("p", vec![c(t, t - T0)])]);
            if let Some(before) = prev {
                let p = get(&s, "p").expect("rate");
                assert_eq!(p.window, Duration::from_nanos(t - before), "point {i}");
                assert_eq!(cpu_of(&p, "c"), NanoCores(S));
            }
            prev = Some(t);
        }
    }

    #[test]
    fn long_windows_stay_within_their_bound_with_fast_ticks() {
        // 15 s window with 1 s and 100 ms ticks, a little jitter: the window is never
        // shorter than 15/16 of 15 s once the series is old enough, never longer than
        // 15 s + 15 s / WINDOW_STEPS + one tick, and the rate is exact.
        for tick in [S, 100 * MS] {
            let (s, clock) = windowed(Duration::from_secs(15));
            let mut t = T0;
            for i in 0..(60 * S / tick) {
                t += tick + (i % 3) * MS;
                // Half a core.
                feed(
                    &s,
                    &clock,
                    "n1",
                    t,
                    vec![pod("p", vec![c(t, (t - T0) / 2)])],
                );
                if i == 0 {
                    continue;
                }
                let p = get(&s, "p").expect("rate");
                let w = p.window.as_nanos() as u64;
                if t - T0 >= 16 * S {
                    assert!(w >= 15 * S - 15 * S / 16, "tick {tick}: window {w} at {i}");
                }
                assert!(
                    w <= 15 * S + 15 * S / WINDOW_STEPS + tick + 3 * MS,
                    "tick {tick}: window {w} at {i}"
                );
                let got = cpu_of(&p, "c").0;
                assert!(got.abs_diff(S / 2) <= 1, "tick {tick}: {got} at {i}");
            }
        }
    }

    /// A store serving an adaptive window of `window`, expiry 10 s.
    fn adaptive(window: Duration) -> (TestStore, Arc<ManualClock>) {
        store_with(StoreConfig {
            window,
            window_mode: WindowMode::Adaptive,
            ..StoreConfig::new(Duration::from_secs(10))
        })
    }

    /// Feeds container `c` of pod `p` a point a second from `T0` for each second's usage
    /// in `usage` (nanoseconds of CPU), returning each point's served (window, rate).
    fn feed_seconds(
        s: &TestStore,
        clock: &ManualClock,
        usage: impl IntoIterator<Item = u64>,
    ) -> Vec<Option<(Duration, NanoCores)>> {
        let mut total = 0;
        let mut served = Vec::new();
        let point = |i: u64, total: u64| {
            let t = T0 + i * S;
            feed(s, clock, "n1", t, vec![pod("p", vec![c(t, total)])]);
            get(s, "p").map(|p| (p.window, cpu_of(&p, "c")))
        };
        served.push(point(0, 0));
        for (i, used) in usage.into_iter().enumerate() {
            total += used;
            served.push(point(i as u64 + 1, total));
        }
        served
    }

    #[test]
    fn an_adaptive_window_restarts_at_a_step_and_grows_back() {
        let w = Duration::from_secs(30);
        let (s, clock) = adaptive(w);
        // 45 s idle with a little noise (1 or 3 mCPU), then half a core from 0.3 s into
        // second 46, for 60 s; then idle again.
        let usage = (0..45)
            .map(|i| if i % 2 == 0 { MS } else { 3 * MS })
            .chain([S / 2 * 7 / 10])
            .chain(std::iter::repeat_n(S / 2, 60))
            .chain(std::iter::repeat_n(0, 40));
        let served = feed_seconds(&s, &clock, usage);
        // Idle: the whole window once the series is old enough.
        for (i, got) in served.iter().enumerate().take(46).skip(31) {
            let (window, _) = got.expect("a rate");
            assert!(window >= w - w / 16, "point {i}: {window:?}");
        }
        // Point 46 holds the partial second: one interval cannot move the window.
        assert!(served[46].expect("a rate").0 >= w - w / 16);
        // Point 47: two intervals far above the idle level; the window restarts at the
        // newest interval and serves the new rate exactly.
        assert_eq!(served[47], Some((Duration::from_secs(1), NanoCores(S / 2))));
        // Then it grows back by a second a point (all of it at the new level) until a
        // younger kept point is old enough, never past its bound.
        for (i, got) in served.iter().enumerate().take(107).skip(48) {
            let (window, cpu) = got.expect("a rate");
            assert_eq!(cpu, NanoCores(S / 2), "point {i}");
            if i <= 76 {
                assert_eq!(window, Duration::from_secs(i as u64 - 46), "point {i}");
            }
            assert!(window <= w + w / 4 + Duration::from_secs(1), "point {i}");
        }
        // The drop: the second idle interval restarts it again, at zero.
        assert!(served[107].expect("a rate").0 > Duration::from_secs(1));
        assert_eq!(served[108], Some((Duration::from_secs(1), NanoCores(0))));
        for (i, got) in served.iter().enumerate().skip(109) {
            let (window, cpu) = got.expect("a rate");
            assert_eq!(cpu, NanoCores(0), "point {i}");
            if i <= 136 {
                assert_eq!(window, Duration::from_secs(i as u64 - 107), "point {i}");
            }
        }
    }

    #[test]
    fn an_adaptive_window_holds_through_spikes_and_noise() {
        // A bursty container: 200 mCPU in one second of six (twice in a row once), else
        // idle: a mean near 33 mCPU with spikes far above it, but never two intervals
        // outside the spread of the intervals before them, so always the whole window.
        let w = Duration::from_secs(30);
        let (s, clock) = adaptive(w);
        let usage = || (0..120u64).map(|i| if i % 6 == 0 || i == 61 { 200 * MS } else { 0 });
        let served = feed_seconds(&s, &clock, usage());
        for (i, got) in served.iter().enumerate().skip(31) {
            let (window, _) = got.expect("a rate");
            assert!(window >= w - w / 16, "point {i}: {window:?}");
        }
        // A fixed window over the same points serves the same.
        let (fixed, clock) = windowed(w);
        assert_eq!(feed_seconds(&fixed, &clock, usage()), served);
    }

    #[test]
    fn a_steady_load_changes_level_by_a_fifth_or_more_only() {
        // 500 mCPU for 40 s, then 10 % more (no change of level: within 4 × 5 % of the
        // mean), then 50 % more (a change).
        let w = Duration::from_secs(30);
        let (s, clock) = adaptive(w);
        let usage = std::iter::repeat_n(500 * MS, 40)
            .chain(std::iter::repeat_n(550 * MS, 40))
            .chain(std::iter::repeat_n(750 * MS, 5));
        let served = feed_seconds(&s, &clock, usage);
        for (i, got) in served.iter().enumerate().take(81).skip(31) {
            assert!(got.expect("a rate").0 >= w - w / 16, "point {i}");
        }
        assert_eq!(
            served[82],
            Some((Duration::from_secs(1), NanoCores(750 * MS)))
        );
    }

    /// A pod busy from its start, Ready 5 s later: the adaptive window restarts once a point
    /// lies a second past the (whole-second) Ready transition, so that from then on every
    /// point passes the HPA's initialisation rule (`timestamp`, in whole seconds, at least
    /// the transition + `window`); once, not at every batch that repeats it. A fixed window
    /// ignores readiness.
    #[test]
    fn an_adaptive_window_starts_after_the_pods_ready_transition() {
        let ready = T0 + 5 * S;
        let run = |mode: WindowMode| {
            let (s, clock) = store_with(StoreConfig {
                window: Duration::from_secs(45),
                window_mode: mode,
                ..StoreConfig::new(Duration::from_secs(10))
            });
            (0..=80u64)
                .map(|i| {
                    // Read 0.3 s into each second, 50 mCPU all along.
                    let t = T0 + 300 * MS + i * S;
                    let mut p = pod(
                        "p",
                        vec![started(c(t, (300 + i * 1000) * 50 * MS / 1000), T0)],
                    );
                    // Not Ready before second 6 (the API shows the transition then).
                    p.ready_since = (i >= 6).then_some(UnixNanos(ready));
                    feed(&s, &clock, "n1", t, vec![p]);
                    get(&s, "p").expect("served")
                })
                .collect::<Vec<_>>()
        };
        let counted = |p: &PodMetricsPoint| {
            p.timestamp.0 / S * S >= ready + u64::try_from(p.window.as_nanos()).expect("small")
        };
        let adaptive = run(WindowMode::Adaptive);
        for (i, p) in adaptive.iter().enumerate() {
            assert_eq!(cpu_of(p, "c"), NanoCores(50 * MS), "point {i}");
            if i <= 6 {
                // From the container's start, before Ready.
                assert_eq!(
                    p.window,
                    Duration::from_millis(300 + i as u64 * 1000),
                    "point {i}"
                );
                assert!(!counted(p), "point {i}");
            } else {
                // Restarted at point 6 (6.3 s, the first a second past Ready), then growing.
                assert!(counted(p), "point {i}: {p:?}");
                if i <= 48 {
                    assert_eq!(p.window, Duration::from_secs(i as u64 - 6), "point {i}");
                }
            }
        }
        // Grown back to the whole window, not restarted by the repeated transition.
        assert!(adaptive[80].window >= Duration::from_secs(45) * 15 / 16);
        for (i, p) in run(WindowMode::Fixed).iter().enumerate().take(46) {
            assert_eq!(
                p.window,
                Duration::from_millis(300 + i as u64 * 1000),
                "point {i}"
            );
        }
    }

    #[test]
    fn an_adaptive_window_needs_a_positive_setting() {
        let err = Store::with_clock(
            StoreConfig {
                window_mode: WindowMode::Adaptive,
                ..StoreConfig::new(Duration::from_secs(10))
            },
            ManualClock::new(UnixNanos(T0)),
        )
        .map(|_| ())
        .expect_err("zero adaptive window");
        assert!(err.to_string().contains("window"), "{err}");
    }

    #[test]
    fn windowed_series_start_over_after_a_gap_a_restart_or_a_step_back() {
        let (s, clock) = windowed(Duration::from_secs(5));
        let at = |secs: u64| T0 + secs * S;
        let send = |secs: u64, cpu: u64| {
            feed(
                &s,
                &clock,
                "n1",
                at(secs),
                vec![pod("p", vec![c(at(secs), cpu)])],
            );
        };
        let window = |s: &TestStore| get(s, "p").map(|p| p.window.as_secs());
        // Between 15/16 of 5 s and 5 s + 5 s / WINDOW_STEPS + one tick, in whole seconds.
        let full = |w: Option<u64>| w.is_some_and(|w| (5..=7).contains(&w));
        for i in 0..=8 {
            send(i, i * S);
        }
        assert!(full(window(&s)), "{:?}", window(&s));
        // A gap longer than the expiry: no rate over the gap, a fresh start.
        send(20, 20 * S);
        assert_eq!(window(&s), None);
        send(21, 21 * S);
        assert_eq!(window(&s), Some(1));
        // A restart (the counter went back): the old points are never used.
        send(22, S / 2);
        assert_eq!(window(&s), None);
        for i in 23..=30 {
            send(i, S / 2 + (i - 22) * S / 4);
        }
        assert!(full(window(&s)), "{:?}", window(&s));
        assert_eq!(
            get(&s, "p").map(|p| cpu_of(&p, "c")),
            Some(NanoCores(S / 4))
        );
        // A point back in time keeps the older points and serves from them (over a
        // shorter window while the window slides past the step).
        send(27, S / 2 + 5 * S / 4);
        let p = get(&s, "p").expect("rate from the points before 27 s");
        assert_eq!(p.timestamp, UnixNanos(at(27)));
        assert!(p.window >= Duration::from_secs(1), "{:?}", p.window);
        assert_eq!(cpu_of(&p, "c"), NanoCores(S / 4));
    }

    #[test]
    fn a_new_container_is_served_over_its_life_until_the_window_is_full() {
        // Started 2 s before its first point, within first_point_max_age: served at once
        // over 2 s, then over its whole life until the window (6 s) is reached; after
        // that between 15/16 of it and 6 s + 6 s / WINDOW_STEPS + one tick.
        let (s, clock) = windowed(Duration::from_secs(6));
        let start = T0;
        for i in 2..=12u64 {
            let t = T0 + i * S;
            feed(
                &s,
                &clock,
                "n1",
                t,
                vec![pod("p", vec![started(c(t, i * S / 2), start)])],
            );
            let p = get(&s, "p").expect("served from the first point");
            if i <= 6 {
                assert_eq!(p.window, Duration::from_secs(i), "point {i}");
            } else {
                let w = p.window.as_nanos() as u64;
                assert!(
                    (6 * S - 6 * S / 16..=8 * S + S / 2).contains(&w),
                    "point {i}: {w}"
                );
            }
            assert_eq!(cpu_of(&p, "c"), NanoCores(S / 2));
        }
    }

    /// What an agent sends around a step of its node's wall clock (`kpulse_agent::clock`):
    /// timestamps advance with the boot clock, and at the step every timestamp, every
    /// container's `started_at` and the node's boot instant move by the step. Whatever the
    /// step, every rate served is the true one or absent for one tick; never bent,
    /// negative or absurd.
    #[test]
    fn a_clock_step_on_the_node_restarts_series_and_never_bends_a_rate() {
        // True time: the store's clock. The node booted at BOOT; the container started 1 s
        // after boot and uses half a core; the node uses one core.
        const BOOT: u64 = T0 - 3600 * S;
        let truth = |t: u64| (t - BOOT - S) / 2;
        // (the node's clock error before the step, the step)
        let cases: [(i64, i64); 4] = [
            (0, -500 * MS as i64),
            (30 * S as i64, -30 * S as i64),
            (0, 3600 * S as i64),
            (-2 * S as i64, 2 * S as i64),
        ];
        for (error, step) in cases {
            let (s, clock) = store();
            let shift = |t: u64, by: i64| t.checked_add_signed(by).expect("in range");
            let agent_batch = |t: u64, offset: i64| {
                let anchor = shift(BOOT, offset);
                let mut b = batch(
                    "n1",
                    shift(t, offset),
                    vec![pod(
                        "p",
                        vec![cgroup(
                            started(c(shift(t, offset), truth(t)), anchor + S),
                            7,
                        )],
                    )],
                );
                b.node.started_at = Some(UnixNanos(anchor));
                b.node.cpu = CpuNanos(t - BOOT);
                b
            };
            let mut missing = 0;
            for tick in 0..10u64 {
                let t = T0 + tick * S;
                let offset = if tick < 5 { error } else { error + step };
                ingest_at(&s, &clock, t, agent_batch(t, offset));
                match get(&s, "p") {
                    Some(p) => assert_eq!(
                        (cpu_of(&p, "c"), p.window),
                        (NanoCores(S / 2), Duration::from_secs(1)),
                        "error {error} step {step} tick {tick}"
                    ),
                    None => missing += 1,
                }
                if let Some(n) = node(&s, "n1") {
                    assert_eq!(n.cpu, NanoCores(S), "error {error} step {step} tick {tick}");
                }
            }
            // The first tick (no previous point; the start is too old to serve from) and
            // the tick of the step.
            assert_eq!(missing, 2, "error {error} step {step}");
        }
    }

    #[test]
    fn arithmetic_edges_neither_overflow_nor_panic() {
        let base = |t: u64, cpu: u64| Base {
            timestamp: UnixNanos(t),
            cpu: CpuNanos(cpu),
        };
        let point = |t: u64, cpu: u64| Point {
            timestamp: UnixNanos(t),
            cpu: CpuNanos(cpu),
            memory: Bytes(0),
            swap: None,
            started_at: None,
            cgroup_id: None,
        };
        let rate = |b: Base, p: Point| cpu_rate(b, &p).map(|r| r.0);
        // The whole counter range in one nanosecond saturates.
        assert_eq!(
            rate(base(0, 0), point(1, u64::MAX)),
            Some(NanoCores(u64::MAX))
        );
        // Δcpu × 10⁹ needs more than 64 bits here.
        assert_eq!(
            rate(base(0, 0), point(u64::MAX, u64::MAX)),
            Some(NanoCores(S))
        );
        assert_eq!(rate(base(0, 0), point(u64::MAX, 1)), Some(NanoCores(0)));
        assert_eq!(rate(base(5, 0), point(5, 1)), None, "zero window");
        assert_eq!(rate(base(6, 0), point(5, 1)), None, "negative window");
        assert_eq!(rate(base(0, 2), point(5, 1)), None, "negative usage");

        // Through the store, with extreme configuration and inputs.
        let (s, clock) = store_with(StoreConfig {
            metric_expiry: Duration::MAX,
            first_point_max_age: Duration::MAX,
            ..StoreConfig::new(Duration::MAX)
        });
        let max = u64::MAX;
        let since_epoch = started(named("c", max, max, max), 0);
        ingest_at(
            &s,
            &clock,
            max,
            batch("n1", max, vec![pod("p", vec![since_epoch])]),
        );
        let p = get(&s, "p").expect("rate since the epoch");
        assert_eq!(cpu_of(&p, "c"), NanoCores(S));
        assert_eq!(p.containers[0].memory, Bytes(max));
        clock.advance(Duration::MAX);
        assert!(get(&s, "p").is_some());
        let backwards = started(named("c", 0, 0, 0), max);
        ingest_at(
            &s,
            &clock,
            0,
            batch("n1", 0, vec![pod("p", vec![backwards])]),
        );
        assert_eq!(get(&s, "p"), None);
        assert_eq!(s.housekeep(), 0);
    }

    #[test]
    fn malformed_input_is_skipped_and_counted() {
        let (s, clock) = store();
        let t = T0;
        let pods = vec![
            pod("ok", vec![c(t, 0), c(t, 9)]), // duplicate container
            pod("ok", vec![c(t, 0)]),          // duplicate pod
            pod_in("a/b", "p", vec![c(t, 0)]),
            pod_in("", "p", vec![c(t, 0)]),
            pod("", vec![c(t, 0)]),
            pod("empty", vec![]),
            pod("unnamed", vec![named("", t, 0, 0)]),
        ];
        let sum = feed(&s, &clock, "n1", t, pods);
        let expected = IngestSummary {
            pods: 1,
            containers: 1,
            restarts: 0,
            duplicates: 2,
            invalid: 5,
        };
        assert_eq!(sum, expected);
        let unnamed = s.ingest(batch("", t, vec![]));
        assert!(matches!(unnamed, Err(Error::EmptyNodeName)));
        assert_eq!(
            s.pod_metrics(&[("a/b", "p"), ("", ""), ("ns", "ok")]),
            [None, None, None]
        );
        let zero = Store::new(StoreConfig::new(Duration::ZERO));
        assert!(matches!(
            zero,
            Err(Error::InvalidConfig {
                field: "metric_expiry",
                ..
            })
        ));
    }

    #[test]
    fn readiness_mirrors_metrics_server() {
        let (s, clock) = store();
        assert!(!s.ready());
        // First points give neither node nor pod rates.
        feed(&s, &clock, "n1", T0, vec![pod("p", vec![c(T0, 0)])]);
        assert!(!s.ready());
        // Node rates alone are not enough.
        feed(&s, &clock, "n1", T0 + S, vec![]);
        assert!(s.node_ready() && !s.pod_ready() && !s.ready());
        for secs in 2..4 {
            let t = T0 + secs * S;
            feed(&s, &clock, "n1", t, vec![pod("p", vec![c(t, secs * S)])]);
        }
        assert!(s.ready());
        clock.advance(Duration::from_secs(11));
        assert!(!s.ready(), "expired data does not keep the store ready");
    }

    /// Readers run while a writer ingests; every answer must come from one whole batch.
    #[test]
    fn concurrent_reads_during_ingest_see_whole_batches() {
        const NODES: usize = 4;
        const PODS: usize = 25;
        const TICKS: u64 = 300;
        let (s, clock) = store_with(StoreConfig::new(Duration::from_secs(3600)));
        let keys: Vec<(String, String)> = (0..PODS * NODES)
            .map(|i| (format!("ns{}", i % 3), format!("pod-{i}")))
            .collect();
        let query: Vec<(&str, &str)> = keys.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        let make = |n: usize, tick: u64| {
            let t = T0 + tick * S;
            let pods = (n * PODS..(n + 1) * PODS).map(|i| {
                let (ns, name) = query[i];
                // Memory carries the tick, so that mixing two batches would show.
                let a = named("a", t, tick * 250 * MS, tick);
                let b = named("b", t, tick * 500 * MS, tick);
                pod_in(ns, name, vec![a, b])
            });
            batch(&format!("node-{n}"), t, pods.collect())
        };
        let check = |p: &PodMetricsPoint| {
            let tick = p.containers[0].memory.0;
            assert_eq!(p.containers.len(), 2);
            assert_eq!(p.containers[1].memory.0, tick, "containers of one batch");
            assert_eq!(p.timestamp, UnixNanos(T0 + tick * S));
            assert_eq!(p.window, Duration::from_secs(1));
            assert_eq!(p.containers[0].cpu, NanoCores(250 * MS));
            assert_eq!(p.containers[1].cpu, NanoCores(500 * MS));
        };
        let done = AtomicBool::new(false);
        let reads = AtomicUsize::new(0);
        let served = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for tick in 1..=TICKS {
                    clock.set(UnixNanos(T0 + tick * S));
                    for n in 0..NODES {
                        s.ingest(make(n, tick)).expect("ingest");
                    }
                }
                done.store(true, Ordering::SeqCst);
            });
            for reader in 0..3 {
                let (s, query, check) = (&s, &query, &check);
                let (done, reads, served) = (&done, &reads, &served);
                scope.spawn(move || {
                    while !done.load(Ordering::SeqCst) {
                        let got = s.pod_metrics(query);
                        assert_eq!(got.len(), query.len());
                        for p in got.iter().flatten() {
                            check(p);
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        if reader == 0 {
                            s.pods().iter().for_each(check);
                            for n in s.nodes() {
                                assert_eq!(n.cpu, NanoCores(S));
                            }
                            let _ = s.ready();
                        }
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert!(reads.load(Ordering::Relaxed) > 0);
        assert!(served.load(Ordering::Relaxed) > 0);
        assert!(s.pod_metrics(&query).iter().all(Option::is_some));
        assert_eq!(s.nodes().len(), NODES);
    }
}
