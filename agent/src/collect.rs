//! One collection cycle: kernel counters → [`Snapshot`]. Two collectors behind one
//! trait: [`EbpfCollector`] (the `iter/cgroup` program) and [`CgroupfsCollector`]
//! (reading files), chosen by [`select`].

use std::{os::unix::fs::MetadataExt, path::Path, sync::Arc};

// Keys are kernel-assigned cgroup ids and paths, looked up hundreds of times a tick: a fast
// hash (randomly seeded), not the default SipHash.
use foldhash::{HashMap, HashMapExt as _};

use kpulse_common::{
    CgroupRecord, FLAG_CFS, FLAG_CFS_QUOTA, FLAG_MEMCG, FLAG_NAME_KEPT, FLAG_NAME_TRUNCATED,
    FLAG_PSI, FLAG_READ_ERROR,
};

use crate::{
    cgroupfs::{self, FsError, KeptFile},
    layout::Layout,
    probe::{CgroupIter, ExtraRegions, IterLink, ProbeError},
    sample::{
        self, Bytes, CgroupId, CgroupSample, CpuNanos, Memory, NodeSample, Pressure, PsiAveraged,
        Snapshot, Source, Throttling,
    },
};

/// Errors of one cycle.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// eBPF side.
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// File side.
    #[error(transparent)]
    Fs(#[from] FsError),
}

/// What to collect.
#[derive(Clone, Debug)]
pub struct Scope {
    /// The node's cgroup layout.
    pub layout: Layout,
    /// Subtree to report, relative to each hierarchy's mount (`/` = everything).
    pub root: String,
    /// Upper bound on cgroups per cycle; more are dropped and counted.
    pub max_cgroups: usize,
    /// What to read besides CPU and memory.
    pub signals: Signals,
}

pub use crate::probe::Signals;

impl Scope {
    /// Checks that the subtree exists in every hierarchy the layout reads from: a missing
    /// root is a configuration error, not a reason to change collectors.
    pub fn validate(&self) -> Result<(), FsError> {
        let mut mounts = vec![self.layout.cpu_mount()];
        if self.layout.memory_mount() != self.layout.cpu_mount() {
            mounts.push(self.layout.memory_mount());
        }
        for m in mounts {
            let dir = cgroupfs::join_rel(m, &self.root);
            if !dir.is_dir() {
                return Err(FsError::Parse {
                    path: dir,
                    reason: format!(
                        "--cgroup-root {} does not exist in the hierarchy mounted at {}",
                        self.root,
                        m.display()
                    ),
                });
            }
        }
        Ok(())
    }
}

/// A source of snapshots.
pub trait Collector: Send {
    /// Which collector this is (for [`AutoCollector`], the one in use now).
    fn source(&self) -> Source;
    /// Reads every cgroup under the scope's root, and the node totals.
    fn collect(&mut self) -> Result<Snapshot, CollectError>;
    /// When the cgroup `id` (as in the snapshots) was made, in nanoseconds of the boot
    /// clock: the instant its counters were zero. `None` where this collector cannot know
    /// (cgroupfs keeps no creation time; eBPF only for cgroups made while it runs).
    fn birth(&self, _id: u64) -> Option<u64> {
        None
    }
    /// What the collector did and holds, for the agent's self-metrics: counters since it
    /// was made, sizes as of the last tick.
    fn stats(&self) -> CollectorStats {
        CollectorStats::default()
    }
}

/// A collector's counters (cumulative) and sizes (last tick).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CollectorStats {
    /// Iterator links made again because another process had replaced their program.
    pub relinks_program_replaced: u64,
    /// Iterator links made again because their cgroup had been removed.
    pub relinks_cgroup_removed: u64,
    /// Walks done again because another walk of our link overwrote their records.
    pub foreign_walks: u64,
    /// Switches from eBPF to cgroupfs while running (`auto` only; at most one).
    pub fallbacks: u64,
    /// Records the last tick's walks returned (eBPF; every hierarchy walked).
    pub walk_records: u64,
    /// Entries of the cgroup id → path caches (eBPF).
    pub path_cache_entries: u64,
    /// Of the last tick's records, those whose name the walk copied rather than kept
    /// (`FLAG_NAME_KEPT`): cgroups new to their slot. 0 in a tree that did not change.
    pub walk_names_copied: u64,
}

impl CollectorStats {
    /// Ticks that met another process's interference show as a change of these.
    fn interference(&self) -> u64 {
        self.relinks_program_replaced + self.foreign_walks
    }

    fn add(self, o: CollectorStats) -> CollectorStats {
        CollectorStats {
            relinks_program_replaced: self.relinks_program_replaced + o.relinks_program_replaced,
            relinks_cgroup_removed: self.relinks_cgroup_removed + o.relinks_cgroup_removed,
            foreign_walks: self.foreign_walks + o.foreign_walks,
            fallbacks: self.fallbacks + o.fallbacks,
            walk_records: o.walk_records,
            path_cache_entries: o.path_cache_entries,
            walk_names_copied: o.walk_names_copied,
        }
    }
}

/// `--collector`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// eBPF, or cgroupfs with a warning when eBPF cannot load.
    Auto,
    /// eBPF only: fail if it cannot load.
    Ebpf,
    /// cgroupfs only.
    Cgroupfs,
}

/// Builds the collector `mode` asks for. In `auto` mode an eBPF failure is returned as
/// the second value (the reason), for the caller to log once.
pub fn select(
    mode: Mode,
    scope: Scope,
    object: Option<&Path>,
) -> Result<(Box<dyn Collector>, Option<ProbeError>), CollectError> {
    scope.validate()?;
    match mode {
        Mode::Cgroupfs => Ok((Box::new(CgroupfsCollector::new(scope)), None)),
        Mode::Ebpf => Ok((Box::new(EbpfCollector::new(scope, object)?), None)),
        Mode::Auto => match EbpfCollector::new(scope.clone(), object) {
            Ok(c) => Ok((Box::new(AutoCollector::new(c, scope)), None)),
            Err(CollectError::Probe(reason)) => {
                Ok((Box::new(CgroupfsCollector::new(scope)), Some(reason)))
            }
            Err(e) => Err(e),
        },
    }
}

/// The node-wide files both collectors read every tick, kept open ([`KeptFile`]), giving
/// the node's figures the way the kubelet (cAdvisor's root container) computes them on each
/// layout, so that `kubectl top node` agrees with metrics-server:
///
/// | | pure cgroup v2 | hybrid / v1 |
/// |---|---|---|
/// | CPU | root `cpu.stat` `usage_usec` | root `cpuacct.usage` |
/// | memory usage | root `memory.stat` `anon + file` | root `memory.usage_in_bytes` |
/// | working set | usage − root `inactive_file` | usage − root `total_inactive_file` |
///
/// The v2 root has no `memory.current`; runc, which the kubelet uses to read it, takes
/// `anon + file` of its `memory.stat`. Where the hierarchy has no memory controller the
/// working set falls back to `MemTotal − MemFree − Inactive(file)` of `/proc/meminfo`.
/// Swap is `SwapTotal − SwapFree` of `/proc/meminfo` on every layout.
#[derive(Debug)]
struct NodeFiles {
    cpu: NodeCpu,
    memory: NodeMemory,
    meminfo: KeptFile,
    /// Read buffer, kept between ticks.
    text: String,
}

/// Where the node's CPU time comes from (see [`NodeFiles`]).
#[derive(Debug)]
enum NodeCpu {
    /// v2 root `cpu.stat`: the kernel sums every CPU's `kcpustat`.
    CpuStat(KeptFile),
    /// v1 root `cpuacct.usage`: the root cpuacct group's per-CPU charge, which is what the
    /// kubelet reads on a v1 or hybrid node (it also counts what v2's root `cpu.stat`
    /// leaves out, such as steal time).
    Cpuacct(KeptFile),
}

/// Where the node's working set comes from (see [`NodeFiles`]).
#[derive(Debug)]
enum NodeMemory {
    /// v2 root `memory.stat`.
    V2 { stat: KeptFile },
    /// v1 root `memory.usage_in_bytes` and `memory.stat`.
    V1 { usage: KeptFile, stat: KeptFile },
}

