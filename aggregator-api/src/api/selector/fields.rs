//! Field selectors (`?fieldSelector=`).
//!
//! A port of `fields.ParseSelector` (`pkg/fields/selector.go`): terms split on unescaped
//! commas, sorted, each `field=value`, `field==value` or `field!=value` with `\\`, `\,`, `\=`
//! escapes in values. The apiserver's list handler (`handlers/get.go`, `listOpts`) then maps
//! every field label through the scheme; metrics.k8s.io registers no conversion, so
//! `runtime.DefaultMetaV1FieldSelectorConversion` applies and any field other than
//! `metadata.name` and `metadata.namespace` is a 400 with
//! `"spec.nodeName" is not a known field selector: only "metadata.name", "metadata.namespace"`
//! ([`FieldSelector::check_fields`]). metrics-server then filters on the object's
//! `metadata.name` and, for pods only, `metadata.namespace` (`pkg/api/filter.go`,
//! `generic.AddObjectMetaFieldsSet`); a field the object lacks reads as `""`, so
//! `metadata.namespace=x` matches no node and `metadata.namespace!=x` every node.

use std::fmt;

use super::{check_length, too_many, SelectorError, MAX_REQUIREMENTS};
use crate::go;

/// The only field labels metrics.k8s.io accepts (`DefaultMetaV1FieldSelectorConversion`).
pub const SUPPORTED_FIELDS: [&str; 2] = ["metadata.name", "metadata.namespace"];

/// One term of a field selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldTerm {
    /// The field label, e.g. `metadata.name`.
    pub field: String,
    /// The unescaped value.
    pub value: String,
    /// `!=` rather than `=`/`==`.
    pub negated: bool,
}

impl FieldTerm {
    fn matches(&self, fields: &ObjectFields<'_>) -> bool {
        (fields.get(&self.field) == self.value) != self.negated
    }
}

impl fmt::Display for FieldTerm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = if self.negated { "!=" } else { "=" };
        write!(f, "{}{op}{}", self.field, escape_field_value(&self.value))
    }
}

/// The fields metrics-server filters on: the object's name and, for pods, its namespace
/// (`generic.AddObjectMetaFieldsSet`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectFields<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.namespace`: `Some` for namespaced objects (pods), `None` for nodes.
    pub namespace: Option<&'a str>,
}

impl ObjectFields<'_> {
    /// `fields.Set.Get`: the field's value, `""` when the object has no such field.
    pub fn get(&self, field: &str) -> &str {
        match field {
            "metadata.name" => self.name,
            "metadata.namespace" => self.namespace.unwrap_or(""),
            _ => "",
        }
    }
}

/// A parsed field selector: the AND of its terms, sorted like Go sorts them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<FieldTerm>,
}

