//! Delegated authentication and authorization: asking the Kubernetes API who a bearer
//! token belongs to (TokenReview) and whether a user may make a request
//! (SubjectAccessReview), as k8s.io/apiserver does for metrics-server.
//!
//! What is reproduced (k8s.io/apiserver paths):
//!
//! - [`TokenAuthenticator`] (`plugin/pkg/authenticator/token/webhook/webhook.go`,
//!   `pkg/authentication/token/cache/cached_token_authenticator.go`): `spec.token` and, when
//!   configured, `spec.audiences`; `status.authenticated` with `status.user`; when audiences
//!   were asked for, the answer must name one of them (an answer naming none counts as the
//!   asked-for ones). Answers — authenticated or not — are cached for
//!   `--authentication-token-webhook-cache-ttl` (10 s); errors, including an unauthenticated
//!   answer carrying `status.error`, are never cached. Cache keys are an HMAC-SHA256, under a
//!   per-process random key, of the length-prefixed token and audiences: no token is kept.
//!   Concurrent look-ups of one token share a single review, which runs detached from any one
//!   request. An unreachable API is an error, never "anonymous".
//! - [`Authorizer`] (`pkg/server/options/authorization.go`,
//!   `plugin/pkg/authorizer/webhook/webhook.go`, `pkg/authorization/union/union.go`): members
//!   of an always-allow group (`system:masters`) are allowed, then non-resource requests to an
//!   always-allow path (`/healthz`, `/readyz`, `/livez`; a trailing `*` matches a prefix), and
//!   only then is a SubjectAccessReview made, with the user's name, uid, groups and extra and
//!   either `resourceAttributes` (verb, group, version, resource, subresource, namespace,
//!   name) or `nonResourceAttributes` (path, verb). Allowed answers are cached for
//!   `--authorization-webhook-cache-authorized-ttl` (10 s), the rest for
//!   `--authorization-webhook-cache-unauthorized-ttl` (10 s), keyed by the review's spec;
//!   errors are not cached. A failed review is [`Decision::Error`]: the apiserver answers
//!   it with a plain-text 500 ([`internal_error_body`]), never 403 and never "allowed".
//!
//! Both talk to the API through `kube` with an explicit timeout per review (retries
//! included: kube's client retries 429/503/504 by itself). Neither logs or prints a token.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    fmt,
    future::Future,
    hash::Hash,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use k8s_openapi::api::{
    authentication::v1 as authn,
    authorization::v1::{
        NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    },
};
use kube::{api::PostParams, Api, Client};
use rustls::crypto::tls13::{Hkdf, OkmBlock};
use tokio::{
    sync::{watch, Mutex},
    time::Instant,
};

use super::UserInfo;
use crate::go;
use crate::status::RequestAttributes;

/// The group whose members every request is allowed to (k8s.io/apiserver's default
/// `AlwaysAllowGroups`; there is no flag for it).
pub const PRIVILEGED_GROUP: &str = "system:masters";

/// The paths allowed to everyone without a review (`--authorization-always-allow-paths`).
pub const DEFAULT_ALWAYS_ALLOW_PATHS: [&str; 3] = ["/healthz", "/readyz", "/livez"];

/// Errors in the delegated authentication or authorization settings.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// An always-allow path with a `*` anywhere but at its end.
    #[error("--authorization-always-allow-paths: only a trailing * is allowed, not in {path:?}")]
    PathPattern {
        /// The offending entry.
        path: String,
    },
    /// No random key could be made for the token cache.
    #[error("no randomness for the token cache key: {reason}")]
    Random {
        /// Why.
        reason: String,
    },
}

/// A snapshot of a review cache's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheMetrics {
    /// Look-ups answered from the cache.
    pub hits: u64,
    /// Look-ups that started a review.
    pub misses: u64,
    /// Look-ups that joined a review already under way for the same key.
    pub coalesced: u64,
    /// Reviews that ended without a cacheable answer (API unreachable, timed out, an error
    /// status, an unreadable answer, or a token review reporting an error).
    pub errors: u64,
    /// Live entries pushed out to keep a cache within its size.
    pub evictions: u64,
}

// ---------------------------------------------------------------------------------------------
// Token reviews.

/// Settings of [`TokenAuthenticator`].
#[derive(Clone, Debug)]
pub struct TokenConfig {
    /// How long an answer (authenticated or not) is reused
    /// (`--authentication-token-webhook-cache-ttl`, 10 s). Zero disables caching.
    pub cache_ttl: Duration,
    /// Most answers kept, for each of authenticated and unauthenticated tokens; the oldest
    /// go first.
    pub cache_size: usize,
    /// `spec.audiences` to ask for; empty asks for the API server's own.
    pub audiences: Vec<String>,
    /// Time allowed for one review, retries included (k8s.io/apiserver's
    /// `TokenRequestTimeout`, 10 s), the wait for a place among [`Self::max_in_flight`]
    /// included.
    pub timeout: Duration,
    /// Reviews in flight at once; the rest wait their turn here. When a replica restarts,
    /// every agent's stream asks for one within seconds: sent all at once, they overflowed
    /// kube-apiserver's API Priority and Fairness queues for the server's ServiceAccount
    /// (11 of 3,002 rejected with 1,500 agents over 15 s, `cluster bench-fleet`), where
    /// waiting here costs kube-apiserver nothing.
    pub max_in_flight: usize,
    /// Longest wait for one of the [`Self::max_in_flight`] places. Past it the look-up
    /// fails at once with [`AuthnFailure::Busy`] and no review is sent: an agent (whose
    /// handshake waits 10 s) is told to come back later, with its own jittered backoff,
    /// instead of waiting past its patience for a review it would not be there to take
    /// (at 10,000 agents, reviews that ended after their agent left kept the queue from
    /// ever draining: docs/design/scale.md).
    pub queue_wait: Duration,
}

impl Default for TokenConfig {
    fn default() -> Self {
        TokenConfig {
            cache_ttl: Duration::from_secs(10),
            cache_size: 8192,
            audiences: Vec::new(),
            timeout: Duration::from_secs(10),
            max_in_flight: 32,
            queue_wait: Duration::from_secs(2),
        }
    }
}

/// Why a bearer token could not be judged. Every variant means 401 (fail closed), never
/// anonymous access.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthnFailure {
    /// The TokenReview could not be made, or the API answered it with an error (unreachable,
    /// an error status such as 403 for a service account that may not create tokenreviews,
    /// an unreadable answer).
    #[error("TokenReview failed: {reason}")]
    Review {
        /// The client's error, cause chain included.
        reason: String,
    },
    /// The TokenReview took longer than [`TokenConfig::timeout`].
    #[error("TokenReview timed out after {after:?}")]
    Timeout {
        /// The timeout.
        after: Duration,
    },
    /// The API reviewed the token and reported an error with it (`status.error`).
    #[error("token rejected: {reason}")]
    Rejected {
        /// `status.error`.
        reason: String,
    },
    /// The review ended without an answer.
    #[error("TokenReview ended without an answer")]
    Lost,
    /// No place among [`TokenConfig::max_in_flight`] within [`TokenConfig::queue_wait`]:
    /// too many reviews under way; nothing was sent.
    #[error("none of the {waiting} TokenReview places freed within {after:?}; try again later")]
    Busy {
        /// The places, all taken.
        waiting: usize,
        /// [`TokenConfig::queue_wait`].
        after: Duration,
    },
}

