//! The HPA driven by each system in turn.
//!
//! The same Deployment (`web`: request 100m, limit 200m, spinning while a file exists on
//! the node, so one loaded pod is at 200 % of its request) and `autoscaling/v2` HPA (CPU
//! utilisation 50 %, 1–4 replicas, scale-up with the default behaviour, i.e. no
//! stabilisation, unless `--scale-up-stabilization` sets one for both sources; scale-down
//! stabilisation 30 s instead of the default 300 s so that a trial ends in minutes) are
//! driven by kpulse, then by metrics-server: the `v1beta1.metrics.k8s.io` APIService, the
//! version the HPA reads up to 1.37 (`cluster check` asserts it), is pointed at
//! metrics-server's Service for its trials (`insecureSkipTLSVerify: true`, as its release
//! manifest has it) and back to kpulse after, whatever happens. Each trial: idle at 1
//! replica with a utilisation reported, load on → the first `desiredReplicas > 1` seen
//! (polled every 250 ms), replicas ready, load off → `desiredReplicas = 1` seen. Both
//! sources are tried at each of the given `--horizontal-pod-autoscaler-sync-period`s (the
//! controller-manager is restarted with the flag, and without it, i.e. the default 15 s, at
//! the end).

use std::{
    fmt::Write as _,
    fs, thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use super::{api::Source, joined, percentile, Bench, NAMESPACE};
use crate::cluster::images;

const POLL: Duration = Duration::from_millis(250);

/// `web`'s loop: spin while the flag file exists, else sleep.
const WEB_SCRIPT: &str = "trap 'exit 0' TERM; while :; do if [ -e /v/on ]; then i=0; while [ $i -lt 5000 ]; do i=$((i+1)); done; else sleep 0.1; fi; done";

pub(super) fn manifest(load: &std::path::Path, scale_up: Duration) -> String {
    workload("web", WEB_SCRIPT, load, scale_up)
}

/// The HPAs' `behavior`: scale-down stabilisation 30 s; scale-up stabilisation `scale_up`
/// (zero: the default, none), with the default scale-up policies either way.
fn behavior(scale_up: Duration) -> Value {
    let mut b = serde_json::json!({"scaleDown": {"stabilizationWindowSeconds": 30}});
    if !scale_up.is_zero() {
        b["scaleUp"] = serde_json::json!({"stabilizationWindowSeconds": scale_up.as_secs()});
    }
    b
}

/// The scale-up behaviour in words, for the reports.
pub(super) fn describe_scale_up(scale_up: Duration) -> String {
    if scale_up.is_zero() {
        "default scale-up behaviour (no stabilisation)".to_string()
    } else {
        format!(
            "scale-up stabilisation {} s with the default policies",
            scale_up.as_secs()
        )
    }
}

/// A Deployment `name` (request 100m, limit 200m) running `script` in busybox with `load`
/// mounted at `/v`, and its `autoscaling/v2` HPA: CPU utilisation 50 %, 1–4 replicas,
/// [`behavior`]`(scale_up)`.
pub(super) fn workload(
    name: &str,
    script: &str,
    load: &std::path::Path,
    scale_up: Duration,
) -> String {
    let command = serde_json::json!(["/bin/sh", "-c", script]);
    format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
{{"apiVersion":"apps/v1","kind":"Deployment",
"metadata":{{"name":"{name}","namespace":"{NAMESPACE}"}},
"spec":{{"replicas":1,"selector":{{"matchLabels":{{"app":"{name}"}}}},
"template":{{"metadata":{{"labels":{{"app":"{name}","kpulse.dev/bench":"versus"}}}},
"spec":{{"terminationGracePeriodSeconds":1,"containers":[{{"name":"main","image":"{image}","imagePullPolicy":"Never",
"command":{command},
"resources":{{"requests":{{"cpu":"100m","memory":"16Mi"}},"limits":{{"cpu":"200m","memory":"32Mi"}}}},
"volumeMounts":[{{"name":"v","mountPath":"/v","readOnly":true}}]}}],
"volumes":[{{"name":"v","hostPath":{{"path":"{load}","type":"Directory"}}}}]}}}}}}}},
{{"apiVersion":"autoscaling/v2","kind":"HorizontalPodAutoscaler",
"metadata":{{"name":"{name}","namespace":"{NAMESPACE}"}},
"spec":{{"scaleTargetRef":{{"apiVersion":"apps/v1","kind":"Deployment","name":"{name}"}},
"minReplicas":1,"maxReplicas":4,
"metrics":[{{"type":"Resource","resource":{{"name":"cpu","target":{{"type":"Utilization","averageUtilization":50}}}}}}],
"behavior":{behavior}}}}}]}}"#,
        image = images::BUSYBOX_IMAGE,
        load = load.display(),
        behavior = behavior(scale_up),
    )
}

