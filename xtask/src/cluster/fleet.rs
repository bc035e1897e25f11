//! `cargo xtask cluster fleet`: thousands of Nodes and their Pods in the real cluster,
//! without their kubelets, for measuring kpulse at the size of real clusters.
//!
//! kwok (`sigs.k8s.io/kwok`, built from its module like the other components, pinned in
//! [`versions::KWOK`]) plays every kubelet of the fleet: it keeps the Nodes Ready (a Lease
//! each, renewed every quarter of [`LEASE_SECONDS`]), marks their Pods Running with an
//! address from the node's own pod range, and serves each node's `/metrics/resource` (the
//! kubelet's series, from the Pods' `kwok.x-k8s.io/usage-*` annotations) at the path the
//! Node's `metrics.k8s.io/resource-metrics-path` annotation names, on [`KWOK_PORT`] of this
//! machine's node address. It listens there with a serving certificate from the cluster CA,
//! so kpulse's kubelet fallback (and metrics-server) read it as they read a kubelet.
//!
//! What this makes, on a cluster `cluster up --install` started:
//! - `--nodes` Nodes `fleet-node-NNNNN`, labelled as a cloud's nodes are (arch, os, zone,
//!   region, instance type, and two labels of the user's own), tainted
//!   `kwok.x-k8s.io/node=fake:NoSchedule`, each with a /24 of [`host::FLEET_POD_RANGE`];
//! - `--pods` Pods on each, bound directly (`spec.nodeName`, as kwok's own benchmark
//!   makes them), in `--namespaces` namespaces `fleet-NNN`, with `--containers` containers
//!   each and a CPU and memory use drawn from `--seed`;
//! - the kpulse agent DaemonSet's own Pod on every fleet node (it tolerates every taint), which
//!   kwok reports Running: the real agent Pods that simulated agents stream for.
//!
//! Nothing is ever sent to a fleet pod's address: no Service selects them, and the whole
//! range is a blackhole route on this machine ([`host`]).
//!
//! kube-controller-manager marks a node unreachable when its Lease is older than
//! `--node-monitor-grace-period` (50 s by default); kwok renews a Lease every
//! [`LEASE_SECONDS`] / 4, so the controller is restarted with [`GRACE_PERIOD`] while a fleet
//! exists, and back without it by `--remove`.
//!
//! `--remove` deletes the Pods (their namespaces), then the Nodes, then stops kwok: with kwok
//! gone first, nothing would finish the Pods' deletion and every node would go unreachable.

