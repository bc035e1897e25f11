//! The kubelet, where the agent is not: the fallback that keeps every node served.
//!
//! metrics-server scrapes every kubelet's `/metrics/resource`; kpulse's agents stream
//! instead. A node with no agent streaming its data — no agent pod there (Windows, another
//! architecture, a nodeSelector or taint that keeps the DaemonSet off it), an agent pod
//! that is not Ready (crash-looping, being rolled out or deleted), or an agent silent for
//! longer than `--metric-expiry` — is scraped here as metrics-server would scrape it, into
//! a store of its own ([`Fallback::store`], the window metrics-server serves: the
//! kubelet's last two points, `--metric-resolution` apart, with the kubelet's timestamps).
//! [`crate::sources::Sources`] serves each node and pod from its agent's data when that
//! is there, from here otherwise; once the agent streams again its data takes over, and
//! what was scraped here lingers for two resolutions (so that pods the agent has no rate
//! for yet stay served) and is then dropped.
//!
//! Scrapes: when a node enters the fallback, then every [`FIRST_INTERVAL`] until its
//! readings give the node and its pods a rate (two with different timestamps: a kubelet that
//! serves cached stats, as 1.34's does, moves them only at its housekeeping, every 10–15 s)
//! but for at most [`FAST_RESOLUTIONS`] resolutions, then every `--metric-resolution`; a
//! kubelet whose last scrape failed, every `--metric-resolution` as metrics-server retries
//! it. At most
//! [`MAX_CONCURRENT`] at once, each within `--kubelet-request-timeout`; they run on their
//! own tasks, so a slow kubelet delays nothing else. A kubelet that fails (refused, timed
//! out, HTTP error, an answer over 8 MiB, text that does not parse) is logged at WARN and
//! counted; that node keeps what it had until it expires, and nothing else is affected.
//! The fallback also scrapes a node whose agent serves it but reports pods it has no
//! counters for at two looks [`INCOMPLETE_CHECK`] apart (pods in VM sandboxes, whose
//! containers' cgroups are inside the guest): the kubelet has their stats where the runtime
//! reports them, and [`crate::sources::Sources`] serves those pods from here, the node and
//! its other pods from the agent. (A pod that is not running yet, or no longer, lacks
//! counters too: such a node is then scraped every resolution, as metrics-server scrapes
//! every node, and nothing of it is served from here that the agent has.)
//!
//! Which pods exist, their uids and labels (for label selectors and the HPA) come from a
//! metadata-only list of the node's pods (`fieldSelector=spec.nodeName=…`) made with each
//! scrape.
//!
//! Operators see where each node's data comes from in `kpulse_aggregator_node_source`
//! (label `source`: `agent` or `kubelet`), and one INFO line per switch.

pub mod client;
pub mod parse;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Node, Pod};
use kpulse_wire::{ContainerSample, NodeBatch, NodeSample, PodSample, UnixNanos};
use parking_lot::Mutex;

use crate::{
    agents::AgentPods,
    metadata::{Announced, StreamMetadata},
    nodes::ClusterNodes,
    store::{RestartRule, Store, StoreConfig, WindowMode},
};

/// How often a node that entered the fallback is scraped until the kubelet's readings give
/// it and its pods a rate (for at most [`FAST_RESOLUTIONS`] resolutions): a rate needs two
/// readings with different timestamps, and a node should not wait a whole resolution for
/// its first. 5 s: within the 10 s `--metric-expiry` for which an agent that has just
/// stopped is still served, so a crashed agent's node is served again about as soon as its
/// data ends where the kubelet reads stats on demand (1.37); a kubelet serving cached
/// stats (1.34) moves them at its housekeeping, 10–15 s. The first rate is then over those
/// seconds (the served `window` says so); later ones over `--metric-resolution`, as
/// metrics-server's.
pub const FIRST_INTERVAL: Duration = Duration::from_secs(5);
/// How many resolutions after entering the fallback a node may be scraped every
/// [`FIRST_INTERVAL`]: a kubelet whose readings never give a rate (a stuck housekeeping,
/// a clock far behind) is then scraped as metrics-server scrapes it.
pub const FAST_RESOLUTIONS: u32 = 2;
/// Scrapes in flight at most.
pub const MAX_CONCURRENT: usize = 128;
/// How long after this replica starts a node whose agent pod is Ready but whose agent has
/// not streamed to it falls back (agents find a new replica when they next resolve its
/// Service, within about 10 s).
pub const AGENT_GRACE: Duration = Duration::from_secs(20);
/// How long a node's kubelet data stays after its agent's data is served again.
pub const LINGER_RESOLUTIONS: u32 = 2;
/// How often the nodes whose agents serve them are looked at for pods without metrics; a
/// pod must lack them at two looks in a row (a new pod has its first rate about a second
/// after its containers start).
pub const INCOMPLETE_CHECK: Duration = Duration::from_secs(5);
/// How often a node's address is looked up again (also after every failed scrape).
const ADDRESS_MAX_AGE: Duration = Duration::from_secs(600);

