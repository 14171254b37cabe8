//! Fuzzes every signature header parser and `verify` with arbitrary bytes.
//!
//! Run with: `cargo +nightly fuzz run signature_headers` (from the repository root).
//! The input's first byte picks the generic scheme's settings; the rest is split on
//! `\n` into header values, which go to each parser and, as headers, to `verify` under
//! every scheme. Nothing may panic, and nothing random may verify.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use oncely_webhooks::parse::{
    parse_generic, parse_github, parse_standard, parse_stripe, parse_timestamp,
};
use oncely_webhooks::{verify, Encoding, HmacConfig, Scheme, Secrets};

const NAMES: [&str; 8] = [
    "Stripe-Signature",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "X-Hub-Signature-256",
    "X-Signature",
    "X-Timestamp",
    "X-GitHub-Delivery",
];

fuzz_target!(|data: &[u8]| {
    let Some((&knobs, rest)) = data.split_first() else {
        return;
    };
    let generic = HmacConfig {
        encoding: if knobs & 1 == 0 {
            Encoding::Hex
        } else {
            Encoding::Base64
        },
        prefix: (knobs & 2 != 0).then(|| "sha256=".to_owned()),
        timestamp_header: (knobs & 4 != 0).then(|| "X-Timestamp".to_owned()),
        ..HmacConfig::default()
    };

    let values: Vec<&[u8]> = rest.split(|&b| b == b'\n').collect();
    for value in &values {
        if let Ok(text) = std::str::from_utf8(value) {
            let _ = parse_timestamp(text);
            let _ = parse_stripe(text);
            let _ = parse_standard(text);
            let _ = parse_github(text);
            let _ = parse_generic(&generic, text);
        }
    }

    let headers: Vec<(&str, &[u8])> = NAMES.iter().copied().zip(values.iter().copied()).collect();
    let body = values.last().copied().unwrap_or_default();
    let now = i64::from(knobs) * 1_000_000_007;
    for scheme in [
        Scheme::Stripe,
        Scheme::Standard,
        Scheme::Github,
        Scheme::HmacSha256(generic.clone()),
    ] {
        let secrets = Secrets::parse(&scheme, "whsec_c2VjcmV0 whsec_b2xk").unwrap();
        let result = verify(
            &scheme,
            &secrets,
            &headers,
            body,
            now,
            Duration::from_secs(300),
        );
        assert!(result.is_err(), "random input verified under {scheme}");
    }
});
