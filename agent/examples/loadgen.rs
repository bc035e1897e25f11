//! Simulated agents: N nodes of P pods of C containers each, streaming to the aggregator
//! through the agent's own shipping code ([`kpulse_agent::ship`]), one HTTP/2 stream per
//! node and replica, with a client certificate per node (CN = node name) signed by a CA this
//! tool creates. Used by `cargo xtask bench-ingest`, `cargo xtask soak`, `cargo xtask
//! bench-restart` and the end-to-end tests.
//!
//! ```text
//! loadgen --ca-dir DIR --init-only            # writes DIR/ca.crt (give it to the server's
//!                                             # --agent-client-ca-file and --client-ca-file),
//!                                             # DIR/ca.key, and DIR/client.{crt,key}: a user
//!                                             # certificate for reading the API and /metrics
//! loadgen --ca-dir DIR --server 127.0.0.1:8444 --nodes 5000 --pods 110 --containers 2
//! loadgen --ca-dir DIR --read-api 127.0.0.1:10250 --reads-per-sec 50 --nodes 5000 ...
//! loadgen --ca-dir DIR --read-api 127.0.0.1:10250 --wait-complete --nodes 5000 ...
//! loadgen --ca-dir DIR --fleet FILE --server 10.244.0.7:8444 --server 10.244.0.8:8444
//! loadgen --ca-dir DIR --fleet FILE --server … --apiserver https://10.244.0.1:6443 \
//!         --apiserver-ca ca.crt                # and each node's pod watch, as the agent's
//! ```
//!
//! With `--fleet` (a file `cargo xtask cluster fleet --agents-file` writes) the agents are
//! those of a cluster's real Nodes and Pods: each authenticates with a token of the agent's
//! ServiceAccount bound to its node's agent pod, as a real agent does, and reports that
//! node's real pods.
//!
//! Each container's counter advances at its own constant rate (10m to 500m), so every
//! served value is known exactly ([`sim`]); each node ticks once per `--resolution` at a
//! random phase.
//!
//! **Counted end to end.** At the end (`--duration-secs`, SIGTERM or SIGINT) the agents stop
//! ticking, wait until every tick is written to a stream or dropped from a queue (at most
//! [`DRAIN_LIMIT`]), end their streams cleanly (the server has then stored everything it
//! received), and print one JSON line on stdout: ticks produced, written to a stream
//! (`sent`), dropped from a queue, never sent (published while no stream was up and
//! replaced by a newer tick before one was), reconnects and stream errors by reason. A
//! server's stored batches (`kpulse_aggregator_ingest_to_visible_seconds_count`) compared
//! with `produced` gives the batches lost.
//!
//! **Reader** (`--read-api`): instead of agents, reads the metrics API and checks every
//! answer ([`read`]); at the end prints a JSON summary on stdout. With `--wait-complete` it
//! polls until every node and pod is served and fresh, prints when, and exits (1 if not
//! within `--timeout-secs`).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result};
use clap::Parser;
use kpulse_agent::{
    attribute::PodSet,
    ship::{self, Credentials, Replicas, ShipConfig, ShipMetrics, Shipper, Tick},
};
use kpulse_wire::{
    stream::{PodCounters, PodMeta},
    Bytes, ContainerSample, CpuNanos, Fraction, NodeSample, Signals, UnixNanos,
};
use rcgen::{CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;
use tokio::sync::watch;

#[path = "loadgen/read.rs"]
mod read;
#[path = "loadgen/sim.rs"]
mod sim;

use sim::Sim;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Longest wait, once ticking stopped, for the queued ticks to be written.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);
/// Once ticking stopped, a node whose counts did not move for this long is drained.
const DRAIN_QUIET: Duration = Duration::from_millis(500);
/// Longest wait for a node's streams to end cleanly.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Every second, at INFO, this and a JSON object of the agents' counts so far: streams up,
/// reconnects, stream errors by reason.
const COUNTS_LINE: &str = "loadgen counts";
/// The CN of `client.crt` (a user of the API, for readers and /metrics scrapes).
const READER_USER: &str = "kpulse-loadgen-reader";

