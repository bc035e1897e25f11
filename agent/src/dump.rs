//! `kpulse-agent dump`: one JSON object per cgroup per tick, plus one for the node.

use std::{
    io::Write,
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::{
    cgroup_path::{self, CgroupKind},
    collect::Collector,
    sample::{CgroupSample, Snapshot},
};

/// One output line for a cgroup.
#[derive(Debug, Serialize)]
pub struct CgroupLine<'a> {
    /// Always `"cgroup"`.
    pub kind: &'static str,
    /// The collector.
    pub collector: String,
    /// Sample time, ns since the Unix epoch.
    pub timestamp_ns: u64,
    /// Path relative to the cgroup mount.
    pub path: &'a str,
    /// cgroup id (inode number).
    pub id: u64,
    /// Cumulative CPU time, ns.
    pub cpu_ns: Option<u64>,
    /// Memory usage, bytes.
    pub memory_usage_bytes: Option<u64>,
    /// Working set (usage - inactive_file, floored at 0), bytes.
    pub memory_working_set_bytes: Option<u64>,
    /// Anonymous memory, bytes.
    pub memory_rss_bytes: Option<u64>,
    /// Swap, bytes: on nodes with swap only (as the agent sends it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_swap_bytes: Option<u64>,
    /// PSI `some` totals, ns (`--custom-metrics`; cgroup v2 with PSI on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pressure_cpu_some_ns: Option<u64>,
    /// See `pressure_cpu_some_ns`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pressure_memory_some_ns: Option<u64>,
    /// The PSI totals as of the kernel's last averaging, and its instant (kernel clock, ns):
    /// eBPF only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pressure_averaged: Option<crate::sample::PsiAveraged>,
    /// CFS periods with runnable tasks (`--custom-metrics`; cgroups with a CPU quota).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cfs_periods: Option<u64>,
    /// Of those, periods throttled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cfs_throttled_periods: Option<u64>,
    /// Kubernetes attribution from the path, when it is a kubepods cgroup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<serde_json::Value>,
}

/// The node line.
#[derive(Debug, Serialize)]
pub struct NodeLine {
    /// Always `"node"`.
    pub kind: &'static str,
    /// The collector.
    pub collector: String,
    /// Sample time, ns since the Unix epoch.
    pub timestamp_ns: u64,
    /// Cumulative CPU time of the node, ns.
    pub cpu_ns: u64,
    /// Node working set, bytes.
    pub memory_working_set_bytes: u64,
    /// Swap in use, bytes: on nodes with swap only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_swap_bytes: Option<u64>,
}

/// Builds a cgroup's line.
pub fn cgroup_line<'a>(snap: &Snapshot, c: &'a CgroupSample) -> CgroupLine<'a> {
    CgroupLine {
        kind: "cgroup",
        collector: snap.source.to_string(),
        timestamp_ns: snap.timestamp.0,
        path: &c.path,
        id: c.id.0,
        cpu_ns: c.cpu.map(|v| v.0),
        memory_usage_bytes: c.memory.map(|m| m.usage.0),
        memory_working_set_bytes: c.memory.map(|m| m.working_set.0),
        memory_rss_bytes: c.memory.map(|m| m.rss.0),
        memory_swap_bytes: snap
            .node
            .swap
            .and(c.memory.and_then(|m| m.swap))
            .map(|b| b.0),
        pressure_cpu_some_ns: c.pressure.map(|p| p.cpu_some_ns),
        pressure_memory_some_ns: c.pressure.map(|p| p.memory_some_ns),
        pressure_averaged: c.pressure.and_then(|p| p.averaged),
        cfs_periods: c.throttling.map(|t| t.periods),
        cfs_throttled_periods: c.throttling.map(|t| t.throttled),
        kubernetes: attribution_json(&c.path),
    }
}