impl ReviewError for AuthnFailure {
    fn lost() -> Self {
        AuthnFailure::Lost
    }

    /// Not for a judged token, and not for [`AuthnFailure::Busy`]: that is this replica's
    /// own saturation (counted where it is turned into a refusal), not the API's, and
    /// during a reconnect storm it alternates with answered reviews.
    fn is_outage(&self) -> bool {
        !matches!(
            self,
            AuthnFailure::Rejected { .. } | AuthnFailure::Busy { .. }
        )
    }
}

/// Authenticates bearer tokens with TokenReviews, through a cache.
pub struct TokenAuthenticator {
    api: Api<authn::TokenReview>,
    config: TokenConfig,
    /// [`TokenConfig::max_in_flight`] places.
    in_flight: Arc<tokio::sync::Semaphore>,
    keyer: CacheKeyer,
    cache: ReviewCache<[u8; 32], Option<UserInfo>, AuthnFailure>,
}

impl fmt::Debug for TokenAuthenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenAuthenticator")
            .field("config", &self.config)
            .field("metrics", &self.metrics())
            .finish_non_exhaustive()
    }
}

impl TokenAuthenticator {
    /// An authenticator asking the API behind `client`.
    pub fn new(client: Client, config: TokenConfig) -> Result<Self, ConfigError> {
        Ok(TokenAuthenticator {
            api: Api::all(client),
            in_flight: Arc::new(tokio::sync::Semaphore::new(config.max_in_flight.max(1))),
            keyer: CacheKeyer::new()?,
            cache: ReviewCache::new(
                "TokenReview",
                config.cache_size,
                config.cache_ttl,
                config.cache_ttl,
            ),
            config,
        })
    }

    /// Who `token` belongs to: `Some` user, `None` when the API says the token is not
    /// (or not for our audiences) authenticated, an error when it could not be told. An
    /// empty token is `None` without a review.
    pub async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, AuthnFailure> {
        if token.is_empty() {
            return Ok(None);
        }
        let key = self.keyer.key(token, &self.config.audiences);
        let api = self.api.clone();
        let audiences = self.config.audiences.clone();
        let limits = ReviewLimits {
            timeout: self.config.timeout,
            queue_wait: self.config.queue_wait,
            places: self.config.max_in_flight.max(1),
        };
        let token = token.to_owned();
        let in_flight = self.in_flight.clone();
        self.cache
            .get_or_review(key, true, move || {
                review_token(api, token, audiences, limits, in_flight)
            })
            .await
    }

    /// The cache's counters.
    pub fn metrics(&self) -> CacheMetrics {
        self.cache.metrics()
    }
}

/// How long one review may wait and take, from [`TokenConfig`].
#[derive(Clone, Copy, Debug)]
struct ReviewLimits {
    timeout: Duration,
    queue_wait: Duration,
    places: usize,
}

async fn review_token(
    api: Api<authn::TokenReview>,
    token: String,
    audiences: Vec<String>,
    limits: ReviewLimits,
    in_flight: Arc<tokio::sync::Semaphore>,
) -> Result<Option<UserInfo>, AuthnFailure> {
    let started = Instant::now();
    let timeout = limits.timeout;
    let busy = AuthnFailure::Busy {
        waiting: limits.places,
        after: limits.queue_wait,
    };
    let place =
        match tokio::time::timeout(limits.queue_wait.min(timeout), in_flight.acquire()).await {
            Ok(Ok(place)) => place,
            // The semaphore is never closed.
            Ok(Err(_)) => return Err(AuthnFailure::Lost),
            Err(_) => return Err(busy),
        };
    let review = authn::TokenReview {
        spec: authn::TokenReviewSpec {
            token: Some(token),
            audiences: (!audiences.is_empty()).then(|| audiences.clone()),
        },
        ..Default::default()
    };
    let left = timeout.saturating_sub(started.elapsed());
    let answer = tokio::time::timeout(left, api.create(&PostParams::default(), &review)).await;
    drop(place);
    drop(review);
    let answer = match answer {
        Err(_) => return Err(AuthnFailure::Timeout { after: timeout }),
        Ok(Err(e)) => {
            return Err(AuthnFailure::Review {
                reason: describe(&e),
            })
        }
        Ok(Ok(answer)) => answer,
    };
    let status = answer.status.unwrap_or_default();
    if !audiences.is_empty() {
        let granted = status.audiences.as_deref().filter(|a| !a.is_empty());
        if let Some(granted) = granted {
            if !audiences.iter().any(|a| granted.contains(a)) {
                return Ok(None);
            }
        }
    }
    if status.authenticated != Some(true) {
        return match status.error.filter(|e| !e.is_empty()) {
            Some(reason) => Err(AuthnFailure::Rejected { reason }),
            None => Ok(None),
        };
    }
    let user = status.user.unwrap_or_default();
    Ok(Some(UserInfo {
        name: user.username.unwrap_or_default(),
        uid: user.uid.filter(|u| !u.is_empty()),
        groups: user.groups.unwrap_or_default(),
        extra: user.extra.unwrap_or_default(),
    }))
}

/// HMAC-SHA256 under a random per-process key (rustls' ring provider), so that cache keys
/// reveal nothing about tokens and cannot be precomputed.
struct CacheKeyer {
    hkdf: &'static dyn Hkdf,
    key: OkmBlock,
}

impl CacheKeyer {
    fn new() -> Result<Self, ConfigError> {
        let provider = rustls::crypto::ring::default_provider();
        let mut secret = [0u8; 32];
        provider
            .secure_random
            .fill(&mut secret)
            .map_err(|e| ConfigError::Random {
                reason: format!("{e:?}"),
            })?;
        let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256
            .tls13()
            .ok_or_else(|| ConfigError::Random {
                reason: "no TLS 1.3 SHA-256 suite".into(),
            })?;
        let key = OkmBlock::new(&secret);
        secret.fill(0);
        Ok(CacheKeyer {
            hkdf: suite.hkdf_provider,
            key,
        })
    }

    fn key(&self, token: &str, audiences: &[String]) -> [u8; 32] {
        let mut message = Vec::with_capacity(token.len() + 16 + audiences.len() * 24);
        length_prefixed(&mut message, token.as_bytes());
        message.extend_from_slice(&(audiences.len() as u64).to_be_bytes());
        for a in audiences {
            length_prefixed(&mut message, a.as_bytes());
        }
        let tag = self.hkdf.hmac_sign(&self.key, &message);
        message.fill(0);
        let mut out = [0u8; 32];
        let tag = tag.as_ref();
        let n = tag.len().min(out.len());
        out[..n].copy_from_slice(&tag[..n]);
        out
    }
}

fn length_prefixed(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    out.extend_from_slice(bytes);
}

// ---------------------------------------------------------------------------------------------
// Authorization.

/// Settings of [`Authorizer`].
#[derive(Clone, Debug)]
pub struct AuthorizerConfig {
    /// How long an allowed answer is reused
    /// (`--authorization-webhook-cache-authorized-ttl`, 10 s). Zero disables.
    pub allow_ttl: Duration,
    /// How long any other answer is reused
    /// (`--authorization-webhook-cache-unauthorized-ttl`, 10 s). Zero disables.
    pub deny_ttl: Duration,
    /// Most answers kept, for each of allowed and not allowed; the oldest go first.
    pub cache_size: usize,
    /// Non-resource paths allowed to everyone (`--authorization-always-allow-paths`); a
    /// trailing `*` matches a prefix.
    pub always_allow_paths: Vec<String>,
    /// Groups whose members are allowed everything.
    pub always_allow_groups: Vec<String>,
    /// Time allowed for one review, retries included (k8s.io/apiserver's `ClientTimeout`,
    /// 10 s).
    pub timeout: Duration,
}

