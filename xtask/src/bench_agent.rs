//! `cargo xtask bench-agent`: the agent's own CPU and memory on this machine, on a node's
//! worth of pods, for one or two builds (and this tree with `--custom-metrics`) side by side
//! in one run.
//!
//! Steps: build (unless `--no-build`) the eBPF object, the release agent and aggregator-api;
//! make a CA and certificates (`demo::write_pki`); create `--pods` pods under
//! `kpulse-bench-agent` in every cgroup hierarchy, each laid out as kubelet lays one out (a
//! pod cgroup holding a sandbox cgroup and `--containers` container cgroups, named by pod UID
//! and 64-hex container ids), with one sleeping process in each sandbox and container; write
//! a pods file naming the containers (`--pods-file`: the agent's standalone attribution);
//! start `--replicas` aggregator-api replicas, to every one of which the agent streams, as
//! in a cluster.
//!
//! Then `--rounds` rounds; in each, every build (this tree's, this tree's with the agent's
//! `--custom-metrics` when `--custom-metrics` is given, and `--baseline` if given) ×
//! every collector of `--collectors`, one phase each, in that order:
//! start the agent in a cgroup of its own (`kpulse-bench-agent.self` in the cgroup2 mount,
//! outside the tree it measures); wait until every replica lists every pod with all its
//! containers; let it settle for `--warmup`; measure for `--phase` its CPU (`usage_usec`,
//! `user_usec`, `system_usec` of its cgroup's `cpu.stat`: every thread, exited ones too, to
//! the microsecond) and the time its collections took (its own
//! `kpulse_agent_collection_duration_seconds`); read its RSS; check again that every replica
//! lists every pod in full; stop it.
//!
//! `--perf DIR` adds, after the rounds, one phase per build and collector under
//! `perf record --call-graph dwarf` (not measured: perf costs the process it samples), and
//! writes each profile and its reports (`perf report`, self and inclusive) to `DIR`.
//!
//! Prints the table as Markdown (and writes it to `--report`). Every process started is
//! killed by PID and every cgroup created removed, on errors and Ctrl-C too.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

use crate::{
    demo::{parse_duration, Cgroups, Hierarchies, Processes},
    harness::{self, Proc, Stop},
    stats::{mean, median},
};

/// Parent of the measured pods' cgroups, in every hierarchy.
const PARENT: &str = "kpulse-bench-agent";
/// The agent's own cgroup, in the cgroup2 mount.
const SELF_CGROUP: &str = "kpulse-bench-agent.self";
/// The pods' namespace.
const NAMESPACE: &str = "bench";
/// The node the agent reports as.
const NODE: &str = "bench-node";

/// `cargo xtask bench-agent` flags.
#[derive(clap::Args, Debug)]
pub struct Options {
    /// Pods on the node (kubelet's default `maxPods` is 110).
    #[arg(long, default_value_t = 110)]
    pods: usize,
    /// Containers per pod (each pod also has a sandbox cgroup, not reported).
    #[arg(long, default_value_t = 2)]
    containers: usize,
    /// The agent's `--resolution`.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    resolution: Duration,
    /// Collectors to measure, comma-separated (`ebpf`, `cgroupfs`).
    #[arg(long, value_delimiter = ',', default_value = "ebpf,cgroupfs")]
    collectors: Vec<String>,
    /// Aggregator-api replicas the agent streams to.
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// Measured time per phase.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    phase: Duration,
    /// Time between every replica listing every pod and the start of the measurement.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    warmup: Duration,
    /// Rounds (each measures every build and collector once); 0 with `--perf`: profiles
    /// only.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Another agent binary measured beside this tree's in every round (e.g. one built from
    /// an earlier commit: see docs/benchmarks.md).
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Profile each build and collector with `perf record -g` in one extra phase, into
    /// this directory.
    #[arg(long)]
    perf: Option<PathBuf>,
    /// Also measure this tree's agent with `--custom-metrics` (PSI and CFS counters for
    /// `custom.metrics.k8s.io`) in every round, beside it without.
    #[arg(long)]
    custom_metrics: bool,
    /// Use the release binaries already built.
    #[arg(long)]
    no_build: bool,
    /// Also write the report (Markdown) here.
    #[arg(long)]
    report: Option<PathBuf>,
}