/// Where each node's kubelet answers, and when that was looked up.
type Targets = Mutex<HashMap<String, (client::Target, Instant)>>;

/// Why a node is served from its kubelet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// No Ready agent pod runs there.
    NoReadyAgent,
    /// Its agent is Ready but its data is not servable: older than `--metric-expiry`, or
    /// never sent to this replica within [`AGENT_GRACE`] of its start.
    AgentSilent,
    /// Its agent serves the node but reports pods it cannot measure (their metadata
    /// without their counters: a VM sandbox, whose containers' cgroups are in the guest);
    /// the kubelet serves those pods where the runtime gives it their stats.
    IncompletePods,
}

impl Why {
    fn text(self) -> &'static str {
        match self {
            Why::NoReadyAgent => "no Ready agent pod on the node",
            Why::AgentSilent => {
                "its agent's data is not servable (older than --metric-expiry, or none)"
            }
            Why::IncompletePods => "its agent reports pods it cannot measure",
        }
    }
}

/// Which source serves one node, for `kpulse_aggregator_node_source`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The node's agent.
    Agent,
    /// Its kubelet, through this fallback.
    Kubelet,
}

impl Source {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Source::Agent => "agent",
            Source::Kubelet => "kubelet",
        }
    }
}

/// What the fallback has done, for the server's own metrics.
#[derive(Debug, Default)]
pub struct Stats {
    sources: Mutex<BTreeMap<String, Source>>,
    scrapes: Mutex<BTreeMap<&'static str, u64>>,
    pods_skipped: Mutex<BTreeMap<&'static str, u64>>,
    scrape_seconds_sum: AtomicU64,
}

impl Stats {
    /// Each node served, by where its data comes from.
    pub fn sources(&self) -> Vec<(String, Source)> {
        self.sources
            .lock()
            .iter()
            .map(|(n, s)| (n.clone(), *s))
            .collect()
    }

    /// Scrapes by result (`ok`, or the error's label).
    pub fn scrapes(&self) -> Vec<(&'static str, u64)> {
        self.scrapes.lock().iter().map(|(k, v)| (*k, *v)).collect()
    }

    /// Pods a kubelet reported but that were not served, by reason.
    pub fn pods_skipped(&self) -> Vec<(&'static str, u64)> {
        self.pods_skipped
            .lock()
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect()
    }

    /// Total time spent in scrapes, seconds.
    pub fn scrape_seconds(&self) -> f64 {
        self.scrape_seconds_sum.load(Ordering::Relaxed) as f64 / 1e6
    }

    fn count(map: &Mutex<BTreeMap<&'static str, u64>>, key: &'static str, n: u64) {
        if n > 0 {
            *map.lock().entry(key).or_default() += n;
        }
    }
}

/// The fallback's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `--metric-resolution`: how often a node in the fallback is scraped.
    pub resolution: Duration,
}

/// The kubelet store, its pods' metadata and what the fallback has done.
#[derive(Debug)]
pub struct Fallback {
    /// What kubelets answered, as metrics-server stores it.
    pub store: Arc<Store>,
    /// The pods those answers name, with their labels.
    pub metadata: Arc<StreamMetadata>,
    /// Counters and each node's source.
    pub stats: Arc<Stats>,
    settings: Settings,
}