impl Default for AuthorizerConfig {
    fn default() -> Self {
        AuthorizerConfig {
            allow_ttl: Duration::from_secs(10),
            deny_ttl: Duration::from_secs(10),
            cache_size: 8192,
            always_allow_paths: DEFAULT_ALWAYS_ALLOW_PATHS.map(String::from).to_vec(),
            always_allow_groups: vec![PRIVILEGED_GROUP.to_owned()],
            timeout: Duration::from_secs(10),
        }
    }
}

/// What is being authorized: who, and the request's attributes (the same
/// [`RequestAttributes`] a denial is worded from, plus the API version).
#[derive(Clone, Copy, Debug)]
pub struct Attributes<'a> {
    user: &'a UserInfo,
    api_version: &'a str,
    request: RequestAttributes<'a>,
}

impl<'a> Attributes<'a> {
    /// `request` made by `user`; `request.user` is set to the user's name. `api_version`
    /// is the version of a resource request (e.g. `v1beta1`), empty otherwise.
    pub fn new(user: &'a UserInfo, request: RequestAttributes<'a>, api_version: &'a str) -> Self {
        let request = RequestAttributes {
            user: &user.name,
            ..request
        };
        Attributes {
            user,
            api_version,
            request,
        }
    }

    /// The request's attributes, for [`crate::status::Status::forbidden`].
    pub fn request(&self) -> &RequestAttributes<'a> {
        &self.request
    }

    /// The user.
    pub fn user(&self) -> &'a UserInfo {
        self.user
    }

    /// The API version.
    pub fn api_version(&self) -> &'a str {
        self.api_version
    }

    /// The SubjectAccessReview asking about these attributes.
    pub fn review(&self) -> SubjectAccessReview {
        let r = &self.request;
        let u = self.user;
        let (resource_attributes, non_resource_attributes) = if r.resource_request {
            let resource = ResourceAttributes {
                namespace: non_empty(r.namespace),
                verb: non_empty(r.verb),
                group: non_empty(r.api_group),
                version: non_empty(self.api_version),
                resource: non_empty(r.resource),
                subresource: non_empty(r.subresource),
                name: non_empty(r.name),
                ..Default::default()
            };
            (Some(resource), None)
        } else {
            let path = NonResourceAttributes {
                path: non_empty(r.path),
                verb: non_empty(r.verb),
            };
            (None, Some(path))
        };
        SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: non_empty(&u.name),
                uid: u.uid.as_deref().and_then(non_empty),
                groups: (!u.groups.is_empty()).then(|| u.groups.clone()),
                extra: (!u.extra.is_empty()).then(|| u.extra.clone()),
                resource_attributes,
                non_resource_attributes,
            },
            ..Default::default()
        }
    }

    /// The apiserver caches only reviews whose attributes are under 10000 bytes in all.
    fn cacheable(&self) -> bool {
        let r = &self.request;
        let size = [
            r.namespace,
            r.verb,
            r.api_group,
            self.api_version,
            r.resource,
            r.subresource,
            r.name,
            r.path,
        ]
        .iter()
        .map(|s| s.len())
        .sum::<usize>();
        size < 10_000
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// An authorization decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Go ahead.
    Allow,
    /// 403, with the authorizer's reason (possibly empty) for
    /// [`crate::status::Status::forbidden`].
    Deny(String),
    /// No decision could be had (the API unreachable, timed out or erring): a plain-text
    /// 500 ([`internal_error_body`]). Fails closed.
    Error(String),
}

impl Decision {
    /// Whether the request may proceed.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow)
    }
}

/// The body the apiserver sends with a 500 when authorization failed
/// (`responsewriters.InternalError`): `Internal Server Error: "<request URI>": <error>`,
/// HTML-escaped, with a trailing newline, as `text/plain; charset=utf-8` with
/// `X-Content-Type-Options: nosniff` ([`crate::body::text`] sets both).
pub fn internal_error_body(request_uri: &str, error: &str) -> String {
    let text = format!("Internal Server Error: {}: {error}", go::quote(request_uri));
    let mut body = text
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    body.push('\n');
    body
}

/// Why a SubjectAccessReview could not be had.
#[derive(Clone, Debug, PartialEq, Eq)]
enum AuthzFailure {
    Review(String),
    Timeout(Duration),
    Lost,
}

impl fmt::Display for AuthzFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthzFailure::Review(reason) => write!(f, "SubjectAccessReview failed: {reason}"),
            AuthzFailure::Timeout(after) => {
                write!(f, "SubjectAccessReview timed out after {after:?}")
            }
            AuthzFailure::Lost => f.write_str("SubjectAccessReview ended without an answer"),
        }
    }
}

impl ReviewError for AuthzFailure {
    fn lost() -> Self {
        AuthzFailure::Lost
    }

    fn is_outage(&self) -> bool {
        true
    }
}

/// A SubjectAccessReview's `status`, as cached.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Verdict {
    allowed: bool,
    denied: bool,
    reason: String,
}

impl Positive for Verdict {
    fn positive(&self) -> bool {
        self.allowed
    }
}

impl Positive for Option<UserInfo> {
    fn positive(&self) -> bool {
        self.is_some()
    }
}

impl Verdict {
    /// As the apiserver's union of always-allow authorizers and the webhook reads it.
    fn decision(&self) -> Decision {
        match (self.allowed, self.denied) {
            (true, true) => Decision::Error(
                "webhook subject access review returned both allow and deny response".into(),
            ),
            (true, false) => Decision::Allow,
            // An explicit denial ends the union with the webhook's own reason.
            (false, true) => Decision::Deny(self.reason.clone()),
            // No opinion: the union names the authorizer that gave a reason.
            (false, false) if self.reason.is_empty() => Decision::Deny(String::new()),
            (false, false) => Decision::Deny(format!("kubernetes.io/webhook: {}", self.reason)),
        }
    }
}

/// Authorizes requests with SubjectAccessReviews, through allowed and denied caches.
pub struct Authorizer {
    api: Api<SubjectAccessReview>,
    config: AuthorizerConfig,
    exact_paths: BTreeSet<String>,
    path_prefixes: Vec<String>,
    cache: ReviewCache<Vec<u8>, Verdict, AuthzFailure>,
}

impl fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authorizer")
            .field("config", &self.config)
            .field("metrics", &self.metrics())
            .finish_non_exhaustive()
    }
}

impl Authorizer {
    /// An authorizer asking the API behind `client`.
    pub fn new(client: Client, config: AuthorizerConfig) -> Result<Self, ConfigError> {
        let mut exact_paths = BTreeSet::new();
        let mut path_prefixes = Vec::new();
        for p in &config.always_allow_paths {
            let trimmed = p.strip_prefix('/').unwrap_or(p);
            match trimmed.strip_suffix('*') {
                Some(head) if !head.contains('*') => path_prefixes.push(head.to_owned()),
                None if !trimmed.contains('*') => {
                    exact_paths.insert(trimmed.to_owned());
                }
                _ => return Err(ConfigError::PathPattern { path: p.clone() }),
            }
        }
        Ok(Authorizer {
            api: Api::all(client),
            cache: ReviewCache::new(
                "SubjectAccessReview",
                config.cache_size,
                config.allow_ttl,
                config.deny_ttl,
            ),
            config,
            exact_paths,
            path_prefixes,
        })
    }

