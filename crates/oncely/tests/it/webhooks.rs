//! `[[webhooks]]` through the real binary: a signed delivery is acknowledged once and
//! delivered once, a bad signature is refused with nothing recorded, a handler that keeps
//! failing is dead-lettered, and `oncely webhooks dead|redeliver` (and the admin API) bring
//! it back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use oncely_webhooks::{sign, Scheme, Secrets};
use serde_json::Value;

use crate::common::{get, post as send_post, run, stdout, upstream, Gateway};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The internal handler: counts deliveries, records their keys, and fails while `fail` is set.
#[derive(Clone, Default)]
struct Handler {
    deliveries: Arc<AtomicUsize>,
    keys: Arc<Mutex<Vec<(String, String, String)>>>,
    fail: Arc<std::sync::atomic::AtomicBool>,
}

async fn handle(State(h): State<Handler>, headers: HeaderMap, body: String) -> StatusCode {
    h.deliveries.fetch_add(1, Ordering::SeqCst);
    let key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let ctype = headers
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    h.keys.lock().unwrap().push((key, ctype, body));
    if h.fail.load(Ordering::SeqCst) {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    }
}

fn config(dir: &std::path::Path, deliver_to: std::net::SocketAddr) -> std::path::PathBuf {
    let path = dir.join("oncely.toml");
    std::fs::write(
        &path,
        format!(
            r#"
store = "sqlite://{db}"
upstream = "http://127.0.0.1:9"

[[webhooks]]
path = "/hooks/events"
verify = "standard"
secret_env = "TEST_WEBHOOK_SECRET"
tolerance = "5m"
deliver_to = "http://{deliver_to}/internal/events"
deliver_timeout = "2s"
max_attempts = 2
retry_backoff = "20ms"
"#,
            db = dir.join("ledger.db").display()
        ),
    )
    .unwrap();
    path
}