impl NodeFiles {
    fn new(layout: &Layout) -> NodeFiles {
        let (cpu, memory) = match layout {
            Layout::Unified { mount } => (
                NodeCpu::CpuStat(KeptFile::new(mount.join("cpu.stat"))),
                NodeMemory::V2 {
                    stat: KeptFile::new(mount.join("memory.stat")),
                },
            ),
            Layout::Hybrid {
                cpuacct, memory, ..
            } => (
                NodeCpu::Cpuacct(KeptFile::new(cpuacct.join("cpuacct.usage"))),
                NodeMemory::V1 {
                    usage: KeptFile::new(memory.join("memory.usage_in_bytes")),
                    stat: KeptFile::new(memory.join("memory.stat")),
                },
            ),
        };
        NodeFiles {
            cpu,
            memory,
            meminfo: KeptFile::new(cgroupfs::MEMINFO.into()),
            text: String::new(),
        }
    }

    /// The root `memory.stat` these figures read each tick (whose read also flushes the
    /// hierarchy's memory statistics, as [`EbpfCollector::flush`] needs).
    fn memory_stat(&self) -> &Path {
        match &self.memory {
            NodeMemory::V2 { stat } | NodeMemory::V1 { stat, .. } => stat.path(),
        }
    }

    fn read(&mut self) -> Result<NodeSample, FsError> {
        let text = &mut self.text;
        let cpu = match &mut self.cpu {
            NodeCpu::CpuStat(f) => {
                f.read_all(text)?;
                cgroupfs::parse_cpu_stat_usage(f.path(), text)?
            }
            NodeCpu::Cpuacct(f) => {
                f.read_all(text)?;
                CpuNanos(cgroupfs::parse_single_u64(f.path(), text)?)
            }
        };
        self.meminfo.read_all(text)?;
        let mem = cgroupfs::parse_meminfo(text)?;
        let working_set = match &mut self.memory {
            NodeMemory::V2 { stat } => match stat.read_all(text) {
                Ok(()) => {
                    let key = |k| cgroupfs::need_key(stat.path(), text, k);
                    let usage = key("anon")?.saturating_add(key("file")?);
                    Bytes(usage.saturating_sub(key("inactive_file")?))
                }
                // No memory controller in the hierarchy.
                Err(e) if e.is_not_found() => {
                    self.meminfo.read_all(text)?;
                    let inactive = cgroupfs::parse_meminfo_inactive_file(text)?;
                    Bytes(mem.used.0.saturating_sub(inactive.0))
                }
                Err(e) => return Err(e),
            },
            NodeMemory::V1 { usage, stat } => {
                usage.read_all(text)?;
                let used = cgroupfs::parse_single_u64(usage.path(), text)?;
                stat.read_all(text)?;
                let inactive = cgroupfs::need_key(stat.path(), text, "total_inactive_file")?;
                Bytes(used.saturating_sub(inactive))
            }
        };
        Ok(NodeSample {
            cpu,
            memory_working_set: working_set,
            swap: mem.swap,
        })
    }
}

/// Reads cgroupfs files, one directory at a time.
#[derive(Debug)]
pub struct CgroupfsCollector {
    scope: Scope,
    node: NodeFiles,
}

impl CgroupfsCollector {
    /// A collector over `scope`.
    pub fn new(scope: Scope) -> Self {
        CgroupfsCollector {
            node: NodeFiles::new(&scope.layout),
            scope,
        }
    }
}

impl Collector for CgroupfsCollector {
    fn source(&self) -> Source {
        Source::Cgroupfs
    }

    fn collect(&mut self) -> Result<Snapshot, CollectError> {
        let s = &self.scope;
        let timestamp = sample::now();
        // First, to know whether to read swap files at all (only where the node has swap).
        let node = self.node.read()?;
        let swap = node.swap.is_some();
        let mut out: Vec<CgroupSample> = Vec::new();
        let (cpu_dirs, mut dropped) = cgroupfs::walk(s.layout.cpu_mount(), &s.root, s.max_cgroups)?;
        for d in &cpu_dirs {
            let stat_path = d.abs.join("cpu.stat");
            let stat = match cgroupfs::read(&stat_path) {
                Ok(text) => text,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e.into()),
            };
            let cpu = Some(cgroupfs::parse_cpu_stat_usage(&stat_path, &stat)?);
            let memory = match &s.layout {
                Layout::Unified { .. } if d.rel != "/" => match cgroupfs::memory_v2(&d.abs, swap) {
                    Ok(m) => m,
                    Err(e) if e.is_not_found() => continue,
                    Err(e) => return Err(e.into()),
                },
                _ => None,
            };
            let (pressure, throttling) = match fs_signals(s, &d.rel, &d.abs, &stat) {
                Ok(x) => x,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e.into()),
            };
            out.push(CgroupSample {
                path: d.rel.as_str().into(),
                id: CgroupId(d.ino),
                cpu,
                memory,
                pressure,
                throttling,
            });
        }
        if let Layout::Hybrid { memory, .. } = &s.layout {
            let index: HashMap<Arc<str>, usize> = out
                .iter()
                .enumerate()
                .map(|(i, c)| (c.path.clone(), i))
                .collect();
            let (mem_dirs, mem_dropped) = cgroupfs::walk(memory, &s.root, s.max_cgroups)?;
            dropped += mem_dropped;
            for d in mem_dirs {
                if d.rel == "/" {
                    continue;
                }
                let m = match cgroupfs::memory_v1(&d.abs, swap) {
                    Ok(m) => m,
                    Err(e) if e.is_not_found() => continue,
                    Err(e) => return Err(e.into()),
                };
                match index.get(d.rel.as_str()) {
                    Some(&i) => out[i].memory = Some(m),
                    None if out.len() < s.max_cgroups => out.push(CgroupSample {
                        path: d.rel.as_str().into(),
                        id: CgroupId(d.ino),
                        cpu: None,
                        memory: Some(m),
                        pressure: None,
                        throttling: None,
                    }),
                    None => dropped += 1,
                }
            }
        }
        Ok(Snapshot {
            timestamp,
            source: Source::Cgroupfs,
            cgroups: out,
            node,
            dropped,
        })
    }
}

/// The cgroupfs collector's [`Signals`] for the cgroup at `rel` (its directory `abs` on the
/// CPU hierarchy, the cgroup2 mount): pressure from that directory, throttling from the
/// hierarchy carrying the `cpu` controller (the v1 one on a hybrid node; on a unified one
/// it is the same directory, whose `cpu.stat` the caller read as `cpu_stat`). Not for the
/// hierarchy root, whose files are system-wide or absent.
fn fs_signals(
    s: &Scope,
    rel: &str,
    abs: &Path,
    cpu_stat: &str,
) -> Result<(Option<Pressure>, Option<Throttling>), FsError> {
    if rel == "/" {
        return Ok((None, None));
    }
    let pressure = if s.signals.pressure {
        cgroupfs::pressure(abs)?
    } else {
        None
    };
    let throttling = match s.layout.cfs_mount() {
        Some(mount) if s.signals.throttling => {
            let v2 = matches!(s.layout, Layout::Unified { .. });
            cgroupfs::throttling(&cgroupfs::join_rel(mount, rel), v2, v2.then_some(cpu_stat))?
        }
        _ => None,
    };
    Ok((pressure, throttling))
}

/// Runs the `cgroup_stats` iterator over the CPU hierarchy (and, on hybrid nodes, the
/// v1 memory hierarchy) once per cycle.
#[derive(Debug)]
pub struct EbpfCollector {
    scope: Scope,
    iter: CgroupIter,
    cpu_link: IterLink,
    mem_link: Option<IterLink>,
    page: u64,
    records: Vec<CgroupRecord>,
    mem_records: Vec<CgroupRecord>,
    /// Hybrid, with CFS counters asked for: the v1 `cpu` hierarchy's link, records and
    /// paths.
    cfs_link: Option<IterLink>,
    cfs_records: Vec<CgroupRecord>,
    cfs_paths: PathCache,
    cpu_paths: PathCache,
    mem_paths: PathCache,
    /// `cpu.stat` files whose read flushes the subtree's CPU statistics.
    flush_files: Vec<KeptFile>,
    /// The scope root's `memory.stat` on the memory hierarchy, read to flush the subtree's
    /// memory statistics (see [`EbpfCollector::flush`]).
    memory_flush: KeptFile,
    node: NodeFiles,
    links: LinkEvents,
    /// Cgroup id and CPU time of the last successful tick (for [`AutoCollector`]'s switch).
    last_cpu: Vec<(u64, u64)>,
    /// [`CollectorStats::walk_names_copied`] of the last tick.
    names_copied: u64,
    /// Hybrid: for each memory record's path (in order), the CPU sample it was merged
    /// into last tick (`u32::MAX`: none).
    mem_partners: Vec<u32>,
}