impl FieldSelector {
    /// Parses a selector as `fields.ParseSelector` does (syntax only: any field label is
    /// accepted here; see [`FieldSelector::check_fields`]).
    ///
    /// # Errors
    ///
    /// `invalid selector: '<selector>'; can't understand '<term>'`, or an escape error
    /// (`invalid field selector: …`), as apimachinery words them; kpulse's own bounds.
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        check_length("field", selector)?;
        let mut parts = split_terms(selector);
        parts.sort_unstable();
        let mut terms = Vec::new();
        for part in parts {
            if part.is_empty() {
                continue;
            }
            let Some((field, op, value)) = split_term(part) else {
                return Err(SelectorError::new(format!(
                    "invalid selector: '{selector}'; can't understand '{part}'"
                )));
            };
            let value = unescape_field_value(value)?;
            // The parse-time identity transform turns an empty field with an empty value into
            // "everything", which the AND then drops.
            if field.is_empty() && value.is_empty() {
                continue;
            }
            if terms.len() == MAX_REQUIREMENTS {
                return Err(too_many("field"));
            }
            terms.push(FieldTerm {
                field: field.to_owned(),
                value,
                negated: op == "!=",
            });
        }
        Ok(Self { terms })
    }

    /// The field label check the list handler applies after validation
    /// (`FieldSelector.Transform` with `DefaultMetaV1FieldSelectorConversion`), terms in
    /// order.
    ///
    /// # Errors
    ///
    /// `"<field>" is not a known field selector: only "metadata.name", "metadata.namespace"`
    /// for the first other field.
    pub fn check_fields(&self) -> Result<(), SelectorError> {
        match self
            .terms
            .iter()
            .find(|t| !SUPPORTED_FIELDS.contains(&t.field.as_str()))
        {
            Some(t) => Err(SelectorError::new(format!(
                "{} is not a known field selector: only \"metadata.name\", \"metadata.namespace\"",
                go::quote(&t.field)
            ))),
            None => Ok(()),
        }
    }

    /// The selector that matches everything.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Whether this selector has no term (matches everything).
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The terms, in Go's order.
    pub fn terms(&self) -> &[FieldTerm] {
        &self.terms
    }

    /// Whether an object with these fields satisfies every term.
    pub fn matches(&self, fields: &ObjectFields<'_>) -> bool {
        self.terms.iter().all(|t| t.matches(fields))
    }

    /// `Selector.RequiresExactMatch`: the value of the first `=`/`==` term on `field`.
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| !t.negated && t.field == field)
            .map(|t| t.value.as_str())
    }
}

impl fmt::Display for FieldSelector {
    /// `Selector.String()`: terms joined by `,`, values escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{t}")?;
        }
        Ok(())
    }
}

/// `splitTerms`: split on commas not escaped by a backslash.
fn split_terms(selector: &str) -> Vec<&str> {
    if selector.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in selector.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(selector.get(start..i).unwrap_or_default());
            start = i + 1;
        }
    }
    terms.push(selector.get(start..).unwrap_or_default());
    terms
}

/// `splitTerm`: the first position holding `!=`, `==` or `=` (tried in that order).
fn split_term(term: &str) -> Option<(&str, &'static str, &str)> {
    for (i, _) in term.char_indices() {
        let rest = term.get(i..).unwrap_or_default();
        for op in ["!=", "==", "="] {
            if rest.starts_with(op) {
                return Some((
                    term.get(..i).unwrap_or_default(),
                    op,
                    term.get(i + op.len()..).unwrap_or_default(),
                ));
            }
        }
    }
    None
}

