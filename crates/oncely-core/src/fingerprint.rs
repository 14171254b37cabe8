//! The request fingerprint: what makes two requests "the same intention".
//!
//! SHA-256 over the principal, method, path and query, the chosen headers and the body.
//! A JSON body is canonicalised first ([`crate::canon`]: RFC 8785's sorted keys and no
//! white space, with numbers compared as exact decimals, so `1.0`, `1` and `1e0` agree
//! while `9007199254740993` and `9007199254740992` do not), with `ignore_fields` (JSON
//! pointers) removed; any other body, invalid JSON included, is hashed as bytes.
//! [`FingerprintBuilder::request_body`] also reads the body by its `Content-Type`: a
//! `multipart/form-data` body as its parts ([`crate::multipart`]: name, filename, content
//! type and content, in order, none of the framing) and an
//! `application/x-www-form-urlencoded` one as its decoded pairs ([`crate::form`], ordered by
//! name), with `ignore_fields` of the form `/NAME` naming a part or a field; a body
//! malformed for its type is hashed as [`FingerprintBuilder::body`] hashes it.
//! Every field is length-prefixed so that no two different inputs share a byte stream, and
//! each way of reading a body has its own tag (`J`, `B`, `M`, `F`), so no two share a
//! fingerprint.

use std::fmt;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{form, multipart};

/// A SHA-256 request fingerprint.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// Lower-case hex, as stored and shown.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Reads the hex form back.
    pub fn from_hex(text: &str) -> Option<Fingerprint> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(text, &mut out).ok()?;
        Some(Fingerprint(out))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Canonicalises a JSON document ([`crate::canon`]) after removing `ignore` pointers.
/// Returns `None` when `body` is not JSON.
pub fn canonical_json(body: &[u8], ignore: &[String]) -> Option<Vec<u8>> {
    crate::canon::canonicalize(body, ignore)
}

