//! `cargo xtask bench-fit`: what one aggregator-api replica costs per stream, per pod and
//! per container, fitted by least squares from `bench-ingest` runs, and what that predicts
//! for the clusters of docs/design/scale.md (issue 37, item 2).
//!
//! **Design.** Four factors at three levels each: streams (simulated nodes), pods a node,
//! containers a pod, and batches a second in all (each agent's interval is `streams /
//! rate`, so that many streams fit this machine at a reduced rate). The nine runs of the L9
//! orthogonal array cover them: every level of every factor three times, every pair of
//! levels of two factors once. (Orthogonal in the factors, not in the models' columns,
//! which are products of them: the per-pod and per-container estimates are correlated, and
//! their sum for a pod is what the design determines best.) Each pass runs
//! the nine in an order shuffled by `--seed`; `--passes` passes, so the runs of a point are
//! spread over the whole measurement and a drift of the machine lands on every point alike.
//!
//! **Models**, ordinary least squares with 95 % intervals (Student's t):
//! - memory: `RSS = a + b·streams + c·pods + d·containers` (pods and containers stored);
//! - CPU: `cores = e + f·streams + g·batches/s + h·pods/s + i·containers/s` (pods and
//!   containers carried by the batches made visible);
//! - file descriptors and the host's TCP memory: `a + b·streams`.
//!
//! **Lack of fit**: each point runs once a pass, so the scatter of a point's runs tells how
//! far the model misses beyond the noise (an F statistic and the worst point's miss); a
//! large F says the intervals are too narrow.
//!
//! **Predictions** at the sizes of scale.md, each agent at its 1 s: the fitted mean with its
//! interval under the model. They are extrapolations past the streams measured, resting on
//! the model's linearity; the interval is the model's, not the extrapolation's, uncertainty.
//!
//! One process may hold at most its hard open-file limit of sockets, and the server and the
//! load generator each hold one per stream: the streams' highest level must fit both.

use std::time::Instant;

use anyhow::{ensure, Context, Result};

use crate::{
    bench_ingest::{self, Sample, Shape},
    harness::{self, Stop},
    stats::Fit,
};

/// The L9(3⁴) orthogonal array: for each run, the level (0, 1, 2) of each of four factors.
const L9: [[usize; 4]; 9] = [
    [0, 0, 0, 0],
    [0, 1, 1, 1],
    [0, 2, 2, 2],
    [1, 0, 1, 2],
    [1, 1, 2, 0],
    [1, 2, 0, 1],
    [2, 0, 2, 1],
    [2, 1, 0, 2],
    [2, 2, 1, 0],
];

/// Streams one destination address is given at most (Linux's default ephemeral range has
/// about 28,000 ports per destination).
const STREAMS_PER_ADDRESS: usize = 10_000;

/// Open files each process keeps besides its streams.
const SPARE_FILES: u64 = 600;

/// Options.
#[derive(clap::Args, Debug)]
pub struct Options {
    /// The three levels of streams (simulated nodes).
    #[arg(
        long,
        value_delimiter = ',',
        num_args = 1,
        default_value = "1000,9000,18000"
    )]
    streams: Vec<usize>,
    /// The three levels of pods a node.
    #[arg(long, value_delimiter = ',', default_value = "1,10,60")]
    pods: Vec<usize>,
    /// The three levels of containers a pod.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    containers: Vec<usize>,
    /// The three levels of batches a second, all agents together.
    #[arg(long, value_delimiter = ',', default_value = "500,1000,2000")]
    rates: Vec<u64>,
    /// Passes over the nine runs, each in its own shuffled order.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=10))]
    passes: u32,
    /// Seed of the passes' orders.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Agents connecting a second during the ramp (TLS handshakes on both ends).
    #[arg(long, default_value_t = 300)]
    handshakes_per_sec: usize,
    /// Seconds of steady state, once every stream is up, before measuring.
    #[arg(long, default_value_t = 20)]
    warmup_secs: u64,
    /// Seconds measured in each run.
    #[arg(long, default_value_t = 40)]
    measure_secs: u64,
    /// Use the release binaries as built.
    #[arg(long)]
    no_build: bool,
}

