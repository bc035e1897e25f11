//! Command-line flags (clap derive, each with an environment variable), validated before
//! anything is loaded or bound.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::collect::Mode;

/// Shortest accepted `--resolution`.
pub const MIN_RESOLUTION: Duration = Duration::from_millis(100);

/// Largest accepted `--max-cgroups` (about 200 MB of record map).
pub const MAX_CGROUPS_LIMIT: usize = 1_000_000;

/// kpulse node agent.
#[derive(Debug, Parser)]
#[command(name = "kpulse-agent", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print one JSON object per cgroup (and one for the node) per tick.
    Dump(DumpArgs),
    /// Collect, attribute to pods and stream to the aggregator (the DaemonSet's command).
    Run(Box<RunArgs>),
}

/// Default `--metrics-bind-address`.
pub const DEFAULT_METRICS_BIND_ADDRESS: &str = "127.0.0.1:9464";

/// `run` flags.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// This node's name (`spec.nodeName` of its pods); the downward API sets `NODE_NAME`.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Standalone mode: pods and their containers' cgroups from this JSON file (re-read when
    /// it changes) instead of the Kubernetes API.
    #[arg(long, env = "KPULSE_PODS_FILE")]
    pub pods_file: Option<PathBuf>,
    /// An aggregator replica, `host:port` (repeatable, or comma-separated in the variable).
    #[arg(long = "server", env = "KPULSE_SERVER", value_delimiter = ',')]
    pub servers: Vec<String>,
    /// A headless Service whose every address is a replica, `name.namespace.svc:port`;
    /// resolved again every 10 s.
    #[arg(long, env = "KPULSE_SERVER_SERVICE")]
    pub server_service: Option<String>,
    /// The name the servers' certificate must carry (default: the Service's DNS name, or
    /// the host of each `--server`).
    #[arg(long, env = "KPULSE_SERVER_NAME")]
    pub server_name: Option<String>,
    /// PEM CA bundle that signed the aggregator's serving certificate.
    #[arg(long, env = "KPULSE_SERVER_CA_FILE")]
    pub server_ca_file: Option<PathBuf>,
    /// Do not verify the aggregator's certificate. Local tests only.
    #[arg(long, env = "KPULSE_INSECURE_SKIP_TLS_VERIFY")]
    pub insecure_skip_tls_verify: bool,
    /// Bearer token file (a projected ServiceAccount token, audience `kpulse`), re-read at
    /// every connect.
    #[arg(long, env = "KPULSE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM client certificate for mTLS (standalone), with `--client-key-file`.
    #[arg(long, env = "KPULSE_CLIENT_CERT_FILE")]
    pub client_cert_file: Option<PathBuf>,
    /// PEM private key of `--client-cert-file`.
    #[arg(long, env = "KPULSE_CLIENT_KEY_FILE")]
    pub client_key_file: Option<PathBuf>,
    /// Ticks queued per replica before the oldest is dropped.
    #[arg(long, env = "KPULSE_QUEUE_TICKS", default_value_t = crate::ship::DEFAULT_QUEUE_TICKS)]
    pub queue_ticks: usize,
    /// Where to serve the agent's own metrics (plain HTTP `/metrics`); empty disables.
    #[arg(long, env = "KPULSE_METRICS_BIND_ADDRESS", default_value = DEFAULT_METRICS_BIND_ADDRESS)]
    pub metrics_bind_address: String,
    /// On SIGTERM/SIGINT, keep collecting and streaming this long before stopping (as
    /// kube-apiserver's flag of this name), so that the aggregator-api's kubelet fallback,
    /// which starts when the agent pod starts terminating, has its first rate (two scrapes,
    /// 5 s apart) before this agent's data ends: a rollout or a drain then costs no gap.
    #[arg(long, env = "KPULSE_SHUTDOWN_DELAY_DURATION", default_value = "0s", value_parser = parse_duration)]
    pub shutdown_delay_duration: Duration,
    /// On SIGTERM/SIGINT, how long streams get to end cleanly.
    #[arg(long, env = "KPULSE_SHUTDOWN_GRACE", default_value = "5s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// With `--custom-metrics`: the trailing window pressure and throttling are shares of
    /// (at least this long; see `window`).
    #[arg(long, env = "KPULSE_CUSTOM_METRICS_WINDOW", default_value = "30s", value_parser = parse_duration)]
    pub custom_metrics_window: Duration,
    /// Collection flags.
    #[command(flatten)]
    pub collect: CollectArgs,
}

