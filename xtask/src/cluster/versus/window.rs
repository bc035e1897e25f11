//! The served window, decided by measurement: the HPA's reaction to a load step and its
//! replica flapping on a bursty workload, with kpulse serving each `--metric-window` in
//! turn and with metrics-server, in one run.
//!
//! - **Reaction**: the load-step trials of [`super::hpa`] (Deployment `web`), at the
//!   controller-manager's default 15 s sync.
//! - **Flapping**: Deployment `bursty` (request 100m, limit 200m) whose every pod, each
//!   second, spins for one second at its limit with probability 1/6 and otherwise sleeps:
//!   a mean of 33 % of its request, below the HPA's 50 % target and outside its 10 %
//!   tolerance, so an HPA that saw the mean would never scale it. Its HPA is the one of
//!   `web` (50 %, 1–4 replicas, default scale-up, scale-down stabilisation 30 s). Over
//!   each phase the benchmark counts the HPA's rescales, the highest replica count and the
//!   replica-seconds above one, and samples the utilisation the HPA reports every second.
//!   The first `bursty` pod's cgroup counter gives the workload's true mean.
//!
//! kpulse's window is switched with `kubectl set env` of `KPULSE_METRIC_WINDOW` on the
//! aggregator-api (a rollout), and removed again at the end, whatever happens; the
//! `v1beta1.metrics.k8s.io` APIService is pointed at the source under test as in
//! [`super::hpa`].

use std::{
    fmt::Write as _,
    fs, thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};

use super::{api::Source, hpa, percentile, Bench, NAMESPACE};
use crate::cluster::images;

const WINDOW_ENV: &str = "KPULSE_METRIC_WINDOW";

fn bursty_manifest(load: &std::path::Path) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
{{"apiVersion":"apps/v1","kind":"Deployment",
"metadata":{{"name":"bursty","namespace":"{NAMESPACE}"}},
"spec":{{"replicas":1,"selector":{{"matchLabels":{{"app":"bursty"}}}},
"template":{{"metadata":{{"labels":{{"app":"bursty","kpulse.dev/bench":"versus"}}}},
"spec":{{"terminationGracePeriodSeconds":1,"containers":[{{"name":"main","image":"{image}","imagePullPolicy":"Never",
"command":["/bin/sh","-c","trap 'exit 0' TERM; while :; do if [ -e /v/on ] && [ $((RANDOM % 6)) -eq 0 ]; then sleep 1 & p=$!; while kill -0 $p 2>/dev/null; do :; done; wait $p; else sleep 1; fi; done"],
"resources":{{"requests":{{"cpu":"100m","memory":"16Mi"}},"limits":{{"cpu":"200m","memory":"32Mi"}}}},
"volumeMounts":[{{"name":"v","mountPath":"/v","readOnly":true}}]}}],
"volumes":[{{"name":"v","hostPath":{{"path":"{load}","type":"Directory"}}}}]}}}}}}}},
{{"apiVersion":"autoscaling/v2","kind":"HorizontalPodAutoscaler",
"metadata":{{"name":"bursty","namespace":"{NAMESPACE}"}},
"spec":{{"scaleTargetRef":{{"apiVersion":"apps/v1","kind":"Deployment","name":"bursty"}},
"minReplicas":1,"maxReplicas":4,
"metrics":[{{"type":"Resource","resource":{{"name":"cpu","target":{{"type":"Utilization","averageUtilization":50}}}}}}],
"behavior":{{"scaleDown":{{"stabilizationWindowSeconds":30}}}}}}}}]}}"#,
        image = images::BUSYBOX_IMAGE,
        load = load.display()
    )
}

/// One configuration under test.
#[derive(Clone, Copy, Debug)]
struct Setting {
    source: Source,
    /// kpulse's `--metric-window`.
    window: Option<Duration>,
}

impl Setting {
    fn name(&self) -> String {
        match self.window {
            Some(w) => format!("kpulse, window {}", humantime::format_duration(w)),
            None => format!("{} (15 s resolution)", self.source.name()),
        }
    }
}

/// What one bursty phase saw.
#[derive(Debug, Default)]
struct Flapping {
    rescales: usize,
    max_replicas: i64,
    /// ∫ (replicas − 1) dt over the phase, in seconds.
    extra_replica_seconds: f64,
    /// The utilisation the HPA reported, sampled every second (%).
    seen: Vec<f64>,
    /// The first pod's true mean over the phase, in % of its request.
    true_mean: Option<f64>,
    phase: Duration,
}

