//! Collector accuracy against ground truth, on this machine's kernel (and, through
//! `cargo xtask test-vm`, on Debian's 6.1 and 6.12 kernels with pure cgroup v2).
//!
//! Creates a cgroup subtree `kpulse-acc-<pid>` with three children, runs in them
//! a busy loop pinned to one CPU, a ~50 % duty-cycle burner, and a process that touches
//! 64 MiB (plus 16 MiB of page cache), then checks over a 2 s window:
//! - each collector's CPU delta is within ±2 % of `/proc/PID/schedstat` read just before
//!   and just after each collection (the truth lies between the two reads);
//! - each collector's working set is within ±2 % of the kernel's cgroup files read at
//!   the same tick;
//! - the cgroupfs collector gives the same answers as eBPF; `auto` falls back to it with
//!   a warning when eBPF cannot load;
//! - a cgroup made while the eBPF collector runs has its creation instant (`birth`),
//!   between boot-clock reads just before and after the `mkdir`; one made before it has
//!   none, and a v1 hierarchy's cgroup is not taken for a v2 one (see `births`);
//! - in the VM stage only, stepping the wall clock back and forward changes no window
//!   between two samples (see `clock_steps`);
//! - afterwards no cgroup, process or BPF program of the test is left.
//!
//! Needs root and BPF. Outside CI it skips with a reason when they are missing; with
//! `CI=true` it fails instead.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

mod common;

use common::TestCgroups;
use kpulse_agent::{
    cgroupfs,
    collect::{self, CgroupfsCollector, Collector, EbpfCollector, Mode, Scope, Signals},
    layout::Layout,
    sample::{CgroupSample, Snapshot, Source},
};

const TOLERANCE: f64 = 0.02;
const WINDOW: Duration = Duration::from_secs(2);
const TOUCH_MIB: usize = 64;
const CACHE_MIB: usize = 16;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("workload") {
        workload(&args[2..]);
        return;
    }
    let ci = common::in_ci();
    if let Err(reason) = preflight() {
        if ci {
            eprintln!("accuracy: cannot run in CI: {reason}");
            println!("0 passed, 1 failed");
            std::process::exit(1);
        }
        println!("accuracy: SKIPPED: {reason}");
        println!("0 passed, 0 failed, 1 skipped");
        return;
    }
    let result = std::panic::catch_unwind(run);
    let leftovers = leftover_check();
    match (result, leftovers) {
        (Ok(checks), Ok(())) => {
            println!("accuracy: {checks} checks passed");
            println!("1 passed, 0 failed");
        }
        (Ok(_), Err(e)) => {
            eprintln!("accuracy: left behind: {e}");
            println!("0 passed, 1 failed");
            std::process::exit(1);
        }
        (Err(_), l) => {
            if let Err(e) = l {
                eprintln!("accuracy: also left behind: {e}");
            }
            println!("0 passed, 1 failed");
            std::process::exit(1);
        }
    }
}

fn preflight() -> Result<(), String> {
    if !common::is_root() {
        return Err("needs root (creates cgroups, loads eBPF)".into());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err("kernel has no BTF".into());
    }
    let bytes = kpulse_agent::probe::object_bytes(object_override().as_deref())
        .map_err(|e| e.to_string())?;
    let iter = kpulse_agent::probe::CgroupIter::load(&bytes, 64)
        .map_err(|e| format!("eBPF cannot load here: {e}"))?;
    if let Some(id) = iter.program_id() {
        remember_program(id);
    }
    Ok(())
}

fn object_override() -> Option<PathBuf> {
    std::env::var_os("KPULSE_EBPF_OBJECT").map(PathBuf::from)
}

/// The accuracy test's own uses of the shared test cgroups.
impl TestCgroups {
    /// Makes cgroup `kid` a dying one: a process writes page cache charged to it and exits,
    /// then the cgroup is removed while the cache (kept in a file) still pins its memcg.
    /// The kernel keeps such cgroups on its lists, and the iterator walks past them.
    fn make_dying(&mut self, kid: &str) {
        self.fill_page_cache(kid);
        let dirs: Vec<PathBuf> = self
            .dirs
            .iter()
            .filter(|d| d.file_name().is_some_and(|n| n == kid))
            .cloned()
            .collect();
        for d in dirs {
            let mut removed = false;
            for _ in 0..100 {
                if std::fs::remove_dir(&d).is_ok() {
                    removed = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(removed, "could not remove {}", d.display());
            self.dirs.retain(|x| x != &d);
        }
    }

    /// Charges 8 MiB of page cache to cgroup `kid`: a process joins it, writes a file (kept,
    /// removed on drop) and exits.
    fn fill_page_cache(&mut self, kid: &str) {
        let file = std::env::temp_dir().join(format!("kpulse-cache-{kid}-{}", std::process::id()));
        self.files.push(file.clone());
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        cmd.arg("workload").arg("pagecache").arg(&file);
        for f in self.procs_files(kid) {
            cmd.arg(f);
        }
        let status = cmd.status().expect("run pagecache workload");
        assert!(status.success(), "pagecache workload failed: {status}");
    }

    /// Starts `workload <kind>` of this executable inside cgroup `kid`; returns its pid
    /// once it reports ready (moved into its cgroups and warmed up).
    fn spawn(&mut self, kind: &str, kid: &str) -> u32 {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        cmd.arg("workload").arg(kind);
        for f in self.procs_files(kid) {
            cmd.arg(f);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn workload");
        let pid = child.id();
        let stdout = child.stdout.take().expect("stdout");
        self.children.push(child);
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("workload ready line");
        assert_eq!(line.trim(), "ready", "workload {kind} did not start");
        pid
    }
}

fn schedstat_ns(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).expect("schedstat");
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("schedstat first field")
}

fn find<'a>(snap: &'a Snapshot, path: &str) -> &'a CgroupSample {
    snap.cgroups
        .iter()
        .find(|c| &*c.path == path)
        .unwrap_or_else(|| panic!("{} snapshot has no {path}", snap.source))
}

fn rel_err(got: f64, want: f64) -> f64 {
    if want == 0.0 {
        if got == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        (got - want).abs() / want
    }
}

/// How far `got` lies outside `[low, high]`, relative to the bound it passed (0 inside).
fn outside(got: f64, low: f64, high: f64) -> f64 {
    if got < low {
        (low - got) / low
    } else if got > high {
        (got - high) / high
    } else {
        0.0
    }
}

/// The kernel's own memory figures of cgroup `kid`, from its files (swap included).
fn file_memory(layout: &Layout, parent: &str, kid: &str) -> kpulse_agent::sample::Memory {
    match layout {
        Layout::Unified { mount } => cgroupfs::memory_v2(&mount.join(parent).join(kid), true)
            .expect("memory files")
            .expect("memory controller enabled"),
        Layout::Hybrid { memory, .. } => {
            cgroupfs::memory_v1(&memory.join(parent).join(kid), true).expect("memory files")
        }
    }
}

