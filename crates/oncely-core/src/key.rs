//! Client keys, scopes and the keys oncely passes downstream.
//!
//! A client's `Idempotency-Key` names one business intention. It is only meaningful
//! inside a [`Scope`] (principal + route), so two accounts may pick the same key. The
//! upstream receives a [`DownstreamKey`] derived from scope and key: stable over every
//! attempt of one intention, different for two principals that chose the same key.

use std::fmt;

use sha2::{Digest, Sha256};

/// The longest client key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// Why a client key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The route requires a key and the request carried none.
    #[error("this route requires an Idempotency-Key header")]
    Missing,
    /// The key is empty.
    #[error("the Idempotency-Key is empty")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`].
    #[error("the Idempotency-Key is longer than 255 characters")]
    TooLong,
    /// The key has a character outside visible ASCII.
    #[error("the Idempotency-Key may hold only visible ASCII characters")]
    InvalidCharacter,
    /// A quoted (RFC 8941) key is not properly closed or escaped.
    #[error("the Idempotency-Key is a malformed quoted string")]
    MalformedQuoted,
}

/// A validated client key: 1 to 255 visible ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientKey(String);

impl ClientKey {
    /// Parses an `Idempotency-Key` header value. Both the bare form (`abc-123`) and the
    /// RFC 8941 string form (`"abc-123"`, with `\"` and `\\` escapes) are accepted; the
    /// two spellings name the same key.
    pub fn parse(raw: &[u8]) -> Result<ClientKey, KeyError> {
        let raw = trim_ows(raw);
        let value: Vec<u8> = if raw.first() == Some(&b'"') {
            unquote(raw)?
        } else {
            raw.to_vec()
        };
        if value.is_empty() {
            return Err(KeyError::Empty);
        }
        if value.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong);
        }
        if !value.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(KeyError::InvalidCharacter);
        }
        // All bytes are ASCII, so this cannot fail.
        Ok(ClientKey(
            String::from_utf8(value).map_err(|_| KeyError::InvalidCharacter)?,
        ))
    }

    /// The key's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn trim_ows(mut b: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = b {
        b = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = b {
        b = rest;
    }
    b
}

fn unquote(raw: &[u8]) -> Result<Vec<u8>, KeyError> {
    // RFC 8941 sf-string: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE
    let inner = raw
        .strip_prefix(b"\"")
        .and_then(|r| r.strip_suffix(b"\""))
        .ok_or(KeyError::MalformedQuoted)?;
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => return Err(KeyError::MalformedQuoted),
            },
            b'"' => return Err(KeyError::MalformedQuoted),
            0x20..=0x7e => out.push(b),
            _ => return Err(KeyError::InvalidCharacter),
        }
    }
    Ok(out)
}

/// The keyed hash a principal is stored as (HMAC-SHA-256 with the store's principal key,
/// lower-case hex): the one function the gateway, the CLI and the admin API hash a raw
/// principal (an `Authorization` value, a JWT claim) with, so that one account is one
/// principal everywhere and its raw value never reaches the ledger.
pub fn principal_hash(key: &[u8], raw: &[u8]) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key size");
    mac.update(raw);
    hex::encode(mac.finalize().into_bytes())
}

/// Where a key lives: the hash of the principal and the route (or MCP tool, or webhook
/// source). Lower-case hex of a SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope(String);

impl Scope {
    /// The scope of `principal` (already a keyed hash) on `route`.
    pub fn new(principal: &str, route: &str) -> Scope {
        let mut h = Sha256::new();
        h.update(b"oncely/scope/v1\0");
        h.update((principal.len() as u64).to_be_bytes());
        h.update(principal.as_bytes());
        h.update(route.as_bytes());
        Scope(hex::encode(h.finalize()))
    }

    /// Wraps a scope read back from a store.
    pub fn from_stored(hex: String) -> Scope {
        Scope(hex)
    }

    /// The scope as hex.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 16 bytes a store's unique index holds for `key` in this scope: the first half
    /// of SHA-256(`"oncely/claim/v1\0"` ‖ scope hex ‖ `"\0"` ‖ key). A quarter of the
    /// size of the scope and key as text (about 140 bytes an entry), so the one index
    /// every claim inserts into at random stays small enough to be cached at 10 M
    /// records. Finding two keys with one hash takes about 2^64 work; a store still
    /// compares scope and key on the row it finds. PostgreSQL computes the same value
    /// in SQL when it upgrades a ledger (`sha256`), so this function never changes.
    pub fn claim_hash(&self, key: &str) -> [u8; 16] {
        let mut h = Sha256::new();
        h.update(b"oncely/claim/v1\0");
        h.update(self.0.as_bytes());
        h.update(b"\0");
        h.update(key.as_bytes());
        let digest = h.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&digest[..16]);
        out
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The `Idempotency-Key` oncely sends upstream: derived from scope and key, the same on
/// every attempt of one record, different for two principals that chose the same key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DownstreamKey(String);

impl DownstreamKey {
    /// Derives the downstream key of `key` in `scope`.
    pub fn derive(scope: &Scope, key: &str) -> DownstreamKey {
        let mut h = Sha256::new();
        h.update(b"oncely/downstream/v1\0");
        h.update(scope.as_str().as_bytes());
        h.update(b"\0");
        h.update(key.as_bytes());
        let digest = h.finalize();
        DownstreamKey(format!("oncely-{}", hex::encode(&digest[..16])))
    }

