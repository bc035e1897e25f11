//! kpulse's eBPF programs. No pods, no policy: kernel counters in, records out.
//!
//! - `cgroup_stats` (`iter/cgroup`): walks a cgroup hierarchy and copies each cgroup's
//!   own CPU and memory counters into a [`CgroupRecord`]. Nothing runs on any hot
//!   path: the kernel already keeps these counters, we only read them.
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
    helpers::{
        bpf_get_current_cgroup_id, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes, generated::bpf_seq_write,
    },
    macros::{btf_tracepoint, map},
    maps::{PerCpuArray, PerCpuHashMap},
    programs::BtfTracePointContext,
};
use kpulse_common::{
    CgroupRecord, FLAG_MEMCG, FLAG_NAME_TRUNCATED, FLAG_READ_ERROR, NAME_LEN, RECORD_VERSION,
    SCHED_MAX_CGROUPS,
};

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
static OFF_CGROUP_LEVEL: u64 = 0;
#[no_mangle]
static OFF_CGROUP_CPU: u64 = 0;
#[no_mangle]
static OFF_CGROUP_MEMCG: u64 = 0;
#[no_mangle]
static OFF_MEMCG_USAGE: u64 = 0;
#[no_mangle]
static OFF_MEMCG_VMSTATS: u64 = 0;
#[no_mangle]
static VMSTATS_IS_PTR: u64 = 0;
#[no_mangle]
static OFF_VMSTATS_INACTIVE_FILE: u64 = 0;
#[no_mangle]
static OFF_VMSTATS_ANON: u64 = 0;

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

/// Iterator over a cgroup hierarchy; one [`CgroupRecord`] per cgroup.
#[unsafe(link_section = "iter/cgroup")]
#[no_mangle]
pub extern "C" fn cgroup_stats(ctx: *const IterCgroupCtx) -> i32 {
    let ctx = unsafe { &*ctx };
    let cgrp = ctx.cgroup;
    if cgrp == 0 {
        // Final call of the session (no cgroup): nothing to write.
        return 0;
    }
    let seq = unsafe { (*ctx.meta).seq };
    let mut rec = CgroupRecord {
        version: RECORD_VERSION,
        flags: 0,
        id: 0,
        parent_id: 0,
        level: 0,
        cpu_usage_ns: 0,
        memory_usage_pages: 0,
        inactive_file_pages: 0,
        anon_pages: 0,
        name: [0; NAME_LEN],
    };
    if fill(cgrp, &mut rec).is_err() {
        rec.flags |= FLAG_READ_ERROR;
    }
    unsafe {
        bpf_seq_write(
            seq,
            &rec as *const CgroupRecord as *const _,
            core::mem::size_of::<CgroupRecord>() as u32,
        );
    }
    0
}

#[inline(always)]
fn fill(cgrp: u64, rec: &mut CgroupRecord) -> Result<(), i32> {
    unsafe {
        let kn = read_u64(cgrp, global(&OFF_CGROUP_KN))?;
        rec.id = read_u64(kn, global(&OFF_KN_ID))?;
        let name_ptr = read_u64(kn, global(&OFF_KN_NAME))?;
        let n = bpf_probe_read_kernel_str_bytes(name_ptr as *const u8, &mut rec.name)?.len();
        if n >= NAME_LEN - 1 {
            rec.flags |= FLAG_NAME_TRUNCATED;
        }
        rec.level = read_i32(cgrp, global(&OFF_CGROUP_LEVEL))? as u64;
        // `struct cgroup` starts with its `self` css, so a css pointer is a cgroup pointer.
        let parent = read_u64(cgrp, global(&OFF_CSS_PARENT))?;
        if parent != 0 {
            let pkn = read_u64(parent, global(&OFF_CGROUP_KN))?;
            rec.parent_id = read_u64(pkn, global(&OFF_KN_ID))?;
        }
        rec.cpu_usage_ns = read_u64(cgrp, global(&OFF_CGROUP_CPU))?;

        let memcg = read_u64(cgrp, global(&OFF_CGROUP_MEMCG))?;
        if memcg != 0 {
            rec.flags |= FLAG_MEMCG;
            rec.memory_usage_pages = read_u64(memcg, global(&OFF_MEMCG_USAGE))?;
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
    }
    Ok(())
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
    match SCHED_CPU_NS.get_ptr_mut(&cg) {
        Some(v) => unsafe { *v += delta },
        None => {
            let _ = SCHED_CPU_NS.insert(&cg, &delta, 0);
        }
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