/// One phase's measurement.
#[derive(Debug, Clone, Copy)]
struct Measured {
    /// CPU, cores (usage ÷ wall time).
    cpu: f64,
    /// Of which user and system.
    user: f64,
    system: f64,
    /// Collections: count and mean duration, seconds.
    ticks: f64,
    collect_mean: f64,
    /// RSS at the end, MiB.
    rss: f64,
}

pub fn run(opts: &Options) -> Result<()> {
    ensure!(
        opts.pods > 0 && opts.containers > 0 && opts.replicas > 0,
        "--pods, --containers and --replicas must be positive"
    );
    ensure!(
        opts.rounds > 0 || opts.perf.is_some(),
        "--rounds 0 measures nothing (it is for --perf alone)"
    );
    for c in &opts.collectors {
        ensure!(
            c == "ebpf" || c == "cgroupfs",
            "--collectors: {c:?} is neither ebpf nor cgroupfs"
        );
    }
    ensure!(
        opts.phase >= Duration::from_secs(5),
        "--phase must be at least 5s"
    );
    let root = crate::vm::workspace_root()?;
    let stop = Stop::install()?;
    if !opts.no_build {
        crate::build_ebpf::run(&crate::build_ebpf::Options {
            release: true,
            no_install: false,
            clippy: false,
        })?;
        crate::exec::run(Command::new("cargo").current_dir(&root).args([
            "build",
            "--release",
            "-p",
            "kpulse-agent",
            "--bin",
            "kpulse-agent",
            "-p",
            "kpulse-aggregator-api",
            "--bin",
            "kpulse-aggregator-api",
        ]))?;
    }
    let release = root.join("target/release");
    // (label, binary, with `--custom-metrics`)
    let mut builds = vec![("this tree".to_owned(), release.join("kpulse-agent"), false)];
    if opts.custom_metrics {
        builds.push((
            "this tree, --custom-metrics".to_owned(),
            release.join("kpulse-agent"),
            true,
        ));
    }
    if let Some(b) = &opts.baseline {
        builds.push(("baseline".to_owned(), b.clone(), false));
    }
    let server_bin = release.join("kpulse-aggregator-api");
    for b in builds.iter().map(|b| &b.1).chain([&server_bin]) {
        ensure!(b.is_file(), "{} is missing", b.display());
    }
    if opts.perf.is_some() {
        ensure!(
            Command::new("perf").arg("--version").output().is_ok(),
            "--perf needs perf on PATH (apt-get install linux-perf)"
        );
    }

    let scratch = harness::Scratch::new("bench-agent")?;
    let dir = &scratch.dir;
    let hierarchies = crate::demo::detect_hierarchies()?;
    let unified = match &hierarchies {
        Hierarchies::Unified(m) | Hierarchies::Hybrid { unified: m, .. } => m.clone(),
    };
    let own = OwnCgroup::create(&unified.join(SELF_CGROUP))?;

    // The node: pods, each a pod cgroup with a sandbox and its containers.
    let pods: Vec<Pod> = (0..opts.pods)
        .map(|i| Pod::new(i, opts.containers))
        .collect();
    let mut children = Vec::new();
    for p in &pods {
        children.push(p.cgroup());
        children.push(format!("{}/{}", p.cgroup(), p.sandbox));
        children.extend(p.containers.iter().map(|c| format!("{}/{c}", p.cgroup())));
    }
    let cgroups = Cgroups::create(&hierarchies, PARENT, &children)?;
    let mut sleepers = Processes::default();
    for p in &pods {
        for c in std::iter::once(&p.sandbox).chain(&p.containers) {
            let mut cmd = Command::new("sh");
            cmd.args([
                "-c",
                &format!(
                    "{}exec sleep 1000000",
                    cgroups.join_shell(&format!("{}/{c}", p.cgroup()))
                ),
            ]);
            sleepers.spawn("sleep", cmd, Path::new("/dev/null"))?;
        }
    }
    let pods_file = dir.join("pods.json");
    write_pods_file(&pods_file, &pods)?;
    println!(
        "bench-agent: {} pods × {} containers under {PARENT} ({} cgroups, {} sleeping processes)",
        opts.pods,
        opts.containers,
        children.len() + 1,
        pods.len() * (opts.containers + 1)
    );

    // The replicas.
    let mut ports = Vec::new();
    for _ in 0..opts.replicas {
        ports.push((crate::exec::free_port()?, crate::exec::free_port()?));
    }
    let pki = crate::demo::write_pki(dir, NODE, ports[0].0)?;
    let mut servers = Vec::new();
    for (i, (api, ingest)) in ports.iter().enumerate() {
        let args: Vec<String> = [
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            &api.to_string(),
            "--ingest-port",
            &ingest.to_string(),
            "--tls-cert-file",
            &pki.server_cert.display().to_string(),
            "--tls-private-key-file",
            &pki.server_key.display().to_string(),
            "--client-ca-file",
            &pki.ca.display().to_string(),
            "--agent-client-ca-file",
            &pki.ca.display().to_string(),
            "--authorization-mode",
            "AlwaysAllow",
            "--authentication-skip-lookup",
        ]
        .map(String::from)
        .to_vec();
        servers.push(Proc::spawn(
            "aggregator-api",
            &server_bin,
            &args,
            false,
            &dir.join(format!("aggregator-api-{i}.log")),
            None,
        )?);
    }
    let lister = Lister {
        kubeconfig: pki.kubeconfig.clone(),
        api_ports: ports.iter().map(|(a, _)| *a).collect(),
        pods: opts.pods,
        containers: opts.containers,
    };
    let agent_args = |collector: &str, metrics: &str, custom_metrics: bool| -> Vec<String> {
        let servers: Vec<String> = ports
            .iter()
            .map(|(_, ingest)| format!("127.0.0.1:{ingest}"))
            .collect();
        [
            "run",
            "--node-name",
            NODE,
            "--server",
            &servers.join(","),
            "--server-ca-file",
            &pki.ca.display().to_string(),
            "--client-cert-file",
            &pki.agent_cert.display().to_string(),
            "--client-key-file",
            &pki.agent_key.display().to_string(),
            "--pods-file",
            &pods_file.display().to_string(),
            "--collector",
            collector,
            "--resolution",
            &humantime::format_duration(opts.resolution).to_string(),
            "--metrics-bind-address",
            metrics,
        ]
        .map(String::from)
        .into_iter()
        .chain(custom_metrics.then(|| "--custom-metrics".to_owned()))
        .collect()
    };

    // A fresh agent in its own cgroup, once every replica lists every pod and `--warmup`
    // has passed; with the address of its `/metrics`.
    let start_agent =
        |bin: &Path, collector: &str, custom_metrics: bool, log: &Path| -> Result<(Proc, String)> {
            let metrics = format!("127.0.0.1:{}", crate::exec::free_port()?);
            let mut agent = Proc::spawn(
                "the agent",
                bin,
                &agent_args(collector, &metrics, custom_metrics),
                false,
                log,
                None,
            )?;
            own.adopt(agent.pid())?;
            lister.wait_complete(&mut agent, &stop)?;
            stop.sleep(opts.warmup)?;
            Ok((agent, metrics))
        };
    let mut results: Vec<(String, String, Vec<Measured>)> = Vec::new();
    for (label, _, _) in &builds {
        for c in &opts.collectors {
            results.push((label.clone(), c.clone(), Vec::new()));
        }
    }
    let started = Instant::now();
    for round in 1..=opts.rounds {
        let mut slot = 0;
        for (label, bin, custom) in &builds {
            for collector in &opts.collectors {
                for s in &mut servers {
                    s.check_running()?;
                }
                let log = dir.join(format!("agent-{round}-{slot}.log"));
                let (mut agent, metrics) = start_agent(bin, collector, *custom, &log)?;
                let m = measure(&own, &mut agent, &metrics, opts.phase, &stop)?;
                lister.check_complete().with_context(|| {
                    format!(
                        "after the phase of {label} ({collector}); see {}",
                        log.display()
                    )
                })?;
                agent.stop(Duration::from_secs(10))?;
                println!(
                    "bench-agent: round {round}/{}, {label}, {collector}: {:.2} mCPU, {:.1} MiB, \
                     {:.0} collections of {:.2} ms ({:.0} s so far)",
                    opts.rounds,
                    m.cpu * 1e3,
                    m.rss,
                    m.ticks,
                    m.collect_mean * 1e3,
                    started.elapsed().as_secs_f64()
                );
                results[slot].2.push(m);
                slot += 1;
            }
        }
    }
    if opts.rounds > 0 {
        let report = report(opts, &hierarchies, &results);
        println!("\n{report}");
        if let Some(path) = &opts.report {
            fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
        }
    }

    if let Some(out) = &opts.perf {
        fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        for (label, bin, custom) in &builds {
            for collector in &opts.collectors {
                let name = format!("{}-{collector}", label.replace([' ', ','], "-"));
                let log = dir.join(format!("agent-perf-{name}.log"));
                let (mut agent, _) = start_agent(bin, collector, *custom, &log)?;
                let data = out.join(format!("{name}.perf.data"));
                crate::exec::run(
                    Command::new("perf")
                        .args(["record", "-q", "-F", "1999", "--call-graph", "dwarf,32768"])
                        .arg("-p")
                        .arg(agent.pid().to_string())
                        .arg("-o")
                        .arg(&data)
                        .args(["--", "sleep"])
                        .arg(opts.phase.as_secs().to_string()),
                )?;
                agent.stop(Duration::from_secs(10))?;
                let flat = crate::exec::output(
                    Command::new("perf")
                        .args(["report", "--stdio", "--no-children", "-g", "none"])
                        .args(["--percent-limit", "0.5", "--sort", "dso,symbol", "-i"])
                        .arg(&data),
                )?;
                let txt = out.join(format!("{name}.txt"));
                fs::write(&txt, &flat).with_context(|| format!("writing {}", txt.display()))?;
                println!(
                    "bench-agent: profile of {label} ({collector}): {}",
                    txt.display()
                );
            }
        }
    }
    for s in &mut servers {
        s.stop(Duration::from_secs(10))?;
    }
    sleepers.stop();
    cgroups.remove();
    Ok(())
}

