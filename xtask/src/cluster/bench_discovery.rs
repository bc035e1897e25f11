//! `cargo xtask cluster bench-discovery`: how long discovery of `metrics.k8s.io` takes
//! through kube-apiserver while thousands of simulated nodes stream to the installed
//! aggregator-api, against the same with nothing streaming, in one run.
//!
//! kube-apiserver gives an aggregated API's discovery 5 s (its discovery manager and the
//! APIService availability check); past that, the group drops out of `/apis` and every
//! client's discovery reports it failed. The replicas' ingest shares their CPU with the
//! discovery answers, so the question is how close to 5 s a busy replica comes.
//!
//! Against a cluster `cluster up --install` made:
//! 1. the load generator's CA is added to the aggregator-api as `--agent-client-ca-file`
//!    (a Secret and a patch of the Deployment, memory limit raised for the simulated fleet,
//!    `--max-connections-per-ip` raised because every simulated node connects from this
//!    machine's address), and the rollout is waited for;
//! 2. **idle**: `GET /apis/metrics.k8s.io/v1beta1` and `/apis/metrics.k8s.io/v1` through
//!    kube-apiserver, alternately, at a steady rate by one curl on one connection, as the
//!    cluster's admin; each request's status and time;
//! 3. **streaming**: the same, once `--nodes` simulated agents (the `loadgen` example, the
//!    agent's own shipping code, a client certificate per node) stream to every replica's
//!    pod IP and have ramped up;
//! 4. the Deployment is rolled back and the Secret deleted, also after a failure.
//!
//! It prints p50, p99 and the maximum of each phase, the errors, and what the load
//! generator delivered.

use std::{
    fs,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use super::{
    check::{DEPLOYMENT, NAMESPACE, SELECTOR},
    daemons,
    host::Dirs,
};
use crate::harness::{self, Agents, Pki, Stop};

const SECRET: &str = "kpulse-bench-agents-ca";
const MOUNT: &str = "/etc/kpulse/bench-agents";

/// `cargo xtask cluster bench-discovery` flags.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Simulated nodes.
    #[arg(long, default_value_t = 3000)]
    nodes: usize,
    /// Pods per simulated node.
    #[arg(long, default_value_t = 10)]
    pods: usize,
    /// Containers per pod.
    #[arg(long, default_value_t = 2)]
    containers: usize,
    /// Discovery requests per phase.
    #[arg(long, default_value_t = 1200)]
    requests: usize,
    /// Discovery requests per second.
    #[arg(long, default_value_t = 20)]
    rate: u32,
    /// Seconds over which the simulated nodes connect.
    #[arg(long, default_value_t = 30)]
    ramp_secs: u64,
    /// Use the release binaries as they are.
    #[arg(long)]
    no_build: bool,
}

pub fn run(opts: &Options, dirs: &Dirs, kubectl: &Path) -> Result<()> {
    ensure!(
        opts.nodes > 0 && opts.pods > 0 && opts.containers > 0 && opts.requests > 0,
        "--nodes, --pods, --containers and --requests must be positive"
    );
    ensure!(opts.rate > 0, "--rate must be positive");
    harness::require_curl("bench-discovery")?;
    let bins = harness::release_binaries(opts.no_build)?;
    let scratch = harness::Scratch::new("bench-discovery")?;
    let stop = Stop::install()?;
    let pki = Pki::create(&bins.loadgen, &scratch.dir.join("ca"))?;
    let k = Kubectl { dirs, bin: kubectl };

    let result = k
        .add_agents_ca(&pki, opts.nodes)
        .and_then(|()| measure(opts, &k, &bins.loadgen, &pki, &scratch.dir, &stop));
    let restored = k.restore();
    if result.is_err() {
        scratch.keep();
    }
    let table = result?;
    restored?;
    println!("{table}");
    Ok(())
}

struct Kubectl<'a> {
    dirs: &'a Dirs,
    bin: &'a Path,
}

