//! An agent killed with SIGKILL and started again, on this machine's kernel:
//!
//! - everything the killed agent had in the kernel (program, links, maps, by id) is gone
//!   once it is dead, and no `cgroup_stats` program is left that no live process holds;
//! - the restarted agent loads and links its own program;
//! - the CPU time it reports for a busy cgroup continues where the killed one left off:
//!   every value of both runs lies between the cgroup's own `cpu.stat` read just before
//!   (less [`CLOCK_SLACK`]) and shortly after the agent's timestamp (the kernel's cumulative
//!   counter: no restart can double it or reset it), and the increase across the restart
//!   matches `cpu.stat`'s. How far each run's timestamps are from when `cpu.stat` reached
//!   the values they carry is printed (within a few milliseconds either way on this host:
//!   the counter advances in steps as the scheduler accounts the running task).
//!
//! Needs root and BPF. Outside CI it skips with a reason when they are missing; with
//! `CI=true` it fails instead.

mod common;

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime},
};

use common::{agent::Agent, bpf, TestCgroups};
use kpulse_agent::layout::Layout;

/// Ticks read from each run.
const TICKS: usize = 8;
/// Margin after an agent's timestamp within which its walk must have read the counter.
const READ_WITHIN: Duration = Duration::from_millis(250);
/// How far the agent's timeline (boot instant + `CLOCK_BOOTTIME`) and this test's wall clock
/// may disagree. The agent reads its boot instant as the narrowest of up to eight bracketed
/// reads (`clock.rs`): microseconds here; in an emulated VM whose vCPU the host deschedules
/// between reads, more. A restart that doubled or reset the counter would be off by
/// hundreds of milliseconds of CPU.
const CLOCK_SLACK: Duration = Duration::from_millis(30);
/// Tolerance on the CPU increase across the restart (relative, plus the sampler's step).
const GAP_TOLERANCE: f64 = 0.02;

