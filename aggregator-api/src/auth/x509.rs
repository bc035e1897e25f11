//! Client certificates: does a presented chain verify against a CA bundle (for client
//! authentication), and what identity does it carry. Verification is rustls' WebPKI
//! client verifier; parsing is x509-parser. Nothing is hand-rolled.

use std::sync::Arc;

use rustls::{
    pki_types::{pem::PemObject as _, CertificateDer, UnixTime},
    server::{danger::ClientCertVerifier, WebPkiClientVerifier},
    RootCertStore,
};

use super::{AuthnError, UserInfo};

/// Errors building a CA bundle.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// No certificate in the PEM text.
    #[error("{what}: no CERTIFICATE block")]
    Empty {
        /// Where the PEM came from.
        what: String,
    },
    /// A certificate could not be read or used as a trust anchor.
    #[error("{what}: {reason}")]
    Invalid {
        /// Where the PEM came from.
        what: String,
        /// Why.
        reason: String,
    },
}

/// A set of CAs that client certificates are verified against.
#[derive(Clone)]
pub struct CaBundle {
    verifier: Arc<dyn ClientCertVerifier>,
    pem: Arc<str>,
}

impl std::fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaBundle").finish_non_exhaustive()
    }
}

impl CaBundle {
    /// Parses PEM (one or more CERTIFICATE blocks). `what` names the source in errors.
    pub fn from_pem(pem: &str, what: &str) -> Result<CaBundle, CaError> {
        let invalid = |reason: String| CaError::Invalid {
            what: what.to_string(),
            reason,
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| invalid(e.to_string()))?;
        if certs.is_empty() {
            return Err(CaError::Empty {
                what: what.to_string(),
            });
        }
        let mut roots = RootCertStore::empty();
        for c in certs {
            roots.add(c).map_err(|e| invalid(e.to_string()))?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .allow_unauthenticated()
        .build()
        .map_err(|e| invalid(e.to_string()))?;
        Ok(CaBundle {
            verifier,
            pem: pem.into(),
        })
    }

    /// The PEM text the bundle was built from (to notice changes).
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// The rustls verifier (for the TLS layer).
    pub fn verifier(&self) -> Arc<dyn ClientCertVerifier> {
        self.verifier.clone()
    }

    /// Whether `chain` (end entity first) verifies against this bundle for client
    /// authentication, now.
    pub fn verifies(&self, chain: &[CertificateDer<'_>]) -> bool {
        let Some((end, intermediates)) = chain.split_first() else {
            return false;
        };
        self.verifier
            .verify_client_cert(end, intermediates, UnixTime::now())
            .is_ok()
    }
}

/// The identity in a client certificate, as Kubernetes reads it: CN is the user name,
/// each O is a group.
pub fn identity(cert: &CertificateDer<'_>) -> Result<UserInfo, AuthnError> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| AuthnError::BadCertificate(e.to_string()))?;
    let subject = parsed.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .filter(|s| !s.is_empty())
        .ok_or(AuthnError::NoCommonName)?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Ok(UserInfo {
        name,
        uid: None,
        groups,
        extra: Default::default(),
    })
}

#[cfg(test)]
pub(crate) mod testing {
    //! Certificates made on the fly for tests.
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    use rustls::pki_types::CertificateDer;

    /// A CA that can issue client certificates.
    pub struct TestCa {
        pub pem: String,
        issuer: Issuer<'static, KeyPair>,
    }

    impl TestCa {
        pub fn new(name: &str) -> TestCa {
            let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
            p.distinguished_name.push(DnType::CommonName, name);
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let key = KeyPair::generate().expect("key");
            let cert = p.self_signed(&key).expect("self-signed");
            TestCa {
                pem: cert.pem(),
                issuer: Issuer::new(p, key),
            }
        }

        /// A client certificate with CN `cn` and organisations `orgs`.
        pub fn client(&self, cn: &str, orgs: &[&str]) -> CertificateDer<'static> {
            let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
            p.distinguished_name.push(DnType::CommonName, cn);
            for o in orgs {
                p.distinguished_name.push(DnType::OrganizationName, *o);
            }
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let key = KeyPair::generate().expect("key");
            let cert = p.signed_by(&key, &self.issuer).expect("sign");
            cert.der().clone()
        }

        /// A client certificate for a given key.
        pub fn client_with_key(&self, cn: &str, key: &KeyPair) -> CertificateDer<'static> {
            let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
            p.distinguished_name.push(DnType::CommonName, cn);
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            p.signed_by(key, &self.issuer).expect("sign").der().clone()
        }

        /// An expired client certificate.
        pub fn expired_client(&self, cn: &str) -> CertificateDer<'static> {
            let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
            p.distinguished_name.push(DnType::CommonName, cn);
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            p.not_before = rcgen::date_time_ymd(2000, 1, 1);
            p.not_after = rcgen::date_time_ymd(2001, 1, 1);
            let key = KeyPair::generate().expect("key");
            p.signed_by(&key, &self.issuer).expect("sign").der().clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{testing::TestCa, *};

    #[test]
    fn chains_verify_only_against_their_own_ca() {
        let a = TestCa::new("ca-a");
        let b = TestCa::new("ca-b");
        let bundle = CaBundle::from_pem(&a.pem, "test").expect("bundle");
        assert!(bundle.verifies(&[a.client("alice", &[])]));
        assert!(!bundle.verifies(&[b.client("alice", &[])]), "other CA");
        assert!(!bundle.verifies(&[a.expired_client("alice")]), "expired");
        assert!(!bundle.verifies(&[]), "no certificate");
    }

    #[test]
    fn identity_is_cn_and_organisations() {
        let a = TestCa::new("ca");
        // rcgen keeps one value per attribute type, so one organisation here.
        let u = identity(&a.client("jane", &["system:masters"])).expect("identity");
        assert_eq!(u.name, "jane");
        assert_eq!(u.groups, ["system:masters"]);
        assert!(identity(&a.client("bob", &[]))
            .expect("identity")
            .groups
            .is_empty());
        assert!(identity(&CertificateDer::from(vec![1, 2, 3])).is_err());
    }

    #[test]
    fn bundles_refuse_garbage() {
        assert!(matches!(
            CaBundle::from_pem("", "x"),
            Err(CaError::Empty { .. })
        ));
        assert!(CaBundle::from_pem(
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            "x"
        )
        .is_err());
    }
}
