//! `cargo xtask bench-ingest`: one aggregator-api replica ingesting many simulated agents
//! (the agent's own shipping code, in the `loadgen` example), measured from outside.
//!
//! Steps: build release binaries; create the simulated agents' CA; start the server on
//! loopback with that CA as `--agent-client-ca-file`; start the load generator; after the
//! ramp and a warm-up, measure for `--measure-secs`: the server's CPU time (`/proc/PID/stat`
//! utime+stime, so the load generator's own CPU is not counted), its RSS (`VmRSS`, peak
//! `VmHWM`), bytes received per node per second and the ingest→visible latency histogram
//! (`/metrics`, differences between the start and the end of the window). Prints a Markdown
//! table for docs/benchmarks.md.

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

/// Options.
#[derive(clap::Args, Debug)]
pub struct Options {
    /// Simulated nodes.
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    /// Pods per node.
    #[arg(long, default_value_t = 110)]
    pods: usize,
    /// Containers per pod.
    #[arg(long, default_value_t = 2)]
    containers: usize,
    /// Seconds over which the simulated agents connect.
    #[arg(long, default_value_t = 30)]
    ramp_secs: u64,
    /// Seconds of steady state before measuring.
    #[arg(long, default_value_t = 15)]
    warmup_secs: u64,
    /// Seconds measured.
    #[arg(long, default_value_t = 60)]
    measure_secs: u64,
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `utime + stime` of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces) start after ") ".
    let rest = stat
        .rsplit_once(") ")
        .map(|(_, r)| r)
        .context("malformed /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks: u64 = fields
        .get(11)
        .and_then(|u| u.parse::<u64>().ok())
        .zip(fields.get(12).and_then(|s| s.parse::<u64>().ok()))
        .map(|(u, s)| u + s)
        .context("utime/stime")?;
    // USER_HZ is 100 on every Linux ABI that matters here.
    Ok(ticks as f64 / 100.0)
}

