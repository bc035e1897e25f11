//! What another privileged process can do to the agent's BPF objects, by id, with raw
//! `bpf(2)` calls (the fault tests play that process), and where to find a process's BPF
//! objects (`/proc/PID/fdinfo`).

#![allow(unsafe_code)]

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
};

const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_ITER_CREATE: libc::c_long = 33;
const BPF_LINK_DETACH: libc::c_long = 34;

const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_ITER: u32 = 28;

/// `union bpf_attr`, as bytes: every command's struct fits, the rest stays zero.
#[repr(C, align(8))]
struct Attr([u8; 144]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 144])
    }
    fn u32(mut self, off: usize, v: u32) -> Attr {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(mut self, off: usize, v: u64) -> Attr {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
}

fn sys_bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<i64> {
    // SAFETY: `attr` is a zero-padded `union bpf_attr` that outlives the call; pointers in
    // it point at live buffers of the caller.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut Attr,
            std::mem::size_of::<Attr>() as libc::c_uint,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn fd_of(ret: i64) -> OwnedFd {
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(ret as RawFd) }
}

/// `BPF_PROG_GET_FD_BY_ID`.
pub fn prog_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut Attr::new().u32(0, id)).map(fd_of)
}

/// `BPF_MAP_GET_FD_BY_ID`.
pub fn map_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    sys_bpf(BPF_MAP_GET_FD_BY_ID, &mut Attr::new().u32(0, id)).map(fd_of)
}

/// `BPF_LINK_GET_FD_BY_ID`.
pub fn link_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    sys_bpf(BPF_LINK_GET_FD_BY_ID, &mut Attr::new().u32(0, id)).map(fd_of)
}

/// `BPF_LINK_UPDATE`: makes link `link_id` run program `prog_id`.
pub fn link_update(link_id: u32, prog_id: u32) -> io::Result<()> {
    let link = link_fd_by_id(link_id)?;
    let prog = prog_fd_by_id(prog_id)?;
    let mut attr = Attr::new()
        .u32(0, link.as_raw_fd() as u32)
        .u32(4, prog.as_raw_fd() as u32);
    sys_bpf(BPF_LINK_UPDATE, &mut attr).map(|_| ())
}

/// `BPF_LINK_DETACH` on link `link_id`.
pub fn link_detach(link_id: u32) -> io::Result<()> {
    let link = link_fd_by_id(link_id)?;
    sys_bpf(
        BPF_LINK_DETACH,
        &mut Attr::new().u32(0, link.as_raw_fd() as u32),
    )
    .map(|_| ())
}

/// Runs an iterator of link `link_id` to its end (another walk of the agent's link).
pub fn run_iterator(link_id: u32) -> io::Result<usize> {
    use std::io::Read;
    let link = link_fd_by_id(link_id)?;
    let fd = sys_bpf(
        BPF_ITER_CREATE,
        &mut Attr::new().u32(0, link.as_raw_fd() as u32),
    )
    .map(fd_of)?;
    let mut f = std::fs::File::from(fd);
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(k) => n += k,
            Err(e) => return Err(e),
        }
    }
}

/// `BPF_MAP_UPDATE_ELEM` of key 0 of map `map_id` with zeroes (an array's `u32` key, or a
/// hash map's `u64` key: little-endian zero either way).
pub fn map_write_first(map_id: u32, value_size: usize) -> io::Result<()> {
    let map = map_fd_by_id(map_id)?;
    let key = 0u64;
    let value = vec![0u8; value_size];
    let mut attr = Attr::new()
        .u32(0, map.as_raw_fd() as u32)
        .u64(8, &key as *const u64 as u64)
        .u64(16, value.as_ptr() as u64);
    sys_bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(|_| ())
}

/// Maps array map `map_id` writable and shared (what another process would need to
/// rewrite records in place).
pub fn map_mmap_writable(map_id: u32, len: usize) -> io::Result<()> {
    let map = map_fd_by_id(map_id)?;
    // SAFETY: a fresh mapping of a BPF map, unmapped at once if it succeeds.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            map.as_raw_fd(),
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        libc::munmap(p, len);
    }
    Ok(())
}

