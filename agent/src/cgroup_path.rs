//! Kubernetes attribution from a cgroup path: which pod, QoS class and container a cgroup
//! belongs to, read from the path alone.
//!
//! This module is pure: no I/O, no kube types. It is not the attribution itself: it cannot
//! tell a pod's sandbox (pause) container from an app container, nor name a container. That is
//! `attribute.rs`'s job, which matches the [`ContainerId`] found here against the pod's
//! statuses.
//!
//! # Input
//!
//! [`classify`] takes a path relative to the cgroup mount, with or without a leading `/`: on
//! cgroup v2 relative to `/sys/fs/cgroup`, on v1 or hybrid relative to a controller's mount
//! (`/sys/fs/cgroup/memory`, ...), where the relative paths are the same. Empty segments (`//`,
//! a trailing `/`) and `.` segments are ignored.
//!
//! # Path grammar
//!
//! A path is any number of ignored prefix segments (`system.slice`, `kubelet`, `k8s`,
//! `docker-<id>.scope`, ...) followed by the first *kubepods root*, or by a *colon segment*.
//! Nothing before that is looked at; a path with neither is [`CgroupKind::NotKubernetes`].
//!
//! ```text
//! QOS   = "burstable" | "besteffort"          Guaranteed pods have no QoS level
//! UID   = 8-4-4-4-12 hex digits               assigned by the apiserver
//!       | 32 hex digits                       static pod: kubelet's hash of the pod
//! SUID  = UID with '-' written as '_'         kubelet's systemd escaping; '-' accepted too
//! ID    = 64 lowercase hex digits             containerd, CRI-O and Docker container ids
//!
//! cgroupfs driver
//!   "kubepods"                                            KubepodsRoot { qos: None }
//!   "kubepods/" QOS                                       KubepodsRoot { qos: Some(..) }
//!   "kubepods/" [QOS "/"] "pod" UID                       Pod
//!   "kubepods/" [QOS "/"] "pod" UID "/" CHILD ...         see CHILD
//!
//! systemd driver; R = "kubepods", or "<p>-kubepods" when kubelet runs with
//! --cgroup-root=/<p> (kind: "kubelet-kubepods"; /a/b gives "a-b-kubepods" under
//! "a.slice/a-b.slice"); R-Q below means R "-" QOS
//!   R ".slice"                                            KubepodsRoot { qos: None }
//!   R ".slice/" R-Q ".slice"                              KubepodsRoot { qos: Some(..) }
//!   R ".slice/" R "-pod" SUID ".slice"                    Pod (Guaranteed)
//!   R ".slice/" R-Q ".slice/" R-Q "-pod" SUID ".slice"    Pod
//!   ... pod slice "/" CHILD ...                           see CHILD
//!
//! colon segment: runc given a systemd cgroupsPath "slice:prefix:name" but running its
//! cgroupfs manager (a containerd/kubelet cgroup-driver mismatch) makes it a directory name
//!   (R | R-Q) "-pod" SUID ".slice:" PREFIX ":" NAME       as CHILD PREFIX "-" NAME, except
//!                                                         that an unknown PREFIX with an ID
//!                                                         is a Container, Unknown
//!
//! CHILD, a child of a pod cgroup (either driver)
//!   "cri-containerd-" ID [".scope"]                       Container, Containerd
//!   "crio-" ID [".scope"]                                 Container, CriO
//!   "docker-" ID [".scope"]                               Container, Docker
//!   "crio-conmon-" ID [".scope"]                          ConmonMonitor
//!   ID [".scope"]                                         Container, Unknown
//!   anything else                                         PodOther
//! below a Container, at any depth                         ContainerChild
//! below a ConmonMonitor or a PodOther, at any depth       PodOther
//! ```
//!
//! # Decisions
//!
//! - **The first kubepods root wins.** A kubelet nested in a container (kind, k3d, a CI pod)
//!   puts a second `kubepods` under the outer container's cgroup; from the node that is still
//!   the outer container's usage, so it is a [`CgroupKind::ContainerChild`] of that container.
//!   Only a root directly followed by another root (`--cgroup-root=/kubepods` gives
//!   `kubepods/kubepods/...`) counts as a prefix.
//! - **Errors are for paths that claim to be Kubernetes and are malformed**: a segment under a
//!   kubepods root that is neither a QoS level nor a pod, a pod segment whose UID is not a
//!   UID, a pod slice named for another root or QoS level than its parent, a recognised runtime
//!   prefix (`cri-containerd-`, `crio-`, `crio-conmon-`, `docker-`) followed by a bad id.
//!   Unrecognised names *below a pod* are [`CgroupKind::PodOther`], not errors: runtimes put
//!   their own cgroups there (e.g. Kata's `kata_<id>` for its VM), and they belong to the pod.
//!   A bare child is a container only if it is exactly [`ID`](ContainerId).
//! - **UIDs are normalised**: `_` becomes `-` and hex is lower-cased. A 32-digit static-pod UID
//!   is kept as it is, without inserting dashes: it is the value of the mirror pod's
//!   `kubernetes.io/config.mirror` annotation, not the mirror pod's own `metadata.uid`, so
//!   `attribute.rs` must match static pods by that annotation.
//! - **Container ids are not normalised**: runtimes write them lower-case, and an upper-case
//!   id after a runtime prefix is an error rather than an id that matches nothing.
//! - **The sandbox is a container here.** The pause container's cgroup is an ordinary container
//!   cgroup whose id is the pod sandbox id; no runtime above marks it in the path. A pod's
//!   statuses list only its app, init and ephemeral containers, so a [`CgroupKind::Container`]
//!   whose id matches none of them is the sandbox (or a container the reflector has not seen
//!   yet). CRI-O with `drop_infra_ctr` has no pause process at all.
//! - **CRI-O's conmon** gets [`CgroupKind::ConmonMonitor`] when it sits in the pod
//!   (`conmon_cgroup = "pod"`, the default); in `system.slice` it is node overhead and
//!   [`CgroupKind::NotKubernetes`].
//! - **Descendants of a container** are [`CgroupKind::ContainerChild`], not `Container`: with
//!   per-cgroup (non-hierarchical) counters their usage must be added to the container's,
//!   while hierarchical counters (`cpu.stat`, `memory.current`) of the container already
//!   include them. crun's `crio-<id>.scope/container` and a container running systemd
//!   (`.../cri-containerd-<id>.scope/init.scope`) are examples.
//! - **Not covered**: kubelet with `--cgroups-per-qos=false` (no pod cgroups; containers are
//!   [`CgroupKind::NotKubernetes`]), and paths seen through a cgroup namespace (`/../..`).