/// Points `v1beta1.metrics.k8s.io` at a source; returns what to patch back.
pub(super) fn point_apiservice(bench: &Bench, source: Source, original: &Value) -> Result<()> {
    let patch = match source {
        Source::MetricsServer => r#"{"spec":{"service":{"name":"metrics-server","namespace":"kube-system","port":443},"caBundle":null,"insecureSkipTLSVerify":true}}"#.to_string(),
        Source::Kpulse => serde_json::json!({"spec": {
            "service": original["spec"]["service"],
            "insecureSkipTLSVerify": false,
            "caBundle": original["spec"]["caBundle"],
        }})
        .to_string(),
    };
    crate::exec::output(bench.kubectl().args([
        "patch",
        "apiservice",
        "v1beta1.metrics.k8s.io",
        "--type=merge",
        "-p",
        &patch,
    ]))?;
    let want = match source {
        Source::MetricsServer => "kube-system/metrics-server",
        Source::Kpulse => "kpulse-system/kpulse-aggregator-api",
    };
    let t = Instant::now();
    loop {
        let v = bench.json(&["get", "apiservice", "v1beta1.metrics.k8s.io"])?;
        let at = format!(
            "{}/{}",
            v["spec"]["service"]["namespace"].as_str().unwrap_or(""),
            v["spec"]["service"]["name"].as_str().unwrap_or("")
        );
        let available = v["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Available" && c["status"] == "True");
        if at == want && available {
            return Ok(());
        }
        ensure!(
            t.elapsed() < Duration::from_secs(120),
            "v1beta1.metrics.k8s.io not Available on {want} within 120 s: {}",
            v["status"]
        );
        thread::sleep(Duration::from_secs(1));
    }
}

fn hpa(bench: &Bench) -> Result<Value> {
    bench.json(&["get", "hpa", "web", "-n", NAMESPACE])
}

/// Waits until the HPA `name` has settled at one ready replica with a utilisation below
/// its 50 % target read from the source in place.
pub(super) fn settle(bench: &Bench, name: &str) -> Result<()> {
    let t = Instant::now();
    loop {
        let v = bench.json(&["get", "hpa", name, "-n", NAMESPACE])?;
        let d = bench.json(&["get", "deployment", name, "-n", NAMESPACE])?;
        let idle = v["status"]["currentMetrics"][0]["resource"]["current"]["averageUtilization"]
            .as_i64()
            .is_some_and(|u| u < 50);
        if idle
            && v["status"]["desiredReplicas"].as_i64() == Some(1)
            && d["status"]["replicas"].as_i64() == Some(1)
            && d["status"]["readyReplicas"].as_i64() == Some(1)
        {
            return Ok(());
        }
        ensure!(
            t.elapsed() < Duration::from_secs(300),
            "{name}: the HPA did not settle idle at 1 replica in 300 s: {}",
            v["status"]
        );
        thread::sleep(Duration::from_secs(1));
    }
}

/// What one trial saw.
#[derive(Clone, Debug)]
pub(super) struct Trial {
    /// Seconds from load on to `desiredReplicas > 1`.
    pub up: f64,
    /// That `desiredReplicas`.
    pub replicas: i64,
    /// Seconds from load off to `desiredReplicas = 1`.
    pub down: f64,
    /// Every poll of the HPA's status from load off to the end (see [`Poll`]).
    pub after_off: Vec<Poll>,
}

/// One poll of the HPA's status: what it wanted, had, saw, and why.
#[derive(Clone, Debug)]
pub(super) struct Poll {
    /// Seconds since the load was switched off.
    pub t: f64,
    pub desired: i64,
    pub current: i64,
    /// The utilisation the HPA last computed, if any.
    pub utilisation: Option<i64>,
    /// `AbleToScale`'s and `ScalingLimited`'s reasons (e.g. `ScaleDownStabilized`,
    /// `TooFewReplicas`) and `ScalingActive`'s when it is not `ValidMetricFound`.
    pub why: String,
}

impl Poll {
    fn of(t: f64, status: &Value) -> Self {
        let reason = |kind: &str| {
            status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == kind)
                .and_then(|c| c["reason"].as_str())
                .unwrap_or("-")
                .to_string()
        };
        let mut why = format!("{} {}", reason("AbleToScale"), reason("ScalingLimited"));
        let active = reason("ScalingActive");
        if active != "ValidMetricFound" {
            why.push(' ');
            why.push_str(&active);
        }
        Self {
            t,
            desired: status["desiredReplicas"].as_i64().unwrap_or(0),
            current: status["currentReplicas"].as_i64().unwrap_or(0),
            utilisation: status["currentMetrics"][0]["resource"]["current"]["averageUtilization"]
                .as_i64(),
            why,
        }
    }

    fn json(&self) -> Value {
        serde_json::json!({
            "t": self.t, "desired": self.desired, "current": self.current,
            "utilisation": self.utilisation, "why": self.why,
        })
    }
}

