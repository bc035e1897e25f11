//! `cargo xtask bench-vs-metrics-server`: kpulse and metrics-server v0.8.0 on the same
//! cluster, the same pods, in the same run, against the kernel's own counters.
//!
//! Needs `cargo xtask cluster up --install`. It installs metrics-server from its module's
//! release manifests **beside** kpulse (its Deployment, Service and RBAC, with
//! `--metric-resolution=15s` as shipped and `--kubelet-insecure-tls`; not its APIService,
//! since kpulse holds `metrics.k8s.io`) and reads both as the HPA would ([`api`]). Parts:
//!
//! - `freshness` ([`freshness`]): a burner's CPU steps 0 → its limit → 0; time until each
//!   API serves ≥ 90 % of the new rate (≤ 10 % after a drop); served CPU and working set
//!   against the cgroup counters over the window each API states; a new pod's time to its
//!   first served value.
//! - `cost` ([`cost`]): CPU and memory of kpulse (agent and aggregator-api) against
//!   metrics-server plus what the kubelet and containerd spend serving its scrapes, on a node
//!   full of pods; kpulse at 1 s and at 100 ms.
//! - `load` ([`cost::under_load`]): every CPU saturated by best-effort pods: metrics-server's
//!   scrapes against kpulse's data age, before, during and after.
//! - `hpa` ([`hpa`]): the same Deployment and CPU HPA driven by each system in turn: load
//!   step → first scale-up, load stop → scale-down.
//! - `window` ([`window`]): kpulse at each `--metric-window` and metrics-server: the HPA's
//!   first scale-up after a load step, and its replica flapping on a bursty workload.
//! - `throttled` ([`throttled`]): a workload throttled under its CPU limit while using ~50 %
//!   of its request, under a CPU-utilisation HPA and under an HPA on kpulse's
//!   `cpu_throttled_ratio` (`custom.metrics.k8s.io`, the `custom-metrics` overlay, installed
//!   by the part and left installed): replicas, served figures and the bursts' latency.
//!
//! The report (markdown) goes to stdout and to `--out`.

pub(super) mod api;
mod cost;
mod freshness;
mod hpa;
mod throttled;
pub(super) mod truth;
mod window;

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use super::{gobuild, host::Dirs, images, versions};
use api::{Api, PodPoint, Source};

/// The parts of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    Freshness,
    Cost,
    Load,
    Hpa,
    Window,
    Throttled,
}

/// `cargo xtask bench-vs-metrics-server` flags.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Which parts to run (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Part>,
    /// Load steps (each up and back down).
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// New pods whose first served value is timed.
    #[arg(long, default_value_t = 5)]
    new_pods: usize,
    /// Pods the cost part puts on the node (the kubelet admits 110, its default maxPods,
    /// including the cluster's own).
    #[arg(long, default_value_t = 95)]
    cost_pods: usize,
    /// Containers in each filler pod of the cost part (each an idle shell).
    #[arg(long, default_value_t = 1)]
    cost_containers: usize,
    /// Off/on rounds of metrics-server in the cost part.
    #[arg(long, default_value_t = 3)]
    cost_rounds: usize,
    /// Length of each measured phase of the cost part (the load part's are twice this).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    phase: Duration,
    /// HPA trials per source and sync period.
    #[arg(long, default_value_t = 5)]
    hpa_trials: usize,
    /// The controller-manager's HPA sync periods to try (15s is its default).
    #[arg(long, value_delimiter = ',', default_value = "15s,1s", value_parser = humantime::parse_duration)]
    hpa_sync_periods: Vec<Duration>,
    /// The HPAs' `behavior.scaleUp.stabilizationWindowSeconds`, the same for every source
    /// (0: the HPA's default, none).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    scale_up_stabilization: Duration,
    /// kpulse's `--metric-window`s the window part tries: a duration (fixed) or
    /// `adaptive:<duration>` (`--metric-window-mode=adaptive`).
    #[arg(long, value_delimiter = ',', default_value = "1s,5s,15s")]
    windows: Vec<window::WindowSpec>,
    /// How long the window part runs its bursty workload for each setting.
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    bursty_phase: Duration,
    /// Bursty phases per setting in the window part (interleaved across settings).
    #[arg(long, default_value_t = 1)]
    bursty_rounds: usize,
    /// How long the throttled part keeps its load on under each HPA.
    #[arg(long, default_value = "240s", value_parser = humantime::parse_duration)]
    throttled_phase: Duration,
    /// CPU time of one pod's burst each second at one replica in the throttled part (the
    /// total work, shared among the replicas); 100ms is 50 % of the pods' 200m request.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    throttled_burst: Duration,
    /// Where the markdown report goes.
    #[arg(long, default_value = "target/bench-vs-metrics-server.md")]
    out: PathBuf,
}

