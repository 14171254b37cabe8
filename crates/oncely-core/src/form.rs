//! `application/x-www-form-urlencoded` bodies read as their name/value pairs, for the
//! fingerprint.
//!
//! The body is split at `&` (empty pieces skipped), each piece at its first `=` (a piece
//! without one is a name with an empty value), and both sides are percent-decoded, `+`
//! being a space: what the WHATWG URL standard's parser does, but on bytes (no UTF-8 is
//! required) and strict: a `%` not followed by two hex digits is [`Malformed`], and the
//! fingerprint then hashes the body as bytes. Pairs are ordered by decoded name, the order
//! of repeated names kept (`items[0][price]=1&items[0][price]=2` is a list, and its order
//! counts).
//!
//! Nothing is decoded into a copy of the body: a pair holds the encoded slices, compares
//! and hashes them decoded as it goes ([`Encoded`]).

use std::borrow::Cow;
use std::cmp::Ordering;

/// The media type this module reads.
const MEDIA_TYPE: &[u8] = b"application/x-www-form-urlencoded";

/// Why a body is not a well-formed form: a `%` at byte `at` not followed by two hex
/// digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a `%` not followed by two hex digits at byte {at}")]
pub struct Malformed {
    /// The offset of the `%` in the body.
    pub at: usize,
}

/// Whether a `Content-Type` header value names a form (the media type compared
/// case-insensitively; its parameters, such as `charset`, do not matter).
///
/// ```
/// use oncely_core::form::is_form;
/// assert!(is_form(b"Application/X-WWW-Form-Urlencoded ; charset=utf-8"));
/// assert!(!is_form(b"application/json"));
/// ```
pub fn is_form(content_type: &[u8]) -> bool {
    let end = memchr::memchr(b';', content_type).unwrap_or(content_type.len());
    let media_type = &content_type[..end];
    let start = media_type.iter().take_while(|b| is_ows(b)).count();
    let media_type = &media_type[start..];
    let end = media_type.len() - media_type.iter().rev().take_while(|b| is_ows(b)).count();
    media_type[..end].eq_ignore_ascii_case(MEDIA_TYPE)
}

/// One name/value pair of a form, still encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair<'a> {
    /// The name.
    pub name: Encoded<'a>,
    /// The value (empty for a piece without `=`).
    pub value: Encoded<'a>,
}

/// The pairs of a form body, ordered by decoded name (a stable sort: repeated names keep
/// their order).
///
/// ```
/// use oncely_core::form::pairs;
/// let read = pairs(b"b=2&a=x+y&b=1&&c").unwrap();
/// let text: Vec<_> = read.iter().map(|p| (p.name.decode(), p.value.decode())).collect();
/// assert_eq!(text[0], (b"a"[..].into(), b"x y"[..].into()));
/// assert_eq!(text[1].1, &b"2"[..]);
/// assert_eq!(text[3], (b"c"[..].into(), b""[..].into()));
/// assert!(pairs(b"a=%zz").is_err());
/// ```
pub fn pairs(body: &[u8]) -> Result<Vec<Pair<'_>>, Malformed> {
    if let Some(at) = bad_escape(body) {
        return Err(Malformed { at });
    }
    let mut pairs: Vec<Pair<'_>> = body
        .split(|&b| b == b'&')
        .filter(|piece| !piece.is_empty())
        .map(|piece| {
            let (name, value) = match memchr::memchr(b'=', piece) {
                Some(i) => (&piece[..i], &piece[i + 1..]),
                None => (piece, &piece[piece.len()..]),
            };
            Pair {
                name: Encoded(name),
                value: Encoded(value),
            }
        })
        .collect();
    pairs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(pairs)
}

/// The offset of the first `%` not followed by two hex digits.
fn bad_escape(body: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'%', body).find(|&i| {
        !matches!(body.get(i + 1..i + 3), Some([a, b]) if a.is_ascii_hexdigit() && b.is_ascii_hexdigit())
    })
}

/// A percent-encoded name or value whose escapes are all valid. It compares (and is
/// equal) by its decoded bytes.
#[derive(Debug, Clone, Copy)]
pub struct Encoded<'a>(&'a [u8]);

