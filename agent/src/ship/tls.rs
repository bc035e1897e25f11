//! The client side of the stream's TLS: rustls with ring, ALPN `h2`, the aggregator's CA
//! bundle, and an optional client certificate (mTLS, standalone).

use std::{path::PathBuf, sync::Arc};

use kpulse_process::pem::{self, PemError};

use kpulse_process::tls::AnyServer;
use rustls::{
    crypto::ring,
    pki_types::{CertificateDer, PrivateKeyDer},
};

/// Errors building the client configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or held nothing usable.
    #[error(transparent)]
    Pem(#[from] PemError),
    /// rustls refused the configuration (a key that does not match, ...).
    #[error("TLS configuration")]
    Rustls(#[from] rustls::Error),
    /// Neither a CA bundle nor `--insecure-skip-tls-verify`.
    #[error("a CA bundle is required to verify the aggregator (or skip verification, for local tests only)")]
    NoTrust,
}

/// How to verify the server and whom to present.
#[derive(Clone, Debug, Default)]
pub struct TlsOptions {
    /// PEM CA bundle that signed the aggregator's serving certificate.
    pub ca_file: Option<PathBuf>,
    /// Accept any server certificate (local tests only).
    pub insecure_skip_verify: bool,
    /// PEM client certificate chain and private key (mTLS).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// Builds the client configuration from files: TLS 1.2+ with ring, ALPN `h2`.
///
/// # Errors
///
/// Unreadable or empty PEM files, a key rustls refuses, or no way to verify the server.
pub fn client_config(opts: &TlsOptions) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let trust = if opts.insecure_skip_verify {
        Trust::AnyServer
    } else {
        let ca = opts.ca_file.as_deref().ok_or(TlsError::NoTrust)?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in pem::certificates(ca)? {
            roots.add(cert)?;
        }
        Trust::Roots(roots)
    };
    let client = match &opts.client_cert {
        Some((cert, key)) => Some((pem::certificates(cert)?, pem::private_key(key)?)),
        None => None,
    };
    client_config_from(trust, client)
}

/// How the client decides to trust the server.
#[derive(Debug)]
pub enum Trust {
    /// Certificates chaining to these roots.
    Roots(rustls::RootCertStore),
    /// Any certificate (`--insecure-skip-tls-verify`, load generators on loopback); the
    /// handshake's signatures are still checked.
    AnyServer,
}

/// [`client_config`] from certificates already in memory (a load generator issuing one
/// client certificate per simulated node).
///
/// # Errors
///
/// A client key rustls refuses.
pub fn client_config_from(
    trust: Trust,
    client: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let provider = Arc::new(ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match trust {
        Trust::AnyServer => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer::new(provider))),
        Trust::Roots(roots) => builder.with_root_certificates(roots),
    };
    let mut config = match client {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_a_way_to_trust_the_server() {
        assert!(matches!(
            client_config(&TlsOptions::default()),
            Err(TlsError::NoTrust)
        ));
        let c = client_config(&TlsOptions {
            insecure_skip_verify: true,
            ..TlsOptions::default()
        })
        .expect("insecure config");
        assert_eq!(c.alpn_protocols, [b"h2".to_vec()]);
    }

    #[test]
    fn pem_files_are_read() {
        let dir = std::env::temp_dir().join(format!("kpulse-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["agent".to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let (ca, k, empty) = (dir.join("ca.pem"), dir.join("key.pem"), dir.join("e.pem"));
        std::fs::write(&ca, cert.pem()).expect("write");
        std::fs::write(&k, key.serialize_pem()).expect("write");
        std::fs::write(&empty, "nothing").expect("write");
        client_config(&TlsOptions {
            ca_file: Some(ca.clone()),
            insecure_skip_verify: false,
            client_cert: Some((ca.clone(), k.clone())),
        })
        .expect("CA and client certificate");
        let err = client_config(&TlsOptions {
            ca_file: Some(empty.clone()),
            ..TlsOptions::default()
        })
        .expect_err("no certificate");
        assert!(err.to_string().contains("no CERTIFICATE"), "{err}");
        let err = client_config(&TlsOptions {
            ca_file: Some(dir.join("missing.pem")),
            ..TlsOptions::default()
        })
        .expect_err("missing");
        assert!(err.to_string().contains("cannot read"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
