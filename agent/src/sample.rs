//! What one collection cycle produces: per-cgroup and node samples with units in types.

use serde::Serialize;

/// The units are the wire's: what is collected is what is sent, with no conversion.
pub use kpulse_wire::{Bytes, CgroupId, CpuNanos, UnixNanos};

/// Which collector produced a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The `iter/cgroup` eBPF program.
    Ebpf,
    /// Reading cgroupfs files.
    Cgroupfs,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Ebpf => "ebpf",
            Source::Cgroupfs => "cgroupfs",
        })
    }
}

/// Memory figures of one cgroup, defined as kubelet/cAdvisor define them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Memory {
    /// `memory.current` (v2) / `memory.usage_in_bytes` (v1).
    pub usage: Bytes,
    /// `usage - inactive_file`, floored at 0.
    pub working_set: Bytes,
    /// Anonymous memory: `anon` (v2) / `total_rss` (v1) of `memory.stat`.
    pub rss: Bytes,
    /// `inactive_file` (v2) / `total_inactive_file` (v1) of `memory.stat`.
    pub inactive_file: Bytes,
    /// Swap used by the cgroup's subtree, as kubelet reads it: `memory.swap.current` (v2) /
    /// `total_swap` of `memory.stat` (v1). `None` when it was not read: swap accounting is
    /// off, or the collector skips swap because the node has none.
    pub swap: Option<Bytes>,
}

impl Memory {
    /// Builds the figures from the kernel's raw counters, without swap.
    pub fn from_raw(usage: Bytes, inactive_file: Bytes, rss: Bytes) -> Memory {
        Memory {
            usage,
            working_set: Bytes(usage.0.saturating_sub(inactive_file.0)),
            rss,
            inactive_file,
            swap: None,
        }
    }

    /// The same figures with the cgroup's swap.
    pub fn with_swap(self, swap: Option<Bytes>) -> Memory {
        Memory { swap, ..self }
    }
}

/// Pressure stall totals of one cgroup (PSI `some`, cgroup v2): cumulative time in which at
/// least one of its tasks waited for the resource. The kernel brings these totals up to
/// date in its averaging work (every 2 s while the cgroup is active) and when the pressure
/// files are read, so a total read by the eBPF walk lags by up to about 2 s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Pressure {
    /// `cpu.pressure` `some total=`, nanoseconds.
    pub cpu_some_ns: u64,
    /// `memory.pressure` `some total=`, nanoseconds.
    pub memory_some_ns: u64,
    /// The same totals as of the kernel's last averaging, with its instant (eBPF only:
    /// what the windows are taken between, see `window`). `None` from the files, whose
    /// reads bring the totals up to date themselves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub averaged: Option<PsiAveraged>,
}

/// PSI totals as the kernel's averaging last wrote them (`psi_group.avg_total`,
/// `avg_last_update`): a consistent reading at a known instant, which later reads of the
/// pressure files do not move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PsiAveraged {
    /// When (`sched_clock`, ns: the kernel's own clock, only differences mean anything).
    pub at_ns: u64,
    /// CPU `some` total then, ns.
    pub cpu_some_ns: u64,
    /// Memory `some` total then, ns.
    pub memory_some_ns: u64,
}

/// CFS bandwidth counters of one cgroup with a CPU quota (`cpu.stat`): the cgroup's own, not
/// its subtree's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Throttling {
    /// `nr_periods`: enforcement periods in which the cgroup had runnable tasks.
    pub periods: u64,
    /// `nr_throttled`: of those, periods in which it ran out of quota.
    pub throttled: u64,
}

/// One cgroup at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupSample {
    /// Path relative to the hierarchy's mount point, starting with `/` (`/` is the root).
    /// Shared: collectors keep paths across ticks.
    pub path: std::sync::Arc<str>,
    /// The cgroup's id in the hierarchy that carried its CPU time (memory's on hybrid
    /// nodes when the cgroup exists only there).
    pub id: CgroupId,
    /// Cumulative CPU time; `None` when the cgroup has no CPU accounting in this layout.
    pub cpu: Option<CpuNanos>,
    /// Memory; `None` when no memory controller covers the cgroup.
    pub memory: Option<Memory>,
    /// Pressure stall totals; `None` unless asked for ([`crate::collect::Signals`]), and
    /// where the kernel keeps none for the cgroup (PSI off, `cgroup.pressure` 0).
    pub pressure: Option<Pressure>,
    /// CFS bandwidth counters; `None` unless asked for, and for a cgroup without a quota.
    pub throttling: Option<Throttling>,
}

/// Node totals, as kubelet reports them for the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct NodeSample {
    /// Cumulative CPU time of the whole node as the kubelet reads it: the root cgroup's
    /// usage (v2 `cpu.stat` `usage_usec`, v1 `cpuacct.usage`).
    pub cpu: CpuNanos,
    /// Working set of the whole node as the kubelet computes it (see `kpulse_wire::NodeSample`).
    pub memory_working_set: Bytes,
    /// Swap in use on the node, `SwapTotal - SwapFree` of `/proc/meminfo`; `None` when the
    /// node has no swap (`SwapTotal` 0). The node "has swap" exactly when this is `Some`:
    /// only then are containers' swap figures sent (see `attribute`).
    pub swap: Option<Bytes>,
}

/// Everything one collection cycle produced.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// When the cycle read the counters.
    pub timestamp: UnixNanos,
    /// The collector.
    pub source: Source,
    /// Every cgroup under the configured root, parents before children.
    pub cgroups: Vec<CgroupSample>,
    /// Node totals.
    pub node: NodeSample,
    /// Cgroups seen this cycle but not reported, because of `--max-cgroups` or because
    /// a kernel read failed (exact for eBPF; a lower bound for cgroupfs, which stops
    /// descending at the bound).
    pub dropped: u64,
}

impl Snapshot {
    /// Logs a change in how many cgroups were left out since the last tick (`last`, updated):
    /// changes, not ticks, so a node over `--max-cgroups` warns once, not every second.
    pub fn log_dropped_change(&self, last: &mut u64) {
        if self.dropped == *last {
            return;
        }
        if self.dropped > 0 {
            tracing::warn!(
                dropped = self.dropped,
                "cgroups left out of this tick (--max-cgroups, or unreadable)"
            );
        } else {
            tracing::info!("all cgroups reported again");
        }
        *last = self.dropped;
    }
}

/// Now on the agent's timeline ([`crate::clock`]): wall-clock nanoseconds that advance
/// with `CLOCK_BOOTTIME`, so that a step of the wall clock never changes a window.
pub fn now() -> UnixNanos {
    UnixNanos(crate::clock::now().0)
}
