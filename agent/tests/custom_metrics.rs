//! `custom.metrics.k8s.io` end to end, with real processes: the real `kpulse-agent run`
//! with `--custom-metrics` (twice: the eBPF collector and the cgroupfs one, as two nodes),
//! streaming over mTLS to the real `kpulse-aggregator-api --custom-metrics`, read with the
//! real kubectl (`get --raw`), and compared with the kernel's own files.
//!
//! Each agent has a pod of its own: a pod cgroup holding two container cgroups with CPU
//! quotas, `app` (a busy loop under 10 %: throttled in every period, waiting for CPU most
//! of the time) and `bursty` (bursts of 100 ms of CPU, 100 ms asleep between them, under 40 %:
//! throttled in some periods), and reports only that subtree (`--cgroup-root`), so that neither agent's reads
//! touch the other's cgroups. While a window passes the test reads every pressure file and
//! `cpu.stat` every 200 ms; then it asks for each metric of the pod's own series and of each
//! container's (`metricLabelSelector=container=<name>`), and checks each served share
//! against the files: it must lie within ±2 % (0.002 near 0) of the range of shares the files
//! show over the spans the API's answer allows (ending at the served `timestamp`, or up to
//! 2 s and a tick before it for the eBPF collector, whose windows end at the kernel's last
//! averaging; lasting `windowSeconds` to one second more). The pod's pressure is its pod
//! cgroup's; its throttling is summed over both containers' periods. Also shown: nothing is
//! served before a whole window has passed, and the served window is at least the agent's.
//!
//! Needs root (cgroups, eBPF) and PSI; skips without them unless `CI=true`.

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::TestCgroups;
use kpulse_agent::{cgroupfs, layout::Layout};
use serde_json::Value;

const KUBECTL: &str = "/usr/bin/kubectl";
const PARENT: &str = "kpulse-cm-e2e";
/// The agents' `--custom-metrics-window`.
const WINDOW: Duration = Duration::from_secs(10);
/// The issue's tolerance, relative.
const TOLERANCE: f64 = 0.02;
/// Below this a share counts as about 0 and is compared absolutely.
const NEAR_ZERO: f64 = 0.002;
const TIMEOUT: Duration = Duration::from_secs(40);

fn main() {
    if common::workload::dispatch() {
        return;
    }
    common::main_of("custom_metrics", preflight, run);
}

fn preflight() -> Result<(), String> {
    common::ebpf_preflight()?;
    if !Path::new("/proc/pressure/cpu").exists() {
        return Err("PSI is off (boot with psi=1)".into());
    }
    if !Path::new(KUBECTL).exists() {
        return Err(format!("{KUBECTL} is missing"));
    }
    Ok(())
}

/// A child process killed (SIGKILL) and reaped on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn write(path: &Path, contents: impl AsRef<[u8]>) {
    std::fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// A pod's containers: name, workload, CPU quota (µs per 100 ms period).
const CONTAINERS: [(&str, &str, u32); 2] = [
    // Throttled in every period, waiting for CPU most of the time.
    ("app", "spin", 10_000),
    // Bursts of 100 ms of CPU time, 100 ms apart, against a quota of 40 %: throttled in
    // some periods. (A wall-clock duty cycle asked for less CPU on a busy host, and was
    // then hardly ever throttled.)
    ("bursty", "bursts", 40_000),
];

/// The kernel's files of one pod at one instant.
#[derive(Clone, Debug)]
struct Files {
    /// Wall clock, ns (the agent's timestamps are on the same clock).
    t: u64,
    /// PSI `some` totals, ns, `[cpu, memory]`: the pod cgroup's, then each container's.
    psi: Vec<[u64; 2]>,
    /// Each container's `(nr_periods, nr_throttled)`.
    cfs: Vec<(u64, u64)>,
}

/// The cgroup of `rel` on the hierarchy carrying the `cpu` controller (the quota's).
fn cfs_dir(layout: &Layout, rel: &str) -> PathBuf {
    layout
        .cfs_mount()
        .expect("a cpu controller hierarchy")
        .join(PARENT)
        .join(rel)
}

