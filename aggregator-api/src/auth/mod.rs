//! Authentication, as an extension API server behind the aggregation layer must do it
//! (k8s.io/apiserver's delegated authentication):
//!
//! - [`x509`]: client certificates — which CA a presented chain verifies against, and the
//!   identity in it (CN = user, O = groups);
//! - [`requestheader`]: the front proxy (kube-apiserver's aggregator) proves itself with a
//!   client certificate from the request-header CA, whose CN must be an allowed name; only
//!   then are `X-Remote-User` / `X-Remote-Group` / `X-Remote-Extra-*` believed. The same
//!   headers from anyone else are ignored.
//!
//! - [`delegated`]: bearer tokens through a TokenReview and authorization through a
//!   SubjectAccessReview, via `kube`, with TTL caches, failing closed;
//! - [`issuer`]: the agents' projected tokens verified against the service account
//!   issuer's keys and the agent pods, a TokenReview only for those that do not pass;
//! - [`authconfig`]: the cluster's `extension-apiserver-authentication` ConfigMap, followed
//!   so that rotated CAs are trusted without a restart;
//! - [`chain`]: the order k8s.io/apiserver applies them in for an aggregated server:
//!   request-header → client certificate → token → anonymous (off unless enabled).

pub mod authconfig;
pub mod chain;
pub mod delegated;
pub mod issuer;
pub mod requestheader;
pub mod tls;
pub mod x509;

use std::collections::BTreeMap;

/// Who made a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// User name.
    pub name: String,
    /// UID, when the authenticator knows it.
    pub uid: Option<String>,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes (keys lower-case).
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Why a request is refused at authentication (401).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthnError {
    /// A front-proxy certificate whose CN is not in `--requestheader-allowed-names`.
    #[error("request-header client certificate CN {cn:?} is not allowed")]
    ProxyNotAllowed {
        /// The certificate's CN.
        cn: String,
    },
    /// A client certificate without a usable identity.
    #[error("client certificate has no common name")]
    NoCommonName,
    /// A certificate could not be parsed.
    #[error("client certificate cannot be parsed: {0}")]
    BadCertificate(String),
}
