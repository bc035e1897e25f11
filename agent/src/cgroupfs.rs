//! Reading cgroupfs and procfs files: the fallback collector's source, the ground truth
//! the tests compare against, and the few node-wide figures the kernel keeps outside
//! any cgroup's reach from eBPF.

use std::{
    io::ErrorKind,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::sample::{Bytes, CpuNanos, Memory, Pressure, Throttling};

/// Errors reading cgroupfs/procfs.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// A file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file did not have the expected content.
    #[error("{path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

impl FsError {
    /// True when the file vanished (the cgroup was removed during the scan).
    pub fn is_not_found(&self) -> bool {
        matches!(self, FsError::Read { source, .. } if source.kind() == ErrorKind::NotFound
            || source.raw_os_error() == Some(libc::ENODEV))
    }
}

/// Reads a whole (small) file.
pub fn read(path: &Path) -> Result<String, FsError> {
    std::fs::read_to_string(path).map_err(|source| FsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Value of `key` in a flat-keyed file (`key value` per line), e.g. `cpu.stat`, `memory.stat`.
pub fn flat_key(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The value of `key` in a flat-keyed file's text, or a parse error naming `path`.
pub fn need_key(path: &Path, text: &str, key: &str) -> Result<u64, FsError> {
    flat_key(text, key).ok_or_else(|| FsError::Parse {
        path: path.to_path_buf(),
        reason: format!("no `{key}`"),
    })
}

fn single_u64(path: &Path) -> Result<u64, FsError> {
    parse_single_u64(path, &read(path)?)
}

/// The number that is the whole text of a one-value file (`cpuacct.usage`), read from `path`.
pub fn parse_single_u64(path: &Path, text: &str) -> Result<u64, FsError> {
    text.trim().parse().map_err(|_| FsError::Parse {
        path: path.to_path_buf(),
        reason: format!("not a number: {:?}", text.trim()),
    })
}

/// A statistics file read every tick through one open descriptor: a read at offset 0
/// (`pread`) makes the kernel format it anew, and run what its `show` handler runs (the
/// flushes), as a fresh open would, without the path lookup, open and close each time.
/// When a read fails (the cgroup was removed: `ENODEV`), the file is opened again once by
/// path, so a cgroup made again under the same name is followed and a vanished one reports
/// [`FsError::is_not_found`].
#[derive(Debug)]
pub struct KeptFile {
    path: PathBuf,
    file: Option<std::fs::File>,
}

/// Bound on what [`KeptFile::read_all`] reads: these files are a few KiB.
const KEPT_FILE_MAX: usize = 1 << 20;

impl KeptFile {
    /// The file at `path`, opened at its first read.
    pub fn new(path: PathBuf) -> KeptFile {
        KeptFile { path, file: None }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the start of the file and drops it: the kernel formats the whole file (and
    /// flushes what its `show` handler flushes, as for every reader) on the first read, so
    /// one small read, with nothing allocated, is enough to ask for the flush.
    pub fn read_to_flush(&mut self) -> Result<(), FsError> {
        let mut buf = [0u8; 256];
        self.with_file(|f| {
            use std::os::unix::fs::FileExt;
            f.read_at(&mut buf, 0).map(|_| ())
        })
    }

    /// Reads the whole file into `text` (replacing what it held).
    pub fn read_all(&mut self, text: &mut String) -> Result<(), FsError> {
        let mut bytes = std::mem::take(text).into_bytes();
        let r = self.with_file(|f| read_all_at(f, &mut bytes));
        *text = match String::from_utf8(bytes) {
            Ok(t) => t,
            Err(_) => {
                return Err(FsError::Parse {
                    path: self.path.clone(),
                    reason: "not UTF-8".into(),
                })
            }
        };
        r
    }

    fn with_file(
        &mut self,
        mut read: impl FnMut(&std::fs::File) -> std::io::Result<()>,
    ) -> Result<(), FsError> {
        if let Some(f) = &self.file {
            if read(f).is_ok() {
                return Ok(());
            }
            self.file = None;
        }
        let opened = std::fs::File::open(&self.path).and_then(|f| read(&f).map(|()| f));
        match opened {
            Ok(f) => {
                self.file = Some(f);
                Ok(())
            }
            Err(source) => Err(FsError::Read {
                path: self.path.clone(),
                source,
            }),
        }
    }
}

/// Reads `f` from offset 0 to its end into `out` (cleared first), at most
/// [`KEPT_FILE_MAX`] bytes.
fn read_all_at(f: &std::fs::File, out: &mut Vec<u8>) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    out.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let n = f.read_at(&mut chunk, out.len() as u64)?;
        if n == 0 {
            return Ok(());
        }
        if out.len() + n > KEPT_FILE_MAX {
            return Err(std::io::Error::new(
                ErrorKind::InvalidData,
                format!("longer than {KEPT_FILE_MAX} bytes"),
            ));
        }
        out.extend_from_slice(&chunk[..n]);
    }
}

/// `usage_usec` of the text of the v2 `cpu.stat` at `path`, as nanoseconds. (Reading that
/// file also makes the kernel flush the cgroup subtree's pending CPU statistics, rstat.)
pub fn parse_cpu_stat_usage(path: &Path, text: &str) -> Result<CpuNanos, FsError> {
    Ok(CpuNanos(
        need_key(path, text, "usage_usec")?.saturating_mul(1000),
    ))
}

/// The `some` line's `total=` (µs) of a pressure file's text (`cpu.pressure`,
/// `memory.pressure`), as nanoseconds.
pub fn parse_pressure_some(path: &Path, text: &str) -> Result<u64, FsError> {
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix("some ")?;
            rest.split_whitespace()
                .find_map(|f| f.strip_prefix("total="))?
                .parse::<u64>()
                .ok()
        })
        .map(|us| us.saturating_mul(1000))
        .ok_or_else(|| FsError::Parse {
            path: path.to_path_buf(),
            reason: "no `some … total=`".into(),
        })
}

/// Pressure stall totals of a cgroup v2 directory; `Ok(None)` when it has no pressure
/// files (PSI off in the kernel, or `cgroup.pressure` 0 for it).
pub fn pressure(dir: &Path) -> Result<Option<Pressure>, FsError> {
    let some = |name: &str| -> Result<Option<u64>, FsError> {
        let path = dir.join(name);
        match read(&path) {
            Ok(text) => parse_pressure_some(&path, &text).map(Some),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    };
    Ok(match (some("cpu.pressure")?, some("memory.pressure")?) {
        (Some(cpu_some_ns), Some(memory_some_ns)) => Some(Pressure {
            averaged: None,
            cpu_some_ns,
            memory_some_ns,
        }),
        _ => None,
    })
}

/// CFS bandwidth counters of a cgroup directory with the `cpu` controller: v2 (`cpu.max`,
/// `cpu.stat`) or v1 (`cpu.cfs_quota_us`, `cpu.stat`). `Ok(None)` when it has no quota, or
/// no `cpu` controller (no such files). `cpu_stat` is the text of this directory's
/// `cpu.stat` when the caller has just read it (for the CPU usage of a v2 cgroup); the file
/// is read otherwise.
pub fn throttling(
    dir: &Path,
    v2: bool,
    cpu_stat: Option<&str>,
) -> Result<Option<Throttling>, FsError> {
    let (quota_file, unlimited) = if v2 {
        ("cpu.max", "max")
    } else {
        ("cpu.cfs_quota_us", "-1")
    };
    let quota_path = dir.join(quota_file);
    let quota = match read(&quota_path) {
        Ok(q) => q,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
    };
    if quota.split_whitespace().next() == Some(unlimited) {
        return Ok(None);
    }
    let path = dir.join("cpu.stat");
    let read_now;
    let text = match cpu_stat {
        Some(t) => t,
        None => {
            read_now = read(&path)?;
            &read_now
        }
    };
    Ok(Some(Throttling {
        periods: need_key(&path, text, "nr_periods")?,
        throttled: need_key(&path, text, "nr_throttled")?,
    }))
}

/// v1 `cpuacct.usage`, nanoseconds.
pub fn cpuacct_usage(dir: &Path) -> Result<CpuNanos, FsError> {
    single_u64(&dir.join("cpuacct.usage")).map(CpuNanos)
}

/// Memory of a v2 cgroup: `memory.current` and `memory.stat` (`inactive_file`, `anon`),
/// and with `swap` its `memory.swap.current` (`None` where swap accounting is off and the
/// file is missing). `Ok(None)` when the memory controller is not enabled for it.
pub fn memory_v2(dir: &Path, swap: bool) -> Result<Option<Memory>, FsError> {
    let current = dir.join("memory.current");
    if !current.exists() {
        return Ok(None);
    }
    let usage = single_u64(&current)?;
    let stat_path = dir.join("memory.stat");
    let stat = read(&stat_path)?;
    let inactive = need_key(&stat_path, &stat, "inactive_file")?;
    let anon = need_key(&stat_path, &stat, "anon")?;
    let swapped = if swap {
        match single_u64(&dir.join("memory.swap.current")) {
            Ok(b) => Some(Bytes(b)),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    Ok(Some(
        Memory::from_raw(Bytes(usage), Bytes(inactive), Bytes(anon)).with_swap(swapped),
    ))
}

/// Memory of a v1 memcg: `memory.usage_in_bytes` and `memory.stat`
/// (`total_inactive_file`, `total_rss`, and with `swap` `total_swap`, absent where swap
/// accounting is off), as cAdvisor reads them.
pub fn memory_v1(dir: &Path, swap: bool) -> Result<Memory, FsError> {
    let usage = single_u64(&dir.join("memory.usage_in_bytes"))?;
    let stat_path = dir.join("memory.stat");
    let stat = read(&stat_path)?;
    let inactive = need_key(&stat_path, &stat, "total_inactive_file")?;
    let rss = need_key(&stat_path, &stat, "total_rss")?;
    let swapped = swap.then(|| flat_key(&stat, "total_swap")).flatten();
    Ok(Memory::from_raw(Bytes(usage), Bytes(inactive), Bytes(rss)).with_swap(swapped.map(Bytes)))
}

/// The kernel's memory figures.
pub const MEMINFO: &str = "/proc/meminfo";

/// The value of `key` (kB) in the text of `/proc/meminfo`, as bytes.
fn meminfo_bytes(text: &str, key: &str) -> Result<Bytes, FsError> {
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
        .map(|kib| Bytes(kib.saturating_mul(1024)))
        .ok_or_else(|| FsError::Parse {
            path: PathBuf::from(MEMINFO),
            reason: format!("no {key}"),
        })
}

/// The node's memory figures from `/proc/meminfo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// `MemTotal - MemFree`: the node working set's fallback where no memory controller is.
    pub used: Bytes,
    /// `SwapTotal - SwapFree`; `None` when `SwapTotal` is 0 (no swap on the node).
    pub swap: Option<Bytes>,
}

/// Parses [`MemInfo`] from the text of `/proc/meminfo`.
pub fn parse_meminfo(text: &str) -> Result<MemInfo, FsError> {
    let total = meminfo_bytes(text, "MemTotal")?;
    let free = meminfo_bytes(text, "MemFree")?;
    // Kernels without CONFIG_SWAP still print both lines, as 0.
    let swap_total = meminfo_bytes(text, "SwapTotal")?;
    let swap_free = meminfo_bytes(text, "SwapFree")?;
    Ok(MemInfo {
        used: Bytes(total.0.saturating_sub(free.0)),
        swap: (swap_total.0 > 0).then(|| Bytes(swap_total.0.saturating_sub(swap_free.0))),
    })
}

/// `Inactive(file)` from the text of `/proc/meminfo`, bytes.
pub fn parse_meminfo_inactive_file(text: &str) -> Result<Bytes, FsError> {
    meminfo_bytes(text, "Inactive(file)")
}

/// One directory of a cgroup tree.
#[derive(Clone, Debug)]
pub struct Dir {
    /// Path relative to the mount, starting with `/`.
    pub rel: String,
    /// Absolute path.
    pub abs: PathBuf,
    /// Inode number = cgroup id.
    pub ino: u64,
}

/// Walks the cgroup tree below `mount`+`root` (inclusive), parents first. Directories
/// that vanish during the walk are skipped. Bounded by `max` entries; the second value
/// is how many more were seen and left out (a lower bound: the walk stops descending).
pub fn walk(mount: &Path, root: &str, max: usize) -> Result<(Vec<Dir>, u64), FsError> {
    let abs_root = join_rel(mount, root);
    let meta = std::fs::metadata(&abs_root).map_err(|source| FsError::Read {
        path: abs_root.clone(),
        source,
    })?;
    let mut out = vec![Dir {
        rel: normalise_rel(root),
        abs: abs_root,
        ino: meta.ino(),
    }];
    let mut i = 0;
    while i < out.len() && out.len() < max {
        let (abs, rel) = (out[i].abs.clone(), out[i].rel.clone());
        i += 1;
        let entries = match std::fs::read_dir(&abs) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(source) => return Err(FsError::Read { path: abs, source }),
        };
        let mut children = Vec::new();
        for e in entries.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if !ft.is_dir() {
                continue;
            }
            let Ok(md) = e.metadata() else { continue };
            let name = e.file_name().to_string_lossy().into_owned();
            let child_rel = if rel == "/" {
                format!("/{name}")
            } else {
                format!("{rel}/{name}")
            };
            children.push(Dir {
                rel: child_rel,
                abs: e.path(),
                ino: md.ino(),
            });
        }
        children.sort_by(|a, b| a.rel.cmp(&b.rel));
        out.extend(children);
    }
    // Breadth-first: parents before children, siblings by name.
    let dropped = out.len().saturating_sub(max) as u64;
    out.truncate(max);
    Ok((out, dropped))
}

/// `/a/b` style relative path: leading slash, no trailing slash, `/` for the root.
pub fn normalise_rel(root: &str) -> String {
    let parts: Vec<&str> = root.split('/').filter(|p| !p.is_empty()).collect();
    format!("/{}", parts.join("/"))
}

/// `mount` joined with a relative cgroup path.
pub fn join_rel(mount: &Path, rel: &str) -> PathBuf {
    let rel = normalise_rel(rel);
    let trimmed = rel.trim_start_matches('/');
    if trimmed.is_empty() {
        mount.to_path_buf()
    } else {
        mount.join(trimmed)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn kept_files_read_from_the_start_each_time_and_follow_their_path() {
        let dir = std::env::temp_dir().join(format!("kpulse-kept-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("memory.stat");
        // Longer than one read chunk.
        let first = "anon 1\n".repeat(1000);
        std::fs::write(&path, &first).expect("write");
        let mut kept = KeptFile::new(path.clone());
        let mut text = String::new();
        kept.read_all(&mut text).expect("read");
        assert_eq!(text, first);
        kept.read_to_flush().expect("flush read");
        // Rewritten in place (the same inode, as a kernel file's content changes): the next
        // read starts at 0 again and sees the new content.
        let second = "anon 2\n".repeat(10);
        std::fs::write(&path, &second).expect("rewrite");
        kept.read_all(&mut text).expect("read");
        assert_eq!(text, second);

        // Not there: not found, and found again once it is.
        let mut missing = KeptFile::new(dir.join("gone"));
        let err = missing.read_to_flush().expect_err("missing file");
        assert!(err.is_not_found(), "{err}");
        assert!(missing
            .read_all(&mut text)
            .expect_err("missing")
            .is_not_found());
        std::fs::write(dir.join("gone"), "back\n").expect("write");
        missing.read_all(&mut text).expect("read after it appeared");
        assert_eq!(text, "back\n");

        // A directory opens but cannot be read: an error naming it, not a panic.
        let mut not_a_file = KeptFile::new(dir.clone());
        let err = not_a_file.read_all(&mut text).expect_err("a directory");
        assert!(!err.is_not_found());
        assert!(
            err.to_string().contains(&dir.display().to_string()),
            "{err}"
        );

        // Bounded: a file longer than the bound is refused.
        let big = dir.join("big");
        std::fs::write(&big, vec![b'x'; KEPT_FILE_MAX + 1]).expect("write");
        let err = KeptFile::new(big)
            .read_all(&mut text)
            .expect_err("too long");
        assert!(format!("{err:?}").contains("longer than"), "{err:?}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    use super::*;

    #[test]
    fn pressure_totals() {
        let text = "some avg10=0.00 avg60=0.12 avg300=0.03 total=12345\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=99\n";
        let p = Path::new("cpu.pressure");
        assert_eq!(parse_pressure_some(p, text).expect("some"), 12_345_000);
        assert!(parse_pressure_some(p, "full avg10=0.00 total=1\n").is_err());
        assert!(parse_pressure_some(p, "some avg10=0.00 total=x\n").is_err());
        assert!(parse_pressure_some(p, "").is_err());
    }

    #[test]
    fn throttling_only_with_a_quota() {
        let dir = std::env::temp_dir().join(format!("kpulse-cfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let stat = "usage_usec 10\nnr_periods 7\nnr_throttled 3\nthrottled_usec 5\n";
        std::fs::write(dir.join("cpu.stat"), stat).expect("write");
        std::fs::write(dir.join("cpu.max"), "max 100000\n").expect("write");
        assert_eq!(throttling(&dir, true, None).expect("read"), None);
        std::fs::write(dir.join("cpu.max"), "50000 100000\n").expect("write");
        assert_eq!(
            throttling(&dir, true, None).expect("read"),
            Some(Throttling {
                periods: 7,
                throttled: 3
            })
        );
        // The text the caller already read is used instead of the file.
        assert_eq!(
            throttling(&dir, true, Some("nr_periods 9\nnr_throttled 1\n")).expect("read"),
            Some(Throttling {
                periods: 9,
                throttled: 1
            })
        );
        std::fs::write(dir.join("cpu.cfs_quota_us"), "-1\n").expect("write");
        assert_eq!(throttling(&dir, false, None).expect("read"), None);
        std::fs::write(dir.join("cpu.cfs_quota_us"), "50000\n").expect("write");
        assert!(throttling(&dir, false, None).expect("read").is_some());
        std::fs::write(dir.join("cpu.stat"), "nr_periods 7\n").expect("write");
        assert!(
            throttling(&dir, false, None).is_err(),
            "a quota without nr_throttled"
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
        assert_eq!(throttling(&dir, true, None).expect("gone"), None);
    }

    #[test]
    fn flat_keys() {
        let text = "usage_usec 1234\nuser_usec 1000\nsystem_usec 234\n";
        assert_eq!(flat_key(text, "usage_usec"), Some(1234));
        assert_eq!(flat_key(text, "user_usec"), Some(1000));
        assert_eq!(flat_key(text, "usage"), None);
        assert_eq!(flat_key("usage_usec x\n", "usage_usec"), None);
    }

    #[test]
    fn meminfo_keys() {
        let text = "MemTotal:       1000 kB\nMemFree:         250 kB\nInactive(file):   10 kB\n";
        assert_eq!(
            meminfo_bytes(text, "MemTotal").expect("total"),
            Bytes(1_024_000)
        );
        assert_eq!(
            meminfo_bytes(text, "Inactive(file)").expect("inactive"),
            Bytes(10_240)
        );
        assert!(meminfo_bytes(text, "MemAvailable").is_err());
        assert!(meminfo_bytes(text, "Mem").is_err(), "a prefix is not a key");
    }

    #[test]
    fn meminfo_swap_only_where_the_node_has_swap() {
        let with = "MemTotal: 1000 kB\nMemFree: 250 kB\nSwapTotal: 4096 kB\nSwapFree: 1024 kB\n";
        let m = parse_meminfo(with).expect("meminfo");
        assert_eq!(m.used, Bytes(750 * 1024));
        assert_eq!(m.swap, Some(Bytes(3072 * 1024)));
        let used_up = "MemTotal: 1000 kB\nMemFree: 250 kB\nSwapTotal: 4096 kB\nSwapFree: 0 kB\n";
        assert_eq!(
            parse_meminfo(used_up).expect("meminfo").swap,
            Some(Bytes(4096 * 1024))
        );
        let none = "MemTotal: 1000 kB\nMemFree: 250 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n";
        assert_eq!(parse_meminfo(none).expect("meminfo").swap, None);
        let err = parse_meminfo("MemTotal: 1000 kB\nMemFree: 250 kB\n").expect_err("no swap lines");
        assert!(err.to_string().contains("SwapTotal"), "{err}");
    }

    #[test]
    fn relative_paths() {
        assert_eq!(normalise_rel(""), "/");
        assert_eq!(normalise_rel("/"), "/");
        assert_eq!(normalise_rel("a//b/"), "/a/b");
        assert_eq!(
            join_rel(Path::new("/sys/fs/cgroup"), "/"),
            PathBuf::from("/sys/fs/cgroup")
        );
        assert_eq!(
            join_rel(Path::new("/sys/fs/cgroup"), "/kubepods.slice/"),
            PathBuf::from("/sys/fs/cgroup/kubepods.slice")
        );
    }

    #[test]
    fn working_set_floors_at_zero() {
        let m = Memory::from_raw(Bytes(10), Bytes(20), Bytes(1));
        assert_eq!(m.working_set, Bytes(0));
        let m = Memory::from_raw(Bytes(30), Bytes(20), Bytes(1));
        assert_eq!(m.working_set, Bytes(10));
    }

    #[test]
    fn walk_of_a_plain_tree_is_parents_first() {
        let dir = std::env::temp_dir().join(format!("kpulse-walk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a/b")).expect("mkdir");
        std::fs::create_dir_all(dir.join("c")).expect("mkdir");
        std::fs::write(dir.join("a/file"), "x").expect("write");
        let (w, dropped) = walk(&dir, "/", 100).expect("walk");
        assert_eq!(dropped, 0);
        let rels: Vec<&str> = w.iter().map(|d| d.rel.as_str()).collect();
        assert_eq!(rels, ["/", "/a", "/c", "/a/b"]);
        let (w, dropped) = walk(&dir, "/", 2).expect("walk");
        assert_eq!(w.len(), 2);
        assert_eq!(dropped, 1, "/a/b was seen and left out... and /c");
        assert!(walk(&dir, "/missing", 10).is_err());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
