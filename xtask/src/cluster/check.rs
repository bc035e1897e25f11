//! `cargo xtask cluster check`: kpulse on the real cluster, through the real clients.
//!
//! Against a cluster that `cluster up --install` made (kpulse installed as the README
//! says), it shows and times:
//! - both metrics.k8s.io APIServices `Available=True`; kpulse's TokenReviews and
//!   SubjectAccessReviews at a priority level of their own ([`super::flowcontrol`]); an
//!   agent's token verified by each replica without a TokenReview ([`super::tokens`]);
//!   discovery through kube-apiserver,
//!   legacy (`/apis/metrics.k8s.io/<version>`) and aggregated (`/apis` as
//!   `APIGroupDiscoveryList`);
//! - `kubectl top node`, `top pod -A`, `top pod --containers`, `get podmetrics -A` with every
//!   installed kubectl (1.27–1.33) and the cluster's own;
//! - pods of a new Deployment in `kubectl get podmetrics` about a second after their
//!   containers start, and gone after they are deleted;
//! - the HPA: a Deployment of CPU burners with CPU requests and an `autoscaling/v2` HPA on
//!   CPU utilisation; load on → the HPA scales up, load off → it scales down, timed from the
//!   HPA's own status and shown by its events;
//! - the served window as installed: adaptive, up to 45 s ([`served_window`]);
//! - `kubectl rollout restart` of the aggregator-api and then of the agent DaemonSet while a
//!   reader runs `kubectl top pod -A` and lists PodMetrics every 100 ms: failed calls and
//!   incomplete lists, counted per rollout (none allowed in either);
//! - node CPU and memory against the kubelet's own figures, the agent taken off the node
//!   and brought back, and the agent crash-looping ([`super::fallback`]: the kubelet
//!   fallback serving the node meanwhile);
//! - the `custom-metrics` overlay ([`super::custom_metrics`]): refused over another
//!   adapter's APIService, then installed; an HPA on `cpu_throttled_ratio` scales a
//!   throttled Deployment up and down;
//! - last, the aggregation layer's failure modes ([`faults`]): the front-proxy and client
//!   CAs rotated by restarting kube-apiserver, and every aggregator-api replica down.
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

use super::{daemons, faults, host::Dirs, images};

/// kpulse's namespace, its aggregator-api Deployment (as kubectl names it) and the
/// Deployment's pod selector, as deploy/ has them: what the checks and the benchmarks that
/// change the Deployment act on.
pub(super) const NAMESPACE: &str = "kpulse-system";
pub(super) const DEPLOYMENT: &str = "deployment/kpulse-aggregator-api";
pub(super) const SELECTOR: &str = "app.kubernetes.io/name=kpulse-aggregator-api";

/// The older kubectls the matrix runs besides the cluster's own, oldest first: the Google
/// Cloud SDK's builds 1.27 to 1.33 and its `kubectl` (a dispatcher), which this machine's
/// image carries. In CI every one must be there ([`missing_kubectls`]).
fn older_kubectls() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = (27..=33)
        .map(|m| PathBuf::from(format!("/usr/lib/google-cloud-sdk/bin/kubectl.1.{m}")))
        .collect();
    v.push(PathBuf::from("/usr/bin/kubectl"));
    v
}

/// The older kubectls installed here, oldest first.
pub(super) fn installed_kubectls() -> Vec<PathBuf> {
    older_kubectls()
        .into_iter()
        .filter(|p| p.is_file())
        .collect()
}

/// The older kubectls the matrix should run that are not installed: an error in CI, where
/// a matrix of fewer clients than the docs name must not pass.
fn missing_kubectls() -> Result<()> {
    let missing: Vec<PathBuf> = older_kubectls()
        .into_iter()
        .filter(|p| !p.is_file())
        .collect();
    ensure!(
        missing.is_empty(),
        "the kubectl matrix lacks {missing:?} (install the Google Cloud SDK's kubectls, or run \
         outside CI to test with what is installed)"
    );
    Ok(())
}

pub(super) struct Ctx<'a> {
    pub(super) dirs: &'a Dirs,
    kubectl: PathBuf,
    only: Option<&'a str>,
    passed: usize,
    failed: Vec<String>,
}

