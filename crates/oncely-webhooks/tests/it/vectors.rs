//! The providers' published examples, verified exactly.

use std::time::Duration;

use oncely_webhooks::{sign, verify, Scheme, Secret, Secrets, VerifyError};

const TOL: Duration = Duration::from_secs(300);

// Standard Webhooks: the fixed vector of the reference libraries' test suites.
const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SW_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SW_TIMESTAMP: i64 = 1_614_265_330;
const SW_PAYLOAD: &[u8] = br#"{"test": 2432232314}"#;
const SW_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn sw_headers(signature: &str) -> Vec<(&'static str, String)> {
    vec![
        ("webhook-id", SW_ID.to_owned()),
        ("webhook-timestamp", SW_TIMESTAMP.to_string()),
        ("webhook-signature", signature.to_owned()),
    ]
}

#[test]
fn standard_webhooks_vector_signs_to_the_published_signature() {
    let secrets = Secrets::parse(&Scheme::Standard, SW_SECRET).unwrap();
    let headers = sign(
        &Scheme::Standard,
        secrets.primary(),
        SW_ID,
        SW_TIMESTAMP,
        SW_PAYLOAD,
    );
    assert_eq!(
        headers,
        [
            ("webhook-id".to_owned(), SW_ID.to_owned()),
            ("webhook-timestamp".to_owned(), "1614265330".to_owned()),
            ("webhook-signature".to_owned(), SW_SIGNATURE.to_owned()),
        ]
    );
}

#[test]
fn standard_webhooks_vector_verifies_with_and_without_whsec_prefix() {
    for secret in [SW_SECRET, SW_SECRET.trim_start_matches("whsec_")] {
        let secrets = Secrets::parse(&Scheme::Standard, secret).unwrap();
        let verified = verify(
            &Scheme::Standard,
            &secrets,
            &sw_headers(SW_SIGNATURE),
            SW_PAYLOAD,
            SW_TIMESTAMP,
            TOL,
        )
        .unwrap();
        assert_eq!(verified.event_id.as_deref(), Some(SW_ID));
        assert_eq!(verified.timestamp, Some(SW_TIMESTAMP));
    }
}

#[test]
fn standard_webhooks_vector_refuses_the_reference_suites_bad_cases() {
    let secrets = Secrets::parse(&Scheme::Standard, SW_SECRET).unwrap();
    let check = |headers: &[(&str, String)], now: i64| {
        verify(&Scheme::Standard, &secrets, headers, SW_PAYLOAD, now, TOL)
    };
    // One bit off in the last byte.
    let off = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA=";
    assert_eq!(
        check(&sw_headers(off), SW_TIMESTAMP),
        Err(VerifyError::NoMatchingSignature)
    );
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        let headers: Vec<_> = sw_headers(SW_SIGNATURE)
            .into_iter()
            .filter(|(n, _)| *n != name)
            .collect();
        assert_eq!(
            check(&headers, SW_TIMESTAMP),
            Err(VerifyError::MissingHeader(name.into()))
        );
    }
    let mut headers = sw_headers(SW_SIGNATURE);
    headers[1].1 = "hello".into();
    assert!(matches!(
        check(&headers, SW_TIMESTAMP),
        Err(VerifyError::MalformedHeader { .. })
    ));
    // Five minutes and one second either way.
    for now in [SW_TIMESTAMP + 301, SW_TIMESTAMP - 301] {
        assert!(matches!(
            check(&sw_headers(SW_SIGNATURE), now),
            Err(VerifyError::TimestampOutOfTolerance { .. })
        ));
    }
}

#[test]
fn standard_webhooks_vector_in_a_list_with_other_versions() {
    let secrets = Secrets::parse(&Scheme::Standard, SW_SECRET).unwrap();
    let decoy = "Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=";
    let list = format!("v1,{decoy} v2,{decoy} {SW_SIGNATURE} v1,{decoy}");
    assert!(verify(
        &Scheme::Standard,
        &secrets,
        &sw_headers(&list),
        SW_PAYLOAD,
        SW_TIMESTAMP,
        TOL
    )
    .is_ok());
    let decoys_only = format!("v1,{decoy} v2,{decoy}");
    assert_eq!(
        verify(
            &Scheme::Standard,
            &secrets,
            &sw_headers(&decoys_only),
            SW_PAYLOAD,
            SW_TIMESTAMP,
            TOL
        ),
        Err(VerifyError::NoMatchingSignature)
    );
}