/// Sets kpulse's window on the aggregator-api (`None`: its default) and waits for the
/// rollout.
fn set_window(bench: &Bench, window: Option<Duration>) -> Result<()> {
    let assignment = match window {
        Some(w) => format!("{WINDOW_ENV}={}ms", w.as_millis()),
        None => format!("{WINDOW_ENV}-"),
    };
    crate::exec::output(bench.kubectl().args([
        "-n",
        "kpulse-system",
        "set",
        "env",
        "deployment/kpulse-aggregator-api",
        &assignment,
    ]))?;
    crate::exec::output(
        bench
            .kubectl()
            .args([
                "-n",
                "kpulse-system",
                "rollout",
                "status",
                "deployment/kpulse-aggregator-api",
                "--timeout=300s",
            ])
            .arg("--request-timeout=0"),
    )?;
    Ok(())
}

/// Waits until the HPA named `name` has settled at one replica with a utilisation read.
fn settle(bench: &Bench, name: &str) -> Result<()> {
    let t = Instant::now();
    loop {
        let v = bench.json(&["get", "hpa", name, "-n", NAMESPACE])?;
        let d = bench.json(&["get", "deployment", name, "-n", NAMESPACE])?;
        let read = v["status"]["currentMetrics"][0]["resource"]["current"]["averageUtilization"]
            .as_i64()
            .is_some();
        if read
            && v["status"]["desiredReplicas"].as_i64() == Some(1)
            && d["status"]["replicas"].as_i64() == Some(1)
            && d["status"]["readyReplicas"].as_i64() == Some(1)
        {
            return Ok(());
        }
        ensure!(
            t.elapsed() < Duration::from_secs(300),
            "{name}: the HPA did not settle at 1 replica in 300 s: {}",
            v["status"]
        );
        thread::sleep(Duration::from_secs(1));
    }
}

fn bursty_phase(bench: &Bench, flag: &std::path::Path, phase: Duration) -> Result<Flapping> {
    settle(bench, "bursty")?;
    let pods = bench.json(&["get", "pods", "-n", NAMESPACE, "-l", "app=bursty"])?;
    let first = pods["items"][0]["metadata"]["name"]
        .as_str()
        .context("no bursty pod")?
        .to_string();
    let cgroup = bench.container_cgroup(NAMESPACE, &first)?;
    fs::write(flag, b"")?;
    let cpu0 = cgroup.cpu_ns()?;
    let on = Instant::now();
    let mut f = Flapping {
        max_replicas: 1,
        phase,
        ..Flapping::default()
    };
    let mut replicas = 1i64;
    let mut last = Instant::now();
    let result = (|| -> Result<()> {
        while on.elapsed() < phase {
            thread::sleep(Duration::from_secs(1).saturating_sub(last.elapsed()));
            let v = bench.json(&["get", "hpa", "bursty", "-n", NAMESPACE])?;
            let now = Instant::now();
            f.extra_replica_seconds += (replicas - 1) as f64 * (now - last).as_secs_f64();
            last = now;
            let current = v["status"]["currentReplicas"].as_i64().unwrap_or(replicas);
            let desired = v["status"]["desiredReplicas"].as_i64().unwrap_or(current);
            // The HPA's decisions are its rescales: desiredReplicas changing.
            if desired != replicas {
                f.rescales += 1;
                replicas = desired;
                f.max_replicas = f.max_replicas.max(desired);
            }
            if let Some(u) = v["status"]["currentMetrics"][0]["resource"]["current"]
                ["averageUtilization"]
                .as_f64()
            {
                f.seen.push(u);
            }
        }
        Ok(())
    })();
    let elapsed = on.elapsed();
    let cpu1 = cgroup.cpu_ns();
    fs::remove_file(flag)?;
    result?;
    // The first pod's mean in % of its 100m request.
    f.true_mean = cpu1
        .ok()
        .map(|c| c.saturating_sub(cpu0) as f64 / elapsed.as_nanos() as f64 / 0.1 * 100.0);
    Ok(f)
}

