//! `kpulse-aggregator-api`: wiring only. Flags → tracing → TLS → store, sessions (agents'
//! streams and the feed file), the maintenance loop and the server's own metrics → serve
//! the API and the agents' port → drain.

use std::{process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context;
use clap::Parser;
use kpulse_aggregator_api::{
    app::{App, Authorization, HealthChecks, Security},
    auth::{self, chain, delegated, issuer::LocalVerifier, x509::CaBundle},
    config::{AuthorizationMode, Config, TokenVerification},
    health, ingest,
    metadata::StreamMetadata,
    selfmetrics, serve,
    session::Sessions,
    store::Store,
    tls,
};

/// mimalloc: per-message allocations on the ingest path made glibc's malloc (with its
/// consolidation) a quarter of the server's CPU in profiles.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cfg = Config::parse();
    kpulse_process::init_logging();
    kpulse_process::run_main(
        "kpulse-aggregator-api",
        cfg.validate(),
        || {
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
        },
        || run(cfg),
    )
}

async fn run(cfg: Config) -> anyhow::Result<()> {
    // Installed before the port is bound: a SIGTERM from then on drains.
    let shutdown = kpulse_process::shutdown::install().context("installing signal handlers")?;
    let open_files = raise_open_files();
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

    let server_config = Arc::new(server_config);

    let addr = std::net::SocketAddr::new(cfg.bind_address, cfg.secure_port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(%addr, "serving");
    // Bound now, listening once the replica can verify the agents' tokens itself
    // (ingest::listen_when, below).
    let ingest_addr = cfg.ingest_address();
    let ingest_socket = ingest::bind(ingest_addr)
        .with_context(|| format!("cannot listen on {ingest_addr} (--ingest-port)"))?;
    let started = std::time::Instant::now();
    let (kube_config, client) = match kube_client(&cfg).await? {
        Some((config, client)) => (Some(config), Some(client)),
        None => (None, None),
    };
    let security = security(&cfg, client.clone()).await?;
    let store = Arc::new(
        kpulse_aggregator_api::store::Store::new(kpulse_aggregator_api::store::StoreConfig {
            window: cfg.metric_window,
            window_mode: cfg.metric_window_mode,
            ..kpulse_aggregator_api::store::StoreConfig::new(cfg.metric_expiry)
        })
        .context("store configuration")?,
    );
    // Nodes from the API as metrics-server's Node informer (labels, existence), where there
    // is one; from the agents alone where not (standalone, the test doubles).
    // With an API, readiness also waits for the nodes that run a Ready agent.
    let (metadata, expected) = match &client {
        Some(client) => {
            let nodes = kpulse_aggregator_api::nodes::ClusterNodes::new();
            tokio::spawn(kpulse_aggregator_api::nodes::follow(
                client.clone(),
                nodes.clone(),
            ));
            let agents = kpulse_aggregator_api::agents::AgentPods::new();
            tokio::spawn(kpulse_aggregator_api::agents::follow(
                client.clone(),
                cfg.agent_namespace.clone(),
                cfg.agent_selector.clone(),
                agents.clone(),
            ));
            (
                StreamMetadata::with_cluster_nodes(nodes.clone()),
                Some((nodes, agents)),
            )
        }
        None => (StreamMetadata::new(), None),
    };
    let ingest_metrics = selfmetrics::IngestMetrics::new();
    let sessions = Sessions::new(store.clone(), metadata.clone(), ingest_metrics.clone());
    let identity = agent_identity(
        &cfg,
        client.clone(),
        expected.as_ref().map(|(_, agents)| agents.clone()),
    )?;
    let local_tokens = identity.local.clone();
    let agents = ingest::Ingest::new(
        sessions.clone(),
        identity,
        ingest_settings(&cfg, open_files),
    );
    if let Some(path) = &cfg.feed_file {
        tracing::info!(path = %path.display(), "following the feed file");
        tokio::spawn(kpulse_aggregator_api::feed::follow(
            path.clone(),
            sessions.clone(),
        ));
    }
    let (every, max_age) = health::maintenance_schedule(cfg.metric_expiry);
    let heartbeat = Arc::new(health::Heartbeat::new(
        health::METRIC_COLLECTION_TIMELY,
        "the store's maintenance loop",
        max_age,
    ));
    tokio::spawn(maintain(sessions, heartbeat.clone(), every));
    // The kubelets, for nodes without an agent streaming (src/kubelet/mod.rs).
    let kubelets = match &kube_config {
        Some(kube_config) if cfg.kubelet_fallback => match kubelet_client(&cfg, kube_config) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "no kubelet fallback: nodes without an agent are not served"
                );
                None
            }
        },
        _ => None,
    };
    let fallback = match (kubelets, &client, &expected) {
        (Some(kubelet), Some(client), Some((nodes, agents))) => {
            let fallback = kpulse_aggregator_api::kubelet::Fallback::new(
                kpulse_aggregator_api::kubelet::Settings {
                    resolution: cfg.metric_resolution,
                },
            )
            .context("the kubelet fallback's store")?;
            tokio::spawn(kpulse_aggregator_api::kubelet::run(
                fallback.clone(),
                kpulse_aggregator_api::kubelet::Inputs {
                    api: client.clone(),
                    kubelet,
                    nodes: nodes.clone(),
                    agents: agents.clone(),
                    agent_store: store.clone(),
                    agent_metadata: metadata.clone(),
                },
            ));
            tracing::info!(
                resolution = ?cfg.metric_resolution,
                "serving nodes without an agent from their kubelets"
            );
            Some(fallback)
        }
        _ => {
            tracing::info!(
                "no kubelet fallback (--kubelet-fallback=false, or no Kubernetes API): nodes \
                 without an agent are not served"
            );
            None
        }
    };
    let sources = kpulse_aggregator_api::sources::Sources::new(
        (store.clone(), metadata.clone()),
        fallback.as_ref().map(|f| {
            (
                f.store.clone() as Arc<dyn kpulse_aggregator_api::api::objects::MetricsReader>,
                f.metadata.clone() as Arc<dyn kpulse_aggregator_api::metadata::MetadataSource>,
            )
        }),
    );
    let ready_store = store.clone();
    let ready_kubelets = fallback.as_ref().map(|f| f.store.clone());
    let storage_ready = health::FnCheck::arc("metric-storage-ready", move || {
        if ready_store.ready() || ready_kubelets.as_ref().is_some_and(|s| s.ready()) {
            Ok(())
        } else {
            Err("no metrics to serve".into())
        }
    });
    // Fails from SIGTERM on, through --shutdown-delay-duration (as kube-apiserver's
    // `shutdown` check), so that nothing new is routed to a replica that is leaving.
    let terminating = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let shutdown_check = {
        let terminating = terminating.clone();
        health::FnCheck::arc("shutdown", move || {
            if terminating.load(std::sync::atomic::Ordering::Relaxed) {
                Err("process is shutting down".into())
            } else {
                Ok(())
            }
        })
    };
    let mut readyz: Vec<Arc<dyn health::Check>> =
        vec![health::ping(), shutdown_check, storage_ready];
    if let Some((nodes, agents)) = expected {
        let served = sources.clone();
        readyz.push(Arc::new(health::Completeness::new(
            nodes,
            agents,
            move |node| {
                kpulse_aggregator_api::api::objects::MetricsReader::node_metrics(&*served, &[node])
                    .first()
                    .is_some_and(Option::is_some)
            },
        )));
    }
    let watches =
        kpulse_aggregator_api::api::watch::Hub::new(kpulse_aggregator_api::api::watch::Settings {
            min_request_timeout: cfg.min_request_timeout,
            ..Default::default()
        });
    let api_connections = serve::ConnectionStats::new();
    let agent_connections = serve::ConnectionStats::new();
    let metrics = Arc::new(
        selfmetrics::SelfMetrics::with_store(&store)
            .with_fallback(fallback.as_ref().map(|f| f.stats.clone()))
            .with_watches(watches.clone())
            .with_ingest(&ingest_metrics)
            .with_connections(vec![
                ("api", api_connections.clone()),
                ("agents", agent_connections.clone()),
            ]),
    );
    // The resource endpoints negotiate protobuf (api/proto/), so OpenAPI lists it.
    let discovery = kpulse_aggregator_api::api::discovery::Discovery::new(
        kpulse_aggregator_api::api::document::Options {
            protobuf: true,
            custom_metrics: cfg.custom_metrics,
            ..kpulse_aggregator_api::api::document::Options::for_secure_port(cfg.secure_port)
        },
    )
    .context("building the discovery and OpenAPI documents")?;
    let app = Arc::new(App {
        health: HealthChecks {
            healthz: vec![health::ping()],
            livez: vec![health::ping(), heartbeat],
            readyz,
        },
        security,
        router: kpulse_aggregator_api::api::handler::ApiContext {
            store: sources.clone(),
            metadata: sources,
            discovery: Arc::new(discovery),
            watch: watches.clone(),
        },
        metrics: Some(metrics),
    });
    // One signal, two servers.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let delay = cfg.shutdown_delay_duration;
    let closing = terminating.clone();
    tokio::spawn(async move {
        shutdown.await;
        terminating.store(true, std::sync::atomic::Ordering::Relaxed);
        if !delay.is_zero() {
            tracing::info!(
                ?delay,
                "still serving until kube-apiserver routes elsewhere (--shutdown-delay-duration)"
            );
            tokio::time::sleep(delay).await;
        }
        stop.send_replace(true);
    });
    let signalled = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        // An error means the sender is gone: stop as well.
        let _ = rx.wait_for(|s| *s).await;
    };
    let api_shutdown = {
        let signal = signalled(stopped.clone());
        async move {
            signal.await;
            // Watches never end by themselves: end them so that the drain can finish.
            watches.shutdown();
        }
    };
    let api = serve::serve(
        listener,
        server_config.clone(),
        app,
        cfg.serve_limits(),
        api_connections,
        api_shutdown,
    );
    let ingest_stop = signalled(stopped);
    let ingest_limits = cfg.serve_limits();
    let ingest = async move {
        let can_check = || local_tokens.as_ref().is_none_or(|l| l.can_check());
        let listener = tokio::select! {
            listener = ingest::listen_when(ingest_socket, can_check, started) => listener
                .with_context(|| format!("cannot listen on {ingest_addr} (--ingest-port)"))?,
            // A replica terminating before its agents' port opened never opens it (during
            // --shutdown-delay-duration it still serves the API, not new streams; the stop
            // signal comes after `closing`, so this also covers it).
            () = async {
                while !closing.load(std::sync::atomic::Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            } => return Ok(()),
        };
        ingest::serve(
            listener,
            server_config,
            agents,
            ingest_limits,
            agent_connections,
            ingest_stop,
        )
        .await;
        anyhow::Ok(())
    };
    // A replica that cannot listen on its agents' port stops, with that error.
    tokio::try_join!(
        async {
            api.await;
            anyhow::Ok(())
        },
        ingest
    )?;
    tracing::info!("stopped");
    Ok(())
}

