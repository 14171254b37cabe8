//! Canonical JSON for intentions: RFC 8785 (JCS) with numbers compared as exact decimals.
//!
//! RFC 8785 reads every number as an IEEE 754 double, which is right for signatures and
//! wrong for intentions: `9007199254740993` and `9007199254740992` are one double, but two
//! orders. Here a number is kept as the decimal it spells and written the way ECMAScript
//! writes a number (`Number::toString`) with all of its significant digits, so numbers
//! equal as decimals agree (`1.0`, `1`, `1e0`; `1e2`, `100`) and numbers that differ as
//! decimals never do. For every number that is the shortest spelling of a double (the
//! usual case) the bytes are RFC 8785's. Everything else follows the RFC: object members
//! sorted by UTF-16 code units, no white space, strings escaped as `JSON.stringify` does.
//!
//! The parser is this module's own (strict RFC 8259 JSON, nesting up to 128 deep like
//! `serde_json`); strings with escapes are decoded by `serde_json`. It borrows from the
//! text where it can. Like RFC 8785, it takes only I-JSON (RFC 7493): an object that
//! repeats a member name is not canonical JSON. Parsers disagree on such an object (most
//! keep the last value, some the first, some refuse it), so `{"amount":1000,"amount":2}`
//! and `{"amount":2}` may be two orders; the fingerprint hashes such a body as bytes.
//! This is the one canonical form: the fingerprint and `oncely audit` both use it.

use std::borrow::Cow;
use std::cmp::Ordering;

/// How deep arrays and objects may nest (as `serde_json`'s default limit).
const MAX_DEPTH: usize = 128;

