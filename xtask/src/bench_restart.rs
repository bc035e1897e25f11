//! `cargo xtask bench-restart`: how long after a server restart under load every node and
//! pod is served again.
//!
//! Steps: build the release server and load generator; start the server (client
//! certificates for agents and users) and `--agents` simulated agents at 1 Hz;
//! wait until the reader (`loadgen --wait-complete`) sees every node and pod served with
//! rates. Then `--restarts` times: wait `--interval`, SIGKILL the server, start a reader
//! that polls (NodeMetrics list, then every PodMetrics in protobuf, each checked: every
//! node and pod present once, every container's rate and memory as simulated, fresh), and
//! start the server again on the same ports. Measured from the new process' start: its
//! first HTTP answer, and the answer that showed everything complete again. Prints a
//! Markdown table (each restart, p50, max) against the 3 s target.
//!
//! The agents' reconnect backoff (`kpulse_agent::ship::Backoff`) grows while a server is
//! down and is reset by a stream that stays up 60 s: with `--interval` under that, each
//! restart starts where the last one left the backoff.

use std::{
    fmt::Write as _,
    path::Path,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use crate::{
    demo::parse_duration,
    harness::{self, read_summary, Agents, Binaries, Fleet, Pki, Server, ServerAuth, Stop, Waiter},
};

/// The issue's target: complete again within this after the new process starts.
const TARGET: Duration = Duration::from_secs(3);

/// `cargo xtask bench-restart` flags.
#[derive(clap::Args, Debug)]
pub struct Options {
    /// The simulated fleet.
    #[command(flatten)]
    fleet: Fleet,
    /// Restarts measured.
    #[arg(long, default_value_t = 5)]
    restarts: usize,
    /// Time from the data being complete again to the next kill.
    #[arg(long, value_parser = parse_duration, default_value = "65s")]
    interval: Duration,
    /// Give up on a restart after this many seconds.
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
    /// Use the release binaries already built.
    #[arg(long)]
    no_build: bool,
    /// Keep the logs (their directory is printed) instead of removing them.
    #[arg(long)]
    keep_logs: bool,
}

/// One restart: seconds from the new process' start to its first answer and to complete.
struct Restart {
    first_answer: Option<f64>,
    /// Every node served (the arrival of a complete NodeMetrics list).
    nodes: Option<f64>,
    /// The complete PodMetrics list: asked for, and arrived (every node and pod served
    /// again at the latest then).
    asked: Option<f64>,
    complete: f64,
    polls: u64,
    /// When the agents' streams were accepted again (seconds after the start), sorted.
    streams_back: Vec<f64>,
}

/// Runs the measurement.
pub fn run(opts: &Options) -> Result<()> {
    opts.fleet.check()?;
    harness::require_curl("bench-restart")?;
    let stop = Stop::install()?;
    let bins = harness::release_binaries(opts.no_build)?;
    let scratch = harness::Scratch::new("bench-restart")?;
    let result = measure(opts, &scratch.dir, &bins, &stop);
    if opts.keep_logs || result.is_err() {
        scratch.keep();
    }
    let (restarts, agents) = result?;
    print!("{}", report(opts, &restarts, &agents));
    Ok(())
}

/// The load generator's INFO line for a stream accepted (again) by the server.
const STREAM_ACCEPTED: &str = "streaming to the aggregator";

/// Seconds after `since` of each line of `log` (tracing's format: an RFC 3339 UTC time
/// first) that contains `needle` and is not older than `since`; sorted.
fn event_times(log: &Path, needle: &str, since: SystemTime) -> Result<Vec<f64>> {
    let text =
        std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    let since = unix_ns(since);
    let mut times: Vec<f64> = text
        .lines()
        .filter(|l| l.contains(needle))
        .filter_map(|l| parse_utc(l.split_whitespace().next()?))
        .filter(|t| *t >= since)
        .map(|t| (t - since) as f64 / 1e9)
        .collect();
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// `2026-11-30T06:52:31.443673Z` → nanoseconds since the Unix epoch.
fn parse_utc(s: &str) -> Option<u128> {
    let s = s.strip_suffix('Z')?;
    let (date, clock) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i32>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let date = time::Date::from_calendar_date(
        y,
        time::Month::try_from(u8::try_from(m).ok()?).ok()?,
        u8::try_from(day).ok()?,
    )
    .ok()?;
    // Julian day 2440588 is 1970-01-01.
    let days = u128::try_from(date.to_julian_day() - 2_440_588).ok()?;
    let (hms, frac) = clock.split_once('.').unwrap_or((clock, ""));
    let mut t = hms.splitn(3, ':').map(|x| x.parse::<u128>().ok());
    let (h, min, sec) = (t.next()??, t.next()??, t.next()??);
    let nanos: u128 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").get(..9)?.parse().ok()?
    };
    Some(((days * 86_400 + h * 3_600 + min * 60 + sec) * 1_000_000_000) + nanos)
}

fn secs(v: Option<f64>) -> String {
    v.map_or("n/a".to_owned(), |s| format!("{s:.2} s"))
}

fn unix_ns(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn ns_field(v: &Value, key: &str) -> Option<u128> {
    v[key].as_str()?.parse().ok()
}

fn measure(
    opts: &Options,
    dir: &Path,
    bins: &Binaries,
    stop: &Stop,
) -> Result<(Vec<Restart>, Value)> {
    let pki = Pki::create(&bins.loadgen, &dir.join("ca"))?;
    let server = Server::new(dir, &pki.ca, ServerAuth::ClientCerts(&pki))?;
    let mut server_proc = server.start(&bins.server, &dir.join("server-0.log"))?;
    server.wait_answering(&mut server_proc, Duration::from_secs(30), stop)?;
    let servers = [server.ingest()];
    let agents = Agents {
        // Every stream accepted again is an INFO line with its time: the reconnects' spread.
        log_filter: Some("info"),
        custom_metrics: false,
        // Agents are on their own nodes: their reconnects must not wait for the CPU.
        ..opts.fleet.agents(&servers, false)
    };
    let agents_out = dir.join("loadgen.out");
    let mut loadgen = agents.start(&bins.loadgen, &pki, &dir.join("loadgen.log"), &agents_out)?;
    eprintln!(
        "bench-restart: {} agents × {} pods × {} containers; {} restarts, {} s apart",
        opts.fleet.agents,
        opts.fleet.pods,
        opts.fleet.containers,
        opts.restarts,
        opts.interval.as_secs()
    );
    // Everything served once, before the first restart.
    Waiter::start(
        bins,
        &pki,
        &server,
        &agents,
        dir,
        "0",
        opts.fleet.ramp_secs + 120,
    )?
    .finish(stop)
    .context("the agents' data was never complete before the restarts")?;
    eprintln!("bench-restart: every node and pod served");

    let mut restarts = Vec::new();
    for n in 1..=opts.restarts {
        let until = Instant::now() + opts.interval;
        while Instant::now() < until {
            loadgen.check_running()?;
            server_proc.check_running()?;
            stop.sleep(
                until
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_secs(1)),
            )?;
        }
        server_proc.kill()?;
        let waiter = Waiter::start(
            bins,
            &pki,
            &server,
            &agents,
            dir,
            &n.to_string(),
            opts.timeout_secs,
        )?;
        let spawned = SystemTime::now();
        server_proc = server.start(&bins.server, &dir.join(format!("server-{n}.log")))?;
        let v = waiter
            .finish(stop)
            .with_context(|| format!("restart {n}"))?;
        let since =
            |key: &str| ns_field(&v, key).map(|t| t.saturating_sub(unix_ns(spawned)) as f64 / 1e9);
        let r = Restart {
            first_answer: since("first_answer_unix_ns"),
            nodes: since("nodes_complete_unix_ns"),
            asked: since("complete_request_unix_ns"),
            complete: since("complete_unix_ns").context("no complete_unix_ns")?,
            polls: v["polls"].as_u64().unwrap_or(0),
            streams_back: event_times(&loadgen.log, STREAM_ACCEPTED, spawned)?,
        };
        eprintln!(
            "bench-restart: restart {n}: first answer {}, {} streams accepted again (p50 {}, \
             last {}), every node served {}, every pod {:.2} s after the start",
            secs(r.first_answer),
            r.streams_back.len(),
            secs(nearest_rank(&r.streams_back, 0.5)),
            secs(r.streams_back.last().copied()),
            secs(r.nodes),
            r.complete
        );
        restarts.push(r);
    }
    loadgen.signal("TERM")?;
    ensure!(
        loadgen.wait_for(Duration::from_secs(60))?.is_some(),
        "the load generator did not stop within 60 s"
    );
    let summary = read_summary(&agents_out)?;
    server_proc.stop(Duration::from_secs(10))?;
    Ok((restarts, summary))
}

/// The `q`-quantile (nearest rank) of `values`.
fn nearest_rank(values: &[f64], q: f64) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = (q * v.len() as f64).ceil().max(1.0) as usize;
    v.get(rank - 1).copied()
}

