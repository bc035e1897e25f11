//! `cargo xtask bench-ingest`: one aggregator-api replica ingesting many simulated agents
//! (the agent's own shipping code, in the `loadgen` example), measured from outside.
//!
//! Steps: build release binaries; create the simulated agents' CA; start the server on
//! loopback with that CA as `--agent-client-ca-file`; start the load generator; after the
//! ramp and a warm-up, measure for `--measure-secs`: the server's CPU time (`/proc/PID/stat`
//! utime+stime, so the load generator's own CPU is not counted), its RSS (`VmRSS`, peak
//! `VmHWM`), bytes received per node per second and the ingest→visible latency histogram
//! (`/metrics`, differences between the start and the end of the window). Prints a Markdown
//! table for docs/benchmarks.md. The window starts once every stream is up (an error if
//! they are not within the ramp and 120 s), and the server keeps a node for three of its
//! intervals (`--metric-expiry`, at least the default 10 s), as at the agent's 1 s. With
//! `--against BINARY` another server binary (an earlier
//! build) runs at the same time under its own load generator of the same shape, over the
//! same window: a side by side in which both share the machine alike.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::harness::{
    self, cpu_seconds, delta, ms, quantile, rss_mib, value, Agents, Pki, Server, ServerAuth, Stop,
};

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
    /// Each simulated agent's interval between batches, in milliseconds (the agent's is
    /// 1,000): a longer one gives many streams at a reduced rate on this small machine.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..))]
    resolution_ms: u64,
    /// Loopback addresses the server's agent port is reached at (127.0.0.1 …): each node
    /// streams to one of them, so more than about 28,000 streams (the ephemeral ports per
    /// destination address) reach the one server. With more than one the port listens on
    /// every address.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..))]
    addresses: u8,
    /// Another server binary (an earlier build) measured at the same time as this build's,
    /// each under its own load generator of the same shape: the table has a column for
    /// each.
    #[arg(long, value_name = "SERVER_BINARY", conflicts_with = "custom_metrics")]
    against: Option<PathBuf>,
    /// Measure twice in one run, with a fresh server each time: the agents as by default,
    /// then sending pressure and throttling too (`kpulse-agent run --custom-metrics`, every
    /// figure for every pod and container); the table has one column for each.
    #[arg(long)]
    custom_metrics: bool,
}

/// Runs the benchmark.
pub fn run(opts: &Options) -> Result<()> {
    harness::require_curl("bench-ingest")?;
    let stop = Stop::install()?;
    let bins = harness::release_binaries(false)?;
    let dir = harness::Scratch::new("bench-ingest")?;
    let phases: &[bool] = if opts.custom_metrics {
        &[false, true]
    } else {
        &[false]
    };
    if let Some(against) = &opts.against {
        anyhow::ensure!(
            against.is_file(),
            "--against {}: no such file",
            against.display()
        );
        let shape = opts.shape(false);
        let (a, b) = match measure_side_by_side(&shape, &dir.dir, &bins, against, &stop) {
            Ok(samples) => samples,
            Err(e) => {
                dir.keep();
                return Err(e);
            }
        };
        print_table(
            &["this build", &format!("`{}`", against.display())],
            &[rows(&shape, &a, 2), rows(&shape, &b, 2)],
        );
        return Ok(());
    }
    let mut columns = Vec::new();
    for (i, signals) in phases.iter().enumerate() {
        let phase_dir = dir.dir.join(format!("phase-{i}"));
        std::fs::create_dir_all(&phase_dir)?;
        match measure_rows(opts, &phase_dir, &bins, &stop, *signals) {
            Ok(column) => columns.push(column),
            Err(e) => {
                dir.keep();
                return Err(e);
            }
        }
    }
    let head: Vec<&str> = phases
        .iter()
        .map(|s| {
            if *s {
                "with pressure and throttling"
            } else {
                "value"
            }
        })
        .collect();
    print_table(&head, &columns);
    Ok(())
}

