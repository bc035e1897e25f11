//! Go's runtime behaviour that a client can observe, reproduced in one place.
//!
//! metrics-server is a Go program: where its answers depend on Go's standard library or on
//! apimachinery's small helpers (how a string is quoted in an error, how a duration is
//! printed or parsed, how a URL is unescaped, which query values mean `false`), kpulse must
//! answer the same, byte for byte. Every such function lives here, named after the Go
//! function it matches, with where a client sees it:
//!
//! | here | Go | where a client sees it |
//! | --- | --- | --- |
//! | [`quote`] | `strconv.Quote` (`%q`) | names and values echoed in Status messages, selector errors |
//! | [`parse_int`], [`IntError`] | `strconv.ParseInt(s, 10, 64)` | `?limit=`, `?timeoutSeconds=`, `>`/`<` selectors |
//! | [`parse_duration`], [`DurationError`] | `time.ParseDuration` | `?timeout=` (and its error), duration flags |
//! | [`format_duration`] | `time.Duration.String` | `window` of every object, the Table's Window column |
//! | [`unescape`], [`UnescapeError`] | `url.PathUnescape`, `url.QueryUnescape` | the request path and query |
//! | [`lossy`] | `encoding/json` on invalid UTF-8 | decoded path and query values echoed back |
//! | [`escaped_path`] | `url.URL.EscapedPath` | the URL in a RequestInfo error |
//! | [`convert_bool`] | apimachinery `runtime.Convert_Slice_string_To_bool` | `?watch=`, `?allowWatchBookmarks=`, `?export=` |
//!
//! The unit test `matches_output_captured_from_go` checks each of them against
//! `testdata/go-edge/golden.jsonl`, which a Go program beside it (`main.go`, built with the
//! Go toolchain and apimachinery v0.33.2, the version metrics-server v0.8.0 builds with)
//! prints; `cargo xtask go-golden` regenerates it, and `--check` (run by the lints stage of
//! `cargo xtask test`) fails when the checked-in file is not what Go prints.

use std::fmt::Write as _;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// strconv.Quote.

/// `strconv.Quote` (and `fmt`'s `%q`): double quotes around the text, with `\"`, `\\`, the
/// short escapes `\a \b \f \n \r \t \v`, `\xNN` for the other ASCII controls and DEL,
/// `\uNNNN` / `\UNNNNNNNN` for every other character Go does not consider printable
/// (`unicode.IsPrint`: unassigned code points included).
pub fn quote(text: &str) -> String {
    quote_bytes(text.as_bytes())
}

/// [`quote`] of bytes that need not be UTF-8: each byte of an invalid sequence is `\xNN`,
/// as Go quotes a `string` holding them.
fn quote_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 2);
    out.push('"');
    for chunk in bytes.utf8_chunks() {
        for ch in chunk.valid().chars() {
            push_quoted_char(&mut out, ch);
        }
        for &b in chunk.invalid() {
            push_hex(&mut out, "\\x", 2, u32::from(b));
        }
    }
    out.push('"');
    out
}