impl<'a> Encoded<'a> {
    /// The text as written.
    pub fn raw(&self) -> &'a [u8] {
        self.0
    }

    /// The length of the decoded bytes.
    pub fn decoded_len(&self) -> usize {
        self.0.len() - 2 * memchr::memchr_iter(b'%', self.0).count()
    }

    /// Hands the decoded bytes to `sink` in order, in pieces: runs without escapes as
    /// slices of the text, each escape and `+` as one byte.
    pub fn decode_into(&self, mut sink: impl FnMut(&[u8])) {
        let mut rest = self.0;
        while let Some(i) = memchr::memchr2(b'%', b'+', rest) {
            if i > 0 {
                sink(&rest[..i]);
            }
            if rest[i] == b'+' {
                sink(b" ");
                rest = &rest[i + 1..];
            } else {
                sink(&[hex(rest[i + 1]) << 4 | hex(rest[i + 2])]);
                rest = &rest[i + 3..];
            }
        }
        if !rest.is_empty() {
            sink(rest);
        }
    }

    /// The decoded bytes, borrowed when there is nothing to decode.
    pub fn decode(&self) -> Cow<'a, [u8]> {
        if memchr::memchr2(b'%', b'+', self.0).is_none() {
            return Cow::Borrowed(self.0);
        }
        let mut out = Vec::with_capacity(self.decoded_len());
        self.decode_into(|piece| out.extend_from_slice(piece));
        Cow::Owned(out)
    }

    /// The decoded bytes one by one.
    pub fn bytes(&self) -> impl Iterator<Item = u8> + 'a {
        let text = self.0;
        let mut i = 0;
        std::iter::from_fn(move || {
            let b = *text.get(i)?;
            Some(match b {
                b'+' => {
                    i += 1;
                    b' '
                }
                b'%' => {
                    i += 3;
                    hex(text[i - 2]) << 4 | hex(text[i - 1])
                }
                b => {
                    i += 1;
                    b
                }
            })
        })
    }

    /// Whether the decoded bytes are `other`.
    pub fn is(&self, other: &[u8]) -> bool {
        if memchr::memchr2(b'%', b'+', self.0).is_none() {
            return self.0 == other;
        }
        self.decoded_len() == other.len() && self.bytes().eq(other.iter().copied())
    }
}

impl PartialEq for Encoded<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Encoded<'_> {}

impl PartialOrd for Encoded<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Encoded<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        let plain = |t: &[u8]| memchr::memchr2(b'%', b'+', t).is_none();
        if plain(self.0) && plain(other.0) {
            return self.0.cmp(other.0);
        }
        self.bytes().cmp(other.bytes())
    }
}

/// The value of a hex digit (the caller has checked it is one).
fn hex(digit: u8) -> u8 {
    match digit {
        b'0'..=b'9' => digit - b'0',
        b'a'..=b'f' => digit - b'a' + 10,
        _ => digit - b'A' + 10,
    }
}