/// The Markdown table: a column per run, a row per measure.
fn print_table(head: &[&str], columns: &[Vec<(String, String)>]) {
    println!("| measure | {} |", head.join(" | "));
    println!("|---|{}", "---|".repeat(head.len()));
    let Some(first) = columns.first() else {
        return;
    };
    for (r, (label, _)) in first.iter().enumerate() {
        let cells: Vec<&str> = columns
            .iter()
            .map(|c| c.get(r).map_or("", |(_, v)| v.as_str()))
            .collect();
        println!("| {label} | {} |", cells.join(" | "));
    }
}

/// What one run simulates.
#[derive(Clone, Debug)]
pub struct Shape {
    /// Simulated nodes, a stream each.
    pub nodes: usize,
    /// Pods per node.
    pub pods: usize,
    /// Containers per pod.
    pub containers: usize,
    /// Each agent's interval between batches.
    pub resolution_ms: u64,
    /// Loopback addresses the server's agent port is reached at.
    pub addresses: u8,
    /// Seconds over which the agents connect.
    pub ramp_secs: u64,
    /// Seconds of steady state before measuring.
    pub warmup_secs: u64,
    /// Seconds measured.
    pub measure_secs: u64,
    /// Pressure and throttling too (`--custom-metrics`).
    pub signals: bool,
}

impl Shape {
    /// Batches a second the agents send in all.
    pub fn batches_per_sec(&self) -> f64 {
        self.nodes as f64 * 1000.0 / self.resolution_ms as f64
    }
}

/// One run's measurements, from outside the server (`/proc`) and from its `/metrics`.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Seconds measured.
    pub secs: f64,
    /// The server's CPU seconds (utime + stime) over them.
    pub cpu_secs: f64,
    /// The load generator's CPU seconds over them.
    pub loadgen_cpu_secs: f64,
    /// The server's RSS at the end, MiB.
    pub rss_mib: f64,
    /// Its peak RSS, MiB.
    pub hwm_mib: f64,
    /// Its open file descriptors at the end.
    pub fds: usize,
    /// The host's TCP memory at the end (both ends of every stream), KiB.
    pub tcp_kib: f64,
    /// Batches made visible over the window.
    pub batches: f64,
    /// Bytes received over the window.
    pub bytes: f64,
    /// Streams open at the end.
    pub streams: f64,
    /// Nodes stored at the end.
    pub stored_nodes: f64,
    /// Containers stored at the end.
    pub stored_containers: f64,
    /// Agent send → visible, p50 and p99 (seconds).
    pub visible: (Option<f64>, Option<f64>),
    /// Last byte received → visible in the server, p50 and p99 (seconds).
    pub in_server: (Option<f64>, Option<f64>),
}

impl Sample {
    /// The server's cores over the window.
    pub fn cores(&self) -> f64 {
        self.cpu_secs / self.secs
    }

    /// Batches made visible a second.
    pub fn batches_per_sec(&self) -> f64 {
        self.batches / self.secs
    }
}

impl Options {
    /// The run the flags ask for.
    fn shape(&self, signals: bool) -> Shape {
        Shape {
            nodes: self.nodes,
            pods: self.pods,
            containers: self.containers,
            resolution_ms: self.resolution_ms,
            addresses: self.addresses,
            ramp_secs: self.ramp_secs,
            warmup_secs: self.warmup_secs,
            measure_secs: self.measure_secs,
            signals,
        }
    }
}

/// One measurement: the table's rows, `(measure, value)`.
fn measure_rows(
    opts: &Options,
    dir: &Path,
    bins: &harness::Binaries,
    stop: &Stop,
    signals: bool,
) -> Result<Vec<(String, String)>> {
    let shape = opts.shape(signals);
    let s = measure(&shape, dir, bins, stop)?;
    Ok(rows(&shape, &s, 1))
}

