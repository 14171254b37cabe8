//! Who a call acts for.
//!
//! A principal is stored only as the gateway's keyed hash
//! ([`oncely_tower::Guard::principal_hash`], the same on HTTP routes and every instance). With `jwt:CLAIM` the principal is a claim of
//! a bearer token whose signature and expiry verify, so that a refreshed OAuth token (a
//! new string) is still the same account; a token that does not verify is never trusted
//! for a replay.
//!
//! Tokens are verified with one shared HS256 secret (`jwt_secret_env`) or with the keys of a
//! JWKS document (`jwks_file`): `oct` keys verify `HS256`, `RSA` keys verify `RS256`
//! (RSASSA-PKCS1-v1_5 with SHA-256, 2048 to 8192 bits) and `EC` keys on `P-256` verify
//! `ES256`. The token header's `alg` must match the key's type, so an RSA public key is
//! never used as an HMAC secret (the algorithm-confusion attack); `none` and every other
//! algorithm are refused.
//!
//! Signatures and the `aud`/`iss` checks are `jsonwebtoken`'s (on ring, through
//! `crate::ring_jws`); the times are
//! checked here against the caller's clock: `exp` is required unless
//! [`JwtVerifier::require_exp`] is turned off, and an `exp` or `nbf` that is not a number
//! refuses the token (a library that reads it as absent would accept it forever).
//! `aud` and `iss`, when configured (`jwt_audience`, `jwt_issuer`), must be present and
//! match.

use std::collections::HashSet;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use sha2::Sha256;

use crate::McpError;

type HmacSha256 = Hmac<Sha256>;

/// What a key verifies with; each kind verifies exactly one `alg`.
#[derive(Clone)]
enum KeyMaterial {
    /// An HS256 secret.
    Hmac(Vec<u8>),
    /// An RS256 public key: big-endian modulus and exponent, without leading zeros.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// An ES256 public key: the uncompressed point `0x04 || x || y` (65 bytes).
    EcP256(Vec<u8>),
}

impl KeyMaterial {
    /// The one JWS `alg` this key verifies.
    fn alg(&self) -> &'static str {
        match self {
            KeyMaterial::Hmac(_) => "HS256",
            KeyMaterial::Rsa { .. } => "RS256",
            KeyMaterial::EcP256(_) => "ES256",
        }
    }

    /// The `jsonwebtoken` key that verifies with this material.
    fn decoding(&self) -> DecodingKey {
        match self {
            KeyMaterial::Hmac(secret) => DecodingKey::from_secret(secret),
            KeyMaterial::Rsa { n, e } => DecodingKey::from_rsa_raw_components(n, e),
            KeyMaterial::EcP256(point) => DecodingKey::from_ec_der(point),
        }
    }

    fn algorithm(&self) -> Algorithm {
        match self {
            KeyMaterial::Hmac(_) => Algorithm::HS256,
            KeyMaterial::Rsa { .. } => Algorithm::RS256,
            KeyMaterial::EcP256(_) => Algorithm::ES256,
        }
    }
}

/// One key a token may be signed with.
#[derive(Clone)]
struct Key {
    kid: Option<String>,
    material: KeyMaterial,
    decoding: DecodingKey,
}

impl Key {
    fn new(kid: Option<String>, material: KeyMaterial) -> Key {
        Key {
            kid,
            decoding: material.decoding(),
            material,
        }
    }
}

/// Verifies HS256, RS256 and ES256 bearer tokens and reads one claim.
#[derive(Clone)]
pub struct JwtVerifier {
    claim: String,
    keys: Vec<Key>,
    audience: Option<String>,
    issuer: Option<String>,
    require_exp: bool,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "JwtVerifier(jwt:{}, {} keys)",
            self.claim,
            self.keys.len()
        )
    }
}

/// Why a token is not trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// Not three base64url parts of JSON.
    #[error("malformed token")]
    Malformed,
    /// An algorithm other than HS256, RS256 and ES256 (`none` included).
    #[error("unsupported algorithm {0:?}")]
    Algorithm(String),
    /// The header's `kid` names no key of the JWKS that verifies its `alg`.
    #[error("no key with kid {0:?} for this algorithm")]
    UnknownKey(String),
    /// No key verifies the signature.
    #[error("bad signature")]
    Signature,
    /// Past `exp`, or before `nbf`.
    #[error("token expired or not yet valid")]
    Expired,
    /// The claim is missing or not a string.
    #[error("claim {0:?} missing")]
    Claim(String),
    /// A claim the verifier requires (`exp`, or `aud`/`iss` when configured) is absent.
    #[error("required claim {0:?} missing")]
    MissingClaim(String),
    /// `exp` or `nbf` is not a number.
    #[error("claim {0:?} is not a number")]
    NotNumeric(String),
    /// `aud` names no configured audience.
    #[error("wrong audience")]
    Audience,
    /// `iss` is not the configured issuer.
    #[error("wrong issuer")]
    Issuer,
}

