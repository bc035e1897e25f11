//! `cargo xtask soak`: one aggregator-api replica under steady load for a long time —
//! simulated agents at 1 Hz and a reader checking every answer — with the end-to-end count
//! of what was sent and stored, the server's RSS over time, and pass/fail criteria.
//!
//! Steps: build the release server and load generator; make the agents' CA and a user
//! certificate; start the server (client certificates for agents and users,
//! `--authorization-mode AlwaysAllow`); start `--agents` simulated agents (the `loadgen`
//! example, at the normal priority) and wait until every node and pod is stored; start the
//! reader (`loadgen --read-api`, `--reads-per-sec`, the mix and checks of
//! `loadgen/read.rs`). The soak's clock starts then: `--duration` long, the first `--warmup`
//! of it not judged. The server's RSS (`VmRSS`) is sampled every `--rss-interval` (judged);
//! it is also read every second, and each window's lowest and mean readings are reported
//! beside the samples, with the trend (least squares), to tell a leak (a rising trend and
//! floor) from responses being built (a list of every PodMetrics in JSON holds about 35 MiB
//! while it is built: 17.7 MB of body at 1,000 nodes × 30 pods). Its CPU and the
//! `/metrics` counters are taken at the end of the warm-up and at the end.
//!
//! At the end the reader stops (its summary: reads, errors by class, latency), then the
//! agents stop producing, drain their queues and end their streams cleanly (their summary:
//! ticks produced, written, dropped, never sent, reconnects, stream errors); then the
//! server's count of stored batches (`kpulse_aggregator_ingest_to_visible_seconds_count`)
//! is read. **Lost** = produced − stored.
//!
//! Fails (exit code 1, after the report) unless: no reader error, no stream error or
//! reconnect, no tick dropped or unsent, nothing lost, no 5xx or failed API answer and no
//! refused stream in the server's `/metrics`, no ERROR line in its log, the reader kept its
//! rate (≥ 95 % of `--reads-per-sec`), and every RSS sample after the warm-up is within
//! ±`--rss-tolerance-percent` of their mean. Prints the report as Markdown (and writes it,
//! and the RSS series as CSV, to `--report`); the logs are kept with `--keep-logs` or when
//! it fails.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use crate::{
    demo::parse_duration,
    harness::{
        self, cpu_seconds, delta, ms, quantile, read_summary, rss_mib, sum, value, Agents,
        Binaries, Fleet, Metrics, Pki, Proc, Server, ServerAuth, Stop, Waiter,
    },
};

/// `cargo xtask soak` flags.
#[derive(clap::Args, Debug)]
pub struct Options {
    /// The simulated fleet.
    #[command(flatten)]
    fleet: Fleet,
    /// Authenticated reads of the metrics API per second.
    #[arg(long, default_value_t = 50.0)]
    reads_per_sec: f64,
    /// Length of the soak, warm-up included, from the moment every agent streams and the
    /// reader starts (e.g. 30m, 90s).
    #[arg(long, value_parser = parse_duration, default_value = "30m")]
    duration: Duration,
    /// The length in minutes (instead of --duration).
    #[arg(long, conflicts_with = "duration")]
    minutes: Option<u64>,
    /// The first part of the soak, not judged (RSS grows to its working size).
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    warmup: Duration,
    /// Interval of the RSS samples.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    rss_interval: Duration,
    /// Largest deviation of an RSS sample after the warm-up from their mean, in percent.
    #[arg(long, default_value_t = 5.0)]
    rss_tolerance_percent: f64,
    /// Oldest served timestamp the reader accepts as fresh, in seconds before each request
    /// was sent.
    #[arg(long, default_value_t = 5)]
    max_age_secs: u64,
    /// Also write the Markdown report to this file (and the RSS series beside it, as
    /// `<name>.rss.csv`).
    #[arg(long)]
    report: Option<PathBuf>,
    /// Use the release binaries already built.
    #[arg(long)]
    no_build: bool,
    /// Keep the logs (their directory is printed) instead of removing them.
    #[arg(long)]
    keep_logs: bool,
    /// An environment variable of the server, `KEY=VALUE` (repeatable): e.g.
    /// `MIMALLOC_PURGE_DELAY=-1`, mimalloc keeping the memory it freed instead of returning
    /// it to the system after 10 ms.
    #[arg(long = "server-env")]
    server_env: Vec<String>,
}

