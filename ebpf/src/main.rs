//! kpulse's eBPF programs. No pods, no policy: kernel counters in, records out.
//!
//! - `cgroup_stats` (`iter/cgroup`): walks a cgroup hierarchy and copies each cgroup's
//!   own CPU and memory counters into a [`CgroupRecord`]. Nothing runs on any hot
//!   path: the kernel already keeps these counters, we only read them.
//! - `cgroup_mkdir` (`tp_btf/cgroup_mkdir`): notes the boot-clock instant each cgroup of
//!   the default (v2) hierarchy is made, the instant its counters were zero. The agent
//!   reads it as a new container's start time: no process IDs, so it works from the
//!   agent's own PID namespace. Runs only when a cgroup is created.
//! - `sched_switch` (`tp_btf/sched_switch`): the scheduler-path alternative, kept to
//!   measure against (see docs/design/collection.md); the agent does not attach it
//!   in normal operation.
//!
//! Rust eBPF has no CO-RE relocations, so struct offsets are globals written by the
//! loader from the running kernel's BTF.
#![no_std]
#![no_main]
#![allow(unsafe_code)]

use core::ptr::read_volatile;

use aya_ebpf::{
    bindings::BPF_F_MMAPABLE,
    helpers::{
        bpf_get_current_cgroup_id, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes,
        generated::{bpf_ktime_get_boot_ns, bpf_seq_write},
    },
    macros::{btf_tracepoint, map},
    maps::{Array, LruHashMap, PerCpuArray, PerCpuHashMap},
    programs::BtfTracePointContext,
};
use kpulse_common::{
    CgroupRecord, WalkEnd, FLAG_CFS, FLAG_CFS_QUOTA, FLAG_MEMCG, FLAG_NAME_KEPT,
    FLAG_NAME_TRUNCATED, FLAG_PSI, FLAG_READ_ERROR, NAME_LEN, READ_CFS, READ_PSI, RECORD_VERSION,
    SCHED_MAX_CGROUPS,
};

/// Live cgroups visited so far in session [`WALK_SESSION`]. `seq_num` cannot serve: at the
/// final call it is the last object's index (one object and none look alike), and it
/// also counts dying cgroups, for which the kernel does not call the program.
static mut WALK_VISITED: u64 = 0;
/// The session [`WALK_VISITED`] counts.
static mut WALK_SESSION: u64 = 0;
/// The region session [`WALK_SESSION`] writes (see `WalkEnd::region`).
static mut WALK_REGION: u64 = 0;

/// Records of the current walk, indexed by visit order. The loader sets the size.
#[map]
static CGROUP_RECORDS: Array<CgroupRecord> = Array::with_max_entries(1, BPF_F_MMAPABLE);

// Offsets into kernel structs, written by the loader (see kpulse_common::globals).
#[no_mangle]
static OFF_CGROUP_KN: u64 = 0;
#[no_mangle]
static OFF_KN_ID: u64 = 0;
#[no_mangle]
static OFF_KN_NAME: u64 = 0;
#[no_mangle]
static OFF_CSS_PARENT: u64 = 0;
#[no_mangle]
static OFF_CSS_CGROUP: u64 = 0;
#[no_mangle]
static OFF_CGROUP_LEVEL: u64 = 0;
#[no_mangle]
static OFF_CGROUP_CPU: u64 = 0;
#[no_mangle]
static OFF_CGROUP_MEMCG: u64 = 0;
#[no_mangle]
static OFF_MEMCG_USAGE: u64 = 0;
#[no_mangle]
static OFF_MEMCG_SWAP: u64 = 0;
#[no_mangle]
static OFF_MEMCG_VMSTATS: u64 = 0;
#[no_mangle]
static VMSTATS_IS_PTR: u64 = 0;
#[no_mangle]
static OFF_VMSTATS_INACTIVE_FILE: u64 = 0;
#[no_mangle]
static OFF_VMSTATS_ANON: u64 = 0;
#[no_mangle]
static OFF_CGROUP_ROOT: u64 = 0;
#[no_mangle]
static OFF_ROOT_HIERARCHY_ID: u64 = 0;
#[no_mangle]
static OFF_CGROUP_PSI: u64 = 0;
#[no_mangle]
static OFF_PSI_CPU_SOME: u64 = 0;
#[no_mangle]
static OFF_PSI_MEMORY_SOME: u64 = 0;
#[no_mangle]
static OFF_PSI_ENABLED: u64 = u64::MAX;
#[no_mangle]
static OFF_PSI_AVG_CPU_SOME: u64 = 0;
#[no_mangle]
static OFF_PSI_AVG_MEMORY_SOME: u64 = 0;
#[no_mangle]
static OFF_PSI_AVG_LAST_UPDATE: u64 = 0;
#[no_mangle]
static OFF_CGROUP_CPU_CSS: u64 = 0;
#[no_mangle]
static OFF_TG_QUOTA: u64 = 0;
#[no_mangle]
static OFF_TG_NR_PERIODS: u64 = 0;
/// `READ_PSI` | `READ_CFS`: 0 unless the agent asks for these signals.
#[no_mangle]
static READ_SIGNALS: u64 = 0;
// Written by the loader too: the records map's layout (see `WalkEnd::region`).
#[no_mangle]
static RECORDS_PER_REGION: u64 = 1;
#[no_mangle]
static SECOND_REGION_HIERARCHY: u64 = u64::MAX;
#[no_mangle]
static THIRD_REGION_HIERARCHY: u64 = u64::MAX;