fn is_ows(b: &u8) -> bool {
    matches!(b, b' ' | b'\t')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fingerprint, FingerprintBuilder};
    use proptest::prelude::*;

    fn fp_ignoring(body: &[u8], ignore: &[&str]) -> Fingerprint {
        let ignore: Vec<String> = ignore.iter().map(|s| s.to_string()).collect();
        FingerprintBuilder::new("acct", "POST", "/v1/charges").request_body(
            Some(b"application/x-www-form-urlencoded; charset=utf-8"),
            body,
            &ignore,
        )
    }

    fn fp(body: &[u8]) -> Fingerprint {
        fp_ignoring(body, &[])
    }

    fn bytes_fp(body: &[u8]) -> Fingerprint {
        FingerprintBuilder::new("acct", "POST", "/v1/charges").body(body, &[])
    }

    fn decoded(body: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs(body)
            .unwrap()
            .iter()
            .map(|p| (p.name.decode().into_owned(), p.value.decode().into_owned()))
            .collect()
    }

    fn owned(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn reads_decoded_pairs_in_name_order() {
        assert_eq!(
            decoded(b"b=2&&a=x+y%2B%2b&b=1&c&=e&d=%C3%A9&f=a=b&"),
            owned(&[
                ("", "e"),
                ("a", "x y++"),
                ("b", "2"),
                ("b", "1"),
                ("c", ""),
                ("d", "é"),
                ("f", "a=b")
            ]),
        );
        assert_eq!(decoded(b""), vec![]);
        assert_eq!(decoded(b"&&&"), vec![]);
        // Bytes, not text: no UTF-8 is required.
        assert_eq!(decoded(b"%FF=%00\xfe"), vec![(vec![0xff], vec![0, 0xfe])]);
        // Names compare decoded: `%41` is `A`, which sorts before `B`.
        assert_eq!(decoded(b"B=1&%41=2"), owned(&[("A", "2"), ("B", "1")]));
        assert!(is_form(b"application/x-www-form-urlencoded"));
        assert!(!is_form(b"application/x-www-form-urlencodedx"));
        assert!(!is_form(b"text/plain; application/x-www-form-urlencoded"));
    }

    #[test]
    fn order_of_different_names_and_spelling_do_not_count() {
        let base = fp(b"amount=100&currency=usd&description=a+b&items[0][price]=p_1");
        assert_eq!(
            base,
            fp(b"items%5B0%5D%5Bprice%5D=p_1&description=a%20b&currency=usd&amount=100")
        );
        assert_eq!(
            base,
            fp(b"&currency=%75sd&&amount=100&description=a+%62&items[0][price]=p_1&")
        );
        // `+` is a space; `%2B` is a plus.
        assert_eq!(fp(b"q=a+b"), fp(b"q=a%20b"));
        assert_ne!(fp(b"q=a+b"), fp(b"q=a%2Bb"));
        // `a` is `a=`.
        assert_eq!(fp(b"a&b=1"), fp(b"a=&b=1"));
    }

    #[test]
    fn names_values_and_repeated_order_count() {
        let base = fp(b"items[]=a&items[]=b&n=1");
        assert_ne!(base, fp(b"items[]=b&items[]=a&n=1"));
        assert_eq!(base, fp(b"items[]=a&n=1&items[]=b"));
        assert_ne!(base, fp(b"items[]=a&items[]=b&n=2"));
        assert_ne!(base, fp(b"items[]=a&items[]=b&m=1"));
        assert_ne!(base, fp(b"items[]=a&items[]=b"));
        assert_ne!(base, fp(b"items[]=a&items[]=b&n=1&n=1"));
        // Bytes do not move between a name and its value, or between pairs.
        assert_ne!(fp(b"ab=c"), fp(b"a=bc"));
        assert_ne!(fp(b"a=b&c=d"), fp(b"a=b%26c%3Dd"));
        // A form never shares a fingerprint with its bytes, or an empty form with an
        // empty body.
        assert_ne!(fp(b"a=1"), bytes_fp(b"a=1"));
        assert_ne!(fp(b""), bytes_fp(b""));
    }

    #[test]
    fn ignored_fields_do_not_count() {
        let f = |body: &[u8]| fp_ignoring(body, &["/nonce", "/meta[trace]", "/a~1b", "/x/y"]);
        assert_eq!(
            f(b"amount=1&nonce=r1&meta[trace]=t1&a/b=1"),
            f(b"amount=1&nonce=r2&nonce=r3&meta%5Btrace%5D=t2&a%2Fb=2")
        );
        assert_eq!(f(b"amount=1&nonce=r1"), fp(b"amount=1"));
        assert_ne!(f(b"amount=1"), f(b"amount=2"));
        assert_ne!(f(b"amount=1&x/y=1"), f(b"amount=1&x/y=2"));
    }

    #[test]
    fn a_malformed_form_is_hashed_as_bytes() {
        for (body, at) in [
            (&b"a=%"[..], 2),
            (b"a=%4", 2),
            (b"a=%4g&b=1", 2),
            (b"ok=%41&a%=1", 8),
            (b"%%41", 0),
            (b"a=%\xc3\xa9", 2),
        ] {
            assert_eq!(pairs(body), Err(Malformed { at }), "{body:?}");
            assert_eq!(fp(body), bytes_fp(body), "{body:?}");
        }
        // JSON sent with a form content type is read as a form: one name, no value.
        assert_eq!(decoded(br#"{"a":1}"#), owned(&[(r#"{"a":1}"#, "")]));
        assert_ne!(fp(br#"{"a":1}"#), bytes_fp(br#"{"a":1}"#));
        // Unless it cannot be one: then it is what `body` gives it, canonical JSON.
        assert_eq!(fp(br#"{"a": "100%"}"#), bytes_fp(br#"{"a":"100%"}"#));
    }

    /// Encodes a name or value: every byte escaped or not as `escape` says (a space as
    /// `+` or `%20`), hex digits upper- or lower-case.
    fn encode(text: &[u8], escape: &[bool], lower: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, &b) in text.iter().enumerate() {
            let must = !(b.is_ascii_alphanumeric() || b"-._*[]".contains(&b));
            if b == b' ' && !escape.get(i).copied().unwrap_or(false) {
                out.push(b'+');
            } else if must || escape.get(i).copied().unwrap_or(false) {
                let hex = if lower {
                    format!("%{b:02x}")
                } else {
                    format!("%{b:02X}")
                };
                out.extend_from_slice(hex.as_bytes());
            } else {
                out.push(b);
            }
        }
        out
    }

    fn form(pairs: &[(Vec<u8>, Vec<u8>)], escape: &[bool], lower: bool, empty: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, value) in pairs {
            if empty {
                out.extend_from_slice(b"&&");
            }
            out.extend_from_slice(&encode(name, escape, lower));
            out.push(b'=');
            out.extend_from_slice(&encode(value, escape, !lower));
            out.push(b'&');
        }
        out
    }

    fn text() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(
            prop_oneof![
                b'a'..=b'c',
                Just(b' '),
                Just(b'&'),
                Just(b'='),
                Just(b'%'),
                Just(b'+'),
                any::<u8>()
            ],
            0..6,
        )
    }

    fn sorted(mut pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        pairs
    }

    proptest! {
        #[test]
        fn any_spelling_reads_back_the_same_pairs(
            pairs in proptest::collection::vec((text(), text()), 0..8),
            escape in proptest::collection::vec(any::<bool>(), 6),
            lower in any::<bool>(),
        ) {
            let plain = form(&pairs, &[], false, false);
            prop_assert_eq!(decoded(&plain), sorted(pairs.clone()));
            // Reordered (different names only: a stable sort by name, descending) and
            // spelled otherwise.
            let mut reordered = pairs.clone();
            reordered.sort_by(|a, b| b.0.cmp(&a.0));
            let respelled = form(&reordered, &escape, lower, true);
            prop_assert_eq!(decoded(&respelled), sorted(pairs));
            prop_assert_eq!(fp(&plain), fp(&respelled));
        }

        #[test]
        fn any_changed_pair_changes_the_fingerprint(
            a in proptest::collection::vec((text(), text()), 0..6),
            b in proptest::collection::vec((text(), text()), 0..6),
        ) {
            prop_assume!(sorted(a.clone()) != sorted(b.clone()));
            prop_assert_ne!(fp(&form(&a, &[], false, false)), fp(&form(&b, &[], false, false)));
        }

        #[test]
        fn encoded_compares_as_decoded(a in text(), b in text(), escape in proptest::collection::vec(any::<bool>(), 6)) {
            let (ea, eb) = (encode(&a, &escape, false), encode(&b, &[], true));
            let (x, y) = (Encoded(&ea), Encoded(&eb));
            prop_assert_eq!(x.cmp(&y), a.cmp(&b));
            prop_assert_eq!(x.is(&b), a == b);
            prop_assert_eq!(x.decoded_len(), a.len());
            prop_assert_eq!(x.bytes().collect::<Vec<_>>(), a.clone());
            prop_assert_eq!(&x.decode()[..], &a[..]);
        }

        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(prop_oneof![any::<u8>(), Just(b'%'), Just(b'&'), Just(b'=')], 0..256)) {
            match pairs(&raw) {
                Ok(read) => {
                    for pair in read {
                        let _ = (pair.name.decode(), pair.value.decode());
                    }
                    prop_assert_ne!(fp(&raw), bytes_fp(&raw));
                }
                Err(_) => prop_assert_eq!(fp(&raw), bytes_fp(&raw)),
            }
        }
    }
}