/// One RSS window of `--rss-interval` (MiB), read every second.
#[derive(Clone, Copy, Debug)]
struct Sample {
    /// Seconds since the soak's start, at the window's end.
    t: f64,
    /// The RSS at the window's end: the sample every `--rss-interval` (judged).
    point: f64,
    /// The lowest RSS in the window: the memory the server keeps between responses (a list
    /// of every PodMetrics in JSON holds tens of MiB while it is built).
    floor: f64,
    /// The mean of the window's readings.
    mean: f64,
}

/// The RSS readings of the window being measured.
#[derive(Default)]
struct Window {
    min: Option<f64>,
    sum: f64,
    n: u32,
    last: f64,
}

impl Window {
    fn add(&mut self, mib: f64) {
        self.min = Some(self.min.map_or(mib, |m: f64| m.min(mib)));
        self.sum += mib;
        self.n += 1;
        self.last = mib;
    }

    /// The window's sample; the next window starts empty.
    fn close(&mut self, t: f64) -> Sample {
        let s = Sample {
            t,
            point: self.last,
            floor: self.min.unwrap_or(self.last),
            mean: if self.n > 0 {
                self.sum / f64::from(self.n)
            } else {
                self.last
            },
        };
        *self = Window::default();
        s
    }
}

/// Runs the soak.
pub fn run(opts: &Options) -> Result<()> {
    let duration = opts
        .minutes
        .map_or(opts.duration, |m| Duration::from_secs(m * 60));
    ensure!(
        opts.warmup < duration,
        "--warmup ({:?}) must be shorter than the soak ({duration:?})",
        opts.warmup
    );
    opts.fleet.check()?;
    harness::require_curl("soak")?;
    let stop = Stop::install()?;
    let bins = harness::release_binaries(opts.no_build)?;
    let scratch = harness::Scratch::new("soak")?;
    let dir = scratch.dir.clone();
    let result = soak(opts, duration, &dir, &bins, &stop);
    if let Ok(r) = &result {
        let _ = std::fs::write(dir.join("rss.csv"), &r.rss_csv);
    }
    if opts.keep_logs || result.as_ref().map_or(true, |r| !r.failures.is_empty()) {
        scratch.keep();
    }
    let report = result?;
    print!("{}", report.markdown);
    if let Some(path) = &opts.report {
        std::fs::write(path, &report.markdown)
            .with_context(|| format!("writing {}", path.display()))?;
        let csv = path.with_extension("rss.csv");
        std::fs::write(&csv, &report.rss_csv)
            .with_context(|| format!("writing {}", csv.display()))?;
        eprintln!(
            "soak: report in {}, RSS series in {}",
            path.display(),
            csv.display()
        );
    }
    if !report.failures.is_empty() {
        bail!("soak failed: {}", report.failures.join("; "));
    }
    Ok(())
}

struct Report {
    markdown: String,
    failures: Vec<String>,
    /// The RSS windows: seconds since the start, floor and sample (MiB).
    rss_csv: String,
}

/// What the soak measured.
struct Measured {
    duration: Duration,
    warmup: Duration,
    rss: Vec<Sample>,
    rss_at_warmup: f64,
    rss_peak: f64,
    /// Cores over the judged part: server, load generator, reader.
    cpu: (f64, f64, f64),
    /// `/metrics` at the end of the warm-up and at the end of the judged part.
    m_warm: Metrics,
    m_end: Metrics,
    /// `/metrics` after the agents ended their streams.
    m_final: Metrics,
    reader: Value,
    agents: Value,
    server_error_lines: usize,
    first_server_errors: Vec<String>,
}

