//! Agents' tokens verified here, without a TokenReview (`--agent-token-verification=local`,
//! the default): the signature against the cluster's service account issuer keys, and
//! the pod the token is bound to against the agent pods this replica already watches.
//!
//! Every agent opens a stream to every replica, so a restarted replica used to send a
//! TokenReview per agent at once: at 5,000 nodes about 5,000 reviews, some 30 s of
//! kube-apiserver's answers before the replica was complete again (docs/design/scale.md).
//! kube-apiserver publishes the keys it signs service account tokens with for exactly this
//! use (service account issuer discovery: `/.well-known/openid-configuration` and
//! `/openid/v1/jwks`); this module reads them through the Kubernetes API and makes the
//! checks kube-apiserver makes of a pod-bound token:
//!
//! 1. the signature, with a key of the issuer's set chosen by the token's key id, in an
//!    asymmetric algorithm of that key's family and the key's own algorithm (never HMAC),
//!    by `jsonwebtoken`;
//! 2. the issuer (the discovery document's, a string), an audience of
//!    `--agent-token-audience`, expiry, not-before and issued-at within [`LEEWAY`];
//! 3. the claims of a pod-bound token: `sub` is the service account the `kubernetes.io`
//!    claim names, which must be bound to a pod and name its node (kube-apiserver 1.30+;
//!    a review's answer names the node from that claim, and without one it is refused);
//! 4. that pod is one of the agent pods this replica watches (`--agent-namespace`,
//!    `--agent-selector`; listed, and the watch not failing), with the token's uid (a pod
//!    deleted and created again under the same name has another), not being deleted,
//!    running as the token's service account, on the node the token names.
//!
//! Nothing here refuses a token: whatever fails a check, or cannot be checked (no keys
//! yet, a key id not in the set, the pods not listed or their watch failing, a pod the
//! watch has not seen yet), goes to a TokenReview as before, so kube-apiserver stays the
//! judge of every token this module does not accept. A replica opens its agents' port only
//! once it can make these checks ([`LocalVerifier::can_check`]: keys, and the agent pods
//! listed), at most [`crate::ingest::PORT_WAIT`] after its start
//! ([`crate::ingest::listen_when`]): a restarted replica's agents reconnect as soon as it
//! listens, and before its first list of the agent pods every one of their tokens would be
//! reviewed. (The checks of the pods' state come first of all, before the signature, so a
//! replica that does not know its pods spends no crypto on tokens it will send to a
//! review anyway.)
//!
//! What it gives up against a review, stated in deploy/README.md: a pod deleted is noticed
//! when this replica's watch sees it (a review asks kube-apiserver's own state), the service
//! account's uid is not compared (its deletion is not watched; it does not delete the
//! pods), and a key the issuer stops publishing is trusted until the next successful fetch:
//! within [`REFRESH`] while fetches succeed, at most [`MAX_AGE`] while they fail. The keys
//! are fetched every [`REFRESH`], at once on an unknown key id (at most every
//! [`MIN_REFETCH`]), every [`MIN_REFETCH`] while none are usable, and not used once no
//! fetch has succeeded for [`MAX_AGE`].

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use arc_swap::ArcSwapOption;
use http_body_util::{BodyExt, Limited};
use jsonwebtoken::{
    jwk::{AlgorithmParameters, Jwk, JwkSet, KeyAlgorithm},
    Algorithm, DecodingKey, Validation,
};
use serde::Deserialize;

use crate::agents::AgentPods;

/// How often the issuer's keys are fetched again.
pub const REFRESH: Duration = Duration::from_secs(60);
/// The shortest time between two fetches (an unknown key id asks for one at once).
pub const MIN_REFETCH: Duration = Duration::from_secs(10);
/// Keys no fetch has confirmed for this long are not used.
pub const MAX_AGE: Duration = Duration::from_secs(600);
/// Time allowed for one fetch of both documents.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Clock skew allowed on `exp`, `nbf` and `iat`, in seconds.
pub const LEEWAY: u64 = 30;
/// The largest discovery document or key set read.
const MAX_DOCUMENT_BYTES: usize = 256 << 10;
/// kube-apiserver's service account issuer discovery paths.
pub const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
/// See [`DISCOVERY_PATH`].
pub const JWKS_PATH: &str = "/openid/v1/jwks";