/// The kernel's own working set of cgroup `kid`, from its files.
fn file_working_set(layout: &Layout, parent: &str, kid: &str) -> u64 {
    file_memory(layout, parent, kid).working_set.0
}

/// The node's CPU time as the kubelet reads it (ns): the root's `cpu.stat` on pure v2, the
/// root's `cpuacct.usage` on a hybrid node.
fn kubelet_node_cpu(layout: &Layout) -> u64 {
    let read = |p: PathBuf| std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
    match layout {
        Layout::Unified { mount } => {
            cgroupfs::flat_key(&read(mount.join("cpu.stat")), "usage_usec").expect("usage_usec")
                * 1000
        }
        Layout::Hybrid { cpuacct, .. } => read(cpuacct.join("cpuacct.usage"))
            .trim()
            .parse()
            .expect("cpuacct.usage"),
    }
}

/// The node's working set as the kubelet computes it: on pure v2 `anon + file -
/// inactive_file` of the root's `memory.stat` (runc's root usage), on a hybrid node the root
/// memcg's `memory.usage_in_bytes - total_inactive_file`.
fn kubelet_node_working_set(layout: &Layout) -> u64 {
    let read = |p: PathBuf| std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
    let key = |t: &str, k: &str| cgroupfs::flat_key(t, k).unwrap_or_else(|| panic!("no {k}"));
    match layout {
        Layout::Unified { mount } => {
            let stat = read(mount.join("memory.stat"));
            (key(&stat, "anon") + key(&stat, "file")).saturating_sub(key(&stat, "inactive_file"))
        }
        Layout::Hybrid { memory, .. } => {
            let usage: u64 = read(memory.join("memory.usage_in_bytes"))
                .trim()
                .parse()
                .expect("usage_in_bytes");
            usage.saturating_sub(key(
                &read(memory.join("memory.stat")),
                "total_inactive_file",
            ))
        }
    }
}

/// Swap area the swap check adds when the node has none.
const SWAP_AREA_MIB: u64 = 128;
/// The swap cgroup's memory limit, and what its process touches: the rest goes to swap.
const SWAP_LIMIT_MIB: u64 = 24;

/// Sets cgroup `kid`'s memory limit (v2 `memory.max`, v1 `memory.limit_in_bytes`).
fn limit_memory(layout: &Layout, parent: &str, kid: &str, bytes: u64) {
    let file = match layout {
        Layout::Unified { mount } => mount.join(parent).join(kid).join("memory.max"),
        Layout::Hybrid { memory, .. } => {
            memory.join(parent).join(kid).join("memory.limit_in_bytes")
        }
    };
    std::fs::write(&file, bytes.to_string())
        .unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
}

/// Swap as kubelet reads it (a container's `memory.swap.current` on v2, `total_swap` on v1;
/// the node's `SwapTotal - SwapFree`), from both collectors against the kernel's files
/// read just before and after each collection, within ±2 % of that bracket. The node gets
/// swap for the check when it has none (see `common::swap`); a process touches 64 MiB in
/// cgroup `swap` limited to 24 MiB, so that about 40 MiB goes to swap. Ends with the
/// process killed, before the swap area can be removed.
fn swap_figures(
    collectors: &mut [&mut dyn Collector],
    layout: &Layout,
    cg: &mut TestCgroups,
    parent: &str,
    failures: &mut Vec<String>,
) -> usize {
    let area = common::swap::Swap::ensure(SWAP_AREA_MIB).expect("a swap area");
    limit_memory(layout, parent, "swap", SWAP_LIMIT_MIB << 20);
    let pid = cg.spawn("touch", "swap");
    let path = format!("/{parent}/swap");
    let mut checks = 0;
    for collector in collectors.iter_mut() {
        let source = collector.source();
        let before = file_memory(layout, parent, "swap")
            .swap
            .expect("swap accounting");
        let node_before = common::swap::swap_used();
        let snap = collector.collect().expect("collect");
        let after = file_memory(layout, parent, "swap")
            .swap
            .expect("swap accounting");
        let node_after = common::swap::swap_used();
        let (lo, hi) = (before.0.min(after.0), before.0.max(after.0));
        if hi < 8 << 20 {
            failures.push(format!(
                "swap: only {hi} B of the workload went to swap; the check means nothing"
            ));
        }
        let within = |got: u64, lo: u64, hi: u64| {
            got as f64 >= lo as f64 * (1.0 - TOLERANCE)
                && got as f64 <= hi as f64 * (1.0 + TOLERANCE)
        };
        match find(&snap, &path).memory.and_then(|m| m.swap) {
            Some(got) => {
                println!(
                    "accuracy: {source:8} swap {path}: collector {} B, kernel files {lo} … {hi} B",
                    got.0
                );
                if !within(got.0, lo, hi) {
                    failures.push(format!("{source} swap: {} B, files {lo} … {hi} B", got.0));
                }
            }
            None => failures.push(format!("{source} swap: none reported on a node with swap")),
        }
        let (nlo, nhi) = (node_before.min(node_after), node_before.max(node_after));
        match snap.node.swap {
            Some(got) => {
                println!(
                    "accuracy: {source:8} swap node: collector {} B, /proc/meminfo {nlo} … {nhi} B",
                    got.0
                );
                if !within(got.0, nlo, nhi) {
                    failures.push(format!(
                        "{source} node swap: {} B, meminfo {nlo} … {nhi} B",
                        got.0
                    ));
                }
            }
            None => failures.push(format!("{source} node swap: none on a node with swap")),
        }
        checks += 2;
    }
    cg.kill(pid);
    drop(area);
    checks
}