    /// Whether the request described by `attrs` may proceed.
    pub async fn authorize(&self, attrs: &Attributes<'_>) -> Decision {
        let groups = &self.config.always_allow_groups;
        if attrs.user.groups.iter().any(|g| groups.contains(g)) {
            return Decision::Allow;
        }
        if !attrs.request.resource_request && self.always_allowed(attrs.request.path) {
            return Decision::Allow;
        }
        let review = attrs.review();
        let key = match serde_json::to_vec(&review.spec) {
            Ok(k) => k,
            Err(e) => return Decision::Error(format!("SubjectAccessReview: {e}")),
        };
        let api = self.api.clone();
        let timeout = self.config.timeout;
        let answer = self
            .cache
            .get_or_review(key, attrs.cacheable(), move || {
                review_access(api, review, timeout)
            })
            .await;
        match answer {
            Ok(verdict) => verdict.decision(),
            Err(e) => Decision::Error(e.to_string()),
        }
    }

    /// The caches' counters (allowed and denied together).
    pub fn metrics(&self) -> CacheMetrics {
        self.cache.metrics()
    }

    fn always_allowed(&self, path: &str) -> bool {
        let path = path.strip_prefix('/').unwrap_or(path);
        self.exact_paths.contains(path) || self.path_prefixes.iter().any(|p| path.starts_with(p))
    }
}

async fn review_access(
    api: Api<SubjectAccessReview>,
    review: SubjectAccessReview,
    timeout: Duration,
) -> Result<Verdict, AuthzFailure> {
    let answer = tokio::time::timeout(timeout, api.create(&PostParams::default(), &review))
        .await
        .map_err(|_| AuthzFailure::Timeout(timeout))?
        .map_err(|e| AuthzFailure::Review(describe(&e)))?;
    let status = answer.status.unwrap_or_default();
    Ok(Verdict {
        allowed: status.allowed,
        denied: status.denied.unwrap_or(false),
        reason: status.reason.unwrap_or_default(),
    })
}

/// A client error for logs and answers: an API error as `<code> <reason>: <message>`,
/// anything else as its cause chain without the repetitions kube's errors carry.
fn describe(e: &kube::Error) -> String {
    if let kube::Error::Api(status) = e {
        return format!("{} {}: {}", status.code, status.reason, status.message);
    }
    let mut out = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The review cache: positive and negative TTL caches, bounded, plus one review in flight per
// key.

/// Which of the two caches an answer goes to.
trait Positive {
    fn positive(&self) -> bool;
}

/// What a review's error must offer the cache.
trait ReviewError: Clone + fmt::Display {
    /// The review's task ended without sending an answer.
    fn lost() -> Self;
    /// Whether this is the API failing (logged as a state change), rather than an answer.
    fn is_outage(&self) -> bool;
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    coalesced: AtomicU64,
    errors: AtomicU64,
    evictions: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }
}

type Flight<V, E> = watch::Receiver<Option<Result<V, E>>>;

struct State<K, V, E> {
    positive: TtlCache<K, V>,
    negative: TtlCache<K, V>,
    in_flight: HashMap<K, Flight<V, E>>,
}

struct Shared<K, V, E> {
    what: &'static str,
    state: Mutex<State<K, V, E>>,
    counters: Counters,
    failing: AtomicBool,
    positive_ttl: Duration,
    negative_ttl: Duration,
}

struct ReviewCache<K, V, E> {
    shared: Arc<Shared<K, V, E>>,
}

impl<K, V, E> ReviewCache<K, V, E>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Positive + Clone + Send + Sync + 'static,
    E: ReviewError + Send + Sync + 'static,
{
    fn new(
        what: &'static str,
        size: usize,
        positive_ttl: Duration,
        negative_ttl: Duration,
    ) -> Self {
        ReviewCache {
            shared: Arc::new(Shared {
                what,
                state: Mutex::new(State {
                    positive: TtlCache::new(size),
                    negative: TtlCache::new(size),
                    in_flight: HashMap::new(),
                }),
                counters: Counters::default(),
                failing: AtomicBool::new(false),
                positive_ttl,
                negative_ttl,
            }),
        }
    }

    fn metrics(&self) -> CacheMetrics {
        let c = &self.shared.counters;
        CacheMetrics {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            coalesced: c.coalesced.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
        }
    }

    /// The cached answer for `key`, or the answer of a review — joining one under way for
    /// the same key, or starting `review` on a task of its own, so that a caller giving up
    /// does not cancel it for the others. Only answers are cached, and only if `cacheable`.
    async fn get_or_review<F, Fut>(&self, key: K, cacheable: bool, review: F) -> Result<V, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
    {
        let shared = &self.shared;
        let mut flight = {
            let mut state = shared.state.lock().await;
            let now = Instant::now();
            let cached = match state.positive.get(&key, now) {
                Some(v) => Some(v),
                None => state.negative.get(&key, now),
            };
            if let Some(v) = cached {
                Counters::bump(&shared.counters.hits, 1);
                return Ok(v);
            }
            match state.in_flight.get(&key) {
                // A review whose task is gone without answering is replaced.
                Some(flight) if flight.has_changed().is_ok() => {
                    Counters::bump(&shared.counters.coalesced, 1);
                    flight.clone()
                }
                _ => {
                    Counters::bump(&shared.counters.misses, 1);
                    let (tx, rx) = watch::channel(None);
                    state.in_flight.insert(key.clone(), rx.clone());
                    let task = review();
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        let answer = task.await;
                        shared.settle(key, cacheable, &answer).await;
                        let _ = tx.send(Some(answer));
                    });
                    rx
                }
            }
        };
        let answer = match flight.wait_for(Option::is_some).await {
            Ok(answer) => answer.clone(),
            Err(_) => None,
        };
        answer.unwrap_or_else(|| Err(E::lost()))
    }
}

impl<K, V, E> Shared<K, V, E>
where
    K: Hash + Eq + Clone,
    V: Positive + Clone,
    E: ReviewError,
{
    /// Records a finished review: caches an answer, counts an error, logs a change between
    /// reaching and not reaching the API.
    async fn settle(&self, key: K, cacheable: bool, answer: &Result<V, E>) {
        let mut state = self.state.lock().await;
        state.in_flight.remove(&key);
        match answer {
            Ok(v) => {
                if cacheable {
                    let now = Instant::now();
                    let evicted = if v.positive() {
                        state
                            .positive
                            .insert(key, v.clone(), self.positive_ttl, now)
                    } else {
                        state
                            .negative
                            .insert(key, v.clone(), self.negative_ttl, now)
                    };
                    Counters::bump(&self.counters.evictions, evicted);
                }
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(review = self.what, "Kubernetes API answering reviews again");
                }
            }
            Err(e) => {
                Counters::bump(&self.counters.errors, 1);
                if e.is_outage() && !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(review = self.what, error = %e, "Kubernetes API not answering reviews; failing closed");
                } else {
                    tracing::debug!(review = self.what, error = %e, "review failed");
                }
            }
        }
    }
}

/// A map whose entries expire, bounded in size: when full, the oldest entry goes.
struct TtlCache<K, V> {
    entries: HashMap<K, Slot<V>>,
    /// Insertion order; an item whose sequence number no longer matches its entry is stale.
    order: VecDeque<(K, u64)>,
    capacity: usize,
    next_seq: u64,
}

