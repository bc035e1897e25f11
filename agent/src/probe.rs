//! Loading and driving the eBPF programs. The only module with `unsafe` (raw `bpf(2)`
//! calls for what aya 0.14 does not expose: cgroup iterator links with options, link
//! information, freezing maps; and two libc queries, [`clock_nanos`] and [`heap_in_use`]).
//!
//! Guarding against other processes (see docs/design/collection.md, "Faults"): the records
//! map and the walk counters are frozen (no user-space writes, by anyone); each walk checks
//! that its link still runs our program ([`ProbeError::LinkReplaced`]) and that every
//! record it copied belongs to it ([`ProbeError::ForeignRecord`]).

#![allow(unsafe_code)]

use std::{
    fs::File,
    io::Read,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::{Path, PathBuf},
};

use aya::{
    programs::{BtfTracePoint, Iter},
    Btf, Ebpf, EbpfLoader,
};
use kpulse_common::{globals, CgroupRecord, WalkEnd, BIRTHS_MAP, RECORDS_MAP, RECORD_VERSION};

use crate::kernel_layout::{KernelLayout, LayoutError};

/// The object built by `cargo xtask build-ebpf`, embedded at compile time when present.
#[cfg(kpulse_embedded_ebpf)]
static EMBEDDED: Option<&[u8]> = Some(aya::include_bytes_aligned!(env!("KPULSE_EBPF_OBJECT_PATH")));
#[cfg(not(kpulse_embedded_ebpf))]
static EMBEDDED: Option<&[u8]> = None;

/// The scheduler-path program's map.
const SCHED_MAP: &str = "SCHED_CPU_NS";

/// The object's zero-initialised globals (the walk's counters).
const BSS_MAP: &str = ".bss";