fn signed(event_id: &str, body: &str, timestamp: i64) -> Vec<(String, String)> {
    let scheme: Scheme = "standard".parse().unwrap();
    let secrets = Secrets::parse(&scheme, SECRET).unwrap();
    sign(
        &scheme,
        secrets.primary(),
        event_id,
        timestamp,
        body.as_bytes(),
    )
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

async fn deliver(gw: &Gateway, headers: &[(String, String)], body: &str) -> crate::common::Answer {
    let mut h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    h.push(("content-type", "application/json"));
    send_post(&gw.url("/hooks/events"), body, &h).await
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_signed_event_is_acknowledged_and_delivered_once() {
    let handler = Handler::default();
    let target = upstream(
        Router::new()
            .route("/internal/events", post(handle))
            .with_state(handler.clone()),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), target);
    let gw = Gateway::start(
        &["--config", cfg.to_str().unwrap()],
        &[
            ("TEST_WEBHOOK_SECRET", SECRET),
            ("ONCELY_ADMIN_TOKEN", "t0ken"),
        ],
    );

    let body = r#"{"type":"invoice.paid","id":"evt_1"}"#;
    let headers = signed("msg_evt_1", body, now());
    // The sender delivers the same event three times, two of them at once.
    let (a, b) = tokio::join!(deliver(&gw, &headers, body), deliver(&gw, &headers, body));
    let c = deliver(&gw, &headers, body).await;
    let mut statuses: Vec<String> = [&a, &b, &c]
        .iter()
        .map(|r| {
            assert_eq!(r.status, StatusCode::OK, "{}", r.text());
            r.header("oncely-status").to_owned()
        })
        .collect();
    statuses.sort();
    assert_eq!(statuses, ["duplicate", "duplicate", "fresh"]);

    eventually("the handler got the event", || {
        handler.deliveries.load(Ordering::SeqCst) >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        handler.deliveries.load(Ordering::SeqCst),
        1,
        "delivered once"
    );
    let (key, ctype, got) = handler.keys.lock().unwrap()[0].clone();
    assert_eq!(key, "msg_evt_1", "the event id is the Idempotency-Key");
    assert_eq!(ctype, "application/json");
    assert_eq!(got, body);

    // A bad signature, and a stale one: 400 signature_invalid, nothing recorded.
    let other = r#"{"type":"invoice.paid","id":"evt_2"}"#;
    let tampered = deliver(&gw, &headers, other).await;
    assert_eq!(tampered.status, StatusCode::BAD_REQUEST);
    assert_eq!(tampered.json()["code"], "signature_invalid");
    assert_eq!(tampered.header("content-type"), "application/problem+json");
    let stale = deliver(&gw, &signed("msg_evt_3", other, now() - 3600), other).await;
    assert_eq!(stale.status, StatusCode::BAD_REQUEST);
    assert_eq!(stale.json()["code"], "signature_invalid");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(handler.deliveries.load(Ordering::SeqCst), 1);
    assert_eq!(gw.terminate().code(), Some(0));

    let db = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let list = run(&["ledger", "list", "--json", "--store", &db]);
    let records: Value = serde_json::from_str(&stdout(&list)).unwrap();
    assert_eq!(
        records.as_array().unwrap().len(),
        1,
        "one record: {records}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_handler_is_dead_lettered_and_redelivered() {
    let handler = Handler::default();
    handler.fail.store(true, Ordering::SeqCst);
    let target = upstream(
        Router::new()
            .route("/internal/events", post(handle))
            .with_state(handler.clone()),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), target);
    let envs = [
        ("TEST_WEBHOOK_SECRET", SECRET),
        ("ONCELY_ADMIN_TOKEN", "t0ken"),
    ];
    let gw = Gateway::start(&["--config", cfg.to_str().unwrap()], &envs);
    let body = r#"{"type":"order.created","id":"evt_9"}"#;
    let r = deliver(&gw, &signed("msg_evt_9", body, now()), body).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("oncely-status"), "fresh");

    // Two attempts (max_attempts = 2), then dead.
    let db = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let dead_list = || {
        let o = run(&["webhooks", "dead", "--json", "--store", &db]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_str::<Value>(&stdout(&o)).unwrap()
    };
    eventually("the delivery is dead-lettered", || {
        dead_list().as_array().is_some_and(|a| a.len() == 1)
    })
    .await;
    assert_eq!(handler.deliveries.load(Ordering::SeqCst), 2);
    let dead = dead_list();
    assert_eq!(dead[0]["event_id"], "msg_evt_9");
    assert_eq!(dead[0]["attempts"], 2);
    let id = dead[0]["id"].as_str().unwrap().to_owned();

    // The admin API shows the same, behind the token.
    let unauth = get(&gw.admin_url("/webhooks/dead"), &[]).await;
    assert_eq!(unauth.status, StatusCode::UNAUTHORIZED);
    let listed = get(
        &gw.admin_url("/webhooks/dead"),
        &[("authorization", "Bearer t0ken")],
    )
    .await;
    assert_eq!(listed.status, StatusCode::OK);
    assert_eq!(listed.json()[0]["id"], id.as_str());

    // The handler is fixed; the operator redelivers from the CLI.
    handler.fail.store(false, Ordering::SeqCst);
    let o = run(&["webhooks", "redeliver", &id, "--store", &db]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    eventually("the redelivery arrives", || {
        handler.deliveries.load(Ordering::SeqCst) == 3
    })
    .await;
    let keys = handler.keys.lock().unwrap().clone();
    assert!(
        keys.iter().all(|(k, _, _)| k == "msg_evt_9"),
        "same key every time: {keys:?}"
    );
    eventually("the dead list is empty", || {
        dead_list().as_array().is_some_and(|a| a.is_empty())
    })
    .await;

    // An unknown id is a one-line exit 2.
    let o = run(&["webhooks", "redeliver", "task_nope", "--store", &db]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
    assert_eq!(gw.terminate().code(), Some(0));
}

/// GitHub signs the body only: `X-GitHub-Delivery` is outside the signature and there is
/// no timestamp. A captured delivery sent again under a new delivery id (or a `hmac-sha256`
/// one with a header event id) is a duplicate, not delivered again; a different body is
/// a new event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_under_a_new_unsigned_id_is_a_duplicate() {
    let handler = Handler::default();
    let target = upstream(
        Router::new()
            .route("/internal/events", post(handle))
            .with_state(handler.clone()),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("oncely.toml");
    std::fs::write(
        &path,
        format!(
            r#"
store = "sqlite://{db}"
upstream = "http://127.0.0.1:9"

[[webhooks]]
path = "/hooks/github"
verify = "github"
secret_env = "TEST_WEBHOOK_SECRET"
deliver_to = "http://{target}/internal/events"

[[webhooks]]
path = "/hooks/generic"
verify = "hmac-sha256"
event_id = "header:X-Event-Id"
secret_env = "TEST_WEBHOOK_SECRET"
deliver_to = "http://{target}/internal/events"
"#,
            db = dir.path().join("ledger.db").display()
        ),
    )
    .unwrap();
    let gw = Gateway::start(
        &["--config", path.to_str().unwrap()],
        &[("TEST_WEBHOOK_SECRET", SECRET)],
    );
    let post_signed = |scheme: &str, hook: &str, id: &str, body: &str| {
        let scheme: Scheme = scheme.parse().unwrap();
        let secrets = Secrets::parse(&scheme, SECRET).unwrap();
        let mut headers = sign(&scheme, secrets.primary(), id, now(), body.as_bytes());
        if hook == "/hooks/generic" {
            headers.push(("X-Event-Id".into(), id.into()));
        }
        let url = gw.url(hook);
        let body = body.to_owned();
        async move {
            let h: Vec<(&str, &str)> = headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            send_post(&url, &body, &h).await
        }
    };
    for (scheme, hook) in [
        ("github", "/hooks/github"),
        ("hmac-sha256", "/hooks/generic"),
    ] {
        let body = format!(r#"{{"action":"opened","hook":"{hook}"}}"#);
        let first = post_signed(scheme, hook, "delivery-1", &body).await;
        assert_eq!(first.status, StatusCode::OK, "{}", first.text());
        assert_eq!(first.header("oncely-status"), "fresh");
        let replay = post_signed(scheme, hook, "delivery-2-forged", &body).await;
        assert_eq!(replay.status, StatusCode::OK, "{}", replay.text());
        assert_eq!(replay.header("oncely-status"), "duplicate", "{hook}");
        let other = format!(r#"{{"action":"closed","hook":"{hook}"}}"#);
        let new = post_signed(scheme, hook, "delivery-3", &other).await;
        assert_eq!(new.header("oncely-status"), "fresh", "{hook}");
    }
    eventually("four deliveries", || {
        handler.deliveries.load(Ordering::SeqCst) >= 4
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let keys: Vec<String> = handler
        .keys
        .lock()
        .unwrap()
        .iter()
        .map(|(k, _, _)| k.clone())
        .collect();
    assert_eq!(keys.len(), 4, "the replays were not delivered: {keys:?}");
    assert!(!keys.iter().any(|k| k == "delivery-2-forged"), "{keys:?}");
}

/// With traces on, a webhook request is a server span and its delivery a client span in
/// the same trace; the handler gets a `traceparent` naming the delivery's span.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delivery_is_a_span_in_the_trace_of_the_request_that_received_it() {
    use crate::otlp::{Mode, Receiver};
    use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let kept = seen.clone();
    let target = upstream(Router::new().route(
        "/internal/events",
        post(move |headers: HeaderMap| {
            let kept = kept.clone();
            async move {
                let tp = headers
                    .get("traceparent")
                    .map(|v| v.to_str().unwrap().to_owned())
                    .unwrap_or_default();
                kept.lock().unwrap().push(tp);
                StatusCode::OK
            }
        }),
    ))
    .await;
    let rx = Receiver::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), target);
    let endpoint = rx.http_url();
    let gw = Gateway::start(
        &["--config", cfg.to_str().unwrap()],
        &[
            ("TEST_WEBHOOK_SECRET", SECRET),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ],
    );
    let body = r#"{"type":"invoice.paid","id":"evt_traced"}"#;
    let mut headers = signed("evt_traced", body, now());
    let sender = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    headers.push(("traceparent".into(), sender.into()));
    let a = deliver(&gw, &headers, body).await;
    assert_eq!(a.status, 200, "{}", a.text());
    eventually("the event is delivered", || {
        !seen.lock().unwrap().is_empty()
    })
    .await;
    let server = rx
        .wait_for(1, |g| g.span.kind == SpanKind::Server as i32)
        .await
        .remove(0);
    let client = rx
        .wait_for(1, |g| g.span.kind == SpanKind::Client as i32)
        .await
        .remove(0);
    assert_eq!(server.span.name, "POST /hooks/events");
    assert_eq!(server.str("http.route"), "/hooks/events");
    assert_eq!(server.int("http.response.status_code"), 200);
    // The sender's trace continued, and the delivery in it, under the request's span.
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    assert_eq!(
        hex(&server.span.trace_id),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    assert_eq!(client.span.trace_id, server.span.trace_id);
    assert_eq!(client.span.parent_span_id, server.span.span_id);
    assert_eq!(client.int("http.response.status_code"), 200);
    assert!(client.str("url.full").ends_with("/internal/events"));
    let delivered = seen.lock().unwrap()[0].clone();
    assert_eq!(
        delivered.split('-').nth(2).unwrap(),
        hex(&client.span.span_id)
    );
}