/// What happened to the links, and whether the previous tick met interference (warnings
/// are logged when interference starts, not on every tick while it lasts).
#[derive(Debug, Default)]
struct LinkEvents {
    stats: CollectorStats,
    /// Consecutive ticks with interference, up to the last one.
    streak: u64,
    /// The current tick met interference.
    now: bool,
}

impl EbpfCollector {
    /// Loads the program (from `object`, or the embedded one) and links it to the scope's
    /// subtrees. Any error is a reason to fall back.
    pub fn new(scope: Scope, object: Option<&Path>) -> Result<EbpfCollector, CollectError> {
        Self::with_layout(scope, object, None)
    }

    /// Like [`EbpfCollector::new`], with the kernel offsets given instead of computed
    /// (`None`: from the running kernel's BTF).
    pub fn with_layout(
        scope: Scope,
        object: Option<&Path>,
        layout: Option<crate::kernel_layout::KernelLayout>,
    ) -> Result<EbpfCollector, CollectError> {
        let bytes = crate::probe::object_bytes(object)?;
        let cap = u32::try_from(scope.max_cgroups).unwrap_or(u32::MAX);
        // A hybrid node's memory hierarchy gets a region of records of its own, and so does
        // its v1 `cpu` hierarchy when CFS counters are asked for (its cgroups hold them).
        let proc_cgroups = std::fs::read_to_string("/proc/cgroups").unwrap_or_default();
        let extra = match &scope.layout {
            Layout::Hybrid { cpu, .. } => {
                let memory = parse_hierarchy_id(&proc_cgroups, "memory");
                let cfs = match (scope.signals.throttling, cpu) {
                    (true, Some(_)) => parse_hierarchy_id(&proc_cgroups, "cpu").filter(|h| {
                        // The cpu controller mounted with memory: nothing more to walk.
                        Some(*h) != memory
                    }),
                    _ => None,
                };
                ExtraRegions { memory, cfs }
            }
            Layout::Unified { .. } => ExtraRegions::default(),
        };
        let iter = CgroupIter::load_with(&bytes, cap, layout, extra, scope.signals)?;
        let cpu_root = cgroupfs::join_rel(scope.layout.cpu_mount(), &scope.root);
        let cpu_link = iter.link(&cpu_root)?;
        let mem_link = match &scope.layout {
            Layout::Hybrid { memory, .. } => {
                Some(iter.link(&cgroupfs::join_rel(memory, &scope.root))?)
            }
            Layout::Unified { .. } => None,
        };
        // Throttling is an addition: without the scope root in the v1 `cpu` hierarchy there
        // are no CFS counters, not no collector.
        let cfs_link = match (&scope.layout, extra.cfs) {
            (Layout::Hybrid { cpu: Some(cpu), .. }, Some(_)) => {
                let root = cgroupfs::join_rel(cpu, &scope.root);
                match iter.link(&root) {
                    Ok(l) => Some(l),
                    Err(e) => {
                        tracing::warn!(
                            root = %root.display(),
                            error = %kpulse_process::error_chain(&e),
                            "no CFS throttling counters: cannot walk the v1 cpu hierarchy"
                        );
                        None
                    }
                }
            }
            _ => None,
        };
        let mut c = EbpfCollector {
            node: NodeFiles::new(&scope.layout),
            scope,
            iter,
            cpu_link,
            mem_link,
            cfs_link,
            page: crate::probe::page_size(),
            records: Vec::new(),
            mem_records: Vec::new(),
            cfs_records: Vec::new(),
            cpu_paths: PathCache::default(),
            mem_paths: PathCache::default(),
            cfs_paths: PathCache::default(),
            flush_files: Vec::new(),
            memory_flush: KeptFile::new(std::path::PathBuf::new()),
            links: LinkEvents::default(),
            last_cpu: Vec::new(),
            names_copied: 0,
            mem_partners: Vec::new(),
        };
        c.refresh_flush_files()?;
        c.self_check()?;
        if let Some(why) = c.iter.births_error() {
            tracing::warn!(
                error = why,
                "cgroup creation instants unavailable: a new container's first value waits \
                 for its second sample unless its processes are visible in /proc"
            );
        }
        tracing::info!(
            program_id = c.iter.program_id().unwrap_or(0),
            link_ids = ?c.link_ids(),
            map_ids = ?c.iter.map_ids(),
            "eBPF cgroup iterator loaded and linked"
        );
        Ok(c)
    }

    /// Kernel ids of the iterator links (CPU hierarchy first).
    pub fn link_ids(&self) -> Vec<u32> {
        std::iter::once(&self.cpu_link)
            .chain(self.mem_link.as_ref())
            .chain(self.cfs_link.as_ref())
            .map(IterLink::id)
            .collect()
    }

    /// Kernel ids of the program's maps.
    pub fn map_ids(&self) -> Vec<u32> {
        self.iter.map_ids()
    }

    /// Compares the program's memory statistics with `memory.stat` for a few cgroups
    /// that hold enough memory to tell fields apart. The `state[]` index of a statistic
    /// on 6.11+ kernels comes from a table in the kernel source, not from BTF; if a
    /// future kernel reorders it, this fails loudly at load instead of serving another
    /// statistic under the name `inactive_file` or `anon`.
    fn self_check(&mut self) -> Result<(), CollectError> {
        const MIN: u64 = 16 << 20;
        const CHECKED: usize = 8;
        const ATTEMPTS: usize = 3;
        let layout = self.scope.layout.clone();
        let read_files = |path: &str| {
            let dir = cgroupfs::join_rel(layout.memory_mount(), path);
            match &layout {
                Layout::Unified { .. } => cgroupfs::memory_v2(&dir, false).ok().flatten(),
                Layout::Hybrid { .. } => cgroupfs::memory_v1(&dir, false).ok(),
            }
        };
        // Cgroups holding enough memory for a wrong statistic to stand out.
        let first = self.collect()?;
        let candidates: Vec<Arc<str>> = first
            .cgroups
            .iter()
            .filter(|c| c.memory.is_some())
            .filter(|c| {
                read_files(&c.path).is_some_and(|m| m.inactive_file.0 >= MIN || m.rss.0 >= MIN)
            })
            .take(CHECKED)
            .map(|c| c.path.clone())
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        // Memory changes while we look, and reading memory.stat may flush pending
        // statistics: bracket the eBPF read between two file reads and allow a margin.
        let within = |v: Bytes, a: Bytes, b: Bytes| {
            let (lo, hi) = (a.0.min(b.0), a.0.max(b.0));
            let margin = (hi / 4).max(8 << 20);
            v.0 + margin >= lo && v.0 <= hi + margin
        };
        let mut last = Vec::new();
        for _ in 0..ATTEMPTS {
            let before: Vec<Option<Memory>> = candidates.iter().map(|p| read_files(p)).collect();
            let snap = self.collect()?;
            let after: Vec<Option<Memory>> = candidates.iter().map(|p| read_files(p)).collect();
            last.clear();
            for (i, path) in candidates.iter().enumerate() {
                let ours = snap
                    .cgroups
                    .iter()
                    .find(|c| c.path == *path)
                    .and_then(|c| c.memory);
                let (Some(ours), Some(b), Some(a)) = (ours, before[i], after[i]) else {
                    continue;
                };
                if within(ours.inactive_file, b.inactive_file, a.inactive_file)
                    && within(ours.rss, b.rss, a.rss)
                {
                    return Ok(());
                }
                last.push(format!(
                    "{path}: inactive_file {} vs {}..{}, anon {} vs {}..{}",
                    ours.inactive_file.0,
                    b.inactive_file.0,
                    a.inactive_file.0,
                    ours.rss.0,
                    b.rss.0,
                    a.rss.0
                ));
            }
        }
        if last.is_empty() {
            // Every candidate vanished meanwhile: nothing to judge by.
            return Ok(());
        }
        Err(ProbeError::Output(format!(
            "memory statistics disagree with memory.stat in every cgroup checked ({}; eBPF vs \
             memory.stat before..after): this kernel's memcg_vmstats layout is not the one \
             expected ({:?} indexing)",
            last.join("; "),
            self.iter.layout().vmstats_indexing
        ))
        .into())
    }

