//! `cargo xtask cluster bench-fleet`: what kpulse costs the real control plane with a fleet
//! of kwok nodes, how long a replica takes to be complete again when every agent
//! reconnects, how long `kubectl top` takes through kube-apiserver at that size, and what
//! an HPA in each fleet namespace costs kube-controller-manager.
//!
//! Against a cluster `cluster up --install` made:
//! 1. the fleet ([`fleet::make`]: `--nodes` kwok nodes with `--pods` pods each, the agent's
//!    Pod on each) and its agents file (two tokens per node bound to its agent Pod: one for
//!    kpulse's ingest, one for kube-apiserver), made with kpulse off (the Deployment at 0 and
//!    its APIServices removed: its replicas would scrape every new node's kwok endpoint on
//!    the cores kwok needs);
//! 2. the aggregator-api Deployment patched for a fleet whose agents all connect from this
//!    machine's address (`--max-connections-per-ip`) and with a memory limit for its size
//!    (`--server-memory-limit`); put back at the end, also after a failure, and so are
//!    kpulse's APIServices and FlowSchema ([`saved`]);
//! 3. `--rounds` rounds of two arms, in alternating order (off, on; on, off; …):
//!    - **off**: kpulse as if not installed: the Deployment scaled to 0, no agent
//!      streaming, and its APIServices removed (registered without endpoints they would
//!      make every controller's discovery fail and retry, a cost no cluster without kpulse
//!      bears): kube-apiserver and etcd with the fleet (kwok's Leases and status) alone;
//!    - **on**: the APIServices back, the replicas started again and the fleet's agents
//!      (`loadgen --fleet --apiserver`: each node's stream to every replica with its token,
//!      reviewed by the replicas' TokenReview, and its watch of its node's pods, as the
//!      agent's) until every replica is ready — readyz: every node with a Ready agent Pod is
//!      served, or 60 s have passed — and every fleet node is served from its agent (at
//!      most 60 s more: the steady window must not hold the start's tail), then measured;
//!      then one replica's process is killed (SIGKILL, the kubelet restarts it in the same
//!      Pod) and timed until its readyz answers 200 again;
//!
//!    with `--flowschema-every-other-round`, the "on" arms of rounds 2, 4, … run without
//!    kpulse's FlowSchema for its reviews (its TokenReviews then queue with every other
//!    ServiceAccount's requests, as before deploy/ had it), to show what it changes in the
//!    same run; with `--review-tokens-every-other-round`, they run with
//!    `--agent-token-verification=review` (a TokenReview for every agent's stream, as before
//!    the replicas verified the tokens themselves);
//!
//!    each measured over `--window-secs` after `--settle-secs`: CPU (`utime + stime`) and RSS
//!    of kube-apiserver and etcd (the processes `cluster up` started), kube-apiserver's
//!    requests (`apiserver_request_total`), TokenReviews, requests APF rejected, and watches;
//! 4. **reads**, with kpulse on: `kubectl top node`, `kubectl top pod -A`, `kubectl top pod
//!    -n NS` (the real kubectl, timed as a user sees it), the same lists as JSON through
//!    kube-apiserver (time and bytes, and every fleet node and pod in them), and discovery
//!    of `metrics.k8s.io`, interleaved, `--reads` times each ([`reads`]);
//! 5. **HPAs**, with the same agents: one in each fleet namespace reading kpulse, and
//!    kube-controller-manager's own time for them ([`hpa`]).
//!
//! It prints the tables for docs/benchmarks.md. The fleet stays (another run at the same
//! size reuses it): `cargo xtask cluster fleet --remove` removes it.