/// Decodes the base64url member `name` of a JWK (padding tolerated).
fn jwk_bytes(k: &Value, kty: &str, name: &str) -> Result<Vec<u8>, McpError> {
    let s = k
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| McpError::Config(format!("jwks_file: an {kty} key lacks {name}")))?;
    URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .map_err(|_| McpError::Config(format!("jwks_file: {kty} key {name} is not base64url")))
}

/// Big-endian integer bytes without leading zeros (ring wants minimal encodings).
fn strip_leading_zeros(mut b: Vec<u8>) -> Vec<u8> {
    let zeros = b.iter().take_while(|&&x| x == 0).count();
    b.drain(..zeros);
    b
}

/// Reads one JWK; `Ok(None)` for an encryption key (`"use": "enc"`), which never signs.
fn parse_jwk(k: &Value) -> Result<Option<Key>, McpError> {
    if k.get("use").and_then(Value::as_str) == Some("enc") {
        return Ok(None);
    }
    let kty = k.get("kty").and_then(Value::as_str);
    let material = match kty {
        Some("oct") => {
            let secret = jwk_bytes(k, "oct", "k")?;
            if secret.is_empty() {
                return Err(McpError::Config("jwks_file: an oct key has an empty k".into()));
            }
            KeyMaterial::Hmac(secret)
        }
        Some("RSA") => {
            let n = strip_leading_zeros(jwk_bytes(k, "RSA", "n")?);
            let e = strip_leading_zeros(jwk_bytes(k, "RSA", "e")?);
            if n.len() * 8 < 2048 || n.len() * 8 > 8192 || e.is_empty() {
                return Err(McpError::Config(format!(
                    "jwks_file: an RSA key must have a 2048 to 8192 bit modulus (this one has {} bytes) and an exponent",
                    n.len()
                )));
            }
            KeyMaterial::Rsa { n, e }
        }
        Some("EC") => {
            let crv = k.get("crv").and_then(Value::as_str);
            if crv != Some("P-256") {
                return Err(McpError::Config(format!(
                    "jwks_file: EC curve {crv:?} is not supported (only \"P-256\" for ES256)"
                )));
            }
            let x = jwk_bytes(k, "EC", "x")?;
            let y = jwk_bytes(k, "EC", "y")?;
            if x.len() != 32 || y.len() != 32 {
                return Err(McpError::Config(
                    "jwks_file: a P-256 key needs 32-byte x and y".into(),
                ));
            }
            let mut point = Vec::with_capacity(65);
            point.push(0x04);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            KeyMaterial::EcP256(point)
        }
        other => {
            return Err(McpError::Config(format!(
                "jwks_file: key type {other:?} is not supported (\"oct\" for HS256, \"RSA\" for RS256, \"EC\" P-256 for ES256)"
            )))
        }
    };
    if let Some(alg) = k.get("alg").and_then(Value::as_str) {
        if alg != material.alg() {
            return Err(McpError::Config(format!(
                "jwks_file: a {} key with alg {alg:?} is not supported (it verifies {} only)",
                kty.unwrap_or_default(),
                material.alg()
            )));
        }
    }
    Ok(Some(Key::new(
        k.get("kid").and_then(Value::as_str).map(str::to_string),
        material,
    )))
}

impl JwtVerifier {
    /// Verifies with one shared HS256 secret (`jwt_secret_env`).
    pub fn hs256(claim: &str, secret: &[u8]) -> Result<JwtVerifier, McpError> {
        if secret.is_empty() {
            return Err(McpError::Config("jwt secret is empty".into()));
        }
        Ok(JwtVerifier::with_keys(
            claim,
            vec![Key::new(None, KeyMaterial::Hmac(secret.to_vec()))],
        ))
    }

