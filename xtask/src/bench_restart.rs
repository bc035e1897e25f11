//! `cargo xtask bench-restart`: how long after a server restart under load every node and
//! pod is served again.
//!
//! Steps: build the release server and load generator; start the server (client
//! certificates for agents and users) and `--agents` simulated agents at 1 Hz (`nice 19`);
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

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use crate::{
    demo::parse_duration,
    harness::{self, read_summary, Agents, Binaries, Pki, Proc, Server, ServerAuth, Stop},
};

/// The issue's target: complete again within this after the new process starts.
const TARGET: Duration = Duration::from_secs(3);

/// `cargo xtask bench-restart` flags.
#[derive(clap::Args, Debug)]
pub struct Options {
    /// Simulated agents (nodes).
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// Pods per node.
    #[arg(long, default_value_t = 30)]
    pods: usize,
    /// Containers per pod.
    #[arg(long, default_value_t = 2)]
    containers: usize,
    /// Restarts measured.
    #[arg(long, default_value_t = 5)]
    restarts: usize,
    /// Time from the data being complete again to the next kill.
    #[arg(long, value_parser = parse_duration, default_value = "65s")]
    interval: Duration,
    /// Seconds over which the agents connect at first.
    #[arg(long, default_value_t = 30)]
    ramp_secs: u64,
    /// Give up on a restart after this many seconds.
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
    /// Use the release binaries already built.
    #[arg(long)]
    no_build: bool,
}

/// One restart: seconds from the new process' start to its first answer and to complete.
struct Restart {
    first_answer: Option<f64>,
    complete: f64,
    polls: u64,
}

/// Runs the measurement.
pub fn run(opts: &Options) -> Result<()> {
    ensure!(
        opts.agents > 0 && opts.pods > 0 && opts.containers > 0,
        "--agents, --pods and --containers must be positive"
    );
    harness::require_curl("bench-restart")?;
    let stop = Stop::install()?;
    let bins = harness::release_binaries(opts.no_build)?;
    let scratch = harness::Scratch::new("bench-restart")?;
    let (restarts, agents) = measure(opts, &scratch.0, &bins, &stop)?;
    print!("{}", report(opts, &restarts, &agents));
    Ok(())
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
        nodes: opts.agents,
        pods: opts.pods,
        containers: opts.containers,
        ramp_secs: opts.ramp_secs,
        servers: &servers,
    };
    let agents_out = dir.join("loadgen.out");
    let mut loadgen = agents.start(&bins.loadgen, &pki, &dir.join("loadgen.log"), &agents_out)?;
    eprintln!(
        "bench-restart: {} agents × {} pods × {} containers; {} restarts, {} s apart",
        opts.agents,
        opts.pods,
        opts.containers,
        opts.restarts,
        opts.interval.as_secs()
    );
    let waiter = |n: usize, limit: u64| -> Result<(Proc, std::path::PathBuf)> {
        let mut args = vec![
            "--ca-dir".to_owned(),
            pki.dir.display().to_string(),
            "--read-api".to_owned(),
            server.api(),
            "--wait-complete".to_owned(),
            "--timeout-secs".to_owned(),
            limit.to_string(),
        ];
        args.extend(agents.shape());
        let out = dir.join(format!("waiter-{n}.out"));
        let p = Proc::spawn(
            "the reader",
            &bins.loadgen,
            &args,
            false,
            &dir.join(format!("waiter-{n}.log")),
            Some(&out),
        )?;
        Ok((p, out))
    };
    let finish = |p: &mut Proc, out: &Path, limit: u64| -> Result<Value> {
        // The reader gives up by itself after `limit`; this is only a backstop.
        let deadline = Instant::now() + Duration::from_secs(limit + 15);
        while p.wait_for(Duration::from_millis(200))?.is_none() {
            stop.check()?;
            ensure!(Instant::now() < deadline, "the reader did not end");
        }
        let v = read_summary(out)?;
        if v["complete"] != true {
            bail!(
                "not complete within {limit} s: {}; see {}",
                v["last"],
                p.log.display()
            );
        }
        Ok(v)
    };
    // Everything served once, before the first restart.
    let first_limit = opts.ramp_secs + 120;
    let (mut w, out) = waiter(0, first_limit)?;
    finish(&mut w, &out, first_limit)
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
        let (mut w, out) = waiter(n, opts.timeout_secs)?;
        let spawned = SystemTime::now();
        server_proc = server.start(&bins.server, &dir.join(format!("server-{n}.log")))?;
        let v = finish(&mut w, &out, opts.timeout_secs).with_context(|| format!("restart {n}"))?;
        let since =
            |key: &str| ns_field(&v, key).map(|t| t.saturating_sub(unix_ns(spawned)) as f64 / 1e9);
        let r = Restart {
            first_answer: since("first_answer_unix_ns"),
            complete: since("complete_unix_ns").context("no complete_unix_ns")?,
            polls: v["polls"].as_u64().unwrap_or(0),
        };
        eprintln!(
            "bench-restart: restart {n}: first answer {}, complete {:.2} s after the start",
            r.first_answer
                .map_or("n/a".to_owned(), |s| format!("{s:.2} s")),
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
        opts.agents, opts.pods, opts.containers
    );
    let _ = writeln!(
        md,
        "```sh\ncargo xtask bench-restart --agents {} --pods {} --containers {} --restarts {} \
         --interval {}s\n```\n",
        opts.agents,
        opts.pods,
        opts.containers,
        opts.restarts,
        opts.interval.as_secs()
    );
    let _ = writeln!(
        md,
        "| restart | first answer | every node and pod served again | polls |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|");
    for (i, r) in restarts.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} s | {} |",
            i + 1,
            r.first_answer
                .map_or("n/a".to_owned(), |s| format!("{s:.2} s")),
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
    let secs = |v: Option<f64>| v.map_or("n/a".to_owned(), |s| format!("{s:.2} s"));
    let met = max.is_some_and(|m| m <= TARGET.as_secs_f64());
    let _ = writeln!(
        md,
        "\nComplete again after the new process started: p50 **{}**, max **{}** (target ≤ {} s: \
         {}). Times are from the start of the new process to the arrival of the answer that \
         showed every node and pod (the reader polls the NodeMetrics list, then every \
         PodMetrics in protobuf). Agents over the run: {} reconnects, stream errors {}.",
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
    fn nearest_rank_quantiles() {
        let v = [3.0, 1.0, 2.0, 5.0, 4.0];
        assert_eq!(nearest_rank(&v, 0.5), Some(3.0));
        assert_eq!(nearest_rank(&v, 1.0), Some(5.0));
        assert_eq!(nearest_rank(&[], 0.5), None);
    }
}