/// The changes of `desiredReplicas` after load off, e.g. `4 → 2 @31.8 → 1 @58.9` (seconds
/// after load off); the polls themselves, with the HPA's reasons, go to `<report>.hpa.jsonl`.
pub(super) fn down_path(polls: &[Poll]) -> String {
    let Some(first) = polls.first() else {
        return String::new();
    };
    let mut out = first.desired.to_string();
    for w in polls.windows(2) {
        if w[1].desired != w[0].desired {
            let _ = write!(out, " → {} @{:.1}", w[1].desired, w[1].t);
        }
    }
    out
}

pub(super) fn trial(bench: &Bench, flag: &std::path::Path, sync: Duration) -> Result<Trial> {
    // Idle, one replica, a utilisation read from the source in place.
    settle(bench, "web")?;
    // A random point of the controller's cycle.
    thread::sleep(super::freshness::jitter(sync));
    fs::write(flag, b"")?;
    let on = Instant::now();
    let (up, replicas) = loop {
        let v = hpa(bench)?;
        let desired = v["status"]["desiredReplicas"].as_i64().unwrap_or(1);
        if desired > 1 {
            break (on.elapsed().as_secs_f64(), desired);
        }
        ensure!(
            on.elapsed() < Duration::from_secs(300),
            "no scale-up within 300 s: {}",
            v["status"]
        );
        thread::sleep(POLL);
    };
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(120) {
        let d = bench.json(&["get", "deployment", "web", "-n", NAMESPACE])?;
        if d["status"]["readyReplicas"].as_i64().unwrap_or(0) >= replicas {
            break;
        }
        thread::sleep(Duration::from_secs(1));
    }
    thread::sleep(super::freshness::jitter(sync));
    fs::remove_file(flag)?;
    let off = Instant::now();
    let mut after_off = Vec::new();
    let down = loop {
        let v = hpa(bench)?;
        let t = off.elapsed().as_secs_f64();
        after_off.push(Poll::of(t, &v["status"]));
        if v["status"]["desiredReplicas"].as_i64() == Some(1) {
            break t;
        }
        ensure!(
            off.elapsed() < Duration::from_secs(400),
            "no scale-down within 400 s: {}",
            v["status"]
        );
        thread::sleep(POLL);
    };
    Ok(Trial {
        up,
        replicas,
        down,
        after_off,
    })
}

/// The controller-manager's default `--horizontal-pod-autoscaler-sync-period`.
pub const DEFAULT_SYNC: Duration = Duration::from_secs(15);
const SYNC_FLAG: &str = "--horizontal-pod-autoscaler-sync-period=";

/// Restarts kube-controller-manager with `sync` (no flag for the default) and waits for it.
fn set_sync(bench: &Bench, sync: Duration) -> Result<()> {
    crate::cluster::host::restart(&bench.dirs, "kube-controller-manager", |args| {
        let mut args: Vec<String> = args
            .into_iter()
            .filter(|a| !a.starts_with(SYNC_FLAG))
            .collect();
        if sync != DEFAULT_SYNC {
            args.push(format!("{SYNC_FLAG}{}ms", sync.as_millis()));
        }
        args
    })?;
    crate::cluster::host::wait_for(
        &bench.dirs,
        "kube-controller-manager /healthz",
        None,
        Duration::from_secs(60),
        || {
            let out = std::process::Command::new("curl")
                .args(["-sk", "--max-time", "2", "https://127.0.0.1:10257/healthz"])
                .output()?;
            Ok(String::from_utf8_lossy(&out.stdout) == "ok")
        },
    )?;
    Ok(())
}

/// Every poll after load off of every trial, as JSON lines beside the report.
fn keep_polls(bench: &Bench, results: &[(Duration, Source, Vec<Trial>)]) -> Result<()> {
    use std::io::Write as _;
    let mut f = bench.raw_file("hpa")?;
    for (sync, source, trials) in results {
        for (i, t) in trials.iter().enumerate() {
            for p in &t.after_off {
                let mut line = p.json();
                line["source"] = source.name().into();
                line["sync_s"] = sync.as_secs_f64().into();
                line["trial"] = (i + 1).into();
                writeln!(f, "{line}")?;
            }
        }
    }
    f.flush()?;
    Ok(())
}