/// A JSON document with every number in its canonical spelling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Json<'a> {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number, already in its canonical spelling ([`canonical_number`]).
    Num(Cow<'a, str>),
    /// A string, unescaped.
    Str(Cow<'a, str>),
    /// An array.
    Arr(Vec<Json<'a>>),
    /// Members as read (no name twice); [`Json::normalize`] sorts them.
    Obj(Vec<(Cow<'a, str>, Json<'a>)>),
}

impl<'a> Json<'a> {
    /// Parses JSON text; `None` when it is not JSON (one value, white space around it),
    /// or when an object repeats a member name (not I-JSON).
    pub fn parse(text: &'a [u8]) -> Option<Json<'a>> {
        Json::read(text, false)
    }

    fn read(text: &'a [u8], repeats_allowed: bool) -> Option<Json<'a>> {
        let text = std::str::from_utf8(text).ok()?;
        let mut p = Parser {
            s: text,
            b: text.as_bytes(),
            i: 0,
            depth: 0,
            repeats_allowed,
        };
        let value = p.value()?;
        p.ws();
        (p.i == p.b.len()).then_some(value)
    }

    /// Sorts every object's members in canonical order.
    pub fn normalize(&mut self) {
        match self {
            Json::Arr(items) => items.iter_mut().for_each(Json::normalize),
            Json::Obj(members) => {
                members.sort_by(|a, b| member_order(&a.0, &b.0));
                members.iter_mut().for_each(|(_, v)| v.normalize());
            }
            _ => {}
        }
    }

    /// Removes the member or element a JSON pointer (RFC 6901) names, if it exists.
    pub fn remove_pointer(&mut self, pointer: &str) {
        let Some(i) = pointer.rfind('/').filter(|_| pointer.starts_with('/')) else {
            return;
        };
        let last = unescape(&pointer[i + 1..]);
        let Some(parent) = self.pointer_mut(&pointer[..i]) else {
            return;
        };
        match parent {
            Json::Obj(members) => members.retain(|(k, _)| *k != last),
            Json::Arr(items) => {
                if let Ok(n) = last.parse::<usize>() {
                    if n < items.len() {
                        items.remove(n);
                    }
                }
            }
            _ => {}
        }
    }

    /// What a JSON pointer names (`serde_json::Value::pointer_mut`'s rules).
    pub fn pointer_mut(&mut self, pointer: &str) -> Option<&mut Json<'a>> {
        if pointer.is_empty() {
            return Some(self);
        }
        let rest = pointer.strip_prefix('/')?;
        let mut target = self;
        for token in rest.split('/') {
            let token = unescape(token);
            target = match target {
                Json::Obj(members) => &mut members.iter_mut().rev().find(|(k, _)| *k == token)?.1,
                Json::Arr(items) => {
                    if token.starts_with('+') || (token.starts_with('0') && token.len() > 1) {
                        return None;
                    }
                    items.get_mut(token.parse::<usize>().ok()?)?
                }
                _ => return None,
            };
        }
        Some(target)
    }

    /// Appends the canonical form (call [`Json::normalize`] first).
    pub fn write_canonical(&self, out: &mut Vec<u8>) {
        match self {
            Json::Null => out.extend_from_slice(b"null"),
            Json::Bool(true) => out.extend_from_slice(b"true"),
            Json::Bool(false) => out.extend_from_slice(b"false"),
            Json::Num(n) => out.extend_from_slice(n.as_bytes()),
            Json::Str(s) => write_string(s, out),
            Json::Arr(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write_canonical(out);
                }
                out.push(b']');
            }
            Json::Obj(members) => {
                out.push(b'{');
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_string(k, out);
                    out.push(b':');
                    v.write_canonical(out);
                }
                out.push(b'}');
            }
        }
    }
}

/// Whether `text` is RFC 8259 JSON, repeated member names allowed (RFC 8259 only says
/// names SHOULD be unique): for telling a message that must be refused from one that is
/// not JSON at all.
pub fn is_json(text: &[u8]) -> bool {
    Json::read(text, true).is_some()
}

/// The canonical form of JSON text with the `ignore` pointers removed; `None` when the
/// text is not JSON, or not I-JSON (a repeated member name).
pub fn canonicalize(text: &[u8], ignore: &[String]) -> Option<Vec<u8>> {
    let mut doc = Json::parse(text)?;
    Some(canonical_doc(&mut doc, ignore))
}

/// The canonical form of a parsed document with the `ignore` pointers removed.
pub fn canonical_doc(doc: &mut Json<'_>, ignore: &[String]) -> Vec<u8> {
    doc.normalize();
    for pointer in ignore {
        doc.remove_pointer(pointer);
    }
    let mut out = Vec::new();
    doc.write_canonical(&mut out);
    out
}

/// Whether no two members share a name (the names as decoded: `"a"` and `"\u0061"` are
/// one name).
fn unique_names(members: &[(Cow<'_, str>, Json<'_>)]) -> bool {
    match members.len() {
        0 | 1 => true,
        n if n <= 8 => (1..n).all(|i| members[..i].iter().all(|(k, _)| *k != members[i].0)),
        _ => {
            let mut names: Vec<&str> = members.iter().map(|(k, _)| k.as_ref()).collect();
            names.sort_unstable();
            names.windows(2).all(|w| w[0] != w[1])
        }
    }
}

/// RFC 8785 member order: by UTF-16 code units. UTF-8 byte order is the same unless a
/// name holds a character at or above U+E000 (lead byte 0xEE or more).
fn member_order(a: &str, b: &str) -> Ordering {
    let high = |s: &str| s.bytes().any(|b| b >= 0xEE);
    if high(a) || high(b) {
        a.encode_utf16().cmp(b.encode_utf16())
    } else {
        a.as_bytes().cmp(b.as_bytes())
    }
}

fn unescape(token: &str) -> Cow<'_, str> {
    if token.contains('~') {
        Cow::Owned(token.replace("~1", "/").replace("~0", "~"))
    } else {
        Cow::Borrowed(token)
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    // Most strings need no escape; this test has no early exit, so it vectorises.
    let needs_escape = bytes.iter().fold(false, |any, &b| {
        any | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if !needs_escape {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0c => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x00..=0x1f => &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 0xf) as usize],
            ],
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(escape);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

struct Parser<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
    depth: usize,
    /// Whether an object may repeat a member name.
    repeats_allowed: bool,
}

impl<'a> Parser<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.b.get(self.i) == Some(&byte)).then(|| self.i += 1)
    }

    fn literal(&mut self, word: &[u8], value: Json<'a>) -> Option<Json<'a>> {
        self.b[self.i..].starts_with(word).then(|| {
            self.i += word.len();
            value
        })
    }

    fn value(&mut self) -> Option<Json<'a>> {
        self.ws();
        match *self.b.get(self.i)? {
            b'{' => self.nested(|p| {
                let mut members = Vec::new();
                p.ws();
                if p.eat(b'}').is_some() {
                    return Some(Json::Obj(members));
                }
                loop {
                    p.ws();
                    let key = p.string()?;
                    p.ws();
                    p.eat(b':')?;
                    let value = p.value()?;
                    members.push((key, value));
                    p.ws();
                    match *p.b.get(p.i)? {
                        b',' => p.i += 1,
                        b'}' => {
                            p.i += 1;
                            return (p.repeats_allowed || unique_names(&members))
                                .then_some(Json::Obj(members));
                        }
                        _ => return None,
                    }
                }
            }),
            b'[' => self.nested(|p| {
                let mut items = Vec::new();
                p.ws();
                if p.eat(b']').is_some() {
                    return Some(Json::Arr(items));
                }
                loop {
                    items.push(p.value()?);
                    p.ws();
                    match *p.b.get(p.i)? {
                        b',' => p.i += 1,
                        b']' => {
                            p.i += 1;
                            return Some(Json::Arr(items));
                        }
                        _ => return None,
                    }
                }
            }),
            b'"' => self.string().map(Json::Str),
            b't' => self.literal(b"true", Json::Bool(true)),
            b'f' => self.literal(b"false", Json::Bool(false)),
            b'n' => self.literal(b"null", Json::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn nested(&mut self, inner: impl FnOnce(&mut Self) -> Option<Json<'a>>) -> Option<Json<'a>> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        self.i += 1;
        let value = inner(self);
        self.depth -= 1;
        value
    }

    fn string(&mut self) -> Option<Cow<'a, str>> {
        let open = self.i;
        self.eat(b'"')?;
        let mut escaped = false;
        loop {
            match *self.b.get(self.i)? {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    self.i += 2;
                }
                0x00..=0x1f => return None,
                _ => self.i += 1,
            }
        }
        self.i += 1;
        if escaped {
            // serde_json decodes escapes (and refuses bad ones and lone surrogates).
            serde_json::from_str::<String>(&self.s[open..self.i])
                .ok()
                .map(Cow::Owned)
        } else {
            Some(Cow::Borrowed(&self.s[open + 1..self.i - 1]))
        }
    }

    fn number(&mut self) -> Option<Json<'a>> {
        let start = self.i;
        let digits = |p: &mut Self| {
            let from = p.i;
            while p.b.get(p.i).is_some_and(u8::is_ascii_digit) {
                p.i += 1;
            }
            p.i > from
        };
        let _ = self.eat(b'-');
        if self.eat(b'0').is_none() && !digits(self) {
            return None;
        }
        if self.eat(b'.').is_some() && !digits(self) {
            return None;
        }
        if let Some(b'e' | b'E') = self.b.get(self.i) {
            self.i += 1;
            if let Some(b'+' | b'-') = self.b.get(self.i) {
                self.i += 1;
            }
            if !digits(self) {
                return None;
            }
        }
        canonical_number(&self.s[start..self.i]).map(Json::Num)
    }
}