use std::{
    collections::BTreeMap,
    fs,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use futures_util::{stream, StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::{
    authentication::v1::TokenRequest,
    coordination::v1::Lease,
    core::v1::{Namespace, Node, Pod, ServiceAccount},
};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use super::{
    gobuild,
    host::{self, Dirs},
    pki, versions,
};

/// The port kwok serves the fleet's kubelet endpoints on (the Nodes' status port; kwok's
/// own default, clear of the kubelet's 10250).
pub const KWOK_PORT: u16 = 10247;
/// At most this many fleet nodes (the /24s of [`host::FLEET_POD_RANGE`]).
pub const MAX_NODES: usize = 16_384;
/// The label every fleet node has, and that kwok selects its nodes by (server side).
pub(super) const NODE_LABEL: (&str, &str) = ("type", "kwok");
/// The use kwok reports for each container of a fleet pod (its usage-from-annotation).
pub(super) const USAGE_CPU: &str = "kwok.x-k8s.io/usage-cpu";
pub(super) const USAGE_MEMORY: &str = "kwok.x-k8s.io/usage-memory";
/// The label of every fleet pod and namespace.
pub(super) const POD_LABEL: (&str, &str) = ("kpulse.local/fleet", "true");
pub(super) const NODE_PREFIX: &str = "fleet-node-";
pub(super) const NAMESPACE_PREFIX: &str = "fleet-";
/// Every fleet pod's name starts so (`p-NNNNN-KKK`).
pub(super) const POD_PREFIX: &str = "p-";
/// kwok's node Leases: renewed every 60 s, so that 10,000 nodes cost about 170 writes a
/// second (with kwokctl's 40 s, 1,000).
const LEASE_SECONDS: u32 = 240;
/// kube-controller-manager's `--node-monitor-grace-period` while a fleet exists: more than a
/// Lease renewal period (60 s) with room for a late one.
const GRACE_PERIOD: &str = "--node-monitor-grace-period=5m0s";
/// Requests in flight while making or removing the fleet (the admin is in `system:masters`,
/// which API Priority and Fairness exempts).
const CONCURRENCY: usize = 32;
/// kwok's workers of each kind.
const KWOK_WORKERS: u32 = 16;
/// Each request's timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// kwok's stages (from its module, `kustomize/stage/...`): nodes become Ready and renew
/// their Lease; pods become Running, and finish deleting.
const STAGES: [&str; 5] = [
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
];
/// The kubelet's `/metrics/resource` as kwok emulates it, and the usage it reads (the pods'
/// annotations).
const METRICS: [&str; 2] = [
    "kustomize/metrics/resource/metrics-resource.yaml",
    "kustomize/metrics/usage/usage-from-annotation.yaml",
];

/// The fleet's size and makeup (`cluster fleet` and `cluster bench-fleet`).
#[derive(Debug, Clone, clap::Args)]
pub struct Shape {
    /// Fleet nodes (at most 16,384).
    #[arg(long, default_value_t = 1000)]
    pub nodes: usize,
    /// Pods on each fleet node, besides the agent's.
    #[arg(long, default_value_t = 10)]
    pub pods: usize,
    /// Containers in each pod.
    #[arg(long, default_value_t = 2)]
    pub containers: usize,
    /// Namespaces the pods are spread over.
    #[arg(long, default_value_t = 50)]
    pub namespaces: usize,
    /// Seed of the pods' CPU and memory use and of the nodes' labels.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How long to wait for every node to be Ready and every pod Running.
    #[arg(long, default_value = "20m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

impl Shape {
    fn check(&self) -> Result<()> {
        ensure!(
            (1..=MAX_NODES).contains(&self.nodes),
            "--nodes must be between 1 and {MAX_NODES}"
        );
        ensure!(
            self.containers > 0 && self.namespaces > 0,
            "--containers and --namespaces must be positive"
        );
        Ok(())
    }

    /// The namespace of the fleet's first pods (one `kubectl top pod -n` reads).
    pub fn first_namespace() -> String {
        namespace(0)
    }
}

/// `cargo xtask cluster fleet` flags.
#[derive(Debug, clap::Args)]
pub struct Options {
    #[command(flatten)]
    shape: Shape,
    /// Once the fleet is ready, write here what `loadgen --fleet` streams as the fleet's
    /// agents: each fleet node, a token of the agent's ServiceAccount bound to its agent pod
    /// (as the kubelet projects one: audience `kpulse`, reviewed by kpulse's TokenReview),
    /// another for kube-apiserver (the agent's own watch of its node's pods), and the node's
    /// pods. Mode 0600.
    #[arg(long)]
    agents_file: Option<std::path::PathBuf>,
    /// Remove the fleet (pods, nodes, kwok) instead.
    #[arg(long)]
    remove: bool,
}

pub fn run(opts: &Options, dirs: &Dirs, release: &versions::Release) -> Result<()> {
    let rt = runtime()?;
    let client = rt.block_on(client(&dirs.kubeconfig()))?;
    if opts.remove {
        return rt.block_on(remove(dirs, &client));
    }
    make(
        &opts.shape,
        opts.agents_file.as_deref(),
        dirs,
        release,
        &rt,
        &client,
    )
}

/// The runtime the fleet's requests run on.
pub(super) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")
}

/// Where `fleet` keeps kube-controller-manager's own `--node-monitor-grace-period` flag (an
/// empty file: it had none), to put it back.
const GRACE_SAVED: &str = "fleet-node-monitor-grace-period";

/// Makes what is missing of the fleet `shape` describes and waits until it is ready; with
/// `agents_file`, writes it (see [`Options::agents_file`]). What it made stays on failure.
pub(super) fn make(
    shape: &Shape,
    agents_file: Option<&Path>,
    dirs: &Dirs,
    release: &versions::Release,
    rt: &tokio::runtime::Runtime,
    client: &kube::Client,
) -> Result<()> {
    shape.check()?;
    let opts = shape;
    // What it made stays on failure: say so, whichever step failed.
    let made = (|| -> Result<()> {
        let started = Instant::now();
        host::fleet_route_up()?;
        start_kwok(dirs)?;
        let args = controller_manager_args(dirs)?;
        if !args.iter().any(|a| a == GRACE_PERIOD) {
            let own = args
                .iter()
                .find(|a| a.starts_with("--node-monitor-grace-period="))
                .cloned()
                .unwrap_or_default();
            fs::write(dirs.state.join(GRACE_SAVED), own)?;
            println!("fleet: kube-controller-manager restarted with {GRACE_PERIOD}");
            host::restart(dirs, "kube-controller-manager", |mut args| {
                args.retain(|a| !a.starts_with("--node-monitor-grace-period="));
                args.push(GRACE_PERIOD.to_string());
                args
            })?;
        }
        rt.block_on(async {
            let t = Instant::now();
            let made = create_nodes(client, opts, release).await?;
            println!(
                "fleet: {} nodes made ({made} new) in {:.1} s",
                opts.nodes,
                t.elapsed().as_secs_f64()
            );
            let t = Instant::now();
            let made = create_pods(client, opts).await?;
            println!(
                "fleet: {} pods made ({made} new) in {:.1} s",
                opts.nodes * opts.pods,
                t.elapsed().as_secs_f64()
            );
            wait_fleet(client, opts, started).await?;
            if let Some(path) = agents_file {
                let t = Instant::now();
                let n = write_agents_file(client, path).await?;
                println!(
                    "fleet: {n} agents' tokens and pods in {} ({:.1} s)",
                    path.display(),
                    t.elapsed().as_secs_f64()
                );
            }
            Ok(())
        })
    })();
    if made.is_err() {
        eprintln!(
            "fleet: failed; what it made stays (kwok, the route, kube-controller-manager's grace \
             period): `cargo xtask cluster fleet --remove` or `cargo xtask cluster down` undoes it"
        );
    }
    made
}

/// The agent's ServiceAccount and the audience its projected token has (deploy/).
const AGENT_ACCOUNT: (&str, &str) = ("kpulse-system", "kpulse-agent");
const AGENT_AUDIENCE: &str = "kpulse";
/// Lifetime of the tokens `--agents-file` holds: long enough for any benchmark.
const TOKEN_SECONDS: i64 = 6 * 3600;

/// Writes `loadgen --fleet`'s file (see [`Options::agents_file`]); returns its nodes.
async fn write_agents_file(client: &kube::Client, path: &Path) -> Result<usize> {
    let pods: Api<Pod> = Api::all(client.clone());
    let on_node = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| n.starts_with(NODE_PREFIX))
    };
    let mut by_node: BTreeMap<String, Vec<serde_json::Value>> = BTreeMap::new();
    let fleet = ListParams::default().labels(&format!("{}={}", POD_LABEL.0, POD_LABEL.1));
    for_each(&pods, &fleet, |p| {
        if let Some(node) = on_node(p) {
            let containers: Vec<String> = p
                .spec
                .iter()
                .flat_map(|s| s.containers.iter().map(|c| c.name.clone()))
                .collect();
            by_node.entry(node).or_default().push(json!({
                "uid": p.metadata.uid,
                "namespace": p.metadata.namespace,
                "name": p.metadata.name,
                "labels": p.metadata.labels,
                "containers": containers,
            }));
        }
    })
    .await?;
    // One agent pod per node, the newest (a rollout has two for a moment).
    let mut newest: BTreeMap<String, (String, String, String)> = BTreeMap::new();
    let running = ListParams::default()
        .labels(super::fallback::AGENTS)
        .fields("status.phase=Running");
    for_each(&pods, &running, |p| {
        let created = p
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default();
        if let (Some(node), Some(name), Some(uid)) =
            (on_node(p), p.metadata.name.clone(), p.metadata.uid.clone())
        {
            let entry = newest.entry(node).or_default();
            if created >= entry.0 {
                *entry = (created, name, uid);
            }
        }
    })
    .await?;
    let without = by_node.keys().filter(|n| !newest.contains_key(*n)).count();
    if without > 0 {
        println!("fleet: {without} fleet nodes have no Running agent pod: left out of the file");
    }
    let agents: Vec<(String, String, String)> = newest
        .into_iter()
        .map(|(node, (_, name, uid))| (node, name, uid))
        .collect();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), AGENT_ACCOUNT.0);
    let tokens: Vec<(String, String, String)> = stream::iter(agents)
        .map(|(node, pod, uid)| {
            let accounts = accounts.clone();
            async move {
                let stream = token(&accounts, &pod, &uid, Some(AGENT_AUDIENCE)).await?;
                let api = token(&accounts, &pod, &uid, None).await?;
                Ok::<_, anyhow::Error>((node, stream, api))
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;
    let nodes: Vec<serde_json::Value> = tokens
        .into_iter()
        .map(|(node, token, api_token)| {
            let pods = by_node.remove(&node).unwrap_or_default();
            json!({"name": node, "token": token, "api_token": api_token, "pods": pods})
        })
        .collect();
    let n = nodes.len();
    let text = serde_json::to_string(&json!({ "nodes": nodes }))?;
    {
        use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        // `mode` is for a new file only: an old one keeps its own until this.
        f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .with_context(|| format!("cannot restrict {}", path.display()))?;
        f.write_all(text.as_bytes())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(n)
}

/// A token of the agent's ServiceAccount bound to its pod `name` (`uid`), for `audience`
/// (kube-apiserver's own audiences when `None`), valid [`TOKEN_SECONDS`].
async fn token(
    accounts: &Api<ServiceAccount>,
    name: &str,
    uid: &str,
    audience: Option<&str>,
) -> Result<String> {
    let mut spec = json!({
        "expirationSeconds": TOKEN_SECONDS,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid},
    });
    if let Some(audience) = audience {
        spec["audiences"] = json!([audience]);
    }
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": spec,
    }))?;
    let answer = accounts
        .create_token_request(AGENT_ACCOUNT.1, &PostParams::default(), &request)
        .await
        .with_context(|| format!("a token for the agent pod {name}"))?;
    answer
        .status
        .map(|s| s.token)
        .with_context(|| format!("no token for the agent pod {name}"))
}