impl Fallback {
    /// An empty fallback.
    ///
    /// # Errors
    ///
    /// A resolution the store refuses (zero).
    pub fn new(settings: Settings) -> anyhow::Result<Arc<Fallback>> {
        let store = Store::new(StoreConfig {
            // Three resolutions: one missed scrape does not take a node away.
            metric_expiry: settings.resolution * 3,
            // The kubelet's start times are the runtime's, not the counters' zero: two
            // points, as metrics-server's steady state.
            first_point_max_age: Duration::ZERO,
            window: Duration::ZERO,
            window_mode: WindowMode::Fixed,
            // metrics-server's: a start time not before the last point is a restart.
            restarts: RestartRule::StartedAfterLastPoint,
        })?;
        Ok(Arc::new(Fallback {
            store: Arc::new(store),
            metadata: StreamMetadata::new(),
            stats: Arc::new(Stats::default()),
            settings,
        }))
    }
}

/// What the loop watches and reaches.
#[derive(Clone)]
pub struct Inputs {
    /// The Kubernetes API: Nodes (addresses) and Pods (metadata of a node's pods).
    pub api: kube::Client,
    /// The kubelets.
    pub kubelet: client::Client,
    /// Which nodes exist.
    pub nodes: Arc<ClusterNodes>,
    /// Which nodes run a Ready agent.
    pub agents: Arc<AgentPods>,
    /// The agents' data.
    pub agent_store: Arc<Store>,
    /// The pods the agents report (with or without their counters).
    pub agent_metadata: Arc<StreamMetadata>,
}

/// The pods `node`'s agent reports that its data has no servable metrics for.
pub fn unmeasured_pods(metadata: &StreamMetadata, store: &Store, node: &str) -> usize {
    let keys = metadata.pods_of(node);
    let refs: Vec<(&str, &str)> = keys.iter().map(|k| (k.namespace(), k.name())).collect();
    store
        .pod_metrics(&refs)
        .iter()
        .filter(|p| p.is_none())
        .count()
}

/// One node in the fallback.
struct Entry {
    why: Why,
    /// When it entered the fallback.
    entered: Instant,
    /// When its last scrape started.
    last: Option<Instant>,
    in_flight: Arc<std::sync::atomic::AtomicBool>,
    /// Whether its last scrape failed.
    failed: Arc<std::sync::atomic::AtomicBool>,
    /// When the agent's data came back (the linger starts).
    agent_back: Option<Instant>,
}

