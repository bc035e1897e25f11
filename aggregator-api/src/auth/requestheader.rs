//! The front proxy's identity assertion (k8s.io/apiserver's request-header
//! authenticator): a client whose certificate verifies against the request-header CA,
//! and whose CN is in `--requestheader-allowed-names` (empty = any), names the user in
//! headers. Anyone else's identical headers are ignored — and [`strip`] removes them from
//! every request before any handler sees it.

use http::HeaderMap;
use rustls::pki_types::CertificateDer;

use super::{x509::CaBundle, AuthnError, UserInfo};

/// `--requestheader-*` settings (flags, or the `extension-apiserver-authentication`
/// ConfigMap).
#[derive(Clone, Debug)]
pub struct Config {
    /// `--requestheader-client-ca-file` / `requestheader-client-ca-file`.
    pub ca: CaBundle,
    /// `--requestheader-allowed-names`; empty allows any CN.
    pub allowed_names: Vec<String>,
    /// `--requestheader-username-headers` (e.g. `X-Remote-User`).
    pub username_headers: Vec<String>,
    /// `--requestheader-uid-headers` (e.g. `X-Remote-Uid`).
    pub uid_headers: Vec<String>,
    /// `--requestheader-group-headers` (e.g. `X-Remote-Group`).
    pub group_headers: Vec<String>,
    /// `--requestheader-extra-headers-prefix` (e.g. `X-Remote-Extra-`).
    pub extra_prefixes: Vec<String>,
}

/// What the request-header authenticator concluded.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The client is not the front proxy: its headers mean nothing.
    NotProxy,
    /// The front proxy sent no user name: other authenticators may decide.
    NoUser,
    /// The user the front proxy vouches for.
    User(UserInfo),
}