/// A run: its point of the design and what was measured.
struct Run {
    pass: u32,
    point: usize,
    shape: Shape,
    sample: Sample,
}

/// Runs the benchmark.
pub fn run(opts: &Options) -> Result<()> {
    for (name, n) in [
        ("--streams", opts.streams.len()),
        ("--pods", opts.pods.len()),
        ("--containers", opts.containers.len()),
        ("--rates", opts.rates.len()),
    ] {
        ensure!(n == 3, "{name} takes three levels, not {n}");
    }
    let most = opts.streams.iter().copied().max().unwrap_or(0) as u64;
    let files = harness::open_file_limit()?;
    ensure!(
        most + SPARE_FILES <= files,
        "{most} streams need about {} open files in the server and in the load generator, \
         and this shell's hard limit is {files} (raising it needs CAP_SYS_RESOURCE): lower \
         --streams",
        most + SPARE_FILES
    );
    let shapes: Vec<Shape> = L9.iter().map(|l| shape(opts, *l)).collect();
    for s in &shapes {
        ensure!(
            s.resolution_ms >= 100,
            "{} streams at {:.0} batches/s is more than 10 a second each",
            s.nodes,
            s.batches_per_sec()
        );
    }
    harness::require_curl("bench-fit")?;
    let stop = Stop::install()?;
    let bins = harness::release_binaries(opts.no_build)?;
    let scratch = harness::Scratch::new("bench-fit")?;
    let mut rng = fastrand::Rng::with_seed(opts.seed);
    let mut order = Vec::new();
    for pass in 0..opts.passes {
        let mut points: Vec<usize> = (0..L9.len()).collect();
        rng.shuffle(&mut points);
        order.extend(points.into_iter().map(|p| (pass, p)));
    }
    let started = Instant::now();
    let mut runs = Vec::new();
    for (i, (pass, point)) in order.iter().enumerate() {
        let shape = shapes[*point].clone();
        eprintln!(
            "bench-fit: run {}/{} (pass {}, point {}), {:.0} min so far",
            i + 1,
            order.len(),
            pass + 1,
            point + 1,
            started.elapsed().as_secs_f64() / 60.0
        );
        let dir = scratch.dir.join(format!("run-{i:02}"));
        std::fs::create_dir_all(&dir)?;
        let run = bench_ingest::measure(&shape, &dir, &bins, &stop).and_then(|sample| {
            let run = Run {
                pass: *pass,
                point: *point,
                shape,
                sample,
            };
            check(&run)?;
            Ok(run)
        });
        match run {
            Ok(run) => {
                // As it comes: a later failure loses no run.
                eprintln!("{}", row(&run));
                runs.push(run);
            }
            Err(e) => {
                scratch.keep();
                return Err(e.context(format!("run {} (point {})", i + 1, point + 1)));
            }
        }
    }
    print!("{}", report(opts, &runs)?);
    Ok(())
}

/// The run at the levels `l` of the four factors.
fn shape(opts: &Options, l: [usize; 4]) -> Shape {
    let nodes = opts.streams[l[0]];
    let rate = opts.rates[l[3]].max(1);
    Shape {
        nodes,
        pods: opts.pods[l[1]],
        containers: opts.containers[l[2]],
        resolution_ms: (nodes as u64 * 1000).div_ceil(rate),
        addresses: u8::try_from(nodes.div_ceil(STREAMS_PER_ADDRESS).max(1)).unwrap_or(u8::MAX),
        ramp_secs: (nodes / opts.handshakes_per_sec.max(1)).max(10) as u64,
        warmup_secs: opts.warmup_secs,
        measure_secs: opts.measure_secs,
        signals: false,
    }
}