/// The signals `custom.metrics.k8s.io` serves (`--custom-metrics`): each collector's PSI
/// `some` totals and CFS counters of cgroup `throttled` (a busy loop under a 10 % CPU quota,
/// so throttled every period and stalled for CPU), and the memory pressure of cgroup
/// `swap` (after [`swap_figures`]), against the kernel's files read just before and just
/// after the collection. A read of a pressure file brings the kernel's
/// totals up to date, so the walk's totals lie between the two reads, as the counters do.
/// Without `--custom-metrics` no collector reports them, a cgroup without a quota has no
/// throttling figure, and one whose PSI is switched off (`cgroup.pressure` 0) no pressure
/// figure.
fn signals_against_files(
    layout: &Layout,
    scope: &Scope,
    cg: &mut TestCgroups,
    parent: &str,
    plain: &Snapshot,
    failures: &mut Vec<String>,
) -> usize {
    let mut checks = 0;
    let path = format!("/{parent}/throttled");
    checks += 1;
    if plain
        .cgroups
        .iter()
        .any(|c| c.pressure.is_some() || c.throttling.is_some())
    {
        failures.push("signals reported without --custom-metrics".into());
    }
    // The quota, on the hierarchy carrying the cpu controller.
    let Some(cfs_mount) = layout.cfs_mount().map(Path::to_path_buf) else {
        failures.push(format!("no cpu controller hierarchy in {layout:?}"));
        return checks;
    };
    let v2 = matches!(layout, Layout::Unified { .. });
    let cfs_dir = cfs_mount.join(parent).join("throttled");
    if !v2 {
        for d in [cfs_mount.join(parent), cfs_dir.clone()] {
            std::fs::create_dir(&d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
            cg.dirs.push(d);
        }
        std::fs::write(cfs_dir.join("cpu.cfs_quota_us"), "10000").expect("v1 quota");
    } else {
        std::fs::write(cfs_dir.join("cpu.max"), "10000 100000").expect("v2 quota");
    }
    cg.spawn("spin", "throttled");
    std::thread::sleep(Duration::from_millis(1500));
    let psi_dir = |kid: &str| layout.cpu_mount().join(parent).join(kid);
    let pressure = |kid: &str| {
        cgroupfs::pressure(&psi_dir(kid))
            .expect("pressure files")
            .expect("PSI on")
    };
    let throttling = || {
        cgroupfs::throttling(&cfs_dir, v2, None)
            .expect("cpu.stat")
            .expect("a quota")
    };
    let with = Scope {
        signals: Signals {
            pressure: true,
            throttling: true,
        },
        ..scope.clone()
    };
    let mut ebpf =
        EbpfCollector::new(with.clone(), object_override().as_deref()).expect("eBPF collector");
    remember(&ebpf);
    let mut fs = CgroupfsCollector::new(with);
    for c in [&mut ebpf as &mut dyn Collector, &mut fs] {
        let source = c.source();
        // `throttled` for CPU pressure and throttling; `swap` (its memory pushed out to
        // swap by `swap_figures`: reclaim is a memory stall) for memory pressure.
        let (p0, t0, m0) = (pressure("throttled"), throttling(), pressure("swap"));
        let snap = c.collect().expect("collect");
        let (p1, t1, m1) = (pressure("throttled"), throttling(), pressure("swap"));
        let got = find(&snap, &path);
        let swap = find(&snap, &format!("/{parent}/swap"));
        let pairs = [
            (
                "cpu some",
                "throttled",
                got.pressure.map(|p| p.cpu_some_ns),
                p0.cpu_some_ns,
                p1.cpu_some_ns,
            ),
            (
                "memory some",
                "throttled",
                got.pressure.map(|p| p.memory_some_ns),
                p0.memory_some_ns,
                p1.memory_some_ns,
            ),
            (
                "memory some",
                "swap",
                swap.pressure.map(|p| p.memory_some_ns),
                m0.memory_some_ns,
                m1.memory_some_ns,
            ),
            (
                "periods",
                "throttled",
                got.throttling.map(|t| t.periods),
                t0.periods,
                t1.periods,
            ),
            (
                "throttled",
                "throttled",
                got.throttling.map(|t| t.throttled),
                t0.throttled,
                t1.throttled,
            ),
        ];
        for (what, kid, got, low, high) in pairs {
            checks += 1;
            println!(
                "accuracy: {source:8} {what:11} {kid:9}: collector {got:?}, files {low} … {high}"
            );
            let Some(got) = got else {
                failures.push(format!("{source} {what}: no figure for /{parent}/{kid}"));
                continue;
            };
            let slack = |v: u64| (v as f64 * TOLERANCE) as u64;
            if got + slack(low) < low || got > high + slack(high) {
                failures.push(format!(
                    "{source} {what} {kid}: collector {got}, files {low} … {high}"
                ));
            }
        }
        // Throttled every period, stalled waiting for CPU, and stalled in reclaim.
        checks += 1;
        if t1.throttled == 0 || p1.cpu_some_ns == 0 || m1.memory_some_ns == 0 {
            failures.push(format!(
                "no throttling, CPU or memory pressure to measure: {t1:?} {p1:?} {m1:?}"
            ));
        }
        checks += 1;
        let spin = find(&snap, &format!("/{parent}/spin"));
        if spin.throttling.is_some() {
            failures.push(format!(
                "{source}: a throttling figure for a cgroup without a quota"
            ));
        }
    }
    // The eBPF walk's averaged readings: present, and never ahead of the current totals
    // (which the files print in whole µs: an averaged total of an idle cgroup equals the
    // current one to the ns, and is then ahead of the file by the truncated ns).
    let snap = ebpf.collect().expect("collect");
    let p = pressure("throttled");
    checks += 1;
    match find(&snap, &path).pressure.and_then(|p| p.averaged) {
        Some(a)
            if a.at_ns > 0 && a.cpu_some_ns / 1000 <= p.cpu_some_ns / 1000 && a.cpu_some_ns > 0 => {
        }
        other => failures.push(format!(
            "ebpf: averaged PSI reading {other:?}, files then {p:?}"
        )),
    }
    checks += windows_against_files(
        [&mut ebpf as &mut dyn Collector, &mut fs],
        &path,
        &psi_dir("throttled"),
        &cfs_dir,
        v2,
        failures,
    );
    // PSI switched off for one cgroup (`cgroup.pressure` 0, which the kernel has had since
    // 6.1): no pressure figure for it, never 0; the others keep theirs.
    let switch = psi_dir("throttled").join("cgroup.pressure");
    std::fs::write(&switch, "0").unwrap_or_else(|e| panic!("write {}: {e}", switch.display()));
    for c in [&mut ebpf as &mut dyn Collector, &mut fs] {
        let snap = c.collect().expect("collect");
        let (off, on) = (
            find(&snap, &path).pressure,
            find(&snap, &format!("/{parent}/swap")).pressure,
        );
        println!(
            "accuracy: {:8} pressure with cgroup.pressure 0: {off:?}; another cgroup: {on:?}",
            c.source()
        );
        checks += 1;
        if off.is_some() || on.is_none() {
            failures.push(format!(
                "{}: cgroup.pressure 0 gave {off:?}, another cgroup {on:?}",
                c.source()
            ));
        }
    }
    drop(ebpf);
    checks
}

/// The shares `--custom-metrics` sends (`kpulse_agent::window`) against the files, for the
/// busy loop under a 10 % quota: both collectors every second for a window (10 s) and a few
/// seconds more, the files every 200 ms meanwhile. Each collector's CPU pressure and
/// throttled share must lie within ±2 % of the range the files show over spans of the
/// figure's own length (±200 ms) that end at the collection, or (eBPF, whose windows end at
/// the kernel's last averaging) up to 2 s and a tick before it.
fn windows_against_files(
    collectors: [&mut dyn Collector; 2],
    path: &str,
    psi_dir: &Path,
    cfs_dir: &Path,
    v2: bool,
    failures: &mut Vec<String>,
) -> usize {
    use kpulse_agent::window::Windows;
    use std::sync::atomic::{AtomicBool, Ordering};
    const WINDOW: Duration = Duration::from_secs(10);
    const EVERY: Duration = Duration::from_millis(200);
    let now = || kpulse_wire::UnixNanos::from_system_time(std::time::SystemTime::now()).0;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    // (t, cpu some ns, periods, throttled)
    let sampler = {
        let (stop, psi_dir, cfs_dir) = (stop.clone(), psi_dir.to_path_buf(), cfs_dir.to_path_buf());
        std::thread::spawn(move || {
            let mut v = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let p = cgroupfs::pressure(&psi_dir).ok().flatten();
                let t = cgroupfs::throttling(&cfs_dir, v2, None).ok().flatten();
                if let (Some(p), Some(t)) = (p, t) {
                    v.push((now(), p.cpu_some_ns, t.periods, t.throttled));
                }
                std::thread::sleep(EVERY);
            }
            v
        })
    };
    let mut windows = [
        Windows::new(WINDOW, Duration::from_secs(1)),
        Windows::new(WINDOW, Duration::from_secs(1)),
    ];
    let mut last = [None, None];
    let [a, b] = collectors;
    let mut collectors = [a, b];
    let until = Instant::now() + WINDOW + Duration::from_secs(4);
    while Instant::now() < until {
        for (i, c) in collectors.iter_mut().enumerate() {
            let snap = c.collect().expect("collect");
            windows[i].observe(&snap);
            let id = find(&snap, path).id;
            last[i] = Some((c.source(), snap.timestamp.0, windows[i].figures(id)));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    std::thread::sleep(EVERY * 2);
    stop.store(true, Ordering::Relaxed);
    let files = sampler.join().expect("the file sampler");
    let mut checks = 0;
    for (source, end, figures) in last.into_iter().flatten() {
        let slack: u64 = if source == Source::Ebpf {
            3_500_000_000
        } else {
            300_000_000
        };
        let every = EVERY.as_nanos() as u64;
        for (what, fraction) in [
            ("cpu pressure", figures.and_then(|f| f.signals.cpu_pressure)),
            ("throttled", figures.and_then(|f| f.signals.cpu_throttled)),
        ] {
            checks += 1;
            let Some(f) = fraction else {
                failures.push(format!("{source} {what}: no share after a window"));
                continue;
            };
            let got = f64::from(f.ppm) / 1e6;
            let w = u64::from(f.window_ms) * 1_000_000;
            let mut range: Option<(f64, f64)> = None;
            for e in files
                .iter()
                .filter(|e| e.0 + slack + every >= end && e.0 <= end + every)
            {
                for s in files
                    .iter()
                    .filter(|s| s.0 + w <= e.0 + every && e.0 <= s.0 + w + every)
                {
                    let share = if what == "throttled" {
                        let periods = e.2.saturating_sub(s.2);
                        (periods > 0).then(|| e.3.saturating_sub(s.3) as f64 / periods as f64)
                    } else {
                        let dt = e.0.saturating_sub(s.0);
                        (dt > 0).then(|| e.1.saturating_sub(s.1) as f64 / dt as f64)
                    };
                    if let Some(v) = share {
                        range = Some(range.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))));
                    }
                }
            }
            println!(
                "accuracy: {source:8} window {what:12}: {got:.6} over {} ms, files {range:?}",
                f.window_ms
            );
            match range {
                Some((lo, hi))
                    if got >= lo * (1.0 - TOLERANCE)
                        && got <= hi * (1.0 + TOLERANCE)
                        && f.window_ms >= WINDOW.as_millis() as u32 => {}
                _ => failures.push(format!(
                    "{source} window {what}: {got} over {} ms, files {range:?}",
                    f.window_ms
                )),
            }
        }
    }
    checks
}