/// Where the kernel's BTF lives.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Why eBPF is not available or failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The agent was built without the eBPF object and none was given.
    #[error("this agent was built without the eBPF object: run `cargo xtask build-ebpf` and rebuild, or pass --ebpf-object")]
    NotBuilt,
    /// The object file could not be read.
    #[error("cannot read eBPF object {path}")]
    ReadObject {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The kernel has no BTF.
    #[error("kernel BTF {KERNEL_BTF} is missing (kernel built without CONFIG_DEBUG_INFO_BTF)")]
    NoBtf,
    /// Offsets could not be computed.
    #[error("kernel layout")]
    Layout(#[from] LayoutError),
    /// aya failed to parse or load.
    #[error("loading the eBPF object")]
    Load(#[from] aya::EbpfError),
    /// A program failed to load or attach (verifier, permissions).
    #[error("program {name}")]
    Program {
        /// Program name.
        name: &'static str,
        /// The cause, including the verifier log.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// The object lacks a program.
    #[error("the eBPF object has no program {0}")]
    MissingProgram(&'static str),
    /// A bpf(2) call failed.
    #[error("{call} on {what}")]
    Syscall {
        /// The call.
        call: &'static str,
        /// What it was for.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The iterator output did not parse.
    #[error("iterator output: {0}")]
    Output(String),
    /// Another process replaced the program of one of our iterator links
    /// (`BPF_LINK_UPDATE`): the link would run a program that is not ours.
    #[error(
        "the iterator link {link} over {dir} runs program {found}, not ours ({ours}): \
         another process replaced it"
    )]
    LinkReplaced {
        /// The link's kernel id.
        link: u32,
        /// The subtree the link walks.
        dir: PathBuf,
        /// The program the link runs now.
        found: u32,
        /// Our program.
        ours: u32,
    },
    /// The cgroup a link walks was removed (a link holds the cgroup, not its path) and
    /// linking its path again found nothing live either.
    #[error("the cgroup {} is not live (removed while linked?)", dir.display())]
    CgroupGone {
        /// The subtree's root directory.
        dir: PathBuf,
    },
    /// A record of the records map was overwritten by another walk (another process ran an
    /// iterator of our link at the same time) before it was copied.
    #[error("{what}: record {index} of {visited} was overwritten by another walk")]
    ForeignRecord {
        /// The walk.
        what: String,
        /// The record's index.
        index: usize,
        /// Records of the walk.
        visited: u64,
    },
    /// A map could not be read.
    #[error("map {name}")]
    Map {
        /// Map name.
        name: &'static str,
        /// The cause.
        #[source]
        source: aya::maps::MapError,
    },
}

/// The loaded `cgroup_stats` iterator program and its records map, mapped read-only.
pub struct CgroupIter {
    ebpf: Ebpf,
    layout: KernelLayout,
    records: RecordsMap,
    buf: Vec<u8>,
    /// `cgroup_stats`' kernel id: what each of our links must run.
    prog_id: u32,
    /// `tp_btf/cgroup_mkdir` attached, or why not.
    births: Result<(), String>,
}

/// The `BPF_F_MMAPABLE` records array, mapped into this process: `regions` regions of
/// `len` records (see [`WalkEnd::region`]).
struct RecordsMap {
    ptr: *const CgroupRecord,
    len: usize,
    regions: usize,
    bytes: usize,
}

// SAFETY: the mapping is read-only from this side and owned by one CgroupIter.
unsafe impl Send for RecordsMap {}

impl Drop for RecordsMap {
    fn drop(&mut self) {
        // SAFETY: ptr/bytes are exactly what mmap returned; nothing borrows the mapping
        // past the CgroupIter that owns it.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.bytes);
        }
    }
}

/// What one walk saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkStats {
    /// Cgroups the kernel visited.
    pub visited: u64,
    /// Of those, the ones the map could not hold (dropped).
    pub dropped: u64,
}

impl std::fmt::Debug for CgroupIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CgroupIter")
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

/// Reads the object: a given file, else the embedded one.
pub fn object_bytes(path: Option<&Path>) -> Result<Vec<u8>, ProbeError> {
    match path {
        Some(p) => std::fs::read(p).map_err(|source| ProbeError::ReadObject {
            path: p.to_path_buf(),
            source,
        }),
        None => EMBEDDED.map(<[u8]>::to_vec).ok_or(ProbeError::NotBuilt),
    }
}

fn prog_err(name: &'static str) -> impl FnOnce(aya::programs::ProgramError) -> ProbeError {
    move |source| ProbeError::Program { name, source }
}

/// Parses and loads the object's maps with the kernel offsets set and the maps sized
/// for the program the caller will load (the other program's maps get one entry: every
/// map of an object is created, used or not).
fn open_object(
    object: &[u8],
    btf: &Btf,
    layout: &KernelLayout,
    records: &RecordsLayout,
    births: u32,
    sched_cgroups: u32,
    signals: &SignalGlobals,
) -> Result<Ebpf, ProbeError> {
    let mut loader = EbpfLoader::new();
    loader.btf(Some(btf));
    loader.map_max_entries(RECORDS_MAP, records.entries());
    loader
        .override_global(globals::RECORDS_PER_REGION, &records.per_region, true)
        .override_global(
            globals::SECOND_REGION_HIERARCHY,
            &records.second_region_hierarchy,
            true,
        )
        .override_global(
            globals::THIRD_REGION_HIERARCHY,
            &records.third_region_hierarchy,
            true,
        );
    loader.map_max_entries(BIRTHS_MAP, births);
    loader.map_max_entries(SCHED_MAP, sched_cgroups);
    loader_with_layout(&mut loader, layout);
    loader
        .override_global(globals::READ_SIGNALS, &signals.read, true)
        .override_global(globals::CGROUP_PSI, &signals.cgroup_psi, true)
        .override_global(globals::PSI_CPU_SOME, &signals.psi_cpu_some, true)
        .override_global(globals::PSI_MEMORY_SOME, &signals.psi_memory_some, true)
        .override_global(globals::PSI_ENABLED, &signals.psi_enabled, true)
        .override_global(globals::PSI_AVG_CPU_SOME, &signals.psi_avg_cpu_some, true)
        .override_global(
            globals::PSI_AVG_MEMORY_SOME,
            &signals.psi_avg_memory_some,
            true,
        )
        .override_global(globals::PSI_AVG_LAST_UPDATE, &signals.psi_avg_at, true)
        .override_global(globals::CGROUP_CPU_CSS, &signals.cgroup_cpu_css, true)
        .override_global(globals::TG_QUOTA, &signals.tg_quota, true)
        .override_global(globals::TG_NR_PERIODS, &signals.tg_nr_periods, true);
    Ok(loader.load(object)?)
}

fn loader_with_layout<'a>(loader: &mut EbpfLoader<'a>, l: &'a KernelLayout) {
    loader
        .override_global(globals::CGROUP_KN, &l.cgroup_kn, true)
        .override_global(globals::KN_ID, &l.kn_id, true)
        .override_global(globals::KN_NAME, &l.kn_name, true)
        .override_global(globals::CSS_PARENT, &l.css_parent, true)
        .override_global(globals::CSS_CGROUP, &l.css_cgroup, true)
        .override_global(globals::CGROUP_LEVEL, &l.cgroup_level, true)
        .override_global(globals::CGROUP_CPU, &l.cgroup_cpu, true)
        .override_global(globals::CGROUP_MEMCG, &l.cgroup_memcg, true)
        .override_global(globals::MEMCG_USAGE, &l.memcg_usage, true)
        .override_global(globals::MEMCG_SWAP, &l.memcg_swap, true)
        .override_global(globals::MEMCG_VMSTATS, &l.memcg_vmstats, true)
        .override_global(globals::VMSTATS_IS_PTR, &l.vmstats_is_ptr, true)
        .override_global(
            globals::VMSTATS_INACTIVE_FILE,
            &l.vmstats_inactive_file,
            true,
        )
        .override_global(globals::VMSTATS_ANON, &l.vmstats_anon, true)
        .override_global(globals::CGROUP_ROOT, &l.cgroup_root, true)
        .override_global(globals::ROOT_HIERARCHY_ID, &l.root_hierarchy_id, true);
}