/// Raises the open-file limit to the hard one, as Go's runtime does for metrics-server: a
/// container of containerd 2 starts at 1,024, and a stream is a file descriptor. The limit
/// in force, raised or not.
fn raise_open_files() -> Option<u64> {
    match kpulse_process::limits::raise_open_files() {
        Ok(files) => {
            if files.soft > files.inherited {
                tracing::info!(
                    inherited = files.inherited,
                    now = files.soft,
                    "open-file limit raised to the hard limit"
                );
            }
            Some(files.soft)
        }
        Err(e) => {
            tracing::warn!(error = %e, "open-file limit left as inherited");
            kpulse_process::limits::open_files().ok()
        }
    }
}

/// Below this many streams, an open-file limit that lowers `--max-agent-streams` is worth a
/// warning even at its default: it caps the cluster's size, not a bound no cluster reaches.
const FEW_STREAMS: usize = 10_000;

/// The agents' port's limits: `--max-agent-streams`, within what the open-file limit
/// `open_files` leaves room for.
fn ingest_settings(cfg: &Config, open_files: Option<u64>) -> ingest::Settings {
    let mut settings = ingest::Settings::new(cfg.max_agent_streams, cfg.metric_expiry);
    let Some(open_files) = open_files else {
        return settings;
    };
    match settings.fit_open_files(open_files) {
        // The default is above any cluster: that a host's limit is below it says nothing
        // unless the room left is small.
        Some(ingest::DEFAULT_MAX_STREAMS) if settings.max_streams >= FEW_STREAMS => {
            tracing::info!(
                open_files,
                streams = settings.max_streams,
                "agent streams bounded by the open-file limit"
            )
        }
        Some(asked) => tracing::warn!(
            open_files,
            max_agent_streams = asked,
            streams = settings.max_streams,
            "the open-file limit leaves room for fewer agent streams than \
             --max-agent-streams: agents past it are refused (429) and their nodes served \
             from the kubelets if --kubelet-fallback; raise the container runtime's nofile \
             limit (containerd's LimitNOFILE) or lower the flag"
        ),
        None => {}
    }
    settings
}

