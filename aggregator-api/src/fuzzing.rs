//! Fuzz target bodies, shared by `fuzz/fuzz_targets/` (cargo-fuzz) and the regression test
//! that replays the committed corpus (`tests/fuzz_regressions.rs`). Not part of the API.
//!
//! Each body takes arbitrary bytes and panics when an invariant breaks; errors the product
//! returns for bad input are fine. The checks below are oracles for properties the modules
//! document, not second implementations of them.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::api::selector::{
    FieldSelector, LabelSelector, ObjectFields, Operator, MAX_SELECTOR_BYTES,
};
use crate::auth::requestheader::{self, Config, Outcome};
use crate::auth::x509::CaBundle;
use crate::kubelet::parse::{self as kubelet_parse, ParseError, Reading, Resource, MAX_SAMPLES};
use crate::quantity::{self, Quantity};

// ---------------------------------------------------------------------------------------------
// Selectors.

/// Label and field selector parsing ([`LabelSelector::parse`], [`FieldSelector::parse`]) of
/// the input as text (lossy UTF-8, as a query string decodes), then matching.
///
/// Invariants: no panic; a parsed label selector prints (`Display`, Go's `String()`) as text
/// that parses to the same selector; a parsed field selector prints as text that parses to the
/// same terms (Go sorts terms by their text, so the order may change once, and is then
/// stable); both parse the same way and match the same objects; a value
/// `requires_exact_match` returns is the value of that key in every object that matches.
pub fn selectors(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    label_selector(&text);
    field_selector(&text);
}

fn label_selector(text: &str) {
    let selector = match LabelSelector::parse(text) {
        Ok(s) => s,
        Err(e) => {
            assert!(!e.message.is_empty(), "empty error for {text:?}");
            return;
        }
    };
    let sets = label_sets(&selector);
    for labels in &sets {
        let matched = selector.matches(labels);
        for r in selector.requirements() {
            if let (true, Some(want)) = (matched, selector.requires_exact_match(r.key())) {
                assert_eq!(
                    labels.get(r.key()).map(String::as_str),
                    Some(want),
                    "{text:?} matched labels {labels:?} without {}={want}",
                    r.key()
                );
            }
        }
    }
    let printed = selector.to_string();
    if printed.len() > MAX_SELECTOR_BYTES {
        // Printing may add spaces (`a in(b)` → `a in (b)`); kpulse's length bound applies to
        // what clients send, and nothing re-parses printed selectors.
        return;
    }
    let again = match LabelSelector::parse(&printed) {
        Ok(s) => s,
        Err(e) => panic!("{text:?} prints as {printed:?}, which does not parse: {e}"),
    };
    assert_eq!(again, selector, "{text:?} prints as {printed:?}");
    assert_eq!(again.to_string(), printed, "printing is not stable");
}

/// Label sets to match against: fixed ones, and ones built from the selector's own keys and
/// values so that requirements can hold.
fn label_sets(selector: &LabelSelector) -> Vec<BTreeMap<String, String>> {
    let fixed = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let mut sets = vec![
        BTreeMap::new(),
        fixed(&[("app", "web"), ("tier", "front"), ("n", "5")]),
        fixed(&[("app", ""), ("a", "1"), ("example.com/x", "-7")]),
    ];
    for pick in 0..3usize {
        let mut labels = BTreeMap::new();
        for r in selector.requirements() {
            let value = match (r.operator(), pick) {
                (Operator::DoesNotExist, 0) => continue,
                (Operator::GreaterThan | Operator::LessThan, _) => {
                    let n: i64 = r.values().first().and_then(|v| v.parse().ok()).unwrap_or(0);
                    let step = if r.operator() == Operator::GreaterThan {
                        1
                    } else {
                        -1
                    };
                    n.saturating_add(step * i64::from(pick != 2)).to_string()
                }
                _ => r
                    .values()
                    .get(pick % r.values().len().max(1))
                    .cloned()
                    .unwrap_or_default(),
            };
            labels.entry(r.key().to_owned()).or_insert(value);
        }
        sets.push(labels);
    }
    sets
}