fn escape_field_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `fields.UnescapeValue`.
fn unescape_field_value(value: &str) -> Result<String, SelectorError> {
    if !value.contains(['\\', ',', '=']) {
        return Ok(value.to_owned());
    }
    let mut out = String::with_capacity(value.len());
    let mut in_slash = false;
    for c in value.chars() {
        if in_slash {
            match c {
                '\\' | ',' | '=' => out.push(c),
                _ => {
                    return Err(SelectorError::new(format!(
                        "invalid field selector: invalid escape sequence: \\{c}"
                    )))
                }
            }
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            // Go prints the rune with %v: its number.
            ',' | '=' => {
                return Err(SelectorError::new(format!(
                    "invalid field selector: unescaped character in value: {}",
                    u32::from(c)
                )))
            }
            _ => out.push(c),
        }
    }
    if in_slash {
        return Err(SelectorError::new(
            "invalid field selector: invalid escape sequence: \\",
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::selector::MAX_SELECTOR_BYTES;

    const FIELDS: &str =
        "is not a known field selector: only \"metadata.name\", \"metadata.namespace\"";

    #[test]
    fn field_selectors() {
        // (input, Ok(String()) or Err(message) from parse, then check_fields)
        let cases: Vec<(&str, Result<&str, String>)> = vec![
            ("", Ok("")),
            ("metadata.name=x", Ok("metadata.name=x")),
            ("metadata.name==x", Ok("metadata.name=x")),
            ("metadata.name!=x", Ok("metadata.name!=x")),
            (
                "metadata.namespace=default,metadata.name=a",
                Ok("metadata.name=a,metadata.namespace=default"),
            ),
            ("metadata.name=a\\,b", Ok("metadata.name=a\\,b")),
            ("metadata.name=a\\=b", Ok("metadata.name=a\\=b")),
            ("metadata.name=a\\\\b", Ok("metadata.name=a\\\\b")),
            ("metadata.name=", Ok("metadata.name=")),
            (",metadata.name=x,", Ok("metadata.name=x")),
            ("=", Ok("")),
            ("!=", Ok("")),
            (
                "spec.nodeName=n1",
                Err(format!("\"spec.nodeName\" {FIELDS}")),
            ),
            (
                "metadata.name=a,spec.x=b,a.b=c",
                Err(format!("\"a.b\" {FIELDS}")),
            ),
            ("metadata.uid=x", Err(format!("\"metadata.uid\" {FIELDS}"))),
            (
                " metadata.name=x",
                Err(format!("\" metadata.name\" {FIELDS}")),
            ),
            ("=x", Err(format!("\"\" {FIELDS}"))),
            (
                "a=b=c",
                Err("invalid field selector: unescaped character in value: 61".into()),
            ),
            (
                "metadata.name=a\\b",
                Err("invalid field selector: invalid escape sequence: \\b".into()),
            ),
            (
                "metadata.name=a\\",
                Err("invalid field selector: invalid escape sequence: \\".into()),
            ),
            (
                "metadata.name",
                Err("invalid selector: 'metadata.name'; can't understand 'metadata.name'".into()),
            ),
            (
                "metadata.name=a,bad",
                Err("invalid selector: 'metadata.name=a,bad'; can't understand 'bad'".into()),
            ),
        ];
        for (input, want) in cases {
            let got = FieldSelector::parse(input)
                .and_then(|s| s.check_fields().map(|()| s))
                .map(|s| s.to_string())
                .map_err(|e| e.message);
            assert_eq!(
                got.as_deref().map_err(String::as_str),
                want.as_deref().map_err(String::as_str),
                "{input:?}"
            );
        }
    }

    #[test]
    fn field_matching_uses_name_and_pod_namespace() {
        let node = ObjectFields {
            name: "n1",
            namespace: None,
        };
        let pod = ObjectFields {
            name: "web-0",
            namespace: Some("default"),
        };
        // (selector, matches node, matches pod)
        let cases = [
            ("", true, true),
            ("metadata.name=n1", true, false),
            ("metadata.name!=n1", false, true),
            ("metadata.name==web-0", false, true),
            ("metadata.namespace=default", false, true),
            ("metadata.namespace!=default", true, false),
            ("metadata.namespace=", true, false),
            (
                "metadata.name=web-0,metadata.namespace=default",
                false,
                true,
            ),
            ("metadata.name=web-0,metadata.namespace=other", false, false),
        ];
        for (selector, want_node, want_pod) in cases {
            let Ok(s) = FieldSelector::parse(selector) else {
                panic!("{selector:?}")
            };
            assert_eq!(s.matches(&node), want_node, "{selector:?} on node");
            assert_eq!(s.matches(&pod), want_pod, "{selector:?} on pod");
        }
        let Ok(s) = FieldSelector::parse("metadata.name!=a,metadata.name=b") else {
            panic!("parse")
        };
        assert_eq!(s.requires_exact_match("metadata.name"), Some("b"));
        assert_eq!(s.requires_exact_match("metadata.namespace"), None);
        assert_eq!(s.terms().len(), 2);
        assert!(FieldSelector::everything().is_empty());
    }

    #[test]
    fn field_selector_bounds() {
        let many = vec!["metadata.name=a"; MAX_REQUIREMENTS + 1].join(",");
        assert_eq!(
            FieldSelector::parse(&many).map_err(|e| e.message),
            Err("field selector has too many requirements: at most 256 are accepted".to_owned())
        );
        let long = "x".repeat(MAX_SELECTOR_BYTES + 1);
        assert!(FieldSelector::parse(&long).is_err());
    }
}