/// Why a token was left to a TokenReview (`outcome` of
/// `kpulse_aggregator_ingest_local_token_checks_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Deferral {
    /// No keys (not fetched yet, or not for [`MAX_AGE`]).
    #[error("the service account issuer's keys are not known")]
    NoKeys,
    /// The token's key id is not in the key set (another issuer, or keys rotated since the
    /// last fetch).
    #[error("the token's key is not among the issuer's")]
    UnknownKey,
    /// The token failed a check of its signature or claims.
    #[error("the token does not verify against the issuer's keys and claims")]
    Invalid,
    /// The agent pods are not listed yet, or their watch is failing: the replica cannot
    /// tell which pods exist now.
    #[error("the agent pods are not known now (not listed yet, or their watch is failing)")]
    PodsUnknown,
    /// Not bound to an agent pod this replica knows, by name and uid, on the node the
    /// token names.
    #[error("the token is not bound to a known agent pod")]
    NotAnAgentPod,
}

impl Deferral {
    /// Every deferral.
    pub const ALL: [Deferral; 5] = [
        Deferral::NoKeys,
        Deferral::UnknownKey,
        Deferral::Invalid,
        Deferral::PodsUnknown,
        Deferral::NotAnAgentPod,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Deferral::NoKeys => "no_keys",
            Deferral::UnknownKey => "unknown_key",
            Deferral::Invalid => "invalid",
            Deferral::PodsUnknown => "pods_unknown",
            Deferral::NotAnAgentPod => "not_an_agent_pod",
        }
    }
}

/// A token accepted here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// `system:serviceaccount:<namespace>:<name>`.
    pub user: String,
    /// The node the token's pod runs on.
    pub node: String,
}

/// The issuer's keys, as last fetched.
#[derive(Debug)]
pub struct Keys {
    /// `issuer` of the discovery document: the tokens' `iss`.
    pub issuer: String,
    /// The key set.
    pub set: JwkSet,
    /// When they were fetched.
    pub fetched: Instant,
}

impl Keys {
    /// Whether a fetch confirmed them within [`MAX_AGE`] of `now`.
    fn usable_at(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.fetched) <= MAX_AGE
    }
}

/// Why the keys could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The request failed (unreachable, refused, timed out).
    #[error("GET {path}: {reason}")]
    Request {
        /// The path.
        path: &'static str,
        /// The client's error.
        reason: String,
    },
    /// kube-apiserver answered with an error status (403: the server's ServiceAccount may
    /// not read the issuer's keys).
    #[error("GET {path}: HTTP {status}")]
    Status {
        /// The path.
        path: &'static str,
        /// The status.
        status: http::StatusCode,
    },
    /// An unreadable or oversized answer.
    #[error("GET {path}: {reason}")]
    Document {
        /// The path.
        path: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// The claims read from an agent's token, beyond those `jsonwebtoken` validates.
#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
    /// A string, as kube-apiserver issues it (`jsonwebtoken` would also take an array).
    #[allow(dead_code)]
    iss: String,
    iat: Option<u64>,
    #[serde(rename = "kubernetes.io")]
    kubernetes: KubernetesClaims,
}

#[derive(Debug, Deserialize)]
struct KubernetesClaims {
    namespace: String,
    serviceaccount: ObjectRef,
    pod: Option<ObjectRef>,
    node: Option<ObjectRef>,
}

#[derive(Debug, Deserialize)]
struct ObjectRef {
    name: String,
    uid: String,
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
}

/// The checks of the module docs.
pub struct LocalVerifier {
    keys: ArcSwapOption<Keys>,
    /// Asks the fetch loop for a fetch now (an unknown key id).
    refetch: tokio::sync::Notify,
    agents: Arc<AgentPods>,
    namespace: String,
    audiences: Vec<String>,
}

impl std::fmt::Debug for LocalVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalVerifier")
            .field(
                "issuer",
                &self.keys.load().as_ref().map(|k| k.issuer.clone()),
            )
            .field("namespace", &self.namespace)
            .field("audiences", &self.audiences)
            .finish_non_exhaustive()
    }
}

