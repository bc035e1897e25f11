//! The `custom.metrics.k8s.io` check of `cargo xtask cluster check` (issue 16, items 2–3):
//! the `custom-metrics` overlay on the real cluster, and an HPA scaling on it.
//!
//! 1. **Another adapter first.** An APIService `v1beta1.custom.metrics.k8s.io` pointing at
//!    another adapter's Service, applied server-side by the field manager `helm` (as a Helm
//!    chart installs one). The overlay is installed as deploy/README.md says: everything but
//!    the APIServices with `kubectl apply -k … -l 'app.kubernetes.io/component!=apiservice'`,
//!    then the APIServices with `kubectl apply --server-side -k … -l
//!    app.kubernetes.io/component=apiservice`, which must fail with a conflict naming that
//!    manager, the APIService still pointing at the other adapter: kpulse does not take the
//!    group over silently. Then the other APIService is deleted and the same apply succeeds.
//! 2. **Served through kube-apiserver.** The APIService becomes `Available=True`; the group's
//!    discovery and values are read through kube-apiserver (front-proxy authentication, a
//!    SubjectAccessReview per request), for a pod's own series and a container's.
//! 3. **The HPA on it.** A Deployment whose container spins under a CPU limit of 100m when a
//!    flag file exists (throttled in every period, not busy: its usage is its limit) and an
//!    `autoscaling/v2` HPA with a `Pods` metric `cpu_throttled_ratio`, target average
//!    `500m`. Load on → the HPA reads about 1 and scales up; load off → the share falls to
//!    0 over the agent's 30 s window and the HPA scales down (30 s stabilisation). Its
//!    status and `SuccessfulRescale` events are printed as evidence.
//!
//! The overlay stays installed afterwards (the checks after this one run with it).

use std::{
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use super::{
    check::{in_fresh_namespace, Ctx},
    images,
};

const NS: &str = "kpulse-custom";
const APISERVICE: &str = "v1beta1.custom.metrics.k8s.io";
const OVERLAY: &str = "deploy/overlays/custom-metrics";
/// The label that tells the APIServices from the rest (deploy/README.md's two steps).
const NOT_APISERVICES: &str = "app.kubernetes.io/component!=apiservice";
const APISERVICES: &str = "app.kubernetes.io/component=apiservice";
/// The HPA's target, as the quantity it writes.
const TARGET: &str = "500m";
/// Where the flag file that turns the load on lives, below the cluster's run directory.
const LOAD_DIR: &str = "custom-load";

/// The check; `root` is the repository (the overlay's directory is relative to it).
pub(super) fn custom_metrics(ctx: &Ctx<'_>) -> Result<String> {
    let root = crate::vm::workspace_root()?;
    let refused = other_adapter_is_not_taken_over(ctx, &root)?;
    install(&|| ctx.kubectl(), &root)?;
    let load_dir = ctx.dirs.run.join(LOAD_DIR);
    std::fs::create_dir_all(&load_dir)?;
    let flag = load_dir.join("on");
    let _ = std::fs::remove_file(&flag);
    let result = in_fresh_namespace(ctx, NS, || hpa(ctx, &flag, &load_dir));
    let _ = std::fs::remove_file(&flag);
    Ok(format!("{refused}; {}", result?))
}

fn apiservice_target(ctx: &Ctx<'_>) -> Result<String> {
    let v = ctx.json(&["get", "apiservice", APISERVICE])?;
    Ok(format!(
        "{}/{}",
        v["spec"]["service"]["namespace"].as_str().unwrap_or(""),
        v["spec"]["service"]["name"].as_str().unwrap_or("")
    ))
}

/// The install's first step: everything but the APIServices.
fn apply_all_but_apiservices(mut kubectl: Command, root: &Path) -> Result<()> {
    crate::exec::output(kubectl.current_dir(root).args([
        "apply",
        "-k",
        OVERLAY,
        "-l",
        NOT_APISERVICES,
    ]))?;
    Ok(())
}

/// The install's second step: the APIServices, server-side.
fn apply_apiservices(mut kubectl: Command, root: &Path) -> Result<std::process::Output> {
    kubectl
        .current_dir(root)
        .args(["apply", "--server-side", "-k", OVERLAY, "-l", APISERVICES])
        .output()
        .context("kubectl apply --server-side -k")
}

fn other_adapter_is_not_taken_over(ctx: &Ctx<'_>, root: &Path) -> Result<String> {
    // A clean start where a run before this one left the group registered.
    let _ = crate::exec::output(ctx.kubectl().args([
        "delete",
        "apiservice",
        APISERVICE,
        "--ignore-not-found",
    ]));
    let foreign = format!(
        r#"{{"apiVersion":"apiregistration.k8s.io/v1","kind":"APIService",
"metadata":{{"name":"{APISERVICE}"}},
"spec":{{"group":"custom.metrics.k8s.io","version":"v1beta1",
"service":{{"name":"other-adapter","namespace":"kube-system","port":443}},
"insecureSkipTLSVerify":true,"groupPriorityMinimum":100,"versionPriority":100}}}}"#
    );
    let file = ctx.dirs.etc.join("check-other-adapter.json");
    std::fs::write(&file, foreign)?;
    crate::exec::output(
        ctx.kubectl()
            .args(["apply", "--server-side", "--field-manager=helm", "-f"])
            .arg(&file),
    )?;
    apply_all_but_apiservices(ctx.kubectl(), root)?;
    let out = apply_apiservices(ctx.kubectl(), root)?;
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let target = apiservice_target(ctx)?;
    let _ = crate::exec::output(ctx.kubectl().args(["delete", "apiservice", APISERVICE]));
    ensure!(
        !out.status.success(),
        "the apply took the other adapter's APIService (now {target})"
    );
    ensure!(
        stderr.contains("conflict") && stderr.contains("\"helm\""),
        "the apply failed, but not with a conflict naming the other manager:\n{stderr}"
    );
    ensure!(
        target == "kube-system/other-adapter",
        "the APIService points at {target} after the refused apply"
    );
    let line = stderr
        .lines()
        .find(|l| l.contains("conflict"))
        .unwrap_or_default()
        .trim();
    println!("check:      refused: {line}");
    Ok(
        "over another adapter's APIService (manager helm) the server-side apply failed with a \
        conflict and left it in place"
            .into(),
    )
}

