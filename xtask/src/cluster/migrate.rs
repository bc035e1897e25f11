//! The README's migration from metrics-server, run for real: metrics-server v0.8.0 (built
//! from its module, deployed with its own release manifests plus `--kubelet-insecure-tls`,
//! since the kubelet's serving certificate is signed by the cluster CA it is not given)
//! serves `kubectl top` first; then, while a reader runs `kubectl top pod -A` every 100 ms,
//! the steps of deploy/README.md ("Replacing metrics-server") run as written. Every failed
//! call is counted, with the window in which they happened.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Result};

use super::{gobuild, host::Dirs, versions};

/// kustomize overlay over metrics-server's `manifests/overlays/release`; its list of
/// patches comes last, so that other overlays can add to it.
pub(crate) const OVERLAY: &str = "apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - manifests/overlays/release
patches:
  - target:
      kind: Deployment
      name: metrics-server
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --kubelet-insecure-tls
";

fn kubectl(dirs: &Dirs, bin: &Path) -> Command {
    let mut c = Command::new(bin);
    c.arg("--kubeconfig")
        .arg(dirs.kubeconfig())
        .arg("--request-timeout=10s");
    c
}

/// A kustomization in `etc/<name>` over a copy of metrics-server's module manifests.
pub fn metrics_server_kustomization(dirs: &Dirs, name: &str, overlay: &str) -> Result<PathBuf> {
    let src = gobuild::module_dir("sigs.k8s.io/metrics-server", versions::METRICS_SERVER)?;
    let dir = dirs.etc.join(name);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    // The module cache is read-only; kustomize wants the files under its root.
    crate::exec::run(
        Command::new("cp")
            .arg("-r")
            .arg(src.join("manifests"))
            .arg(&dir),
    )?;
    crate::exec::run(Command::new("chmod").arg("-R").arg("u+w").arg(&dir))?;
    fs::write(dir.join("kustomization.yaml"), overlay)?;
    Ok(dir)
}

/// Installs metrics-server and waits until `kubectl top pod -A` answers through it.
pub fn install_metrics_server(dirs: &Dirs, bin: &Path) -> Result<Duration> {
    let dir = metrics_server_kustomization(dirs, "metrics-server", OVERLAY)?;
    let t = Instant::now();
    crate::exec::run(kubectl(dirs, bin).arg("apply").arg("-k").arg(&dir))?;
    super::host::wait_for(
        dirs,
        "metrics-server to answer kubectl top pod -A",
        None,
        Duration::from_secs(180),
        || {
            let out = kubectl(dirs, bin)
                .args(["top", "pod", "-A", "--no-headers"])
                .output()?;
            Ok(out.status.success()
                && String::from_utf8_lossy(&out.stdout).contains("metrics-server"))
        },
    )?;
    Ok(t.elapsed())
}

/// Objects the not-found comparison creates: a Node with no kubelet (arm64, so no agent
/// goes there either) and a pod that never gets a node.
const ABSENT_NODE: &str = "kpulse-migrate-absent";
const PENDING_POD: &str = "kpulse-migrate-pending";

/// What the metrics API answers, through kube-apiserver, for names that do not exist or have
/// no metrics: `(case, kubectl's error)`.
fn not_found_answers(dirs: &Dirs, bin: &Path) -> Result<Vec<(&'static str, String)>> {
    let cases: [(&str, &[&str]); 4] = [
        (
            "no such node",
            &[
                "get",
                "nodemetrics.v1beta1.metrics.k8s.io",
                "kpulse-migrate-no-node",
            ],
        ),
        (
            "a Node without metrics",
            &["get", "nodemetrics.v1beta1.metrics.k8s.io", ABSENT_NODE],
        ),
        (
            "no such pod",
            &[
                "get",
                "podmetrics.v1beta1.metrics.k8s.io",
                "-n",
                "default",
                "kpulse-migrate-no-pod",
            ],
        ),
        (
            "a pod that never ran",
            &[
                "get",
                "podmetrics.v1beta1.metrics.k8s.io",
                "-n",
                "default",
                PENDING_POD,
            ],
        ),
    ];
    let mut answers = Vec::new();
    for (case, args) in cases {
        let out = kubectl(dirs, bin).args(args).output()?;
        ensure!(
            !out.status.success(),
            "{case}: `kubectl {}` succeeded",
            args.join(" ")
        );
        answers.push((
            case,
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(answers)
}

fn not_found_objects(dirs: &Dirs, bin: &Path, create: bool) -> Result<()> {
    let manifest = format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{ABSENT_NODE}","labels":{{"kubernetes.io/arch":"arm64"}}}}}},
{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{PENDING_POD}","namespace":"default"}},
"spec":{{"nodeSelector":{{"kpulse.dev/never":"true"}},"containers":[{{"name":"c","image":"{}","imagePullPolicy":"Never"}}]}}}}]}}"#,
        super::images::BUSYBOX_IMAGE
    );
    let file = dirs.etc.join("migrate-not-found.json");
    fs::write(&file, manifest)?;
    if create {
        crate::exec::run(kubectl(dirs, bin).arg("apply").arg("-f").arg(&file))?;
    } else {
        crate::exec::run(
            kubectl(dirs, bin)
                .args(["delete", "--ignore-not-found", "--wait=false", "-f"])
                .arg(&file),
        )?;
    }
    Ok(())
}

