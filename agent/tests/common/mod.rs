//! Helpers shared by the integration tests: test cgroups in every hierarchy that matters
//! (the unified one and, on hybrid nodes, the v1 memory one), removed on drop with the
//! processes placed in them.

#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    process::Child,
    time::Duration,
};

use kpulse_agent::layout::Layout;

/// Whether the test runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    #[allow(unsafe_code)]
    let uid = unsafe { libc::geteuid() };
    uid == 0
}

/// `CI=true` or `CI=1`: tests must not skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The cgroups of a test, in every hierarchy that matters; removed on drop, after the
/// processes in them are killed.
pub struct TestCgroups {
    /// Every directory created, parents first.
    pub dirs: Vec<PathBuf>,
    /// Processes to kill on drop.
    pub children: Vec<Child>,
    /// Files to remove on drop.
    pub files: Vec<PathBuf>,
}

impl TestCgroups {
    /// Creates `parent` and its `kids` below each hierarchy's mount.
    pub fn create(layout: &Layout, parent: &str, kids: &[&str]) -> TestCgroups {
        let mounts: Vec<PathBuf> = match layout {
            Layout::Unified { mount } => vec![mount.clone()],
            Layout::Hybrid {
                unified, memory, ..
            } => vec![unified.clone(), memory.clone()],
        };
        let mut dirs = Vec::new();
        for m in &mounts {
            let p = m.join(parent);
            std::fs::create_dir(&p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
            dirs.push(p.clone());
            if matches!(layout, Layout::Unified { .. }) {
                enable_controllers(m, &p);
            }
            for k in kids {
                let c = p.join(k);
                std::fs::create_dir(&c).unwrap_or_else(|e| panic!("mkdir {}: {e}", c.display()));
                dirs.push(c);
            }
        }
        TestCgroups {
            dirs,
            children: Vec::new(),
            files: Vec::new(),
        }
    }

    /// The `cgroup.procs` files of cgroup `kid`, one per hierarchy.
    pub fn procs_files(&self, kid: &str) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .filter(|d| d.file_name().is_some_and(|n| n == kid))
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }

    /// Moves a running process into cgroup `kid` (every hierarchy) and keeps it, to be
    /// killed on drop.
    pub fn adopt(&mut self, child: Child, kid: &str) {
        let pid = child.id();
        self.children.push(child);
        for f in self.procs_files(kid) {
            std::fs::write(&f, pid.to_string())
                .unwrap_or_else(|e| panic!("move {pid} into {}: {e}", f.display()));
        }
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Children first, then parents; retry briefly while the kernel releases them.
        for d in self.dirs.iter().rev() {
            for _ in 0..50 {
                match std::fs::remove_dir(d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    }
}

/// Delegates cpu and memory from the root to `parent` (pure cgroup v2).
pub fn enable_controllers(mount: &Path, parent: &Path) {
    // The root must delegate cpu and memory for the parent to have them.
    let root_ctl = mount.join("cgroup.subtree_control");
    let _ = std::fs::write(&root_ctl, "+cpu +memory");
    std::fs::write(parent.join("cgroup.subtree_control"), "+cpu +memory")
        .unwrap_or_else(|e| panic!("enable cpu/memory in {}: {e}", parent.display()));
}

/// A response body fed from a channel (the in-test aggregators' streams).
pub struct ChannelBody(pub tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}