/// The canonical spelling of a JSON number: its exact decimal value written as
/// ECMAScript's `Number::toString` writes a number, with every significant digit.
/// `None` when `text` is not a JSON number.
///
/// ```
/// use oncely_core::canon::canonical_number;
/// assert_eq!(canonical_number("1.0").unwrap(), "1");
/// assert_eq!(canonical_number("1e2").unwrap(), "100");
/// assert_eq!(canonical_number("4.50").unwrap(), "4.5");
/// assert_eq!(canonical_number("1E30").unwrap(), "1e+30");
/// assert_eq!(canonical_number("9007199254740993").unwrap(), "9007199254740993");
/// assert_eq!(canonical_number("-0.0").unwrap(), "0");
/// ```
pub fn canonical_number(text: &str) -> Option<Cow<'_, str>> {
    let b = text.as_bytes();
    // The common case: a plain integer (no leading zero, at most 21 digits) is its own
    // canonical spelling.
    let unsigned = b.strip_prefix(b"-").unwrap_or(b);
    if !unsigned.is_empty()
        && unsigned.len() <= 21
        && unsigned.iter().all(u8::is_ascii_digit)
        && (unsigned[0] != b'0' || (unsigned.len() == 1 && unsigned.len() == b.len()))
    {
        return Some(Cow::Borrowed(text));
    }

    let negative = b.first() == Some(&b'-');
    let (mantissa, exponent) = match unsigned.iter().position(|c| matches!(c, b'e' | b'E')) {
        Some(e) => (&unsigned[..e], Some(&unsigned[e + 1..])),
        None => (unsigned, None),
    };
    let (int, frac) = match mantissa.iter().position(|c| *c == b'.') {
        Some(d) => (&mantissa[..d], &mantissa[d + 1..]),
        None => (mantissa, &[][..]),
    };
    let valid_int =
        !int.is_empty() && int.iter().all(u8::is_ascii_digit) && (int[0] != b'0' || int.len() == 1);
    let valid_frac =
        frac.iter().all(u8::is_ascii_digit) && (mantissa.len() == int.len() || !frac.is_empty());
    if !valid_int || !valid_frac {
        return None;
    }
    let (exp_negative, exp_digits) = match exponent {
        None => (false, &[][..]),
        Some(e) => {
            let (neg, digits) = match e.first() {
                Some(b'-') => (true, &e[1..]),
                Some(b'+') => (false, &e[1..]),
                _ => (false, e),
            };
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            (neg, digits)
        }
    };

    // The significant digits: int and frac together, without leading or trailing zeros.
    let all: Vec<u8> = int.iter().chain(frac).copied().collect();
    let Some(first) = all.iter().position(|c| *c != b'0') else {
        return Some(Cow::Borrowed("0"));
    };
    let last = all.iter().rposition(|c| *c != b'0').unwrap_or(first);
    let sig = &all[first..=last];
    let trailing = (all.len() - 1 - last) as i128;
    let k = sig.len() as i128;
    // value = 0.SIG × 10^n, i.e. SIG × 10^(n - k); n = k + exp - frac_len + trailing.
    let shift = k - frac.len() as i128 + trailing;

    let exp_digits = {
        let nz = exp_digits.iter().position(|c| *c != b'0');
        nz.map_or(&[][..], |i| &exp_digits[i..])
    };
    let mut out = String::with_capacity(sig.len() + 8);
    if negative {
        out.push('-');
    }
    let sig = std::str::from_utf8(sig).ok()?;
    if exp_digits.len() <= 30 {
        let mut exp: i128 = 0;
        for d in exp_digits {
            exp = exp * 10 + i128::from(d - b'0');
        }
        if exp_negative {
            exp = -exp;
        }
        let n = exp + shift;
        if k <= n && n <= 21 {
            out.push_str(sig);
            out.extend(std::iter::repeat_n('0', (n - k) as usize));
        } else if 0 < n && n <= 21 {
            out.push_str(&sig[..n as usize]);
            out.push('.');
            out.push_str(&sig[n as usize..]);
        } else if -6 < n && n <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-n) as usize));
            out.push_str(sig);
        } else {
            push_scientific(&mut out, sig);
            let e = n - 1;
            out.push(if e < 0 { '-' } else { '+' });
            out.push_str(&e.unsigned_abs().to_string());
        }
    } else {
        // An exponent of 31 digits or more: far outside the plain range, and the
        // adjustment (bounded by the text's length) never changes its sign.
        push_scientific(&mut out, sig);
        out.push(if exp_negative { '-' } else { '+' });
        let delta = shift - 1;
        let magnitude = std::str::from_utf8(exp_digits).ok()?;
        // |exp + delta| = |exp| + delta·sign(exp).
        let toward = if exp_negative { -delta } else { delta };
        out.push_str(&add_small(magnitude, toward));
    }
    Some(Cow::Owned(out))
}

