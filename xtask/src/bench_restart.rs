//! `cargo xtask bench-restart`: how long after a server restart under load every node and
//! pod is served again.
//!
//! Steps: build the release server and load generator; start the server (client
//! certificates for agents and users) and `--agents` simulated agents at 1 Hz;
//! wait until the reader (`loadgen --wait-complete`) sees every node and pod served with
//! rates. Then `--restarts` times: wait `--interval`, SIGKILL the server, start a reader
//! that polls (NodeMetrics list, then every PodMetrics in protobuf, each checked: every
//! node and pod present once, every container's rate and memory as simulated, fresh: at
//! most 5 s older than the request, whatever the answer then took), and
//! start the server again on the same ports. Measured from the new process' start: its
//! first HTTP answer, and the answer that showed everything complete again. Prints a
//! Markdown table (each restart, p50, max) against the 3 s target.
//!
//! `--down` keeps the server down that long after each kill, as a cluster's replica is while
//! the kubelet restarts its container and until the new process listens: the agents'
//! reconnect backoff (`kpulse_agent::ship::Backoff`) grows meanwhile. Each restart also
//! reports the stream errors this build's agents counted during it, by reason (the load
//! generator's `loadgen counts` lines).
//!
//! `--against-loadgen BINARY` compares two builds of the agents' shipping code within the
//! same restarts: half the agents run on this build's load generator, half on `BINARY`
//! (node names `against-…`), both streaming at once; each restart gives each build's
//! reconnect times. The reader knows one fleet, so it does not run: such a restart is
//! complete when every agent's stream is back.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use crate::{
    demo::parse_duration,
    harness::{
        self, read_summary, Agents, Binaries, Fleet, Pki, Proc, Server, ServerAuth, Stop, Waiter,
    },
    stats,
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
    /// How long the server stays down after each kill before it is started again (0: at
    /// once). In a cluster a replica is down while the kubelet restarts its container and
    /// until the new process listens.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    down: Duration,
    /// Another build's load generator (an earlier commit's `target/release/examples/loadgen`):
    /// half the agents run on it, half on this build's, through the same restarts.
    #[arg(long)]
    against_loadgen: Option<PathBuf>,
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
#[derive(Default)]
struct Restart {
    first_answer: Option<f64>,
    /// Every node served (the arrival of a complete NodeMetrics list).
    nodes: Option<f64>,
    /// The complete PodMetrics list: asked for, and arrived (every node and pod served
    /// again at the latest then).
    asked: Option<f64>,
    /// The reader's complete list; with `--against-loadgen`, the last stream back.
    complete: f64,
    polls: u64,
    /// When the agents' streams were accepted again (seconds after the start), sorted: this
    /// build's agents, then (with `--against-loadgen`) the other build's.
    streams_back: Vec<Vec<f64>>,
    /// This build's agents' stream errors during the restart, by reason (`None`: its load
    /// generator wrote no counts line after the restart).
    errors: Option<BTreeMap<String, u64>>,
}

/// The other build's agents' node names start with this.
const AGAINST_PREFIX: &str = "against-";

/// One load generator of the run: its process, its agents' count.
struct Group {
    proc: Proc,
    nodes: usize,
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

pub(crate) fn unix_ns(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn ns_field(v: &Value, key: &str) -> Option<u128> {
    v[key].as_str()?.parse().ok()
}

/// The `loadgen counts` lines of `log` (the load generator's counts so far, every second):
/// each line's time and its JSON object.
pub(crate) fn counts_lines(log: &Path) -> Result<Vec<(u128, Value)>> {
    // `COUNTS_LINE` of agent/examples/loadgen.rs, then a space.
    const MARK: &str = "loadgen counts ";
    let text =
        std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let at = parse_utc(l.split_whitespace().next()?)?;
            let json = &l[l.find(MARK)? + MARK.len()..];
            Some((at, serde_json::from_str(json).ok()?))
        })
        .collect())
}

/// The stream errors by reason counted between the last counts line at or before `from`
/// and the first one after `to`; `None` if no line follows `to` (within 5 s).
fn errors_after(
    log: &Path,
    from: SystemTime,
    to: SystemTime,
    stop: &Stop,
) -> Result<Option<BTreeMap<String, u64>>> {
    let (from, to) = (unix_ns(from), unix_ns(to));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(errors) = errors_between(&counts_lines(log)?, from, to) {
            return Ok(Some(errors));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        stop.sleep(Duration::from_millis(200))?;
    }
}