/// deploy/README.md's install of the overlay, both steps, as a user without another adapter
/// does it (the `throttled` part of `bench-vs-metrics-server`); waits as [`install`] does.
/// `kubectl` gives a kubectl for the cluster; `root` is the repository.
pub(super) fn install_overlay(kubectl: &dyn Fn() -> Command, root: &Path) -> Result<()> {
    apply_all_but_apiservices(kubectl(), root)?;
    install(kubectl, root)
}

/// The install's second step (the first is done), then waits for the rollouts it causes
/// and for the APIService to be `Available`.
fn install(kubectl: &dyn Fn() -> Command, root: &Path) -> Result<()> {
    let out = apply_apiservices(kubectl(), root)?;
    ensure!(
        out.status.success(),
        "kubectl apply --server-side of the APIServices: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for what in ["deployment/kpulse-aggregator-api", "daemonset/kpulse-agent"] {
        crate::exec::output(kubectl().args([
            "-n",
            "kpulse-system",
            "rollout",
            "status",
            what,
            "--timeout=180s",
            // The watch may take longer than a request's timeout; `--timeout` bounds it.
            "--request-timeout=0",
        ]))?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out =
            crate::exec::output(kubectl().args(["get", "apiservice", APISERVICE, "-o", "json"]))?;
        let v: Value = serde_json::from_str(&out).context("kubectl printed no JSON")?;
        let available = v["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Available" && c["status"] == "True");
        if available {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{APISERVICE} not Available within 120 s: {}",
            v["status"]
        );
        thread::sleep(Duration::from_millis(500));
    }
}

fn manifest(load_dir: &Path) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
{{"apiVersion":"apps/v1","kind":"Deployment",
"metadata":{{"name":"throttled","namespace":"{NS}"}},
"spec":{{"replicas":1,"selector":{{"matchLabels":{{"app":"throttled"}}}},
"template":{{"metadata":{{"labels":{{"app":"throttled"}}}},
"spec":{{"terminationGracePeriodSeconds":1,"containers":[{{"name":"work","image":"{image}","imagePullPolicy":"Never",
"command":["/bin/sh","-c","trap 'exit 0' TERM; while :; do if [ -e /load/on ]; then i=0; while [ $i -lt 5000 ]; do i=$((i+1)); done; else sleep 0.2; fi; done"],
"resources":{{"requests":{{"cpu":"100m","memory":"16Mi"}},"limits":{{"cpu":"100m","memory":"32Mi"}}}},
"volumeMounts":[{{"name":"load","mountPath":"/load","readOnly":true}}]}}],
"volumes":[{{"name":"load","hostPath":{{"path":"{load}","type":"Directory"}}}}]}}}}}}}},
{{"apiVersion":"autoscaling/v2","kind":"HorizontalPodAutoscaler",
"metadata":{{"name":"throttled","namespace":"{NS}"}},
"spec":{{"scaleTargetRef":{{"apiVersion":"apps/v1","kind":"Deployment","name":"throttled"}},
"minReplicas":1,"maxReplicas":3,
"metrics":[{{"type":"Pods","pods":{{"metric":{{"name":"cpu_throttled_ratio"}},"target":{{"type":"AverageValue","averageValue":"{TARGET}"}}}}}}],
"behavior":{{"scaleDown":{{"stabilizationWindowSeconds":30}}}}}}}}]}}"#,
        image = images::BUSYBOX_IMAGE,
        load = load_dir.display()
    )
}