/// Calls `f` on every object `api` lists with `params`, in pages of 500.
async fn for_each<K>(api: &Api<K>, params: &ListParams, mut f: impl FnMut(&K)) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = params.clone().limit(500);
    loop {
        let page = api.list(&params).await?;
        page.items.iter().for_each(&mut f);
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => params = params.continue_token(&c),
            _ => return Ok(()),
        }
    }
}

/// kube-controller-manager's arguments as it runs.
fn controller_manager_args(dirs: &Dirs) -> Result<Vec<String>> {
    let pid = fs::read_to_string(dirs.state.join("kube-controller-manager.pid"))
        .context("kube-controller-manager is not running")?;
    let cmdline = fs::read(format!("/proc/{}/cmdline", pid.trim()))
        .context("kube-controller-manager is not running")?;
    Ok(cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect())
}

pub(super) async fn client(kubeconfig: &Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .context("admin kubeconfig")?;
    config.connect_timeout = Some(REQUEST_TIMEOUT);
    config.read_timeout = Some(REQUEST_TIMEOUT);
    config.write_timeout = Some(REQUEST_TIMEOUT);
    kube::Client::try_from(config).context("Kubernetes client")
}

/// kwok's configuration: its options, the stages and the metrics emulation from its
/// module (the files its own kustomizations use), one multi-document file.
fn kwok_config(serving: &pki::Pair) -> Result<String> {
    let module = gobuild::module_dir("sigs.k8s.io/kwok", versions::KWOK)?;
    let options = json!({
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "manageAllNodes": false,
            "manageNodesWithLabelSelector": format!("{}={}", NODE_LABEL.0, NODE_LABEL.1),
            "nodeIP": host::NODE_IP,
            "nodePort": KWOK_PORT,
            "serverAddress": format!("{}:{KWOK_PORT}", host::NODE_IP),
            "tlsCertFile": serving.cert.display().to_string(),
            "tlsPrivateKeyFile": serving.key.display().to_string(),
            "nodeLeaseDurationSeconds": LEASE_SECONDS,
            // Workers (the binary's defaults are 0, which it refuses). kwok's own manifest
            // has 4 of each, which marked about 60 pods a second Running here at 1,000
            // nodes, each worker waiting on kube-apiserver's answer: 16 keep more requests
            // in flight (not yet shown faster: at 10,000 nodes kwok was short of CPU).
            "nodeLeaseParallelism": KWOK_WORKERS,
            "nodePlayStageParallelism": KWOK_WORKERS,
            "podPlayStageParallelism": KWOK_WORKERS,
            "podsOnNodeSyncParallelism": KWOK_WORKERS,
            // As kwok's own in-cluster manifest: a watch per node's pods, not a paged list.
            "enablePodsOnNodeSyncListPager": false,
            "enablePodsOnNodeSyncStreamWatch": true,
            // Its server has no authentication: nothing on it but the kubelet endpoints.
            "enableDebuggingHandlers": false,
            "enableProfilingHandler": false,
            "enableContentionProfiling": false,
        }
    });
    let mut text = serde_json::to_string_pretty(&options)?;
    for file in STAGES.iter().chain(METRICS.iter()) {
        let path = module.join(file);
        let doc =
            fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        text.push_str("\n---\n");
        text.push_str(&doc);
    }
    Ok(text)
}