/// The sizes the fit predicts: (what, nodes, pods a node, containers a pod).
const SIZES: [(&str, usize, usize, usize); 5] = [
    (
        "5,000 nodes × 110 pods × 2 (the ingest target)",
        5_000,
        110,
        2,
    ),
    ("10,000 nodes × 15 pods × 2 (150,000 pods)", 10_000, 15, 2),
    ("30,000 nodes × 10 pods × 2", 30_000, 10, 2),
    ("65,000 nodes × 10 pods × 2 (GKE's limit)", 65_000, 10, 2),
    (
        "130,000 nodes × 8 pods × 2 (GKE's largest run)",
        130_000,
        8,
        2,
    ),
];

/// The memory model's row: 1, streams, pods, containers (as stored).
fn memory_row(streams: f64, pods: f64, containers: f64) -> Vec<f64> {
    vec![1.0, streams, pods, containers]
}

/// The CPU model's row: 1, streams, batches/s, pods/s, containers/s.
fn cpu_row(streams: f64, batches: f64, pods: f64, containers: f64) -> Vec<f64> {
    vec![
        1.0,
        streams,
        batches,
        batches * pods,
        batches * pods * containers,
    ]
}

/// A run had every stream open and every node and container stored.
fn check(r: &Run) -> Result<()> {
    let containers = (r.shape.nodes * r.shape.pods * r.shape.containers) as f64;
    ensure!(
        (r.sample.streams - r.shape.nodes as f64).abs() < 0.5
            && (r.sample.stored_nodes - r.shape.nodes as f64).abs() < 0.5
            && (r.sample.stored_containers - containers).abs() < 0.5,
        "{} streams open, {} nodes and {} containers stored, not {} and {containers}",
        r.sample.streams,
        r.sample.stored_nodes,
        r.sample.stored_containers,
        r.shape.nodes
    );
    Ok(())
}

/// A run's row of the runs' table.
fn row(r: &Run) -> String {
    format!(
        "| {} | {} | {:.0} | {} | {} | {} ms | {:.0} | {:.3} | {:.0} | {} | {:.0} | {} |",
        r.pass + 1,
        r.point + 1,
        r.sample.streams,
        r.shape.pods,
        r.shape.containers,
        r.shape.resolution_ms,
        r.sample.batches_per_sec(),
        r.sample.cores(),
        r.sample.rss_mib,
        r.sample.fds,
        r.sample.tcp_kib,
        harness::ms(r.sample.in_server.1)
    )
}