fn push_quoted_char(out: &mut String, ch: char) {
    match ch {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\u{07}' => out.push_str("\\a"),
        '\u{08}' => out.push_str("\\b"),
        '\u{0c}' => out.push_str("\\f"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{0b}' => out.push_str("\\v"),
        '\u{00}'..='\u{1f}' | '\u{7f}' => push_hex(out, "\\x", 2, u32::from(ch)),
        _ if is_print(ch) => out.push(ch),
        _ if u32::from(ch) < 0x1_0000 => push_hex(out, "\\u", 4, u32::from(ch)),
        _ => push_hex(out, "\\U", 8, u32::from(ch)),
    }
}

/// Appends `prefix` and `value` as `width` lowercase hex digits.
fn push_hex(out: &mut String, prefix: &str, width: usize, value: u32) {
    // Writing to a String cannot fail.
    let _ = write!(out, "{prefix}{value:0width$x}");
}

/// Go's `unicode.IsPrint` (which `strconv.IsPrint` tabulates): letters, marks, numbers,
/// punctuation and symbols (general categories L, M, N, P, S), and U+0020 as the only space.
/// The categories are Unicode 15.0's, as in Go 1.21 to 1.26.
fn is_print(ch: char) -> bool {
    use unicode_general_category::{get_general_category, GeneralCategory as C};
    if ch == ' ' {
        return true;
    }
    !matches!(
        get_general_category(ch),
        C::Control
            | C::Format
            | C::Surrogate
            | C::PrivateUse
            | C::Unassigned
            | C::SpaceSeparator
            | C::LineSeparator
            | C::ParagraphSeparator
    )
}

// ---------------------------------------------------------------------------------------------
// strconv.ParseInt.

/// A `strconv.ParseInt(s, 10, 64)` failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntError {
    /// `invalid syntax`.
    Syntax,
    /// `value out of range`.
    Range,
}

impl IntError {
    /// The error text Go prints: `strconv.ParseInt: parsing "<s>": <reason>`.
    pub fn message(self, input: &str) -> String {
        self.message_bytes(input.as_bytes())
    }

    /// [`IntError::message`] for an input that need not be UTF-8.
    pub fn message_bytes(self, input: &[u8]) -> String {
        let reason = match self {
            Self::Syntax => "invalid syntax",
            Self::Range => "value out of range",
        };
        format!("strconv.ParseInt: parsing {}: {reason}", quote_bytes(input))
    }
}

/// `strconv.ParseInt(s, 10, 64)`: optional sign, ASCII digits, no underscores; a range error
/// wins as soon as the digits overflow, even before a later bad character.
///
/// # Errors
///
/// [`IntError::Syntax`] or [`IntError::Range`], as Go decides.
pub fn parse_int(s: &str) -> Result<i64, IntError> {
    parse_int_bytes(s.as_bytes())
}

/// [`parse_int`] of bytes that need not be UTF-8.
///
/// # Errors
///
/// As [`parse_int`].
pub fn parse_int_bytes(s: &[u8]) -> Result<i64, IntError> {
    let (negative, digits) = match s.first() {
        Some(b'+') => (false, s.get(1..).unwrap_or_default()),
        Some(b'-') => (true, s.get(1..).unwrap_or_default()),
        _ => (false, s),
    };
    if digits.is_empty() {
        return Err(IntError::Syntax);
    }
    let mut n: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return Err(IntError::Syntax);
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(b - b'0')))
            .ok_or(IntError::Range)?;
    }
    if negative {
        if n > 1 << 63 {
            return Err(IntError::Range);
        }
        Ok(0i64.wrapping_sub_unsigned(n))
    } else {
        i64::try_from(n).map_err(|_| IntError::Range)
    }
}

// ---------------------------------------------------------------------------------------------
// time.ParseDuration and time.Duration.String.

/// A `time.ParseDuration` failure; its text is Go's (`time: invalid duration "x"`,
/// `time: missing unit in duration "1"`, `time: unknown unit "d" in duration "1d"`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DurationError {
    message: String,
}

/// `time.ParseDuration`: a signed sequence of decimal numbers, each with an optional
/// fraction and a unit (`ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`), such as `1.5h`,
/// `-1m30s` or `.5s`; `0` needs no unit. Returns nanoseconds.
///
/// # Errors
///
/// Go's error for an empty or malformed input, a missing or unknown unit, or a value
/// outside an `int64` of nanoseconds.
pub fn parse_duration(s: &str) -> Result<i64, DurationError> {
    parse_duration_bytes(s.as_bytes())
}