fn field_selector(text: &str) {
    let selector = match FieldSelector::parse(text) {
        Ok(s) => s,
        Err(e) => {
            assert!(!e.message.is_empty(), "empty error for {text:?}");
            return;
        }
    };
    let _ = selector.check_fields();
    let values: Vec<&str> = selector
        .terms()
        .iter()
        .map(|t| t.value.as_str())
        .chain(["", "x", "default"])
        .collect();
    let objects: Vec<ObjectFields<'_>> = values
        .iter()
        .flat_map(|&name| {
            values.iter().flat_map(move |&ns| {
                [
                    ObjectFields {
                        name,
                        namespace: None,
                    },
                    ObjectFields {
                        name,
                        namespace: Some(ns),
                    },
                ]
            })
        })
        .take(64)
        .collect();
    for object in &objects {
        if !selector.matches(object) {
            continue;
        }
        for field in ["metadata.name", "metadata.namespace"] {
            if let Some(want) = selector.requires_exact_match(field) {
                assert_eq!(
                    object.get(field),
                    want,
                    "{text:?} matched {object:?} without {field}={want}"
                );
            }
        }
    }
    let printed = selector.to_string();
    let again = match FieldSelector::parse(&printed) {
        Ok(s) => s,
        Err(e) => panic!("{text:?} prints as {printed:?}, which does not parse: {e}"),
    };
    let sorted = |s: &FieldSelector| {
        let mut terms: Vec<String> = s.terms().iter().map(|t| format!("{t:?}")).collect();
        terms.sort();
        terms
    };
    assert_eq!(
        sorted(&again),
        sorted(&selector),
        "{text:?} prints as {printed:?}"
    );
    assert_eq!(
        again.check_fields().is_ok(),
        selector.check_fields().is_ok(),
        "{text:?} prints as {printed:?}"
    );
    for object in &objects {
        assert_eq!(again.matches(object), selector.matches(object), "{text:?}");
    }
    // Once printed, the order is Go's sorted order of the printed terms: a fixed point.
    let printed_again = again.to_string();
    match FieldSelector::parse(&printed_again) {
        Ok(third) => assert_eq!(third, again, "{printed_again:?} is not a fixed point"),
        Err(e) => panic!("{printed_again:?} does not parse: {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Request headers.

/// The front proxy's identity headers: [`requestheader::user`] (what
/// [`requestheader::authenticate`] returns once the client certificate is the proxy's) and
/// [`requestheader::strip`], on header sets built from the input.
///
/// Input layout: byte 0 picks the `--requestheader-*` configuration (bits 0–1: three
/// presets, or 3 = the first record names them: `users;uids;groups;prefixes`, each
/// comma-separated; bit 7 also runs [`requestheader::authenticate`] with a front-proxy
/// certificate); the rest is records separated by `\n`, each `name:value` (names and values
/// that HTTP does not allow are skipped).
///
/// Invariants: no panic; a user exists exactly when a username header has a non-empty textual
/// value, and its name, uid, groups are such values; every extra comes from a header with an
/// extra prefix, and its key is the rest of the header name, percent-decoded only when every
/// `%` starts a valid `%XX` escape; `authenticate` without a certificate is `NotProxy`, with the
/// proxy's certificate it is [`requestheader::user`]'s answer; after `strip`, no configured
/// identity header and no header with an extra prefix remains, no user can be built, and every
/// other header is still there.
pub fn request_header(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Some(ca) = fuzz_ca() else {
        panic!("cannot make the fuzzing CA");
    };
    let mut records = rest.split(|&b| b == b'\n');
    let cfg = match selector & 3 {
        0 => config(
            ca.bundle.clone(),
            &["X-Remote-User"],
            &["X-Remote-Uid"],
            &["X-Remote-Group"],
            &["X-Remote-Extra-"],
        ),
        1 => config(
            ca.bundle.clone(),
            &["X-Remote-User", "X-Forwarded-User"],
            &[],
            &["X-Remote-Group", "X-Forwarded-Groups"],
            &["X-Remote-Extra-", "X-Remote-"],
        ),
        2 => config(
            ca.bundle.clone(),
            &["x-remote-user", "Not A Header", ""],
            &["X-REMOTE-UID"],
            &["x-remote-group", "x-remote-group"],
            &["X-Remote-Extra-", "x-REMOTE-extra-"],
        ),
        _ => {
            let spec = String::from_utf8_lossy(records.next().unwrap_or_default()).into_owned();
            let mut lists = spec.split(';').map(|l| {
                l.split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            });
            let mut next = || lists.next().unwrap_or_default();
            Config {
                ca: ca.bundle.clone(),
                allowed_names: Vec::new(),
                username_headers: next(),
                uid_headers: next(),
                group_headers: next(),
                extra_prefixes: next(),
            }
        }
    };
    let mut headers = HeaderMap::new();
    for record in records {
        let (name, value) = match record.iter().position(|&b| b == b':') {
            Some(i) => (&record[..i], &record[i + 1..]),
            None => (record, &[][..]),
        };
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    }
    check_user(&cfg, &headers);
    assert_eq!(
        requestheader::authenticate(&cfg, None, &headers),
        Ok(Outcome::NotProxy)
    );
    if selector & 0x80 != 0 {
        let want = match requestheader::user(&cfg, &headers) {
            Some(user) => Outcome::User(user),
            None => Outcome::NoUser,
        };
        let chain = std::slice::from_ref(&ca.proxy);
        assert_eq!(
            requestheader::authenticate(&cfg, Some(chain), &headers),
            Ok(want)
        );
    }
    let mut stripped = headers.clone();
    requestheader::strip(&cfg, &mut stripped);
    check_stripped(&cfg, &headers, &stripped);
}

/// A CA for the configurations and a front-proxy client certificate it issued, made once.
struct FuzzCa {
    bundle: CaBundle,
    proxy: rustls::pki_types::CertificateDer<'static>,
}

fn fuzz_ca() -> Option<&'static FuzzCa> {
    static CA: OnceLock<Option<FuzzCa>> = OnceLock::new();
    CA.get_or_init(|| {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let mut params = CertificateParams::new(Vec::<String>::new()).ok()?;
        params
            .distinguished_name
            .push(DnType::CommonName, "fuzz-front-proxy-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().ok()?;
        let cert = params.self_signed(&key).ok()?;
        let bundle = CaBundle::from_pem(&cert.pem(), "fuzzing").ok()?;
        let issuer = Issuer::new(params, key);
        let mut client = CertificateParams::new(Vec::<String>::new()).ok()?;
        client
            .distinguished_name
            .push(DnType::CommonName, "front-proxy-client");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = KeyPair::generate().ok()?;
        let proxy = client.signed_by(&client_key, &issuer).ok()?.der().clone();
        Some(FuzzCa { bundle, proxy })
    })
    .as_ref()
}

fn config(
    ca: CaBundle,
    users: &[&str],
    uids: &[&str],
    groups: &[&str],
    prefixes: &[&str],
) -> Config {
    let owned = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect();
    Config {
        ca,
        allowed_names: Vec::new(),
        username_headers: owned(users),
        uid_headers: owned(uids),
        group_headers: owned(groups),
        extra_prefixes: owned(prefixes),
    }
}

/// The non-empty textual values of the headers `names` (case-insensitive), in map order.
fn values_of<'h>(headers: &'h HeaderMap, names: &[String]) -> Vec<&'h str> {
    headers
        .iter()
        .filter(|(k, _)| names.iter().any(|n| n.eq_ignore_ascii_case(k.as_str())))
        .filter_map(|(_, v)| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .collect()
}

/// The non-empty textual *first* values of the headers `names`: what Go's `Header.Get` reads
/// (a header repeated with an empty first value names nobody, as in k8s.io/apiserver).
fn first_values<'h>(headers: &'h HeaderMap, names: &[String]) -> Vec<&'h str> {
    names
        .iter()
        .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
        .filter_map(|n| headers.get(n))
        .filter_map(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .collect()
}

/// The rests of `name` after each extra prefix it starts with.
fn extra_rests<'n>(cfg: &Config, name: &'n str) -> Vec<&'n str> {
    cfg.extra_prefixes
        .iter()
        .filter_map(|p| name.strip_prefix(p.to_ascii_lowercase().as_str()))
        .collect()
}

