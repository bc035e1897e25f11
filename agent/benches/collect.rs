//! `cargo bench -p kpulse-agent --bench collect` (root, BPF): the numbers behind
//! docs/benchmarks.md and docs/design/collection.md.
//!
//! 1. CPU time (user + system of the collecting thread, `CLOCK_THREAD_CPUTIME_ID`) of one
//!    full collection cycle at 100, 1,000 and 10,000 cgroups, eBPF iterator vs cgroupfs
//!    scan of the same cgroups, side by side in one run; plus the iterator program's own
//!    kernel run time per cgroup (`BPF_ENABLE_STATS`).
//! 2. The scheduler-path alternative (`tp_btf/sched_switch`): its cost per event under a
//!    context-switch storm, and its accuracy against `/proc/PID/schedstat` for a task
//!    spinning alone on a CPU, next to the iterator's.

use std::{
    io::{Read, Write},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use kpulse_agent::{
    collect::{CgroupfsCollector, Collector, EbpfCollector, Scope},
    layout::Layout,
    probe::{self, SchedSwitch},
};

const SIZES: [usize; 3] = [100, 1_000, 10_000];

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing useful either.
    if std::env::args().any(|a| a == "workload-spin") {
        spin_forever();
    }
    #[allow(unsafe_code)]
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("collect bench: SKIPPED: needs root (creates cgroups, loads eBPF)");
        return;
    }
    let object = match probe::object_bytes(
        std::env::var_os("KPULSE_EBPF_OBJECT")
            .map(PathBuf::from)
            .as_deref(),
    ) {
        Ok(o) => o,
        Err(e) => {
            println!("collect bench: SKIPPED: {e}");
            return;
        }
    };
    let layout = Layout::detect().expect("layout");
    let quick = std::env::var_os("KPULSE_BENCH_QUICK").is_some();
    let parent = format!("kpulse-bench-{}", std::process::id());
    let mut tree = Tree::new(&layout, &parent);
    println!("## Collection cycle CPU time\n");
    println!(
        "kernel {}, layout {}, {} CPUs; median of N cycles (p90 in brackets)\n",
        osrelease(),
        layout.name(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "| cgroups | eBPF cycle | eBPF in-kernel per cgroup | cgroupfs cycle | cgroupfs / eBPF |"
    );
    println!("|---:|---:|---:|---:|---:|");
    let stats_fd = aya::sys::enable_stats(aya::sys::Stats::RunTime).expect("BPF_ENABLE_STATS");
    for &n in &SIZES {
        if quick && n > 1_000 {
            break;
        }
        tree.grow_to(n);
        let scope = Scope {
            layout: layout.clone(),
            root: format!("/{parent}"),
            max_cgroups: 100_000,
            signals: Default::default(),
        };
        let mut ebpf = EbpfCollector::new(scope.clone(), None).expect("eBPF collector");
        let mut fs = CgroupfsCollector::new(scope);
        let iters = if n >= 10_000 { 10 } else { 30 };
        let got = ebpf.collect().expect("collect").cgroups.len();
        assert!(got >= n, "eBPF saw {got} cgroups, expected at least {n}");
        let before = iter_prog_stats();
        let e = measure(&mut ebpf, iters);
        let after = iter_prog_stats();
        let per_cgroup = match (before, after) {
            (Some((t0, c0)), Some((t1, c1))) if c1 > c0 => {
                format!("{:.0} ns", (t1 - t0) as f64 / ((c1 - c0) as f64))
            }
            _ => "n/a".into(),
        };
        let f = measure(&mut fs, iters);
        println!(
            "| {n} | {} ({}) | {per_cgroup} | {} ({}) | {:.1}x |",
            fmt(e.0),
            fmt(e.1),
            fmt(f.0),
            fmt(f.1),
            f.0.as_secs_f64() / e.0.as_secs_f64()
        );
    }
    drop(tree);

    println!("\n## Scheduler-path program (tp_btf/sched_switch), for comparison\n");
    let sched = SchedSwitch::attach(&object).expect("attach sched_switch");
    let (ns_per_event, events) = switch_storm(&sched, Duration::from_secs(2));
    println!("- cost per scheduler event: {ns_per_event:.1} ns (in-kernel run time / run count over {events} events during a pipe ping-pong storm)");
    accuracy_vs_sched(&layout, &object, &sched);
    drop(sched);
    drop(stats_fd);
}