fn read_files(layout: &Layout, pod: &str, v2: bool) -> Files {
    let psi = |rel: &str| {
        let p = cgroupfs::pressure(&layout.cpu_mount().join(PARENT).join(rel))
            .expect("pressure files")
            .expect("PSI on");
        [p.cpu_some_ns, p.memory_some_ns]
    };
    let mut files = Files {
        t: now_ns(),
        psi: vec![psi(pod)],
        cfs: Vec::new(),
    };
    for (name, _, _) in CONTAINERS {
        let rel = format!("{pod}/{name}");
        files.psi.push(psi(&rel));
        let cfs = cgroupfs::throttling(&cfs_dir(layout, &rel), v2, None)
            .expect("cpu.stat")
            .expect("a quota");
        files.cfs.push((cfs.periods, cfs.throttled));
    }
    files
}

fn now_ns() -> u64 {
    kpulse_wire::UnixNanos::from_system_time(std::time::SystemTime::now()).0
}

/// The RFC 3339 timestamp of a served value, as wall-clock ns.
fn timestamp_ns(item: &Value) -> u64 {
    let t: k8s_openapi::jiff::Timestamp = item["timestamp"]
        .as_str()
        .unwrap_or_default()
        .parse()
        .unwrap_or_else(|e| panic!("timestamp of {item}: {e}"));
    u64::try_from(t.as_nanosecond()).unwrap_or(0)
}

/// The smallest and largest share the files show over any span the API's statement allows:
/// ending within `end_slack` before `end` and lasting `window` s to `window` + 1 s (the
/// served `windowSeconds` is whole seconds, rounded down), from readings `every` apart.
fn envelope(
    files: &[Files],
    end: u64,
    end_slack: Duration,
    window: i64,
    every: Duration,
    share: impl Fn(&Files, &Files) -> Option<f64>,
) -> Option<(f64, f64)> {
    let (slack, every) = (end_slack.as_nanos() as u64, every.as_nanos() as u64);
    let w = u64::try_from(window).ok()? * 1_000_000_000;
    let mut range: Option<(f64, f64)> = None;
    for e in files
        .iter()
        .filter(|f| f.t + slack + every >= end && f.t <= end + every)
    {
        for s in files
            .iter()
            .filter(|s| s.t + w <= e.t + every && e.t <= s.t + w + 1_000_000_000 + every)
        {
            if let Some(v) = share(s, e) {
                range = Some(range.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))));
            }
        }
    }
    range
}