#[inline(always)]
fn global(v: &'static u64) -> u64 {
    // The loader rewrites .rodata before load: the compiler must not fold the zero.
    unsafe { read_volatile(v) }
}

#[inline(always)]
unsafe fn read_u64(base: u64, off: u64) -> Result<u64, i32> {
    unsafe { bpf_probe_read_kernel((base + off) as *const u64) }
}

#[inline(always)]
unsafe fn read_i32(base: u64, off: u64) -> Result<i32, i32> {
    unsafe { bpf_probe_read_kernel((base + off) as *const i32) }
}

/// Context of an `iter/cgroup` program: `struct bpf_iter__cgroup`.
#[repr(C)]
pub struct IterCgroupCtx {
    /// `struct bpf_iter_meta *`.
    pub meta: *const IterMeta,
    /// `struct cgroup *`, NULL on the last call.
    pub cgroup: u64,
}

/// `struct bpf_iter_meta`.
#[repr(C)]
pub struct IterMeta {
    /// Output.
    pub seq: *mut aya_ebpf::bindings::seq_file,
    /// Session.
    pub session_id: u64,
    /// Index of the object in the session.
    pub seq_num: u64,
}

/// Iterator over a cgroup hierarchy: one record of [`CGROUP_RECORDS`] per live cgroup,
/// then one [`WalkEnd`] on the output when the walk is over.
#[unsafe(link_section = "iter/cgroup")]
#[no_mangle]
// Only the kernel calls this, with a valid iterator context; no Rust code can call it.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub extern "C" fn cgroup_stats(ctx: *const IterCgroupCtx) -> i32 {
    let ctx = unsafe { &*ctx };
    let meta = unsafe { &*ctx.meta };
    let cgrp = ctx.cgroup;
    if cgrp == 0 {
        // Final call of the session: report how many cgroups were visited.
        let ours = unsafe { core::ptr::read_volatile(&raw const WALK_SESSION) } == meta.session_id;
        let end = WalkEnd {
            version: RECORD_VERSION,
            region: if ours {
                unsafe { core::ptr::read_volatile(&raw const WALK_REGION) as u32 }
            } else {
                0
            },
            session: meta.session_id,
            count: if ours {
                unsafe { core::ptr::read_volatile(&raw const WALK_VISITED) }
            } else {
                0
            },
        };
        unsafe {
            bpf_seq_write(
                meta.seq,
                &end as *const WalkEnd as *const _,
                core::mem::size_of::<WalkEnd>() as u32,
            );
        }
        return 0;
    }
    // Dense index: the kernel also counts dying cgroups (skipped without calling us) in
    // `seq_num`, so records are numbered by this program's own count of live ones.
    let (index, region) = unsafe {
        if core::ptr::read_volatile(&raw const WALK_SESSION) == meta.session_id {
            (
                core::ptr::read_volatile(&raw const WALK_VISITED),
                core::ptr::read_volatile(&raw const WALK_REGION),
            )
        } else {
            // The walk's first cgroup, its root: the hierarchy decides the region.
            let region = match hierarchy_of(cgrp) {
                Ok(h) if h == global(&SECOND_REGION_HIERARCHY) => 1,
                Ok(h) if h == global(&THIRD_REGION_HIERARCHY) => 2,
                _ => 0,
            };
            (0, region)
        }
    };
    unsafe {
        core::ptr::write_volatile(&raw mut WALK_SESSION, meta.session_id);
        core::ptr::write_volatile(&raw mut WALK_VISITED, index + 1);
        core::ptr::write_volatile(&raw mut WALK_REGION, region);
    }
    let per_region = global(&RECORDS_PER_REGION);
    if index >= per_region {
        // More cgroups than a region holds: user space sees count > capacity.
        return 0;
    }
    let slot = region * per_region + index;
    if slot >= u64::from(u32::MAX) {
        return 0;
    }
    let Some(rec) = CGROUP_RECORDS.get_ptr_mut(slot as u32) else {
        return 0;
    };
    let rec = unsafe { &mut *rec };
    // What the previous walk left in this slot: its name can be kept if it is the same
    // cgroup with the same name (see `CgroupRecord::name_key`).
    let previous = Previous {
        valid: rec.version == RECORD_VERSION && rec.flags & FLAG_READ_ERROR == 0,
        id: rec.id,
        name_key: rec.name_key,
        truncated: rec.flags & FLAG_NAME_TRUNCATED,
    };
    // One store per field: plain assignments of zeros to neighbouring fields are merged
    // by the compiler into a `memset` call, which for BPF is a byte-at-a-time loop.
    unsafe {
        use core::ptr::write_volatile as w;
        w(&raw mut rec.version, RECORD_VERSION);
        w(&raw mut rec.flags, 0);
        w(&raw mut rec.session, meta.session_id);
        w(&raw mut rec.id, 0);
        w(&raw mut rec.parent_id, 0);
        w(&raw mut rec.level, 0);
        w(&raw mut rec.cpu_usage_ns, 0);
        w(&raw mut rec.memory_usage_pages, 0);
        w(&raw mut rec.inactive_file_pages, 0);
        w(&raw mut rec.anon_pages, 0);
        w(&raw mut rec.swap_counter_pages, 0);
        w(&raw mut rec.psi_cpu_some_ns, 0);
        w(&raw mut rec.psi_memory_some_ns, 0);
        w(&raw mut rec.cfs_periods, 0);
        w(&raw mut rec.cfs_throttled, 0);
        w(&raw mut rec.psi_avg_cpu_some_ns, 0);
        w(&raw mut rec.psi_avg_memory_some_ns, 0);
        w(&raw mut rec.psi_avg_at_ns, 0);
        w(&raw mut rec.name_key, 0);
    }
    if fill(cgrp, rec, &previous, region).is_err() {
        rec.flags |= FLAG_READ_ERROR;
    }
    0
}