/// Longest accepted `--custom-metrics-window`.
pub const MAX_CUSTOM_METRICS_WINDOW: Duration = Duration::from_secs(600);

/// Largest accepted `--queue-ticks`.
pub const MAX_QUEUE_TICKS: usize = 1024;

impl RunArgs {
    /// Checks every flag (collection flags included), reporting all problems at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut errs = match self.collect.validate() {
            Ok(()) => Vec::new(),
            Err(ConfigError(e)) => e,
        };
        let window = self.custom_metrics_window;
        if window < crate::window::MIN_WINDOW
            || window > MAX_CUSTOM_METRICS_WINDOW
            || window < self.collect.resolution * 4
        {
            errs.push(format!(
                "--custom-metrics-window {} must be between {} and {}, and at least four \
                 --resolution",
                humantime::format_duration(window),
                humantime::format_duration(crate::window::MIN_WINDOW),
                humantime::format_duration(MAX_CUSTOM_METRICS_WINDOW),
            ));
        }
        if self.node_name.trim().is_empty() {
            errs.push("--node-name (or NODE_NAME) must not be empty".into());
        }
        match (self.servers.is_empty(), &self.server_service) {
            (true, None) => errs.push("one of --server or --server-service is required".into()),
            (false, Some(_)) => {
                errs.push("--server and --server-service are mutually exclusive".into())
            }
            _ => {}
        }
        for s in &self.servers {
            if crate::ship::split_host_port(s).is_none() {
                errs.push(format!("--server {s:?} is not host:port"));
            }
        }
        if let Some(s) = &self.server_service {
            if crate::ship::split_host_port(s).is_none() {
                errs.push(format!(
                    "--server-service {s:?} is not name.namespace.svc:port"
                ));
            }
        }
        if let Some(n) = &self.server_name {
            if rustls::pki_types::ServerName::try_from(n.as_str()).is_err() {
                errs.push(format!(
                    "--server-name {n:?} is not a DNS name or IP address"
                ));
            }
        }
        match (&self.server_ca_file, self.insecure_skip_tls_verify) {
            (None, false) => errs.push(
                "--server-ca-file is required (or --insecure-skip-tls-verify, for local tests)"
                    .into(),
            ),
            (Some(_), true) => errs.push(
                "--server-ca-file and --insecure-skip-tls-verify are mutually exclusive".into(),
            ),
            _ => {}
        }
        if self.client_cert_file.is_some() != self.client_key_file.is_some() {
            errs.push("--client-cert-file and --client-key-file go together".into());
        }
        if self.queue_ticks == 0 || self.queue_ticks > MAX_QUEUE_TICKS {
            errs.push(format!(
                "--queue-ticks must be between 1 and {MAX_QUEUE_TICKS}"
            ));
        }
        if !self.metrics_bind_address.is_empty()
            && self
                .metrics_bind_address
                .parse::<std::net::SocketAddr>()
                .is_err()
        {
            errs.push(format!(
                "--metrics-bind-address {:?} is not ip:port (or empty to disable)",
                self.metrics_bind_address
            ));
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ConfigError(errs))
        }
    }

    /// The metrics address, `None` when disabled. Call after [`RunArgs::validate`].
    pub fn metrics_address(&self) -> Option<std::net::SocketAddr> {
        self.metrics_bind_address.parse().ok()
    }
}