/// An eBPF collector over the whole hierarchy, as the agent runs in a cluster.
fn whole_hierarchy(layout: &Layout) -> EbpfCollector {
    let whole = Scope {
        layout: layout.clone(),
        root: "/".into(),
        max_cgroups: 100_000,
        signals: Default::default(),
    };
    let ebpf = EbpfCollector::new(whole, object_override().as_deref()).expect("eBPF collector");
    remember(&ebpf);
    ebpf
}

/// A collector over a whole hierarchy flushes the CPU statistics through the top-level
/// cgroups (the root's `cpu.stat` flushes nothing), so it must follow the top level: a
/// top-level cgroup made after the collector started gets flushed from the tick after the
/// walk first sees it. Its process burns some CPU and is killed, so its counter then stands
/// still, and the collector's second figure must equal `cpu.stat`'s, read afterwards.
/// Without the flush the figure would stay at whatever another reader last flushed (on
/// 6.18, whose CPU and memory statistics are flushed separately, nothing else flushes it).
fn late_top_level_cgroup(layout: &Layout, failures: &mut Vec<String>) -> usize {
    let mut ebpf = whole_hierarchy(layout);
    ebpf.collect().expect("collect");
    let name = format!("kpulse-acc-{}-late", std::process::id());
    let dir = layout.cpu_mount().join(&name);
    std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    let mut cg = TestCgroups {
        dirs: vec![dir],
        children: Vec::new(),
        files: Vec::new(),
    };
    let pid = cg.spawn("spin", &name);
    std::thread::sleep(Duration::from_millis(300));
    cg.kill(pid);
    let path = format!("/{name}");
    let mut got = None;
    for _ in 0..2 {
        let snap = ebpf.collect().expect("collect");
        got = snap
            .cgroups
            .iter()
            .find(|c| *c.path == *path)
            .and_then(|c| c.cpu)
            .map(|c| c.0);
    }
    let truth = common::cpu_stat_ns(layout, &path);
    println!(
        "accuracy: ebpf     cpu of a top-level cgroup made after the start, at rest: collector {got:?} ns, cpu.stat {truth} ns"
    );
    let Some(got) = got else {
        failures.push(format!(
            "top-level cgroup {path} made after the start not reported"
        ));
        return 1;
    };
    if truth < 50_000_000 || rel_err(got as f64, truth as f64) > TOLERANCE {
        failures.push(format!(
            "top-level cgroup made after the start: collector {got} ns, cpu.stat {truth} ns (not flushed?)"
        ));
    }
    1
}

/// Largest difference allowed between the eBPF working set of a cgroup whose page cache was
/// just written and the one its files give: what the kernel leaves unflushed below its
/// threshold (a batch of 64 pages per CPU), on hosts of up to 4 CPUs.
const FRESH_SLACK: u64 = 1 << 20;

/// The eBPF walk reads `memcg->vmstats` as they stand, so the collector must flush them
/// first, as every reader of `memory.stat` does. Page cache written into a cgroup just
/// before a collection raises its usage (a page counter, always exact) at once, and its
/// `inactive_file` only once flushed: read unflushed, the working set would count the new
/// cache as in use until the kernel's periodic flush (every 2 s).
///
/// Checked for a collector over a subtree (which reads its scope root's `memory.stat` to
/// flush) and for one over the whole hierarchy, as in a cluster, where the read of the
/// root's `memory.stat` for the node's figures is the flush. `kid` is a cgroup of its own
/// for each.
fn fresh_memory_statistics(
    ebpf: &mut EbpfCollector,
    scope: &str,
    layout: &Layout,
    cg: &mut TestCgroups,
    (parent, kid): (&str, &str),
    failures: &mut Vec<String>,
) -> usize {
    cg.fill_page_cache(kid);
    let snap = ebpf.collect().expect("collect");
    let ws_file = file_working_set(layout, parent, kid);
    let ws = find(&snap, &format!("/{parent}/{kid}"))
        .memory
        .expect("memory")
        .working_set
        .0;
    println!(
        "accuracy: ebpf     working set right after 8 MiB of page cache, {scope}: collector {ws} B, kernel files {ws_file} B"
    );
    if ws.abs_diff(ws_file) > FRESH_SLACK {
        failures.push(format!(
            "ebpf over {scope}: working set after new page cache: {ws} B, kernel files {ws_file} B (unflushed statistics?)"
        ));
    }
    1
}

