//! Simulated agents: N nodes of P pods of C containers each, streaming to the aggregator
//! through the agent's own shipping code ([`kpulse_agent::ship`]), one HTTP/2 stream per
//! node and replica, with a client certificate per node (CN = node name) signed by a CA this
//! tool creates. Used by `cargo xtask bench-ingest` and the end-to-end tests.
//!
//! ```text
//! loadgen --ca-dir DIR --init-only            # writes DIR/ca.crt (give it to the server's
//!                                             # --agent-client-ca-file) and DIR/ca.key
//! loadgen --ca-dir DIR --server 127.0.0.1:8444 --nodes 5000 --pods 110 --containers 2
//! ```
//!
//! Each container's counter advances at its own constant rate (10m to 500m), so every
//! served value is known exactly; each node ticks once per `--resolution` at a random phase.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result};
use clap::Parser;
use kpulse_agent::{
    attribute::PodSet,
    ship::{self, Credentials, Replicas, ShipConfig, ShipMetrics, Shipper, Tick},
};
use kpulse_wire::{
    stream::{PodCounters, PodMeta},
    Bytes, ContainerSample, CpuNanos, NodeSample, UnixNanos,
};
use rcgen::{CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(name = "loadgen", about = "simulated kpulse agents")]
struct Args {
    /// Where the agents' CA lives (created when missing).
    #[arg(long)]
    ca_dir: PathBuf,
    /// Only create the CA, then exit.
    #[arg(long)]
    init_only: bool,
    /// Replica `host:port` (repeat for several).
    #[arg(long)]
    server: Vec<String>,
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
    /// Stop after this many seconds (0: until killed).
    #[arg(long, default_value_t = 0)]
    duration_secs: u64,
    /// Seconds over which the nodes connect (so a benchmark measures steady state, not
    /// 5,000 simultaneous handshakes).
    #[arg(long, default_value_t = 10)]
    ramp_secs: u64,
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
    let ca = Ca::load_or_create(&args.ca_dir)?;
    if args.init_only {
        return Ok(());
    }
    anyhow::ensure!(!args.server.is_empty(), "give at least one --server");
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("runtime")?
        .block_on(run(args, ca))
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

    /// A client certificate for `node` (CN = node name) and its key.
    fn issue(&self, node: &str) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>)> {
        let issuer = Issuer::new(ca_params()?, &self.key);
        let key = KeyPair::generate().context("node key")?;
        let mut params = CertificateParams::new(Vec::<String>::new()).context("params")?;
        params.distinguished_name.push(DnType::CommonName, node);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params
            .signed_by(&key, &issuer)
            .context("node certificate")?;
        Ok((
            cert.der().clone(),
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        ))
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
    /// Nanocores of CPU per container, by pod then container.
    rates: Vec<Vec<u64>>,
    started: UnixNanos,
}

impl Node {
    fn new(name: String, pods: usize, containers: usize) -> Node {
        let uids: Vec<String> = (0..pods).map(|p| format!("{name}-pod-{p}")).collect();
        let set = PodSet::new(uids.iter().enumerate().map(|(p, uid)| PodMeta {
            uid: uid.clone(),
            namespace: format!("ns-{}", p % 10),
            name: format!("{name}-pod-{p}"),
            labels: [("app".to_owned(), format!("app-{}", p % 7))].into(),
        }));
        let rates = (0..pods)
            .map(|p| {
                (0..containers)
                    .map(|c| 10_000_000 * (1 + ((p * 7 + c * 13) % 50) as u64))
                    .collect()
            })
            .collect();
        Node {
            name,
            pods: Arc::new(set),
            uids,
            rates,
            started: now(),
        }
    }

    fn tick(&self) -> Tick {
        let t = now();
        let elapsed = t.0.saturating_sub(self.started.0);
        let counters = self
            .uids
            .iter()
            .zip(&self.rates)
            .map(|(uid, rates)| PodCounters {
                uid: uid.clone(),
                containers: rates
                    .iter()
                    .enumerate()
                    .map(|(c, rate)| ContainerSample {
                        name: format!("c{c}"),
                        timestamp: t,
                        cgroup_id: None,
                        started_at: Some(self.started),
                        cpu: CpuNanos(
                            u64::try_from(u128::from(elapsed) * u128::from(*rate) / 1_000_000_000)
                                .unwrap_or(u64::MAX),
                        ),
                        memory_working_set: Bytes(64 << 20),
                    })
                    .collect(),
            })
            .collect();
        Tick {
            node: NodeSample {
                timestamp: t,
                started_at: Some(self.started),
                cpu: CpuNanos(elapsed),
                memory_working_set: Bytes(8 << 30),
            },
            pods: self.pods.clone(),
            counters,
        }
    }
}

async fn run(args: Args, ca: Ca) -> Result<()> {
    let metrics = Arc::new(ShipMetrics::default());
    let resolution = Duration::from_millis(args.resolution_ms.max(100));
    let ramp = Duration::from_secs(args.ramp_secs);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..args.nodes {
        let name = format!("{}{i}", args.node_prefix);
        let (cert, key) = ca.issue(&name)?;
        // Any server certificate: the benchmark's server is on loopback with a self-signed
        // certificate; what is measured is the ingest, not server authentication.
        let tls =
            ship::tls::client_config_from(ship::tls::Trust::AnyServer, Some((vec![cert], key)))
                .context("client certificate")?;
        let mut config = ShipConfig::new(Replicas::Static(args.server.clone()), tls);
        config.credentials = Credentials::None;
        config.server_name = Some("localhost".to_owned());
        config.metrics = metrics.clone();
        let node = Node::new(name.clone(), args.pods, args.containers);
        let start_after = ramp.mul_f64(i as f64 / args.nodes.max(1) as f64);
        tasks.spawn(async move {
            tokio::time::sleep(start_after).await;
            let shipper = Shipper::spawn(config, ship::hello(&node.name, "kpulse loadgen"));
            let phase = resolution.mul_f64(fastrand::f64());
            tokio::time::sleep(phase).await;
            let mut ticks = tokio::time::interval(resolution);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                shipper.publish(node.tick());
            }
        });
    }
    eprintln!(
        "loadgen: {} nodes × {} pods × {} containers → {:?}",
        args.nodes, args.pods, args.containers, args.server
    );
    let report = {
        let metrics = metrics.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                eprintln!("loadgen: streams up {}", metrics.streams_up());
            }
        }
    };
    tokio::select! {
        _ = report => {}
        _ = async {
            if args.duration_secs == 0 {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_secs(args.duration_secs)).await;
        } => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tasks.abort_all();
    Ok(())
}