use std::{
    collections::BTreeMap,
    fs,
    path::Path,
    process::Command,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use super::{
    check::{container_pid, Ctx, DEPLOYMENT, NAMESPACE, SELECTOR},
    daemons, fleet,
    host::Dirs,
    versions,
};
use crate::harness::{self, Metrics, Stop};

mod agents;
mod hpa;
mod reads;
mod report;
mod saved;

use agents::Agents;
use reads::{Reads, Want};
use saved::Saved;

/// The replicas' HTTPS port (readyz), as deploy/ has it.
const HTTPS_PORT: u16 = 10250;
/// Longest wait for the replicas to start, go, or be ready.
const PHASE_LIMIT: Duration = Duration::from_secs(600);
/// Longest wait, after the replicas are ready, for every fleet node to be served from its
/// agent: then the figure is NaN and the run goes on.
const COMPLETE_LIMIT: Duration = Duration::from_secs(60);
/// Longest wait for a killed replica to be ready again: then the restart is reported as not
/// ready (NaN) and the run goes on.
const RESTART_LIMIT: Duration = Duration::from_secs(300);

/// `cargo xtask cluster bench-fleet` flags.
#[derive(Debug, clap::Args)]
pub struct Options {
    #[command(flatten)]
    shape: fleet::Shape,
    /// Rounds of the two arms (off, on), alternating which goes first.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds each arm is measured over.
    #[arg(long, default_value_t = 60)]
    window_secs: u64,
    /// Seconds after an arm's start (every replica ready, or gone) before it is measured.
    #[arg(long, default_value_t = 30)]
    settle_secs: u64,
    /// Seconds over which the fleet's agents connect when they start.
    #[arg(long, default_value_t = 20)]
    ramp_secs: u64,
    /// Reads of each kind in the reads phase.
    #[arg(long, default_value_t = 20)]
    reads: usize,
    /// Load generator processes the fleet's agents are split over: at least this many,
    /// and as many as their open files need (a stream a node and replica, a pod watch a
    /// node) under the hard open-file limit.
    #[arg(long, default_value_t = 1)]
    agent_processes: usize,
    /// Each agent's tick interval (the agent's `--resolution`), in milliseconds: above
    /// 1,000 to keep thousands of agents within this machine's two cores.
    #[arg(long, default_value_t = 1000)]
    resolution_ms: u64,
    /// The aggregator-api's memory limit during the benchmark (deploy/'s 512Mi holds about
    /// a thousand nodes of 30 pods).
    #[arg(long, default_value = "4Gi")]
    server_memory_limit: String,
    /// aggregator-api replicas in the "on" arms (default: the Deployment's own).
    #[arg(long)]
    replicas: Option<u64>,
    /// Take kpulse's FlowSchema for its reviews (deploy/base/flowcontrol.yaml) away in the
    /// "on" arm of every second round (rounds 2, 4, …), to compare starts and restarts with
    /// and without it in one run, alternating.
    #[arg(long, conflicts_with = "review_tokens_every_other_round")]
    flowschema_every_other_round: bool,
    /// Have the replicas review every agent's token (`--agent-token-verification=review`)
    /// in the "on" arm of every second round (rounds 2, 4, …), and verify them themselves
    /// (`local`, the default) in the others: starts and restarts with and without the
    /// TokenReviews, in one run, alternating.
    #[arg(long)]
    review_tokens_every_other_round: bool,
    /// Use the release binaries as they are.
    #[arg(long)]
    no_build: bool,
}

pub fn run(opts: &Options, dirs: &Dirs, kubectl: &Path, release: &versions::Release) -> Result<()> {
    ensure!(
        opts.rounds >= 2 && opts.window_secs > 0 && opts.reads > 0,
        "--rounds must be at least 2 (an interval needs two pairs); --window-secs and --reads \
         positive"
    );
    ensure!(
        opts.agent_processes > 0 && opts.resolution_ms >= 100,
        "--agent-processes must be positive and --resolution-ms at least 100"
    );
    harness::require_curl("bench-fleet")?;
    let bins = harness::release_binaries(opts.no_build)?;
    let scratch = harness::Scratch::new("bench-fleet")?;
    let stop = Stop::install()?;
    let agents_file = scratch.dir.join("agents.json");
    let ctx = Ctx::new(dirs, kubectl.to_path_buf());
    let bench = Bench {
        opts,
        ctx: &ctx,
        loadgen: &bins.loadgen,
        dir: &scratch.dir,
        agents_file: &agents_file,
        stop: &stop,
    };
    let saved = bench.saved()?;
    // kpulse off while the fleet is made: its replicas would scrape every new node's
    // kubelet (kwok), whose agent is silent, on the two cores kwok needs to mark the
    // fleet's pods Running (and its APIServices without endpoints would have every
    // controller retry their discovery). Put back whenever this was tried: a failed
    // rollout or a stop leaves the patch applied.
    let result = bench
        .scale(0)
        .and_then(|()| bench.remove_apiservices(&saved))
        .and_then(|()| {
            let rt = fleet::runtime()?;
            let client = rt.block_on(fleet::client(&dirs.kubeconfig()))?;
            fleet::make(&opts.shape, Some(&agents_file), dirs, release, &rt, &client)
        })
        .and_then(|()| bench.patch_deployment(&saved))
        .and_then(|()| bench.measure(&saved));
    let restored = bench.restore(&saved);
    match (result, restored) {
        (Ok(report), restored) => {
            println!("{report}");
            println!(
                "bench-fleet: the fleet stays; `cargo xtask cluster fleet --remove` removes it"
            );
            restored
        }
        (Err(e), restored) => {
            scratch.keep();
            if let Err(r) = restored {
                eprintln!("bench-fleet: {r:#}");
            }
            Err(e)
        }
    }
}

struct Bench<'a> {
    opts: &'a Options,
    ctx: &'a Ctx<'a>,
    loadgen: &'a Path,
    dir: &'a Path,
    agents_file: &'a Path,
    stop: &'a Stop,
}