/// Signals the walk reads besides CPU and memory, for `custom.metrics.k8s.io`: off unless
/// asked for (they cost loads on every cgroup of every walk).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Signals {
    /// PSI `some` totals of CPU and memory (cgroup v2 only).
    pub pressure: bool,
    /// CFS bandwidth counters of cgroups with a quota.
    pub throttling: bool,
}

/// The values of the signal globals (see `kpulse_common::globals::READ_SIGNALS`): what the
/// agent asked for and this kernel has, with the offsets to read it at.
#[derive(Debug, Default)]
struct SignalGlobals {
    read: u64,
    cgroup_psi: u64,
    psi_cpu_some: u64,
    psi_memory_some: u64,
    psi_enabled: u64,
    psi_avg_cpu_some: u64,
    psi_avg_memory_some: u64,
    psi_avg_at: u64,
    cgroup_cpu_css: u64,
    tg_quota: u64,
    tg_nr_periods: u64,
}

impl SignalGlobals {
    /// `psi_on`: the kernel keeps pressure stall information now (it has [`PROC_PRESSURE`]).
    fn new(wanted: Signals, layout: &KernelLayout, psi_on: bool) -> SignalGlobals {
        let mut g = SignalGlobals {
            psi_enabled: u64::MAX,
            ..SignalGlobals::default()
        };
        if wanted.pressure {
            match layout.psi {
                Some(_) if !psi_on => tracing::warn!(
                    "pressure stall information asked for, but PSI is off in this kernel \
                     (no {PROC_PRESSURE}; boot with psi=1): no pressure figures"
                ),
                Some(p) => {
                    g.read |= kpulse_common::READ_PSI;
                    g.cgroup_psi = p.cgroup_psi;
                    g.psi_cpu_some = p.cpu_some;
                    g.psi_memory_some = p.memory_some;
                    g.psi_enabled = p.enabled;
                    g.psi_avg_cpu_some = p.avg_cpu_some;
                    g.psi_avg_memory_some = p.avg_memory_some;
                    g.psi_avg_at = p.avg_at;
                }
                // The reason was logged with the layout.
                None => {}
            }
        }
        if let (true, Some(c)) = (wanted.throttling, layout.cfs) {
            g.read |= kpulse_common::READ_CFS;
            g.cgroup_cpu_css = c.cgroup_cpu_css;
            g.tg_quota = c.quota;
            g.tg_nr_periods = c.nr_periods;
        }
        g
    }
}

/// The v1 hierarchies of a hybrid node walked besides the CPU one, by hierarchy id: each
/// gets a region of the records map of its own (see [`WalkEnd::region`]), so that every
/// slot is rewritten by one hierarchy's walks and keeps its name between them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtraRegions {
    /// The `memory` hierarchy (region 1).
    pub memory: Option<u32>,
    /// The `cpu` hierarchy, walked for CFS counters (region 2; only with a memory one).
    pub cfs: Option<u32>,
}

/// Present when the kernel keeps pressure stall information (`CONFIG_PSI` and not `psi=0`).
const PROC_PRESSURE: &str = "/proc/pressure/cpu";

/// The records map's regions, as the loader sets them (see [`WalkEnd::region`]).
struct RecordsLayout {
    per_region: u64,
    /// `u64::MAX`: none.
    second_region_hierarchy: u64,
    /// `u64::MAX`: none.
    third_region_hierarchy: u64,
}

impl RecordsLayout {
    fn new(max_cgroups: u32, extra: ExtraRegions) -> RecordsLayout {
        RecordsLayout {
            per_region: u64::from(max_cgroups.max(1)),
            second_region_hierarchy: extra.memory.map_or(u64::MAX, u64::from),
            third_region_hierarchy: extra.cfs.map_or(u64::MAX, u64::from),
        }
    }

    fn regions(&self) -> u32 {
        if self.third_region_hierarchy != u64::MAX {
            3
        } else if self.second_region_hierarchy != u64::MAX {
            2
        } else {
            1
        }
    }

    fn entries(&self) -> u32 {
        u32::try_from(self.per_region * u64::from(self.regions())).unwrap_or(u32::MAX)
    }
}

impl CgroupIter {
    /// Computes the kernel layout, loads the object and the `cgroup_stats` program, with
    /// room for `max_cgroups` records per walk. Every failure is a typed reason the caller
    /// can log before falling back.
    pub fn load(object: &[u8], max_cgroups: u32) -> Result<CgroupIter, ProbeError> {
        Self::load_with(
            object,
            max_cgroups,
            None,
            ExtraRegions::default(),
            Signals::default(),
        )
    }

