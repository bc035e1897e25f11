//! Helpers shared by the integration tests: test cgroups in every hierarchy that matters
//! (the unified one and, on hybrid nodes, the v1 memory one), removed on drop with the
//! processes placed in them.

#![allow(dead_code)]

pub mod agent;
pub mod bpf;
pub mod pki;
pub mod swap;
pub mod workload;

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

/// The time on clock `id` (`clock_gettime`), e.g. `CLOCK_BOOTTIME` or
/// `CLOCK_THREAD_CPUTIME_ID`.
pub fn clock(id: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::clock_gettime(id, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime({id})");
    Duration::new(
        u64::try_from(ts.tv_sec).expect("seconds"),
        u32::try_from(ts.tv_nsec).expect("nanoseconds"),
    )
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

impl TestCgroups {
    /// Creates child `kid` of `parent` in every hierarchy (as [`TestCgroups::create`] did
    /// for the first ones); removed on drop unless [`TestCgroups::remove_kid`] did it.
    pub fn add_kid(&mut self, layout: &Layout, parent: &str, kid: &str) -> std::io::Result<()> {
        for m in mounts(layout) {
            let c = m.join(parent).join(kid);
            std::fs::create_dir(&c)?;
            self.dirs.push(c);
        }
        Ok(())
    }

    /// Removes child `kid` (every hierarchy); false if a directory is still busy.
    pub fn remove_kid(&mut self, kid: &str) -> bool {
        let mut all = true;
        let dirs: Vec<PathBuf> = self
            .dirs
            .iter()
            .filter(|d| d.file_name().is_some_and(|n| n == kid))
            .cloned()
            .collect();
        for d in dirs {
            match std::fs::remove_dir(&d) {
                Ok(()) => self.dirs.retain(|x| x != &d),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.dirs.retain(|x| x != &d),
                Err(_) => all = false,
            }
        }
        all
    }

    /// Starts `exe workload <kind> <args...> <cgroup.procs files of kid...>` and keeps it,
    /// to be killed on drop. With `wait_ready`, returns once it printed `ready`.
    pub fn spawn_workload(
        &mut self,
        kind: &str,
        args: &[&str],
        kid: &str,
        wait_ready: bool,
    ) -> u32 {
        use std::io::BufRead;
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("workload").arg(kind).args(args);
        for f in self.procs_files(kid) {
            cmd.arg(f);
        }
        cmd.stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .stdout(if wait_ready {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            });
        let mut child = cmd.spawn().expect("spawn workload");
        let pid = child.id();
        let stdout = child.stdout.take();
        self.children.push(child);
        if let Some(out) = stdout {
            let mut line = String::new();
            std::io::BufReader::new(out)
                .read_line(&mut line)
                .expect("workload ready line");
            assert_eq!(line.trim(), "ready", "workload {kind} did not start");
        }
        pid
    }

    /// Kills workload `pid` and waits for it.
    pub fn kill(&mut self, pid: u32) {
        self.children.retain_mut(|c| {
            if c.id() != pid {
                return true;
            }
            let _ = c.kill();
            let _ = c.wait();
            false
        });
    }

    /// Reaps the workloads that have exited; returns their pids.
    pub fn reap(&mut self) -> Vec<u32> {
        let mut done = Vec::new();
        self.children.retain_mut(|c| match c.try_wait() {
            Ok(Some(_)) => {
                done.push(c.id());
                false
            }
            _ => true,
        });
        done
    }
}

/// The mounts whose hierarchies the tests create cgroups in.
pub fn mounts(layout: &Layout) -> Vec<PathBuf> {
    match layout {
        Layout::Unified { mount } => vec![mount.clone()],
        Layout::Hybrid {
            unified, memory, ..
        } => vec![unified.clone(), memory.clone()],
    }
}

/// `usage_usec` of the v2 `cpu.stat` of `rel` (relative to the cgroup2 mount), in ns.
pub fn cpu_stat_ns(layout: &Layout, rel: &str) -> u64 {
    let p = layout
        .cpu_mount()
        .join(rel.trim_start_matches('/'))
        .join("cpu.stat");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    text.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{}: no usage_usec", p.display()))
        * 1000
}

/// Outcome lines and exit status of a `harness = false` test made of named checks: runs
/// `body`, prints `N passed, M failed` like the other suites, and exits non-zero on a
/// failure. Outside CI, a failed `preflight` skips with its reason; in CI it fails.
pub fn main_of(
    name: &str,
    preflight: impl FnOnce() -> Result<(), String>,
    body: impl FnOnce() + std::panic::UnwindSafe,
) {
    if let Err(reason) = preflight() {
        if in_ci() {
            eprintln!("{name}: cannot run in CI: {reason}");
            println!("0 passed, 1 failed");
            std::process::exit(1);
        }
        println!("{name}: SKIPPED: {reason}");
        println!("0 passed, 0 failed, 1 skipped");
        return;
    }
    let started = std::time::Instant::now();
    match std::panic::catch_unwind(body) {
        Ok(()) => {
            println!("{name}: passed in {:.1} s", started.elapsed().as_secs_f64());
            println!("1 passed, 0 failed");
        }
        Err(_) => {
            println!(
                "{name}: FAILED after {:.1} s",
                started.elapsed().as_secs_f64()
            );
            println!("0 passed, 1 failed");
            std::process::exit(1);
        }
    }
}

/// Root, BTF and a loadable eBPF object: what the eBPF fault tests need.
pub fn ebpf_preflight() -> Result<(), String> {
    if !is_root() {
        return Err("needs root (creates cgroups, loads eBPF)".into());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err("kernel has no BTF".into());
    }
    let bytes = kpulse_agent::probe::object_bytes(None).map_err(|e| e.to_string())?;
    kpulse_agent::probe::CgroupIter::load(&bytes, 8)
        .map(drop)
        .map_err(|e| format!("eBPF cannot load here: {e}"))
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
