//! One log line in, one [`Request`] (or the reason it cannot be read) out.
//!
//! Only the members the [`FieldMap`] names are looked at; everything else in the line is
//! skipped without being built. The identity of a request is what the gateway
//! fingerprints: principal, method, path and query, and the body, a JSON body
//! canonicalised per RFC 8785 with the ignored pointers removed (hashed by
//! [`request_key`], the audit's own SHA-256). A body that
//! the log keeps as a JSON value is compared as that value; a body kept as a string is
//! compared as the text the client sent (canonicalised too when that text is JSON, as the
//! gateway would). A log that keeps only `body_sha256` is compared by that hash.
//!
//! The Idempotency-Key a line may carry is not part of the identity: it is kept, hashed,
//! only to tell a retry under the same key from one under a key made up anew.

use std::borrow::Cow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::num::NonZeroU64;

use oncely_core::units::Timestamp;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::args::{Field, FieldMap};
use crate::canon::{request_key, Body, Json, RequestKey};

/// A request as the audit needs it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Request {
    /// Start, milliseconds since the epoch.
    pub(crate) ts: i64,
    /// How long it ran (0 when the log does not say).
    pub(crate) duration_ms: u64,
    /// Units charged; `None` when the line has none (then it counts as one).
    pub(crate) units: Option<u64>,
    /// Principal, method and path in one allocation.
    pub(crate) names: Names,
    /// Principal, method, path and body, as the gateway would fingerprint them.
    pub(crate) key: RequestKey,
    /// A hash of the Idempotency-Key the line carries (`None` without one).
    pub(crate) idempotency_key: Option<NonZeroU64>,
}

/// A field read from a top-level member, and the JSON pointer inside it (if any).
type Target = (Field, Option<String>);

/// A request's principal, method and path, kept in one allocation (one per line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Names {
    text: Box<str>,
    principal_end: u32,
    method_end: u32,
}

impl Names {
    pub(crate) fn new(principal: &str, method: &str, path: &str) -> Names {
        let mut text = String::with_capacity(principal.len() + method.len() + path.len());
        text.push_str(principal);
        text.push_str(method);
        text.push_str(path);
        Names {
            text: text.into(),
            principal_end: principal.len() as u32,
            method_end: (principal.len() + method.len()) as u32,
        }
    }
    pub(crate) fn principal(&self) -> &str {
        &self.text[..self.principal_end as usize]
    }
    pub(crate) fn method(&self) -> &str {
        &self.text[self.principal_end as usize..self.method_end as usize]
    }
    pub(crate) fn path(&self) -> &str {
        &self.text[self.method_end as usize..]
    }
}

/// How the log's field names map onto what the audit reads, prepared for fast lookup.
#[derive(Debug, Clone)]
pub(crate) struct LineReader {
    /// Top-level member name → the fields read from it (and the pointer inside it).
    members: Vec<(String, Vec<Target>)>,
    ignore: Vec<String>,
}

impl LineReader {
    pub(crate) fn new(fields: &FieldMap, ignore: &[String]) -> LineReader {
        let mut members: Vec<(String, Vec<Target>)> = Vec::new();
        for field in Field::ALL {
            for source in fields.sources(field) {
                let target = (field, source.inner);
                match members.iter_mut().find(|(m, _)| *m == source.member) {
                    Some((_, targets)) => targets.push(target),
                    None => members.push((source.member, vec![target])),
                }
            }
        }
        LineReader {
            members,
            ignore: ignore.to_vec(),
        }
    }

    /// Reads one line (without its line break); `scratch` is reused between lines.
    pub(crate) fn read(&self, line: &[u8], scratch: &mut Vec<u8>) -> Result<Request, LineError> {
        let mut de = serde_json::Deserializer::from_slice(line);
        let captured = CaptureSeed { reader: self }
            .deserialize(&mut de)
            .map_err(|e| LineError::NotJson(e.to_string()))?;
        de.end().map_err(|e| LineError::NotJson(e.to_string()))?;
        self.interpret(captured, scratch)
    }

