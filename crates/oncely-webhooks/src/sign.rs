//! The sender's side: the headers a provider would attach to a delivery.
//!
//! Used by tests, by `oncely demo` and by the webhook ingress's own tests to make
//! deliveries that [`crate::verify()`] accepts.

use base64::Engine as _;

use crate::scheme::{Encoding, Scheme};
use crate::secret::Secret;
use crate::verify::tag;

/// The headers that sign `body` with `secret` at `timestamp` (Unix seconds), as the
/// scheme's provider writes them:
///
/// - `stripe`: `Stripe-Signature: t=T,v1=HEX` (the event id lives in the body's `id`, so
///   `event_id` is not used).
/// - `standard`: `webhook-id: EVENT_ID`, `webhook-timestamp: T`, `webhook-signature: v1,B64`.
/// - `github`: `X-Hub-Signature-256: sha256=HEX`, `X-GitHub-Delivery: EVENT_ID`
///   (`timestamp` is not used).
/// - `hmac-sha256`: the configured header with its prefix and encoding, and the
///   timestamp header when one is configured (`event_id` is not used).
pub fn sign(
    scheme: &Scheme,
    secret: &Secret,
    event_id: &str,
    timestamp: i64,
    body: &[u8],
) -> Vec<(String, String)> {
    let header = |name: &str, value: String| (name.to_owned(), value);
    match scheme {
        Scheme::Stripe => {
            let mac = tag(secret, format!("{timestamp}.").as_bytes(), body);
            vec![header(
                "Stripe-Signature",
                format!("t={timestamp},v1={}", hex::encode(mac)),
            )]
        }
        Scheme::Standard => {
            let mac = tag(secret, format!("{event_id}.{timestamp}.").as_bytes(), body);
            vec![
                header("webhook-id", event_id.to_owned()),
                header("webhook-timestamp", timestamp.to_string()),
                header(
                    "webhook-signature",
                    format!(
                        "v1,{}",
                        base64::engine::general_purpose::STANDARD.encode(mac)
                    ),
                ),
            ]
        }
        Scheme::Github => {
            let mac = tag(secret, b"", body);
            vec![
                header(
                    "X-Hub-Signature-256",
                    format!("sha256={}", hex::encode(mac)),
                ),
                header("X-GitHub-Delivery", event_id.to_owned()),
            ]
        }
        Scheme::HmacSha256(config) => {
            let prefix = match config.timestamp_header {
                Some(_) => format!("{timestamp}."),
                None => String::new(),
            };
            let mac = tag(secret, prefix.as_bytes(), body);
            let encoded = match config.encoding {
                Encoding::Hex => hex::encode(mac),
                Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(mac),
            };
            let mut headers = vec![header(
                &config.header,
                format!("{}{encoded}", config.prefix.as_deref().unwrap_or("")),
            )];
            if let Some(name) = &config.timestamp_header {
                headers.push(header(name, timestamp.to_string()));
            }
            headers
        }
    }
}