#[derive(Parser, Debug)]
#[command(
    name = "loadgen",
    about = "simulated kpulse agents, or a checking reader"
)]
struct Args {
    /// Where the agents' CA lives (created when missing).
    #[arg(long)]
    ca_dir: PathBuf,
    /// Only create the CA and the reader's certificate, then exit.
    #[arg(long)]
    init_only: bool,
    /// Replica `host:port` (repeat for several).
    #[arg(long)]
    server: Vec<String>,
    /// Agents: each node streams to one `--server`, node i to the (i mod n)th, instead of to
    /// every one: one replica reached at several of its addresses (127.0.0.1, 127.0.0.2, …
    /// of loopback), so that more streams reach it than one destination address has
    /// ephemeral ports for (about 28,000).
    #[arg(long, conflicts_with = "read_api")]
    spread: bool,
    /// Nodes simulated.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Pods per node.
    #[arg(long, default_value_t = 110)]
    pods: usize,
    /// Containers per pod.
    #[arg(long, default_value_t = 2)]
    containers: usize,
    /// Node names are `<prefix><index>`.
    #[arg(long, default_value = "sim-")]
    node_prefix: String,
    /// Tick interval in milliseconds.
    #[arg(long, default_value_t = 1000)]
    resolution_ms: u64,
    /// Stop after this many seconds (0: until SIGTERM or SIGINT).
    #[arg(long, default_value_t = 0)]
    duration_secs: u64,
    /// Seconds over which the nodes connect (so a benchmark measures steady state, not
    /// 5,000 simultaneous handshakes).
    #[arg(long, default_value_t = 10)]
    ramp_secs: u64,
    /// Be a reader of the metrics API at this `host:port` instead of agents.
    #[arg(long)]
    read_api: Option<String>,
    /// Reader: reads per second.
    #[arg(long, default_value_t = 50.0)]
    reads_per_sec: f64,
    /// Reader: the oldest served timestamp that counts as fresh, in seconds before the
    /// request was sent (the answer's own time is its latency).
    #[arg(long, default_value_t = 5)]
    max_age_secs: u64,
    /// Agents: also send pressure and throttling (protocol 1.2, as `kpulse-agent run
    /// --custom-metrics` does) for every pod and container.
    #[arg(long)]
    custom_metrics: bool,
    /// Reader: poll until every node and pod is served, print when, and exit.
    #[arg(long, requires = "read_api")]
    wait_complete: bool,
    /// Reader with --wait-complete: give up after this many seconds (exit 1).
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
    /// Agents: stream as the nodes this file names instead of simulated ones (`cargo xtask
    /// cluster fleet --agents-file` writes it): each node's name, a bearer token of the
    /// agent's ServiceAccount bound to its agent pod (reviewed by the server's TokenReview,
    /// as a real agent's), and its real pods (uid, namespace, name, labels, containers).
    /// `--nodes`, `--pods` and `--containers` are then the file's.
    #[arg(long, conflicts_with_all = ["read_api", "nodes", "pods", "containers", "node_prefix"])]
    fleet: Option<PathBuf>,
    /// Agents of a `--fleet`: also watch each node's pods at this kube-apiserver
    /// (`https://host:port`), as the agent does (a watch of the pods whose `spec.nodeName`
    /// is its node, with the node's kube-apiserver token), so that kube-apiserver bears what
    /// the fleet's agents would cost it.
    #[arg(long, requires_all = ["fleet", "apiserver_ca"])]
    apiserver: Option<String>,
    /// The CA of `--apiserver`'s serving certificate (PEM).
    #[arg(long, requires = "apiserver")]
    apiserver_ca: Option<PathBuf>,
    /// Agents of a `--fleet`: only the file's nodes `I`, `I + N`, `I + 2N`, … (`I/N`), so
    /// that `N` processes, each within its own open-file limit, stream as one fleet
    /// together.
    #[arg(long, requires = "fleet", value_parser = parse_shard)]
    shard: Option<Shard>,
}