/// [`errors_after`] on lines already read.
pub(crate) fn errors_between(
    lines: &[(u128, Value)],
    from: u128,
    to: u128,
) -> Option<BTreeMap<String, u64>> {
    let count = |v: &Value| -> BTreeMap<String, u64> {
        v["stream_errors"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, n)| Some((k.clone(), n.as_u64()?)))
            .collect()
    };
    let before = lines
        .iter()
        .rev()
        .find(|(at, _)| *at <= from)
        .map(|(_, v)| count(v))
        .unwrap_or_default();
    let (_, after) = lines.iter().find(|(at, _)| *at > to)?;
    Some(
        count(after)
            .into_iter()
            .map(|(k, n)| {
                let d = n.saturating_sub(before.get(&k).copied().unwrap_or(0));
                (k, d)
            })
            .filter(|(_, d)| *d > 0)
            .collect(),
    )
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
    let against = opts.against_loadgen.as_deref();
    // With --against-loadgen, this build's agents are the first half.
    let ours = if against.is_some() {
        opts.fleet.agents.div_ceil(2)
    } else {
        opts.fleet.agents
    };
    let agents = Agents {
        nodes: ours,
        // Every stream accepted again is an INFO line with its time: the reconnects' spread.
        log_filter: Some("info"),
        custom_metrics: false,
        // Agents are on their own nodes: their reconnects must not wait for the CPU.
        ..opts.fleet.agents(&servers, false)
    };
    let agents_out = dir.join("loadgen.out");
    let mut groups = vec![Group {
        proc: agents.start(&bins.loadgen, &pki, &dir.join("loadgen.log"), &agents_out)?,
        nodes: ours,
    }];
    if let Some(bin) = against {
        ensure!(
            bin.is_file(),
            "--against-loadgen {}: no such file",
            bin.display()
        );
        let theirs = opts.fleet.agents - ours;
        let other = Agents {
            nodes: theirs,
            node_prefix: Some(AGAINST_PREFIX),
            ..agents
        };
        groups.push(Group {
            proc: other.start(
                bin,
                &pki,
                &dir.join("loadgen-against.log"),
                &dir.join("loadgen-against.out"),
            )?,
            nodes: theirs,
        });
    }
    eprintln!(
        "bench-restart: {} agents × {} pods × {} containers{}; {} restarts, {} s apart, the \
         server down {} s each",
        opts.fleet.agents,
        opts.fleet.pods,
        opts.fleet.containers,
        against.map_or(String::new(), |b| format!(
            " ({ours} on this build, the rest on {})",
            b.display()
        )),
        opts.restarts,
        opts.interval.as_secs(),
        opts.down.as_secs_f64()
    );
    // Everything served (or with two builds, every stream up) once, before the first
    // restart.
    let first_limit = opts.fleet.ramp_secs + 120;
    if against.is_some() {
        wait_streams(&server, opts.fleet.agents, first_limit, &mut groups, stop)
    } else {
        Waiter::start(bins, &pki, &server, &agents, dir, "0", first_limit)?
            .finish(stop)
            .map(drop)
    }
    .context("the agents were never all served before the restarts")?;
    eprintln!("bench-restart: every agent served");

    let mut restarts = Vec::new();
    for n in 1..=opts.restarts {
        let until = Instant::now() + opts.interval;
        while Instant::now() < until {
            for g in &mut groups {
                g.proc.check_running()?;
            }
            server_proc.check_running()?;
            stop.sleep(
                until
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_secs(1)),
            )?;
        }
        let killed = SystemTime::now();
        server_proc.kill()?;
        stop.sleep(opts.down)?;
        let waiter = match against {
            Some(_) => None,
            None => Some(Waiter::start(
                bins,
                &pki,
                &server,
                &agents,
                dir,
                &n.to_string(),
                opts.timeout_secs,
            )?),
        };
        let spawned = SystemTime::now();
        server_proc = server.start(&bins.server, &dir.join(format!("server-{n}.log")))?;
        let since = |t: u128| t.saturating_sub(unix_ns(spawned)) as f64 / 1e9;
        let mut r = match waiter {
            Some(waiter) => {
                let v = waiter
                    .finish(stop)
                    .with_context(|| format!("restart {n}"))?;
                let at = |key: &str| ns_field(&v, key).map(since);
                Restart {
                    first_answer: at("first_answer_unix_ns"),
                    nodes: at("nodes_complete_unix_ns"),
                    asked: at("complete_request_unix_ns"),
                    complete: at("complete_unix_ns").context("no complete_unix_ns")?,
                    polls: v["polls"].as_u64().unwrap_or(0),
                    ..Restart::default()
                }
            }
            None => {
                // Every agent back: the server holds every stream again. (Its log lines
                // alone could be fooled: an agent cut again after its Welcome logs twice.)
                wait_streams(
                    &server,
                    opts.fleet.agents,
                    opts.timeout_secs,
                    &mut groups,
                    stop,
                )
                .with_context(|| format!("restart {n}"))?;
                Restart {
                    complete: since(unix_ns(SystemTime::now())),
                    ..Restart::default()
                }
            }
        };
        let done = SystemTime::now();
        r.errors = errors_after(&groups[0].proc.log, killed, done, stop)?;
        for g in &groups {
            let mut back = event_times(&g.proc.log, STREAM_ACCEPTED, spawned)?;
            // One line an agent, more for one cut again after its Welcome: the `nodes`th
            // earliest line is at most the last agent's return (a lower bound; `complete`,
            // the server's count, an upper one).
            back.truncate(g.nodes);
            r.streams_back.push(back);
        }
        eprintln!(
            "bench-restart: restart {n}: first answer {}, streams accepted again {}, every node \
             served {}, complete {:.2} s after the start; errors during it {:?}",
            secs(r.first_answer),
            r.streams_back
                .iter()
                .map(|t| format!(
                    "{} (p50 {}, last {})",
                    t.len(),
                    secs(nearest_rank(t, 0.5)),
                    secs(t.last().copied())
                ))
                .collect::<Vec<_>>()
                .join(" / "),
            secs(r.nodes),
            r.complete,
            r.errors
        );
        restarts.push(r);
    }
    for g in &mut groups {
        g.proc.signal("TERM")?;
    }
    for g in &mut groups {
        ensure!(
            g.proc.wait_for(Duration::from_secs(60))?.is_some(),
            "{} did not stop within 60 s",
            g.proc.name
        );
    }
    let summary = read_summary(&agents_out)?;
    server_proc.stop(Duration::from_secs(10))?;
    Ok((restarts, summary))
}