fn run() -> usize {
    let layout = Layout::detect().expect("layout");
    let parent = format!("kpulse-acc-{}", std::process::id());
    println!(
        "accuracy: layout {} ({layout:?}), kernel {}",
        layout.name(),
        kernel()
    );
    let mut cg = TestCgroups::create(
        &layout,
        &parent,
        &[
            "spin",
            "duty",
            "mem",
            "gone",
            "fresh",
            "fresh-whole",
            "swap",
            "throttled",
        ],
    );
    cg.make_dying("gone");
    let pids = [
        ("spin", cg.spawn("spin", "spin")),
        ("duty", cg.spawn("duty", "duty")),
        ("mem", cg.spawn("touch", "mem")),
    ];
    let scope = Scope {
        layout: layout.clone(),
        root: format!("/{parent}"),
        max_cgroups: 1000,
        signals: Default::default(),
    };
    let mut ebpf =
        EbpfCollector::new(scope.clone(), object_override().as_deref()).expect("eBPF collector");
    println!("accuracy: kernel layout {:?}", ebpf.kernel_layout());
    let mut failures = Vec::new();
    let mut checks = births(&ebpf, &layout, &mut cg, &parent, &mut failures);
    checks += fresh_memory_statistics(
        &mut ebpf,
        "its subtree",
        &layout,
        &mut cg,
        (&parent, "fresh"),
        &mut failures,
    );
    {
        let mut whole = whole_hierarchy(&layout);
        whole.collect().expect("collect");
        checks += fresh_memory_statistics(
            &mut whole,
            "the whole hierarchy",
            &layout,
            &mut cg,
            (&parent, "fresh-whole"),
            &mut failures,
        );
    }
    checks += late_top_level_cgroup(&layout, &mut failures);
    let mut fs = CgroupfsCollector::new(scope.clone());

    for collector in [
        &mut ebpf as &mut dyn Collector,
        &mut fs as &mut dyn Collector,
    ] {
        let source = collector.source();
        // Ground truth is read just before and just after each collection: the counter the
        // collector saw lies between the two reads, so the delta it reports must lie
        // between the shortest and the longest bracketed truth. A delay between a read and
        // a collection (a busy host; a VM's vCPU descheduled) widens the bracket instead of
        // being counted as the collector's error.
        let truth0_before: Vec<u64> = pids.iter().map(|(_, p)| schedstat_ns(*p)).collect();
        let node0_before = kubelet_node_cpu(&layout);
        let s0 = collector.collect().expect("collect");
        let node0_after = kubelet_node_cpu(&layout);
        let truth0_after: Vec<u64> = pids.iter().map(|(_, p)| schedstat_ns(*p)).collect();
        let t0 = Instant::now();
        std::thread::sleep(WINDOW.saturating_sub(t0.elapsed()));
        let truth1_before: Vec<u64> = pids.iter().map(|(_, p)| schedstat_ns(*p)).collect();
        let node1_before = kubelet_node_cpu(&layout);
        let s1 = collector.collect().expect("collect");
        let node1_after = kubelet_node_cpu(&layout);
        let node_ws_file = kubelet_node_working_set(&layout);
        let truth1_after: Vec<u64> = pids.iter().map(|(_, p)| schedstat_ns(*p)).collect();
        let ws_file = file_working_set(&layout, &parent, "mem");

        // The node's figures are the kubelet's (what metrics-server serves for the node).
        let got = s1.node.cpu.0.saturating_sub(s0.node.cpu.0) as f64;
        let (low, high) = (
            node1_before.saturating_sub(node0_after) as f64,
            node1_after.saturating_sub(node0_before) as f64,
        );
        let err = outside(got, low, high);
        println!(
            "accuracy: {source:8} node cpu: collector {got:.0} ns, kubelet's file {low:.0} … {high:.0} ns, error {:.3} % outside that",
            err * 100.0
        );
        checks += 1;
        if err > 0.02 {
            failures.push(format!("{source} node cpu: error {:.3} %", err * 100.0));
        }
        let node_ws = s1.node.memory_working_set.0;
        let err = rel_err(node_ws as f64, node_ws_file as f64);
        println!(
            "accuracy: {source:8} node working set: collector {node_ws} B, kubelet's files {node_ws_file} B, error {:.3} %",
            err * 100.0
        );
        checks += 1;
        if err > 0.02 {
            failures.push(format!(
                "{source} node working set: error {:.3} %",
                err * 100.0
            ));
        }
        for (i, (kid, _)) in pids.iter().enumerate() {
            if *kid == "mem" {
                continue;
            }
            let path = format!("/{parent}/{kid}");
            let c0 = find(&s0, &path).cpu.expect("cpu").0;
            let c1 = find(&s1, &path).cpu.expect("cpu").0;
            let got = (c1 - c0) as f64;
            let low = truth1_before[i].saturating_sub(truth0_after[i]) as f64;
            let high = truth1_after[i].saturating_sub(truth0_before[i]) as f64;
            let err = outside(got, low, high);
            println!(
                "accuracy: {source:8} cpu  {kid:4}: collector {:>12.0} ns, schedstat {:>12.0} … {:>12.0} ns, error {:+.3} % outside that",
                got,
                low,
                high,
                if got < low { -err } else { err } * 100.0
            );
            checks += 1;
            if err > TOLERANCE {
                failures.push(format!("{source} cpu {kid}: error {:.3} %", err * 100.0));
            }
        }
        let ws = find(&s1, &format!("/{parent}/mem"))
            .memory
            .expect("memory")
            .working_set
            .0;
        let err = rel_err(ws as f64, ws_file as f64);
        println!(
            "accuracy: {source:8} working set mem: collector {ws} B, kernel files {ws_file} B, error {:+.3} %",
            (ws as f64 - ws_file as f64) / ws_file as f64 * 100.0
        );
        checks += 1;
        if err > TOLERANCE {
            failures.push(format!("{source} working set: error {:.3} %", err * 100.0));
        }
        let min = ((TOUCH_MIB as u64) << 20) * 98 / 100;
        checks += 1;
        if ws < min {
            failures.push(format!(
                "{source} working set {ws} B below the {TOUCH_MIB} MiB touched"
            ));
        }
    }

    // Same answers from both collectors at (nearly) the same instant.
    let a = ebpf.collect().expect("collect");
    let b = fs.collect().expect("collect");
    checks += 1;
    let gone = format!("/{parent}/gone");
    if a.cgroups.iter().any(|c| *c.path == *gone) || b.cgroups.iter().any(|c| *c.path == *gone) {
        failures.push(format!("removed cgroup {gone} reported"));
    }
    checks += 1;
    let live = |s: &Snapshot| {
        let mut v: Vec<&str> = s.cgroups.iter().map(|c| &*c.path).collect();
        v.sort();
        v.join(" ")
    };
    if live(&a) != live(&b) {
        failures.push(format!(
            "collectors see different cgroups: ebpf [{}] cgroupfs [{}]",
            live(&a),
            live(&b)
        ));
    }
    for kid in ["spin", "duty", "mem"] {
        let path = format!("/{parent}/{kid}");
        let (ea, fb) = (find(&a, &path), find(&b, &path));
        checks += 1;
        if ea.id != fb.id {
            failures.push(format!(
                "{path}: ids differ: ebpf {:?}, cgroupfs {:?}",
                ea.id, fb.id
            ));
        }
        let (ma, mb) = (ea.memory.expect("memory"), fb.memory.expect("memory"));
        checks += 1;
        if rel_err(ma.working_set.0 as f64, mb.working_set.0 as f64) > TOLERANCE {
            failures.push(format!("{path}: working sets differ: {ma:?} vs {mb:?}"));
        }
        checks += 1;
        if rel_err(ma.rss.0 as f64, mb.rss.0 as f64) > TOLERANCE {
            failures.push(format!("{path}: rss differs: {ma:?} vs {mb:?}"));
        }
    }
    checks += 1;
    let (na, nb) = (
        a.node.memory_working_set.0 as f64,
        b.node.memory_working_set.0 as f64,
    );
    if rel_err(na, nb) > 0.05 {
        failures.push(format!("node working set differs: {na} vs {nb}"));
    }
    assert_eq!(a.source, Source::Ebpf);
    assert_eq!(b.source, Source::Cgroupfs);

    checks += names(&mut ebpf, &layout, &mut cg, &parent, &mut failures);

    // No swap on the node: no swap figure for it, and cgroupfs reads no swap file.
    if common::swap::swap_total_kb() == 0 {
        checks += 1;
        let fs_swap = find(&b, &format!("/{parent}/mem"))
            .memory
            .and_then(|m| m.swap);
        if a.node.swap.is_some() || b.node.swap.is_some() || fs_swap.is_some() {
            failures.push(format!(
                "swap reported on a node without swap: node {:?} / {:?}, cgroupfs mem {fs_swap:?}",
                a.node.swap, b.node.swap
            ));
        }
    }
    checks += swap_figures(
        &mut [&mut ebpf as &mut dyn Collector, &mut fs],
        &layout,
        &mut cg,
        &parent,
        &mut failures,
    );
    checks += signals_against_files(&layout, &scope, &mut cg, &parent, &a, &mut failures);

    // --max-cgroups bounds what is reported, and the rest is counted, never silently lost.
    let small = Scope {
        max_cgroups: 2,
        signals: Default::default(),
        ..scope.clone()
    };
    let mut small_ebpf =
        EbpfCollector::new(small.clone(), object_override().as_deref()).expect("eBPF collector");
    remember(&small_ebpf);
    let mut small_fs = CgroupfsCollector::new(small);
    for c in [
        &mut small_ebpf as &mut dyn Collector,
        &mut small_fs as &mut dyn Collector,
    ] {
        let snap = c.collect().expect("collect");
        checks += 1;
        if snap.cgroups.len() != 2 || snap.dropped < 2 {
            failures.push(format!(
                "{}: max_cgroups 2 gave {} cgroups, {} dropped",
                snap.source,
                snap.cgroups.len(),
                snap.dropped
            ));
        }
    }
    drop(small_ebpf);

    // A wrong memcg statistics index (what a kernel reordering its table would cause) is
    // caught when the collector starts, not served.
    let mut wrong = *ebpf.kernel_layout();
    std::mem::swap(&mut wrong.vmstats_anon, &mut wrong.vmstats_inactive_file);
    checks += 1;
    match EbpfCollector::with_layout(scope.clone(), object_override().as_deref(), Some(wrong)) {
        Err(e) if e.to_string().contains("memcg_vmstats layout") => {}
        Err(e) => failures.push(format!("wrong layout refused for another reason: {e}")),
        Ok(c) => {
            remember(&c);
            failures.push("a collector with swapped memcg indices started".into());
        }
    }

    // auto falls back to cgroupfs when the object cannot load, and says why.
    let bogus = std::env::temp_dir().join(format!("kpulse-bogus-{}.o", std::process::id()));
    std::fs::write(&bogus, b"not an ELF object").expect("write bogus object");
    let (c, reason) = collect::select(Mode::Auto, scope.clone(), Some(&bogus)).expect("select");
    checks += 1;
    if c.source() != Source::Cgroupfs || reason.is_none() {
        failures.push("auto did not fall back to cgroupfs with a reason".into());
    }
    drop(c);
    checks += agent_binary_fallback(&bogus, &parent, &mut failures);
    let _ = std::fs::remove_file(&bogus);

    // Clock steps: only inside a throwaway VM, whose wall clock nobody else depends on.
    if std::env::var("KPULSE_IN_VM").is_ok_and(|v| v == "1") {
        checks += clock_steps(&mut ebpf, &format!("/{parent}/spin"), &mut failures);
    } else {
        println!(
            "accuracy: clock steps are checked in the VM stage only (this host's clock is shared)"
        );
    }

    drop(ebpf);
    let pids: Vec<u32> = pids.iter().map(|(_, p)| *p).collect();
    drop(cg);
    checks += 1;
    for pid in pids {
        if Path::new(&format!("/proc/{pid}")).exists() {
            failures.push(format!("workload process {pid} still exists"));
        }
    }
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("accuracy: FAILED: {f}");
        }
        panic!("{} accuracy checks failed", failures.len());
    }
    checks
}

