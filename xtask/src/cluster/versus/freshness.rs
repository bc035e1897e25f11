//! Freshness and accuracy on the same pods, read through both APIs every 100 ms.
//!
//! - **Steps.** Pod `burner` (CPU limit 500m) spins while a file exists on the node and
//!   idles otherwise. Each step waits a random 0–15 s (so that steps fall anywhere in both
//!   systems' sampling cycles), turns the load on, holds it until both APIs have served it
//!   plus 3 s and another random 0–15 s, turns it off and holds again. The step's instant is the kernel's: when the
//!   burner's CPU counter starts (or stops) climbing at ≥ 0.5 CPU over 20 ms, to one 5 ms
//!   read. Freshness is the time from that instant to the first answer serving ≥ 90 % of
//!   the new rate (≤ 10 % of it after a drop), the rate being what the counters say over the
//!   second half of the hold. A rate over a trailing window `w` cannot reach 90 % before
//!   `0.9 w`.
//! - **Accuracy.** Every distinct point either API served (pod `steady`, a constant 300m
//!   spinner holding 48 MiB in a memory-backed volume, and the burner) against the counters
//!   over the window it states. Both APIs serve whole-second timestamps (`metav1.Time`), so
//!   a window ends somewhere in `[t, t + 1 s)`: the truth is taken over the window ending at
//!   `t + 0.5 s`, and the spread of the truth over that second is reported beside.
//! - **New pods.** Pods created one by one, 2–17 s apart (at random): time from the container's
//!   start (containerd's `startedAt`, in ns) to the first answer listing the pod.

use std::{
    fmt::Write as _,
    fs, thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};

use super::{
    api::{PodPoint, Source},
    percentile,
    truth::{self, Sampler, Series},
    Bench, Observation, Poller, BENCH_LABEL, NAMESPACE,
};
use crate::cluster::images;

const BURNER_LIMIT: f64 = 0.5;
const HOLD_AFTER: Duration = Duration::from_secs(3);
/// The longer of the two systems' cycles (metrics-server's default resolution): each step
/// and each new pod waits a random part of it, so that they fall anywhere in both cycles.
const CYCLE: Duration = Duration::from_secs(15);
const MAX_WAIT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(100);
const SEC: i128 = 1_000_000_000;

/// A pod of the benchmark: one container running `script` under a CPU limit.
pub fn pod(name: &str, cpu_limit: &str, memory_limit: &str, script: &str, extra: &str) -> String {
    let script = serde_json::to_string(script).unwrap_or_default();
    format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"{NAMESPACE}","labels":{{"kpulse.dev/bench":"versus","app":"{name}"}}}},
"spec":{{"terminationGracePeriodSeconds":1,{extra}"containers":[{{"name":"main","image":"{image}","imagePullPolicy":"Never",
"command":["/bin/sh","-c",{script}],
"resources":{{"requests":{{"cpu":"{cpu_limit}","memory":"{memory_limit}"}},"limits":{{"cpu":"{cpu_limit}","memory":"{memory_limit}"}}}}{mounts}}}]}}}}"#,
        image = images::BUSYBOX_IMAGE,
        mounts = if extra.contains("\"volumes\"") {
            r#","volumeMounts":[{"name":"v","mountPath":"/v"}]"#
        } else {
            ""
        },
    )
}

/// Spins while `/v/on` exists.
const BURNER: &str = "trap 'exit 0' TERM; while :; do if [ -e /v/on ]; then i=0; while [ $i -lt 5000 ]; do i=$((i+1)); done; else sleep 0.1; fi; done";
/// Holds 48 MiB in a memory-backed volume, spins under its limit.
const STEADY: &str = "trap 'exit 0' TERM; dd if=/dev/zero of=/v/fill bs=1M count=48 2>/dev/null; while :; do i=0; while [ $i -lt 5000 ]; do i=$((i+1)); done; done";
/// A light spinner (new pods).
const LIGHT: &str = "trap 'exit 0' TERM; while :; do i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; sleep 0.05; done";
/// [`LIGHT`] after 5 s idle, and ready from then on (see [`READY_FILE_PROBE`]): a pod that
/// gets its work once it is Ready, as one behind a Service does.
const LIGHT_WHEN_READY: &str = "trap 'exit 0' TERM; sleep 5; : > /tmp/ready; while :; do i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; sleep 0.05; done";
/// The readiness probe of [`LIGHT_WHEN_READY`]'s pods.
const READY_FILE_PROBE: &str = r#"{"exec":{"command":["/bin/sh","-c","[ -e /tmp/ready ]"]},"periodSeconds":1,"failureThreshold":1}"#;