/// The runs, the fits and the predictions, as Markdown.
fn report(opts: &Options, runs: &[Run]) -> Result<String> {
    use std::fmt::Write;
    let mut out = String::new();
    writeln!(
        out,
        "Runs ({} passes over the L9 design, seed {}, in the order run):\n",
        opts.passes, opts.seed
    )?;
    writeln!(
        out,
        "| pass | point | streams | pods/node | containers/pod | batch every | batches/s | server cores | RSS MiB | fds | host TCP KiB | in-server p99 |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    for r in runs {
        writeln!(out, "{}", row(r))?;
    }
    let per_node = |r: &Run| (r.shape.pods as f64, r.shape.containers as f64);
    let points: Vec<usize> = runs.iter().map(|r| r.point).collect();
    let memory_x: Vec<Vec<f64>> = runs
        .iter()
        .map(|r| {
            let (p, c) = per_node(r);
            let n = r.sample.streams;
            memory_row(n, n * p, n * p * c)
        })
        .collect();
    let memory_y: Vec<f64> = runs.iter().map(|r| r.sample.rss_mib).collect();
    let memory = Fit::least_squares(&memory_x, &memory_y).context("memory")?;
    let cpu_x: Vec<Vec<f64>> = runs
        .iter()
        .map(|r| {
            let (p, c) = per_node(r);
            cpu_row(r.sample.streams, r.sample.batches_per_sec(), p, c)
        })
        .collect();
    let cpu_y: Vec<f64> = runs.iter().map(|r| r.sample.cores()).collect();
    let cpu = Fit::least_squares(&cpu_x, &cpu_y).context("CPU")?;
    let per_stream = |y: fn(&Sample) -> f64| -> Result<Fit> {
        Fit::least_squares(
            &runs
                .iter()
                .map(|r| vec![1.0, r.sample.streams])
                .collect::<Vec<_>>(),
            &runs.iter().map(|r| y(&r.sample)).collect::<Vec<_>>(),
        )
    };
    let fds = per_stream(|s| s.fds as f64).context("file descriptors")?;
    let tcp = per_stream(|s| s.tcp_kib).context("TCP memory")?;

    let coef = |f: &Fit, j: usize, unit: f64, fmt: &dyn Fn(f64) -> String| {
        let (v, lo, hi) = f.coefficient(j);
        format!(
            "{} ({} … {})",
            fmt(v * unit),
            fmt(lo * unit),
            fmt(hi * unit)
        )
    };
    let num = |digits: usize| move |v: f64| format!("{v:.digits$}");
    writeln!(out, "\nFits (95 % intervals; {} runs):\n", runs.len())?;
    writeln!(out, "| coefficient | value |")?;
    writeln!(out, "|---|---|")?;
    let rows: [(&str, &Fit, usize, f64, usize); 13] = [
        ("memory: fixed, MiB", &memory, 0, 1.0, 0),
        ("memory per stream, KiB", &memory, 1, 1024.0, 1),
        ("memory per pod, KiB", &memory, 2, 1024.0, 2),
        ("memory per container, KiB", &memory, 3, 1024.0, 2),
        ("CPU: fixed, millicores", &cpu, 0, 1e3, 0),
        ("CPU per stream (idle), microcores", &cpu, 1, 1e6, 2),
        ("CPU per batch, µs", &cpu, 2, 1e6, 1),
        ("CPU per pod in a batch, µs", &cpu, 3, 1e6, 3),
        ("CPU per container in a batch, µs", &cpu, 4, 1e6, 3),
        ("file descriptors: fixed", &fds, 0, 1.0, 0),
        ("file descriptors per stream", &fds, 1, 1.0, 3),
        ("host TCP memory: fixed, KiB", &tcp, 0, 1.0, 0),
        (
            "host TCP memory per stream (both ends), KiB",
            &tcp,
            1,
            1.0,
            2,
        ),
    ];
    for (label, fit, j, unit, digits) in rows {
        writeln!(out, "| {label} | {} |", coef(fit, j, unit, &num(digits)))?;
    }
    writeln!(
        out,
        "| residual sd / R² | memory {:.0} MiB / {:.3}; CPU {:.3} cores / {:.3}; fds {:.1} / {:.4}; TCP {:.0} KiB / {:.3} |",
        memory.residual_sd, memory.r2, cpu.residual_sd, cpu.r2, fds.residual_sd, fds.r2, tcp.residual_sd, tcp.r2
    )?;
    let lof = |fit: &Fit, x: &[Vec<f64>], y: &[f64], unit: &str, scale: f64| {
        fit.lack_of_fit(x, y, &points)
            .map_or("no repeated points".to_owned(), |l| {
                format!(
                    "F = {:.1} on ({}, {}); the worst point's mean {:.3} {unit} off",
                    l.f,
                    l.df.0,
                    l.df.1,
                    l.worst * scale
                )
            })
    };
    writeln!(
        out,
        "| lack of fit (the points' means against their runs' scatter; a large F: the model \
         misses by more than the runs vary, and the intervals above are too narrow) | memory: \
         {}; CPU: {} |",
        lof(&memory, &memory_x, &memory_y, "MiB", 1.0),
        lof(&cpu, &cpu_x, &cpu_y, "cores", 1.0)
    )?;
    writeln!(
        out,
        "\nPredicted for one replica, every agent at 1 s (extrapolated past {} streams; 95 % \
         intervals of the fitted mean):\n",
        opts.streams.iter().max().copied().unwrap_or(0)
    )?;
    writeln!(
        out,
        "| cluster | memory, GiB | CPU, cores | file descriptors |"
    )?;
    writeln!(out, "|---|---|---|---|")?;
    for (what, nodes, pods, containers) in SIZES {
        let (n, p, c) = (nodes as f64, pods as f64, containers as f64);
        let (m, mlo, mhi) = memory.predict(&memory_row(n, n * p, n * p * c));
        let (k, klo, khi) = cpu.predict(&cpu_row(n, n, p, c));
        let (f, _, _) = fds.predict(&[1.0, n]);
        writeln!(
            out,
            "| {what} | {:.1} ({:.1} … {:.1}) | {:.2} ({:.2} … {:.2}) | {:.0} |",
            m / 1024.0,
            mlo / 1024.0,
            mhi / 1024.0,
            k,
            klo,
            khi,
            f
        )?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_design_is_orthogonal() {
        // Every level of every factor three times; every pair of levels of two factors once.
        for f in 0..4 {
            for level in 0..3 {
                assert_eq!(L9.iter().filter(|r| r[f] == level).count(), 3);
            }
            for g in f + 1..4 {
                for a in 0..3 {
                    for b in 0..3 {
                        let n = L9.iter().filter(|r| r[f] == a && r[g] == b).count();
                        assert_eq!(n, 1, "factors {f} and {g} at levels {a}, {b}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_models_are_separable_on_the_default_design() -> Result<()> {
        // Made-up costs, fitted back from the design's own rows: the design separates every
        // coefficient (no collinear columns), so a real run can only fail on its data.
        let opts = Options {
            streams: vec![1000, 9000, 18000],
            pods: vec![1, 10, 60],
            containers: vec![1, 2, 4],
            rates: vec![500, 1000, 2000],
            passes: 1,
            seed: 1,
            handshakes_per_sec: 300,
            warmup_secs: 20,
            measure_secs: 40,
            no_build: true,
        };
        let shapes: Vec<Shape> = L9.iter().map(|l| shape(&opts, *l)).collect();
        let truth = [5.0, 0.02, 0.3, 0.002, 0.0011];
        let x: Vec<Vec<f64>> = shapes
            .iter()
            .map(|s| {
                cpu_row(
                    s.nodes as f64,
                    s.batches_per_sec(),
                    s.pods as f64,
                    s.containers as f64,
                )
            })
            .collect();
        let y: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let noise = if i % 2 == 0 { 1e-6 } else { -1e-6 };
                r.iter().zip(truth).map(|(a, b)| a * b).sum::<f64>() + noise
            })
            .collect();
        let fit = Fit::least_squares(&x, &y)?;
        for (j, t) in truth.iter().enumerate() {
            assert!((fit.coef[j] - t).abs() < 1e-3 * t.abs().max(1e-3), "{j}");
        }
        let memory: Vec<Vec<f64>> = shapes
            .iter()
            .map(|s| {
                let n = s.nodes as f64;
                let p = n * s.pods as f64;
                memory_row(n, p, p * s.containers as f64)
            })
            .collect();
        let y: Vec<f64> = memory
            .iter()
            .enumerate()
            .map(|(i, r)| 50.0 + 0.05 * r[1] + 0.002 * r[2] + 0.0015 * r[3] + (i % 3) as f64)
            .collect();
        let fit = Fit::least_squares(&memory, &y)?;
        assert!((fit.coef[1] - 0.05).abs() < 1e-3);
        // Every run at most 10 batches a second per stream, two addresses past 10,000.
        assert!(shapes.iter().all(|s| s.resolution_ms >= 100));
        assert_eq!(shapes.iter().map(|s| s.addresses).max(), Some(2));
        Ok(())
    }
}
