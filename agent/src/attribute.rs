//! Attribution: which pod and container each sampled cgroup belongs to.
//!
//! A [`PodIndex`] is this node's pods as the agent knows them: their metadata (a [`PodSet`],
//! what the stream's `pods`/`upserts`/`removed` describe) and how to find their containers'
//! cgroups. [`PodIndex::join`] turns one collector [`Snapshot`] into per-pod counters.
//!
//! Two sources build the index, behind one handle, [`Attributor`], so that the tick loop and
//! the shipper do not care which is used:
//!
//! - **cluster** ([`Attributor::cluster`]): a `kube` watcher and reflector of the Pods with
//!   `spec.nodeName=<node>`. A cgroup is joined to a pod by the pod UID in its path
//!   ([`cgroup_path::classify`]; static pods by their `kubernetes.io/config.mirror`
//!   annotation) and to a container by the container id in its path, matched against
//!   `status.containerStatuses`, `initContainerStatuses` and `ephemeralContainerStatuses`.
//!   A Ready pod's metadata also carries when it became Ready (`ready_since`, the Ready
//!   condition's `lastTransitionTime`), for the server's adaptive window.
//! - **standalone** ([`Attributor::from_file`]): `--pods-file`, a JSON description mapping
//!   cgroup paths (relative to the cgroup mount, as the collector reports them) to pods and
//!   containers, re-read when it changes:
//!
//!   ```json
//!   {"pods":[{"uid":"u1","namespace":"default","name":"web","labels":{"app":"web"},
//!             "containers":[{"name":"app","cgroup":"/demo/web/app"}]}]}
//!   ```
//!
//! # Join rules
//!
//! - A pod's counters are sent only when **every** container it runs was measured (CPU and
//!   memory): in cluster mode the containers whose status is `running`, in standalone mode
//!   every listed container. Otherwise the pod is left out of the tick and counted
//!   ([`Attribution::incomplete_pods`]), as the wire protocol requires.
//! - A cgroup under kubepods whose pod is not in the index (not watched yet, or never), or
//!   whose path is malformed, is counted ([`Attribution::unattributed`]) and not sent.
//! - A container cgroup of a known pod whose id matches no running container status is the
//!   pod's sandbox (pause) or a container the watch has not caught up with: not sent, not
//!   counted. Container children (`init.scope`, ...) are already in their container's
//!   hierarchical counters; pod-level and other cgroups of a pod are not containers.
//! - The metadata set holds every pod of the source, with or without counters; a pod that
//!   leaves the source is gone: [`PodSet::changes_since`] reports it as removed.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

// Looked up for every cgroup of every tick: a fast hash (randomly seeded), not SipHash.
use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kpulse_wire::{
    stream::{PodCounters, PodMeta},
    ContainerSample, Signals, UnixNanos,
};
use serde::Deserialize;
use tokio::sync::watch;

use crate::{
    cgroup_path::{self, CgroupKind, ContainerId, PodUid},
    cgroupfs,
    sample::Snapshot,
    window::{ThrottledPeriods, Windows},
};

/// The annotation a mirror pod carries: the static pod's UID as kubelet names its cgroup.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// How often `--pods-file` is checked for changes when its directory cannot be watched
/// with inotify (a `stat`; new pods show up within this, about one tick at the default
/// resolution). With inotify, a change is seen at once and this is the safety net's
/// period times [`POD_FILE_RECHECK_FACTOR`].
pub const POD_FILE_POLL: Duration = Duration::from_secs(1);

/// With inotify, the file is still checked every `poll × this` (a file system that does not
/// report changes, a missed event).
pub const POD_FILE_RECHECK_FACTOR: u32 = 10;

/// Largest accepted `--pods-file`.
pub const MAX_POD_FILE_BYTES: u64 = 16 << 20;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum AttributeError {
    /// The pods file could not be read.
    #[error("cannot read the pods file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The pods file is larger than [`MAX_POD_FILE_BYTES`].
    #[error("the pods file {path} is {len} bytes, over the {MAX_POD_FILE_BYTES}-byte limit")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        len: u64,
    },
    /// The pods file is not the expected JSON.
    #[error("the pods file {path} is not valid")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The pods file is JSON but describes something impossible.
    #[error("the pods file {path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Result of this module.
pub type Result<T, E = AttributeError> = std::result::Result<T, E>;

/// The metadata of every pod the agent attributes, keyed by UID.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSet {
    pods: BTreeMap<String, PodMeta>,
}

/// What changed between two [`PodSet`]s: an `Update`'s `upserts` and `removed`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaChanges {
    /// Pods new, or whose metadata changed.
    pub upserts: Vec<PodMeta>,
    /// UIDs of pods gone.
    pub removed: Vec<String>,
}

impl PodSet {
    /// A set of these pods (a later duplicate UID replaces an earlier one).
    pub fn new(pods: impl IntoIterator<Item = PodMeta>) -> PodSet {
        PodSet {
            pods: pods.into_iter().map(|p| (p.uid.clone(), p)).collect(),
        }
    }

    /// The pod with this UID.
    pub fn get(&self, uid: &str) -> Option<&PodMeta> {
        self.pods.get(uid)
    }

    /// Number of pods.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether there are no pods.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// The pods, by UID.
    pub fn iter(&self) -> impl Iterator<Item = &PodMeta> {
        self.pods.values()
    }

    /// The pods as a `Snapshot`'s `pods`.
    pub fn to_vec(&self) -> Vec<PodMeta> {
        self.pods.values().cloned().collect()
    }

    /// The changes that turn `older` into `self`.
    pub fn changes_since(&self, older: &PodSet) -> MetaChanges {
        let upserts = self
            .pods
            .values()
            .filter(|p| older.pods.get(&p.uid) != Some(*p))
            .cloned()
            .collect();
        let removed = older
            .pods
            .keys()
            .filter(|uid| !self.pods.contains_key(*uid))
            .cloned()
            .collect();
        MetaChanges { upserts, removed }
    }
}

/// A container the index knows: its pod and its name. (Start times come from the kernel,
/// in `starttime.rs`: the status' `startedAt` is whole seconds.)
#[derive(Clone, Debug, PartialEq, Eq)]
struct ContainerRef {
    /// The pod's `metadata.uid`.
    pod: String,
    name: String,
}

/// What a cgroup is to a [`PodIndex`].
#[derive(Clone, Debug)]
enum Found {
    /// A container of a known pod.
    Container(Arc<ContainerRef>),
    /// The pod-level cgroup of a known pod (its `metadata.uid`): where the pod's pressure is
    /// read, and a quota of its own.
    Pod(Arc<str>),
    /// Not a container of a known pod: outside kubepods, a QoS or pod cgroup, a sandbox.
    Other,
    /// Under kubepods, but no known pod has it (or a malformed path): counted, not sent.
    Unattributed,
}

/// What [`PodIndex::join`] found for each cgroup of the last tick, by position: while the
/// index is the same and a position holds the same path (the same string: the collector's
/// path caches reuse them), it is not looked up or parsed again. Held by the tick loop.
#[derive(Debug, Default)]
pub struct JoinCache {
    /// The index the slots were found in (held, so it cannot be another at that address).
    index: Option<Arc<PodIndex>>,
    slots: Vec<(Arc<str>, Found)>,
}

impl JoinCache {
    /// [`PodIndex::join_with`] of `index`, reusing last tick's findings where they hold.
    pub fn join(
        &mut self,
        index: &Arc<PodIndex>,
        snap: &Snapshot,
        windows: Option<&Windows>,
    ) -> Attribution {
        let same = self.index.as_ref().is_some_and(|i| Arc::ptr_eq(i, index));
        let mut slots = Vec::with_capacity(snap.cgroups.len());
        for (i, c) in snap.cgroups.iter().enumerate() {
            let kept = if same {
                self.slots
                    .get(i)
                    .filter(|(path, _)| Arc::ptr_eq(path, &c.path))
                    .map(|(_, f)| f.clone())
            } else {
                None
            };
            slots.push((c.path.clone(), kept.unwrap_or_else(|| index.find(&c.path))));
        }
        self.slots = slots;
        self.index = Some(index.clone());
        index.assemble(snap, self.slots.iter().map(|(_, f)| f), windows)
    }
}