/// Writes one snapshot as JSON lines.
pub fn write_snapshot(out: &mut impl Write, snap: &Snapshot) -> std::io::Result<()> {
    for c in &snap.cgroups {
        serde_json::to_writer(&mut *out, &cgroup_line(snap, c))?;
        out.write_all(b"\n")?;
    }
    let node = NodeLine {
        kind: "node",
        collector: snap.source.to_string(),
        timestamp_ns: snap.timestamp.0,
        cpu_ns: snap.node.cpu.0,
        memory_working_set_bytes: snap.node.memory_working_set.0,
        memory_swap_bytes: snap.node.swap.map(|b| b.0),
    };
    serde_json::to_writer(&mut *out, &node)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// Collects `count` times (0 = forever) every `resolution`, writing each snapshot.
/// Ticks follow a fixed schedule; a cycle that overruns skips the missed ticks.
pub fn run(
    collector: &mut dyn Collector,
    count: u64,
    resolution: Duration,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut tick: u64 = 0;
    let mut last_dropped = 0;
    loop {
        let snap = collector.collect()?;
        snap.log_dropped_change(&mut last_dropped);
        write_snapshot(out, &snap)?;
        tick += 1;
        if count != 0 && tick >= count {
            return Ok(());
        }
        let now = start.elapsed();
        let res = resolution.as_nanos().max(1);
        let next = (now.as_nanos() / res + 1) * res;
        let next = Duration::from_nanos(u64::try_from(next).unwrap_or(u64::MAX));
        std::thread::sleep(next.saturating_sub(now));
    }
}

/// Kubernetes attribution of a cgroup path, for `dump`: `None` outside kubepods, an
/// `error` member for kubepods paths that do not parse.
pub fn attribution_json(path: &str) -> Option<serde_json::Value> {
    use serde_json::json;
    let kind = match cgroup_path::classify(path) {
        Ok(k) => k,
        Err(e) => return Some(json!({ "error": e.to_string() })),
    };
    let v = match &kind {
        CgroupKind::NotKubernetes => return None,
        CgroupKind::KubepodsRoot { qos } => {
            json!({ "kind": "kubepods", "qos_class": qos.map(|q| q.as_str()) })
        }
        CgroupKind::Pod { uid, qos } => {
            json!({ "kind": "pod", "pod_uid": uid.as_str(), "qos_class": qos.as_str() })
        }
        CgroupKind::Container {
            pod,
            qos,
            id,
            runtime,
        } => json!({
            "kind": "container", "pod_uid": pod.as_str(), "qos_class": qos.as_str(),
            "container_id": id.as_str(), "runtime": runtime.as_str(),
        }),
        CgroupKind::ContainerChild {
            pod,
            qos,
            id,
            runtime,
        } => json!({
            "kind": "container_child", "pod_uid": pod.as_str(), "qos_class": qos.as_str(),
            "container_id": id.as_str(), "runtime": runtime.as_str(),
        }),
        CgroupKind::ConmonMonitor { pod, qos, id } => json!({
            "kind": "conmon", "pod_uid": pod.as_str(), "qos_class": qos.as_str(),
            "container_id": id.as_str(),
        }),
        CgroupKind::PodOther { pod, qos } => {
            json!({ "kind": "pod_other", "pod_uid": pod.as_str(), "qos_class": qos.as_str() })
        }
    };
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::{Bytes, CgroupId, CpuNanos, Memory, NodeSample, Source, UnixNanos};

    #[test]
    fn lines_carry_the_required_fields() {
        let uid = "5f8c0f2a-1b2c-4d3e-9f00-0123456789ab";
        let id = "a".repeat(64);
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id}.scope",
            uid.replace('-', "_")
        );
        let snap = Snapshot {
            timestamp: UnixNanos(42),
            source: Source::Ebpf,
            cgroups: vec![CgroupSample {
                path: path.as_str().into(),
                id: CgroupId(7),
                cpu: Some(CpuNanos(1000)),
                memory: Some(
                    Memory::from_raw(Bytes(300), Bytes(100), Bytes(50)).with_swap(Some(Bytes(8))),
                ),
                pressure: None,
                throttling: None,
            }],
            node: NodeSample {
                cpu: CpuNanos(5),
                memory_working_set: Bytes(6),
                swap: None,
            },
            dropped: 0,
        };
        let mut out = Vec::new();
        write_snapshot(&mut out, &snap).expect("write");
        let text = String::from_utf8(out).expect("utf8");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(lines.len(), 2);
        let c = &lines[0];
        assert_eq!(c["path"], path.as_str());
        assert_eq!(c["id"], 7);
        assert_eq!(c["cpu_ns"], 1000);
        assert_eq!(c["memory_usage_bytes"], 300);
        assert_eq!(c["memory_working_set_bytes"], 200);
        assert_eq!(c["memory_rss_bytes"], 50);
        assert_eq!(c["timestamp_ns"], 42);
        assert_eq!(c["collector"], "ebpf");
        assert_eq!(c["kubernetes"]["pod_uid"], uid);
        assert_eq!(c["kubernetes"]["container_id"], id.as_str());
        assert_eq!(c["kubernetes"]["qos_class"], "Burstable");
        assert_eq!(lines[1]["kind"], "node");
        assert_eq!(lines[1]["cpu_ns"], 5);
        // No swap on the node: no swap figures, whatever the collector read.
        assert!(c.get("memory_swap_bytes").is_none(), "{c}");
        assert!(lines[1].get("memory_swap_bytes").is_none());
        let mut with_swap = snap;
        with_swap.node.swap = Some(Bytes(4096));
        let mut out = Vec::new();
        write_snapshot(&mut out, &with_swap).expect("write");
        let text = String::from_utf8(out).expect("utf8");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(lines[0]["memory_swap_bytes"], 8);
        assert_eq!(lines[1]["memory_swap_bytes"], 4096);
        // Signals only where collected (`--custom-metrics`).
        assert!(c.get("pressure_cpu_some_ns").is_none() && c.get("cfs_periods").is_none());
        let mut with_signals = with_swap;
        with_signals.cgroups[0].pressure = Some(crate::sample::Pressure {
            averaged: None,
            cpu_some_ns: 11,
            memory_some_ns: 12,
        });
        with_signals.cgroups[0].throttling = Some(crate::sample::Throttling {
            periods: 13,
            throttled: 14,
        });
        let line = serde_json::to_value(cgroup_line(&with_signals, &with_signals.cgroups[0]))
            .expect("json");
        assert_eq!(line["pressure_cpu_some_ns"], 11);
        assert_eq!(line["pressure_memory_some_ns"], 12);
        assert_eq!(line["cfs_periods"], 13);
        assert_eq!(line["cfs_throttled_periods"], 14);
    }

    #[test]
    fn malformed_kubepods_paths_report_an_error() {
        let v = attribution_json("/kubepods/burstable/podnot-a-uid").expect("kubepods path");
        assert!(v["error"].is_string(), "{v}");
        assert!(attribution_json("/system.slice/sshd.service").is_none());
    }
}
