//! Ground truth: each container's own cgroup counters, read by the benchmark itself from
//! the kernel's files, every [`PERIOD`], on the realtime clock.
//!
//! - CPU: `cpuacct.usage` (ns) on cgroup v1 and hybrid layouts, `cpu.stat` `usage_usec` on
//!   pure v2: the counters kubelet's cAdvisor reads, and the ones kpulse's agent reads in
//!   eBPF.
//! - Working set, as kubelet defines it: usage minus inactive file pages (`memory.usage_in_bytes`
//!   − `total_inactive_file` on v1, `memory.current` − `inactive_file` on v2), floored at 0.
//!
//! Served values are compared with what these counters say over the window the API states
//! ([`Series::rate`]), interpolating linearly between reads.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context, Result};

/// How often every container's CPU counter is read.
pub const PERIOD: Duration = Duration::from_millis(5);
/// Memory is read every this many CPU reads (50 ms).
const MEMORY_EVERY: u32 = 10;
/// Bound on one container's samples (≈ 83 min at 5 ms).
const MAX_SAMPLES: usize = 1_000_000;

/// A container's counter files.
#[derive(Clone, Debug)]
pub struct CgroupFiles {
    cpu: PathBuf,
    v2: bool,
    /// The CPU controller's `cpu.stat` (its CFS bandwidth counters).
    cpu_stat: PathBuf,
    memory_usage: PathBuf,
    memory_stat: PathBuf,
}

impl CgroupFiles {
    /// From the OCI `cgroupsPath` (cgroupfs driver: a path below the hierarchy's root).
    pub fn for_path(cgroups_path: &str) -> Result<CgroupFiles> {
        if cgroups_path.contains(':') {
            bail!("cgroupsPath {cgroups_path:?} is systemd's form; the benchmark expects the cgroupfs driver");
        }
        let rel = cgroups_path.trim_start_matches('/');
        let root = Path::new("/sys/fs/cgroup");
        let files = if root.join("cgroup.controllers").is_file() {
            let dir = root.join(rel);
            CgroupFiles {
                cpu: dir.join("cpu.stat"),
                v2: true,
                cpu_stat: dir.join("cpu.stat"),
                memory_usage: dir.join("memory.current"),
                memory_stat: dir.join("memory.stat"),
            }
        } else {
            let cpu = v1_hierarchy(root, "cpuacct")?.join(rel);
            let mem = v1_hierarchy(root, "memory")?.join(rel);
            CgroupFiles {
                cpu: cpu.join("cpuacct.usage"),
                v2: false,
                cpu_stat: v1_hierarchy(root, "cpu")?.join(rel).join("cpu.stat"),
                memory_usage: mem.join("memory.usage_in_bytes"),
                memory_stat: mem.join("memory.stat"),
            }
        };
        files
            .cpu_ns()
            .with_context(|| format!("cgroup of {cgroups_path}"))?;
        Ok(files)
    }

    /// Cumulative CPU time, ns.
    pub fn cpu_ns(&self) -> Result<u64> {
        let text = fs::read_to_string(&self.cpu)
            .with_context(|| format!("cannot read {}", self.cpu.display()))?;
        if self.v2 {
            let usec = stat_field(&text, "usage_usec")
                .with_context(|| format!("{}: no usage_usec", self.cpu.display()))?;
            Ok(usec.saturating_mul(1000))
        } else {
            text.trim()
                .parse()
                .with_context(|| format!("{}: not a number", self.cpu.display()))
        }
    }

    /// The CFS bandwidth counters: `(nr_periods, nr_throttled)`.
    pub fn throttling(&self) -> Result<(u64, u64)> {
        let text = fs::read_to_string(&self.cpu_stat)
            .with_context(|| format!("cannot read {}", self.cpu_stat.display()))?;
        let field = |key: &str| {
            stat_field(&text, key).with_context(|| format!("{}: no {key}", self.cpu_stat.display()))
        };
        Ok((field("nr_periods")?, field("nr_throttled")?))
    }