/// Housekeeping on a timer, so a node whose agent stopped is dropped even when no batch
/// arrives to trigger it, with its metadata once no session holds it; every pass beats
/// `heartbeat`, the livez check that this loop (and so the runtime) still makes progress.
async fn maintain(sessions: Arc<Sessions>, heartbeat: Arc<health::Heartbeat>, every: Duration) {
    let store: &Store = &sessions.sink().store;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let dropped = store.housekeep();
        let forgotten = sessions.forget_expired();
        heartbeat.beat();
        if dropped > 0 {
            tracing::debug!(dropped, "housekeeping dropped expired nodes");
        }
        if !forgotten.is_empty() {
            tracing::info!(nodes = ?forgotten, "metadata of expired nodes without a stream dropped");
        }
    }
}

/// Who may stream which node: agents' tokens (for `--agent-token-audience`) verified
/// against the issuer's keys and `agents` (`--agent-token-verification=local`) or reviewed,
/// through the same Kubernetes API client (when there is one), and `--agent-client-ca-file`
/// certificates.
fn agent_identity(
    cfg: &Config,
    client: Option<kube::Client>,
    agents: Option<Arc<kpulse_aggregator_api::agents::AgentPods>>,
) -> anyhow::Result<ingest::Identity> {
    let audiences: Vec<String> = cfg
        .agent_token_audience
        .iter()
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .collect();
    let client = client.filter(|_| cfg.authentication_token_webhook);
    // Without an audience of kpulse's own, the reviews ask for kube-apiserver's, which
    // only kube-apiserver can judge.
    let local = match (&client, agents, cfg.agent_token_verification) {
        (Some(client), Some(agents), TokenVerification::Local) if !audiences.is_empty() => {
            let local = LocalVerifier::new(agents, cfg.agent_namespace.clone(), audiences.clone());
            tokio::spawn(local.clone().follow(client.clone()));
            Some(local)
        }
        _ => None,
    };
    let tokens = match client {
        Some(client) => Some(Arc::new(delegated::TokenAuthenticator::new(
            client,
            delegated::TokenConfig {
                cache_ttl: cfg.authentication_token_webhook_cache_ttl,
                audiences: audiences.clone(),
                timeout: ingest::AGENT_TOKEN_REVIEW_TIMEOUT,
                ..Default::default()
            },
        )?)),
        None => None,
    };
    let client_ca = match &cfg.agent_client_ca_file {
        Some(path) => Some(read_ca("--agent-client-ca-file", path)?),
        None => None,
    };
    Ok(ingest::Identity {
        tokens,
        local,
        audiences,
        service_accounts: cfg
            .agent_service_accounts
            .iter()
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect(),
        client_ca,
    })
}