// GitHub: the example of "Validating webhook deliveries".
const GH_SECRET: &str = "It's a Secret to Everybody";
const GH_PAYLOAD: &[u8] = b"Hello, World!";
const GH_SIGNATURE: &str =
    "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

#[test]
fn github_documented_example_signs_and_verifies() {
    // The secret holds spaces, so it is made directly: in the `secret_env` variable,
    // spaces separate secrets.
    let secret = Secret::parse(&Scheme::Github, GH_SECRET).unwrap();
    let secrets = Secrets::new(vec![secret]).unwrap();
    let headers = sign(
        &Scheme::Github,
        secrets.primary(),
        "delivery-1",
        0,
        GH_PAYLOAD,
    );
    assert_eq!(
        headers[0],
        ("X-Hub-Signature-256".to_owned(), GH_SIGNATURE.to_owned())
    );

    let received = [
        ("X-Hub-Signature-256", GH_SIGNATURE),
        ("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
    ];
    // GitHub signs no timestamp: any clock verifies.
    let verified = verify(&Scheme::Github, &secrets, &received, GH_PAYLOAD, 1, TOL).unwrap();
    assert_eq!(
        verified.event_id.as_deref(),
        Some("72d3162e-cc78-11e3-81ab-4c9367dc0958")
    );
    assert_eq!(verified.timestamp, None);
    assert_eq!(
        verify(
            &Scheme::Github,
            &secrets,
            &received,
            b"Hello, World?",
            1,
            TOL
        ),
        Err(VerifyError::NoMatchingSignature)
    );
}

// Stripe: "Verify manually": signed_payload = "{t}.{body}", HMAC-SHA256 keyed with the
// endpoint secret (whsec_ included), compared to each v1. The expected value below was
// produced by stripe-python 16.1.0's WebhookSignature.generate_signature_header for the
// payload and secret its own test suite uses.
const ST_SECRET: &str = "whsec_test_secret";
const ST_PAYLOAD: &[u8] = br#"{"id":"evt_test_webhook","object":"event"}"#;
const ST_TIMESTAMP: i64 = 1_492_774_577;
const ST_HEADER: &str =
    "t=1492774577,v1=88a022085c6bdb887b02cb26ff76dd681234d9675c0f22844059f55552a8883a";

#[test]
fn stripe_documented_scheme_signs_and_verifies() {
    let secrets = Secrets::parse(&Scheme::Stripe, ST_SECRET).unwrap();
    let headers = sign(
        &Scheme::Stripe,
        secrets.primary(),
        "",
        ST_TIMESTAMP,
        ST_PAYLOAD,
    );
    assert_eq!(
        headers,
        [("Stripe-Signature".to_owned(), ST_HEADER.to_owned())]
    );

    // As Stripe sends it in test mode: with a v0 alongside.
    let received =
        format!("{ST_HEADER},v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39");
    let verified = verify(
        &Scheme::Stripe,
        &secrets,
        &[("Stripe-Signature", received)],
        ST_PAYLOAD,
        ST_TIMESTAMP + 10,
        TOL,
    )
    .unwrap();
    assert_eq!(verified.event_id.as_deref(), Some("evt_test_webhook"));
    assert_eq!(verified.timestamp, Some(ST_TIMESTAMP));
}

#[test]
fn stripe_signature_is_keyed_with_the_whole_whsec_string() {
    // Decoding the secret as Standard Webhooks does would give a different key.
    let decoded = Secrets::parse(&Scheme::Standard, "whsec_dGVzdF9zZWNyZXQ=").unwrap();
    assert_eq!(
        verify(
            &Scheme::Stripe,
            &decoded,
            &[("Stripe-Signature", ST_HEADER)],
            ST_PAYLOAD,
            ST_TIMESTAMP,
            TOL
        ),
        Err(VerifyError::NoMatchingSignature)
    );
}
