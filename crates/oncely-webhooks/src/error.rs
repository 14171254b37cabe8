//! [`ConfigError`], the one error of the configuration this crate reads. The modules that
//! read it (schemes, event id sources, secrets) all return it, so it sits below them all.

/// Errors in the configuration this crate reads: scheme names, encodings, event id
/// sources and secrets. Their text never contains a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `verify = "..."` names no scheme this crate knows.
    #[error(
        "unknown webhook verification scheme {0:?} (use stripe, standard, github or hmac-sha256)"
    )]
    UnknownScheme(String),
    /// The generic scheme's signature encoding is neither `hex` nor `base64`.
    #[error("unknown signature encoding {0:?} (use hex or base64)")]
    UnknownEncoding(String),
    /// A header name in the configuration is empty or not a valid HTTP header name.
    #[error("invalid header name {0:?}")]
    BadHeaderName(String),
    /// `event_id = "..."` is not `json:POINTER` or `header:NAME`.
    #[error("invalid event id source {0:?} (use json:/POINTER or header:NAME)")]
    BadEventIdSource(String),
    /// The secret variable holds no secret at all.
    #[error("the webhook secret variable is empty")]
    NoSecret,
    /// One of the secrets cannot be used; `position` counts from 1 in the variable.
    #[error("webhook secret number {position} is unusable: {reason}")]
    BadSecret {
        /// Which secret, counting from 1, in the space-separated list.
        position: usize,
        /// Why it cannot be used (never the secret itself).
        reason: &'static str,
    },
}
