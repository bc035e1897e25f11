//! `kpulse-agent`: wiring only. Flags → tracing → collector → command.

use std::{process::ExitCode, sync::Arc};

use anyhow::Context;
use clap::Parser;
use kpulse_agent::{
    attribute::{self, Attributor},
    collect::{self, Collector, Scope},
    config::{Cli, CollectArgs, Command, DumpArgs, RunArgs},
    dump,
    layout::Layout,
    run::TickLoop,
    selfmetrics::{self, AgentMetrics},
    ship::{self, Credentials, Replicas, ShipConfig, Shipper},
    window::Windows,
};
use tracing::{info, warn};

fn main() -> ExitCode {
    let cli = Cli::parse();
    kpulse_process::init_logging();
    match cli.command {
        Command::Dump(args) => main_dump(&args),
        Command::Run(args) => main_run(*args),
    }
}

fn main_dump(args: &DumpArgs) -> ExitCode {
    if let Err(e) = args.collect.validate() {
        eprintln!("kpulse-agent: {e}");
        return ExitCode::from(kpulse_process::EX_USAGE);
    }
    match run_dump(args) {
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

/// The collector, and the cgroup layout it reads.
fn collector(c: &CollectArgs) -> anyhow::Result<(Box<dyn Collector>, Layout)> {
    let layout = Layout::detect()?;
    let scope = Scope {
        layout: layout.clone(),
        root: c.cgroup_root.clone(),
        max_cgroups: c.max_cgroups,
        signals: collect::Signals {
            pressure: c.custom_metrics,
            throttling: c.custom_metrics,
        },
    };
    let (collector, fallback) = collect::select(c.collector, scope, c.ebpf_object.as_deref())?;
    if let Some(reason) = fallback {
        let reason = kpulse_process::error_chain(&reason);
        warn!(%reason, "eBPF collector unavailable, using cgroupfs");
    }
    info!(collector = %collector.source(), layout = layout.name(), "collector ready");
    Ok((collector, layout))
}

fn run_dump(args: &DumpArgs) -> anyhow::Result<()> {
    let c = &args.collect;
    let (mut collector, _) = collector(c)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    dump::run(collector.as_mut(), args.count, c.resolution, &mut out)
}

fn main_run(args: RunArgs) -> ExitCode {
    // One thread for everything asynchronous (a few streams, a watch, `/metrics`: idle
    // most of the time); collections run on the blocking pool. A multi-threaded runtime
    // costs more here than it gives: workers waking and stealing from each other for work
    // that takes microseconds (see docs/benchmarks.md, the agent's own cost).
    kpulse_process::run_main(
        "kpulse-agent",
        args.validate(),
        || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        },
        || run(args),
    )
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    // Installed first: a SIGTERM from here on stops the agent cleanly.
    let signalled = kpulse_process::shutdown::install().context("installing signal handlers")?;
    let delay = args.shutdown_delay_duration;
    let shutdown = async move {
        signalled.await;
        if !delay.is_zero() {
            tracing::info!(
                ?delay,
                "still streaming while the server's kubelet fallback takes over \
                 (--shutdown-delay-duration)"
            );
            tokio::time::sleep(delay).await;
        }
    };
    if args.insecure_skip_tls_verify {
        warn!("--insecure-skip-tls-verify: the aggregator's certificate is NOT verified; for local tests only");
    }
    if args.token_file.is_none() && args.client_cert_file.is_none() {
        warn!("no credentials (--token-file or --client-cert-file): a real aggregator refuses an anonymous agent");
    }
    let tls = ship::tls::client_config(&ship::tls::TlsOptions {
        ca_file: args.server_ca_file.clone(),
        insecure_skip_verify: args.insecure_skip_tls_verify,
        client_cert: args
            .client_cert_file
            .clone()
            .zip(args.client_key_file.clone()),
    })
    .context("TLS client configuration")?;

    let c = args.collect.clone();
    let (collector, layout) = tokio::task::spawn_blocking(move || collector(&c))
        .await
        .context("collector setup")??;
    let source = collector.source();
    if kpulse_agent::clock::boot().is_none() {
        warn!("the clocks cannot be read: no node boot time or container start times");
    }

    let (mode, attributor) = match &args.pods_file {
        Some(path) => (
            "standalone",
            Attributor::from_file(path.clone(), attribute::POD_FILE_POLL).await?,
        ),
        None => {
            let client = kube::Client::try_default().await.context(
                "Kubernetes client (in-cluster or KUBECONFIG); without a Kubernetes API use --pods-file",
            )?;
            info!(node = %args.node_name, "watching this node's pods");
            ("cluster", Attributor::cluster(client, &args.node_name))
        }
    };

    let metrics = Arc::new(AgentMetrics::new());
    let (metrics_stop, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    let metrics_server = match args.metrics_address() {
        Some(addr) => {
            let listener = selfmetrics::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (--metrics-bind-address)"))?;
            info!(%addr, "serving /metrics");
            Some(tokio::spawn(selfmetrics::serve(
                listener,
                metrics.clone(),
                async move {
                    let _ = metrics_stopped.await;
                },
            )))
        }
        None => None,
    };

    let replicas = match &args.server_service {
        Some(s) => {
            let (host, port) =
                ship::split_host_port(s).context("--server-service is not host:port")?;
            Replicas::Service { host, port }
        }
        None => Replicas::Static(args.servers.clone()),
    };
    let mut config = ShipConfig::new(replicas, tls);
    config.server_name = args.server_name.clone();
    config.credentials = args
        .token_file
        .clone()
        .map_or(Credentials::None, Credentials::TokenFile);
    config.queue_ticks = args.queue_ticks;
    config.metrics = metrics.ship.clone();
    let agent = format!(
        "kpulse-agent {} ({source} collector, {mode})",
        env!("CARGO_PKG_VERSION")
    );
    let shipper = Shipper::spawn(config, ship::hello(&args.node_name, &agent));

    // Containers' start times come from the hierarchy every process is in (cgroup2).
    let procs_root = Some(layout.cpu_mount().to_path_buf());
    let ended = TickLoop {
        collector,
        attributor,
        resolution: args.collect.resolution,
        windows: args
            .collect
            .custom_metrics
            .then(|| Windows::new(args.custom_metrics_window, args.collect.resolution)),
        procs_root,
        metrics,
    }
    .run(&shipper, shutdown)
    .await;

    shipper.shutdown(args.shutdown_grace).await;
    let _ = metrics_stop.send(());
    if let Some(task) = metrics_server {
        let _ = task.await;
    }
    ended?;
    info!("stopped");
    Ok(())
}
