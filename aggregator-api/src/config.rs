//! Flags, named like metrics-server's where they mean the same, each with an
//! environment variable; validated (all problems at once) before anything binds.

use std::{net::IpAddr, path::PathBuf};

use clap::Parser;

/// kpulse aggregator-api: the metrics.k8s.io extension API server.
#[derive(Debug, Clone, Parser)]
#[command(name = "kpulse-aggregator-api", version, about)]
pub struct Config {
    /// Port for HTTPS (metrics-server's `--secure-port`).
    #[arg(long, env = "KPULSE_SECURE_PORT", default_value_t = 10250)]
    pub secure_port: u16,
    /// Address to listen on.
    #[arg(long, env = "KPULSE_BIND_ADDRESS", default_value = "0.0.0.0")]
    pub bind_address: IpAddr,
    /// Serving certificate (PEM); re-read when it changes.
    #[arg(long, env = "KPULSE_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// Serving key (PEM); re-read when it changes.
    #[arg(long, env = "KPULSE_TLS_PRIVATE_KEY_FILE")]
    pub tls_private_key_file: Option<PathBuf>,
    /// Where a self-signed serving certificate is generated when none is given.
    #[arg(
        long,
        env = "KPULSE_CERT_DIR",
        default_value = "apiserver.local.config/certificates"
    )]
    pub cert_dir: PathBuf,
    /// Minimum TLS version: VersionTLS12 or VersionTLS13.
    #[arg(long, env = "KPULSE_TLS_MIN_VERSION", default_value = "VersionTLS12")]
    pub tls_min_version: String,
    /// Comma-separated TLS 1.2 cipher suites (Go/IANA names); empty = defaults.
    #[arg(long, env = "KPULSE_TLS_CIPHER_SUITES", value_delimiter = ',')]
    pub tls_cipher_suites: Vec<String>,

    /// kubeconfig for the Kubernetes API (TokenReview, SubjectAccessReview); default:
    /// in-cluster configuration, then `$KUBECONFIG` / `~/.kube/config`.
    #[arg(long, env = "KPULSE_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// CA bundle that verifies the front proxy's client certificate.
    #[arg(long, env = "KPULSE_REQUESTHEADER_CLIENT_CA_FILE")]
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// Front-proxy certificate CNs allowed to name users (empty = any from the CA).
    #[arg(
        long,
        env = "KPULSE_REQUESTHEADER_ALLOWED_NAMES",
        value_delimiter = ','
    )]
    pub requestheader_allowed_names: Vec<String>,
    /// Headers carrying the user name.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-User")]
    pub requestheader_username_headers: Vec<String>,
    /// Headers carrying the user's UID.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Uid")]
    pub requestheader_uid_headers: Vec<String>,
    /// Headers carrying the user's groups.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Group")]
    pub requestheader_group_headers: Vec<String>,
    /// Header prefixes carrying extra user attributes.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Extra-")]
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// CA bundle for x509 client-certificate authentication (CN = user, O = groups).
    #[arg(long, env = "KPULSE_CLIENT_CA_FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// Do not take the request-header settings and client CA from the
    /// `kube-system/extension-apiserver-authentication` ConfigMap (by default, each of the
    /// two that has no `--requestheader-client-ca-file` / `--client-ca-file` flag follows it).
    #[arg(
        long,
        env = "KPULSE_AUTHENTICATION_SKIP_LOOKUP",
        default_value_t = false
    )]
    pub authentication_skip_lookup: bool,
    /// Allow unauthenticated requests (as `system:anonymous`); off by default.
    #[arg(long, env = "KPULSE_ANONYMOUS_AUTH", default_value_t = false)]
    pub anonymous_auth: bool,
    /// Accept bearer tokens (users' and agents'), reviewed with a TokenReview. When nothing
    /// else needs the Kubernetes API and none is configured, tokens are off (one INFO line).
    #[arg(
        long,
        env = "KPULSE_AUTHENTICATION_TOKEN_WEBHOOK",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub authentication_token_webhook: bool,
    /// How long TokenReview answers are cached.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub authentication_token_webhook_cache_ttl: std::time::Duration,
    /// How requests are authorized, as kube-apiserver's flag: `Webhook` (a
    /// SubjectAccessReview) or `AlwaysAllow` (every authenticated request: local use only).
    #[arg(
        long,
        env = "KPULSE_AUTHORIZATION_MODE",
        value_enum,
        default_value_t = AuthorizationMode::Webhook
    )]
    pub authorization_mode: AuthorizationMode,
    /// How long "allowed" SubjectAccessReview answers are cached.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub authorization_webhook_cache_authorized_ttl: std::time::Duration,
    /// How long "denied" SubjectAccessReview answers are cached.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub authorization_webhook_cache_unauthorized_ttl: std::time::Duration,
    /// Connections one client IP address may hold open at once, on each port; more are
    /// closed as soon as they are accepted (0: no limit). A kube-apiserver needs a handful
    /// (one HTTP/2 connection carries --http2-max-streams-per-connection requests); a load
    /// generator running many agents from one address needs one per agent.
    #[arg(
        long,
        env = "KPULSE_MAX_CONNECTIONS_PER_IP",
        default_value_t = crate::serve::DEFAULT_MAX_CONNECTIONS_PER_IP
    )]
    pub max_connections_per_ip: usize,
    /// Concurrent HTTP/2 streams a client may open on one connection (kube-apiserver's and
    /// metrics-server's flag; 0 means Go's default, 250, as there).
    #[arg(
        long,
        env = "KPULSE_HTTP2_MAX_STREAMS_PER_CONNECTION",
        default_value_t = crate::serve::DEFAULT_MAX_CONCURRENT_STREAMS
    )]
    pub http2_max_streams_per_connection: u32,
    /// Paths served without authorization (health endpoints).
    #[arg(long, value_delimiter = ',', default_value = "/healthz,/readyz,/livez")]
    pub authorization_always_allow_paths: Vec<String>,
    /// Serve nodes without an agent streaming their data (no agent pod there, one that is
    /// not Ready, or one silent for longer than --metric-expiry), and pods an agent leaves
    /// out, from the kubelet's /metrics/resource, as metrics-server does. Needs the
    /// Kubernetes API and `get` on `nodes/metrics` (see src/kubelet/mod.rs).
    #[arg(
        long,
        env = "KPULSE_KUBELET_FALLBACK",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub kubelet_fallback: bool,
    /// How often a node served from its kubelet is scraped (metrics-server's flag and
    /// default; at least 10s). Agents' data does not depend on it.
    #[arg(long, env = "KPULSE_METRIC_RESOLUTION", default_value = "15s", value_parser = duration)]
    pub metric_resolution: std::time::Duration,
    /// The port of the kubelets' HTTPS endpoint, where the Node's status gives none or
    /// --kubelet-use-node-status-port is false.
    #[arg(long, default_value_t = 10250)]
    pub kubelet_port: u16,
    /// Use the port the Node's status reports (`daemonEndpoints.kubeletEndpoint.Port`).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub kubelet_use_node_status_port: bool,
    /// The address types to reach kubelets by, most preferred first (metrics-server's
    /// default order).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "Hostname,InternalDNS,InternalIP,ExternalDNS,ExternalIP"
    )]
    pub kubelet_preferred_address_types: Vec<String>,
    /// Do not verify the kubelets' serving certificates (testing only).
    #[arg(long, default_value_t = false)]
    pub kubelet_insecure_tls: bool,
    /// The CA that signs the kubelets' serving certificates; by default the Kubernetes
    /// API's CA (the in-cluster or --kubeconfig one), as metrics-server.
    #[arg(long)]
    pub kubelet_certificate_authority: Option<PathBuf>,
    /// A client certificate for the kubelets (PEM); by default the ServiceAccount's token
    /// authenticates.
    #[arg(long)]
    pub kubelet_client_certificate: Option<PathBuf>,
    /// The key of --kubelet-client-certificate (PEM).
    #[arg(long)]
    pub kubelet_client_key: Option<PathBuf>,
    /// The whole scrape of one kubelet, connection to last byte.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub kubelet_request_timeout: std::time::Duration,
    /// Data older than this is never served (a disconnected node's metrics expire).
    #[arg(long, env = "KPULSE_METRIC_EXPIRY", default_value = "10s", value_parser = duration)]
    pub metric_expiry: std::time::Duration,
    /// The window CPU rates are served over: from the newest point the agent sent at
    /// least this long ago to its latest, refreshed with every point (so still every
    /// agent interval); with `--metric-window-mode=adaptive` (the default), the longest
    /// such window. `0s` (fixed mode only): one agent interval. See
    /// docs/design/aggregator.md, "The served window", for the measured trade-off.
    #[arg(long, env = "KPULSE_METRIC_WINDOW", default_value = "45s", value_parser = duration)]
    pub metric_window: std::time::Duration,
    /// `adaptive`: `--metric-window` is the longest window; after a change of CPU level (two
    /// intervals in a row far outside the window's spread) a series is served over the time
    /// since the change, which grows back to the whole window. `fixed`: every rate is over
    /// `--metric-window`. The served `window` always says which.
    #[arg(
        long,
        env = "KPULSE_METRIC_WINDOW_MODE",
        default_value = "adaptive",
        value_enum
    )]
    pub metric_window_mode: crate::store::WindowMode,
    /// Also serve `custom.metrics.k8s.io` (`cpu_pressure`, `memory_pressure`,
    /// `cpu_throttled_ratio` of pods and containers) from what agents run with
    /// `--custom-metrics` send. Off by default; the `custom-metrics` overlay turns it on and
    /// registers the APIServices. `--custom-metrics` alone or `=true`/`=false`.
    #[arg(
        long,
        env = "KPULSE_CUSTOM_METRICS",
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub custom_metrics: bool,
    /// A watch without `timeoutSeconds` ends after a random time between this and twice
    /// this (as the apiserver's flag of the same name).
    #[arg(long, env = "KPULSE_MIN_REQUEST_TIMEOUT", default_value = "1800", value_parser = parse_seconds)]
    pub min_request_timeout: std::time::Duration,
    /// After SIGTERM, keep serving this long before draining, with `/readyz` failing
    /// (kube-apiserver's flag of the same name). kube-apiserver picks an aggregated
    /// server's endpoint from its own copy of the EndpointSlices, which learns of a
    /// terminating pod some time after the pod is told to stop; a replica that closed
    /// its port at once would make those requests fail with 503. 0: drain at once.
    #[arg(long, env = "KPULSE_SHUTDOWN_DELAY_DURATION", default_value = "0s", value_parser = duration)]
    pub shutdown_delay_duration: std::time::Duration,
    /// A JSON Lines file of agents' wire messages (Hello, Snapshot, Update), followed as
    /// it grows: the loader for tests and offline use (see the `feed` module). Agents'
    /// streams replace it in a cluster.
    #[arg(long, env = "KPULSE_FEED_FILE")]
    pub feed_file: Option<PathBuf>,

    /// Port for the agents' streams (HTTPS, same certificate and TLS settings as the API).
    #[arg(long, env = "KPULSE_INGEST_PORT", default_value_t = crate::ingest::DEFAULT_PORT)]
    pub ingest_port: u16,
    /// Address the agents' port listens on; default: --bind-address.
    #[arg(long, env = "KPULSE_INGEST_BIND_ADDRESS")]
    pub ingest_bind_address: Option<IpAddr>,
    /// Audiences agents' tokens are reviewed for (TokenReview `spec.audiences`).
    #[arg(
        long,
        env = "KPULSE_AGENT_TOKEN_AUDIENCE",
        value_delimiter = ',',
        default_value = crate::ingest::DEFAULT_AUDIENCE
    )]
    pub agent_token_audience: Vec<String>,
    /// Users whose tokens may stream node metrics (comma-separated).
    #[arg(
        long,
        env = "KPULSE_AGENT_SERVICE_ACCOUNTS",
        value_delimiter = ',',
        default_value = crate::ingest::DEFAULT_AGENT_SERVICE_ACCOUNT
    )]
    pub agent_service_accounts: Vec<String>,
    /// Namespace of the agent pods, watched for readiness: a replica is ready once every
    /// node that runs a Ready agent is served (with a Kubernetes API only).
    #[arg(long, env = "KPULSE_AGENT_NAMESPACE", default_value = "kpulse-system")]
    pub agent_namespace: String,
    /// Label selector of the agent pods in `--agent-namespace`.
    #[arg(
        long,
        env = "KPULSE_AGENT_SELECTOR",
        default_value = "app.kubernetes.io/name=kpulse-agent"
    )]
    pub agent_selector: String,
    /// CA bundle for agents' client certificates (standalone mode: CN = node name). Without
    /// it, agents must use tokens.
    #[arg(long, env = "KPULSE_AGENT_CLIENT_CA_FILE")]
    pub agent_client_ca_file: Option<PathBuf>,
    /// Agent streams (requests on the agents' port) at once; more get 429. Every agent
    /// streams to every replica, so this is above the largest clusters (130,000 nodes): a
    /// bound on what clients can make one replica hold (about 61 KiB of memory and a file
    /// descriptor a stream), not a capacity to size. The server lowers it to what its
    /// open-file limit, raised to the hard one at start, leaves room for.
    #[arg(long, env = "KPULSE_MAX_AGENT_STREAMS", default_value_t = crate::ingest::DEFAULT_MAX_STREAMS)]
    pub max_agent_streams: usize,
    /// How agents' tokens are verified. `local`: against the service account issuer's
    /// keys (read from kube-apiserver's `/openid/v1/jwks`) and the agent pods this replica
    /// watches, with a TokenReview only for a token that does not pass, so that a
    /// restarted replica does not send one review per node at once (its agents' port opens
    /// once it can make these checks, at most 10 s after its start); `review`: a
    /// TokenReview for every token, as before (a deleted pod is then refused by
    /// kube-apiserver's own state, not this replica's watch, and a deleted service account's
    /// tokens at once: `local` does not watch service accounts).
    #[arg(
        long,
        env = "KPULSE_AGENT_TOKEN_VERIFICATION",
        value_enum,
        default_value = "local"
    )]
    pub agent_token_verification: TokenVerification,
}

