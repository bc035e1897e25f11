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
}

/// Flags that cannot work together.
#[derive(Debug, thiserror::Error)]
#[error("invalid flags: {}", .0.join("; "))]
pub struct ConfigError(pub Vec<String>);

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
    fn defaults_are_valid() {
        let c = parse(&[]);
        assert_eq!(c.secure_port, 10250);
        c.validate().expect("valid");
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
        ]);
        let e = c.validate().expect_err("invalid").to_string();
        for part in ["--secure-port", "go together", "VersionTLS10", "TLS_BOGUS"] {
            assert!(e.contains(part), "{part} missing from {e}");
        }
    }
}