/// Boot-clock nanoseconds (`CLOCK_BOOTTIME`, the clock the eBPF program reads).
fn boottime_ns() -> u64 {
    u64::try_from(common::clock(libc::CLOCK_BOOTTIME).as_nanos()).expect("nanoseconds")
}

/// The `cgroup_mkdir` program's creation instants: a cgroup made now has one, inside the
/// boot-clock bracket of its `mkdir`; `spin` (made before the collector loaded) has none;
/// on a hybrid node, the v1 memory cgroup made by the same `add_kid` is not recorded
/// under its own (v1) id.
/// Walks copy a cgroup's name only when its record slot held another cgroup or another
/// name: none in a tree that did not change, the new ones after a mkdir; a renamed cgroup
/// (v1 hierarchies only: the default hierarchy cannot rename) gets its new path.
fn names(
    ebpf: &mut EbpfCollector,
    layout: &Layout,
    cg: &mut TestCgroups,
    parent: &str,
    failures: &mut Vec<String>,
) -> usize {
    let copied = |ebpf: &EbpfCollector| ebpf.stats().walk_names_copied;
    let paths =
        |s: &Snapshot| -> Vec<String> { s.cgroups.iter().map(|c| c.path.to_string()).collect() };
    ebpf.collect().expect("collect");
    let steady = ebpf.collect().expect("collect");
    let mut checks = 1;
    if copied(ebpf) != 0 {
        failures.push(format!(
            "names: {} names copied in a tree that did not change ({:?})",
            copied(ebpf),
            paths(&steady)
        ));
    }
    cg.add_kid(layout, parent, "late").expect("mkdir");
    let grown = ebpf.collect().expect("collect");
    let late = format!("/{parent}/late");
    checks += 1;
    if copied(ebpf) == 0 || !paths(&grown).contains(&late) {
        failures.push(format!(
            "names: after a mkdir {} names copied, paths {:?}",
            copied(ebpf),
            paths(&grown)
        ));
    }
    ebpf.collect().expect("collect");
    checks += 1;
    if copied(ebpf) != 0 {
        failures.push(format!(
            "names: {} names copied in the tick after",
            copied(ebpf)
        ));
    }
    let mut renamed_too = "";
    // The v1 memory hierarchy (the CPU comes from the default one, which cannot rename).
    if let Layout::Hybrid { memory, .. } = layout {
        std::fs::rename(
            memory.join(parent).join("late"),
            memory.join(parent).join("later"),
        )
        .expect("rename a v1 cgroup");
        let after = ebpf.collect().expect("collect");
        checks += 1;
        let later = format!("/{parent}/later");
        let has_memory = |path: &str| {
            after
                .cgroups
                .iter()
                .any(|c| *c.path == *path && c.memory.is_some())
        };
        if !has_memory(&later) || has_memory(&late) {
            failures.push(format!(
                "names: after a rename of late to later in the memory hierarchy, paths {:?}",
                paths(&after)
            ));
        }
        std::fs::rename(
            memory.join(parent).join("later"),
            memory.join(parent).join("late"),
        )
        .expect("rename back");
        renamed_too = ", a v1 rename followed";
    }
    cg.remove_kid("late");
    println!("accuracy: names kept by unchanged slots, copied for a new cgroup{renamed_too}");
    checks
}