    /// Like [`CgroupIter::load`] with offsets given by the caller (tests of the checks
    /// that guard against a wrong layout).
    pub fn load_with_layout(
        object: &[u8],
        max_cgroups: u32,
        layout: KernelLayout,
    ) -> Result<CgroupIter, ProbeError> {
        Self::load_with(
            object,
            max_cgroups,
            Some(layout),
            ExtraRegions::default(),
            Signals::default(),
        )
    }

    /// The general form: offsets computed from the running kernel's BTF when `layout` is
    /// `None`; walks of the `extra` hierarchies (a hybrid node's v1 ones, walked as well as
    /// the CPU one) write regions of their own. The walk also reads the `signals` this
    /// kernel has.
    pub fn load_with(
        object: &[u8],
        max_cgroups: u32,
        layout: Option<KernelLayout>,
        extra: ExtraRegions,
        signals: Signals,
    ) -> Result<CgroupIter, ProbeError> {
        let layout = match layout {
            Some(l) => l,
            None => {
                if !Path::new(KERNEL_BTF).exists() {
                    return Err(ProbeError::NoBtf);
                }
                KernelLayout::from_file(Path::new(KERNEL_BTF))?
            }
        };
        let btf = Btf::from_sys_fs().map_err(|_| ProbeError::NoBtf)?;
        let regions = RecordsLayout::new(max_cgroups, extra);
        let signal_globals =
            SignalGlobals::new(signals, &layout, Path::new(PROC_PRESSURE).exists());
        let mut ebpf = open_object(
            object,
            &btf,
            &layout,
            &regions,
            kpulse_common::BIRTHS_MAX,
            1,
            &signal_globals,
        )?;
        let records = map_records(&ebpf, max_cgroups.max(1), regions.regions())?;
        let prog: &mut Iter = ebpf
            .program_mut("cgroup_stats")
            .ok_or(ProbeError::MissingProgram("cgroup_stats"))?
            .try_into()
            .map_err(prog_err("cgroup_stats"))?;
        prog.load("cgroup", &btf)
            .map_err(prog_err("cgroup_stats"))?;
        let prog_id = prog.info().map_err(prog_err("cgroup_stats"))?.id();
        // Start times are an addition: without them a new container's first value waits
        // for its second sample, so a failure here is reported, not fatal.
        let births = attach_births(&mut ebpf, &btf).map_err(|e| kpulse_process::error_chain(&e));
        // No process may write the records, the walk counters or the creation instants
        // from user space (by map id, with BPF_MAP_UPDATE_ELEM or a writable mmap); the
        // programs still can.
        for name in [RECORDS_MAP, BSS_MAP, BIRTHS_MAP] {
            freeze(&ebpf, name)?;
        }
        Ok(CgroupIter {
            ebpf,
            layout,
            records,
            buf: vec![0; 4096],
            prog_id,
            births,
        })
    }

    /// Why cgroup creation instants are not recorded, if they are not
    /// (`tp_btf/cgroup_mkdir` failed to load or attach).
    pub fn births_error(&self) -> Option<&str> {
        self.births.as_ref().err().map(String::as_str)
    }

    /// When the default-hierarchy cgroup `id` was made, in nanoseconds of the boot clock
    /// (`CLOCK_BOOTTIME`), if it was made while this program was attached and is still
    /// remembered.
    pub fn birth(&self, id: u64) -> Option<u64> {
        self.births.as_ref().ok()?;
        let map = self.ebpf.map(BIRTHS_MAP)?;
        let map: aya::maps::HashMap<_, u64, u64> = aya::maps::HashMap::try_from(map).ok()?;
        map.get(&id, 0).ok()
    }

    /// The program's kernel id.
    pub fn program_id(&self) -> Option<u32> {
        Some(self.prog_id)
    }

    /// Kernel ids of the maps this iterator's program uses (records, counters, offsets).
    pub fn map_ids(&self) -> Vec<u32> {
        self.ebpf
            .maps()
            .filter_map(|(_, m)| map_data(m).and_then(|d| d.info().ok()).map(|i| i.id()))
            .collect()
    }

    /// How many records the map holds.
    pub fn capacity(&self) -> usize {
        self.records.len
    }

