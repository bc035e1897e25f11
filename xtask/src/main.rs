//! Project chores, as `cargo xtask <command>`: a local demo, build the eBPF programs, run
//! the tests (on this host and in qemu VMs), fuzzing, benchmarks, the TLS material of
//! `deploy/`. Not shipped; not a library.

mod bench_agent;
mod bench_fit;
mod bench_ingest;
mod bench_restart;
mod build_ebpf;
mod certs;
mod cluster;
mod cross;
mod demo;
mod exec;
mod fuzz;
mod go_golden;
mod harness;
mod soak;
mod stats;
mod test;
mod vm;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "kpulse project chores")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The agent's own CPU and memory on a node's worth of pods here; two builds side by side.
    BenchAgent(bench_agent::Options),
    /// One aggregator-api replica ingesting simulated agents: CPU, RSS, latency, bytes.
    BenchIngest(bench_ingest::Options),
    /// One replica's cost per stream, pod and container: bench-ingest runs fitted by least squares.
    BenchFit(bench_fit::Options),
    /// kpulse beside metrics-server on the running cluster: freshness, accuracy, cost, load.
    BenchVsMetricsServer(cluster::versus::Options),
    /// Server restarts under load: time until every node and pod is served again.
    BenchRestart(bench_restart::Options),
    /// Check/install the eBPF toolchain, then build the programs in ebpf/.
    BuildEbpf(build_ebpf::Options),
    /// Make the CA, serving certificate and caBundle patch that deploy/ includes.
    Certs(certs::Options),
    /// A real single-node Kubernetes here (built from Go modules): up, down, status.
    Cluster(cluster::Options),
    /// Run the agent and the aggregator-api here, with demo pods, and watch `kubectl top`.
    Demo(demo::Options),
    /// Run the cargo-fuzz targets of fuzz/ (nightly) and report; fails on a crash.
    Fuzz(fuzz::Options),
    /// Rewrite (or --check) aggregator-api's golden.jsonl: what Go prints for go.rs's cases.
    GoGolden(go_golden::Options),
    /// Long run under agents and readers: end-to-end count, errors, RSS drift; pass/fail.
    Soak(soak::Options),
    /// Run every test: lints, host tests, accuracy on this kernel and in qemu VMs.
    Test(test::Options),
    /// Boot Debian kernels (pure cgroup v2) in qemu and run a test binary inside.
    Vm(vm::Options),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::BenchAgent(opts) => bench_agent::run(&opts),
        Command::BenchIngest(opts) => bench_ingest::run(&opts),
        Command::BenchFit(opts) => bench_fit::run(&opts),
        Command::BenchRestart(opts) => bench_restart::run(&opts),
        Command::BenchVsMetricsServer(opts) => cluster::versus::run(&opts),
        Command::BuildEbpf(opts) if opts.clippy => build_ebpf::clippy(),
        Command::BuildEbpf(opts) => build_ebpf::run(&opts).map(|_| ()),
        Command::Certs(opts) => certs::run(&opts),
        Command::Cluster(opts) => cluster::run(&opts),
        Command::Demo(opts) => demo::run(&opts),
        Command::Fuzz(opts) => fuzz::run(&opts),
        Command::GoGolden(opts) => go_golden::run(&opts),
        Command::Soak(opts) => soak::run(&opts),
        Command::Test(opts) => test::run(&opts),
        Command::Vm(opts) => vm::run(&opts),
    }
}