/// Whether every `%` in `s` starts a `%XX` escape of two hex digits.
fn valid_escapes(s: &str) -> bool {
    let b = s.as_bytes();
    b.iter().enumerate().all(|(i, &c)| {
        c != b'%'
            || b.get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    })
}

fn check_user(cfg: &Config, headers: &HeaderMap) {
    let names = first_values(headers, &cfg.username_headers);
    let Some(user) = requestheader::user(cfg, headers) else {
        assert!(names.is_empty(), "no user from username values {names:?}");
        return;
    };
    // The first non-empty one, in the configured order.
    assert_eq!(names.first(), Some(&user.name.as_str()));
    assert_eq!(
        user.uid.as_deref(),
        first_values(headers, &cfg.uid_headers).first().copied()
    );
    let groups = values_of(headers, &cfg.group_headers);
    assert!(user.groups.iter().all(|g| groups.contains(&g.as_str())));
    // Every header with an extra prefix and a textual value gives one extra value per prefix.
    let expected: usize = headers
        .iter()
        .filter(|(_, v)| v.to_str().is_ok())
        .map(|(k, _)| extra_rests(cfg, k.as_str()).len())
        .sum();
    let got: usize = user.extra.values().map(Vec::len).sum();
    assert_eq!(got, expected, "extra values of {headers:?}");
    // Each extra key, header by header: the rest of the name, decoded only if it decodes.
    let Ok(user_value) = HeaderValue::from_str(&user.name) else {
        return;
    };
    let Some(user_header) = cfg
        .username_headers
        .iter()
        .find_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
    else {
        return;
    };
    let mut alone = HeaderMap::new();
    alone.append(user_header.clone(), user_value.clone());
    // The username header may have an extra prefix too: its own extras.
    let Some(base) = requestheader::user(cfg, &alone) else {
        panic!("no user from {alone:?}");
    };
    for (name, value) in headers {
        let rests = extra_rests(cfg, name.as_str());
        if rests.is_empty() || value.to_str().is_err() || *name == user_header {
            continue;
        }
        let mut one = HeaderMap::new();
        one.append(user_header.clone(), user_value.clone());
        one.append(name.clone(), value.clone());
        let Some(u) = requestheader::user(cfg, &one) else {
            panic!("user vanished with {one:?}");
        };
        for (key, values) in &u.extra {
            if values.len() == base.extra.get(key).map_or(0, Vec::len) {
                continue;
            }
            assert!(
                rests
                    .iter()
                    .any(|r| r == key || (r.contains('%') && valid_escapes(r))),
                "extra key {key:?} from header {name:?} (rests {rests:?})"
            );
        }
    }
}