/// One simulated pod.
struct Pod {
    uid: String,
    name: String,
    sandbox: String,
    containers: Vec<String>,
}

impl Pod {
    fn new(i: usize, containers: usize) -> Pod {
        // Container ids as containerd makes them: 64 hex digits.
        let id = |j: usize| format!("{:064x}", (i << 8 | j) as u128 * 0x9e37_79b9_7f4a_7c15);
        Pod {
            uid: format!("00000000-0000-4000-8000-{i:012}"),
            name: format!("filler-{i:03}"),
            sandbox: id(0xff),
            containers: (0..containers).map(id).collect(),
        }
    }

    /// Relative to [`PARENT`], as kubelet's cgroupfs driver names it.
    fn cgroup(&self) -> String {
        format!("pod{}", self.uid)
    }
}

fn write_pods_file(path: &Path, pods: &[Pod]) -> Result<()> {
    let pods: Vec<_> = pods
        .iter()
        .map(|p| {
            let containers: Vec<_> = p
                .containers
                .iter()
                .enumerate()
                .map(|(j, c)| {
                    serde_json::json!({
                        "name": format!("c{j}"),
                        "cgroup": format!("/{PARENT}/{}/{c}", p.cgroup()),
                    })
                })
                .collect();
            // The pod cgroup too: where a pod's pressure is read (`--custom-metrics`).
            serde_json::json!({
                "uid": p.uid, "namespace": NAMESPACE, "name": p.name,
                "labels": {"app": "filler"}, "containers": containers,
                "cgroup": format!("/{PARENT}/{}", p.cgroup()),
            })
        })
        .collect();
    let json = serde_json::json!({ "pods": pods });
    fs::write(path, format!("{json}\n")).with_context(|| format!("writing {}", path.display()))
}