fn soak(
    opts: &Options,
    duration: Duration,
    dir: &Path,
    bins: &Binaries,
    stop: &Stop,
) -> Result<Report> {
    let pki = Pki::create(&bins.loadgen, &dir.join("ca"))?;
    let mut server = Server::new(dir, &pki.ca, ServerAuth::ClientCerts(&pki))?;
    server.set_env(&opts.server_env)?;
    let server_log = dir.join("server.log");
    let mut server_proc = server.start(&bins.server, &server_log)?;
    server.wait_answering(&mut server_proc, Duration::from_secs(30), stop)?;
    let servers = [server.ingest()];
    // At the normal priority: on a busy host, agents at nice 19 fall behind their 1 Hz
    // and the reader rightly finds stale data; on their own nodes they would not.
    let agents = opts.fleet.agents(&servers, false);
    let agents_out = dir.join("loadgen.out");
    let mut loadgen = agents.start(&bins.loadgen, &pki, &dir.join("loadgen.log"), &agents_out)?;
    eprintln!(
        "soak: {} agents × {} pods × {} containers at 1 Hz, {} reads/s; ramp {} s, then {} \
         (warm-up {})",
        opts.fleet.agents,
        opts.fleet.pods,
        opts.fleet.containers,
        opts.reads_per_sec,
        opts.fleet.ramp_secs,
        human(duration),
        human(opts.warmup)
    );
    wait_stored(
        &server,
        &agents,
        opts.fleet.ramp_secs,
        [&mut server_proc, &mut loadgen],
        stop,
    )?;
    // Stored is not yet served (a node's first batch gives no rate): the reader's own check,
    // once, before the reads are judged.
    Waiter::start(bins, &pki, &server, &agents, dir, "first", 60)?
        .finish(stop)
        .context("every node and pod is stored but not all are served")?;

    let mut reader_args = vec![
        "--ca-dir".to_owned(),
        pki.dir.display().to_string(),
        "--read-api".to_owned(),
        server.api(),
        "--reads-per-sec".to_owned(),
        opts.reads_per_sec.to_string(),
        "--max-age-secs".to_owned(),
        opts.max_age_secs.to_string(),
    ];
    reader_args.extend(agents.shape());
    let reader_out = dir.join("reader.out");
    let mut reader = Proc::spawn(
        "the reader",
        &bins.loadgen,
        &reader_args,
        false,
        &dir.join("reader.log"),
        Some(&reader_out),
    )?;

    let started = Instant::now();
    let at = |d: Duration| started + d;
    let mut rss = Vec::new();
    let mut window = Window::default();
    let mut next_sample = started + opts.rss_interval;
    let mut next_progress = started + Duration::from_secs(60);
    let mut warm: Option<(f64, [f64; 3], Metrics)> = None;
    let mut rss_at_warmup = 0.0;
    let pids = [server_proc.pid(), loadgen.pid(), reader.pid()];
    let cpus = |pids: [u32; 3]| -> Result<[f64; 3]> {
        Ok([
            cpu_seconds(pids[0])?,
            cpu_seconds(pids[1])?,
            cpu_seconds(pids[2])?,
        ])
    };
    while Instant::now() < at(duration) {
        for p in [&mut server_proc, &mut loadgen, &mut reader] {
            p.check_running()?;
        }
        let now = Instant::now();
        window.add(rss_mib(pids[0])?.0);
        if now >= next_sample {
            rss.push(window.close(now.duration_since(started).as_secs_f64()));
            next_sample += opts.rss_interval;
        }
        if warm.is_none() && now >= at(opts.warmup) {
            let (mib, _) = rss_mib(pids[0])?;
            rss_at_warmup = mib;
            warm = Some((
                now.duration_since(started).as_secs_f64(),
                cpus(pids)?,
                server.scrape()?,
            ));
        }
        if now >= next_progress {
            next_progress += Duration::from_secs(60);
            let last = rss.last().map_or(0.0, |s| s.point);
            eprintln!(
                "soak: {} of {}, server RSS {last:.0} MiB",
                human(now.duration_since(started)),
                human(duration)
            );
        }
        // RSS every second (the windows' floors); events on time.
        let next = [next_sample, next_progress, at(duration)]
            .into_iter()
            .chain(warm.is_none().then(|| at(opts.warmup)))
            .min()
            .unwrap_or(now);
        stop.sleep(
            next.saturating_duration_since(Instant::now())
                .min(Duration::from_secs(1)),
        )?;
    }
    let (warm_at, cpu_warm, m_warm) = warm.context("the warm-up never ended")?;
    let (mib, rss_peak) = rss_mib(pids[0])?;
    window.add(mib);
    rss.push(window.close(started.elapsed().as_secs_f64()));
    let cpu_end = cpus(pids)?;
    let judged = started.elapsed().as_secs_f64() - warm_at;
    let m_end = server.scrape()?;

    // The reader first (the agents' end removes what it checks), then the agents.
    eprintln!("soak: stopping the reader, then the agents (drain and count)");
    reader.signal("TERM")?;
    ensure!(
        reader.wait_for(Duration::from_secs(40))?.is_some(),
        "the reader did not stop within 40 s"
    );
    let reader_summary = read_summary(&reader_out)?;
    loadgen.signal("TERM")?;
    ensure!(
        loadgen.wait_for(Duration::from_secs(60))?.is_some(),
        "the load generator did not stop within 60 s"
    );
    let agents_summary = read_summary(&agents_out)?;
    // The agents ended their streams cleanly: the server has stored all it received. Read
    // the count until it settles, in case the last batches are still being applied.
    let stored = "kpulse_aggregator_ingest_to_visible_seconds_count";
    let mut m_final = server.scrape()?;
    for _ in 0..10 {
        stop.sleep(Duration::from_millis(300))?;
        let again = server.scrape()?;
        let settled = value(&again, stored) == value(&m_final, stored);
        m_final = again;
        if settled {
            break;
        }
    }
    server_proc.stop(Duration::from_secs(10))?;
    let log = std::fs::read_to_string(&server_log).unwrap_or_default();
    let errors: Vec<String> = log
        .lines()
        .filter(|l| l.contains(" ERROR "))
        .map(str::to_owned)
        .collect();

    let measured = Measured {
        duration,
        warmup: opts.warmup,
        rss,
        rss_at_warmup,
        rss_peak,
        cpu: (
            (cpu_end[0] - cpu_warm[0]) / judged,
            (cpu_end[1] - cpu_warm[1]) / judged,
            (cpu_end[2] - cpu_warm[2]) / judged,
        ),
        m_warm,
        m_end,
        m_final,
        reader: reader_summary,
        agents: agents_summary,
        server_error_lines: errors.len(),
        first_server_errors: errors.into_iter().take(5).collect(),
    };
    Ok(report(opts, &measured))
}

