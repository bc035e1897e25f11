//! Who a request is from, trying its credentials in k8s.io/apiserver's order for a
//! delegating server (`pkg/authentication/authenticatorfactory/delegating.go`):
//!
//! 1. the front proxy: a client certificate from the request-header CA (and an allowed CN)
//!    whose `X-Remote-*` headers name the user ([`super::requestheader`]);
//! 2. a client certificate from `--client-ca-file`: CN is the user, O the groups, and the
//!    certificate's SHA-256 the `authentication.kubernetes.io/credential-id` extra;
//! 3. a bearer token, through a TokenReview ([`super::delegated::TokenAuthenticator`]);
//! 4. anonymous — only if enabled (k8s.io/apiserver enables it; kpulse does not by default),
//!    and only when none of the above *failed*.
//!
//! As in `pkg/authentication/request/union/union.go`, a method that fails (a certificate
//! that does not verify, a CN not allowed, a token refused or not reviewable) does not stop
//! the later ones, but is remembered: when nothing succeeds, those failures make the 401 and
//! rule out anonymous access (`unionauth.NewFailOnError`). Users from methods 1–3 get the
//! `system:authenticated` group (`pkg/authentication/group/authenticated_group_adder.go`);
//! the anonymous user is `system:anonymous` in `system:unauthenticated`
//! (`pkg/authentication/request/anonymous/anonymous.go`). Every 401 has the same body:
//! `Status` `Unauthorized`, reason `Unauthorized` (`pkg/endpoints/filters/authentication.go`).
//!
//! The CA-based methods (1 and 2) can change while serving — k8s.io/apiserver's dynamic CA
//! content, fed by the `extension-apiserver-authentication` ConfigMap
//! ([`super::authconfig`]): [`Chain::set_ca_sources`] swaps them atomically (`ArcSwap`), so
//! the request path takes no lock and a request sees either the old or the new sources.

use std::{fmt, sync::Arc};

use arc_swap::ArcSwap;

use http::HeaderMap;
use rustls::pki_types::CertificateDer;

use super::{
    delegated::{AuthnFailure, TokenAuthenticator},
    requestheader,
    x509::{self, CaBundle},
    AuthnError, UserInfo,
};
use crate::status::Status;

/// The anonymous user's name.
pub const ANONYMOUS_USER: &str = "system:anonymous";
/// The anonymous user's group.
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// The group every authenticated user is in.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// The extra key naming the credential a user authenticated with.
pub const CREDENTIAL_ID_KEY: &str = "authentication.kubernetes.io/credential-id";

/// The 401 message when a bearer token could not be reviewed ([`Unauthenticated::status`]).
pub const API_UNAVAILABLE_MESSAGE: &str = "Unauthorized: the bearer token could not be verified \
     (the Kubernetes API did not answer the TokenReview, or too many were under way); retry \
     later";

/// Whether requests without credentials are served as `system:anonymous`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Anonymous {
    /// No: they get 401 (kpulse's default).
    #[default]
    Disabled,
    /// Yes, on these exact request paths, or on every path when empty
    /// (k8s.io/apiserver's `AnonymousAuthConfig` conditions).
    Enabled {
        /// The paths.
        paths: Vec<String>,
    },
}

/// The authentication methods to use; unset ones are skipped.
#[derive(Clone, Debug, Default)]
pub struct ChainConfig {
    /// The front proxy (`--requestheader-*`); initial value, see [`Chain::set_ca_sources`].
    pub request_header: Option<requestheader::Config>,
    /// `--client-ca-file`; initial value, see [`Chain::set_ca_sources`].
    pub client_ca: Option<CaBundle>,
    /// TokenReviews (needs a Kubernetes API client).
    pub tokens: Option<Arc<TokenAuthenticator>>,
    /// Anonymous requests.
    pub anonymous: Anonymous,
}

/// The methods that trust a CA, replaceable while serving.
#[derive(Clone, Debug, Default)]
pub struct CaSources {
    /// The front proxy.
    pub request_header: Option<requestheader::Config>,
    /// Client certificates.
    pub client_ca: Option<CaBundle>,
}

/// A chain with no way to authenticate anyone.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "no authentication method configured: give a request-header CA, a client CA or a \
     Kubernetes API for TokenReviews, or enable anonymous access"
)]
pub struct NoAuthenticators;

