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
    path::Path,
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
    let mut columns = Vec::new();
    for (i, signals) in phases.iter().enumerate() {
        let phase_dir = dir.dir.join(format!("phase-{i}"));
        std::fs::create_dir_all(&phase_dir)?;
        columns.push(measure(opts, &phase_dir, &bins, &stop, *signals)?);
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
    println!("| measure | {} |", head.join(" | "));
    println!("|---|{}", "---|".repeat(head.len()));
    for (r, (label, _)) in columns[0].iter().enumerate() {
        let cells: Vec<&str> = columns
            .iter()
            .map(|c| c.get(r).map_or("", |(_, v)| v.as_str()))
            .collect();
        println!("| {label} | {} |", cells.join(" | "));
    }
    Ok(())
}

/// One measurement: the table's rows, `(measure, value)`.
fn measure(
    opts: &Options,
    dir: &Path,
    bins: &harness::Binaries,
    stop: &Stop,
    signals: bool,
) -> Result<Vec<(String, String)>> {
    let pki = Pki::create(&bins.loadgen, &dir.join("ca"))?;
    // A Kubernetes API that is not there: the benchmark needs no TokenReview (agents use
    // client certificates) and reads /metrics anonymously (an always-allowed path).
    let mut server = Server::new(
        dir,
        &pki.ca,
        ServerAuth::AnonymousMetrics {
            kubeconfig: dir.join("kubeconfig"),
        },
    )?;
    let servers = server.ingest_addresses(opts.addresses);
    let mut server_proc = server.start(&bins.server, &dir.join("server.log"))?;
    server.wait_answering(&mut server_proc, Duration::from_secs(20), stop)?;
    let mut loadgen = Agents {
        nodes: opts.nodes,
        pods: opts.pods,
        containers: opts.containers,
        ramp_secs: opts.ramp_secs,
        servers: &servers,
        spread: servers.len() > 1,
        resolution_ms: opts.resolution_ms,
        // The server's CPU is what is measured: it gets the CPU first.
        nice: true,
        log_filter: None,
        custom_metrics: signals,
    }
    .start(
        &bins.loadgen,
        &pki,
        &dir.join("loadgen.log"),
        &dir.join("loadgen.out"),
    )?;
    eprintln!(
        "bench-ingest: {} nodes × {} pods × {} containers; ramp {} s, warm-up {} s, measuring {} s",
        opts.nodes, opts.pods, opts.containers, opts.ramp_secs, opts.warmup_secs, opts.measure_secs
    );
    stop.sleep(Duration::from_secs(opts.ramp_secs + opts.warmup_secs))?;
    loadgen.check_running()?;
    let m0 = server.scrape()?;
    let (cpu0, lg0, t0) = (
        cpu_seconds(server_proc.pid())?,
        cpu_seconds(loadgen.pid())?,
        Instant::now(),
    );
    stop.sleep(Duration::from_secs(opts.measure_secs))?;
    let m1 = server.scrape()?;
    let (cpu1, lg1, elapsed) = (
        cpu_seconds(server_proc.pid())?,
        cpu_seconds(loadgen.pid())?,
        t0.elapsed(),
    );
    let (rss, hwm) = rss_mib(server_proc.pid())?;
    let fds = open_files(server_proc.pid())?;
    let tcp_pages = tcp_memory_pages()?;
    let page_kib = page_size()? as f64 / 1024.0;
    let secs = elapsed.as_secs_f64();
    let visible = "kpulse_aggregator_ingest_to_visible_seconds";
    let messages = delta(&m0, &m1, &format!("{visible}_count"));
    let p50 = quantile(&m0, &m1, visible, "", 0.50);
    let p99 = quantile(&m0, &m1, visible, "", 0.99);
    let in_server = "kpulse_aggregator_ingest_received_to_visible_seconds";
    let (s50, s99) = (
        quantile(&m0, &m1, in_server, "", 0.50),
        quantile(&m0, &m1, in_server, "", 0.99),
    );
    let bytes = delta(&m0, &m1, "kpulse_aggregator_ingest_received_bytes_total");
    let stored_nodes = value(&m1, "kpulse_aggregator_store_nodes");
    let containers = value(&m1, "kpulse_aggregator_store_containers");
    let streams = value(&m1, "kpulse_aggregator_ingest_streams");
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut row = |label: &str, value: String| rows.push((label.to_owned(), value));
    row(
        "load",
        format!(
            "{} nodes × {} pods × {} containers, a batch every {} ms{} ({} streams open, {} nodes \
             and {} containers stored){}",
            opts.nodes,
            opts.pods,
            opts.containers,
            opts.resolution_ms,
            if opts.addresses > 1 {
                format!(", to {} loopback addresses", opts.addresses)
            } else {
                String::new()
            },
            streams,
            stored_nodes,
            containers,
            if signals {
                ", every pod and container with pressure and throttling"
            } else {
                ""
            }
        ),
    );
    row(
        "server CPU",
        format!(
            "{:.2} cores (utime+stime over {secs:.0} s)",
            (cpu1 - cpu0) / secs
        ),
    );
    row(
        "server RSS",
        format!("{rss:.0} MiB at the end, peak {hwm:.0} MiB"),
    );
    row(
        "batches made visible",
        format!(
            "{:.0}/s (expected {:.0}/s)",
            messages / secs,
            opts.nodes as f64 * 1000.0 / opts.resolution_ms as f64
        ),
    );
    row(
        "server CPU per batch made visible",
        format!("{:.0} µs", (cpu1 - cpu0) / messages.max(1.0) * 1e6),
    );
    row(
        "server file descriptors",
        format!("{fds} ({:.2} per stream)", fds as f64 / streams.max(1.0)),
    );
    row(
        "kernel TCP memory, the whole host (both ends of every stream)",
        format!(
            "{tcp_pages} pages ({:.2} KiB per stream)",
            tcp_pages as f64 * page_kib / streams.max(1.0)
        ),
    );
    row(
        "ingest→visible in the server (last byte received → store)",
        format!("p50 {}, p99 {}", ms(s50), ms(s99)),
    );
    row(
        "agent send → visible (includes the load generator's own queueing on this shared host)",
        format!("p50 {}, p99 {}", ms(p50), ms(p99)),
    );
    row(
        "wire bytes per node",
        format!(
            "{:.1} KiB/s",
            bytes / secs / opts.nodes.max(1) as f64 / 1024.0
        ),
    );
    row(
        "load generator CPU (not the server's)",
        format!("{:.2} cores", (lg1 - lg0) / secs),
    );
    drop(loadgen);
    drop(server_proc);
    Ok(rows)
}

/// Open file descriptors of process `pid`.
fn open_files(pid: u32) -> Result<usize> {
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
