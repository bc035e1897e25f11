//! The cluster's authentication settings for extension API servers: the
//! `kube-system/extension-apiserver-authentication` ConfigMap that kube-apiserver keeps
//! up to date (its cluster authentication trust controller). k8s.io/apiserver's
//! `DelegatingAuthenticationOptions` reads it through informers (dynamic CA content,
//! `RequestHeaderAuthRequestController`); [`follow`] does the same with a `kube` watcher on
//! that one ConfigMap and swaps the new settings into the [`Chain`], so a rotated
//! front-proxy or client CA is trusted without a restart.
//!
//! Which settings come from the ConfigMap is decided per part, as in
//! `DelegatingAuthenticationOptions.ApplyTo`: `--client-ca-file` given → the client CA is
//! that file's, *instead of* the ConfigMap's `client-ca-file`; `--requestheader-client-ca-file`
//! given → every request-header setting comes from the `--requestheader-*` flags, instead
//! of the ConfigMap's `requestheader-*` keys. A part without its flag follows the
//! ConfigMap (unless the lookup is skipped). See [`Follow`].
//!
//! Keys: `client-ca-file` and `requestheader-client-ca-file` are PEM;
//! `requestheader-allowed-names`, `requestheader-username-headers`,
//! `requestheader-uid-headers`, `requestheader-group-headers` and
//! `requestheader-extra-headers-prefix` are JSON arrays of strings (absent or empty = no
//! values, as the apiserver reads them).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{watcher, WatchStreamExt};

use super::{
    chain::{CaSources, Chain},
    requestheader,
    x509::{CaBundle, CaError},
};

/// The ConfigMap's namespace.
pub const NAMESPACE: &str = "kube-system";
/// The ConfigMap's name.
pub const NAME: &str = "extension-apiserver-authentication";

/// PEM: CAs for client-certificate authentication.
pub const CLIENT_CA_KEY: &str = "client-ca-file";
/// PEM: CAs for the front proxy's client certificate.
pub const REQUESTHEADER_CA_KEY: &str = "requestheader-client-ca-file";
/// JSON list: allowed front-proxy CNs (empty = any).
pub const ALLOWED_NAMES_KEY: &str = "requestheader-allowed-names";
/// JSON list: user name headers.
pub const USERNAME_HEADERS_KEY: &str = "requestheader-username-headers";
/// JSON list: UID headers.
pub const UID_HEADERS_KEY: &str = "requestheader-uid-headers";
/// JSON list: group headers.
pub const GROUP_HEADERS_KEY: &str = "requestheader-group-headers";
/// JSON list: extra-attribute header prefixes.
pub const EXTRA_PREFIX_KEY: &str = "requestheader-extra-headers-prefix";

/// A ConfigMap whose contents cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A PEM key that is not a usable CA bundle.
    #[error("{NAMESPACE}/{NAME} key {key:?}: {source}")]
    Ca {
        /// The key.
        key: &'static str,
        /// Why.
        #[source]
        source: CaError,
    },
    /// A list key that is not a JSON array of strings.
    #[error("{NAMESPACE}/{NAME} key {key:?}: not a JSON array of strings: {source}")]
    List {
        /// The key.
        key: &'static str,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// Reads the ConfigMap's data: the request-header settings when it has
/// `requestheader-client-ca-file`, the client CA when it has `client-ca-file` (an empty value
/// counts as absent).
pub fn parse(
    data: &BTreeMap<String, String>,
) -> Result<(Option<requestheader::Config>, Option<CaBundle>), Error> {
    let ca = |key: &'static str| -> Result<Option<CaBundle>, Error> {
        match data.get(key).filter(|v| !v.trim().is_empty()) {
            None => Ok(None),
            Some(pem) => CaBundle::from_pem(pem, "PEM")
                .map(Some)
                .map_err(|source| Error::Ca { key, source }),
        }
    };
    let list = |key: &'static str| -> Result<Vec<String>, Error> {
        match data.get(key).filter(|v| !v.trim().is_empty()) {
            None => Ok(Vec::new()),
            Some(json) => serde_json::from_str(json).map_err(|source| Error::List { key, source }),
        }
    };
    let client_ca = ca(CLIENT_CA_KEY)?;
    let request_header = match ca(REQUESTHEADER_CA_KEY)? {
        None => None,
        Some(ca) => Some(requestheader::Config {
            ca,
            allowed_names: list(ALLOWED_NAMES_KEY)?,
            username_headers: list(USERNAME_HEADERS_KEY)?,
            uid_headers: list(UID_HEADERS_KEY)?,
            group_headers: list(GROUP_HEADERS_KEY)?,
            extra_prefixes: list(EXTRA_PREFIX_KEY)?,
        }),
    };
    Ok((request_header, client_ca))
}