/// `--agent-token-verification`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TokenVerification {
    /// Signature and bound pod checked here; a TokenReview for the rest.
    Local,
    /// A TokenReview for every token.
    Review,
}

/// `--authorization-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthorizationMode {
    /// Delegated: a SubjectAccessReview per request (cached).
    #[value(name = "Webhook")]
    Webhook,
    /// Every authenticated request is allowed; no Kubernetes API needed.
    #[value(name = "AlwaysAllow")]
    AlwaysAllow,
}

impl Config {
    /// What the flags need the Kubernetes API for; empty when nothing does (bearer tokens,
    /// wanted by default, then only work if an API is configured anyway).
    pub fn kube_api_needed_for(&self) -> Vec<&'static str> {
        let mut needs = Vec::new();
        if self.authorization_mode == AuthorizationMode::Webhook {
            needs.push("SubjectAccessReviews (--authorization-mode Webhook)");
        }
        if !self.authentication_skip_lookup
            && (self.requestheader_client_ca_file.is_none() || self.client_ca_file.is_none())
        {
            needs.push(
                "the extension-apiserver-authentication ConfigMap (no \
                 --authentication-skip-lookup)",
            );
        }
        needs
    }

    /// The serving limits the flags set (both ports; the agents' port then sizes its
    /// connection count by --max-agent-streams).
    pub fn serve_limits(&self) -> crate::serve::Limits {
        crate::serve::Limits {
            max_connections_per_ip: self.max_connections_per_ip,
            max_concurrent_streams: match self.http2_max_streams_per_connection {
                0 => crate::serve::DEFAULT_MAX_CONCURRENT_STREAMS,
                n => n,
            },
            ..crate::serve::Limits::default()
        }
    }

    /// The address of the agents' port.
    pub fn ingest_address(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(
            self.ingest_bind_address.unwrap_or(self.bind_address),
            self.ingest_port,
        )
    }
}

