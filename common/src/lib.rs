//! Kernel ↔ user ABI of kpulse's eBPF programs.
//!
//! Plain `#[repr(C)]` records with fixed-width fields and no padding, shared by
//! the programs in `ebpf/` (built for `bpfel-unknown-none`, `no_std`) and the
//! agent (feature `user`, which adds `aya::Pod`). This crate has no logic and no
//! knowledge of Kubernetes: it only fixes byte layouts and names.
#![no_std]

/// Version of [`CgroupRecord`]'s layout. The agent refuses records of another version.
pub const RECORD_VERSION: u32 = 6;

/// Name of the `BPF_F_MMAPABLE` array the iterator fills: record `i` of a walk is the
/// `i`-th cgroup visited, in the walk's region (see [`WalkEnd::region`]). Its size is set
/// by the loader: `--max-cgroups` records per region.
pub const RECORDS_MAP: &str = "CGROUP_RECORDS";

/// Bytes of a cgroup's directory name carried in a record (NUL-terminated).
/// Longer names are flagged with [`FLAG_NAME_TRUNCATED`] and resolved by user space.
pub const NAME_LEN: usize = 128;

/// The record's cgroup has a memory controller state (v2 with memory enabled, or a
/// v1 memory hierarchy); the memory fields are valid.
pub const FLAG_MEMCG: u32 = 1 << 0;
/// The cgroup's name did not fit in [`NAME_LEN`] bytes.
pub const FLAG_NAME_TRUNCATED: u32 = 1 << 1;
/// A kernel read failed for one of the fields; user space drops the record and counts it.
pub const FLAG_READ_ERROR: u32 = 1 << 2;
/// The name was not copied again: the record's slot already held this cgroup with this
/// [`CgroupRecord::name_key`] (and so its name) from the previous walk.
pub const FLAG_NAME_KEPT: u32 = 1 << 3;
/// The cgroup's pressure stall totals were read (the walk was asked for them, the kernel
/// keeps PSI for this cgroup and it is enabled): `psi_*` are valid.
pub const FLAG_PSI: u32 = 1 << 4;
/// The cgroup's CFS bandwidth counters were read (the walk was asked for them and the cpu
/// controller is on for it): `cfs_*` are valid.
pub const FLAG_CFS: u32 = 1 << 5;
/// With [`FLAG_CFS`]: the cgroup has a CPU quota (`cpu.max` not `max`).
pub const FLAG_CFS_QUOTA: u32 = 1 << 6;

/// Bits of the `READ_SIGNALS` global: what the walk reads besides CPU and memory.
pub const READ_PSI: u64 = 1 << 0;
/// See [`READ_PSI`].
pub const READ_CFS: u64 = 1 << 1;