pub fn run(bench: &mut Bench, trials: usize, syncs: &[Duration], scale_up: Duration) -> Result<()> {
    let load = bench.dirs.run.join("versus-hpa");
    fs::create_dir_all(&load)?;
    let flag = load.join("on");
    let _ = fs::remove_file(&flag);
    let original = bench.json(&["get", "apiservice", "v1beta1.metrics.k8s.io"])?;
    ensure!(
        original["spec"]["service"]["namespace"] == "kpulse-system",
        "v1beta1.metrics.k8s.io does not point at kpulse"
    );
    bench.apply("hpa", &manifest(&load, scale_up))?;
    bench.rollout("web", Duration::from_secs(120))?;
    let mut results: Vec<(Duration, Source, Vec<Trial>)> = Vec::new();
    let mut failure = None;
    'all: for &sync in syncs {
        if let Err(e) = set_sync(bench, sync) {
            failure = Some(e);
            break;
        }
        for source in Source::ALL {
            let r = (|| -> Result<Vec<Trial>> {
                point_apiservice(bench, source, &original)?;
                let mut v = Vec::new();
                for i in 0..trials {
                    let t = trial(bench, &flag, sync).with_context(|| {
                        format!("{} sync {sync:?} trial {}", source.name(), i + 1)
                    })?;
                    println!(
                        "versus: HPA on {} (sync {sync:?}): trial {}/{trials}: up after {:.1} s to {}, down after {:.1} s ({})",
                        source.name(),
                        i + 1,
                        t.up,
                        t.replicas,
                        t.down,
                        down_path(&t.after_off),
                    );
                    v.push(t);
                }
                Ok(v)
            })();
            let _ = fs::remove_file(&flag);
            match r {
                Ok(v) => results.push((sync, source, v)),
                Err(e) => {
                    failure = Some(e);
                    break 'all;
                }
            }
        }
    }
    // Whatever happened: metrics.k8s.io back on kpulse, the controller-manager as `up` set it.
    point_apiservice(bench, Source::Kpulse, &original)
        .context("pointing v1beta1.metrics.k8s.io back at kpulse")?;
    if syncs.iter().any(|s| *s != DEFAULT_SYNC) {
        set_sync(bench, DEFAULT_SYNC).context("restoring the controller-manager")?;
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## The HPA on each source ({trials} trials each)\n\n\
         `autoscaling/v2`, CPU utilisation 50 % of a 100m request, 1–4 replicas, {}, \
         scale-down stabilisation 30 s. Load (each pod at its 200m limit) switched on and off \
         at a random point of the HPA's cycle; times are until `desiredReplicas` changed, \
         polled every 250 ms. The HPA reads `metrics.k8s.io/v1beta1`, whose APIService \
         points at the source under test.\n",
        describe_scale_up(scale_up)
    );
    let _ = writeln!(
        out,
        "| HPA sync | source | first scale-up p50 | max | every trial | replicas | scale-down p50 | max |\n|---|---|---|---|---|---|---|---|"
    );
    for (sync, source, v) in &results {
        let mut up: Vec<f64> = v.iter().map(|t| t.up).collect();
        let mut down: Vec<f64> = v.iter().map(|t| t.down).collect();
        let every = joined(v, |t| format!("{:.1}", t.up));
        let replicas = joined(v, |t| t.replicas.to_string());
        let _ =
            writeln!(
            out,
            "| {sync:?}{} | {} | {:.1} s | {:.1} s | {every} | {replicas} | {:.1} s | {:.1} s |",
            if *sync == DEFAULT_SYNC { " (default)" } else { "" },
            source.name(),
            percentile(&mut up, 0.5),
            percentile(&mut up, 1.0),
            percentile(&mut down, 0.5),
            percentile(&mut down, 1.0),
        );
    }
    let _ = writeln!(
        out,
        "\nScale-down, every trial: `desiredReplicas` from load off (→ new value @ seconds \
         after load off); each poll's status and reasons are in `{}`.\n",
        bench.raw_path("hpa").display()
    );
    for (sync, source, v) in &results {
        let _ = writeln!(
            out,
            "- {sync:?}, {}: {}",
            source.name(),
            v.iter()
                .map(|t| down_path(&t.after_off))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    keep_polls(bench, &results)?;
    bench.section(&out);
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The manifest is one List whose HPA has the scale-up stabilisation asked for, or none.
    #[test]
    fn the_hpa_gets_the_scale_up_behaviour_asked_for() {
        let load = std::path::Path::new("/run/x");
        for (scale_up, want) in [(0, Value::Null), (30, Value::from(30))] {
            let m: Value = serde_json::from_str(&manifest(load, Duration::from_secs(scale_up)))
                .expect("the manifest is JSON");
            let hpa = &m["items"][1];
            assert_eq!(hpa["kind"], "HorizontalPodAutoscaler");
            let b = &hpa["spec"]["behavior"];
            assert_eq!(b["scaleDown"]["stabilizationWindowSeconds"], 30);
            assert_eq!(b["scaleUp"]["stabilizationWindowSeconds"], want);
            assert_eq!(
                m["items"][0]["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"],
                "/run/x"
            );
        }
    }
}
