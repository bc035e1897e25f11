//! Byte offsets of the kernel struct fields the `cgroup_stats` program reads, computed
//! from the running kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! Rust eBPF programs get no CO-RE relocations, so the loader does by hand what libbpf
//! would: look each field up by name in the kernel's own type information. Names that
//! changed between kernels are tried in order; a field that is missing everywhere is a
//! clear error (and the agent falls back to cgroupfs), never a guess.

use std::path::Path;

use btf_rs::{Btf, BtfType, Type};

/// Errors computing the layout.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// The BTF file could not be parsed.
    #[error("cannot parse kernel BTF {path}: {reason}")]
    Parse {
        /// The file.
        path: String,
        /// btf-rs's message.
        reason: String,
    },
    /// A struct, member or enum value the program needs is not in this kernel's BTF.
    #[error("kernel BTF has no {0}")]
    Missing(String),
    /// A type was not what the program expects.
    #[error("unexpected kernel type: {0}")]
    Unexpected(String),
}

/// Offsets (bytes) handed to the eBPF program as globals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLayout {
    /// `struct cgroup` → `kn`.
    pub cgroup_kn: u64,
    /// `struct kernfs_node` → `id`.
    pub kn_id: u64,
    /// `struct kernfs_node` → `name`.
    pub kn_name: u64,
    /// `struct cgroup` → `self.parent`.
    pub css_parent: u64,
    /// `struct cgroup_subsys_state` → `cgroup`.
    pub css_cgroup: u64,
    /// `struct cgroup` → `level`.
    pub cgroup_level: u64,
    /// `struct cgroup` → `bstat.cputime.sum_exec_runtime`.
    pub cgroup_cpu: u64,
    /// `struct cgroup` → `subsys[memory_cgrp_id]`.
    pub cgroup_memcg: u64,
    /// `struct mem_cgroup` → `memory.usage`.
    pub memcg_usage: u64,
    /// `struct mem_cgroup` → `swap.usage`, the same place as `memsw.usage` (a union: the
    /// swap counter on v2, memory + swap on v1).
    pub memcg_swap: u64,
    /// `struct mem_cgroup` → `vmstats`.
    pub memcg_vmstats: u64,
    /// 1 if `mem_cgroup.vmstats` is a pointer, 0 if embedded.
    pub vmstats_is_ptr: u64,
    /// `struct memcg_vmstats` → `state[inactive_file]`.
    pub vmstats_inactive_file: u64,
    /// `struct memcg_vmstats` → `state[anon]`.
    pub vmstats_anon: u64,
    /// How `state[]` is indexed, for logs.
    pub vmstats_indexing: VmstatsIndexing,
    /// `struct cgroup` → `root` (`cgroup_mkdir` keeps the default hierarchy's cgroups only).
    pub cgroup_root: u64,
    /// `struct cgroup_root` → `hierarchy_id`.
    pub root_hierarchy_id: u64,
    /// Pressure stall information, where the kernel has it (`CONFIG_PSI`).
    pub psi: Option<PsiLayout>,
    /// CFS bandwidth control, where the kernel has it (`CONFIG_CFS_BANDWIDTH`).
    pub cfs: Option<CfsLayout>,
}

/// Where a cgroup's pressure stall totals are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PsiLayout {
    /// `struct cgroup` → `psi`, a `struct psi_group *` (embedded before 6.1, which the
    /// agent does not support).
    pub cgroup_psi: u64,
    /// `struct psi_group` → `total[PSI_AVGS][PSI_CPU_SOME]` (ns; what `cpu.pressure`'s
    /// `some … total=` prints, in µs).
    pub cpu_some: u64,
    /// `struct psi_group` → `total[PSI_AVGS][PSI_MEM_SOME]` (ns).
    pub memory_some: u64,
    /// `struct psi_group` → `enabled` (the cgroup's `cgroup.pressure`); `u64::MAX` where
    /// the kernel has no such switch.
    pub enabled: u64,
    /// `struct psi_group` → `avg_total[PSI_CPU_SOME]` (ns): the total as of `avg_at`.
    pub avg_cpu_some: u64,
    /// `struct psi_group` → `avg_total[PSI_MEM_SOME]` (ns).
    pub avg_memory_some: u64,
    /// `struct psi_group` → `avg_last_update` (`sched_clock` ns of the last averaging).
    pub avg_at: u64,
}