    /// Runs the iterator of `link` once and copies its records into `out` (cleared first).
    pub fn walk(
        &mut self,
        link: &IterLink,
        out: &mut Vec<CgroupRecord>,
    ) -> Result<WalkStats, ProbeError> {
        out.clear();
        let what = || format!("cgroup iterator over {}", link.dir.display());
        let fd = sys::iter_create(link.link.as_raw_fd()).map_err(|source| ProbeError::Syscall {
            call: "BPF_ITER_CREATE",
            what: what(),
            source,
        })?;
        // The session runs the program the link held when the iterator was created: if that
        // is still ours now, the walk is ours (a replacement in between is caught here or
        // by the session check below).
        let found = sys::link_info(link.link.as_raw_fd())
            .map_err(|source| ProbeError::Syscall {
                call: "BPF_OBJ_GET_INFO_BY_FD",
                what: what(),
                source,
            })?
            .prog_id;
        if found != self.prog_id {
            return Err(ProbeError::LinkReplaced {
                link: link.id,
                dir: link.dir.clone(),
                found,
                ours: self.prog_id,
            });
        }
        let mut file = File::from(fd);
        let mut got = 0usize;
        loop {
            if got == self.buf.len() {
                return Err(ProbeError::Output(format!(
                    "{}: more output than expected",
                    what()
                )));
            }
            match file.read(&mut self.buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(ProbeError::Syscall {
                        call: "read",
                        what: what(),
                        source,
                    })
                }
            }
        }
        if got != std::mem::size_of::<WalkEnd>() {
            return Err(ProbeError::Output(format!(
                "{}: {got} bytes of output, expected one {}-byte walk summary",
                what(),
                std::mem::size_of::<WalkEnd>()
            )));
        }
        // SAFETY: WalkEnd is plain old data of exactly `got` bytes; unaligned read.
        let end = unsafe { std::ptr::read_unaligned(self.buf.as_ptr().cast::<WalkEnd>()) };
        if end.version != RECORD_VERSION {
            return Err(version_mismatch(end.version));
        }
        let visited = end.count;
        let region = end.region as usize;
        if region >= self.records.regions {
            return Err(ProbeError::Output(format!(
                "{}: the walk wrote region {region} of {}",
                what(),
                self.records.regions
            )));
        }
        // SAFETY: region < regions: the region's first record is inside the mapping.
        let base = unsafe { self.records.ptr.add(region * self.records.len) };
        let held = usize::try_from(visited)
            .unwrap_or(usize::MAX)
            .min(self.records.len);
        out.reserve(held);
        for i in 0..held {
            // SAFETY: i < len, inside the region; records are plain old data, and the walk
            // that wrote them finished before read() returned end of file.
            let r = unsafe { std::ptr::read_volatile(base.add(i)) };
            if r.version != RECORD_VERSION {
                return Err(ProbeError::Output(format!(
                    "{}: record {i} of {visited}: {}",
                    what(),
                    version_mismatch(r.version)
                )));
            }
            if r.session != end.session {
                return Err(ProbeError::ForeignRecord {
                    what: what(),
                    index: i,
                    visited,
                });
            }
            out.push(r);
        }
        // Another walk of this link (a process that got it by id) may have rewritten
        // records while they were copied: every record must still be this walk's.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        for i in 0..held {
            // SAFETY: as above; only the session field is read.
            let session =
                unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*base.add(i)).session)) };
            if session != end.session {
                return Err(ProbeError::ForeignRecord {
                    what: what(),
                    index: i,
                    visited,
                });
            }
        }
        Ok(WalkStats {
            visited,
            dropped: visited - held as u64,
        })
    }

    /// The offsets in use.
    pub fn layout(&self) -> &KernelLayout {
        &self.layout
    }

    /// Creates an iterator link over the cgroup directory `dir` and its descendants,
    /// parents first. Keep the link and pass it to [`CgroupIter::walk`] once per cycle.
    pub fn link(&self, dir: &Path) -> Result<IterLink, ProbeError> {
        let prog: &Iter = self
            .ebpf
            .program("cgroup_stats")
            .ok_or(ProbeError::MissingProgram("cgroup_stats"))?
            .try_into()
            .map_err(prog_err("cgroup_stats"))?;
        let prog_fd = prog.fd().map_err(prog_err("cgroup_stats"))?;
        let cgroup_dir = File::open(dir).map_err(|source| ProbeError::Syscall {
            call: "open",
            what: dir.display().to_string(),
            source,
        })?;
        let link = sys::link_create_cgroup_iter(
            prog_fd.as_fd().as_raw_fd(),
            cgroup_dir.as_raw_fd(),
            sys::BPF_CGROUP_ITER_DESCENDANTS_PRE,
        )
        .map_err(|source| ProbeError::Syscall {
            call: "BPF_LINK_CREATE",
            what: dir.display().to_string(),
            source,
        })?;
        let info = sys::link_info(link.as_raw_fd()).map_err(|source| ProbeError::Syscall {
            call: "BPF_OBJ_GET_INFO_BY_FD",
            what: dir.display().to_string(),
            source,
        })?;
        Ok(IterLink {
            link,
            dir: dir.to_path_buf(),
            id: info.id,
        })
    }
}

/// An attached cgroup iterator over one subtree.
#[derive(Debug)]
pub struct IterLink {
    link: OwnedFd,
    dir: PathBuf,
    id: u32,
}

