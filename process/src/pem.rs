//! Certificate chains and private keys from PEM files, with errors that name the file and
//! say what it lacked.

use std::path::{Path, PathBuf};

use rustls::pki_types::{
    pem::{self, PemObject as _},
    CertificateDer, PrivateKeyDer,
};

/// A PEM file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file held nothing usable.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

fn read(path: &Path) -> Result<Vec<u8>, PemError> {
    std::fs::read(path).map_err(|source| PemError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Every CERTIFICATE block of `path`, in order; at least one.
///
/// # Errors
///
/// When the file cannot be read, a block is malformed, or there is none.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let invalid = |reason: String| PemError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&read(path)?)
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(e.to_string()))?;
    if certs.is_empty() {
        return Err(invalid("no CERTIFICATE block".into()));
    }
    Ok(certs)
}

/// The first private key of `path` (PKCS#8, PKCS#1 or SEC1).
///
/// # Errors
///
/// When the file cannot be read or holds no readable key.
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, PemError> {
    PrivateKeyDer::from_pem_slice(&read(path)?).map_err(|e| PemError::Invalid {
        path: path.to_path_buf(),
        reason: match e {
            pem::Error::NoItemsFound => "no PRIVATE KEY block".into(),
            e => e.to_string(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, contents: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kpulse-process-pem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join(name);
        std::fs::write(&path, contents).expect("write");
        path
    }

    #[test]
    fn errors_name_the_file_and_what_it_lacked() {
        let missing = Path::new("/nonexistent/kpulse.pem");
        let e = certificates(missing).expect_err("missing");
        assert_eq!(e.to_string(), "cannot read /nonexistent/kpulse.pem");
        assert!(matches!(e, PemError::Read { .. }));

        let empty = temp("empty.pem", "not PEM at all\n");
        let e = certificates(&empty).expect_err("empty");
        assert_eq!(
            e.to_string(),
            format!("{}: no CERTIFICATE block", empty.display())
        );
        let e = private_key(&empty).expect_err("no key");
        assert_eq!(
            e.to_string(),
            format!("{}: no PRIVATE KEY block", empty.display())
        );

        let broken = temp(
            "broken.pem",
            "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
        );
        assert!(matches!(
            certificates(&broken),
            Err(PemError::Invalid { .. })
        ));
    }

    #[test]
    fn reads_what_it_is_given() {
        let generated =
            rcgen::generate_simple_self_signed(vec!["kpulse".to_string()]).expect("generate");
        let cert = temp("cert.pem", &generated.cert.pem());
        let key = temp("key.pem", &generated.signing_key.serialize_pem());
        let chain = certificates(&cert).expect("cert");
        assert_eq!(chain.len(), 1);
        assert_eq!(chain[0].as_ref(), generated.cert.der().as_ref());
        let read = private_key(&key).expect("key");
        assert_eq!(
            read.secret_der(),
            generated.signing_key.serialize_der().as_slice()
        );
    }
}