/// Builds kwok if needed and starts it, unless it runs.
fn start_kwok(dirs: &Dirs) -> Result<()> {
    let pid_file = dirs.state.join("kwok.pid");
    if let Some(pid) = fs::read_to_string(&pid_file)
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
    {
        if host::alive(pid) {
            println!("fleet: kwok runs (PID {pid})");
            return Ok(());
        }
    }
    let kwok = gobuild::kwok();
    gobuild::build(&kwok, &dirs.build)?;
    let work = dirs.state.join("kwok");
    let serving = pki::serving(&dirs.pki, &work, "serving", "kwok", host::NODE_IP)?;
    let config = work.join("kwok.yaml");
    fs::write(&config, kwok_config(&serving)?)
        .with_context(|| format!("cannot write {}", config.display()))?;
    let pid = host::start(
        dirs,
        "kwok",
        &kwok.bin(&dirs.build, "kwok"),
        &[
            format!(
                "--kubeconfig={}",
                dirs.pki.join("admin.kubeconfig").display()
            ),
            format!("--config={}", config.display()),
        ],
        // Else kwok also reads ~/.kwok/kwok.yaml.
        &[("KWOK_WORKDIR", work.display().to_string())],
    )?;
    host::wait_for(
        dirs,
        "kwok's /healthz",
        Some(("kwok", pid)),
        Duration::from_secs(60),
        || {
            Ok(
                super::http_get(&format!("{}:{KWOK_PORT}", host::NODE_IP), "/healthz")
                    .is_ok_and(|r| r.starts_with("HTTP/1.0 200") || r.starts_with("HTTP/1.1 200")),
            )
        },
    )?;
    println!("fleet: kwok {} started (PID {pid})", versions::KWOK);
    Ok(())
}