    /// Verifies with the keys of a JWKS document (`jwks_file`), `{"keys": [...]}` with
    /// members base64url-encoded: `{"kty": "oct", "k"}` (HS256), `{"kty": "RSA", "n", "e"}`
    /// (RS256) and `{"kty": "EC", "crv": "P-256", "x", "y"}` (ES256), each with an optional
    /// `kid` and `alg` (which must be the one the key type verifies). Encryption keys
    /// (`"use": "enc"`) are skipped; any other key type, curve or algorithm is refused with
    /// a clear error.
    pub fn from_jwks(claim: &str, jwks: &str) -> Result<JwtVerifier, McpError> {
        let doc: Value = serde_json::from_str(jwks)
            .map_err(|e| McpError::Config(format!("jwks_file: not JSON: {e}")))?;
        let mut keys = Vec::new();
        for k in doc
            .get("keys")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            keys.extend(parse_jwk(k)?);
        }
        if keys.is_empty() {
            return Err(McpError::Config("jwks_file: no signing keys".into()));
        }
        Ok(JwtVerifier::with_keys(claim, keys))
    }

    fn with_keys(claim: &str, keys: Vec<Key>) -> JwtVerifier {
        crate::ring_jws::install();
        JwtVerifier {
            claim: claim.to_string(),
            keys,
            audience: None,
            issuer: None,
            require_exp: true,
        }
    }

    /// Accepts only tokens whose `aud` is (or contains) `audience` (`jwt_audience`).
    pub fn with_audience(mut self, audience: impl Into<String>) -> JwtVerifier {
        self.audience = Some(audience.into());
        self
    }

    /// Accepts only tokens whose `iss` is `issuer` (`jwt_issuer`).
    pub fn with_issuer(mut self, issuer: impl Into<String>) -> JwtVerifier {
        self.issuer = Some(issuer.into());
        self
    }

    /// Whether a token without `exp` is refused (the default; `jwt_require_exp = false`
    /// accepts tokens that never expire).
    pub fn require_exp(mut self, required: bool) -> JwtVerifier {
        self.require_exp = required;
        self
    }

    /// The claim's name (`sub`).
    pub fn claim(&self) -> &str {
        &self.claim
    }

    /// Verifies `token` at `now_secs` (Unix seconds) and returns the claim's value.
    ///
    /// Only keys of the type the header's `alg` names are tried. When the header has a
    /// `kid`, the keys with that `kid` are tried (keys without a `kid` only if none has it);
    /// without one, every key of the type is tried.
    pub fn verify(&self, token: &str, now_secs: i64) -> Result<String, TokenError> {
        let mut parts = token.split('.');
        let (Some(h), Some(_), Some(_), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let decode = |x: &str| URL_SAFE_NO_PAD.decode(x).map_err(|_| TokenError::Malformed);
        let header: Value =
            serde_json::from_slice(&decode(h)?).map_err(|_| TokenError::Malformed)?;
        let alg = header.get("alg").and_then(Value::as_str).unwrap_or("");
        if !matches!(alg, "HS256" | "RS256" | "ES256") {
            return Err(TokenError::Algorithm(alg.to_string()));
        }
        let typed = || self.keys.iter().filter(|k| k.material.alg() == alg);
        let candidates: Vec<&Key> = match header.get("kid").and_then(Value::as_str) {
            None => typed().collect(),
            Some(kid) => {
                let named: Vec<&Key> = typed().filter(|k| k.kid.as_deref() == Some(kid)).collect();
                if named.is_empty() {
                    typed().filter(|k| k.kid.is_none()).collect()
                } else {
                    named
                }
            }
        };
        if candidates.is_empty() {
            return Err(match header.get("kid").and_then(Value::as_str) {
                Some(kid) => TokenError::UnknownKey(kid.to_string()),
                None => TokenError::Signature,
            });
        }
        let validation = self.validation(candidates[0].material.algorithm());
        for key in candidates {
            match jsonwebtoken::decode::<Value>(token, &key.decoding, &validation) {
                Ok(data) => return self.read_claims(&data.claims, now_secs),
                Err(e) => match e.kind() {
                    // Not this key's signature: try the next one.
                    ErrorKind::InvalidSignature
                    | ErrorKind::InvalidEcdsaKey
                    | ErrorKind::InvalidRsaKey(_)
                    | ErrorKind::InvalidKeyFormat => continue,
                    ErrorKind::InvalidAudience => return Err(TokenError::Audience),
                    ErrorKind::InvalidIssuer => return Err(TokenError::Issuer),
                    ErrorKind::MissingRequiredClaim(c) => {
                        return Err(TokenError::MissingClaim(c.clone()))
                    }
                    ErrorKind::InvalidClaimFormat(c) => {
                        return Err(TokenError::NotNumeric(c.clone()))
                    }
                    _ => return Err(TokenError::Malformed),
                },
            }
        }
        Err(TokenError::Signature)
    }

    /// `jsonwebtoken`'s checks: the signature with `alg`, and `aud`/`iss` when configured
    /// (then required). Times are checked by [`JwtVerifier::read_claims`] against the
    /// caller's clock.
    fn validation(&self, alg: Algorithm) -> Validation {
        let mut v = Validation::new(alg);
        v.leeway = 0;
        v.validate_exp = false;
        v.validate_nbf = false;
        v.required_spec_claims = HashSet::new();
        v.validate_aud = self.audience.is_some();
        if let Some(aud) = &self.audience {
            v.set_audience(&[aud]);
            v.required_spec_claims.insert("aud".into());
        }
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
            v.required_spec_claims.insert("iss".into());
        }
        v
    }

    /// Checks `exp` and `nbf` at `now_secs` and reads the principal's claim.
    fn read_claims(&self, payload: &Value, now_secs: i64) -> Result<String, TokenError> {
        let time = |name: &str| match payload.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_f64()
                .map(Some)
                .ok_or_else(|| TokenError::NotNumeric(name.into())),
            Some(_) => Err(TokenError::NotNumeric(name.into())),
        };
        let now = now_secs as f64;
        match time("exp")? {
            Some(exp) if now >= exp => return Err(TokenError::Expired),
            None if self.require_exp => return Err(TokenError::MissingClaim("exp".into())),
            _ => {}
        }
        if matches!(time("nbf")?, Some(nbf) if now < nbf) {
            return Err(TokenError::Expired);
        }
        match payload.get(&self.claim) {
            Some(Value::String(v)) if !v.is_empty() => Ok(v.clone()),
            Some(Value::Number(n)) => Ok(n.to_string()),
            _ => Err(TokenError::Claim(self.claim.clone())),
        }
    }
}

