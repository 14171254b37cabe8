//! Interoperability with the providers' own libraries, in both directions.
//!
//! `scripts/webhook-interop.sh` runs the official `standardwebhooks` and `stripe` Python
//! packages (installed from PyPI into `target/interop-venv` on first use). Deliveries they
//! sign must verify here, and deliveries `oncely_webhooks::sign` makes must verify there;
//! a changed body, timestamp, id or secret must fail on both sides.
//!
//! The test fails loudly when the script cannot run (no python3, pip cannot install).
//! Set `ONCELY_SKIP_INTEROP=1` to skip it on purpose, e.g. offline.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use oncely_webhooks::{sign, verify, Scheme, Secret, Secrets, VerifyError};
use serde_json::{json, Value};

const TOL: Duration = Duration::from_secs(300);

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/webhook-interop.sh")
}

/// Runs the script with `command`, feeding it `input`, and parses its JSON answer.
fn run(command: &str, input: &str) -> Value {
    let mut child = Command::new("bash")
        .arg(script())
        .arg(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "webhook-interop.sh {command} failed ({}); set ONCELY_SKIP_INTEROP=1 to skip on purpose.\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the interop script prints JSON")
}

fn skipped() -> bool {
    let skip = std::env::var_os("ONCELY_SKIP_INTEROP").is_some_and(|v| v == "1");
    if skip {
        eprintln!("interop: skipped (ONCELY_SKIP_INTEROP=1)");
    }
    skip
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("fixture lacks {key}: {v}"))
}

fn changed(payload: &str) -> String {
    format!("{payload} ")
}

#[test]
fn official_libraries_signatures_verify_in_oncely() {
    if skipped() {
        return;
    }
    let fixtures = run("sign", "");
    let other = "whsec_b3RoZXItc2VjcmV0LW9mLW9uY2VseQ==";

    let standard = fixtures["standard"].as_array().unwrap();
    assert!(standard.len() >= 5, "{fixtures}");
    for case in standard {
        let secrets = Secrets::parse(&Scheme::Standard, str_of(case, "secret")).unwrap();
        let ts = case["timestamp"].as_i64().unwrap();
        let payload = str_of(case, "payload");
        let headers = |id: &str, t: i64| {
            vec![
                ("webhook-id", id.to_owned()),
                ("webhook-timestamp", t.to_string()),
                ("webhook-signature", str_of(case, "signature").to_owned()),
            ]
        };
        let id = str_of(case, "id");
        let check = |h: &[(&str, String)], body: &str, s: &Secrets| {
            verify(&Scheme::Standard, s, h, body.as_bytes(), ts, TOL)
        };
        let verified = check(&headers(id, ts), payload, &secrets)
            .unwrap_or_else(|e| panic!("standard fixture did not verify: {e}\n{case}"));
        assert_eq!(verified.event_id.as_deref(), Some(id));
        assert_eq!(verified.timestamp, Some(ts));

        let no = Err(VerifyError::NoMatchingSignature);
        assert_eq!(
            check(&headers(id, ts), &changed(payload), &secrets),
            no,
            "body"
        );
        assert_eq!(
            check(&headers(id, ts + 1), payload, &secrets),
            no,
            "timestamp"
        );
        assert_eq!(
            check(&headers("msg_other", ts), payload, &secrets),
            no,
            "id"
        );
        let wrong = Secrets::parse(&Scheme::Standard, other).unwrap();
        assert_eq!(check(&headers(id, ts), payload, &wrong), no, "secret");

        let rotated = Secrets::parse(
            &Scheme::Standard,
            &format!("{other} {}", str_of(case, "secret")),
        )
        .unwrap();
        assert_eq!(
            check(&headers(id, ts), payload, &rotated)
                .unwrap()
                .secret_index,
            1
        );
    }

    let stripe = fixtures["stripe"].as_array().unwrap();
    assert!(stripe.len() >= 4, "{fixtures}");
    for case in stripe {
        let secrets = Secrets::parse(&Scheme::Stripe, str_of(case, "secret")).unwrap();
        let ts = case["timestamp"].as_i64().unwrap();
        let payload = str_of(case, "payload");
        let header = str_of(case, "header");
        let check = |h: &str, body: &str, s: &Secrets| {
            verify(
                &Scheme::Stripe,
                s,
                &[("Stripe-Signature", h)],
                body.as_bytes(),
                ts,
                TOL,
            )
        };
        let verified = check(header, payload, &secrets)
            .unwrap_or_else(|e| panic!("stripe fixture did not verify: {e}\n{case}"));
        let body_id = serde_json::from_str::<Value>(payload).unwrap()["id"]
            .as_str()
            .map(str::to_owned);
        assert_eq!(verified.event_id, body_id);

        let no = Err(VerifyError::NoMatchingSignature);
        assert_eq!(check(header, &changed(payload), &secrets), no, "body");
        let moved = header.replacen(&format!("t={ts}"), &format!("t={}", ts + 1), 1);
        assert_eq!(check(&moved, payload, &secrets), no, "timestamp");
        let wrong = Secrets::parse(&Scheme::Stripe, "whsec_0123456789abcdef").unwrap();
        assert_eq!(check(header, payload, &wrong), no, "secret");
    }
}