    fn interpret(&self, c: Captured<'_>, scratch: &mut Vec<u8>) -> Result<Request, LineError> {
        let get = |f: Field| c.values[f.index()].as_deref();
        let required = |f: Field| get(f).ok_or(LineError::Missing(f));

        let ts = read_ts(required(Field::Ts)?).ok_or(LineError::Invalid(Field::Ts))?;
        let principal =
            read_name(required(Field::Principal)?).ok_or(LineError::Invalid(Field::Principal))?;
        let method =
            read_string(required(Field::Method)?).ok_or(LineError::Invalid(Field::Method))?;
        let path = read_string(required(Field::Path)?).ok_or(LineError::Invalid(Field::Path))?;
        if principal.is_empty() {
            return Err(LineError::Invalid(Field::Principal));
        }
        if method.is_empty() {
            return Err(LineError::Invalid(Field::Method));
        }
        let units = match get(Field::Units) {
            None | Some("null") => None,
            Some(raw) => Some(read_count(raw).ok_or(LineError::Invalid(Field::Units))?),
        };
        let duration_ms = match get(Field::DurationMs) {
            None | Some("null") => 0,
            Some(raw) => read_count(raw).ok_or(LineError::Invalid(Field::DurationMs))?,
        };

        let key = match (c.body, get(Field::BodySha256)) {
            (Some(body), _) if body != Json::Null => {
                // A body kept as a string is the text sent: JSON text is compared as
                // JSON, as the gateway does; anything else as bytes.
                let (mut json, text) = match body {
                    Json::Str(text) => (None, Some(text)),
                    other => (Some(other), None),
                };
                let reparsed;
                if let Some(text) = &text {
                    reparsed = Json::parse(text.as_bytes());
                    json = reparsed;
                }
                match json {
                    Some(mut value) => {
                        value.normalize();
                        for pointer in &self.ignore {
                            value.remove_pointer(pointer);
                        }
                        scratch.clear();
                        value.write_canonical(scratch);
                        request_key(&principal, &method, &path, Body::Json(scratch))
                    }
                    None => {
                        let text = text.unwrap_or_default();
                        request_key(&principal, &method, &path, Body::Bytes(text.as_bytes()))
                    }
                }
            }
            (_, Some(raw)) if raw != "null" => {
                let digest = read_sha256(raw).ok_or(LineError::Invalid(Field::BodySha256))?;
                request_key(&principal, &method, &path, Body::Sha256(&digest))
            }
            _ => request_key(&principal, &method, &path, Body::Bytes(b"")),
        };
        Ok(Request {
            ts,
            duration_ms,
            units,
            names: Names::new(&principal, &method, &path),
            key,
            idempotency_key: get(Field::IdempotencyKey).and_then(read_idempotency_key),
        })
    }
}

/// Why a line was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LineError {
    NotJson(String),
    Missing(Field),
    Invalid(Field),
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineError::NotJson(e) => write!(f, "not a JSON object: {e}"),
            LineError::Missing(field) => write!(f, "missing field {:?}", field.name()),
            LineError::Invalid(field) => write!(f, "{}", invalid_reason(*field)),
        }
    }
}

fn invalid_reason(field: Field) -> &'static str {
    match field {
        Field::Ts => "\"ts\" is not an RFC 3339 time or a number of (milli)seconds",
        Field::Principal => "\"principal\" is not a non-empty string or number",
        Field::Method => "\"method\" is not a non-empty string",
        Field::Path => "\"path\" is not a string",
        Field::Body => "\"body\" is not a JSON value or a string",
        Field::BodySha256 => "\"body_sha256\" is not 64 hex digits",
        Field::Units => "\"units\" is not a whole number of at least 0",
        Field::DurationMs => "\"duration_ms\" is not a number of at least 0",
        // Never given: a key that is not a string or number is read as no key.
        Field::IdempotencyKey => "\"idempotency_key\" is not a string or number",
    }
}

/// The raw JSON text of each field found in a line; the body parsed.
struct Captured<'de> {
    values: [Option<Cow<'de, str>>; Field::COUNT],
    body: Option<Json<'de>>,
}

struct CaptureSeed<'r> {
    reader: &'r LineReader,
}

