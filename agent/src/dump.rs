//! `kpulse-agent dump`: one JSON object per cgroup per tick, plus one for the node.

use std::{
    io::Write,
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::{

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
        kubernetes: None,
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
    loop {
        let snap = collector.collect()?;
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
