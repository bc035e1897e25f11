//! The serving certificate: from `--tls-cert-file`/`--tls-private-key-file` (re-read when
//! either file changes, without a restart), or self-signed into `--cert-dir` when none is
//! given — as metrics-server (k8s.io/apiserver) does. TLS settings (`--tls-min-version`,
//! `--tls-cipher-suites`) use Go's names, so the same values work for both servers.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use arc_swap::ArcSwap;
use rustls::{
    crypto::ring as provider,
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
    SupportedCipherSuite, SupportedProtocolVersion,
};

/// Errors building the TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A PEM file could not be read or held no usable certificate or key.
    #[error(transparent)]
    Pem(#[from] kpulse_process::pem::PemError),
    /// rustls refused the key or configuration.
    #[error("TLS configuration")]
    Rustls(#[from] rustls::Error),
    /// Self-signed certificate generation failed.
    #[error("generating the self-signed serving certificate")]
    Generate(#[from] rcgen::Error),
    /// An unknown `--tls-min-version` or cipher suite name.
    #[error("{0}")]
    Option(String),
}

/// Where the serving certificate comes from.
#[derive(Clone, Debug)]
pub enum CertSource {
    /// PEM files given on the command line; watched for changes.
    Files {
        /// Certificate chain.
        cert: PathBuf,
        /// Private key.
        key: PathBuf,
    },
    /// Self-signed, generated once into this directory (kept across restarts).
    SelfSigned {
        /// `--cert-dir`.
        dir: PathBuf,
        /// Names the certificate is valid for.
        names: Vec<String>,
    },
}

impl CertSource {
    /// The certificate and key files this source serves from (generating them if needed).
    pub fn files(&self) -> Result<(PathBuf, PathBuf), TlsError> {
        match self {
            CertSource::Files { cert, key } => Ok((cert.clone(), key.clone())),
            CertSource::SelfSigned { dir, names } => {
                let cert = dir.join("apiserver.crt");
                let key = dir.join("apiserver.key");
                if !(cert.is_file() && key.is_file()) {
                    std::fs::create_dir_all(dir).map_err(|source| TlsError::Io {
                        path: dir.clone(),
                        source,
                    })?;
                    let generated = rcgen::generate_simple_self_signed(names.clone())?;
                    write_private(&key, generated.signing_key.serialize_pem().as_bytes())?;
                    std::fs::write(&cert, generated.cert.pem()).map_err(|source| TlsError::Io {
                        path: cert.clone(),
                        source,
                    })?;
                    tracing::info!(cert = %cert.display(), "generated a self-signed serving certificate");
                }
                Ok((cert, key))
            }
        }
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| TlsError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    f.write_all(bytes).map_err(|source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Loads a certificate chain and its private key from PEM files.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = kpulse_process::pem::certificates(cert)?;
    let der = kpulse_process::pem::private_key(key)?;
    let signing = provider::sign::any_supported_type(&der)?;
    Ok(CertifiedKey::new(chain, signing))
}

/// Serves the current certificate; [`ReloadingCert::watch`] swaps in a new one when the
/// files change. A failed reload keeps the previous certificate and logs why.
#[derive(Debug)]
pub struct ReloadingCert {
    current: ArcSwap<CertifiedKey>,
    cert: PathBuf,
    key: PathBuf,
}

impl ReloadingCert {
    /// Loads the certificate now (an error here is fatal: nothing to serve with).
    pub fn new(cert: PathBuf, key: PathBuf) -> Result<Arc<ReloadingCert>, TlsError> {
        let ck = load_certified_key(&cert, &key)?;
        Ok(Arc::new(ReloadingCert {
            current: ArcSwap::from_pointee(ck),
            cert,
            key,
        }))
    }

    fn stamp(&self) -> Option<(SystemTime, SystemTime)> {
        let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        Some((m(&self.cert)?, m(&self.key)?))
    }

    /// Re-reads the files if their modification times changed. Returns whether a new
    /// certificate is now served.
    pub fn reload_if_changed(&self, last: &mut Option<(SystemTime, SystemTime)>) -> bool {
        let now = self.stamp();
        if now.is_none() || now == *last {
            return false;
        }
        match load_certified_key(&self.cert, &self.key) {
            Ok(ck) => {
                self.current.store(Arc::new(ck));
                *last = now;
                tracing::info!(cert = %self.cert.display(), "serving certificate reloaded");
                true
            }
            Err(e) => {
                // Half-written files are normal during a rotation: try again next time.
                tracing::warn!(error = %kpulse_process::error_chain(&e), "serving certificate not reloaded");
                false
            }
        }
    }

    /// Polls the files every `period` until the task is dropped.
    pub async fn watch(self: Arc<Self>, period: Duration) {
        let mut last = self.stamp();
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.reload_if_changed(&mut last);
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// `--tls-min-version`: Go's names.
pub fn protocol_versions(min: &str) -> Result<Vec<&'static SupportedProtocolVersion>, TlsError> {
    match min {
        "" | "VersionTLS12" => Ok(vec![&rustls::version::TLS13, &rustls::version::TLS12]),
        "VersionTLS13" => Ok(vec![&rustls::version::TLS13]),
        "VersionTLS10" | "VersionTLS11" => Err(TlsError::Option(format!(
            "--tls-min-version {min} is not supported: TLS 1.0 and 1.1 are insecure (use VersionTLS12 or VersionTLS13)"
        ))),
        other => Err(TlsError::Option(format!(
            "--tls-min-version {other:?}: expected VersionTLS12 or VersionTLS13"
        ))),
    }
}

/// `--tls-cipher-suites`: IANA/Go names (`TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256`, ...);
/// empty means rustls' defaults. TLS 1.3 suites are always enabled, as in Go.
pub fn cipher_suites(names: &[String]) -> Result<Vec<SupportedCipherSuite>, TlsError> {
    let all = provider::ALL_CIPHER_SUITES;
    if names.is_empty() {
        return Ok(provider::DEFAULT_CIPHER_SUITES.to_vec());
    }
    let mut out: Vec<SupportedCipherSuite> = all
        .iter()
        .filter(|s| matches!(s, SupportedCipherSuite::Tls13(_)))
        .copied()
        .collect();
    for n in names {
        let n = n.trim();
        let found = all
            .iter()
            .find(|s| format!("{:?}", s.suite()) == n)
            .ok_or_else(|| {
                TlsError::Option(format!(
                    "--tls-cipher-suites: unknown or unsupported suite {n:?} (supported: {})",
                    all.iter()
                        .map(|s| format!("{:?}", s.suite()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
        if !out.contains(found) {
            out.push(*found);
        }
    }
    Ok(out)
}

/// The crypto provider with the chosen cipher suites.
pub fn provider_with(suites: Vec<SupportedCipherSuite>) -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::CryptoProvider {
        cipher_suites: suites,
        ..provider::default_provider()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_is_generated_once_and_reused() {
        let dir = std::env::temp_dir().join(format!("kpulse-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let src = CertSource::SelfSigned {
            dir: dir.clone(),
            names: vec!["localhost".into()],
        };
        let (c, k) = src.files().expect("generate");
        let first = std::fs::read(&c).expect("cert");
        let (c2, _) = src.files().expect("reuse");
        assert_eq!(first, std::fs::read(&c2).expect("cert"));
        load_certified_key(&c, &k).expect("loads");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn pem_errors_name_the_file_and_what_is_missing() {
        let dir = std::env::temp_dir().join(format!("kpulse-tls-pem-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let g = rcgen::generate_simple_self_signed(vec!["a.example".to_string()]).expect("gen");
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        let message = |cert_pem: &str, key_pem: &str| {
            std::fs::write(&cert, cert_pem).expect("cert");
            std::fs::write(&key, key_pem).expect("key");
            match load_certified_key(&cert, &key) {
                Ok(_) => "loaded".to_string(),
                Err(e) => e.to_string(),
            }
        };
        let (cert_pem, key_pem) = (g.cert.pem(), g.signing_key.serialize_pem());
        assert_eq!(message(&cert_pem, &key_pem), "loaded");
        // A key file holding only a certificate, a certificate file without one.
        let no_key = message(&cert_pem, &cert_pem);
        assert!(
            no_key.ends_with("tls.key: no PRIVATE KEY block"),
            "{no_key}"
        );
        let no_cert = message("not PEM at all\n", &key_pem);
        assert!(
            no_cert.ends_with("tls.crt: no CERTIFICATE block"),
            "{no_cert}"
        );
        // A block cut short is a PEM error, not "missing".
        let cut = &key_pem[..key_pem.len() - 30];
        let truncated = message(&cert_pem, cut);
        assert!(
            truncated.contains("tls.key: ") && !truncated.contains("no PRIVATE KEY block"),
            "{truncated}"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn reload_on_change_keeps_old_on_garbage() {
        let dir = std::env::temp_dir().join(format!("kpulse-tls-reload-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (c, k) = CertSource::SelfSigned {
            dir: dir.clone(),
            names: vec!["a.example".into()],
        }
        .files()
        .expect("generate");
        let r = ReloadingCert::new(c.clone(), k.clone()).expect("load");
        let before = r.current.load_full().cert[0].clone();
        let mut last = r.stamp();
        assert!(!r.reload_if_changed(&mut last), "nothing changed");
        // A garbage rewrite is refused and the old certificate stays.
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&c, b"garbage").expect("write");
        assert!(!r.reload_if_changed(&mut last));
        assert_eq!(r.current.load_full().cert[0], before);
        // A new valid pair is picked up.
        let g = rcgen::generate_simple_self_signed(vec!["b.example".to_string()]).expect("gen");
        std::fs::write(&k, g.signing_key.serialize_pem()).expect("key");
        std::fs::write(&c, g.cert.pem()).expect("cert");
        assert!(r.reload_if_changed(&mut last));
        assert_ne!(r.current.load_full().cert[0], before);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn tls_options_use_go_names() {
        assert_eq!(protocol_versions("VersionTLS13").expect("13").len(), 1);
        assert_eq!(protocol_versions("VersionTLS12").expect("12").len(), 2);
        assert!(protocol_versions("VersionTLS10").is_err());
        assert!(protocol_versions("TLS1.2").is_err());
        let s = cipher_suites(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into()]).expect("known");
        assert!(s
            .iter()
            .any(|c| format!("{:?}", c.suite()) == "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"));
        let err = cipher_suites(&["TLS_RSA_WITH_RC4_128_SHA".into()]).expect_err("unknown");
        assert!(err.to_string().contains("unsupported suite"), "{err}");
    }
}
