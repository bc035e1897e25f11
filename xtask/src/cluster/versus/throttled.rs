//! A throttled, not busy, workload under a CPU-utilisation HPA and under an HPA on kpulse's
//! `cpu_throttled_ratio` (issue 16, item 3).
//!
//! Deployment `shared` (busybox, request = limit = 200m: a CFS quota of 20 ms per 100 ms
//! period) does a fixed amount of CPU work per second, shared among its running replicas,
//! in one burst each second: each pod touches a heartbeat file `pods/<pod>` in a hostPath
//! directory (removed by its `TERM` trap), counts the files to know the replica count `n`,
//! and, while the flag file `on` exists, starts `sleep 1` in the background, spins
//! `work / n` shell-loop iterations and waits for the sleep (a cycle is max(1 s, burst)).
//! `work` is calibrated on this host with the image's own busybox ([`calibrate`]) so that
//! one pod's burst is `--throttled-burst` of CPU (100 ms by default): one replica then
//! uses ~50 % of its request, under the CPU HPA's 80 % target and outside its 10 %
//! tolerance, while the burst is throttled in most of the periods it spans and takes
//! several times its CPU time. (At 140 ms, ~70 %, the CPU HPA scaled in 2 of 3 runs: when a
//! burst runs long the next one follows without a gap, and kpulse's 1 s window then holds
//! up to the whole quota; one such second read at a sync is enough.) Each pod appends every
//! burst's wall duration (from `/proc/uptime`, centiseconds) to `lat/<pod>`: the latency
//! the workload's users see.
//!
//! Two phases, the Deployment recreated at one replica for each:
//!
//! 1. `autoscaling/v2` HPA on CPU utilisation, `averageUtilization: 80`, 1–4 replicas, the
//!    default behaviour, reading kpulse's `metrics.k8s.io`;
//! 2. the same with a `Pods` metric `cpu_throttled_ratio`, `averageValue: 300m`, reading
//!    kpulse's `custom.metrics.k8s.io` (the `custom-metrics` overlay, installed first as
//!    deploy/README.md says, by [`crate::cluster::custom_metrics::install_overlay`], and left
//!    installed; both phases run with it).
//!
//! Each phase waits until its HPA reads a value at idle, then switches the load on for
//! `--throttled-phase` (240 s by default) and samples every second: the HPA's desired and
//! current replicas and its metric, the served `cpu_throttled_ratio` and CPU of every pod
//! (read as the HPA reads them), the heartbeat count, and the first pod's cgroup counters
//! (usage and CFS periods). Per heartbeat count, the figures are taken over *settled*
//! samples only: the count unchanged, and the load on, for at least the agent's 30 s
//! window. Raw samples and bursts go to `<report>.throttled.jsonl`.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};

use super::{
    api::{self, Api, Source},
    percentile, Bench, NAMESPACE,
};
use crate::{cluster::images, stats::mean};

const NAME: &str = "shared";
/// The pods' CPU request and limit, millicores.
const CPU_M: u32 = 200;
/// Below the cluster's run directory: `on`, `pods/`, `lat/`.
const LOAD_DIR: &str = "versus-throttled";
const CPU_TARGET: i64 = 80;
const THROTTLED_TARGET: &str = "300m";
const MAX_REPLICAS: i64 = 4;
/// The agent's window: a pod's served ratio covers the last 30 s.
const SETTLE: f64 = 30.0;
/// The HPA's tolerance: usage at or above this share of the request scales a CPU HPA at
/// 80 % (80 % × 1.1).
const CPU_SCALES_AT: f64 = 88.0;

/// The spin loop of the workload, `$i` iterations.
const SPIN: &str = "while [ $i -gt 0 ]; do i=$((i-1)); done";
const CALIBRATION_ITERATIONS: u64 = 1_000_000;