impl Kubectl<'_> {
    fn cmd(&self) -> Command {
        let mut c = Command::new(self.bin);
        c.arg("--kubeconfig").arg(self.dirs.kubeconfig());
        c
    }

    fn run(&self, args: &[&str]) -> Result<String> {
        crate::exec::output(self.cmd().args(args))
    }

    /// The Secret, and the Deployment patched to trust it for agents and to take all of
    /// them from one address (the simulated nodes share this machine's; real agents each
    /// have their pod's, and the default limit of 1,024 connections per address stays).
    fn add_agents_ca(&self, pki: &Pki, nodes: usize) -> Result<()> {
        self.delete_secret()?;
        crate::exec::output(
            self.cmd()
                .args(["-n", NAMESPACE, "create", "secret", "generic", SECRET])
                .arg(format!("--from-file=ca.crt={}", pki.ca.display())),
        )?;
        let patch = serde_json::json!([
            {"op": "add", "path": "/spec/template/spec/volumes/-",
             "value": {"name": "bench-agents-ca", "secret": {"secretName": SECRET}}},
            {"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-",
             "value": {"name": "bench-agents-ca", "mountPath": MOUNT, "readOnly": true}},
            {"op": "add", "path": "/spec/template/spec/containers/0/args/-",
             "value": format!("--agent-client-ca-file={MOUNT}/ca.crt")},
            {"op": "add", "path": "/spec/template/spec/containers/0/args/-",
             "value": format!("--max-connections-per-ip={}", nodes + 64)},
            {"op": "replace", "path": "/spec/template/spec/containers/0/resources/limits/memory",
             "value": "2Gi"},
        ]);
        self.run(&[
            "-n",
            NAMESPACE,
            "patch",
            DEPLOYMENT,
            "--type=json",
            "-p",
            &patch.to_string(),
        ])?;
        self.rollout_status()
    }

    fn rollout_status(&self) -> Result<()> {
        self.run(&[
            "-n",
            NAMESPACE,
            "rollout",
            "status",
            DEPLOYMENT,
            "--timeout=240s",
        ])?;
        Ok(())
    }

    /// The Deployment as `deploy/` made it, and no Secret.
    fn restore(&self) -> Result<()> {
        let template = self.run(&[
            "-n",
            NAMESPACE,
            "get",
            DEPLOYMENT,
            "-o",
            "jsonpath={.spec.template.spec.containers[0].args}",
        ])?;
        if template.contains("--agent-client-ca-file") {
            self.run(&["-n", NAMESPACE, "rollout", "undo", DEPLOYMENT])?;
            self.rollout_status()?;
        }
        self.delete_secret()
    }

    fn delete_secret(&self) -> Result<()> {
        let args = [
            "-n",
            NAMESPACE,
            "delete",
            "secret",
            SECRET,
            "--ignore-not-found",
        ];
        self.run(&args).map(drop)
    }

    /// Every ready replica's `podIP:8444`.
    fn ingest_addresses(&self) -> Result<Vec<String>> {
        let pods: Value = serde_json::from_str(
            &self.run(&["-n", NAMESPACE, "get", "pods", "-l", SELECTOR, "-o", "json"])?,
        )
        .context("kubectl printed no JSON")?;
        let out: Vec<String> = pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter_map(|p| p["status"]["podIP"].as_str())
            .map(|ip| format!("{ip}:8444"))
            .collect();
        ensure!(!out.is_empty(), "no aggregator-api pod has an IP");
        Ok(out)
    }
}

/// One phase's requests: (HTTP status, seconds).
struct Phase {
    name: &'static str,
    samples: Vec<(u16, f64)>,
}

impl Phase {
    fn row(&self) -> String {
        let mut ok: Vec<f64> = self
            .samples
            .iter()
            .filter(|(s, _)| *s == 200)
            .map(|(_, t)| *t)
            .collect();
        ok.sort_by(f64::total_cmp);
        let pct = |p: f64| -> f64 {
            if ok.is_empty() {
                return f64::NAN;
            }
            let i = ((p * ok.len() as f64).ceil() as usize).clamp(1, ok.len()) - 1;
            ok[i] * 1e3
        };
        format!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} |",
            self.name,
            self.samples.len(),
            self.samples.len() - ok.len(),
            pct(0.50),
            pct(0.99),
            ok.last().map_or(f64::NAN, |t| t * 1e3),
        )
    }
}