impl<'a> Ctx<'a> {
    /// A context for running the checks' helpers outside `check` (benchmarks).
    pub(super) fn new(dirs: &'a Dirs, kubectl: PathBuf) -> Ctx<'a> {
        Ctx {
            dirs,
            kubectl,
            only: None,
            passed: 0,
            failed: Vec::new(),
        }
    }

    pub(super) fn kubectl_with(&self, bin: &Path) -> Command {
        let mut c = Command::new(bin);
        c.arg("--kubeconfig")
            .arg(self.dirs.kubeconfig())
            .arg("--request-timeout=10s");
        c
    }

    pub(super) fn kubectl(&self) -> Command {
        self.kubectl_with(&self.kubectl)
    }

    pub(super) fn json(&self, args: &[&str]) -> Result<Value> {
        let out = crate::exec::output(self.kubectl().args(args).args(["-o", "json"]))?;
        serde_json::from_str(&out).context("kubectl printed no JSON")
    }

    /// Whether the check named `name` runs (`--only` matches part of its name).
    fn wants(&self, name: &str) -> bool {
        self.only.is_none_or(|o| name.contains(o))
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

/// Runs every check; with `faults`, last, the aggregation layer's failure modes
/// ([`faults`]: they restart kube-apiserver and take kpulse's replicas away).
pub fn run(dirs: &Dirs, kubectl: PathBuf, only: Option<&str>, with_faults: bool) -> Result<()> {
    let mut ctx = Ctx {
        only,
        ..Ctx::new(dirs, kubectl)
    };
    type Check = fn(&Ctx<'_>) -> Result<String>;
    let first: [(&str, Check); 8] = [
        ("APIServices v1beta1 and v1 Available=True", apiservices),
        (
            "kpulse's reviews at a kube-apiserver priority level of their own",
            super::flowcontrol::reviews_have_their_own_level,
        ),
        (
            "an agent's token verified by each replica itself, no TokenReview",
            super::tokens::agent_tokens_verified_locally,
        ),
        (
            "node CPU and memory as the kubelet's /metrics/resource (target ±2 %)",
            super::fallback::node_figures,
        ),
        ("legacy discovery through kube-apiserver", legacy_discovery),
        (
            "aggregated discovery through kube-apiserver",
            aggregated_discovery,
        ),
        (
            "node labels and existence from the API (selectors, not-found texts)",
            node_labels,
        ),
        // Before the kubectl matrix and the HPA: they then read objects with `swap` keys.
        (
            "swap served as kubelet's, shown by kubectl top --show-swap",
            super::swap::swap,
        ),
    ];
    let own_kubectl: (&str, Check) = (
        "the cluster's kubectl reads the metrics.k8s.io version of its release",
        kubectl_version_read,
    );
    let last: [(&str, Check); 7] = [
        ("a Deployment's pods appear and disappear", pod_lifecycle),
        (
            "the agent off the node and back: the kubelet serves it meanwhile",
            super::fallback::agent_off_and_back,
        ),
        (
            "the agent crash-looping: the kubelet covers its gaps",
            super::fallback::agent_crashloop,
        ),
        (
            "an autoscaling/v2 HPA on CPU scales up and down on kpulse's metrics",
            hpa,
        ),
        // After the HPA, before anything restarts the aggregator-api: its series are old.
        (
            "the default served window: adaptive, up to 45 s",
            served_window,
        ),
        ("rollout restarts under a reader every 100 ms", rollouts),
        // Last: it installs the custom-metrics overlay, which restarts both workloads.
        (
            "custom.metrics.k8s.io: overlay, no takeover, an HPA on cpu_throttled_ratio",
            super::custom_metrics::custom_metrics,
        ),
    ];
    for (name, check) in first {
        if ctx.wants(name) {
            let r = check(&ctx);
            ctx.record(name, r);
        }
    }
    if crate::test::in_ci() && ctx.wants("kubectl matrix complete") {
        let r = missing_kubectls().map(|()| "every older kubectl installed".to_owned());
        ctx.record("kubectl matrix complete", r);
    }
    let mut clients = installed_kubectls();
    clients.push(ctx.kubectl.clone());
    for bin in clients {
        let name = format!("kubectl top/get with {}", bin.display());
        if ctx.wants(&name) {
            let r = kubectl_matrix(&ctx, &bin);
            ctx.record(&name, r);
        }
    }
    let failure_modes: [(&str, Check); 3] = [
        (
            "the front-proxy CA rotated with a kube-apiserver restart",
            faults::front_proxy_rotation,
        ),
        (
            "the client CA rotated with a kube-apiserver restart",
            faults::client_ca_rotation,
        ),
        (
            "every aggregator-api replica down, then back",
            faults::every_replica_down,
        ),
    ];
    let failure_modes = failure_modes.into_iter().filter(|_| with_faults);
    // Last of all: a second node, emulated, that runs the agent's arm64 image. It joins
    // and leaves the cluster, so nothing after it would find the one node it expects.
    let arm64: (&str, Check) = (
        "an arm64 node (qemu, Debian's arm64 kernel) runs the agent and is served from it",
        super::arm64_node::check,
    );
    // After it: the fleet's nodes come and go too.
    let fleet: (&str, Check) = (
        "a kwok fleet of 40 nodes with silent agents is served from its kubelets",
        super::fallback::fleet_from_kubelets,
    );
    let arm64 = [arm64, fleet].into_iter().filter(|_| with_faults);
    for (name, check) in std::iter::once(own_kubectl)
        .chain(last)
        .chain(failure_modes)
        .chain(arm64)
    {
        if ctx.wants(name) {
            let r = check(&ctx);
            ctx.record(name, r);
        }
    }
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
        daemons::admin_curl(pki)
            .args(["--silent", "--show-error", "--fail", "--max-time", "10"])
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

/// The label the node-label check sets, and the Node it creates without a kubelet.
const ZONE: &str = "topology.kubernetes.io/zone";
const CHECK_LABEL: &str = "kpulse.dev/check";
const ABSENT_NODE: &str = "kpulse-check-absent";

fn node_labels(ctx: &Ctx<'_>) -> Result<String> {
    let _ = crate::exec::output(ctx.kubectl().args([
        "delete",
        "node",
        ABSENT_NODE,
        "--ignore-not-found",
    ]));
    let result = node_labels_set(ctx);
    let _ = crate::exec::output(ctx.kubectl().args([
        "label",
        "node",
        daemons::NODE_NAME,
        &format!("{ZONE}-"),
        &format!("{CHECK_LABEL}-"),
    ]));
    let _ = crate::exec::output(ctx.kubectl().args([
        "delete",
        "node",
        ABSENT_NODE,
        "--ignore-not-found",
    ]));
    result
}

/// The names `kubectl get nodemetrics -l <selector>` lists.
fn nodemetrics_names(ctx: &Ctx<'_>, selector: &str) -> Result<Vec<String>> {
    let v = ctx.json(&["get", "nodemetrics", "-l", selector])?;
    Ok(v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
        .collect())
}

/// Labels the node (the kubelet sets none of these), then checks that selectors match the
/// Node's labels through kpulse (`kubectl top node -l`, `kubectl get nodemetrics -l`:
/// equality, set-based, negated), that a label change is followed, and that a Node without
/// an agent exists while a name without a Node does not (metrics-server's texts).
fn node_labels_set(ctx: &Ctx<'_>) -> Result<String> {
    let node = daemons::NODE_NAME;
    let labelled = Instant::now();
    crate::exec::output(ctx.kubectl().args([
        "label",
        "node",
        node,
        &format!("{ZONE}=kpulse-a"),
        &format!("{CHECK_LABEL}=labels"),
        "--overwrite",
    ]))?;
    let wait_for = |selector: &str, since: Instant| -> Result<Duration> {
        loop {
            if nodemetrics_names(ctx, selector)? == [node] {
                return Ok(since.elapsed());
            }
            ensure!(
                since.elapsed() < Duration::from_secs(30),
                "`get nodemetrics -l {selector}` does not list {node} 30 s after labelling"
            );
            thread::sleep(Duration::from_millis(100));
        }
    };
    let first = wait_for(&format!("{ZONE}=kpulse-a"), labelled)?;
    let mut checked = 0;
    for selector in [
        format!("{ZONE}=kpulse-a"),
        format!("{ZONE} in (kpulse-a,kpulse-b)"),
        format!("{ZONE},{CHECK_LABEL}=labels"),
        "!node-role.kubernetes.io/control-plane".to_string(),
    ] {
        let out = crate::exec::output(ctx.kubectl().args(["top", "node", "-l", &selector]))?;
        ensure!(
            out.lines().skip(1).any(|l| l.starts_with(node)),
            "`kubectl top node -l '{selector}'` does not list {node}:\n{out}"
        );
        ensure!(
            nodemetrics_names(ctx, &selector)? == [node],
            "`kubectl get nodemetrics -l '{selector}'` does not list {node} alone"
        );
        checked += 1;
    }
    for selector in [
        format!("{ZONE}=kpulse-b"),
        format!("{ZONE} notin (kpulse-a)"),
        format!("!{CHECK_LABEL}"),
    ] {
        let names = nodemetrics_names(ctx, &selector)?;
        ensure!(
            names.is_empty(),
            "`kubectl get nodemetrics -l '{selector}'` lists {names:?}"
        );
        // kubectl top says so when the list is empty.
        let top = ctx
            .kubectl()
            .args(["top", "node", "-l", &selector])
            .output()?;
        let err = String::from_utf8_lossy(&top.stderr);
        ensure!(
            !top.status.success() && err.contains("metrics not available yet"),
            "`kubectl top node -l '{selector}'`: {}, {err}",
            top.status
        );
        checked += 1;
    }
    let relabelled = Instant::now();
    crate::exec::output(ctx.kubectl().args([
        "label",
        "node",
        node,
        &format!("{ZONE}=kpulse-c"),
        "--overwrite",
    ]))?;
    let change = wait_for(&format!("{ZONE}=kpulse-c"), relabelled)?;
    ensure!(
        nodemetrics_names(ctx, &format!("{ZONE}=kpulse-a"))?.is_empty(),
        "the old label still matches"
    );
    // A Node with no kubelet and no agent (arm64, so the agent's DaemonSet skips it): it
    // exists, its metrics do not; a name without a Node is not a node.
    let manifest = format!(
        r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{ABSENT_NODE}","labels":{{"kubernetes.io/arch":"arm64","{CHECK_LABEL}":"absent"}}}}}}"#
    );
    let file = ctx.dirs.etc.join("check-absent-node.json");
    std::fs::write(&file, manifest)?;
    crate::exec::output(ctx.kubectl().arg("create").arg("-f").arg(&file))?;
    let created = Instant::now();
    let get_error = |name: &str| -> Result<String> {
        let out = ctx.kubectl().args(["get", "nodemetrics", name]).output()?;
        ensure!(!out.status.success(), "`get nodemetrics {name}` succeeded");
        Ok(String::from_utf8_lossy(&out.stderr).trim().to_string())
    };
    let want_absent = format!(r#"nodemetrics.metrics.k8s.io "{ABSENT_NODE}" not found"#);
    loop {
        let err = get_error(ABSENT_NODE)?;
        if err.contains(&want_absent) {
            break;
        }
        ensure!(
            created.elapsed() < Duration::from_secs(30),
            "a Node without an agent: `{err}`, want `{want_absent}`"
        );
        thread::sleep(Duration::from_millis(100));
    }
    let missing = "kpulse-check-no-such-node";
    let err = get_error(missing)?;
    let want_missing = format!(r#"node "{missing}" not found"#);
    ensure!(
        err.contains(&want_missing),
        "a name without a Node: `{err}`, want `{want_missing}`"
    );
    Ok(format!(
        "labels served {:.1} s after `kubectl label`, a change {:.1} s after; {checked} selectors \
         (top node and get nodemetrics) right; a Node without an agent: `{want_absent}`; \
         no Node: `{want_missing}`",
        first.as_secs_f64(),
        change.as_secs_f64()
    ))
}

/// Runs `body` in namespace `ns`, made fresh (an earlier run's is deleted first) and
/// deleted in the background afterwards, whatever `body` returned.
pub(super) fn in_fresh_namespace(
    ctx: &Ctx<'_>,
    ns: &str,
    body: impl FnOnce() -> Result<String>,
) -> Result<String> {
    let _ = crate::exec::output(ctx.kubectl().args([
        "delete",
        "namespace",
        ns,
        "--wait=true",
        "--ignore-not-found",
    ]));
    crate::exec::output(ctx.kubectl().args(["create", "namespace", ns]))?;
    let result = body();
    let _ = crate::exec::output(
        ctx.kubectl()
            .args(["delete", "namespace", ns, "--wait=false"]),
    );
    result
}

/// A Deployment `sleepers` of `replicas` busybox pods in `ns` that sleep and leave at once
/// on SIGTERM.
fn sleepers(ns: &str, replicas: usize) -> String {
    format!(
        r#"{{"apiVersion":"apps/v1","kind":"Deployment",
"metadata":{{"name":"sleepers","namespace":"{ns}"}},
"spec":{{"replicas":{replicas},"selector":{{"matchLabels":{{"app":"sleepers"}}}},
"template":{{"metadata":{{"labels":{{"app":"sleepers"}}}},
"spec":{{"terminationGracePeriodSeconds":1,"containers":[{{"name":"sleep","image":"{}","imagePullPolicy":"Never",
"command":["/bin/sh","-c","trap 'exit 0' TERM; while :; do sleep 1; done"]}}]}}}}}}}}"#,
        images::BUSYBOX_IMAGE
    )
}

fn pod_lifecycle(ctx: &Ctx<'_>) -> Result<String> {
    in_fresh_namespace(ctx, LIFECYCLE_NS, || pod_lifecycle_in_namespace(ctx))
}

fn pod_lifecycle_in_namespace(ctx: &Ctx<'_>) -> Result<String> {
    let manifest = sleepers(LIFECYCLE_NS, LIFECYCLE_REPLICAS);
    let file = ctx.dirs.etc.join("check-sleepers.json");
    std::fs::write(&file, manifest)?;
    let sources_before = agent_start_sources(ctx)?;
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
    // Each new container's start time must come from its cgroup's creation (the agent's
    // `cgroup_mkdir` program): from the agent's own PID namespace no process is visible.
    let sources_after = agent_start_sources(ctx)?;
    let from_creation = sources_after.creation - sources_before.creation;
    let unknown = sources_after.unknown - sources_before.unknown;
    ensure!(
        from_creation >= LIFECYCLE_REPLICAS as f64,
        "start times of the {LIFECYCLE_REPLICAS} new containers: {from_creation} from their \
         cgroups' creation, {unknown} unknown (agent metrics before {sources_before:?}, \
         after {sources_after:?})"
    );
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
        "{LIFECYCLE_REPLICAS} pods listed {:.1}–{:.1} s after their containers started (startedAt has whole seconds; start times from cgroup creation: {from_creation}, unknown: {unknown}); gone {:.1} s after `kubectl delete`",
        delays[0],
        delays[delays.len() - 1],
        gone.as_secs_f64()
    ))
}

/// The agent's `kpulse_agent_start_times_total`, by source.
#[derive(Debug, Default)]
struct StartSources {
    creation: f64,
    processes: f64,
    unknown: f64,
}

/// Reads the (single) agent's self-metrics. They listen on the pod's loopback only, so
/// they are read from the node, inside the agent's network namespace: the container's PID
/// from the cluster's own `crictl`, then `nsenter --net` and `curl`.
fn agent_start_sources(ctx: &Ctx<'_>) -> Result<StartSources> {
    let pods = kpulse_pods(ctx, super::fallback::AGENTS, None)?;
    let id = pods
        .iter()
        .filter_map(|p| p["status"]["containerStatuses"][0]["containerID"].as_str())
        .find_map(|id| id.strip_prefix("containerd://"))
        .context("no running agent container")?
        .to_owned();
    let pid = container_pid(ctx, &id)?;
    let text = crate::exec::output(Command::new("nsenter").args([
        "-t",
        &pid.to_string(),
        "--net",
        "--",
        "curl",
        "-sS",
        "--max-time",
        "5",
        "http://127.0.0.1:9464/metrics",
    ]))?;
    let mut s = StartSources::default();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("kpulse_agent_start_times_total{source=\"") else {
            continue;
        };
        let Some((source, value)) = rest.split_once("\"} ") else {
            continue;
        };
        let v: f64 = value.trim().parse().context("start_times value")?;
        match source {
            "creation" => s.creation = v,
            "processes" => s.processes = v,
            "unknown" => s.unknown = v,
            _ => {}
        }
    }
    Ok(s)
}

/// The version of metrics.k8s.io the cluster's own clients read: 1.37 made v1 GA (KEP-5207)
/// and its kubectl and HPA use it when discovery offers it; older ones read v1beta1.
fn served_version(ctx: &Ctx<'_>) -> &'static str {
    let release = std::fs::read_to_string(ctx.dirs.state.join("release")).unwrap_or_default();
    let minor = release
        .trim()
        .split('.')
        .nth(1)
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(0);
    if minor >= 37 {
        "v1"
    } else {
        "v1beta1"
    }
}

/// Each aggregator-api replica's `/metrics` text. Read like the agent's metrics: inside each
/// replica's network namespace, over HTTPS, as the cluster's admin (a client certificate
/// the replica's client CA trusts).
pub(super) fn server_metrics(ctx: &Ctx<'_>) -> Result<Vec<String>> {
    Ok(from_each_replica(ctx, &["/metrics"])?
        .into_iter()
        .flatten()
        .collect())
}

/// The serving certificate's host name: what curl asks for inside a replica's network
/// namespace (`--resolve` to loopback), so that the certificate verifies.
pub(super) const SERVER_HOST: &str = "kpulse-aggregator-api.kpulse-system.svc";

/// A `curl` inside the network namespace of the process `pid` (a replica's), trusting
/// deploy/'s CA: `-sS --max-time 5`, the URL left to the caller.
pub(super) fn curl_in(pid: &str) -> Result<Command> {
    let ca = crate::vm::workspace_root()?.join("deploy/generated/ca.crt");
    let mut c = Command::new("nsenter");
    c.args(["-t", pid, "--net", "--"])
        .args(["curl", "-sS", "--max-time", "5"])
        .arg("--cacert")
        .arg(ca);
    Ok(c)
}

/// The pods of `kpulse-system` that the label `selector` selects, and the field selector
/// `fields` where given, as JSON.
pub(super) fn kpulse_pods(
    ctx: &Ctx<'_>,
    selector: &str,
    fields: Option<&str>,
) -> Result<Vec<Value>> {
    let fields = fields.map(|f| format!("--field-selector={f}"));
    let mut args = vec!["get", "pods", "-n", "kpulse-system", "-l", selector];
    args.extend(fields.as_deref());
    let pods = ctx.json(&args)?;
    Ok(pods["items"].as_array().cloned().unwrap_or_default())
}

/// The PID of each running aggregator-api replica's container (not being deleted).
pub(super) fn replica_pids(ctx: &Ctx<'_>) -> Result<Vec<String>> {
    let pids = kpulse_pods(
        ctx,
        "app.kubernetes.io/name=kpulse-aggregator-api",
        Some("status.phase=Running"),
    )?
    .into_iter()
    .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
    .filter_map(|p| {
        p["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .and_then(|id| id.strip_prefix("containerd://"))
            .map(str::to_owned)
    })
    .map(|id| container_pid(ctx, &id).map(|pid| pid.to_string()))
    .collect::<Result<Vec<_>>>()?;
    ensure!(!pids.is_empty(), "no running aggregator-api replica");
    Ok(pids)
}

/// The cluster admin's client certificate and key, written under etc/ for curl.
pub(super) fn admin_identity(ctx: &Ctx<'_>) -> Result<(PathBuf, PathBuf)> {
    let admin = |field: &str| -> Result<Vec<u8>> {
        let b64 = crate::exec::output(ctx.kubectl().args([
            "config",
            "view",
            "--raw",
            "-o",
            &format!("jsonpath={{.users[0].user.{field}}}"),
        ]))?;
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .context("admin kubeconfig: not base64")
    };
    let cert = ctx.dirs.etc.join("check-admin.crt");
    let key = ctx.dirs.etc.join("check-admin.key");
    std::fs::write(&cert, admin("client-certificate-data")?)?;
    std::fs::write(&key, admin("client-key-data")?)?;
    Ok((cert, key))
}

/// What the replica of `pid` answers to GET `path` on its API port, as `admin`
/// ([`admin_identity`]).
pub(super) fn get_from_replica(
    admin: &(PathBuf, PathBuf),
    pid: &str,
    path: &str,
) -> Result<String> {
    crate::exec::output(
        curl_in(pid)?
            .arg("--fail")
            .arg("--cert")
            .arg(&admin.0)
            .arg("--key")
            .arg(&admin.1)
            .args([
                "--resolve",
                &format!("{SERVER_HOST}:10250:127.0.0.1"),
                &format!("https://{SERVER_HOST}:10250{path}"),
            ]),
    )
}

/// What each running aggregator-api replica answers to GET each of `paths`, one list per
/// replica in the order of `paths` (read as [`server_metrics`] reads them: as the cluster's
/// admin, from inside the replica's network namespace), so that a check sees every replica
/// and not the one kube-apiserver's proxy picks.
pub(super) fn from_each_replica(ctx: &Ctx<'_>, paths: &[&str]) -> Result<Vec<Vec<String>>> {
    let admin = admin_identity(ctx)?;
    replica_pids(ctx)?
        .iter()
        .map(|pid| {
            paths
                .iter()
                .map(|path| get_from_replica(&admin, pid, path))
                .collect()
        })
        .collect()
}

/// `kpulse_aggregator_requests_total`, summed over the aggregator-api replicas, by its
/// label set.
fn api_requests(ctx: &Ctx<'_>) -> Result<std::collections::BTreeMap<String, f64>> {
    let mut total = std::collections::BTreeMap::new();
    for text in server_metrics(ctx)? {
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("kpulse_aggregator_requests_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.split_once("} ") else {
                continue;
            };
            let v: f64 = value.trim().parse().context("requests_total value")?;
            *total.entry(labels.to_string()).or_insert(0.0) += v;
        }
    }
    Ok(total)
}

/// Versions of metrics.k8s.io that served more PodMetrics lists in `after` than in `before`,
/// with how many more.
fn read_versions(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
) -> std::collections::BTreeMap<&'static str, f64> {
    let mut read = std::collections::BTreeMap::new();
    for (labels, v) in after {
        let more = v - before.get(labels).copied().unwrap_or(0.0);
        if more <= 0.0
            || !labels.contains(r#"verb="list""#)
            || !labels.contains(r#"resource="pods""#)
        {
            continue;
        }
        for version in ["v1", "v1beta1"] {
            if labels.contains(&format!(r#"version="{version}""#)) {
                *read.entry(version).or_insert(0.0) += more;
            }
        }
    }
    read
}

/// `crictl inspect` of a container, from the cluster's `crictl`, as JSON.
pub(super) fn container_inspect(ctx: &Ctx<'_>, id: &str) -> Result<Value> {
    let inspect = crate::exec::output(
        Command::new(super::crictl(ctx.dirs))
            .arg("--runtime-endpoint")
            .arg(format!("unix://{}", ctx.dirs.containerd_socket().display()))
            .args(["inspect", "-o", "json", id]),
    )?;
    serde_json::from_str(&inspect).context("crictl inspect printed no JSON")
}

/// The PID of a container's first process.
pub(super) fn container_pid(ctx: &Ctx<'_>, id: &str) -> Result<u64> {
    container_inspect(ctx, id)?["info"]["pid"]
        .as_u64()
        .filter(|p| *p > 0)
        .with_context(|| format!("no PID for container {id}"))
}

/// kubectl of the cluster's own release reads the version its release prefers.
fn kubectl_version_read(ctx: &Ctx<'_>) -> Result<String> {
    let before = api_requests(ctx)?;
    crate::exec::output(ctx.kubectl().args(["top", "pod", "-A"]))?;
    let read = read_versions(&before, &api_requests(ctx)?);
    let want = served_version(ctx);
    ensure!(
        read.get(want).copied().unwrap_or(0.0) > 0.0 && read.len() == 1,
        "`kubectl top pod -A` read PodMetrics lists in {read:?}, want {want} only"
    );
    Ok(format!("`kubectl top pod -A` read metrics.k8s.io/{want}"))
}

/// The served window as installed (the aggregator-api's defaults, `--metric-window=45s
/// --metric-window-mode=adaptive`), read by the HPA's version: no pod's window is longer
/// than the longest the store serves with 45 s (45 s + a quarter + one agent interval), and
/// the pods older than that are served over whole windows (at least 15/16 of 45 s) unless
/// their CPU level changed since: some are (a fixed 1 s window would give none).
fn served_window(ctx: &Ctx<'_>) -> Result<String> {
    const LONGEST: f64 = 45.0 + 45.0 / 4.0 + 1.0;
    const WHOLE: f64 = 45.0 * 15.0 / 16.0;
    let raw = crate::exec::output(ctx.kubectl().args([
        "get",
        "--raw",
        "/apis/metrics.k8s.io/v1beta1/pods",
    ]))?;
    let v: Value = serde_json::from_str(&raw).context("PodMetricsList is not JSON")?;
    let windows: Vec<(String, f64)> = v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            let name = format!(
                "{}/{}",
                i["metadata"]["namespace"].as_str().unwrap_or("?"),
                i["metadata"]["name"].as_str().unwrap_or("?")
            );
            let w = i["window"]
                .as_str()
                .and_then(super::versus::api::go_duration)
                .with_context(|| format!("{name}: window {}", i["window"]))?;
            Ok((name, w.as_secs_f64()))
        })
        .collect::<Result<_>>()?;
    ensure!(!windows.is_empty(), "no PodMetrics served");
    if let Some((name, w)) = windows.iter().find(|(_, w)| *w > LONGEST) {
        bail!("{name} served over {w:.3} s, longer than {LONGEST} s");
    }
    let whole = windows.iter().filter(|(_, w)| *w >= WHOLE).count();
    ensure!(
        whole > 0,
        "no pod served over a whole 45 s window (at least {WHOLE} s): {windows:?}"
    );
    let mut ws: Vec<f64> = windows.iter().map(|(_, w)| *w).collect();
    ws.sort_by(f64::total_cmp);
    Ok(format!(
        "{} pods, windows {:.2}–{:.2} s, {whole} over a whole window (≥ {WHOLE:.2} s)",
        ws.len(),
        ws[0],
        ws[ws.len() - 1],
    ))
}

const HPA_NS: &str = "kpulse-hpa";
/// The burners' switch: a file on the node, seen by every burner through a hostPath.
const LOAD_DIR: &str = "load";

/// A Deployment of burners (request 100m, limit 200m: one loaded burner is at 200 % of its
/// request) and an HPA targeting 50 % CPU, 1–4 replicas. Scale-up keeps the HPA's default
/// behaviour (no stabilisation); scale-down's stabilisation window is 30 s instead of the
/// default 300 s, so that the test ends in minutes.
fn hpa_manifest(load_dir: &Path) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
{{"apiVersion":"apps/v1","kind":"Deployment",
"metadata":{{"name":"burner","namespace":"{HPA_NS}"}},
"spec":{{"replicas":1,"selector":{{"matchLabels":{{"app":"burner"}}}},
"template":{{"metadata":{{"labels":{{"app":"burner"}}}},
"spec":{{"terminationGracePeriodSeconds":1,"containers":[{{"name":"burn","image":"{image}","imagePullPolicy":"Never",
"command":["/bin/sh","-c","trap 'exit 0' TERM; while :; do if [ -e /load/on ]; then i=0; while [ $i -lt 5000 ]; do i=$((i+1)); done; else sleep 0.2; fi; done"],
"resources":{{"requests":{{"cpu":"100m","memory":"16Mi"}},"limits":{{"cpu":"200m","memory":"32Mi"}}}},
"volumeMounts":[{{"name":"load","mountPath":"/load","readOnly":true}}]}}],
"volumes":[{{"name":"load","hostPath":{{"path":"{load}","type":"Directory"}}}}]}}}}}}}},
{{"apiVersion":"autoscaling/v2","kind":"HorizontalPodAutoscaler",
"metadata":{{"name":"burner","namespace":"{HPA_NS}"}},
"spec":{{"scaleTargetRef":{{"apiVersion":"apps/v1","kind":"Deployment","name":"burner"}},
"minReplicas":1,"maxReplicas":4,
"metrics":[{{"type":"Resource","resource":{{"name":"cpu","target":{{"type":"Utilization","averageUtilization":50}}}}}}],
"behavior":{{"scaleDown":{{"stabilizationWindowSeconds":30}}}}}}}}]}}"#,
        image = images::BUSYBOX_IMAGE,
        load = load_dir.display()
    )
}