/// A direct load from a BTF-typed kernel pointer (`struct cgroup *` of the iterator, and
/// what its members point to). The offsets are read-only globals, so the verifier knows
/// them as constants and checks each load against the kernel's BTF; it turns such a load
/// into a fault-safe one (a bad address reads 0), far cheaper than a helper call.
#[inline(always)]
unsafe fn load_u64(base: u64, off: u64) -> u64 {
    unsafe { read_volatile((base + off) as *const u64) }
}

#[inline(always)]
unsafe fn load_i32(base: u64, off: u64) -> i32 {
    unsafe { read_volatile((base + off) as *const i32) }
}

#[inline(always)]
unsafe fn load_u8(base: u64, off: u64) -> u8 {
    unsafe { read_volatile((base + off) as *const u8) }
}

/// A slot's record from the previous walk, as far as the name is concerned.
struct Previous {
    /// Written by this program version, without a read error (so its name was copied).
    valid: bool,
    id: u64,
    name_key: u64,
    truncated: u32,
}

#[inline(always)]
/// `region` says what to read besides the path: in region 0, the hierarchy carrying CPU
/// time, the CPU counter and the signals asked for; in region 1, a hybrid node's v1 memory
/// hierarchy, neither (its cgroups keep none: the loads would only cost a cache miss per
/// cgroup); in region 2, its v1 `cpu` hierarchy, the CFS counters alone.
fn fill(cgrp: u64, rec: &mut CgroupRecord, previous: &Previous, region: u64) -> Result<(), i32> {
    let cpu_tree = region == 0;
    unsafe {
        // Along BTF-typed pointers: direct loads (see `load_u64`).
        let kn = load_u64(cgrp, global(&OFF_CGROUP_KN));
        if kn == 0 {
            return Err(-1);
        }
        rec.id = load_u64(kn, global(&OFF_KN_ID));
        let name_ptr = load_u64(kn, global(&OFF_KN_NAME));
        if previous.valid && previous.id == rec.id && previous.name_key == name_ptr {
            // The slot already holds this name: in a steady tree, every slot.
            rec.flags |= FLAG_NAME_KEPT | previous.truncated;
        } else {
            rec.name[0] = 0;
            let n = bpf_probe_read_kernel_str_bytes(name_ptr as *const u8, &mut rec.name)?.len();
            if n >= NAME_LEN - 1 {
                rec.flags |= FLAG_NAME_TRUNCATED;
            }
        }
        rec.name_key = name_ptr;
        rec.level = load_i32(cgrp, global(&OFF_CGROUP_LEVEL)) as u64;
        let parent_css = load_u64(cgrp, global(&OFF_CSS_PARENT));
        if parent_css != 0 {
            let parent = load_u64(parent_css, global(&OFF_CSS_CGROUP));
            if parent == 0 {
                return Err(-1);
            }
            let pkn = load_u64(parent, global(&OFF_CGROUP_KN));
            if pkn == 0 {
                return Err(-1);
            }
            rec.parent_id = load_u64(pkn, global(&OFF_KN_ID));
        }
        if cpu_tree {
            rec.cpu_usage_ns = load_u64(cgrp, global(&OFF_CGROUP_CPU));
        }

        // `struct mem_cgroup` starts with its css; BTF types the pointer as a css, so
        // the memcg's own members are read with the helper.
        let memcg = load_u64(cgrp, global(&OFF_CGROUP_MEMCG));
        if memcg != 0 {
            rec.flags |= FLAG_MEMCG;
            rec.memory_usage_pages = read_u64(memcg, global(&OFF_MEMCG_USAGE))?;
            rec.swap_counter_pages = read_u64(memcg, global(&OFF_MEMCG_SWAP))?;
            let mut vmstats = memcg + global(&OFF_MEMCG_VMSTATS);
            if global(&VMSTATS_IS_PTR) != 0 {
                vmstats = read_u64(vmstats, 0)?;
            }
            if vmstats != 0 {
                rec.inactive_file_pages =
                    read_u64(vmstats, global(&OFF_VMSTATS_INACTIVE_FILE))? as i64;
                rec.anon_pages = read_u64(vmstats, global(&OFF_VMSTATS_ANON))? as i64;
            }
        }

        let signals = match region {
            0 => global(&READ_SIGNALS),
            2 => global(&READ_SIGNALS) & READ_CFS,
            _ => 0,
        };
        if signals & READ_PSI != 0 {
            // `cgroup.psi` is a BTF-typed `struct psi_group *`: direct loads.
            let psi = load_u64(cgrp, global(&OFF_CGROUP_PSI));
            let off_enabled = global(&OFF_PSI_ENABLED);
            if psi != 0 && (off_enabled == u64::MAX || load_u8(psi, off_enabled) != 0) {
                rec.flags |= FLAG_PSI;
                rec.psi_cpu_some_ns = load_u64(psi, global(&OFF_PSI_CPU_SOME));
                rec.psi_memory_some_ns = load_u64(psi, global(&OFF_PSI_MEMORY_SOME));
                // Written together by the kernel's averaging (no lock for readers: a torn
                // read shows as a point a little off, replaced by the next update's).
                rec.psi_avg_at_ns = load_u64(psi, global(&OFF_PSI_AVG_LAST_UPDATE));
                rec.psi_avg_cpu_some_ns = load_u64(psi, global(&OFF_PSI_AVG_CPU_SOME));
                rec.psi_avg_memory_some_ns = load_u64(psi, global(&OFF_PSI_AVG_MEMORY_SOME));
            }
        }
        if signals & READ_CFS != 0 {
            // A `struct task_group`, typed as its css: its own members by the helper.
            let tg = load_u64(cgrp, global(&OFF_CGROUP_CPU_CSS));
            if tg != 0 {
                let quota = read_u64(tg, global(&OFF_TG_QUOTA))?;
                // `int nr_periods; int nr_throttled;`, side by side (the loader checks).
                let counts = read_u64(tg, global(&OFF_TG_NR_PERIODS))?;
                rec.flags |= FLAG_CFS | if quota == u64::MAX { 0 } else { FLAG_CFS_QUOTA };
                rec.cfs_periods = counts & 0xffff_ffff;
                rec.cfs_throttled = counts >> 32;
            }
        }
    }
    Ok(())
}