/// This node's pods and how to find their containers' cgroups. Immutable: a source builds a
/// new one when its pods change.
#[derive(Clone, Debug, Default)]
pub struct PodIndex {
    pods: Arc<PodSet>,
    /// Pod UID → the names of the containers that must all be measured.
    required: HashMap<String, Vec<String>>,
    /// UID as found in cgroup paths (the mirror hash for static pods) → `metadata.uid`.
    by_cgroup_uid: HashMap<PodUid, Arc<str>>,
    /// Normalised cgroup path → pod `metadata.uid` (standalone mode, pods that name their
    /// pod-level cgroup).
    pod_by_path: HashMap<String, Arc<str>>,
    /// Container id → container (cluster mode).
    by_container: HashMap<ContainerId, Arc<ContainerRef>>,
    /// Normalised cgroup path → container (standalone mode).
    by_path: HashMap<String, Arc<ContainerRef>>,
    ready: bool,
}

/// One tick's attribution.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attribution {
    /// Counters of every pod whose containers were all measured, by UID; containers by name.
    pub counters: Vec<PodCounters>,
    /// Cgroups under kubepods that could not be joined to a known pod (unknown UID or a
    /// malformed path).
    pub unattributed: u64,
    /// Known pods left out because some of their running containers were not measured.
    pub incomplete_pods: u64,
}

impl PodIndex {
    /// An index that knows no pod and is not ready (the watch has not listed yet).
    pub fn empty() -> PodIndex {
        PodIndex::default()
    }

    /// Whether the source has delivered a complete view (the first list, the first file).
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// The pods' metadata.
    pub fn pods(&self) -> &Arc<PodSet> {
        &self.pods
    }

    /// Keeps `older`'s metadata set when it is equal to this one's, so that consumers can
    /// tell "unchanged" by pointer ([`Arc::ptr_eq`]).
    pub fn share_unchanged(&mut self, older: &PodIndex) {
        if self.pods == older.pods {
            self.pods = older.pods.clone();
        }
    }

    /// Builds the index from Pod objects (cluster mode). Pods without a UID, name or
    /// namespace are skipped.
    pub fn from_pods<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> PodIndex {
        let mut metas = Vec::new();
        let mut index = PodIndex {
            ready: true,
            ..PodIndex::default()
        };
        for pod in pods {
            let Some(meta) = pod_meta(pod) else { continue };
            let uid = meta.uid.clone();
            let shared: Arc<str> = Arc::from(uid.as_str());
            if let Some(u) = PodUid::parse(&uid) {
                index.by_cgroup_uid.insert(u, shared.clone());
            }
            if let Some(hash) = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(MIRROR_ANNOTATION))
                .and_then(|h| PodUid::parse(h))
            {
                index.by_cgroup_uid.insert(hash, shared.clone());
            }
            let mut required = Vec::new();
            for (name, id) in running_containers(pod) {
                required.push(name.clone());
                index.by_container.insert(
                    id,
                    Arc::new(ContainerRef {
                        pod: uid.clone(),
                        name,
                    }),
                );
            }
            required.sort();
            index.required.insert(uid, required);
            metas.push(meta);
        }
        index.pods = Arc::new(PodSet::new(metas));
        index
    }

    /// Builds the index from a pods file's contents (standalone mode).
    ///
    /// # Errors
    ///
    /// [`AttributeError::Invalid`] for empty or duplicate UIDs, container names or cgroup
    /// paths.
    pub fn from_file_contents(path: &Path, file: PodsFile) -> Result<PodIndex> {
        let invalid = |reason: String| AttributeError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let mut metas = Vec::new();
        let mut index = PodIndex {
            ready: true,
            ..PodIndex::default()
        };
        for (i, pod) in file.pods.into_iter().enumerate() {
            for (field, v) in [
                ("uid", &pod.uid),
                ("namespace", &pod.namespace),
                ("name", &pod.name),
            ] {
                if v.is_empty() {
                    return Err(invalid(format!("pods[{i}] has an empty {field}")));
                }
            }
            if index.required.contains_key(&pod.uid) {
                return Err(invalid(format!("pod uid {:?} appears twice", pod.uid)));
            }
            if pod.containers.is_empty() {
                return Err(invalid(format!(
                    "pod {}/{} lists no containers",
                    pod.namespace, pod.name
                )));
            }
            if let Some(path) = &pod.cgroup {
                let cgroup = cgroupfs::normalise_rel(path);
                if cgroup == "/" || path.split('/').any(|s| s == "..") {
                    return Err(invalid(format!(
                        "pod {}/{}: its cgroup must be below the root, without `..`",
                        pod.namespace, pod.name
                    )));
                }
                if index
                    .pod_by_path
                    .insert(cgroup.clone(), Arc::from(pod.uid.as_str()))
                    .is_some()
                {
                    return Err(invalid(format!("cgroup {cgroup} is listed twice")));
                }
            }
            let mut names = HashSet::new();
            let mut required = Vec::new();
            for c in pod.containers {
                let cgroup = cgroupfs::normalise_rel(&c.cgroup);
                if c.name.is_empty() || cgroup == "/" || c.cgroup.split('/').any(|s| s == "..") {
                    return Err(invalid(format!(
                        "pod {}/{}: every container needs a name and a cgroup below the root \
                         without `..`",
                        pod.namespace, pod.name
                    )));
                }
                if !names.insert(c.name.clone()) {
                    return Err(invalid(format!(
                        "pod {}/{}: container {:?} appears twice",
                        pod.namespace, pod.name, c.name
                    )));
                }
                if let Some(u) = cgroup_path::classify(&cgroup)
                    .ok()
                    .and_then(|k| k.pod_uid().cloned())
                {
                    index.by_cgroup_uid.insert(u, Arc::from(pod.uid.as_str()));
                }
                let r = Arc::new(ContainerRef {
                    pod: pod.uid.clone(),
                    name: c.name.clone(),
                });
                if index.pod_by_path.contains_key(&cgroup)
                    || index.by_path.insert(cgroup.clone(), r).is_some()
                {
                    return Err(invalid(format!("cgroup {cgroup} is listed twice")));
                }
                required.push(c.name);
            }
            required.sort();
            index.required.insert(pod.uid.clone(), required);
            metas.push(PodMeta {
                uid: pod.uid,
                namespace: pod.namespace,
                name: pod.name,
                labels: pod.labels,
                ready_since: None,
            });
        }
        index.pods = Arc::new(PodSet::new(metas));
        Ok(index)
    }

    /// Reads and parses a pods file (blocking I/O).
    ///
    /// # Errors
    ///
    /// Reading, size, JSON and validity errors.
    pub fn read_file(path: &Path) -> Result<PodIndex> {
        let read_err = |source| AttributeError::Read {
            path: path.to_path_buf(),
            source,
        };
        let len = std::fs::metadata(path).map_err(read_err)?.len();
        if len > MAX_POD_FILE_BYTES {
            return Err(AttributeError::TooLarge {
                path: path.to_path_buf(),
                len,
            });
        }
        let bytes = std::fs::read(path).map_err(read_err)?;
        let file: PodsFile =
            serde_json::from_slice(&bytes).map_err(|source| AttributeError::Parse {
                path: path.to_path_buf(),
                source,
            })?;
        PodIndex::from_file_contents(path, file)
    }

    /// Joins one collection with this index, without pressure or throttling.
    pub fn join(&self, snap: &Snapshot) -> Attribution {
        self.join_with(snap, None)
    }

    /// Joins one collection with this index; with `windows`, containers and pods carry
    /// their pressure and throttling figures.
    pub fn join_with(&self, snap: &Snapshot, windows: Option<&Windows>) -> Attribution {
        let found: Vec<Found> = snap.cgroups.iter().map(|c| self.find(&c.path)).collect();
        self.assemble(snap, found.iter(), windows)
    }

    /// What a cgroup path is to this index.
    fn find(&self, path: &str) -> Found {
        if let Some(r) = self.by_path.get(path) {
            return Found::Container(r.clone());
        }
        if let Some(uid) = self.pod_by_path.get(path) {
            return Found::Pod(uid.clone());
        }
        match cgroup_path::classify(path) {
            Ok(CgroupKind::NotKubernetes | CgroupKind::KubepodsRoot { .. }) => Found::Other,
            Ok(kind) => {
                let pod = kind.pod_uid().and_then(|u| self.by_cgroup_uid.get(u));
                match (pod, &kind) {
                    (None, _) => Found::Unattributed,
                    (Some(pod), CgroupKind::Container { id, .. }) => self
                        .by_container
                        .get(id)
                        .filter(|r| *r.pod == **pod)
                        .map_or(Found::Other, |r| Found::Container(r.clone())),
                    (Some(pod), CgroupKind::Pod { .. }) => Found::Pod(pod.clone()),
                    (Some(_), _) => Found::Other,
                }
            }
            Err(_) => Found::Unattributed,
        }
    }

    /// The tick's counters from what each of `snap`'s cgroups is (`found`, in order).
    fn assemble<'f>(
        &self,
        snap: &Snapshot,
        found: impl Iterator<Item = &'f Found>,
        windows: Option<&Windows>,
    ) -> Attribution {
        let mut measured: HashMap<&str, Vec<ContainerSample>> = HashMap::new();
        // Pressure of pod cgroups and throttling summed over each pod's cgroups with a quota.
        let mut pod_signals: HashMap<&str, PodSignals> = HashMap::new();
        let mut unattributed = 0u64;
        // Swap is sent for every container of a node with swap, and for none elsewhere.
        let node_has_swap = snap.node.swap.is_some();
        // Only the cgroups of known pods are looked up.
        let figures_of = |c: &crate::sample::CgroupSample| windows.and_then(|w| w.figures(c.id));
        for (c, f) in snap.cgroups.iter().zip(found) {
            let r = match f {
                Found::Container(r) => r,
                Found::Pod(uid) => {
                    if let Some(figures) = figures_of(c) {
                        let pod = pod_signals.entry(uid).or_default();
                        pod.pressure = Some(figures.signals);
                        pod.add(figures.throttling);
                    }
                    continue;
                }
                Found::Other => continue,
                Found::Unattributed => {
                    unattributed += 1;
                    continue;
                }
            };
            let (Some(cpu), Some(memory)) = (c.cpu, c.memory) else {
                continue;
            };
            let figures = figures_of(c);
            if let Some(figures) = figures {
                pod_signals
                    .entry(&r.pod)
                    .or_default()
                    .add(figures.throttling);
            }
            measured.entry(&r.pod).or_default().push(ContainerSample {
                name: r.name.clone(),
                timestamp: snap.timestamp,
                cgroup_id: Some(c.id),
                started_at: None,
                cpu,
                memory_working_set: memory.working_set,
                swap: if node_has_swap { memory.swap } else { None },
                signals: figures.map(|f| f.signals),
            });
        }
        let mut counters = Vec::new();
        let mut incomplete_pods = 0u64;
        for meta in self.pods.iter() {
            let Some(required) = self.required.get(&meta.uid) else {
                continue;
            };
            if required.is_empty() {
                continue;
            }
            let Some(mut containers) = measured.remove(meta.uid.as_str()) else {
                incomplete_pods += 1;
                continue;
            };
            containers.sort_by(|a, b| a.name.cmp(&b.name));
            containers.dedup_by(|a, b| a.name == b.name);
            let complete = containers.len() == required.len()
                && containers
                    .iter()
                    .zip(required)
                    .all(|(c, name)| c.name == *name);
            if complete {
                let signals = windows.map(|_| {
                    pod_signals
                        .get(meta.uid.as_str())
                        .map(PodSignals::signals)
                        .unwrap_or_default()
                });
                counters.push(PodCounters {
                    uid: meta.uid.clone(),
                    containers,
                    signals: signals.filter(|s| !s.is_empty()),
                });
            } else {
                incomplete_pods += 1;
            }
        }
        Attribution {
            counters,
            unattributed,
            incomplete_pods,
        }
    }
}