impl IterLink {
    /// The subtree's root directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The link's kernel id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The id of the program the link runs now (ours, unless another process replaced it).
    pub fn program_id(&self) -> Result<u32, ProbeError> {
        sys::link_info(self.link.as_raw_fd())
            .map(|i| i.prog_id)
            .map_err(|source| ProbeError::Syscall {
                call: "BPF_OBJ_GET_INFO_BY_FD",
                what: format!("iterator link {}", self.id),
                source,
            })
    }
}

fn version_mismatch(v: u32) -> ProbeError {
    ProbeError::Output(format!(
        "record version {v} (this agent reads {RECORD_VERSION}): agent and eBPF object differ"
    ))
}

/// A clock [`clock_nanos`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockId {
    /// `CLOCK_REALTIME`: the wall clock, which may step.
    Realtime,
    /// `CLOCK_BOOTTIME`: time since boot, suspend included; never steps.
    Boottime,
}

/// Nanoseconds of `clock`; `None` if it cannot be read.
pub fn clock_nanos(clock: ClockId) -> Option<u128> {
    let id = match clock {
        ClockId::Realtime => libc::CLOCK_REALTIME,
        ClockId::Boottime => libc::CLOCK_BOOTTIME,
    };
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime has no other
    // preconditions.
    let rc = unsafe { libc::clock_gettime(id, &mut ts) };
    if rc != 0 {
        return None;
    }
    Some(u128::try_from(ts.tv_sec).ok()? * 1_000_000_000 + u128::try_from(ts.tv_nsec).ok()?)
}

/// Bytes of heap the process has allocated and not freed (glibc's `mallinfo2`: `uordblks`
/// over every arena plus `hblkhd`, the blocks served by `mmap`), unlike the resident size,
/// which keeps what the allocator retains after a peak. `None` where the C library is not
/// glibc. It locks each arena in turn: call it at scrape time, not per allocation.
#[cfg(target_env = "gnu")]
pub fn heap_in_use() -> Option<u64> {
    // SAFETY: mallinfo2 takes no arguments and returns a plain struct by value (glibc ≥ 2.33;
    // the agent's runtime is Debian 12's 2.36).
    let info = unsafe { libc::mallinfo2() };
    u64::try_from(info.uordblks.saturating_add(info.hblkhd)).ok()
}

/// See the glibc version: `None` here.
#[cfg(not(target_env = "gnu"))]
pub fn heap_in_use() -> Option<u64> {
    None
}

/// Clock ticks per second of `/proc/PID/stat` times (`_SC_CLK_TCK`, 100 on Linux).
pub fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(v).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// The kernel's page size (memcg counters are in pages).
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(v).unwrap_or(4096)
}

/// Loads and attaches `tp_btf/cgroup_mkdir`, which fills [`BIRTHS_MAP`].
fn attach_births(ebpf: &mut Ebpf, btf: &Btf) -> Result<(), ProbeError> {
    let prog: &mut BtfTracePoint = ebpf
        .program_mut("cgroup_mkdir")
        .ok_or(ProbeError::MissingProgram("cgroup_mkdir"))?
        .try_into()
        .map_err(prog_err("cgroup_mkdir"))?;
    prog.load("cgroup_mkdir", btf)
        .map_err(prog_err("cgroup_mkdir"))?;
    prog.attach().map_err(prog_err("cgroup_mkdir"))?;
    Ok(())
}

/// The [`aya::maps::MapData`] behind any map kind this agent's objects have.
fn map_data(m: &aya::maps::Map) -> Option<&aya::maps::MapData> {
    use aya::maps::Map;
    match m {
        Map::Array(d)
        | Map::PerCpuArray(d)
        | Map::HashMap(d)
        | Map::LruHashMap(d)
        | Map::PerCpuHashMap(d) => Some(d),
        _ => None,
    }
}

/// `BPF_MAP_FREEZE` on the object's map `name`: no more writes from user space.
fn freeze(ebpf: &Ebpf, name: &'static str) -> Result<(), ProbeError> {
    let data = ebpf
        .map(name)
        .and_then(map_data)
        .ok_or(ProbeError::MissingProgram(name))?;
    sys::map_freeze(data.fd().as_fd().as_raw_fd()).map_err(|source| ProbeError::Syscall {
        call: "BPF_MAP_FREEZE",
        what: name.into(),
        source,
    })
}

