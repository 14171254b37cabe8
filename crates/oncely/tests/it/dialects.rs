//! The errors of the gateway's own, as clients' retry loops and SDKs read them, through
//! the real binary: `X-Should-Retry` (and `Retry-After`) on every one, `Oncely-Problem`
//! in every dialect, each dialect's body and status (`errors` on a route and in
//! `[defaults]`), and `check-config` refusing an unknown dialect.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;

use crate::common::{post as http_post, run, stderr, upstream, Answer, Gateway};

const ALICE: (&str, &str) = ("authorization", "Bearer alice");

/// An upstream that counts its calls and sleeps `ms` from the body's `{"ms": N}`.
async fn slow(State(calls): State<Arc<AtomicUsize>>, body: String) -> String {
    calls.fetch_add(1, Ordering::SeqCst);
    let ms = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["ms"].as_u64())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    format!("done: {body}")
}

async fn gateway(dialect: Option<&str>) -> (Gateway, Arc<AtomicUsize>, tempfile::TempDir) {
    let calls = Arc::new(AtomicUsize::new(0));
    let up = upstream(
        axum::Router::new()
            .route("/{*rest}", post(slow))
            .with_state(calls.clone()),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let errors = dialect
        .map(|d| format!("errors = \"{d}\""))
        .unwrap_or_default();
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
store = "sqlite://{db}"
upstream = "http://{up}"

[defaults]
{errors}

[[routes]]
method = "POST"
path = "/v1/write"
class = "write"
timeout = "1s"
wait = "300ms"

[[routes]]
method = "POST"
path = "/v1/action"
class = "action"
timeout = "1s"

[[routes]]
method = "POST"
path = "/v1/keyed"
key = "header"
"#,
            db = dir.path().join("ledger.db").display(),
        ),
    )
    .unwrap();
    let gw = Gateway::start(&["--config", cfg.to_str().unwrap()], &[]);
    (gw, calls, dir)
}

fn hint(a: &Answer) -> (&str, &str) {
    (a.header("x-should-retry"), a.header("oncely-problem"))
}

