//! Properties over arbitrary input: the parsers and `verify` never panic on any header
//! bytes, and signing then verifying holds for any body and timestamp while any change
//! to the body breaks it. The fuzz target `fuzz/fuzz_targets/signature_headers.rs`
//! explores the same parsers further with a nightly toolchain.

use std::time::Duration;

use oncely_webhooks::parse::{
    parse_generic, parse_github, parse_standard, parse_stripe, parse_timestamp,
};
use oncely_webhooks::{sign, verify, Encoding, HmacConfig, Scheme, Secrets, VerifyError};
use proptest::prelude::*;

fn schemes() -> Vec<Scheme> {
    vec![
        Scheme::Stripe,
        Scheme::Standard,
        Scheme::Github,
        Scheme::HmacSha256(HmacConfig::default()),
        Scheme::HmacSha256(HmacConfig {
            header: "X-Sig".into(),
            encoding: Encoding::Base64,
            prefix: Some("sha256=".into()),
            timestamp_header: Some("X-Ts".into()),
        }),
    ]
}

/// Header-ish text: mostly the characters signature headers are made of.
fn headerish() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[tv01a=,; +/=sha256whsec_0-9a-fA-F]{0,120}",
        "(t=[0-9]{1,12}|v1=[0-9a-f]{64}|v0=[0-9a-f]{0,64}|v1,[A-Za-z0-9+/]{43}=|sha256=[0-9a-f]{64}|)([, ](t=[0-9]{1,12}|v1=[0-9a-f]{64}|v1,[A-Za-z0-9+/]{43}=)){0,4}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn parsers_never_panic(text in headerish()) {
        let _ = parse_timestamp(&text);
        let _ = parse_stripe(&text);
        let _ = parse_standard(&text);
        let _ = parse_github(&text);
        for scheme in schemes() {
            if let Scheme::HmacSha256(config) = &scheme {
                let _ = parse_generic(config, &text);
            }
        }
    }

    #[test]
    fn verify_never_panics_and_never_accepts_garbage(
        values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..100), 4),
        texts in proptest::collection::vec(headerish(), 4),
        body in proptest::collection::vec(any::<u8>(), 0..64),
        now in any::<i64>(),
    ) {
        let names = ["Stripe-Signature", "webhook-id", "webhook-timestamp", "webhook-signature",
                     "X-Hub-Signature-256", "X-Signature", "X-Sig", "X-Ts"];
        let mut headers: Vec<(&str, Vec<u8>)> = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let value = if i % 2 == 0 { values[i / 2].clone() } else { texts[i / 2].clone().into_bytes() };
            headers.push((name, value));
        }
        for scheme in schemes() {
            let secrets = Secrets::parse(&scheme, "whsec_c2VjcmV0").unwrap();
            // Random headers forging a valid HMAC-SHA256 is not going to happen.
            prop_assert!(verify(&scheme, &secrets, &headers, &body, now, Duration::from_secs(u64::MAX)).is_err());
        }
    }

    #[test]
    fn signed_deliveries_verify_and_any_body_change_fails(
        body in proptest::collection::vec(any::<u8>(), 0..256),
        timestamp in 0i64..=i64::MAX,
        flip in any::<prop::sample::Index>(),
        bit in 0u8..8,
        id in "[A-Za-z0-9_-]{1,40}",
    ) {
        for scheme in schemes() {
            let secrets = Secrets::parse(&scheme, "whsec_c2VjcmV0 whsec_b2xk").unwrap();
            let headers = sign(&scheme, secrets.primary(), &id, timestamp, &body);
            let verified = verify(&scheme, &secrets, &headers, &body, timestamp, Duration::ZERO);
            prop_assert!(verified.is_ok(), "{}: {:?}", scheme, verified);
            if !body.is_empty() {
                let mut changed = body.clone();
                changed[flip.index(body.len())] ^= 1 << bit;
                prop_assert_eq!(
                    verify(&scheme, &secrets, &headers, &changed, timestamp, Duration::ZERO),
                    Err(VerifyError::NoMatchingSignature)
                );
            }
        }
    }
}