/// [`parse_duration`] of bytes that need not be UTF-8 (Go's strings need not be).
///
/// # Errors
///
/// As [`parse_duration`].
fn parse_duration_bytes(orig: &[u8]) -> Result<i64, DurationError> {
    let invalid = || DurationError {
        message: format!("time: invalid duration {}", time_quote(orig)),
    };
    let mut s = orig;
    let mut negative = false;
    if let Some(&c) = s.first() {
        if c == b'-' || c == b'+' {
            negative = c == b'-';
            s = &s[1..];
        }
    }
    if s == b"0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    const LIMIT: u64 = 1 << 63;
    let mut total: u64 = 0;
    while !s.is_empty() {
        if !(s[0] == b'.' || s[0].is_ascii_digit()) {
            return Err(invalid());
        }
        // The integer part.
        let mut v: u64 = 0;
        let mut i = 0;
        while i < s.len() && s[i].is_ascii_digit() {
            if v > LIMIT / 10 {
                return Err(invalid());
            }
            v = v * 10 + u64::from(s[i] - b'0');
            if v > LIMIT {
                return Err(invalid());
            }
            i += 1;
        }
        let pre = i > 0;
        s = &s[i..];
        // The fraction: digits past what fits are read and ignored.
        let mut f: u64 = 0;
        let mut scale = 1f64;
        let mut post = false;
        if s.first() == Some(&b'.') {
            s = &s[1..];
            let mut i = 0;
            let mut overflow = false;
            while i < s.len() && s[i].is_ascii_digit() {
                if !overflow {
                    if f > (LIMIT - 1) / 10 {
                        overflow = true;
                    } else {
                        let y = f * 10 + u64::from(s[i] - b'0');
                        if y > LIMIT {
                            overflow = true;
                        } else {
                            f = y;
                            scale *= 10.0;
                        }
                    }
                }
                i += 1;
            }
            post = i > 0;
            s = &s[i..];
        }
        if !pre && !post {
            return Err(invalid());
        }
        // The unit: everything up to the next digit or '.'.
        let i = s
            .iter()
            .position(|&c| c == b'.' || c.is_ascii_digit())
            .unwrap_or(s.len());
        if i == 0 {
            return Err(DurationError {
                message: format!("time: missing unit in duration {}", time_quote(orig)),
            });
        }
        let unit_bytes = &s[..i];
        s = &s[i..];
        let unit: u64 = match unit_bytes {
            b"ns" => 1,
            // us, µs (U+00B5 micro sign), μs (U+03BC Greek mu).
            b"us" | [0xc2, 0xb5, b's'] | [0xce, 0xbc, b's'] => 1_000,
            b"ms" => 1_000_000,
            b"s" => 1_000_000_000,
            b"m" => 60_000_000_000,
            b"h" => 3_600_000_000_000,
            _ => {
                return Err(DurationError {
                    message: format!(
                        "time: unknown unit {} in duration {}",
                        time_quote(unit_bytes),
                        time_quote(orig)
                    ),
                })
            }
        };
        if v > LIMIT / unit {
            return Err(invalid());
        }
        v *= unit;
        if f > 0 {
            // Go computes the fraction's nanoseconds in float64, truncating.
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                clippy::cast_precision_loss
            )]
            let add = (f as f64 * (unit as f64 / scale)) as u64;
            v += add;
            if v > LIMIT {
                return Err(invalid());
            }
        }
        total += v;
        if total > LIMIT {
            return Err(invalid());
        }
    }
    if negative {
        return Ok(0i64.wrapping_sub_unsigned(total));
    }
    i64::try_from(total).map_err(|_| invalid())
}

/// The `time` package's own quoting in its errors (not `strconv.Quote`): `\xNN` for every
/// control or non-ASCII byte, `\"` and `\\`.
fn time_quote(s: &[u8]) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for &b in s {
        if b < b' ' || !b.is_ascii() {
            push_hex(&mut out, "\\x", 2, u32::from(b));
        } else {
            if b == b'"' || b == b'\\' {
                out.push('\\');
            }
            out.push(char::from(b));
        }
    }
    out.push('"');
    out
}