/// Node `i`'s /24 of [`host::FLEET_POD_RANGE`] (10.128.0.0/10).
fn pod_cidr(i: usize) -> String {
    format!("10.{}.{}.0/24", 128 + i / 256, i % 256)
}

fn node_name(i: usize) -> String {
    format!("{NODE_PREFIX}{i:05}")
}

pub(super) fn namespace(j: usize) -> String {
    format!("{NAMESPACE_PREFIX}{j:03}")
}

/// Fleet node `i`: labelled as a cloud's node, its own /24, its kubelet endpoint on kwok.
fn node(i: usize, release: &versions::Release, rng: &mut fastrand::Rng) -> Result<Node> {
    let name = node_name(i);
    let arm = rng.u8(..100) < 20;
    let arch = if arm { "arm64" } else { "amd64" };
    let (shape, cpu, memory) = [
        ("standard-8", "8", "32Gi"),
        ("standard-16", "16", "64Gi"),
        ("highmem-8", "8", "64Gi"),
        ("highcpu-16", "16", "16Gi"),
    ][rng.usize(..4)];
    let zone = ["a", "b", "c"][i % 3];
    let team = ["checkout", "search", "batch", "web"][rng.usize(..4)];
    let instance_type = format!("{}{shape}", if arm { "a" } else { "x" });
    let containerd = format!("containerd://{}", release.containerd);
    let pod_cidr = pod_cidr(i);
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                (NODE_LABEL.0): NODE_LABEL.1,
                "kubernetes.io/arch": arch,
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": name,
                "beta.kubernetes.io/arch": arch,
                "beta.kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": instance_type,
                "topology.kubernetes.io/region": "region-1",
                "topology.kubernetes.io/zone": format!("region-1{zone}"),
                "kpulse.local/pool": format!("pool-{}", i % 8),
                "kpulse.local/team": team,
            },
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
                // Where metrics-server (since 0.7) and kpulse's fallback read the node's
                // /metrics/resource: kwok serves every node on one port, by path.
                "metrics.k8s.io/resource-metrics-path":
                    format!("/metrics/nodes/{name}/metrics/resource"),
            },
        },
        "spec": {
            "podCIDR": pod_cidr,
            "podCIDRs": [pod_cidr],
            "taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}],
        },
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": host::NODE_IP},
                {"type": "Hostname", "address": name},
            ],
            "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
            "daemonEndpoints": {"kubeletEndpoint": {"Port": KWOK_PORT}},
            "nodeInfo": {
                "architecture": arch,
                "operatingSystem": "linux",
                "kubeletVersion": format!("v{}", release.kubernetes),
                "kubeProxyVersion": format!("v{}", release.kubernetes),
                "containerRuntimeVersion": containerd,
                "kernelVersion": "6.12.0",
                "osImage": "kwok",
                "machineID": "", "systemUUID": "", "bootID": "",
            },
        },
    }))
    .context("a fleet Node")
}