/// Decides every second which nodes fall back and scrapes them. Never returns.
pub async fn run(fallback: Arc<Fallback>, inputs: Inputs) {
    let started = Instant::now();
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT));
    let targets: Arc<Targets> = Arc::default();
    let mut agent_seen: HashSet<String> = HashSet::new();
    // Each node's in-flight flag outlives its entry: one scrape of a node at a time.
    let mut flights: HashMap<String, Arc<std::sync::atomic::AtomicBool>> = HashMap::new();
    // Nodes with unmeasured pods at the last look, and when the next look is.
    let mut unmeasured: HashMap<String, u8> = HashMap::new();
    let mut next_look = Instant::now();
    let mut fallen: HashMap<String, Entry> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let settings = fallback.settings.clone();
    let linger = settings.resolution * LINGER_RESOLUTIONS;
    loop {
        tick.tick().await;
        // Until both lists are complete nothing says which nodes lack an agent.
        if !inputs.nodes.listed() || !inputs.agents.listed() {
            continue;
        }
        let now = Instant::now();
        let ready = inputs.agents.ready_nodes();
        let names: Vec<String> = inputs.nodes.collect(|(n, _)| n.clone());
        let mut sources = BTreeMap::new();
        let look = now >= next_look;
        if look {
            next_look = now + INCOMPLETE_CHECK;
        }
        for name in &names {
            let agent_serves = inputs
                .agent_store
                .node_metrics(&[name])
                .first()
                .is_some_and(Option::is_some);
            // Served by its agent since this replica started: once that data has expired the
            // node falls back at once; never served: after AGENT_GRACE (agents find a new
            // replica when they next resolve its Service).
            let known = if agent_serves {
                agent_seen.insert(name.clone());
                true
            } else {
                agent_seen.contains(name)
            };
            if look {
                let missing = agent_serves
                    && unmeasured_pods(&inputs.agent_metadata, &inputs.agent_store, name) > 0;
                if missing {
                    let looks = unmeasured.entry(name.clone()).or_default();
                    *looks = looks.saturating_add(1);
                } else {
                    unmeasured.remove(name);
                }
            }
            let why = if !ready.contains(name) {
                Some(Why::NoReadyAgent)
            } else if !agent_serves && (known || now.duration_since(started) > AGENT_GRACE) {
                Some(Why::AgentSilent)
            } else if unmeasured.get(name).is_some_and(|looks| *looks >= 2) {
                Some(Why::IncompletePods)
            } else {
                None
            };
            match (why, fallen.get_mut(name)) {
                (Some(why), None) => {
                    tracing::info!(
                        node = %name,
                        reason = why.text(),
                        "serving the node from its kubelet"
                    );
                    let in_flight = flights.entry(name.clone()).or_default().clone();
                    // What a late scrape of an earlier entry left is no reading of this one.
                    if !in_flight.load(Ordering::Acquire) {
                        fallback.store.remove_node(name);
                        fallback.metadata.remove_node(name);
                    }
                    fallen.insert(
                        name.clone(),
                        Entry {
                            why,
                            entered: now,
                            last: None,
                            in_flight,
                            failed: Arc::default(),
                            agent_back: None,
                        },
                    );
                }
                (Some(why), Some(e)) => {
                    if e.why != why || e.agent_back.is_some() {
                        tracing::info!(
                            node = %name,
                            reason = why.text(),
                            "serving the node from its kubelet"
                        );
                    }
                    e.why = why;
                    e.agent_back = None;
                }
                // Keep scraping a node with a Ready agent until its agent's data is served.
                (None, Some(e)) if e.agent_back.is_none() && agent_serves => {
                    if e.why == Why::IncompletePods {
                        tracing::info!(node = %name, "every pod the agent reports is measured again");
                    } else {
                        tracing::info!(node = %name, "serving the node from its agent again");
                    }
                    e.agent_back = Some(now);
                }
                _ => {}
            }
            // A node whose agent serves it stays the agent's, whatever pods it lacks.
            let source = match fallen.get(name) {
                Some(e) if e.agent_back.is_none() && e.why != Why::IncompletePods => {
                    Source::Kubelet
                }
                _ => Source::Agent,
            };
            sources.insert(name.clone(), source);
        }
        // Nodes gone from the API, and nodes whose agent has been back long enough.
        fallen.retain(|name, e| {
            let keep = sources.contains_key(name)
                && e.agent_back.is_none_or(|t| now.duration_since(t) < linger);
            if !keep {
                fallback.store.remove_node(name);
                fallback.metadata.remove_node(name);
                targets.lock().remove(name);
            }
            keep
        });
        agent_seen.retain(|n| sources.contains_key(n));
        unmeasured.retain(|n, _| sources.contains_key(n));
        // What a scrape still in flight wrote after its node left: gone at the next tick.
        for orphan in fallback.metadata.node_names() {
            if !fallen.contains_key(&orphan) {
                fallback.store.remove_node(&orphan);
                fallback.metadata.remove_node(&orphan);
            }
        }
        flights.retain(|n, f| fallen.contains_key(n) || f.load(Ordering::Acquire));
        *fallback.stats.sources.lock() = sources;
        fallback.store.housekeep();
        for (name, e) in &mut fallen {
            if e.agent_back.is_some() || e.in_flight.load(Ordering::Acquire) {
                continue;
            }
            // The node and every pod the kubelet named have a rate.
            let rate = fallback
                .store
                .node_metrics(&[name])
                .first()
                .is_some_and(Option::is_some)
                && unmeasured_pods(&fallback.metadata, &fallback.store, name) == 0;
            let interval = scrape_interval(
                rate,
                e.failed.load(Ordering::Acquire),
                now.duration_since(e.entered),
                settings.resolution,
            );
            if e.last.is_some_and(|t| now.duration_since(t) < interval) {
                continue;
            }
            e.last = Some(now);
            e.in_flight.store(true, Ordering::Release);
            let task = Scrape {
                node: name.clone(),
                fallback: fallback.clone(),
                inputs: inputs.clone(),
                targets: targets.clone(),
            };
            let (limit, in_flight, failed) = (limit.clone(), e.in_flight.clone(), e.failed.clone());
            tokio::spawn(async move {
                if let Ok(_permit) = limit.acquire_owned().await {
                    let ok = task.run().await;
                    failed.store(!ok, Ordering::Release);
                }
                in_flight.store(false, Ordering::Release);
            });
        }
    }
}

