//! The TLS layer's part in client-certificate authentication: ask every client for a
//! certificate, accept any chain whose holder proves possession of the key, and leave
//! trust to authentication — as k8s.io/apiserver does (`tls.RequestClientCert`).
//!
//! Deciding trust per request rather than per handshake means a rotated request-header
//! or client CA applies to the next request without touching the TLS configuration, and a
//! certificate from an unknown CA is refused by authentication (401), not by the
//! handshake. The chain in [`crate::serve::Peer`] is therefore *unverified*; only
//! [`super::x509::CaBundle::verifies`] makes it mean anything.

use std::sync::Arc;

use rustls::{
    client::danger::HandshakeSignatureValid,
    crypto::{CryptoProvider, WebPkiSupportedAlgorithms},
    pki_types::{CertificateDer, UnixTime},
    server::danger::{ClientCertVerified, ClientCertVerifier},
    DigitallySignedStruct, DistinguishedName, SignatureScheme,
};

/// Requests a client certificate, never requires one, checks only the handshake
/// signature (proof of the private key).
#[derive(Debug)]
pub struct RequestClientCert {
    algorithms: WebPkiSupportedAlgorithms,
}

impl RequestClientCert {
    /// A verifier using `provider`'s signature algorithms.
    pub fn new(provider: &CryptoProvider) -> Arc<RequestClientCert> {
        Arc::new(RequestClientCert {
            algorithms: provider.signature_verification_algorithms,
        })
    }
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hints: Go clients (kube-apiserver's aggregator) then send their certificate
        // whatever CA issued it.
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