impl<'de> DeserializeSeed<'de> for CaptureSeed<'_> {
    type Value = Captured<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Captured<'de>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for CaptureSeed<'_> {
    type Value = Captured<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Captured<'de>, A::Error> {
        let mut out = Captured {
            values: Default::default(),
            body: None,
        };
        while let Some(member) = map.next_key_seed(MemberSeed {
            reader: self.reader,
        })? {
            let Some(i) = member else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            let targets = &self.reader.members[i].1;
            let raw: &'de RawValue = map.next_value()?;
            for (field, inner) in targets {
                if *field == Field::Body {
                    // Numbers are read as the decimals they spell, as the gateway does.
                    out.body = match Json::parse(raw.get().as_bytes()) {
                        Some(mut v) => match inner {
                            None => Some(v),
                            Some(pointer) => v
                                .pointer_mut(pointer)
                                .map(|t| std::mem::replace(t, Json::Null)),
                        },
                        // JSON that repeats a member name (the line itself is JSON): its
                        // text, compared as bytes, as the gateway hashes such a body.
                        None => Some(Json::Str(Cow::Borrowed(raw.get()))),
                    };
                    continue;
                }
                let value = match inner {
                    None => Some(Cow::Borrowed(raw.get())),
                    Some(pointer) => serde_json::from_str::<serde_json::Value>(raw.get())
                        .ok()
                        .and_then(|v| v.pointer(pointer).map(|v| Cow::Owned(v.to_string()))),
                };
                out.values[field.index()] = value;
            }
        }
        Ok(out)
    }
}

/// Reads a member name and says which entry of [`LineReader::members`] it is, if any.
struct MemberSeed<'r> {
    reader: &'r LineReader,
}

impl<'de> DeserializeSeed<'de> for MemberSeed<'_> {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for MemberSeed<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Option<usize>, E> {
        Ok(self.reader.members.iter().position(|(m, _)| m == name))
    }
}

fn read_string(raw: &str) -> Option<Cow<'_, str>> {
    if !raw.starts_with('"') {
        return None;
    }
    if !raw.contains('\\') {
        return Some(Cow::Borrowed(&raw[1..raw.len() - 1]));
    }
    serde_json::from_str::<String>(raw).ok().map(Cow::Owned)
}

/// A principal may be a string or a number (an account id).
fn read_name(raw: &str) -> Option<Cow<'_, str>> {
    if raw.starts_with('"') {
        read_string(raw)
    } else if raw.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        Some(Cow::Borrowed(raw))
    } else {
        None
    }
}

/// RFC 3339, or a number: milliseconds when at least 1e11 (after 1973 in ms), else
/// seconds (fractions kept to the millisecond).
fn read_ts(raw: &str) -> Option<i64> {
    if raw.starts_with('"') {
        return Timestamp::parse_rfc3339(&read_string(raw)?)
            .ok()
            .map(|t| t.millis());
    }
    let n: f64 = raw.parse().ok()?;
    if !n.is_finite() {
        return None;
    }
    let ms = if n.abs() >= 1e11 { n } else { n * 1000.0 };
    if ms.abs() > 1e15 {
        return None;
    }
    Some(ms.round() as i64)
}

/// A whole number of at least 0, as a JSON number (`12`, `12.0`) or a string of digits.
fn read_count(raw: &str) -> Option<u64> {
    let text = raw
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .unwrap_or(raw);
    if let Ok(n) = text.parse::<u64>() {
        return Some(n);
    }
    let f: f64 = text.parse().ok()?;
    (f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f < 1.8e19).then_some(f as u64)
}

/// An Idempotency-Key: a non-empty string, or a number (as written), hashed. Anything
/// else (`null`, `""`, an object) is no key: the field is optional and never makes a line
/// unreadable. Only keys of one request are ever compared, so 64 bits are plenty.
fn read_idempotency_key(raw: &str) -> Option<NonZeroU64> {
    let text = if raw.starts_with('"') {
        read_string(raw)?
    } else if raw.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        Cow::Borrowed(raw)
    } else {
        return None;
    };
    if text.is_empty() {
        return None;
    }
    // SipHash with fixed keys: the same key hashes alike on every parser thread.
    let mut h = std::hash::DefaultHasher::new();
    text.hash(&mut h);
    Some(NonZeroU64::new(h.finish()).unwrap_or(NonZeroU64::MIN))
}