    /// The key's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key in the UUID layout (RFC 9562, version 8: its 128 bits are the key's, but
    /// for the version and variant), for a server whose key argument takes a UUID.
    pub fn as_uuid(&self) -> String {
        let hex = self.0.strip_prefix("oncely-").unwrap_or(&self.0);
        let mut bytes = [0u8; 16];
        if let Ok(decoded) = hex::decode(hex) {
            let n = decoded.len().min(16);
            bytes[..n].copy_from_slice(&decoded[..n]);
        }
        bytes[6] = (bytes[6] & 0x0f) | 0x80;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        let h = hex::encode(bytes);
        format!(
            "{}-{}-{}-{}-{}",
            &h[..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..]
        )
    }
}

impl fmt::Display for DownstreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_claim_hash_is_fixed() {
        // Computed outside Rust (Python's hashlib); the PostgreSQL migration's SQL is
        // checked against the same value.
        let scope = Scope::from_stored("ab".repeat(32));
        assert_eq!(
            hex::encode(scope.claim_hash("order-1")),
            "eb89224ab9eac58caae1ecf12e6ca5f9"
        );
        assert_ne!(scope.claim_hash("order-1"), scope.claim_hash("order-2"));
    }

    #[test]
    fn accepts_bare_and_quoted_forms_as_one_key() {
        assert_eq!(ClientKey::parse(b"order-42").unwrap().as_str(), "order-42");
        assert_eq!(
            ClientKey::parse(b"\"order-42\"").unwrap().as_str(),
            "order-42"
        );
        assert_eq!(
            ClientKey::parse(b"  order-42 ").unwrap().as_str(),
            "order-42"
        );
        assert_eq!(
            ClientKey::parse(br#""a\"b\\c""#).unwrap().as_str(),
            r#"a"b\c"#
        );
        let longest = "k".repeat(255);
        assert_eq!(
            ClientKey::parse(longest.as_bytes()).unwrap().as_str(),
            longest
        );
    }

    #[test]
    fn refuses_what_the_contract_refuses() {
        assert_eq!(ClientKey::parse(b""), Err(KeyError::Empty));
        assert_eq!(ClientKey::parse(b"   "), Err(KeyError::Empty));
        assert_eq!(ClientKey::parse(b"\"\""), Err(KeyError::Empty));
        assert_eq!(
            ClientKey::parse("k".repeat(256).as_bytes()),
            Err(KeyError::TooLong)
        );
        assert_eq!(
            ClientKey::parse("ключ".as_bytes()),
            Err(KeyError::InvalidCharacter)
        );
        assert_eq!(ClientKey::parse(b"a b"), Err(KeyError::InvalidCharacter));
        assert_eq!(ClientKey::parse(b"a\x7f"), Err(KeyError::InvalidCharacter));
        assert_eq!(ClientKey::parse(b"\"open"), Err(KeyError::MalformedQuoted));
        assert_eq!(
            ClientKey::parse(br#""bad\escape""#),
            Err(KeyError::MalformedQuoted)
        );
        assert_eq!(
            ClientKey::parse(br#""in"side""#),
            Err(KeyError::MalformedQuoted)
        );
    }

    #[test]
    fn scopes_separate_principals_and_routes() {
        let a = Scope::new("alice", "POST /v1/render");
        let b = Scope::new("bob", "POST /v1/render");
        let c = Scope::new("alice", "POST /v1/orders");
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, Scope::new("alice", "POST /v1/render"));
        // Length-prefixing keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(Scope::new("ab", "c"), Scope::new("a", "bc"));
    }

    #[test]
    fn a_downstream_key_in_the_uuid_layout_is_version_8() {
        let k = DownstreamKey::derive(&Scope::new("p", "POST /x"), "k");
        let u = k.as_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(u.as_bytes()[14], b'8', "{u}");
        assert!(matches!(u.as_bytes()[19], b'8' | b'9' | b'a' | b'b'), "{u}");
        assert_eq!(u, k.as_uuid());
        let other = DownstreamKey::derive(&Scope::new("q", "POST /x"), "k");
        assert_ne!(u, other.as_uuid());
    }

    #[test]
    fn downstream_keys_are_stable_and_scoped() {
        let a = Scope::new("alice", "r");
        let b = Scope::new("bob", "r");
        let k1 = DownstreamKey::derive(&a, "same");
        assert_eq!(k1, DownstreamKey::derive(&a, "same"));
        assert_ne!(k1, DownstreamKey::derive(&b, "same"));
        assert_ne!(k1, DownstreamKey::derive(&a, "other"));
        assert!(
            ClientKey::parse(k1.as_str().as_bytes()).is_ok(),
            "a valid key itself"
        );
    }

    proptest! {
        #[test]
        fn every_visible_ascii_key_round_trips(key in "[!#-~][!-~]{0,254}") {
            let parsed = ClientKey::parse(key.as_bytes()).unwrap();
            prop_assert_eq!(parsed.as_str(), key.as_str());
        }

        #[test]
        fn quoting_never_changes_the_key(key in "[!-~]{1,200}") {
            let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
            let parsed = ClientKey::parse(quoted.as_bytes()).unwrap();
            prop_assert_eq!(parsed.as_str(), key.as_str());
        }

        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = ClientKey::parse(&raw);
        }
    }
}
