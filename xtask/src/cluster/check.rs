//! `cargo xtask cluster check`: kpulse on the real cluster, through the real clients.
//!
//! Against a cluster that `cluster up --install` made (kpulse installed as the README
//! says), it shows and times:
//! - both metrics.k8s.io APIServices `Available=True`; discovery through kube-apiserver,
//!   legacy (`/apis/metrics.k8s.io/<version>`) and aggregated (`/apis` as
//!   `APIGroupDiscoveryList`);
//! - `kubectl top node`, `top pod -A`, `top pod --containers`, `get podmetrics -A` with every
//!   installed kubectl (1.27–1.33) and the cluster's own;
//! - pods of a new Deployment in `kubectl get podmetrics` about a second after their
//!   containers start, and gone after they are deleted.
//!
//! Each check prints one line; the run ends with `N passed, N failed`.

use std::{
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use super::{daemons, host::Dirs, images};

/// Installed kubectls besides the cluster's own, oldest first.
fn installed_kubectls() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = (27..=33)
        .map(|m| PathBuf::from(format!("/usr/lib/google-cloud-sdk/bin/kubectl.1.{m}")))
        .filter(|p| p.is_file())
        .collect();
    if Path::new("/usr/bin/kubectl").is_file() {
        v.push(PathBuf::from("/usr/bin/kubectl"));
    }
    v
}

struct Ctx<'a> {
    dirs: &'a Dirs,
    kubectl: PathBuf,
    passed: usize,
    failed: Vec<String>,
}

impl Ctx<'_> {
    fn kubectl_with(&self, bin: &Path) -> Command {
        let mut c = Command::new(bin);
        c.arg("--kubeconfig")
            .arg(self.dirs.kubeconfig())
            .arg("--request-timeout=10s");
        c
    }

    fn kubectl(&self) -> Command {
        self.kubectl_with(&self.kubectl)
    }

    fn json(&self, args: &[&str]) -> Result<Value> {
        let out = crate::exec::output(self.kubectl().args(args).args(["-o", "json"]))?;
        serde_json::from_str(&out).context("kubectl printed no JSON")
    }

    fn record(&mut self, name: &str, result: Result<String>) {
        match result {
            Ok(detail) => {
                println!("check: ok   {name}: {detail}");
                self.passed += 1;
            }
            Err(e) => {
                println!("check: FAIL {name}: {e:#}");
                self.failed.push(name.to_string());
            }
        }
    }
}

/// Runs every check; fails if any failed.
pub fn run(dirs: &Dirs, kubectl: PathBuf) -> Result<()> {
    let mut ctx = Ctx {
        dirs,
        kubectl,
        passed: 0,
        failed: Vec::new(),
    };
    let r = apiservices(&ctx);
    ctx.record("APIServices v1beta1 and v1 Available=True", r);
    let r = legacy_discovery(&ctx);
    ctx.record("legacy discovery through kube-apiserver", r);
    let r = aggregated_discovery(&ctx);
    ctx.record("aggregated discovery through kube-apiserver", r);
    let mut clients = installed_kubectls();
    clients.push(ctx.kubectl.clone());
    for bin in clients {
        let r = kubectl_matrix(&ctx, &bin);
        ctx.record(&format!("kubectl top/get with {}", bin.display()), r);
    }
    let r = pod_lifecycle(&ctx);
    ctx.record("a Deployment's pods appear and disappear", r);
    println!("{} passed, {} failed", ctx.passed, ctx.failed.len());
    if !ctx.failed.is_empty() {
        bail!("cluster checks failed: {}", ctx.failed.join("; "));
    }
    Ok(())
}

fn apiservices(ctx: &Ctx<'_>) -> Result<String> {
    let mut states = Vec::new();
    for name in ["v1beta1.metrics.k8s.io", "v1.metrics.k8s.io"] {
        let v = ctx.json(&["get", "apiservice", name])?;
        let available = v["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Available")
            .with_context(|| format!("{name} has no Available condition"))?;
        ensure!(
            available["status"] == "True",
            "{name} is not Available: {}",
            available
        );
        states.push(format!(
            "{name} → {}/{}",
            v["spec"]["service"]["namespace"].as_str().unwrap_or("?"),
            v["spec"]["service"]["name"].as_str().unwrap_or("?")
        ));
    }
    Ok(states.join(", "))
}