/// A [`Duration`] as Go's `time.Duration`: nanoseconds in an `int64`, saturating at
/// `i64::MAX` (as Go's `Time.Sub` does).
pub fn nanos(duration: Duration) -> i64 {
    i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX)
}

/// `time.Duration.String`: `"0s"`, `"1.5µs"` (U+00B5), `"500ms"`, `"20.051s"`, `"1m0s"`,
/// `"1h2m3s"`, with a leading `-` for negative durations.
pub fn format_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".to_owned();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let u = nanos.unsigned_abs();
    if u < 1_000_000_000 {
        // Under a second: one unit, with a fraction as needed.
        let (unit, digits) = if u < 1_000 {
            ("ns", 0)
        } else if u < 1_000_000 {
            ("µs", 3)
        } else {
            ("ms", 6)
        };
        let (whole, fraction) = split_fraction(u, digits);
        return format!("{sign}{whole}{fraction}{unit}");
    }
    let (whole_seconds, fraction) = split_fraction(u, 9);
    let seconds = whole_seconds % 60;
    let minutes_total = whole_seconds / 60;
    if minutes_total == 0 {
        return format!("{sign}{seconds}{fraction}s");
    }
    let minutes = minutes_total % 60;
    let hours = minutes_total / 60;
    if hours == 0 {
        return format!("{sign}{minutes}m{seconds}{fraction}s");
    }
    format!("{sign}{hours}h{minutes}m{seconds}{fraction}s")
}

/// Splits `value` into `value / 10^digits` and the remainder as `"." + digits` without
/// trailing zeros, or `""` when the remainder is zero.
fn split_fraction(value: u64, digits: u32) -> (u64, String) {
    let Some(divisor) = 10u64.checked_pow(digits) else {
        return (value, String::new());
    };
    let whole = value / divisor;
    let remainder = value % divisor;
    if remainder == 0 {
        return (whole, String::new());
    }
    let padded = format!("{remainder:0width$}", width = digits as usize);
    (whole, format!(".{}", padded.trim_end_matches('0')))
}

// ---------------------------------------------------------------------------------------------
// net/url.

/// Which part of a URL [`unescape`] decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// A path (`url.PathUnescape`): `+` stays `+`.
    Path,
    /// A query key or value (`url.QueryUnescape`): `+` is a space.
    Query,
}

/// A `%` not followed by two hex digits; the text is Go's `url.EscapeError`:
/// `invalid URL escape "%zz"`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid URL escape {}", quote(.escape))]
pub struct UnescapeError {
    escape: String,
}

/// `url.PathUnescape` / `url.QueryUnescape`: `%XX` decoded to its byte (the result need not
/// be UTF-8), and in a query `+` as a space.
///
/// # Errors
///
/// [`UnescapeError`] naming the first bad escape (at most three bytes from its `%`).
pub fn unescape(s: &str, part: Part) -> Result<Vec<u8>, UnescapeError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = |at: usize| b.get(at).and_then(|c| char::from(*c).to_digit(16));
                let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2)) else {
                    let end = (i + 3).min(b.len());
                    let escape = String::from_utf8_lossy(&b[i..end]).into_owned();
                    return Err(UnescapeError { escape });
                };
                // Two hex digits make a byte.
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(u8::MAX));
                i += 3;
            }
            b'+' if part == Part::Query => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Bytes to text the way Go's JSON encoder writes a string holding invalid UTF-8: one
/// U+FFFD per bad byte.
pub fn lossy(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for _ in chunk.invalid() {
            out.push('\u{fffd}');
        }
    }
    out
}