/// The benchmark's namespace; every pod in it has [`BENCH_LABEL`].
pub const NAMESPACE: &str = "kpulse-versus";
pub const BENCH_LABEL: &str = "kpulse.dev/bench=versus";

/// Everything the parts share.
pub struct Bench {
    pub dirs: Dirs,
    pub kubectl: PathBuf,
    pub crictl: PathBuf,
    pub apis: Vec<Api>,
    pub report: String,
    /// The report's path; raw data goes beside it.
    pub out: PathBuf,
}

impl Bench {
    pub fn kubectl(&self) -> Command {
        let mut c = Command::new(&self.kubectl);
        c.arg("--kubeconfig")
            .arg(self.dirs.kubeconfig())
            .arg("--request-timeout=30s");
        c
    }

    pub fn json(&self, args: &[&str]) -> Result<Value> {
        let out = crate::exec::output(self.kubectl().args(args).args(["-o", "json"]))?;
        serde_json::from_str(&out).context("kubectl printed no JSON")
    }

    /// Applies a manifest given as JSON text.
    pub fn apply(&self, name: &str, manifest: &str) -> Result<()> {
        let file = self.dirs.etc.join(format!("versus-{name}.json"));
        fs::write(&file, manifest)?;
        crate::exec::output(self.kubectl().arg("apply").arg("-f").arg(&file))?;
        Ok(())
    }

    /// `crictl inspect` of a container, as JSON.
    pub fn inspect(&self, container_id: &str) -> Result<Value> {
        let out = crate::exec::output(
            Command::new(&self.crictl)
                .arg("--runtime-endpoint")
                .arg(format!(
                    "unix://{}",
                    self.dirs.containerd_socket().display()
                ))
                .args(["inspect", "-o", "json", container_id]),
        )?;
        serde_json::from_str(&out).context("crictl inspect printed no JSON")
    }