fn map_records(ebpf: &Ebpf, len: u32, regions: u32) -> Result<RecordsMap, ProbeError> {
    let map = ebpf
        .map(RECORDS_MAP)
        .ok_or(ProbeError::MissingProgram("CGROUP_RECORDS"))?;
    let aya::maps::Map::Array(data) = map else {
        return Err(ProbeError::Output(format!("{RECORDS_MAP} is not an array")));
    };
    let len = len as usize;
    let regions = regions as usize;
    let page = usize::try_from(page_size()).unwrap_or(4096);
    let bytes = (len * regions * std::mem::size_of::<CgroupRecord>()).div_ceil(page) * page;
    // SAFETY: mapping a BPF_F_MMAPABLE array read-only and shared; the kernel checks the
    // length against the map, and the result is checked before use.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ,
            libc::MAP_SHARED,
            data.fd().as_fd().as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(ProbeError::Syscall {
            call: "mmap",
            what: RECORDS_MAP.into(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(RecordsMap {
        ptr: ptr as *const CgroupRecord,
        len,
        regions,
        bytes,
    })
}

/// The scheduler-path program, for measurements only (see docs/design/collection.md).
pub struct SchedSwitch {
    ebpf: Ebpf,
}

impl SchedSwitch {
    /// Loads and attaches `tp_btf/sched_switch`.
    pub fn attach(object: &[u8]) -> Result<SchedSwitch, ProbeError> {
        let btf = Btf::from_sys_fs().map_err(|_| ProbeError::NoBtf)?;
        // This program reads no kernel struct: the iterator's offsets stay zero.
        let mut ebpf = open_object(
            object,
            &btf,
            &KernelLayout::default(),
            &RecordsLayout::new(1, ExtraRegions::default()),
            1,
            kpulse_common::SCHED_MAX_CGROUPS,
            &SignalGlobals::default(),
        )?;
        let prog: &mut BtfTracePoint = ebpf
            .program_mut("sched_switch")
            .ok_or(ProbeError::MissingProgram("sched_switch"))?
            .try_into()
            .map_err(prog_err("sched_switch"))?;
        prog.load("sched_switch", &btf)
            .map_err(prog_err("sched_switch"))?;
        prog.attach().map_err(prog_err("sched_switch"))?;
        Ok(SchedSwitch { ebpf })
    }

    /// Total nanoseconds credited to the (v2) cgroup `id`, summed over CPUs.
    pub fn cpu_ns(&self, id: u64) -> Result<u64, ProbeError> {
        let map = self
            .ebpf
            .map(SCHED_MAP)
            .ok_or(ProbeError::MissingProgram(SCHED_MAP))?;
        let map: aya::maps::PerCpuHashMap<_, u64, u64> = aya::maps::PerCpuHashMap::try_from(map)
            .map_err(|source| ProbeError::Map {
                name: SCHED_MAP,
                source,
            })?;
        match map.get(&id, 0) {
            Ok(values) => Ok(values.iter().sum()),
            Err(aya::maps::MapError::KeyNotFound) => Ok(0),
            Err(source) => Err(ProbeError::Map {
                name: SCHED_MAP,
                source,
            }),
        }
    }

    /// The program's kernel id (for `kernel.bpf_stats_enabled` run time/count).
    pub fn program_id(&self) -> Option<u32> {
        let prog = self.ebpf.program("sched_switch")?;
        prog.info().ok().map(|i| i.id())
    }
}

/// Raw `bpf(2)` calls aya 0.14 does not offer.
mod sys {
    use std::os::fd::{FromRawFd, OwnedFd, RawFd};

    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    const BPF_MAP_FREEZE: libc::c_long = 22;
    const BPF_LINK_CREATE: libc::c_long = 28;
    const BPF_ITER_CREATE: libc::c_long = 33;
    const BPF_TRACE_ITER: u32 = 28;
    /// `enum bpf_cgroup_iter_order`: walk descendants, parents first.
    pub const BPF_CGROUP_ITER_DESCENDANTS_PRE: u32 = 2;

    /// `union bpf_iter_link_info`'s cgroup member.
    #[repr(C)]
    #[derive(Default)]
    struct CgroupIterInfo {
        order: u32,
        cgroup_fd: u32,
        cgroup_id: u64,
    }

    /// The `BPF_LINK_CREATE` part of `union bpf_attr`, padded to a safe size.
    #[repr(C)]
    #[derive(Default)]
    struct LinkCreateAttr {
        prog_fd: u32,
        target_fd: u32,
        attach_type: u32,
        flags: u32,
        iter_info: u64,
        iter_info_len: u32,
        _pad: [u32; 25],
    }

    #[repr(C)]
    #[derive(Default)]
    struct IterCreateAttr {
        link_fd: u32,
        flags: u32,
        _pad: [u64; 6],
    }

    /// The `BPF_OBJ_GET_INFO_BY_FD` part of `union bpf_attr`.
    #[repr(C)]
    #[derive(Default)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
        _pad: [u64; 4],
    }

    /// The head of `struct bpf_link_info` and its iterator member (the kernel fills what
    /// fits in the length given).
    #[repr(C)]
    #[derive(Default, Debug, Clone, Copy)]
    pub struct LinkInfo {
        pub type_: u32,
        pub id: u32,
        pub prog_id: u32,
        _pad: u32,
        target_name: u64,
        target_name_len: u32,
        map_id: u32,
        pub cgroup_id: u64,
        pub order: u32,
        _pad2: u32,
    }

    /// The `BPF_MAP_FREEZE` part of `union bpf_attr`.
    #[repr(C)]
    #[derive(Default)]
    struct MapFdAttr {
        map_fd: u32,
        _pad: [u32; 15],
    }

    /// `bpf(2)` itself: the kernel's return value, or the error it set.
    fn bpf_raw<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
        // SAFETY: `attr` is a properly initialised #[repr(C)] struct that outlives the call,
        // and its size is passed along; the kernel writes only through pointers inside
        // `attr` that the caller made point at live, large-enough buffers.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                attr as *mut T,
                std::mem::size_of::<T>() as libc::c_uint,
            )
        };
        if ret < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ret)
    }

    /// `bpf(2)` for the commands that return 0 on success, not a file descriptor.
    fn bpf_unit<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<()> {
        bpf_raw(cmd, attr).map(|_| ())
    }

    /// What the kernel says about link `fd`: its id and the program it runs now.
    pub fn link_info(fd: RawFd) -> std::io::Result<LinkInfo> {
        let mut info = LinkInfo::default();
        let mut attr = InfoAttr {
            bpf_fd: fd as u32,
            info_len: std::mem::size_of::<LinkInfo>() as u32,
            info: &mut info as *mut LinkInfo as u64,
            ..Default::default()
        };
        bpf_unit(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
        Ok(info)
    }

    pub fn map_freeze(fd: RawFd) -> std::io::Result<()> {
        let mut attr = MapFdAttr {
            map_fd: fd as u32,
            ..Default::default()
        };
        bpf_unit(BPF_MAP_FREEZE, &mut attr)
    }

    /// `bpf(2)` for the commands that return a new file descriptor.
    fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<OwnedFd> {
        let ret = bpf_raw(cmd, attr)?;
        let fd = RawFd::try_from(ret).map_err(|_| std::io::Error::other("fd out of range"))?;
        // SAFETY: the kernel returned a new file descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub fn link_create_cgroup_iter(
        prog_fd: RawFd,
        cgroup_fd: RawFd,
        order: u32,
    ) -> std::io::Result<OwnedFd> {
        let info = CgroupIterInfo {
            order,
            cgroup_fd: cgroup_fd as u32,
            cgroup_id: 0,
        };
        let mut attr = LinkCreateAttr {
            prog_fd: prog_fd as u32,
            attach_type: BPF_TRACE_ITER,
            iter_info: &info as *const CgroupIterInfo as u64,
            iter_info_len: std::mem::size_of::<CgroupIterInfo>() as u32,
            ..Default::default()
        };
        bpf(BPF_LINK_CREATE, &mut attr)
    }

    pub fn iter_create(link_fd: RawFd) -> std::io::Result<OwnedFd> {
        let mut attr = IterCreateAttr {
            link_fd: link_fd as u32,
            ..Default::default()
        };
        bpf(BPF_ITER_CREATE, &mut attr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel_layout::{CfsLayout, PsiLayout};

    fn layout(psi: bool, cfs: bool) -> KernelLayout {
        KernelLayout {
            psi: psi.then_some(PsiLayout {
                cgroup_psi: 1,
                cpu_some: 2,
                memory_some: 3,
                enabled: 4,
                avg_cpu_some: 12,
                avg_memory_some: 13,
                avg_at: 14,
            }),
            cfs: cfs.then_some(CfsLayout {
                cgroup_cpu_css: 5,
                quota: 6,
                nr_periods: 7,
                nr_throttled: 11,
            }),
            ..KernelLayout::default()
        }
    }

    /// The walk reads a signal only when it was asked for, the kernel's BTF has it and, for
    /// PSI, the running kernel keeps it; otherwise the bit stays clear and no figure is made
    /// (absent, never 0).
    #[test]
    fn signals_read_only_when_asked_for_and_available() {
        let both = Signals {
            pressure: true,
            throttling: true,
        };
        let g = SignalGlobals::new(both, &layout(true, true), true);
        assert_eq!(g.read, kpulse_common::READ_PSI | kpulse_common::READ_CFS);
        assert_eq!((g.cgroup_psi, g.psi_cpu_some, g.psi_memory_some), (1, 2, 3));
        assert_eq!(g.psi_enabled, 4);
        assert_eq!(
            (g.psi_avg_cpu_some, g.psi_avg_memory_some, g.psi_avg_at),
            (12, 13, 14)
        );
        assert_eq!((g.cgroup_cpu_css, g.tg_quota, g.tg_nr_periods), (5, 6, 7));

        let off = SignalGlobals::new(Signals::default(), &layout(true, true), true);
        assert_eq!(off.read, 0);
        // Booted with psi=0: no PSI, throttling still read.
        let psi_off = SignalGlobals::new(both, &layout(true, true), false);
        assert_eq!(psi_off.read, kpulse_common::READ_CFS);
        // Not in this kernel's BTF.
        let none = SignalGlobals::new(both, &layout(false, false), true);
        assert_eq!(none.read, 0);
        assert_eq!(none.psi_enabled, u64::MAX);
    }
}