/// Runs one server under the load generator as `shape` says and measures it.
pub fn measure(shape: &Shape, dir: &Path, bins: &harness::Binaries, stop: &Stop) -> Result<Sample> {
    let mut run = Running::start(shape, dir, bins, stop)?;
    run.wait_streams(stop)?;
    stop.sleep(Duration::from_secs(shape.warmup_secs))?;
    let begun = run.begin()?;
    stop.sleep(Duration::from_secs(shape.measure_secs))?;
    run.end(&begun)
}

/// A server and its load generator, running.
struct Running {
    shape: Shape,
    server: Server,
    server_proc: harness::Proc,
    loadgen: harness::Proc,
}

/// The counters at the start of the measured window.
struct Begun {
    metrics: harness::Metrics,
    cpu: f64,
    loadgen_cpu: f64,
    at: Instant,
}

impl Running {
    /// Starts the server of `bins`, then its load generator, as `shape` says.
    fn start(shape: &Shape, dir: &Path, bins: &harness::Binaries, stop: &Stop) -> Result<Running> {
        let pki = Pki::create(&bins.loadgen, &dir.join("ca"))?;
        // A Kubernetes API that is not there: the benchmark needs no TokenReview (agents
        // use client certificates) and reads /metrics anonymously (an always-allowed path).
        let mut server = Server::new(
            dir,
            &pki.ca,
            ServerAuth::AnonymousMetrics {
                kubeconfig: dir.join("kubeconfig"),
            },
        )?;
        let servers = server.ingest_addresses(shape.addresses);
        // A node kept between two of its batches at a reduced rate, as at the agent's 1 s
        // with the default 10 s.
        let expiry_ms = (3 * shape.resolution_ms).max(10_000);
        server.flag("--metric-expiry", format!("{expiry_ms}ms"));
        let mut server_proc = server.start(&bins.server, &dir.join("server.log"))?;
        server.wait_answering(&mut server_proc, Duration::from_secs(20), stop)?;
        let loadgen = Agents {
            nodes: shape.nodes,
            pods: shape.pods,
            containers: shape.containers,
            ramp_secs: shape.ramp_secs,
            servers: &servers,
            spread: servers.len() > 1,
            resolution_ms: shape.resolution_ms,
            // The server's CPU is what is measured: it gets the CPU first.
            nice: true,
            log_filter: None,
            custom_metrics: shape.signals,
            node_prefix: None,
        }
        .start(
            &bins.loadgen,
            &pki,
            &dir.join("loadgen.log"),
            &dir.join("loadgen.out"),
        )?;
        eprintln!(
            "bench-ingest: {} ({}): {} nodes × {} pods × {} containers, a batch every {} ms; \
             ramp {} s, warm-up {} s, measuring {} s",
            bins.server.display(),
            dir.display(),
            shape.nodes,
            shape.pods,
            shape.containers,
            shape.resolution_ms,
            shape.ramp_secs,
            shape.warmup_secs,
            shape.measure_secs
        );
        Ok(Running {
            shape: shape.clone(),
            server,
            server_proc,
            loadgen,
        })
    }

    /// Waits out the ramp, then until every stream is up: the ramp is what the load
    /// generator aims at, and on a busy machine the handshakes may take longer.
    fn wait_streams(&mut self, stop: &Stop) -> Result<()> {
        let shape = &self.shape;
        let deadline = Instant::now() + Duration::from_secs(shape.ramp_secs + 120);
        loop {
            self.loadgen.check_running()?;
            self.server_proc.check_running()?;
            let streams = value(&self.server.scrape()?, "kpulse_aggregator_ingest_streams");
            if streams >= shape.nodes as f64 {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{streams} of {} streams up {} s after the start; see {}",
                shape.nodes,
                120 + shape.ramp_secs,
                self.loadgen.log.display()
            );
            stop.sleep(Duration::from_secs(1))?;
        }
    }