fn hpa(ctx: &Ctx<'_>) -> Result<String> {
    let load_dir = ctx.dirs.run.join(LOAD_DIR);
    std::fs::create_dir_all(&load_dir)?;
    let flag = load_dir.join("on");
    let _ = std::fs::remove_file(&flag);
    let result = in_fresh_namespace(ctx, HPA_NS, || hpa_in_namespace(ctx, &flag, &load_dir));
    let _ = std::fs::remove_file(&flag);
    result
}

fn hpa_status(ctx: &Ctx<'_>) -> Result<Value> {
    ctx.json(&["get", "hpa", "burner", "-n", HPA_NS])
}

fn hpa_in_namespace(ctx: &Ctx<'_>, flag: &Path, load_dir: &Path) -> Result<String> {
    let requests_before = api_requests(ctx)?;
    let result = hpa_scales(ctx, flag, load_dir)?;
    // The HPA was the only reader of PodMetrics meanwhile: which version did it read? Up to
    // 1.37.2 at least, v1beta1: its resource metrics client is the typed v1beta1 client
    // (`pkg/controller/podautoscaler/metrics/client.go`, `cmd/kube-controller-manager/app/
    // autoscaling.go`), whatever discovery offers; kubectl 1.37 reads v1.
    let read = read_versions(&requests_before, &api_requests(ctx)?);
    let want = "v1beta1";
    ensure!(
        read.get(want).copied().unwrap_or(0.0) > 0.0 && read.len() == 1,
        "the HPA read PodMetrics lists in {read:?}, want {want} only"
    );
    Ok(format!("{result}; the HPA read metrics.k8s.io/{want}"))
}