use std::fmt;

/// Result of this module, [`PathError`] by default.
pub type Result<T, E = PathError> = std::result::Result<T, E>;

/// A pod UID as kubelet names the pod's cgroup, normalised: lower-case, `-` not `_`.
///
/// Either an apiserver-assigned UUID (`5f8c0f2a-1b2c-4d3e-9f00-0123456789ab`) or, for a static
/// pod, the 32-hex-digit hash kubelet uses as its UID (the mirror pod's
/// `kubernetes.io/config.mirror` annotation).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodUid(String);

impl PodUid {
    /// Parses a UID, accepting systemd's `_` for `-` and upper-case hex; `None` if it is
    /// neither a UUID nor 32 hex digits.
    #[must_use]
    pub fn parse(raw: &str) -> Option<Self> {
        let uid: String = raw
            .chars()
            .map(|c| {
                if c == '_' {
                    '-'
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect();
        (is_uuid(&uid) || is_lower_hex(&uid, 32)).then_some(Self(uid))
    }

    /// The canonical form, e.g. `5f8c0f2a-1b2c-4d3e-9f00-0123456789ab`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A container id as containerd, CRI-O and Docker write it: 64 lower-case hex digits.
///
/// Also the pod sandbox id, for the sandbox's (pause) cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerId(String);

impl ContainerId {
    /// Parses a bare id; `None` unless it is exactly 64 lower-case hex digits.
    #[must_use]
    pub fn parse(raw: &str) -> Option<Self> {
        is_lower_hex(raw, 64).then(|| Self(raw.to_owned()))
    }

    /// Parses a pod status `containerID`, `<runtime>://<id>` (`containerd://`, `cri-o://`,
    /// `docker://`), or a bare id.
    #[must_use]
    pub fn from_status(raw: &str) -> Option<Self> {
        let id = raw.split_once("://").map_or(raw, |(_, id)| id);
        Self::parse(id)
    }

    /// The 64 hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A pod's QoS class, as kubelet places its cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QosClass {
    /// Directly under the kubepods root.
    Guaranteed,
    /// Under `burstable` / `<root>-burstable.slice`.
    Burstable,
    /// Under `besteffort` / `<root>-besteffort.slice`.
    BestEffort,
}

impl QosClass {
    /// The name Kubernetes uses in `status.qosClass`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The container runtime, as far as the cgroup name tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Runtime {
    /// `cri-containerd-<id>`.
    Containerd,
    /// `crio-<id>`.
    CriO,
    /// `docker-<id>` (dockershim, cri-dockerd).
    Docker,
    /// A bare id (cgroupfs driver: containerd, Docker, ...) or an unknown colon-form prefix.
    Unknown,
}

impl Runtime {
    /// A short lower-case name: `containerd`, `cri-o`, `docker`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Containerd => "containerd",
            Self::CriO => "cri-o",
            Self::Docker => "docker",
            Self::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a cgroup is, from Kubernetes' point of view. See the [module docs](self) for the
/// grammar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupKind {
    /// The kubepods root (`qos: None`; Guaranteed pods are its direct children) or a QoS-level
    /// cgroup (`kubepods/burstable`, `kubepods-besteffort.slice`, ...).
    KubepodsRoot {
        /// `None` for the root itself, else the QoS level.
        qos: Option<QosClass>,
    },
    /// A pod's cgroup.
    Pod {
        /// The pod.
        uid: PodUid,
        /// Its QoS class.
        qos: QosClass,
    },
    /// A container or the pod sandbox (pause): the path alone can't tell them apart; the id is
    /// matched against the pod's statuses later, and one that matches none is the sandbox.
    Container {
        /// The pod it belongs to.
        pod: PodUid,
        /// The pod's QoS class.
        qos: QosClass,
        /// The container (or sandbox) id.
        id: ContainerId,
        /// From the cgroup name's prefix.
        runtime: Runtime,
    },
    /// A cgroup below a container's (crun's `container`, systemd's `init.scope` in a container
    /// running systemd, a nested kubelet's hierarchy, ...): its usage is the container's, and
    /// already counted in the container's hierarchical counters.
    ContainerChild {
        /// The pod it belongs to.
        pod: PodUid,
        /// The pod's QoS class.
        qos: QosClass,
        /// The enclosing container's id.
        id: ContainerId,
        /// From the enclosing container cgroup's prefix.
        runtime: Runtime,
    },
    /// CRI-O's conmon monitor for a container (`crio-conmon-<id>`): belongs to the pod, is not
    /// a container.
    ConmonMonitor {
        /// The pod it belongs to.
        pod: PodUid,
        /// The pod's QoS class.
        qos: QosClass,
        /// The id of the container it monitors.
        id: ContainerId,
    },
    /// Anything else below a pod cgroup: an unrecognised child name (a runtime's own cgroup,
    /// such as Kata's `kata_<id>`), or a descendant of a [`CgroupKind::ConmonMonitor`]. Belongs to
    /// the pod, to no container.
    PodOther {
        /// The pod it belongs to.
        pod: PodUid,
        /// The pod's QoS class.
        qos: QosClass,
    },
    /// Not below a kubepods root: system services, the runtime's own daemons, user sessions.
    NotKubernetes,
}

impl CgroupKind {
    /// The pod this cgroup belongs to, if any.
    pub fn pod_uid(&self) -> Option<&PodUid> {
        match self {
            Self::Pod { uid: pod, .. }
            | Self::Container { pod, .. }
            | Self::ContainerChild { pod, .. }
            | Self::ConmonMonitor { pod, .. }
            | Self::PodOther { pod, .. } => Some(pod),
            Self::KubepodsRoot { .. } | Self::NotKubernetes => None,
        }
    }

    /// The container whose usage this cgroup is: for a [`CgroupKind::Container`] or a
    /// [`CgroupKind::ContainerChild`]; not for a [`CgroupKind::ConmonMonitor`].
    pub fn container_id(&self) -> Option<&ContainerId> {
        match self {
            Self::Container { id, .. } | Self::ContainerChild { id, .. } => Some(id),
            _ => None,
        }
    }

    /// The QoS class of the pod, or of the QoS-level cgroup.
    pub fn qos(&self) -> Option<QosClass> {
        match self {
            Self::KubepodsRoot { qos } => *qos,
            Self::Pod { qos, .. }
            | Self::Container { qos, .. }
            | Self::ContainerChild { qos, .. }
            | Self::ConmonMonitor { qos, .. }
            | Self::PodOther { qos, .. } => Some(*qos),
            Self::NotKubernetes => None,
        }
    }
}

/// A path that claims to be a Kubernetes cgroup and is malformed. Each names the offending
/// segment; the caller knows, and should log, the whole path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// A child of a kubepods root or QoS level that is neither a QoS level nor a pod.
    #[error("cgroup {segment:?} under {parent:?} is neither a QoS level nor a pod")]
    UnexpectedSegment {
        /// The offending segment.
        segment: String,
        /// Its parent segment.
        parent: String,
    },
    /// A pod segment (`pod<uid>`, `...-pod<uid>.slice`) whose UID is not a UID.
    #[error("pod cgroup {segment:?}: {uid:?} is not a pod UID (want a UUID or 32 hex digits)")]
    InvalidPodUid {
        /// The offending segment.
        segment: String,
        /// The UID part as found.
        uid: String,
    },
    /// A systemd pod slice whose name does not extend its parent's (systemd slices are named
    /// after their whole ancestry, so this can't be a real kubelet layout).
    #[error("pod slice {segment:?} does not belong under {parent:?}")]
    PodSliceMismatch {
        /// The offending segment.
        segment: String,
        /// Its parent segment.
        parent: String,
    },
    /// A recognised runtime prefix (`cri-containerd-`, `crio-`, `crio-conmon-`, `docker-`, or
    /// a colon segment's) followed by something that is not a container id.
    #[error(
        "container cgroup {segment:?}: {id:?} is not a container id (want 64 lower-case hex digits)"
    )]
    InvalidContainerId {
        /// The offending segment.
        segment: String,
        /// The id part as found.
        id: String,
    },
}

/// Classifies a cgroup by its path relative to the cgroup mount. Never panics.
///
/// # Errors
///
/// [`PathError`] when the path has a kubepods root (or a colon segment naming a pod slice)
/// but what follows is malformed; see the [module docs](self).
pub fn classify(path: &str) -> Result<CgroupKind> {
    let segments: Vec<&str> = path
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    for (i, &segment) in segments.iter().enumerate() {
        let root = Root::parse(segment);
        if root.is_some()
            && segments
                .get(i + 1)
                .is_some_and(|&s| Root::parse(s).is_some())
        {
            // `--cgroup-root=/kubepods`: this one is only the prefix of the real root.
            continue;
        }
        let rest = segments.get(i + 1..).unwrap_or_default();
        match root {
            Some(Root::Cgroupfs) => return classify_cgroupfs(rest),
            Some(Root::Systemd(stem)) => return classify_systemd(segment, stem, rest),
            None => {}
        }
        if let Some(kind) = classify_colon(segment, rest)? {
            return Ok(kind);
        }
    }
    Ok(CgroupKind::NotKubernetes)
}

/// A kubepods root segment.
enum Root<'a> {
    /// `kubepods`.
    Cgroupfs,
    /// `<stem>.slice`, the stem being `kubepods` or ending in `-kubepods`.
    Systemd(&'a str),
}

impl<'a> Root<'a> {
    fn parse(segment: &'a str) -> Option<Self> {
        if segment == "kubepods" {
            return Some(Self::Cgroupfs);
        }
        let stem = segment.strip_suffix(".slice")?;
        is_systemd_root_stem(stem).then_some(Self::Systemd(stem))
    }
}

fn is_systemd_root_stem(stem: &str) -> bool {
    stem == "kubepods" || stem.ends_with("-kubepods")
}

fn qos_from_name(name: &str) -> Option<QosClass> {
    match name {
        "burstable" => Some(QosClass::Burstable),
        "besteffort" => Some(QosClass::BestEffort),
        _ => None,
    }
}

/// `rest` follows a `kubepods` segment.
fn classify_cgroupfs(rest: &[&str]) -> Result<CgroupKind> {
    let Some((&first, after)) = rest.split_first() else {
        return Ok(CgroupKind::KubepodsRoot { qos: None });
    };
    let (qos, parent, pod_segment, below) = match (qos_from_name(first), after.split_first()) {
        (Some(level), None) => return Ok(CgroupKind::KubepodsRoot { qos: Some(level) }),
        (Some(level), Some((&pod_segment, below))) => (level, first, pod_segment, below),
        (None, _) => (QosClass::Guaranteed, "kubepods", first, after),
    };
    let Some(raw_uid) = pod_segment.strip_prefix("pod") else {
        return Err(PathError::UnexpectedSegment {
            segment: pod_segment.to_owned(),
            parent: parent.to_owned(),
        });
    };
    let uid = parse_uid(pod_segment, raw_uid)?;
    classify_below_pod(uid, qos, below)
}

/// `rest` follows the systemd root slice `root` (`<stem>.slice`).
fn classify_systemd(root: &str, stem: &str, rest: &[&str]) -> Result<CgroupKind> {
    let Some((&first, after)) = rest.split_first() else {
        return Ok(CgroupKind::KubepodsRoot { qos: None });
    };
    let qos_level = first
        .strip_prefix(stem)
        .and_then(|s| s.strip_prefix('-'))
        .and_then(|s| s.strip_suffix(".slice"))
        .and_then(qos_from_name);
    let (parent, pod_segment, below) = match (qos_level, after.split_first()) {
        (Some(level), None) => return Ok(CgroupKind::KubepodsRoot { qos: Some(level) }),
        (Some(_), Some((&pod_segment, below))) => (first, pod_segment, below),
        (None, _) => (root, first, after),
    };
    let Some(slice) = PodSlice::parse(pod_segment, pod_segment)? else {
        return Err(PathError::UnexpectedSegment {
            segment: pod_segment.to_owned(),
            parent: parent.to_owned(),
        });
    };
    let expected_qos = qos_level.unwrap_or(QosClass::Guaranteed);
    if slice.root_stem != stem || slice.qos != expected_qos {
        return Err(PathError::PodSliceMismatch {
            segment: pod_segment.to_owned(),
            parent: parent.to_owned(),
        });
    }
    classify_below_pod(slice.uid, slice.qos, below)
}

/// A colon segment (`<pod slice>:<prefix>:<id>`), or `Ok(None)` if `segment` is not one.
fn classify_colon(segment: &str, rest: &[&str]) -> Result<Option<CgroupKind>> {
    let mut parts = segment.split(':');
    let (Some(slice_name), Some(prefix), Some(raw_id), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Ok(None);
    };
    let Some(slice) = PodSlice::parse(slice_name, segment)? else {
        return Ok(None);
    };
    let leaf = match runtime_prefix(prefix) {
        Some(kind) => Some(leaf_with_id(segment, kind, raw_id)?),
        None => ContainerId::parse(raw_id).map(|id| Leaf::Container(id, Runtime::Unknown)),
    };
    Ok(Some(classify_leaf(slice.uid, slice.qos, leaf, rest)))
}

/// A systemd pod slice name, `<root stem>[-<qos>]-pod<suid>.slice`.
struct PodSlice<'a> {
    root_stem: &'a str,
    qos: QosClass,
    uid: PodUid,
}