/// One cgroup as seen by the `iter/cgroup` program `cgroup_stats`, stored at index
/// *i* of [`RECORDS_MAP`] for the *i*-th live cgroup visited, in pre-order (a parent always precedes its children).
///
/// The kernel's cgroup iterator cannot resume a walk across `read()` calls and its
/// `seq_file` holds 8 pages, so records go to a map, not to the iterator's output; the
/// output is one [`WalkEnd`] per walk.
///
/// All counters are the kernel's own, copied without arithmetic:
/// - `cpu_usage_ns`: `cgroup->bstat.cputime.sum_exec_runtime`, the hierarchical CPU time
///   that `cpu.stat`'s `usage_usec` prints (as of the last rstat flush);
/// - `memory_usage_pages`: `mem_cgroup->memory.usage` (page counter, pages);
/// - `inactive_file_pages`, `anon_pages`: hierarchical memcg statistics
///   (`memory.stat` `inactive_file`, and `anon`/`rss`), pages;
/// - `swap_counter_pages`: the memcg's second page counter, pages: `swap.usage` on v2
///   (what `memory.swap.current` prints), `memsw.usage` (memory + swap) on v1, where the
///   two share one place in `struct mem_cgroup`;
/// - `psi_cpu_some_ns`, `psi_memory_some_ns`: `cgroup->psi->total[PSI_AVGS][…]`, the
///   totals `cpu.pressure` and `memory.pressure` print as `some … total=` (µs there), as of
///   the kernel's last update of them (its 2 s averaging work, or a read of the files);
/// - `psi_avg_cpu_some_ns`, `psi_avg_memory_some_ns`, `psi_avg_at_ns`:
///   `cgroup->psi->avg_total[…]` and `avg_last_update`, which the kernel's averaging writes
///   together: the same totals as of that instant (kernel `sched_clock`, ns), unaffected by
///   reads of the files in between; the windows of `custom.metrics.k8s.io` are taken
///   between such instants;
/// - `cfs_periods`, `cfs_throttled`: the cgroup's own (not hierarchical) CFS bandwidth
///   counters, `nr_periods` and `nr_throttled` of `cpu.stat`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CgroupRecord {
    /// Layout version, [`RECORD_VERSION`].
    pub version: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// The iterator session that wrote this record (`bpf_iter_meta.session_id`).
    pub session: u64,
    /// cgroup id: the kernfs node id, equal to the directory's inode number.
    pub id: u64,
    /// Parent cgroup's id; 0 for a hierarchy root.
    pub parent_id: u64,
    /// Depth in the hierarchy (root = 0).
    pub level: u64,
    /// Hierarchical CPU time, nanoseconds (v2 base stat; 0 on v1 hierarchies, and not read
    /// in region 1, the v1 memory hierarchy of a hybrid node: see [`WalkEnd::region`]).
    pub cpu_usage_ns: u64,
    /// Memory page counter, pages.
    pub memory_usage_pages: u64,
    /// Hierarchical inactive file LRU size, pages.
    pub inactive_file_pages: i64,
    /// Hierarchical anonymous mapped memory, pages.
    pub anon_pages: i64,
    /// The memcg's `swap` (v2) / `memsw` (v1) page counter, pages.
    pub swap_counter_pages: u64,
    /// PSI `some` total of CPU, nanoseconds ([`FLAG_PSI`]).
    pub psi_cpu_some_ns: u64,
    /// PSI `some` total of memory, nanoseconds ([`FLAG_PSI`]).
    pub psi_memory_some_ns: u64,
    /// CFS periods that had runnable tasks ([`FLAG_CFS`]).
    pub cfs_periods: u64,
    /// Of those, periods in which the cgroup was throttled ([`FLAG_CFS`]).
    pub cfs_throttled: u64,
    /// PSI `some` total of CPU as of [`CgroupRecord::psi_avg_at_ns`] ([`FLAG_PSI`]).
    pub psi_avg_cpu_some_ns: u64,
    /// PSI `some` total of memory as of [`CgroupRecord::psi_avg_at_ns`] ([`FLAG_PSI`]).
    pub psi_avg_memory_some_ns: u64,
    /// When the kernel's averaging last ran for the cgroup (`sched_clock`, ns).
    pub psi_avg_at_ns: u64,
    /// Identifies the cgroup's current name: the address of its kernfs node's name string.
    /// Kernfs names are immutable strings; renaming (possible on v1 hierarchies only)
    /// allocates a new one, so a cgroup with the same id and key has the same name. Walks
    /// copy a name only when its slot held another id or key; user space compares keys,
    /// not bytes. Opaque: only equality means anything.
    pub name_key: u64,
    /// Directory name, NUL-terminated.
    pub name: [u8; NAME_LEN],
}

/// The only output of a walk, written when the iterator ends: how many cgroups it
/// visited (records `0..count` of [`RECORDS_MAP`], as far as the map holds them).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WalkEnd {
    /// Layout version, [`RECORD_VERSION`].
    pub version: u32,
    /// The region of [`RECORDS_MAP`] this walk wrote: its records are
    /// `region × RECORDS_PER_REGION + i`. Walks of the hierarchy the loader names in
    /// `SECOND_REGION_HIERARCHY` (the v1 memory hierarchy of a hybrid node) use region 1,
    /// those of `THIRD_REGION_HIERARCHY` (its v1 `cpu` hierarchy, walked for CFS counters)
    /// region 2, all others region 0, so that each slot is rewritten by walks of one
    /// hierarchy and
    /// usually holds the same cgroup as in the previous walk ([`FLAG_NAME_KEPT`]).
    pub region: u32,
    /// The session, equal to every record's `session`.
    pub session: u64,
    /// Cgroups visited.
    pub count: u64,
}

#[cfg(feature = "user")]
// SAFETY: plain old data: integers and a byte array, no padding, any bit pattern valid.
#[allow(unsafe_code)]
unsafe impl aya::Pod for CgroupRecord {}

#[cfg(feature = "user")]
// SAFETY: plain old data: integers, no padding.
#[allow(unsafe_code)]
unsafe impl aya::Pod for WalkEnd {}

/// Name of the map of cgroup creation instants (`cgroup_mkdir`).
pub const BIRTHS_MAP: &str = "CGROUP_BIRTHS";

/// Entries of [`BIRTHS_MAP`]: cgroups made since the agent started, the oldest given up
/// first. The agent reads an entry about a tick after the cgroup is made, so this only has
/// to outlast the cgroups a node can create in a few seconds.
pub const BIRTHS_MAX: u32 = 8_192;

/// Maximum number of cgroups tracked by the scheduler-path program's map.
pub const SCHED_MAX_CGROUPS: u32 = 16_384;

