//! The audit's request key, over the one canonical form of JSON bodies.
//!
//! The canonical form is `oncely_core::canon`'s, the same bytes the gateway fingerprints:
//! object members sorted by UTF-16 code units, numbers compared as exact decimals
//! (written as ECMAScript writes them, with every significant digit), strings escaped as
//! `JSON.stringify` does.

use sha2::{Digest, Sha256};

pub(crate) use oncely_core::canon::Json;

/// What the body of a request is, for its key.
pub(crate) enum Body<'a> {
    /// A JSON body, already canonical.
    Json(&'a [u8]),
    /// Any other body, as bytes.
    Bytes(&'a [u8]),
    /// Only the body's SHA-256 is known.
    Sha256(&'a [u8; 32]),
}

/// The audit's identity of a request: SHA-256 over principal, method, path and body,
/// each length-prefixed (so no two different requests share a byte stream), the body
/// tagged by kind; the first 128 bits are kept (a collision among even a billion live
/// requests has a chance below 1e-20, and half the key halves the memory it takes).
pub(crate) fn request_key(principal: &str, method: &str, path: &str, body: Body<'_>) -> RequestKey {
    let mut h = Sha256::new();
    h.update(b"oncely/audit/v1\0");
    let field = |h: &mut Sha256, bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(&mut h, principal.as_bytes());
    field(&mut h, method.as_bytes());
    field(&mut h, path.as_bytes());
    let (tag, bytes): (&[u8], &[u8]) = match body {
        Body::Json(c) => (b"J", c),
        Body::Bytes(b) => (b"B", b),
        Body::Sha256(d) => (b"S", d),
    };
    h.update(tag);
    field(&mut h, bytes);
    let digest: [u8; 32] = h.finalize().into();
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    RequestKey(u128::from_be_bytes(first))
}

/// A request's identity (see [`request_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RequestKey(pub(crate) u128);

impl RequestKey {
    /// 32 hex digits.
    pub(crate) fn to_hex(self) -> String {
        format!("{:032x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(text: &str) -> String {
        let mut v = Json::parse(text.as_bytes()).unwrap();
        String::from_utf8(oncely_core::canon::canonical_doc(&mut v, &[])).unwrap()
    }

    #[test]
    fn the_gateways_canonical_form() {
        for text in [
            r#"{"b":[1.0,1e2],"a":"\u20ac"}"#,
            r#"{"id":9007199254740993,"amount":12345678901234567890.5}"#,
            "333333333.33333329",
        ] {
            let core = oncely_core::canonical_json(text.as_bytes(), &[]).unwrap();
            assert_eq!(canonical(text), String::from_utf8(core).unwrap());
        }
        assert_ne!(
            canonical(r#"{"id":9007199254740993}"#),
            canonical(r#"{"id":9007199254740992}"#)
        );
        assert_eq!(canonical("[1.0, 1e2]"), canonical("[1,100]"));
    }

    #[test]
    fn keys_tags_and_fields_are_kept_apart() {
        let k = |p: &str, m: &str, path: &str, b: Body<'_>| request_key(p, m, path, b);
        let base = k("p", "POST", "/x", Body::Json(b"{}"));
        assert_eq!(base, k("p", "POST", "/x", Body::Json(b"{}")));
        assert_ne!(base, k("p", "POST", "/x", Body::Bytes(b"{}")));
        assert_eq!(base.to_hex().len(), 32);
        assert_ne!(base, k("pP", "OST", "/x", Body::Json(b"{}")));
        assert_ne!(base, k("q", "POST", "/x", Body::Json(b"{}")));
        assert_ne!(
            k("p", "POST", "/x", Body::Sha256(&[0; 32])),
            k("p", "POST", "/x", Body::Bytes(&[0; 32]))
        );
    }
}