fn hpa_scales(ctx: &Ctx<'_>, flag: &Path, load_dir: &Path) -> Result<String> {
    let file = ctx.dirs.etc.join("check-hpa.json");
    std::fs::write(&file, hpa_manifest(load_dir))?;
    crate::exec::output(ctx.kubectl().arg("apply").arg("-f").arg(&file))?;
    // Idle first: the HPA must be reading a utilisation from kpulse.
    let deadline = Instant::now() + Duration::from_secs(120);
    let idle = loop {
        ensure!(
            Instant::now() < deadline,
            "the HPA read no CPU utilisation within 120 s: {}",
            hpa_status(ctx)?["status"]
        );
        let v = hpa_status(ctx)?;
        if let Some(u) =
            v["status"]["currentMetrics"][0]["resource"]["current"]["averageUtilization"].as_i64()
        {
            break u;
        }
        thread::sleep(Duration::from_millis(500));
    };
    std::fs::write(flag, b"")?;
    let load_on = now_secs();
    let on_at = Instant::now();
    let (up_seen, up_replicas, up_recorded) = loop {
        ensure!(
            on_at.elapsed() < Duration::from_secs(180),
            "no scale-up within 180 s of the load: {}",
            hpa_status(ctx)?["status"]
        );
        let v = hpa_status(ctx)?;
        let desired = v["status"]["desiredReplicas"].as_i64().unwrap_or(1);
        if desired > 1 {
            let recorded = v["status"]["lastScaleTime"].as_str().and_then(rfc3339_secs);
            break (on_at.elapsed(), desired, recorded);
        }
        thread::sleep(Duration::from_millis(250));
    };
    // Let the new replicas run, then stop the load.
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let v = ctx.json(&["get", "deployment", "burner", "-n", HPA_NS])?;
        if v["status"]["readyReplicas"].as_i64().unwrap_or(0) >= up_replicas {
            break;
        }
        thread::sleep(Duration::from_millis(500));
    }
    std::fs::remove_file(flag)?;
    let load_off = now_secs();
    let off_at = Instant::now();
    let (down_seen, down_recorded) = loop {
        ensure!(
            off_at.elapsed() < Duration::from_secs(300),
            "no scale-down within 300 s of the load's end: {}",
            hpa_status(ctx)?["status"]
        );
        let v = hpa_status(ctx)?;
        if v["status"]["desiredReplicas"].as_i64() == Some(1) {
            let recorded = v["status"]["lastScaleTime"].as_str().and_then(rfc3339_secs);
            break (off_at.elapsed(), recorded);
        }
        thread::sleep(Duration::from_millis(500));
    };
    let events = crate::exec::output(ctx.kubectl().args([
        "get",
        "events",
        "-n",
        HPA_NS,
        "--field-selector=involvedObject.kind=HorizontalPodAutoscaler,reason=SuccessfulRescale",
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]))?;
    ensure!(
        events.contains("above target") && events.contains("below target"),
        "the HPA's events do not show both decisions:\n{events}"
    );
    for line in events.lines() {
        println!("check:      HPA event: SuccessfulRescale: {line}");
    }
    let fmt = |recorded: Option<f64>, since: f64| {
        recorded.map_or("?".to_string(), |r| format!("{:.0} s", r - since))
    };
    Ok(format!(
        "idle utilisation {idle} %; load on → desiredReplicas {up_replicas} seen after {:.1} s \
         (lastScaleTime {} after, whole seconds); load off → 1 replica seen after {:.1} s \
         (lastScaleTime {} after; 30 s scale-down stabilisation); controller-manager's \
         default 15 s sync",
        up_seen.as_secs_f64(),
        fmt(up_recorded, load_on),
        down_seen.as_secs_f64(),
        fmt(down_recorded, load_off),
    ))
}

