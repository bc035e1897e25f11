//! Label and field selectors as the apiserver parses and applies them for metrics-server.
//!
//! * `labels.rs`: `?labelSelector=`, a port of apimachinery's `labels.Parse` ([`LabelSelector`]);
//! * `fields.rs`: `?fieldSelector=`, a port of `fields.ParseSelector` and the field label check
//!   of the list handler ([`FieldSelector`]);
//! * `validation.rs`: the `content` checks (label keys and values, DNS-1123 names) and their
//!   messages, byte for byte as apimachinery words them.
//!
//! This file holds what both selectors share: [`SelectorError`], the bounds, and
//! `utilerrors.NewAggregate`'s message format.
//!
//! # Bounds
//!
//! kpulse-specific, not upstream: a selector longer than [`MAX_SELECTOR_BYTES`] or with more
//! than [`MAX_REQUIREMENTS`] requirements (terms) is rejected with a message saying so.

mod fields;
mod labels;
mod validation;

pub use fields::{FieldSelector, FieldTerm, ObjectFields, SUPPORTED_FIELDS};
pub use labels::{LabelSelector, Operator, Requirement};
pub(crate) use validation::{is_dns1123_label, is_dns1123_subdomain};

/// Longest selector accepted, in bytes (kpulse's bound; the apiserver has none).
pub const MAX_SELECTOR_BYTES: usize = 16 * 1024;

/// Most requirements (label selector) or terms (field selector) accepted (kpulse's bound).
pub const MAX_REQUIREMENTS: usize = 256;

/// A selector that does not parse, or names an unsupported field; the message is the
/// apiserver's, to be sent as a 400 `BadRequest`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SelectorError {
    /// The error text, exactly as apimachinery words it.
    pub message: String,
}

impl SelectorError {
    fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

fn check_length(kind: &str, selector: &str) -> Result<(), SelectorError> {
    if selector.len() > MAX_SELECTOR_BYTES {
        return Err(SelectorError::new(format!(
            "{kind} selector is too long: {} bytes, at most {MAX_SELECTOR_BYTES} are accepted",
            selector.len()
        )));
    }
    Ok(())
}

fn too_many(kind: &str) -> SelectorError {
    SelectorError::new(format!(
        "{kind} selector has too many requirements: at most {MAX_REQUIREMENTS} are accepted"
    ))
}

/// `utilerrors.NewAggregate(…).Error()` over already formatted messages: duplicates dropped,
/// one message bare, several as `[a, b]`.
pub(crate) fn aggregate(messages: Vec<String>) -> String {
    let mut seen: Vec<String> = Vec::new();
    for m in messages {
        if !seen.contains(&m) {
            seen.push(m);
        }
    }
    if seen.len() == 1 {
        seen.pop().unwrap_or_default()
    } else {
        format!("[{}]", seen.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A small deterministic generator for garbage inputs.
    fn garbage(seed: &mut u64, alphabet: &[&str], max_len: u64) -> String {
        let mut next = || {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed
        };
        let len = next() % (max_len + 1);
        (0..len)
            .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
            .collect()
    }

    #[test]
    fn garbage_never_panics() {
        let alphabet = [
            "a",
            "b",
            "1",
            "-",
            "_",
            ".",
            "/",
            "=",
            "!",
            "(",
            ")",
            ",",
            " ",
            "\t",
            "<",
            ">",
            "in",
            "notin",
            "\\",
            "é",
            "\u{0}",
            "metadata.name",
            "\u{2028}",
            "%",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        let any: BTreeMap<String, String> = [("a", "1"), ("b", "")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let fields = ObjectFields {
            name: "a",
            namespace: Some("b"),
        };
        for _ in 0..20_000 {
            let input = garbage(&mut seed, &alphabet, 24);
            if let Ok(s) = LabelSelector::parse(&input) {
                let _ = s.matches(&any);
                // What Go prints parses back to the same requirements.
                let again = LabelSelector::parse(&s.to_string());
                assert_eq!(
                    again.as_ref().map(|a| a.requirements().len()).ok(),
                    Some(s.requirements().len()),
                    "{input:?}"
                );
            }
            if let Ok(s) = FieldSelector::parse(&input) {
                let _ = s.check_fields();
                let _ = s.matches(&fields);
            }
        }
    }
}