/// A pod's figures as [`PodIndex::assemble`] gathers them from its cgroups.
#[derive(Clone, Copy, Debug, Default)]
struct PodSignals {
    /// The pod cgroup's figures (its pressure).
    pressure: Option<Signals>,
    /// CFS counters summed over the pod's cgroups that have a quota.
    throttling: Option<ThrottledPeriods>,
}

impl PodSignals {
    fn add(&mut self, th: Option<ThrottledPeriods>) {
        if let Some(th) = th {
            self.throttling = Some(self.throttling.map_or(th, |sum| sum.plus(th)));
        }
    }

    /// A pod's pressure is its pod cgroup's: PSI counts a stall once however many of the
    /// pod's tasks wait, so a sum over containers would count it several times. Its
    /// throttling is the share of all its cgroups' periods that were throttled.
    fn signals(&self) -> Signals {
        let pressure = self.pressure.unwrap_or_default();
        Signals {
            cpu_pressure: pressure.cpu_pressure,
            memory_pressure: pressure.memory_pressure,
            cpu_throttled: self.throttling.map(ThrottledPeriods::fraction),
        }
    }
}

/// `--pods-file`: the pods of a node without a Kubernetes API.
#[derive(Clone, Debug, Deserialize)]
pub struct PodsFile {
    /// The pods.
    pub pods: Vec<FilePod>,
}

/// One pod of a [`PodsFile`].
#[derive(Clone, Debug, Deserialize)]
pub struct FilePod {
    /// `metadata.uid` (any unique string).
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The pod-level cgroup, relative to the cgroup mount (`/demo/web`), when there is one:
    /// where the pod's pressure is read (`--custom-metrics`). Optional.
    #[serde(default)]
    pub cgroup: Option<String>,
    /// The containers, each with its cgroup.
    pub containers: Vec<FileContainer>,
}

/// One container of a [`FilePod`].
#[derive(Clone, Debug, Deserialize)]
pub struct FileContainer {
    /// The container's name.
    pub name: String,
    /// Its cgroup, relative to the cgroup mount (`/demo/web/app`).
    pub cgroup: String,
}

fn pod_meta(pod: &Pod) -> Option<PodMeta> {
    let m = &pod.metadata;
    Some(PodMeta {
        uid: m.uid.clone().filter(|s| !s.is_empty())?,
        namespace: m.namespace.clone().filter(|s| !s.is_empty())?,
        name: m.name.clone().filter(|s| !s.is_empty())?,
        labels: m.labels.clone().unwrap_or_default(),
        ready_since: ready_since(pod),
    })
}

/// When the pod last became Ready, while its Ready condition is `True`: that condition's
/// `lastTransitionTime` (the server starts an adaptive window no earlier, so that the HPA,
/// which ignores a new pod's CPU while `timestamp < lastTransitionTime + window`, can use it
/// from then on). `None` when not Ready, or the time is missing or before 1970.
fn ready_since(pod: &Pod) -> Option<UnixNanos> {
    let ready = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    if ready.status != "True" {
        return None;
    }
    let t = ready.last_transition_time.as_ref()?.0;
    u64::try_from(t.as_nanosecond()).ok().map(UnixNanos)
}

/// The running containers of a pod (app, init and ephemeral): name and id.
fn running_containers(pod: &Pod) -> Vec<(String, ContainerId)> {
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    let lists: [&Option<Vec<ContainerStatus>>; 3] = [
        &status.container_statuses,
        &status.init_container_statuses,
        &status.ephemeral_container_statuses,
    ];
    lists
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|s| {
            s.state.as_ref()?.running.as_ref()?;
            let id = ContainerId::from_status(s.container_id.as_deref()?)?;
            Some((s.name.clone(), id))
        })
        .collect()
}