    /// The iterator program's kernel id.
    pub fn program_id(&self) -> Option<u32> {
        self.iter.program_id()
    }

    /// The kernel layout in use (offsets), for logs.
    pub fn kernel_layout(&self) -> &crate::kernel_layout::KernelLayout {
        self.iter.layout()
    }

    /// The files [`EbpfCollector::flush`] reads. The hierarchy root's `cpu.stat` reports
    /// kernel-wide figures and flushes nothing, so when the scope is the whole hierarchy the
    /// CPU flush goes through its children; the root's `memory.stat` flushes the whole tree.
    fn refresh_flush_files(&mut self) -> Result<(), CollectError> {
        let root = cgroupfs::normalise_rel(&self.scope.root);
        self.memory_flush = KeptFile::new(
            cgroupfs::join_rel(self.scope.layout.memory_mount(), &root).join("memory.stat"),
        );
        let mount = self.scope.layout.cpu_mount();
        self.flush_files = if root == "/" {
            let mut files = Vec::new();
            let entries = std::fs::read_dir(mount).map_err(|source| FsError::Read {
                path: mount.to_path_buf(),
                source,
            })?;
            for e in entries.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    files.push(KeptFile::new(e.path().join("cpu.stat")));
                }
            }
            files
        } else {
            vec![KeptFile::new(
                cgroupfs::join_rel(mount, &root).join("cpu.stat"),
            )]
        };
        Ok(())
    }

    /// Whether the flush files no longer match the hierarchy's top level, as the walk just
    /// saw it: a top-level cgroup made since (its statistics would otherwise wait for
    /// another reader's flush) or one removed.
    fn flush_files_stale(&self, records: &[CgroupRecord]) -> bool {
        cgroupfs::normalise_rel(&self.scope.root) == "/"
            && records
                .iter()
                .filter(|r| r.flags & FLAG_READ_ERROR == 0 && r.level == 1)
                .count()
                != self.flush_files.len()
    }

    /// Asks the kernel to fold its per-CPU statistics of the scope into the totals the walk
    /// reads, as any reader of the files does:
    /// - CPU: `cpu.stat` of each flush directory (rstat flush of the base statistics);
    /// - memory: `memory.stat` of the scope root. Its read runs `mem_cgroup_flush_stats`
    ///   (when more than a batch of updates is pending, the kernel's own threshold), which
    ///   the walk's direct reads of `memcg->vmstats` do not. Without it `inactive_file`, and
    ///   so the working set, lags until the kernel's periodic flush (every 2 s, later on a
    ///   busy host): 4 MiB of a 64 MiB cgroup was seen. A scope root without the file (no
    ///   memory controller there) has no memory statistics to flush. When the scope is the
    ///   whole hierarchy, that file is the one the node's figures read in full
    ///   ([`NodeFiles`]), right after this: that read is the flush, and this one is skipped.
    ///
    /// The files stay open between ticks ([`KeptFile`]).
    fn flush(&mut self) -> Result<(), CollectError> {
        let mut stale = false;
        for f in &mut self.flush_files {
            match f.read_to_flush() {
                Ok(()) => {}
                Err(e) if e.is_not_found() => stale = true,
                Err(e) => return Err(e.into()),
            }
        }
        if stale {
            self.refresh_flush_files()?;
        }
        if self.memory_flush.path() == self.node.memory_stat() {
            // The node's figures read this very file in full right after (`collect_once`):
            // one read of the root's `memory.stat` per tick, not two.
            return Ok(());
        }
        match self.memory_flush.read_to_flush() {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Walks redone in one tick when another walk of our link overwrote the records.
const FOREIGN_WALK_RETRIES: usize = 2;

/// Walks `link`, repairing what can be repaired within the tick:
/// - a walk that visits nothing means the link's cgroup was removed (a link keeps the dead
///   cgroup, not the path): link the path again;
/// - a link whose program another process replaced (`BPF_LINK_UPDATE`; detected before
///   the walk's output is read): log, link our program again;
/// - records overwritten by another walk of our link: walk again (up to
///   [`FOREIGN_WALK_RETRIES`] times).
///
/// Each repair is tried a bounded number of times; then the tick fails (no number is reported
/// from a walk that is not entirely ours).
fn walk_live(
    iter: &mut CgroupIter,
    link: &mut IterLink,
    out: &mut Vec<CgroupRecord>,
    events: &mut LinkEvents,
) -> Result<crate::probe::WalkStats, CollectError> {
    let mut first = iter.walk(link, out);
    for _ in 0..FOREIGN_WALK_RETRIES {
        let Err(ProbeError::ForeignRecord { index, visited, .. }) = first else {
            break;
        };
        events.stats.foreign_walks += 1;
        events.interfered(|| {
            tracing::warn!(
                link_id = link.id(),
                dir = %link.dir().display(),
                record = index,
                visited,
                "another walk of our eBPF iterator link overwrote this walk's records \
                 (a process running our link?); walking again"
            )
        });
        first = iter.walk(link, out);
    }
    let replaced = match first {
        Ok(stats) if stats.visited > 0 => return Ok(stats),
        Ok(_) => None,
        Err(ProbeError::LinkReplaced {
            link: id, found, ..
        }) => Some((id, found)),
        Err(e) => return Err(e.into()),
    };
    let old = link.id();
    *link = iter.link(link.dir())?;
    match replaced {
        Some((id, found)) => {
            events.stats.relinks_program_replaced += 1;
            events.interfered(|| {
                tracing::warn!(
                    link_id = id,
                    found_program_id = found,
                    our_program_id = iter.program_id().unwrap_or(0),
                    new_link_id = link.id(),
                    dir = %link.dir().display(),
                    "another process replaced the program of our eBPF iterator link; \
                     linked our program again"
                )
            });
        }
        None => {
            events.stats.relinks_cgroup_removed += 1;
            tracing::info!(
                old_link_id = old,
                new_link_id = link.id(),
                dir = %link.dir().display(),
                "the linked cgroup was removed; linked its path again"
            );
        }
    }
    let stats = iter.walk(link, out)?;
    if stats.visited == 0 {
        return Err(ProbeError::CgroupGone {
            dir: link.dir().to_path_buf(),
        }
        .into());
    }
    Ok(stats)
}

impl LinkEvents {
    /// Notes interference in this tick; `log` runs only for the first tick of a streak.
    fn interfered(&mut self, log: impl FnOnce()) {
        if !self.now && self.streak == 0 {
            log();
        }
        self.now = true;
    }

    /// Ends a tick: extends or ends the streak.
    fn end_tick(&mut self) {
        if self.now {
            self.streak += 1;
        } else if self.streak > 0 {
            tracing::info!(
                ticks = self.streak,
                "no more interference with the eBPF iterator links"
            );
            self.streak = 0;
        }
        self.now = false;
    }
}

/// cgroup id → path, kept across ticks, so that a path is built once per cgroup rather
/// than once per cgroup per tick.
///
/// A pre-order walk of a tree that did not change returns every cgroup at the position it
/// had in the last walk, so the cache is positional: record *i* reuses slot *i*'s path when
/// the slot holds the same cgroup id, parent id and `name_key` (so the same name) and its
/// parent's slot was reused too (so the same parent path). That is a few comparisons over
/// two arrays read in order. Other records (new cgroups, or cgroups shifted by a creation
/// or removal before them) get their parent's path by id, from a map built only in ticks
/// that have such records, and a path string of their own. Slots not reached again are
/// dropped.
#[derive(Debug, Default)]
struct PathCache {
    /// The last walk's paths, by position (`None`: that record was left out).
    slots: Vec<Option<Slot>>,
}

#[derive(Debug, Clone)]
struct Slot {
    id: u64,
    parent: u64,
    /// The record's `name_key`: the same key, the same name.
    name_key: u64,
    /// Position of the parent's record in the walk (`u32::MAX` for the walk's root).
    parent_pos: u32,
    rel: Arc<str>,
}

impl PathCache {
    /// Entries held.
    fn len(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// Pairs pre-ordered records with their paths (relative to `mount`). Records whose
    /// parent is unknown (the walk raced with a removal) or whose read failed are left out.
    fn resolve<'r>(
        &mut self,
        records: &'r [CgroupRecord],
        root_rel: &str,
        mount: &Path,
    ) -> Vec<(Arc<str>, &'r CgroupRecord)> {
        self.resolve_interned(records, root_rel, mount, &mut |_| None)
    }

    /// [`PathCache::resolve`], taking a new path's string from `intern` when it has an
    /// equal one (another hierarchy's cache), so that equal paths share one allocation.
    fn resolve_interned<'r>(
        &mut self,
        records: &'r [CgroupRecord],
        root_rel: &str,
        mount: &Path,
        intern: &mut dyn FnMut(&str) -> Option<Arc<str>>,
    ) -> Vec<(Arc<str>, &'r CgroupRecord)> {
        let mut out = Vec::with_capacity(records.len());
        let mut slots: Vec<Option<Slot>> = Vec::with_capacity(records.len());
        // Whether record i reused slot i (its path is last tick's).
        let mut reused: Vec<bool> = Vec::with_capacity(records.len());
        // cgroup id → position, this tick; built at the first record the slots cannot serve.
        let mut positions: Option<HashMap<u64, u32>> = None;
        for (i, r) in records.iter().enumerate() {
            let reuse = if r.flags & FLAG_READ_ERROR != 0 {
                None
            } else {
                self.reuse(i, r, records, &reused)
            };
            let hit = reuse.is_some();
            let kept = if hit || r.flags & FLAG_READ_ERROR != 0 {
                reuse
            } else {
                let positions = positions.get_or_insert_with(|| {
                    slots
                        .iter()
                        .enumerate()
                        .filter_map(|(p, s)| Some((s.as_ref()?.id, p as u32)))
                        .collect()
                });
                Self::build(i, r, root_rel, mount, &slots, positions).map(|mut slot| {
                    if let Some(shared) = intern(&slot.rel) {
                        slot.rel = shared;
                    }
                    slot
                })
            };
            if let Some(slot) = &kept {
                if let Some(positions) = positions.as_mut() {
                    positions.insert(slot.id, i as u32);
                }
                out.push((slot.rel.clone(), r));
            }
            reused.push(hit);
            slots.push(kept);
        }
        self.slots = slots;
        out
    }

    /// Slot `i` of the last walk, if record `i` is the same cgroup under the same path.
    fn reuse(
        &self,
        i: usize,
        r: &CgroupRecord,
        records: &[CgroupRecord],
        reused: &[bool],
    ) -> Option<Slot> {
        let old = self.slots.get(i)?.as_ref()?;
        if old.id != r.id || old.parent != r.parent_id || old.name_key != r.name_key {
            return None;
        }
        let parent_same = if i == 0 {
            old.parent_pos == u32::MAX
        } else {
            let p = old.parent_pos as usize;
            reused.get(p).copied().unwrap_or(false)
                && records.get(p).is_some_and(|pr| pr.id == r.parent_id)
        };
        parent_same.then(|| old.clone())
    }

    /// A new slot for record `i`: its parent's path (this tick's) and its name.
    fn build(
        i: usize,
        r: &CgroupRecord,
        root_rel: &str,
        mount: &Path,
        slots: &[Option<Slot>],
        positions: &HashMap<u64, u32>,
    ) -> Option<Slot> {
        if i == 0 {
            return Some(Slot {
                id: r.id,
                parent: r.parent_id,
                name_key: r.name_key,
                parent_pos: u32::MAX,
                rel: root_rel.into(),
            });
        }
        let parent_pos = *positions.get(&r.parent_id)?;
        let prel = &slots.get(parent_pos as usize)?.as_ref()?.rel;
        let name = if r.flags & FLAG_NAME_TRUNCATED != 0 {
            name_by_inode(&cgroupfs::join_rel(mount, prel), r.id)?
        } else {
            let raw =
                std::ffi::CStr::from_bytes_until_nul(&r.name).map_or(&r.name[..], |c| c.to_bytes());
            String::from_utf8_lossy(raw).into_owned()
        };
        let rel: Arc<str> = if &**prel == "/" {
            format!("/{name}").into()
        } else {
            format!("{prel}/{name}").into()
        };
        Some(Slot {
            id: r.id,
            parent: r.parent_id,
            name_key: r.name_key,
            parent_pos,
            rel,
        })
    }
}

/// The `hierarchy` column of `controller`'s line of `/proc/cgroups`; `None` when the
/// controller is on the default hierarchy (0) or absent.
fn parse_hierarchy_id(proc_cgroups: &str, controller: &str) -> Option<u32> {
    proc_cgroups.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        (fields.next()? == controller)
            .then(|| fields.next()?.parse::<u32>().ok())
            .flatten()
            .filter(|&h| h != 0)
    })
}