/// Every code a caller of a guarded route can meet, with the hint the contract gives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_of_the_gateway_tells_the_retry_loop_what_to_do() {
    let (gw, calls, _dir) = gateway(None).await;
    let with_key = |k: &'static str| [ALICE, ("idempotency-key", k)];

    // key_missing, key_invalid: a retry as is cannot succeed.
    let a = http_post(&gw.url("/v1/keyed"), "{}", &[ALICE]).await;
    assert_eq!(a.status, 400);
    assert_eq!(hint(&a), ("false", "key_missing"));
    let a = http_post(&gw.url("/v1/keyed"), "{}", &with_key("")).await;
    assert_eq!(hint(&a), ("false", "key_invalid"));

    // key_reused: never.
    let a = http_post(&gw.url("/v1/keyed"), r#"{"a":1}"#, &with_key("k1")).await;
    assert_eq!(a.status, 200, "{}", a.text());
    let a = http_post(&gw.url("/v1/keyed"), r#"{"a":2}"#, &with_key("k1")).await;
    assert_eq!(a.status, 422);
    assert_eq!(hint(&a), ("false", "key_reused"));

    // in_flight: yes, after Retry-After.
    let first = tokio::spawn({
        let url = gw.url("/v1/write");
        async move { http_post(&url, r#"{"ms":800}"#, &[ALICE]).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let a = http_post(&gw.url("/v1/write"), r#"{"ms":800}"#, &[ALICE]).await;
    assert_eq!(a.status, 409, "{}", a.text());
    assert_eq!(hint(&a), ("true", "in_flight"));
    assert!(a.headers.contains_key("retry-after"));
    assert_eq!(first.await.unwrap().status, 200);

    // upstream_timeout on a write: released, so a retry runs it again.
    let a = http_post(&gw.url("/v1/write"), r#"{"ms":3000}"#, &[ALICE]).await;
    assert_eq!(a.status, 504, "{}", a.text());
    assert_eq!(hint(&a), ("true", "upstream_timeout"));

    // upstream_timeout on an action: outcome_unknown, so no; nor its repeats.
    let before = calls.load(Ordering::SeqCst);
    let a = http_post(&gw.url("/v1/action"), r#"{"ms":3000}"#, &[ALICE]).await;
    assert_eq!(a.status, 504, "{}", a.text());
    assert_eq!(hint(&a), ("false", "upstream_timeout"));
    let a = http_post(&gw.url("/v1/action"), r#"{"ms":3000}"#, &[ALICE]).await;
    assert_eq!(a.status, 409, "{}", a.text());
    assert_eq!(hint(&a), ("false", "outcome_unknown"));
    assert_eq!(calls.load(Ordering::SeqCst), before + 1);

    // An answer of the upstream's own carries no hint of the gateway's.
    let a = http_post(&gw.url("/v1/write"), r#"{"ms":0}"#, &[ALICE]).await;
    assert_eq!(a.status, 200);
    assert!(!a.headers.contains_key("x-should-retry"));
    assert!(!a.headers.contains_key("oncely-problem"));
}

/// The same `outcome_unknown` in each dialect: the status, `Retry-After`,
/// `X-Should-Retry`, `Oncely-Problem` and `Oncely-Record` do not change; the body is the
/// dialect's. `[defaults]` sets it for every route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_dialect_writes_its_body_and_keeps_the_rest() {
    for dialect in ["problem", "openai", "anthropic", "stripe"] {
        let (gw, _calls, _dir) = gateway(Some(dialect)).await;
        let a = http_post(&gw.url("/v1/action"), r#"{"ms":3000}"#, &[ALICE]).await;
        assert_eq!(a.status, 504, "{dialect}: {}", a.text());
        let a = http_post(&gw.url("/v1/action"), r#"{"ms":3000}"#, &[ALICE]).await;
        assert_eq!(a.status, 409, "{dialect}: {}", a.text());
        assert_eq!(hint(&a), ("false", "outcome_unknown"), "{dialect}");
        assert!(a.header("oncely-record").starts_with("rec_"));
        let doc = a.json();
        match dialect {
            "problem" => {
                assert_eq!(a.header("content-type"), "application/problem+json");
                assert_eq!(doc["code"], "outcome_unknown");
                assert_eq!(doc["status"], 409);
            }
            "openai" => {
                assert_eq!(a.header("content-type"), "application/json");
                assert_eq!(doc["error"]["code"], "outcome_unknown");
                assert_eq!(doc["error"]["type"], "invalid_request_error");
                assert!(doc["error"]["param"].is_null());
                assert!(doc["error"]["message"].as_str().unwrap().len() > 10);
            }
            "anthropic" => {
                assert_eq!(doc["type"], "error");
                assert_eq!(doc["error"]["type"], "invalid_request_error");
                assert!(doc["error"]["message"].as_str().unwrap().len() > 10);
            }
            "stripe" => {
                assert_eq!(doc["error"]["type"], "invalid_request_error");
                assert_eq!(doc["error"]["code"], "outcome_unknown");
                assert_eq!(a.header("stripe-should-retry"), "false");
            }
            _ => unreachable!(),
        }

        // Stripe answers a reused key 400 idempotency_error; the others keep 422.
        let key = [ALICE, ("idempotency-key", "same")];
        let a = http_post(&gw.url("/v1/keyed"), r#"{"a":1}"#, &key).await;
        assert_eq!(a.status, 200, "{dialect}: {}", a.text());
        let a = http_post(&gw.url("/v1/keyed"), r#"{"a":2}"#, &key).await;
        assert_eq!(hint(&a), ("false", "key_reused"), "{dialect}");
        if dialect == "stripe" {
            assert_eq!(a.status, 400);
            assert_eq!(a.json()["error"]["type"], "idempotency_error");
            assert_eq!(a.json()["error"]["code"], "key_reused");
        } else {
            assert_eq!(a.status, 422, "{dialect}");
        }
    }
}

#[test]
fn check_config_refuses_an_unknown_dialect() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        r#"
upstream = "http://127.0.0.1:3000"

[defaults]
errors = "grpc"

[[routes]]
method = "POST"
path = "/v1/render"
errors = "OpenAI"
"#,
    )
    .unwrap();
    let o = run(&["check-config", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("errors") && err.contains("\"grpc\""), "{err}");
    assert!(err.contains("\"OpenAI\""), "{err}");
    assert!(
        err.contains("problem, openai, anthropic or stripe"),
        "{err}"
    );
}
