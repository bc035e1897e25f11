//! Where the cgroup hierarchies are mounted, and which layout the node uses.
//!
//! Two layouts are supported:
//! - **unified** (pure cgroup v2, every current Kubernetes node): one `cgroup2` mount
//!   carries CPU and memory;
//! - **hybrid** (systemd's hybrid mode): the `cpuacct` and `memory` controllers sit on
//!   cgroup v1 hierarchies, and a `cgroup2` mount (usually `/sys/fs/cgroup/unified`)
//!   carries no controllers but still keeps every cgroup's base CPU statistics.
//!
//! Detection reads `/proc/self/mountinfo`; nothing is assumed from one distribution's
//! mount points.

use std::path::{Path, PathBuf};

/// Errors from layout detection.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// mountinfo could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// No usable combination of mounts.
    #[error("no supported cgroup layout: {0}")]
    Unsupported(String),
}

/// The cgroup layout of this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Pure cgroup v2.
    Unified {
        /// The cgroup2 mount point.
        mount: PathBuf,
    },
    /// v1 controllers plus a controller-less cgroup2 mount.
    Hybrid {
        /// The cgroup2 mount point (base CPU statistics).
        unified: PathBuf,
        /// The v1 hierarchy carrying `cpuacct`.
        cpuacct: PathBuf,
        /// The v1 hierarchy carrying `memory`.
        memory: PathBuf,
        /// The v1 hierarchy carrying `cpu` (CFS bandwidth control), often the `cpuacct`
        /// one; `None` when it is not mounted.
        cpu: Option<PathBuf>,
    },
}

impl Layout {
    /// Short name for logs and JSON: `"unified"` or `"hybrid"`.
    pub fn name(&self) -> &'static str {
        match self {
            Layout::Unified { .. } => "unified",
            Layout::Hybrid { .. } => "hybrid",
        }
    }

    /// The hierarchy whose cgroups carry CPU time (base stat or `cpuacct`).
    pub fn cpu_mount(&self) -> &Path {
        match self {
            Layout::Unified { mount } => mount,
            Layout::Hybrid { unified, .. } => unified,
        }
    }

    /// The hierarchy whose cgroups carry memory statistics.
    pub fn memory_mount(&self) -> &Path {
        match self {
            Layout::Unified { mount } => mount,
            Layout::Hybrid { memory, .. } => memory,
        }
    }

    /// The hierarchy whose cgroups carry CFS bandwidth control (`cpu` controller), if any.
    pub fn cfs_mount(&self) -> Option<&Path> {
        match self {
            Layout::Unified { mount } => Some(mount),
            Layout::Hybrid { cpu, .. } => cpu.as_deref(),
        }
    }

    /// Detects the layout of the running system.
    pub fn detect() -> Result<Layout, LayoutError> {
        let path = PathBuf::from("/proc/self/mountinfo");
        let text = std::fs::read_to_string(&path).map_err(|source| LayoutError::Read {
            path: path.clone(),
            source,
        })?;
        Self::from_mountinfo(&text)
    }

    /// Decides the layout from the text of a mountinfo file.
    pub fn from_mountinfo(text: &str) -> Result<Layout, LayoutError> {
        let mut unified: Option<(PathBuf, Vec<String>)> = None;
        let mut cpuacct: Option<PathBuf> = None;
        let mut memory: Option<PathBuf> = None;
        let mut cpu: Option<PathBuf> = None;
        for line in text.lines() {
            let Some(m) = parse_mount_line(line) else {
                continue;
            };
            match m.fstype.as_str() {
                "cgroup2" => {
                    // Several mounts of a hierarchy (bind mounts, a chroot's /sys): prefer
                    // the standard place, then the shortest path.
                    let better = unified
                        .as_ref()
                        .is_none_or(|(p, _)| preferred(&m.mount_point, p));
                    if better {
                        let controllers = read_controllers(&m.mount_point);
                        unified = Some((m.mount_point, controllers));
                    }
                }
                "cgroup" => {
                    let opts: Vec<&str> = m.super_options.split(',').collect();
                    if opts.contains(&"cpuacct")
                        && cpuacct
                            .as_ref()
                            .is_none_or(|p| preferred(&m.mount_point, p))
                    {
                        cpuacct = Some(m.mount_point.clone());
                    }
                    if opts.contains(&"memory")
                        && memory.as_ref().is_none_or(|p| preferred(&m.mount_point, p))
                    {
                        memory = Some(m.mount_point.clone());
                    }
                    if opts.contains(&"cpu")
                        && cpu.as_ref().is_none_or(|p| preferred(&m.mount_point, p))
                    {
                        cpu = Some(m.mount_point.clone());
                    }
                }
                _ => {}
            }
        }
        match (unified, cpuacct, memory) {
            (Some((unified, _)), Some(cpuacct), Some(memory)) => Ok(Layout::Hybrid {
                unified,
                cpuacct,
                memory,
                cpu,
            }),
            (Some((mount, controllers)), None, None) => {
                let has = |name: &str| controllers.iter().any(|c| c == name);
                if !controllers.is_empty() && (!has("memory") || !has("cpu")) {
                    return Err(LayoutError::Unsupported(format!(
                        "cgroup2 at {} lacks the cpu/memory controllers ({}) and no v1 hierarchy has them",
                        mount.display(),
                        controllers.join(" ")
                    )));
                }
                Ok(Layout::Unified { mount })
            }
            (None, _, _) => Err(LayoutError::Unsupported(
                "no cgroup2 mount (pure cgroup v1 is not supported; enable the unified hierarchy)"
                    .into(),
            )),
            (Some((mount, _)), c, m) => Err(LayoutError::Unsupported(format!(
                "cgroup2 at {} but v1 cpuacct={} memory={}: a hybrid layout needs both",
                mount.display(),
                c.map_or("absent".into(), |p| p.display().to_string()),
                m.map_or("absent".into(), |p| p.display().to_string()),
            ))),
        }
    }
}