fn read_sha256(raw: &str) -> Option<[u8; 32]> {
    let text = read_string(raw)?;
    let hex_text = text.strip_prefix("sha256:").unwrap_or(&text);
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_text, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader() -> LineReader {
        LineReader::new(&FieldMap::default(), &[])
    }

    #[test]
    fn reads_the_contract_fields_and_skips_the_rest() {
        let r = reader()
            .read(br#"{"ts":"2026-11-06T10:00:00.5Z","extra":{"deep":[1,2,{"x":"\u0041"}]},"principal":"acct_1","method":"POST","path":"/v1/render?x=1","body":{"text":"hi"},"units":2,"duration_ms":90000}"#, &mut Vec::new())
            .unwrap();
        assert_eq!(
            r.ts,
            Timestamp::parse_rfc3339("2026-11-06T10:00:00.500Z")
                .unwrap()
                .millis()
        );
        assert_eq!(r.names.principal(), "acct_1");
        assert_eq!(r.names.method(), "POST");
        assert_eq!(r.names.path(), "/v1/render?x=1");
        assert_eq!(r.units, Some(2));
        assert_eq!(r.duration_ms, 90_000);
        assert_eq!(
            r.key,
            request_key(
                "acct_1",
                "POST",
                "/v1/render?x=1",
                Body::Json(br#"{"text":"hi"}"#)
            )
        );
    }

    #[test]
    fn a_string_body_holding_json_equals_the_json_value() {
        let a = reader()
            .read(br#"{"ts":1,"principal":"p","method":"POST","path":"/","body":"{\"b\":1.0,\"a\":[1]}"}"#, &mut Vec::new())
            .unwrap();
        let b = reader()
            .read(
                br#"{"ts":1,"principal":"p","method":"POST","path":"/","body":{"a":[1],"b":1}}"#,
                &mut Vec::new(),
            )
            .unwrap();
        assert_eq!(a.key, b.key);
        let text = reader()
            .read(
                br#"{"ts":1,"principal":"p","method":"POST","path":"/","body":"plain text"}"#,
                &mut Vec::new(),
            )
            .unwrap();
        assert_ne!(text.key, a.key);
    }

    #[test]
    fn a_body_that_repeats_a_member_name_is_its_text() {
        let key = |body: &str| {
            let line =
                format!(r#"{{"ts":1,"principal":"p","method":"POST","path":"/","body":{body}}}"#);
            reader().read(line.as_bytes(), &mut Vec::new()).unwrap().key
        };
        let repeated = key(r#"{"amount":1000,"amount":2}"#);
        // Not the request without the first value, nor one without a body.
        assert_ne!(repeated, key(r#"{"amount":2}"#));
        assert_ne!(repeated, key("null"));
        assert_ne!(repeated, key(r#"{"amount":2,"amount":1000}"#));
        // The same text again is the same request, in the body and in a string.
        assert_eq!(repeated, key(r#"{"amount":1000,"amount":2}"#));
        assert_eq!(repeated, key(r#""{\"amount\":1000,\"amount\":2}""#));
        assert_eq!(
            repeated,
            request_key(
                "p",
                "POST",
                "/",
                Body::Bytes(br#"{"amount":1000,"amount":2}"#)
            )
        );
    }

    #[test]
    fn numbers_and_escapes() {
        let r = reader()
            .read(br#"{"ts":1762423200,"principal":42,"method":"POST","path":"/caf\u00e9","units":"7","duration_ms":1.5e3}"#, &mut Vec::new())
            .unwrap();
        assert_eq!(r.ts, 1_762_423_200_000);
        assert_eq!(r.names.principal(), "42");
        assert_eq!(r.names.path(), "/café");
        assert_eq!(r.units, Some(7));
        assert_eq!(r.duration_ms, 1500);
        let ms = reader()
            .read(
                br#"{"ts":1762423200123,"principal":"p","method":"GET","path":"/"}"#,
                &mut Vec::new(),
            )
            .unwrap();
        assert_eq!(ms.ts, 1_762_423_200_123);
        assert_eq!(ms.units, None);
    }

    #[test]
    fn body_sha256_is_its_own_kind_of_identity() {
        let hash = "ab".repeat(32);
        let line = format!(
            r#"{{"ts":1,"principal":"p","method":"POST","path":"/","body_sha256":"{hash}"}}"#
        );
        let upper = line.replace(&hash, &hash.to_uppercase());
        let a = reader().read(line.as_bytes(), &mut Vec::new()).unwrap();
        assert_eq!(
            a.key,
            reader()
                .read(upper.as_bytes(), &mut Vec::new())
                .unwrap()
                .key
        );
        let empty = reader()
            .read(
                br#"{"ts":1,"principal":"p","method":"POST","path":"/"}"#,
                &mut Vec::new(),
            )
            .unwrap();
        assert_ne!(a.key, empty.key);
        assert_eq!(
            reader()
                .read(
                    br#"{"ts":1,"principal":"p","method":"POST","path":"/","body_sha256":"xyz"}"#,
                    &mut Vec::new()
                )
                .unwrap_err(),
            LineError::Invalid(Field::BodySha256)
        );
    }

    #[test]
    fn reasons_name_the_problem() {
        let cases: [(&[u8], &str); 8] = [
            (b"not json", "not a JSON object"),
            (b"[1,2]", "not a JSON object"),
            (
                br#"{"ts":1,"principal":"p","method":"GET","path":"/"} trailing"#,
                "not a JSON object",
            ),
            (
                br#"{"principal":"p","method":"GET","path":"/"}"#,
                "missing field \"ts\"",
            ),
            (
                br#"{"ts":"yesterday","principal":"p","method":"GET","path":"/"}"#,
                "\"ts\" is not",
            ),
            (
                br#"{"ts":1,"principal":"","method":"GET","path":"/"}"#,
                "\"principal\" is not",
            ),
            (
                br#"{"ts":1,"principal":"p","method":"GET","path":"/","units":-3}"#,
                "\"units\" is not",
            ),
            (
                br#"{"ts":1,"principal":"p","method":"GET","path":"/","units":1.5}"#,
                "\"units\" is not",
            ),
        ];
        for (line, reason) in cases {
            let e = reader()
                .read(line, &mut Vec::new())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(reason),
                "{:?}: {e}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn mapped_and_nested_fields() {
        let map =
            FieldMap::parse(&["principal=/auth/account", "ts=time", "body=/req/payload"]).unwrap();
        let r = LineReader::new(&map, &["/nonce".to_string()])
            .read(br#"{"time":"2026-11-06T10:00:00Z","ts":"garbage","auth":{"account":"acct_9"},"method":"POST","path":"/x","req":{"payload":{"t":1,"nonce":"abc"}}}"#, &mut Vec::new())
            .unwrap();
        assert_eq!(r.names.principal(), "acct_9");
        assert_eq!(
            r.key,
            request_key("acct_9", "POST", "/x", Body::Json(br#"{"t":1}"#))
        );
    }

    #[test]
    fn the_idempotency_key_is_kept_hashed_and_not_in_the_identity() {
        let read = |extra: &str| {
            let line = format!(r#"{{"ts":1,"principal":"p","method":"POST","path":"/"{extra}}}"#);
            reader().read(line.as_bytes(), &mut Vec::new()).unwrap()
        };
        let (plain, k1) = (read(""), read(r#","idempotency_key":"k-1""#));
        assert_eq!((plain.idempotency_key, k1.key), (None, plain.key));
        assert!(k1.idempotency_key.is_some());
        assert_ne!(read(r#","idempotency_key":"k-2""#), k1);
        assert_eq!(read(r#","idempotencyKey":"k\u002d1""#), k1);
        assert_eq!(read(r#","idempotency_key":null"#), plain);
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_lines_never_panic(raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = reader().read(&raw, &mut Vec::new());
        }

        #[test]
        fn arbitrary_values_in_every_field_never_panic(
            ts in "[0-9a-zA-Z:.+\\-]{0,30}",
            body in "[\\[\\]{}\":,0-9a-z ]{0,30}",
            units in "[-0-9.e]{0,12}",
        ) {
            let line = format!(
                r#"{{"ts":"{ts}","principal":"p","method":"POST","path":"/","body":"{body}","units":{units},"duration_ms":{units}}}"#
            );
            let _ = reader().read(line.as_bytes(), &mut Vec::new());
            let map = FieldMap::parse(&["body=/b/0", "principal=/who"]).unwrap();
            let line = format!(r#"{{"ts":1,"who":{body},"method":"GET","path":"/","b":[{body}]}}"#);
            let _ = LineReader::new(&map, &["/0".into(), "/a/b".into()]).read(line.as_bytes(), &mut Vec::new());
        }
    }
}