struct Slot<V> {
    value: V,
    expires: Instant,
    seq: u64,
}

impl<K: Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    fn new(capacity: usize) -> Self {
        TtlCache {
            entries: HashMap::new(),
            order: VecDeque::new(),
            capacity,
            next_seq: 0,
        }
    }

    fn get(&mut self, key: &K, now: Instant) -> Option<V> {
        let slot = self.entries.get(key)?;
        if slot.expires > now {
            return Some(slot.value.clone());
        }
        self.entries.remove(key);
        None
    }

    /// Inserts, then drops expired entries from the old end and, while over capacity, the
    /// oldest live ones. Returns how many live entries were pushed out.
    fn insert(&mut self, key: K, value: V, ttl: Duration, now: Instant) -> u64 {
        let Some(expires) = now.checked_add(ttl).filter(|_| !ttl.is_zero()) else {
            return 0;
        };
        if self.capacity == 0 {
            return 0;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.insert(
            key.clone(),
            Slot {
                value,
                expires,
                seq,
            },
        );
        self.order.push_back((key, seq));
        let mut evicted = 0;
        while let Some((k, s)) = self.order.front() {
            let live = self.entries.get(k).filter(|slot| slot.seq == *s);
            match live {
                None => {}
                Some(slot) if slot.expires <= now => {
                    self.entries.remove(k);
                }
                Some(_) if self.entries.len() > self.capacity => {
                    self.entries.remove(k);
                    evicted += 1;
                }
                Some(_) => break,
            }
            self.order.pop_front();
        }
        if self.order.len() > 2 * self.capacity + 16 {
            let entries = &self.entries;
            self.order
                .retain(|(k, s)| entries.get(k).is_some_and(|slot| slot.seq == *s));
        }
        evicted
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! A scripted stand-in for the Kubernetes API's review endpoints, on loopback.

    use std::{
        sync::{
            atomic::{AtomicU64, AtomicUsize, Ordering},
            Arc,
        },
        time::Duration,
    };

    use bytes::Bytes;
    use http::{Request, Response, StatusCode};
    use http_body_util::{BodyExt, Full};
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;
    use serde_json::{json, Value};
    use tokio::{net::TcpListener, sync::Mutex, task::JoinHandle};

    /// Token reviews' path.
    pub const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
    /// Subject access reviews' path.
    pub const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

    /// The script: (path, request spec) → (HTTP status, `status` of the review for 2xx or
    /// the whole body otherwise).
    pub type Script = dyn Fn(&str, &Value) -> (u16, Value) + Send + Sync;

    struct Inner {
        script: Box<Script>,
        token_reviews: AtomicUsize,
        access_reviews: AtomicUsize,
        delay_ms: AtomicU64,
        specs: Mutex<Vec<(String, Value)>>,
        /// Requests being answered now, and the most at once.
        in_flight: AtomicUsize,
        most_in_flight: AtomicUsize,
    }

    /// The fake API server.
    pub struct FakeApi {
        /// `http://127.0.0.1:<port>`.
        pub url: String,
        inner: Arc<Inner>,
        task: Option<JoinHandle<()>>,
    }

    impl FakeApi {
        /// Starts answering with `script`.
        pub async fn start(
            script: impl Fn(&str, &Value) -> (u16, Value) + Send + Sync + 'static,
        ) -> FakeApi {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let url = format!("http://{}", listener.local_addr().expect("addr"));
            let inner = Arc::new(Inner {
                script: Box::new(script),
                token_reviews: AtomicUsize::new(0),
                access_reviews: AtomicUsize::new(0),
                delay_ms: AtomicU64::new(0),
                specs: Mutex::new(Vec::new()),
                in_flight: AtomicUsize::new(0),
                most_in_flight: AtomicUsize::new(0),
            });
            let state = inner.clone();
            let task = tokio::spawn(async move {
                // Dropping the set (when this task is aborted) closes every connection.
                let mut connections = tokio::task::JoinSet::new();
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        continue;
                    };
                    let state = state.clone();
                    connections.spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let state = state.clone();
                            async move { Ok::<_, std::convert::Infallible>(answer(&state, req).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tcp), service)
                            .await;
                    });
                }
            });
            FakeApi {
                url,
                inner,
                task: Some(task),
            }
        }

        /// A kube client for this server.
        pub fn client(&self) -> kube::Client {
            let config = kube::Config::new(self.url.parse().expect("url"));
            kube::Client::try_from(config).expect("client")
        }

        /// TokenReviews received.
        pub fn token_reviews(&self) -> usize {
            self.inner.token_reviews.load(Ordering::SeqCst)
        }

        /// SubjectAccessReviews received.
        pub fn access_reviews(&self) -> usize {
            self.inner.access_reviews.load(Ordering::SeqCst)
        }

        /// The most requests it was answering at once.
        pub fn most_in_flight(&self) -> usize {
            self.inner.most_in_flight.load(Ordering::SeqCst)
        }

        /// Makes every answer wait this long.
        pub fn set_delay(&self, delay: Duration) {
            self.inner
                .delay_ms
                .store(delay.as_millis() as u64, Ordering::SeqCst);
        }

        /// The specs received, in order, with their paths.
        pub async fn specs(&self) -> Vec<(String, Value)> {
            self.inner.specs.lock().await.clone()
        }

        /// Stops answering: the listener and every open connection close.
        pub async fn stop(&mut self) {
            if let Some(task) = self.task.take() {
                task.abort();
                let _ = task.await;
            }
            // Let the aborted connection tasks be dropped.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    impl Drop for FakeApi {
        fn drop(&mut self) {
            if let Some(task) = self.task.take() {
                task.abort();
            }
        }
    }

    async fn answer(state: &Inner, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = req.uri().path().to_owned();
        let post = req.method() == http::Method::POST;
        if req.method() == http::Method::GET {
            // Documents (the service account issuer's): the script's answer, whole.
            let (code, value) = (state.script)(&path, &Value::Null);
            return respond(code, &value);
        }
        let body = req.into_body().collect().await.expect("body").to_bytes();
        let object: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let (api_version, kind) = match path.as_str() {
            TOKEN_REVIEWS if post => {
                state.token_reviews.fetch_add(1, Ordering::SeqCst);
                ("authentication.k8s.io/v1", "TokenReview")
            }
            ACCESS_REVIEWS if post => {
                state.access_reviews.fetch_add(1, Ordering::SeqCst);
                ("authorization.k8s.io/v1", "SubjectAccessReview")
            }
            _ => return respond(404, &json!({"kind": "Status", "code": 404})),
        };
        let spec = object.get("spec").cloned().unwrap_or(Value::Null);
        state.specs.lock().await.push((path.clone(), spec.clone()));
        let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        state.most_in_flight.fetch_max(now, Ordering::SeqCst);
        let delay = state.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        state.in_flight.fetch_sub(1, Ordering::SeqCst);
        let (code, value) = (state.script)(&path, &spec);
        if !(200..300).contains(&code) {
            return respond(code, &value);
        }
        respond(
            code,
            &json!({
                "apiVersion": api_version,
                "kind": kind,
                "metadata": {},
                "spec": spec,
                "status": value,
            }),
        )
    }

    fn respond(code: u16, body: &Value) -> Response<Full<Bytes>> {
        let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
        *r.status_mut() = StatusCode::from_u16(code).expect("status code");
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        r
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{json, Value};

    use super::{testing::*, *};
    use crate::api::types::GROUP;
    use crate::status::Status;

    const TTL: Duration = Duration::from_millis(250);

    /// Tokens: `good-*` are users named after the rest, `bad` is unauthenticated, `error`
    /// carries `status.error`, `aud` is authenticated for audience `other` only.
    async fn token_api() -> FakeApi {
        FakeApi::start(|_, spec| {
            let token = spec["token"].as_str().unwrap_or("");
            let status = match token {
                "bad" => json!({"authenticated": false}),
                "error" => json!({"authenticated": false, "error": "token expired"}),
                "aud" => json!({
                    "authenticated": true,
                    "user": {"username": "aud-user"},
                    "audiences": ["other"],
                }),
                t => match t.strip_prefix("good-") {
                    Some(name) => json!({
                        "authenticated": true,
                        "user": {
                            "username": name,
                            "uid": "uid-1",
                            "groups": ["team"],
                            "extra": {"scopes": ["a", "b"]},
                        },
                    }),
                    None => json!({"authenticated": false}),
                },
            };
            (201, status)
        })
        .await
    }

    fn tokens(api: &FakeApi, config: TokenConfig) -> TokenAuthenticator {
        TokenAuthenticator::new(api.client(), config).expect("authenticator")
    }

    fn short() -> TokenConfig {
        TokenConfig {
            cache_ttl: TTL,
            timeout: Duration::from_secs(5),
            ..TokenConfig::default()
        }
    }

    #[tokio::test]
    async fn reviews_in_flight_are_bounded_and_the_rest_wait_their_turn() {
        let api = token_api().await;
        api.set_delay(Duration::from_millis(50));
        let t = Arc::new(
            TokenAuthenticator::new(
                api.client(),
                TokenConfig {
                    max_in_flight: 3,
                    ..short()
                },
            )
            .expect("authenticator"),
        );
        let mut reviews = tokio::task::JoinSet::new();
        for i in 0..20 {
            let t = t.clone();
            reviews.spawn(async move { t.authenticate(&format!("good-user{i}")).await });
        }
        let mut authenticated = 0;
        while let Some(r) = reviews.join_next().await {
            let user = r.expect("task").expect("review").expect("authenticated");
            assert!(user.name.starts_with("user"));
            authenticated += 1;
        }
        assert_eq!(authenticated, 20);
        assert_eq!(api.token_reviews(), 20);
        // Never more than the bound, and the bound used (20 reviews of 50 ms each).
        assert_eq!(api.most_in_flight(), 3);
    }

    #[tokio::test]
    async fn a_look_up_that_waits_too_long_for_a_place_is_turned_away_unsent() {
        let api = token_api().await;
        api.set_delay(Duration::from_millis(600));
        let t = Arc::new(tokens(
            &api,
            TokenConfig {
                max_in_flight: 1,
                queue_wait: Duration::from_millis(100),
                ..short()
            },
        ));
        let first = {
            let t = t.clone();
            tokio::spawn(async move { t.authenticate("good-first").await })
        };
        // The first holds the only place for 600 ms.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let waited = Instant::now();
        let second = t.authenticate("good-second").await;
        assert_eq!(
            second,
            Err(AuthnFailure::Busy {
                waiting: 1,
                after: Duration::from_millis(100)
            })
        );
        assert!(
            waited.elapsed() < Duration::from_millis(400),
            "turned away early"
        );
        let first = first.await.expect("task").expect("review");
        assert_eq!(first.map(|u| u.name), Some("first".into()));
        assert_eq!(
            api.token_reviews(),
            1,
            "the turned-away review was never sent"
        );
        // Not cached: once a place is free, the same token is reviewed.
        let again = t.authenticate("good-second").await.expect("review");
        assert_eq!(again.map(|u| u.name), Some("second".into()));
        assert_eq!(api.token_reviews(), 2);
        assert_eq!(t.metrics().errors, 1);
    }

    #[tokio::test]
    async fn a_reviewed_token_is_cached_until_its_ttl() {
        let api = token_api().await;
        let t = tokens(&api, short());
        let user = t.authenticate("good-alice").await.expect("review");
        let expected = UserInfo {
            name: "alice".into(),
            uid: Some("uid-1".into()),
            groups: vec!["team".into()],
            extra: BTreeMap::from([("scopes".into(), vec!["a".into(), "b".into()])]),
        };
        assert_eq!(user, Some(expected.clone()));
        assert_eq!(
            t.authenticate("good-alice").await,
            Ok(Some(expected.clone()))
        );
        assert_eq!(api.token_reviews(), 1, "second look-up from the cache");
        // The request carried the token and no audiences.
        let specs = api.specs().await;
        assert_eq!(specs[0].0, TOKEN_REVIEWS);
        assert_eq!(specs[0].1, json!({"token": "good-alice"}));
        tokio::time::sleep(TTL + Duration::from_millis(50)).await;
        assert_eq!(t.authenticate("good-alice").await, Ok(Some(expected)));
        assert_eq!(api.token_reviews(), 2, "expired: reviewed again");
        let m = t.metrics();
        assert_eq!((m.hits, m.misses, m.errors), (1, 2, 0));
    }

    #[tokio::test]
    async fn unauthenticated_answers_are_cached_errors_are_not() {
        let api = token_api().await;
        let t = tokens(&api, short());
        assert_eq!(t.authenticate("bad").await, Ok(None));
        assert_eq!(t.authenticate("bad").await, Ok(None));
        assert_eq!(api.token_reviews(), 1);
        let rejected = Err(AuthnFailure::Rejected {
            reason: "token expired".into(),
        });
        assert_eq!(t.authenticate("error").await, rejected);
        assert_eq!(t.authenticate("error").await, rejected);
        assert_eq!(api.token_reviews(), 3, "status.error is not cached");
        assert_eq!(t.authenticate("").await, Ok(None));
        assert_eq!(api.token_reviews(), 3, "empty tokens are not reviewed");
        assert_eq!(t.metrics().errors, 2);
    }

    #[tokio::test]
    async fn audiences_are_asked_for_and_checked() {
        let api = token_api().await;
        let t = tokens(
            &api,
            TokenConfig {
                audiences: vec!["kpulse".into()],
                ..short()
            },
        );
        // Answers naming no audience count as ours.
        assert!(t.authenticate("good-bob").await.expect("review").is_some());
        // An answer for other audiences only is not ours.
        assert_eq!(t.authenticate("aud").await, Ok(None));
        let specs = api.specs().await;
        assert_eq!(
            specs[0].1,
            json!({"token": "good-bob", "audiences": ["kpulse"]})
        );
    }

    #[tokio::test]
    async fn concurrent_look_ups_share_one_review() {
        let api = token_api().await;
        api.set_delay(Duration::from_millis(200));
        let t = Arc::new(tokens(&api, short()));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let t = t.clone();
            tasks.push(tokio::spawn(
                async move { t.authenticate("good-carol").await },
            ));
        }
        for task in tasks {
            let user = task.await.expect("task").expect("review").expect("user");
            assert_eq!(user.name, "carol");
        }
        assert_eq!(api.token_reviews(), 1);
        let m = t.metrics();
        assert_eq!(m.misses + m.coalesced + m.hits, 8);
        assert_eq!(m.misses, 1);
    }

    #[tokio::test]
    async fn the_cache_is_bounded_oldest_first() {
        let api = token_api().await;
        let t = tokens(
            &api,
            TokenConfig {
                cache_size: 2,
                cache_ttl: Duration::from_secs(60),
                ..short()
            },
        );
        for name in ["good-a", "good-b", "good-c"] {
            t.authenticate(name).await.expect("review");
        }
        assert_eq!(t.metrics().evictions, 1);
        t.authenticate("good-c").await.expect("review");
        t.authenticate("good-b").await.expect("review");
        assert_eq!(api.token_reviews(), 3, "b and c still cached");
        t.authenticate("good-a").await.expect("review");
        assert_eq!(api.token_reviews(), 4, "a was evicted");
    }

    #[tokio::test]
    async fn an_unreachable_api_fails_closed_but_cached_answers_last_their_ttl() {
        let mut api = token_api().await;
        let t = tokens(&api, short());
        assert!(t.authenticate("good-dave").await.expect("review").is_some());
        assert_eq!(t.authenticate("bad").await, Ok(None));
        api.stop().await;
        assert!(matches!(
            t.authenticate("good-erin").await,
            Err(AuthnFailure::Review { .. })
        ));
        assert!(t.authenticate("good-dave").await.expect("cached").is_some());
        assert_eq!(t.authenticate("bad").await, Ok(None), "cached");
        tokio::time::sleep(TTL + Duration::from_millis(50)).await;
        let e = t.authenticate("good-dave").await.expect_err("expired");
        assert!(matches!(e, AuthnFailure::Review { .. }), "{e:?}");
        assert!(!e.to_string().contains("good-dave"), "{e}");
        assert_eq!(t.metrics().errors, 2);
    }

    #[tokio::test]
    async fn slow_reviews_time_out() {
        let api = token_api().await;
        api.set_delay(Duration::from_millis(500));
        let t = tokens(
            &api,
            TokenConfig {
                timeout: Duration::from_millis(100),
                ..short()
            },
        );
        assert_eq!(
            t.authenticate("good-frank").await,
            Err(AuthnFailure::Timeout {
                after: Duration::from_millis(100)
            })
        );
    }

    #[tokio::test]
    async fn api_errors_are_failures() {
        let api = FakeApi::start(|_, _| {
            (
                403,
                json!({
                    "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
                    "reason": "Forbidden",
                    "message": "tokenreviews.authentication.k8s.io is forbidden",
                }),
            )
        })
        .await;
        let t = tokens(&api, short());
        let e = t.authenticate("good-gina").await.expect_err("403");
        assert_eq!(
            e,
            AuthnFailure::Review {
                reason: "403 Forbidden: tokenreviews.authentication.k8s.io is forbidden".into()
            }
        );
        assert!(!format!("{e:?}{t:?}").contains("good-gina"));
    }

    #[test]
    fn cache_keys_are_keyed_hashes() {
        let k = CacheKeyer::new().expect("keyer");
        let other = CacheKeyer::new().expect("keyer");
        let a = k.key("secret", &[]);
        assert_eq!(a, k.key("secret", &[]));
        assert_ne!(a, other.key("secret", &[]), "random key per process");
        assert_ne!(a, k.key("secret", &["x".into()]));
        assert_ne!(k.key("ab", &["c".into()]), k.key("a", &["bc".into()]));
        assert!(!a.windows(6).any(|w| w == b"secret"));
    }

    #[test]
    fn ttl_cache_expires_and_bounds() {
        let mut c = TtlCache::new(2);
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        assert_eq!(c.insert("a", 1, ttl, t0), 0);
        assert_eq!(c.insert("b", 2, ttl, t0), 0);
        assert_eq!(c.insert("a", 3, ttl, t0), 0, "replacing is not growing");
        assert_eq!(c.insert("c", 4, ttl, t0), 1, "b is the oldest");
        assert_eq!(c.get(&"b", t0), None);
        assert_eq!(c.get(&"a", t0), Some(3));
        assert_eq!(c.get(&"a", t0 + ttl), None, "expired");
        assert_eq!(c.insert("d", 5, Duration::ZERO, t0), 0);
        assert_eq!(c.get(&"d", t0), None, "zero TTL is not cached");
        for i in 0..100 {
            c.insert("e", i, ttl, t0);
        }
        assert!(
            c.order.len() <= 2 * 2 + 16,
            "stale order items are compacted"
        );
        assert!(c.len() <= 2);
    }

    // --- authorization ---------------------------------------------------------------

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.into(),
            uid: Some("u-42".into()),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            extra: BTreeMap::from([("scopes".into(), vec!["x".into()])]),
        }
    }

    fn list_pods(ns: &str) -> RequestAttributes<'_> {
        RequestAttributes {
            verb: "list",
            resource_request: true,
            api_group: GROUP,
            resource: "pods",
            namespace: ns,
            ..RequestAttributes::default()
        }
    }

    fn get_path(path: &str) -> RequestAttributes<'_> {
        RequestAttributes {
            verb: "get",
            path,
            ..RequestAttributes::default()
        }
    }

    /// Users: `alice` allowed; `bob` explicitly denied; `carol` no opinion with a reason;
    /// `dave` no opinion; `erin` both allowed and denied.
    async fn access_api() -> FakeApi {
        FakeApi::start(|_, spec| {
            let status = match spec["user"].as_str().unwrap_or("") {
                "alice" => json!({"allowed": true, "reason": "RBAC: allowed"}),
                "bob" => json!({"allowed": false, "denied": true, "reason": "blocked"}),
                "carol" => json!({"allowed": false, "reason": "no rule"}),
                "erin" => json!({"allowed": true, "denied": true}),
                _ => json!({"allowed": false}),
            };
            (201, status)
        })
        .await
    }

    fn authorizer(api: &FakeApi, config: AuthorizerConfig) -> Authorizer {
        Authorizer::new(api.client(), config).expect("authorizer")
    }

    fn short_authz() -> AuthorizerConfig {
        AuthorizerConfig {
            allow_ttl: TTL,
            deny_ttl: Duration::from_millis(100),
            timeout: Duration::from_secs(5),
            ..AuthorizerConfig::default()
        }
    }

    #[tokio::test]
    async fn resource_requests_are_reviewed_and_cached() {
        let api = access_api().await;
        let a = authorizer(&api, short_authz());
        let alice = user("alice", &["team", "system:authenticated"]);
        let req = Attributes::new(
            &alice,
            RequestAttributes {
                verb: "get",
                name: "web-0",
                ..list_pods("team-a")
            },
            "v1beta1",
        );
        assert_eq!(req.request().user, "alice");
        assert_eq!(a.authorize(&req).await, Decision::Allow);
        assert_eq!(a.authorize(&req).await, Decision::Allow);
        assert_eq!(api.access_reviews(), 1);
        let specs = api.specs().await;
        assert_eq!(specs[0].0, ACCESS_REVIEWS);
        assert_eq!(
            specs[0].1,
            json!({
                "user": "alice",
                "uid": "u-42",
                "groups": ["team", "system:authenticated"],
                "extra": {"scopes": ["x"]},
                "resourceAttributes": {
                    "verb": "get",
                    "group": "metrics.k8s.io",
                    "version": "v1beta1",
                    "resource": "pods",
                    "namespace": "team-a",
                    "name": "web-0",
                },
            })
        );
        // Another namespace is another question.
        let other = Attributes::new(&alice, list_pods("team-b"), "v1beta1");
        assert_eq!(a.authorize(&other).await, Decision::Allow);
        assert_eq!(api.access_reviews(), 2);
        tokio::time::sleep(TTL + Duration::from_millis(50)).await;
        assert_eq!(a.authorize(&req).await, Decision::Allow);
        assert_eq!(api.access_reviews(), 3, "allowed TTL expired");
    }

    #[tokio::test]
    async fn non_resource_requests_send_path_and_verb() {
        let api = access_api().await;
        let a = authorizer(&api, short_authz());
        let alice = user("alice", &[]);
        let req = Attributes::new(&alice, get_path("/metrics"), "");
        assert_eq!(a.authorize(&req).await, Decision::Allow);
        let specs = api.specs().await;
        assert_eq!(
            specs[0].1,
            json!({
                "user": "alice",
                "uid": "u-42",
                "extra": {"scopes": ["x"]},
                "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
            })
        );
    }

    #[tokio::test]
    async fn denials_carry_the_reason_as_the_apiserver_words_it() {
        let api = access_api().await;
        let a = authorizer(&api, short_authz());
        let cases = [
            ("bob", Decision::Deny("blocked".into())),
            (
                "carol",
                Decision::Deny("kubernetes.io/webhook: no rule".into()),
            ),
            ("dave", Decision::Deny(String::new())),
            (
                "erin",
                Decision::Error(
                    "webhook subject access review returned both allow and deny response".into(),
                ),
            ),
        ];
        for (name, expected) in cases {
            let u = user(name, &[]);
            let req = Attributes::new(&u, list_pods(""), "v1beta1");
            assert_eq!(a.authorize(&req).await, expected, "{name}");
        }
        // The 403 body for dave.
        let dave = user("dave", &[]);
        let req = Attributes::new(&dave, list_pods("ns"), "v1beta1");
        let Decision::Deny(reason) = a.authorize(&req).await else {
            panic!("denied");
        };
        assert_eq!(
            Status::forbidden(req.request(), &reason)
                .0
                .message
                .as_deref(),
            Some(
                "pods.metrics.k8s.io is forbidden: User \"dave\" cannot list resource \"pods\" \
                 in API group \"metrics.k8s.io\" in the namespace \"ns\""
            )
        );
    }

    #[tokio::test]
    async fn denials_use_their_own_ttl() {
        let api = access_api().await;
        let a = authorizer(&api, short_authz());
        let dave = user("dave", &[]);
        let alice = user("alice", &[]);
        let deny = Attributes::new(&dave, list_pods(""), "v1beta1");
        let allow = Attributes::new(&alice, list_pods(""), "v1beta1");
        a.authorize(&deny).await;
        a.authorize(&allow).await;
        assert_eq!(api.access_reviews(), 2);
        tokio::time::sleep(Duration::from_millis(150)).await;
        a.authorize(&deny).await;
        a.authorize(&allow).await;
        assert_eq!(
            api.access_reviews(),
            3,
            "the denial expired, the allowance did not"
        );
    }

    #[tokio::test]
    async fn privileged_groups_and_paths_need_no_review() {
        let api = access_api().await;
        let a = authorizer(
            &api,
            AuthorizerConfig {
                always_allow_paths: vec![
                    "/healthz".into(),
                    "/readyz".into(),
                    "/livez".into(),
                    "/debug/*".into(),
                ],
                ..short_authz()
            },
        );
        let admin = user("root", &[PRIVILEGED_GROUP]);
        let nobody = user("dave", &[]);
        for req in [
            Attributes::new(&admin, list_pods(""), "v1beta1"),
            Attributes::new(&admin, get_path("/metrics"), ""),
            Attributes::new(&nobody, get_path("/healthz"), ""),
            Attributes::new(&nobody, get_path("/livez"), ""),
            Attributes::new(&nobody, get_path("/debug/pprof/heap"), ""),
        ] {
            assert_eq!(a.authorize(&req).await, Decision::Allow, "{req:?}");
        }
        assert_eq!(api.access_reviews(), 0);
        // Not a prefix match without a star; resource requests never match paths.
        let sub = Attributes::new(&nobody, get_path("/healthz/ping"), "");
        assert_eq!(a.authorize(&sub).await, Decision::Deny(String::new()));
        assert_eq!(api.access_reviews(), 1);
        assert_eq!(
            Authorizer::new(
                api.client(),
                AuthorizerConfig {
                    always_allow_paths: vec!["/a*b".into()],
                    ..AuthorizerConfig::default()
                }
            )
            .err(),
            Some(ConfigError::PathPattern {
                path: "/a*b".into()
            })
        );
    }

    #[tokio::test]
    async fn an_unreachable_api_fails_closed_but_cached_decisions_last_their_ttl() {
        let mut api = access_api().await;
        let a = authorizer(
            &api,
            AuthorizerConfig {
                deny_ttl: TTL,
                ..short_authz()
            },
        );
        let alice = user("alice", &[]);
        let bob = user("bob", &[]);
        let allowed = Attributes::new(&alice, list_pods(""), "v1beta1");
        let denied = Attributes::new(&bob, list_pods(""), "v1beta1");
        assert!(a.authorize(&allowed).await.is_allowed());
        assert_eq!(a.authorize(&denied).await, Decision::Deny("blocked".into()));
        api.stop().await;
        let fresh = Attributes::new(&alice, list_pods("elsewhere"), "v1beta1");
        let Decision::Error(msg) = a.authorize(&fresh).await else {
            panic!("fails closed");
        };
        assert!(msg.starts_with("SubjectAccessReview failed: "), "{msg}");
        assert_eq!(a.authorize(&allowed).await, Decision::Allow, "cached");
        assert_eq!(a.authorize(&denied).await, Decision::Deny("blocked".into()));
        tokio::time::sleep(TTL + Duration::from_millis(50)).await;
        assert!(matches!(a.authorize(&allowed).await, Decision::Error(_)));
        assert!(matches!(a.authorize(&denied).await, Decision::Error(_)));
        assert_eq!(a.metrics().errors, 3);
    }

    #[tokio::test]
    async fn oversized_attributes_are_not_cached() {
        let api = access_api().await;
        let a = authorizer(&api, short_authz());
        let alice = user("alice", &[]);
        let long = "x".repeat(10_000);
        let req = Attributes::new(
            &alice,
            RequestAttributes {
                name: &long,
                ..list_pods("")
            },
            "v1beta1",
        );
        a.authorize(&req).await;
        a.authorize(&req).await;
        assert_eq!(api.access_reviews(), 2);
    }

    #[test]
    fn internal_errors_are_worded_like_the_apiserver() {
        assert_eq!(
            internal_error_body(
                "/apis/metrics.k8s.io/v1beta1/nodes?x=<y>",
                "SubjectAccessReview failed: connection refused"
            ),
            "Internal Server Error: \"/apis/metrics.k8s.io/v1beta1/nodes?x=&lt;y&gt;\": \
             SubjectAccessReview failed: connection refused\n"
        );
    }

    #[test]
    fn reviews_omit_empty_fields() {
        let anonymous = UserInfo {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            ..UserInfo::default()
        };
        let r = Attributes::new(&anonymous, get_path("/apis"), "").review();
        let v: Value = serde_json::to_value(&r.spec).expect("json");
        assert_eq!(
            v,
            json!({
                "user": "system:anonymous",
                "groups": ["system:unauthenticated"],
                "nonResourceAttributes": {"path": "/apis", "verb": "get"},
            })
        );
    }
}