/// Whether mount point `a` is a better choice than `b` for the same hierarchy.
fn preferred(a: &Path, b: &Path) -> bool {
    let std_place = |p: &Path| p.starts_with("/sys/fs/cgroup");
    match (std_place(a), std_place(b)) {
        (true, false) => true,
        (false, true) => false,
        _ => a.as_os_str().len() < b.as_os_str().len(),
    }
}

struct Mount {
    mount_point: PathBuf,
    fstype: String,
    super_options: String,
}

/// Parses one mountinfo line:
/// `id parent maj:min root mount-point options [optional...] - fstype source super-options`.
fn parse_mount_line(line: &str) -> Option<Mount> {
    let (left, right) = line.split_once(" - ")?;
    let mount_point = left.split(' ').nth(4)?;
    let mut r = right.split(' ');
    let fstype = r.next()?.to_string();
    let _source = r.next()?;
    let super_options = r.next().unwrap_or("").to_string();
    Some(Mount {
        mount_point: PathBuf::from(unescape_octal(mount_point)),
        fstype,
        super_options,
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn read_controllers(mount: &Path) -> Vec<String> {
    std::fs::read_to_string(mount.join("cgroup.controllers"))
        .map(|s| s.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn hybrid_layout() {
        let l = Layout::from_mountinfo(HYBRID).expect("hybrid");
        assert_eq!(
            l,
            Layout::Hybrid {
                unified: "/sys/fs/cgroup/unified".into(),
                cpuacct: "/sys/fs/cgroup/cpuacct".into(),
                memory: "/sys/fs/cgroup/memory".into(),
                cpu: Some("/sys/fs/cgroup/cpu".into()),
            }
        );
        assert_eq!(l.cpu_mount(), Path::new("/sys/fs/cgroup/unified"));
        assert_eq!(l.memory_mount(), Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(l.cfs_mount(), Some(Path::new("/sys/fs/cgroup/cpu")));
    }

    #[test]
    fn joint_cpu_cpuacct_hierarchy() {
        let text = "\
30 25 0:26 / /sys/fs/cgroup/unified rw shared:5 - cgroup2 cgroup2 rw,nsdelegate
33 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw shared:9 - cgroup cgroup rw,cpu,cpuacct
34 25 0:30 / /sys/fs/cgroup/memory rw shared:10 - cgroup cgroup rw,memory
";
        let l = Layout::from_mountinfo(text).expect("hybrid");
        assert_eq!(
            l,
            Layout::Hybrid {
                unified: "/sys/fs/cgroup/unified".into(),
                cpuacct: "/sys/fs/cgroup/cpu,cpuacct".into(),
                memory: "/sys/fs/cgroup/memory".into(),
                cpu: Some("/sys/fs/cgroup/cpu,cpuacct".into()),
            }
        );
        assert_eq!(l.cfs_mount(), Some(Path::new("/sys/fs/cgroup/cpu,cpuacct")));
    }

    #[test]
    fn bind_mounts_elsewhere_do_not_win() {
        let text = "\
90 80 0:32 / /tmp/chroot/sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
91 80 0:38 / /tmp/chroot/sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
92 80 0:30 / /tmp/c/cpuacct rw - cgroup cgroup rw,cpuacct
"
        .to_string()
            + HYBRID;
        let l = Layout::from_mountinfo(&text).expect("hybrid");
        assert_eq!(
            l,
            Layout::Hybrid {
                unified: "/sys/fs/cgroup/unified".into(),
                cpuacct: "/sys/fs/cgroup/cpuacct".into(),
                memory: "/sys/fs/cgroup/memory".into(),
                cpu: Some("/sys/fs/cgroup/cpu".into()),
            }
        );
    }

    #[test]
    fn unified_layout() {
        let text = "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        assert_eq!(
            Layout::from_mountinfo(text).expect("unified"),
            Layout::Unified {
                mount: "/sys/fs/cgroup".into()
            }
        );
    }

    #[test]
    fn pure_v1_is_refused_with_reason() {
        let text = "33 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        let err = Layout::from_mountinfo(text).expect_err("v1 only");
        assert!(err.to_string().contains("no cgroup2 mount"), "{err}");
    }

    #[test]
    fn escaped_mount_points() {
        let text = "29 23 0:26 / /mnt/cg\\040v2 rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            Layout::from_mountinfo(text).expect("unified"),
            Layout::Unified {
                mount: "/mnt/cg v2".into()
            }
        );
    }

    #[test]
    fn garbage_lines_are_ignored() {
        assert!(Layout::from_mountinfo("garbage\n\n - - -\n1 2 3\n").is_err());
    }
}
