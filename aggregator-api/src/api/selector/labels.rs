//! Label selectors (`?labelSelector=`).
//!
//! A port of apimachinery's `labels.Parse` (`pkg/labels/selector.go`): the same lexer (bytes;
//! whitespace is space, tab, CR, LF; a NUL byte ends the input the way Go's lexer reads it),
//! the same recursive-descent parser and the same validation (`NewRequirement`, keys checked by
//! `content.IsLabelKey`, values by `content.IsLabelValue`), so that a bad selector yields the
//! apiserver's message byte for byte, e.g.
//! `unable to parse requirement: <nil>: Invalid value: "-a": name part must consist of …`.
//! Operators: `=`, `==`, `!=`, `in (…)`, `notin (…)`, `key` (exists), `!key` (does not
//! exist), and apimachinery's `>`/`<` (integer comparison). `!=` and `notin` match objects
//! that lack the label, as upstream.
//!
//! metrics-server hands the parsed selector to its listers (`pkg/api/node.go`, `pod.go`), so a
//! selector only filters by the node's or pod's labels.

use std::collections::BTreeMap;
use std::fmt;

use super::validation::{invalid_label_key, label_value_errors};
use super::{aggregate, check_length, too_many, SelectorError, MAX_REQUIREMENTS};
use crate::go;

/// A label selector operator (apimachinery `selection.Operator`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operator {
    /// `key in (v1,v2)`.
    In,
    /// `key notin (v1,v2)`: also true when the label is absent.
    NotIn,
    /// `key=value`.
    Equals,
    /// `key==value`.
    DoubleEquals,
    /// `key!=value`: also true when the label is absent.
    NotEquals,
    /// `key`.
    Exists,
    /// `!key`.
    DoesNotExist,
    /// `key>n`: the label parses as an integer greater than `n`.
    GreaterThan,
    /// `key<n`: the label parses as an integer less than `n`.
    LessThan,
}

/// One parsed requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    key: String,
    operator: Operator,
    /// Sorted and deduplicated, as Go's `sets.String.List()` hands them over.
    values: Vec<String>,
}

impl Requirement {
    /// The label key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The operator.
    pub fn operator(&self) -> Operator {
        self.operator
    }

    /// The values, sorted and deduplicated (empty for `Exists`/`DoesNotExist`).
    pub fn values(&self) -> &[String] {
        &self.values
    }

    fn has_value(&self, value: &str) -> bool {
        self.values
            .binary_search_by(|v| v.as_str().cmp(value))
            .is_ok()
    }

    /// Whether `labels` satisfy this requirement (`Requirement.Matches`).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self.operator {
            Operator::In | Operator::Equals | Operator::DoubleEquals => labels
                .get(&self.key)
                .is_some_and(|value| self.has_value(value)),
            Operator::NotIn | Operator::NotEquals => labels
                .get(&self.key)
                .is_none_or(|value| !self.has_value(value)),
            Operator::Exists => labels.contains_key(&self.key),
            Operator::DoesNotExist => !labels.contains_key(&self.key),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(Ok(have)) = labels.get(&self.key).map(|v| go::parse_int(v)) else {
                    return false;
                };
                let [want] = self.values.as_slice() else {
                    return false;
                };
                let Ok(want) = go::parse_int(want) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    /// `Requirement.String()`: `!key`, `key`, `key=v`, `key in (a,b)`, ….
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.operator {
            Operator::DoesNotExist => return write!(f, "!{}", self.key),
            Operator::Exists => return f.write_str(&self.key),
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::NotEquals => "!=",
            Operator::In => " in ",
            Operator::NotIn => " notin ",
            Operator::GreaterThan => ">",
            Operator::LessThan => "<",
        };
        let values = self.values.join(",");
        match self.operator {
            Operator::In | Operator::NotIn => write!(f, "{}{op}({values})", self.key),
            _ => write!(f, "{}{op}{values}", self.key),
        }
    }
}