/// The workload (`WORK` is replaced by the total iterations per second); see the module doc.
const SCRIPT: &str = "trap 'rm -f /v/pods/$HOSTNAME; exit 0' TERM; \
while :; do : > /v/pods/$HOSTNAME; sleep 1 & p=$!; \
if [ -e /v/on ]; then set -- /v/pods/*; read a x < /proc/uptime; i=$((WORK / $#)); SPIN; \
read b x < /proc/uptime; echo \"${b/./} $((${b/./} - ${a/./}))\" >> /v/lat/$HOSTNAME; fi; \
wait $p; done";

/// The HPA of a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hpa {
    Cpu,
    Throttled,
}

impl Hpa {
    fn name(self) -> &'static str {
        match self {
            Hpa::Cpu => "CPU utilisation 80 %",
            Hpa::Throttled => "cpu_throttled_ratio 300m",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Hpa::Cpu => "cpu",
            Hpa::Throttled => "throttled",
        }
    }

    fn metric(self) -> Value {
        match self {
            Hpa::Cpu => json!({"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": CPU_TARGET}}}),
            Hpa::Throttled => json!({"type": "Pods", "pods": {
                "metric": {"name": "cpu_throttled_ratio"},
                "target": {"type": "AverageValue", "averageValue": THROTTLED_TARGET}}}),
        }
    }

    /// The HPA's current value of its metric: utilisation in % or the average ratio.
    fn current(self, status: &Value) -> Option<f64> {
        let m = &status["currentMetrics"][0];
        match self {
            Hpa::Cpu => m["resource"]["current"]["averageUtilization"].as_f64(),
            Hpa::Throttled => m["pods"]["current"]["averageValue"]
                .as_str()
                .and_then(api::quantity),
        }
    }

    fn format(self, v: f64) -> String {
        match self {
            Hpa::Cpu => format!("{v:.0} %"),
            Hpa::Throttled => format!("{v:.2}"),
        }
    }
}

/// The Deployment (one replica) and the HPA `hpa_name` of a phase, as a List.
fn manifest(dir: &Path, work: u64, hpa: Hpa, hpa_name: &str) -> Value {
    let script = SCRIPT
        .replace("SPIN", SPIN)
        .replace("WORK", &work.to_string());
    let cpu = format!("{CPU_M}m");
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": NAME, "namespace": NAMESPACE},
         "spec": {"replicas": 1, "selector": {"matchLabels": {"app": NAME}},
          "template": {"metadata": {"labels": {"app": NAME, "kpulse.dev/bench": "versus"}},
           "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
             "name": "main", "image": images::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
             "command": ["/bin/sh", "-c", script],
             "resources": {"requests": {"cpu": cpu, "memory": "16Mi"},
                           "limits": {"cpu": cpu, "memory": "32Mi"}},
             "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
            "volumes": [{"name": "v", "hostPath": {"path": dir.display().to_string(),
                                                    "type": "Directory"}}]}}}},
        {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
         "metadata": {"name": hpa_name, "namespace": NAMESPACE},
         "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME},
          "minReplicas": 1, "maxReplicas": MAX_REPLICAS, "metrics": [hpa.metric()]}}
    ]})
}

/// CPU seconds per iteration of [`SPIN`] run by the image's busybox on this host: the
/// least of 3 runs of [`CALIBRATION_ITERATIONS`], from the shell's own `times`.
fn calibrate() -> Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let out = crate::exec::output(Command::new(images::HOST_BUSYBOX).args([
            "sh",
            "-c",
            &format!("i={CALIBRATION_ITERATIONS}; {SPIN}; times"),
        ]))?;
        // `0m0.820s 0m0.000s` (the shell's user and system time), then its children's.
        let line = out.lines().next().unwrap_or_default();
        let cpu = line
            .split_whitespace()
            .map(times_seconds)
            .sum::<Option<f64>>()
            .with_context(|| format!("busybox `times` printed {out:?}"))?;
        best = best.min(cpu);
    }
    ensure!(best > 0.0, "the calibration loop took no CPU time");
    Ok(best / CALIBRATION_ITERATIONS as f64)
}