/// Flags shared by everything that collects.
#[derive(Debug, Clone, Args)]
pub struct CollectArgs {
    /// Interval between collections (e.g. `1s`, `250ms`); at least 100ms.
    #[arg(long, env = "KPULSE_RESOLUTION", default_value = "1s", value_parser = parse_duration)]
    pub resolution: Duration,
    /// Which collector: eBPF with cgroupfs fallback, eBPF only, or cgroupfs only.
    #[arg(long, env = "KPULSE_COLLECTOR", value_enum, default_value = "auto")]
    pub collector: Mode,
    /// Subtree to report, relative to the cgroup mount (e.g. `/kubepods.slice`).
    #[arg(long, env = "KPULSE_CGROUP_ROOT", default_value = "/")]
    pub cgroup_root: String,
    /// Load the eBPF object from this file instead of the embedded one.
    #[arg(long, env = "KPULSE_EBPF_OBJECT")]
    pub ebpf_object: Option<PathBuf>,
    /// Upper bound on cgroups reported per tick (sizes the eBPF record map: 272 bytes each).
    #[arg(long, env = "KPULSE_MAX_CGROUPS", default_value_t = 16_384)]
    pub max_cgroups: usize,
    /// Also collect the signals `custom.metrics.k8s.io` serves: each cgroup's pressure stall
    /// totals (PSI, cgroup v2) and CFS throttling counters. Off by default; the
    /// `custom-metrics` overlay turns it on. `--custom-metrics` alone or `=true`/`=false`.
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
}

/// `dump` flags.
#[derive(Debug, Clone, Args)]
pub struct DumpArgs {
    /// Number of ticks to print, then exit (0 = until interrupted).
    #[arg(long, default_value_t = 1)]
    pub count: u64,
    /// Collection flags.
    #[command(flatten)]
    pub collect: CollectArgs,
}

/// A flag combination that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("invalid flags: {}", .0.join("; "))]
pub struct ConfigError(pub Vec<String>);