fn main() {
    if common::workload::dispatch() {
        return;
    }
    common::main_of("agent_restart", common::ebpf_preflight, run);
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// One read of `cpu.stat`: started, ended (wall clock, ns), value (ns).
#[derive(Clone, Copy, Debug)]
struct Sample {
    start: u64,
    end: u64,
    cpu: u64,
}

/// One tick of an agent for the busy cgroup.
#[derive(Clone, Copy, Debug)]
struct Tick {
    run: char,
    t: u64,
    cpu: u64,
}

fn run() {
    let layout = Layout::detect().expect("layout");
    let parent = format!("kpulse-restart-{}", std::process::id());
    let burn = format!("/{parent}/burn");
    let mut cg = TestCgroups::create(&layout, &parent, &["burn"]);
    cg.spawn_workload("duty", &[], "burn", true);

    // The cgroup's own counter, read every few milliseconds.
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (samples, stop, layout, burn) =
            (samples.clone(), stop.clone(), layout.clone(), burn.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let start = now_ns();
                let cpu = common::cpu_stat_ns(&layout, &burn);
                let end = now_ns();
                if let Ok(mut v) = samples.lock() {
                    v.push(Sample { start, end, cpu });
                }
                std::thread::sleep(Duration::from_millis(3));
            }
        })
    };

    let before: Vec<u32> = bpf::loaded_programs_named("cgroup_stats");
    let args: Vec<String> = [
        "dump",
        "--count",
        "0",
        "--resolution",
        "250ms",
        "--collector",
        "ebpf",
        "--cgroup-root",
        &format!("/{parent}"),
        "--max-cgroups",
        "64",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let mut failures = Vec::new();
    let mut ticks = Vec::new();

    let mut a = Agent::spawn(&args, None);
    ticks.extend(read_ticks(&mut a, &burn, 'A'));
    let held_a = bpf::held_by(a.pid);
    println!("restart: agent A (pid {}) held {held_a:?}", a.pid);
    let mut progs_a: Vec<u32> = held_a
        .links
        .iter()
        .map(|&(_, p)| p)
        .chain(held_a.progs.iter().copied())
        .collect();
    progs_a.sort_unstable();
    progs_a.dedup();
    if held_a.links.is_empty() || held_a.maps.is_empty() {
        failures.push(format!("agent A holds no link or map: {held_a:?}"));
    }
    let killed = Instant::now();
    a.kill();
    // Freed after the last reference goes, past an RCU grace period.
    let mut left = Vec::new();
    loop {
        left.clear();
        left.extend(
            progs_a
                .iter()
                .filter(|&&p| bpf::exists("prog", p))
                .map(|p| format!("prog {p}")),
        );
        left.extend(
            held_a
                .links
                .iter()
                .filter(|&&(l, _)| bpf::exists("link", l))
                .map(|(l, _)| format!("link {l}")),
        );
        left.extend(
            held_a
                .maps
                .iter()
                .filter(|&&m| bpf::exists("map", m))
                .map(|m| format!("map {m}")),
        );
        if left.is_empty() || killed.elapsed() > Duration::from_secs(10) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    println!(
        "restart: after SIGKILL, agent A's {} programs, {} links, {} maps gone from the kernel in {:?}",
        progs_a.len(),
        held_a.links.len(),
        held_a.maps.len(),
        killed.elapsed()
    );
    if !left.is_empty() {
        failures.push(format!(
            "still in the kernel after agent A was killed: {left:?}"
        ));
    }
    let after = bpf::loaded_programs_named("cgroup_stats");
    // A program no live process holds, and that stays loaded: leaked. (Another process's
    // program can be caught between its exit and the kernel freeing it: look again.)
    let unheld = |ids: &[u32]| -> Vec<u32> {
        ids.iter()
            .copied()
            .filter(|p| {
                !before.contains(p)
                    && bpf::holders_of_program(*p).is_empty()
                    && bpf::exists("prog", *p)
            })
            .collect()
    };
    let mut orphans = unheld(&after);
    let since = Instant::now();
    while !orphans.is_empty() && since.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(100));
        orphans = unheld(&orphans);
    }
    println!(
        "restart: cgroup_stats programs loaded: {} before agent A, {} after it was killed; \
         orphans {orphans:?}",
        before.len(),
        after.len()
    );
    if !orphans.is_empty() {
        failures.push(format!(
            "cgroup_stats programs held by no process: {orphans:?}"
        ));
    }

    let mut b = Agent::spawn(&args, None);
    ticks.extend(read_ticks(&mut b, &burn, 'B'));
    let held_b = bpf::held_by(b.pid);
    let progs_b: Vec<u32> = held_b.links.iter().map(|&(_, p)| p).collect();
    println!("restart: agent B (pid {}) held {held_b:?}", b.pid);
    if progs_b.is_empty() || progs_b.iter().any(|p| progs_a.contains(p)) {
        failures.push(format!(
            "agent B did not link a program of its own: {held_b:?}"
        ));
    }
    b.kill();
    // Upper bounds for the last ticks.
    std::thread::sleep(READ_WITHIN + Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let samples = samples.lock().map(|v| v.clone()).unwrap_or_default();

    check_ticks(&ticks, &samples, &mut failures);

    drop(cg);
    for m in common::mounts(&layout) {
        if m.join(&parent).exists() {
            failures.push(format!("cgroup {} left behind", m.join(&parent).display()));
        }
    }
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("restart: FAILED: {f}");
        }
        panic!("{} restart checks failed", failures.len());
    }
}

/// Reads the agent's JSON lines until [`TICKS`] ticks of `burn` were seen.
fn read_ticks(agent: &mut Agent, burn: &str, run: char) -> Vec<Tick> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < TICKS {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match agent.lines.recv_timeout(left) {
            Ok(l) => l,
            Err(_) => panic!(
                "agent {run}: {} ticks in 30 s; log:\n{}",
                out.len(),
                agent.log()
            ),
        };
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if v["kind"] == "cgroup" && v["path"] == burn {
            assert_eq!(v["collector"], "ebpf", "agent {run}: {line}");
            out.push(Tick {
                run,
                t: v["timestamp_ns"].as_u64().expect("timestamp"),
                cpu: v["cpu_ns"].as_u64().expect("cpu_ns"),
            });
        }
    }
    out
}

/// The counter's value at `t`, interpolated between the samples around it.
fn interpolate(samples: &[Sample], t: u64) -> Option<f64> {
    let mid = |s: &Sample| (s.start / 2 + s.end / 2) as f64;
    let i = samples.iter().position(|s| mid(s) >= t as f64)?;
    let (a, b) = (samples.get(i.checked_sub(1)?)?, &samples[i]);
    let (ta, tb) = (mid(a), mid(b));
    if tb <= ta {
        return Some(b.cpu as f64);
    }
    Some(a.cpu as f64 + (b.cpu as f64 - a.cpu as f64) * (t as f64 - ta) / (tb - ta))
}

