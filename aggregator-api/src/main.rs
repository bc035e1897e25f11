//! `kpulse-aggregator-api`: wiring only. Flags → tracing → TLS → serve → drain.

use std::{process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context;
use clap::Parser;
use kpulse_aggregator_api::{
    app::{App, HealthChecks},
    config::Config,
    health, serve, tls,
};

/// sysexits' EX_USAGE.
const EX_USAGE: u8 = 64;

fn main() -> ExitCode {
    let cfg = Config::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = cfg.validate() {
        eprintln!("kpulse-aggregator-api: {e}");
        return ExitCode::from(EX_USAGE);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kpulse-aggregator-api: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cfg)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kpulse-aggregator-api: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cfg: Config) -> anyhow::Result<()> {
    let source = match (&cfg.tls_cert_file, &cfg.tls_private_key_file) {
        (Some(cert), Some(key)) => tls::CertSource::Files {
            cert: cert.clone(),
            key: key.clone(),
        },
        _ => tls::CertSource::SelfSigned {
            dir: cfg.cert_dir.clone(),
            names: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
        },
    };
    let (cert, key) = source.files()?;
    let certs = tls::ReloadingCert::new(cert, key)?;
    tokio::spawn(certs.clone().watch(Duration::from_secs(1)));
    let provider = tls::provider_with(tls::cipher_suites(&cfg.tls_cipher_suites)?);
    let client_certs = kpulse_aggregator_api::auth::tls::RequestClientCert::new(&provider);
    let mut server_config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&tls::protocol_versions(&cfg.tls_min_version)?)?
        .with_client_cert_verifier(client_certs)
        .with_cert_resolver(certs);
    server_config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];

    let addr = std::net::SocketAddr::new(cfg.bind_address, cfg.secure_port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(%addr, "serving");
    let app = Arc::new(App {
        health: HealthChecks {
            healthz: vec![health::ping()],
            livez: vec![health::ping()],
            readyz: vec![health::ping()],
        },
    });
    serve::serve(
        listener,
        Arc::new(server_config),
        app,
        serve::Limits::default(),
        shutdown_signal(),
    )
    .await;
    tracing::info!("stopped");
    Ok(())
}

/// SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = int.recv() => tracing::info!("SIGINT: draining"),
    }
}