/// A parsed label selector: the AND of its requirements. The empty selector matches
/// everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses a selector as `labels.Parse` does.
    ///
    /// # Errors
    ///
    /// apimachinery's message for invalid syntax, keys or values; kpulse's own for a selector
    /// over [`MAX_SELECTOR_BYTES`](super::MAX_SELECTOR_BYTES) or [`MAX_REQUIREMENTS`].
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        check_length("label", selector)?;
        let mut parser = Parser::new(selector);
        let mut requirements = parser.parse()?;
        // Sorted by key, as `sort.Sort(ByKey(items))`. Go's sort is unstable, so requirements
        // on the same key may print in another order there; only `Display` shows it, and no
        // client sees that.
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { requirements })
    }

    /// The selector that matches everything.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Whether this selector has no requirement (matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// `Selector.RequiresExactMatch`: the value `key` must equal, if the first requirement on
    /// `key` pins one (`=`, `==`, or `in` with one value).
    pub fn requires_exact_match(&self, key: &str) -> Option<&str> {
        let r = self.requirements.iter().find(|r| r.key == key)?;
        match (r.operator, r.values.as_slice()) {
            (Operator::Equals | Operator::DoubleEquals | Operator::In, [value]) => Some(value),
            _ => None,
        }
    }
}

impl fmt::Display for LabelSelector {
    /// `Selector.String()`: requirements joined by `,`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

fn keyword(literal: &[u8]) -> Option<Token> {
    Some(match literal {
        b")" => Token::ClosedPar,
        b"," => Token::Comma,
        b"!" => Token::DoesNotExist,
        b"==" => Token::DoubleEquals,
        b"=" => Token::Equals,
        b">" => Token::GreaterThan,
        b"in" => Token::In,
        b"<" => Token::LessThan,
        b"!=" => Token::NotEquals,
        b"notin" => Token::NotIn,
        b"(" => Token::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

/// Go's `Lexer`: reads bytes; a 0 byte reads like the end of the input (and is consumed).
struct Lexer<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Lexer<'_> {
    fn read(&mut self) -> u8 {
        match self.s.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                b
            }
            None => 0,
        }
    }

    fn unread(&mut self) {
        self.pos = self.pos.saturating_sub(1);
    }

    fn lex(&mut self) -> (Token, String) {
        let mut ch = self.read();
        while is_whitespace(ch) {
            ch = self.read();
        }
        if ch == 0 {
            return (Token::EndOfString, String::new());
        }
        self.unread();
        if is_special(ch) {
            self.scan_special()
        } else {
            self.scan_identifier()
        }
    }

    fn scan_identifier(&mut self) -> (Token, String) {
        let start = self.pos;
        let mut end = start;
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if is_special(ch) || is_whitespace(ch) {
                self.unread();
                break;
            }
            end = self.pos;
        }
        // A NUL byte inside stops the identifier; the bytes before it are kept.
        let literal = self.s.get(start..end).unwrap_or_default();
        let text = String::from_utf8_lossy(literal).into_owned();
        (keyword(literal).unwrap_or(Token::Identifier), text)
    }