fn check_stripped(cfg: &Config, before: &HeaderMap, after: &HeaderMap) {
    let identity = |k: &HeaderName| {
        cfg.username_headers
            .iter()
            .chain(&cfg.uid_headers)
            .chain(&cfg.group_headers)
            .any(|n| n.eq_ignore_ascii_case(k.as_str()))
            || !extra_rests(cfg, k.as_str()).is_empty()
    };
    for k in after.keys() {
        assert!(!identity(k), "{k:?} survived strip");
    }
    assert_eq!(requestheader::user(cfg, after), None);
    let kept: Vec<(&HeaderName, &HeaderValue)> =
        before.iter().filter(|(k, _)| !identity(k)).collect();
    assert!(
        kept.len() == after.len()
            && kept
                .iter()
                .all(|(k, v)| after.get_all(*k).iter().any(|w| w == *v)),
        "strip removed other headers: {before:?} → {after:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Quantities.

/// [`quantity`]'s formatting: CPU and memory quantities ([`quantity::cpu_nanocores`],
/// [`quantity::memory_bytes`], [`Quantity::add`]), [`crate::go::format_duration`],
/// [`quantity::rfc3339_unix`] and [`quantity::unix_parts`], on `u64`s read from the input.
///
/// Input layout: byte 0 picks the operation; the rest is read as little-endian `u64`s (the
/// last one zero-padded).
///
/// Invariants: no panic; every quantity is in Kubernetes' canonical form (no leading zeros;
/// DecimalSI: the largest suffix whose mantissa is an integer; BinarySI: `Ki`…`Ei` for
/// multiples of 1024, plain digits otherwise, DecimalSI below 1024) and reads back as the
/// input, exactly up to `i64::MAX` and with the last decimal digit dropped (truncated) above,
/// as metrics-server does; sums of up to 32 quantities are exact; durations read back as their
/// nanoseconds (saturated at `i64::MAX`); RFC 3339 fields are in range; `unix_parts` floors.
pub fn quantity(data: &[u8]) {
    let Some((&op, rest)) = data.split_first() else {
        return;
    };
    let values: Vec<u64> = rest
        .chunks(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect();
    match op % 6 {
        0 => {
            for &v in &values {
                let s = quantity::cpu_nanocores(v);
                assert_eq!(Quantity::from_cpu_nanocores(v).to_string(), s);
                assert_eq!(
                    read_cpu_nanos(&s),
                    Some(u128::from(fit(v))),
                    "cpu {v} → {s}"
                );
            }
        }
        1 => {
            for &v in &values {
                let s = quantity::memory_bytes(v);
                assert_eq!(Quantity::from_memory_bytes(v).to_string(), s);
                assert_eq!(read_bytes(&s), Some(u128::from(fit(v))), "memory {v} → {s}");
            }
        }
        2 | 3 => {
            let cpu = op % 6 == 2;
            let mut sum = Quantity::zero();
            let mut want = 0u128;
            for &v in values.iter().take(32) {
                let q = if cpu {
                    Quantity::from_cpu_nanocores(v)
                } else {
                    Quantity::from_memory_bytes(v)
                };
                sum.add(&q);
                want += u128::from(fit(v));
            }
            let s = sum.canonical();
            let got = if cpu {
                read_cpu_nanos(&s)
            } else {
                read_bytes(&s)
            };
            assert_eq!(got, Some(want), "sum of {values:?} → {s}");
        }
        4 => {
            for &v in &values {
                let d = Duration::from_nanos(v);
                let s = crate::go::format_duration(crate::go::nanos(d));
                let want = u128::from(v.min(i64::MAX as u64));
                assert_eq!(read_go_duration(&s), Some(want), "{d:?} → {s}");
                // Longer than u64 nanoseconds: saturates.
                let long = Duration::new(v, 999_999_999);
                if long.as_nanos() > i64::MAX as u128 {
                    assert_eq!(
                        crate::go::format_duration(crate::go::nanos(long)),
                        "2562047h47m16.854775807s"
                    );
                }
            }
        }
        _ => {
            for &v in &values {
                let seconds = v as i64;
                check_rfc3339(&quantity::rfc3339_unix(seconds));
                let d = Duration::new(v >> 30, (v & 0x3fff_ffff) as u32 % 1_000_000_000);
                for (t, sign) in [
                    (UNIX_EPOCH.checked_add(d), 1i128),
                    (UNIX_EPOCH.checked_sub(d), -1),
                ] {
                    let Some(t) = t else { continue };
                    let (s, n) = quantity::unix_parts(t);
                    assert!(n < 1_000_000_000);
                    assert_eq!(
                        i128::from(s) * 1_000_000_000 + i128::from(n),
                        sign * d.as_nanos() as i128,
                        "unix_parts({d:?} × {sign})"
                    );
                }
            }
        }
    }
}

/// What metrics-server keeps of a `u64`: itself up to `i64::MAX`, else its last digit zeroed.
fn fit(v: u64) -> u64 {
    if v > i64::MAX as u64 {
        v - v % 10
    } else {
        v
    }
}

/// Splits a quantity into its digits (no sign, no leading zero) and suffix.
fn split_quantity(s: &str) -> Option<(u128, &str)> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(end);
    if digits.is_empty() || (digits.starts_with('0') && s != "0") {
        return None;
    }
    Some((digits.parse().ok()?, suffix))
}

/// Reads a canonical DecimalSI quantity as nanounits; `None` if it is not canonical.
fn read_cpu_nanos(s: &str) -> Option<u128> {
    let (mantissa, suffix) = split_quantity(s)?;
    if mantissa == 0 {
        return Some(0);
    }
    let exponent: u32 = match suffix {
        "n" => 0,
        "u" => 3,
        "m" => 6,
        "" => 9,
        "k" => 12,
        "M" => 15,
        "G" => 18,
        "T" => 21,
        "P" => 24,
        "E" => 27,
        _ => return None,
    };
    // Canonical: the exponent is as large as the suffixes allow.
    if mantissa % 1000 == 0 && suffix != "E" {
        return None;
    }
    mantissa.checked_mul(10u128.checked_pow(exponent)?)
}

/// Reads a canonical BinarySI quantity of whole bytes; `None` if it is not canonical.
fn read_bytes(s: &str) -> Option<u128> {
    let (mantissa, suffix) = split_quantity(s)?;
    if mantissa == 0 {
        return Some(0);
    }
    let value = match suffix {
        // Below 1024, DecimalSI: only 1000 gets a suffix.
        "k" => (mantissa == 1).then_some(1000)?,
        "" => {
            let canonical = if mantissa < 1024 {
                mantissa != 1000
            } else {
                mantissa % 1024 != 0
            };
            canonical.then_some(mantissa)?
        }
        _ => {
            let power = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
                .iter()
                .position(|&p| p == suffix)?;
            if mantissa % 1024 == 0 && suffix != "Ei" {
                return None;
            }
            let value = mantissa.checked_mul(1u128 << (10 * (power + 1)))?;
            (value >= 1024).then_some(value)?
        }
    };
    Some(value)
}

/// Reads Go's `Duration.String()` back as nanoseconds; `None` if it is not in that form.
fn read_go_duration(s: &str) -> Option<u128> {
    if s == "0s" {
        return Some(0);
    }
    let mut rest = s;
    let mut total = 0u128;
    let mut units_seen = Vec::new();
    while !rest.is_empty() {
        let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (number, tail) = rest.split_at(end);
        let (unit, scale) = [
            ("ns", 1u128),
            ("µs", 1_000),
            ("ms", 1_000_000),
            ("s", 1_000_000_000),
            ("m", 60_000_000_000),
            ("h", 3_600_000_000_000),
        ]
        .into_iter()
        .find(|(u, _)| tail.starts_with(u))?;
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() || fraction.ends_with('0') || units_seen.contains(&unit) {
            return None;
        }
        let mut nanos = whole.parse::<u128>().ok()?.checked_mul(scale)?;
        if !fraction.is_empty() {
            let digits = u32::try_from(fraction.len()).ok()?;
            let denominator = 10u128.checked_pow(digits)?;
            let part = fraction.parse::<u128>().ok()?.checked_mul(scale)?;
            if part % denominator != 0 {
                return None;
            }
            nanos += part / denominator;
        }
        total = total.checked_add(nanos)?;
        units_seen.push(unit);
        rest = &tail[unit.len()..];
    }
    Some(total)
}

fn check_rfc3339(s: &str) {
    let body = s.strip_prefix('-').unwrap_or(s);
    let ok = (|| {
        let (date, time) = body.strip_suffix('Z')?.split_once('T')?;
        let mut date = date.rsplitn(3, '-');
        let (day, month, year) = (date.next()?, date.next()?, date.next()?);
        let year_digits = year.len();
        let (year, month, day): (u64, u32, u32) =
            (year.parse().ok()?, month.parse().ok()?, day.parse().ok()?);
        let mut time = time.split(':').map(|p| p.parse::<u32>().ok());
        let (h, m, sec) = (time.next()??, time.next()??, time.next()??);
        Some(
            (year_digits == 4 || (year_digits > 4 && year > 9999))
                && (1..=12).contains(&month)
                && (1..=31).contains(&day)
                && h < 24
                && m < 60
                && sec < 60,
        )
    })();
    assert_eq!(ok, Some(true), "{s:?} is not RFC 3339");
}

// ---------------------------------------------------------------------------------------------
// The kubelet's `/metrics/resource`.

/// When [`kubelet_resource`]'s answers were fetched: samples without a timestamp take it.
/// Not whole milliseconds: the parser must round it down, as the kubelet's stamps are.
const SCRAPED_AT: kpulse_wire::UnixNanos = kpulse_wire::UnixNanos(1_764_950_460_123_456_789);

/// The kubelet fallback's parser of `/metrics/resource` ([`kubelet_parse::parse`]), on the
/// input as text (lossy UTF-8), fetched at [`SCRAPED_AT`].
///
/// Input layout: the whole input is the answer's body.
///
/// Invariants: no panic; an error names a line of the text (1-based), and `TooMany` comes
/// only with more than [`MAX_SAMPLES`] lines; on success, every pod has at least one
/// container, every reading's timestamp is a whole number of milliseconds (its sample's, or
/// [`SCRAPED_AT`] for a sample without one), and it is zero
/// only if the text has both a CPU and a memory sample of that kind (node or container) with
/// timestamp 0 (the parser takes a zero CPU timestamp as absent and falls back to the memory
/// one, but accepts a zero there: nothing in it requires a non-zero timestamp); the result,
/// written back in the kubelet's format (the five series with `namespace`, `pod`,
/// `container` labels, escaped, and millisecond timestamps; CPU and start times as seconds
/// with nine decimals, memory as an integer), parses to the same node and pods, with no
/// incomplete pod. Timestamps, memory, names and which figures are there come back exactly;
/// CPU times and start times come back exactly below 2^51 ns (26 CPU-days), and from there
/// within one unit in the last place of the value as an `f64` (at least 1 ns): reading the
/// decimal into an `f64` and scaling it by 1e9 round twice (see `seconds_tolerance`).
pub fn kubelet_resource(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let lines = text.lines().count();
    let resource = match kubelet_parse::parse(&text, SCRAPED_AT) {
        Ok(r) => r,
        Err(ParseError::Line { line, reason }) => {
            assert!(
                (1..=lines).contains(&line) && !reason.is_empty(),
                "line {line} of {lines}: {reason:?}"
            );
            return;
        }
        Err(ParseError::TooMany(n)) => {
            assert!(
                n == MAX_SAMPLES && lines > MAX_SAMPLES,
                "TooMany({n}) of {lines} lines"
            );
            return;
        }
    };
    if let Some(node) = &resource.node {
        check_timestamp(&text, "node", node);
    }
    for ((namespace, pod), containers) in &resource.pods {
        assert!(
            !containers.is_empty(),
            "pod {namespace}/{pod} without containers"
        );
        for reading in containers.values() {
            check_timestamp(&text, "container", reading);
        }
    }
    let rendered = render_resource(&resource);
    let again = match kubelet_parse::parse(&rendered, SCRAPED_AT) {
        Ok(r) => r,
        Err(e) => panic!("{resource:?} renders as {rendered:?}, which does not parse: {e}"),
    };
    assert_eq!(again.incomplete_pods, 0, "{rendered:?}");
    match (&resource.node, &again.node) {
        (None, None) => {}
        (Some(a), Some(b)) => same_reading("node", a, b),
        (a, b) => panic!("node {a:?} renders as {rendered:?}, read back as {b:?}"),
    }
    assert!(
        resource.pods.keys().eq(again.pods.keys()),
        "pods {:?} read back as {:?}",
        resource.pods.keys().collect::<Vec<_>>(),
        again.pods.keys().collect::<Vec<_>>()
    );
    for ((key, a), b) in resource.pods.iter().zip(again.pods.values()) {
        assert!(
            a.keys().eq(b.keys()),
            "containers of {key:?}: {:?} read back as {:?}",
            a.keys().collect::<Vec<_>>(),
            b.keys().collect::<Vec<_>>()
        );
        for ((name, ra), rb) in a.iter().zip(b.values()) {
            same_reading(&format!("{key:?} {name:?}"), ra, rb);
        }
    }
}

/// A reading's timestamp is whole milliseconds, and zero only if the text has a CPU and a
/// memory sample of `kind` (`node` or `container`) whose timestamp is 0.
fn check_timestamp(text: &str, kind: &str, reading: &Reading) {
    let ns = reading.timestamp.0;
    assert_eq!(
        ns % 1_000_000,
        0,
        "{kind} timestamp {ns} ns is not whole milliseconds"
    );
    if ns != 0 {
        return;
    }
    let zero_stamped = |series: &str| {
        let name = format!("{kind}_{series}");
        text.lines().map(str::trim).any(|line| {
            let Some(rest) = line.strip_prefix(name.as_str()) else {
                return false;
            };
            let name_goes_on =
                rest.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':');
            !name_goes_on
                && rest
                    .split_whitespace()
                    .next_back()
                    .and_then(|t| t.parse::<i64>().ok())
                    == Some(0)
        })
    };
    assert!(
        zero_stamped("cpu_usage_seconds_total") && zero_stamped("memory_working_set_bytes"),
        "a {kind} reading with timestamp 0 from a text without zero timestamps: {reading:?}"
    );
}

/// How far a time of `nanos` (CPU or a start time) may move when written as seconds with nine
/// decimals and parsed back: not at all below 2^51; from there one unit in the last place of
/// `nanos` as an `f64`, and at least 1. Parsing rounds the decimal `nanos / 1e9` to the
/// nearest `f64` `x`; `x` is off by at most half its ulp, which scaled by 1e9 (less than 2^30,
/// and `x`'s exponent is 29 or 30 below that of `nanos`) is less than 0.94 ulp of `nanos`;
/// rounding `x * 1e9` to an `f64` then gives `nanos` or a neighbour, and rounding that to an
/// integer adds at most 0.5 where the ulp is below 1. Below 2^51 the ulp is at most 1/4, so
/// the error stays under 0.94/4 + 1/8 < 0.5 and rounding restores `nanos`. (The parser's
/// values are `f64` integers, so the largest is 2^64 − 2048, which comes back exactly rather
/// than overflowing to an invalid figure: the unit tests check it.)
fn seconds_tolerance(nanos: u64) -> u64 {
    if nanos < 1 << 51 {
        return 0;
    }
    let bits = 64 - nanos.leading_zeros();
    1u64 << bits.saturating_sub(53)
}

fn same_reading(what: &str, a: &Reading, b: &Reading) {
    let close = |x: u64, y: u64| x.abs_diff(y) <= seconds_tolerance(x);
    let started = match (a.started_at, b.started_at) {
        (None, None) => true,
        (Some(x), Some(y)) => close(x.0, y.0),
        _ => false,
    };
    assert!(
        a.timestamp == b.timestamp
            && a.memory_working_set == b.memory_working_set
            && close(a.cpu.0, b.cpu.0)
            && started,
        "{what}: {a:?} read back as {b:?}"
    );
}

/// Nanoseconds as seconds with nine decimals.
fn seconds(nanos: u64) -> String {
    format!("{}.{:09}", nanos / 1_000_000_000, nanos % 1_000_000_000)
}

/// A label value with the exposition format's escapes.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes `resource` as the kubelet writes `/metrics/resource`: series by series, each with
/// its `# HELP` and `# TYPE` lines, start times with the container's timestamp.
fn render_resource(resource: &Resource) -> String {
    let mut node = Vec::new();
    let mut containers: [Vec<String>; 3] = Default::default();
    if let Some(r) = &resource.node {
        let ms = r.timestamp.0 / 1_000_000;
        node.push(format!(
            "node_cpu_usage_seconds_total {} {ms}",
            seconds(r.cpu.0)
        ));
        node.push(format!(
            "node_memory_working_set_bytes {} {ms}",
            r.memory_working_set.0
        ));
    }
    for ((namespace, pod), pod_containers) in &resource.pods {
        for (container, r) in pod_containers {
            let labels = format!(
                "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
                escape_label(container),
                escape_label(namespace),
                escape_label(pod)
            );
            let ms = r.timestamp.0 / 1_000_000;
            containers[0].push(format!(
                "container_cpu_usage_seconds_total{labels} {} {ms}",
                seconds(r.cpu.0)
            ));
            containers[1].push(format!(
                "container_memory_working_set_bytes{labels} {} {ms}",
                r.memory_working_set.0
            ));
            if let Some(start) = r.started_at {
                containers[2].push(format!(
                    "container_start_time_seconds{labels} {} {ms}",
                    seconds(start.0)
                ));
            }
        }
    }
    let series = [
        (
            "container_cpu_usage_seconds_total",
            "counter",
            &containers[0],
        ),
        (
            "container_memory_working_set_bytes",
            "gauge",
            &containers[1],
        ),
        ("container_start_time_seconds", "gauge", &containers[2]),
    ];
    let mut out = String::new();
    for (name, kind, lines) in series {
        out.push_str(&format!(
            "# HELP {name} [STABLE] fuzzing\n# TYPE {name} {kind}\n"
        ));
        for line in lines {
            out.push_str(line);
            out.push('\n');
        }
    }
    for line in node {
        out.push_str(&line);
        out.push('\n');
    }
    out.push_str("# TYPE resource_scrape_error gauge\nresource_scrape_error 0\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpulse_wire::{Bytes, CpuNanos, UnixNanos};

    #[test]
    fn kubelet_resource_holds_on_inline_answers() {
        let inputs: &[&[u8]] = &[
            b"",
            b"# only a comment\n\n",
            b"node_cpu_usage_seconds_total 86412.75 1764950400125\n\
              node_memory_working_set_bytes 2.39e+09 1764950400125\n\
              container_cpu_usage_seconds_total{container=\"a\\\"b\",namespace=\"n\\\\s\",pod=\"p\\nq\"} 1.5 1764950400000\n\
              container_memory_working_set_bytes{pod=\"p\\nq\",namespace=\"n\\\\s\",container=\"a\\\"b\"} 7 1764950400000\n\
              container_start_time_seconds{container=\"a\\\"b\",namespace=\"n\\\\s\",pod=\"p\\nq\"} 1.7649e+09\n",
            // Zero timestamps are accepted (a runtime that reports none gives the epoch).
            b"node_cpu_usage_seconds_total 1 0\nnode_memory_working_set_bytes 1 0\n",
            b"node_cpu_usage_seconds_total 1 0\r\nnode_memory_working_set_bytes 1 5\r\n",
            // The largest CPU figure the parser returns, and huge timestamps.
            b"node_cpu_usage_seconds_total 18446744073.709549568 18446744073709\n\
              node_memory_working_set_bytes 1.8446744073709550e19 18446744073709\n",
            b"node_cpu_usage_seconds_total +.5 1\nnode_memory_working_set_bytes 0x1 1\n",
            b"container_cpu_usage_seconds_total{container=\"c\",namespace=\"n\",pod=\"p\"} NaN 1\n",
            b"\xff\xfe node_cpu_usage_seconds_total 1 1\n",
        ];
        for input in inputs {
            kubelet_resource(input);
        }
    }

    /// `seconds_tolerance`'s claims: exact below 2^51, within an ulp above, and the largest
    /// figure the parser returns reads back without overflowing.
    #[test]
    fn nine_decimal_seconds_read_back_within_the_tolerance() {
        let read_back = |nanos: u64| {
            let reading = Reading {
                timestamp: UnixNanos(1_000_000),
                cpu: CpuNanos(nanos),
                memory_working_set: Bytes(1),
                started_at: None,
            };
            let resource = Resource {
                node: Some(reading),
                ..Resource::default()
            };
            let text = render_resource(&resource);
            match kubelet_parse::parse(&text, SCRAPED_AT) {
                Ok(Resource { node: Some(r), .. }) => r.cpu.0,
                other => panic!("{nanos} read back as {other:?}"),
            }
        };
        // The parser's figures are f64 integers: these are, from every binade.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut inexact_below = 0;
        let mut inexact_above = 0;
        for i in 0..200_000u32 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let bits = i % 64 + 1;
            let nanos = (state >> (64 - bits)) as f64;
            if nanos >= 18_446_744_073_709_551_616.0 {
                continue;
            }
            let nanos = nanos as u64;
            let back = read_back(nanos);
            assert!(
                nanos.abs_diff(back) <= seconds_tolerance(nanos),
                "{nanos} read back as {back}"
            );
            if back != nanos {
                if nanos < 1 << 53 {
                    inexact_below += 1;
                } else {
                    inexact_above += 1;
                }
            }
        }
        // The tolerance is needed (it is not slack for a check that never fails).
        assert!(inexact_below > 0 && inexact_above > 0);
        let largest = f64::from_bits(18_446_744_073_709_551_616.0_f64.to_bits() - 1) as u64;
        assert_eq!(largest, u64::MAX - 2047);
        assert_eq!(read_back(largest), largest);
        assert_eq!(seconds_tolerance((1 << 51) - 1), 0);
        assert_eq!(seconds_tolerance(1 << 51), 1);
        assert_eq!(seconds_tolerance(1 << 53), 2);
        assert_eq!(seconds_tolerance(1 << 54), 4);
        assert_eq!(seconds_tolerance(u64::MAX), 2048);
    }
}