fn births(
    ebpf: &EbpfCollector,
    layout: &Layout,
    cg: &mut TestCgroups,
    parent: &str,
    failures: &mut Vec<String>,
) -> usize {
    use std::os::unix::fs::MetadataExt;
    let dir_id = |mount: &Path, kid: &str| {
        std::fs::metadata(mount.join(parent).join(kid))
            .expect("cgroup directory")
            .ino()
    };
    let before = boottime_ns();
    cg.add_kid(layout, parent, "born").expect("mkdir born");
    let after = boottime_ns();
    let id = dir_id(layout.cpu_mount(), "born");
    let mut checks = 1;
    match ebpf.birth(id) {
        Some(at) if (before..=after).contains(&at) => println!(
            "accuracy: cgroup made at boot+{at} ns, between {before} and {after} ns around mkdir"
        ),
        other => failures.push(format!(
            "birth of the new cgroup (id {id}): {other:?}, want within {before}..={after}"
        )),
    }
    checks += 1;
    let spin = dir_id(layout.cpu_mount(), "spin");
    if let Some(at) = ebpf.birth(spin) {
        failures.push(format!(
            "cgroup made before the program loaded has a birth: {at}"
        ));
    }
    if let Layout::Hybrid { memory, .. } = layout {
        let v1 = dir_id(memory, "born");
        if v1 != id {
            checks += 1;
            if let Some(at) = ebpf.birth(v1) {
                failures.push(format!(
                    "v1 memory cgroup (id {v1}) recorded as a v2 birth at {at}"
                ));
            }
        }
    }
    assert!(cg.remove_kid("born"), "rmdir born");
    checks
}

/// Steps the (VM's) wall clock back by 0.5 s, back by 30 s and forward by one hour between
/// two collections, as `date -s` or an NTP step would, and checks what the agent relies on
/// (`kpulse_agent::clock`): the window between two samples is the real elapsed time whatever
/// the wall clock did, so the busy loop's rate stays at most one core; the tick loop's
/// check sees each step, to within the threshold; after it the timestamps are the wall
/// clock's again, and the boot instant (the node's `started_at`, and the base of every
/// container's) moved by the step, which makes the aggregator restart every series instead
/// of computing a rate across the step.
fn clock_steps(ebpf: &mut EbpfCollector, spin: &str, failures: &mut Vec<String>) -> usize {
    use kpulse_agent::clock;
    const HALF: Duration = Duration::from_millis(500);
    let mut checks = 0;
    let _ = clock::check();
    for (label, step) in [
        ("back 0.5 s", -500_000_000i128),
        ("back 30 s", -30_000_000_000),
        ("forward 1 h", 3_600_000_000_000),
    ] {
        let boot0 = clock::boot().expect("boot instant");
        let wall0 = wall_nanos();
        let t0 = Instant::now();
        let s0 = ebpf.collect().expect("collect");
        std::thread::sleep(HALF);
        step_wall_clock(step);
        std::thread::sleep(HALF);
        let s1 = ebpf.collect().expect("collect");
        let elapsed = t0.elapsed();
        let wall1 = wall_nanos();
        let seen = clock::check();
        let boot1 = clock::boot().expect("boot instant");
        let s2 = ebpf.collect().expect("collect");
        let wall2 = wall_nanos();

        let window = s1.timestamp.0 - s0.timestamp.0;
        let cpu = find(&s1, spin).cpu.expect("cpu").0 - find(&s0, spin).cpu.expect("cpu").0;
        let rate = cpu as f64 / window as f64;
        let wall_window = wall1 - wall0;
        println!(
            "accuracy: clock {label:11}: window {:.3} s (elapsed {:.3} s; the wall clock says {:.3} s), \
             spin {rate:.3} cores (by the wall clock {:.3}), step seen {}",
            window as f64 / 1e9,
            elapsed.as_secs_f64(),
            wall_window as f64 / 1e9,
            cpu as f64 / wall_window as f64,
            seen.map_or("none".to_string(), |s| s.to_string()),
        );
        checks += 1;
        // The window can only be shorter than the elapsed time around it (both collections
        // happen inside it), and not by more than the two collections took.
        let elapsed_ns = elapsed.as_nanos() as i128;
        if (window as i128) > elapsed_ns || (window as i128) < elapsed_ns - 200_000_000 {
            failures.push(format!(
                "clock {label}: window {window} ns, but {elapsed_ns} ns elapsed"
            ));
        }
        checks += 1;
        if !(rate > 0.0 && rate <= 1.0 + TOLERANCE) {
            failures.push(format!("clock {label}: one busy loop at {rate:.3} cores"));
        }
        checks += 1;
        match seen {
            Some(s) if (s.nanos() - step).abs() < clock::STEP_THRESHOLD.as_nanos() as i128 => {}
            other => failures.push(format!("clock {label}: step seen {other:?}")),
        }
        checks += 1;
        let moved = i128::from(boot1.0) - i128::from(boot0.0);
        if (moved - step).abs() >= clock::STEP_THRESHOLD.as_nanos() as i128 {
            failures.push(format!("clock {label}: boot instant moved {moved} ns"));
        }
        checks += 1;
        if (i128::from(s2.timestamp.0) - wall2).abs() > 200_000_000 {
            failures.push(format!(
                "clock {label}: timestamp {} not back on the wall clock {wall2}",
                s2.timestamp.0
            ));
        }
    }
    checks
}