impl<'a> PodSlice<'a> {
    /// `Ok(None)` if `name` is not named like a pod slice; an error naming `segment` (which
    /// is `name`, or a colon segment starting with it) if it is but its UID is malformed.
    fn parse(name: &'a str, segment: &str) -> Result<Option<Self>> {
        let Some(stem) = name.strip_suffix(".slice") else {
            return Ok(None);
        };
        // UIDs are hex, dashes and underscores: the last "-pod" is the marker.
        let Some((prefix, raw_uid)) = stem.rsplit_once("-pod") else {
            return Ok(None);
        };
        let (root_stem, qos) = match prefix.rsplit_once('-') {
            Some((root, level)) if is_systemd_root_stem(root) => match qos_from_name(level) {
                Some(qos) => (root, qos),
                None => (prefix, QosClass::Guaranteed),
            },
            _ => (prefix, QosClass::Guaranteed),
        };
        if !is_systemd_root_stem(root_stem) {
            return Ok(None);
        }
        let uid = parse_uid(segment, raw_uid)?;
        Ok(Some(Self {
            root_stem,
            qos,
            uid,
        }))
    }
}

fn parse_uid(segment: &str, raw_uid: &str) -> Result<PodUid> {
    PodUid::parse(raw_uid).ok_or_else(|| PathError::InvalidPodUid {
        segment: segment.to_owned(),
        uid: raw_uid.to_owned(),
    })
}