/// The migration under a reader; fails if any `kubectl top` call failed, or if kpulse's
/// not-found answers differ from metrics-server's.
pub fn migrate(root: &Path, dirs: &Dirs, bin: &Path) -> Result<String> {
    let ms_ready = install_metrics_server(dirs, bin)?;
    not_found_objects(dirs, bin, true)?;
    let compared = compare_not_found(root, dirs, bin, ms_ready);
    let cleaned = not_found_objects(dirs, bin, false);
    let text = compared?;
    cleaned?;
    Ok(text)
}

fn compare_not_found(root: &Path, dirs: &Dirs, bin: &Path, ms_ready: Duration) -> Result<String> {
    let metrics_server = not_found_answers(dirs, bin)?;
    let text = migrate_under_reader(root, dirs, bin, ms_ready)?;
    // kpulse's Node watch lists within a second of its start; give it a few.
    let deadline = Instant::now() + Duration::from_secs(30);
    let kpulse = loop {
        let answers = not_found_answers(dirs, bin)?;
        if answers == metrics_server || Instant::now() >= deadline {
            break answers;
        }
        thread::sleep(Duration::from_millis(500));
    };
    ensure!(
        kpulse == metrics_server,
        "not-found answers differ: metrics-server {metrics_server:?}, kpulse {kpulse:?}"
    );
    Ok(format!(
        "{text}; not-found answers identical to metrics-server's for {}: {}",
        kpulse
            .iter()
            .map(|(c, _)| *c)
            .collect::<Vec<_>>()
            .join(", "),
        kpulse
            .iter()
            .map(|(_, a)| a.as_str())
            .collect::<Vec<_>>()
            .join(" | ")
    ))
}

fn migrate_under_reader(
    root: &Path,
    dirs: &Dirs,
    bin: &Path,
    ms_ready: Duration,
) -> Result<String> {
    let apiservice_service = |name: &str| -> String {
        crate::exec::output(kubectl(dirs, bin).args([
            "get",
            "apiservice",
            name,
            "-o",
            "jsonpath={.spec.service.namespace}/{.spec.service.name}",
        ]))
        .unwrap_or_default()
    };
    let before = apiservice_service("v1beta1.metrics.k8s.io");
    ensure!(
        before == "kube-system/metrics-server",
        "v1beta1.metrics.k8s.io is served by {before:?} before the migration"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let (reads, failures) = thread::scope(|scope| -> Result<(u32, Vec<(f64, String)>)> {
        let reader = {
            let stop = stop.clone();
            scope.spawn(move || {
                let mut reads = 0u32;
                let mut failures = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    reads += 1;
                    match kubectl(dirs, bin)
                        .args(["top", "pod", "-A", "--no-headers"])
                        .output()
                    {
                        Ok(o) if o.status.success() => {}
                        Ok(o) => failures.push((
                            started.elapsed().as_secs_f64(),
                            String::from_utf8_lossy(&o.stderr).trim().to_string(),
                        )),
                        Err(e) => failures.push((started.elapsed().as_secs_f64(), e.to_string())),
                    }
                    thread::sleep(Duration::from_millis(100).saturating_sub(t.elapsed()));
                }
                (reads, failures)
            })
        };
        let steps = || -> Result<()> {
            // deploy/README.md, "Replacing metrics-server", step by step.
            crate::certs::run(&crate::certs::Options {
                out: None,
                days: 365,
                new_ca: false,
            })?;
            crate::exec::run(kubectl(dirs, bin).current_dir(root).args([
                "apply",
                "-k",
                "deploy/",
                "-l",
                "app.kubernetes.io/component!=apiservice",
            ]))?;
            for target in ["deployment/kpulse-aggregator-api", "daemonset/kpulse-agent"] {
                crate::exec::run(kubectl(dirs, bin).args([
                    "-n",
                    "kpulse-system",
                    "rollout",
                    "status",
                    target,
                    "--timeout=180s",
                    "--request-timeout=0",
                ]))?;
            }
            crate::exec::run(
                kubectl(dirs, bin)
                    .current_dir(root)
                    .args(["apply", "-k", "deploy/"]),
            )?;
            crate::exec::run(kubectl(dirs, bin).args([
                "wait",
                "--for=condition=Available",
                "apiservice/v1beta1.metrics.k8s.io",
                "apiservice/v1.metrics.k8s.io",
                "--timeout=120s",
            ]))?;
            crate::exec::run(kubectl(dirs, bin).args([
                "-n",
                "kube-system",
                "delete",
                "deployment,service",
                "metrics-server",
            ]))?;
            // Keep the reader going for a while after metrics-server is gone: a client still
            // routed to it (a stale endpoint, a cached discovery) would fail now.
            thread::sleep(Duration::from_secs(10));
            Ok(())
        };
        let result = steps();
        stop.store(true, Ordering::Relaxed);
        let (reads, failures) = reader
            .join()
            .map_err(|_| anyhow::anyhow!("the reader panicked"))?;
        result?;
        Ok((reads, failures))
    })?;
    let after = apiservice_service("v1beta1.metrics.k8s.io");
    ensure!(
        after == "kpulse-system/kpulse-aggregator-api",
        "v1beta1.metrics.k8s.io is served by {after:?} after the migration"
    );
    let window = match (failures.first(), failures.last()) {
        (Some(a), Some(b)) => format!("failures from {:.1} s to {:.1} s, e.g. {:?}", a.0, b.0, a.1),
        _ => "no failure".into(),
    };
    let text = format!(
        "metrics-server answered {:.0} s after its apply; migration took {:.0} s: {reads} \
         `kubectl top pod -A` calls, {} failed ({window})",
        ms_ready.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    ensure!(failures.is_empty(), "{text}");
    Ok(text)
}