fn fmt(d: Duration) -> String {
    if d >= Duration::from_millis(1) {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.0} µs", d.as_secs_f64() * 1e6)
    }
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: ts is a valid timespec to write into.
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Median and p90 CPU time of one `collect()`.
fn measure(c: &mut dyn Collector, iters: usize) -> (Duration, Duration) {
    for _ in 0..3 {
        c.collect().expect("collect");
    }
    let mut v: Vec<Duration> = (0..iters)
        .map(|_| {
            let t = thread_cpu();
            std::hint::black_box(c.collect().expect("collect"));
            thread_cpu() - t
        })
        .collect();
    v.sort();
    (v[v.len() / 2], v[(v.len() * 9 / 10).min(v.len() - 1)])
}

/// (run_time_ns, run_count) of the loaded `cgroup_stats` program(s).
fn iter_prog_stats() -> Option<(u64, u64)> {
    let mut acc = None;
    for p in aya::programs::loaded_programs().flatten() {
        if p.name_as_str() == Some("cgroup_stats") {
            let (t, c) = acc.unwrap_or((0, 0));
            acc = Some((t + p.run_time().as_nanos() as u64, c + p.run_count()));
        }
    }
    acc
}

/// A bench cgroup tree: `p<i>/c` pairs (a pod and its container), in every hierarchy.
struct Tree {
    roots: Vec<PathBuf>,
    made: Vec<PathBuf>,
    count: usize,
}

impl Tree {
    fn new(layout: &Layout, parent: &str) -> Tree {
        let mounts: Vec<PathBuf> = match layout {
            Layout::Unified { mount } => vec![mount.clone()],
            Layout::Hybrid {
                unified, memory, ..
            } => vec![unified.clone(), memory.clone()],
        };
        let mut roots = Vec::new();
        for m in mounts {
            let r = m.join(parent);
            std::fs::create_dir(&r).expect("mkdir bench root");
            if matches!(layout, Layout::Unified { .. }) {
                let _ = std::fs::write(m.join("cgroup.subtree_control"), "+cpu +memory");
                std::fs::write(r.join("cgroup.subtree_control"), "+cpu +memory")
                    .expect("enable controllers");
            }
            roots.push(r);
        }
        Tree {
            made: roots.clone(),
            roots,
            count: 1,
        }
    }

