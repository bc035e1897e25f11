//! Fuzz target bodies, shared by `fuzz/fuzz_targets/` (cargo-fuzz) and the regression test
//! that replays the committed corpus (`tests/fuzz_regressions.rs`). Not part of the API.
//!
//! Each body takes arbitrary bytes and panics when an invariant breaks; errors the product
//! returns for bad input are fine. The checks are properties the module documents, not a
//! second implementation of it.

use crate::cgroup_path::{classify, CgroupKind, ContainerId, PodUid, QosClass};

/// A container id to append below pods.
const CHILD_ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// [`classify`] of the input as a path (lossy UTF-8), plus [`PodUid::parse`] and
/// [`ContainerId::from_status`] of the same text.
///
/// Invariants: no panic; empty and `.` segments and leading/trailing slashes do not change
/// the answer; a pod UID found is canonical (a UUID or 32 lower-case hex digits, parsing to
/// itself) and is in the path (`_` for `-`, any case); a container id found is 64 lower-case
/// hex digits and is in the path as it is; the parent path (last segment dropped) classifies
/// as the grammar says (a pod's parent is its kubepods root or QoS level, a container's its
/// pod — unless the segment is a colon segment —, a container child's its container, ...);
/// appending a segment below a pod, container or error gives the documented kind (an error
/// stays the same error).
pub fn cgroup_path(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    check_ids(&text);
    let path: &str = &text;
    let kind = classify(path);
    let segments: Vec<&str> = path
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    let normal = segments.join("/");
    assert_eq!(classify(&normal), kind, "{path:?} vs {normal:?}");
    assert_eq!(
        classify(&format!("/./{}//", segments.join("//./"))),
        kind,
        "{path:?} with empty and . segments"
    );
    let kind = match kind {
        Ok(kind) => kind,
        Err(e) => {
            // The error is about a segment already there: nothing below changes it.
            assert_eq!(classify(&format!("{normal}/x")), Err(e.clone()), "{path:?}");
            assert_eq!(classify(&format!("{normal}/kubepods")), Err(e), "{path:?}");
            return;
        }
    };
    if let Some(uid) = kind.pod_uid() {
        check_uid(uid);
        let folded = normal.replace('_', "-").to_ascii_lowercase();
        assert!(folded.contains(uid.as_str()), "{uid} not in {path:?}");
    }
    if let Some(id) = kind.container_id() {
        check_container_id(id);
        assert!(normal.contains(id.as_str()), "{id} not in {path:?}");
    }
    if let CgroupKind::ConmonMonitor { id, .. } = &kind {
        check_container_id(id);
        assert!(normal.contains(id.as_str()), "{id} not in {path:?}");
    }
    check_parent(&segments, &kind);
    check_children(&normal, &kind);
}

/// The kind of the path without its last segment, as the grammar says it must be.
fn check_parent(segments: &[&str], kind: &CgroupKind) {
    let Some((last, parent_segments)) = segments.split_last() else {
        assert_eq!(kind, &CgroupKind::NotKubernetes, "the empty path");
        return;
    };
    let parent_path = parent_segments.join("/");
    let parent = match classify(&parent_path) {
        Ok(parent) => parent,
        Err(e) => panic!("{last:?} is {kind:?} below {parent_path:?}, an error: {e}"),
    };
    let colon = last.contains(':');
    let ok = match kind {
        CgroupKind::NotKubernetes => parent == CgroupKind::NotKubernetes,
        CgroupKind::KubepodsRoot { qos: None } => matches!(
            parent,
            CgroupKind::NotKubernetes | CgroupKind::KubepodsRoot { qos: None }
        ),
        CgroupKind::KubepodsRoot { qos: Some(_) } => {
            parent == CgroupKind::KubepodsRoot { qos: None }
        }
        CgroupKind::Pod { qos, .. } => {
            let level = (*qos != QosClass::Guaranteed).then_some(*qos);
            parent == CgroupKind::KubepodsRoot { qos: level }
        }
        CgroupKind::Container { pod, qos, .. } | CgroupKind::ConmonMonitor { pod, qos, .. } => {
            colon
                || parent
                    == CgroupKind::Pod {
                        uid: pod.clone(),
                        qos: *qos,
                    }
        }
        CgroupKind::ContainerChild {
            pod,
            qos,
            id,
            runtime,
        } => match &parent {
            CgroupKind::Container {
                pod: p,
                qos: q,
                id: i,
                runtime: r,
            }
            | CgroupKind::ContainerChild {
                pod: p,
                qos: q,
                id: i,
                runtime: r,
            } => (p, q, i, r) == (pod, qos, id, runtime),
            _ => false,
        },
        CgroupKind::PodOther { pod, qos } => {
            colon
                || match &parent {
                    CgroupKind::Pod { uid: p, qos: q }
                    | CgroupKind::PodOther { pod: p, qos: q }
                    | CgroupKind::ConmonMonitor { pod: p, qos: q, .. } => (p, q) == (pod, qos),
                    _ => false,
                }
        }
    };
    assert!(
        ok,
        "{last:?} is {kind:?} below {parent_path:?}, which is {parent:?}"
    );
}

