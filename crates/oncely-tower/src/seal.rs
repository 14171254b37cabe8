//! Sealing what a queued job keeps: its headers (an `Authorization` among them), its body
//! and its query string are encrypted before they reach the store, so the ledger's
//! files (and a PostgreSQL dump) never hold them in the clear.
//!
//! The cipher is XChaCha20-Poly1305 (RustCrypto's `chacha20poly1305`), an AEAD with a
//! random 24-byte nonce per job; the associated data binds a sealed payload to its
//! task's kind, method and path, so a payload moved to another task does not open. The
//! key is 32 bytes the operator supplies (`ONCELY_SECRET_KEY`) or a key file beside a
//! SQLite ledger; it never lives in the ledger. The store sees an opaque body and no
//! headers; it needs no change.
//!
//! A sealed body is `MAGIC || nonce || ciphertext`, where the plaintext is the full
//! target (path and query), then each header as two length-prefixed strings, then the
//! body.

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

/// How a sealed task body starts.
const MAGIC: &[u8; 8] = b"oncely\x01s";
/// XChaCha20's nonce length.
const NONCE_LEN: usize = 24;

/// The 32-byte key job payloads are sealed with.
#[derive(Clone)]
pub struct JobKey(XChaCha20Poly1305);

impl std::fmt::Debug for JobKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobKey(..)")
    }
}

/// What a job keeps, in the clear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Opened {
    pub(crate) target: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl JobKey {
    /// A key from its 32 bytes.
    pub fn new(bytes: [u8; 32]) -> JobKey {
        JobKey(XChaCha20Poly1305::new(&bytes.into()))
    }

    /// Seals a job's target, headers and body; `bound` (kind, method and path) must be
    /// given again to open it.
    pub(crate) fn seal(&self, bound: &[u8], opened: &Opened) -> Vec<u8> {
        let mut plain = Vec::with_capacity(opened.body.len() + 256);
        put(&mut plain, opened.target.as_bytes());
        plain.extend_from_slice(&(opened.headers.len() as u32).to_be_bytes());
        for (n, v) in &opened.headers {
            put(&mut plain, n.as_bytes());
            put(&mut plain, v.as_bytes());
        }
        plain.extend_from_slice(&opened.body);
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let sealed = self
            .0
            .encrypt(
                &nonce,
                Payload {
                    msg: &plain,
                    aad: bound,
                },
            )
            .expect("XChaCha20-Poly1305 seals any length a job body can have");
        let mut out = Vec::with_capacity(MAGIC.len() + NONCE_LEN + sealed.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    /// Opens what [`JobKey::seal`] sealed with the same `bound`.
    pub(crate) fn open(&self, bound: &[u8], sealed: &[u8]) -> Result<Opened, String> {
        let rest = sealed
            .strip_prefix(MAGIC.as_slice())
            .ok_or("the queued job is not sealed")?;
        if rest.len() < NONCE_LEN {
            return Err("the queued job's sealed payload is truncated".into());
        }
        let (nonce, ciphertext) = rest.split_at(NONCE_LEN);
        let plain = self
            .0
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: bound,
                },
            )
            .map_err(|_| {
                "the queued job's payload does not open with this key (was ONCELY_SECRET_KEY \
                 or the key file changed?)"
                    .to_string()
            })?;
        parse(&plain).ok_or_else(|| "the queued job's sealed payload is malformed".into())
    }
}

/// Whether a task body is sealed.
pub(crate) fn is_sealed(body: &[u8]) -> bool {
    body.starts_with(MAGIC)
}

fn put(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s);
}

fn parse(mut plain: &[u8]) -> Option<Opened> {
    fn take<'a>(p: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if p.len() < n {
            return None;
        }
        let (a, b) = p.split_at(n);
        *p = b;
        Some(a)
    }
    fn len(p: &mut &[u8]) -> Option<usize> {
        Some(u32::from_be_bytes(take(p, 4)?.try_into().ok()?) as usize)
    }
    fn string(p: &mut &[u8]) -> Option<String> {
        let n = len(p)?;
        String::from_utf8(take(p, n)?.to_vec()).ok()
    }
    let target = string(&mut plain)?;
    let count = len(&mut plain)?;
    let mut headers = Vec::with_capacity(count.min(256));
    for _ in 0..count {
        headers.push((string(&mut plain)?, string(&mut plain)?));
    }
    Some(Opened {
        target,
        headers,
        body: plain.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Opened {
        Opened {
            target: "/v1/render?token=q".into(),
            headers: vec![
                ("authorization".into(), "Bearer sk_secret".into()),
                ("content-type".into(), "application/json".into()),
            ],
            body: br#"{"text":"distinctive"}"#.to_vec(),
        }
    }

    #[test]
    fn a_sealed_job_opens_with_its_key_and_binding_only() {
        let key = JobKey::new([7; 32]);
        let sealed = key.seal(b"job:render POST /v1/render", &job());
        assert!(is_sealed(&sealed));
        for needle in [&b"sk_secret"[..], b"distinctive", b"token=q"] {
            assert!(!sealed.windows(needle.len()).any(|w| w == needle));
        }
        assert_eq!(
            key.open(b"job:render POST /v1/render", &sealed).unwrap(),
            job()
        );
        assert!(key.open(b"job:other POST /v1/render", &sealed).is_err());
        assert!(JobKey::new([8; 32])
            .open(b"job:render POST /v1/render", &sealed)
            .is_err());
        let mut tampered = sealed.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(key.open(b"job:render POST /v1/render", &tampered).is_err());
        assert!(key
            .open(b"job:render POST /v1/render", &sealed[..20])
            .is_err());
    }

    #[test]
    fn two_seals_of_one_job_differ() {
        let key = JobKey::new([7; 32]);
        assert_ne!(key.seal(b"b", &job()), key.seal(b"b", &job()));
    }
}