    /// The counters at the start of the window.
    fn begin(&mut self) -> Result<Begun> {
        self.loadgen.check_running()?;
        Ok(Begun {
            metrics: self.server.scrape()?,
            cpu: cpu_seconds(self.server_proc.pid())?,
            loadgen_cpu: cpu_seconds(self.loadgen.pid())?,
            at: Instant::now(),
        })
    }

    /// The window's measurements; stops both processes.
    fn end(self, begun: &Begun) -> Result<Sample> {
        let m1 = self.server.scrape()?;
        let (cpu1, lg1, elapsed) = (
            cpu_seconds(self.server_proc.pid())?,
            cpu_seconds(self.loadgen.pid())?,
            begun.at.elapsed(),
        );
        let (rss, hwm) = rss_mib(self.server_proc.pid())?;
        let fds = open_files(self.server_proc.pid())?;
        let tcp_kib = tcp_memory_pages()? as f64 * page_size()? as f64 / 1024.0;
        let m0 = &begun.metrics;
        let visible = "kpulse_aggregator_ingest_to_visible_seconds";
        let in_server = "kpulse_aggregator_ingest_received_to_visible_seconds";
        Ok(Sample {
            secs: elapsed.as_secs_f64(),
            cpu_secs: cpu1 - begun.cpu,
            loadgen_cpu_secs: lg1 - begun.loadgen_cpu,
            rss_mib: rss,
            hwm_mib: hwm,
            fds,
            tcp_kib,
            batches: delta(m0, &m1, &format!("{visible}_count")),
            bytes: delta(m0, &m1, "kpulse_aggregator_ingest_received_bytes_total"),
            streams: value(&m1, "kpulse_aggregator_ingest_streams"),
            stored_nodes: value(&m1, "kpulse_aggregator_store_nodes"),
            stored_containers: value(&m1, "kpulse_aggregator_store_containers"),
            visible: (
                quantile(m0, &m1, visible, "", 0.50),
                quantile(m0, &m1, visible, "", 0.99),
            ),
            in_server: (
                quantile(m0, &m1, in_server, "", 0.50),
                quantile(m0, &m1, in_server, "", 0.99),
            ),
        })
        // Dropping the processes stops them.
    }
}

/// This build and `against` at once, each under its own load generator of the same shape,
/// started, warmed up and measured over the same window: both share the machine alike.
fn measure_side_by_side(
    shape: &Shape,
    dir: &Path,
    bins: &harness::Binaries,
    against: &Path,
    stop: &Stop,
) -> Result<(Sample, Sample)> {
    let other = harness::Binaries {
        server: against.to_path_buf(),
        loadgen: bins.loadgen.clone(),
    };
    let (dir_a, dir_b) = (dir.join("this"), dir.join("against"));
    for d in [&dir_a, &dir_b] {
        std::fs::create_dir_all(d)?;
    }
    let mut a = Running::start(shape, &dir_a, bins, stop)?;
    let mut b = Running::start(shape, &dir_b, &other, stop)?;
    a.wait_streams(stop)?;
    b.wait_streams(stop)?;
    stop.sleep(Duration::from_secs(shape.warmup_secs))?;
    let (begun_a, begun_b) = (a.begin()?, b.begin()?);
    stop.sleep(Duration::from_secs(shape.measure_secs))?;
    let sample_b = b.end(&begun_b)?;
    let sample_a = a.end(&begun_a)?;
    Ok((sample_a, sample_b))
}

