//! Checking a delivery: headers present and readable, timestamp within tolerance, then an
//! HMAC-SHA256 over the signed content that matches a sent signature under one of the
//! secrets, compared in constant time.
//!
//! The checks run in that order, so a stale or malformed delivery costs no HMAC work.
//! Every failure is a [`VerifyError`]; the ingress answers all of them 400
//! `signature_invalid`, and their text is safe to show the sender: it names headers and
//! reasons, never a secret nor an expected signature.

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::event_id::EventIdSource;
use crate::headers::HeaderLookup;
use crate::parse::{self, Malformed, Tag};
use crate::scheme::Scheme;
use crate::secret::{Secret, Secrets};

/// The tolerance the providers' own libraries use: five minutes.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// Why a delivery did not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// A header the scheme needs is absent or empty.
    #[error("missing {0} header")]
    MissingHeader(String),
    /// A header is present but cannot be read.
    #[error("malformed {header} header: {reason}")]
    MalformedHeader {
        /// The header's name.
        header: String,
        /// What is wrong with it (fixed text, never the header's value).
        reason: &'static str,
    },
    /// The signed timestamp is further from the receiver's clock than the tolerance,
    /// in the past or in the future.
    #[error(
        "timestamp {timestamp} is {}s from the receiver's clock ({now}), beyond the {tolerance_secs}s tolerance",
        timestamp.abs_diff(*now)
    )]
    TimestampOutOfTolerance {
        /// The signed timestamp, Unix seconds.
        timestamp: i64,
        /// The receiver's clock, Unix seconds.
        now: i64,
        /// The tolerance, whole seconds.
        tolerance_secs: u64,
    },
    /// The headers are well formed but no signature matches the body under any secret.
    #[error("no signature matches the body")]
    NoMatchingSignature,
}

/// A delivery that verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The event id (see [`EventIdSource`]); `None` when the source holds none.
    pub event_id: Option<String>,
    /// The signed timestamp, Unix seconds; `None` for schemes without one (`github`,
    /// `hmac-sha256` without a timestamp header).
    pub timestamp: Option<i64>,
    /// Which secret matched, counting from 0 in the order written: a value above 0
    /// means the sender still signs with an older secret.
    pub secret_index: usize,
}

/// Checks one delivery with `scheme`, taking the event id from the scheme's default.
///
/// `now_unix_secs` is the receiver's clock; `tolerance` bounds how far the signed
/// timestamp may be from it, in either direction (schemes without a timestamp ignore
/// it).
pub fn verify<H: HeaderLookup + ?Sized>(
    scheme: &Scheme,
    secrets: &Secrets,
    headers: &H,
    body: &[u8],
    now_unix_secs: i64,
    tolerance: Duration,
) -> Result<Verified, VerifyError> {
    let (timestamp, secret_index) =
        check_signature(scheme, secrets, headers, body, now_unix_secs, tolerance)?;
    Ok(Verified {
        event_id: scheme
            .default_event_id()
            .and_then(|source| source.extract(headers, body)),
        timestamp,
        secret_index,
    })
}

/// Checks the headers, the timestamp and the signature, in that order; gives the signed
/// timestamp and the index of the secret that matched.
fn check_signature<H: HeaderLookup + ?Sized>(
    scheme: &Scheme,
    secrets: &Secrets,
    headers: &H,
    body: &[u8],
    now_unix_secs: i64,
    tolerance: Duration,
) -> Result<(Option<i64>, usize), VerifyError> {
    let signed = read_signed(scheme, headers)?;
    if let Some(timestamp) = signed.timestamp {
        check_tolerance(timestamp, now_unix_secs, tolerance)?;
    }
    let secret_index = match_any(secrets, &signed.prefix, body, &signed.tags)
        .ok_or(VerifyError::NoMatchingSignature)?;
    Ok((signed.timestamp, secret_index))
}

/// One `[[webhooks]]` entry's verification settings, resolved once at start-up.
#[derive(Debug, Clone)]
pub struct Verifier {
    scheme: Scheme,
    secrets: Secrets,
    tolerance: Duration,
    event_id: Option<EventIdSource>,
}

impl Verifier {
    /// A verifier that takes event ids from the scheme's default.
    pub fn new(scheme: Scheme, secrets: Secrets, tolerance: Duration) -> Verifier {
        Verifier {
            scheme,
            secrets,
            tolerance,
            event_id: None,
        }
    }