impl LocalVerifier {
    /// A verifier of tokens for `audiences`, bound to the pods of `agents` (the pods of
    /// `namespace`), with no keys until [`Self::set_keys`] or [`Self::follow`].
    pub fn new(agents: Arc<AgentPods>, namespace: String, audiences: Vec<String>) -> Arc<Self> {
        Arc::new(LocalVerifier {
            keys: ArcSwapOption::empty(),
            refetch: tokio::sync::Notify::new(),
            agents,
            namespace,
            audiences,
        })
    }

    /// Replaces the keys.
    pub fn set_keys(&self, keys: Keys) {
        self.keys.store(Some(Arc::new(keys)));
    }

    /// Who `token` belongs to, if every check of the module docs passes; otherwise why it
    /// must be reviewed.
    ///
    /// # Errors
    ///
    /// The [`Deferral`]; an unknown key id also asks [`Self::follow`] for a fetch.
    pub fn verify(&self, token: &str) -> Result<Verified, Deferral> {
        self.verify_at(token, Instant::now())
    }

    /// Whether a token can be checked now: keys a fetch confirmed within [`MAX_AGE`], and
    /// the agent pods listed and watched ([`AgentPods::current`]). Until then every token
    /// is deferred to a review.
    pub fn can_check(&self) -> bool {
        self.has_usable_keys() && self.agents.current()
    }

    fn verify_at(&self, token: &str, now: Instant) -> Result<Verified, Deferral> {
        let keys = self.keys.load_full().ok_or(Deferral::NoKeys)?;
        if !keys.usable_at(now) {
            return Err(Deferral::NoKeys);
        }
        // Before the signature (no crypto while the pods are not known), and so before the
        // order of the module docs: a token then goes to a review, whatever it is.
        if !self.agents.current() {
            return Err(Deferral::PodsUnknown);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| Deferral::Invalid)?;
        let kid = header.kid.as_deref().ok_or(Deferral::UnknownKey)?;
        let Some(jwk) = keys.set.find(kid) else {
            self.refetch.notify_one();
            return Err(Deferral::UnknownKey);
        };
        if !algorithm_fits(jwk, header.alg) {
            return Err(Deferral::Invalid);
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|_| Deferral::Invalid)?;
        let mut validation = Validation::new(header.alg);
        validation.leeway = LEEWAY;
        validation.validate_nbf = true;
        validation.set_issuer(&[&keys.issuer]);
        validation.set_audience(&self.audiences);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let claims = jsonwebtoken::decode::<Claims>(token, &key, &validation)
            .map_err(|_| Deferral::Invalid)?
            .claims;
        // Issued in the future (beyond the skew): kube-apiserver's validator refuses it; a
        // review decides.
        if claims
            .iat
            .is_some_and(|iat| iat > jsonwebtoken::get_current_timestamp() + LEEWAY)
        {
            return Err(Deferral::Invalid);
        }
        self.bound_pod(&claims)
    }

    /// Steps 3 and 4 of the module docs.
    fn bound_pod(&self, claims: &Claims) -> Result<Verified, Deferral> {
        let k = &claims.kubernetes;
        let user = format!(
            "system:serviceaccount:{}:{}",
            k.namespace, k.serviceaccount.name
        );
        if claims.sub != user {
            return Err(Deferral::Invalid);
        }
        let pod = k.pod.as_ref().ok_or(Deferral::NotAnAgentPod)?;
        // The node claim (kube-apiserver 1.30+): a TokenReview's node-name extra comes from
        // it, and without it a review's answer is refused (`Identity::authorize`), so a
        // token without one is left to the review here too.
        let claimed_node = k.node.as_ref().ok_or(Deferral::NotAnAgentPod)?;
        if k.namespace != self.namespace {
            return Err(Deferral::NotAnAgentPod);
        }
        let node = self
            .agents
            .get(&pod.name, |p| {
                (p.uid == pod.uid && !p.deleting && p.service_account == k.serviceaccount.name)
                    .then(|| p.node.clone())
                    .flatten()
            })
            .flatten()
            .ok_or(Deferral::NotAnAgentPod)?;
        if claimed_node.name != node {
            return Err(Deferral::NotAnAgentPod);
        }
        Ok(Verified { user, node })
    }