/// How long after its last scrape a node in the fallback is scraped again: every
/// [`FIRST_INTERVAL`] while the node or one of its pods has no `rate` yet, the last scrape
/// succeeded, and it entered less than [`FAST_RESOLUTIONS`] ago; every `resolution`
/// otherwise (a failing kubelet is retried as metrics-server retries it, never hammered).
fn scrape_interval(
    rate: bool,
    last_failed: bool,
    since_entry: Duration,
    resolution: Duration,
) -> Duration {
    if !rate && !last_failed && since_entry < resolution * FAST_RESOLUTIONS {
        FIRST_INTERVAL.min(resolution)
    } else {
        resolution
    }
}

/// One scrape of one node.
struct Scrape {
    node: String,
    fallback: Arc<Fallback>,
    inputs: Inputs,
    targets: Arc<Targets>,
}

impl Scrape {
    /// Scrapes, counts and logs; says whether the scrape succeeded.
    async fn run(self) -> bool {
        let began = Instant::now();
        let result = self.scrape().await;
        let stats = &self.fallback.stats;
        stats.scrape_seconds_sum.fetch_add(
            u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        match result {
            Ok(()) => {
                Stats::count(&stats.scrapes, "ok", 1);
                true
            }
            Err(e) => {
                self.targets.lock().remove(&self.node);
                Stats::count(&stats.scrapes, e.label(), 1);
                tracing::warn!(node = %self.node, error = %e, "kubelet scrape failed; the node keeps what it had");
                false
            }
        }
    }

    async fn target(&self) -> Result<client::Target, client::ScrapeError> {
        if let Some((target, at)) = self.targets.lock().get(&self.node) {
            if at.elapsed() < ADDRESS_MAX_AGE {
                return Ok(target.clone());
            }
        }
        let node = kube::Api::<Node>::all(self.inputs.api.clone())
            .get(&self.node)
            .await
            .map_err(|e| client::ScrapeError::Api(format!("getting the Node: {e}")))?;
        let target = self.inputs.kubelet.target(&node)?;
        self.targets
            .lock()
            .insert(self.node.clone(), (target.clone(), Instant::now()));
        Ok(target)
    }

    async fn scrape(&self) -> Result<(), client::ScrapeError> {
        let target = self.target().await?;
        let pods = kube::Api::<Pod>::all(self.inputs.api.clone());
        // From kube-apiserver's watch cache (resourceVersion=0), not a quorum read of etcd.
        let params = kube::api::ListParams::default()
            .fields(&format!("spec.nodeName={}", self.node))
            .match_any();
        let (answer, listed) = tokio::join!(
            self.inputs.kubelet.get(&target),
            pods.list_metadata(&params)
        );
        // Samples without a timestamp take the time the request was sent (metrics-server's).
        let (text, sent) = answer?;
        let resource = parse::parse(&text, sent)?;
        let listed = listed
            .map_err(|e| client::ScrapeError::Api(format!("listing the node's pods: {e}")))?;
        let objects: HashMap<(String, String), (String, BTreeMap<String, String>)> = listed
            .items
            .into_iter()
            .filter_map(|p| {
                let m = p.metadata;
                Some((
                    (m.namespace?, m.name?),
                    (m.uid?, m.labels.unwrap_or_default()),
                ))
            })
            .collect();
        let node = resource.node.ok_or(client::ScrapeError::Body(
            "an answer without the node's figures",
        ))?;
        let stats = &self.fallback.stats;
        Stats::count(
            &stats.pods_skipped,
            "incomplete",
            resource.incomplete_pods as u64,
        );
        let mut metas = Vec::with_capacity(resource.pods.len());
        let mut samples = Vec::with_capacity(resource.pods.len());
        let mut unknown = 0;
        for ((namespace, name), containers) in resource.pods {
            let Some((uid, labels)) = objects.get(&(namespace.clone(), name.clone())) else {
                unknown += 1;
                continue;
            };
            // A pod without a uid, namespace or name (none in Kubernetes) has no metadata.
            metas.extend(Announced::new(kpulse_wire::stream::PodMeta {
                uid: uid.clone(),
                namespace: namespace.clone(),
                name: name.clone(),
                labels: labels.clone(),
                ready_since: None,
            }));
            samples.push(PodSample {
                uid: uid.clone(),
                namespace,
                name,
                containers: containers
                    .into_iter()
                    .map(|(name, r)| ContainerSample {
                        name,
                        timestamp: r.timestamp,
                        cgroup_id: None,
                        // The kubelet's start time: one not before the last point is a
                        // restart (the store then never subtracts the old instance's counter
                        // from the new one's).
                        started_at: r.started_at,
                        cpu: r.cpu,
                        memory_working_set: r.memory_working_set,
                        swap: None,
                        signals: None,
                    })
                    .collect(),
                signals: None,
                ready_since: None,
            });
        }
        Stats::count(&stats.pods_skipped, "no_pod_object", unknown);
        self.fallback.metadata.replace_pods(&self.node, &mut metas);
        self.fallback
            .store
            .ingest(NodeBatch {
                node_name: self.node.clone(),
                sent_at: UnixNanos::from_system_time(std::time::SystemTime::now()),
                node: NodeSample {
                    timestamp: node.timestamp,
                    started_at: None,
                    cpu: node.cpu,
                    memory_working_set: node.memory_working_set,
                    swap: None,
                },
                pods: samples,
            })
            .map_err(|e| client::ScrapeError::Store(e.to_string()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpulse_wire::{Bytes, CpuNanos};

    #[test]
    fn a_node_is_scraped_often_only_until_it_has_a_rate() {
        let res = Duration::from_secs(15);
        let s = Duration::from_secs;
        // A kubelet serving cached stats repeats its timestamps: scrape again soon...
        assert_eq!(scrape_interval(false, false, s(0), res), FIRST_INTERVAL);
        assert_eq!(scrape_interval(false, false, s(29), res), FIRST_INTERVAL);
        // ...but not for ever, never after a failure, and not once there is a rate.
        assert_eq!(scrape_interval(false, false, s(30), res), res);
        assert_eq!(scrape_interval(false, true, s(0), res), res);
        assert_eq!(scrape_interval(true, false, s(0), res), res);
        // Never slower than the resolution asked for.
        assert_eq!(scrape_interval(false, false, s(0), s(3)), s(3));
    }

    fn meta(name: &str) -> Announced {
        Announced::new(kpulse_wire::stream::PodMeta {
            uid: format!("uid-{name}"),
            namespace: "ns".into(),
            name: name.into(),
            labels: BTreeMap::new(),
            ready_since: None,
        })
        .expect("valid")
    }

    /// A pod the agent reports without counters (a VM sandbox) is what sends its node's
    /// pods to the kubelet; measured pods and other nodes' pods are not.
    #[test]
    fn pods_reported_without_counters_are_unmeasured() {
        let metadata = StreamMetadata::new();
        metadata.replace_pods("a", &mut [meta("measured"), meta("sandboxed")]);
        metadata.replace_pods("b", &mut [meta("elsewhere")]);
        let store = Store::new(StoreConfig::new(Duration::from_secs(60))).expect("store");
        let now = UnixNanos::from_system_time(std::time::SystemTime::now()).0;
        for (i, t) in [now - 2_000_000_000, now - 1_000_000_000]
            .into_iter()
            .enumerate()
        {
            let cpu = CpuNanos(i as u64 * 1_000_000);
            store
                .ingest(NodeBatch {
                    node_name: "a".into(),
                    sent_at: UnixNanos(t),
                    node: NodeSample {
                        timestamp: UnixNanos(t),
                        started_at: None,
                        cpu,
                        memory_working_set: Bytes(1),
                        swap: None,
                    },
                    pods: vec![PodSample {
                        uid: "uid-measured".into(),
                        namespace: "ns".into(),
                        name: "measured".into(),
                        containers: vec![ContainerSample {
                            name: "c".into(),
                            timestamp: UnixNanos(t),
                            cgroup_id: None,
                            started_at: None,
                            cpu,
                            memory_working_set: Bytes(1),
                            swap: None,
                            signals: None,
                        }],
                        signals: None,
                        ready_since: None,
                    }],
                })
                .expect("ingest");
        }
        assert_eq!(unmeasured_pods(&metadata, &store, "a"), 1);
        assert_eq!(unmeasured_pods(&metadata, &store, "b"), 1);
        assert_eq!(unmeasured_pods(&metadata, &store, "c"), 0);
        metadata.replace_pods("a", &mut [meta("measured")]);
        assert_eq!(unmeasured_pods(&metadata, &store, "a"), 0);
    }
}