/// The kubelets' client, from the `--kubelet-*` flags and, where they say nothing, the
/// Kubernetes API's CA and ServiceAccount token (as metrics-server).
fn kubelet_client(
    cfg: &Config,
    kube_config: &kube::Config,
) -> anyhow::Result<kpulse_aggregator_api::kubelet::client::Client> {
    use kpulse_aggregator_api::kubelet::client::{Client, Settings, Token};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = if cfg.kubelet_insecure_tls {
        tracing::warn!("--kubelet-insecure-tls: kubelets' certificates are not verified");
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(kpulse_process::tls::AnyServer::new(
                provider,
            )))
    } else {
        let mut roots = rustls::RootCertStore::empty();
        match &cfg.kubelet_certificate_authority {
            Some(path) => {
                for cert in kpulse_process::pem::certificates(path)? {
                    roots.add(cert)?;
                }
            }
            None => {
                let from_file = match &kube_config.root_cert_file {
                    Some(path) => kpulse_process::pem::certificates(path)?,
                    None => Vec::new(),
                };
                for cert in from_file {
                    roots.add(cert)?;
                }
                for der in kube_config.root_cert.iter().flatten() {
                    roots.add(rustls::pki_types::CertificateDer::from(der.clone()))?;
                }
            }
        }
        if roots.is_empty() {
            anyhow::bail!(
                "the kubelet fallback has no CA to verify kubelets with: pass \
                 --kubelet-certificate-authority (or --kubelet-insecure-tls, or \
                 --kubelet-fallback=false)"
            );
        }
        builder.with_root_certificates(roots)
    };
    let config = match (&cfg.kubelet_client_certificate, &cfg.kubelet_client_key) {
        (Some(cert), Some(key)) => builder.with_client_auth_cert(
            kpulse_process::pem::certificates(cert)?,
            kpulse_process::pem::private_key(key)?,
        )?,
        _ => builder.with_no_client_auth(),
    };
    let token = if cfg.kubelet_client_certificate.is_some() {
        Token::None
    } else if let Some(file) = &kube_config.auth_info.token_file {
        Token::File(file.into())
    } else if let Some(token) = &kube_config.auth_info.token {
        use secrecy::ExposeSecret as _;
        Token::Fixed(token.expose_secret().to_string())
    } else {
        Token::None
    };
    Ok(Client::new(
        Arc::new(config),
        token,
        Settings {
            address_types: cfg
                .kubelet_preferred_address_types
                .iter()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
                .collect(),
            port: cfg.kubelet_port,
            use_node_status_port: cfg.kubelet_use_node_status_port,
            timeout: cfg.kubelet_request_timeout,
        },
    ))
}