/// Finds a child directory of `parent` by inode (for names longer than the record holds).
fn name_by_inode(parent: &Path, ino: u64) -> Option<String> {
    std::fs::read_dir(parent).ok()?.flatten().find_map(|e| {
        let md = e.metadata().ok()?;
        (md.is_dir() && md.ino() == ino).then(|| e.file_name().to_string_lossy().into_owned())
    })
}

impl EbpfCollector {
    /// A record's memory figures. Swap: the swap page counter on v2; on v1 (the hybrid
    /// layout's memory hierarchy) the memory + swap counter less the memory counter, which
    /// is what `total_swap` counts (a page moves its charge from memory to swap when it is
    /// swapped out, and back when it is swapped in).
    fn memory_of(&self, r: &CgroupRecord) -> Option<Memory> {
        if r.flags & FLAG_MEMCG == 0 {
            return None;
        }
        let pages = |p: i64| Bytes(u64::try_from(p).unwrap_or(0).saturating_mul(self.page));
        let swap_pages = if self.mem_link.is_some() {
            r.swap_counter_pages.saturating_sub(r.memory_usage_pages)
        } else {
            r.swap_counter_pages
        };
        Some(
            Memory::from_raw(
                Bytes(r.memory_usage_pages.saturating_mul(self.page)),
                pages(r.inactive_file_pages),
                pages(r.anon_pages),
            )
            .with_swap(Some(Bytes(swap_pages.saturating_mul(self.page)))),
        )
    }
}

impl Collector for EbpfCollector {
    fn source(&self) -> Source {
        Source::Ebpf
    }

    fn birth(&self, id: u64) -> Option<u64> {
        self.iter.birth(id)
    }

    fn stats(&self) -> CollectorStats {
        CollectorStats {
            walk_records: (self.records.len() + self.mem_records.len() + self.cfs_records.len())
                as u64,
            path_cache_entries: (self.cpu_paths.len() + self.mem_paths.len()) as u64,
            walk_names_copied: self.names_copied,
            ..self.links.stats
        }
    }

    fn collect(&mut self) -> Result<Snapshot, CollectError> {
        let r = self.collect_once();
        self.links.end_tick();
        r
    }
}