    /// The cgroup files of a pod's first container (`<namespace>/<pod>`), once it runs.
    pub fn container_cgroup(&self, namespace: &str, pod: &str) -> Result<truth::CgroupFiles> {
        let v = self.json(&["get", "pod", "-n", namespace, pod])?;
        let id = v["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .and_then(|id| id.strip_prefix("containerd://"))
            .with_context(|| format!("{namespace}/{pod} has no running container"))?;
        let inspect = self.inspect(id)?;
        let path = inspect["info"]["runtimeSpec"]["linux"]["cgroupsPath"]
            .as_str()
            .with_context(|| format!("{namespace}/{pod}: no cgroupsPath"))?;
        truth::CgroupFiles::for_path(path)
    }

    /// Waits until every pod matching `selector` in `namespace` is Ready.
    pub fn wait_ready(&self, namespace: &str, selector: &str, timeout: Duration) -> Result<()> {
        crate::exec::output(self.kubectl().args([
            "wait",
            "pod",
            "-n",
            namespace,
            "-l",
            selector,
            "--for=condition=Ready",
            &format!("--timeout={}s", timeout.as_secs()),
        ]))?;
        Ok(())
    }

    /// Waits until a Deployment of [`NAMESPACE`] has every replica ready.
    pub fn rollout(&self, deployment: &str, timeout: Duration) -> Result<()> {
        crate::exec::output(self.kubectl().args([
            "rollout",
            "status",
            "-n",
            NAMESPACE,
            &format!("deployment/{deployment}"),
            &format!("--timeout={}s", timeout.as_secs()),
        ]))?;
        Ok(())
    }

    /// Where a part's raw data goes: `<report>.<part>.jsonl`.
    pub fn raw_path(&self, part: &str) -> PathBuf {
        self.out.with_extension(format!("{part}.jsonl"))
    }

    /// [`Self::raw_path`], created (with its directory) for writing.
    pub fn raw_file(&self, part: &str) -> Result<std::io::BufWriter<fs::File>> {
        let path = self.raw_path(part);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        Ok(std::io::BufWriter::new(
            fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?,
        ))
    }

    /// Writes every answer and every counter read of a part beside the report, as JSON
    /// lines (`<report>.<part>.jsonl`), for a second look at the figures.
    pub fn keep_raw(
        &self,
        part: &str,
        seen: &Observations,
        series: &[(&str, &truth::Series)],
    ) -> Result<()> {
        use std::io::Write as _;
        let path = self.raw_path(part);
        let mut f = self.raw_file(part)?;
        for source in Source::ALL {
            for o in seen.of(source) {
                let line = match &o.points {
                    Ok(points) => serde_json::json!({
                        "source": source.name(), "at": o.at.to_string(),
                        "pods": points.iter().map(|p| serde_json::json!({
                            "pod": p.pod, "timestamp": p.timestamp,
                            "window": p.window.as_secs_f64(),
                            "cpu": p.containers.iter().map(|c| c.cpu).sum::<f64>(),
                            "memory": p.containers.iter().map(|c| c.memory).sum::<f64>(),
                        })).collect::<Vec<_>>(),
                    }),
                    Err(e) => serde_json::json!({
                        "source": source.name(), "at": o.at.to_string(), "error": e,
                    }),
                };
                writeln!(f, "{line}")?;
            }
        }
        for (name, s) in series {
            for (at, cpu) in &s.cpu {
                writeln!(
                    f,
                    "{}",
                    serde_json::json!({"counter": name, "at": at.to_string(), "cpu_ns": cpu})
                )?;
            }
        }
        f.flush()?;
        println!("versus: raw data in {}", path.display());
        Ok(())
    }

    fn section(&mut self, text: &str) {
        println!("{text}");
        self.report.push_str(text);
        self.report.push('\n');
    }
}

pub fn run(opts: &Options) -> Result<()> {
    let root = crate::vm::workspace_root()?;
    let dirs = Dirs::new(&root);
    let release = super::running_release(&dirs)?;
    let kubectl = gobuild::kubernetes(&release).bin(&dirs.build, "kubectl");
    let crictl = super::crictl(&dirs);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let service_ip = install_metrics_server(&dirs, &kubectl, &runtime)?;
    let apis = runtime.block_on(async {
        Ok::<_, anyhow::Error>(vec![
            Api::kpulse(&dirs.kubeconfig()).await?,
            Api::metrics_server(
                &service_ip,
                &dirs.pki.join("front-proxy-client.crt"),
                &dirs.pki.join("front-proxy-client.key"),
            )?,
        ])
    })?;
    let mut bench = Bench {
        dirs,
        kubectl,
        crictl,
        apis,
        report: String::new(),
        out: opts.out.clone(),
    };
    let parts = if opts.only.is_empty() {
        vec![
            Part::Freshness,
            Part::Cost,
            Part::Load,
            Part::Hpa,
            Part::Window,
            Part::Throttled,
        ]
    } else {
        opts.only.clone()
    };
    let mut header = String::new();
    let _ = writeln!(
        header,
        "# kpulse beside metrics-server {} — Kubernetes {}, {} CPUs, kernel {}\n",
        versions::METRICS_SERVER,
        release.kubernetes,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    bench.section(&header);
    reset_namespace(&bench)?;
    let result = (|| -> Result<()> {
        for part in &parts {
            match part {
                Part::Freshness => freshness::run(&mut bench, &runtime, opts.steps, opts.new_pods)?,
                Part::Cost => cost::run(
                    &mut bench,
                    cost::Filler {
                        pods: opts.cost_pods,
                        containers: opts.cost_containers,
                    },
                    opts.phase,
                    opts.cost_rounds,
                )?,
                Part::Load => cost::under_load(&mut bench, &runtime, 2 * opts.phase)?,
                Part::Hpa => hpa::run(
                    &mut bench,
                    opts.hpa_trials,
                    &opts.hpa_sync_periods,
                    opts.scale_up_stabilization,
                )?,
                Part::Window => window::run(
                    &mut bench,
                    opts.hpa_trials,
                    &opts.windows,
                    opts.bursty_phase,
                    opts.bursty_rounds,
                    opts.scale_up_stabilization,
                )?,
                Part::Throttled => throttled::run(
                    &mut bench,
                    &runtime,
                    opts.throttled_phase,
                    opts.throttled_burst,
                )?,
            }
            reset_namespace(&bench)?;
        }
        Ok(())
    })();
    if let Some(dir) = opts.out.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(&opts.out, &bench.report)?;
    println!("report: {}", opts.out.display());
    let _ = crate::exec::output(bench.kubectl().args([
        "delete",
        "namespace",
        NAMESPACE,
        "--wait=false",
        "--ignore-not-found",
    ]));
    result
}

fn reset_namespace(bench: &Bench) -> Result<()> {
    crate::exec::output(bench.kubectl().args([
        "delete",
        "namespace",
        NAMESPACE,
        "--wait=true",
        "--ignore-not-found",
        "--timeout=300s",
    ]))?;
    crate::exec::output(bench.kubectl().args(["create", "namespace", NAMESPACE]))?;
    Ok(())
}

/// Patches that, added to the migration's overlay ([`super::migrate::OVERLAY`]), leave out
/// of metrics-server's release manifests the two objects kpulse owns: the
/// `v1beta1.metrics.k8s.io` APIService and the `system:aggregated-metrics-reader` role.
const BESIDE_PATCHES: &str = "  - patch: |-
      $patch: delete
      apiVersion: apiregistration.k8s.io/v1
      kind: APIService
      metadata:
        name: v1beta1.metrics.k8s.io
  - patch: |-
      $patch: delete
      apiVersion: rbac.authorization.k8s.io/v1
      kind: ClusterRole
      metadata:
        name: system:aggregated-metrics-reader
";

/// Installs metrics-server beside kpulse (idempotent); returns its Service's ClusterIP
/// once it answers for its own pod.
fn install_metrics_server(
    dirs: &Dirs,
    kubectl: &Path,
    runtime: &tokio::runtime::Runtime,
) -> Result<String> {
    let kc = |args: &[&str]| -> Result<String> {
        crate::exec::output(
            Command::new(kubectl)
                .arg("--kubeconfig")
                .arg(dirs.kubeconfig())
                .arg("--request-timeout=30s")
                .args(args),
        )
    };
    let owner = kc(&[
        "get",
        "apiservice",
        "v1beta1.metrics.k8s.io",
        "-o",
        "jsonpath={.spec.service.namespace}/{.spec.service.name}",
    ])?;
    ensure!(
        owner.starts_with("kpulse-system/"),
        "v1beta1.metrics.k8s.io points at {owner}, not kpulse: run `cargo xtask cluster up --install`"
    );
    let overlay = format!("{}{BESIDE_PATCHES}", super::migrate::OVERLAY);
    let dir =
        super::migrate::metrics_server_kustomization(dirs, "metrics-server-beside", &overlay)?;
    let rendered = kc(&["kustomize", &dir.display().to_string()])?;
    ensure!(
        !rendered.contains("kind: APIService")
            && rendered.contains(&images::metrics_server_image()),
        "the overlay kept metrics-server's APIService or changed its image"
    );
    kc(&["apply", "-k", &dir.display().to_string()])?;
    let ip = kc(&[
        "get",
        "service",
        "-n",
        "kube-system",
        "metrics-server",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])?;
    let api = runtime.block_on(async {
        Api::metrics_server(
            &ip,
            &dirs.pki.join("front-proxy-client.crt"),
            &dirs.pki.join("front-proxy-client.key"),
        )
    })?;
    let t = Instant::now();
    super::host::wait_for(
        dirs,
        "metrics-server to serve its own pod",
        None,
        Duration::from_secs(180),
        || {
            let list =
                runtime.block_on(api.pod_metrics("kube-system", "k8s-app=metrics-server"))?;
            Ok(!list.is_empty())
        },
    )?;
    println!(
        "versus: metrics-server {} beside kpulse at {ip}:443, serving after {:.0} s",
        versions::METRICS_SERVER,
        t.elapsed().as_secs_f64()
    );
    Ok(ip)
}

/// One answer of a poller.
#[derive(Clone, Debug)]
pub struct Observation {
    /// When the answer arrived (unix ns).
    pub at: i128,
    pub points: Result<Vec<PodPoint>, String>,
}

/// Every answer each source gave, polling every `every`.
#[derive(Clone, Default)]
pub struct Observations(Arc<Mutex<Vec<(Source, Observation)>>>);

impl Observations {
    pub fn of(&self, source: Source) -> Vec<Observation> {
        self.0
            .lock()
            .map(|v| {
                v.iter()
                    .filter(|(s, _)| *s == source)
                    .map(|(_, o)| o.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The latest answer of `source` (or `None` before the first).
    pub fn latest(&self, source: Source) -> Option<Observation> {
        self.0.lock().ok().and_then(|v| {
            v.iter()
                .rev()
                .find(|(s, _)| *s == source)
                .map(|(_, o)| o.clone())
        })
    }
}

/// Upper bound on kept answers (2 sources × 10/s × 2 h).
const MAX_OBSERVATIONS: usize = 144_000;

/// Polls every API for `selector` in [`NAMESPACE`] every `every`, on the runtime's worker,
/// until dropped.
pub struct Poller {
    pub seen: Observations,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Poller {
    pub fn start(
        runtime: &tokio::runtime::Runtime,
        apis: &[Api],
        selector: &str,
        every: Duration,
    ) -> Poller {
        let seen = Observations::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        for api in apis {
            let (api, seen, stop) = (api.clone(), seen.clone(), stop.clone());
            let selector = selector.to_string();
            runtime.spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    tick.tick().await;
                    let points = api
                        .pod_metrics(NAMESPACE, &selector)
                        .await
                        .map_err(|e| format!("{e:#}"));
                    let o = Observation {
                        at: truth::now_ns(),
                        points,
                    };
                    if let Ok(mut v) = seen.0.lock() {
                        if v.len() < MAX_OBSERVATIONS {
                            v.push((api.source, o));
                        }
                    }
                }
            });
        }
        Poller { seen, stop }
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `items` formatted by `f`, comma-separated (a table cell listing every trial or phase).
pub fn joined<T>(items: impl IntoIterator<Item = T>, f: impl Fn(T) -> String) -> String {
    items.into_iter().map(f).collect::<Vec<_>>().join(", ")
}

/// Nearest-rank percentile of `v` (sorted in place); NaN when empty.
pub fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v = vec![5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(percentile(&mut v, 0.5), 3.0);
        assert_eq!(percentile(&mut v, 0.95), 5.0);
        assert_eq!(percentile(&mut v, 0.0), 1.0);
        assert!(percentile(&mut [], 0.5).is_nan());
    }
}