/// Pod `k` of fleet node `i`, in namespace `ns`: bound to the node, tolerating its taint,
/// with CPU and memory requests (for HPAs on utilisation) and its use for kwok to report.
fn pod(i: usize, k: usize, ns: &str, containers: usize, rng: &mut fastrand::Rng) -> Result<Pod> {
    let cpu_m = 5 + rng.u32(..200);
    let mem_mi = 16 + rng.u32(..240);
    let containers: Vec<_> = (0..containers)
        .map(|c| {
            json!({
                "name": format!("c{c}"),
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            })
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("{POD_PREFIX}{i:05}-{k:03}"),
            "namespace": ns,
            "labels": {(POD_LABEL.0): POD_LABEL.1, "app": format!("app-{}", k % 4)},
            "annotations": {
                // Per container (kwok's usage-from-annotation).
                (USAGE_CPU): format!("{cpu_m}m"),
                (USAGE_MEMORY): format!("{mem_mi}Mi"),
            },
        },
        "spec": {
            "nodeName": node_name(i),
            "automountServiceAccountToken": false,
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": containers,
        },
    }))
    .context("a fleet Pod")
}

/// Creates what is missing of the fleet's nodes; returns how many it made.
async fn create_nodes(
    client: &kube::Client,
    opts: &Shape,
    release: &versions::Release,
) -> Result<usize> {
    let api: Api<Node> = Api::all(client.clone());
    let mut rng = fastrand::Rng::with_seed(opts.seed);
    let nodes: Vec<Node> = (0..opts.nodes)
        .map(|i| node(i, release, &mut rng))
        .collect::<Result<_>>()?;
    let made = stream::iter(nodes)
        .map(|n| {
            let api = api.clone();
            async move { created(api.create(&PostParams::default(), &n).await) }
        })
        .buffer_unordered(CONCURRENCY)
        .try_fold(0, |sum, new| async move { Ok(sum + usize::from(new)) })
        .await?;
    Ok(made)
}