fn push_scientific(out: &mut String, sig: &str) {
    out.push_str(&sig[..1]);
    if sig.len() > 1 {
        out.push('.');
        out.push_str(&sig[1..]);
    }
    out.push('e');
}

/// `digits + delta` for a decimal string much larger than `|delta|`.
fn add_small(digits: &str, delta: i128) -> String {
    let mut out: Vec<u8> = digits.bytes().rev().map(|c| c - b'0').collect();
    let mut carry = delta.unsigned_abs();
    let up = delta >= 0;
    let mut i = 0;
    while carry > 0 {
        let d = out[i] as u128;
        let step = carry % 10;
        carry /= 10;
        if up {
            let sum = d + step;
            out[i] = (sum % 10) as u8;
            carry += sum / 10;
        } else if d >= step {
            out[i] = (d - step) as u8;
        } else {
            out[i] = (d + 10 - step) as u8;
            carry += 1;
        }
        i += 1;
        if i == out.len() && carry > 0 {
            out.push(0);
        }
    }
    while out.len() > 1 && out.last() == Some(&0) {
        out.pop();
    }
    out.iter().rev().map(|d| (d + b'0') as char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn canon(text: &str) -> String {
        String::from_utf8(canonicalize(text.as_bytes(), &[]).unwrap()).unwrap()
    }

    fn num(text: &str) -> String {
        canonical_number(text).unwrap().into_owned()
    }

    #[test]
    fn numbers_equal_as_decimals_agree() {
        for (a, b) in [
            ("1", "1.0"),
            ("1", "1e0"),
            ("1", "10e-1"),
            ("1", "0.1e1"),
            ("100", "1e2"),
            ("100", "1E+2"),
            ("100", "100.000"),
            ("0", "-0"),
            ("0", "-0.0e7"),
            ("0", "0e-99999999999999999999999999999999999999"),
            ("4.5", "4.50"),
            ("0.002", "2e-3"),
            ("1e+30", "1E30"),
            ("1e-27", "0.000000000000000000000000001"),
            ("123.456", "123456e-3"),
            ("1e+1000", "10e999"),
        ] {
            assert_eq!(num(a), num(b), "{a} vs {b}");
        }
    }

    #[test]
    fn numbers_different_as_decimals_differ() {
        for (a, b) in [
            ("9007199254740993", "9007199254740992"),
            ("-9007199254740993", "-9007199254740992"),
            ("18446744073709551617", "18446744073709551616"),
            ("0.1", "0.10000000000000001"),
            ("333333333.33333329", "333333333.3333333"),
            (
                "12345678901234567890.123456789",
                "12345678901234567890.12345679",
            ),
            ("1e400", "1e401"),
            ("1", "-1"),
            (
                "1e99999999999999999999999999999999999999999",
                "1e99999999999999999999999999999999999999998",
            ),
        ] {
            assert_ne!(num(a), num(b), "{a} vs {b}");
        }
    }

    #[test]
    fn ecmascript_spellings() {
        for (text, want) in [
            ("123e18", "123000000000000000000"),
            ("1e21", "1e+21"),
            ("1.5e-7", "1.5e-7"),
            ("0.000001", "0.000001"),
            ("0.0000001", "1e-7"),
            ("-12.5e300", "-1.25e+301"),
            (
                "1e99999999999999999999999999999999999999999",
                "1e+99999999999999999999999999999999999999999",
            ),
            (
                "12e-99999999999999999999999999999999999999999",
                "1.2e-99999999999999999999999999999999999999998",
            ),
            (
                "10e99999999999999999999999999999999999999999",
                "1e+100000000000000000000000000000000000000000",
            ),
        ] {
            assert_eq!(num(text), want, "{text}");
        }
        for bad in [
            "", "-", "01", "1.", ".1", "1e", "1e+", "+1", "0x1", "1.e2", "--1",
        ] {
            assert_eq!(canonical_number(bad), None, "{bad:?}");
        }
    }

    /// The RFC 8785 examples where they are about strings, order and literals; numbers
    /// that are the shortest spelling of a double are spelled as the RFC spells them.
    #[test]
    fn rfc8785_vectors() {
        let input = r#"{
          "numbers": [333333333.3333333, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        let expected = r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#;
        assert_eq!(canon(input), expected);
        let sorting = r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#;
        let sorted = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
        assert_eq!(canon(sorting), sorted);
        // Appendix B: the ECMAScript spellings of doubles are their own canonical form.
        for text in [
            "0",
            "5e-324",
            "-5e-324",
            "1.7976931348623157e+308",
            "-1.7976931348623157e+308",
            "9007199254740992",
            "-9007199254740992",
            "295147905179352830000",
            "9.999999999999997e+22",
            "1e+23",
            "1.0000000000000001e+23",
            "999999999999999700000",
            "999999999999999900000",
            "1e+21",
            "9.999999999999997e-7",
            "0.000001",
            "333333333.3333332",
            "333333333.33333325",
            "333333333.3333333",
            "333333333.3333334",
            "333333333.33333343",
            "-0.0000033333333333333333",
            "1424953923781206.2",
        ] {
            assert_eq!(canon(text), text);
        }
    }

    #[test]
    fn strict_json_only() {
        for bad in [
            "",
            " ",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "[1 2]",
            "01",
            "nul",
            "tru",
            "\"\\x\"",
            "\"\\ud800\"",
            "\"a\nb\"",
            "1 2",
            "{1:2}",
            "[\"\\\"]",
            "NaN",
        ] {
            assert_eq!(Json::parse(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(Json::parse(b"\xff"), None);
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert_eq!(Json::parse(deep.as_bytes()), None);
        let ok = "[".repeat(100) + &"]".repeat(100);
        assert!(Json::parse(ok.as_bytes()).is_some());
        assert_eq!(
            canon(" { \"b\" : [ ] , \"a\" : { } } "),
            r#"{"a":{},"b":[]}"#
        );
    }

    #[test]
    fn a_repeated_member_name_is_not_canonical_json() {
        let many: String = (0..20).map(|i| format!("\"k{i}\":{i},")).collect();
        for repeated in [
            r#"{"a":1,"a":2}"#.to_string(),
            r#"{"amount":1000,"amount":2}"#.to_string(),
            // One name, spelled two ways.
            r#"{"a":1,"\u0061":1}"#.to_string(),
            // Deep inside, and among many members.
            r#"[{"x":{"b":true,"c":null,"b":false}}]"#.to_string(),
            format!("{{{many}\"k7\":0}}"),
        ] {
            assert_eq!(Json::parse(repeated.as_bytes()), None, "{repeated}");
            assert_eq!(canonicalize(repeated.as_bytes(), &[]), None, "{repeated}");
        }
        // It is still JSON, only not canonical JSON.
        assert!(is_json(br#"{"a":1,"a":2}"#));
        assert!(!is_json(br#"{"a":1,"a":}"#));
        // Distinct names, and one name in two different objects, are fine.
        assert!(Json::parse(format!("{{{many}\"k20\":0}}").as_bytes()).is_some());
        assert_eq!(
            canon(r#"{"b":{"a":1},"a":{"a":2}}"#),
            r#"{"a":{"a":2},"b":{"a":1}}"#
        );
    }

    /// A decimal as (negative, digits, exponent): its value is ±digits × 10^exponent.
    fn decimal() -> impl Strategy<Value = (bool, String, i32)> {
        (any::<bool>(), "[0-9]{1,40}", -400i32..400)
    }

    /// Spells ±digits × 10^exp in a random but equal way: leading and trailing zeros,
    /// a moved decimal point, an exponent of any case and sign.
    fn spell(
        negative: bool,
        digits: &str,
        exp: i32,
        point: usize,
        pad: (usize, usize),
        upper: bool,
    ) -> String {
        let padded = format!("{}{}{}", "0".repeat(pad.0), digits, "0".repeat(pad.1));
        // padded × 10^(exp - pad.1) is the value; put the point `point` digits from the end.
        let point = point.min(padded.len() - 1);
        let (int, frac) = padded.split_at(padded.len() - point);
        let int = int.trim_start_matches('0');
        let int = if int.is_empty() { "0" } else { int };
        let e = exp - pad.1 as i32 + point as i32;
        let mut s = String::new();
        if negative {
            s.push('-');
        }
        s.push_str(int);
        if !frac.is_empty() {
            s.push('.');
            s.push_str(frac);
        }
        if e != 0 || upper {
            s.push(if upper { 'E' } else { 'e' });
            s.push_str(&e.to_string());
        }
        s
    }

    /// The exact value of a decimal, as (sign, significant digits, exponent of last digit).
    fn exact(negative: bool, digits: &str, exp: i32) -> Option<(bool, String, i32)> {
        let trimmed = digits.trim_start_matches('0');
        if trimmed.is_empty() {
            return None;
        }
        let sig = trimmed.trim_end_matches('0');
        let e = exp + (trimmed.len() - sig.len()) as i32;
        Some((negative, sig.to_string(), e))
    }

    proptest! {
        #[test]
        fn equal_decimals_share_a_spelling(
            (negative, digits, exp) in decimal(),
            a in (0usize..45, 0usize..3, 0usize..3, any::<bool>()),
            b in (0usize..45, 0usize..3, 0usize..3, any::<bool>()),
        ) {
            let one = spell(negative, &digits, exp, a.0, (a.1, a.2), a.3);
            let two = spell(negative, &digits, exp, b.0, (b.1, b.2), b.3);
            prop_assert_eq!(num(&one), num(&two), "{} vs {}", one, two);
            prop_assert_eq!(canon(&format!("[{one}]")), canon(&format!("[ {two} ]")));
        }

        #[test]
        fn different_decimals_never_share_a_spelling(
            x in decimal(),
            y in decimal(),
            p in 0usize..45,
            q in 0usize..45,
        ) {
            prop_assume!(exact(x.0, &x.1, x.2) != exact(y.0, &y.1, y.2));
            let one = spell(x.0, &x.1, x.2, p, (0, 0), false);
            let two = spell(y.0, &y.1, y.2, q, (0, 0), false);
            prop_assert_ne!(num(&one), num(&two), "{} vs {}", one, two);
        }

        #[test]
        fn doubles_keep_their_rfc8785_spelling(f in any::<f64>().prop_filter("finite", |f| f.is_finite())) {
            let value = serde_json::json!(f);
            let rfc = serde_json_canonicalizer::to_string(&value).unwrap();
            prop_assert_eq!(num(&rfc), rfc.clone());
            prop_assert_eq!(num(&value.to_string()), rfc);
        }

        #[test]
        fn canonical_form_is_a_fixed_point(raw in "[0-9]{1,25}(\\.[0-9]{1,25})?([eE][+-]?[0-9]{1,4})?", neg in any::<bool>()) {
            let text = if neg { format!("-{raw}") } else { raw };
            prop_assume!(canonical_number(&text).is_some());
            let once = num(&text);
            prop_assert_eq!(num(&once), once.clone());
        }

        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = canonicalize(&raw, &[]);
        }
    }
}