/// A `jwt:CLAIM` principal: the claim of a bearer token that verifies now. A missing or
/// unverifiable token names no account: its call is forwarded unguarded.
impl oncely_tower::MakePrincipal for JwtVerifier {
    fn make_principal<'a>(
        &self,
        head: &oncely_tower::RequestHead<'a>,
    ) -> Option<std::borrow::Cow<'a, [u8]>> {
        let token = head.headers.get("authorization")?.to_str().ok()?;
        let token = token
            .strip_prefix("Bearer ")
            .or_else(|| token.strip_prefix("bearer "))?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        match self.verify(token.trim(), now) {
            Ok(claim) => Some(std::borrow::Cow::Owned(claim.into_bytes())),
            Err(e) => {
                tracing::info!(claim = %self.claim, reason = %e,
                    "unverifiable token: tools/call forwarded unguarded");
                None
            }
        }
    }
}

/// Signs an HS256 token (tests and examples).
pub fn sign_hs256(claims: &Value, secret: &[u8]) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let mut mac = HmacSha256::new_from_slice(secret).expect("hmac takes any key");
    mac.update(format!("{header}.{payload}").as_bytes());
    let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{header}.{payload}.{sig}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_refreshed_token_is_the_same_account() {
        let v = JwtVerifier::hs256("sub", b"s3cret").unwrap();
        let a = sign_hs256(&json!({"sub": "acct_1", "exp": 2000, "iat": 1}), b"s3cret");
        let b = sign_hs256(&json!({"sub": "acct_1", "exp": 3000, "iat": 2}), b"s3cret");
        assert_ne!(a, b);
        assert_eq!(v.verify(&a, 1000).unwrap(), "acct_1");
        assert_eq!(v.verify(&b, 1000).unwrap(), "acct_1");
    }

    #[test]
    fn unverifiable_tokens_are_refused() {
        let v = JwtVerifier::hs256("sub", b"s3cret").unwrap();
        let forged = sign_hs256(&json!({"sub": "acct_1"}), b"other");
        assert_eq!(v.verify(&forged, 0), Err(TokenError::Signature));
        let expired = sign_hs256(&json!({"sub": "acct_1", "exp": 10}), b"s3cret");
        assert_eq!(v.verify(&expired, 10), Err(TokenError::Expired));
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(br#"{"sub":"acct_1"}"#)
        );
        assert_eq!(
            v.verify(&none, 0),
            Err(TokenError::Algorithm("none".into()))
        );
        assert_eq!(v.verify("abc", 0), Err(TokenError::Malformed));
        let nosub = sign_hs256(&json!({"aud": "x", "exp": 10}), b"s3cret");
        assert_eq!(v.verify(&nosub, 0), Err(TokenError::Claim("sub".into())));
    }

    #[test]
    fn jwks_oct_keys_verify_and_unknown_key_types_are_refused_clearly() {
        let k = URL_SAFE_NO_PAD.encode(b"jwks-secret");
        let v =
            JwtVerifier::from_jwks("sub", &format!(r#"{{"keys":[{{"kty":"oct","k":"{k}"}}]}}"#))
                .unwrap();
        let t = sign_hs256(&json!({"sub": "u", "exp": 10}), b"jwks-secret");
        assert_eq!(v.verify(&t, 0).unwrap(), "u");
        let err = JwtVerifier::from_jwks("sub", r#"{"keys":[{"kty":"OKP","crv":"Ed25519"}]}"#)
            .unwrap_err();
        assert!(err.to_string().contains("not supported"), "{err}");
        let err =
            JwtVerifier::from_jwks("sub", r#"{"keys":[{"kty":"EC","crv":"P-384"}]}"#).unwrap_err();
        assert!(err.to_string().contains("P-384"), "{err}");
        let err = JwtVerifier::from_jwks(
            "sub",
            &format!(r#"{{"keys":[{{"kty":"oct","k":"{k}","alg":"RS256"}}]}}"#),
        )
        .unwrap_err();
        assert!(err.to_string().contains("RS256"), "{err}");
        // An encryption key is skipped, not used to verify.
        let err = JwtVerifier::from_jwks(
            "sub",
            &format!(r#"{{"keys":[{{"kty":"oct","k":"{k}","use":"enc"}}]}}"#),
        )
        .unwrap_err();
        assert!(err.to_string().contains("no signing keys"), "{err}");
    }

    #[test]
    fn exp_is_required_unless_told_and_times_must_be_numbers() {
        let v = JwtVerifier::hs256("sub", b"s3cret").unwrap();
        let forever = sign_hs256(&json!({"sub": "u"}), b"s3cret");
        assert_eq!(
            v.verify(&forever, 0),
            Err(TokenError::MissingClaim("exp".into()))
        );
        let lax = v.clone().require_exp(false);
        assert_eq!(lax.verify(&forever, 0).unwrap(), "u");
        for claims in [
            json!({"sub": "u", "exp": "99999999999"}),
            json!({"sub": "u", "exp": null}),
            json!({"sub": "u", "exp": 99999, "nbf": "0"}),
            json!({"sub": "u", "exp": 99999, "nbf": [1]}),
        ] {
            // Refused: as not a number, or (an array the library cannot skip) malformed.
            let t = sign_hs256(&claims, b"s3cret");
            for verifier in [&v, &lax] {
                assert!(
                    matches!(
                        verifier.verify(&t, 0),
                        Err(TokenError::NotNumeric(_) | TokenError::Malformed)
                    ),
                    "{claims}"
                );
            }
        }
        // A fractional NumericDate is a number.
        let frac = sign_hs256(&json!({"sub": "u", "exp": 100.5}), b"s3cret");
        assert_eq!(v.verify(&frac, 100).unwrap(), "u");
        assert_eq!(v.verify(&frac, 101), Err(TokenError::Expired));
    }

    #[test]
    fn audience_and_issuer_are_checked_when_configured() {
        let v = JwtVerifier::hs256("sub", b"s3cret")
            .unwrap()
            .with_audience("https://api.example")
            .with_issuer("https://issuer.example");
        let t = |claims: Value| sign_hs256(&claims, b"s3cret");
        let good = json!({"sub": "u", "exp": 10, "aud": "https://api.example", "iss": "https://issuer.example"});
        assert_eq!(v.verify(&t(good.clone()), 0).unwrap(), "u");
        let mut many = good.clone();
        many["aud"] = json!(["other", "https://api.example"]);
        assert_eq!(v.verify(&t(many), 0).unwrap(), "u");
        let mut wrong_aud = good.clone();
        wrong_aud["aud"] = json!("https://other.example");
        assert_eq!(v.verify(&t(wrong_aud), 0), Err(TokenError::Audience));
        let mut wrong_iss = good.clone();
        wrong_iss["iss"] = json!("https://evil.example");
        assert_eq!(v.verify(&t(wrong_iss), 0), Err(TokenError::Issuer));
        let mut no_aud = good.clone();
        no_aud.as_object_mut().unwrap().remove("aud");
        assert_eq!(
            v.verify(&t(no_aud), 0),
            Err(TokenError::MissingClaim("aud".into()))
        );
        let mut no_iss = good.clone();
        no_iss.as_object_mut().unwrap().remove("iss");
        assert_eq!(
            v.verify(&t(no_iss), 0),
            Err(TokenError::MissingClaim("iss".into()))
        );
        // Unconfigured, aud and iss are not checked.
        let plain = JwtVerifier::hs256("sub", b"s3cret").unwrap();
        let mut any = good;
        any["aud"] = json!("https://other.example");
        assert_eq!(plain.verify(&t(any), 0).unwrap(), "u");
    }

    use ring::rand::SystemRandom;
    use ring::signature::{
        EcdsaKeyPair, KeyPair as _, RsaKeyPair, RsaPublicKeyComponents,
        ECDSA_P256_SHA256_FIXED_SIGNING, RSA_PKCS1_SHA256,
    };

    /// `header.payload` in base64url.
    fn signing_input(header: &Value, claims: &Value) -> String {
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        )
    }

    /// A fresh P-256 key and its public JWK.
    fn ec_key(kid: &str) -> (EcdsaKeyPair, Value) {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let point = pair.public_key().as_ref();
        assert_eq!((point.len(), point[0]), (65, 0x04));
        let jwk = json!({
            "kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..]),
        });
        (pair, jwk)
    }

    fn sign_es256(pair: &EcdsaKeyPair, kid: Option<&str>, claims: &Value) -> String {
        let mut header = json!({"alg": "ES256", "typ": "JWT"});
        if let Some(kid) = kid {
            header["kid"] = json!(kid);
        }
        let input = signing_input(&header, claims);
        let sig = pair.sign(&SystemRandom::new(), input.as_bytes()).unwrap();
        assert_eq!(sig.as_ref().len(), 64, "JWS ES256 is r||s");
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }

    #[test]
    fn es256_tokens_verify_with_an_ec_p256_jwk() {
        let (pair, jwk) = ec_key("ec-1");
        let (other, _) = ec_key("ec-1");
        let v = JwtVerifier::from_jwks("sub", &json!({ "keys": [jwk] }).to_string()).unwrap();
        let claims = json!({"sub": "acct_ec", "exp": 2000});
        let token = sign_es256(&pair, Some("ec-1"), &claims);
        assert_eq!(v.verify(&token, 1000).unwrap(), "acct_ec");
        // No kid: every EC key is tried.
        let bare = sign_es256(&pair, None, &claims);
        assert_eq!(v.verify(&bare, 1000).unwrap(), "acct_ec");
        // A tampered payload keeps the old signature, which no longer matches.
        let parts: Vec<&str> = token.split('.').collect();
        let forged_payload =
            URL_SAFE_NO_PAD.encode(json!({"sub": "admin", "exp": 2000}).to_string());
        let tampered = format!("{}.{forged_payload}.{}", parts[0], parts[2]);
        assert_eq!(v.verify(&tampered, 1000), Err(TokenError::Signature));
        // Signed by another P-256 key under the same kid.
        let wrong = sign_es256(&other, Some("ec-1"), &claims);
        assert_eq!(v.verify(&wrong, 1000), Err(TokenError::Signature));
        assert_eq!(v.verify(&token, 2000), Err(TokenError::Expired));
        let early = sign_es256(
            &pair,
            Some("ec-1"),
            &json!({"sub": "acct_ec", "nbf": 500, "exp": 2000}),
        );
        assert_eq!(v.verify(&early, 499), Err(TokenError::Expired));
        // An HS256 token is never checked against the EC key.
        let hs = sign_hs256(&claims, &URL_SAFE_NO_PAD.decode(jwk_x(&v)).unwrap());
        assert_eq!(v.verify(&hs, 1000), Err(TokenError::Signature));
    }

    /// The x coordinate of the verifier's only EC key, base64url (for the confusion check).
    fn jwk_x(v: &JwtVerifier) -> String {
        match &v.keys[0].material {
            KeyMaterial::EcP256(point) => URL_SAFE_NO_PAD.encode(&point[1..33]),
            _ => panic!("not an EC key"),
        }
    }

    /// A fresh 2048-bit RSA key made by `openssl` (ring cannot generate RSA keys).
    fn rsa_key() -> RsaKeyPair {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rsa.der");
        let out = std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
            ])
            .args(["-outform", "DER", "-out"])
            .arg(&path)
            .output()
            .unwrap_or_else(|e| {
                panic!("the RS256 tests need the openssl command to make an RSA key: {e}")
            });
        assert!(
            out.status.success(),
            "openssl genpkey failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // OpenSSL 3 writes a DER key as PKCS#1 RSAPrivateKey (ring's `from_der`), not PKCS#8.
        RsaKeyPair::from_der(&std::fs::read(&path).unwrap()).unwrap()
    }

    fn sign_rs256(pair: &RsaKeyPair, kid: Option<&str>, claims: &Value) -> String {
        let mut header = json!({"alg": "RS256", "typ": "JWT"});
        if let Some(kid) = kid {
            header["kid"] = json!(kid);
        }
        let input = signing_input(&header, claims);
        let mut sig = vec![0; pair.public().modulus_len()];
        pair.sign(
            &RSA_PKCS1_SHA256,
            &SystemRandom::new(),
            input.as_bytes(),
            &mut sig,
        )
        .unwrap();
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(&sig))
    }

    #[test]
    fn rs256_tokens_verify_with_an_rsa_jwk_and_alg_confusion_is_refused() {
        let pair = rsa_key();
        let public = RsaPublicKeyComponents::<Vec<u8>>::from(pair.public());
        let jwks = json!({"keys": [{
            "kty": "RSA", "alg": "RS256", "use": "sig", "kid": "rsa-1",
            "n": URL_SAFE_NO_PAD.encode(&public.n),
            "e": URL_SAFE_NO_PAD.encode(&public.e),
        }]});
        let v = JwtVerifier::from_jwks("sub", &jwks.to_string()).unwrap();
        let claims = json!({"sub": "acct_rsa", "exp": 2000});
        let token = sign_rs256(&pair, Some("rsa-1"), &claims);
        assert_eq!(v.verify(&token, 1000).unwrap(), "acct_rsa");
        assert_eq!(
            v.verify(&sign_rs256(&pair, None, &claims), 1000).unwrap(),
            "acct_rsa"
        );
        assert_eq!(v.verify(&token, 2001), Err(TokenError::Expired));
        // The classic attack: HS256 with the public key's bytes as the HMAC secret.
        let confused = sign_hs256(&claims, &public.n);
        assert_eq!(v.verify(&confused, 1000), Err(TokenError::Signature));
        let confused_jwks = sign_hs256(&claims, jwks.to_string().as_bytes());
        assert_eq!(v.verify(&confused_jwks, 1000), Err(TokenError::Signature));
        // A kid that names no key.
        let unknown = sign_rs256(&pair, Some("rsa-2"), &claims);
        assert_eq!(
            v.verify(&unknown, 1000),
            Err(TokenError::UnknownKey("rsa-2".into()))
        );
        // Tampered payload.
        let parts: Vec<&str> = token.split('.').collect();
        let forged = URL_SAFE_NO_PAD.encode(json!({"sub": "admin", "exp": 2000}).to_string());
        let tampered = format!("{}.{forged}.{}", parts[0], parts[2]);
        assert_eq!(v.verify(&tampered, 1000), Err(TokenError::Signature));
        // An RS256 header over an ES256 key set, and RS384, are refused.
        let (_, ec) = ec_key("rsa-1");
        let ec_only = JwtVerifier::from_jwks("sub", &json!({ "keys": [ec] }).to_string()).unwrap();
        assert_eq!(
            ec_only.verify(&token, 1000),
            Err(TokenError::UnknownKey("rsa-1".into()))
        );
        let rs384 = format!(
            "{}.{}.{}",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"RS384"}"#),
            parts[1],
            parts[2]
        );
        assert_eq!(
            v.verify(&rs384, 1000),
            Err(TokenError::Algorithm("RS384".into()))
        );
        // A modulus too short for RS256 is refused when the JWKS is read.
        let err =
            JwtVerifier::from_jwks("sub", r#"{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}"#)
                .unwrap_err();
        assert!(err.to_string().contains("2048"), "{err}");
    }
}