/// Keeps what [`PodIndex::from_pods`] reads, before the reflector caches a pod.
fn strip(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    pod.metadata.owner_references = None;
    pod.metadata.finalizers = None;
    if let Some(a) = pod.metadata.annotations.as_mut() {
        a.retain(|k, _| k == MIRROR_ANNOTATION);
    }
    pod.spec = None;
    if let Some(s) = pod.status.as_mut() {
        // Only Ready's status and transition are read ([`ready_since`]).
        if let Some(conditions) = s.conditions.as_mut() {
            conditions.retain(|c| c.type_ == "Ready");
            for c in conditions {
                c.message = None;
                c.reason = None;
                c.last_probe_time = None;
            }
        }
        s.pod_ips = None;
        s.host_ips = None;
        s.resource_claim_statuses = None;
        s.message = None;
        for list in [
            &mut s.container_statuses,
            &mut s.init_container_statuses,
            &mut s.ephemeral_container_statuses,
        ]
        .into_iter()
        .flatten()
        {
            for c in list {
                c.image = String::new();
                c.image_id = String::new();
                c.last_state = None;
                c.resources = None;
                c.volume_mounts = None;
                c.allocated_resources = None;
                c.allocated_resources_status = None;
                c.user = None;
            }
        }
    }
}

/// The current [`PodIndex`], kept up to date by a background task (or fixed).
///
/// Cloning is cheap; the task ends when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct Attributor {
    rx: watch::Receiver<Arc<PodIndex>>,
}

impl Attributor {
    /// An attributor whose index never changes (tests, load generators).
    pub fn fixed(index: PodIndex) -> Attributor {
        let (_tx, rx) = watch::channel(Arc::new(index));
        Attributor { rx }
    }

    /// The index as of now.
    pub fn current(&self) -> Arc<PodIndex> {
        self.rx.borrow().clone()
    }

    /// A receiver that sees every new index.
    pub fn subscribe(&self) -> watch::Receiver<Arc<PodIndex>> {
        self.rx.clone()
    }

    /// Standalone mode: reads `path` now (an error is a configuration error), then re-reads
    /// it when its inode, size or modification time changes: checked when inotify reports a
    /// change in its directory (a write closed, a file renamed, created or removed there;
    /// replacing the file by a rename is seen too), and every `poll` ×
    /// [`POD_FILE_RECHECK_FACTOR`] in case an event is missed; every `poll` if the
    /// directory cannot be watched. A later unreadable or invalid file is logged and the
    /// previous pods are kept.
    ///
    /// # Errors
    ///
    /// The first read's errors.
    pub async fn from_file(path: PathBuf, poll: Duration) -> Result<Attributor> {
        // Watch before the first read: no change between the two is missed.
        let events = dir_events(&path).map_err(|e| {
            tracing::warn!(
                path = %path.display(),
                error = %e,
                poll = %humantime::format_duration(poll),
                "cannot watch the pods file's directory with inotify; polling it"
            );
        });
        let p = path.clone();
        let (first, stamp) = tokio::task::spawn_blocking(move || {
            let stamp = file_stamp(&p);
            PodIndex::read_file(&p).map(|i| (i, stamp))
        })
        .await
        .map_err(|e| AttributeError::Read {
            path: path.clone(),
            source: std::io::Error::other(e),
        })??;
        tracing::info!(path = %path.display(), pods = first.pods().len(), "pods file read");
        let (tx, rx) = watch::channel(Arc::new(first));
        tokio::spawn(follow_file(path, poll, events.ok(), stamp, tx));
        Ok(Attributor { rx })
    }

    /// Cluster mode: watches the Pods bound to `node_name` through `client`, with the
    /// watcher's default backoff on errors. The index is empty and not ready until the first
    /// list completes.
    pub fn cluster(client: kube::Client, node_name: &str) -> Attributor {
        let (tx, rx) = watch::channel(Arc::new(PodIndex::empty()));
        tokio::spawn(watch_pods(client, node_name.to_owned(), tx));
        Attributor { rx }
    }
}

/// What tells a changed file: inode (replaced by a rename), size, modification time.
type FileStamp = Option<(u64, u64, SystemTime)>;

fn file_stamp(path: &Path) -> FileStamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.len(), m.modified().ok()?))
}

async fn follow_file(
    path: PathBuf,
    poll: Duration,
    mut events: Option<inotify::EventStream<Vec<u8>>>,
    mut stamp: FileStamp,
    tx: watch::Sender<Arc<PodIndex>>,
) {
    let mut last_error: Option<String> = None;
    let period = if events.is_some() {
        poll.saturating_mul(POD_FILE_RECHECK_FACTOR)
    } else {
        poll
    };
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            e = next_event(&mut events) => {
                if let Err(e) = e {
                    tracing::warn!(
                        path = %path.display(),
                        error = %e,
                        poll = %humantime::format_duration(poll),
                        "inotify failed; polling the pods file"
                    );
                    events = None;
                    ticker = tokio::time::interval(poll);
                    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                }
            }
            () = tx.closed() => return,
        }
        // A `stat` per poll, here (it does not block for long: no thread hand-off); the
        // file is read and parsed on the blocking pool only when it changed (or the last
        // read failed).
        let now = file_stamp(&path);
        if now == stamp && last_error.is_none() {
            continue;
        }
        let p = path.clone();
        let Ok(read) =
            tokio::task::spawn_blocking(move || now.is_some().then(|| PodIndex::read_file(&p)))
                .await
        else {
            continue;
        };
        match read {
            Some(Ok(mut index)) => {
                stamp = now;
                if last_error.take().is_some() {
                    tracing::info!(path = %path.display(), "pods file valid again");
                }
                let old = tx.borrow().clone();
                index.share_unchanged(&old);
                if !Arc::ptr_eq(index.pods(), old.pods()) {
                    tracing::info!(path = %path.display(), pods = index.pods().len(), "pods file changed");
                }
                tx.send_replace(Arc::new(index));
            }
            Some(Err(e)) => {
                stamp = now;
                let msg = kpulse_process::error_chain(&e);
                if last_error.as_deref() != Some(msg.as_str()) {
                    tracing::error!(error = %msg, "pods file unusable; keeping the previous pods");
                    last_error = Some(msg);
                }
            }
            None => {
                let msg = format!("{} is gone", path.display());
                if last_error.as_deref() != Some(msg.as_str()) {
                    tracing::warn!(path = %path.display(), "pods file gone; keeping the previous pods");
                    last_error = Some(msg);
                }
            }
        }
    }
}

/// Events of the directory holding `path`: the changes that can replace or rewrite it.
fn dir_events(path: &Path) -> std::io::Result<inotify::EventStream<Vec<u8>>> {
    use inotify::{Inotify, WatchMask};
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let inotify = Inotify::init()?;
    inotify.watches().add(
        dir,
        WatchMask::CLOSE_WRITE
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM
            | WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::ATTRIB,
    )?;
    // Events are only a reason to look: a buffer for a few at a time is enough.
    inotify.into_event_stream(vec![0u8; 4096])
}

/// The next event (its content does not matter: the file's stamp decides), or an error;
/// pending forever without a stream.
async fn next_event(events: &mut Option<inotify::EventStream<Vec<u8>>>) -> std::io::Result<()> {
    match events {
        Some(stream) => match stream.next().await {
            Some(Ok(_)) => Ok(()),
            Some(Err(e)) => Err(e),
            None => Err(std::io::Error::other("the inotify stream ended")),
        },
        None => std::future::pending().await,
    }
}