/// Waits until the server holds `count` agents' streams, the load generators running.
fn wait_streams(
    server: &Server,
    count: usize,
    limit_secs: u64,
    groups: &mut [Group],
    stop: &Stop,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(limit_secs);
    loop {
        let up = server
            .scrape()
            .map(|m| harness::sum(&m, "kpulse_aggregator_ingest_streams", |_| true))
            .unwrap_or(0.0);
        if up >= count as f64 {
            return Ok(());
        }
        for g in groups.iter_mut() {
            g.proc.check_running()?;
        }
        ensure!(
            Instant::now() < deadline,
            "{up} of {count} streams up after {limit_secs} s"
        );
        stop.sleep(Duration::from_millis(100))?;
    }
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
         --interval {}s --down {}ms{}\n```\n",
        opts.fleet.agents,
        opts.fleet.pods,
        opts.fleet.containers,
        opts.restarts,
        opts.interval.as_secs(),
        opts.down.as_millis(),
        opts.against_loadgen
            .as_ref()
            .map_or(String::new(), |b| format!(
                " --against-loadgen {}",
                b.display()
            ))
    );
    let spread = |t: &[f64]| {
        format!(
            "{} / {} / {} ({})",
            secs(nearest_rank(t, 0.5)),
            secs(nearest_rank(t, 0.9)),
            secs(t.last().copied()),
            t.len()
        )
    };
    let errors = |e: &Option<BTreeMap<String, u64>>| match e {
        Some(e) => e
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        None => "n/a".to_owned(),
    };
    if opts.against_loadgen.is_some() {
        return report_against(opts, restarts, md, spread, errors);
    }
    let _ = writeln!(
        md,
        "| restart | first answer | streams accepted again: p50 / p90 / last (count) | \
         every node served | every pod served (list asked → answered) | polls | stream errors \
         during |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---|");
    for (i, r) in restarts.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} → **{:.2} s** | {} | {} |",
            i + 1,
            secs(r.first_answer),
            spread(group(r, 0)),
            secs(r.nodes),
            secs(r.asked),
            r.complete,
            r.polls,
            errors(&r.errors)
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
         {}). Times are from the start of the new process (the server was down {:.1} s after \
         each kill). The reader polls the NodeMetrics list until every node is there (about \
         20 ms a poll), then every PodMetrics in protobuf; the time quoted is the arrival of \
         the first complete PodMetrics list, an upper bound (that list is built while the \
         agents' snapshots arrive). Agents over the run: {} reconnects, stream errors {}.",
        secs(p50),
        secs(max),
        TARGET.as_secs(),
        if met { "met" } else { "**not met**" },
        opts.down.as_secs_f64(),
        agents["reconnects"],
        agents["stream_errors"]
    );
    md
}

/// The reconnect times of a restart's `i`th load generator (0: this build's).
fn group(r: &Restart, i: usize) -> &[f64] {
    r.streams_back.get(i).map_or(&[], Vec::as_slice)
}

/// The table of a run with `--against-loadgen`: each restart's reconnects of both builds,
/// and the paired difference of their last stream back.
fn report_against(
    opts: &Options,
    restarts: &[Restart],
    mut md: String,
    spread: impl Fn(&[f64]) -> String,
    errors: impl Fn(&Option<BTreeMap<String, u64>>) -> String,
) -> String {
    let _ = writeln!(
        md,
        "| restart | this build: streams back p50 / p90 / last (count) | against: p50 / p90 / \
         last (count) | every stream held by the server | this build's stream errors during |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---|");
    for (i, r) in restarts.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} s | {} |",
            i + 1,
            spread(group(r, 0)),
            spread(group(r, 1)),
            r.complete,
            errors(&r.errors)
        );
    }
    let quantile = |i: usize, q: f64| -> Vec<f64> {
        restarts
            .iter()
            .filter_map(|r| nearest_rank(group(r, i), q))
            .collect()
    };
    for (what, q) in [("p50", 0.5), ("p90", 0.9), ("last", 1.0)] {
        let (ours, theirs) = (quantile(0, q), quantile(1, q));
        let diffs: Vec<f64> = ours.iter().zip(&theirs).map(|(a, b)| a - b).collect();
        let (mean, lo, hi) = stats::paired(&diffs);
        let _ = writeln!(
            md,
            "\n- {what} stream back: this build median {:.2} s, against {:.2} s; this build \
             minus against, paired by restart: {mean:+.2} s (95 % CI {lo:+.2} … {hi:+.2}, {} \
             restarts)",
            stats::median(&ours),
            stats::median(&theirs),
            diffs.len()
        );
    }
    let _ = writeln!(
        md,
        "\nTimes are from the start of the new process; the server was down {:.1} s after each \
         kill. Both builds' agents streamed to the same server at once. A build's streams back \
         are its load generator's \"streaming to the aggregator\" lines, its agents' count of \
         the earliest (an agent cut again after its Welcome logs twice: \"last\" is then a \
         lower bound); \"every stream held\" is when the server's count of streams reached \
         every agent's (polled every 100 ms: an upper bound).",
        opts.down.as_secs_f64()
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
    fn errors_are_counted_between_two_counts_lines() {
        let log = std::env::temp_dir().join(format!("kpulse-counts-{}.log", std::process::id()));
        std::fs::write(
            &log,
            "1970-01-01T00:00:10Z  INFO loadgen: loadgen counts {\"stream_errors\":{\"http\":1}}\n\
             1970-01-01T00:00:11Z  INFO kpulse_agent::ship: streaming to the aggregator\n\
             1970-01-01T00:00:12Z  INFO loadgen: loadgen counts {\"stream_errors\":{\"http\":3,\"connect\":7}}\n\
             1970-01-01T00:00:13Z  INFO loadgen: loadgen counts {\"stream_errors\":{\"http\":3,\"connect\":9}}\n",
        )
        .expect("write");
        let lines = counts_lines(&log).expect("read");
        std::fs::remove_file(&log).expect("remove");
        assert_eq!(lines.len(), 3);
        let s = |n: u128| n * 1_000_000_000;
        // From the line at 10 s to the first after 11.5 s (the one at 12 s).
        let e = errors_between(&lines, s(10), s(11) + 500_000_000).expect("a line after");
        assert_eq!(
            e,
            BTreeMap::from([("connect".to_owned(), 7), ("http".to_owned(), 2)])
        );
        // Nothing changed between 12 and 13 s but connect.
        let e = errors_between(&lines, s(12), s(12) + 1).expect("a line after");
        assert_eq!(e, BTreeMap::from([("connect".to_owned(), 2)]));
        // No line after the end: not known, rather than none.
        assert_eq!(errors_between(&lines, s(10), s(13)), None);
    }

    #[test]
    fn nearest_rank_quantiles() {
        let v = [3.0, 1.0, 2.0, 5.0, 4.0];
        assert_eq!(nearest_rank(&v, 0.5), Some(3.0));
        assert_eq!(nearest_rank(&v, 1.0), Some(5.0));
        assert_eq!(nearest_rank(&[], 0.5), None);
    }
}