    fn scan_special(&mut self) -> (Token, String) {
        let start = self.pos;
        let mut last: Option<(Token, usize)> = None;
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if !is_special(ch) {
                self.unread();
                break;
            }
            let buffer = self.s.get(start..self.pos).unwrap_or_default();
            if let Some(token) = keyword(buffer) {
                last = Some((token, self.pos));
            } else if last.is_some() {
                self.unread();
                break;
            }
        }
        match last {
            Some((token, end)) => {
                let literal = self.s.get(start..end).unwrap_or_default();
                (token, String::from_utf8_lossy(literal).into_owned())
            }
            // Unreachable: every single special character is a token. Go answers an error
            // token; treat it as the end of the input.
            None => (Token::EndOfString, String::new()),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

struct Parser {
    items: Vec<(Token, String)>,
    position: usize,
}

impl Parser {
    fn new(selector: &str) -> Self {
        let mut lexer = Lexer {
            s: selector.as_bytes(),
            pos: 0,
        };
        let mut items = Vec::new();
        loop {
            let (token, literal) = lexer.lex();
            items.push((token, literal));
            if token == Token::EndOfString {
                break;
            }
        }
        Self { items, position: 0 }
    }

    fn item(&self, at: usize, context: Context) -> (Token, &str) {
        match self.items.get(at) {
            Some((token, literal)) => {
                let token = match (context, token) {
                    (Context::Values, Token::In | Token::NotIn) => Token::Identifier,
                    _ => *token,
                };
                (token, literal)
            }
            None => (Token::EndOfString, ""),
        }
    }

    fn lookahead(&self, context: Context) -> (Token, String) {
        let (t, l) = self.item(self.position, context);
        (t, l.to_owned())
    }

    fn consume(&mut self, context: Context) -> (Token, String) {
        let (t, l) = self.item(self.position, context);
        let out = (t, l.to_owned());
        self.position += 1;
        out
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut requirements = Vec::new();
        loop {
            let (token, literal) = self.lookahead(Context::Values);
            match token {
                Token::Identifier | Token::DoesNotExist => {
                    let r = self.parse_requirement().map_err(|e| {
                        SelectorError::new(format!("unable to parse requirement: {e}"))
                    })?;
                    if requirements.len() == MAX_REQUIREMENTS {
                        return Err(too_many("label"));
                    }
                    requirements.push(r);
                    let (t, l) = self.consume(Context::Values);
                    match t {
                        Token::EndOfString => return Ok(requirements),
                        Token::Comma => {
                            let (t2, l2) = self.lookahead(Context::Values);
                            if t2 != Token::Identifier && t2 != Token::DoesNotExist {
                                return Err(SelectorError::new(format!(
                                    "found '{l2}', expected: identifier after ','"
                                )));
                            }
                        }
                        _ => {
                            return Err(SelectorError::new(format!(
                                "found '{l}', expected: ',' or 'end of string'"
                            )))
                        }
                    }
                }
                Token::EndOfString => return Ok(requirements),
                _ => {
                    return Err(SelectorError::new(format!(
                        "found '{literal}', expected: !, identifier, or 'end of string'"
                    )))
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, String> {
        let (key, operator) = self.parse_key_and_infer_operator()?;
        if let Some(op @ (Operator::Exists | Operator::DoesNotExist)) = operator {
            return new_requirement(key, op, Vec::new());
        }
        let operator = self.parse_operator()?;
        let values = match operator {
            Operator::In | Operator::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        new_requirement(key, operator, values)
    }

    fn parse_key_and_infer_operator(&mut self) -> Result<(String, Option<Operator>), String> {
        let mut operator = None;
        let (mut token, mut literal) = self.consume(Context::Values);
        if token == Token::DoesNotExist {
            operator = Some(Operator::DoesNotExist);
            (token, literal) = self.consume(Context::Values);
        }
        if token != Token::Identifier {
            return Err(format!("found '{literal}', expected: identifier"));
        }
        // Go validates with a nil field path, which prints as "<nil>".
        if let Some(e) = invalid_label_key(&literal, "<nil>") {
            return Err(e);
        }
        let (next, _) = self.lookahead(Context::Values);
        if (next == Token::EndOfString || next == Token::Comma) && operator.is_none() {
            operator = Some(Operator::Exists);
        }
        Ok((literal, operator))
    }

    fn parse_operator(&mut self) -> Result<Operator, String> {
        let (token, literal) = self.consume(Context::KeyAndOperator);
        Ok(match token {
            Token::In => Operator::In,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            _ => {
                return Err(format!(
                    "found '{literal}', expected: in, notin, =, ==, !=, gt, lt"
                ))
            }
        })
    }

    fn parse_values(&mut self) -> Result<Vec<String>, String> {
        let (token, literal) = self.consume(Context::Values);
        if token != Token::OpenPar {
            return Err(format!("found '{literal}' expected: '('"));
        }
        let (token, literal) = self.lookahead(Context::Values);
        match token {
            Token::Identifier | Token::Comma => {
                let values = self.parse_identifiers_list()?;
                let (token, _) = self.consume(Context::Values);
                if token != Token::ClosedPar {
                    // Go reports the literal looked at before the list, as here.
                    return Err(format!("found '{literal}', expected: ')'"));
                }
                Ok(values)
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(vec![String::new()])
            }
            _ => Err(format!(
                "found '{literal}', expected: ',', ')' or identifier"
            )),
        }
    }

    fn parse_identifiers_list(&mut self) -> Result<Vec<String>, String> {
        let mut set = std::collections::BTreeSet::new();
        loop {
            let (token, literal) = self.consume(Context::Values);
            match token {
                Token::Identifier => {
                    set.insert(literal);
                    let (next, next_literal) = self.lookahead(Context::Values);
                    match next {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(set.into_iter().collect()),
                        _ => return Err(format!("found '{next_literal}', expected: ',' or ')'")),
                    }
                }
                Token::Comma => {
                    if set.is_empty() {
                        set.insert(String::new());
                    }
                    let (next, _) = self.lookahead(Context::Values);
                    if next == Token::ClosedPar {
                        set.insert(String::new());
                        return Ok(set.into_iter().collect());
                    }
                    if next == Token::Comma {
                        set.insert(String::new());
                    }
                }
                _ => return Err(format!("found '{literal}', expected: ',', or identifier")),
            }
        }
    }

    fn parse_exact_value(&mut self) -> Result<Vec<String>, String> {
        let (token, _) = self.lookahead(Context::Values);
        if token == Token::EndOfString || token == Token::Comma {
            return Ok(vec![String::new()]);
        }
        let (token, literal) = self.consume(Context::Values);
        if token == Token::Identifier {
            return Ok(vec![literal]);
        }
        Err(format!("found '{literal}', expected: identifier"))
    }
}

/// `NewRequirement` as reached from the parser: the key is already valid and the value count
/// right for the operator, so only `>`/`<` integers and label values are checked. Errors are
/// aggregated like `field.ErrorList.ToAggregate()`.
fn new_requirement(
    key: String,
    operator: Operator,
    values: Vec<String>,
) -> Result<Requirement, String> {
    let mut errors: Vec<String> = Vec::new();
    if matches!(operator, Operator::GreaterThan | Operator::LessThan) {
        for (i, value) in values.iter().enumerate() {
            if go::parse_int(value).is_err() {
                errors.push(format!(
                    "values[{i}]: Invalid value: {}: for 'Gt', 'Lt' operators, the value must be an integer",
                    go::quote(value)
                ));
            }
        }
    }
    for (i, value) in values.iter().enumerate() {
        let messages = label_value_errors(value);
        if !messages.is_empty() {
            errors.push(format!(
                "values[{i}][{key}]: Invalid value: {}: {}",
                go::quote(value),
                messages.join("; ")
            ));
        }
    }
    if errors.is_empty() {
        Ok(Requirement {
            key,
            operator,
            values,
        })
    } else {
        Err(aggregate(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::selector::{MAX_REQUIREMENTS, MAX_SELECTOR_BYTES};

    // apimachinery's messages, including RegexError's doubled space before "or".
    const KEY_RE: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    const VALUE_RE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn parse_err(selector: &str) -> String {
        match LabelSelector::parse(selector) {
            Ok(s) => panic!("{selector:?} parsed as {s}"),
            Err(e) => e.message,
        }
    }

    #[test]
    fn valid_label_selectors_parse_like_go() {
        // (input, Go's String() of the parsed selector)
        let cases = [
            ("", ""),
            ("a", "a"),
            ("!a", "!a"),
            ("a=b", "a=b"),
            ("a==b", "a==b"),
            ("a!=b", "a!=b"),
            (" a = b ", "a=b"),
            ("a\tin\t(x)", "a in (x)"),
            ("a\nin (y,x,y)", "a in (x,y)"),
            ("a notin (x)", "a notin (x)"),
            ("a in ()", "a in ()"),
            ("a in (,)", "a in ()"),
            ("a in (x,)", "a in (,x)"),
            ("a in (,x)", "a in (,x)"),
            ("a in (x,,y)", "a in (,x,y)"),
            ("a=", "a="),
            ("a==,b", "a==,b"),
            ("a!=,b", "a!=,b"),
            ("a>1", "a>1"),
            ("a<1", "a<1"),
            ("a>01", "a>01"),
            ("z,b=c,!a", "!a,b=c,z"),
            ("in in (in)", "in in (in)"),
            ("notin notin (notin)", "notin notin (notin)"),
            ("a=in", "a=in"),
            ("example.com/a=b", "example.com/a=b"),
            ("a_b.c-d=e_f.g-h", "a_b.c-d=e_f.g-h"),
            (
                "app.kubernetes.io/name in (web, api),tier!=db",
                "app.kubernetes.io/name in (api,web),tier!=db",
            ),
            // A NUL byte ends the input the way Go's lexer reads it.
            ("a=b \u{0} junk", "a=b"),
        ];
        for (input, want) in cases {
            match LabelSelector::parse(input) {
                Ok(s) => assert_eq!(s.to_string(), want, "{input:?}"),
                Err(e) => panic!("{input:?}: {e}"),
            }
        }
        let long_key = format!("{}=v", "k".repeat(63));
        assert!(LabelSelector::parse(&long_key).is_ok());
        let long_value = format!("k={}", "v".repeat(63));
        assert!(LabelSelector::parse(&long_value).is_ok());
    }

    #[test]
    fn invalid_label_selectors_give_apimachinery_messages() {
        let cases: Vec<(String, String)> = vec![
            ("-a=b".into(), format!("unable to parse requirement: <nil>: Invalid value: \"-a\": name part {KEY_RE}")),
            ("a_=b".into(), format!("unable to parse requirement: <nil>: Invalid value: \"a_\": name part {KEY_RE}")),
            ("é=a".into(), format!("unable to parse requirement: <nil>: Invalid value: \"é\": name part {KEY_RE}")),
            ("a=-b".into(), format!("unable to parse requirement: values[0][a]: Invalid value: \"-b\": {VALUE_RE}")),
            ("a=é".into(), format!("unable to parse requirement: values[0][a]: Invalid value: \"é\": {VALUE_RE}")),
            ("a=b_,c=d_".into(), format!("unable to parse requirement: values[0][a]: Invalid value: \"b_\": {VALUE_RE}")),
            ("a>-5".into(), format!("unable to parse requirement: values[0][a]: Invalid value: \"-5\": {VALUE_RE}")),
            (
                "a in (-x,y_)".into(),
                format!(
                    "unable to parse requirement: [values[0][a]: Invalid value: \"-x\": {VALUE_RE}, values[1][a]: Invalid value: \"y_\": {VALUE_RE}]"
                ),
            ),
            ("a>x".into(), "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer".into()),
            ("a>".into(), "unable to parse requirement: values[0]: Invalid value: \"\": for 'Gt', 'Lt' operators, the value must be an integer".into()),
            ("a>1a".into(), "unable to parse requirement: values[0]: Invalid value: \"1a\": for 'Gt', 'Lt' operators, the value must be an integer".into()),
            ("a>99999999999999999999".into(), "unable to parse requirement: values[0]: Invalid value: \"99999999999999999999\": for 'Gt', 'Lt' operators, the value must be an integer".into()),
            (format!("k={}", "v".repeat(64)), format!("unable to parse requirement: values[0][k]: Invalid value: \"{}\": must be no more than 63 characters", "v".repeat(64))),
            (format!("{}=v", "x".repeat(64)), format!("unable to parse requirement: <nil>: Invalid value: \"{}\": name part must be no more than 63 characters", "x".repeat(64))),
            (format!("{}/n=v", "p".repeat(254)), format!("unable to parse requirement: <nil>: Invalid value: \"{}/n\": prefix part must be no more than 253 characters", "p".repeat(254))),
            ("/a=b".into(), "unable to parse requirement: <nil>: Invalid value: \"/a\": prefix part must be non-empty".into()),
            ("example.com/".into(), format!("unable to parse requirement: <nil>: Invalid value: \"example.com/\": name part must be non-empty; name part {KEY_RE}")),
            (
                "Ex.com/a=b".into(),
                "unable to parse requirement: <nil>: Invalid value: \"Ex.com/a\": prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into(),
            ),
            ("a/b/c=d".into(), format!("unable to parse requirement: <nil>: Invalid value: \"a/b/c\": a qualified name {KEY_RE} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')")),
            ("a in (x y)".into(), "unable to parse requirement: found 'y', expected: ',' or ')'".into()),
            ("a in x".into(), "unable to parse requirement: found 'x' expected: '('".into()),
            ("a notin".into(), "unable to parse requirement: found '' expected: '('".into()),
            ("a (".into(), "unable to parse requirement: found '(', expected: in, notin, =, ==, !=, gt, lt".into()),
            ("a b".into(), "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt".into()),
            ("a\u{0}b".into(), "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt".into()),
            ("a>+1".into(), format!("unable to parse requirement: values[0][a]: Invalid value: \"+1\": {VALUE_RE}")),
            ("a<=1".into(), "unable to parse requirement: found '=', expected: identifier".into()),
            ("a=(b)".into(), "unable to parse requirement: found '(', expected: identifier".into()),
            ("!".into(), "unable to parse requirement: found '', expected: identifier".into()),
            ("a=b c=d".into(), "found 'c', expected: ',' or 'end of string'".into()),
            ("a=b)".into(), "found ')', expected: ',' or 'end of string'".into()),
            ("!a=b".into(), "found '=', expected: ',' or 'end of string'".into()),
            ("a,".into(), "found '', expected: identifier after ','".into()),
            ("a,,b".into(), "found ',', expected: identifier after ','".into()),
            ("(".into(), "found '(', expected: !, identifier, or 'end of string'".into()),
            (")a".into(), "found ')', expected: !, identifier, or 'end of string'".into()),
            ("=".into(), "found '=', expected: !, identifier, or 'end of string'".into()),
        ];
        for (input, want) in cases {
            assert_eq!(parse_err(&input), want, "{input:?}");
        }
    }

    #[test]
    fn label_matching_semantics() {
        let none = labels(&[]);
        let web = labels(&[("app", "web"), ("tier", "front"), ("n", "5")]);
        let empty_app = labels(&[("app", "")]);
        // (selector, matches none, matches web, matches empty_app)
        let cases = [
            ("", true, true, true),
            ("app", false, true, true),
            ("!app", true, false, false),
            ("app=web", false, true, false),
            ("app==web", false, true, false),
            ("app!=web", true, false, true),
            ("app!=api", true, true, true),
            ("app=", false, false, true),
            ("app!=", true, true, false),
            ("app in (web,api)", false, true, false),
            ("app in ()", false, false, true),
            ("app notin (web)", true, false, true),
            ("app notin (api)", true, true, true),
            ("app=web,tier=front", false, true, false),
            ("app=web,tier=back", false, false, false),
            ("app,!tier", false, false, true),
            ("n>4", false, true, false),
            ("n>5", false, false, false),
            ("n<6", false, true, false),
            ("n>-4x", false, false, false),
            ("app>1", false, false, false),
        ];
        for (selector, want_none, want_web, want_empty) in cases {
            let Ok(s) = LabelSelector::parse(selector) else {
                // Only ">-4x" is invalid: its value fails validation.
                assert_eq!(selector, "n>-4x");
                continue;
            };
            assert_eq!(s.matches(&none), want_none, "{selector:?} on no labels");
            assert_eq!(s.matches(&web), want_web, "{selector:?} on web");
            assert_eq!(
                s.matches(&empty_app),
                want_empty,
                "{selector:?} on app=\"\""
            );
        }
    }

    #[test]
    fn requirements_and_exact_matches() {
        let Ok(s) = LabelSelector::parse("b in (y),a=x,c notin (z),d") else {
            panic!("parse")
        };
        let keys: Vec<&str> = s.requirements().iter().map(Requirement::key).collect();
        assert_eq!(keys, ["a", "b", "c", "d"]);
        assert_eq!(s.requirements()[2].operator(), Operator::NotIn);
        assert_eq!(s.requirements()[2].values(), ["z"]);
        assert_eq!(s.requires_exact_match("a"), Some("x"));
        assert_eq!(s.requires_exact_match("b"), Some("y"));
        assert_eq!(s.requires_exact_match("c"), None);
        assert_eq!(s.requires_exact_match("zz"), None);
        assert!(LabelSelector::everything().is_empty());
        assert!(!s.is_empty());
    }

    #[test]
    fn label_selector_bounds() {
        let many = vec!["a"; MAX_REQUIREMENTS].join(",");
        assert!(LabelSelector::parse(&many).is_ok());
        let too_many = vec!["a"; MAX_REQUIREMENTS + 1].join(",");
        assert_eq!(
            parse_err(&too_many),
            "label selector has too many requirements: at most 256 are accepted"
        );
        let long = format!("a in ({})", "x".repeat(MAX_SELECTOR_BYTES));
        assert_eq!(
            parse_err(&long),
            format!(
                "label selector is too long: {} bytes, at most 16384 are accepted",
                long.len()
            )
        );
    }
}