async fn watch_pods(client: kube::Client, node_name: String, tx: watch::Sender<Arc<PodIndex>>) {
    use kube::runtime::{reflector, watcher, WatchStreamExt};
    let api: kube::Api<Pod> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let (reader, writer) = reflector::store::<Pod>();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(strip)
        .reflect(writer);
    let mut stream = std::pin::pin!(stream);
    let mut failing = false;
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            () = tx.closed() => return,
        };
        let Some(event) = event else {
            tracing::error!("the pod watch ended");
            return;
        };
        match event {
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
            Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                if failing {
                    tracing::info!(node = %node_name, "pod watch recovered");
                    failing = false;
                }
                let state = reader.state();
                let mut index = PodIndex::from_pods(state.iter().map(|p| p.as_ref()));
                let old = tx.borrow().clone();
                index.share_unchanged(&old);
                if !old.is_ready() {
                    tracing::info!(node = %node_name, pods = index.pods().len(), "pods listed");
                }
                tx.send_replace(Arc::new(index));
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %kpulse_process::error_chain(&e), "pod watch failing; retrying with backoff");
                    failing = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{
            ContainerState, ContainerStateRunning, ContainerStateTerminated, PodCondition,
            PodStatus,
        },
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    };

    use super::*;
    use crate::sample::{
        self, Bytes, CgroupId, CgroupSample, CpuNanos, Memory, NodeSample, Source, UnixNanos,
    };

    const U1: &str = "5f8c0f2a-1b2c-4d3e-9f00-0123456789ab";
    const U2: &str = "0b5e0000-1111-4222-8333-444455556666";
    const STATIC: &str = "6a3b1c9d2e4f5a6b7c8d9e0f1a2b3c4d";

    fn id(c: char) -> String {
        std::iter::repeat_n(c, 64).collect()
    }

    fn status(name: &str, id: &str, running: bool) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            container_id: Some(format!("containerd://{id}")),
            state: Some(if running {
                ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(Time(
                            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000)
                                .expect("timestamp"),
                        )),
                    }),
                    ..ContainerState::default()
                }
            } else {
                ContainerState {
                    terminated: Some(ContainerStateTerminated::default()),
                    ..ContainerState::default()
                }
            }),
            ..ContainerStatus::default()
        }
    }

    fn pod(uid: &str, name: &str, statuses: PodStatus) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                name: Some(name.into()),
                namespace: Some("default".into()),
                labels: Some(BTreeMap::from([("app".into(), name.into())])),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(statuses),
        }
    }

    fn pod_path(uid: &str) -> String {
        format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            uid.replace('-', "_")
        )
    }

    fn ctr_path(uid: &str, id: &str) -> String {
        format!("{}/cri-containerd-{id}.scope", pod_path(uid))
    }

    fn cg(path: &str, ino: u64, cpu: u64) -> CgroupSample {
        CgroupSample {
            path: path.into(),
            id: sample::CgroupId(ino),
            cpu: Some(sample::CpuNanos(cpu)),
            memory: Some(Memory::from_raw(
                sample::Bytes(1000),
                sample::Bytes(100),
                sample::Bytes(10),
            )),
            pressure: None,
            throttling: None,
        }
    }

    fn snap(cgroups: Vec<CgroupSample>) -> Snapshot {
        Snapshot {
            timestamp: sample::UnixNanos(42),
            source: Source::Cgroupfs,
            cgroups,
            node: NodeSample {
                cpu: sample::CpuNanos(1),
                memory_working_set: sample::Bytes(2),
                swap: None,
            },
            dropped: 0,
        }
    }

    /// A web pod (app + sidecar running, an init container that finished) and a static pod.
    fn cluster() -> (Vec<Pod>, Vec<CgroupSample>) {
        let web = pod(
            U1,
            "web",
            PodStatus {
                container_statuses: Some(vec![
                    status("app", &id('a'), true),
                    status("sidecar", &id('b'), true),
                ]),
                init_container_statuses: Some(vec![status("setup", &id('c'), false)]),
                ..PodStatus::default()
            },
        );
        let mut etcd = pod(
            "mirror-uid",
            "etcd-node1",
            PodStatus {
                container_statuses: Some(vec![status("etcd", &id('e'), true)]),
                ..PodStatus::default()
            },
        );
        etcd.metadata.annotations = Some(BTreeMap::from([(
            MIRROR_ANNOTATION.to_string(),
            STATIC.to_string(),
        )]));
        let cgroups = vec![
            cg("/", 1, 0),
            cg("/system.slice/sshd.service", 2, 5),
            cg(&pod_path(U1), 10, 300),
            cg(&ctr_path(U1, &id('a')), 11, 100),
            cg(&format!("{}/init.scope", ctr_path(U1, &id('a'))), 12, 50),
            cg(&ctr_path(U1, &id('b')), 13, 200),
            // The sandbox: a container of the pod that no status names.
            cg(&ctr_path(U1, &id('f')), 14, 1),
            cg(
                &format!("/kubepods.slice/kubepods-pod{STATIC}.slice"),
                20,
                7,
            ),
            cg(
                &format!(
                    "/kubepods.slice/kubepods-pod{STATIC}.slice/cri-containerd-{}.scope",
                    id('e')
                ),
                21,
                7,
            ),
        ];
        (vec![web, etcd], cgroups)
    }

    #[test]
    fn statuses_become_containers_and_pods_join() {
        let (pods, cgroups) = cluster();
        let index = PodIndex::from_pods(&pods);
        assert!(index.is_ready());
        let a = index.join(&snap(cgroups));
        assert_eq!(a.unattributed, 0);
        assert_eq!(a.incomplete_pods, 0);
        assert_eq!(a.counters.len(), 2);
        let web = a.counters.iter().find(|p| p.uid == U1).expect("web sent");
        let names: Vec<&str> = web.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["app", "sidecar"]);
        let app = &web.containers[0];
        assert_eq!(
            app.cpu,
            CpuNanos(100),
            "the container, not its child or the pod"
        );
        assert_eq!(app.cgroup_id, Some(CgroupId(11)));
        assert_eq!(app.memory_working_set, Bytes(900));
        assert_eq!(app.timestamp, UnixNanos(42));
        assert_eq!(
            app.started_at, None,
            "start times are the run loop's (starttime.rs)"
        );
        let etcd = a
            .counters
            .iter()
            .find(|p| p.uid == "mirror-uid")
            .expect("static pod joined by its mirror annotation");
        assert_eq!(etcd.containers[0].name, "etcd");
        let meta = index.pods().get(U1).expect("meta");
        assert_eq!(meta.name, "web");
        assert_eq!(meta.labels["app"], "web");
    }

    /// Containers carry swap exactly when the node has swap: every one of them then (0 where
    /// the kernel counted none), none elsewhere whatever the collector read.
    #[test]
    fn swap_is_sent_for_every_container_of_a_node_with_swap_only() {
        let (pods, mut cgroups) = cluster();
        for c in &mut cgroups {
            c.memory = c.memory.map(|m| m.with_swap(Some(Bytes(4096))));
        }
        let index = PodIndex::from_pods(&pods);
        let mut s = snap(cgroups);
        let swaps = |s: &Snapshot| -> Vec<Option<Bytes>> {
            let a = index.join(s);
            a.counters
                .iter()
                .flat_map(|p| p.containers.iter().map(|c| c.swap))
                .collect()
        };
        let without = swaps(&s);
        assert!(!without.is_empty());
        assert!(without.iter().all(Option::is_none), "{without:?}");
        s.node.swap = Some(Bytes(1 << 20));
        let with = swaps(&s);
        assert!(with.iter().all(|w| *w == Some(Bytes(4096))), "{with:?}");
    }

    /// With `--custom-metrics`: a container carries its own cgroup's figures; a pod its pod
    /// cgroup's pressure and the throttling summed over its pod cgroup and containers with a
    /// quota (not its sandbox's); a pod without figures carries none.
    #[test]
    fn signals_of_containers_and_pods() {
        use crate::sample::{Pressure, Throttling};
        use crate::window::Windows;
        let (pods, base) = cluster();
        let index = PodIndex::from_pods(&pods);
        let mut windows = Windows::new(Duration::from_secs(10), Duration::from_secs(1));
        let second = 1_000_000_000u64;
        let tick = |t: u64| {
            let mut cgroups = base.clone();
            for c in &mut cgroups {
                // (stall ns per second, (periods, throttled) per second)
                let (stall, cfs) = match c.id.0 {
                    10 => (200_000_000, Some((10, 1))),
                    11 => (100_000_000, Some((10, 5))),
                    13 => (0, None),
                    14 => (0, Some((10, 10))),
                    _ => continue,
                };
                c.pressure = Some(Pressure {
                    averaged: None,
                    cpu_some_ns: stall * t,
                    memory_some_ns: 0,
                });
                c.throttling = cfs.map(|(p, th)| Throttling {
                    periods: p * t,
                    throttled: th * t,
                });
            }
            let mut s = snap(cgroups);
            s.timestamp = sample::UnixNanos(t * second);
            s
        };
        let mut last = None;
        for t in 1..=15 {
            let s = tick(t);
            windows.observe(&s);
            last = Some(index.join_with(&s, Some(&windows)));
        }
        let a = last.expect("ticks");
        let ppm = |f: Option<kpulse_wire::Fraction>| f.map(|f| f.ppm);
        let web = a.counters.iter().find(|p| p.uid == U1).expect("web sent");
        let pod = web.signals.expect("pod signals");
        assert_eq!(ppm(pod.cpu_pressure), Some(200_000));
        assert_eq!(ppm(pod.memory_pressure), Some(0));
        assert_eq!(ppm(pod.cpu_throttled), Some(300_000), "(1 + 5) / (10 + 10)");
        let app = web.containers[0].signals.expect("app signals");
        assert_eq!(
            (ppm(app.cpu_pressure), ppm(app.cpu_throttled)),
            (Some(100_000), Some(500_000))
        );
        let sidecar = web.containers[1].signals.expect("sidecar signals");
        assert_eq!(
            (ppm(sidecar.cpu_pressure), sidecar.cpu_throttled),
            (Some(0), None)
        );
        let etcd = a
            .counters
            .iter()
            .find(|p| p.uid == "mirror-uid")
            .expect("etcd");
        assert_eq!(etcd.signals, None);
        assert_eq!(etcd.containers[0].signals, None);
        // Without windows (no --custom-metrics), nothing.
        let plain = index.join(&tick(16));
        assert!(plain
            .counters
            .iter()
            .all(|p| p.signals.is_none() && p.containers.iter().all(|c| c.signals.is_none())));
    }

    #[test]
    fn running_init_and_ephemeral_containers_count() {
        let p = pod(
            U1,
            "web",
            PodStatus {
                container_statuses: Some(vec![status("app", &id('a'), true)]),
                init_container_statuses: Some(vec![status("proxy", &id('c'), true)]),
                ephemeral_container_statuses: Some(vec![status("debug", &id('d'), true)]),
                ..PodStatus::default()
            },
        );
        let index = PodIndex::from_pods([&p]);
        let all = vec![
            cg(&ctr_path(U1, &id('a')), 1, 1),
            cg(&ctr_path(U1, &id('c')), 2, 1),
            cg(&ctr_path(U1, &id('d')), 3, 1),
        ];
        let a = index.join(&snap(all.clone()));
        let names: Vec<&str> = a.counters[0]
            .containers
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["app", "debug", "proxy"]);
        // Without the ephemeral container's cgroup the pod is incomplete.
        let a = index.join(&snap(all[..2].to_vec()));
        assert!(a.counters.is_empty());
        assert_eq!(a.incomplete_pods, 1);
    }

    #[test]
    fn the_join_cache_answers_as_the_join_does() {
        let (pods, cgroups) = cluster();
        let index = Arc::new(PodIndex::from_pods(&pods));
        let mut cache = JoinCache::default();
        let first = snap(cgroups.clone());
        assert_eq!(cache.join(&index, &first, None), index.join(&first));
        // The same path strings, later counters: last tick's findings, the same answer.
        let mut later = first.clone();
        for c in &mut later.cgroups {
            c.cpu = c.cpu.map(|v| sample::CpuNanos(v.0 + 1_000));
        }
        assert_eq!(cache.join(&index, &later, None), index.join(&later));
        assert!(cache
            .slots
            .iter()
            .zip(&later.cgroups)
            .all(|(s, c)| Arc::ptr_eq(&s.0, &c.path)));
        // Another index (a pod gone): nothing is reused from the old one.
        let fewer = Arc::new(PodIndex::from_pods(&pods[1..]));
        let a = cache.join(&fewer, &later, None);
        assert_eq!(a, fewer.join(&later));
        assert!(a.counters.iter().all(|p| p.uid != U1));
        // Another path at a position: found again.
        let mut moved = later.clone();
        moved.cgroups.rotate_left(1);
        assert_eq!(cache.join(&fewer, &moved, None), fewer.join(&moved));
    }

    #[test]
    fn partial_pods_are_dropped() {
        let (pods, mut cgroups) = cluster();
        let index = PodIndex::from_pods(&pods);
        // The sidecar's cgroup is gone (or over --max-cgroups).
        cgroups.retain(|c| !c.path.contains(&id('b')));
        let a = index.join(&snap(cgroups.clone()));
        assert_eq!(a.incomplete_pods, 1);
        assert!(a.counters.iter().all(|p| p.uid != U1));
        // A container without memory figures is not measured either.
        let (_, mut cgroups) = cluster();
        for c in &mut cgroups {
            if c.path.ends_with(&format!("{}.scope", id('a'))) {
                c.memory = None;
            }
        }
        let a = index.join(&snap(cgroups));
        assert_eq!(a.incomplete_pods, 1);
        assert_eq!(a.counters.len(), 1);
    }

    #[test]
    fn unknown_pods_are_counted_not_sent() {
        let (pods, mut cgroups) = cluster();
        cgroups.push(cg(&pod_path(U2), 30, 1));
        cgroups.push(cg(&ctr_path(U2, &id('9')), 31, 1));
        cgroups.push(cg("/kubepods/burstable/podnot-a-uid", 32, 1));
        let index = PodIndex::from_pods(&pods);
        let a = index.join(&snap(cgroups.clone()));
        assert_eq!(a.unattributed, 3);
        assert_eq!(a.counters.len(), 2);
        // Before the first list everything under kubepods is unattributed.
        let a = PodIndex::empty().join(&snap(cgroups));
        assert!(a.counters.is_empty());
        assert_eq!(a.unattributed, 10);
        assert!(!PodIndex::empty().is_ready());
    }

    #[test]
    fn a_container_id_of_another_pod_is_not_joined() {
        let (pods, mut cgroups) = cluster();
        // The web pod's app id found under the static pod's cgroup: not web's container.
        cgroups.retain(|c| !c.path.contains(&id('a')));
        cgroups.push(cg(
            &format!(
                "/kubepods.slice/kubepods-pod{STATIC}.slice/cri-containerd-{}.scope",
                id('a')
            ),
            40,
            1,
        ));
        let a = PodIndex::from_pods(&pods).join(&snap(cgroups));
        assert!(a.counters.iter().all(|p| p.uid != U1));
    }

    #[test]
    fn removal_and_changes_are_detected() {
        let (mut pods, _) = cluster();
        let before = PodIndex::from_pods(&pods);
        // Same pods: same set, shared.
        let mut same = PodIndex::from_pods(&pods);
        same.share_unchanged(&before);
        assert!(Arc::ptr_eq(same.pods(), before.pods()));
        assert_eq!(
            same.pods().changes_since(before.pods()),
            MetaChanges::default()
        );
        // The static pod disappears from the watch, web is relabelled, a new pod comes.
        pods.retain(|p| p.metadata.name.as_deref() != Some("etcd-node1"));
        pods[0]
            .metadata
            .labels
            .as_mut()
            .expect("labels")
            .insert("v".into(), "2".into());
        pods.push(pod(U2, "new", PodStatus::default()));
        let mut after = PodIndex::from_pods(&pods);
        after.share_unchanged(&before);
        assert!(!Arc::ptr_eq(after.pods(), before.pods()));
        let ch = after.pods().changes_since(before.pods());
        assert_eq!(ch.removed, ["mirror-uid"]);
        let up: Vec<&str> = ch.upserts.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(up, ["new", "web"]);
        // Everything gone.
        let ch = PodSet::default().changes_since(after.pods());
        assert_eq!(ch.removed.len(), 2);
        assert!(ch.upserts.is_empty());
    }

    /// While the pod is Ready, its Ready transition goes with its metadata (so a change of
    /// readiness is an upsert), and stripping the watched object keeps it.
    #[test]
    fn a_ready_pods_transition_is_in_its_metadata() {
        let at = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).expect("time"));
        let condition = |type_: &str, status: &str, s: i64| PodCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: Some(at(s)),
            message: Some("long text".into()),
            ..PodCondition::default()
        };
        let with = |conditions: Vec<PodCondition>| {
            let mut p = pod(U1, "web", PodStatus::default());
            if let Some(s) = p.status.as_mut() {
                s.conditions = Some(conditions);
            }
            p
        };
        let ready = with(vec![
            condition("PodScheduled", "True", 1_700_000_000),
            condition("Ready", "True", 1_700_000_005),
        ]);
        let mut stripped = ready.clone();
        strip(&mut stripped);
        for p in [&ready, &stripped] {
            let meta = pod_meta(p).expect("a pod");
            assert_eq!(meta.ready_since, Some(UnixNanos(1_700_000_005_000_000_000)));
        }
        let conditions = stripped.status.and_then(|s| s.conditions).expect("kept");
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].message, None);
        // Not Ready, no Ready condition, no time: none.
        for p in [
            with(vec![condition("Ready", "False", 1_700_000_009)]),
            with(vec![condition("PodScheduled", "True", 1_700_000_000)]),
            with(vec![PodCondition {
                last_transition_time: None,
                ..condition("Ready", "True", 0)
            }]),
            pod(U1, "web", PodStatus::default()),
        ] {
            assert_eq!(pod_meta(&p).expect("a pod").ready_since, None);
        }
        // Becoming Ready is a change of the pod's metadata.
        let before = PodIndex::from_pods([&with(vec![condition("Ready", "False", 1)])]);
        let after = PodIndex::from_pods([&ready]);
        let ch = after.pods().changes_since(before.pods());
        assert_eq!(ch.upserts.len(), 1);
        assert_eq!(ch.upserts[0].ready_since, ready_since(&ready));
    }

    #[test]
    fn stripping_keeps_what_the_join_reads() {
        let (pods, cgroups) = cluster();
        let mut stripped = pods.clone();
        for p in &mut stripped {
            p.metadata
                .annotations
                .get_or_insert_default()
                .insert("big".into(), "x".into());
            strip(p);
        }
        let a = PodIndex::from_pods(&pods).join(&snap(cgroups.clone()));
        let b = PodIndex::from_pods(&stripped).join(&snap(cgroups));
        assert_eq!(a, b);
        assert!(stripped.iter().all(|p| p
            .metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key("big"))));
    }

    fn file(json: &str) -> Result<PodIndex> {
        let f: PodsFile = serde_json::from_str(json).expect("json");
        PodIndex::from_file_contents(Path::new("pods.json"), f)
    }

    /// A pods file may name a pod's own cgroup: it is where the pod's pressure is read. It
    /// must not be a container's.
    #[test]
    fn pods_file_pod_cgroups() {
        let index = file(
            r#"{"pods":[{"uid":"u1","namespace":"demo","name":"web","cgroup":"/demo/web",
                "containers":[{"name":"app","cgroup":"/demo/web/app"}]}]}"#,
        )
        .expect("valid");
        assert!(matches!(index.find("/demo/web"), Found::Pod(uid) if &*uid == "u1"));
        assert!(matches!(index.find("/demo/web/app"), Found::Container(_)));
        for bad in [
            r#"{"pods":[{"uid":"u1","namespace":"d","name":"w","cgroup":"/demo/web",
                "containers":[{"name":"app","cgroup":"/demo/web"}]}]}"#,
            r#"{"pods":[{"uid":"u1","namespace":"d","name":"w","cgroup":"/",
                "containers":[{"name":"app","cgroup":"/demo/web/app"}]}]}"#,
            r#"{"pods":[{"uid":"u1","namespace":"d","name":"w","cgroup":"/demo/../x",
                "containers":[{"name":"app","cgroup":"/demo/web/app"}]}]}"#,
        ] {
            assert!(
                matches!(file(bad), Err(AttributeError::Invalid { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn pods_file_maps_paths() {
        let index = file(
            r#"{"pods":[{"uid":"u1","namespace":"demo","name":"web","labels":{"a":"b"},
                "containers":[{"name":"app","cgroup":"demo/web/app/"},{"name":"db","cgroup":"/demo/web/db"}]},
              {"uid":"u2","namespace":"demo","name":"idle","containers":[{"name":"x","cgroup":"/demo/idle"}]}]}"#,
        )
        .expect("valid");
        let a = index.join(&snap(vec![
            cg("/demo", 1, 1),
            cg("/demo/web/app", 2, 10),
            cg("/demo/web/db", 3, 20),
            cg(
                "/kubepods/burstable/pod5f8c0f2a-1b2c-4d3e-9f00-0123456789ab",
                4,
                1,
            ),
        ]));
        assert_eq!(a.counters.len(), 1);
        assert_eq!(a.counters[0].uid, "u1");
        assert_eq!(a.counters[0].containers[1].cpu, CpuNanos(20));
        assert_eq!(a.counters[0].containers[1].started_at, None);
        assert_eq!(a.incomplete_pods, 1, "idle has no cgroup this tick");
        assert_eq!(
            a.unattributed, 1,
            "a kubepods cgroup the file does not know"
        );
        assert_eq!(index.pods().get("u1").expect("u1").labels["a"], "b");
        assert_eq!(index.pods().len(), 2);
    }

    #[test]
    fn pods_file_with_kubepods_paths_knows_their_pods() {
        let index = file(&format!(
            r#"{{"pods":[{{"uid":"u1","namespace":"demo","name":"web",
                "containers":[{{"name":"app","cgroup":"{}"}}]}}]}}"#,
            ctr_path(U1, &id('a'))
        ))
        .expect("valid");
        let a = index.join(&snap(vec![
            cg(&pod_path(U1), 1, 1),
            cg(&ctr_path(U1, &id('a')), 2, 1),
            cg(&ctr_path(U1, &id('f')), 3, 1),
        ]));
        assert_eq!(a.unattributed, 0);
        assert_eq!(a.counters.len(), 1);
    }

    #[test]
    fn invalid_pods_files_are_refused() {
        for (json, want) in [
            (
                r#"{"pods":[{"uid":"","namespace":"d","name":"n","containers":[{"name":"a","cgroup":"/x"}]}]}"#,
                "empty uid",
            ),
            (
                r#"{"pods":[{"uid":"u","namespace":"d","name":"n","containers":[]}]}"#,
                "no containers",
            ),
            (
                r#"{"pods":[{"uid":"u","namespace":"d","name":"n","containers":[{"name":"a","cgroup":"/x"},{"name":"a","cgroup":"/y"}]}]}"#,
                "twice",
            ),
            (
                r#"{"pods":[{"uid":"u","namespace":"d","name":"n","containers":[{"name":"a","cgroup":"/x"}]},
                         {"uid":"u","namespace":"d","name":"m","containers":[{"name":"a","cgroup":"/y"}]}]}"#,
                "twice",
            ),
            (
                r#"{"pods":[{"uid":"u","namespace":"d","name":"n","containers":[{"name":"a","cgroup":"/x"}]},
                         {"uid":"v","namespace":"d","name":"m","containers":[{"name":"a","cgroup":"x/"}]}]}"#,
                "listed twice",
            ),
            (
                r#"{"pods":[{"uid":"u","namespace":"d","name":"n","containers":[{"name":"a","cgroup":"/"}]}]}"#,
                "below the root",
            ),
            (
                r#"{"pods":[{"uid":"u","namespace":"d","name":"n","containers":[{"name":"a","cgroup":"/x/../y"}]}]}"#,
                "without `..`",
            ),
        ] {
            let err = file(json).expect_err(want).to_string();
            assert!(err.contains(want), "{err} lacks {want}");
        }
    }

    #[tokio::test]
    async fn the_pods_file_is_followed_and_a_bad_one_ignored() {
        let dir = std::env::temp_dir().join(format!("kpulse-podsfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("pods.json");
        let pods = |n: usize| {
            let list: Vec<String> = (0..n)
                .map(|i| {
                    format!(
                        r#"{{"uid":"u{i}","namespace":"d","name":"p{i}","containers":[{{"name":"c","cgroup":"/p{i}"}}]}}"#
                    )
                })
                .collect();
            format!(r#"{{"pods":[{}]}}"#, list.join(","))
        };
        std::fs::write(&path, pods(1)).expect("write");
        assert!(
            Attributor::from_file(dir.join("missing.json"), Duration::from_millis(20))
                .await
                .is_err()
        );
        let a = Attributor::from_file(path.clone(), Duration::from_millis(20))
            .await
            .expect("valid file");
        let mut rx = a.subscribe();
        assert_eq!(a.current().pods().len(), 1);
        std::fs::write(&path, pods(2)).expect("write");
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .expect("re-read in time")
            .expect("alive");
        assert_eq!(a.current().pods().len(), 2);
        // A broken file keeps the previous pods; a valid one is taken again.
        std::fs::write(&path, "{not json").expect("write");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(a.current().pods().len(), 2);
        std::fs::write(&path, pods(3)).expect("write");
        tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|i| i.pods().len() == 3))
            .await
            .expect("re-read in time")
            .expect("alive");
        // Only a changed stamp (inode, size, modification time) makes it read the file: the
        // same bytes rewritten with its old time are not parsed again...
        let before = std::fs::metadata(&path)
            .expect("stat")
            .modified()
            .expect("mtime");
        let renamed = pods(3).replace("\"p0\"", "\"q0\"");
        std::fs::write(&path, &renamed).expect("write");
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(before))
            .expect("set mtime");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(a.current().pods().iter().any(|p| p.name == "p0"));
        // ...and are once the time moves.
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(before + Duration::from_secs(1)))
            .expect("set mtime");
        tokio::time::timeout(
            Duration::from_secs(5),
            rx.wait_for(|i| i.pods().iter().any(|p| p.name == "q0")),
        )
        .await
        .expect("re-read in time")
        .expect("alive");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn pods_file_changes_are_seen_without_polling() {
        let dir = std::env::temp_dir().join(format!("kpulse-inotify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("pods.json");
        let pods = |name: &str| {
            format!(
                r#"{{"pods":[{{"uid":"u-{name}","namespace":"d","name":"{name}","containers":[{{"name":"a","cgroup":"/{name}/a"}}]}}]}}"#
            )
        };
        std::fs::write(&path, pods("first")).expect("write");
        // Polling alone would take an hour.
        let a = Attributor::from_file(path.clone(), Duration::from_secs(3600))
            .await
            .expect("valid file");
        let mut rx = a.subscribe();
        let named =
            |want: &'static str| move |i: &Arc<PodIndex>| i.pods().iter().any(|p| p.name == want);
        // Written in place...
        std::fs::write(&path, pods("second")).expect("write");
        tokio::time::timeout(Duration::from_secs(5), rx.wait_for(named("second")))
            .await
            .expect("seen through inotify")
            .expect("alive");
        // ...and replaced by a rename, as tools that write atomically do.
        let tmp = dir.join(".pods.json.tmp");
        std::fs::write(&tmp, pods("third")).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
        tokio::time::timeout(Duration::from_secs(5), rx.wait_for(named("third")))
            .await
            .expect("seen through inotify")
            .expect("alive");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A scripted API server: lists the node's pods, then streams watch events the test
    /// sends; records every request's path and query.
    mod cluster {
        use std::convert::Infallible;

        use bytes::Bytes;
        use http_body_util::{Full, StreamBody};
        use hyper::body::Frame;
        use tokio::sync::mpsc;

        use super::*;

        type BoxBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

        fn client(
            pods: Vec<Pod>,
            watch: mpsc::Receiver<Bytes>,
            seen: mpsc::Sender<String>,
        ) -> kube::Client {
            let watch = Arc::new(tokio::sync::Mutex::new(Some(watch)));
            let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
                let pods = pods.clone();
                let watch = watch.clone();
                let seen = seen.clone();
                async move {
                    let uri = req.uri().to_string();
                    let _ = seen.send(uri.clone()).await;
                    let body: BoxBody = if uri.contains("watch=true") {
                        match watch.lock().await.take() {
                            Some(rx) => {
                                let stream =
                                    futures_util::stream::unfold(rx, |mut rx| async move {
                                        rx.recv()
                                            .await
                                            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
                                    });
                                BoxBody::new(StreamBody::new(stream))
                            }
                            // Later watches hang (a quiet watch), never end.
                            None => BoxBody::new(StreamBody::new(futures_util::stream::pending())),
                        }
                    } else {
                        let list = serde_json::json!({
                            "apiVersion": "v1", "kind": "PodList",
                            "metadata": {"resourceVersion": "10"},
                            "items": pods,
                        });
                        BoxBody::new(Full::new(Bytes::from(list.to_string())))
                    };
                    let mut r = http::Response::new(body);
                    r.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, Infallible>(r)
                }
            });
            kube::Client::new(service, "default")
        }

        fn event(kind: &str, pod: &Pod) -> Bytes {
            let mut line = serde_json::json!({"type": kind, "object": pod}).to_string();
            line.push('\n');
            Bytes::from(line)
        }

        async fn next_index(rx: &mut watch::Receiver<Arc<PodIndex>>) -> Arc<PodIndex> {
            tokio::time::timeout(Duration::from_secs(10), rx.changed())
                .await
                .expect("a new index in time")
                .expect("source alive");
            rx.borrow_and_update().clone()
        }

        #[tokio::test]
        async fn the_reflector_follows_this_nodes_pods() {
            let (pods, cgroups) = cluster();
            let mut web = pods[0].clone();
            web.metadata.resource_version = Some("11".into());
            let (watch_tx, watch_rx) = mpsc::channel(8);
            let (seen_tx, mut seen) = mpsc::channel(64);
            let attributor =
                Attributor::cluster(client(vec![pods[1].clone()], watch_rx, seen_tx), "node-1");
            assert!(!attributor.current().is_ready());
            let mut rx = attributor.subscribe();

            // The list: only the static pod.
            let index = next_index(&mut rx).await;
            assert!(index.is_ready());
            assert_eq!(index.pods().len(), 1);
            let list = seen.recv().await.expect("list request");
            assert!(list.starts_with("/api/v1/pods?"), "{list}");
            assert!(
                list.contains("fieldSelector=spec.nodeName%3Dnode-1"),
                "{list}"
            );
            let a = index.join(&snap(cgroups.clone()));
            assert_eq!(a.counters.len(), 1);
            assert_eq!(
                a.unattributed, 5,
                "the web pod's cgroups, until it is watched"
            );

            // web arrives through the watch, then goes.
            watch_tx.send(event("ADDED", &web)).await.expect("send");
            let index = next_index(&mut rx).await;
            assert_eq!(index.join(&snap(cgroups.clone())).counters.len(), 2);
            let before = index.pods().clone();
            watch_tx.send(event("DELETED", &web)).await.expect("send");
            let index = next_index(&mut rx).await;
            let changes = index.pods().changes_since(&before);
            assert_eq!(changes.removed, [U1]);
            assert!(changes.upserts.is_empty());
            let watch = seen.recv().await.expect("watch request");
            assert!(watch.contains("watch=true"), "{watch}");
            assert!(
                watch.contains("fieldSelector=spec.nodeName%3Dnode-1"),
                "{watch}"
            );
            assert!(watch.contains("resourceVersion=10"), "{watch}");
        }
    }
}