/// Boot-clock nanoseconds at which each cgroup of the default hierarchy was made, by cgroup
/// id. LRU: the agent looks an entry up when it first sees the cgroup, a tick or so after
/// its creation; the oldest entries give way. The loader sets the size.
#[map]
static CGROUP_BIRTHS: LruHashMap<u64, u64> = LruHashMap::with_max_entries(1, 0);

/// `tp_btf/cgroup_mkdir` (`struct cgroup *cgrp, const char *path`), called once the new
/// cgroup is complete: note when it was made, if it belongs to the default (v2) hierarchy,
/// whose ids the collector reports (v1 hierarchies number their cgroups separately).
#[btf_tracepoint(function = "cgroup_mkdir")]
pub fn cgroup_mkdir(ctx: BtfTracePointContext) -> i32 {
    let now = unsafe { bpf_ktime_get_boot_ns() };
    let cgrp: u64 = ctx.arg(0);
    let _ = record_birth(cgrp, now);
    0
}

/// The id of the hierarchy `cgrp` belongs to (`cgroup->root->hierarchy_id`; the
/// default hierarchy is 0, the `0::` line of /proc/PID/cgroup).
#[inline(always)]
fn hierarchy_of(cgrp: u64) -> Result<u64, i32> {
    unsafe {
        let root = read_u64(cgrp, global(&OFF_CGROUP_ROOT))?;
        Ok(read_i32(root, global(&OFF_ROOT_HIERARCHY_ID))? as u64)
    }
}