/// The longest `--metric-window`: the HPA's default CPU initialisation period (5 min),
/// inside which a longer window would hide every new pod's CPU.
pub const MAX_METRIC_WINDOW: std::time::Duration = std::time::Duration::from_secs(300);

/// Whole seconds, at least 1 (the apiserver's `--min-request-timeout` is an int).
fn parse_seconds(s: &str) -> Result<std::time::Duration, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(std::time::Duration::from_secs(n)),
        _ => Err(format!("{s:?}: expected a positive number of seconds")),
    }
}

/// A duration flag, read as Go's `time.ParseDuration` reads metrics-server's (`10s`,
/// `1.5s`, `1m30s`, `500ms`, `0`), with Go's error text; negative durations are refused.
fn duration(s: &str) -> Result<std::time::Duration, String> {
    let nanos = crate::go::parse_duration(s).map_err(|e| e.to_string())?;
    let nanos = u64::try_from(nanos)
        .map_err(|_| format!("{s:?}: a negative duration is not allowed here"))?;
    Ok(std::time::Duration::from_nanos(nanos))
}

/// Flags that cannot work together.
#[derive(Debug, thiserror::Error)]
#[error("invalid flags: {}", .0.join("; "))]
pub struct ConfigError(pub Vec<String>);

/// metrics-server's lower bound on `--metric-resolution`.
pub const MIN_METRIC_RESOLUTION: std::time::Duration = std::time::Duration::from_secs(10);