/// The CPU a source last served for `pod` (all containers), if any.
fn served_cpu(o: &Observation, pod: &str) -> Option<f64> {
    let points = o.points.as_ref().ok()?;
    let p = points.iter().find(|p| p.pod == pod)?;
    Some(p.containers.iter().map(|c| c.cpu).sum())
}

/// Waits until every source's latest answer satisfies `ok` for `pod`, at most [`MAX_WAIT`].
fn wait_served(poller: &Poller, pod: &str, ok: impl Fn(f64) -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < MAX_WAIT {
        if Source::ALL.iter().all(|s| {
            poller
                .seen
                .latest(*s)
                .and_then(|o| served_cpu(&o, pod))
                .is_some_and(&ok)
        }) {
            return true;
        }
        thread::sleep(POLL);
    }
    false
}

/// A random wait in `[0, max)`, so that steps fall anywhere in both systems' cycles.
pub fn jitter(max: Duration) -> Duration {
    Duration::from_nanos(fastrand::u64(
        ..u64::try_from(max.as_nanos()).unwrap_or(u64::MAX).max(1),
    ))
}

/// One step's instants (unix ns).
struct Step {
    on_flag: i128,
    off_flag: i128,
}

pub fn run(
    bench: &mut Bench,
    rt: &tokio::runtime::Runtime,
    steps: usize,
    new_pods: usize,
) -> Result<()> {
    let load = bench.dirs.run.join("versus-load");
    fs::create_dir_all(&load)?;
    let flag = load.join("on");
    let _ = fs::remove_file(&flag);
    let host_path = format!(
        r#""volumes":[{{"name":"v","hostPath":{{"path":"{}","type":"Directory"}}}}],"#,
        load.display()
    );
    bench.apply("burner", &pod("burner", "500m", "32Mi", BURNER, &host_path))?;
    bench.apply(
        "steady",
        &pod(
            "steady",
            "300m",
            "128Mi",
            STEADY,
            r#""volumes":[{"name":"v","emptyDir":{"medium":"Memory","sizeLimit":"64Mi"}}],"#,
        ),
    )?;
    bench.wait_ready(NAMESPACE, BENCH_LABEL, Duration::from_secs(120))?;
    let sampler = Sampler::start();
    for name in ["burner", "steady"] {
        sampler.watch(name, bench.container_cgroup(NAMESPACE, name)?);
    }
    let poller = Poller::start(rt, &bench.apis, BENCH_LABEL, POLL);
    for name in ["burner", "steady"] {
        ensure!(
            wait_served(&poller, name, |_| true),
            "{name} was not served by both APIs within {MAX_WAIT:?}"
        );
    }
    // Let metrics-server's first windows (which may start before the pods) pass.
    thread::sleep(Duration::from_secs(20));
    let mut log = Vec::new();
    for i in 0..steps {
        thread::sleep(jitter(CYCLE));
        let on_flag = truth::now_ns();
        fs::write(&flag, b"")?;
        let up = wait_served(&poller, "burner", |c| c >= 0.9 * BURNER_LIMIT);
        thread::sleep(HOLD_AFTER);
        thread::sleep(jitter(CYCLE));
        let off_flag = truth::now_ns();
        fs::remove_file(&flag)?;
        let down = wait_served(&poller, "burner", |c| c <= 0.1 * BURNER_LIMIT);
        thread::sleep(HOLD_AFTER);
        println!(
            "versus: step {}/{steps} done (both served the rise: {up}, the drop: {down})",
            i + 1
        );
        log.push(Step { on_flag, off_flag });
    }
    let fresh = new_pod_starts(bench, &poller, new_pods)?;
    let seen = poller.seen.clone();
    drop(poller);
    let burner = sampler.series("burner");
    let steady = sampler.series("steady");
    drop(sampler);
    bench.keep_raw(
        "freshness",
        &seen,
        &[("burner", &burner), ("steady", &steady)],
    )?;

    // Freshness.
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Freshness: load steps 0 → {BURNER_LIMIT} CPU (the burner's limit) → 0, {steps} each way\n\n\
         Time from the kernel's counter changing slope to the first answer (both APIs polled \
         every {} ms, as the HPA's identity) serving ≥ 90 % of the new rate, or ≤ 10 % of it \
         after the drop. New pods: containerd's `startedAt` to the first answer listing the pod; \
         \"counted by the HPA\": the pod's Ready transition to the first answer whose point the \
         HPA would use in the pod's first 5 minutes, for pods busy from their start and pods \
         that idle until they are Ready (`timestamp` ≥ Ready's \
         `lastTransitionTime` + `window`; before that it takes the pod's CPU as 0 when scaling \
         up and leaves the pod out when scaling down).\n",
        POLL.as_millis()
    );
    let _ = writeln!(
        out,
        "| step | source | p50 | p95 | max | missed (> {} s) |",
        MAX_WAIT.as_secs()
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    let mut per_step = String::new();
    let mut p95s = Vec::new();
    for (dir, name) in [(true, "0 → 90 %"), (false, "→ ≤ 10 %")] {
        for source in Source::ALL {
            let obs = seen.of(source);
            let mut times = Vec::new();
            let mut missed = 0;
            for (i, s) in log.iter().enumerate() {
                match step_time(&burner, &obs, s, dir) {
                    Some((t, rate)) => {
                        times.push(t);
                        let _ = writeln!(
                            per_step,
                            "| {} | {} | {} | {:.3} | {:.2} s | {} |",
                            i + 1,
                            if dir { "rise" } else { "drop" },
                            source.name(),
                            rate,
                            t,
                            [1, 15]
                                .iter()
                                .map(|w| ideal_time(&burner, s, dir, Duration::from_secs(*w))
                                    .map_or("–".to_string(), |t| format!("{t:.2} s")))
                                .collect::<Vec<_>>()
                                .join(" / ")
                        );
                    }
                    None => missed += 1,
                }
            }
            let p95 = percentile(&mut times, 0.95);
            p95s.push((dir, source, p95));
            let _ = writeln!(
                out,
                "| {name} | {} | {:.2} s | {:.2} s | {:.2} s | {missed} |",
                source.name(),
                percentile(&mut times, 0.5),
                p95,
                percentile(&mut times, 1.0),
            );
        }
        for w in [1, 15] {
            let mut times: Vec<f64> = log
                .iter()
                .filter_map(|s| ideal_time(&burner, s, dir, Duration::from_secs(w)))
                .collect();
            let _ = writeln!(
                out,
                "| {name} | *the counters' own trailing {w} s rate* | {:.2} s | {:.2} s | {:.2} s | {} |",
                percentile(&mut times, 0.5),
                percentile(&mut times, 0.95),
                percentile(&mut times, 1.0),
                log.len() - times.len(),
            );
        }
    }
    for (row, counted, kind) in [
        ("new pod", false, None),
        (
            "new pod counted by the HPA, busy from its start",
            true,
            Some(false),
        ),
        (
            "new pod counted by the HPA, busy once Ready",
            true,
            Some(true),
        ),
    ] {
        for source in Source::ALL {
            let obs = seen.of(source);
            let pods: Vec<&Fresh> = fresh
                .iter()
                .filter(|f| kind.is_none_or(|k| k == f.busy_when_ready))
                .collect();
            let mut times: Vec<f64> = pods
                .iter()
                .filter_map(|f| {
                    let from = if counted { f.ready } else { f.started };
                    obs.iter()
                        .find(|o| f.served_in(o, counted))
                        .map(|o| (o.at - from) as f64 / 1e9)
                })
                .collect();
            let missed = pods.len() - times.len();
            let _ = writeln!(
                out,
                "| {row} ({} pods) | {} | {:.2} s | {:.2} s | {:.2} s | {missed} |",
                pods.len(),
                source.name(),
                percentile(&mut times, 0.5),
                percentile(&mut times, 0.95),
                percentile(&mut times, 1.0),
            );
        }
    }
    for dir in [true, false] {
        let get = |s| {
            p95s.iter()
                .find(|(d, src, _)| *d == dir && *src == s)
                .map_or(f64::NAN, |x| x.2)
        };
        let _ = writeln!(
            out,
            "\np95 {}: metrics-server / kpulse = **{:.1}×**",
            if dir { "rise" } else { "drop" },
            get(Source::MetricsServer) / get(Source::Kpulse)
        );
    }
    let errors: Vec<String> = Source::ALL
        .iter()
        .map(|s| {
            let obs = seen.of(*s);
            format!(
                "{}: {} answers, {} errors",
                s.name(),
                obs.len(),
                obs.iter().filter(|o| o.points.is_err()).count()
            )
        })
        .collect();
    let _ = writeln!(out, "\nPolls: {}.\n", errors.join("; "));
    let _ = writeln!(
        out,
        "<details><summary>Every step</summary>\n\n| step | | source | rate (counters) | time | the counters' own trailing 1 s / 15 s rate |\n|---|---|---|---|---|---|\n{per_step}\n</details>\n"
    );

    // Accuracy.
    let _ = writeln!(
        out,
        "## Accuracy: served values against the cgroup counters over the stated window\n\n\
         Every distinct point served during the steps. Both APIs serve whole-second \
         timestamps, so a window ends somewhere in the second after its timestamp. \
         \"Determined\" points are those whose true rate moves less than {:.0} % over that \
         second; their CPU error is against the counters' rate over the window ending at the \
         timestamp + 0.5 s. \"Consistent\": of all points with ≥ 0.05 CPU, those within ±2 % \
         of the counters' rate for some end in that second. Working set: against the kernel's \
         usage − inactive_file read nearest the same instant.\n",
        DETERMINED * 100.0
    );
    let _ = writeln!(
        out,
        "| pod | source | points | window (median) | determined | CPU \\|error\\| p50 | p95 | max | within ±2 % | consistent | memory \\|error\\| p50 | max |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (pod, series) in [("steady", &steady), ("burner", &burner)] {
        for source in Source::ALL {
            let a = accuracy(&seen.of(source), pod, series);
            let _ = writeln!(out, "{}", a.row(pod, source));
        }
    }
    bench.section(&out);
    Ok(())
}

/// The span over which "running flat out" is judged: well below the 100 ms CFS period
/// (the burner runs its 50 ms quota in one piece) and well above the idle loop's few ms.
const BURST: i128 = 20_000_000;

/// When the burner started spinning after `flag` (the first instant its counter rises at
/// ≥ 0.5 CPU over [`BURST`]), or stopped (the last such instant, within 2 s).
fn busy_edge(series: &Series, flag: i128, rise: bool) -> Option<i128> {
    let busy = |t: i128| series.rate(t, t + BURST).is_some_and(|r| r >= 0.5);
    let mut reads = series
        .cpu
        .iter()
        .map(|(t, _)| *t)
        .filter(|t| *t >= flag - 200_000_000 && *t <= flag + 2 * SEC);
    if rise {
        reads.filter(|t| *t >= flag).find(|t| busy(*t))
    } else {
        reads.rfind(|t| busy(*t)).map(|t| t + BURST)
    }
}

/// The freshness of one step for one source: `(seconds, rate)`.
fn step_time(series: &Series, obs: &[Observation], s: &Step, rise: bool) -> Option<(f64, f64)> {
    let (from, limit, rate, ok) = step_target(series, s, rise)?;
    let hit = obs
        .iter()
        .filter(|o| o.at >= from)
        .find(|o| served_cpu(o, "burner").is_some_and(&ok))?;
    (hit.at <= limit).then(|| ((hit.at - from) as f64 / 1e9, rate))
}

/// What a step's answer must show: `(the kernel's edge, the latest credited instant, the
/// level, the test)`. A later step must not be credited to this one.
#[allow(clippy::type_complexity)]
fn step_target(
    series: &Series,
    s: &Step,
    rise: bool,
) -> Option<(i128, i128, f64, Box<dyn Fn(f64) -> bool>)> {
    let on = busy_edge(series, s.on_flag, true)?;
    // The level: the counters over the second half of the hold.
    let rate = series.rate(on + (s.off_flag - on) / 2, s.off_flag)?;
    if rise {
        Some((on, s.off_flag, rate, Box::new(move |c| c >= 0.9 * rate)))
    } else {
        Some((
            busy_edge(series, s.off_flag, false)?,
            s.off_flag + MAX_WAIT.as_nanos() as i128,
            rate,
            Box::new(move |c| c <= 0.1 * rate),
        ))
    }
}

/// The same for a perfect API serving the counters' own rate over a trailing `window`,
/// read every 5 ms: how much of a source's time the window alone explains.
fn ideal_time(series: &Series, s: &Step, rise: bool, window: Duration) -> Option<f64> {
    let (from, limit, _, ok) = step_target(series, s, rise)?;
    let w = window.as_nanos() as i128;
    series
        .cpu
        .iter()
        .map(|(t, _)| *t)
        .filter(|t| *t >= from && *t <= limit)
        .find(|t| series.rate(t - w, *t).is_some_and(&ok))
        .map(|t| (t - from) as f64 / 1e9)
}

/// Points whose truth moves less than this over the stated second are "determined".
const DETERMINED: f64 = 0.01;

#[derive(Default)]
struct Accuracy {
    points: usize,
    windows: Vec<f64>,
    /// |error| against the truth at the second's middle, for determined points.
    cpu: Vec<f64>,
    /// Points (with ≥ 0.05 CPU) whose served CPU is within the truth's range over the
    /// second ±2 %, and how many there were.
    consistent: usize,
    loaded: usize,
    memory: Vec<f64>,
    memory_kib: Vec<f64>,
}

impl Accuracy {
    fn row(mut self, pod: &str, source: Source) -> String {
        let within = self.cpu.iter().filter(|e| **e <= 0.02).count();
        format!(
            "| {pod} | {} | {} | {:.2} s | {} | {:.2} % | {:.2} % | {:.2} % | {:.0} % | {:.0} % | {:.3} % | {:.0} KiB |",
            source.name(),
            self.points,
            percentile(&mut self.windows, 0.5),
            self.cpu.len(),
            100.0 * percentile(&mut self.cpu, 0.5),
            100.0 * percentile(&mut self.cpu, 0.95),
            100.0 * percentile(&mut self.cpu, 1.0),
            100.0 * within as f64 / self.cpu.len().max(1) as f64,
            100.0 * self.consistent as f64 / self.loaded.max(1) as f64,
            100.0 * percentile(&mut self.memory, 0.5),
            percentile(&mut self.memory_kib, 1.0),
        )
    }
}

/// Every distinct point `obs` served for `pod`, against `series`.
fn accuracy(obs: &[Observation], pod: &str, series: &Series) -> Accuracy {
    let mut seen = std::collections::BTreeSet::new();
    let mut a = Accuracy::default();
    for p in obs
        .iter()
        .filter_map(|o| o.points.as_ref().ok())
        .flatten()
        .filter(|p: &&PodPoint| p.pod == pod)
    {
        if !seen.insert((p.timestamp, p.window.as_nanos())) {
            continue;
        }
        let w = p.window.as_nanos() as i128;
        let end = i128::from(p.timestamp) * SEC;
        let Some(mid) = series.rate(end + SEC / 2 - w, end + SEC / 2) else {
            continue;
        };
        let cpu: f64 = p.containers.iter().map(|c| c.cpu).sum();
        let memory: f64 = p.containers.iter().map(|c| c.memory).sum();
        a.points += 1;
        a.windows.push(p.window.as_secs_f64());
        if mid >= 0.05 {
            let ends: Vec<f64> = (0..=10)
                .filter_map(|k| {
                    let e = end + SEC * k / 10 - i128::from(k == 10);
                    series.rate(e - w, e)
                })
                .collect();
            let lo = ends.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = ends.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            a.loaded += 1;
            if cpu >= lo * 0.98 && cpu <= hi * 1.02 {
                a.consistent += 1;
            }
            if (hi - lo) / mid < DETERMINED {
                a.cpu.push(((cpu - mid) / mid).abs());
            }
        }
        if let Some(m) = series.memory_near(end + SEC / 2) {
            if m > 0 {
                a.memory.push(((memory - m as f64) / m as f64).abs());
                a.memory_kib.push((memory - m as f64).abs() / 1024.0);
            }
        }
    }
    a
}

/// A new pod of the freshness part.
struct Fresh {
    name: String,
    /// Busy only once Ready ([`LIGHT_WHEN_READY`]), else from its start ([`LIGHT`]).
    busy_when_ready: bool,
    /// Its container's start, from containerd (unix ns).
    started: i128,
    /// Its Ready condition's `lastTransitionTime` (unix ns, whole seconds).
    ready: i128,
}

impl Fresh {
    /// Whether answer `o` has a point of this pod (one the HPA would count, if `counted`).
    fn served_in(&self, o: &Observation, counted: bool) -> bool {
        o.points.as_ref().is_ok_and(|p| {
            p.iter()
                .any(|p| p.pod == self.name && (!counted || hpa_counts(p, self.ready)))
        })
    }
}

/// Whether the HPA uses `p`'s CPU for a pod that became Ready at `ready` (unix ns) and is in
/// its CPU initialisation period (`--horizontal-pod-autoscaler-cpu-initialization-period`,
/// 5 min): the replica calculator ignores the point while `timestamp` is before Ready's
/// transition + `window`.
fn hpa_counts(p: &PodPoint, ready: i128) -> bool {
    i128::from(p.timestamp) * SEC
        >= ready + i128::try_from(p.window.as_nanos()).unwrap_or(i128::MAX)
}

/// Creates `n` pods of each kind ([`LIGHT`], [`LIGHT_WHEN_READY`]), alternately, a few
/// seconds apart, and waits until both APIs serve each a point the
/// HPA would count ([`hpa_counts`]), at most [`MAX_WAIT`] in all.
fn new_pod_starts(bench: &Bench, poller: &Poller, n: usize) -> Result<Vec<Fresh>> {
    let mut names = Vec::new();
    for k in 0..2 * n {
        thread::sleep(Duration::from_secs(2) + jitter(CYCLE));
        let when_ready = k % 2 == 1;
        let name = format!("fresh-{k}");
        // 50m: ten of them fit beside the rest on a 2-CPU node.
        let mut manifest: serde_json::Value = serde_json::from_str(&pod(
            &name,
            "50m",
            "16Mi",
            if when_ready { LIGHT_WHEN_READY } else { LIGHT },
            "",
        ))?;
        if when_ready {
            manifest["spec"]["containers"][0]["readinessProbe"] =
                serde_json::from_str(READY_FILE_PROBE)?;
        }
        bench.apply(&name, &manifest.to_string())?;
        names.push((name, when_ready));
    }
    bench.wait_ready(
        NAMESPACE,
        "kpulse.dev/bench=versus",
        Duration::from_secs(120),
    )?;
    let mut out = Vec::new();
    for (name, busy_when_ready) in &names {
        let v = bench.json(&["get", "pod", "-n", NAMESPACE, name])?;
        let id = v["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .and_then(|id| id.strip_prefix("containerd://"))
            .with_context(|| format!("{name}: no container"))?;
        let started = bench.inspect(id)?["status"]["startedAt"]
            .as_str()
            .and_then(|s| {
                time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
            })
            .map(|t| t.unix_timestamp_nanos())
            .with_context(|| format!("{name}: no startedAt from containerd"))?;
        let ready = v["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready" && c["status"] == "True")
            .and_then(|c| c["lastTransitionTime"].as_str())
            .and_then(|s| {
                time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
            })
            .map(|t| t.unix_timestamp_nanos())
            .with_context(|| format!("{name}: no Ready transition"))?;
        out.push(Fresh {
            name: name.clone(),
            busy_when_ready: *busy_when_ready,
            started,
            ready,
        });
    }
    let t = Instant::now();
    for f in &out {
        while t.elapsed() < MAX_WAIT
            && !Source::ALL.iter().all(|s| {
                poller
                    .seen
                    .latest(*s)
                    .is_some_and(|o| f.served_in(&o, true))
            })
        {
            thread::sleep(POLL);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads every 5 ms of a counter that idles at 0.01 CPU and spins at 1 CPU in
    /// `[start, stop)`.
    fn series(start: i128, stop: i128) -> Series {
        let mut cpu = Vec::new();
        let mut c = 0f64;
        let mut t = 0;
        while t <= 5 * SEC {
            cpu.push((t, c as u64));
            let next = t + 5_000_000;
            for ns in (t..next).step_by(100_000) {
                c += if ns >= start && ns < stop {
                    100_000.0
                } else {
                    1_000.0
                };
            }
            t = next;
        }
        Series {
            cpu,
            memory: Vec::new(),
        }
    }

    #[test]
    fn busy_edges_are_found_to_one_read() {
        let s = series(SEC + 300_000_000, 3 * SEC + 700_000_000);
        let on = busy_edge(&s, SEC, true).expect("test input");
        assert!((on - (SEC + 300_000_000)).abs() <= 10_000_000, "{on}");
        let off = busy_edge(&s, 3 * SEC + 500_000_000, false).expect("test input");
        assert!((off - (3 * SEC + 700_000_000)).abs() <= 10_000_000, "{off}");
        // No spinning after the flag: no edge.
        assert_eq!(busy_edge(&series(0, 0), SEC, true), None);
    }

    #[test]
    fn steps_are_timed_from_the_kernel_edge() {
        let s = series(SEC, 3 * SEC);
        let answer = |at: i128, cpu: f64| Observation {
            at,
            points: Ok(vec![PodPoint {
                pod: "burner".into(),
                timestamp: (at / SEC) as i64,
                window: Duration::from_secs(1),
                containers: vec![super::super::api::Usage { cpu, memory: 0.0 }],
            }]),
        };
        let obs = vec![
            answer(SEC + 500_000_000, 0.5),
            answer(2 * SEC, 0.95),
            answer(3 * SEC + 400_000_000, 0.5),
            answer(4 * SEC, 0.05),
        ];
        let step = Step {
            on_flag: SEC - 100_000_000,
            off_flag: 3 * SEC - 100_000_000,
        };
        let (up, rate) = step_time(&s, &obs, &step, true).expect("test input");
        assert!((up - 1.0).abs() < 0.011, "{up}");
        assert!((rate - 0.99).abs() < 0.02, "{rate}");
        let (down, _) = step_time(&s, &obs, &step, false).expect("test input");
        assert!((down - 1.0).abs() < 0.011, "{down}");
    }

    /// The HPA's initialisation rule: a point counts once its window starts at or after
    /// the Ready transition.
    #[test]
    fn a_new_pod_counts_once_its_window_starts_after_ready() {
        let point = |timestamp: i64, window: u64| PodPoint {
            pod: "p".into(),
            timestamp,
            window: Duration::from_secs(window),
            containers: Vec::new(),
        };
        let ready = 100 * SEC;
        assert!(!hpa_counts(&point(100, 1), ready));
        assert!(hpa_counts(&point(101, 1), ready));
        assert!(!hpa_counts(&point(144, 45), ready));
        assert!(hpa_counts(&point(145, 45), ready));
        assert!(hpa_counts(&point(160, 15), ready));
    }
}