/// Loads the smallest `iter/cgroup` program there is (`r0 = 0; exit`: it writes nothing),
/// as any process could; the returned fd keeps it loaded.
pub fn load_minimal_cgroup_iter() -> io::Result<OwnedFd> {
    let btf = btf_rs::Btf::from_file("/sys/kernel/btf/vmlinux")
        .map_err(|e| io::Error::other(format!("vmlinux BTF: {e}")))?;
    let ids = btf
        .resolve_ids_by_name("bpf_iter_cgroup")
        .map_err(|e| io::Error::other(format!("bpf_iter_cgroup in BTF: {e}")))?;
    let attach_btf_id = *ids
        .first()
        .ok_or_else(|| io::Error::other("no bpf_iter_cgroup in BTF"))?;
    // mov64 r0, 0; exit
    let insns: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095];
    let license = b"GPL\0";
    let mut log = vec![0u8; 4096];
    let mut name = [0u8; 16];
    name[..14].copy_from_slice(b"kpulse_foreign");
    let mut attr = Attr::new()
        .u32(0, BPF_PROG_TYPE_TRACING)
        .u32(4, insns.len() as u32)
        .u64(8, insns.as_ptr() as u64)
        .u64(16, license.as_ptr() as u64)
        .u32(24, 1)
        .u32(28, log.len() as u32)
        .u64(32, log.as_mut_ptr() as u64)
        .u32(68, BPF_TRACE_ITER)
        .u32(108, attach_btf_id);
    attr.0[48..64].copy_from_slice(&name);
    sys_bpf(BPF_PROG_LOAD, &mut attr).map(fd_of).map_err(|e| {
        let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
        io::Error::new(
            e.kind(),
            format!("{e}: {}", String::from_utf8_lossy(&log[..end])),
        )
    })
}

/// The id of the program behind fd `fd` (from this process's fdinfo).
pub fn own_prog_id(fd: &OwnedFd) -> Option<u32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    fdinfo_field(&info, "prog_id")
}

fn fdinfo_field(info: &str, key: &str) -> Option<u32> {
    info.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The BPF objects a process holds, from `/proc/PID/fdinfo`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Programs (held directly).
    pub progs: Vec<u32>,
    /// Links, with the program each runs.
    pub links: Vec<(u32, u32)>,
    /// The iterator links among them (not `cgroup_mkdir`'s tracepoint link).
    pub iter_links: Vec<(u32, u32)>,
    /// Maps.
    pub maps: Vec<u32>,
}

impl Held {
    /// Nothing at all.
    pub fn is_empty(&self) -> bool {
        self.progs.is_empty() && self.links.is_empty() && self.maps.is_empty()
    }
}

/// What `pid` holds now (empty if it is gone).
pub fn held_by(pid: u32) -> Held {
    let mut h = Held::default();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return h;
    };
    for fd in fds.flatten() {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        let t = target.to_string_lossy();
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        if t.contains("bpf_link") {
            if let (Some(l), Some(p)) = (
                fdinfo_field(&info, "link_id"),
                fdinfo_field(&info, "prog_id"),
            ) {
                h.links.push((l, p));
                if info.lines().any(|line| {
                    line.split_once(':')
                        .is_some_and(|(k, v)| k.trim() == "link_type" && v.trim() == "iter")
                }) {
                    h.iter_links.push((l, p));
                }
            }
        } else if t.contains("bpf-prog") {
            h.progs.extend(fdinfo_field(&info, "prog_id"));
        } else if t.contains("bpf-map") {
            h.maps.extend(fdinfo_field(&info, "map_id"));
        }
    }
    h.progs.sort_unstable();
    h.links.sort_unstable();
    h.iter_links.sort_unstable();
    h.maps.sort_unstable();
    h
}

/// Ids of the loaded programs named `name`.
pub fn loaded_programs_named(name: &str) -> Vec<u32> {
    aya::programs::loaded_programs()
        .flatten()
        .filter(|p| p.name_as_str() == Some(name))
        .map(|p| p.id())
        .collect()
}

/// Every process holding program `id` directly or through a link.
pub fn holders_of_program(id: u32) -> Vec<u32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            let h = held_by(pid);
            h.progs.contains(&id) || h.links.iter().any(|&(_, p)| p == id)
        })
        .collect()
}

/// Whether the kernel still has program / link / map `id` (`*_GET_FD_BY_ID` ≠ ENOENT).
pub fn exists(kind: &str, id: u32) -> bool {
    let r = match kind {
        "prog" => prog_fd_by_id(id),
        "link" => link_fd_by_id(id),
        _ => map_fd_by_id(id),
    };
    !matches!(r, Err(e) if e.raw_os_error() == Some(libc::ENOENT))
}

/// The program link `link_id` runs now.
pub fn link_program(link_id: u32) -> Option<u32> {
    aya::programs::loaded_links()
        .flatten()
        .find(|l| l.id() == link_id)
        .map(|l| l.program_id())
}

/// Names of maps by id.
pub fn map_name(id: u32) -> Option<String> {
    aya::maps::loaded_maps()
        .flatten()
        .find(|m| m.id() == id)
        .and_then(|m| m.name_as_str().map(str::to_owned))
}