/// The agent's own cgroup (cgroup2): moved into after start, removed on drop.
struct OwnCgroup(PathBuf);

impl OwnCgroup {
    fn create(path: &Path) -> Result<OwnCgroup> {
        // Left by a killed run: empty now (its agent died with the run).
        let _ = fs::remove_dir(path);
        fs::create_dir(path).with_context(|| format!("mkdir {}", path.display()))?;
        Ok(OwnCgroup(path.to_path_buf()))
    }

    /// Moves `pid` (every thread of it) in.
    fn adopt(&self, pid: u32) -> Result<()> {
        let procs = self.0.join("cgroup.procs");
        fs::write(&procs, pid.to_string())
            .with_context(|| format!("moving {pid} into {}", procs.display()))
    }

    /// `usage_usec`, `user_usec`, `system_usec`, in seconds.
    fn cpu(&self) -> Result<(f64, f64, f64)> {
        let path = self.0.join("cpu.stat");
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let field = |name: &str| -> Result<f64> {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|us| us as f64 / 1e6)
                .with_context(|| format!("{name} in {}", path.display()))
        };
        Ok((
            field("usage_usec")?,
            field("user_usec")?,
            field("system_usec")?,
        ))
    }
}

impl Drop for OwnCgroup {
    fn drop(&mut self) {
        // Its processes are stopped by then; retried while the kernel lets go of them.
        for _ in 0..100 {
            if fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One phase: CPU of `own` over `phase`, the agent's collections over it, RSS at its end.
fn measure(
    own: &OwnCgroup,
    agent: &mut Proc,
    metrics: &str,
    phase: Duration,
    stop: &Stop,
) -> Result<Measured> {
    const SUM: &str = "kpulse_agent_collection_duration_seconds_sum";
    const COUNT: &str = "kpulse_agent_collection_duration_seconds_count";
    let m0 = harness::scrape_http(metrics)?;
    let (t0, c0) = (Instant::now(), own.cpu()?);
    stop.sleep(phase)?;
    let (c1, wall) = (own.cpu()?, t0.elapsed().as_secs_f64());
    let m1 = harness::scrape_http(metrics)?;
    agent.check_running()?;
    let (rss, _) = harness::rss_mib(agent.pid())?;
    let ticks = harness::delta(&m0, &m1, COUNT);
    ensure!(ticks > 0.0, "the agent collected nothing in the phase");
    Ok(Measured {
        cpu: (c1.0 - c0.0) / wall,
        user: (c1.1 - c0.1) / wall,
        system: (c1.2 - c0.2) / wall,
        ticks,
        collect_mean: harness::delta(&m0, &m1, SUM) / ticks,
        rss,
    })
}

/// Reads every replica's PodMetrics of the namespace.
struct Lister {
    kubeconfig: PathBuf,
    api_ports: Vec<u16>,
    pods: usize,
    containers: usize,
}

impl Lister {
    /// Pods listed in full by the replica on `port`.
    fn complete_on(&self, port: u16) -> Result<usize> {
        let text = crate::exec::output(
            Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(["--server", &format!("https://127.0.0.1:{port}")])
                .args(["--request-timeout", "10s", "get", "--raw"])
                .arg(format!(
                    "/apis/metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/pods"
                )),
        )?;
        let list: serde_json::Value =
            serde_json::from_str(&text).context("the PodMetrics list is not JSON")?;
        Ok(list["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter(|p| p["containers"].as_array().map(Vec::len) == Some(self.containers))
                    .count()
            })
            .unwrap_or(0))
    }

    /// Fails unless every replica lists every pod with every container.
    fn check_complete(&self) -> Result<()> {
        for &port in &self.api_ports {
            let n = self.complete_on(port)?;
            ensure!(
                n == self.pods,
                "the replica on port {port} lists {n} of {} pods in full",
                self.pods
            );
        }
        Ok(())
    }

    /// Waits (60 s at most) until [`Lister::check_complete`] passes.
    fn wait_complete(&self, agent: &mut Proc, stop: &Stop) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            agent.check_running()?;
            match self.check_complete() {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    bail!(
                        "not every pod served 60 s after the agent started: {e:#}; see {}",
                        agent.log.display()
                    )
                }
                Err(_) => stop.sleep(Duration::from_millis(500))?,
            }
        }
    }
}