    /// Fetches the issuer's keys through `client` now, every [`REFRESH`], and when a token
    /// names an unknown key (at most every [`MIN_REFETCH`]). Never returns. Failures are
    /// logged at WARN (tokens then go to TokenReviews) and tried again at the next turn.
    pub async fn follow(self: Arc<Self>, client: kube::Client) {
        // The first failure of a spell at WARN, the rest at DEBUG; keys given up once.
        let mut failing = false;
        let mut expired = false;
        loop {
            let started = Instant::now();
            let error = match tokio::time::timeout(FETCH_TIMEOUT, fetch(&client)).await {
                Ok(Ok(keys)) => {
                    if failing || self.keys.load().is_none() {
                        tracing::info!(
                            issuer = %keys.issuer,
                            keys = keys.set.keys.len(),
                            "service account issuer keys fetched: agents' tokens are verified \
                             here, TokenReviews only for those that do not verify"
                        );
                    }
                    failing = false;
                    expired = false;
                    self.set_keys(keys);
                    None
                }
                Ok(Err(error)) => Some(error.to_string()),
                Err(_) => Some(format!("timed out after {FETCH_TIMEOUT:?}")),
            };
            if let Some(error) = error {
                if failing {
                    tracing::debug!(%error, "still cannot read the service account issuer's keys");
                } else {
                    tracing::warn!(
                        %error,
                        "cannot read the service account issuer's keys (needs get on \
                         {DISCOVERY_PATH} and {JWKS_PATH}); tokens go to TokenReviews when \
                         no keys are known, the last ones are used for at most {MAX_AGE:?}"
                    );
                }
                failing = true;
                let stale = self
                    .keys
                    .load()
                    .as_ref()
                    .is_some_and(|k| !k.usable_at(Instant::now()));
                if stale && !expired {
                    tracing::warn!(
                        "the service account issuer's keys were last read over {MAX_AGE:?} \
                         ago: no longer used; agents' tokens go to TokenReviews"
                    );
                    expired = true;
                }
            }
            // Without usable keys, try again soon; with them, at the refresh or an unknown
            // key id, whichever comes first.
            if !self.has_usable_keys() {
                tokio::time::sleep(MIN_REFETCH).await;
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(REFRESH) => {}
                () = self.refetch.notified() => {}
            }
            tokio::time::sleep(MIN_REFETCH.saturating_sub(started.elapsed())).await;
        }
    }

    fn has_usable_keys(&self) -> bool {
        self.keys
            .load()
            .as_ref()
            .is_some_and(|k| k.usable_at(Instant::now()))
    }
}

/// Whether a token signed with `alg` may be checked with `jwk`: an asymmetric algorithm of
/// the key's family (never HMAC, whose secret would be the public key), and the key's own
/// algorithm where it names one (kube-apiserver's keys do).
fn algorithm_fits(jwk: &Jwk, alg: Algorithm) -> bool {
    let family = matches!(
        (&jwk.algorithm, alg),
        (
            AlgorithmParameters::RSA(_),
            Algorithm::RS256
                | Algorithm::RS384
                | Algorithm::RS512
                | Algorithm::PS256
                | Algorithm::PS384
                | Algorithm::PS512,
        ) | (
            AlgorithmParameters::EllipticCurve(_),
            Algorithm::ES256 | Algorithm::ES384
        )
    );
    let named = match jwk.common.key_algorithm {
        None => return family,
        Some(KeyAlgorithm::RS256) => Algorithm::RS256,
        Some(KeyAlgorithm::RS384) => Algorithm::RS384,
        Some(KeyAlgorithm::RS512) => Algorithm::RS512,
        Some(KeyAlgorithm::PS256) => Algorithm::PS256,
        Some(KeyAlgorithm::PS384) => Algorithm::PS384,
        Some(KeyAlgorithm::PS512) => Algorithm::PS512,
        Some(KeyAlgorithm::ES256) => Algorithm::ES256,
        Some(KeyAlgorithm::ES384) => Algorithm::ES384,
        Some(_) => return false,
    };
    family && named == alg
}