/// Decides whether `chain` (the verified TLS client chain, if any) belongs to the front
/// proxy and, if so, who the request is from.
pub fn authenticate(
    cfg: &Config,
    chain: Option<&[CertificateDer<'_>]>,
    headers: &HeaderMap,
) -> Result<Outcome, AuthnError> {
    let Some(chain) = chain.filter(|c| !c.is_empty()) else {
        return Ok(Outcome::NotProxy);
    };
    if !cfg.ca.verifies(chain) {
        return Ok(Outcome::NotProxy);
    }
    if !cfg.allowed_names.is_empty() {
        let cn = super::x509::identity(&chain[0])
            .map(|u| u.name)
            .unwrap_or_default();
        if !cfg.allowed_names.contains(&cn) {
            return Err(AuthnError::ProxyNotAllowed { cn });
        }
    }
    Ok(match user(cfg, headers) {
        Some(user) => Outcome::User(user),
        None => Outcome::NoUser,
    })
}

/// The user the headers name, once the client is known to be the front proxy: the first
/// non-empty username header, the first non-empty uid header, every non-empty group, and the
/// extras (`<prefix><key>`, keys lower-cased and percent-decoded); `None` without a user name.
pub fn user(cfg: &Config, headers: &HeaderMap) -> Option<UserInfo> {
    let name = first_value(headers, &cfg.username_headers)?;
    let uid = first_value(headers, &cfg.uid_headers);
    let groups = all_values(headers, &cfg.group_headers);
    let mut extra = std::collections::BTreeMap::<String, Vec<String>>::new();
    for (k, v) in headers {
        let key = k.as_str();
        for prefix in &cfg.extra_prefixes {
            let p = prefix.to_ascii_lowercase();
            if let Some(rest) = key.strip_prefix(&p) {
                if let Ok(v) = v.to_str() {
                    extra
                        .entry(unescape_key(rest))
                        .or_default()
                        .push(v.to_string());
                }
            }
        }
    }
    Some(UserInfo {
        name,
        uid,
        groups,
        extra,
    })
}

/// Removes every header the front proxy uses to name users, so that no handler can
/// mistake a forged one for an authenticated identity.
pub fn strip(cfg: &Config, headers: &mut HeaderMap) {
    for h in cfg
        .username_headers
        .iter()
        .chain(&cfg.uid_headers)
        .chain(&cfg.group_headers)
    {
        headers.remove(h.as_str());
    }
    let prefixes: Vec<String> = cfg
        .extra_prefixes
        .iter()
        .map(|p| p.to_ascii_lowercase())
        .collect();
    let doomed: Vec<http::HeaderName> = headers
        .keys()
        .filter(|k| prefixes.iter().any(|p| k.as_str().starts_with(p.as_str())))
        .cloned()
        .collect();
    for k in doomed {
        headers.remove(k);
    }
}

/// The first non-empty value among `names`, in the order given.
fn first_value(headers: &HeaderMap, names: &[String]) -> Option<String> {
    names.iter().find_map(|n| {
        headers
            .get(n.as_str())
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    })
}

/// Every non-empty value of every header in `names`.
fn all_values(headers: &HeaderMap, names: &[String]) -> Vec<String> {
    names
        .iter()
        .flat_map(|n| headers.get_all(n.as_str()).iter())
        .filter_map(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .collect()
}

/// Extra keys are lower-cased and percent-decoded (`X-Remote-Extra-Foo%2fBar` → `foo/bar`);
/// a key that does not decode (Go's `url.PathUnescape` fails: a `%` not followed by two hex
/// digits) is kept as it is.
fn unescape_key(raw: &str) -> String {
    let b = raw.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            // Exactly two hex digits: `u8::from_str_radix` alone would also take a sign
            // (`%+f`).
            match b.get(i + 1..i + 3) {
                Some(&[hi, lo]) if hi.is_ascii_hexdigit() && lo.is_ascii_hexdigit() => {
                    out.push(hex_value(hi) << 4 | hex_value(lo));
                    i += 3;
                    continue;
                }
                _ => return raw.to_string(),
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| raw.to_string())
}

/// The value of an ASCII hex digit (0 for anything else).
fn hex_value(digit: u8) -> u8 {
    match digit {
        b'0'..=b'9' => digit - b'0',
        b'a'..=b'f' => digit - b'a' + 10,
        b'A'..=b'F' => digit - b'A' + 10,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::x509::testing::TestCa;

    fn cfg(ca: &TestCa, allowed: &[&str]) -> Config {
        Config {
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

    fn forged() -> HeaderMap {
        headers(&[
            ("X-Remote-User", "system:admin"),
            ("X-Remote-Group", "system:masters"),
            ("X-Remote-Group", "system:authenticated"),
            ("X-Remote-Uid", "u-1"),
            ("X-Remote-Extra-Scopes", "a"),
            ("X-Remote-Extra-Scopes", "b"),
            ("X-Remote-Extra-Acme.com%2fProject", "p"),
        ])
    }

    #[test]
    fn the_front_proxy_names_the_user() {
        let ca = TestCa::new("front-proxy-ca");
        let c = cfg(&ca, &["front-proxy-client"]);
        let chain = [ca.client("front-proxy-client", &[])];
        let Outcome::User(u) = authenticate(&c, Some(&chain), &forged()).expect("ok") else {
            panic!("expected a user");
        };
        assert_eq!(u.name, "system:admin");
        assert_eq!(u.uid.as_deref(), Some("u-1"));
        assert_eq!(u.groups, ["system:masters", "system:authenticated"]);
        assert_eq!(u.extra["scopes"], ["a", "b"]);
        assert_eq!(u.extra["acme.com/project"], ["p"]);
    }

    #[test]
    fn headers_without_the_proxy_certificate_are_ignored() {
        let ca = TestCa::new("front-proxy-ca");
        let other = TestCa::new("client-ca");
        let c = cfg(&ca, &[]);
        assert_eq!(authenticate(&c, None, &forged()), Ok(Outcome::NotProxy));
        let chain = [other.client("front-proxy-client", &[])];
        assert_eq!(
            authenticate(&c, Some(&chain), &forged()),
            Ok(Outcome::NotProxy)
        );
        let expired = [ca.expired_client("front-proxy-client")];
        assert_eq!(
            authenticate(&c, Some(&expired), &forged()),
            Ok(Outcome::NotProxy)
        );
    }

    #[test]
    fn a_proxy_cn_outside_the_allowed_names_is_refused() {
        let ca = TestCa::new("front-proxy-ca");
        let c = cfg(&ca, &["front-proxy-client"]);
        let chain = [ca.client("someone-else", &[])];
        assert_eq!(
            authenticate(&c, Some(&chain), &forged()),
            Err(AuthnError::ProxyNotAllowed {
                cn: "someone-else".into()
            })
        );
        // Empty allowed names: any CN from the CA will do.
        let any = cfg(&ca, &[]);
        assert!(matches!(
            authenticate(&any, Some(&chain), &forged()),
            Ok(Outcome::User(_))
        ));
    }

    #[test]
    fn no_user_header_means_no_decision() {
        let ca = TestCa::new("front-proxy-ca");
        let c = cfg(&ca, &[]);
        let chain = [ca.client("front-proxy-client", &[])];
        let h = headers(&[("X-Remote-User", ""), ("X-Remote-Group", "g")]);
        assert_eq!(authenticate(&c, Some(&chain), &h), Ok(Outcome::NoUser));
    }

    #[test]
    fn strip_removes_every_identity_header() {
        let ca = TestCa::new("front-proxy-ca");
        let c = cfg(&ca, &[]);
        let mut h = forged();
        h.insert("accept", http::HeaderValue::from_static("application/json"));
        strip(&c, &mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("accept"));
    }

    #[test]
    fn extra_keys_decode_or_stay() {
        assert_eq!(unescape_key("foo%2fbar"), "foo/bar");
        assert_eq!(unescape_key("bad%zz"), "bad%zz");
        assert_eq!(unescape_key("trailing%2"), "trailing%2");
        assert_eq!(unescape_key("%e2%82%ac"), "€");
        assert_eq!(unescape_key("%2F%2f"), "//");
        assert_eq!(unescape_key("%ff"), "%ff");
    }

    /// Found by fuzzing (`fuzz/regressions/request_header/extra-key-escape-with-plus-sign`):
    /// `u8::from_str_radix` accepts a leading `+`, so `%+a` decoded to a newline where Go's
    /// `url.PathUnescape` refuses the escape and the key stays as sent.
    #[test]
    fn a_sign_is_not_a_hex_digit() {
        assert_eq!(unescape_key("%+a"), "%+a");
        assert_eq!(unescape_key("k%+1"), "k%+1");
        assert_eq!(unescape_key("%-1"), "%-1");
        assert_eq!(unescape_key("%2f%+f"), "%2f%+f");
        let ca = TestCa::new("front-proxy-ca");
        let c = cfg(&ca, &[]);
        let chain = [ca.client("front-proxy-client", &[])];
        let h = headers(&[("X-Remote-User", "u"), ("X-Remote-Extra-%+1", "v")]);
        let Ok(Outcome::User(u)) = authenticate(&c, Some(&chain), &h) else {
            panic!("expected a user");
        };
        assert_eq!(u.extra.keys().collect::<Vec<_>>(), ["%+1"]);
    }
}