/// What a child of a pod cgroup is.
enum Leaf {
    Container(ContainerId, Runtime),
    Conmon(ContainerId),
}

/// What a recognised runtime prefix announces.
#[derive(Clone, Copy)]
enum LeafKind {
    Container(Runtime),
    Conmon,
}

/// Prefixes of children of a pod cgroup, without the `-`; `crio-conmon` before `crio`.
const RUNTIME_PREFIXES: [(&str, LeafKind); 4] = [
    ("cri-containerd", LeafKind::Container(Runtime::Containerd)),
    ("crio-conmon", LeafKind::Conmon),
    ("crio", LeafKind::Container(Runtime::CriO)),
    ("docker", LeafKind::Container(Runtime::Docker)),
];

fn runtime_prefix(prefix: &str) -> Option<LeafKind> {
    RUNTIME_PREFIXES
        .iter()
        .find(|(p, _)| *p == prefix)
        .map(|&(_, kind)| kind)
}

fn leaf_with_id(segment: &str, kind: LeafKind, raw_id: &str) -> Result<Leaf> {
    let Some(id) = ContainerId::parse(raw_id) else {
        return Err(PathError::InvalidContainerId {
            segment: segment.to_owned(),
            id: raw_id.to_owned(),
        });
    };
    Ok(match kind {
        LeafKind::Container(runtime) => Leaf::Container(id, runtime),
        LeafKind::Conmon => Leaf::Conmon(id),
    })
}

/// A child of a pod cgroup: `Ok(None)` for an unrecognised name.
fn parse_child(segment: &str) -> Result<Option<Leaf>> {
    let name = segment.strip_suffix(".scope").unwrap_or(segment);
    for &(prefix, kind) in &RUNTIME_PREFIXES {
        if let Some(raw_id) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('-'))
        {
            return leaf_with_id(segment, kind, raw_id).map(Some);
        }
    }
    Ok(ContainerId::parse(name).map(|id| Leaf::Container(id, Runtime::Unknown)))
}

/// `rest` follows the cgroup of pod `uid`.
fn classify_below_pod(uid: PodUid, qos: QosClass, rest: &[&str]) -> Result<CgroupKind> {
    let Some((&child, below)) = rest.split_first() else {
        return Ok(CgroupKind::Pod { uid, qos });
    };
    let leaf = parse_child(child)?;
    Ok(classify_leaf(uid, qos, leaf, below))
}