impl EbpfCollector {
    fn collect_once(&mut self) -> Result<Snapshot, CollectError> {
        let timestamp = sample::now();
        self.flush()?;
        // Before the walk: where the node's root `memory.stat` is the scope root's, this read
        // is the memory flush the walk needs (see `flush`).
        let node = self.node.read()?;
        let root_rel = cgroupfs::normalise_rel(&self.scope.root);
        let max = self.scope.max_cgroups;
        let mut records = std::mem::take(&mut self.records);
        let walked = walk_live(
            &mut self.iter,
            &mut self.cpu_link,
            &mut records,
            &mut self.links,
        );
        // Keep the buffer (and make the sizes reported honest) whatever happened.
        let stats = match walked {
            Ok(s) => s,
            Err(e) => {
                records.clear();
                self.records = records;
                self.mem_records.clear();
                return Err(e);
            }
        };
        let mut dropped = stats.dropped;
        let cpu_mount = self.scope.layout.cpu_mount().to_path_buf();
        let mut out: Vec<CgroupSample> = Vec::with_capacity(records.len().min(max));
        let hybrid = self.mem_link.is_some();
        let cpu_paths = self.cpu_paths.resolve(&records, &root_rel, &cpu_mount);
        dropped += (records.len() - cpu_paths.len()) as u64;
        dropped += cpu_paths.len().saturating_sub(max) as u64;
        for (path, r) in cpu_paths.into_iter().take(max) {
            let hierarchy_root = &*path == "/";
            let cpu = if hierarchy_root {
                // Root CPU time is kernel-wide (kcpustat), read below with the node totals.
                None
            } else {
                Some(CpuNanos(r.cpu_usage_ns))
            };
            let memory = if hybrid || hierarchy_root {
                None
            } else {
                self.memory_of(r)
            };
            let (pressure, throttling) = if hierarchy_root {
                (None, None)
            } else {
                record_signals(r)
            };
            out.push(CgroupSample {
                path,
                id: CgroupId(r.id),
                cpu,
                memory,
                pressure,
                throttling,
            });
        }
        let mut mrecs = std::mem::take(&mut self.mem_records);
        if let Some(link) = self.mem_link.as_mut() {
            let stats = match walk_live(&mut self.iter, link, &mut mrecs, &mut self.links) {
                Ok(s) => s,
                Err(e) => {
                    mrecs.clear();
                    self.mem_records = mrecs;
                    self.records = records;
                    return Err(e);
                }
            };
            dropped += stats.dropped;
            let mem_mount = self.scope.layout.memory_mount().to_path_buf();
            // CPU sample index by path, built only in a tick that needs it: when a memory
            // cgroup gets a new path (it then shares the CPU sample's string, so that the
            // pairing below is a pointer comparison) or its pairing moved.
            let mut by_path: Option<HashMap<Arc<str>, usize>> = None;
            let mut index_of = |out: &[CgroupSample], path: &str| -> Option<usize> {
                by_path
                    .get_or_insert_with(|| {
                        out.iter()
                            .enumerate()
                            .map(|(i, c)| (c.path.clone(), i))
                            .collect()
                    })
                    .get(path)
                    .copied()
            };
            let mem_paths =
                self.mem_paths
                    .resolve_interned(&mrecs, &root_rel, &mem_mount, &mut |path| {
                        index_of(&out, path).map(|i| out[i].path.clone())
                    });
            dropped += (mrecs.len() - mem_paths.len()) as u64;
            let mut partners = Vec::with_capacity(mem_paths.len());
            for (j, (path, r)) in mem_paths.into_iter().enumerate() {
                if &*path == "/" {
                    partners.push(u32::MAX);
                    continue;
                }
                let m = self.memory_of(r);
                // Last tick's partner, if it is still this path's CPU sample.
                let last = self
                    .mem_partners
                    .get(j)
                    .map(|&k| k as usize)
                    .filter(|&k| out.get(k).is_some_and(|c| Arc::ptr_eq(&c.path, &path)));
                match last.or_else(|| index_of(&out, &path)) {
                    Some(i) => {
                        out[i].memory = m;
                        partners.push(i as u32);
                    }
                    None if out.len() < max => {
                        partners.push(u32::MAX);
                        out.push(CgroupSample {
                            path,
                            id: CgroupId(r.id),
                            cpu: None,
                            memory: m,
                            pressure: None,
                            throttling: None,
                        });
                    }
                    None => {
                        partners.push(u32::MAX);
                        dropped += 1;
                    }
                }
            }
            self.mem_partners = partners;
        }
        let mut crecs = std::mem::take(&mut self.cfs_records);
        if let Some(link) = self.cfs_link.as_mut() {
            match walk_live(&mut self.iter, link, &mut crecs, &mut self.links) {
                Ok(stats) => dropped += stats.dropped,
                Err(e) => {
                    crecs.clear();
                    self.cfs_records = crecs;
                    self.mem_records = mrecs;
                    self.records = records;
                    return Err(e);
                }
            }
            let cfs_mount = self.scope.layout.cfs_mount().unwrap_or(Path::new("/"));
            let cfs_paths = self.cfs_paths.resolve(&crecs, &root_rel, cfs_mount);
            // The counters go to the CPU hierarchy's samples of the same path; a cgroup only
            // the v1 `cpu` hierarchy has is not reported.
            let index: HashMap<&str, usize> =
                out.iter().enumerate().map(|(i, c)| (&*c.path, i)).collect();
            let found: Vec<(usize, Option<Throttling>)> = cfs_paths
                .iter()
                .filter(|(path, _)| &**path != "/")
                .filter_map(|(path, r)| Some((*index.get(&**path)?, record_signals(r).1)))
                .collect();
            for (i, t) in found {
                out[i].throttling = t;
            }
        }
        self.names_copied = records
            .iter()
            .chain(&mrecs)
            .chain(&crecs)
            .filter(|r| r.flags & (FLAG_NAME_KEPT | FLAG_READ_ERROR) == 0)
            .count() as u64;
        self.records = records;
        self.mem_records = mrecs;
        self.cfs_records = crecs;
        if self.flush_files_stale(&self.records) {
            self.refresh_flush_files()?;
        }
        if let Some(root) = out.iter_mut().find(|c| &*c.path == "/") {
            root.cpu = Some(node.cpu);
        }
        self.last_cpu.clear();
        self.last_cpu
            .extend(out.iter().filter_map(|c| c.cpu.map(|v| (c.id.0, v.0))));
        Ok(Snapshot {
            timestamp,
            source: Source::Ebpf,
            cgroups: out,
            node,
            dropped,
        })
    }
}

/// A walk record's [`Signals`], as its flags say they were read.
fn record_signals(r: &CgroupRecord) -> (Option<Pressure>, Option<Throttling>) {
    let pressure = (r.flags & FLAG_PSI != 0).then_some(Pressure {
        cpu_some_ns: r.psi_cpu_some_ns,
        memory_some_ns: r.psi_memory_some_ns,
        averaged: Some(PsiAveraged {
            at_ns: r.psi_avg_at_ns,
            cpu_some_ns: r.psi_avg_cpu_some_ns,
            memory_some_ns: r.psi_avg_memory_some_ns,
        }),
    });
    let throttling =
        (r.flags & FLAG_CFS != 0 && r.flags & FLAG_CFS_QUOTA != 0).then_some(Throttling {
            periods: r.cfs_periods,
            throttled: r.cfs_throttled,
        });
    (pressure, throttling)
}

/// Consecutive ticks of interference or eBPF failure after which [`AutoCollector`] falls
/// back to cgroupfs.
pub const FALLBACK_AFTER: u32 = 3;

/// `--collector auto` once eBPF has loaded: the eBPF collector, until it meets interference
/// it cannot shake off (another process replacing its program or overwriting its walks on
/// [`FALLBACK_AFTER`] consecutive ticks, even though each tick repaired it) or fails with an
/// eBPF error that many ticks in a row. Then it logs one warning, unloads the eBPF program
/// and reads cgroupfs for the rest of the process's life (a restart tries eBPF again): no
/// flapping between two collectors.
///
/// Both collectors read the same kernel counters, but `cpu.stat` has whole microseconds
/// where the eBPF program reads nanoseconds; a cgroup's CPU counter could then read up to
/// 999 ns lower after the switch, which the aggregator would take for a restart. So each
/// cgroup's first cgroupfs values are raised to the last eBPF value (never above the
/// kernel's counter, under it by less than a microsecond) until cgroupfs passes it.
#[derive(Debug)]
pub struct AutoCollector {
    ebpf: Option<EbpfCollector>,
    fs: CgroupfsCollector,
    strikes: u32,
    /// Counters of the eBPF collector, once it is gone.
    retired: CollectorStats,
    fallbacks: u64,
    /// Cgroup id → last CPU time eBPF reported, while cgroupfs reads lower.
    floors: HashMap<u64, u64>,
}