const ROLLOUT_NS: &str = "kpulse-rollout";

/// What the reader saw during one phase.
#[derive(Debug, Default)]
struct Tally {
    calls: u32,
    errors: u32,
    incomplete: u32,
    examples: Vec<String>,
}

impl Tally {
    fn note(&mut self, what: String) {
        if self.examples.len() < 3 {
            self.examples.push(what);
        }
    }
}

fn rollouts(ctx: &Ctx<'_>) -> Result<String> {
    // The earlier checks' namespaces go away in the background: their pods must be gone
    // before the reader takes its list of pods that must always be there.
    for ns in [LIFECYCLE_NS, super::fallback::NS, HPA_NS] {
        namespace_gone(ctx, ns)?;
    }
    in_fresh_namespace(ctx, ROLLOUT_NS, || rollouts_in_namespace(ctx))
}

/// Every Running pod outside kpulse-system that is not being deleted (earlier checks'
/// namespaces are rightly dropped), as `namespace/name`: what every answer must list.
pub(super) fn running_pods(ctx: &Ctx<'_>) -> Result<std::collections::BTreeSet<String>> {
    Ok(
        ctx.json(&["get", "pods", "-A", "--field-selector=status.phase=Running"])?["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["metadata"]["namespace"] != "kpulse-system")
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter_map(|p| {
                Some(format!(
                    "{}/{}",
                    p["metadata"]["namespace"].as_str()?,
                    p["metadata"]["name"].as_str()?
                ))
            })
            .collect(),
    )
}

/// Polls `f` every `every` until it gives a value, and returns it; errors count as "not
/// yet" (the last is in the timeout's message). `abort` is asked first each time, and its
/// error ends the wait at once (what is waited on is gone).
pub(super) fn poll<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    abort: impl Fn() -> Result<()>,
    mut f: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let start = Instant::now();
    let mut last_error = None;
    loop {
        abort().with_context(|| format!("{what}: given up"))?;
        match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_error = Some(format!("{e:#}")),
        }
        if start.elapsed() >= timeout {
            bail!(
                "{what}: not within {} s{}",
                timeout.as_secs(),
                last_error.map(|e| format!(" ({e})")).unwrap_or_default()
            );
        }
        thread::sleep(every);
    }
}