    /// Takes event ids from `source` instead of the scheme's default (`event_id = ...`).
    pub fn with_event_id(mut self, source: EventIdSource) -> Verifier {
        self.event_id = Some(source);
        self
    }

    /// The scheme this verifier checks.
    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    /// Whether the event id lies outside what the signature covers: it is read from a
    /// header, and that header is not Standard Webhooks' signed `webhook-id`. A captured
    /// delivery can then be sent again under a new id with its signature still valid.
    pub fn event_id_unsigned(&self) -> bool {
        let source = self
            .event_id
            .clone()
            .or_else(|| self.scheme.default_event_id());
        match (source, &self.scheme) {
            (Some(EventIdSource::Header(name)), Scheme::Standard) => {
                !name.eq_ignore_ascii_case("webhook-id")
            }
            (Some(EventIdSource::Header(_)), _) => true,
            _ => false,
        }
    }

    /// The tolerance on signed timestamps.
    pub fn tolerance(&self) -> Duration {
        self.tolerance
    }

    /// Checks one delivery; see [`verify()`].
    pub fn verify<H: HeaderLookup + ?Sized>(
        &self,
        headers: &H,
        body: &[u8],
        now_unix_secs: i64,
    ) -> Result<Verified, VerifyError> {
        let (timestamp, secret_index) = check_signature(
            &self.scheme,
            &self.secrets,
            headers,
            body,
            now_unix_secs,
            self.tolerance,
        )?;
        let source = self
            .event_id
            .clone()
            .or_else(|| self.scheme.default_event_id());
        Ok(Verified {
            event_id: source.and_then(|source| source.extract(headers, body)),
            timestamp,
            secret_index,
        })
    }
}

/// What a delivery's headers say was signed: the bytes that precede the body in the
/// signed content, the signatures sent, and the signed timestamp.
struct Signed {
    prefix: Vec<u8>,
    tags: Vec<Tag>,
    timestamp: Option<i64>,
}

fn read_signed<H: HeaderLookup + ?Sized>(
    scheme: &Scheme,
    headers: &H,
) -> Result<Signed, VerifyError> {
    match scheme {
        Scheme::Stripe => {
            const NAME: &str = "Stripe-Signature";
            let sig = parse::parse_stripe(one(headers, NAME)?).map_err(malformed(NAME))?;
            Ok(Signed {
                prefix: format!("{}.", sig.timestamp).into_bytes(),
                tags: sig.v1,
                timestamp: Some(sig.timestamp),
            })
        }
        Scheme::Standard => {
            let id = one(headers, "webhook-id")?;
            let timestamp = one(headers, "webhook-timestamp")?;
            let timestamp =
                parse::parse_timestamp(timestamp).map_err(malformed("webhook-timestamp"))?;
            let tags = parse::parse_standard(one(headers, "webhook-signature")?)
                .map_err(malformed("webhook-signature"))?;
            Ok(Signed {
                prefix: format!("{id}.{timestamp}.").into_bytes(),
                tags,
                timestamp: Some(timestamp),
            })
        }
        Scheme::Github => {
            const NAME: &str = "X-Hub-Signature-256";
            let tag = parse::parse_github(one(headers, NAME)?).map_err(malformed(NAME))?;
            Ok(Signed {
                prefix: Vec::new(),
                tags: vec![tag],
                timestamp: None,
            })
        }
        Scheme::HmacSha256(config) => {
            let tag = parse::parse_generic(config, one(headers, &config.header)?)
                .map_err(malformed(&config.header))?;
            let timestamp = match &config.timestamp_header {
                Some(name) => {
                    Some(parse::parse_timestamp(one(headers, name)?).map_err(malformed(name))?)
                }
                None => None,
            };
            Ok(Signed {
                prefix: timestamp
                    .map(|t| format!("{t}.").into_bytes())
                    .unwrap_or_default(),
                tags: vec![tag],
                timestamp,
            })
        }
    }
}

/// The single, non-empty, UTF-8 value of header `name`.
fn one<'h, H: HeaderLookup + ?Sized>(headers: &'h H, name: &str) -> Result<&'h str, VerifyError> {
    match headers.header_values(name).as_slice() {
        [] | [[]] => Err(VerifyError::MissingHeader(name.to_owned())),
        [value] => {
            std::str::from_utf8(value).map_err(|_| malformed(name)(Malformed("value is not UTF-8")))
        }
        _ => Err(malformed(name)(Malformed("sent more than once"))),
    }
}