impl AutoCollector {
    /// Wraps a loaded eBPF collector; `scope` is the same, for the cgroupfs one.
    pub fn new(ebpf: EbpfCollector, scope: Scope) -> AutoCollector {
        AutoCollector {
            ebpf: Some(ebpf),
            fs: CgroupfsCollector::new(scope),
            strikes: 0,
            retired: CollectorStats::default(),
            fallbacks: 0,
            floors: HashMap::new(),
        }
    }

    /// The eBPF collector, while in use.
    pub fn ebpf(&self) -> Option<&EbpfCollector> {
        self.ebpf.as_ref()
    }

    fn fall_back(&mut self, reason: &str) {
        let Some(e) = self.ebpf.take() else {
            return;
        };
        self.retired = e.stats();
        self.floors = e.last_cpu.iter().copied().collect();
        let program_id = e.program_id().unwrap_or(0);
        drop(e);
        self.fallbacks += 1;
        tracing::warn!(
            ticks = self.strikes,
            %reason,
            program_id,
            "eBPF collection failed or was interfered with on consecutive ticks; \
             unloaded the eBPF program, reading cgroupfs until the agent restarts"
        );
    }

    fn cgroupfs(&mut self) -> Result<Snapshot, CollectError> {
        let mut snap = self.fs.collect()?;
        raise_to_floors(&mut self.floors, &mut snap.cgroups);
        Ok(snap)
    }
}

/// Raises each cgroup's CPU time to its floor (the last eBPF value) while it reads lower;
/// forgets the floors of cgroups that passed theirs or are gone.
fn raise_to_floors(floors: &mut HashMap<u64, u64>, cgroups: &mut [CgroupSample]) {
    if floors.is_empty() {
        return;
    }
    let mut kept = HashMap::new();
    for c in cgroups {
        let (Some(cpu), Some(&floor)) = (c.cpu.as_mut(), floors.get(&c.id.0)) else {
            continue;
        };
        if cpu.0 < floor {
            cpu.0 = floor;
            kept.insert(c.id.0, floor);
        }
    }
    *floors = kept;
}

impl Collector for AutoCollector {
    fn source(&self) -> Source {
        match self.ebpf {
            Some(_) => Source::Ebpf,
            None => Source::Cgroupfs,
        }
    }

    fn birth(&self, id: u64) -> Option<u64> {
        self.ebpf.as_ref()?.birth(id)
    }

    fn stats(&self) -> CollectorStats {
        let live = self.ebpf.as_ref().map(Collector::stats).unwrap_or_default();
        CollectorStats {
            fallbacks: self.fallbacks,
            ..self.retired.add(live)
        }
    }