/// `VmRSS` and `VmHWM` of `pid`, in MiB.
fn rss_mib(pid: u32) -> Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| -> Result<f64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .with_context(|| format!("{name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// The server's `/metrics`, as name{labels} → value.
fn scrape(port: u16) -> Result<BTreeMap<String, f64>> {
    let text = crate::exec::output(Command::new("curl").args([
        "-skf",
        "--max-time",
        "10",
        &format!("https://127.0.0.1:{port}/metrics"),
    ]))?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect())
}

fn delta(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>, key: &str) -> f64 {
    b.get(key).copied().unwrap_or(0.0) - a.get(key).copied().unwrap_or(0.0)
}

/// The q-quantile of the histogram `name` over the window, interpolated within a bucket.
fn quantile(
    a: &BTreeMap<String, f64>,
    b: &BTreeMap<String, f64>,
    name: &str,
    q: f64,
) -> Option<f64> {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut buckets: Vec<(f64, f64)> = b
        .keys()
        .filter_map(|k| {
            let le = k.strip_prefix(&prefix)?.strip_suffix("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, delta(a, b, k)))
        })
        .collect();
    buckets.sort_by(|x, y| x.0.total_cmp(&y.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let target = q * total;
    let mut lower = (0.0, 0.0);
    for (le, count) in buckets {
        if count >= target {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let span = count - lower.1;
            let frac = if span > 0.0 {
                (target - lower.1) / span
            } else {
                1.0
            };
            return Some(lower.0 + frac * (le - lower.0));
        }
        lower = (le, count);
    }
    None
}

/// Runs the benchmark.
pub fn run(opts: &Options) -> Result<()> {
    ensure!(
        Command::new("curl")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok(),
        "bench-ingest scrapes /metrics with curl: apt-get install curl"
    );
    let root = crate::vm::workspace_root()?;
    crate::exec::run(Command::new("cargo").current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "kpulse-aggregator-api",
        "--bin",
        "kpulse-aggregator-api",
    ]))?;
    crate::exec::run(Command::new("cargo").current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "kpulse-agent",
        "--example",
        "loadgen",
    ]))?;
    let release = root.join("target/release");
    let server_bin = release.join("kpulse-aggregator-api");
    let loadgen_bin = release.join("examples/loadgen");
    let dir = std::env::temp_dir().join(format!("kpulse-bench-ingest-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let result = measure(opts, &dir, &server_bin, &loadgen_bin);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn measure(opts: &Options, dir: &Path, server_bin: &Path, loadgen_bin: &Path) -> Result<()> {
    let ca = dir.join("ca");
    crate::exec::run(
        Command::new(loadgen_bin)
            .arg("--ca-dir")
            .arg(&ca)
            .arg("--init-only"),
    )?;
    // A Kubernetes API that is not there: the benchmark needs no TokenReview (agents use
    // client certificates) and reads /metrics anonymously (an always-allowed path).
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: none\n  cluster: {server: \"http://127.0.0.1:9\"}\nusers:\n- name: u\n  user: {token: x}\ncontexts:\n- name: c\n  context: {cluster: none, user: u}\ncurrent-context: c\n",
    )?;
    let (api_port, ingest_port) = (crate::exec::free_port()?, crate::exec::free_port()?);
    // As many descriptors as allowed: a stream per simulated node on each side.
    let nofile = "ulimit -n \"$(ulimit -Hn)\" && exec \"$@\"";
    let server = Killed(
        Command::new("bash")
            .args(["-c", nofile, "server"])
            .arg(server_bin)
            .args([
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &api_port.to_string(),
            ])
            .args(["--ingest-port", &ingest_port.to_string()])
            .arg("--cert-dir")
            .arg(dir.join("certs"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--authentication-skip-lookup", "--anonymous-auth"])
            .arg("--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics")
            .arg("--agent-client-ca-file")
            .arg(ca.join("ca.crt"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("server.log"))?)
            .spawn()
            .context("starting the server")?,
    );
    let server_pid = server.0.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    while scrape(api_port).is_err() {
        ensure!(
            Instant::now() < deadline,
            "the server did not answer within 20 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The load generator shares this machine with the server: run it at the lowest
    // priority so that the server gets the CPU it asks for, as it would on its own node.
    let mut loadgen = Killed(
        Command::new("nice")
            .args(["-n", "19", "bash", "-c", nofile, "loadgen"])
            .arg(loadgen_bin)
            .arg("--ca-dir")
            .arg(&ca)
            .args(["--server", &format!("127.0.0.1:{ingest_port}")])
            .args(["--nodes", &opts.nodes.to_string()])
            .args(["--pods", &opts.pods.to_string()])
            .args(["--containers", &opts.containers.to_string()])
            .args(["--ramp-secs", &opts.ramp_secs.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("loadgen.log"))?)
            .spawn()
            .context("starting the load generator")?,
    );
    let loadgen_pid = loadgen.0.id();
    eprintln!(
        "bench-ingest: {} nodes × {} pods × {} containers; ramp {} s, warm-up {} s, measuring {} s",
        opts.nodes, opts.pods, opts.containers, opts.ramp_secs, opts.warmup_secs, opts.measure_secs
    );
    std::thread::sleep(Duration::from_secs(opts.ramp_secs + opts.warmup_secs));
    if let Some(status) = loadgen.0.try_wait()? {
        bail!("the load generator exited early: {status} (see its log)");
    }
    let m0 = scrape(api_port)?;
    let (cpu0, lg0, t0) = (
        cpu_seconds(server_pid)?,
        cpu_seconds(loadgen_pid)?,
        Instant::now(),
    );
    std::thread::sleep(Duration::from_secs(opts.measure_secs));
    let m1 = scrape(api_port)?;
    let (cpu1, lg1, elapsed) = (
        cpu_seconds(server_pid)?,
        cpu_seconds(loadgen_pid)?,
        t0.elapsed(),
    );
    let (rss, hwm) = rss_mib(server_pid)?;
    let secs = elapsed.as_secs_f64();
    let visible = "kpulse_aggregator_ingest_to_visible_seconds";
    let messages = delta(&m0, &m1, &format!("{visible}_count"));
    let p50 = quantile(&m0, &m1, visible, 0.50);
    let p99 = quantile(&m0, &m1, visible, 0.99);
    let in_server = "kpulse_aggregator_ingest_received_to_visible_seconds";
    let (s50, s99) = (
        quantile(&m0, &m1, in_server, 0.50),
        quantile(&m0, &m1, in_server, 0.99),
    );
    let bytes = delta(&m0, &m1, "kpulse_aggregator_ingest_received_bytes_total");
    let stored_nodes = m1
        .get("kpulse_aggregator_store_nodes")
        .copied()
        .unwrap_or(0.0);
    let containers = m1
        .get("kpulse_aggregator_store_containers")
        .copied()
        .unwrap_or(0.0);
    let streams = m1
        .get("kpulse_aggregator_ingest_streams")
        .copied()
        .unwrap_or(0.0);
    let ms = |v: Option<f64>| v.map_or("n/a".to_string(), |s| format!("{:.1} ms", s * 1e3));
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| load | {} nodes × {} pods × {} containers at 1 Hz ({} streams open, {} nodes and {} containers stored) |",
        opts.nodes, opts.pods, opts.containers, streams, stored_nodes, containers
    );
    println!(
        "| server CPU | {:.2} cores (utime+stime over {secs:.0} s) |",
        (cpu1 - cpu0) / secs
    );
    println!("| server RSS | {rss:.0} MiB at the end, peak {hwm:.0} MiB |");
    println!(
        "| batches made visible | {:.0}/s (expected {}/s) |",
        messages / secs,
        opts.nodes
    );
    println!(
        "| ingest→visible in the server (last byte received → store) | p50 {}, p99 {} |",
        ms(s50),
        ms(s99)
    );
    println!(
        "| agent send → visible (includes the load generator's own queueing on this shared host) | p50 {}, p99 {} |",
        ms(p50),
        ms(p99)
    );
    println!(
        "| wire bytes per node | {:.1} KiB/s |",
        bytes / secs / opts.nodes.max(1) as f64 / 1024.0
    );
    println!(
        "| load generator CPU (not the server's) | {:.2} cores |",
        (lg1 - lg0) / secs
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let a = BTreeMap::new();
        let b: BTreeMap<String, f64> = [
            ("h_bucket{le=\"0.01\"}", 50.0),
            ("h_bucket{le=\"0.02\"}", 90.0),
            ("h_bucket{le=\"0.1\"}", 100.0),
            ("h_bucket{le=\"+Inf\"}", 100.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(quantile(&a, &b, "h", 0.5), Some(0.01));
        let p99 = quantile(&a, &b, "h", 0.99).expect("p99");
        assert!((p99 - 0.092).abs() < 1e-9, "{p99}");
        assert_eq!(quantile(&a, &a, "h", 0.5), None);
    }
}