    /// Whether the files are cgroup v2's.
    pub fn is_v2(&self) -> bool {
        self.v2
    }

    /// Memory usage, bytes.
    pub fn memory_usage(&self) -> Result<u64> {
        fs::read_to_string(&self.memory_usage)
            .with_context(|| format!("cannot read {}", self.memory_usage.display()))?
            .trim()
            .parse()
            .with_context(|| format!("{}: not a number", self.memory_usage.display()))
    }

    /// `key` of `memory.stat`.
    fn memory_stat(&self, key: &str) -> Result<u64> {
        let stat = fs::read_to_string(&self.memory_stat)
            .with_context(|| format!("cannot read {}", self.memory_stat.display()))?;
        stat_field(&stat, key).with_context(|| format!("{}: no {key}", self.memory_stat.display()))
    }

    /// Working set, bytes.
    pub fn working_set(&self) -> Result<u64> {
        let usage = self.memory_usage()?;
        let inactive = self.memory_stat(if self.v2 {
            "inactive_file"
        } else {
            "total_inactive_file"
        })?;
        Ok(usage.saturating_sub(inactive))
    }

    /// Swap, bytes, as kubelet reads it: `memory.swap.current` (v2), `total_swap` (v1; absent
    /// where swap accounting is off).
    pub fn swap(&self) -> Result<u64> {
        if !self.v2 {
            return self.memory_stat("total_swap");
        }
        let path = self.memory_control("memory.swap.current");
        fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?
            .trim()
            .parse()
            .with_context(|| format!("{}: not a number", path.display()))
    }

    /// A file of the container's memory cgroup (`memory.limit_in_bytes`, `memory.reclaim`).
    pub fn memory_control(&self, file: &str) -> PathBuf {
        self.memory_usage.with_file_name(file)
    }

    /// The directory of the pod-level cgroup (the container's parent), same layout.
    pub fn pod_level(&self) -> Option<CgroupFiles> {
        let up = |p: &Path| -> Option<PathBuf> {
            let name = p.file_name()?.to_owned();
            Some(p.parent()?.parent()?.join(name))
        };
        Some(CgroupFiles {
            cpu: up(&self.cpu)?,
            v2: self.v2,
            cpu_stat: up(&self.cpu_stat)?,
            memory_usage: up(&self.memory_usage)?,
            memory_stat: up(&self.memory_stat)?,
        })
    }
}