    fn collect(&mut self) -> Result<Snapshot, CollectError> {
        let Some(e) = self.ebpf.as_mut() else {
            return self.cgroupfs();
        };
        let before = e.stats().interference();
        let result = e.collect();
        let interfered = e.stats().interference() > before;
        match result {
            Ok(snap) => {
                if !interfered {
                    self.strikes = 0;
                    return Ok(snap);
                }
                self.strikes += 1;
                if self.strikes >= FALLBACK_AFTER {
                    // This tick is good (repaired); the next ones come from cgroupfs.
                    self.fall_back("another process keeps replacing the iterator's program or running its link");
                }
                Ok(snap)
            }
            // Not eBPF's doing: the scope or cgroupfs itself (cgroupfs would fail too).
            Err(e @ (CollectError::Fs(_) | CollectError::Probe(ProbeError::CgroupGone { .. }))) => {
                Err(e)
            }
            Err(CollectError::Probe(p)) => {
                self.strikes += 1;
                if self.strikes < FALLBACK_AFTER {
                    return Err(p.into());
                }
                self.fall_back(&kpulse_process::error_chain(&p));
                self.cgroupfs()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpulse_common::{NAME_LEN, RECORD_VERSION};

    fn rec(id: u64, parent: u64, name: &str) -> CgroupRecord {
        let mut n = [0u8; NAME_LEN];
        n[..name.len()].copy_from_slice(name.as_bytes());
        CgroupRecord {
            version: RECORD_VERSION,
            flags: 0,
            session: 1,
            id,
            parent_id: parent,
            level: 0,
            cpu_usage_ns: 0,
            memory_usage_pages: 0,
            inactive_file_pages: 0,
            anon_pages: 0,
            swap_counter_pages: 0,
            psi_cpu_some_ns: 0,
            psi_memory_some_ns: 0,
            cfs_periods: 0,
            cfs_throttled: 0,
            psi_avg_cpu_some_ns: 0,
            psi_avg_memory_some_ns: 0,
            psi_avg_at_ns: 0,
            // As the kernel's: another name is another string (FNV-1a of the name here).
            name_key: name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            }),
            name: n,
        }
    }

    /// The node's figures are the kubelet's on each layout: v2 root `cpu.stat` and
    /// `anon + file - inactive_file`; v1 root `cpuacct.usage` and `usage_in_bytes -
    /// total_inactive_file`; `/proc/meminfo` only where no memory controller is there.
    #[test]
    fn node_figures_are_the_kubelets() {
        let dir = std::env::temp_dir().join(format!("kpulse-nodefiles-{}", std::process::id()));
        let (v2, v2_bare, cpuacct, memory) = (
            dir.join("v2"),
            dir.join("v2-bare"),
            dir.join("cpuacct"),
            dir.join("memory"),
        );
        for d in [&v2, &v2_bare, &cpuacct, &memory] {
            std::fs::create_dir_all(d).expect("test files");
        }
        let write = |p: std::path::PathBuf, t: &str| std::fs::write(p, t).expect("test files");
        write(v2.join("cpu.stat"), "usage_usec 5000\nuser_usec 3000\n");
        write(
            v2.join("memory.stat"),
            "anon 1000\nfile 700\nkernel 900000\ninactive_file 300\n",
        );
        write(v2_bare.join("cpu.stat"), "usage_usec 7\n");
        write(cpuacct.join("cpuacct.usage"), "123456789\n");
        write(memory.join("memory.usage_in_bytes"), "10000\n");
        write(
            memory.join("memory.stat"),
            "inactive_file 1\ntotal_inactive_file 2500\n",
        );

        let mut unified = NodeFiles::new(&Layout::Unified { mount: v2.clone() });
        let n = unified.read().expect("test files");
        assert_eq!(n.cpu, CpuNanos(5_000_000));
        // The kernel memory (not in anon or file) is not in the working set.
        assert_eq!(n.memory_working_set, Bytes(1000 + 700 - 300));

        let mut hybrid = NodeFiles::new(&Layout::Hybrid {
            unified: v2_bare.clone(),
            cpuacct: cpuacct.clone(),
            memory: memory.clone(),
            cpu: None,
        });
        let n = hybrid.read().expect("test files");
        assert_eq!(n.cpu, CpuNanos(123_456_789));
        assert_eq!(n.memory_working_set, Bytes(10_000 - 2500));

        // No memory controller: /proc/meminfo's figures.
        let mut bare = NodeFiles::new(&Layout::Unified {
            mount: v2_bare.clone(),
        });
        let n = bare.read().expect("test files");
        assert_eq!(n.cpu, CpuNanos(7000));
        let text = std::fs::read_to_string(cgroupfs::MEMINFO).expect("test files");
        let used = cgroupfs::parse_meminfo(&text).expect("test files").used.0;
        assert!(n.memory_working_set.0 > 0 && n.memory_working_set.0 <= used);

        // A root memory.stat without `file` is an error that names it, not a wrong figure.
        write(v2.join("memory.stat"), "anon 1000\ninactive_file 300\n");
        let err = unified.read().expect_err("no `file`").to_string();
        assert!(err.contains("memory.stat") && err.contains("file"), "{err}");
        std::fs::remove_dir_all(&dir).expect("test files");
    }

    /// The node's figures read the same root `memory.stat` that the eBPF collector's memory
    /// flush reads for a whole-hierarchy scope, on both layouts: one read does both.
    #[test]
    fn the_node_figures_read_is_the_memory_flush() {
        let layouts = [
            Layout::Unified {
                mount: "/sys/fs/cgroup".into(),
            },
            Layout::Hybrid {
                unified: "/sys/fs/cgroup/unified".into(),
                cpuacct: "/sys/fs/cgroup/cpu,cpuacct".into(),
                memory: "/sys/fs/cgroup/memory".into(),
                cpu: None,
            },
        ];
        for layout in layouts {
            let flush = cgroupfs::join_rel(layout.memory_mount(), &cgroupfs::normalise_rel("/"))
                .join("memory.stat");
            assert_eq!(NodeFiles::new(&layout).memory_stat(), flush, "{layout:?}");
        }
    }

    fn paths(c: &mut PathCache, recs: &[CgroupRecord], root: &str) -> Vec<String> {
        c.resolve(recs, root, Path::new("/nonexistent"))
            .into_iter()
            .map(|(p, _)| p.to_string())
            .collect()
    }

    #[test]
    fn cpu_never_goes_backwards_across_the_fallback() {
        let sample = |id: u64, cpu: u64| CgroupSample {
            path: format!("/c{id}").into(),
            id: CgroupId(id),
            cpu: Some(CpuNanos(cpu)),
            memory: None,
            pressure: None,
            throttling: None,
        };
        // Last eBPF values (ns); cgroup 3 is gone afterwards.
        let mut floors: HashMap<u64, u64> = [(1, 1_234_567), (2, 5_000_400), (3, 7)]
            .into_iter()
            .collect();
        // cgroupfs: whole microseconds. 1 is idle, 2 ran on.
        let mut first = vec![sample(1, 1_234_000), sample(2, 5_002_000), sample(4, 9_000)];
        raise_to_floors(&mut floors, &mut first);
        let cpu: Vec<u64> = first.iter().map(|c| c.cpu.map_or(0, |v| v.0)).collect();
        assert_eq!(cpu, [1_234_567, 5_002_000, 9_000]);
        assert_eq!(floors, [(1, 1_234_567)].into_iter().collect());
        // Once cgroupfs passes the floor, it is forgotten.
        let mut later = vec![sample(1, 1_235_000)];
        raise_to_floors(&mut floors, &mut later);
        assert_eq!(later[0].cpu, Some(CpuNanos(1_235_000)));
        assert!(floors.is_empty());
    }

    /// `/`, `/a`, `/a/b`, `/c`, in walk order.
    fn tree() -> [CgroupRecord; 4] {
        [
            rec(1, 0, ""),
            rec(2, 1, "a"),
            rec(3, 2, "b"),
            rec(4, 1, "c"),
        ]
    }

    #[test]
    fn paths_follow_parents_and_survive_ticks() {
        let mut c = PathCache::default();
        let recs = tree();
        assert_eq!(paths(&mut c, &recs, "/"), ["/", "/a", "/a/b", "/c"]);
        let first = c.resolve(&recs, "/", Path::new("/x"));
        let again = c.resolve(&recs, "/", Path::new("/x"));
        // Reused, not rebuilt.
        assert!(Arc::ptr_eq(&first[2].0, &again[2].0));
    }

    #[test]
    fn a_renamed_parent_renames_its_children() {
        let mut c = PathCache::default();
        let recs = [rec(1, 0, ""), rec(2, 1, "a"), rec(3, 2, "b")];
        assert_eq!(paths(&mut c, &recs, "/"), ["/", "/a", "/a/b"]);
        let renamed = [rec(1, 0, ""), rec(2, 1, "z"), rec(3, 2, "b")];
        assert_eq!(paths(&mut c, &renamed, "/"), ["/", "/z", "/z/b"]);
    }

    #[test]
    fn a_cgroup_made_before_others_shifts_them_and_paths_stay_right() {
        let mut c = PathCache::default();
        assert_eq!(paths(&mut c, &tree(), "/"), ["/", "/a", "/a/b", "/c"]);
        // A new first child moves every later record one slot on.
        let grown = [
            rec(1, 0, ""),
            rec(9, 1, "new"),
            rec(2, 1, "a"),
            rec(3, 2, "b"),
            rec(4, 1, "c"),
        ];
        assert_eq!(
            paths(&mut c, &grown, "/"),
            ["/", "/new", "/a", "/a/b", "/c"]
        );
        // Steady again: every slot reused.
        let first = c.resolve(&grown, "/", Path::new("/x"));
        let again = c.resolve(&grown, "/", Path::new("/x"));
        assert!(first
            .iter()
            .zip(&again)
            .all(|(a, b)| Arc::ptr_eq(&a.0, &b.0)));
        // A child whose parent moved is rebuilt under the parent's path.
        let moved = [
            rec(1, 0, ""),
            rec(2, 1, "a"),
            rec(4, 1, "c"),
            rec(3, 2, "b"),
        ];
        assert_eq!(paths(&mut c, &moved, "/"), ["/", "/a", "/c", "/a/b"]);
    }

    #[test]
    fn equal_paths_of_another_hierarchy_are_shared() {
        let mut cpu = PathCache::default();
        let mut mem = PathCache::default();
        let recs = [rec(1, 0, ""), rec(2, 1, "a")];
        let cpu_paths: Vec<Arc<str>> = cpu
            .resolve(&recs, "/", Path::new("/x"))
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        let mem_recs = [rec(7, 0, ""), rec(8, 7, "a")];
        let mem_paths = mem.resolve_interned(&mem_recs, "/", Path::new("/y"), &mut |p| {
            cpu_paths.iter().find(|c| &***c == p).cloned()
        });
        assert!(Arc::ptr_eq(&mem_paths[1].0, &cpu_paths[1]));
    }

    #[test]
    fn names_are_compared_by_key_only() {
        let mut c = PathCache::default();
        let recs = [rec(1, 0, ""), rec(2, 1, "a")];
        assert_eq!(paths(&mut c, &recs, "/"), ["/", "/a"]);
        // The walk kept the slot's name (FLAG_NAME_KEPT): the key decides, the bytes are
        // not read again.
        let mut kept = rec(2, 1, "a");
        kept.flags |= kpulse_common::FLAG_NAME_KEPT;
        kept.name = [0; NAME_LEN];
        assert_eq!(paths(&mut c, &[rec(1, 0, ""), kept], "/"), ["/", "/a"]);
    }

    #[test]
    fn the_memory_hierarchy_is_found_in_proc_cgroups() {
        let hybrid = "#subsys_name\thierarchy\tnum_cgroups\tenabled\n\
                      cpu\t2\t120\t1\ncpuacct\t3\t120\t1\nmemory\t5\t130\t1\n";
        assert_eq!(parse_hierarchy_id(hybrid, "memory"), Some(5));
        assert_eq!(parse_hierarchy_id(hybrid, "cpu"), Some(2));
        let unified = "#subsys_name\thierarchy\tnum_cgroups\tenabled\nmemory\t0\t80\t1\n";
        assert_eq!(parse_hierarchy_id(unified, "memory"), None);
        assert_eq!(parse_hierarchy_id("", "memory"), None);
        assert_eq!(parse_hierarchy_id("memory\tx\t1\t1\n", "memory"), None);
    }

    #[test]
    fn orphans_and_failed_reads_are_left_out_and_gone_ids_evicted() {
        let mut c = PathCache::default();
        let mut bad = rec(5, 1, "bad");
        bad.flags |= FLAG_READ_ERROR;
        let recs = [rec(1, 0, ""), rec(2, 1, "a"), rec(3, 99, "orphan"), bad];
        assert_eq!(paths(&mut c, &recs, "/sub"), ["/sub", "/sub/a"]);
        let fewer = [rec(1, 0, "")];
        assert_eq!(paths(&mut c, &fewer, "/sub"), ["/sub"]);
        assert_eq!(c.len(), 1);
        // An id reused for another cgroup gets its own path.
        let reused = [rec(1, 0, ""), rec(2, 1, "new")];
        assert_eq!(paths(&mut c, &reused, "/sub"), ["/sub", "/sub/new"]);
    }
}