fn report(
    opts: &Options,
    hierarchies: &Hierarchies,
    results: &[(String, String, Vec<Measured>)],
) -> String {
    let layout = match hierarchies {
        Hierarchies::Unified(_) => "cgroup v2",
        Hierarchies::Hybrid { .. } => "hybrid cgroups",
    };
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut out = format!(
        "### The agent's own cost: {} pods × {} containers, `--resolution={}`, {} replicas\n\n\
         Kernel {}, {layout}; {} rounds of {} s phases (after every replica listed every pod, \
         and {} s more), builds and collectors alternated. CPU in mCPU (its cgroup's \
         `cpu.stat` over the phase ÷ wall time); collection = its own \
         `kpulse_agent_collection_duration_seconds` (mean per tick); RSS at the phase's end. \
         This VM's neighbours sometimes slow a whole phase by half: the median is the figure \
         to compare.\n\n\
         | build | collector | CPU (mCPU), each round | median | mean | user / system | \
         collection | rest of a tick (CPU ÷ ticks − collection) | RSS (MiB) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        opts.pods,
        opts.containers,
        humantime::format_duration(opts.resolution),
        opts.replicas,
        kernel.trim(),
        opts.rounds,
        opts.phase.as_secs(),
        opts.warmup.as_secs(),
    );
    for (label, collector, ms) in results {
        let cpu: Vec<f64> = ms.iter().map(|m| m.cpu * 1e3).collect();
        let rounds: Vec<String> = cpu.iter().map(|c| format!("{c:.2}")).collect();
        let per_tick: Vec<f64> = ms
            .iter()
            .map(|m| m.cpu * opts.phase.as_secs_f64() / m.ticks)
            .collect();
        let collect = mean(&ms.iter().map(|m| m.collect_mean).collect::<Vec<_>>());
        let _ = writeln!(
            out,
            "| {label} | {collector} | {} | **{:.2}** | {:.2} | {:.2} / {:.2} | {:.2} ms | {:.2} ms | {:.1} |",
            rounds.join(", "),
            median(&cpu),
            mean(&cpu),
            mean(&ms.iter().map(|m| m.user * 1e3).collect::<Vec<_>>()),
            mean(&ms.iter().map(|m| m.system * 1e3).collect::<Vec<_>>()),
            collect * 1e3,
            (mean(&per_tick) - collect) * 1e3,
            mean(&ms.iter().map(|m| m.rss).collect::<Vec<_>>()),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_look_like_kubelets() {
        let p = Pod::new(7, 2);
        assert_eq!(p.uid, "00000000-0000-4000-8000-000000000007");
        assert_eq!(p.cgroup(), "pod00000000-0000-4000-8000-000000000007");
        assert_eq!(p.containers.len(), 2);
        for id in p.containers.iter().chain([&p.sandbox]) {
            assert_eq!(id.len(), 64);
            assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        }
        assert_ne!(p.containers[0], p.containers[1]);
        assert_ne!(Pod::new(8, 2).containers[0], p.containers[0]);
    }

    #[test]
    fn the_pods_file_names_every_container() {
        let dir =
            std::env::temp_dir().join(format!("kpulse-bench-agent-test-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("test input");
        let path = dir.join("pods.json");
        write_pods_file(&path, &[Pod::new(0, 2), Pod::new(1, 2)]).expect("test input");
        let v: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).expect("test input"))
                .expect("test input");
        let _ = fs::remove_dir_all(&dir);
        let pods = v["pods"].as_array().expect("test input");
        assert_eq!(pods.len(), 2);
        assert_eq!(
            pods[1]["cgroup"],
            format!("/{PARENT}/pod00000000-0000-4000-8000-000000000001")
        );
        let c = &pods[1]["containers"][1];
        assert_eq!(c["name"], "c1");
        assert_eq!(
            c["cgroup"],
            format!(
                "/{PARENT}/pod00000000-0000-4000-8000-000000000001/{}",
                Pod::new(1, 2).containers[1]
            )
        );
    }
}