/// `requests` discovery GETs through kube-apiserver, `rate` per second, one connection.
fn discovery(dirs: &Dirs, dir: &Path, requests: usize, rate: u32) -> Result<Vec<(u16, f64)>> {
    let base = daemons::apiserver_url();
    let mut config = String::new();
    for i in 0..requests {
        let version = if i % 2 == 0 { "v1beta1" } else { "v1" };
        config.push_str(&format!(
            "url = \"{base}/apis/metrics.k8s.io/{version}\"\noutput = \"/dev/null\"\n"
        ));
    }
    let file = dir.join("discovery.curl");
    fs::write(&file, config).with_context(|| format!("cannot write {}", file.display()))?;
    let out = super::daemons::admin_curl(&dirs.pki)
        .args(["-sS", "--max-time"])
        .arg((requests as u64 / u64::from(rate) + 60).to_string())
        .args(["--rate", &format!("{rate}/s")])
        .args(["-w", "%{http_code} %{time_total}\\n", "-K"])
        .arg(&file)
        .output()
        .context("cannot run curl")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let samples: Vec<(u16, f64)> = text
        .lines()
        .filter_map(|l| {
            let (code, secs) = l.split_once(' ')?;
            Some((code.parse().ok()?, secs.parse().ok()?))
        })
        .collect();
    ensure!(
        samples.len() == requests,
        "curl reported {} of {requests} requests: {}",
        samples.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(samples)
}

fn measure(
    opts: &Options,
    k: &Kubectl<'_>,
    loadgen: &Path,
    pki: &Pki,
    dir: &Path,
    stop: &Stop,
) -> Result<String> {
    let servers = k.ingest_addresses()?;
    println!(
        "bench-discovery: idle phase: {} requests at {}/s",
        opts.requests, opts.rate
    );
    let idle = Phase {
        name: "idle",
        samples: discovery(k.dirs, dir, opts.requests, opts.rate)?,
    };
    stop.check()?;

    let agents = Agents {
        nodes: opts.nodes,
        pods: opts.pods,
        containers: opts.containers,
        ramp_secs: opts.ramp_secs,
        servers: &servers,
        spread: false,
        resolution_ms: 1000,
        nice: false,
        log_filter: None,
        custom_metrics: false,
        node_prefix: None,
    };
    println!(
        "bench-discovery: {} simulated nodes × {} pods × {} containers streaming to {}",
        opts.nodes,
        opts.pods,
        opts.containers,
        servers.join(", ")
    );
    let summary_path = dir.join("loadgen.out");
    let mut proc = agents.start(loadgen, pki, &dir.join("loadgen.log"), &summary_path)?;
    let started = Instant::now();
    // Every node connected (the ramp), then 10 s of steady streaming before measuring.
    stop.sleep(Duration::from_secs(opts.ramp_secs + 10))?;
    proc.check_running()?;
    println!("bench-discovery: streaming phase");
    let streaming = Phase {
        name: "streaming",
        samples: discovery(k.dirs, dir, opts.requests, opts.rate)?,
    };
    proc.check_running()?;
    let streamed = started.elapsed();
    proc.signal("TERM")?;
    proc.wait_for(Duration::from_secs(60))?
        .context("the load generator did not stop within 60 s")?;
    let summary = harness::read_summary(&summary_path)?;
    let produced = summary["produced"].as_f64().unwrap_or(f64::NAN);
    let sent = summary["sent"].as_f64().unwrap_or(f64::NAN);
    Ok(format!(
        "GET /apis/metrics.k8s.io/{{v1beta1,v1}} through kube-apiserver, {} per phase at {}/s, \
         as the admin on one connection; {} nodes × {} pods × {} containers streaming to {} \
         replicas in the second ({:.0} batches/s sent to the replicas together over {:.0} s, {produced} produced, \
         {sent} sent)\n\n| phase | requests | errors | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|---|\n{}\n{}",
        opts.requests,
        opts.rate,
        opts.nodes,
        opts.pods,
        opts.containers,
        servers.len(),
        sent / streamed.as_secs_f64(),
        streamed.as_secs_f64(),
        idle.row(),
        streaming.row(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_successes_only() {
        let mut samples: Vec<(u16, f64)> = (1..=100).map(|i| (200, f64::from(i) / 1e3)).collect();
        samples.push((503, 9.0));
        let row = Phase { name: "x", samples }.row();
        assert_eq!(row, "| x | 101 | 1 | 50.0 | 99.0 | 100.0 |");
    }
}