fn malformed(header: &str) -> impl Fn(Malformed) -> VerifyError + '_ {
    move |Malformed(reason)| VerifyError::MalformedHeader {
        header: header.to_owned(),
        reason,
    }
}

fn check_tolerance(timestamp: i64, now: i64, tolerance: Duration) -> Result<(), VerifyError> {
    if Duration::from_secs(timestamp.abs_diff(now)) > tolerance {
        return Err(VerifyError::TimestampOutOfTolerance {
            timestamp,
            now,
            tolerance_secs: tolerance.as_secs(),
        });
    }
    Ok(())
}

/// The index of the first secret under which some sent tag matches.
fn match_any(secrets: &Secrets, prefix: &[u8], body: &[u8], tags: &[Tag]) -> Option<usize> {
    secrets.iter().position(|secret| {
        let expected = tag(secret, prefix, body);
        // Every sent tag is compared, in constant time, so the time taken does not
        // tell which one came close.
        tags.iter()
            .fold(subtle::Choice::from(0), |found, sent| {
                found | expected.ct_eq(sent)
            })
            .into()
    })
}

/// HMAC-SHA256 of `prefix || body` under `secret`.
pub(crate) fn tag(secret: &Secret, prefix: &[u8], body: &[u8]) -> Tag {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.key()).expect("HMAC accepts keys of any length");
    mac.update(prefix);
    mac.update(body);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::{Encoding, HmacConfig};
    use crate::sign::sign;

    const NOW: i64 = 1_700_000_000;
    const TOL: Duration = DEFAULT_TOLERANCE;
    const BODY: &[u8] = br#"{"id":"evt_123","type":"invoice.paid"}"#;

    fn secrets(scheme: &Scheme, value: &str) -> Secrets {
        Secrets::parse(scheme, value).unwrap()
    }

    fn generic(timestamp_header: Option<&str>) -> Scheme {
        Scheme::HmacSha256(HmacConfig {
            header: "X-Acme-Signature".into(),
            encoding: Encoding::Base64,
            prefix: Some("sha256=".into()),
            timestamp_header: timestamp_header.map(Into::into),
        })
    }

    fn all_schemes() -> Vec<(Scheme, &'static str)> {
        vec![
            (Scheme::Stripe, "whsec_test_secret"),
            (Scheme::Standard, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            (Scheme::Github, "It's-a-Secret-to-Everybody"),
            (generic(None), "generic-secret"),
            (generic(Some("X-Acme-Timestamp")), "generic-secret"),
        ]
    }

    /// Replaces the value of header `name` in `headers`.
    fn with(headers: &[(String, String)], name: &str, value: &str) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|(n, v)| {
                let v = if n.eq_ignore_ascii_case(name) {
                    value
                } else {
                    v
                };
                (n.clone(), v.to_owned())
            })
            .collect()
    }

    fn without(headers: &[(String, String)], name: &str) -> Vec<(String, String)> {
        headers
            .iter()
            .filter(|(n, _)| !n.eq_ignore_ascii_case(name))
            .cloned()
            .collect()
    }

    fn malformed_err(header: &str, reason: &'static str) -> VerifyError {
        VerifyError::MalformedHeader {
            header: header.to_owned(),
            reason,
        }
    }

    #[test]
    fn every_scheme_verifies_its_own_signature() {
        for (scheme, secret) in all_schemes() {
            let secrets = secrets(&scheme, secret);
            let headers = sign(&scheme, secrets.primary(), "evt_header", NOW, BODY);
            let verified = verify(&scheme, &secrets, &headers, BODY, NOW, TOL)
                .unwrap_or_else(|e| panic!("{scheme}: {e}"));
            assert_eq!(verified.secret_index, 0);
            let has_timestamp = !matches!(scheme, Scheme::Github)
                && !matches!(&scheme, Scheme::HmacSha256(c) if c.timestamp_header.is_none());
            assert_eq!(verified.timestamp, has_timestamp.then_some(NOW), "{scheme}");
        }
    }

    #[test]
    fn any_change_of_body_timestamp_or_secret_fails() {
        for (scheme, secret) in all_schemes() {
            let secrets = secrets(&scheme, secret);
            let headers = sign(&scheme, secrets.primary(), "evt_header", NOW, BODY);

            let mut body = BODY.to_vec();
            body[5] ^= 1;
            assert_eq!(
                verify(&scheme, &secrets, &headers, &body, NOW, TOL),
                Err(VerifyError::NoMatchingSignature),
                "{scheme}: changed body"
            );

            let other = Secrets::parse(&scheme, "whsec_b3RoZXJzZWNyZXQ=").unwrap();
            assert_eq!(
                verify(&scheme, &other, &headers, BODY, NOW, TOL),
                Err(VerifyError::NoMatchingSignature),
                "{scheme}: other secret"
            );

            // A different timestamp, still within tolerance: the signature covers it.
            let moved = match &scheme {
                Scheme::Stripe => {
                    let value = &headers[0].1;
                    with(
                        &headers,
                        "Stripe-Signature",
                        &value.replace(&format!("t={NOW}"), &format!("t={}", NOW + 1)),
                    )
                }
                Scheme::Standard => with(&headers, "webhook-timestamp", &(NOW + 1).to_string()),
                Scheme::HmacSha256(HmacConfig {
                    timestamp_header: Some(name),
                    ..
                }) => with(&headers, name, &(NOW + 1).to_string()),
                _ => continue,
            };
            assert_eq!(
                verify(&scheme, &secrets, &moved, BODY, NOW, TOL),
                Err(VerifyError::NoMatchingSignature),
                "{scheme}: changed timestamp"
            );
        }
    }

    #[test]
    fn standard_signature_covers_the_message_id() {
        let scheme = Scheme::Standard;
        let secrets = secrets(&scheme, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let headers = sign(&scheme, secrets.primary(), "msg_1", NOW, BODY);
        let moved = with(&headers, "webhook-id", "msg_2");
        assert_eq!(
            verify(&scheme, &secrets, &moved, BODY, NOW, TOL),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn every_missing_header_is_named() {
        let cases: Vec<(Scheme, &str)> = vec![
            (Scheme::Stripe, "Stripe-Signature"),
            (Scheme::Standard, "webhook-id"),
            (Scheme::Standard, "webhook-timestamp"),
            (Scheme::Standard, "webhook-signature"),
            (Scheme::Github, "X-Hub-Signature-256"),
            (generic(None), "X-Acme-Signature"),
            (generic(Some("X-Acme-Timestamp")), "X-Acme-Timestamp"),
        ];
        for (scheme, name) in cases {
            let secrets = secrets(&scheme, "whsec_c2VjcmV0");
            let headers = sign(&scheme, secrets.primary(), "evt", NOW, BODY);
            let expected = VerifyError::MissingHeader(name.to_owned());
            assert_eq!(
                verify(&scheme, &secrets, &without(&headers, name), BODY, NOW, TOL),
                Err(expected.clone()),
                "{scheme} without {name}"
            );
            // An empty value counts as missing.
            assert_eq!(
                verify(&scheme, &secrets, &with(&headers, name, ""), BODY, NOW, TOL),
                Err(expected),
                "{scheme} with empty {name}"
            );
        }
    }

    #[test]
    fn malformed_headers_are_refused_with_their_reason() {
        let stripe = secrets(&Scheme::Stripe, "whsec_x");
        let good = sign(&Scheme::Stripe, stripe.primary(), "", NOW, BODY);
        let v1 = good[0].1.split_once(",v1=").unwrap().1.to_owned();
        let stripe_cases = [
            (
                format!("t=abc,v1={v1}"),
                "timestamp is not a whole number of seconds",
            ),
            (format!("t={NOW}"), "no v1= signature"),
            (format!("t={NOW},v0={v1}"), "no v1= signature"),
            (format!("t={NOW},,v1={v1}"), "empty entry"),
            (
                format!("t={NOW},v1=not-hex"),
                "signature is not 64 hexadecimal digits",
            ),
            (format!("v1={v1}"), "no t= timestamp"),
        ];
        for (value, reason) in stripe_cases {
            let headers = [("Stripe-Signature", value.as_str())];
            assert_eq!(
                verify(&Scheme::Stripe, &stripe, &headers, BODY, NOW, TOL),
                Err(malformed_err("Stripe-Signature", reason)),
                "{value}"
            );
        }

        let standard = secrets(&Scheme::Standard, "whsec_c2VjcmV0");
        let good = sign(&Scheme::Standard, standard.primary(), "msg", NOW, BODY);
        let standard_cases = [
            (
                "webhook-timestamp",
                "abc",
                "timestamp is not a whole number of seconds",
            ),
            (
                "webhook-timestamp",
                "-1",
                "timestamp is not a whole number of seconds",
            ),
            ("webhook-signature", "v1,***", "signature is not base64"),
            ("webhook-signature", "v1", "entry without ','"),
            ("webhook-signature", "v2,AAAA", "no v1 signature"),
            (
                "webhook-signature",
                "v1,aGVsbG8=",
                "signature is not 32 bytes",
            ),
        ];
        for (name, value, reason) in standard_cases {
            assert_eq!(
                verify(
                    &Scheme::Standard,
                    &standard,
                    &with(&good, name, value),
                    BODY,
                    NOW,
                    TOL
                ),
                Err(malformed_err(name, reason)),
                "{name}: {value}"
            );
        }

        let github = secrets(&Scheme::Github, "s");
        let good = sign(&Scheme::Github, github.primary(), "d", NOW, BODY);
        let hex = good[0].1.strip_prefix("sha256=").unwrap().to_owned();
        for (value, reason) in [
            (hex.clone(), "value does not start with sha256="),
            (format!("sha1={hex}"), "value does not start with sha256="),
            (
                "sha256=xyz".to_owned(),
                "signature is not 64 hexadecimal digits",
            ),
        ] {
            let headers = with(&good, "X-Hub-Signature-256", &value);
            assert_eq!(
                verify(&Scheme::Github, &github, &headers, BODY, NOW, TOL),
                Err(malformed_err("X-Hub-Signature-256", reason)),
                "{value}"
            );
        }

        let scheme = generic(Some("X-Acme-Timestamp"));
        let secrets = secrets(&scheme, "s");
        let good = sign(&scheme, secrets.primary(), "", NOW, BODY);
        for (name, value, reason) in [
            (
                "X-Acme-Signature",
                "md5=AAAA",
                "value does not start with the configured prefix",
            ),
            ("X-Acme-Signature", "sha256=%%%", "signature is not base64"),
            (
                "X-Acme-Timestamp",
                "soon",
                "timestamp is not a whole number of seconds",
            ),
        ] {
            assert_eq!(
                verify(&scheme, &secrets, &with(&good, name, value), BODY, NOW, TOL),
                Err(malformed_err(name, reason)),
                "{name}: {value}"
            );
        }
    }

    #[test]
    fn a_header_sent_twice_or_not_utf8_is_malformed() {
        let scheme = Scheme::Github;
        let secrets = secrets(&scheme, "s");
        let mut headers = sign(&scheme, secrets.primary(), "d", NOW, BODY);
        headers.push(headers[0].clone());
        assert_eq!(
            verify(&scheme, &secrets, &headers, BODY, NOW, TOL),
            Err(malformed_err("X-Hub-Signature-256", "sent more than once"))
        );
        let headers: [(&str, &[u8]); 1] = [("X-Hub-Signature-256", b"sha256=\xff")];
        assert_eq!(
            verify(&scheme, &secrets, &headers, BODY, NOW, TOL),
            Err(malformed_err("X-Hub-Signature-256", "value is not UTF-8"))
        );
    }

    #[test]
    fn tolerance_applies_to_past_and_future_inclusive() {
        let tol = Duration::from_secs(300);
        for (scheme, secret) in all_schemes() {
            let secrets = secrets(&scheme, secret);
            let headers = sign(&scheme, secrets.primary(), "evt", NOW, BODY);
            let signed_at = |now: i64| verify(&scheme, &secrets, &headers, BODY, now, tol);
            let timed = !matches!(&scheme, Scheme::Github)
                && !matches!(&scheme, Scheme::HmacSha256(c) if c.timestamp_header.is_none());
            // Just inside, either way.
            assert!(signed_at(NOW + 300).is_ok(), "{scheme}: 300s old");
            assert!(signed_at(NOW - 300).is_ok(), "{scheme}: 300s ahead");
            for now in [NOW + 301, NOW - 301, NOW + 86_400, NOW - 86_400] {
                let result = signed_at(now);
                if timed {
                    assert_eq!(
                        result,
                        Err(VerifyError::TimestampOutOfTolerance {
                            timestamp: NOW,
                            now,
                            tolerance_secs: 300
                        }),
                        "{scheme}: now {now}"
                    );
                } else {
                    assert!(result.is_ok(), "{scheme} has no timestamp to check");
                }
            }
        }
    }

    #[test]
    fn stale_timestamp_is_refused_before_any_signature_work() {
        // A stale delivery with a bad signature reports the timestamp: the check is cheap
        // and comes first.
        let scheme = Scheme::Stripe;
        let secrets = secrets(&scheme, "whsec_x");
        let headers = [(
            "Stripe-Signature",
            format!("t={},v1={}", NOW - 3600, "0".repeat(64)),
        )];
        assert!(matches!(
            verify(&scheme, &secrets, &headers, BODY, NOW, TOL),
            Err(VerifyError::TimestampOutOfTolerance { .. })
        ));
    }

    #[test]
    fn rotation_accepts_a_later_secret_and_says_which() {
        for (scheme, _) in all_schemes() {
            let old = Secret::parse(&scheme, "whsec_b2xkLXNlY3JldA==").unwrap();
            let both =
                Secrets::parse(&scheme, "whsec_bmV3LXNlY3JldA== whsec_b2xkLXNlY3JldA==").unwrap();
            let headers = sign(&scheme, &old, "evt", NOW, BODY);
            let verified = verify(&scheme, &both, &headers, BODY, NOW, TOL).unwrap();
            assert_eq!(verified.secret_index, 1, "{scheme}");
            let only_new = Secrets::parse(&scheme, "whsec_bmV3LXNlY3JldA==").unwrap();
            assert_eq!(
                verify(&scheme, &only_new, &headers, BODY, NOW, TOL),
                Err(VerifyError::NoMatchingSignature),
                "{scheme}"
            );
        }
    }

    #[test]
    fn stripe_accepts_any_of_several_v1() {
        let scheme = Scheme::Stripe;
        let secrets = secrets(&scheme, "whsec_x");
        let good = sign(&scheme, secrets.primary(), "", NOW, BODY);
        let v1 = good[0].1.split_once(",v1=").unwrap().1.to_owned();
        let wrong = "ab".repeat(32);
        for value in [
            format!("t={NOW},v1={wrong},v1={v1}"),
            format!("t={NOW},v1={v1},v1={wrong}"),
            format!("t={NOW},v0={wrong},v1={wrong},v1={v1},scheme2=x"),
        ] {
            let headers = [("Stripe-Signature", value.as_str())];
            assert!(
                verify(&scheme, &secrets, &headers, BODY, NOW, TOL).is_ok(),
                "{value}"
            );
        }
        let headers = [("Stripe-Signature", format!("t={NOW},v1={wrong},v1={wrong}"))];
        assert_eq!(
            verify(&scheme, &secrets, &headers, BODY, NOW, TOL),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn stripe_refuses_a_header_with_only_v0() {
        // Stripe's v0 is a test-mode scheme with a different key; accepting it would let a
        // right-looking v0 stand in for the v1 that proves the delivery.
        let scheme = Scheme::Stripe;
        let secrets = secrets(&scheme, "whsec_x");
        let good = sign(&scheme, secrets.primary(), "", NOW, BODY);
        let v0_only = good[0].1.replace("v1=", "v0=");
        let headers = [("Stripe-Signature", v0_only.as_str())];
        assert_eq!(
            verify(&scheme, &secrets, &headers, BODY, NOW, TOL),
            Err(malformed_err("Stripe-Signature", "no v1= signature"))
        );
    }

    #[test]
    fn standard_accepts_any_of_several_signatures_and_skips_other_versions() {
        let scheme = Scheme::Standard;
        let secrets = secrets(&scheme, "whsec_c2VjcmV0");
        let good = sign(&scheme, secrets.primary(), "msg", NOW, BODY);
        let sig = good[2].1.clone();
        let wrong = format!("v1,{}", "A".repeat(43) + "=");
        let value = format!("v1a,AAAA {wrong} {sig}");
        let headers = with(&good, "webhook-signature", &value);
        assert!(verify(&scheme, &secrets, &headers, BODY, NOW, TOL).is_ok());
    }

    #[test]
    fn event_ids_come_from_each_schemes_default() {
        let stripe = secrets(&Scheme::Stripe, "whsec_x");
        let headers = sign(&Scheme::Stripe, stripe.primary(), "ignored", NOW, BODY);
        let verified = verify(&Scheme::Stripe, &stripe, &headers, BODY, NOW, TOL).unwrap();
        assert_eq!(verified.event_id.as_deref(), Some("evt_123"));

        let not_json = b"plain text";
        let headers = sign(&Scheme::Stripe, stripe.primary(), "", NOW, not_json);
        let verified = verify(&Scheme::Stripe, &stripe, &headers, not_json, NOW, TOL).unwrap();
        assert_eq!(verified.event_id, None);

        let github = secrets(&Scheme::Github, "s");
        let headers = sign(
            &Scheme::Github,
            github.primary(),
            "72d3162e-cc78",
            NOW,
            BODY,
        );
        let verified = verify(&Scheme::Github, &github, &headers, BODY, NOW, TOL).unwrap();
        assert_eq!(verified.event_id.as_deref(), Some("72d3162e-cc78"));

        let scheme = generic(None);
        let s = secrets(&scheme, "s");
        let headers = sign(&scheme, s.primary(), "evt", NOW, BODY);
        assert_eq!(
            verify(&scheme, &s, &headers, BODY, NOW, TOL)
                .unwrap()
                .event_id,
            None
        );
    }

    #[test]
    fn a_verifier_can_take_the_event_id_from_elsewhere() {
        let scheme = generic(None);
        let s = secrets(&scheme, "s");
        let headers = sign(&scheme, s.primary(), "", NOW, BODY);
        let verifier = Verifier::new(scheme, s, TOL).with_event_id("json:/type".parse().unwrap());
        assert_eq!(verifier.tolerance(), TOL);
        assert_eq!(verifier.scheme().name(), "hmac-sha256");
        let verified = verifier.verify(&headers, BODY, NOW).unwrap();
        assert_eq!(verified.event_id.as_deref(), Some("invoice.paid"));
        // The override does not loosen verification.
        assert_eq!(
            verifier.verify(&headers, b"{}", NOW),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn event_ids_outside_the_signature_are_known() {
        let v = |scheme: Scheme, source: Option<&str>| {
            let s = secrets(&scheme, "whsec_c2VjcmV0");
            let v = Verifier::new(scheme, s, TOL);
            match source {
                Some(text) => v.with_event_id(text.parse().unwrap()),
                None => v,
            }
        };
        assert!(v(Scheme::Github, None).event_id_unsigned());
        assert!(!v(Scheme::Github, Some("json:/id")).event_id_unsigned());
        assert!(v(generic(None), Some("header:X-Event-Id")).event_id_unsigned());
        assert!(!v(generic(None), None).event_id_unsigned(), "no id at all");
        assert!(
            !v(Scheme::Standard, None).event_id_unsigned(),
            "webhook-id is signed"
        );
        assert!(v(Scheme::Standard, Some("header:x-other")).event_id_unsigned());
        assert!(!v(Scheme::Stripe, None).event_id_unsigned());
    }

    #[test]
    fn http_header_maps_work_as_received() {
        let scheme = Scheme::Standard;
        let s = secrets(&scheme, "whsec_c2VjcmV0");
        let mut map = http::HeaderMap::new();
        for (name, value) in sign(&scheme, s.primary(), "msg_7", NOW, BODY) {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        let verified = verify(&scheme, &s, &map, BODY, NOW, TOL).unwrap();
        assert_eq!(verified.event_id.as_deref(), Some("msg_7"));
    }

    #[test]
    fn error_text_is_one_line_and_never_shows_secrets_or_expected_tags() {
        let scheme = Scheme::Stripe;
        let s = secrets(&scheme, "whsec_topsecret");
        let headers = sign(&scheme, s.primary(), "", NOW, BODY);
        let expected_hex = headers[0].1.split_once(",v1=").unwrap().1.to_owned();
        let errors = [
            verify(&scheme, &s, &headers, b"tampered", NOW, TOL).unwrap_err(),
            verify(&scheme, &s, &headers, BODY, NOW + 9999, TOL).unwrap_err(),
            verify(&scheme, &s, &[("Stripe-Signature", "t=1")], BODY, NOW, TOL).unwrap_err(),
            verify(&scheme, &s, &[("x", "y")], BODY, NOW, TOL).unwrap_err(),
        ];
        let texts: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            texts,
            [
                "no signature matches the body".to_owned(),
                format!("timestamp {NOW} is 9999s from the receiver's clock ({}), beyond the 300s tolerance", NOW + 9999),
                "malformed Stripe-Signature header: no v1= signature".to_owned(),
                "missing Stripe-Signature header".to_owned(),
            ]
        );
        for text in texts {
            assert!(
                !text.contains("topsecret")
                    && !text.contains(&expected_hex)
                    && !text.contains('\n')
            );
        }
    }
}