    fn grow_to(&mut self, n: usize) {
        while self.count < n {
            let pod_name = format!("p{}", self.count / 2);
            for r in &self.roots {
                let pod = r.join(&pod_name);
                std::fs::create_dir(&pod).expect("mkdir pod");
                self.made.push(pod.clone());
                let c = pod.join("c");
                std::fs::create_dir(&c).expect("mkdir container");
                self.made.push(c);
            }
            self.count += 2;
        }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        for d in self.made.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Two threads bouncing a byte through pipes: a context switch per hop.
fn switch_storm(sched: &SchedSwitch, dur: Duration) -> (f64, u64) {
    let id = sched.program_id().expect("program id");
    let stats = || {
        aya::programs::loaded_programs()
            .flatten()
            .find(|p| p.id() == id)
            .map(|p| (p.run_time().as_nanos() as u64, p.run_count()))
            .expect("sched_switch info")
    };
    let (t0, c0) = stats();
    let (mut a_r, mut a_w) = pipe();
    let (mut b_r, mut b_w) = pipe();
    let end = Instant::now() + dur;
    let h = std::thread::spawn(move || {
        let mut buf = [0u8; 1];
        while a_r.read_exact(&mut buf).is_ok() && buf[0] == 1 {
            if b_w.write_all(&buf).is_err() {
                break;
            }
        }
    });
    let mut buf = [1u8; 1];
    while Instant::now() < end {
        a_w.write_all(&[1]).expect("ping");
        b_r.read_exact(&mut buf).expect("pong");
    }
    let _ = a_w.write_all(&[0]);
    let _ = h.join();
    let (t1, c1) = stats();
    ((t1 - t0) as f64 / (c1 - c0).max(1) as f64, c1 - c0)
}

fn pipe() -> (std::fs::File, std::fs::File) {
    let mut fds = [0; 2];
    #[allow(unsafe_code)]
    // SAFETY: fds has room for two descriptors; on success both are new and owned here.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0, "pipe");
        use std::os::fd::FromRawFd;
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    }
}

/// A task spinning alone on CPU 1 for 2 s: CPU time by the iterator and by the
/// scheduler-path program, against `/proc/PID/schedstat`.
fn accuracy_vs_sched(layout: &Layout, _object: &[u8], sched: &SchedSwitch) {
    let parent = format!("kpulse-bench-acc-{}", std::process::id());
    let dir = layout.cpu_mount().join(&parent);
    std::fs::create_dir(&dir).expect("mkdir");
    let mut mem_dir = None;
    if let Layout::Hybrid { memory, .. } = layout {
        let d = memory.join(&parent);
        std::fs::create_dir(&d).expect("mkdir");
        mem_dir = Some(d);
    }
    let id = std::fs::metadata(&dir)
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .expect("ino");
    let exe = std::env::current_exe().expect("exe");
    let mut child = std::process::Command::new(exe)
        .arg("workload-spin")
        .spawn()
        .expect("spawn spinner");
    let pid = child.id();
    std::fs::write(dir.join("cgroup.procs"), pid.to_string()).expect("move spinner");
    if let Some(d) = &mem_dir {
        std::fs::write(d.join("cgroup.procs"), pid.to_string()).expect("move spinner");
    }
    std::thread::sleep(Duration::from_millis(300));
    let scope = Scope {
        layout: layout.clone(),
        root: format!("/{parent}"),
        max_cgroups: 10,
        signals: Default::default(),
    };
    let mut ebpf = EbpfCollector::new(scope, None).expect("collector");
    let path = format!("/{parent}");
    let read_iter = |c: &mut EbpfCollector| {
        c.collect()
            .expect("collect")
            .cgroups
            .iter()
            .find(|s| *s.path == *path)
            .and_then(|s| s.cpu)
            .expect("cpu")
            .0
    };
    let mut rows = Vec::new();
    for _ in 0..5 {
        let truth0 = schedstat(pid);
        let it0 = read_iter(&mut ebpf);
        let sc0 = sched.cpu_ns(id).expect("sched map");
        std::thread::sleep(Duration::from_secs(2));
        let truth1 = schedstat(pid);
        let it1 = read_iter(&mut ebpf);
        let sc1 = sched.cpu_ns(id).expect("sched map");
        let truth = (truth1 - truth0) as f64;
        rows.push((
            ((it1 - it0) as f64 - truth) / truth * 100.0,
            ((sc1 - sc0) as f64 - truth) / truth * 100.0,
        ));
    }
    let _ = child.kill();
    let _ = child.wait();
    drop(ebpf);
    for _ in 0..50 {
        if std::fs::remove_dir(&dir).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(d) = mem_dir {
        let _ = std::fs::remove_dir(d);
    }
    println!("- accuracy over 2 s windows, task spinning alone on a CPU, error against /proc/PID/schedstat:");
    println!(
        "\n| window | iter/cgroup (kernel counters) | tp_btf/sched_switch (credit at switch-out) |"
    );
    println!("|---:|---:|---:|");
    for (i, (a, b)) in rows.iter().enumerate() {
        println!("| {} | {a:+.3} % | {b:+.3} % |", i + 1);
    }
}

fn schedstat(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .expect("schedstat")
}

fn spin_forever() -> ! {
    let mut set: libc::cpu_set_t = {
        #[allow(unsafe_code)]
        // SAFETY: cpu_set_t is plain data.
        unsafe {
            std::mem::zeroed()
        }
    };
    #[allow(unsafe_code)]
    // SAFETY: set is a valid cpu_set_t.
    unsafe {
        libc::CPU_SET(1, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    loop {
        std::hint::spin_loop();
    }
}

fn osrelease() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[allow(dead_code)]
fn exists(p: &Path) -> bool {
    p.exists()
}
