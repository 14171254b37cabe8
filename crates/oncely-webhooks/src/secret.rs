//! Signing secrets as read from the variable named by `secret_env`.
//!
//! The variable holds one or more secrets separated by spaces. A delivery verifies when
//! any of them matches, which is how a secret is rotated: add the new one, let senders
//! switch, then remove the old one. A secret that itself contains whitespace cannot be
//! written there; make it with [`Secret::parse`] and [`Secrets::new`] instead.
//!
//! How the written secret becomes the HMAC key depends on the scheme, as each provider's
//! own library does it:
//! - `standard`: the base64 text after an optional `whsec_` prefix, decoded.
//! - `stripe`: the whole string, `whsec_` included, as UTF-8 bytes.
//! - `github` and `hmac-sha256`: the string as UTF-8 bytes.

use std::fmt;

use base64::Engine as _;

use crate::error::ConfigError;
use crate::scheme::Scheme;

/// Standard base64 (`+/`) that accepts the padding written or left out.
pub(crate) const BASE64_LENIENT: base64::engine::GeneralPurpose =
    base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );

const WHSEC_PREFIX: &str = "whsec_";

/// One HMAC key. Its `Debug` output never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Reads one written secret the way `scheme`'s provider does.
    pub fn parse(scheme: &Scheme, text: &str) -> Result<Secret, &'static str> {
        if text.is_empty() {
            return Err("it is empty");
        }
        let key = match scheme {
            Scheme::Standard => {
                let encoded = text.strip_prefix(WHSEC_PREFIX).unwrap_or(text);
                BASE64_LENIENT
                    .decode(encoded)
                    .map_err(|_| "a standard webhooks secret must be base64 after whsec_")?
            }
            Scheme::Stripe | Scheme::Github | Scheme::HmacSha256(_) => text.as_bytes().to_vec(),
        };
        if key.is_empty() {
            return Err("it decodes to an empty key");
        }
        Ok(Secret(key))
    }

    /// A key given as raw bytes.
    pub fn from_bytes(key: impl Into<Vec<u8>>) -> Secret {
        Secret(key.into())
    }

    /// The HMAC key.
    pub fn key(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes, redacted)", self.0.len())
    }
}

/// One or more secrets, any of which may have signed a delivery. Never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secrets(Vec<Secret>);

impl Secrets {
    /// Reads the value of the `secret_env` variable: secrets separated by whitespace.
    pub fn parse(scheme: &Scheme, value: &str) -> Result<Secrets, ConfigError> {
        let secrets = value
            .split_ascii_whitespace()
            .enumerate()
            .map(|(i, text)| {
                Secret::parse(scheme, text).map_err(|reason| ConfigError::BadSecret {
                    position: i + 1,
                    reason,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Secrets::new(secrets)
    }

    /// Secrets from already made keys; refuses an empty list.
    pub fn new(secrets: Vec<Secret>) -> Result<Secrets, ConfigError> {
        if secrets.is_empty() {
            return Err(ConfigError::NoSecret);
        }
        Ok(Secrets(secrets))
    }

    /// The first secret: the one a sender signs with.
    pub fn primary(&self) -> &Secret {
        &self.0[0]
    }

    /// Every secret, in the order written.
    pub fn iter(&self) -> impl Iterator<Item = &Secret> {
        self.0.iter()
    }

    /// How many secrets there are (at least one).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: a `Secrets` holds at least one secret.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::HmacConfig;

    #[test]
    fn standard_secret_is_base64_after_whsec() {
        let secret = Secret::parse(&Scheme::Standard, "whsec_aGVsbG8=").unwrap();
        assert_eq!(secret.key(), b"hello");
        // Like the official library, the prefix is optional and padding may be left out.
        let secret = Secret::parse(&Scheme::Standard, "aGVsbG8").unwrap();
        assert_eq!(secret.key(), b"hello");
    }

    #[test]
    fn standard_secret_that_is_not_base64_is_refused() {
        for bad in ["whsec_not*base64", "whsec_", "whsec_a"] {
            assert!(Secret::parse(&Scheme::Standard, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn stripe_secret_is_used_as_written() {
        let secret = Secret::parse(&Scheme::Stripe, "whsec_abc").unwrap();
        assert_eq!(secret.key(), b"whsec_abc");
        let generic = Scheme::HmacSha256(HmacConfig::default());
        assert_eq!(Secret::parse(&generic, "s3cr3t").unwrap().key(), b"s3cr3t");
        assert_eq!(
            Secret::parse(&Scheme::Github, "It's").unwrap().key(),
            b"It's"
        );
    }

    #[test]
    fn several_secrets_are_space_separated_in_order() {
        let secrets = Secrets::parse(&Scheme::Stripe, "  whsec_new \t whsec_old\n").unwrap();
        let keys: Vec<&[u8]> = secrets.iter().map(Secret::key).collect();
        assert_eq!(keys, [&b"whsec_new"[..], &b"whsec_old"[..]]);
        assert_eq!(secrets.primary().key(), b"whsec_new");
        assert_eq!(secrets.len(), 2);
        assert!(!secrets.is_empty());
    }

    #[test]
    fn an_empty_variable_is_refused() {
        assert_eq!(
            Secrets::parse(&Scheme::Github, "   "),
            Err(ConfigError::NoSecret)
        );
        assert_eq!(Secrets::new(Vec::new()), Err(ConfigError::NoSecret));
    }

    #[test]
    fn a_bad_secret_is_named_by_position_never_by_content() {
        let err =
            Secrets::parse(&Scheme::Standard, "whsec_aGVsbG8= whsec_!!topsecret!!").unwrap_err();
        assert!(matches!(err, ConfigError::BadSecret { position: 2, .. }));
        let text = err.to_string();
        assert!(text.contains("number 2"), "{text}");
        assert!(!text.contains("topsecret"), "{text}");
    }

    #[test]
    fn debug_output_hides_the_key() {
        let secrets = Secrets::parse(&Scheme::Stripe, "whsec_topsecret").unwrap();
        let shown = format!("{secrets:?}");
        assert!(!shown.contains("topsecret"), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }
}