fn kubectl(kubeconfig: &Path, path: &str) -> Result<Value, String> {
    let out = Command::new(KUBECTL)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["get", "--raw", path, "--request-timeout", "5s"])
        .output()
        .map_err(|e| format!("run kubectl: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("kubectl output: {e}"))
}

/// A served share (`value` as a quantity: `250m`, `253412u`, `1`, `0`) and its window.
fn share(item: &Value) -> (f64, i64) {
    let q = item["value"].as_str().unwrap_or_default();
    let (digits, scale) = match q.as_bytes().last() {
        Some(b'm') => (&q[..q.len() - 1], 1e-3),
        Some(b'u') => (&q[..q.len() - 1], 1e-6),
        Some(b'n') => (&q[..q.len() - 1], 1e-9),
        _ => (q, 1.0),
    };
    let v = digits
        .parse::<f64>()
        .unwrap_or_else(|e| panic!("value {q:?}: {e}"));
    (v * scale, item["windowSeconds"].as_i64().unwrap_or(-1))
}

/// The agents: node name (also the namespace and the pod cgroup's name) and collector.
const NODES: [(&str, &str); 2] = [("cm-ebpf", "ebpf"), ("cm-cgroupfs", "cgroupfs")];

fn run() {
    let layout = Layout::detect().expect("cgroup layout");
    let v2 = matches!(layout, Layout::Unified { .. });
    let mut kids = Vec::new();
    for (pod, _) in NODES {
        kids.push(pod.to_string());
        kids.extend(
            CONTAINERS
                .iter()
                .map(|(name, _, _)| format!("{pod}/{name}")),
        );
    }
    let kid_refs: Vec<&str> = kids.iter().map(String::as_str).collect();
    let mut cg = TestCgroups::create(&layout, PARENT, &kid_refs);
    // The quotas, on the hierarchy carrying the cpu controller.
    if !v2 {
        for rel in std::iter::once("").chain(kid_refs.iter().copied()) {
            let d = cfs_dir(&layout, rel);
            std::fs::create_dir(&d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
            cg.dirs.push(d);
        }
    }
    for (pod, _) in NODES {
        if v2 {
            common::enable_controllers(layout.cpu_mount(), &cfs_dir(&layout, pod));
        }
        for (name, workload, quota) in CONTAINERS {
            let rel = format!("{pod}/{name}");
            let dir = cfs_dir(&layout, &rel);
            if v2 {
                write(&dir.join("cpu.max"), format!("{quota} 100000"));
            } else {
                write(&dir.join("cpu.cfs_quota_us"), quota.to_string());
            }
            let procs: Vec<String> = cg
                .dirs
                .iter()
                .filter(|d| d.ends_with(&rel))
                .map(|d| d.join("cgroup.procs").display().to_string())
                .collect();
            let exe = std::env::current_exe().expect("current_exe");
            let mut child = Command::new(exe)
                .args(["workload", workload])
                .args(&procs)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a workload");
            let mut line = String::new();
            if let Some(out) = child.stdout.take() {
                use std::io::BufRead;
                std::io::BufReader::new(out)
                    .read_line(&mut line)
                    .expect("workload ready line");
            }
            assert_eq!(line.trim(), "ready", "workload {workload} did not start");
            cg.children.push(child);
        }
    }
    let dir = common::agent::TempDir(
        std::env::temp_dir().join(format!("kpulse-cm-e2e-{}", std::process::id())),
    );
    std::fs::create_dir_all(&dir.0).expect("test directory");
    let d = &dir.0;
    let pki = common::pki::TestPki::new(d, "kpulse custom metrics e2e CA");
    for (cn, org) in [
        ("cm-ebpf", None),
        ("cm-cgroupfs", None),
        ("cm-admin", Some("system:masters")),
    ] {
        pki.client(cn, org);
    }
    let (api_port, ingest_port) = (common::agent::free_port(), common::agent::free_port());
    let ca = d.join("ca.crt");
    let _server = Proc(
        Command::new(common::agent::server_bin())
            .args(["--bind-address", "127.0.0.1"])
            .args(["--secure-port", &api_port.to_string()])
            .args(["--ingest-port", &ingest_port.to_string()])
            .arg("--tls-cert-file")
            .arg(d.join("server.crt"))
            .arg("--tls-private-key-file")
            .arg(d.join("server.key"))
            .arg("--client-ca-file")
            .arg(&ca)
            .arg("--agent-client-ca-file")
            .arg(&ca)
            .args(["--authorization-mode", "AlwaysAllow"])
            .arg("--authentication-skip-lookup")
            // Certificates only, whatever $KUBECONFIG says: no Kubernetes API.
            .arg("--authentication-token-webhook=false")
            .args(["--metric-expiry", "10s", "--custom-metrics"])
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the aggregator-api"),
    );
    let mut agents = Vec::new();
    for (node, collector) in NODES {
        let pods = d.join(format!("{node}.json"));
        write(
            &pods,
            format!(
                r#"{{"pods":[{{"uid":"u-{node}","namespace":"{node}","name":"throttled",
                    "cgroup":"/{PARENT}/{node}",
                    "containers":[{{"name":"app","cgroup":"/{PARENT}/{node}/app"}},
                                  {{"name":"bursty","cgroup":"/{PARENT}/{node}/bursty"}}]}}]}}"#
            ),
        );
        agents.push(Proc(
            Command::new(common::agent::bin())
                .args(["run", "--node-name", node])
                .args(["--server", &format!("127.0.0.1:{ingest_port}")])
                .arg("--server-ca-file")
                .arg(&ca)
                .arg("--client-cert-file")
                .arg(d.join(format!("{node}.crt")))
                .arg("--client-key-file")
                .arg(d.join(format!("{node}.key")))
                .arg("--pods-file")
                .arg(&pods)
                .args(["--collector", collector, "--resolution", "1s"])
                .args(["--cgroup-root", &format!("/{PARENT}/{node}")])
                .args(["--metrics-bind-address", ""])
                .args(["--custom-metrics", "--custom-metrics-window", "10s"])
                .env("NO_COLOR", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start an agent"),
        ));
    }
    let kubeconfig = d.join("kubeconfig");
    write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: https://127.0.0.1:{api_port}\n    certificate-authority: {ca}\nusers:\n- name: admin\n  user:\n    client-certificate: {cert}\n    client-key: {key}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: admin}}\ncurrent-context: e2e\n",
            ca = ca.display(),
            cert = d.join("cm-admin.crt").display(),
            key = d.join("cm-admin.key").display(),
        ),
    );
    let started = Instant::now();
    let path = |node: &str, metric: &str, container: Option<&str>| {
        format!(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{node}/pods/*/{metric}{}",
            container
                .map(|c| format!("?metricLabelSelector=container%3D{c}"))
                .unwrap_or_default()
        )
    };

    // Discovery through the real kubectl.
    let deadline = Instant::now() + TIMEOUT;
    let resources = loop {
        match kubectl(&kubeconfig, "/apis/custom.metrics.k8s.io/v1beta2") {
            Ok(v) => break v,
            Err(e) if Instant::now() > deadline => panic!("discovery: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let names: Vec<&str> = resources["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "pods/cpu_pressure",
            "pods/cpu_throttled_ratio",
            "pods/memory_pressure"
        ]
    );

    // Nothing before a whole window; then a value, over at least the window.
    for (node, _) in NODES {
        let first = loop {
            let v = kubectl(&kubeconfig, &path(node, "cpu_throttled_ratio", None))
                .unwrap_or_else(|e| panic!("{node}: {e}"));
            if let Some(item) = v["items"].as_array().and_then(|a| a.first()) {
                break item.clone();
            }
            assert!(
                Instant::now() < deadline,
                "{node}: no value within {TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        };
        let after = started.elapsed();
        println!("custom_metrics: {node}: first value after {after:.1?}: {first}");
        assert!(
            after >= WINDOW,
            "{node}: a value after {after:?}, before a whole window"
        );
        assert!(share(&first).1 >= WINDOW.as_secs() as i64, "{first}");
    }

    // The served shares against the files: readings every 200 ms, while a window passes.
    const EVERY: Duration = Duration::from_millis(200);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (stop, layout) = (stop.clone(), layout.clone());
        std::thread::spawn(move || {
            let mut all = vec![Vec::new(); NODES.len()];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (i, (pod, _)) in NODES.iter().enumerate() {
                    all[i].push(read_files(&layout, pod, v2));
                }
                std::thread::sleep(EVERY);
            }
            all
        })
    };
    std::thread::sleep(WINDOW + Duration::from_secs(5));
    // Each metric of the pod's own series (`series` None) and of each container's.
    let series: Vec<Option<&str>> = std::iter::once(None)
        .chain(CONTAINERS.iter().map(|(name, _, _)| Some(*name)))
        .collect();
    let mut served = Vec::new();
    for (node, _) in NODES {
        for metric in ["cpu_pressure", "memory_pressure", "cpu_throttled_ratio"] {
            for s in &series {
                let v = kubectl(&kubeconfig, &path(node, metric, *s))
                    .unwrap_or_else(|e| panic!("{node} {metric}: {e}"));
                served.push(((node, metric, *s), v));
            }
        }
    }
    std::thread::sleep(EVERY * 2);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let samples = sampler.join().expect("the file sampler");
    let mut failures = Vec::new();
    for ((node, collector), files) in NODES.iter().zip(&samples) {
        let (first, last) = (&files[0], &files[files.len() - 1]);
        // Not a fake: the load really was throttled (nearly all of app's periods, some but
        // not all of bursty's) and stalled. Not "all": on a loaded host the spinner misses
        // its quota in some periods (0.896 seen while another build ran beside the test).
        let span = (last.t - first.t) as f64;
        let throttled = |i: usize| {
            let (p, t) = (
                last.cfs[i].0 - first.cfs[i].0,
                last.cfs[i].1 - first.cfs[i].1,
            );
            t as f64 / p.max(1) as f64
        };
        assert!(
            (last.psi[1][0] - first.psi[1][0]) as f64 / span > 0.3
                && throttled(0) > 0.8
                && (0.05..0.95).contains(&throttled(1)),
            "{node}: the quotas did not bite as planned: {first:?} {last:?}"
        );
        // The eBPF collector's windows end at the kernel's last averaging (up to 2 s and a
        // tick before the sample); the files are current at the collector's read.
        let end_slack = if *collector == "ebpf" {
            Duration::from_millis(3_500)
        } else {
            Duration::from_millis(500)
        };
        for ((n, metric, s), v) in &served {
            if n != node {
                continue;
            }
            // Which cgroups the series is of: the pod's (index 0) or a container's.
            let index = s.map_or(0, |name| {
                1 + CONTAINERS
                    .iter()
                    .position(|(c, _, _)| *c == name)
                    .unwrap_or(0)
            });
            let label = s.unwrap_or("(pod)");
            let share_of = |a: &Files, b: &Files| -> Option<f64> {
                if *metric == "cpu_throttled_ratio" {
                    // The pod's: every container with a quota (the pod cgroup has none).
                    let cgroups: Vec<usize> = if index == 0 {
                        (0..CONTAINERS.len()).collect()
                    } else {
                        vec![index - 1]
                    };
                    let (mut periods, mut thr) = (0, 0);
                    for c in cgroups {
                        periods += b.cfs[c].0.checked_sub(a.cfs[c].0)?;
                        thr += b.cfs[c].1.checked_sub(a.cfs[c].1)?;
                    }
                    (periods > 0).then(|| thr as f64 / periods as f64)
                } else {
                    let r = usize::from(*metric == "memory_pressure");
                    let dt = b.t.checked_sub(a.t)?;
                    let dv = b.psi[index][r].checked_sub(a.psi[index][r])?;
                    (dt > 0).then(|| dv as f64 / dt as f64)
                }
            };
            let items = v["items"].as_array().cloned().unwrap_or_default();
            let [item] = items.as_slice() else {
                failures.push(format!("{node} {metric} {label}: {} items", items.len()));
                continue;
            };
            let (got, window) = share(item);
            let end = timestamp_ns(item);
            let Some((lo, hi)) = envelope(files, end, end_slack, window, EVERY, share_of) else {
                failures.push(format!(
                    "{node} {metric} {label}: no file readings span {window} s before {end}"
                ));
                continue;
            };
            let off = if hi < NEAR_ZERO {
                got >= NEAR_ZERO
            } else {
                got < lo * (1.0 - TOLERANCE) || got > hi * (1.0 + TOLERANCE)
            };
            println!(
                "custom_metrics: {node:12} {metric:20} {label:7}: served {got:.6} over {window} s, \
                 files {lo:.6} … {hi:.6}{}",
                if off { "  <-- off" } else { "" }
            );
            if off {
                failures.push(format!(
                    "{node} {metric} {label}: served {got}, files {lo} … {hi}"
                ));
            }
            if window < WINDOW.as_secs() as i64 {
                failures.push(format!("{node} {metric} {label}: window {window} s"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