/// Waits until namespace `ns` (an earlier check's, deleted without waiting) is gone.
pub(super) fn namespace_gone(ctx: &Ctx<'_>, ns: &str) -> Result<()> {
    crate::exec::output(ctx.kubectl().args([
        "wait",
        "--for=delete",
        &format!("namespace/{ns}"),
        "--timeout=180s",
    ]))
    .map(|_| ())
    .or_else(|e| {
        // `kubectl wait --for=delete` of an object that is already gone succeeds on
        // recent kubectls and fails with NotFound on older ones.
        if format!("{e:#}").contains("NotFound") {
            Ok(())
        } else {
            Err(e)
        }
    })
}

fn rollouts_in_namespace(ctx: &Ctx<'_>) -> Result<String> {
    let manifest = sleepers(ROLLOUT_NS, 3);
    let file = ctx.dirs.etc.join("check-rollout.json");
    std::fs::write(&file, manifest)?;
    crate::exec::output(ctx.kubectl().arg("apply").arg("-f").arg(&file))?;
    crate::exec::output(ctx.kubectl().args([
        "rollout",
        "status",
        "deployment/sleepers",
        "-n",
        ROLLOUT_NS,
        "--timeout=120s",
    ]))?;
    // Every running pod outside kpulse-system must be in every answer.
    let expected = running_pods(ctx)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        ensure!(
            Instant::now() < deadline,
            "the expected pods were never all listed"
        );
        if read_once(ctx, 1, &expected).is_ok_and(|missing| missing.is_empty()) {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }

    let phase = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tallies = std::thread::scope(|scope| -> Result<Vec<(Tally, Duration)>> {
        let reader = {
            let (phase, stop, expected) = (phase.clone(), stop.clone(), &expected);
            scope.spawn(move || {
                let mut t = [Tally::default(), Tally::default(), Tally::default()];
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let started = Instant::now();
                    let p = phase.load(std::sync::atomic::Ordering::Relaxed);
                    let tally = &mut t[p.min(2)];
                    tally.calls += 1;
                    match read_once(ctx, i, expected) {
                        Err(e) => {
                            tally.errors += 1;
                            tally.note(format!("{e:#}"));
                        }
                        Ok(missing) if !missing.is_empty() => {
                            tally.incomplete += 1;
                            tally.note(format!("missing {missing:?}"));
                        }
                        Ok(_) => {}
                    }
                    i += 1;
                    thread::sleep(Duration::from_millis(100).saturating_sub(started.elapsed()));
                }
                t
            })
        };
        let mut durations = Vec::new();
        for (n, target) in ["deployment/kpulse-aggregator-api", "daemonset/kpulse-agent"]
            .iter()
            .enumerate()
        {
            phase.store(n, std::sync::atomic::Ordering::Relaxed);
            let t = Instant::now();
            crate::exec::output(ctx.kubectl().args([
                "-n",
                "kpulse-system",
                "rollout",
                "restart",
                target,
            ]))?;
            crate::exec::output(
                ctx.kubectl()
                    .args([
                        "-n",
                        "kpulse-system",
                        "rollout",
                        "status",
                        target,
                        "--timeout=240s",
                    ])
                    .arg("--request-timeout=0"),
            )?;
            // Keep reading a little past the rollout's end.
            thread::sleep(Duration::from_secs(5));
            durations.push(t.elapsed());
        }
        phase.store(2, std::sync::atomic::Ordering::Relaxed);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let t = reader
            .join()
            .map_err(|_| anyhow::anyhow!("the reader panicked"))?;
        let [a, b, _] = t;
        Ok(vec![(a, durations[0]), (b, durations[1])])
    })?;
    let describe = |name: &str, (t, d): &(Tally, Duration)| {
        format!(
            "{name} ({:.0} s incl. 5 s after): {} reads, {} failed, {} incomplete{}",
            d.as_secs_f64(),
            t.calls,
            t.errors,
            t.incomplete,
            if t.examples.is_empty() {
                String::new()
            } else {
                format!(" (e.g. {})", t.examples.join(" | "))
            }
        )
    };
    let text = format!(
        "{}; {}",
        describe("aggregator-api rollout", &tallies[0]),
        describe("agent rollout", &tallies[1])
    );
    // Both: during the agent's, the kubelet fallback serves its node (the old agent streams
    // through --shutdown-delay-duration while the fallback takes its first two scrapes).
    ensure!(
        tallies
            .iter()
            .all(|(t, _)| t.errors == 0 && t.incomplete == 0),
        "a rollout was not seamless: {text}"
    );
    Ok(text)
}

/// One read, alternating `kubectl top pod -A` and a PodMetrics list; the expected pods it
/// did not list.
fn read_once(
    ctx: &Ctx<'_>,
    i: u64,
    expected: &std::collections::BTreeSet<String>,
) -> Result<Vec<String>> {
    let listed: std::collections::BTreeSet<String> = if i.is_multiple_of(2) {
        let out = crate::exec::output(ctx.kubectl().args(["top", "pod", "-A", "--no-headers"]))
            .context("kubectl top pod -A")?;
        out.lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                Some(format!("{}/{}", w.next()?, w.next()?))
            })
            .collect()
    } else {
        let v = ctx
            .json(&["get", "podmetrics", "-A"])
            .context("kubectl get podmetrics -A")?;
        v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                Some(format!(
                    "{}/{}",
                    p["metadata"]["namespace"].as_str()?,
                    p["metadata"]["name"].as_str()?
                ))
            })
            .collect()
    };
    Ok(expected
        .iter()
        .filter(|p| !listed.contains(*p))
        .cloned()
        .collect())
}