impl CollectArgs {
    /// Checks every flag, reporting all problems at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut errs = Vec::new();
        if self.resolution < MIN_RESOLUTION {
            errs.push(format!(
                "--resolution {} is below the minimum of 100ms",
                humantime::format_duration(self.resolution)
            ));
        }
        if self.max_cgroups == 0 || self.max_cgroups > MAX_CGROUPS_LIMIT {
            errs.push(format!(
                "--max-cgroups must be between 1 and {MAX_CGROUPS_LIMIT}"
            ));
        }
        if self.cgroup_root.split('/').any(|p| p == "..") {
            errs.push(format!(
                "--cgroup-root {:?} must not contain `..`",
                self.cgroup_root
            ));
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ConfigError(errs))
        }
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (use e.g. 1s, 500ms)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kpulse-agent").chain(args.iter().copied()))
    }

    fn dump(cli: Cli) -> DumpArgs {
        match cli.command {
            Command::Dump(d) => d,
            other => panic!("not dump: {other:?}"),
        }
    }

    fn run(args: &[&str]) -> RunArgs {
        let all: Vec<&str> = ["run", "--node-name", "n1"]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        match parse(&all).expect("parse").command {
            Command::Run(r) => *r,
            other => panic!("not run: {other:?}"),
        }
    }

    /// `--custom-metrics` alone, or with `=true`/`=false` as the manifests write flags; a
    /// following word is not taken as its value.
    #[test]
    fn custom_metrics_is_a_switch_that_takes_an_optional_value() {
        let on = |args: &[&str]| dump(parse(args).expect("parse")).collect.custom_metrics;
        assert!(!on(&["dump"]));
        assert!(on(&["dump", "--custom-metrics"]));
        assert!(on(&["dump", "--custom-metrics=true"]));
        assert!(!on(&["dump", "--custom-metrics=false"]));
        assert!(on(&["dump", "--custom-metrics", "--count", "2"]));
        assert!(parse(&["dump", "--custom-metrics", "yes"]).is_err());
    }

    #[test]
    fn custom_metrics_window_bounds() {
        let base = ["--server", "10.0.0.1:443", "--server-ca-file", "/ca"];
        let with = |extra: &[&str]| {
            let args: Vec<&str> = base.iter().chain(extra).copied().collect();
            run(&args)
        };
        assert_eq!(with(&[]).custom_metrics_window, Duration::from_secs(30));
        with(&["--custom-metrics-window", "10s"])
            .validate()
            .expect("valid");
        with(&["--custom-metrics-window", "10m"])
            .validate()
            .expect("valid");
        for bad in [
            &["--custom-metrics-window", "9s"][..],
            &["--custom-metrics-window", "11m"],
            &["--custom-metrics-window", "20s", "--resolution", "6s"],
        ] {
            let err = with(bad).validate().expect_err("invalid").to_string();
            assert!(err.contains("--custom-metrics-window"), "{err}");
        }
    }

    #[test]
    fn run_defaults_and_validation() {
        let r = run(&["--server", "10.0.0.1:443", "--server-ca-file", "/ca"]);
        assert_eq!(r.node_name, "n1");
        assert_eq!(r.servers, ["10.0.0.1:443"]);
        assert_eq!(r.metrics_bind_address, "127.0.0.1:9464");
        assert_eq!(r.queue_ticks, 8);
        assert_eq!(r.shutdown_grace, Duration::from_secs(5));
        assert_eq!(r.collect.resolution, Duration::from_secs(1));
        assert!(r.pods_file.is_none() && !r.insecure_skip_tls_verify);
        r.validate().expect("valid");
        assert!(r.metrics_address().is_some());

        let r = run(&[
            "--server-service",
            "kpulse.kube-system.svc:443",
            "--insecure-skip-tls-verify",
            "--metrics-bind-address",
            "",
            "--token-file",
            "/t",
        ]);
        r.validate().expect("valid");
        assert!(r.metrics_address().is_none());

        let r = run(&["--server", "a:1", "--server", "b:2"]);
        assert_eq!(r.servers.len(), 2);
        let err = r.validate().expect_err("no CA").to_string();
        assert!(err.contains("--server-ca-file is required"), "{err}");

        let r = run(&[
            "--server",
            "nope",
            "--server-service",
            "svc",
            "--client-cert-file",
            "/c",
            "--queue-ticks",
            "0",
            "--metrics-bind-address",
            "localhost",
            "--server-ca-file",
            "/ca",
            "--insecure-skip-tls-verify",
        ]);
        let err = r.validate().expect_err("all wrong").to_string();
        for want in [
            "mutually exclusive",
            "\"nope\" is not host:port",
            "not name.namespace.svc:port",
            "go together",
            "--queue-ticks",
            "--metrics-bind-address",
            "--server-ca-file and --insecure-skip-tls-verify",
        ] {
            assert!(err.contains(want), "{err} lacks {want}");
        }
        let err = run(&[]).validate().expect_err("no server").to_string();
        assert!(err.contains("one of --server or --server-service"), "{err}");
        assert!(
            parse(&["run", "--server", "a:1"]).is_err() || std::env::var_os("NODE_NAME").is_some()
        );
    }

    #[test]
    fn defaults() {
        let cli = parse(&["dump"]).expect("parse");
        let d = dump(cli);
        assert_eq!(d.count, 1);
        assert_eq!(d.collect.resolution, Duration::from_secs(1));
        assert_eq!(d.collect.collector, Mode::Auto);
        assert_eq!(d.collect.cgroup_root, "/");
        d.collect.validate().expect("valid");
    }

    #[test]
    fn resolution_bounds() {
        let cli = parse(&["dump", "--resolution", "100ms"]).expect("parse");
        let d = dump(cli);
        d.collect.validate().expect("100ms is allowed");
        let cli = parse(&["dump", "--resolution", "99ms", "--max-cgroups", "0"]).expect("parse");
        let d = dump(cli);
        let err = d.collect.validate().expect_err("too fast");
        assert!(err.to_string().contains("below the minimum"), "{err}");
        assert!(err.to_string().contains("--max-cgroups"), "{err}");
        assert!(parse(&["dump", "--resolution", "fast"]).is_err());
    }

    #[test]
    fn collector_values() {
        for (v, m) in [
            ("auto", Mode::Auto),
            ("ebpf", Mode::Ebpf),
            ("cgroupfs", Mode::Cgroupfs),
        ] {
            let cli = parse(&["dump", "--collector", v]).expect("parse");
            let d = dump(cli);
            assert_eq!(d.collect.collector, m);
        }
        assert!(parse(&["dump", "--collector", "procfs"]).is_err());
    }

    #[test]
    fn dotdot_root_is_refused() {
        let cli = parse(&["dump", "--cgroup-root", "/a/../b"]).expect("parse");
        let d = dump(cli);
        assert!(d.collect.validate().is_err());
    }
}
