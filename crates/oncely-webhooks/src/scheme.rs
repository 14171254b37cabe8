//! The verification schemes a `[[webhooks]]` entry names with `verify = "..."`.
//!
//! | name | headers read | signed content | secret |
//! | --- | --- | --- | --- |
//! | `stripe` | `Stripe-Signature: t=T,v1=HEX[,v1=HEX...]` | `T.BODY` | the `whsec_...` string itself |
//! | `standard` | `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,B64[ v1,B64...]` | `ID.T.BODY` | base64 after `whsec_` |
//! | `github` | `X-Hub-Signature-256: sha256=HEX`, `X-GitHub-Delivery` | `BODY` | the string itself |
//! | `hmac-sha256` | [`HmacConfig::header`] (default `X-Signature`), optional timestamp header | `BODY`, or `T.BODY` with a timestamp header | the string itself |
//!
//! Every scheme uses HMAC-SHA256.

use std::fmt;
use std::str::FromStr;

use crate::error::ConfigError;
use crate::event_id::EventIdSource;

/// How a delivery's signature is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheme {
    /// Stripe: `Stripe-Signature: t=...,v1=...`, HMAC-SHA256 over `t.body`.
    Stripe,
    /// Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature`.
    Standard,
    /// GitHub: `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 over the body.
    Github,
    /// A generic HMAC-SHA256 signature in one header, configured by [`HmacConfig`].
    HmacSha256(HmacConfig),
}

impl Scheme {
    /// The name written in the config: `stripe`, `standard`, `github` or `hmac-sha256`.
    pub fn name(&self) -> &'static str {
        match self {
            Scheme::Stripe => "stripe",
            Scheme::Standard => "standard",
            Scheme::Github => "github",
            Scheme::HmacSha256(_) => "hmac-sha256",
        }
    }

    /// Where the event id comes from when the config sets no `event_id`:
    /// `stripe` → the body's `/id`, `standard` → `webhook-id`, `github` →
    /// `X-GitHub-Delivery`, `hmac-sha256` → nowhere.
    pub fn default_event_id(&self) -> Option<EventIdSource> {
        match self {
            Scheme::Stripe => Some(EventIdSource::Json("/id".to_owned())),
            Scheme::Standard => Some(EventIdSource::Header("webhook-id".to_owned())),
            Scheme::Github => Some(EventIdSource::Header("X-GitHub-Delivery".to_owned())),
            Scheme::HmacSha256(_) => None,
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scheme {
    type Err = ConfigError;

    /// Reads a scheme name; `hmac-sha256` gets [`HmacConfig::default`], which the
    /// config loader then adjusts from the entry's own keys.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "stripe" => Ok(Scheme::Stripe),
            "standard" => Ok(Scheme::Standard),
            "github" => Ok(Scheme::Github),
            "hmac-sha256" => Ok(Scheme::HmacSha256(HmacConfig::default())),
            other => Err(ConfigError::UnknownScheme(other.to_owned())),
        }
    }
}

/// How the generic `hmac-sha256` scheme finds and reads its signature.
///
/// Suggested config keys on a `[[webhooks]]` entry: `signature_header`,
/// `signature_encoding` (`hex` or `base64`), `signature_prefix` (e.g. `"sha256="`) and
/// `timestamp_header`.
///
/// The signature is HMAC-SHA256, keyed with the secret's bytes as written, over the raw
/// body; when `timestamp_header` is set, over `TIMESTAMP.BODY` instead (Stripe's
/// construction), and the timestamp (Unix seconds) must lie within the tolerance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HmacConfig {
    /// The header holding the signature. Default `X-Signature`.
    pub header: String,
    /// How the 32 signature bytes are written. Default hex.
    pub encoding: Encoding,
    /// A prefix the header value must start with, stripped before decoding (e.g.
    /// `sha256=`). Default none.
    pub prefix: Option<String>,
    /// The header holding the Unix timestamp in seconds, when the sender signs one.
    /// Default none: no timestamp, no tolerance check.
    pub timestamp_header: Option<String>,
}

impl Default for HmacConfig {
    fn default() -> Self {
        HmacConfig {
            header: "X-Signature".to_owned(),
            encoding: Encoding::Hex,
            prefix: None,
            timestamp_header: None,
        }
    }
}

impl HmacConfig {
    /// Checks that the configured header names are valid HTTP header names.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for name in std::iter::once(&self.header).chain(self.timestamp_header.as_ref()) {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(ConfigError::BadHeaderName(name.clone()));
            }
        }
        Ok(())
    }
}

/// How the generic scheme writes signature bytes in its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// Hexadecimal, either case.
    #[default]
    Hex,
    /// Standard base64 (`+/`), padding optional.
    Base64,
}

impl FromStr for Encoding {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hex" => Ok(Encoding::Hex),
            "base64" => Ok(Encoding::Base64),
            other => Err(ConfigError::UnknownEncoding(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_contract_name_parses_and_prints_back() {
        for name in ["stripe", "standard", "github", "hmac-sha256"] {
            let scheme: Scheme = name.parse().unwrap();
            assert_eq!(scheme.to_string(), name);
        }
    }

    #[test]
    fn unknown_names_are_refused_with_the_choices() {
        for name in ["Stripe", "svix", "", "hmac-sha1", "standard "] {
            let err = name.parse::<Scheme>().unwrap_err();
            assert_eq!(err, ConfigError::UnknownScheme(name.to_owned()));
            assert!(err
                .to_string()
                .contains("stripe, standard, github or hmac-sha256"));
        }
    }

    #[test]
    fn generic_scheme_defaults_to_hex_in_x_signature() {
        let Scheme::HmacSha256(config) = "hmac-sha256".parse().unwrap() else {
            panic!("hmac-sha256 must parse to the generic scheme");
        };
        assert_eq!(config.header, "X-Signature");
        assert_eq!(config.encoding, Encoding::Hex);
        assert_eq!(config.prefix, None);
        assert_eq!(config.timestamp_header, None);
        assert_eq!(config.validate(), Ok(()));
    }

    #[test]
    fn encodings_parse() {
        assert_eq!("hex".parse(), Ok(Encoding::Hex));
        assert_eq!("base64".parse(), Ok(Encoding::Base64));
        assert_eq!(
            "b64".parse::<Encoding>(),
            Err(ConfigError::UnknownEncoding("b64".into()))
        );
    }

    #[test]
    fn bad_header_names_are_refused() {
        for bad in ["", "X Signature", "X-Sig:"] {
            let config = HmacConfig {
                header: bad.to_owned(),
                ..HmacConfig::default()
            };
            assert_eq!(
                config.validate(),
                Err(ConfigError::BadHeaderName(bad.to_owned()))
            );
        }
        let config = HmacConfig {
            timestamp_header: Some("bad header".into()),
            ..HmacConfig::default()
        };
        assert!(config.validate().is_err());
    }

    #[test]
    fn default_event_ids_follow_each_provider() {
        assert_eq!(
            Scheme::Stripe.default_event_id(),
            Some(EventIdSource::Json("/id".into()))
        );
        assert_eq!(
            Scheme::Standard.default_event_id(),
            Some(EventIdSource::Header("webhook-id".into()))
        );
        assert_eq!(
            Scheme::Github.default_event_id(),
            Some(EventIdSource::Header("X-GitHub-Delivery".into()))
        );
        assert_eq!(
            Scheme::HmacSha256(HmacConfig::default()).default_event_id(),
            None
        );
    }
}