/// Waits until every agent streams and every node and pod is stored.
fn wait_stored(
    server: &Server,
    agents: &Agents<'_>,
    ramp_secs: u64,
    procs: [&mut Proc; 2],
    stop: &Stop,
) -> Result<()> {
    let limit = Duration::from_secs(ramp_secs + 120);
    let deadline = Instant::now() + limit;
    let (nodes, pods) = (agents.nodes as f64, (agents.nodes * agents.pods) as f64);
    let [server_proc, loadgen] = procs;
    loop {
        server_proc.check_running()?;
        loadgen.check_running()?;
        let m = server.scrape()?;
        let (n, p, s) = (
            value(&m, "kpulse_aggregator_store_nodes"),
            value(&m, "kpulse_aggregator_store_pods"),
            value(&m, "kpulse_aggregator_ingest_streams"),
        );
        if n == nodes && p == pods && s == nodes {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "after {limit:?}: {s} streams, {n} nodes and {p} pods stored; expected {nodes}, \
             {nodes} and {pods}"
        );
        stop.sleep(Duration::from_secs(1))?;
    }
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 60, s % 60) {
        (0, s) => format!("{s} s"),
        (m, 0) => format!("{m} min"),
        (m, s) => format!("{m} min {s} s"),
    }
}

fn int(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn float(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// `(min, max, last, mean)` of the samples after `from` seconds, and the extremes' deviation
/// from the mean in percent, and the least-squares slope in MiB per hour.
struct RssStats {
    n: usize,
    min: f64,
    max: f64,
    last: f64,
    mean: f64,
    low_pct: f64,
    high_pct: f64,
    slope_per_hour: f64,
}

fn rss_stats(samples: &[Sample], from: f64, of: fn(&Sample) -> f64) -> Option<RssStats> {
    let after: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.t >= from)
        .map(|s| (s.t, of(s)))
        .collect();
    let n = after.len();
    if n == 0 {
        return None;
    }
    let mean = after.iter().map(|s| s.1).sum::<f64>() / n as f64;
    let min = after.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
    let max = after.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
    let t_mean = after.iter().map(|s| s.0).sum::<f64>() / n as f64;
    let (num, den) = after.iter().fold((0.0, 0.0), |(num, den), s| {
        (
            num + (s.0 - t_mean) * (s.1 - mean),
            den + (s.0 - t_mean).powi(2),
        )
    });
    let slope = if den > 0.0 { num / den } else { 0.0 };
    Some(RssStats {
        n,
        min,
        max,
        last: after[n - 1].1,
        mean,
        low_pct: (min - mean) / mean * 100.0,
        high_pct: (max - mean) / mean * 100.0,
        slope_per_hour: slope * 3600.0,
    })
}

fn report(opts: &Options, m: &Measured) -> Report {
    let mut failures = Vec::new();
    let mut check = |ok: bool, what: String| -> &'static str {
        if ok {
            "pass"
        } else {
            failures.push(what);
            "**FAIL**"
        }
    };
    let a = &m.agents;
    let r = &m.reader;
    let stored_name = "kpulse_aggregator_ingest_to_visible_seconds_count";
    let (produced, sent, dropped, unsent) = (
        int(&a["produced"]),
        int(&a["sent"]),
        int(&a["dropped"]),
        int(&a["unsent"]),
    );
    let stored = value(&m.m_final, stored_name) as u64;
    let lost = produced.saturating_sub(stored);
    let duplicates = stored.saturating_sub(produced);
    let stream_errors: u64 = a["stream_errors"]
        .as_object()
        .map_or(0, |o| o.values().map(int).sum());
    let reconnects = int(&a["reconnects"]);
    let reads = int(&r["reads"]);
    let read_errors = int(&r["errors"]);
    let achieved = float(&r["achieved_rps"]).unwrap_or(0.0);
    let requests = "kpulse_aggregator_requests_total";
    // Counters, as whole numbers.
    let count = |v: f64| v.max(0.0).round() as u64;
    let server_5xx = count(sum(&m.m_final, requests, |l| l.contains("code=\"5")));
    let api_failed = count(sum(&m.m_final, requests, |l| {
        l.contains("endpoint=\"api\"") && !l.contains("code=\"200\"")
    }));
    let rejected = count(sum(
        &m.m_final,
        "kpulse_aggregator_ingest_rejected_total",
        |_| true,
    ));
    let unknown = count(value(
        &m.m_final,
        "kpulse_aggregator_ingest_unknown_uid_counters_dropped_total",
    ));
    let replaced = count(value(
        &m.m_final,
        "kpulse_aggregator_ingest_sessions_replaced_total",
    ));
    let judged_secs = (m.duration - m.warmup).as_secs_f64();
    let from = m.warmup.as_secs_f64();
    let points = rss_stats(&m.rss, from, |s| s.point);
    let floors = rss_stats(&m.rss, from, |s| s.floor);
    let means = rss_stats(&m.rss, from, |s| s.mean);
    let tol = opts.rss_tolerance_percent;

    let mut md = String::new();
    let _ = writeln!(
        md,
        "## Soak: {} agents × {} pods × {} containers at 1 Hz, {} reads/s, {} (warm-up {})\n",
        opts.fleet.agents,
        opts.fleet.pods,
        opts.fleet.containers,
        opts.reads_per_sec,
        human(m.duration),
        human(m.warmup)
    );
    let env: String = opts
        .server_env
        .iter()
        .map(|e| format!(" --server-env {e}"))
        .collect();
    let _ = writeln!(
        md,
        "```sh\ncargo xtask soak --agents {} --pods {} --containers {} --reads-per-sec {} \
         --duration {}s --warmup {}s{env}\n```\n",
        opts.fleet.agents,
        opts.fleet.pods,
        opts.fleet.containers,
        opts.reads_per_sec,
        m.duration.as_secs(),
        m.warmup.as_secs()
    );
    let _ = writeln!(md, "| measure | value | criterion | result |");
    let _ = writeln!(md, "|---|---|---|---|");
    let mut row = |what: &str, value: String, criterion: &str, result: &str| {
        let _ = writeln!(md, "| {what} | {value} | {criterion} | {result} |");
    };
    let res = check(
        lost == 0 && duplicates == 0,
        format!("{lost} batches lost, {duplicates} stored twice"),
    );
    row(
        "batches produced → stored (end to end)",
        format!(
            "{produced} → {stored}: **{lost} lost**{}",
            if duplicates > 0 {
                format!(", {duplicates} more stored than produced")
            } else {
                String::new()
            }
        ),
        "0 lost",
        res,
    );
    let res = check(
        dropped == 0 && unsent == 0,
        format!("{dropped} ticks dropped from queues, {unsent} never sent"),
    );
    row(
        "agents: written to a stream / dropped from a queue / never sent",
        format!("{sent} / {dropped} / {unsent}"),
        "0 dropped, 0 unsent",
        res,
    );
    let res = check(
        stream_errors == 0 && reconnects == 0,
        format!("{stream_errors} stream errors, {reconnects} reconnects"),
    );
    row(
        "agents: stream errors / reconnects",
        format!(
            "{stream_errors} / {reconnects}{}",
            counts_suffix(&a["stream_errors"])
        ),
        "0",
        res,
    );
    let res = check(read_errors == 0, format!("{read_errors} reader errors"));
    row(
        "reads checked (200, parsed, every node/pod present, values, fresh)",
        format!(
            "{reads}, **{read_errors} errors**{}",
            counts_suffix(&r["error_classes"])
        ),
        "0 errors",
        res,
    );
    let res = check(
        achieved >= 0.95 * opts.reads_per_sec,
        format!(
            "reader achieved {achieved:.1} reads/s of {}",
            opts.reads_per_sec
        ),
    );
    row(
        "read rate achieved",
        format!("{achieved:.1}/s"),
        &format!("≥ 95 % of {}", opts.reads_per_sec),
        res,
    );
    row(
        "read latency at the reader (request → last body byte)",
        format!(
            "p50 {}, p99 {}, max {}",
            ms(float(&r["p50_ms"]).map(|v| v / 1e3)),
            ms(float(&r["p99_ms"]).map(|v| v / 1e3)),
            ms(float(&r["max_ms"]).map(|v| v / 1e3))
        ),
        "",
        "",
    );
    let dur = "kpulse_aggregator_request_duration_seconds";
    let api = "endpoint=\"api\"";
    row(
        "read latency in the server, after warm-up (arrival → response built)",
        format!(
            "p50 {}, p99 {}",
            ms(quantile(&m.m_warm, &m.m_end, dur, api, 0.50)),
            ms(quantile(&m.m_warm, &m.m_end, dur, api, 0.99))
        ),
        "",
        "",
    );
    if let Some(kinds) = r["by_kind"].as_object() {
        let text: Vec<String> = kinds
            .iter()
            .map(|(k, v)| {
                format!(
                    "{k} {} (p50 {}, p99 {})",
                    int(&v["count"]),
                    ms(float(&v["p50_ms"]).map(|x| x / 1e3)),
                    ms(float(&v["p99_ms"]).map(|x| x / 1e3))
                )
            })
            .collect();
        row("reads by kind", text.join("; "), "", "");
    }
    let res = check(
        server_5xx == 0 && api_failed == 0,
        format!("server answered {server_5xx} 5xx, {api_failed} API requests not 200"),
    );
    row(
        "server: 5xx / API answers other than 200",
        format!("{server_5xx} / {api_failed}"),
        "0",
        res,
    );
    let res = check(
        rejected == 0 && unknown == 0 && replaced == 0,
        format!(
            "server refused {rejected} streams, dropped {unknown} unknown-uid counters, \
             replaced {replaced} sessions"
        ),
    );
    row(
        "server: streams refused / unknown-uid counters / sessions replaced",
        format!("{rejected} / {unknown} / {replaced}"),
        "0",
        res,
    );
    let res = check(
        m.server_error_lines == 0,
        format!(
            "{} ERROR lines in the server's log: {:?}",
            m.server_error_lines, m.first_server_errors
        ),
    );
    row(
        "server log ERROR lines",
        m.server_error_lines.to_string(),
        "0",
        res,
    );
    let describe = |s: &RssStats| {
        format!(
            "mean {:.0} MiB; min {:.0}, max {:.0}, last {:.0} MiB: **{:+.1} % … {:+.1} %** \
             ({} windows of {}; trend {:+.1} MiB/h)",
            s.mean,
            s.min,
            s.max,
            s.last,
            s.low_pct,
            s.high_pct,
            s.n,
            human(opts.rss_interval),
            s.slope_per_hour
        )
    };
    match &points {
        Some(s) => {
            let res = check(
                s.low_pct >= -tol && s.high_pct <= tol,
                format!(
                    "RSS after warm-up from {:+.1} % to {:+.1} % of its mean",
                    s.low_pct, s.high_pct
                ),
            );
            row(
                &format!(
                    "server RSS after warm-up, sampled every {}",
                    human(opts.rss_interval)
                ),
                describe(s),
                &format!("within ±{tol} % of the mean"),
                res,
            );
        }
        None => {
            check(false, "no RSS sample after the warm-up".into());
            row(
                "server RSS after warm-up",
                "no sample".into(),
                "",
                "**FAIL**",
            );
        }
    }
    for (what, stats) in [
        (
            "server RSS after warm-up: each window's lowest reading (read every second)",
            &floors,
        ),
        (
            "server RSS after warm-up: each window's mean reading",
            &means,
        ),
    ] {
        if let Some(s) = stats {
            row(what, describe(s), "", "");
        }
    }
    row(
        "server RSS at the end of the warm-up / peak (VmHWM)",
        format!("{:.0} MiB / {:.0} MiB", m.rss_at_warmup, m.rss_peak),
        "",
        "",
    );
    row(
        "CPU after warm-up: server / load generator / reader",
        format!(
            "{:.2} / {:.2} / {:.2} cores (over {:.0} s)",
            m.cpu.0, m.cpu.1, m.cpu.2, judged_secs
        ),
        "",
        "",
    );
    let batches = delta(&m.m_warm, &m.m_end, stored_name);
    row(
        "batches stored per second after warm-up",
        format!(
            "{:.0}/s (expected {}/s)",
            batches / judged_secs,
            opts.fleet.agents
        ),
        "",
        "",
    );
    if let Some(classes) = r["first_errors"].as_object().filter(|e| !e.is_empty()) {
        let _ = writeln!(md, "\nFirst reader errors of each class:\n");
        for (class, errors) in classes {
            for e in errors.as_array().into_iter().flatten() {
                let _ = writeln!(md, "- {class}: {}", e.as_str().unwrap_or_default());
            }
        }
    }
    if !m.first_server_errors.is_empty() {
        let _ = writeln!(md, "\nFirst server ERROR lines:\n");
        for e in &m.first_server_errors {
            let _ = writeln!(md, "- `{e}`");
        }
    }
    let _ = writeln!(
        md,
        "\n{}",
        if failures.is_empty() {
            "Result: **pass**".to_owned()
        } else {
            format!("Result: **FAIL** ({})", failures.join("; "))
        }
    );
    let mut rss_csv = String::from("seconds,sample_mib,lowest_mib,mean_mib\n");
    for s in &m.rss {
        let _ = writeln!(
            rss_csv,
            "{:.0},{:.1},{:.1},{:.1}",
            s.t, s.point, s.floor, s.mean
        );
    }
    Report {
        markdown: md,
        failures,
        rss_csv,
    }
}