/// `0m0.820s` → 0.82.
fn times_seconds(s: &str) -> Option<f64> {
    let (m, s) = s.strip_suffix('s')?.split_once('m')?;
    Some(m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// The host's `/proc/uptime` (as the pods read it), centiseconds.
fn uptime_cs() -> Result<i64> {
    let text = fs::read_to_string("/proc/uptime").context("cannot read /proc/uptime")?;
    let first = text.split_whitespace().next().unwrap_or_default();
    let secs: f64 = first
        .parse()
        .with_context(|| format!("/proc/uptime: {text:?}"))?;
    Ok((secs * 100.0).round() as i64)
}

/// One second's look.
#[derive(Clone, Debug, Default)]
struct Sample {
    /// Seconds since the load was switched on.
    t: f64,
    desired: i64,
    current: i64,
    /// The HPA's current value of its metric.
    hpa: Option<f64>,
    /// Heartbeat files: the pods sharing the work.
    pods: usize,
    /// Served `cpu_throttled_ratio` per pod.
    throttled: Vec<(String, f64)>,
    /// Served CPU per pod (cores).
    cpu: Vec<(String, f64)>,
    /// The first pod's cgroup: CPU ns, CFS periods, throttled periods.
    first: Option<(u64, u64, u64)>,
    errors: Vec<String>,
}

impl Sample {
    fn json(&self, phase: Hpa) -> Value {
        json!({"phase": phase.key(), "t": self.t, "desired": self.desired,
            "current": self.current, "hpa": self.hpa, "pods": self.pods,
            "throttled": self.throttled, "cpu": self.cpu, "first_cgroup": self.first,
            "errors": self.errors})
    }
}

/// What a phase saw.
struct Phase {
    hpa: Hpa,
    /// The HPA's value at idle, before the load.
    idle: Option<f64>,
    samples: Vec<Sample>,
    /// Every burst: (seconds since load on at its end, wall duration in seconds).
    bursts: Vec<(f64, f64)>,
    /// The HPA's `SuccessfulRescale` messages.
    events: Vec<String>,
}

/// Figures of the settled samples with one pod count.
#[derive(Default)]
struct Group {
    seconds: usize,
    throttled: Vec<f64>,
    cpu: Vec<f64>,
    /// The first pod's cgroup over consecutive settled samples: CPU ns, periods,
    /// throttled periods, elapsed s.
    cgroup: (u64, u64, u64, f64),
    bursts: Vec<f64>,
}

impl Phase {
    /// The first `desiredReplicas > 1`, in seconds after load on.
    fn first_up(&self) -> Option<f64> {
        self.samples.iter().find(|s| s.desired > 1).map(|s| s.t)
    }

    /// `1 → 3 @31 → 4 @62` (seconds after load on) and the number of changes.
    fn path(&self) -> (String, usize) {
        let Some(first) = self.samples.first() else {
            return (String::new(), 0);
        };
        let mut out = first.desired.to_string();
        let mut changes = 0;
        for w in self.samples.windows(2) {
            if w[1].desired != w[0].desired {
                changes += 1;
                let _ = write!(out, " → {} @{:.0}", w[1].desired, w[1].t);
            }
        }
        (out, changes)
    }

    /// The pod count in force at `t` (the latest sample's at or before it).
    fn pods_at(&self, t: f64) -> usize {
        self.samples
            .iter()
            .take_while(|s| s.t <= t)
            .last()
            .or(self.samples.first())
            .map_or(0, |s| s.pods)
    }

    /// Per pod count: the settled samples' figures, and every burst at that count.
    fn groups(&self) -> BTreeMap<usize, Group> {
        let mut out: BTreeMap<usize, Group> = BTreeMap::new();
        let mut since = 0.0;
        let mut prev: Option<&Sample> = None;
        for s in &self.samples {
            if let Some(p) = prev {
                if p.pods != s.pods {
                    since = s.t;
                }
            }
            let settled = s.pods > 0 && s.t >= SETTLE && s.t - since >= SETTLE;
            if settled {
                let g = out.entry(s.pods).or_default();
                g.seconds += 1;
                g.throttled.extend(s.throttled.iter().map(|(_, v)| *v));
                g.cpu.extend(
                    s.cpu
                        .iter()
                        .map(|(_, c)| c / (CPU_M as f64 / 1000.0) * 100.0),
                );
                if let (Some(p), Some(a), Some(b)) = (prev, prev.and_then(|p| p.first), s.first) {
                    if p.pods == s.pods && p.t - since >= SETTLE {
                        g.cgroup.0 += b.0.saturating_sub(a.0);
                        g.cgroup.1 += b.1.saturating_sub(a.1);
                        g.cgroup.2 += b.2.saturating_sub(a.2);
                        g.cgroup.3 += s.t - p.t;
                    }
                }
            }
            prev = Some(s);
        }
        for &(t, d) in &self.bursts {
            out.entry(self.pods_at(t)).or_default().bursts.push(d);
        }
        out
    }
}

/// Empties (or makes) the load directory: no flag, no heartbeats, no bursts.
fn fresh_dir(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", dir.display())),
    }
    for d in ["pods", "lat"] {
        fs::create_dir_all(dir.join(d))
            .with_context(|| format!("cannot create {}", dir.join(d).display()))?;
    }
    Ok(())
}

/// Deletes the Deployment and every HPA of the namespace and waits until the pods are gone.
fn delete(bench: &Bench) -> Result<()> {
    crate::exec::output(bench.kubectl().args([
        "delete",
        "hpa",
        "--all",
        "-n",
        NAMESPACE,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=60s",
    ]))?;
    crate::exec::output(bench.kubectl().args([
        "delete",
        "deployment",
        NAME,
        "-n",
        NAMESPACE,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=120s",
    ]))?;
    let t = Instant::now();
    loop {
        let v = bench.json(&["get", "pods", "-n", NAMESPACE, "-l", &format!("app={NAME}")])?;
        let left = v["items"].as_array().map_or(0, Vec::len);
        if left == 0 {
            return Ok(());
        }
        ensure!(
            t.elapsed() < Duration::from_secs(120),
            "{left} pods of {NAME} still there 120 s after its deletion"
        );
        thread::sleep(Duration::from_secs(1));
    }
}

/// The served `cpu_throttled_ratio` of every pod of the Deployment, as the HPA reads it.
async fn served_throttled(api: &Api) -> Result<Vec<(String, f64)>> {
    let path = format!(
        "/apis/custom.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/pods/*/cpu_throttled_ratio?labelSelector=app%3D{NAME}"
    );
    let text = api.get(&path).await?;
    let v: Value = serde_json::from_str(&text).context("MetricValueList: not JSON")?;
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            let pod = i["describedObject"]["name"].as_str().unwrap_or("?");
            let value = i["value"]
                .as_str()
                .and_then(api::quantity)
                .with_context(|| format!("{pod}: bad value {}", i["value"]))?;
            Ok((pod.to_string(), value))
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn sample(
    bench: &Bench,
    runtime: &tokio::runtime::Runtime,
    api: &Api,
    hpa: Hpa,
    hpa_name: &str,
    dir: &Path,
    first: Option<&super::truth::CgroupFiles>,
    t: f64,
) -> Sample {
    let mut s = Sample {
        t,
        ..Sample::default()
    };
    match bench.json(&["get", "hpa", hpa_name, "-n", NAMESPACE]) {
        Ok(v) => {
            s.desired = v["status"]["desiredReplicas"].as_i64().unwrap_or(0);
            s.current = v["status"]["currentReplicas"].as_i64().unwrap_or(0);
            s.hpa = hpa.current(&v["status"]);
        }
        Err(e) => s.errors.push(format!("hpa: {e:#}")),
    }
    match fs::read_dir(dir.join("pods")) {
        Ok(entries) => s.pods = entries.count(),
        Err(e) => s.errors.push(format!("heartbeats: {e}")),
    }
    let selector = format!("app={NAME}");
    let (throttled, cpu) = runtime.block_on(async {
        tokio::join!(served_throttled(api), api.pod_metrics(NAMESPACE, &selector))
    });
    match throttled {
        Ok(v) => s.throttled = v,
        Err(e) => s.errors.push(format!("custom.metrics.k8s.io: {e:#}")),
    }
    match cpu {
        Ok(points) => {
            s.cpu = points
                .into_iter()
                .map(|p| (p.pod, p.containers.iter().map(|c| c.cpu).sum()))
                .collect();
        }
        Err(e) => s.errors.push(format!("metrics.k8s.io: {e:#}")),
    }
    if let Some(cg) = first {
        match (cg.cpu_ns(), cg.throttling()) {
            (Ok(cpu), Ok((periods, throttled))) => s.first = Some((cpu, periods, throttled)),
            (Err(e), _) | (_, Err(e)) => s.errors.push(format!("first pod's cgroup: {e:#}")),
        }
    }
    s
}

/// The bursts the pods wrote, relative to the load's start (`on_cs`, uptime centiseconds).
fn bursts(dir: &Path, on_cs: i64) -> Result<Vec<(f64, f64)>> {
    let lat = dir.join("lat");
    let mut out = Vec::new();
    for entry in fs::read_dir(&lat).with_context(|| format!("cannot list {}", lat.display()))? {
        let path = entry?.path();
        let text =
            fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        for line in text.lines() {
            let mut f = line.split_whitespace().map(str::parse::<i64>);
            if let (Some(Ok(end)), Some(Ok(d))) = (f.next(), f.next()) {
                out.push(((end - on_cs) as f64 / 100.0, d as f64 / 100.0));
            }
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(out)
}

fn run_phase(
    bench: &Bench,
    runtime: &tokio::runtime::Runtime,
    api: &Api,
    hpa: Hpa,
    work: u64,
    length: Duration,
) -> Result<Phase> {
    let dir = bench.dirs.run.join(LOAD_DIR);
    // A name of its own for each HPA: the controller keeps an HPA's recommendations (the
    // 300 s scale-down stabilisation) by namespace and name, and a new HPA under the name
    // of the one before started at the replicas that one had reached.
    let hpa_name = format!("{NAME}-{}-{:04x}", hpa.key(), fastrand::u16(..));
    delete(bench)?;
    fresh_dir(&dir)?;
    bench.apply(
        "throttled",
        &manifest(&dir, work, hpa, &hpa_name).to_string(),
    )?;
    bench.rollout(NAME, Duration::from_secs(180))?;
    // Idle first: the HPA reads its metric (for the ratio, once the agent has a window of
    // the new pod).
    let t = Instant::now();
    let idle = loop {
        let v = bench.json(&["get", "hpa", &hpa_name, "-n", NAMESPACE])?;
        if let Some(c) = hpa.current(&v["status"]) {
            break c;
        }
        ensure!(
            t.elapsed() < Duration::from_secs(180),
            "the HPA read no value within 180 s: {}",
            v["status"]
        );
        thread::sleep(Duration::from_secs(1));
    };
    println!(
        "versus: throttled: HPA on {}: reads {} at idle after {:.0} s",
        hpa.name(),
        hpa.format(idle),
        t.elapsed().as_secs_f64()
    );
    let pods = bench.json(&["get", "pods", "-n", NAMESPACE, "-l", &format!("app={NAME}")])?;
    let first_pod = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["metadata"]["deletionTimestamp"].is_null())
        .and_then(|p| p["metadata"]["name"].as_str())
        .context("no running pod")?
        .to_string();
    let cgroup = bench.container_cgroup(NAMESPACE, &first_pod)?;
    let flag = dir.join("on");
    let on_cs = uptime_cs()?;
    fs::write(&flag, b"").with_context(|| format!("cannot write {}", flag.display()))?;
    let on = Instant::now();
    let mut samples = Vec::new();
    let mut tick = Instant::now();
    while on.elapsed() < length {
        tick += Duration::from_secs(1);
        thread::sleep(tick.saturating_duration_since(Instant::now()));
        let t = on.elapsed().as_secs_f64();
        let s = sample(bench, runtime, api, hpa, &hpa_name, &dir, Some(&cgroup), t);
        if samples.len() % 15 == 0 {
            println!(
                "versus: throttled: {} t={t:.0} s: desired {} current {} heartbeats {} HPA {} ratio [{}] cpu [{}]{}",
                hpa.key(),
                s.desired,
                s.current,
                s.pods,
                s.hpa.map_or("-".into(), |v| hpa.format(v)),
                super::joined(&s.throttled, |(_, v)| format!("{v:.2}")),
                super::joined(&s.cpu, |(_, v)| format!("{:.0}m", v * 1000.0)),
                if s.errors.is_empty() { String::new() } else { format!(" errors {:?}", s.errors) },
            );
        }
        samples.push(s);
    }
    fs::remove_file(&flag).with_context(|| format!("cannot remove {}", flag.display()))?;
    // The last bursts end within a cycle.
    thread::sleep(Duration::from_secs(2));
    let bursts = bursts(&dir, on_cs)?;
    let v = bench.json(&["get", "hpa", &hpa_name, "-n", NAMESPACE])?;
    let uid = v["metadata"]["uid"].as_str().unwrap_or_default();
    let events = crate::exec::output(bench.kubectl().args([
        "get",
        "events",
        "-n",
        NAMESPACE,
        &format!("--field-selector=involvedObject.uid={uid},reason=SuccessfulRescale"),
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]))?;
    Ok(Phase {
        hpa,
        idle: Some(idle),
        samples,
        bursts,
        events: events.lines().map(str::to_owned).collect(),
    })
}

fn keep_raw(bench: &Bench, phases: &[Phase]) -> Result<()> {
    use std::io::Write as _;
    let mut f = bench.raw_file("throttled")?;
    for p in phases {
        for s in &p.samples {
            writeln!(f, "{}", s.json(p.hpa))?;
        }
        for (t, d) in &p.bursts {
            writeln!(
                f,
                "{}",
                json!({"phase": p.hpa.key(), "burst_end": t, "burst_s": d})
            )?;
        }
    }
    f.flush()?;
    Ok(())
}

/// The largest of `v`; NaN when empty.
fn max_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

/// Cores in % of the pods' request.
fn percent_of_request(cores: f64) -> f64 {
    cores / (CPU_M as f64 / 1000.0) * 100.0
}

/// `650 ms / 760 ms`: the median and 95th percentile of durations in seconds.
fn p50_p95_ms(v: &mut [f64]) -> String {
    let ms = |x: f64| or_dash(x, |x| format!("{:.0} ms", x * 1000.0));
    format!("{} / {}", ms(percentile(v, 0.5)), ms(percentile(v, 0.95)))
}

/// A figure, or `–` when there is none.
fn or_dash(v: f64, f: impl Fn(f64) -> String) -> String {
    if v.is_nan() {
        "–".to_string()
    } else {
        f(v)
    }
}

pub fn run(
    bench: &mut Bench,
    runtime: &tokio::runtime::Runtime,
    length: Duration,
    burst: Duration,
) -> Result<()> {
    let per_iteration = calibrate()?;
    let work = (burst.as_secs_f64() / per_iteration).round() as u64;
    println!(
        "versus: throttled: {} spins {:.3} µs of CPU per loop iteration here: {work} iterations a second for a {} ms burst at one replica",
        images::HOST_BUSYBOX,
        per_iteration * 1e6,
        burst.as_millis()
    );
    let original = bench.json(&["get", "apiservice", "v1beta1.metrics.k8s.io"])?;
    ensure!(
        original["spec"]["service"]["namespace"] == "kpulse-system",
        "v1beta1.metrics.k8s.io does not point at kpulse"
    );
    let root = crate::vm::workspace_root()?;
    let t = Instant::now();
    crate::cluster::custom_metrics::install_overlay(&|| bench.kubectl(), &root)
        .context("installing the custom-metrics overlay")?;
    println!(
        "versus: throttled: custom-metrics overlay installed and Available in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    let api = bench
        .apis
        .iter()
        .find(|a| a.source == Source::Kpulse)
        .context("no kpulse API")?
        .clone();
    let mut phases = Vec::new();
    let mut failure = None;
    for hpa in [Hpa::Cpu, Hpa::Throttled] {
        let r = run_phase(bench, runtime, &api, hpa, work, length)
            .with_context(|| format!("phase with the HPA on {}", hpa.name()));
        let _ = fs::remove_file(bench.dirs.run.join(LOAD_DIR).join("on"));
        match r {
            Ok(p) => phases.push(p),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    // Whatever happened: no workload left behind.
    if let Err(e) = delete(bench) {
        println!("versus: throttled: cleaning up: {e:#}");
    }
    keep_raw(bench, &phases)?;

    let mut out = String::new();
    let _ = writeln!(
        out,
        "## A throttled workload: CPU-utilisation HPA against an HPA on cpu_throttled_ratio\n\n\
         Deployment `{NAME}`: request = limit = {CPU_M}m (CFS quota 20 ms per 100 ms); a fixed \
         {work} shell-loop iterations a second ({:.3} µs of CPU each, calibrated with {} on this \
         host: {} ms of CPU a second), shared among the running replicas, done in one burst \
         a second. `autoscaling/v2` HPAs, 1–{MAX_REPLICAS} replicas, default behaviour: CPU \
         utilisation {CPU_TARGET} % (kpulse's `metrics.k8s.io`), then `Pods` \
         `cpu_throttled_ratio` average {THROTTLED_TARGET} (kpulse's `custom.metrics.k8s.io`), \
         each on a new Deployment at 1 replica, load on for {:.0} s after the HPA read a value \
         at idle; sampled every second. Burst: the wall time of a pod's burst (centiseconds); \
         per pod count, the served figures are over settled seconds (count unchanged and \
         load on for ≥ {SETTLE:.0} s, the agent's window).\n",
        per_iteration * 1e6,
        images::HOST_BUSYBOX,
        burst.as_millis(),
        length.as_secs_f64(),
    );
    let _ = writeln!(
        out,
        "| HPA on | idle value | first scale-up | desired replicas (@ s after load on) | max / final | rescales | HPA's metric, mean (max) | served CPU ≥ {CPU_SCALES_AT:.0} % of request (max) | burst p50 / p95 |\n|---|---|---|---|---|---|---|---|---|"
    );
    for p in &phases {
        let (path, rescales) = p.path();
        let seen: Vec<f64> = p.samples.iter().filter_map(|s| s.hpa).collect();
        let mut all: Vec<f64> = p.bursts.iter().map(|b| b.1).collect();
        let max = p.samples.iter().map(|s| s.desired).max().unwrap_or(0);
        let last = p.samples.last().map_or(0, |s| s.desired);
        // Every pod's served CPU each second, in % of its request: how often a CPU HPA
        // reading that second would scale (80 % and its 10 % tolerance).
        let cpu: Vec<f64> = p
            .samples
            .iter()
            .flat_map(|s| s.cpu.iter().map(|(_, c)| percent_of_request(*c)))
            .collect();
        let high = cpu.iter().filter(|c| **c >= CPU_SCALES_AT).count();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {path} | {max} / {last} | {rescales} | {} ({}) | {high} of {} pod-seconds ({}) | {} |",
            p.hpa.name(),
            p.idle.map_or("–".into(), |v| p.hpa.format(v)),
            p.first_up()
                .map_or("none".to_string(), |t| format!("{t:.0} s")),
            or_dash(mean(&seen), |v| p.hpa.format(v)),
            or_dash(max_of(&seen), |v| p.hpa.format(v)),
            cpu.len(),
            or_dash(max_of(&cpu), |v| format!("{v:.0} %")),
            p50_p95_ms(&mut all),
        );
    }
    let _ = writeln!(
        out,
        "\n| HPA on | pods sharing | settled s | served cpu_throttled_ratio, mean | served CPU per pod, % of request | first pod's cgroup: usage % of request, throttled periods | bursts | burst p50 / p95 |\n|---|---|---|---|---|---|---|---|"
    );
    let mut too_busy = false;
    for p in &phases {
        for (pods, mut g) in p.groups() {
            let (cpu_ns, periods, throttled, secs) = g.cgroup;
            let usage = if secs > 0.0 {
                percent_of_request(cpu_ns as f64 / 1e9 / secs)
            } else {
                f64::NAN
            };
            if pods == 1 && usage >= CPU_SCALES_AT {
                too_busy = true;
            }
            let _ = writeln!(
                out,
                "| {} | {pods} | {} | {} | {} | {} | {} | {} |",
                p.hpa.name(),
                g.seconds,
                or_dash(mean(&g.throttled), |v| format!("{v:.2}")),
                or_dash(mean(&g.cpu), |v| format!("{v:.0} %")),
                if secs > 0.0 && periods > 0 {
                    format!("{usage:.0} %, {:.2}", throttled as f64 / periods as f64)
                } else {
                    "–".to_string()
                },
                g.bursts.len(),
                p50_p95_ms(&mut g.bursts),
            );
        }
    }
    if too_busy {
        let _ = writeln!(
            out,
            "\n**Invalid contrast**: one pod used ≥ {CPU_SCALES_AT:.0} % of its request, where \
             the CPU HPA scales too; lower `--throttled-burst`."
        );
    }
    let _ = writeln!(out, "\nThe HPAs' `SuccessfulRescale` events:\n");
    for p in &phases {
        let _ = writeln!(
            out,
            "- {}: {}",
            p.hpa.name(),
            if p.events.is_empty() {
                "none".to_string()
            } else {
                p.events.join("; ")
            }
        );
    }
    let _ = writeln!(
        out,
        "\nRaw samples and bursts: `{}`.",
        bench.raw_path("throttled").display()
    );
    bench.section(&out);
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busybox_times() {
        assert_eq!(times_seconds("0m0.820s"), Some(0.82));
        assert_eq!(times_seconds("1m2.500s"), Some(62.5));
        assert_eq!(times_seconds("0.8s"), None);
    }

    /// The script gets the work and the spin loop; the HPA the metric of its phase.
    #[test]
    fn the_manifest_has_the_phase_metric() {
        let m = manifest(Path::new("/run/x"), 1234, Hpa::Throttled, "h");
        let script = m["items"][0]["spec"]["template"]["spec"]["containers"][0]["command"][2]
            .as_str()
            .unwrap_or_default();
        assert!(script.contains("i=$((1234 / $#)); while [ $i -gt 0 ]"));
        assert!(!script.contains("WORK") && !script.contains("SPIN"));
        let hpa = &m["items"][1]["spec"];
        assert_eq!(hpa["metrics"][0]["pods"]["target"]["averageValue"], "300m");
        assert!(hpa["behavior"].is_null());
        let cpu = manifest(Path::new("/run/x"), 1, Hpa::Cpu, "h");
        assert_eq!(
            cpu["items"][1]["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            80
        );
    }

    #[test]
    fn settled_groups_wait_for_the_window() {
        let samples = (0..100)
            .map(|t| Sample {
                t: t as f64,
                desired: if t < 50 { 1 } else { 2 },
                pods: if t < 50 { 1 } else { 2 },
                throttled: vec![("a".into(), 0.5)],
                first: Some((t as u64 * 1_000_000, t as u64 * 10, t as u64 * 5)),
                ..Sample::default()
            })
            .collect();
        let p = Phase {
            hpa: Hpa::Cpu,
            idle: None,
            samples,
            bursts: vec![(10.0, 0.7), (60.0, 0.3)],
            events: Vec::new(),
        };
        let g = p.groups();
        // 1 pod: t 30..=49; 2 pods: t 80..=99.
        assert_eq!(g[&1].seconds, 20);
        assert_eq!(g[&2].seconds, 20);
        assert_eq!(g[&1].cgroup.1, 190);
        assert_eq!(g[&2].cgroup.2, 95);
        assert_eq!(g[&1].bursts, vec![0.7]);
        assert_eq!(p.path(), ("1 → 2 @50".to_string(), 1));
        assert_eq!(p.first_up(), Some(50.0));
    }
}
