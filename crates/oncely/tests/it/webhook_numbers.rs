//! Issue 11 (1) on webhooks, through the real binary: a webhook's `dedupe_fields` compare
//! numbers as exact decimals. Two events whose order ids differ past 64 bits are both
//! delivered; the same order id spelled otherwise (`1e2`, `100.0`) under a new event id
//! is a duplicate.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::routing::post;
use http::StatusCode;
use oncely_webhooks::{sign, Scheme, Secrets};

use crate::common::{post as http_post, upstream, Gateway};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

async fn deliver(gw: &Gateway, event_id: &str, body: &str) -> String {
    let scheme: Scheme = "standard".parse().unwrap();
    let secrets = Secrets::parse(&scheme, SECRET).unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let headers = sign(&scheme, secrets.primary(), event_id, now, body.as_bytes());
    let mut h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    h.push(("content-type", "application/json"));
    let answer = http_post(&gw.url("/hooks/orders"), body, &h).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    answer.header("oncely-status").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedupe_fields_compare_numbers_as_exact_decimals() {
    let delivered = Arc::new(Mutex::new(Vec::<String>::new()));
    let d = delivered.clone();
    let target = upstream(axum::Router::new().route(
        "/internal/orders",
        post(move |body: String| {
            let d = d.clone();
            async move {
                d.lock().unwrap().push(body);
                "ok"
            }
        }),
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("oncely.toml");
    std::fs::write(
        &config,
        format!(
            r#"store = "sqlite://{db}"
upstream = "http://127.0.0.1:9"

[[webhooks]]
path = "/hooks/orders"
verify = "standard"
secret_env = "TEST_WEBHOOK_SECRET"
dedupe_fields = ["/order"]
deliver_to = "http://{target}/internal/orders"
retry_backoff = "20ms"
"#,
            db = dir.path().join("ledger.db").display()
        ),
    )
    .unwrap();
    let gw = Gateway::start(
        &["--config", config.to_str().unwrap()],
        &[("TEST_WEBHOOK_SECRET", SECRET)],
    );

    let big = [
        r#"{"order":123456789012345678901234567891}"#,
        r#"{"order":123456789012345678901234567890}"#,
        r#"{"order":0.10000000000000000001}"#,
        r#"{"order":0.1}"#,
    ];
    for (i, body) in big.iter().enumerate() {
        assert_eq!(
            deliver(&gw, &format!("msg_{i}"), body).await,
            "fresh",
            "{body} is a new event"
        );
    }
    assert_eq!(deliver(&gw, "msg_a", r#"{"order":1e2}"#).await, "fresh");
    assert_eq!(
        deliver(&gw, "msg_b", r#"{ "order" : 100.0 }"#).await,
        "duplicate",
        "the same order id spelled otherwise"
    );
    for _ in 0..200 {
        if delivered.lock().unwrap().len() >= 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let delivered = delivered.lock().unwrap().clone();
    assert_eq!(delivered.len(), 5, "{delivered:?}");
    for body in big {
        assert!(
            delivered.iter().any(|d| d == body),
            "{body} delivered as sent: {delivered:?}"
        );
    }
    assert_eq!(gw.terminate().code(), Some(0));
}