/// The table's rows for one run; `runs` is how many ran at once (the host's TCP memory is
/// every run's).
fn rows(shape: &Shape, s: &Sample, runs: usize) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut row = |label: &str, value: String| rows.push((label.to_owned(), value));
    row(
        "load",
        format!(
            "{} nodes × {} pods × {} containers, a batch every {} ms{} ({} streams open, {} nodes \
             and {} containers stored){}",
            shape.nodes,
            shape.pods,
            shape.containers,
            shape.resolution_ms,
            if shape.addresses > 1 {
                format!(", to {} loopback addresses", shape.addresses)
            } else {
                String::new()
            },
            s.streams,
            s.stored_nodes,
            s.stored_containers,
            if shape.signals {
                ", every pod and container with pressure and throttling"
            } else {
                ""
            }
        ),
    );
    row(
        "server CPU",
        format!("{:.2} cores (utime+stime over {:.0} s)", s.cores(), s.secs),
    );
    row(
        "server RSS",
        format!("{:.0} MiB at the end, peak {:.0} MiB", s.rss_mib, s.hwm_mib),
    );
    row(
        "batches made visible",
        format!(
            "{:.0}/s (expected {:.0}/s)",
            s.batches_per_sec(),
            shape.batches_per_sec()
        ),
    );
    row(
        "server CPU per batch made visible",
        format!("{:.0} µs", s.cpu_secs / s.batches.max(1.0) * 1e6),
    );
    row(
        "server file descriptors",
        format!(
            "{} ({:.2} per stream)",
            s.fds,
            s.fds as f64 / s.streams.max(1.0)
        ),
    );
    row(
        if runs > 1 {
            "kernel TCP memory, the whole host (both ends of every stream of every run)"
        } else {
            "kernel TCP memory, the whole host (both ends of every stream)"
        },
        format!(
            "{:.0} KiB ({:.2} KiB per stream)",
            s.tcp_kib,
            s.tcp_kib / (s.streams * runs as f64).max(1.0)
        ),
    );
    row(
        "ingest→visible in the server (last byte received → store)",
        format!("p50 {}, p99 {}", ms(s.in_server.0), ms(s.in_server.1)),
    );
    row(
        "agent send → visible (includes the load generator's own queueing on this shared host)",
        format!("p50 {}, p99 {}", ms(s.visible.0), ms(s.visible.1)),
    );
    row(
        "wire bytes per node",
        format!(
            "{:.1} KiB/s",
            s.bytes / s.secs / shape.nodes.max(1) as f64 / 1024.0
        ),
    );
    row(
        "load generator CPU (not the server's)",
        format!("{:.2} cores", s.loadgen_cpu_secs / s.secs),
    );
    rows
}

/// Open file descriptors of process `pid`.
pub fn open_files(pid: u32) -> Result<usize> {
    let dir = format!("/proc/{pid}/fd");
    Ok(std::fs::read_dir(&dir)
        .with_context(|| format!("cannot list {dir}"))?
        .count())
}

/// The kernel's page size in bytes (`getconf PAGESIZE`): sockstat counts in pages.
fn page_size() -> Result<u64> {
    let out = crate::exec::output(std::process::Command::new("getconf").arg("PAGESIZE"))?;
    out.trim()
        .parse()
        .with_context(|| format!("getconf PAGESIZE printed {out:?}"))
}

/// The kernel's TCP memory (pages, `mem` of `TCP:` in /proc/net/sockstat): every socket of
/// the host, so both ends of a loopback stream.
fn tcp_memory_pages() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/net/sockstat").context("/proc/net/sockstat")?;
    sockstat_tcp_mem(&text).context("/proc/net/sockstat: no `TCP: … mem N`")
}

fn sockstat_tcp_mem(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("TCP:"))?;
    let mut fields = line.split_whitespace();
    while let Some(f) = fields.next() {
        if f == "mem" {
            return fields.next()?.parse().ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_memory_is_read_from_sockstat() {
        let text =
            "sockets: used 170\nTCP: inuse 7 orphan 0 tw 2 alloc 9 mem 3\nUDP: inuse 1 mem 0\n";
        assert_eq!(sockstat_tcp_mem(text), Some(3));
        assert_eq!(sockstat_tcp_mem("UDP: inuse 1 mem 0\n"), None);
    }
}