fn report(opts: &Options, restarts: &[Restart], agents: &Value) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## Server restart under load: {} agents × {} pods × {} containers at 1 Hz\n",
        opts.fleet.agents, opts.fleet.pods, opts.fleet.containers
    );
    let _ = writeln!(
        md,
        "```sh\ncargo xtask bench-restart --agents {} --pods {} --containers {} --restarts {} \
         --interval {}s\n```\n",
        opts.fleet.agents,
        opts.fleet.pods,
        opts.fleet.containers,
        opts.restarts,
        opts.interval.as_secs()
    );
    let _ = writeln!(
        md,
        "| restart | first answer | streams accepted again: p50 / p90 / last (count) | \
         every node served | every pod served (list asked → answered) | polls |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|");
    for (i, r) in restarts.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {} | {} | {} / {} / {} ({}) | {} | {} → **{:.2} s** | {} |",
            i + 1,
            secs(r.first_answer),
            secs(nearest_rank(&r.streams_back, 0.5)),
            secs(nearest_rank(&r.streams_back, 0.9)),
            secs(r.streams_back.last().copied()),
            r.streams_back.len(),
            secs(r.nodes),
            secs(r.asked),
            r.complete,
            r.polls
        );
    }
    let complete: Vec<f64> = restarts.iter().map(|r| r.complete).collect();
    let (p50, max) = (
        nearest_rank(&complete, 0.5),
        complete
            .iter()
            .copied()
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v)))),
    );
    let met = max.is_some_and(|m| m <= TARGET.as_secs_f64());
    let _ = writeln!(
        md,
        "\nComplete again after the new process started: p50 **{}**, max **{}** (target ≤ {} s: \
         {}). Times are from the start of the new process. The reader polls the NodeMetrics \
         list until every node is there (about 20 ms a poll), then every PodMetrics in \
         protobuf; the time quoted is the arrival of the first complete PodMetrics list, an \
         upper bound (that list, 30,000 pods, is built while the agents' snapshots arrive). \
         Agents over the run: {} reconnects, stream errors {}.",
        secs(p50),
        secs(max),
        TARGET.as_secs(),
        if met { "met" } else { "**not met**" },
        agents["reconnects"],
        agents["stream_errors"]
    );
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracing_times_parse() {
        assert_eq!(
            parse_utc("1970-01-02T00:00:01.5Z"),
            Some(86_401_500_000_000)
        );
        assert_eq!(
            parse_utc("2026-11-30T06:52:31.443673Z"),
            Some(1_796_021_551_443_673_000)
        );
        assert_eq!(parse_utc("2026-11-30 06:52:31Z"), None);
    }

    #[test]
    fn nearest_rank_quantiles() {
        let v = [3.0, 1.0, 2.0, 5.0, 4.0];
        assert_eq!(nearest_rank(&v, 0.5), Some(3.0));
        assert_eq!(nearest_rank(&v, 1.0), Some(5.0));
        assert_eq!(nearest_rank(&[], 0.5), None);
    }
}