/// Where a cgroup's CFS bandwidth counters are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CfsLayout {
    /// `struct cgroup` → `subsys[cpu_cgrp_id]` (a `struct task_group`, which starts with
    /// its css).
    pub cgroup_cpu_css: u64,
    /// `struct task_group` → `cfs_bandwidth.quota` (ns per period; `RUNTIME_INF`, all
    /// ones, when there is none).
    pub quota: u64,
    /// `struct task_group` → `cfs_bandwidth.nr_periods` (`int`).
    pub nr_periods: u64,
    /// `struct task_group` → `cfs_bandwidth.nr_throttled` (`int`).
    pub nr_throttled: u64,
}

/// How `memcg_vmstats.state[]` is indexed on this kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VmstatsIndexing {
    /// Indexed directly by `enum node_stat_item` (kernels before 6.11).
    #[default]
    Direct,
    /// Indexed by the position in the kernel's `memcg_node_stat_items[]` table (6.11+),
    /// whose first entries are fixed in the kernel source.
    Compact,
}

/// The start of `memcg_node_stat_items[]` in mm/memcontrol.c since the compact
/// indexing (6.11): the position of an item in this list is its `state[]` index.
const COMPACT_NODE_ITEMS: &[&str] = &[
    "NR_INACTIVE_ANON",
    "NR_ACTIVE_ANON",
    "NR_INACTIVE_FILE",
    "NR_ACTIVE_FILE",
    "NR_UNEVICTABLE",
    "NR_SLAB_RECLAIMABLE_B",
    "NR_SLAB_UNRECLAIMABLE_B",
    "WORKINGSET_REFAULT_ANON",
    "WORKINGSET_REFAULT_FILE",
    "WORKINGSET_ACTIVATE_ANON",
    "WORKINGSET_ACTIVATE_FILE",
    "WORKINGSET_RESTORE_ANON",
    "WORKINGSET_RESTORE_FILE",
    "WORKINGSET_NODERECLAIM",
    "NR_ANON_MAPPED",
];

impl KernelLayout {
    /// Computes the layout from a BTF file.
    pub fn from_file(path: &Path) -> Result<KernelLayout, LayoutError> {
        let btf = Btf::from_file(path).map_err(|e| LayoutError::Parse {
            path: path.display().to_string(),
            reason: format!("{e:#}"),
        })?;
        Self::from_btf(&btf)
    }

    /// Computes the layout from parsed BTF.
    pub fn from_btf(btf: &Btf) -> Result<KernelLayout, LayoutError> {
        let k = Kbtf(btf);
        let memory_id = k.enum_value("cgroup_subsys_id", "memory_cgrp_id")?;
        let (subsys_off, subsys_elem) = k.array_member("cgroup", "subsys")?;
        let (vmstats_off, vmstats_ty) = k.member("mem_cgroup", &["vmstats"])?;
        let vmstats_is_ptr = matches!(k.strip(vmstats_ty)?, Type::Ptr(_));
        let (state_off, state_elem) = k.array_member("memcg_vmstats", "state")?;
        let state_len = k.array_len("memcg_vmstats", "state")?;
        let memcg_nr_stat = k.enum_value("memcg_stat_item", "MEMCG_NR_STAT")?;
        let (indexing, inactive_idx, anon_idx) = if state_len == memcg_nr_stat {
            (
                VmstatsIndexing::Direct,
                k.enum_value("node_stat_item", "NR_INACTIVE_FILE")?,
                k.enum_value("node_stat_item", "NR_ANON_MAPPED")?,
            )
        } else {
            // Check that the fixed head of the compact table still names real items.
            for item in COMPACT_NODE_ITEMS {
                k.enum_value("node_stat_item", item)?;
            }
            let pos = |name: &str| {
                COMPACT_NODE_ITEMS
                    .iter()
                    .position(|n| *n == name)
                    .map(|p| p as u64)
                    .ok_or_else(|| LayoutError::Missing(format!("compact index of {name}")))
            };
            (
                VmstatsIndexing::Compact,
                pos("NR_INACTIVE_FILE")?,
                pos("NR_ANON_MAPPED")?,
            )
        };
        if inactive_idx >= state_len || anon_idx >= state_len {
            return Err(LayoutError::Unexpected(format!(
                "memcg_vmstats.state has {state_len} entries, need indices {inactive_idx} and {anon_idx}"
            )));
        }
        let memcg_swap = k.member("mem_cgroup", &["swap", "usage"])?.0;
        let memsw = k.member("mem_cgroup", &["memsw", "usage"])?.0;
        if memsw != memcg_swap {
            return Err(LayoutError::Unexpected(format!(
                "mem_cgroup.swap ({memcg_swap}) and .memsw ({memsw}) are not one union"
            )));
        }
        Ok(KernelLayout {
            cgroup_kn: k.member("cgroup", &["kn"])?.0,
            kn_id: k.member("kernfs_node", &["id"])?.0,
            kn_name: k.member("kernfs_node", &["name"])?.0,
            css_parent: k.member("cgroup", &["self", "parent"])?.0,
            css_cgroup: k.member("cgroup_subsys_state", &["cgroup"])?.0,
            cgroup_level: k.member("cgroup", &["level"])?.0,
            cgroup_cpu: k
                .member("cgroup", &["bstat", "cputime", "sum_exec_runtime"])?
                .0,
            cgroup_memcg: subsys_off + memory_id * subsys_elem,
            memcg_usage: k.member("mem_cgroup", &["memory", "usage"])?.0,
            memcg_swap,
            memcg_vmstats: vmstats_off,
            vmstats_is_ptr: u64::from(vmstats_is_ptr),
            vmstats_inactive_file: state_off + inactive_idx * state_elem,
            vmstats_anon: state_off + anon_idx * state_elem,
            vmstats_indexing: indexing,
            cgroup_root: k.member("cgroup", &["root"])?.0,
            root_hierarchy_id: k.member("cgroup_root", &["hierarchy_id"])?.0,
            psi: optional("pressure stall information", psi_layout(&k)),
            cfs: optional(
                "CFS bandwidth counters",
                cfs_layout(&k, subsys_off, subsys_elem),
            ),
        })
    }
}