/// `url.URL.EscapedPath` of a request whose target's path is `raw` and decodes to
/// `decoded` ([`unescape`] with [`Part::Path`]): `raw` itself when Go considers it validly
/// encoded, else `decoded` escaped Go's way (`%XX`, upper case).
pub fn escaped_path(raw: &str, decoded: &[u8]) -> String {
    let unreserved = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'~');
    let path_ok = |c: u8| {
        unreserved(c)
            || matches!(
                c,
                b'$' | b'&' | b'+' | b',' | b'/' | b':' | b';' | b'=' | b'@'
            )
    };
    let valid = raw
        .bytes()
        .all(|c| path_ok(c) || matches!(c, b'!' | b'\'' | b'(' | b')' | b'*' | b'[' | b']' | b'%'));
    if valid {
        return raw.to_owned();
    }
    let mut out = String::with_capacity(decoded.len() * 3);
    for &c in decoded {
        if path_ok(c) {
            out.push(char::from(c));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{c:02X}");
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// apimachinery.

/// apimachinery's `runtime.Convert_Slice_string_To_bool` for a query parameter that is
/// present: false for `0` and for `false` in any case (Go's `strings.EqualFold`, so `ſ`
/// U+017F matches `s`), true for anything else, the empty string included.
pub fn convert_bool(value: &str) -> bool {
    if value == "0" {
        return false;
    }
    let mut chars = value.chars();
    let equal_false = "false".chars().all(|want| {
        chars
            .next()
            .is_some_and(|c| c.to_ascii_lowercase() == want || (want == 's' && c == '\u{17f}'))
    }) && chars.next().is_none();
    !equal_false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::selector::{FieldSelector, LabelSelector};

    /// One line of `golden.jsonl`.
    struct Golden {
        number: usize,
        function: String,
        input: Vec<u8>,
        /// `Ok(output bytes)` or `Err(error text)`.
        result: Result<Vec<u8>, String>,
    }

    fn field<'a>(value: &'a serde_json::Value, name: &str) -> Option<&'a str> {
        value.get(name).and_then(serde_json::Value::as_str)
    }

    fn hex_bytes(hex: &str) -> Option<Vec<u8>> {
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect()
    }

    fn goldens() -> Vec<Golden> {
        let text = include_str!("../testdata/go-edge/golden.jsonl");
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let number = i + 1;
            let value: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("golden.jsonl:{number}: {e}"));
            let bytes = |text: &str, hex: &str| match (field(&value, text), field(&value, hex)) {
                (_, Some(h)) => hex_bytes(h)
                    .unwrap_or_else(|| panic!("golden.jsonl:{number}: bad hex in {hex}")),
                (Some(t), None) => t.as_bytes().to_vec(),
                (None, None) => Vec::new(),
            };
            let ok = value.get("ok").and_then(serde_json::Value::as_bool) == Some(true);
            let result = if ok {
                Ok(bytes("out", "out_hex"))
            } else {
                Err(field(&value, "err").unwrap_or_default().to_owned())
            };
            out.push(Golden {
                number,
                function: field(&value, "fn").unwrap_or_default().to_owned(),
                input: bytes("in", "in_hex"),
                result,
            });
        }
        out
    }

    fn text(bytes: &[u8]) -> Result<&str, String> {
        std::str::from_utf8(bytes).map_err(|_| "input is not UTF-8".to_owned())
    }

    /// kpulse's answer for one golden line, in the same form.
    fn kpulse(g: &Golden) -> Result<Result<Vec<u8>, String>, String> {
        let ok_text = |s: String| Ok(Ok(s.into_bytes()));
        match g.function.as_str() {
            "quote" => ok_text(quote_bytes(&g.input)),
            "parse_int" => Ok(parse_int_bytes(&g.input)
                .map(|n| n.to_string().into_bytes())
                .map_err(|e| e.message_bytes(&g.input))),
            "parse_duration" => Ok(parse_duration_bytes(&g.input)
                .map(|n| n.to_string().into_bytes())
                .map_err(|e| e.to_string())),
            "format_duration" => {
                let n: i64 = text(&g.input)?.parse().map_err(|e| format!("{e}"))?;
                ok_text(format_duration(n))
            }
            "path_unescape" => Ok(unescape(text(&g.input)?, Part::Path).map_err(|e| e.to_string())),
            "query_unescape" => {
                Ok(unescape(text(&g.input)?, Part::Query).map_err(|e| e.to_string()))
            }
            "escaped_path" => {
                let raw = text(&g.input)?;
                let decoded = unescape(raw, Part::Path).map_err(|e| e.to_string())?;
                ok_text(escaped_path(raw, &decoded))
            }
            "convert_bool" => ok_text(convert_bool(text(&g.input)?).to_string()),
            "label_selector" => Ok(LabelSelector::parse(text(&g.input)?)
                .map(|s| s.to_string().into_bytes())
                .map_err(|e| e.message)),
            "field_selector" => Ok(FieldSelector::parse(text(&g.input)?)
                .map(|s| s.to_string().into_bytes())
                .map_err(|e| e.message)),
            other => Err(format!("unknown function {other:?}")),
        }
    }

    fn show(result: &Result<Vec<u8>, String>) -> String {
        match result {
            Ok(bytes) => format!("ok {}", quote_bytes(bytes)),
            Err(e) => format!("error {}", quote(e)),
        }
    }

    /// Every line Go printed (`testdata/go-edge/main.go`) against kpulse's function; all
    /// mismatches are reported at once.
    #[test]
    fn matches_output_captured_from_go() {
        let goldens = goldens();
        assert!(
            goldens.len() > 200,
            "golden.jsonl has {} lines",
            goldens.len()
        );
        let mut mismatches = Vec::new();
        let mut functions = std::collections::BTreeSet::new();
        for g in &goldens {
            functions.insert(g.function.clone());
            match kpulse(g) {
                Ok(have) if have == g.result => {}
                Ok(have) => mismatches.push(format!(
                    "golden.jsonl:{} {}({}): Go {}, kpulse {}",
                    g.number,
                    g.function,
                    quote_bytes(&g.input),
                    show(&g.result),
                    show(&have)
                )),
                Err(e) => mismatches.push(format!("golden.jsonl:{} {e}", g.number)),
            }
        }
        assert!(
            mismatches.is_empty(),
            "{} of {} lines differ:\n{}",
            mismatches.len(),
            goldens.len(),
            mismatches.join("\n")
        );
        assert_eq!(functions.len(), 10, "functions covered: {functions:?}");
    }

    #[test]
    fn quote_escapes_like_strconv_quote() {
        let cases = [
            ("", r#""""#),
            ("ns/name", r#""ns/name""#),
            ("q\"b\\", r#""q\"b\\""#),
            ("\u{07}\u{08}\u{0c}\n\r\t\u{0b}", r#""\a\b\f\n\r\t\v""#),
            ("\u{00}\u{1b}\u{7f}", r#""\x00\x1b\x7f""#),
            ("µs héllo 世界 😀", "\"µs héllo 世界 😀\""),
            (
                "\u{a0}\u{ad}\u{2028}\u{feff}",
                r#""\u00a0\u00ad\u2028\ufeff""#,
            ),
            ("\u{378}\u{e000}", r#""\u0378\ue000""#),
            ("\u{1d173}\u{e0100}", "\"\\U0001d173\u{e0100}\""),
        ];
        for (input, want) in cases {
            assert_eq!(quote(input), want, "{input:?}");
        }
        assert_eq!(quote_bytes(b"a\xe2\x82b\xff"), r#""a\xe2\x82b\xff""#);
    }

    #[test]
    fn parse_int_matches_strconv() {
        let cases: [(&str, Result<i64, IntError>); 14] = [
            ("0", Ok(0)),
            ("-0", Ok(0)),
            ("+7", Ok(7)),
            ("007", Ok(7)),
            ("9223372036854775807", Ok(i64::MAX)),
            ("-9223372036854775808", Ok(i64::MIN)),
            ("9223372036854775808", Err(IntError::Range)),
            ("-9223372036854775809", Err(IntError::Range)),
            ("99999999999999999999x", Err(IntError::Range)),
            ("", Err(IntError::Syntax)),
            ("-", Err(IntError::Syntax)),
            ("1_000", Err(IntError::Syntax)),
            (" 1", Err(IntError::Syntax)),
            ("0x10", Err(IntError::Syntax)),
        ];
        for (input, want) in cases {
            assert_eq!(parse_int(input), want, "{input:?}");
        }
        assert_eq!(
            IntError::Syntax.message("abc"),
            "strconv.ParseInt: parsing \"abc\": invalid syntax"
        );
        assert_eq!(
            IntError::Range.message("99999999999999999999"),
            "strconv.ParseInt: parsing \"99999999999999999999\": value out of range"
        );
    }

    #[test]
    fn durations_parse_and_print_like_go() {
        // (input, Ok(nanoseconds) or Err(message)) checked against Go's time.ParseDuration.
        let durations: [(&str, Result<i64, &str>); 12] = [
            ("0", Ok(0)),
            ("-1.5h", Ok(-5_400_000_000_000)),
            ("1h2m3s4ms5us6ns", Ok(3_723_004_005_006)),
            ("1µs", Ok(1_000)),
            ("1μs", Ok(1_000)),
            (".5s", Ok(500_000_000)),
            ("2562047h47m16.854775807s", Ok(i64::MAX)),
            ("-9223372036854775808ns", Ok(i64::MIN)),
            (
                "9223372036854775808ns",
                Err("time: invalid duration \"9223372036854775808ns\""),
            ),
            ("é", Err("time: invalid duration \"\\xc3\\xa9\"")),
            (
                "1h\u{1}",
                Err("time: unknown unit \"h\\x01\" in duration \"1h\\x01\""),
            ),
            ("1.5.5h", Err("time: missing unit in duration \"1.5.5h\"")),
        ];
        for (input, want) in durations {
            assert_eq!(
                parse_duration(input).map_err(|e| e.to_string()),
                want.map_err(str::to_owned),
                "{input:?}"
            );
        }
        assert_eq!(parse_duration("1m30s"), Ok(90_000_000_000));
        assert_eq!(parse_duration("-1.5h"), Ok(-5_400_000_000_000));
        assert_eq!(
            parse_duration("1.5.5h").map_err(|e| e.to_string()),
            Err("time: missing unit in duration \"1.5.5h\"".to_owned())
        );
        assert_eq!(format_duration(-1_500), "-1.5µs");
        assert_eq!(
            format_duration(nanos(Duration::MAX)),
            "2562047h47m16.854775807s"
        );
    }

    #[test]
    fn url_helpers() {
        assert_eq!(unescape("a+b%2B", Part::Query), Ok(b"a b+".to_vec()));
        assert_eq!(unescape("a+b%2B", Part::Path), Ok(b"a+b+".to_vec()));
        assert_eq!(
            unescape("a%%41", Part::Path).map_err(|e| e.to_string()),
            Err("invalid URL escape \"%%4\"".to_owned())
        );
        assert_eq!(escaped_path("/a%2Fb", b"/a/b"), "/a%2Fb");
        assert_eq!(escaped_path("/%ff\"", b"/\xff\""), "/%FF%22");
        assert_eq!(lossy(b"a\xe2\x82b\xff"), "a\u{fffd}\u{fffd}b\u{fffd}");
    }

    #[test]
    fn convert_bool_false_only_for_0_and_false() {
        for (value, want) in [("", true), ("0", false), ("FaLsE", false), ("falſe", false)] {
            assert_eq!(convert_bool(value), want, "{value:?}");
        }
        assert!(convert_bool("no"));
    }
}