/// The v1 hierarchy holding `controller` (`cpuacct`, or `cpu,cpuacct` where co-mounted).
fn v1_hierarchy(root: &Path, controller: &str) -> Result<PathBuf> {
    for entry in fs::read_dir(root).with_context(|| format!("cannot list {}", root.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_string_lossy().split(',').any(|c| c == controller) {
            return Ok(entry.path());
        }
    }
    bail!(
        "no cgroup v1 hierarchy with {controller} under {}",
        root.display()
    )
}

/// `key value` lines (`cpu.stat`, `memory.stat`).
fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Nanoseconds since the epoch, now.
pub fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// One container's reads.
#[derive(Debug, Default, Clone)]
pub struct Series {
    /// `(unix ns, cpu ns)`, in time order.
    pub cpu: Vec<(i128, u64)>,
    /// `(unix ns, working set bytes)`.
    pub memory: Vec<(i128, u64)>,
}

impl Series {
    /// The CPU counter at `t`, interpolated; `None` outside the reads.
    pub fn cpu_at(&self, t: i128) -> Option<f64> {
        let i = self.cpu.partition_point(|(at, _)| *at <= t);
        if i == 0 || i >= self.cpu.len() {
            return (i > 0 && self.cpu[i - 1].0 == t).then(|| self.cpu[i - 1].1 as f64);
        }
        let (t0, c0) = self.cpu[i - 1];
        let (t1, c1) = self.cpu[i];
        let f = (t - t0) as f64 / (t1 - t0) as f64;
        Some(c0 as f64 + f * (c1 as f64 - c0 as f64))
    }

    /// Cores over `[t0, t1]`.
    pub fn rate(&self, t0: i128, t1: i128) -> Option<f64> {
        if t1 <= t0 {
            return None;
        }
        Some((self.cpu_at(t1)? - self.cpu_at(t0)?) / (t1 - t0) as f64)
    }

    /// The working set read nearest to `t` (within 100 ms).
    pub fn memory_near(&self, t: i128) -> Option<u64> {
        let i = self.memory.partition_point(|(at, _)| *at <= t);
        [i.checked_sub(1), Some(i)]
            .into_iter()
            .flatten()
            .filter_map(|j| self.memory.get(j))
            .min_by_key(|(at, _)| (at - t).abs())
            .filter(|(at, _)| (at - t).abs() <= 100_000_000)
            .map(|(_, m)| *m)
    }
}

/// Reads every registered container's counters on a thread of its own.
pub struct Sampler {
    targets: Arc<Mutex<BTreeMap<String, CgroupFiles>>>,
    data: Arc<Mutex<BTreeMap<String, Series>>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Sampler {
    pub fn start() -> Sampler {
        let targets: Arc<Mutex<BTreeMap<String, CgroupFiles>>> = Arc::default();
        let data: Arc<Mutex<BTreeMap<String, Series>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (targets, data, stop) = (targets.clone(), data.clone(), stop.clone());
            thread::spawn(move || {
                let mut n: u32 = 0;
                while !stop.load(Ordering::Relaxed) {
                    let now: Vec<(String, CgroupFiles)> = match targets.lock() {
                        Ok(t) => t.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                        Err(_) => return,
                    };
                    let with_memory = n.is_multiple_of(MEMORY_EVERY);
                    let mut reads = Vec::with_capacity(now.len());
                    for (key, files) in &now {
                        // A container that is gone stops being read; its series stays.
                        let Ok(cpu) = files.cpu_ns() else { continue };
                        let at = now_ns();
                        let mem = with_memory.then(|| files.working_set().ok()).flatten();
                        reads.push((key, at, cpu, mem));
                    }
                    if let Ok(mut d) = data.lock() {
                        for (key, at, cpu, mem) in reads {
                            let s = d.entry(key.clone()).or_default();
                            if s.cpu.len() < MAX_SAMPLES {
                                s.cpu.push((at, cpu));
                                if let Some(m) = mem {
                                    s.memory.push((at, m));
                                }
                            }
                        }
                    }
                    n = n.wrapping_add(1);
                    thread::sleep(PERIOD);
                }
            })
        };
        Sampler {
            targets,
            data,
            stop,
            thread: Some(thread),
        }
    }

    /// Starts reading `files` under `key`.
    pub fn watch(&self, key: &str, files: CgroupFiles) {
        if let Ok(mut t) = self.targets.lock() {
            t.insert(key.to_string(), files);
        }
    }

    /// A copy of `key`'s reads so far.
    pub fn series(&self, key: &str) -> Series {
        self.data
            .lock()
            .ok()
            .and_then(|d| d.get(key).cloned())
            .unwrap_or_default()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_interpolate_between_reads() {
        let s = Series {
            cpu: vec![(0, 0), (1_000, 500), (2_000, 1_500)],
            memory: vec![(0, 10), (1_000, 20)],
        };
        assert_eq!(s.cpu_at(500), Some(250.0));
        assert_eq!(s.cpu_at(2_000), Some(1_500.0));
        assert_eq!(s.cpu_at(2_001), None);
        assert_eq!(s.cpu_at(-1), None);
        assert_eq!(s.rate(500, 1_500), Some(0.75));
        assert_eq!(s.rate(1_500, 500), None);
        assert_eq!(s.memory_near(900), Some(20));
        assert_eq!(s.memory_near(200_000_000), None);
    }

    #[test]
    fn stat_files() {
        assert_eq!(
            stat_field("usage_usec 12\nuser_usec 3\n", "usage_usec"),
            Some(12)
        );
        assert_eq!(
            stat_field("total_inactive_file 4096\n", "inactive_file"),
            None
        );
    }
}