/// Which parts of the [`Chain`]'s CA sources [`follow`] takes from the ConfigMap; the others
/// are left as they are (set from flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Follow {
    /// The request-header settings (no `--requestheader-client-ca-file`).
    pub request_header: bool,
    /// The client CA (no `--client-ca-file`).
    pub client_ca: bool,
}

/// Watches the ConfigMap (with [`crate::watched::backoff`]) and applies each new version
/// to `chain` (and so to its clones). Never returns. Changes are logged at INFO; a version
/// that cannot be used, an absent or deleted ConfigMap, and API errors (e.g. forbidden:
/// RBAC) at WARN — the last good settings stay in use.
pub async fn follow(client: kube::Client, chain: Chain, parts: Follow) {
    let api = kube::Api::<ConfigMap>::namespaced(client, NAMESPACE);
    let config = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
    let stream = watcher(api, config).backoff(crate::watched::backoff());
    let mut stream = std::pin::pin!(stream);
    // Whether the current list (re-list) has shown the ConfigMap.
    let mut listed = false;
    while let Some(event) = next(stream.as_mut()).await {
        match event {
            Ok(watcher::Event::Init) => listed = false,
            Ok(watcher::Event::InitApply(cm) | watcher::Event::Apply(cm)) => {
                listed = true;
                apply(&chain, parts, &cm);
            }
            Ok(watcher::Event::InitDone) if !listed => tracing::warn!(
                configmap = %format!("{NAMESPACE}/{NAME}"),
                "ConfigMap not found; keeping the current request-header and client CA settings"
            ),
            Ok(watcher::Event::InitDone) => {}
            Ok(watcher::Event::Delete(_)) => tracing::warn!(
                configmap = %format!("{NAMESPACE}/{NAME}"),
                "ConfigMap deleted; keeping the current request-header and client CA settings"
            ),
            Err(error) => tracing::warn!(
                configmap = %format!("{NAMESPACE}/{NAME}"),
                %error,
                "cannot watch the authentication ConfigMap (if forbidden: bind the Role \
                 extension-apiserver-authentication-reader in kube-system); retrying"
            ),
        }
    }
}

/// The next item of a stream (this crate has no `futures` dependency; `WatchStreamExt`
/// is a `Stream`).
async fn next<S: WatchStreamExt + ?Sized>(mut stream: std::pin::Pin<&mut S>) -> Option<S::Item> {
    std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await
}

/// Applies one version of the ConfigMap.
fn apply(chain: &Chain, parts: Follow, cm: &ConfigMap) {
    let version = cm.metadata.resource_version.as_deref().unwrap_or("");
    let empty = BTreeMap::new();
    let (request_header, client_ca) = match parse(cm.data.as_ref().unwrap_or(&empty)) {
        Ok(parsed) => parsed,
        Err(error) => {
            tracing::warn!(
                %error,
                resource_version = version,
                "ignoring an unusable authentication ConfigMap; keeping the last good settings"
            );
            return;
        }
    };
    let old = chain.ca_sources();
    let new = CaSources {
        request_header: if parts.request_header {
            request_header
        } else {
            old.request_header.clone()
        },
        client_ca: if parts.client_ca {
            client_ca
        } else {
            old.client_ca.clone()
        },
    };
    let changes = changes(&old, &new);
    if changes.is_empty() {
        return;
    }
    chain.set_ca_sources(new);
    tracing::info!(
        changed = %changes.join(", "),
        resource_version = version,
        "authentication settings from {NAMESPACE}/{NAME} applied"
    );
}