/// When the counter reached `cpu` (wall clock, ns), interpolated between the samples around
/// it: the instant an agent that reports `cpu` read it.
fn reached_at(samples: &[Sample], cpu: u64) -> Option<f64> {
    let mid = |s: &Sample| (s.start / 2 + s.end / 2) as f64;
    let i = samples.iter().position(|s| s.cpu >= cpu)?;
    let (a, b) = (samples.get(i.checked_sub(1)?)?, &samples[i]);
    if b.cpu <= a.cpu {
        return Some(mid(b));
    }
    Some(mid(a) + (mid(b) - mid(a)) * (cpu - a.cpu) as f64 / (b.cpu - a.cpu) as f64)
}

fn check_ticks(ticks: &[Tick], samples: &[Sample], failures: &mut Vec<String>) {
    let mut worst = 0f64;
    for (i, k) in ticks.iter().enumerate() {
        // Bracket: a read of cpu.stat that ended before the agent's timestamp is a lower
        // bound; one that started after the agent must have read is an upper bound.
        let slack = CLOCK_SLACK.as_nanos() as u64;
        let lo = samples
            .iter()
            .rev()
            .find(|s| s.end + slack <= k.t)
            .map(|s| s.cpu);
        let hi = samples
            .iter()
            .find(|s| s.start >= k.t + READ_WITHIN.as_nanos() as u64)
            .map(|s| s.cpu + 999);
        match (lo, hi) {
            (Some(lo), Some(hi)) if k.cpu >= lo && k.cpu <= hi => {}
            (Some(lo), Some(hi)) => failures.push(format!(
                "agent {} tick {i}: CPU {} outside the cgroup's cpu.stat {lo}..={hi}",
                k.run, k.cpu
            )),
            _ => failures.push(format!(
                "agent {} tick {i}: no cpu.stat samples around it",
                k.run
            )),
        }
        if let Some(want) = interpolate(samples, k.t) {
            worst = worst.max((k.cpu as f64 - want).abs());
        }
        if i > 0 && k.cpu < ticks[i - 1].cpu {
            failures.push(format!("CPU went backwards at agent {} tick {i}", k.run));
        }
    }
    for run in ['A', 'B'] {
        let mut offsets: Vec<f64> = ticks
            .iter()
            .filter(|k| k.run == run)
            .filter_map(|k| reached_at(samples, k.cpu).map(|t| (k.t as f64 - t) / 1e6))
            .collect();
        offsets.sort_by(f64::total_cmp);
        if let (Some(first), Some(last)) = (offsets.first(), offsets.last()) {
            println!(
                "restart: agent {run}: its timestamps are {:+.2} ms (median; {first:+.2} to \
                 {last:+.2}) from when cpu.stat reached the value it reports",
                offsets[offsets.len() / 2]
            );
        }
    }
    let last_a = ticks.iter().rfind(|k| k.run == 'A');
    let first_b = ticks.iter().find(|k| k.run == 'B');
    let (Some(a), Some(b)) = (last_a, first_b) else {
        failures.push("no ticks from one of the runs".into());
        return;
    };
    let (Some(ta), Some(tb)) = (interpolate(samples, a.t), interpolate(samples, b.t)) else {
        failures.push("no cpu.stat samples around the restart".into());
        return;
    };
    let reported = b.cpu as f64 - a.cpu as f64;
    let kernel = tb - ta;
    let err = (reported - kernel).abs();
    // The sampler's steps bound the interpolation error: allow 10 ms of CPU besides.
    let ok = err <= kernel * GAP_TOLERANCE + 10e6;
    println!(
        "restart: {} ticks; largest difference from cpu.stat (interpolated) {:.2} ms of CPU; \
         across the restart ({:.2} s apart) the agents report +{:.1} ms, cpu.stat +{:.1} ms \
         ({:+.2} %)",
        ticks.len(),
        worst / 1e6,
        (b.t - a.t) as f64 / 1e9,
        reported / 1e6,
        kernel / 1e6,
        (reported - kernel) / kernel * 100.0
    );
    if !ok {
        failures.push(format!(
            "CPU across the restart: agents +{reported} ns, cpu.stat +{kernel:.0} ns"
        ));
    }
}