/// One arm's window: the control plane's CPU (cores), RSS (MiB) and requests.
#[derive(Clone, Copy, Debug, Default)]
struct Cost {
    apiserver_cores: f64,
    etcd_cores: f64,
    apiserver_rss: f64,
    etcd_rss: f64,
    requests_per_sec: f64,
    watches: f64,
}

/// What one "on" arm saw besides its cost.
#[derive(Debug, Default)]
struct OnArm {
    /// Whether kpulse's FlowSchema was in the cluster (`--flowschema-every-other-round`
    /// takes it away in every second round).
    flowschema: bool,
    /// How the replicas verified the agents' tokens (`--review-tokens-every-other-round`
    /// has them review every one in every second round): `local` or `review`.
    verification: &'static str,
    /// From starting the agents to every replica ready.
    start_to_ready: f64,
    /// From starting the agents to every fleet node served from its agent on every replica
    /// (NaN: not within [`COMPLETE_LIMIT`] after ready).
    start_to_agents: f64,
    start_tokenreviews: f64,
    start_rejected: f64,
    restart: Restart,
    summary: Value,
}

#[derive(Debug, Default)]
struct Restart {
    /// From the kill to the new process' first answer, to its readyz 200, and to every
    /// fleet node served from its agent on every replica (NaN: not within 60 s more).
    kill_to_answer: f64,
    kill_to_ready: f64,
    kill_to_agents: f64,
    tokenreviews: f64,
    rejected: f64,
    apiserver_cores: f64,
    /// The restarted process's own account: its local token checks by outcome, and the
    /// seconds from its first log line to its first list of Nodes, of the agent pods, and
    /// to its agents' port's opening (from its log; NaN where the log lacks the line).
    restarted: Restarted,
    /// The load generators' account: seconds from the kill until they had as many streams
    /// up as before it (NaN: not counted), and their stream errors by reason meanwhile.
    agents_back: f64,
    agent_errors: BTreeMap<String, u64>,
    /// SYNs the kernel dropped at the replica pod's listening sockets (its network
    /// namespace's `TcpExt ListenDrops`: both ports, retransmissions counted; nearly all an
    /// accept queue full), from the kill to the end of the restart, the killed process's
    /// exit included (its listening sockets stay open, accepting nothing, until its memory
    /// is released); `None`: unread.
    listen_drops: Option<u64>,
    /// Times the kubelet started the replica's container from the kill to the end of the
    /// restart: 1, or more when the new process was itself killed (a failed probe, the
    /// memory limit) before the restart was over.
    starts: Option<u64>,
}

/// What the restarted replica's process says of its start ([`Restart::restarted`]).
#[derive(Debug, Default)]
struct Restarted {
    local_checks: Vec<(String, f64)>,
    nodes_listed: f64,
    agent_pods_listed: f64,
    port_opened: f64,
    /// Its network namespace's `TcpExt ListenDrops` so far (the pod's, over its processes).
    listen_drops: Option<u64>,
}

/// The control plane's counters at one moment.
struct Sample {
    at: Instant,
    apiserver_cpu: f64,
    etcd_cpu: f64,
    metrics: Metrics,
}