/// Names of the globals the loader writes before load (`EbpfLoader::set_global`).
/// Each is a byte offset into a kernel struct, computed from the running kernel's BTF.
pub mod globals {
    /// `offsetof(struct cgroup, kn)`.
    pub const CGROUP_KN: &str = "OFF_CGROUP_KN";
    /// `offsetof(struct kernfs_node, id)`.
    pub const KN_ID: &str = "OFF_KN_ID";
    /// `offsetof(struct kernfs_node, name)`.
    pub const KN_NAME: &str = "OFF_KN_NAME";
    /// `offsetof(struct cgroup, self.parent)`.
    pub const CSS_PARENT: &str = "OFF_CSS_PARENT";
    /// `offsetof(struct cgroup_subsys_state, cgroup)`.
    pub const CSS_CGROUP: &str = "OFF_CSS_CGROUP";
    /// `offsetof(struct cgroup, level)`.
    pub const CGROUP_LEVEL: &str = "OFF_CGROUP_LEVEL";
    /// `offsetof(struct cgroup, bstat.cputime.sum_exec_runtime)`.
    pub const CGROUP_CPU: &str = "OFF_CGROUP_CPU";
    /// `offsetof(struct cgroup, subsys[memory_cgrp_id])`.
    pub const CGROUP_MEMCG: &str = "OFF_CGROUP_MEMCG";
    /// `offsetof(struct mem_cgroup, memory.usage)`.
    pub const MEMCG_USAGE: &str = "OFF_MEMCG_USAGE";
    /// `struct mem_cgroup` → `swap.usage` (the same place as `memsw.usage`).
    pub const MEMCG_SWAP: &str = "OFF_MEMCG_SWAP";
    /// `offsetof(struct mem_cgroup, vmstats)`.
    pub const MEMCG_VMSTATS: &str = "OFF_MEMCG_VMSTATS";
    /// 1 when `mem_cgroup.vmstats` is a pointer (6.x late), 0 when embedded.
    pub const VMSTATS_IS_PTR: &str = "VMSTATS_IS_PTR";
    /// Byte offset of `state[inactive_file]` inside `struct memcg_vmstats`.
    pub const VMSTATS_INACTIVE_FILE: &str = "OFF_VMSTATS_INACTIVE_FILE";
    /// Byte offset of `state[anon]` inside `struct memcg_vmstats`.
    pub const VMSTATS_ANON: &str = "OFF_VMSTATS_ANON";
    /// `offsetof(struct cgroup, root)`.
    pub const CGROUP_ROOT: &str = "OFF_CGROUP_ROOT";
    /// `offsetof(struct cgroup_root, hierarchy_id)`.
    pub const ROOT_HIERARCHY_ID: &str = "OFF_ROOT_HIERARCHY_ID";
    /// Records per region of the records map (`--max-cgroups`); not an offset.
    pub const RECORDS_PER_REGION: &str = "RECORDS_PER_REGION";
    /// The hierarchy id whose walks write region 1 (`u64::MAX`: none); not an offset.
    pub const SECOND_REGION_HIERARCHY: &str = "SECOND_REGION_HIERARCHY";
    /// The hierarchy id whose walks write region 2 (`u64::MAX`: none); not an offset.
    pub const THIRD_REGION_HIERARCHY: &str = "THIRD_REGION_HIERARCHY";
    /// What the walk reads besides CPU and memory: [`crate::READ_PSI`], [`crate::READ_CFS`];
    /// not an offset.
    pub const READ_SIGNALS: &str = "READ_SIGNALS";
    /// `offsetof(struct cgroup, psi)`.
    pub const CGROUP_PSI: &str = "OFF_CGROUP_PSI";
    /// `struct psi_group` → `total[PSI_AVGS][PSI_CPU_SOME]`.
    pub const PSI_CPU_SOME: &str = "OFF_PSI_CPU_SOME";
    /// `struct psi_group` → `total[PSI_AVGS][PSI_MEM_SOME]`.
    pub const PSI_MEMORY_SOME: &str = "OFF_PSI_MEMORY_SOME";
    /// `struct psi_group` → `enabled` (`u64::MAX`: the kernel has no such switch).
    pub const PSI_ENABLED: &str = "OFF_PSI_ENABLED";
    /// `struct psi_group` → `avg_total[PSI_CPU_SOME]`.
    pub const PSI_AVG_CPU_SOME: &str = "OFF_PSI_AVG_CPU_SOME";
    /// `struct psi_group` → `avg_total[PSI_MEM_SOME]`.
    pub const PSI_AVG_MEMORY_SOME: &str = "OFF_PSI_AVG_MEMORY_SOME";
    /// `struct psi_group` → `avg_last_update`.
    pub const PSI_AVG_LAST_UPDATE: &str = "OFF_PSI_AVG_LAST_UPDATE";
    /// `offsetof(struct cgroup, subsys[cpu_cgrp_id])`.
    pub const CGROUP_CPU_CSS: &str = "OFF_CGROUP_CPU_CSS";
    /// `struct task_group` → `cfs_bandwidth.quota`.
    pub const TG_QUOTA: &str = "OFF_TG_QUOTA";
    /// `struct task_group` → `cfs_bandwidth.nr_periods`, followed by `nr_throttled`.
    pub const TG_NR_PERIODS: &str = "OFF_TG_NR_PERIODS";
}