fn wall_nanos() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as i128
}

/// Moves CLOCK_REALTIME by `by` nanoseconds (root; in the VM only).
fn step_wall_clock(by: i128) {
    let to = wall_nanos() + by;
    let ts = libc::timespec {
        tv_sec: (to / 1_000_000_000) as libc::time_t,
        tv_nsec: (to % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `ts` is a valid timespec; clock_settime reads it.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) };
    assert_eq!(rc, 0, "clock_settime: {}", std::io::Error::last_os_error());
}

/// `kpulse-agent dump --collector auto` with an unloadable object prints one WARN line
/// naming the reason and still reports the cgroups, from cgroupfs.
fn agent_binary_fallback(bogus: &Path, parent: &str, failures: &mut Vec<String>) -> usize {
    let bin = std::env::var_os("KPULSE_AGENT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kpulse-agent")));
    let out = Command::new(&bin)
        .args([
            "dump",
            "--count",
            "1",
            "--collector",
            "auto",
            "--cgroup-root",
        ])
        .arg(format!("/{parent}"))
        .arg("--ebpf-object")
        .arg(bogus)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let warns: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN")).collect();
    let mut n = 0;
    n += 1;
    if !out.status.success() {
        failures.push(format!("agent dump failed: {stderr}"));
    }
    n += 1;
    if warns.len() != 1 || !warns[0].contains("eBPF collector unavailable") {
        failures.push(format!(
            "expected one WARN line about the fallback, got: {stderr}"
        ));
    }
    n += 1;
    let spin = format!("\"path\":\"/{parent}/spin\"");
    if !stdout
        .lines()
        .any(|l| l.contains(&spin) && l.contains("\"collector\":\"cgroupfs\""))
    {
        failures.push(format!(
            "fallback dump lacks {spin} from cgroupfs: {stdout}"
        ));
    }
    n
}

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// No cgroup, process or BPF program of this test remains.
/// Kernel ids of every program this test loaded.
static OUR_PROGRAMS: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

fn remember_program(id: u32) {
    if let Ok(mut v) = OUR_PROGRAMS.lock() {
        v.push(id);
    }
}

fn remember(c: &EbpfCollector) {
    if let Some(id) = c.program_id() {
        remember_program(id);
    }
}

fn leftover_check() -> Result<(), String> {
    let ours: Vec<u32> = OUR_PROGRAMS.lock().map(|v| v.clone()).unwrap_or_default();
    let layout = Layout::detect().map_err(|e| e.to_string())?;
    let parent = format!("kpulse-acc-{}", std::process::id());
    for m in [layout.cpu_mount(), layout.memory_mount()] {
        if m.join(&parent).exists() {
            return Err(format!("cgroup {}", m.join(&parent).display()));
        }
    }
    // Programs are freed once their last fd and link are closed (after an RCU grace
    // period): wait briefly for the kernel. Other agents' programs are not ours to judge.
    if ours.is_empty() {
        return Err("the test recorded no program of its own".into());
    }
    let mut extra = Vec::new();
    for _ in 0..50 {
        extra = loaded_cgroup_stats()
            .into_iter()
            .filter(|id| ours.contains(id))
            .collect();
        if extra.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if !extra.is_empty() {
        return Err(format!(
            "BPF programs {extra:?} (cgroup_stats) still loaded"
        ));
    }
    let swaps = common::swap::leftovers();
    if !swaps.is_empty() {
        return Err(format!("swap areas {swaps:?}"));
    }
    let fds = std::fs::read_dir("/proc/self/fd").map_err(|e| e.to_string())?;
    for fd in fds.flatten() {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        let t = target.to_string_lossy();
        if t.contains("bpf-prog") || t.contains("bpf_link") || t.contains("bpf-map") {
            return Err(format!("BPF fd {t} still open"));
        }
    }
    Ok(())
}

/// Ids of the loaded `cgroup_stats` programs (ours, or another agent's on this machine).
fn loaded_cgroup_stats() -> Vec<u32> {
    aya::programs::loaded_programs()
        .flatten()
        .filter(|p| p.name_as_str() == Some("cgroup_stats"))
        .map(|p| p.id())
        .collect()
}

/// Runs inside a test cgroup: `workload <kind> <cgroup.procs files...>`.
fn workload(args: &[String]) {
    let kind = args.first().map(String::as_str).unwrap_or("");
    if kind == "pagecache" {
        // `pagecache <file> <cgroup.procs files...>`: write 8 MiB of page cache, exit.
        for f in &args[2.min(args.len())..] {
            std::fs::write(f, "0").unwrap_or_else(|e| panic!("join {f}: {e}"));
        }
        let path = args.get(1).expect("pagecache needs a file");
        std::fs::write(path, vec![3u8; 8 << 20]).expect("write page cache");
        return;
    }
    for f in &args[1.min(args.len())..] {
        std::fs::write(f, "0").unwrap_or_else(|e| panic!("join {f}: {e}"));
    }
    match kind {
        "spin" => {
            pin_to_cpu(0);
            ready();
            loop {
                std::hint::spin_loop();
            }
        }
        "duty" => {
            ready();
            loop {
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(10) {
                    std::hint::spin_loop();
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        "touch" => {
            let mut mem = vec![0u8; TOUCH_MIB << 20];
            for i in (0..mem.len()).step_by(4096) {
                mem[i] = 1;
            }
            // Some page cache too, so that inactive_file is not trivially zero.
            let path = std::env::temp_dir().join(format!("kpulse-cache-{}", std::process::id()));
            let file = std::fs::File::create(&path);
            if let Ok(mut f) = file.as_ref() {
                let chunk = vec![7u8; 1 << 20];
                for _ in 0..CACHE_MIB {
                    let _ = f.write_all(&chunk);
                }
                let _ = f.sync_all();
            }
            let _ = std::fs::read(&path);
            // Unlinked but open: the page cache stays charged and nothing is left behind.
            let _ = std::fs::remove_file(&path);
            ready();
            loop {
                std::thread::sleep(Duration::from_secs(1));
                std::hint::black_box((&mem, &file));
            }
        }
        other => panic!("unknown workload {other:?}"),
    }
}

fn ready() {
    println!("ready");
    let _ = std::io::stdout().flush();
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity reads it.
    #[allow(unsafe_code)]
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