#[test]
fn oncely_signatures_verify_in_the_official_libraries() {
    if skipped() {
        return;
    }
    let now = now();
    let payloads = [
        r#"{"id":"evt_a","object":"event","type":"charge.succeeded"}"#.to_owned(),
        "{\"id\":\"evt_b\",\"object\":\"event\",\"note\":\"caf\u{e9} \u{1F680}\"}\n".to_owned(),
        format!(
            r#"{{"id":"evt_c","object":"event","blob":"{}"}}"#,
            "y".repeat(4000)
        ),
    ];
    let mut cases = Vec::new();
    let mut case = |name: String,
                    scheme: &str,
                    secret: &str,
                    headers: &[(String, String)],
                    payload: &str,
                    expect: bool| {
        let headers: serde_json::Map<String, Value> =
            headers.iter().map(|(n, v)| (n.clone(), json!(v))).collect();
        cases.push((
            json!({"name": name, "scheme": scheme, "secret": secret, "headers": headers, "payload": payload}),
            expect,
        ));
    };

    for (i, payload) in payloads.iter().enumerate() {
        let sw_secret = format!(
            "whsec_{}",
            [
                "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                "c2VjcmV0LW51bWJlci10d28tZm9yLW9uY2VseQ==",
                "AAECAwQFBgcICQoLDA0ODxAREhMUFRYX"
            ][i]
        );
        let secret = Secret::parse(&Scheme::Standard, &sw_secret).unwrap();
        let id = format!("msg_oncely_{i}");
        let signed = sign(&Scheme::Standard, &secret, &id, now, payload.as_bytes());
        case(
            format!("standard/{i}/ok"),
            "standard",
            &sw_secret,
            &signed,
            payload,
            true,
        );
        case(
            format!("standard/{i}/body"),
            "standard",
            &sw_secret,
            &signed,
            &changed(payload),
            false,
        );
        let mut moved = signed.clone();
        moved[1].1 = (now + 1).to_string();
        case(
            format!("standard/{i}/timestamp"),
            "standard",
            &sw_secret,
            &moved,
            payload,
            false,
        );
        let mut renamed = signed.clone();
        renamed[0].1 = "msg_other".into();
        case(
            format!("standard/{i}/id"),
            "standard",
            &sw_secret,
            &renamed,
            payload,
            false,
        );
        case(
            format!("standard/{i}/secret"),
            "standard",
            "whsec_b3RoZXItc2VjcmV0",
            &signed,
            payload,
            false,
        );
        let stale = sign(
            &Scheme::Standard,
            &secret,
            &id,
            now - 3600,
            payload.as_bytes(),
        );
        case(
            format!("standard/{i}/stale"),
            "standard",
            &sw_secret,
            &stale,
            payload,
            false,
        );

        let st_secret = format!("whsec_oncely_interop_{i}");
        let secret = Secret::parse(&Scheme::Stripe, &st_secret).unwrap();
        let signed = sign(&Scheme::Stripe, &secret, "", now, payload.as_bytes());
        case(
            format!("stripe/{i}/ok"),
            "stripe",
            &st_secret,
            &signed,
            payload,
            true,
        );
        case(
            format!("stripe/{i}/body"),
            "stripe",
            &st_secret,
            &signed,
            &changed(payload),
            false,
        );
        let mut moved = signed.clone();
        moved[0].1 = moved[0]
            .1
            .replacen(&format!("t={now}"), &format!("t={}", now + 1), 1);
        case(
            format!("stripe/{i}/timestamp"),
            "stripe",
            &st_secret,
            &moved,
            payload,
            false,
        );
        case(
            format!("stripe/{i}/secret"),
            "stripe",
            "whsec_other",
            &signed,
            payload,
            false,
        );
        let stale = sign(&Scheme::Stripe, &secret, "", now - 3600, payload.as_bytes());
        case(
            format!("stripe/{i}/stale"),
            "stripe",
            &st_secret,
            &stale,
            payload,
            false,
        );
    }

    let input = Value::Array(cases.iter().map(|(c, _)| c.clone()).collect()).to_string();
    let results = run("verify", &input);
    let results = results.as_array().unwrap();
    assert_eq!(results.len(), cases.len());
    for ((case, expect), result) in cases.iter().zip(results) {
        assert_eq!(result["name"], case["name"]);
        assert_eq!(
            result["ok"].as_bool(),
            Some(*expect),
            "{} by the official library: {result}",
            case["name"]
        );
        if *expect {
            let expected_id = match case["scheme"].as_str() {
                Some("standard") => case["headers"]["webhook-id"].clone(),
                _ => serde_json::from_str::<Value>(case["payload"].as_str().unwrap()).unwrap()
                    ["id"]
                    .clone(),
            };
            assert_eq!(result["event_id"], expected_id, "{result}");
        }
    }
}