/// Removes the member or element a JSON pointer (RFC 6901) names, if it exists.
pub fn remove_pointer(value: &mut Value, pointer: &str) {
    if pointer.is_empty() || !pointer.starts_with('/') {
        return;
    }
    let (parent, last) = match pointer.rfind('/') {
        Some(i) => (&pointer[..i], &pointer[i + 1..]),
        None => return,
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    let target = if parent.is_empty() {
        Some(value)
    } else {
        value.pointer_mut(parent)
    };
    match target {
        Some(Value::Object(map)) => {
            map.remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>() {
                if i < items.len() {
                    items.remove(i);
                }
            }
        }
        _ => {}
    }
}

/// Builds a [`Fingerprint`] field by field.
///
/// ```
/// use oncely_core::FingerprintBuilder;
/// let a = FingerprintBuilder::new("acct", "POST", "/v1/render")
///     .body(br#"{"text": "hi", "voice": 1.0}"#, &[]);
/// let b = FingerprintBuilder::new("acct", "POST", "/v1/render")
///     .body(br#"{"voice":1,"text":"hi"}"#, &[]);
/// assert_eq!(a, b);
/// ```
#[derive(Debug, Clone)]
pub struct FingerprintBuilder {
    hasher: Sha256,
}

impl FingerprintBuilder {
    /// Starts a fingerprint of `principal`'s `method` on `path_and_query`.
    pub fn new(principal: &str, method: &str, path_and_query: &str) -> FingerprintBuilder {
        let mut b = FingerprintBuilder {
            hasher: Sha256::new(),
        };
        b.hasher.update(b"oncely/fingerprint/v1\0");
        b.field(principal.as_bytes());
        b.field(method.as_bytes());
        b.field(path_and_query.as_bytes());
        b
    }

    /// Adds a header that is part of the intention (`fingerprint_headers`). Names are
    /// case-insensitive; an absent header is hashed as absent, not as empty.
    pub fn header(mut self, name: &str, value: Option<&[u8]>) -> FingerprintBuilder {
        self.field(name.to_ascii_lowercase().as_bytes());
        match value {
            Some(v) => {
                self.hasher.update([1u8]);
                self.field(v);
            }
            None => self.hasher.update([0u8]),
        }
        self
    }

    /// Adds an extra named component (an MCP tool name, a webhook source).
    pub fn component(mut self, value: &[u8]) -> FingerprintBuilder {
        self.field(value);
        self
    }

    /// Adds the body and finishes. JSON is canonicalised with `ignore` removed; anything
    /// else is hashed as it is.
    pub fn body(mut self, body: &[u8], ignore: &[String]) -> Fingerprint {
        match canonical_json(body, ignore) {
            Some(canonical) => {
                self.hasher.update(b"J");
                self.field(&canonical);
            }
            None => {
                self.hasher.update(b"B");
                self.field(body);
            }
        }
        Fingerprint(self.hasher.finalize().into())
    }

    /// Adds the body, read as its `Content-Type` (the request header's value) says, and
    /// finishes: a `multipart/form-data` body with a boundary as its parts, in order (each
    /// part's name, filename, content type and content; not the boundary, preamble,
    /// epilogue or other part headers); an `application/x-www-form-urlencoded` body as its
    /// percent-decoded name/value pairs ordered by name (repeated names in their order).
    /// `ignore` entries `/NAME` (JSON pointer escapes `~1` and `~0` undone) drop the parts
    /// and pairs named `NAME`. Any other body, and one malformed for its type, is hashed
    /// as [`FingerprintBuilder::body`] hashes it. A part's content is hashed where it lies
    /// in `body`, never copied.
    ///
    /// ```
    /// use oncely_core::FingerprintBuilder;
    /// let upload = |boundary: &str| {
    ///     let body = format!(
    ///         "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; \
    ///          filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF\r\n--{boundary}--\r\n"
    ///     );
    ///     let content_type = format!("multipart/form-data; boundary={boundary}");
    ///     FingerprintBuilder::new("acct", "POST", "/v1/audio")
    ///         .request_body(Some(content_type.as_bytes()), body.as_bytes(), &[])
    /// };
    /// assert_eq!(upload("x1"), upload("----retry2"));
    ///
    /// let form = |body: &[u8]| {
    ///     FingerprintBuilder::new("acct", "POST", "/v1/charges").request_body(
    ///         Some(b"application/x-www-form-urlencoded"),
    ///         body,
    ///         &["/idempotency_nonce".to_string()],
    ///     )
    /// };
    /// assert_eq!(form(b"amount=100&note=a+b&idempotency_nonce=1"), form(b"note=a%20b&amount=100"));
    /// ```
    pub fn request_body(
        self,
        content_type: Option<&[u8]>,
        body: &[u8],
        ignore: &[String],
    ) -> Fingerprint {
        self.read_body(content_type, body, &Select::Ignore(ignore))
    }

    /// [`FingerprintBuilder::request_body`] over only the `fields` of the body
    /// (`fingerprint_fields`, the complement of `ignore_fields`): JSON pointers, each
    /// hashed with what it names (or as absent), in the order given; `/NAME` for a form
    /// field or a part, whose other fields and parts do not count. A body that is none of
    /// JSON, a form and multipart is hashed whole, as it cannot be read as fields.
    ///
    /// ```
    /// use oncely_core::FingerprintBuilder;
    /// let only = ["/amount".to_string(), "/to".to_string()];
    /// let fp = |body: &[u8]| {
    ///     FingerprintBuilder::new("acct", "POST", "/v1/payments")
    ///         .request_body_fields(Some(b"application/json"), body, &only)
    /// };
    /// assert_eq!(fp(br#"{"amount": 100, "to": "bob", "note": "rent"}"#),
    ///            fp(br#"{"to": "bob", "amount": 1e2, "note": "rent for May"}"#));
    /// assert_ne!(fp(br#"{"amount": 100, "to": "bob"}"#), fp(br#"{"amount": 100}"#));
    /// ```
    pub fn request_body_fields(
        self,
        content_type: Option<&[u8]>,
        body: &[u8],
        fields: &[String],
    ) -> Fingerprint {
        self.read_body(content_type, body, &Select::Only(fields))
    }

    fn read_body(
        self,
        content_type: Option<&[u8]>,
        body: &[u8],
        select: &Select<'_>,
    ) -> Fingerprint {
        let read = content_type.and_then(|content_type| {
            if let Some(boundary) = multipart::boundary(content_type) {
                self.clone().multipart(body, &boundary, select)
            } else if form::is_form(content_type) {
                self.clone().form(body, select)
            } else {
                None
            }
        });
        read.unwrap_or_else(|| match select {
            Select::Ignore(ignore) => self.body(body, ignore),
            Select::Only(fields) => self.json_fields(body, fields),
        })
    }

    /// The JSON body's `fields` (pointers), each with its canonical value or as absent;
    /// a body that is not JSON, as its bytes.
    fn json_fields(mut self, body: &[u8], fields: &[String]) -> Fingerprint {
        let Some(mut doc) = crate::canon::Json::parse(body) else {
            return self.body(body, &[]);
        };
        doc.normalize();
        self.hasher.update(b"S");
        for pointer in fields {
            self.field(pointer.as_bytes());
            let value = doc.pointer_mut(pointer).map(|v| {
                let mut out = Vec::new();
                v.write_canonical(&mut out);
                out
            });
            self.optional(value.as_deref());
        }
        Fingerprint(self.hasher.finalize().into())
    }

    /// The parts, hashed as they are read; `None` when the body is malformed (what was
    /// hashed of it is dropped with this copy of the builder).
    fn multipart(
        mut self,
        body: &[u8],
        boundary: &[u8],
        select: &Select<'_>,
    ) -> Option<Fingerprint> {
        let names = select.names();
        self.hasher.update(select.mark(b'M'));
        for part in multipart::parts(body, boundary) {
            let part = part.ok()?;
            if !select.keeps(&names, |name| *name == *part.name) {
                continue;
            }
            self.hasher.update(b"p");
            self.field(&part.name);
            self.optional(part.filename.as_deref());
            self.optional(part.content_type);
            self.field(part.content);
        }
        self.hasher.update(b"e");
        Some(Fingerprint(self.hasher.finalize().into()))
    }

    /// The pairs in name order, each decoded as it is hashed; `None` when the body is
    /// malformed.
    fn form(mut self, body: &[u8], select: &Select<'_>) -> Option<Fingerprint> {
        let pairs = form::pairs(body).ok()?;
        let names = select.names();
        self.hasher.update(select.mark(b'F'));
        for pair in pairs {
            if !select.keeps(&names, |name| pair.name.is(name)) {
                continue;
            }
            self.hasher.update(b"p");
            for text in [pair.name, pair.value] {
                self.hasher
                    .update((text.decoded_len() as u64).to_be_bytes());
                text.decode_into(|piece| self.hasher.update(piece));
            }
        }
        self.hasher.update(b"e");
        Some(Fingerprint(self.hasher.finalize().into()))
    }

    /// A field that may be absent: absent is not the same as empty.
    fn optional(&mut self, value: Option<&[u8]>) {
        match value {
            Some(v) => {
                self.hasher.update([1u8]);
                self.field(v);
            }
            None => self.hasher.update([0u8]),
        }
    }

    fn field(&mut self, bytes: &[u8]) {
        self.hasher.update((bytes.len() as u64).to_be_bytes());
        self.hasher.update(bytes);
    }
}

/// Which fields of a body count: all but `ignore_fields`, or only `fingerprint_fields`.
enum Select<'a> {
    Ignore(&'a [String]),
    Only(&'a [String]),
}

impl Select<'_> {
    /// The form field and part names its pointers give ([`ignored_names`]).
    fn names(&self) -> Vec<Vec<u8>> {
        match self {
            Select::Ignore(p) | Select::Only(p) => ignored_names(p),
        }
    }

    /// Whether a field or part one of whose `names` is (`is`) counts.
    fn keeps(&self, names: &[Vec<u8>], is: impl Fn(&[u8]) -> bool) -> bool {
        let named = names.iter().any(|n| is(n));
        match self {
            Select::Ignore(_) => !named,
            Select::Only(_) => named,
        }
    }

    /// The mark a reading of a body starts with: a selection of fields is its own
    /// reading, never equal to a whole body's.
    fn mark(&self, whole: u8) -> [u8; 1] {
        match self {
            Select::Ignore(_) => [whole],
            Select::Only(_) => [whole.to_ascii_lowercase()],
        }
    }
}

/// The names that `ignore_fields` entries of the form `/NAME` give a form field or a part:
/// `NAME` with the JSON pointer escapes undone (`~1` is `/`, `~0` is `~`). A pointer of
/// more than one segment names nothing in a form, whose fields are flat.
fn ignored_names(ignore: &[String]) -> Vec<Vec<u8>> {
    ignore
        .iter()
        .filter_map(|pointer| pointer.strip_prefix('/'))
        .filter(|name| !name.contains('/'))
        .map(|name| name.replace("~1", "/").replace("~0", "~").into_bytes())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fp(body: &[u8]) -> Fingerprint {
        FingerprintBuilder::new("acct", "POST", "/v1/render").body(body, &[])
    }

    #[test]
    fn key_order_white_space_and_number_spellings_agree() {
        let base = fp(br#"{"a":1,"b":[100,"x"],"c":{"d":true}}"#);
        assert_eq!(
            base,
            fp(br#" { "c" : { "d" : true } , "b" : [ 1e2 , "x" ] , "a" : 1.0 } "#)
        );
        assert_eq!(
            base,
            fp(b"{\n\t\"b\": [100.0, \"x\"],\n\t\"a\": 1, \"c\": {\"d\": true}\n}")
        );
        assert_ne!(base, fp(br#"{"a":2,"b":[100,"x"],"c":{"d":true}}"#));
        assert_ne!(base, fp(br#"{"a":1,"b":["x",100],"c":{"d":true}}"#));
        assert_ne!(base, fp(br#"{"a":"1","b":[100,"x"],"c":{"d":true}}"#));
    }

    #[test]
    fn invalid_json_and_other_bodies_are_hashed_as_bytes() {
        assert_ne!(fp(b"{not json"), fp(b"{not  json"));
        assert_eq!(fp(b"{not json"), fp(b"{not json"));
        assert_ne!(fp(b""), fp(b" "));
        // A text body is not confused with a JSON string holding the same text.
        assert_ne!(fp(b"hello"), fp(br#""hello""#));
    }

    #[test]
    fn every_part_of_the_request_counts() {
        let body = br#"{"text":"hi"}"#;
        let base = FingerprintBuilder::new("acct", "POST", "/v1/render").body(body, &[]);
        assert_ne!(
            base,
            FingerprintBuilder::new("other", "POST", "/v1/render").body(body, &[])
        );
        assert_ne!(
            base,
            FingerprintBuilder::new("acct", "PUT", "/v1/render").body(body, &[])
        );
        assert_ne!(
            base,
            FingerprintBuilder::new("acct", "POST", "/v1/render?x=1").body(body, &[])
        );
        let plan = |v: Option<&[u8]>| {
            FingerprintBuilder::new("acct", "POST", "/v1/render")
                .header("X-Plan", v)
                .body(body, &[])
        };
        assert_ne!(plan(Some(b"pro")), plan(Some(b"free")));
        assert_ne!(plan(Some(b"")), plan(None));
        assert_eq!(
            plan(Some(b"pro")),
            FingerprintBuilder::new("acct", "POST", "/v1/render")
                .header("x-plan", Some(b"pro"))
                .body(body, &[])
        );
    }

    #[test]
    fn ignored_fields_do_not_count() {
        let ignore = vec![
            "/request_id".to_string(),
            "/meta/trace".to_string(),
            "/a~1b".to_string(),
        ];
        let f = |b: &[u8]| FingerprintBuilder::new("p", "POST", "/x").body(b, &ignore);
        assert_eq!(
            f(br#"{"text":"hi","request_id":"r1","meta":{"trace":"t1","keep":1},"a/b":1}"#),
            f(br#"{"text":"hi","request_id":"r2","meta":{"trace":"t2","keep":1},"a/b":2}"#),
        );
        assert_ne!(
            f(br#"{"text":"hi","meta":{"keep":1}}"#),
            f(br#"{"text":"hi","meta":{"keep":2}}"#),
        );
    }

    #[test]
    fn only_the_fingerprint_fields_count_in_json_forms_and_parts() {
        let only = vec!["/amount".to_string(), "/to".to_string()];
        let b = || FingerprintBuilder::new("p", "POST", "/x");
        let json = |body: &[u8]| b().request_body_fields(Some(b"application/json"), body, &only);
        assert_eq!(
            json(br#"{"amount": 1, "to": "a", "note": "x"}"#),
            json(br#"{"note": "y", "to": "a", "amount": 1.0}"#)
        );
        assert_ne!(
            json(br#"{"amount": 1, "to": "a"}"#),
            json(br#"{"amount": 2, "to": "a"}"#)
        );
        assert_ne!(
            json(br#"{"amount": 1}"#),
            json(br#"{"amount": 1, "to": null}"#),
            "absent is not null"
        );
        let form = |body: &[u8]| {
            b().request_body_fields(Some(b"application/x-www-form-urlencoded"), body, &only)
        };
        assert_eq!(form(b"amount=1&to=a&note=x"), form(b"note=y&to=a&amount=1"));
        assert_ne!(form(b"amount=1&to=a"), form(b"amount=2&to=a"));
        let part = |note: &str, amount: &str| {
            let body = format!(
                "--b\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n{amount}\r\n\
                 --b\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\n{note}\r\n--b--\r\n"
            );
            b().request_body_fields(
                Some(b"multipart/form-data; boundary=b"),
                body.as_bytes(),
                &only,
            )
        };
        assert_eq!(part("x", "1"), part("y", "1"));
        assert_ne!(part("x", "1"), part("x", "2"));
        // A selection is its own reading: never the whole body's fingerprint.
        let whole = b().request_body(
            Some(b"application/x-www-form-urlencoded"),
            b"amount=1&to=a",
            &[],
        );
        assert_ne!(form(b"amount=1&to=a"), whole);
    }

    #[test]
    fn request_body_keeps_the_json_and_bytes_fingerprints() {
        let ignore = vec!["/request_id".to_string()];
        let builder = || FingerprintBuilder::new("acct", "POST", "/v1/render");
        for body in [
            &br#"{"text":"hi","request_id":"r1"}"#[..],
            b"plain text",
            b"",
            b"a=1&b=2",
        ] {
            for content_type in [
                None,
                Some(&b"application/json"[..]),
                Some(b"text/plain"),
                Some(b"multipart/form-data"),
                Some(b"multipart/mixed; boundary=b"),
                Some(b"application/x-www-form-urlencoded-not"),
            ] {
                assert_eq!(
                    builder().request_body(content_type, body, &ignore),
                    builder().body(body, &ignore),
                    "{content_type:?} {body:?}"
                );
            }
        }
    }

    #[test]
    fn each_reading_of_a_body_has_its_own_fingerprint() {
        let builder = || FingerprintBuilder::new("acct", "POST", "/v1/render");
        let form = Some(&b"application/x-www-form-urlencoded"[..]);
        let multipart = Some(&b"multipart/form-data; boundary=b"[..]);
        let readings = [
            builder().body(b"", &[]),
            builder().body(b"{}", &[]),
            builder().request_body(form, b"", &[]),
            builder().request_body(multipart, b"--b--", &[]),
            builder().request_body(form, b"a=1", &[]),
            builder().request_body(
                multipart,
                b"--b\r\nContent-Disposition: form-data; name=a\r\n\r\n1\r\n--b--",
                &[],
            ),
        ];
        for (i, a) in readings.iter().enumerate() {
            for b in &readings[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn hex_round_trip() {
        let f = fp(b"x");
        assert_eq!(Fingerprint::from_hex(&f.to_hex()), Some(f));
        assert_eq!(Fingerprint::from_hex("zz"), None);
    }

    #[test]
    fn numbers_are_compared_as_exact_decimals() {
        assert_ne!(
            fp(br#"{"id":9007199254740993}"#),
            fp(br#"{"id":9007199254740992}"#)
        );
        assert_ne!(
            fp(br#"{"amount":12345678901234567890.123456789}"#),
            fp(br#"{"amount":12345678901234567890.123456788}"#)
        );
        assert_ne!(fp(br#"{"x":0.1}"#), fp(br#"{"x":0.10000000000000001}"#));
        assert_ne!(fp(br#"{"x":1e400}"#), fp(br#"{"x":1e401}"#));
        assert_eq!(fp(br#"{"x":1e400}"#), fp(br#"{"x":10e399}"#));
        assert_eq!(fp(br#"[1.0,1e2,-0]"#), fp(br#"[1,100,0]"#));
    }

    /// The RFC 8785 examples (section 3.2.2 and appendix B), byte for byte, where they
    /// are not about numbers that are not the shortest spelling of their double.
    #[test]
    fn rfc8785_vectors() {
        let input = r#"{
          "numbers": [333333333.3333333, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        let expected = r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#;
        assert_eq!(
            String::from_utf8(canonical_json(input.as_bytes(), &[]).unwrap()).unwrap(),
            expected
        );
        // Sorting is by UTF-16 code units (RFC 8785 section 3.2.3).
        let sorting = r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#;
        let sorted = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
        assert_eq!(
            String::from_utf8(canonical_json(sorting.as_bytes(), &[]).unwrap()).unwrap(),
            sorted
        );
        // Appendix B: IEEE 754 doubles and their ECMAScript spellings.
        for (bits, text) in [
            (0x0000000000000000u64, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ] {
            let value = serde_json::json!(f64::from_bits(bits));
            let canonical = serde_json_canonicalizer::to_string(&value).unwrap();
            assert_eq!(canonical, text, "bits {bits:#018x}");
            // And the canonical text reads back to the same fingerprint.
            assert_eq!(fp(canonical.as_bytes()), fp(value.to_string().as_bytes()));
        }
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-1_000_000i64..1_000_000).prop_map(Value::from),
            "[a-z€ \\\\\"]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z]{1,4}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Re-spells a value: keys in reverse order, extra white space, integers as `N.0`
    /// or `Ne0`.
    fn respell(v: &Value, style: u8) -> String {
        match v {
            Value::Object(map) => {
                let mut parts: Vec<String> = map
                    .iter()
                    .map(|(k, v)| format!("{} :  {}", Value::String(k.clone()), respell(v, style)))
                    .collect();
                parts.reverse();
                format!("{{ {} }}", parts.join(" ,\n "))
            }
            Value::Array(items) => format!(
                "[ {} ]",
                items
                    .iter()
                    .map(|v| respell(v, style))
                    .collect::<Vec<_>>()
                    .join(" , ")
            ),
            Value::Number(n) if n.is_i64() => match style % 3 {
                0 => format!("{}.0", n),
                1 => format!("{}e0", n),
                _ => format!("{}", n),
            },
            other => other.to_string(),
        }
    }

    proptest! {
        #[test]
        fn spelling_never_changes_the_fingerprint(v in json_value(), style in 0u8..3) {
            let plain = serde_json::to_vec(&v).unwrap();
            prop_assert_eq!(fp(&plain), fp(respell(&v, style).as_bytes()));
        }

        #[test]
        fn any_changed_value_changes_the_fingerprint(v in json_value(), extra in "[a-z]{1,6}") {
            let mut changed = serde_json::json!({"original": v.clone()});
            changed["__changed"] = Value::String(extra);
            let original = serde_json::json!({"original": v});
            prop_assert_ne!(
                fp(&serde_json::to_vec(&original).unwrap()),
                fp(&serde_json::to_vec(&changed).unwrap())
            );
        }

        #[test]
        fn changing_one_leaf_changes_the_fingerprint(a in -1_000_000i64..1_000_000, b in -1_000_000i64..1_000_000, s in "[a-z]{0,8}") {
            prop_assume!(a != b);
            let one = serde_json::json!({"n": a, "s": s});
            let two = serde_json::json!({"n": b, "s": s});
            prop_assert_ne!(fp(one.to_string().as_bytes()), fp(two.to_string().as_bytes()));
        }

        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = fp(&raw);
        }
    }
}