pub fn run(bench: &mut Bench, trials: usize, windows: &[Duration], phase: Duration) -> Result<()> {
    let web_dir = bench.dirs.run.join("versus-hpa");
    let bursty_dir = bench.dirs.run.join("versus-bursty");
    for d in [&web_dir, &bursty_dir] {
        fs::create_dir_all(d)?;
        let _ = fs::remove_file(d.join("on"));
    }
    let original = bench.json(&["get", "apiservice", "v1beta1.metrics.k8s.io"])?;
    ensure!(
        original["spec"]["service"]["namespace"] == "kpulse-system",
        "v1beta1.metrics.k8s.io does not point at kpulse"
    );
    bench.apply("hpa", &hpa::manifest(&web_dir))?;
    bench.apply("bursty", &bursty_manifest(&bursty_dir))?;
    bench.rollout("web", Duration::from_secs(120))?;
    bench.rollout("bursty", Duration::from_secs(120))?;

    let mut settings: Vec<Setting> = windows
        .iter()
        .map(|&w| Setting {
            source: Source::Kpulse,
            window: Some(w),
        })
        .collect();
    settings.push(Setting {
        source: Source::MetricsServer,
        window: None,
    });
    let mut results: Vec<(Setting, Vec<hpa::Trial>, Flapping)> = Vec::new();
    let mut failure = None;
    for setting in &settings {
        let r = (|| -> Result<(Vec<hpa::Trial>, Flapping)> {
            if let Some(w) = setting.window {
                set_window(bench, Some(w))?;
            }
            hpa::point_apiservice(bench, setting.source, &original)?;
            let mut up = Vec::new();
            for i in 0..trials {
                let t = hpa::trial(bench, &web_dir.join("on"), hpa::DEFAULT_SYNC)
                    .with_context(|| format!("{}: trial {}", setting.name(), i + 1))?;
                println!(
                    "versus: window: {}: trial {}/{trials}: up after {:.1} s to {}, down after {:.1} s",
                    setting.name(),
                    i + 1,
                    t.up,
                    t.replicas,
                    t.down
                );
                up.push(t);
            }
            let f = bursty_phase(bench, &bursty_dir.join("on"), phase)
                .with_context(|| format!("{}: bursty phase", setting.name()))?;
            println!(
                "versus: window: {}: bursty for {:.0} s: {} rescales, up to {} replicas, {:.0} extra replica-seconds",
                setting.name(),
                phase.as_secs_f64(),
                f.rescales,
                f.max_replicas,
                f.extra_replica_seconds
            );
            Ok((up, f))
        })();
        for d in [&web_dir, &bursty_dir] {
            let _ = fs::remove_file(d.join("on"));
        }
        match r {
            Ok((up, f)) => results.push((*setting, up, f)),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    // Whatever happened: kpulse at its default window, metrics.k8s.io back on kpulse.
    set_window(bench, None).context("restoring the aggregator-api's window")?;
    hpa::point_apiservice(bench, Source::Kpulse, &original)
        .context("pointing v1beta1.metrics.k8s.io back at kpulse")?;

    let mut out = String::new();
    let _ = writeln!(
        out,
        "## The served window: HPA reaction and flapping ({trials} step trials, {:.0} s bursty \
         phase each)\n\n\
         Step trials as in \"The HPA on each source\" (controller-manager's default 15 s \
         sync). Bursty: each pod spins for 1 s at its 200m limit with probability 1/6 every \
         second (mean 33 % of its 100m request; target 50 %, so the right answer is 1 \
         replica throughout); same HPA. Rescales are changes of `desiredReplicas`; \
         utilisation is what the HPA reported, sampled every second.\n",
        phase.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "| source | first scale-up p50 | max | every trial | bursty: rescales | max replicas | extra replicas (mean) | HPA-seen utilisation p50 / p95 / max | true mean (first pod) |\n|---|---|---|---|---|---|---|---|---|"
    );
    for (setting, trials, f) in &mut results {
        let mut up: Vec<f64> = trials.iter().map(|t| t.up).collect();
        let every = trials
            .iter()
            .map(|t| format!("{:.1}", t.up))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "| {} | {:.1} s | {:.1} s | {every} | {} | {} | {:.2} | {:.0} / {:.0} / {:.0} % | {} |",
            setting.name(),
            percentile(&mut up, 0.5),
            percentile(&mut up, 1.0),
            f.rescales,
            f.max_replicas,
            f.extra_replica_seconds / f.phase.as_secs_f64(),
            percentile(&mut f.seen, 0.5),
            percentile(&mut f.seen, 0.95),
            percentile(&mut f.seen, 1.0),
            f.true_mean
                .map_or_else(|| "?".to_string(), |m| format!("{m:.0} %")),
        );
    }
    bench.section(&out);
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