fn read_ca(flag: &str, path: &std::path::Path) -> anyhow::Result<CaBundle> {
    let pem = std::fs::read_to_string(path)
        .with_context(|| format!("reading {flag} {}", path.display()))?;
    Ok(CaBundle::from_pem(
        &pem,
        &format!("{flag} {}", path.display()),
    )?)
}

/// The Kubernetes API client (TokenReview, SubjectAccessReview, the authentication
/// ConfigMap): from `--kubeconfig`, else the in-cluster configuration or `$KUBECONFIG`.
/// `None` when nothing needs it ([`Config::kube_api_needed_for`]) and either tokens are off
/// or no API is configured (then bearer tokens are not accepted, said once at INFO).
async fn kube_client(cfg: &Config) -> anyhow::Result<Option<(kube::Config, kube::Client)>> {
    let needs = cfg.kube_api_needed_for();
    if needs.is_empty() && !cfg.authentication_token_webhook {
        tracing::info!("no Kubernetes API used (--authentication-token-webhook=false)");
        return Ok(None);
    }
    let kube_config = match &cfg.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading --kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("using --kubeconfig {}", path.display()))?
        }
        None => match kube::Config::infer().await {
            Ok(c) => c,
            Err(e) if needs.is_empty() => {
                tracing::info!(
                    reason = %e,
                    "no Kubernetes API configured and none needed: bearer tokens (TokenReview) \
                     are not accepted"
                );
                return Ok(None);
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "no Kubernetes API configuration (in-cluster or $KUBECONFIG): it is \
                         needed for {}; pass --kubeconfig",
                        needs.join(" and ")
                    )
                })
            }
        },
    };
    let client = kube::Client::try_from(kube_config.clone())
        .context("building the Kubernetes API client")?;
    Ok(Some((kube_config, client)))
}