fn status(ctx: &Ctx<'_>) -> Result<Value> {
    ctx.json(&["get", "hpa", "throttled", "-n", NS])
}

/// The HPA's current average of the metric, as it wrote it.
fn current(v: &Value) -> Option<String> {
    v["status"]["currentMetrics"][0]["pods"]["current"]["averageValue"]
        .as_str()
        .map(str::to_owned)
}

/// Reads a served value through kube-apiserver: the pods of `app=throttled`, their own
/// series or their container's.
fn served(ctx: &Ctx<'_>, container: bool) -> Result<Vec<Value>> {
    let path = format!(
        "/apis/custom.metrics.k8s.io/v1beta1/namespaces/{NS}/pods/*/cpu_throttled_ratio?labelSelector=app%3Dthrottled{}",
        if container {
            "&metricLabelSelector=container%3Dwork"
        } else {
            ""
        }
    );
    let out = crate::exec::output(ctx.kubectl().args(["get", "--raw", &path]))?;
    let v: Value = serde_json::from_str(&out).context("MetricValueList")?;
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

fn hpa(ctx: &Ctx<'_>, flag: &Path, load_dir: &Path) -> Result<String> {
    let file = ctx.dirs.etc.join("check-custom-hpa.json");
    std::fs::write(&file, manifest(load_dir))?;
    crate::exec::output(ctx.kubectl().arg("apply").arg("-f").arg(&file))?;
    // Idle first: the HPA must be reading the metric (0: a quota, no period throttled), which
    // comes once the agent has a whole window of the new pod.
    let deadline = Instant::now() + Duration::from_secs(150);
    let idle = loop {
        let v = status(ctx)?;
        if let Some(c) = current(&v) {
            break c;
        }
        ensure!(
            Instant::now() < deadline,
            "the HPA read no cpu_throttled_ratio within 150 s: {}",
            v["status"]
        );
        thread::sleep(Duration::from_millis(500));
    };
    let idle_items = served(ctx, false)?;
    ensure!(idle_items.len() == 1, "served while idle: {idle_items:?}");
    std::fs::write(flag, b"")?;
    let on_at = Instant::now();
    let (up_seen, replicas, value) = loop {
        let v = status(ctx)?;
        let desired = v["status"]["desiredReplicas"].as_i64().unwrap_or(1);
        if desired > 1 {
            break (on_at.elapsed(), desired, current(&v).unwrap_or_default());
        }
        ensure!(
            on_at.elapsed() < Duration::from_secs(180),
            "no scale-up within 180 s of the load: {}",
            v["status"]
        );
        thread::sleep(Duration::from_millis(250));
    };
    // Through kube-apiserver, while loaded: the pod's own series and its container's.
    let pod = served(ctx, false)?;
    let container = served(ctx, true)?;
    let show = |items: &[Value]| -> String {
        items
            .iter()
            .map(|i| {
                format!(
                    "{}={} over {} s",
                    i["describedObject"]["name"].as_str().unwrap_or("?"),
                    i["value"].as_str().unwrap_or("?"),
                    i["window"]
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "check:      served while loaded: pods {}; containers `work` {}",
        show(&pod),
        show(&container)
    );
    // Both lists non-empty: a check of every container item passes on none.
    ensure!(
        !pod.is_empty()
            && !container.is_empty()
            && container.iter().all(|i| i["selector"].is_object()),
        "served while loaded: {pod:?} / {container:?}"
    );
    std::fs::remove_file(flag)?;
    let off_at = Instant::now();
    let down_seen = loop {
        let v = status(ctx)?;
        if v["status"]["desiredReplicas"].as_i64() == Some(1) {
            break off_at.elapsed();
        }
        ensure!(
            off_at.elapsed() < Duration::from_secs(300),
            "no scale-down within 300 s of the load's end: {}",
            v["status"]
        );
        thread::sleep(Duration::from_millis(500));
    };
    let events = crate::exec::output(ctx.kubectl().args([
        "get",
        "events",
        "-n",
        NS,
        "--field-selector=involvedObject.kind=HorizontalPodAutoscaler,reason=SuccessfulRescale",
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]))?;
    for line in events.lines() {
        println!("check:      HPA event: SuccessfulRescale: {line}");
    }
    ensure!(
        events.contains("cpu_throttled_ratio above target")
            && events.contains("All metrics below target"),
        "the HPA's events do not show both decisions on cpu_throttled_ratio:\n{events}"
    );
    Ok(format!(
        "HPA on Pods metric cpu_throttled_ratio (target {TARGET}): idle {idle}; load on → \
         {replicas} replicas after {:.1} s at {value}; load off → 1 replica after {:.1} s \
         (30 s window, 30 s scale-down stabilisation)",
        up_seen.as_secs_f64(),
        down_seen.as_secs_f64()
    ))
}