/// ` ({...})` when `counts` is a non-empty JSON object (counts by class), else nothing.
fn counts_suffix(counts: &Value) -> String {
    counts
        .as_object()
        .filter(|o| !o.is_empty())
        .map_or(String::new(), |o| {
            format!(" ({})", Value::Object(o.clone()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_deviation_is_relative_to_the_mean_after_warmup() {
        let samples: Vec<Sample> = [
            (0.0, 50.0),
            (10.0, 100.0),
            (20.0, 104.0),
            (30.0, 96.0),
            (40.0, 100.0),
        ]
        .into_iter()
        .map(|(t, point)| Sample {
            t,
            point,
            floor: point - 30.0,
            mean: point - 10.0,
        })
        .collect();
        let s = rss_stats(&samples, 10.0, |s| s.point).expect("samples");
        assert_eq!(s.n, 4);
        assert_eq!((s.min, s.max, s.last, s.mean), (96.0, 104.0, 100.0, 100.0));
        assert!((s.high_pct - 4.0).abs() < 1e-9 && (s.low_pct + 4.0).abs() < 1e-9);
        assert!(rss_stats(&samples, 50.0, |s| s.point).is_none());
    }

    #[test]
    fn windows_keep_their_last_lowest_and_mean_reading() {
        let mut w = Window::default();
        for mib in [120.0, 100.0, 140.0] {
            w.add(mib);
        }
        let s = w.close(10.0);
        assert_eq!((s.t, s.point, s.floor, s.mean), (10.0, 140.0, 100.0, 120.0));
        w.add(90.0);
        assert_eq!(w.close(20.0).floor, 90.0);
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human(Duration::from_secs(1800)), "30 min");
        assert_eq!(human(Duration::from_secs(90)), "1 min 30 s");
        assert_eq!(human(Duration::from_secs(45)), "45 s");
    }
}