#[inline(always)]
fn record_birth(cgrp: u64, now: u64) -> Result<(), i32> {
    unsafe {
        if hierarchy_of(cgrp)? != 0 {
            return Ok(());
        }
        let kn = read_u64(cgrp, global(&OFF_CGROUP_KN))?;
        let id = read_u64(kn, global(&OFF_KN_ID))?;
        CGROUP_BIRTHS.insert(id, now, 0)
    }
}

/// Scheduler-path accounting, for comparison only: on-CPU nanoseconds per cgroup id,
/// credited when a task is switched out.
#[map]
static SCHED_CPU_NS: PerCpuHashMap<u64, u64> =
    PerCpuHashMap::with_max_entries(SCHED_MAX_CGROUPS, 0);

/// Per-CPU timestamp of the last context switch.
#[map]
static SCHED_LAST_SWITCH: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// `tp_btf/sched_switch`: credit the time since the last switch on this CPU to the
/// outgoing task's (v2) cgroup.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(_ctx: BtfTracePointContext) -> i32 {
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(last) = SCHED_LAST_SWITCH.get_ptr_mut(0) else {
        return 0;
    };
    let prev = unsafe { *last };
    unsafe { *last = now };
    if prev == 0 || now <= prev {
        return 0;
    }
    let cg = unsafe { bpf_get_current_cgroup_id() };
    let delta = now - prev;
    match SCHED_CPU_NS.get_ptr_mut(cg) {
        Some(v) => unsafe { *v += delta },
        None => {
            let _ = SCHED_CPU_NS.insert(cg, delta, 0);
        }
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