fn legacy_discovery(ctx: &Ctx<'_>) -> Result<String> {
    let mut found = Vec::new();
    for version in ["v1beta1", "v1"] {
        let path = format!("/apis/metrics.k8s.io/{version}");
        let out = crate::exec::output(ctx.kubectl().args(["get", "--raw", &path]))?;
        let v: Value = serde_json::from_str(&out).with_context(|| format!("{path}: not JSON"))?;
        ensure!(v["kind"] == "APIResourceList", "{path}: kind {}", v["kind"]);
        let names: Vec<&str> = v["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["name"].as_str())
            .collect();
        ensure!(
            names.contains(&"nodes") && names.contains(&"pods"),
            "{path}: resources {names:?}"
        );
        found.push(format!("{version}: {}", names.join(",")));
    }
    Ok(found.join("; "))
}

/// `/apis` as `APIGroupDiscoveryList` (what kubectl ≥ 1.30 and the garbage collector
/// ask for), with the admin's client certificate.
fn aggregated_discovery(ctx: &Ctx<'_>) -> Result<String> {
    let pki = &ctx.dirs.pki;
    let out = crate::exec::output(
        Command::new("curl")
            .args(["--silent", "--show-error", "--fail", "--max-time", "10"])
            .arg("--cacert")
            .arg(pki.join("ca.crt"))
            .arg("--cert")
            .arg(pki.join("admin.crt"))
            .arg("--key")
            .arg(pki.join("admin.key"))
            .args([
                "-H",
                "Accept: application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            ])
            .arg(format!("{}/apis", daemons::apiserver_url())),
    )?;
    let v: Value = serde_json::from_str(&out).context("/apis: not JSON")?;
    ensure!(
        v["kind"] == "APIGroupDiscoveryList",
        "/apis answered kind {}",
        v["kind"]
    );
    let group = v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|g| g["metadata"]["name"] == "metrics.k8s.io")
        .context("metrics.k8s.io is not in the aggregated discovery document")?;
    let mut found = Vec::new();
    for version in group["versions"].as_array().into_iter().flatten() {
        let resources: Vec<&str> = version["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["resource"].as_str())
            .collect();
        ensure!(
            resources.contains(&"nodes") && resources.contains(&"pods"),
            "{}: resources {resources:?}",
            version["version"]
        );
        found.push(format!(
            "{} ({})",
            version["version"].as_str().unwrap_or("?"),
            version["freshness"].as_str().unwrap_or("no freshness")
        ));
    }
    ensure!(found.len() == 2, "metrics.k8s.io versions: {found:?}");
    Ok(found.join(", "))
}

fn kubectl_matrix(ctx: &Ctx<'_>, bin: &Path) -> Result<String> {
    let version = crate::exec::output(
        ctx.kubectl_with(bin)
            .args(["version", "--client", "-o", "json"]),
    )
    .ok()
    .and_then(|o| serde_json::from_str::<Value>(&o).ok())
    .and_then(|v| {
        v["clientVersion"]["gitVersion"]
            .as_str()
            .map(str::to_string)
    })
    .unwrap_or_else(|| "?".into());
    let checks: [(&[&str], &str); 4] = [
        (&["top", "node"], daemons::NODE_NAME),
        (&["top", "pod", "-A"], "coredns"),
        (
            &["top", "pod", "-n", "kube-system", "--containers"],
            "coredns",
        ),
        (&["get", "podmetrics", "-A"], "coredns"),
    ];
    for (args, want) in checks {
        let out = crate::exec::output(ctx.kubectl_with(bin).args(args))
            .with_context(|| format!("kubectl {version} {}", args.join(" ")))?;
        ensure!(
            out.contains(want),
            "kubectl {version} {}: no {want} in\n{out}",
            args.join(" ")
        );
    }
    Ok(format!(
        "{version}: top node, top pod -A, top pod --containers, get podmetrics -A"
    ))
}

const LIFECYCLE_NS: &str = "kpulse-check";
const LIFECYCLE_REPLICAS: usize = 3;

/// Seconds since the epoch of an RFC 3339 time as Kubernetes writes it (`…Z`, whole
/// seconds).
fn rfc3339_secs(s: &str) -> Option<f64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    Some(t.unix_timestamp_nanos() as f64 / 1e9)
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// Names of the pods that `kubectl get podmetrics -n <ns>` lists.
fn podmetrics_names(ctx: &Ctx<'_>, ns: &str) -> Result<Vec<String>> {
    let v = ctx.json(&["get", "podmetrics", "-n", ns])?;
    Ok(v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
        .collect())
}

fn pod_lifecycle(ctx: &Ctx<'_>) -> Result<String> {
    let _ = crate::exec::output(ctx.kubectl().args([
        "delete",
        "namespace",
        LIFECYCLE_NS,
        "--wait=true",
        "--ignore-not-found",
    ]));
    crate::exec::output(ctx.kubectl().args(["create", "namespace", LIFECYCLE_NS]))?;
    let result = pod_lifecycle_in_namespace(ctx);
    let _ = crate::exec::output(ctx.kubectl().args([
        "delete",
        "namespace",
        LIFECYCLE_NS,
        "--wait=false",
    ]));
    result
}

fn pod_lifecycle_in_namespace(ctx: &Ctx<'_>) -> Result<String> {
    let manifest = format!(
        r#"{{"apiVersion":"apps/v1","kind":"Deployment",
"metadata":{{"name":"sleepers","namespace":"{LIFECYCLE_NS}"}},
"spec":{{"replicas":{LIFECYCLE_REPLICAS},"selector":{{"matchLabels":{{"app":"sleepers"}}}},
"template":{{"metadata":{{"labels":{{"app":"sleepers"}}}},
"spec":{{"terminationGracePeriodSeconds":1,"containers":[{{"name":"sleep","image":"{}","imagePullPolicy":"Never",
"command":["/bin/sh","-c","trap 'exit 0' TERM; while :; do sleep 1; done"]}}]}}}}}}}}"#,
        images::BUSYBOX_IMAGE
    );
    let file = ctx.dirs.etc.join("check-sleepers.json");
    std::fs::write(&file, manifest)?;
    crate::exec::output(ctx.kubectl().arg("apply").arg("-f").arg(&file))?;
    // Poll every 100 ms: for each pod, the first time kpulse lists it, against the time its
    // container started (kubelet's startedAt, whole seconds).
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut first_seen: std::collections::BTreeMap<String, f64> = Default::default();
    loop {
        ensure!(
            Instant::now() < deadline,
            "pods not all listed within 120 s: {first_seen:?}"
        );
        let now = now_secs();
        for name in podmetrics_names(ctx, LIFECYCLE_NS)? {
            first_seen.entry(name).or_insert(now);
        }
        if first_seen.len() >= LIFECYCLE_REPLICAS {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let pods = ctx.json(&["get", "pods", "-n", LIFECYCLE_NS])?;
    let mut delays = Vec::new();
    for p in pods["items"].as_array().into_iter().flatten() {
        let name = p["metadata"]["name"].as_str().unwrap_or_default();
        let started = p["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
            .as_str()
            .and_then(rfc3339_secs);
        if let (Some(seen), Some(started)) = (first_seen.get(name), started) {
            delays.push(seen - started);
        }
    }
    ensure!(
        delays.len() == LIFECYCLE_REPLICAS,
        "start times of {} pods only",
        delays.len()
    );
    delays.sort_by(f64::total_cmp);
    let deleted_at = Instant::now();
    crate::exec::output(ctx.kubectl().args([
        "delete",
        "deployment",
        "sleepers",
        "-n",
        LIFECYCLE_NS,
        "--wait=false",
    ]))?;
    let gone = loop {
        ensure!(
            deleted_at.elapsed() < Duration::from_secs(120),
            "pods still listed 120 s after deletion"
        );
        if podmetrics_names(ctx, LIFECYCLE_NS)?.is_empty() {
            break deleted_at.elapsed();
        }
        thread::sleep(Duration::from_millis(100));
    };
    Ok(format!(
        "{LIFECYCLE_REPLICAS} pods listed {:.1}–{:.1} s after their containers started (startedAt has whole seconds); gone {:.1} s after `kubectl delete`",
        delays[0],
        delays[delays.len() - 1],
        gone.as_secs_f64()
    ))
}
