//! Who a call acts for.
//!
//! A principal is stored only as the gateway's keyed hash
//! ([`oncely_tower::Guard::principal_hash`], the same on HTTP routes and every instance). With `jwt:CLAIM` the principal is a claim of
//! a bearer token whose signature and expiry verify, so that a refreshed OAuth token (a
//! new string) is still the same account; a token that does not verify is never trusted
//! for a replay.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

use crate::McpError;

type HmacSha256 = Hmac<Sha256>;

/// One key a token may be signed with.
#[derive(Clone)]
struct HsKey {
    kid: Option<String>,
    secret: Vec<u8>,
}

/// Verifies HS256 bearer tokens and reads one claim.
#[derive(Clone)]
pub struct JwtVerifier {
    claim: String,
    keys: Vec<HsKey>,
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
    /// An algorithm other than HS256 (`none` included).
    #[error("unsupported algorithm {0:?}")]
    Algorithm(String),
    /// No key verifies the signature.
    #[error("bad signature")]
    Signature,
    /// Past `exp`, or before `nbf`.
    #[error("token expired or not yet valid")]
    Expired,
    /// The claim is missing or not a string.
    #[error("claim {0:?} missing")]
    Claim(String),
}

impl JwtVerifier {
    /// Verifies with one shared HS256 secret (`jwt_secret_env`).
    pub fn hs256(claim: &str, secret: &[u8]) -> Result<JwtVerifier, McpError> {
        if secret.is_empty() {
            return Err(McpError::Config("jwt secret is empty".into()));
        }
        Ok(JwtVerifier {
            claim: claim.to_string(),
            keys: vec![HsKey {
                kid: None,
                secret: secret.to_vec(),
            }],
        })
    }

    /// Verifies with the symmetric keys of a JWKS document (`jwks_file`): `{"keys": [{"kty":
    /// "oct", "k": BASE64URL, "kid": ...}]}`. Asymmetric keys (RSA, EC) are refused with a
    /// clear error: they are not supported yet.
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
            match k.get("kty").and_then(Value::as_str) {
                Some("oct") => {
                    let secret = k
                        .get("k")
                        .and_then(Value::as_str)
                        .and_then(|s| URL_SAFE_NO_PAD.decode(s.trim_end_matches('=')).ok())
                        .ok_or_else(|| McpError::Config("jwks_file: an oct key lacks k".into()))?;
                    keys.push(HsKey {
                        kid: k.get("kid").and_then(Value::as_str).map(str::to_string),
                        secret,
                    });
                }
                other => {
                    return Err(McpError::Config(format!(
                        "jwks_file: key type {other:?} is not supported (only HS256 \"oct\" keys)"
                    )))
                }
            }
        }
        if keys.is_empty() {
            return Err(McpError::Config("jwks_file: no keys".into()));
        }
        Ok(JwtVerifier {
            claim: claim.to_string(),
            keys,
        })
    }

    /// The claim's name (`sub`).
    pub fn claim(&self) -> &str {
        &self.claim
    }

    /// Verifies `token` at `now_secs` (Unix seconds) and returns the claim's value.
    pub fn verify(&self, token: &str, now_secs: i64) -> Result<String, TokenError> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let decode = |x: &str| URL_SAFE_NO_PAD.decode(x).map_err(|_| TokenError::Malformed);
        let header: Value =
            serde_json::from_slice(&decode(h)?).map_err(|_| TokenError::Malformed)?;
        let alg = header.get("alg").and_then(Value::as_str).unwrap_or("");
        if alg != "HS256" {
            return Err(TokenError::Algorithm(alg.to_string()));
        }
        let kid = header.get("kid").and_then(Value::as_str);
        let signature = decode(s)?;
        let signed = &token[..h.len() + 1 + p.len()];
        let ok = self
            .keys
            .iter()
            .filter(|k| kid.is_none() || k.kid.is_none() || k.kid.as_deref() == kid)
            .any(|k| {
                let mut mac = HmacSha256::new_from_slice(&k.secret).expect("hmac takes any key");
                mac.update(signed.as_bytes());
                mac.verify_slice(&signature).is_ok()
            });
        if !ok {
            return Err(TokenError::Signature);
        }
        let payload: Value =
            serde_json::from_slice(&decode(p)?).map_err(|_| TokenError::Malformed)?;
        if let Some(exp) = payload.get("exp").and_then(Value::as_i64) {
            if now_secs >= exp {
                return Err(TokenError::Expired);
            }
        }
        if let Some(nbf) = payload.get("nbf").and_then(Value::as_i64) {
            if now_secs < nbf {
                return Err(TokenError::Expired);
            }
        }
        match payload.get(&self.claim) {
            Some(Value::String(v)) if !v.is_empty() => Ok(v.clone()),
            Some(Value::Number(n)) => Ok(n.to_string()),
            _ => Err(TokenError::Claim(self.claim.clone())),
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
        let nosub = sign_hs256(&json!({"aud": "x"}), b"s3cret");
        assert_eq!(v.verify(&nosub, 0), Err(TokenError::Claim("sub".into())));
    }

    #[test]
    fn jwks_oct_keys_verify_and_asymmetric_keys_are_refused_clearly() {
        let k = URL_SAFE_NO_PAD.encode(b"jwks-secret");
        let v =
            JwtVerifier::from_jwks("sub", &format!(r#"{{"keys":[{{"kty":"oct","k":"{k}"}}]}}"#))
                .unwrap();
        let t = sign_hs256(&json!({"sub": "u"}), b"jwks-secret");
        assert_eq!(v.verify(&t, 0).unwrap(), "u");
        let err = JwtVerifier::from_jwks("sub", r#"{"keys":[{"kty":"RSA","n":"x","e":"AQAB"}]}"#)
            .unwrap_err();
        assert!(err.to_string().contains("not supported"), "{err}");
    }
}