impl Config {
    /// Checks every flag, reporting all problems at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut errs = Vec::new();
        if self.secure_port == 0 {
            errs.push("--secure-port must not be 0".into());
        }
        if self.tls_cert_file.is_some() != self.tls_private_key_file.is_some() {
            errs.push("--tls-cert-file and --tls-private-key-file go together".into());
        }
        if let Err(e) = crate::tls::protocol_versions(&self.tls_min_version) {
            errs.push(e.to_string());
        }
        if let Err(e) = crate::tls::cipher_suites(&self.tls_cipher_suites) {
            errs.push(e.to_string());
        }
        if self.ingest_port == 0 {
            errs.push("--ingest-port must not be 0".into());
        } else if self.ingest_address()
            == std::net::SocketAddr::new(self.bind_address, self.secure_port)
        {
            errs.push(format!(
                "--ingest-port {} is --secure-port: the agents' port needs its own",
                self.ingest_port
            ));
        }
        if self.agent_namespace.trim().is_empty() {
            errs.push("--agent-namespace must name a namespace".into());
        }
        if self.agent_selector.trim().is_empty() {
            errs.push("--agent-selector must select the agent pods".into());
        }
        if self.max_agent_streams == 0 {
            errs.push("--max-agent-streams must be positive".into());
        }
        if self
            .agent_token_audience
            .iter()
            .all(|a| a.trim().is_empty())
        {
            errs.push("--agent-token-audience must name an audience".into());
        }
        if self
            .agent_service_accounts
            .iter()
            .all(|a| a.trim().is_empty())
        {
            errs.push("--agent-service-accounts must name a user".into());
        }
        if self.metric_expiry.is_zero() {
            errs.push("--metric-expiry must be positive".into());
        }
        if self.kubelet_fallback {
            if self.metric_resolution < MIN_METRIC_RESOLUTION {
                errs.push(format!(
                    "--metric-resolution must be at least {MIN_METRIC_RESOLUTION:?}, as \
                     metrics-server's"
                ));
            }
            if self.kubelet_request_timeout.is_zero()
                || self.kubelet_request_timeout > self.metric_resolution
            {
                errs.push(
                    "--kubelet-request-timeout must be positive and at most --metric-resolution"
                        .into(),
                );
            }
            if self.kubelet_client_certificate.is_some() != self.kubelet_client_key.is_some() {
                errs.push(
                    "--kubelet-client-certificate and --kubelet-client-key go together".into(),
                );
            }
            if self
                .kubelet_preferred_address_types
                .iter()
                .all(|t| t.trim().is_empty())
            {
                errs.push("--kubelet-preferred-address-types must name a type".into());
            }
        }
        if self.metric_window_mode == crate::store::WindowMode::Adaptive
            && self.metric_window.is_zero()
        {
            errs.push(
                "--metric-window-mode=adaptive (the default) needs a positive --metric-window; \
                 --metric-window-mode=fixed serves one agent interval with 0s"
                    .into(),
            );
        }
        if self.metric_window > MAX_METRIC_WINDOW {
            errs.push(format!(
                "--metric-window must be at most {}s (the HPA's CPU initialisation period)",
                MAX_METRIC_WINDOW.as_secs()
            ));
        }
        for (flag, path) in [
            (
                "--requestheader-client-ca-file",
                &self.requestheader_client_ca_file,
            ),
            ("--client-ca-file", &self.client_ca_file),
            ("--agent-client-ca-file", &self.agent_client_ca_file),
            ("--kubeconfig", &self.kubeconfig),
        ] {
            if let Some(p) = path {
                if !p.is_file() {
                    errs.push(format!("{flag} {}: no such file", p.display()));
                }
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ConfigError(errs))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Config {
        Config::try_parse_from(std::iter::once("x").chain(args.iter().copied())).expect("parse")
    }

    #[test]
    fn custom_metrics_is_a_switch_that_takes_an_optional_value() {
        assert!(!parse(&[]).custom_metrics);
        assert!(parse(&["--custom-metrics"]).custom_metrics);
        assert!(parse(&["--custom-metrics=true"]).custom_metrics);
        assert!(!parse(&["--custom-metrics=false"]).custom_metrics);
        assert!(parse(&["--custom-metrics", "--metric-expiry=5s"]).custom_metrics);
    }

    #[test]
    fn defaults_are_valid() {
        let c = parse(&[]);
        assert_eq!(c.secure_port, 10250);
        assert_eq!(c.ingest_port, 8444);
        assert_eq!(c.ingest_address().to_string(), "0.0.0.0:8444");
        assert_eq!(c.agent_token_audience, ["kpulse"]);
        assert_eq!(c.agent_token_verification, TokenVerification::Local);
        assert_eq!(
            c.agent_service_accounts,
            ["system:serviceaccount:kpulse-system:kpulse-agent"]
        );
        assert_eq!(c.max_agent_streams, 150_000);
        let limits = c.serve_limits();
        assert_eq!(limits.max_connections_per_ip, 1024);
        assert_eq!(limits.max_concurrent_streams, 250);
        assert!(c.agent_client_ca_file.is_none());
        c.validate().expect("valid");
        let c = parse(&[
            "--bind-address",
            "127.0.0.1",
            "--ingest-bind-address",
            "::1",
        ]);
        assert_eq!(c.ingest_address().to_string(), "[::1]:8444");
    }

    #[test]
    fn the_served_window_is_bounded() {
        assert_eq!(parse(&[]).metric_window, std::time::Duration::from_secs(45));
        parse(&["--metric-window", "0s", "--metric-window-mode", "fixed"])
            .validate()
            .expect("one interval");
        parse(&["--metric-window", "5m"])
            .validate()
            .expect("the bound");
        let e = parse(&["--metric-window", "301s"])
            .validate()
            .expect_err("too long")
            .to_string();
        assert!(e.contains("--metric-window must be at most 300s"), "{e}");
        assert!(Config::try_parse_from(["x", "--metric-window", "-1s"]).is_err());
    }

    #[test]
    fn an_adaptive_window_needs_a_longest_window() {
        use crate::store::WindowMode;
        let default = parse(&[]);
        default.validate().expect("the defaults");
        assert_eq!(default.metric_window_mode, WindowMode::Adaptive);
        let c = parse(&["--metric-window-mode", "fixed", "--metric-window", "1s"]);
        c.validate().expect("fixed, 1 s");
        assert_eq!(c.metric_window_mode, WindowMode::Fixed);
        let e = parse(&["--metric-window", "0s"])
            .validate()
            .expect_err("nothing to adapt")
            .to_string();
        assert!(e.contains("needs a positive --metric-window"), "{e}");
        assert!(e.contains("--metric-window-mode=fixed"), "{e}");
        assert!(Config::try_parse_from(["x", "--metric-window-mode", "sliding"]).is_err());
    }

    #[test]
    fn the_agents_port_needs_its_own_port() {
        let e = parse(&["--secure-port", "8444"])
            .validate()
            .expect_err("same port")
            .to_string();
        assert!(e.contains("--ingest-port 8444 is --secure-port"), "{e}");
        parse(&[
            "--secure-port",
            "8444",
            "--ingest-bind-address",
            "127.0.0.2",
        ])
        .validate()
        .expect("another address");
    }

    #[test]
    fn only_webhook_authorization_and_the_configmap_need_the_api() {
        let c = parse(&[]);
        assert_eq!(c.authorization_mode, AuthorizationMode::Webhook);
        assert!(c.authentication_token_webhook);
        assert_eq!(c.kube_api_needed_for().len(), 2);
        let c = parse(&["--authorization-mode", "AlwaysAllow"]);
        assert_eq!(
            c.kube_api_needed_for().len(),
            1,
            "the ConfigMap is still followed"
        );
        let c = parse(&[
            "--authorization-mode",
            "AlwaysAllow",
            "--authentication-skip-lookup",
            "--authentication-token-webhook=false",
        ]);
        assert!(c.kube_api_needed_for().is_empty());
        assert!(!c.authentication_token_webhook);
        // Both CAs given by flags: the ConfigMap would not be followed either.
        let c = parse(&[
            "--authorization-mode=AlwaysAllow",
            "--client-ca-file=/ca.crt",
            "--requestheader-client-ca-file=/ca.crt",
        ]);
        assert!(c.kube_api_needed_for().is_empty());
        let c = parse(&["--authentication-skip-lookup"]);
        assert_eq!(
            c.kube_api_needed_for(),
            ["SubjectAccessReviews (--authorization-mode Webhook)"]
        );
        assert!(Config::try_parse_from(["x", "--authorization-mode", "alwaysallow"]).is_err());
    }

    #[test]
    fn connection_limits() {
        let limits = parse(&[
            "--max-connections-per-ip=0",
            "--http2-max-streams-per-connection=0",
        ])
        .serve_limits();
        assert_eq!(
            (limits.max_connections_per_ip, limits.max_concurrent_streams),
            (0, 250),
            "0: no per-IP limit; Go's default stream count"
        );
        let limits = parse(&[
            "--max-connections-per-ip",
            "3",
            "--http2-max-streams-per-connection",
            "8",
        ])
        .serve_limits();
        assert_eq!(
            (limits.max_connections_per_ip, limits.max_concurrent_streams),
            (3, 8)
        );
    }

    #[test]
    fn duration_flags_read_go_durations() {
        let ok = |s: &str| duration(s).map_err(|e| format!("{s}: {e}"));
        assert_eq!(ok("10s"), Ok(std::time::Duration::from_secs(10)));
        assert_eq!(ok("1m30s"), Ok(std::time::Duration::from_secs(90)));
        assert_eq!(ok("1.5s"), Ok(std::time::Duration::from_millis(1_500)));
        assert_eq!(ok("250ms"), Ok(std::time::Duration::from_millis(250)));
        assert_eq!(ok("0"), Ok(std::time::Duration::ZERO));
        assert_eq!(ok("-0s"), Ok(std::time::Duration::ZERO));
        let cases = [
            ("", "time: invalid duration \"\""),
            ("10", "time: missing unit in duration \"10\""),
            ("10x", "time: unknown unit \"x\" in duration \"10x\""),
            (" 10s", "time: invalid duration \" 10s\""),
            ("99999999999h", "time: invalid duration \"99999999999h\""),
            ("-1s", "\"-1s\": a negative duration is not allowed here"),
        ];
        for (bad, want) in cases {
            assert_eq!(duration(bad), Err(want.to_owned()), "{bad}");
        }
        let c = parse(&["--metric-window", "1.5s", "--metric-expiry", "1m30s"]);
        assert_eq!(c.metric_window, std::time::Duration::from_millis(1_500));
        assert_eq!(c.metric_expiry, std::time::Duration::from_secs(90));
    }

    #[test]
    fn every_problem_is_reported() {
        let c = parse(&[
            "--secure-port",
            "0",
            "--tls-cert-file",
            "/x.crt",
            "--tls-min-version",
            "VersionTLS10",
            "--tls-cipher-suites",
            "TLS_BOGUS",
            "--max-agent-streams",
            "0",
            "--agent-client-ca-file",
            "/nonexistent/ca.crt",
        ]);
        let e = c.validate().expect_err("invalid").to_string();
        for part in [
            "--secure-port",
            "go together",
            "VersionTLS10",
            "TLS_BOGUS",
            "--max-agent-streams",
            "--agent-client-ca-file",
        ] {
            assert!(e.contains(part), "{part} missing from {e}");
        }
    }
}