/// GETs `path` from kube-apiserver, at most [`MAX_DOCUMENT_BYTES`], as JSON.
async fn get_json<T: serde::de::DeserializeOwned>(
    client: &kube::Client,
    path: &'static str,
) -> Result<T, FetchError> {
    let request = http::Request::get(path)
        .body(kube::client::Body::empty())
        .map_err(|e| FetchError::Request {
            path,
            reason: e.to_string(),
        })?;
    let response = client
        .send(request)
        .await
        .map_err(|e| FetchError::Request {
            path,
            reason: e.to_string(),
        })?;
    if !response.status().is_success() {
        return Err(FetchError::Status {
            path,
            status: response.status(),
        });
    }
    let body = Limited::new(response.into_body(), MAX_DOCUMENT_BYTES)
        .collect()
        .await
        .map_err(|e| FetchError::Document {
            path,
            reason: format!("reading it: {e} (at most {MAX_DOCUMENT_BYTES} bytes)"),
        })?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| FetchError::Document {
        path,
        reason: e.to_string(),
    })
}

/// The issuer and its keys, through the Kubernetes API.
///
/// # Errors
///
/// [`FetchError`]; a key set without a usable key is a [`FetchError::Document`].
pub async fn fetch(client: &kube::Client) -> Result<Keys, FetchError> {
    #[derive(Deserialize)]
    struct RawSet {
        keys: Vec<serde_json::Value>,
    }
    let discovery: Discovery = get_json(client, DISCOVERY_PATH).await?;
    let raw: RawSet = get_json(client, JWKS_PATH).await?;
    // Each key on its own: one this crate cannot read (a P-521 key, an algorithm it does not
    // know) is left out, not the whole set.
    let set = JwkSet {
        keys: raw
            .keys
            .into_iter()
            .filter_map(|k| serde_json::from_value::<Jwk>(k).ok())
            .collect(),
    };
    if !set.keys.iter().any(|k| {
        k.common.key_id.is_some()
            && matches!(
                k.algorithm,
                AlgorithmParameters::RSA(_) | AlgorithmParameters::EllipticCurve(_)
            )
    }) {
        return Err(FetchError::Document {
            path: JWKS_PATH,
            reason: "no RSA or EC key with a key id".into(),
        });
    }
    Ok(Keys {
        issuer: discovery.issuer,
        set,
        fetched: Instant::now(),
    })
}

#[cfg(test)]
pub(crate) mod testing {
    //! Tokens signed as kube-apiserver signs them, with a key of our own.

    use super::*;
    use crate::agents::AgentPod;
    use crate::watched::Change;
    use base64::Engine;
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    use serde_json::{json, Value};
    use std::collections::BTreeMap;

    pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
    pub const SA: &str = "system:serviceaccount:kpulse-system:kpulse-agent";

    pub struct Signer {
        pair: EcdsaKeyPair,
        kid: &'static str,
    }

    pub fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    impl Signer {
        pub fn new(kid: &'static str) -> Signer {
            let rng = ring::rand::SystemRandom::new();
            let pkcs8 =
                EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
            let pair =
                EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
                    .expect("pair");
            Signer { pair, kid }
        }

        /// The public key as kube-apiserver publishes an EC key.
        pub fn jwk(&self) -> Value {
            let point = self.pair.public_key().as_ref();
            json!({
                "use": "sig", "kty": "EC", "kid": self.kid, "crv": "P-256", "alg": "ES256",
                "x": b64(&point[1..33]), "y": b64(&point[33..65]),
            })
        }

        pub fn sign(&self, header: &Value, claims: &Value) -> String {
            let message = format!(
                "{}.{}",
                b64(header.to_string().as_bytes()),
                b64(claims.to_string().as_bytes())
            );
            let rng = ring::rand::SystemRandom::new();
            let signature = self.pair.sign(&rng, message.as_bytes()).expect("sign");
            format!("{message}.{}", b64(signature.as_ref()))
        }

        pub fn token(&self, claims: &Value) -> String {
            self.sign(
                &json!({"alg": "ES256", "kid": self.kid, "typ": "JWT"}),
                claims,
            )
        }
    }