/// Creates what is missing of the namespaces and pods; returns how many pods it made.
async fn create_pods(client: &kube::Client, opts: &Shape) -> Result<usize> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for j in 0..opts.namespaces {
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace(j), "labels": {(POD_LABEL.0): POD_LABEL.1}},
        }))?;
        created(namespaces.create(&PostParams::default(), &ns).await)?;
    }
    // The ServiceAccount admission refuses a pod until its namespace's `default`
    // ServiceAccount exists, which kube-controller-manager makes a moment after the namespace.
    for j in 0..opts.namespaces {
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace(j));
        let deadline = Instant::now() + Duration::from_secs(60);
        while accounts.get_opt("default").await?.is_none() {
            ensure!(
                Instant::now() < deadline,
                "namespace {} has no default ServiceAccount after 60 s",
                namespace(j)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let mut rng = fastrand::Rng::with_seed(opts.seed.wrapping_add(1));
    let mut pods = Vec::with_capacity(opts.nodes * opts.pods);
    for i in 0..opts.nodes {
        for k in 0..opts.pods {
            let ns = namespace((i * opts.pods + k) % opts.namespaces);
            pods.push(pod(i, k, &ns, opts.containers, &mut rng)?);
        }
    }
    stream::iter(pods)
        .map(|p| {
            let client = client.clone();
            async move {
                let ns = p.metadata.namespace.clone().unwrap_or_default();
                created(
                    Api::<Pod>::namespaced(client, &ns)
                        .create(&PostParams::default(), &p)
                        .await,
                )
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_fold(0, |sum, new| async move { Ok(sum + usize::from(new)) })
        .await
}

/// Whether a create made the object: `false` when it existed (a second `fleet` run).
pub(super) fn created<T>(r: kube::Result<T>) -> Result<bool> {
    match r {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e).context("create"),
    }
}

/// Counts, in pages of 500, the objects `api` lists with `params` for which `count` holds.
async fn count<K>(api: &Api<K>, params: &ListParams, count: impl Fn(&K) -> bool) -> Result<usize>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut n = 0;
    for_each(api, params, |o| n += usize::from(count(o))).await?;
    Ok(n)
}

fn ready_node(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn running_pod(p: &Pod) -> bool {
    p.status
        .as_ref()
        .is_some_and(|s| s.phase.as_deref() == Some("Running"))
}

/// Until every fleet node is Ready and every fleet pod Running, and the agent DaemonSet has
/// a Pod Running on every fleet node; prints the progress every 15 s.
async fn wait_fleet(client: &kube::Client, opts: &Shape, started: Instant) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    let by_node = ListParams::default().labels(&format!("{}={}", NODE_LABEL.0, NODE_LABEL.1));
    // Only the fleet's pods that are not Running yet are listed: at 150,000 pods, a list of
    // them all every few seconds would be most of what kube-apiserver does.
    let all_pods = ListParams::default().labels(&format!("{}={}", POD_LABEL.0, POD_LABEL.1));
    let waiting = ListParams::default()
        .labels(&format!("{}={}", POD_LABEL.0, POD_LABEL.1))
        .fields("status.phase!=Running");
    let agents = ListParams::default().labels(super::fallback::AGENTS);
    let want_pods = opts.nodes * opts.pods;
    let deadline = Instant::now() + opts.timeout;
    let mut said = Instant::now();
    loop {
        let ready = count(&nodes, &by_node, ready_node).await?;
        let mut running = want_pods.saturating_sub(count(&pods, &waiting, |_| true).await?);
        if running >= want_pods {
            // None waits: count them all once, so that a missing pod is not taken for a
            // Running one (nor a leftover of a larger fleet for one of this fleet's).
            running = count(&pods, &all_pods, running_pod).await?;
            ensure!(
                running == want_pods,
                "{running} fleet pods are Running where this fleet has {want_pods}: `cargo \
                 xtask cluster fleet --remove` first"
            );
        }
        let agents = count(&pods, &agents, |p| {
            running_pod(p)
                && p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .is_some_and(|n| n.starts_with(NODE_PREFIX))
        })
        .await?;
        let line = format!(
            "{ready}/{} nodes Ready, {running}/{want_pods} pods Running, the agent Running \
             on {agents}/{} fleet nodes",
            opts.nodes, opts.nodes
        );
        if ready >= opts.nodes && running >= want_pods && agents >= opts.nodes {
            println!(
                "fleet: {line}, {:.0} s after the start",
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("fleet: not ready after {:?}: {line}", opts.timeout);
        }
        if said.elapsed() >= Duration::from_secs(15) {
            println!("fleet: {line}");
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// Deletes the fleet's pods (one request per namespace, without grace: nothing runs in
/// them), its namespaces, its nodes (one request) and their Leases; waits until they and the
/// agent's pods on fleet nodes (the pod garbage collector's) are gone; then stops kwok,
/// removes the route and puts kube-controller-manager's grace period back.
pub(super) async fn remove(dirs: &Dirs, client: &kube::Client) -> Result<()> {
    let t = Instant::now();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    let fleet = ListParams::default().labels(&format!("{}={}", POD_LABEL.0, POD_LABEL.1));
    let by_node = ListParams::default().labels(&format!("{}={}", NODE_LABEL.0, NODE_LABEL.1));
    let now = DeleteParams::default().grace_period(0);
    for ns in namespaces.list(&fleet).await?.items {
        let Some(name) = ns.metadata.name else {
            continue;
        };
        Api::<Pod>::namespaced(client.clone(), &name)
            .delete_collection(&now, &ListParams::default())
            .await
            .with_context(|| format!("delete the pods of {name}"))?;
        ignore_gone(namespaces.delete(&name, &DeleteParams::default()).await)?;
    }
    nodes
        .delete_collection(&DeleteParams::default(), &by_node)
        .await
        .context("delete the fleet's nodes")?;
    let agents = ListParams::default().labels(super::fallback::AGENTS);
    let on_fleet = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| n.starts_with(NODE_PREFIX))
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let left = (
            namespaces.list(&fleet).await?.items.len(),
            count(&nodes, &by_node, |_| true).await?,
            count(&pods, &agents, on_fleet).await?,
        );
        if left == (0, 0, 0) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "after 10 min, left: {} namespaces, {} nodes, {} agent pods of the fleet",
            left.0,
            left.1,
            left.2
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    println!(
        "fleet: pods, namespaces and nodes gone in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    // Once kwok is gone, nothing renews (or makes again) the nodes' Leases.
    stop_kwok(dirs)?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let mut names = Vec::new();
    for_each(&leases, &ListParams::default(), |l| {
        if let Some(name) = l
            .metadata
            .name
            .clone()
            .filter(|n| n.starts_with(NODE_PREFIX))
        {
            names.push(name);
        }
    })
    .await?;
    for name in names {
        ignore_gone(leases.delete(&name, &DeleteParams::default()).await)?;
    }
    host::fleet_route_down()?;
    if controller_manager_args(dirs)?
        .iter()
        .any(|a| a == GRACE_PERIOD)
    {
        let own = fs::read_to_string(dirs.state.join(GRACE_SAVED)).unwrap_or_default();
        host::restart(dirs, "kube-controller-manager", |mut args| {
            args.retain(|a| a != GRACE_PERIOD);
            if !own.trim().is_empty() {
                args.push(own.trim().to_string());
            }
            args
        })?;
        fs::remove_file(dirs.state.join(GRACE_SAVED)).ok();
        println!("fleet: kube-controller-manager restarted without {GRACE_PERIOD}");
    }
    Ok(())
}

pub(super) fn ignore_gone<T>(r: kube::Result<T>) -> Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e).context("delete"),
    }
}

/// Stops the kwok this started (by its PID file).
fn stop_kwok(dirs: &Dirs) -> Result<()> {
    let pid_file = dirs.state.join("kwok.pid");
    let Some(pid) = fs::read_to_string(&pid_file)
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
    else {
        return Ok(());
    };
    if host::alive(pid) {
        crate::exec::run(std::process::Command::new("kill").arg(pid.to_string()))?;
        let t = Instant::now();
        while host::alive(pid) && t.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(200));
        }
        ensure!(!host::alive(pid), "kwok (PID {pid}) did not exit");
    }
    fs::remove_file(&pid_file).ok();
    println!("fleet: kwok stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_has_its_own_24_inside_the_blackholed_range() {
        let range: (std::net::Ipv4Addr, u8) = {
            let (a, b) = host::FLEET_POD_RANGE.split_once('/').expect("a CIDR");
            (a.parse().expect("an address"), b.parse().expect("a length"))
        };
        let mask = u32::MAX << (32 - range.1);
        let mut seen = std::collections::HashSet::new();
        for i in [0, 1, 255, 256, MAX_NODES / 2, MAX_NODES - 1] {
            let cidr = pod_cidr(i);
            let (a, len) = cidr.split_once('/').expect("a CIDR");
            assert_eq!(len, "24");
            let a: std::net::Ipv4Addr = a.parse().expect("an address");
            assert_eq!(u32::from(a) & mask, u32::from(range.0), "{cidr}");
            assert!(seen.insert(cidr));
        }
        assert_eq!(MAX_NODES, 1 << (24 - range.1));
    }

    #[test]
    fn a_node_is_kwoks_and_names_its_metrics_path() {
        let release = versions::RELEASES[0];
        let n = node(7, &release, &mut fastrand::Rng::with_seed(1)).expect("a node");
        let labels = n.metadata.labels.expect("labels");
        assert_eq!(
            labels.get(NODE_LABEL.0).map(String::as_str),
            Some(NODE_LABEL.1)
        );
        let annotations = n.metadata.annotations.expect("annotations");
        assert_eq!(
            annotations
                .get("metrics.k8s.io/resource-metrics-path")
                .map(String::as_str),
            Some("/metrics/nodes/fleet-node-00007/metrics/resource")
        );
        let status = n.status.expect("status");
        assert_eq!(
            status
                .daemon_endpoints
                .and_then(|d| d.kubelet_endpoint)
                .map(|e| e.port),
            Some(i32::from(KWOK_PORT))
        );
    }
}