impl Bench<'_> {
    fn kubectl(&self, args: &[&str]) -> Result<String> {
        crate::exec::output(self.ctx.kubectl().args(args))
    }

    fn pid(&self, name: &str) -> Result<u32> {
        let path = self.ctx.dirs.state.join(format!("{name}.pid"));
        fs::read_to_string(&path)
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .with_context(|| format!("{name} is not running (no {})", path.display()))
    }

    fn sample(&self) -> Result<Sample> {
        let text = self.kubectl(&["get", "--raw", "/metrics"])?;
        Ok(Sample {
            at: Instant::now(),
            apiserver_cpu: harness::cpu_seconds(self.pid("kube-apiserver")?)?,
            etcd_cpu: harness::cpu_seconds(self.pid("etcd")?)?,
            metrics: harness::parse_metrics(&text),
        })
    }

    fn cost(&self, a: &Sample, b: &Sample) -> Result<Cost> {
        let secs = b.at.duration_since(a.at).as_secs_f64();
        let requests = |m: &Metrics| harness::sum(m, "apiserver_request_total", |_| true);
        Ok(Cost {
            apiserver_cores: (b.apiserver_cpu - a.apiserver_cpu) / secs,
            etcd_cores: (b.etcd_cpu - a.etcd_cpu) / secs,
            apiserver_rss: harness::rss_mib(self.pid("kube-apiserver")?)?.0,
            etcd_rss: harness::rss_mib(self.pid("etcd")?)?.0,
            requests_per_sec: (requests(&b.metrics) - requests(&a.metrics)) / secs,
            watches: harness::sum(&b.metrics, "apiserver_longrunning_requests", |l| {
                l.contains("verb=\"WATCH\"")
            }),
        })
    }

    /// Waits for the rollout. The replicas are ready only once the fleet's agents stream to
    /// them (or 60 s after they start), so without agents this waits that long.
    fn rollout(&self) -> Result<()> {
        self.kubectl(&[
            "-n",
            NAMESPACE,
            "rollout",
            "status",
            DEPLOYMENT,
            "--timeout=600s",
            // The watch outlives a request's timeout; `--timeout` bounds it.
            "--request-timeout=0",
        ])
        .map(drop)
    }

    fn scale(&self, replicas: u64) -> Result<()> {
        self.kubectl(&[
            "-n",
            NAMESPACE,
            "scale",
            DEPLOYMENT,
            &format!("--replicas={replicas}"),
        ])
        .map(drop)
    }

    /// The replicas' pods (not being deleted): name, IP (if any), Ready, container ID.
    fn replicas(&self) -> Result<Vec<Replica>> {
        let pods = self
            .ctx
            .json(&["-n", NAMESPACE, "get", "pods", "-l", SELECTOR])?;
        Ok(pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .map(|p| Replica {
                name: p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                ip: p["status"]["podIP"].as_str().map(str::to_owned),
                ready: p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True"),
                container: p["status"]["containerStatuses"][0]["containerID"]
                    .as_str()
                    .and_then(|id| id.strip_prefix("containerd://"))
                    .map(str::to_owned),
                restarts: p["status"]["containerStatuses"][0]["restartCount"].as_u64(),
            })
            .collect())
    }

    /// Polls `done` on the replicas every 200 ms, at most [`PHASE_LIMIT`].
    fn wait_replicas(&self, what: &str, done: impl Fn(&[Replica]) -> bool) -> Result<Vec<Replica>> {
        let deadline = Instant::now() + PHASE_LIMIT;
        loop {
            self.stop.check()?;
            let replicas = self.replicas()?;
            if done(&replicas) {
                return Ok(replicas);
            }
            ensure!(
                Instant::now() < deadline,
                "the aggregator-api replicas not {what} after {PHASE_LIMIT:?}: {replicas:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The fewest fleet nodes any replica serves from their agents
    /// (`kpulse_aggregator_node_source{source="agent"}`); none while a replica's metrics
    /// cannot be read (a replica busy with thousands of reconnecting agents may not answer
    /// within the scrape's 5 s).
    fn fewest_from_agents(&self) -> Result<usize> {
        let prefix = format!(
            "kpulse_aggregator_node_source{{node=\"{}",
            fleet::NODE_PREFIX
        );
        let Ok(texts) = super::check::server_metrics(self.ctx) else {
            return Ok(0);
        };
        Ok(texts
            .iter()
            .map(|t| {
                t.lines()
                    .filter(|l| l.starts_with(&prefix) && l.contains("source=\"agent\""))
                    .count()
            })
            .min()
            .unwrap_or(0))
    }

    /// Waits until every fleet node is served from its agent on every replica, at most
    /// `limit`; how long that took, or `None` when it did not happen in time.
    fn wait_from_agents(&self, limit: Duration) -> Result<Option<Duration>> {
        let started = Instant::now();
        loop {
            self.stop.check()?;
            if self.fewest_from_agents()? >= self.opts.shape.nodes {
                return Ok(Some(started.elapsed()));
            }
            if started.elapsed() >= limit {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn measure(&self, saved: &Saved) -> Result<String> {
        let opts = self.opts;
        let mut off = Vec::new();
        let mut on = Vec::new();
        let mut arms = Vec::new();
        for round in 0..opts.rounds {
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for kpulse in order {
                if kpulse {
                    println!("bench-fleet: round {}/{}: on", round + 1, opts.rounds);
                    let (cost, arm) = self.on_arm(saved, round)?;
                    println!(
                        "bench-fleet: {cost:?}; FlowSchema {}; tokens {}; start to ready {:.1} \
                         s, to all from agents {:.1} s, TokenReviews {}, rejected {}; {:?}",
                        arm.flowschema,
                        arm.verification,
                        arm.start_to_ready,
                        arm.start_to_agents,
                        arm.start_tokenreviews,
                        arm.start_rejected,
                        arm.restart
                    );
                    on.push(cost);
                    arms.push(arm);
                } else {
                    println!("bench-fleet: round {}/{}: off", round + 1, opts.rounds);
                    let cost = self.off_arm(saved)?;
                    println!("bench-fleet: {cost:?}");
                    off.push(cost);
                }
            }
        }
        println!("bench-fleet: reads, then an HPA in each fleet namespace");
        let (reads, hpas) = self.reads_and_hpas(saved)?;
        let hpas = match hpas {
            Ok(phase) => phase.report(),
            Err(e) => format!("\nThe HPAs (one in each fleet namespace) failed: {e:#}\n"),
        };
        Ok(self.report(&off, &on, &arms, &reads) + &hpas)
    }

    fn off_arm(&self, saved: &Saved) -> Result<Cost> {
        self.scale(0)?;
        self.wait_replicas("gone", <[Replica]>::is_empty)?;
        self.remove_apiservices(saved)?;
        self.stop
            .sleep(Duration::from_secs(self.opts.settle_secs))?;
        let a = self.sample()?;
        self.stop
            .sleep(Duration::from_secs(self.opts.window_secs))?;
        let b = self.sample()?;
        self.cost(&a, &b)
    }

    /// New replicas (the old ones, if any, gone first: every "on" arm starts alike) with the
    /// fleet's agents streaming, every replica ready; the agents' processes, the seconds
    /// from their start to every replica ready, and the counters before they started.
    fn start_on(&self, saved: &Saved, verification: &str) -> Result<(Agents, f64, Sample)> {
        self.scale(0)?;
        self.wait_replicas("gone", <[Replica]>::is_empty)?;
        // At 0 replicas, a new template rolls nothing: the replicas below start with it.
        self.set_token_verification(verification)?;
        self.ensure_apiservices(saved)?;
        self.scale(saved.on_replicas())?;
        let replicas = self.wait_replicas("running with an address", |r| {
            r.len() as u64 == saved.on_replicas()
                && r.iter().all(|r| r.ip.is_some() && r.container.is_some())
        })?;
        let servers: Vec<String> = replicas
            .iter()
            .filter_map(|r| r.ip.as_ref())
            .map(|ip| format!("{ip}:8444"))
            .collect();
        let before = self.sample()?;
        let mut args = vec![
            "--ca-dir".to_owned(),
            self.dir.join("ca").display().to_string(),
            "--fleet".to_owned(),
            self.agents_file.display().to_string(),
            "--apiserver".to_owned(),
            daemons::apiserver_url(),
            "--apiserver-ca".to_owned(),
            self.ctx.dirs.pki.join("ca.crt").display().to_string(),
            "--ramp-secs".to_owned(),
            self.opts.ramp_secs.to_string(),
            "--resolution-ms".to_owned(),
            self.opts.resolution_ms.to_string(),
        ];
        for s in &servers {
            args.extend(["--server".to_owned(), s.clone()]);
        }
        let mut agents = Agents::spawn(
            self.loadgen,
            &args,
            (self.opts.shape.nodes, servers.len()),
            self.opts.agent_processes,
            self.dir,
        )?;
        let started = Instant::now();
        let deadline = started + PHASE_LIMIT;
        loop {
            self.stop.check()?;
            agents.check_running()?;
            let r = self.replicas()?;
            if r.len() as u64 == saved.on_replicas() && r.iter().all(|r| r.ready) {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "the replicas not ready {PHASE_LIMIT:?} after the agents started: {r:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok((agents, started.elapsed().as_secs_f64(), before))
    }

    fn on_arm(&self, saved: &Saved, round: usize) -> Result<(Cost, OnArm)> {
        let second = !round.is_multiple_of(2);
        let away = self.opts.flowschema_every_other_round && second;
        self.set_flowschema(saved, !away)?;
        // As it is, whether or not this run changes it.
        let flowschema = !self.flowschema("name")?.trim().is_empty();
        let verification = if self.opts.review_tokens_every_other_round && second {
            "review"
        } else {
            "local"
        };
        let (mut agents, start_to_ready, before) = self.start_on(saved, verification)?;
        let ready = self.sample()?;
        // Readiness may come at its 60 s limit with agents still connecting: the steady
        // window begins once every node is served from its agent (or that wait's limit).
        let start_to_agents = match self.wait_from_agents(COMPLETE_LIMIT)? {
            Some(waited) => start_to_ready + waited.as_secs_f64(),
            None => f64::NAN,
        };
        let mut arm = OnArm {
            flowschema,
            verification,
            start_to_ready,
            start_to_agents,
            start_tokenreviews: tokenreviews(&ready.metrics) - tokenreviews(&before.metrics),
            start_rejected: rejected(&ready.metrics) - rejected(&before.metrics),
            ..OnArm::default()
        };
        self.stop
            .sleep(Duration::from_secs(self.opts.settle_secs))?;
        let a = self.sample()?;
        self.stop
            .sleep(Duration::from_secs(self.opts.window_secs))?;
        agents.check_running()?;
        let b = self.sample()?;
        let cost = self.cost(&a, &b)?;
        arm.restart = self.restart(round, &agents)?;
        agents.check_running()?;
        arm.summary = agents.stop()?;
        self.set_flowschema(saved, true)?;
        Ok((cost, arm))
    }

    /// Kills replica `round % replicas`'s process and times it back to ready.
    fn restart(&self, round: usize, agents: &Agents) -> Result<Restart> {
        let replicas = self.replicas()?;
        ensure!(!replicas.is_empty(), "no aggregator-api replica to restart");
        let victim = &replicas[round % replicas.len()];
        let (Some(ip), Some(container)) = (&victim.ip, &victim.container) else {
            bail!("replica {} has no address or container", victim.name);
        };
        let pid = container_pid(self.ctx, container)?;
        let pid = u32::try_from(pid).context("a PID")?;
        let before = self.sample()?;
        let drops_before = harness::tcp_ext_counter(pid, "ListenDrops").ok();
        let killed_at = SystemTime::now();
        let killed = Instant::now();
        crate::exec::run(Command::new("kill").args(["-KILL", &pid.to_string()]))?;
        // Once the old process is gone, whatever answers is the new one.
        while super::host::alive(pid) {
            ensure!(
                killed.elapsed() < Duration::from_secs(30),
                "replica {}'s process {pid} still there 30 s after SIGKILL",
                victim.name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let url = format!("https://{ip}:{HTTPS_PORT}/readyz");
        let mut answered = None;
        let deadline = killed + RESTART_LIMIT;
        let ready = loop {
            self.stop.check()?;
            let code = crate::exec::output(
                Command::new("curl")
                    .args([
                        "-sk",
                        "--max-time",
                        "5",
                        "-o",
                        "/dev/null",
                        "-w",
                        "%{http_code}",
                    ])
                    .arg(&url),
            )
            .unwrap_or_else(|_| "000".to_owned());
            let now = killed.elapsed().as_secs_f64();
            match code.trim() {
                "000" => {}
                "200" => break now,
                _ if answered.is_none() => answered = Some(now),
                _ => {}
            }
            if Instant::now() >= deadline {
                println!(
                    "bench-fleet: replica {} not ready {RESTART_LIMIT:?} after its process was \
                     killed",
                    victim.name
                );
                break f64::NAN;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let answered = answered.unwrap_or(ready);
        // Ready means every node served from either source (the kubelet fallback reads kwok
        // for a node whose agent is not back yet), or 60 s after the start whatever is
        // missing: then until every fleet node is served from its agent again.
        let from_agents = if ready.is_finite() {
            match self.wait_from_agents(COMPLETE_LIMIT)? {
                Some(_) => killed.elapsed().as_secs_f64(),
                None => f64::NAN,
            }
        } else {
            f64::NAN
        };
        let after = self.sample()?;
        let secs = after.at.duration_since(before.at).as_secs_f64();
        // The load generators count every second: one more count after the last agent.
        self.stop.sleep(Duration::from_millis(1_500))?;
        let (agents_back, agent_errors) = agents.since(killed_at)?;
        // The victim as it is now: its container's restarts, and the new process.
        let now = self.replicas().and_then(|rs| {
            rs.into_iter()
                .find(|r| r.name == victim.name)
                .with_context(|| format!("replica {} is gone", victim.name))
        });
        let starts = victim
            .restarts
            .zip(now.as_ref().ok().and_then(|r| r.restarts))
            .map(|(before, after)| after.saturating_sub(before));
        let restarted = now.and_then(|r| self.restarted(&r)).unwrap_or_else(|e| {
            println!("bench-fleet: the restarted replica's own account: {e:#}");
            Restarted {
                nodes_listed: f64::NAN,
                agent_pods_listed: f64::NAN,
                port_opened: f64::NAN,
                ..Restarted::default()
            }
        });
        let listen_drops = drops_before
            .zip(restarted.listen_drops)
            .map(|(before, after)| after.saturating_sub(before));
        Ok(Restart {
            listen_drops,
            starts,
            restarted,
            kill_to_answer: answered,
            kill_to_ready: ready,
            kill_to_agents: from_agents,
            tokenreviews: tokenreviews(&after.metrics) - tokenreviews(&before.metrics),
            rejected: rejected(&after.metrics) - rejected(&before.metrics),
            apiserver_cores: (after.apiserver_cpu - before.apiserver_cpu) / secs,
            agents_back,
            agent_errors,
        })
    }

    /// The restarted process of `replica`: its local token checks by outcome (its
    /// metrics, read inside its network namespace) and, from its log, the seconds from its
    /// first line to its first Node and agent-pod lists and to "serving agents' streams".
    fn restarted(&self, replica: &Replica) -> Result<Restarted> {
        let name = &replica.name;
        let container = replica
            .container
            .as_ref()
            .with_context(|| format!("replica {name} has no container"))?;
        let pid = container_pid(self.ctx, container)?;
        let listen_drops = u32::try_from(pid)
            .ok()
            .and_then(|pid| harness::tcp_ext_counter(pid, "ListenDrops").ok());
        let pid = pid.to_string();
        let admin = super::check::admin_identity(self.ctx)?;
        let text = super::check::get_from_replica(&admin, &pid, "/metrics")?;
        let prefix = "kpulse_aggregator_ingest_local_token_checks_total{outcome=\"";
        let local_checks = text
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .filter_map(|rest| {
                let (outcome, value) = rest.split_once("\"} ")?;
                Some((outcome.to_owned(), value.trim().parse().ok()?))
            })
            .collect();
        let log = self.kubectl(&["-n", NAMESPACE, "logs", name])?;
        let at = |needle: &str| log.lines().find(|l| l.contains(needle)).and_then(log_time);
        let since =
            |start: Option<std::time::SystemTime>, end: Option<std::time::SystemTime>| match (
                start, end,
            ) {
                (Some(s), Some(e)) => e.duration_since(s).map_or(f64::NAN, |d| d.as_secs_f64()),
                _ => f64::NAN,
            };
        let first = log.lines().find_map(log_time);
        Ok(Restarted {
            local_checks,
            nodes_listed: since(first, at("Nodes listed")),
            agent_pods_listed: since(first, at("agent pods listed")),
            port_opened: since(first, at("serving agents' streams")),
            listen_drops,
        })
    }

    /// The reads phase (kpulse on, every kind of read `--reads` times, interleaved), then
    /// the HPA phase ([`hpa`]) with the same agents.
    /// An HPA phase that fails is reported as such: it comes last, after what was measured.
    fn reads_and_hpas(&self, saved: &Saved) -> Result<(Vec<Reads>, Result<hpa::Phase>)> {
        let (mut agents, _, _) = self.start_on(saved, "local")?;
        // Reads of a replica still waiting for agents would count their gaps as errors.
        if self.wait_from_agents(COMPLETE_LIMIT)?.is_none() {
            println!(
                "bench-fleet: not every fleet node served from its agent {COMPLETE_LIMIT:?} \
                 after the replicas were ready; reading anyway"
            );
        }
        self.stop
            .sleep(Duration::from_secs(self.opts.settle_secs))?;
        let ns = fleet::Shape::first_namespace();
        let fleet_pods = self.opts.shape.nodes * self.opts.shape.pods;
        // Pod k of node i is in namespace (i × pods + k) mod namespaces: the first one has
        // the most, this many.
        let ns_pods = fleet_pods.div_ceil(self.opts.shape.namespaces);
        let nodes = self.opts.shape.nodes;
        let (node_prefix, ns_prefix) = (fleet::NODE_PREFIX, fleet::NAMESPACE_PREFIX);
        let base = "/apis/metrics.k8s.io/v1beta1";
        let mut kinds = vec![
            Reads::kubectl(
                "kubectl top node",
                &["top", "node"],
                Want::names(nodes, node_prefix),
            ),
            Reads::kubectl(
                "kubectl top pod -A",
                &["top", "pod", "-A"],
                Want::names(fleet_pods, ns_prefix),
            ),
            Reads::kubectl(
                &format!("kubectl top pod -n {ns}"),
                &["top", "pod", "-n", &ns],
                Want::names(ns_pods, fleet::POD_PREFIX),
            ),
            Reads::raw(
                "GET NodeMetrics, all",
                &format!("{base}/nodes"),
                Want::names(nodes, node_prefix),
            ),
            Reads::raw(
                "GET PodMetrics, all namespaces",
                &format!("{base}/pods"),
                Want::namespaces(fleet_pods, ns_prefix),
            ),
            Reads::raw(
                &format!("GET PodMetrics, namespace {ns}"),
                &format!("{base}/namespaces/{ns}/pods"),
                Want::names(ns_pods, fleet::POD_PREFIX),
            ),
            Reads::raw("GET discovery of metrics.k8s.io/v1beta1", base, None),
        ];
        for _ in 0..self.opts.reads {
            for kind in &mut kinds {
                self.stop.check()?;
                agents.check_running()?;
                kind.once(self.ctx, self.dir)?;
            }
        }
        for kind in &kinds {
            print!("bench-fleet: {}", kind.row());
        }
        println!("bench-fleet: the HPAs");
        let hpas = hpa::run(self, &mut agents);
        agents.stop()?;
        let hpas = hpas?;
        Ok((kinds, hpas))
    }
}

#[derive(Debug)]
struct Replica {
    name: String,
    ip: Option<String>,
    ready: bool,
    container: Option<String>,
    /// The kubelet's count of its container's restarts.
    restarts: Option<u64>,
}

/// The time a line of the server's log begins with (tracing's RFC 3339, UTC).
fn log_time(line: &str) -> Option<std::time::SystemTime> {
    let stamp = line.split_whitespace().next()?;
    humantime::parse_rfc3339_weak(stamp.trim_end_matches('Z')).ok()
}

fn tokenreviews(m: &Metrics) -> f64 {
    harness::sum(m, "apiserver_request_total", |l| {
        l.contains("resource=\"tokenreviews\"")
    })
}

fn rejected(m: &Metrics) -> f64 {
    harness::sum(m, "apiserver_flowcontrol_rejected_requests_total", |_| true)
}

#[cfg(test)]
mod tests {
    use super::log_time;

    #[test]
    fn times_from_the_servers_log() {
        let a = log_time(
            "2026-12-07T12:24:25.855636Z  INFO kpulse_aggregator_api: serving agents' streams",
        )
        .expect("a time");
        let b = log_time("2026-12-07T12:24:49.003299Z  INFO kpulse_aggregator_api::agents: x")
            .expect("a time");
        let d = b.duration_since(a).expect("later").as_secs_f64();
        assert!((d - 23.147663).abs() < 1e-3, "{d}");
        assert_eq!(log_time("not a time"), None);
    }
    use super::*;

    #[test]
    fn control_plane_counters_are_picked_by_their_labels() {
        let m: Metrics = [
            (
                "apiserver_request_total{code=\"201\",resource=\"tokenreviews\",verb=\"POST\"}",
                7.0,
            ),
            (
                "apiserver_request_total{code=\"200\",resource=\"pods\",verb=\"LIST\"}",
                5.0,
            ),
            (
                "apiserver_flowcontrol_rejected_requests_total{flow_schema=\"x\"}",
                1.0,
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(tokenreviews(&m), 7.0);
        assert_eq!(rejected(&m), 1.0);
        assert_eq!(harness::sum(&m, "apiserver_request_total", |_| true), 12.0);
    }
}