/// How a user was authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// The front proxy's headers.
    RequestHeader,
    /// A client certificate from the client CA.
    ClientCertificate,
    /// A bearer token, by TokenReview.
    BearerToken,
    /// No credentials, anonymous access enabled.
    Anonymous,
}

/// A request's user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authenticated {
    /// The user, `system:authenticated` included (except for the anonymous user).
    pub user: UserInfo,
    /// How.
    pub method: Method,
}

/// Why one method did not authenticate a request that offered its kind of credential.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A client certificate that does not verify against the request-header CA.
    #[error("client certificate does not verify against the request-header CA")]
    ProxyCertificateUnverified,
    /// The front proxy's certificate is not acceptable (e.g. CN not allowed).
    #[error("request-header: {0}")]
    RequestHeader(#[source] AuthnError),
    /// A client certificate that does not verify against the client CA.
    #[error("client certificate does not verify against the client CA")]
    ClientCertificateUnverified,
    /// A verified client certificate without a usable identity.
    #[error("client certificate: {0}")]
    ClientCertificate(#[source] AuthnError),
    /// The API reviewed the bearer token: not authenticated.
    #[error("invalid bearer token")]
    InvalidBearerToken,
    /// The bearer token could not be reviewed, or the review reported an error.
    #[error(transparent)]
    Token(AuthnFailure),
}

/// The request is not authenticated: 401.
#[derive(Debug, PartialEq, Eq)]
pub struct Unauthenticated {
    /// What each method that was offered credentials said; empty when none were offered.
    pub refusals: Vec<Refusal>,
}

impl Unauthenticated {
    /// The 401 body: the apiserver's (`Unauthorized`, whatever the cause), except when the
    /// Kubernetes API could not review a token — then the client is told to retry, as
    /// its credentials may well be good.
    pub fn status(&self) -> Status {
        if self.api_unavailable() {
            Status::unauthorized(API_UNAVAILABLE_MESSAGE)
        } else {
            Status::unauthorized("Unauthorized")
        }
    }

    /// Whether a TokenReview could not be had at all (the API unreachable, erring or too
    /// slow), as opposed to credentials judged wrong.
    pub fn api_unavailable(&self) -> bool {
        self.refusals.iter().any(|r| {
            matches!(
                r,
                Refusal::Token(
                    AuthnFailure::Review { .. }
                        | AuthnFailure::Timeout { .. }
                        | AuthnFailure::Lost
                        | AuthnFailure::Busy { .. }
                )
            )
        })
    }
}

impl fmt::Display for Unauthenticated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.refusals.is_empty() {
            return f.write_str("no credentials");
        }
        for (i, r) in self.refusals.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Unauthenticated {}

/// The authentication chain. Clones share their [`CaSources`]: setting them on one sets
/// them on all.
#[derive(Clone, Debug)]
pub struct Chain {
    ca_sources: Arc<ArcSwap<CaSources>>,
    tokens: Option<Arc<TokenAuthenticator>>,
    anonymous: Anonymous,
}

impl Chain {
    /// A chain of the configured methods.
    pub fn new(config: ChainConfig) -> Result<Chain, NoAuthenticators> {
        let none = config.request_header.is_none()
            && config.client_ca.is_none()
            && config.tokens.is_none()
            && config.anonymous == Anonymous::Disabled;
        if none {
            return Err(NoAuthenticators);
        }
        Ok(Chain {
            ca_sources: Arc::new(ArcSwap::from_pointee(CaSources {
                request_header: config.request_header,
                client_ca: config.client_ca,
            })),
            tokens: config.tokens,
            anonymous: config.anonymous,
        })
    }

    /// Replaces the request-header and client-CA settings; requests authenticated from now
    /// on use them (lock-free for the request path).
    pub fn set_ca_sources(&self, sources: CaSources) {
        self.ca_sources.store(Arc::new(sources));
    }

    /// The request-header and client-CA settings in use.
    pub fn ca_sources(&self) -> Arc<CaSources> {
        self.ca_sources.load_full()
    }

    /// Who sent a request with the TLS client chain `client_certs` (as presented, unverified),
    /// `headers` and URL path `path`.
    pub async fn authenticate(
        &self,
        client_certs: Option<&[CertificateDer<'_>]>,
        headers: &HeaderMap,
        path: &str,
    ) -> Result<Authenticated, Unauthenticated> {
        let certs = client_certs.filter(|c| !c.is_empty());
        let mut refusals = Vec::new();

        // The guard is dropped before the TokenReview's await.
        if let Some(done) = self.authenticate_certificates(certs, headers, &mut refusals) {
            return Ok(done);
        }

        if let (Some(tokens), Some(token)) = (&self.tokens, bearer_token(headers)) {
            match tokens.authenticate(token).await {
                Ok(Some(user)) => return Ok(authenticated(user, Method::BearerToken)),
                Ok(None) => refusals.push(Refusal::InvalidBearerToken),
                Err(e) => refusals.push(Refusal::Token(e)),
            }
        }

        if refusals.is_empty() {
            if let Anonymous::Enabled { paths } = &self.anonymous {
                if paths.is_empty() || paths.iter().any(|p| p == path) {
                    return Ok(Authenticated {
                        user: UserInfo {
                            name: ANONYMOUS_USER.to_owned(),
                            groups: vec![UNAUTHENTICATED_GROUP.to_owned()],
                            ..UserInfo::default()
                        },
                        method: Method::Anonymous,
                    });
                }
            }
        }
        Err(Unauthenticated { refusals })
    }

    /// Methods 1 and 2, with the CA sources in use now.
    fn authenticate_certificates(
        &self,
        certs: Option<&[CertificateDer<'_>]>,
        headers: &HeaderMap,
        refusals: &mut Vec<Refusal>,
    ) -> Option<Authenticated> {
        let sources = self.ca_sources.load();
        if let Some(rh) = &sources.request_header {
            match requestheader::authenticate(rh, certs, headers) {
                Ok(requestheader::Outcome::User(user)) => {
                    return Some(authenticated(user, Method::RequestHeader));
                }
                Ok(requestheader::Outcome::NoUser) => {}
                Ok(requestheader::Outcome::NotProxy) => {
                    if certs.is_some() {
                        refusals.push(Refusal::ProxyCertificateUnverified);
                    }
                }
                Err(e) => refusals.push(Refusal::RequestHeader(e)),
            }
        }

        if let (Some(ca), Some(chain)) = (&sources.client_ca, certs) {
            if !ca.verifies(chain) {
                refusals.push(Refusal::ClientCertificateUnverified);
            } else {
                match x509::identity(&chain[0]) {
                    Ok(mut user) => {
                        if let Some(id) = credential_id(&chain[0]) {
                            user.extra.insert(CREDENTIAL_ID_KEY.to_owned(), vec![id]);
                        }
                        return Some(authenticated(user, Method::ClientCertificate));
                    }
                    // No CN: no opinion, as in k8s.io/apiserver.
                    Err(AuthnError::NoCommonName) => {}
                    Err(e) => refusals.push(Refusal::ClientCertificate(e)),
                }
            }
        }
        None
    }

    /// Removes the credentials a handler must never see: `Authorization`, and the front
    /// proxy's identity headers — the standard `X-Remote-User`, `X-Remote-Uid`,
    /// `X-Remote-Group`, `X-Remote-Extra-*` and the configured ones.
    pub fn strip_credentials(&self, headers: &mut HeaderMap) {
        headers.remove(http::header::AUTHORIZATION);
        if let Some(rh) = &self.ca_sources.load().request_header {
            requestheader::strip(rh, headers);
        }
        for h in ["x-remote-user", "x-remote-uid", "x-remote-group"] {
            headers.remove(h);
        }
        let extra: Vec<http::HeaderName> = headers
            .keys()
            .filter(|k| k.as_str().starts_with("x-remote-extra-"))
            .cloned()
            .collect();
        for k in extra {
            headers.remove(k);
        }
    }
}

/// Adds `system:authenticated` unless the user is anonymous or already in it or in
/// `system:unauthenticated`.
fn authenticated(mut user: UserInfo, method: Method) -> Authenticated {
    let exempt = user.name == ANONYMOUS_USER
        || user
            .groups
            .iter()
            .any(|g| g == AUTHENTICATED_GROUP || g == UNAUTHENTICATED_GROUP);
    if !exempt {
        user.groups.push(AUTHENTICATED_GROUP.to_owned());
    }
    Authenticated { user, method }
}

/// The bearer token in `Authorization`, read as k8s.io/apiserver does
/// (`pkg/authentication/request/bearertoken/bearertoken.go`): the first header value,
/// trimmed, split at spaces into at most three parts; the scheme is case-insensitive, the
/// token is the second part and must not be empty.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .trim();
    let mut parts = value.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// `X509SHA256=<hex SHA-256 of the certificate>`.
fn credential_id(cert: &CertificateDer<'_>) -> Option<String> {
    use std::fmt::Write as _;
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256.tls13()?;
    let digest = suite.common.hash_provider.hash(cert.as_ref());
    let mut id = String::from("X509SHA256=");
    for b in digest.as_ref() {
        let _ = write!(id, "{b:02x}");
    }
    Some(id)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::auth::{
        delegated::{testing::FakeApi, TokenConfig},
        x509::testing::TestCa,
    };

    fn header_config(ca: &TestCa, allowed: &[&str]) -> requestheader::Config {
        requestheader::Config {
            ca: CaBundle::from_pem(&ca.pem, "requestheader-client-ca").expect("ca"),
            allowed_names: allowed.iter().map(|s| s.to_string()).collect(),
            username_headers: vec!["X-Remote-User".into()],
            uid_headers: vec!["X-Remote-Uid".into()],
            group_headers: vec!["X-Remote-Group".into()],
            extra_prefixes: vec!["X-Remote-Extra-".into()],
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                http::HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    /// `good-<name>` tokens are users; anything else is not authenticated.
    async fn token_api() -> FakeApi {
        FakeApi::start(|_, spec| {
            let token = spec["token"].as_str().unwrap_or("");
            match token.strip_prefix("good-") {
                Some(name) => (
                    201,
                    json!({"authenticated": true, "user": {"username": name, "groups": ["g"]}}),
                ),
                None => (201, json!({"authenticated": false})),
            }
        })
        .await
    }

    struct Fixture {
        proxy_ca: TestCa,
        client_ca: TestCa,
        api: FakeApi,
    }

    impl Fixture {
        async fn new() -> Fixture {
            Fixture {
                proxy_ca: TestCa::new("front-proxy-ca"),
                client_ca: TestCa::new("client-ca"),
                api: token_api().await,
            }
        }

        fn chain(&self, anonymous: Anonymous) -> Chain {
            let tokens = TokenAuthenticator::new(
                self.api.client(),
                TokenConfig {
                    timeout: Duration::from_secs(5),
                    ..TokenConfig::default()
                },
            )
            .expect("tokens");
            Chain::new(ChainConfig {
                request_header: Some(header_config(&self.proxy_ca, &["front-proxy-client"])),
                client_ca: Some(
                    CaBundle::from_pem(&self.client_ca.pem, "client-ca").expect("client ca"),
                ),
                tokens: Some(Arc::new(tokens)),
                anonymous,
            })
            .expect("chain")
        }
    }

    fn open() -> Anonymous {
        Anonymous::Enabled { paths: vec![] }
    }

    #[tokio::test]
    async fn the_front_proxy_comes_first() {
        let f = Fixture::new().await;
        let chain = f.chain(Anonymous::Disabled);
        let proxy = [f.proxy_ca.client("front-proxy-client", &[])];
        let h = headers(&[
            ("X-Remote-User", "jane"),
            ("X-Remote-Group", "devs"),
            ("Authorization", "Bearer good-someone-else"),
        ]);
        let a = chain.authenticate(Some(&proxy), &h, "/").await.expect("ok");
        assert_eq!(a.method, Method::RequestHeader);
        assert_eq!(a.user.name, "jane");
        assert_eq!(a.user.groups, ["devs", AUTHENTICATED_GROUP]);
        assert_eq!(f.api.token_reviews(), 0, "no TokenReview needed");
    }

    #[tokio::test]
    async fn client_certificates_from_the_client_ca() {
        let f = Fixture::new().await;
        let chain = f.chain(Anonymous::Disabled);
        let cert = f.client_ca.client("kubelet", &["system:nodes"]);
        let a = chain
            .authenticate(Some(std::slice::from_ref(&cert)), &HeaderMap::new(), "/")
            .await
            .expect("ok");
        assert_eq!(a.method, Method::ClientCertificate);
        assert_eq!(a.user.name, "kubelet");
        assert_eq!(a.user.groups, ["system:nodes", AUTHENTICATED_GROUP]);
        let id = &a.user.extra[CREDENTIAL_ID_KEY];
        assert_eq!(id.len(), 1);
        assert!(id[0].starts_with("X509SHA256="), "{id:?}");
        assert_eq!(id[0].len(), "X509SHA256=".len() + 64);
    }

    #[tokio::test]
    async fn bearer_tokens_are_reviewed() {
        let f = Fixture::new().await;
        let chain = f.chain(Anonymous::Disabled);
        let h = headers(&[("Authorization", "bearer good-sam")]);
        let a = chain.authenticate(None, &h, "/").await.expect("ok");
        assert_eq!(a.method, Method::BearerToken);
        assert_eq!(a.user.name, "sam");
        assert_eq!(a.user.groups, ["g", AUTHENTICATED_GROUP]);
        // Invalid tokens are 401 even with anonymous access enabled.
        let anon = f.chain(open());
        let h = headers(&[("Authorization", "Bearer nope")]);
        let e = anon.authenticate(None, &h, "/").await.expect_err("401");
        assert_eq!(e.refusals, [Refusal::InvalidBearerToken]);
        assert!(!e.api_unavailable());
        assert_eq!(e.status().code(), 401);
        assert_eq!(e.status().0.message.as_deref(), Some("Unauthorized"));
        assert_eq!(e.status().0.reason.as_deref(), Some("Unauthorized"));
    }

    #[tokio::test]
    async fn anonymous_only_when_enabled_and_nothing_failed() {
        let f = Fixture::new().await;
        let none = HeaderMap::new();
        let e = f
            .chain(Anonymous::Disabled)
            .authenticate(None, &none, "/")
            .await
            .expect_err("401");
        assert!(e.refusals.is_empty());
        assert_eq!(e.to_string(), "no credentials");
        let a = f
            .chain(open())
            .authenticate(None, &none, "/")
            .await
            .expect("ok");
        assert_eq!(a.method, Method::Anonymous);
        assert_eq!(a.user.name, ANONYMOUS_USER);
        assert_eq!(a.user.groups, [UNAUTHENTICATED_GROUP]);
        // Limited to some paths.
        let some = f.chain(Anonymous::Enabled {
            paths: vec!["/healthz".into()],
        });
        assert!(some.authenticate(None, &none, "/healthz").await.is_ok());
        assert!(some.authenticate(None, &none, "/apis").await.is_err());
        // A certificate nobody trusts is a failure, so not anonymous either.
        let stranger = TestCa::new("elsewhere").client("mallory", &[]);
        let e = f
            .chain(open())
            .authenticate(Some(std::slice::from_ref(&stranger)), &none, "/")
            .await
            .expect_err("401");
        assert_eq!(
            e.refusals,
            [
                Refusal::ProxyCertificateUnverified,
                Refusal::ClientCertificateUnverified
            ]
        );
    }

    #[tokio::test]
    async fn a_failed_method_does_not_stop_later_ones() {
        let f = Fixture::new().await;
        let chain = f.chain(Anonymous::Disabled);
        // A front-proxy certificate with a CN that is not allowed, plus a good token.
        let wrong_cn = [f.proxy_ca.client("not-the-proxy", &[])];
        let h = headers(&[
            ("X-Remote-User", "admin"),
            ("Authorization", "Bearer good-tom"),
        ]);
        let a = chain
            .authenticate(Some(&wrong_cn), &h, "/")
            .await
            .expect("ok");
        assert_eq!(
            (a.user.name.as_str(), a.method),
            ("tom", Method::BearerToken)
        );
        // Already in system:authenticated: not added twice.
        let proxy = [f.proxy_ca.client("front-proxy-client", &[])];
        let h = headers(&[
            ("X-Remote-User", "jane"),
            ("X-Remote-Group", AUTHENTICATED_GROUP),
        ]);
        let a = chain.authenticate(Some(&proxy), &h, "/").await.expect("ok");
        assert_eq!(a.user.groups, [AUTHENTICATED_GROUP]);
    }

    #[tokio::test]
    async fn an_unreachable_api_is_401_not_anonymous() {
        let mut f = Fixture::new().await;
        let chain = f.chain(open());
        f.api.stop().await;
        let h = headers(&[("Authorization", "Bearer good-uma")]);
        let e = chain.authenticate(None, &h, "/").await.expect_err("401");
        assert!(e.api_unavailable(), "{e}");
        assert!(matches!(
            e.refusals[..],
            [Refusal::Token(AuthnFailure::Review { .. })]
        ));
        assert!(!e.to_string().contains("good-uma"));
        let status = e.status().0;
        assert_eq!(status.code, Some(401));
        assert_eq!(status.reason.as_deref(), Some("Unauthorized"));
        assert_eq!(status.message.as_deref(), Some(API_UNAVAILABLE_MESSAGE));
    }

    #[test]
    fn bearer_tokens_are_parsed_like_the_apiserver() {
        let token = |v: &str| {
            let h = headers(&[("Authorization", v)]);
            bearer_token(&h).map(str::to_owned)
        };
        assert_eq!(token("Bearer abc").as_deref(), Some("abc"));
        assert_eq!(token("  BEARER abc  ").as_deref(), Some("abc"));
        assert_eq!(token("Bearer abc def").as_deref(), Some("abc"));
        assert_eq!(token("Bearer  abc"), None, "space before the token");
        assert_eq!(token("Bearer"), None);
        assert_eq!(token("Basic abc"), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn nothing_configured_is_an_error() {
        assert_eq!(
            Chain::new(ChainConfig::default()).err(),
            Some(NoAuthenticators)
        );
        assert!(Chain::new(ChainConfig {
            anonymous: open(),
            ..ChainConfig::default()
        })
        .is_ok());
    }

    #[tokio::test]
    async fn a_swapped_request_header_ca_is_used_at_once() {
        let f = Fixture::new().await;
        let chain = f.chain(Anonymous::Disabled);
        // A clone (what the server holds) sees the swap made through another.
        let serving = chain.clone();
        let rotated = TestCa::new("front-proxy-ca-2");
        let h = headers(&[("X-Remote-User", "jane")]);
        let old_proxy = [f.proxy_ca.client("front-proxy-client", &[])];
        let new_proxy = [rotated.client("front-proxy-client", &[])];
        let a = serving.authenticate(Some(&old_proxy), &h, "/").await;
        assert_eq!(
            a.expect("old CA before the swap").method,
            Method::RequestHeader
        );
        let e = serving.authenticate(Some(&new_proxy), &h, "/").await;
        assert!(e.is_err(), "new CA not trusted yet");

        let client_ca = chain.ca_sources().client_ca.clone();
        chain.set_ca_sources(CaSources {
            request_header: Some(header_config(&rotated, &["front-proxy-client"])),
            client_ca,
        });
        let a = serving
            .authenticate(Some(&new_proxy), &h, "/")
            .await
            .expect("new CA after the swap");
        assert_eq!(
            (a.user.name.as_str(), a.method),
            ("jane", Method::RequestHeader)
        );
        let e = serving
            .authenticate(Some(&old_proxy), &h, "/")
            .await
            .expect_err("old CA refused");
        assert_eq!(
            e.refusals,
            [
                Refusal::ProxyCertificateUnverified,
                Refusal::ClientCertificateUnverified
            ]
        );
        // The client CA was kept.
        let kubelet = [f.client_ca.client("kubelet", &[])];
        let a = serving
            .authenticate(Some(&kubelet), &HeaderMap::new(), "/")
            .await
            .expect("client CA kept");
        assert_eq!(a.method, Method::ClientCertificate);
    }

    #[tokio::test]
    async fn credentials_are_stripped() {
        let f = Fixture::new().await;
        let chain = f.chain(Anonymous::Disabled);
        let mut h = headers(&[
            ("Authorization", "Bearer x"),
            ("X-Remote-User", "u"),
            ("X-Remote-Uid", "1"),
            ("X-Remote-Group", "g"),
            ("X-Remote-Extra-Scopes", "s"),
            ("Accept", "application/json"),
        ]);
        chain.strip_credentials(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("accept"));
    }
}