/// A part of the layout only some kernels have: `None`, with the reason logged, where the
/// kernel lacks it (the signals it carries are then absent, not zero).
fn optional<T>(what: &str, part: Result<T, LayoutError>) -> Option<T> {
    part.map_err(|e| tracing::warn!(error = %e, "{what} unavailable on this kernel"))
        .ok()
}

fn psi_layout(k: &Kbtf<'_>) -> Result<PsiLayout, LayoutError> {
    let (cgroup_psi, psi_ty) = k.member("cgroup", &["psi"])?;
    if !matches!(psi_ty, Type::Ptr(_)) {
        return Err(LayoutError::Unexpected(
            "cgroup.psi is not a pointer (a kernel before 6.1)".into(),
        ));
    }
    // `u64 total[NR_PSI_AGGREGATORS][NR_PSI_STATES - 1]`: the row of the averaging
    // aggregator is what the files print and the kernel's 2 s work brings up to date.
    let aggregators = k.enum_value("psi_aggregators", "NR_PSI_AGGREGATORS")?;
    let (total_off, row_len, elem) = k.matrix_member("psi_group", "total", aggregators)?;
    let states = k.enum_value("psi_states", "NR_PSI_STATES")?;
    if row_len + 1 != states || elem != 8 {
        return Err(LayoutError::Unexpected(format!(
            "psi_group.total rows have {row_len} entries of {elem} bytes, NR_PSI_STATES is {states}"
        )));
    }
    let avgs = k.enum_value("psi_aggregators", "PSI_AVGS")?;
    let total = |state: &str| -> Result<u64, LayoutError> {
        let state = k.enum_value("psi_states", state)?;
        Ok(total_off + (avgs * row_len + state) * elem)
    };
    // `u64 avg_total[NR_PSI_STATES - 1]` and `u64 avg_last_update`, written together.
    let (avg_off, avg_elem) = k.array_member("psi_group", "avg_total")?;
    let avg_len = k.array_len("psi_group", "avg_total")?;
    if avg_len != row_len || avg_elem != elem {
        return Err(LayoutError::Unexpected(format!(
            "psi_group.avg_total has {avg_len} entries of {avg_elem} bytes, total's rows \
             {row_len} of {elem}"
        )));
    }
    let avg_total = |state: &str| -> Result<u64, LayoutError> {
        Ok(avg_off + k.enum_value("psi_states", state)? * elem)
    };
    Ok(PsiLayout {
        cgroup_psi,
        cpu_some: total("PSI_CPU_SOME")?,
        memory_some: total("PSI_MEM_SOME")?,
        avg_cpu_some: avg_total("PSI_CPU_SOME")?,
        avg_memory_some: avg_total("PSI_MEM_SOME")?,
        avg_at: k.member("psi_group", &["avg_last_update"])?.0,
        enabled: k
            .member("psi_group", &["enabled"])
            .map_or(u64::MAX, |(off, _)| off),
    })
}