/// Authentication and authorization from the flags and the
/// `extension-apiserver-authentication` ConfigMap.
async fn security(cfg: &Config, client: Option<kube::Client>) -> anyhow::Result<Security> {
    // `kube_client` only returns `None` when nothing below needs the API.
    let needed = |what: &str| {
        client
            .clone()
            .with_context(|| format!("{what} needs the Kubernetes API"))
    };
    let request_header = match &cfg.requestheader_client_ca_file {
        Some(path) => Some(auth::requestheader::Config {
            ca: read_ca("--requestheader-client-ca-file", path)?,
            allowed_names: cfg.requestheader_allowed_names.clone(),
            username_headers: cfg.requestheader_username_headers.clone(),
            uid_headers: cfg.requestheader_uid_headers.clone(),
            group_headers: cfg.requestheader_group_headers.clone(),
            extra_prefixes: cfg.requestheader_extra_headers_prefix.clone(),
        }),
        None => None,
    };
    let client_ca = match &cfg.client_ca_file {
        Some(path) => Some(read_ca("--client-ca-file", path)?),
        None => None,
    };
    let tokens = match client.clone().filter(|_| cfg.authentication_token_webhook) {
        Some(client) => Some(Arc::new(delegated::TokenAuthenticator::new(
            client,
            delegated::TokenConfig {
                cache_ttl: cfg.authentication_token_webhook_cache_ttl,
                ..Default::default()
            },
        )?)),
        None => None,
    };
    let chain = chain::Chain::new(chain::ChainConfig {
        request_header,
        client_ca,
        tokens,
        anonymous: if cfg.anonymous_auth {
            chain::Anonymous::Enabled { paths: Vec::new() }
        } else {
            chain::Anonymous::Disabled
        },
    })?;
    // As k8s.io/apiserver's DelegatingAuthenticationOptions: a part given by flags is
    // used instead of the ConfigMap's; the others follow the ConfigMap.
    let follow = auth::authconfig::Follow {
        request_header: cfg.requestheader_client_ca_file.is_none(),
        client_ca: cfg.client_ca_file.is_none(),
    };
    if cfg.authentication_skip_lookup {
        tracing::info!("--authentication-skip-lookup: not following the authentication ConfigMap");
    } else if follow.request_header || follow.client_ca {
        tracing::info!(
            request_header = follow.request_header,
            client_ca = follow.client_ca,
            "following {}/{}",
            auth::authconfig::NAMESPACE,
            auth::authconfig::NAME
        );
        tokio::spawn(auth::authconfig::follow(
            needed("following the authentication ConfigMap")?,
            chain.clone(),
            follow,
        ));
    }
    let authorizer = match cfg.authorization_mode {
        AuthorizationMode::Webhook => Authorization::Webhook(Arc::new(delegated::Authorizer::new(
            needed("--authorization-mode Webhook")?,
            delegated::AuthorizerConfig {
                allow_ttl: cfg.authorization_webhook_cache_authorized_ttl,
                deny_ttl: cfg.authorization_webhook_cache_unauthorized_ttl,
                always_allow_paths: cfg.authorization_always_allow_paths.clone(),
                ..Default::default()
            },
        )?)),
        AuthorizationMode::AlwaysAllow => {
            tracing::warn!(
                "--authorization-mode AlwaysAllow: every authenticated request is allowed; \
                 for local use only"
            );
            Authorization::AlwaysAllow
        }
    };
    Ok(Security { chain, authorizer })
}