    pub fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    /// The claims of a projected token of pod `agent-1` (uid `u-1`) on node `n1`, as
    /// kube-apiserver 1.32+ issues them.
    pub fn claims() -> Value {
        json!({
            "aud": ["kpulse"], "exp": now() + 3600, "iat": now(), "nbf": now(),
            "iss": ISSUER, "jti": "j", "sub": SA,
            "kubernetes.io": {
                "namespace": "kpulse-system",
                "node": {"name": "n1", "uid": "node-uid"},
                "pod": {"name": "agent-1", "uid": "u-1"},
                "serviceaccount": {"name": "kpulse-agent", "uid": "sa-uid"},
                "warnafter": now() + 3000,
            },
        })
    }

    pub fn agent(uid: &str, node: &str) -> AgentPod {
        AgentPod {
            uid: uid.into(),
            node: Some(node.into()),
            service_account: "kpulse-agent".into(),
            ready: false,
            deleting: false,
        }
    }

    pub fn verifier(signer: &Signer) -> Arc<LocalVerifier> {
        let agents = AgentPods::new();
        agents.apply(Change::Replace(BTreeMap::from([(
            "agent-1".to_string(),
            agent("u-1", "n1"),
        )])));
        let v = LocalVerifier::new(agents, "kpulse-system".into(), vec!["kpulse".into()]);
        v.set_keys(Keys {
            issuer: ISSUER.into(),
            set: serde_json::from_value(json!({"keys": [signer.jwk()]})).expect("set"),
            fetched: Instant::now(),
        });
        v
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use crate::agents::AgentPod;
    use crate::auth::delegated::testing::FakeApi;
    use crate::watched::Change;
    use serde_json::{json, Value};

    fn with(mut claims: Value, path: &[&str], value: Value) -> Value {
        let mut at = &mut claims;
        for p in &path[..path.len() - 1] {
            at = &mut at[*p];
        }
        match value {
            Value::Null => {
                at.as_object_mut()
                    .expect("object")
                    .remove(path[path.len() - 1]);
            }
            v => at[path[path.len() - 1]] = v,
        }
        claims
    }

    #[test]
    fn a_pod_bound_agent_token_is_accepted_for_the_pods_node() {
        let s = Signer::new("k1");
        let v = verifier(&s);
        assert_eq!(
            v.verify(&s.token(&claims())),
            Ok(Verified {
                user: SA.into(),
                node: "n1".into()
            })
        );
        // A pod not yet Ready is an agent still: its first stream comes before readiness.
        // Without the node claim (kube-apiserver before 1.30), a review decides (and, its
        // answer naming no node, refuses).
        let older = with(claims(), &["kubernetes.io", "node"], Value::Null);
        assert_eq!(v.verify(&s.token(&older)), Err(Deferral::NotAnAgentPod));
    }

    #[test]
    fn checks_can_be_made_with_fresh_keys_and_the_pods_watched() {
        let s = Signer::new("k1");
        let v = verifier(&s);
        assert!(v.can_check());
        v.agents.set_relisting(true);
        assert!(!v.can_check(), "pods re-listed");
        v.agents.set_relisting(false);
        assert!(v.can_check());
        v.keys.store(None);
        assert!(!v.can_check(), "no keys");
        v.set_keys(Keys {
            issuer: ISSUER.into(),
            set: serde_json::from_value(json!({"keys": [s.jwk()]})).expect("set"),
            fetched: Instant::now()
                .checked_sub(MAX_AGE + Duration::from_secs(1))
                .expect("a monotonic clock past MAX_AGE"),
        });
        assert!(!v.can_check(), "keys too old");
    }

    #[test]
    fn pods_not_listed_or_not_watched_go_to_a_review() {
        let s = Signer::new("k1");
        let v = verifier(&s);
        let token = s.token(&claims());
        v.agents.set_relisting(true);
        assert_eq!(v.verify(&token), Err(Deferral::PodsUnknown));
        v.agents.set_relisting(false);
        assert!(v.verify(&token).is_ok());
        let unlisted = LocalVerifier::new(
            AgentPods::new(),
            "kpulse-system".into(),
            vec!["kpulse".into()],
        );
        unlisted.set_keys(Keys {
            issuer: ISSUER.into(),
            set: serde_json::from_value(json!({"keys": [s.jwk()]})).expect("set"),
            fetched: Instant::now(),
        });
        assert_eq!(unlisted.verify(&token), Err(Deferral::PodsUnknown));
        assert!(
            !unlisted.can_check(),
            "pods never listed: the agents' port stays closed"
        );
    }

    #[test]
    fn signature_issuer_audience_and_time_are_checked() {
        let s = Signer::new("k1");
        let v = verifier(&s);
        let token = s.token(&claims());
        let (rest, _) = token.rsplit_once('.').expect("three parts");
        let forged = format!("{rest}.{}", b64(&[0; 64]));
        assert_eq!(v.verify(&forged), Err(Deferral::Invalid), "bad signature");
        // The same key id, another key.
        let other = Signer::new("k1");
        assert_eq!(v.verify(&other.token(&claims())), Err(Deferral::Invalid));
        for (path, value) in [
            (&["iss"][..], json!("https://elsewhere")),
            (&["aud"], json!(["kube-apiserver"])),
            (&["exp"], json!(now() - LEEWAY - 5)),
            (&["nbf"], json!(now() + LEEWAY + 60)),
            (&["exp"], Value::Null),
            (&["iss"], Value::Null),
            (&["aud"], Value::Null),
            (&["iss"], json!([ISSUER])),
            (&["iat"], json!(now() + LEEWAY + 60)),
        ] {
            let bad = with(claims(), path, value.clone());
            assert_eq!(
                v.verify(&s.token(&bad)),
                Err(Deferral::Invalid),
                "{path:?} = {value}"
            );
        }
        // Within the leeway.
        let late = with(claims(), &["exp"], json!(now() - LEEWAY / 2));
        assert!(v.verify(&s.token(&late)).is_ok());
        assert_eq!(v.verify("not a token"), Err(Deferral::Invalid));
    }

    #[test]
    fn only_an_asymmetric_algorithm_of_the_keys_family() {
        let s = Signer::new("k1");
        let v = verifier(&s);
        // An HMAC over the token with the public key as the secret: the classic confusion.
        // ES384 is of the key's family, but the key names ES256.
        for alg in ["HS256", "RS256", "PS256", "ES384", "none"] {
            let t = s.sign(&json!({"alg": alg, "kid": "k1"}), &claims());
            assert_eq!(v.verify(&t), Err(Deferral::Invalid), "{alg}");
        }
    }

    #[test]
    fn unknown_keys_and_missing_keys_go_to_a_review() {
        let s = Signer::new("k1");
        let v = verifier(&s);
        let rotated = Signer::new("k2");
        assert_eq!(
            v.verify(&rotated.token(&claims())),
            Err(Deferral::UnknownKey)
        );
        let no_kid = s.sign(&json!({"alg": "ES256"}), &claims());
        assert_eq!(v.verify(&no_kid), Err(Deferral::UnknownKey));
        // Keys no fetch has confirmed for MAX_AGE are not used.
        let token = s.token(&claims());
        let later = Instant::now() + MAX_AGE + Duration::from_secs(1);
        assert_eq!(v.verify_at(&token, later), Err(Deferral::NoKeys));
        let empty = LocalVerifier::new(AgentPods::new(), "kpulse-system".into(), vec![]);
        assert_eq!(empty.verify(&token), Err(Deferral::NoKeys));
    }

    #[test]
    fn the_bound_pod_must_be_a_live_agent_pod_on_the_tokens_node() {
        let s = Signer::new("k1");
        let v = verifier(&s);
        let not = |claims: Value| {
            assert_eq!(
                v.verify(&s.token(&claims)),
                Err(Deferral::NotAnAgentPod),
                "{claims}"
            )
        };
        // Bound to no pod (a TokenRequest without a bound object, or bound to a Secret).
        not(with(claims(), &["kubernetes.io", "pod"], Value::Null));
        // Another pod, or the same name with another uid (deleted and created again).
        not(with(
            claims(),
            &["kubernetes.io", "pod", "name"],
            json!("agent-2"),
        ));
        not(with(
            claims(),
            &["kubernetes.io", "pod", "uid"],
            json!("u-old"),
        ));
        // A pod of that name in another namespace is not an agent.
        let elsewhere = with(claims(), &["kubernetes.io", "namespace"], json!("default"));
        not(with(
            elsewhere,
            &["sub"],
            json!("system:serviceaccount:default:kpulse-agent"),
        ));
        // The token names another node than the pod runs on.
        not(with(
            claims(),
            &["kubernetes.io", "node", "name"],
            json!("n2"),
        ));
        // sub disagreeing with the kubernetes.io claim.
        let other_sub = with(
            claims(),
            &["sub"],
            json!("system:serviceaccount:kpulse-system:other"),
        );
        assert_eq!(v.verify(&s.token(&other_sub)), Err(Deferral::Invalid));
        // Another service account than the pod runs as.
        let other_sa = with(
            with(
                claims(),
                &["kubernetes.io", "serviceaccount", "name"],
                json!("other"),
            ),
            &["sub"],
            json!("system:serviceaccount:kpulse-system:other"),
        );
        not(other_sa);
        // The pod being deleted, or not scheduled.
        for pod in [
            AgentPod {
                deleting: true,
                ..agent("u-1", "n1")
            },
            AgentPod {
                node: None,
                ..agent("u-1", "n1")
            },
        ] {
            v.agents.apply(Change::Upsert {
                name: "agent-1".into(),
                value: pod,
            });
            not(claims());
        }
    }

    #[tokio::test]
    async fn keys_are_read_through_the_kubernetes_api() {
        let s = Signer::new("k1");
        let jwks = json!({"keys": [s.jwk()]});
        let api = FakeApi::start(move |path, _| match path {
            DISCOVERY_PATH => (
                200,
                json!({"issuer": ISSUER, "jwks_uri": "https://x/openid/v1/jwks"}),
            ),
            JWKS_PATH => (200, jwks.clone()),
            _ => (404, json!({})),
        })
        .await;
        let keys = fetch(&api.client()).await.expect("keys");
        assert_eq!(keys.issuer, ISSUER);
        assert!(keys.set.find("k1").is_some());

        // A key this crate cannot read (P-521, ES512) is left out, not the whole set.
        let s2 = Signer::new("k2");
        let mixed = json!({"keys": [
            {"use": "sig", "kty": "EC", "kid": "p521", "crv": "P-521", "alg": "ES512",
             "x": "AA", "y": "AA"},
            s2.jwk(),
        ]});
        let api = FakeApi::start(move |path, _| match path {
            JWKS_PATH => (200, mixed.clone()),
            _ => (200, json!({"issuer": ISSUER})),
        })
        .await;
        let keys = fetch(&api.client()).await.expect("keys");
        assert_eq!(keys.set.keys.len(), 1);
        assert!(keys.set.find("k2").is_some());

        // Forbidden (the role not bound), an empty set, an oversized one: errors.
        let forbidden = FakeApi::start(|_, _| (403, json!({"kind": "Status"}))).await;
        let e = fetch(&forbidden.client()).await.expect_err("403");
        assert!(
            matches!(e, FetchError::Status { status, path: DISCOVERY_PATH } if status == 403),
            "{e}"
        );
        let empty = FakeApi::start(|path, _| match path {
            JWKS_PATH => (200, json!({"keys": []})),
            _ => (200, json!({"issuer": ISSUER})),
        })
        .await;
        let e = fetch(&empty.client()).await.expect_err("no keys");
        assert!(e.to_string().contains("no RSA or EC key"), "{e}");
        let huge = FakeApi::start(|path, _| match path {
            JWKS_PATH => (
                200,
                json!({"keys": [], "pad": "x".repeat(MAX_DOCUMENT_BYTES)}),
            ),
            _ => (200, json!({"issuer": ISSUER})),
        })
        .await;
        let e = fetch(&huge.client()).await.expect_err("too big");
        assert!(e.to_string().contains("at most"), "{e}");
    }

    #[test]
    fn deferrals_have_distinct_labels() {
        let labels: std::collections::BTreeSet<_> =
            Deferral::ALL.iter().map(|d| d.as_str()).collect();
        assert_eq!(labels.len(), Deferral::ALL.len());
        assert!(!labels.contains("accepted"));
    }
}