/// What differs between two sets of CA sources, for the log.
fn changes(old: &CaSources, new: &CaSources) -> Vec<&'static str> {
    let mut out = Vec::new();
    match (&old.request_header, &new.request_header) {
        (None, None) => {}
        (None, Some(_)) => out.push("request-header authentication enabled"),
        (Some(_), None) => out.push("request-header authentication disabled"),
        (Some(a), Some(b)) => {
            let fields = [
                (a.ca.pem() != b.ca.pem(), REQUESTHEADER_CA_KEY),
                (a.allowed_names != b.allowed_names, ALLOWED_NAMES_KEY),
                (
                    a.username_headers != b.username_headers,
                    USERNAME_HEADERS_KEY,
                ),
                (a.uid_headers != b.uid_headers, UID_HEADERS_KEY),
                (a.group_headers != b.group_headers, GROUP_HEADERS_KEY),
                (a.extra_prefixes != b.extra_prefixes, EXTRA_PREFIX_KEY),
            ];
            out.extend(fields.iter().filter(|(d, _)| *d).map(|(_, k)| *k));
        }
    }
    match (&old.client_ca, &new.client_ca) {
        (None, None) => {}
        (None, Some(_)) => out.push("client-certificate authentication enabled"),
        (Some(_), None) => out.push("client-certificate authentication disabled"),
        (Some(a), Some(b)) if a.pem() != b.pem() => out.push(CLIENT_CA_KEY),
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::auth::{chain::ChainConfig, x509::testing::TestCa};

    fn valid(proxy: &TestCa, client: &TestCa) -> BTreeMap<String, String> {
        [
            (CLIENT_CA_KEY, client.pem.as_str()),
            (REQUESTHEADER_CA_KEY, proxy.pem.as_str()),
            (ALLOWED_NAMES_KEY, r#"["front-proxy-client"]"#),
            (USERNAME_HEADERS_KEY, r#"["X-Remote-User"]"#),
            (UID_HEADERS_KEY, r#"["X-Remote-Uid"]"#),
            (GROUP_HEADERS_KEY, r#"["X-Remote-Group"]"#),
            (EXTRA_PREFIX_KEY, r#"["X-Remote-Extra-"]"#),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    #[test]
    fn a_full_configmap() {
        let (proxy, client) = (TestCa::new("front-proxy-ca"), TestCa::new("client-ca"));
        let (rh, ca) = parse(&valid(&proxy, &client)).expect("valid");
        let rh = rh.expect("request header");
        assert_eq!(rh.ca.pem(), proxy.pem);
        assert_eq!(rh.allowed_names, ["front-proxy-client"]);
        assert_eq!(rh.username_headers, ["X-Remote-User"]);
        assert_eq!(rh.uid_headers, ["X-Remote-Uid"]);
        assert_eq!(rh.group_headers, ["X-Remote-Group"]);
        assert_eq!(rh.extra_prefixes, ["X-Remote-Extra-"]);
        assert_eq!(ca.expect("client ca").pem(), client.pem);
    }

    #[test]
    fn missing_keys() {
        assert!(matches!(parse(&BTreeMap::new()), Ok((None, None))));
        let (proxy, client) = (TestCa::new("front-proxy-ca"), TestCa::new("client-ca"));
        // Only the client CA.
        let mut data = valid(&proxy, &client);
        data.remove(REQUESTHEADER_CA_KEY);
        let (rh, ca) = parse(&data).expect("valid");
        assert!(rh.is_none() && ca.is_some());
        // Only the request-header CA; absent or empty lists are empty.
        let mut data = valid(&proxy, &client);
        data.remove(CLIENT_CA_KEY);
        data.remove(ALLOWED_NAMES_KEY);
        data.insert(UID_HEADERS_KEY.into(), String::new());
        let (rh, ca) = parse(&data).expect("valid");
        let rh = rh.expect("request header");
        assert!(ca.is_none());
        assert!(rh.allowed_names.is_empty() && rh.uid_headers.is_empty());
        assert_eq!(rh.username_headers, ["X-Remote-User"]);
    }

    #[test]
    fn bad_pem_names_the_key() {
        let (proxy, client) = (TestCa::new("front-proxy-ca"), TestCa::new("client-ca"));
        for key in [CLIENT_CA_KEY, REQUESTHEADER_CA_KEY] {
            for bad in [
                "not a certificate",
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            ] {
                let mut data = valid(&proxy, &client);
                data.insert(key.into(), bad.into());
                let e = parse(&data).expect_err(bad);
                assert!(matches!(e, Error::Ca { key: k, .. } if k == key), "{e:?}");
                assert!(e.to_string().contains(&format!("{key:?}")), "{e}");
            }
        }
    }

    #[test]
    fn bad_lists_name_the_key() {
        let (proxy, client) = (TestCa::new("front-proxy-ca"), TestCa::new("client-ca"));
        for key in [
            ALLOWED_NAMES_KEY,
            USERNAME_HEADERS_KEY,
            UID_HEADERS_KEY,
            GROUP_HEADERS_KEY,
            EXTRA_PREFIX_KEY,
        ] {
            for bad in ["X-Remote-User", r#"{"a":1}"#, "[1]", r#"["a""#] {
                let mut data = valid(&proxy, &client);
                data.insert(key.into(), bad.into());
                let e = parse(&data).expect_err(bad);
                assert!(matches!(e, Error::List { key: k, .. } if k == key), "{e:?}");
                let msg = e.to_string();
                assert!(msg.contains(&format!("{key:?}")), "{msg}");
                assert!(msg.contains("JSON array of strings"), "{msg}");
            }
        }
    }

    fn configmap(data: BTreeMap<String, String>) -> ConfigMap {
        ConfigMap {
            data: Some(data),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn apply_swaps_followed_parts_and_keeps_the_last_good() {
        let flag_ca = TestCa::new("flag-client-ca");
        let chain = Chain::new(ChainConfig {
            client_ca: Some(CaBundle::from_pem(&flag_ca.pem, "flag").expect("ca")),
            ..ChainConfig::default()
        })
        .expect("chain");
        let parts = Follow {
            request_header: true,
            client_ca: false,
        };
        let (proxy, client) = (TestCa::new("front-proxy-ca"), TestCa::new("client-ca"));
        apply(&chain, parts, &configmap(valid(&proxy, &client)));
        let now = chain.ca_sources();
        assert_eq!(now.request_header.as_ref().expect("rh").ca.pem(), proxy.pem);
        assert_eq!(now.client_ca.as_ref().expect("flag's").pem(), flag_ca.pem);

        // A bad version changes nothing.
        let mut bad = valid(&proxy, &client);
        bad.insert(GROUP_HEADERS_KEY.into(), "nope".into());
        apply(&chain, parts, &configmap(bad));
        let after = chain.ca_sources();
        assert!(Arc::ptr_eq(&now, &after));

        // A rotated CA is taken.
        let rotated = TestCa::new("front-proxy-ca-2");
        apply(&chain, parts, &configmap(valid(&rotated, &client)));
        let after = chain.ca_sources();
        assert_eq!(
            after.request_header.as_ref().expect("rh").ca.pem(),
            rotated.pem
        );
        assert_eq!(
            changes(&now, &after),
            [REQUESTHEADER_CA_KEY],
            "only the CA changed"
        );
    }
}