/// A child of pod `pod` that is `leaf` (`None`: unrecognised), with `below` under it.
fn classify_leaf(pod: PodUid, qos: QosClass, leaf: Option<Leaf>, below: &[&str]) -> CgroupKind {
    match (leaf, below.is_empty()) {
        (Some(Leaf::Container(id, runtime)), true) => CgroupKind::Container {
            pod,
            qos,
            id,
            runtime,
        },
        (Some(Leaf::Container(id, runtime)), false) => CgroupKind::ContainerChild {
            pod,
            qos,
            id,
            runtime,
        },
        (Some(Leaf::Conmon(id)), true) => CgroupKind::ConmonMonitor { pod, qos, id },
        (Some(Leaf::Conmon(_)) | None, _) => CgroupKind::PodOther { pod, qos },
    }
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// 8-4-4-4-12 lower-case hex digits.
fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => matches!(b, b'0'..=b'9' | b'a'..=b'f'),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod UID, dashed.
    const U: &str = "5f8c0f2a-1b2c-4d3e-9f00-0123456789ab";
    /// Another pod UID.
    const U2: &str = "214f3ba8-4b69-4bdb-a7d5-5ecc73f04ae9";
    /// A static pod's UID (kubelet's manifest hash).
    const STATIC: &str = "9c8d5d1b1e8e0e8f8d9b5b7e0b3c4a4f";
    /// A container id.
    const ID: &str = "d4e8e05a546c86b6443f101966c618e47753ed01fa9929cae00d3b692f7a9f80";
    /// Another container id.
    const ID2: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// Expands `{U}` (UID), `{U_}` (UID, systemd-escaped), `{U2}`, `{U2_}`, `{S}` (static UID),
    /// `{ID}`, `{ID2}` in a path template.
    fn expand(template: &str) -> String {
        template
            .replace("{U_}", &U.replace('-', "_"))
            .replace("{U2_}", &U2.replace('-', "_"))
            .replace("{U2}", U2)
            .replace("{U}", U)
            .replace("{S}", STATIC)
            .replace("{ID2}", ID2)
            .replace("{ID}", ID)
    }

    fn uid(s: &str) -> PodUid {
        PodUid::parse(s).expect("test UID parses")
    }

    fn cid(s: &str) -> ContainerId {
        ContainerId::parse(s).expect("test id parses")
    }

    fn root(qos: Option<QosClass>) -> CgroupKind {
        CgroupKind::KubepodsRoot { qos }
    }

    fn pod(u: &str, qos: QosClass) -> CgroupKind {
        CgroupKind::Pod { uid: uid(u), qos }
    }

    fn ctr(u: &str, qos: QosClass, id: &str, runtime: Runtime) -> CgroupKind {
        CgroupKind::Container {
            pod: uid(u),
            qos,
            id: cid(id),
            runtime,
        }
    }

    fn child(u: &str, qos: QosClass, id: &str, runtime: Runtime) -> CgroupKind {
        CgroupKind::ContainerChild {
            pod: uid(u),
            qos,
            id: cid(id),
            runtime,
        }
    }

    fn conmon(u: &str, qos: QosClass, id: &str) -> CgroupKind {
        CgroupKind::ConmonMonitor {
            pod: uid(u),
            qos,
            id: cid(id),
        }
    }

    fn other(u: &str, qos: QosClass) -> CgroupKind {
        CgroupKind::PodOther { pod: uid(u), qos }
    }

    use CgroupKind::NotKubernetes;
    use QosClass::{BestEffort, Burstable, Guaranteed};
    use Runtime::{Containerd, CriO, Docker, Unknown};

    #[test]
    fn classifies_real_world_paths() {
        let cases: Vec<(&str, CgroupKind)> = vec![
            // systemd driver, containerd (kubeadm, EKS AL2023, AKS).
            ("/kubepods.slice", root(None)),
            ("/kubepods.slice/kubepods-burstable.slice", root(Some(Burstable))),
            ("/kubepods.slice/kubepods-besteffort.slice", root(Some(BestEffort))),
            (
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice",
                pod(U, Burstable),
            ),
            (
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice/cri-containerd-{ID}.scope",
                ctr(U, Burstable, ID, Containerd),
            ),
            (
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{U_}.slice/cri-containerd-{ID}.scope",
                ctr(U, BestEffort, ID, Containerd),
            ),
            ("/kubepods.slice/kubepods-pod{U_}.slice", pod(U, Guaranteed)),
            (
                "/kubepods.slice/kubepods-pod{U_}.slice/cri-containerd-{ID}.scope",
                ctr(U, Guaranteed, ID, Containerd),
            ),
            // systemd driver, CRI-O (OpenShift): container, conmon, crun's inner cgroup.
            (
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice/crio-{ID}.scope",
                ctr(U, Burstable, ID, CriO),
            ),
            (
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice/crio-conmon-{ID}.scope",
                conmon(U, Burstable, ID),
            ),
            (
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{U_}.slice/crio-{ID}.scope/container",
                child(U, BestEffort, ID, CriO),
            ),
            (
                "/kubepods.slice/kubepods-pod{U_}.slice/crio-{ID2}.scope",
                ctr(U, Guaranteed, ID2, CriO),
            ),
            // systemd driver, Docker (dockershim, cri-dockerd).
            (
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{U_}.slice/docker-{ID}.scope",
                ctr(U, BestEffort, ID, Docker),
            ),
            // Seen from some old kubelets: the UID unescaped (dashed) in the slice name.
            (
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U}.slice/docker-{ID}.scope",
                ctr(U, Burstable, ID, Docker),
            ),
            // Static pod (kubeadm control plane): 32-hex UID.
            (
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{S}.slice/cri-containerd-{ID}.scope",
                ctr(STATIC, Burstable, ID, Containerd),
            ),
            ("/kubepods/burstable/pod{S}/{ID}", ctr(STATIC, Burstable, ID, Unknown)),
            // kind: --cgroup-root=/kubelet with the systemd driver, inside and outside the
            // node container's cgroup namespace.
            ("/kubelet.slice/kubelet-kubepods.slice", root(None)),
            (
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice",
                root(Some(BestEffort)),
            ),
            (
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{U_}.slice/cri-containerd-{ID}.scope",
                ctr(U, BestEffort, ID, Containerd),
            ),
            (
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{U_}.slice",
                pod(U, Guaranteed),
            ),
            (
                "/system.slice/docker-{ID2}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{U_}.slice/cri-containerd-{ID}.scope",
                ctr(U, Burstable, ID, Containerd),
            ),
            // A deeper --cgroup-root=/a/b with systemd.
            (
                "/a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-burstable.slice/a-b-kubepods-burstable-pod{U_}.slice/cri-containerd-{ID}.scope",
                ctr(U, Burstable, ID, Containerd),
            ),
            // cgroupfs driver (k3s, GKE COS, EKS AL2, v1 and hybrid controllers alike).
            ("/kubepods", root(None)),
            ("/kubepods/burstable", root(Some(Burstable))),
            ("/kubepods/besteffort", root(Some(BestEffort))),
            ("/kubepods/burstable/pod{U}", pod(U, Burstable)),
            ("/kubepods/burstable/pod{U}/{ID}", ctr(U, Burstable, ID, Unknown)),
            ("kubepods/besteffort/pod{U}/{ID}", ctr(U, BestEffort, ID, Unknown)),
            ("/kubepods/pod{U}", pod(U, Guaranteed)),
            ("/kubepods/pod{U}/{ID}", ctr(U, Guaranteed, ID, Unknown)),
            // cgroupfs CRI-O: prefixed ids without `.scope`.
            ("/kubepods/burstable/pod{U}/crio-{ID}", ctr(U, Burstable, ID, CriO)),
            ("/kubepods/burstable/pod{U}/crio-conmon-{ID}", conmon(U, Burstable, ID)),
            // cgroupfs with --cgroup-root, kind's old layout, k3d on cgroup v1.
            ("/k8s/kubepods/burstable/pod{U}/{ID}", ctr(U, Burstable, ID, Unknown)),
            ("/kubelet/kubepods/besteffort/pod{U}/{ID}", ctr(U, BestEffort, ID, Unknown)),
            ("/docker/{ID2}/kubepods/pod{U}/{ID}", ctr(U, Guaranteed, ID, Unknown)),
            (
                "/system.slice/docker-{ID2}.scope/kubepods/besteffort/pod{U}/{ID}",
                ctr(U, BestEffort, ID, Unknown),
            ),
            // --cgroup-root=/kubepods: the first root is a prefix.
            ("/kubepods/kubepods/burstable/pod{U}/{ID}", ctr(U, Burstable, ID, Unknown)),
            ("/kubepods.slice/kubepods-kubepods.slice/kubepods-kubepods-pod{U_}.slice", pod(U, Guaranteed)),
            // containerd's cgroupfs manager given kubelet's systemd path (driver mismatch).
            (
                "/system.slice/containerd.service/kubepods-besteffort-pod{U2_}.slice:cri-containerd:{ID}",
                ctr(U2, BestEffort, ID, Containerd),
            ),
            (
                "/kubepods-burstable-pod{U_}.slice:cri-containerd:{ID}",
                ctr(U, Burstable, ID, Containerd),
            ),
            ("/kubepods-pod{U_}.slice:crio:{ID}", ctr(U, Guaranteed, ID, CriO)),
            (
                "/system.slice/containerd.service/kubepods-pod{U_}.slice:nerdctl:{ID}",
                ctr(U, Guaranteed, ID, Unknown),
            ),
            (
                "/system.slice/containerd.service/kubepods-pod{U_}.slice:cri-containerd:{ID}/init.scope",
                child(U, Guaranteed, ID, Containerd),
            ),
            // Below a container: systemd in a container, a nested kubelet.
            (
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice/cri-containerd-{ID}.scope/init.scope",
                child(U, Burstable, ID, Containerd),
            ),
            (
                "/kubepods/burstable/pod{U}/{ID}/kubelet/kubepods/besteffort/pod{U2}/{ID2}",
                child(U, Burstable, ID, Unknown),
            ),
            (
                "/kubepods.slice/kubepods-pod{U_}.slice/cri-containerd-{ID}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{U2_}.slice/cri-containerd-{ID2}.scope",
                child(U, Guaranteed, ID, Containerd),
            ),
            // Other children of a pod, and what is below them.
            ("/kubepods/burstable/pod{U}/kata_{ID}", other(U, Burstable)),
            (
                "/kubepods.slice/kubepods-pod{U_}.slice/kata_sandboxed_pod",
                other(U, Guaranteed),
            ),
            ("/kubepods/pod{U}/{ID}.mount", other(U, Guaranteed)),
            (
                "/kubepods/burstable/pod{U}/crio-conmon-{ID}/x",
                other(U, Burstable),
            ),
            ("/kubepods/burstable/pod{U}/not-an-id/{ID}", other(U, Burstable)),
            // Odd spellings: no leading slash, trailing and double slashes, upper-case UIDs.
            ("kubepods//burstable///pod{U}//{ID}/", ctr(U, Burstable, ID, Unknown)),
            ("/kubepods.slice/", root(None)),
            (
                "/kubepods.slice/kubepods-pod5F8C0F2A_1B2C_4D3E_9F00_0123456789AB.slice/",
                pod(U, Guaranteed),
            ),
            (
                "/kubepods/pod5F8C0F2A-1b2c-4D3E-9f00-0123456789AB/{ID}",
                ctr(U, Guaranteed, ID, Unknown),
            ),
            ("/./kubepods/./pod{U}", pod(U, Guaranteed)),
            // Not Kubernetes.
            ("", NotKubernetes),
            ("/", NotKubernetes),
            ("/init.scope", NotKubernetes),
            ("/system.slice/containerd.service", NotKubernetes),
            ("/system.slice/kubelet.service", NotKubernetes),
            ("/system.slice/kubepods-foo.service", NotKubernetes),
            ("/kubepods-foo.slice", NotKubernetes),
            ("/kubepods-burstable.slice", NotKubernetes),
            ("/kubepods-burstable-pod{U_}.slice", NotKubernetes),
            ("/user.slice/user-1000.slice/session-3.scope", NotKubernetes),
            ("/system.slice/crio-conmon-{ID}.scope", NotKubernetes),
            ("/system.slice/docker-{ID}.scope", NotKubernetes),
            ("/docker/{ID}", NotKubernetes),
            ("/mykubepods/burstable/pod{U}", NotKubernetes),
            ("/system.slice/foo.service/a:b:c", NotKubernetes),
            ("/../../pod{U}/{ID}", NotKubernetes),
        ];
        assert!(cases.len() >= 30);
        let mut failures = Vec::new();
        for (template, want) in cases {
            let path = expand(template);
            let got = classify(&path);
            if got.as_ref() != Ok(&want) {
                failures.push(format!("{path}\n   want {want:?}\n    got {got:?}"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn rejects_malformed_kubernetes_paths() {
        // (path template, offending segment template, variant)
        type Variant = fn(&PathError) -> bool;
        let unexpected: Variant = |e| matches!(e, PathError::UnexpectedSegment { .. });
        let bad_uid: Variant = |e| matches!(e, PathError::InvalidPodUid { .. });
        let mismatch: Variant = |e| matches!(e, PathError::PodSliceMismatch { .. });
        let bad_id: Variant = |e| matches!(e, PathError::InvalidContainerId { .. });
        let cases: Vec<(&str, &str, Variant)> = vec![
            ("/kubepods/guaranteed", "guaranteed", unexpected),
            ("/kubepods/burstable/foo", "foo", unexpected),
            ("/kubepods.slice/kubepods-foo.service", "kubepods-foo.service", unexpected),
            ("/kubepods.slice/system.slice", "system.slice", unexpected),
            (
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable.slice",
                "kubepods-burstable.slice",
                unexpected,
            ),
            ("/kubepods/burstable/podnot-a-uid", "podnot-a-uid", bad_uid),
            ("/kubepods/pod", "pod", bad_uid),
            ("/kubepods/pod{U}0", "pod{U}0", bad_uid),
            ("/kubepods/pod{ID}", "pod{ID}", bad_uid),
            (
                "/kubepods.slice/kubepods-pod12345.slice",
                "kubepods-pod12345.slice",
                bad_uid,
            ),
            (
                "/system.slice/containerd.service/kubepods-podxyz.slice:cri-containerd:{ID}",
                "kubepods-podxyz.slice:cri-containerd:{ID}",
                bad_uid,
            ),
            (
                "/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{U_}.slice",
                "kubepods-besteffort-pod{U_}.slice",
                mismatch,
            ),
            (
                "/kubepods.slice/kubepods-burstable-pod{U_}.slice",
                "kubepods-burstable-pod{U_}.slice",
                mismatch,
            ),
            (
                "/kubelet.slice/kubelet-kubepods.slice/kubepods-pod{U_}.slice",
                "kubepods-pod{U_}.slice",
                mismatch,
            ),
            (
                "/kubepods.slice/kubepods-pod{U_}.slice/cri-containerd-abc.scope",
                "cri-containerd-abc.scope",
                bad_id,
            ),
            (
                "/kubepods.slice/kubepods-pod{U_}.slice/crio-conmon-{ID}0.scope",
                "crio-conmon-{ID}0.scope",
                bad_id,
            ),
            (
                "/kubepods/burstable/pod{U}/docker-D4E8E05A546C86B6443F101966C618E47753ED01FA9929CAE00D3B692F7A9F80",
                "docker-D4E8E05A546C86B6443F101966C618E47753ED01FA9929CAE00D3B692F7A9F80",
                bad_id,
            ),
            ("/kubepods/burstable/pod{U}/crio-", "crio-", bad_id),
            (
                "/kubepods-pod{U_}.slice:cri-containerd:nope",
                "kubepods-pod{U_}.slice:cri-containerd:nope",
                bad_id,
            ),
        ];
        let mut failures = Vec::new();
        for (template, segment, is_variant) in cases {
            let path = expand(template);
            let segment = expand(segment);
            match classify(&path) {
                Err(e) if is_variant(&e) && e.to_string().contains(&format!("{segment:?}")) => {}
                other => failures.push(format!(
                    "{path}: want an error naming {segment:?}, got {other:?}"
                )),
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn error_messages_name_the_segment() {
        let err = classify("/kubepods/burstable/podnot-a-uid/x").expect_err("malformed");
        assert_eq!(
            err.to_string(),
            r#"pod cgroup "podnot-a-uid": "not-a-uid" is not a pod UID (want a UUID or 32 hex digits)"#
        );
        let err = classify(&expand("/kubepods/pod{U}/crio-xyz")).expect_err("malformed");
        assert_eq!(
            err.to_string(),
            r#"container cgroup "crio-xyz": "xyz" is not a container id (want 64 lower-case hex digits)"#
        );
    }

    #[test]
    fn ids_display_and_normalise() {
        let u = uid("5F8C0F2A_1B2C_4D3E_9F00_0123456789AB");
        assert_eq!(u.as_str(), U);
        assert_eq!(u.to_string(), U);
        assert_eq!(uid(STATIC).as_str(), STATIC);
        assert_eq!(PodUid::parse("5f8c0f2a1b2c4d3e9f000123456789ab0"), None);
        assert_eq!(PodUid::parse("5f8c0f2a-1b2c-4d3e-9f00-0123456789ag"), None);
        assert_eq!(PodUid::parse("5f8c0f2a--1b2c-4d3e-9f00-0123456789a"), None);
        assert_eq!(PodUid::parse(""), None);

        let id = cid(ID);
        assert_eq!(id.to_string(), ID);
        assert_eq!(
            ContainerId::from_status(&format!("containerd://{ID}")),
            Some(id.clone())
        );
        assert_eq!(
            ContainerId::from_status(&format!("cri-o://{ID}")),
            Some(id.clone())
        );
        assert_eq!(ContainerId::from_status(ID), Some(id));
        assert_eq!(ContainerId::parse(&ID.to_uppercase()), None);
        assert_eq!(ContainerId::parse(&ID[1..]), None);
        assert_eq!(ContainerId::from_status("containerd://"), None);

        assert_eq!(Guaranteed.to_string(), "Guaranteed");
        assert_eq!(Burstable.to_string(), "Burstable");
        assert_eq!(BestEffort.to_string(), "BestEffort");
        assert_eq!(CriO.to_string(), "cri-o");
    }

    #[test]
    fn accessors() {
        let kind = ctr(U, Burstable, ID, Containerd);
        assert_eq!(kind.pod_uid(), Some(&uid(U)));
        assert_eq!(kind.container_id(), Some(&cid(ID)));
        assert_eq!(kind.qos(), Some(Burstable));
        let kind = conmon(U, BestEffort, ID);
        assert_eq!(kind.pod_uid(), Some(&uid(U)));
        assert_eq!(kind.container_id(), None);
        assert_eq!(root(Some(BestEffort)).qos(), Some(BestEffort));
        assert_eq!(root(None).qos(), None);
        assert_eq!(NotKubernetes.pod_uid(), None);
        assert_eq!(
            child(U, Guaranteed, ID, Docker).container_id(),
            Some(&cid(ID))
        );
    }

    /// xorshift64*: a deterministic source of garbage, no crates needed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            usize::try_from(self.next() % n as u64).unwrap_or(0)
        }
    }

    /// What a classified path promises, whatever the input.
    fn check_invariants(path: &str, result: &Result<CgroupKind>) {
        let Ok(kind) = result else { return };
        if let Some(u) = kind.pod_uid() {
            assert_eq!(PodUid::parse(u.as_str()).as_ref(), Some(u), "{path:?}");
            assert!(!u.as_str().contains('_'), "{path:?}");
        }
        if let Some(id) = kind.container_id() {
            assert_eq!(
                ContainerId::parse(id.as_str()).as_ref(),
                Some(id),
                "{path:?}"
            );
        }
        if !matches!(kind, NotKubernetes) {
            assert!(path.contains("kubepods"), "{path:?} -> {kind:?}");
        }
        // Deterministic, and spelling-insensitive to slashes.
        assert_eq!(&classify(path), result, "{path:?}");
        assert_eq!(&classify(&format!("/{path}/")), result, "{path:?}");
    }

    #[test]
    fn never_panics_on_garbage() {
        // Whole segments, pieces of segments, separators and hostile chars, glued at random.
        let tokens: Vec<String> = [
            "/",
            ".",
            "..",
            ":",
            "-",
            "_",
            "kubepods",
            "kubepods",
            "kubepods.slice",
            "kubelet-kubepods.slice",
            "kubepods-burstable.slice",
            "kubepods-besteffort.slice",
            "kubepods-burstable-pod{U_}.slice",
            "kubepods-pod{U_}.slice",
            "burstable",
            "besteffort",
            "pod{U}",
            "pod{S}",
            "cri-containerd-{ID}.scope",
            "crio-conmon-{ID}",
            "crio-",
            "docker-",
            "{ID}",
            "{U}",
            ".slice",
            ".scope",
            "-pod",
            "pod",
            "kubepods-",
            "-burstable",
            "0",
            "f",
            "Z",
            "5f8c0f2a",
            "é",
            "💥",
            "\0",
            "\u{202e}",
            " ",
            "\n",
        ]
        .iter()
        .map(|t| expand(t))
        .collect();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            let mut path = String::new();
            for _ in 0..rng.below(8) {
                path.push_str(["/", "/", "/", "/", "//", ""][rng.below(6)]);
                for _ in 0..=rng.below(4) / 3 {
                    if rng.below(10) == 0 {
                        // A raw char, including multi-byte ones.
                        let c = u32::try_from(rng.next() % 0x11_0000).unwrap_or(0);
                        path.push(char::from_u32(c).unwrap_or('\u{fffd}'));
                    } else {
                        path.push_str(&tokens[rng.below(tokens.len())]);
                    }
                }
            }
            let result = classify(&path);
            check_invariants(&path, &result);
        }
    }

    #[test]
    fn never_panics_on_mangled_real_paths() {
        let seeds = [
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice/crio-conmon-{ID}.scope/x",
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{U_}.slice/cri-containerd-{ID}.scope",
            "/system.slice/containerd.service/kubepods-besteffort-pod{U_}.slice:cri-containerd:{ID}/init.scope",
            "/k8s/kubepods/burstable/pod{U}/{ID}/kubepods/pod{U2}",
        ];
        let mut rng = Rng(42);
        for seed in seeds {
            let path = expand(seed);
            // Every prefix and every suffix at every char boundary.
            for (i, _) in path.char_indices() {
                for part in [&path[..i], &path[i..]] {
                    let result = classify(part);
                    check_invariants(part, &result);
                }
            }
            // Random single-char edits.
            for _ in 0..2_000 {
                let mut chars: Vec<char> = path.chars().collect();
                let at = rng.below(chars.len() + 1);
                match rng.below(3) {
                    0 if at < chars.len() => {
                        chars.remove(at);
                    }
                    1 if at < chars.len() => {
                        chars[at] = ['/', '-', '_', ':', 'é', 'G'][rng.below(6)];
                    }
                    _ => chars.insert(at, ['/', '-', '.', ':', '0', '💥'][rng.below(6)]),
                }
                let mangled: String = chars.into_iter().collect();
                let result = classify(&mangled);
                check_invariants(&mangled, &result);
            }
        }
    }
}