/// `--shard I/N`: this process's part of a fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shard {
    index: usize,
    count: usize,
}

impl Shard {
    fn keeps(self, i: usize) -> bool {
        i % self.count == self.index
    }
}

fn parse_shard(s: &str) -> Result<Shard, String> {
    let (i, n) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}` is not I/N"))?;
    let number = |x: &str| {
        x.trim()
            .parse::<usize>()
            .map_err(|e| format!("`{x}` in `{s}`: {e}"))
    };
    let (index, count) = (number(i)?, number(n)?);
    if index >= count {
        return Err(format!("`{s}`: I must be below N"));
    }
    Ok(Shard { index, count })
}

fn main() -> Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    // Thousands of streams: as many sockets as the hard limit allows, as the server does.
    kpulse_process::limits::raise_open_files().context("open-file limit")?;
    let ca = Ca::load_or_create(&args.ca_dir)?;
    if args.init_only {
        return ca.write_user(&args.ca_dir, READER_USER);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("runtime")?;
    let complete = rt.block_on(async {
        let stop = stop_on_signal_or(args.duration_secs)?;
        if args.read_api.is_some() {
            reader(&args, &ca, stop).await
        } else {
            anyhow::ensure!(!args.server.is_empty(), "give at least one --server");
            agents(&args, &ca, stop).await.map(|()| true)
        }
    })?;
    anyhow::ensure!(complete, "not complete within --timeout-secs");
    Ok(())
}

/// A flag turning true on SIGTERM, SIGINT, or after `duration_secs` (0: never).
fn stop_on_signal_or(duration_secs: u64) -> Result<watch::Receiver<bool>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let limit = async {
            if duration_secs == 0 {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_secs(duration_secs)).await;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            () = limit => {}
        }
        let _ = tx.send(true);
    });
    Ok(rx)
}

struct Ca {
    key: KeyPair,
}

/// The CA's parameters: the same every time, so that a CA loaded from disk (its key) issues
/// certificates that chain to the certificate written when it was created.
fn ca_params() -> Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new()).context("CA params")?;
    params
        .distinguished_name
        .push(DnType::CommonName, "kpulse simulated agents CA");
    params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    Ok(params)
}

impl Ca {
    fn load_or_create(dir: &Path) -> Result<Ca> {
        let (cert_path, key_path) = (dir.join("ca.crt"), dir.join("ca.key"));
        if cert_path.exists() && key_path.exists() {
            let key_pem = std::fs::read_to_string(&key_path)
                .with_context(|| format!("reading {}", key_path.display()))?;
            let key = KeyPair::from_pem(&key_pem).context("CA key")?;
            return Ok(Ca { key });
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let key = KeyPair::generate().context("CA key")?;
        let cert = ca_params()?.self_signed(&key).context("CA certificate")?;
        std::fs::write(&cert_path, cert.pem())
            .with_context(|| format!("writing {}", cert_path.display()))?;
        std::fs::write(&key_path, key.serialize_pem())
            .with_context(|| format!("writing {}", key_path.display()))?;
        Ok(Ca { key })
    }

    /// A client certificate with CN `name` and its key.
    fn certificate(&self, name: &str) -> Result<(rcgen::Certificate, KeyPair)> {
        let issuer = Issuer::new(ca_params()?, &self.key);
        let key = KeyPair::generate().context("client key")?;
        let mut params = CertificateParams::new(Vec::<String>::new()).context("params")?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params
            .signed_by(&key, &issuer)
            .context("client certificate")?;
        Ok((cert, key))
    }

    /// A client certificate for `name` (a node: CN = node name; or a user), in memory.
    fn issue(&self, name: &str) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>)> {
        let (cert, key) = self.certificate(name)?;
        Ok((
            cert.der().clone(),
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        ))
    }

    /// Writes `dir/client.crt` and `dir/client.key` for the user `name` (curl, readers).
    fn write_user(&self, dir: &Path, name: &str) -> Result<()> {
        let (cert, key) = self.certificate(name)?;
        for (file, pem) in [
            ("client.crt", cert.pem()),
            ("client.key", key.serialize_pem()),
        ] {
            let path = dir.join(file);
            std::fs::write(&path, pem).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }
}

fn now() -> UnixNanos {
    UnixNanos::from_system_time(SystemTime::now())
}

/// One simulated node: its pods and per-container rates.
struct Node {
    name: String,
    pods: Arc<PodSet>,
    uids: Vec<String>,
    /// Container names, by pod.
    containers: Vec<Vec<String>>,
    /// Nanocores of CPU per container, by pod then container.
    rates: Vec<Vec<u64>>,
    started: UnixNanos,
    /// Send pressure and throttling.
    signals: bool,
}

impl Node {
    fn new(name: String, pods: usize, containers: usize, signals: bool) -> Node {
        let uids: Vec<String> = (0..pods).map(|p| Sim::pod_name(&name, p)).collect();
        let set = PodSet::new(uids.iter().enumerate().map(|(p, uid)| PodMeta {
            uid: uid.clone(),
            namespace: Sim::namespace(p),
            name: uid.clone(),
            labels: [("app".to_owned(), Sim::app(p))].into(),
            ready_since: None,
        }));
        let rates = (0..pods)
            .map(|p| (0..containers).map(|c| Sim::rate(p, c)).collect())
            .collect();
        Node {
            name,
            pods: Arc::new(set),
            uids,
            containers: vec![(0..containers).map(Sim::container).collect(); pods],
            rates,
            started: now(),
            signals,
        }
    }

    /// A node of a `--fleet` file: its pods as they are in the cluster, each container at
    /// [`Sim::rate`] of its place.
    fn from_fleet(node: FleetNode, signals: bool) -> Node {
        let set = PodSet::new(node.pods.iter().map(|p| PodMeta {
            uid: p.uid.clone(),
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            labels: p.labels.clone(),
            ready_since: None,
        }));
        let rates = node
            .pods
            .iter()
            .enumerate()
            .map(|(i, p)| (0..p.containers.len()).map(|c| Sim::rate(i, c)).collect())
            .collect();
        Node {
            name: node.name,
            pods: Arc::new(set),
            uids: node.pods.iter().map(|p| p.uid.clone()).collect(),
            containers: node.pods.into_iter().map(|p| p.containers).collect(),
            rates,
            started: now(),
            signals,
        }
    }

    /// What an agent with `--custom-metrics` sends for a cgroup: every figure, over its
    /// 30 s window, varying with the container's rate (all three, as a pod with PSI and a
    /// quota has).
    fn signals(&self, rate: u64) -> Option<Signals> {
        let share = |ppm: u64| {
            Some(Fraction {
                ppm: u32::try_from(ppm % u64::from(Fraction::WHOLE)).unwrap_or(0),
                window_ms: 30_017,
            })
        };
        self.signals.then(|| Signals {
            cpu_pressure: share(rate / 997),
            memory_pressure: share(rate / 9_973),
            cpu_throttled: share(rate / 331),
        })
    }

    fn tick(&self) -> Tick {
        let t = now();
        let elapsed = t.0.saturating_sub(self.started.0);
        let counters = self
            .uids
            .iter()
            .zip(&self.rates)
            .zip(&self.containers)
            .map(|((uid, rates), names)| PodCounters {
                uid: uid.clone(),
                containers: rates
                    .iter()
                    .zip(names)
                    .map(|(rate, name)| ContainerSample {
                        name: name.clone(),
                        timestamp: t,
                        cgroup_id: None,
                        started_at: Some(self.started),
                        cpu: CpuNanos(
                            u64::try_from(u128::from(elapsed) * u128::from(*rate) / 1_000_000_000)
                                .unwrap_or(u64::MAX),
                        ),
                        memory_working_set: Bytes(sim::CONTAINER_MEMORY),
                        swap: None,
                        signals: self.signals(*rate),
                    })
                    .collect(),
                signals: self.signals(rates.iter().sum()),
            })
            .collect();
        Tick {
            node: NodeSample {
                timestamp: t,
                started_at: Some(self.started),
                // One core: the node's counter is the time since it started.
                cpu: CpuNanos(
                    u64::try_from(
                        u128::from(elapsed) * u128::from(sim::NODE_NANOCORES) / 1_000_000_000,
                    )
                    .unwrap_or(u64::MAX),
                ),
                memory_working_set: Bytes(sim::NODE_MEMORY),
                swap: None,
            },
            pods: self.pods.clone(),
            counters,
        }
    }
}

/// A client certificate chain and its key.
type ClientCert = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// A node of a `--fleet` file.
struct FleetNode {
    name: String,
    token: String,
    /// A token of the same agent pod for kube-apiserver (the pod watch).
    api_token: Option<String>,
    pods: Vec<FleetPod>,
}

struct FleetPod {
    uid: String,
    namespace: String,
    name: String,
    labels: BTreeMap<String, String>,
    containers: Vec<String>,
}

/// Reads a `--fleet` file: `{"nodes": [{"name", "token", "pods": [{"uid", "namespace",
/// "name", "labels": {…}, "containers": […]}]}]}`.
fn read_fleet(path: &Path) -> Result<Vec<FleetNode>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    let s = |v: &serde_json::Value, k: &str| -> Result<String> {
        v.get(k)
            .and_then(|x| x.as_str())
            .map(str::to_owned)
            .with_context(|| format!("{}: a `{k}` is missing", path.display()))
    };
    let list = |v: &serde_json::Value, k: &str| -> Result<Vec<serde_json::Value>> {
        v.get(k)
            .and_then(|x| x.as_array())
            .cloned()
            .with_context(|| format!("{}: `{k}` is not a list", path.display()))
    };
    list(&doc, "nodes")?
        .iter()
        .map(|n| {
            let pods = list(n, "pods")?
                .iter()
                .map(|p| {
                    let labels = p
                        .get("labels")
                        .and_then(|l| l.as_object())
                        .map(|l| {
                            l.iter()
                                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                                .collect()
                        })
                        .unwrap_or_default();
                    let containers = list(p, "containers")?
                        .iter()
                        .map(|c| c.as_str().map(str::to_owned))
                        .collect::<Option<Vec<_>>>()
                        .with_context(|| {
                            format!("{}: a container is not a name", path.display())
                        })?;
                    Ok(FleetPod {
                        uid: s(p, "uid")?,
                        namespace: s(p, "namespace")?,
                        name: s(p, "name")?,
                        labels,
                        containers,
                    })
                })
                .collect::<Result<_>>()?;
            Ok(FleetNode {
                name: s(n, "name")?,
                token: s(n, "token")?,
                api_token: n
                    .get("api_token")
                    .and_then(|t| t.as_str())
                    .map(str::to_owned),
                pods,
            })
        })
        .collect()
}

/// What one node did, at the end.
#[derive(Default)]
struct NodeCounts {
    produced: u64,
    sent: u64,
    dropped: u64,
    reconnects: u64,
    errors: BTreeMap<&'static str, u64>,
    /// The queue had not drained within [`DRAIN_LIMIT`].
    drain_timeout: bool,
}

/// Ticks written or dropped so far, over the replicas.
fn written(metrics: &ShipMetrics, replicas: &[String]) -> u64 {
    replicas
        .iter()
        .map(|r| metrics.sent(r) + metrics.dropped(r))
        .sum()
}

async fn agents(args: &Args, ca: &Ca, stop: watch::Receiver<bool>) -> Result<()> {
    let resolution = Duration::from_millis(args.resolution_ms.max(100));
    let ramp = Duration::from_secs(args.ramp_secs);
    let replicas = args.server.clone();
    let produced_total = Arc::new(AtomicU64::new(0));
    // Each node with its credentials: a client certificate of this tool's CA (CN = the
    // node), or with --fleet the bearer token of the node's agent pod.
    // With --apiserver, each fleet node's own client of kube-apiserver for its pod watch.
    let apiserver_ca: Option<Vec<Vec<u8>>> = match &args.apiserver_ca {
        Some(path) => Some(
            kpulse_process::pem::certificates(path)
                .with_context(|| format!("--apiserver-ca {}", path.display()))?
                .into_iter()
                .map(|c| c.to_vec())
                .collect(),
        ),
        None => None,
    };
    let nodes: Vec<(Node, Credentials, Option<ClientCert>, Option<kube::Client>)> =
        match &args.fleet {
            Some(path) => read_fleet(path)?
                .into_iter()
                .enumerate()
                .filter(|(i, _)| args.shard.is_none_or(|s| s.keeps(*i)))
                .map(|(_, n)| {
                    let token = Credentials::Token(n.token.as_str().into());
                    let watch = match (&args.apiserver, &apiserver_ca) {
                        (Some(url), Some(ca)) => {
                            let api_token = n.api_token.as_deref().with_context(|| {
                                format!(
                                    "{}: node {} has no api_token (made by an older `cluster \
                                 fleet`): make the file again",
                                    path.display(),
                                    n.name
                                )
                            })?;
                            Some(apiserver_client(url, ca, api_token)?)
                        }
                        _ => None,
                    };
                    Ok((Node::from_fleet(n, args.custom_metrics), token, None, watch))
                })
                .collect::<Result<_>>()?,
            None => (0..args.nodes)
                .map(|i| {
                    let name = format!("{}{i}", args.node_prefix);
                    let cert = ca.issue(&name)?;
                    let node = Node::new(name, args.pods, args.containers, args.custom_metrics);
                    Ok((node, Credentials::None, Some((vec![cert.0], cert.1)), None))
                })
                .collect::<Result<_>>()?,
        };
    let node_count = nodes.len();
    let pod_count: usize = nodes.iter().map(|(n, _, _, _)| n.uids.len()).sum();
    let watches = Arc::new(WatchCounts::default());
    let mut all_metrics = Vec::with_capacity(node_count);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (node, credentials, cert, pod_watch)) in nodes.into_iter().enumerate() {
        // Any server certificate: the benchmark's server is on loopback with a self-signed
        // certificate (or, with --fleet, reached at a pod address its certificate does not
        // name); what is measured is the ingest, not server authentication.
        let tls = ship::tls::client_config_from(ship::tls::Trust::AnyServer, cert)
            .context("client TLS")?;
        let replicas = if args.spread {
            vec![replicas[i % replicas.len()].clone()]
        } else {
            replicas.clone()
        };
        let mut config = ShipConfig::new(Replicas::Static(replicas.clone()), tls);
        config.credentials = credentials;
        config.server_name = Some("localhost".to_owned());
        // One set of counters per node: the end-to-end count is per node.
        let metrics = Arc::new(ShipMetrics::default());
        config.metrics = metrics.clone();
        all_metrics.push(metrics.clone());
        let start_after = ramp.mul_f64(i as f64 / node_count.max(1) as f64);
        let (mut stop, total) = (stop.clone(), produced_total.clone());
        let watches = watches.clone();
        tasks.spawn(async move {
            let mut counts = NodeCounts::default();
            tokio::select! {
                () = tokio::time::sleep(start_after) => {}
                _ = stop.wait_for(|s| *s) => return counts,
            }
            let watch = pod_watch.map(|client| {
                tokio::spawn(watch_pods(client, node.name.clone(), stop.clone(), watches))
            });
            let shipper = Shipper::spawn(config, ship::hello(&node.name, "kpulse loadgen"));
            let phase = resolution.mul_f64(fastrand::f64());
            let mut ticks =
                tokio::time::interval_at(tokio::time::Instant::now() + phase, resolution);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    _ = stop.wait_for(|s| *s) => break,
                    _ = ticks.tick() => {
                        shipper.publish(node.tick());
                        counts.produced += 1;
                        total.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            // Drain: every tick written or dropped, or nothing moving any more.
            let target = counts.produced * replicas.len() as u64;
            let deadline = Instant::now() + DRAIN_LIMIT;
            let (mut last, mut since) = (written(&metrics, &replicas), Instant::now());
            while last < target && Instant::now() < deadline && since.elapsed() < DRAIN_QUIET {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let now = written(&metrics, &replicas);
                if now != last {
                    (last, since) = (now, Instant::now());
                }
            }
            counts.drain_timeout = last < target && Instant::now() >= deadline;
            shipper.shutdown(SHUTDOWN_GRACE).await;
            if let Some(watch) = watch {
                // It ends with the stop flag.
                let _ = watch.await;
            }
            for r in &replicas {
                counts.sent += metrics.sent(r);
                counts.dropped += metrics.dropped(r);
                counts.reconnects += metrics.reconnects(r);
                for (reason, n) in metrics.stream_errors(r) {
                    *counts.errors.entry(reason).or_default() += n;
                }
            }
            counts
        });
    }
    eprintln!(
        "loadgen: {node_count} nodes, {pod_count} pods → {:?}",
        args.server
    );
    let report = async {
        for second in 1u64.. {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let up: i64 = all_metrics.iter().map(|m| m.streams_up()).sum();
            let produced = produced_total.load(Ordering::Relaxed);
            if second % 5 == 0 {
                eprintln!("loadgen: streams up {up}, ticks produced {produced}");
            }
            // The counts so far, timestamped by the log line: a benchmark takes the
            // difference between two lines (`cargo xtask bench-restart`: one restart's).
            let mut errors: BTreeMap<&'static str, u64> = BTreeMap::new();
            let mut reconnects = 0;
            for m in &all_metrics {
                for r in &replicas {
                    reconnects += m.reconnects(r);
                    for (reason, n) in m.stream_errors(r) {
                        *errors.entry(reason).or_default() += n;
                    }
                }
            }
            tracing::info!(
                "{COUNTS_LINE} {}",
                json!({"streams_up": up, "reconnects": reconnects, "stream_errors": errors})
            );
        }
    };
    let mut stopped = stop.clone();
    tokio::select! {
        () = report => {}
        _ = stopped.wait_for(|s| *s) => {}
    }
    eprintln!("loadgen: stopping: draining the queues and ending the streams");
    let mut total = NodeCounts::default();
    let (mut nodes_unsent, mut drain_timeouts, mut first_unsent) = (0u64, 0u64, Vec::new());
    // Each tick goes to every replica, or with --spread to one.
    let expected_per_tick = if args.spread {
        1
    } else {
        replicas.len() as u64
    };
    while let Some(done) = tasks.join_next().await {
        let c = done.context("a node task failed")?;
        let unsent = (c.produced * expected_per_tick).saturating_sub(c.sent + c.dropped);
        if unsent > 0 {
            nodes_unsent += 1;
            if first_unsent.len() < 10 {
                first_unsent
                    .push(json!({"produced": c.produced, "sent": c.sent, "dropped": c.dropped}));
            }
        }
        drain_timeouts += u64::from(c.drain_timeout);
        total.produced += c.produced;
        total.sent += c.sent;
        total.dropped += c.dropped;
        total.reconnects += c.reconnects;
        for (reason, n) in c.errors {
            *total.errors.entry(reason).or_default() += n;
        }
    }
    let summary = json!({
        "nodes": node_count,
        "pods": pod_count,
        "replicas": replicas.len(),
        "spread": args.spread,
        "produced": total.produced,
        "sent": total.sent,
        "dropped": total.dropped,
        "unsent": (total.produced * expected_per_tick).saturating_sub(total.sent + total.dropped),
        "nodes_with_unsent": nodes_unsent,
        "first_unsent": first_unsent,
        "drain_timeouts": drain_timeouts,
        "reconnects": total.reconnects,
        "stream_errors": total.errors,
        "pod_watch_events": watches.events.load(Ordering::Relaxed),
        "pod_watch_errors": watches.errors.load(Ordering::Relaxed),
    });
    println!("{summary}");
    Ok(())
}

/// The fleet's pod watches, together.
#[derive(Default)]
struct WatchCounts {
    events: AtomicU64,
    errors: AtomicU64,
}

/// A client of kube-apiserver at `url` (trusting `ca`, DER) with the bearer `token`.
fn apiserver_client(url: &str, ca: &[Vec<u8>], token: &str) -> Result<kube::Client> {
    let mut config = kube::Config::new(url.parse().context("--apiserver: not a URL")?);
    config.root_cert = Some(ca.to_vec());
    config.auth_info =
        serde_json::from_value(json!({ "token": token })).context("a bearer token")?;
    config.connect_timeout = Some(Duration::from_secs(30));
    kube::Client::try_from(config).context("a kube-apiserver client")
}

/// What the agent asks of kube-apiserver for its node: a watch of the pods whose
/// `spec.nodeName` is the node, by kube's watcher as `kpulse-agent` runs it (list, then
/// watch, backing off on errors). Its events are counted and dropped; it ends with `stop`.
async fn watch_pods(
    client: kube::Client,
    node: String,
    mut stop: watch::Receiver<bool>,
    counts: Arc<WatchCounts>,
) {
    use futures_util::StreamExt as _;
    use kube::runtime::{watcher, WatchStreamExt as _};
    let api: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            event = events.next() => match event {
                Some(Ok(_)) => counts.events.fetch_add(1, Ordering::Relaxed),
                Some(Err(_)) => counts.errors.fetch_add(1, Ordering::Relaxed),
                None => return,
            },
        };
    }
}

/// The reader mode; `Ok(false)` when `--wait-complete` gave up.
async fn reader(args: &Args, ca: &Ca, stop: watch::Receiver<bool>) -> Result<bool> {
    let api = args.read_api.clone().context("--read-api")?;
    let (cert, key) = ca.issue(READER_USER)?;
    let tls = ship::tls::client_config_from(ship::tls::Trust::AnyServer, Some((vec![cert], key)))
        .context("reader certificate")?;
    let client = Arc::new(read::Client::new(api.clone(), tls));
    let sim = Sim {
        prefix: args.node_prefix.clone(),
        nodes: args.nodes,
        pods: args.pods,
        containers: args.containers,
    };
    let opts = read::Options {
        api,
        reads_per_sec: args.reads_per_sec,
        max_age: Duration::from_secs(args.max_age_secs),
    };
    if args.wait_complete {
        let limit = Duration::from_secs(args.timeout_secs);
        let mut stop = stop;
        let outcome = tokio::select! {
            v = read::wait_complete(&opts, &sim, &client, limit) => v,
            _ = stop.wait_for(|s| *s) => json!({"complete": false, "last": "stopped"}),
        };
        println!("{outcome}");
        return Ok(outcome["complete"] == true);
    }
    eprintln!(
        "reader: {} reads/s against {} ({} nodes × {} pods)",
        opts.reads_per_sec, opts.api, sim.nodes, sim.pods
    );
    let summary = read::run(opts, sim, client, stop).await?;
    println!("{summary}");
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_keeps_every_nth_node_from_its_index() {
        let s = parse_shard("1/3").expect("a shard");
        assert_eq!(s, Shard { index: 1, count: 3 });
        let kept: Vec<usize> = (0..8).filter(|&i| s.keeps(i)).collect();
        assert_eq!(kept, [1, 4, 7]);
        // Every node in exactly one shard of N.
        for i in 0..20 {
            let owners = (0..3)
                .filter(|&k| Shard { index: k, count: 3 }.keeps(i))
                .count();
            assert_eq!(owners, 1, "node {i}");
        }
    }

    #[test]
    fn a_shard_out_of_range_or_malformed_is_refused() {
        for bad in ["3/3", "0/0", "1", "a/2", "1/-2", ""] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
        assert!(parse_shard("0/1").is_ok());
    }
}