/// What a segment appended below `kind` must give.
fn check_children(path: &str, kind: &CgroupKind) {
    let below = |child: &str| classify(&format!("{path}/{child}"));
    match kind {
        CgroupKind::Pod { uid, qos } => {
            for (child, runtime) in [
                (format!("cri-containerd-{CHILD_ID}.scope"), "containerd"),
                (format!("crio-{CHILD_ID}.scope"), "cri-o"),
                (format!("docker-{CHILD_ID}.scope"), "docker"),
                (CHILD_ID.to_owned(), "unknown"),
            ] {
                match below(&child) {
                    Ok(CgroupKind::Container {
                        pod,
                        qos: q,
                        id,
                        runtime: r,
                    }) => assert!(
                        &pod == uid
                            && q == *qos
                            && id.as_str() == CHILD_ID
                            && r.as_str() == runtime,
                        "{path:?}/{child:?}"
                    ),
                    other => panic!("{path:?}/{child:?} is {other:?}, not a container"),
                }
            }
            assert_eq!(
                below(&format!("crio-conmon-{CHILD_ID}.scope")),
                Ok(CgroupKind::ConmonMonitor {
                    pod: uid.clone(),
                    qos: *qos,
                    id: ContainerId::parse(CHILD_ID).unwrap_or_else(|| panic!("CHILD_ID")),
                })
            );
            assert_eq!(
                below("kata_sandbox"),
                Ok(CgroupKind::PodOther {
                    pod: uid.clone(),
                    qos: *qos
                })
            );
        }
        CgroupKind::Container {
            pod,
            qos,
            id,
            runtime,
        }
        | CgroupKind::ContainerChild {
            pod,
            qos,
            id,
            runtime,
        } => {
            let child = CgroupKind::ContainerChild {
                pod: pod.clone(),
                qos: *qos,
                id: id.clone(),
                runtime: *runtime,
            };
            for segment in ["container", "init.scope", "kubepods", CHILD_ID] {
                assert_eq!(below(segment), Ok(child.clone()), "{path:?}/{segment}");
            }
        }
        CgroupKind::ConmonMonitor { pod, qos, .. } | CgroupKind::PodOther { pod, qos } => {
            let other = CgroupKind::PodOther {
                pod: pod.clone(),
                qos: *qos,
            };
            for segment in ["x", "kubepods", CHILD_ID] {
                assert_eq!(below(segment), Ok(other.clone()), "{path:?}/{segment}");
            }
        }
        CgroupKind::NotKubernetes => {
            assert_eq!(below("x"), Ok(CgroupKind::NotKubernetes), "{path:?}/x");
        }
        CgroupKind::KubepodsRoot { .. } => {}
    }
}

/// The id parsers on the raw text.
fn check_ids(text: &str) {
    if let Some(uid) = PodUid::parse(text) {
        check_uid(&uid);
    }
    if let Some(id) = ContainerId::from_status(text) {
        check_container_id(&id);
        assert!(text.ends_with(id.as_str()), "{id} from {text:?}");
    }
    if let Some(id) = ContainerId::parse(text) {
        assert_eq!(id.as_str(), text);
    }
}

fn check_uid(uid: &PodUid) {
    let s = uid.as_str();
    let hex = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
    let well_formed = match s.len() {
        32 => s.bytes().all(hex),
        36 => s.bytes().enumerate().all(|(i, c)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                c == b'-'
            } else {
                hex(c)
            }
        }),
        _ => false,
    };
    assert!(well_formed, "pod UID {s:?}");
    assert_eq!(
        PodUid::parse(s).as_ref(),
        Some(uid),
        "{s:?} does not parse to itself"
    );
    assert_eq!(uid.to_string(), s);
}

fn check_container_id(id: &ContainerId) {
    let s = id.as_str();
    assert!(
        s.len() == 64
            && s.bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)),
        "container id {s:?}"
    );
    assert_eq!(ContainerId::parse(s).as_ref(), Some(id));
    for runtime in ["containerd", "cri-o", "docker"] {
        assert_eq!(
            ContainerId::from_status(&format!("{runtime}://{s}")).as_ref(),
            Some(id)
        );
    }
}
