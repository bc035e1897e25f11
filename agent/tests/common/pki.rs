//! Test certificates, made with rcgen: a CA, a serving certificate for `localhost` and
//! 127.0.0.1 (for the real aggregator-api's `--tls-cert-file`, or an in-test TLS server),
//! and client certificates (an agent's node identity, or a kubectl user's).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

/// A CA and the serving certificate it signed, written into a directory.
pub struct TestPki {
    /// `ca.crt`: for `--agent-client-ca-file`, or an agent's `--ca-file`.
    pub ca_file: PathBuf,
    /// `server.crt` and `server.key`.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// An in-test server's TLS configuration with that certificate, speaking HTTP/2 only.
    pub server_config: Arc<rustls::ServerConfig>,
    ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    dir: PathBuf,
}

fn write(path: &Path, contents: impl AsRef<[u8]>) {
    std::fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

impl TestPki {
    /// A new CA named `ca_name` and its serving certificate, in `dir`.
    pub fn new(dir: &Path, ca_name: &str) -> TestPki {
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, ca_name);
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA certificate");
        let ca_file = dir.join("ca.crt");
        write(&ca_file, ca.pem());

        let key = rcgen::KeyPair::generate().expect("server key");
        let cert = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
            .expect("server params")
            .signed_by(&key, &ca)
            .expect("server certificate");
        let (server_cert, server_key) = (dir.join("server.crt"), dir.join("server.key"));
        write(&server_cert, cert.pem());
        write(&server_key, key.serialize_pem());
        let der_key = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der())
            .expect("server key DER");
        let mut server_config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], der_key)
        .expect("server TLS configuration");
        server_config.alpn_protocols = vec![b"h2".to_vec()];
        TestPki {
            ca_file,
            server_cert,
            server_key,
            server_config: Arc::new(server_config),
            ca,
            dir: dir.to_path_buf(),
        }
    }

    /// A client certificate for `CN=cn` (and `O=org` when given), signed by the CA:
    /// `<cn>.crt` and `<cn>.key` in the directory.
    pub fn client(&self, cn: &str, org: Option<&str>) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().expect("client key");
        let mut params =
            rcgen::CertificateParams::new(Vec::<String>::new()).expect("client params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        if let Some(org) = org {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, org);
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params
            .signed_by(&key, &self.ca)
            .expect("client certificate");
        let (c, k) = (
            self.dir.join(format!("{cn}.crt")),
            self.dir.join(format!("{cn}.key")),
        );
        write(&c, cert.pem());
        write(&k, key.serialize_pem());
        (c, k)
    }
}