fn cfs_layout(k: &Kbtf<'_>, subsys_off: u64, subsys_elem: u64) -> Result<CfsLayout, LayoutError> {
    let cpu_id = k.enum_value("cgroup_subsys_id", "cpu_cgrp_id")?;
    let nr_periods = k.member("task_group", &["cfs_bandwidth", "nr_periods"])?.0;
    let nr_throttled = k
        .member("task_group", &["cfs_bandwidth", "nr_throttled"])?
        .0;
    // The walk reads both with one 8-byte read.
    if nr_throttled != nr_periods + 4 || !nr_periods.is_multiple_of(4) {
        return Err(LayoutError::Unexpected(format!(
            "cfs_bandwidth.nr_periods ({nr_periods}) and .nr_throttled ({nr_throttled}) are not adjacent ints"
        )));
    }
    Ok(CfsLayout {
        cgroup_cpu_css: subsys_off + cpu_id * subsys_elem,
        quota: k.member("task_group", &["cfs_bandwidth", "quota"])?.0,
        nr_periods,
        nr_throttled,
    })
}

/// Small lookups over btf-rs.
struct Kbtf<'a>(&'a Btf);

impl Kbtf<'_> {
    fn name<T: BtfType + ?Sized>(&self, t: &T) -> String {
        self.0.resolve_name(t).unwrap_or_default()
    }

    fn struct_type(&self, name: &str) -> Result<btf_rs::Struct, LayoutError> {
        let types = self
            .0
            .resolve_types_by_name(name)
            .map_err(|_| LayoutError::Missing(format!("struct {name}")))?;
        types
            .into_iter()
            .find_map(|t| match t {
                Type::Struct(s) if !s.members.is_empty() => Some(s),
                _ => None,
            })
            .ok_or_else(|| LayoutError::Missing(format!("struct {name}")))
    }

    /// Follows typedefs and qualifiers.
    fn strip(&self, t: Type) -> Result<Type, LayoutError> {
        let mut t = t;
        for _ in 0..16 {
            t = match t {
                Type::Typedef(ref x) => self.chained(x)?,
                Type::Const(ref x) => self.chained(x)?,
                Type::Volatile(ref x) => self.chained(x)?,
                Type::Restrict(ref x) => self.chained(x)?,
                Type::TypeTag(ref x) => self.chained(x)?,
                other => return Ok(other),
            };
        }
        Err(LayoutError::Unexpected("typedef chain too long".into()))
    }

    fn chained<T: BtfType + ?Sized>(&self, t: &T) -> Result<Type, LayoutError> {
        self.0
            .resolve_chained_type(t)
            .map_err(|e| LayoutError::Unexpected(format!("{e:#}")))
    }

    /// Finds `field` in a struct/union's members, descending into anonymous members.
    /// Returns (bit offset, member type).
    fn find_field(
        &self,
        members: &[btf_rs::Member],
        field: &str,
        depth: u32,
    ) -> Result<Option<(u32, Type)>, LayoutError> {
        for m in members {
            let name = self.name(m);
            if name == field {
                return Ok(Some((m.bit_offset(), self.chained(m)?)));
            }
            if name.is_empty() && depth < 8 {
                let inner = match self.strip(self.chained(m)?)? {
                    Type::Struct(s) | Type::Union(s) => s.members,
                    _ => continue,
                };
                if let Some((off, t)) = self.find_field(&inner, field, depth + 1)? {
                    return Ok(Some((m.bit_offset() + off, t)));
                }
            }
        }
        Ok(None)
    }

    /// Byte offset and type of `path` (nested member names) inside `struct s`.
    fn member(&self, s: &str, path: &[&str]) -> Result<(u64, Type), LayoutError> {
        let mut members = self.struct_type(s)?.members;
        let mut bits = 0u64;
        let mut ty = None;
        for (i, field) in path.iter().enumerate() {
            let (off, t) = self
                .find_field(&members, field, 0)?
                .ok_or_else(|| LayoutError::Missing(format!("{s}.{}", path[..=i].join("."))))?;
            bits += u64::from(off);
            let t = self.strip(t)?;
            if i + 1 < path.len() {
                members = match &t {
                    Type::Struct(x) | Type::Union(x) => x.members.clone(),
                    _ => {
                        return Err(LayoutError::Unexpected(format!(
                            "{s}.{field} is not a struct"
                        )))
                    }
                };
            }
            ty = Some(t);
        }
        if !bits.is_multiple_of(8) {
            return Err(LayoutError::Unexpected(format!(
                "{s}.{} is a bitfield",
                path.join(".")
            )));
        }
        let ty = ty.ok_or_else(|| LayoutError::Unexpected("empty member path".into()))?;
        Ok((bits / 8, ty))
    }

    /// Offset of an array member and the byte size of one element.
    fn array_member(&self, s: &str, field: &str) -> Result<(u64, u64), LayoutError> {
        let (off, t) = self.member(s, &[field])?;
        let Type::Array(a) = t else {
            return Err(LayoutError::Unexpected(format!(
                "{s}.{field} is not an array"
            )));
        };
        let elem = self.strip(self.chained(&a)?)?;
        let size = match elem {
            Type::Ptr(_) => 8,
            Type::Int(i) => i.size() as u64,
            Type::Enum(e) => e.size() as u64,
            other => {
                return Err(LayoutError::Unexpected(format!(
                    "{s}.{field}[] has elements of kind {}",
                    other.name()
                )))
            }
        };
        Ok((off, size))
    }

    /// Offset of a two-dimensional array member of `rows` rows, the length of its rows and
    /// the byte size of one element. BTF may give it as an array of arrays or, as pahole
    /// encodes the kernel's, flattened into one array of `rows × row length` elements.
    fn matrix_member(
        &self,
        s: &str,
        field: &str,
        rows: u64,
    ) -> Result<(u64, u64, u64), LayoutError> {
        let (off, t) = self.member(s, &[field])?;
        let not = || LayoutError::Unexpected(format!("{s}.{field} is not an array of integers"));
        let Type::Array(outer) = t else {
            return Err(not());
        };
        let (row_len, elem) = match self.strip(self.chained(&outer)?)? {
            Type::Array(row) => {
                if outer.len() as u64 != rows {
                    return Err(LayoutError::Unexpected(format!(
                        "{s}.{field} has {} rows, not {rows}",
                        outer.len()
                    )));
                }
                (row.len() as u64, self.strip(self.chained(&row)?)?)
            }
            e @ Type::Int(_) => {
                let len = outer.len() as u64;
                if rows == 0 || !len.is_multiple_of(rows) {
                    return Err(LayoutError::Unexpected(format!(
                        "{s}.{field} has {len} elements, not {rows} equal rows"
                    )));
                }
                (len / rows, e)
            }
            _ => return Err(not()),
        };
        let Type::Int(i) = elem else {
            return Err(not());
        };
        Ok((off, row_len, i.size() as u64))
    }

    fn array_len(&self, s: &str, field: &str) -> Result<u64, LayoutError> {
        match self.member(s, &[field])?.1 {
            Type::Array(a) => Ok(a.len() as u64),
            _ => Err(LayoutError::Unexpected(format!(
                "{s}.{field} is not an array"
            ))),
        }
    }

    fn enum_value(&self, enum_name: &str, member: &str) -> Result<u64, LayoutError> {
        let types = self
            .0
            .resolve_types_by_name(enum_name)
            .map_err(|_| LayoutError::Missing(format!("enum {enum_name}")))?;
        for t in types {
            match t {
                Type::Enum(e) => {
                    if let Some(m) = e.members.iter().find(|m| self.name(*m) == member) {
                        return Ok(u64::from(m.val()));
                    }
                }
                Type::Enum64(e) => {
                    if let Some(m) = e.members.iter().find(|m| self.name(*m) == member) {
                        return Ok(m.val());
                    }
                }
                _ => {}
            }
        }
        Err(LayoutError::Missing(format!("{enum_name}::{member}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running kernel's BTF, when there is one (unit tests never require it).
    #[test]
    fn running_kernel_layout_is_plausible() {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            eprintln!("skipped: no {}", path.display());
            return;
        }
        let l = KernelLayout::from_file(path).expect("layout");
        // Offsets inside struct cgroup are positive and distinct.
        assert!(l.cgroup_kn > 0 && l.cgroup_cpu > 0 && l.cgroup_memcg > 0);
        assert_ne!(l.cgroup_kn, l.cgroup_cpu);
        assert_eq!(l.css_parent % 8, 0);
        assert!(l.vmstats_anon > l.vmstats_inactive_file);
        // The swap counter follows the memory counter (`struct page_counter` apart).
        assert!(l.memcg_swap > l.memcg_usage, "{l:?}");
        // cpu some and memory some are two apart in a row (some and full of each resource).
        if Path::new("/proc/pressure/cpu").exists() {
            let psi = l.psi.expect("PSI layout");
            assert_eq!(psi.cpu_some - psi.memory_some, 16, "{l:?}");
            assert_eq!(psi.avg_cpu_some - psi.avg_memory_some, 16, "{l:?}");
        }
        if let Some(cfs) = l.cfs {
            assert_eq!(cfs.nr_throttled - cfs.nr_periods, 4, "{l:?}");
        }
        println!("{l:?}");
    }

    #[test]
    fn missing_file_is_a_parse_error() {
        let err = KernelLayout::from_file(Path::new("/nonexistent/btf")).expect_err("no file");
        assert!(matches!(err, LayoutError::Parse { .. }), "{err}");
    }
}
