//! `kpulse-agent`: wiring only. Flags → tracing → collector → command.

use std::process::ExitCode;

use clap::Parser;
use kpulse_agent::{
    collect::{self, Scope},
    config::{Cli, Command},
    dump,
    layout::Layout,
};
use tracing::{info, warn};

/// sysexits' EX_USAGE: the flags cannot work.
const EX_USAGE: u8 = 64;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let Command::Dump(args) = cli.command;
    if let Err(e) = args.collect.validate() {
        eprintln!("kpulse-agent: {e}");
        return ExitCode::from(EX_USAGE);
    }
    match run_dump(&args) {
        Ok(()) => ExitCode::SUCCESS,
        // `dump | head`: the reader went away; that is how a pipe ends, not a failure.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kpulse-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_dump(args: &kpulse_agent::config::DumpArgs) -> anyhow::Result<()> {
    let c = &args.collect;
    let layout = Layout::detect()?;
    let scope = Scope {
        layout: layout.clone(),
        root: c.cgroup_root.clone(),
        max_cgroups: c.max_cgroups,
    };
    let (mut collector, fallback) = collect::select(c.collector, scope, c.ebpf_object.as_deref())?;
    if let Some(reason) = fallback {
        let reason = kpulse_agent::error::chain(&reason);
        warn!(%reason, "eBPF collector unavailable, using cgroupfs");
    }
    info!(collector = %collector.source(), layout = layout.name(), "collecting");
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    dump::run(collector.as_mut(), args.count, c.resolution, &mut out)
}
